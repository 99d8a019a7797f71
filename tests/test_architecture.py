"""The house rules of the package, checked on its source: no import cycle (module-level or inside
a function), no module over 400 lines, typer/rich only in the CLI, metadata read by key only in
the format layer, and a runtime that never pulls in the prepare-side libraries."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lmshard"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    """Dotted name → file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """lmshard modules that `name` imports anywhere in its file (functions included)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                out.add(target)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_even_inside_functions():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # A package's __init__ re-exporting its own modules is not a cycle of roles; leave it out.
    graph = {n: {t for t in ts if not n.startswith(t + ".")} for n, ts in graph.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_no_module_over_400_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_typer_and_rich_only_in_the_cli():
    """The command line (the `lmshard/cli/` room: its commands, and render.py for what they print) is the
    only user of typer and rich."""
    modules = _modules()
    assert {"lmshard.cli.commands", "lmshard.cli.render"} <= set(modules)  # the room is where this rule looks
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        used = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        froms = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0]
        used |= {(n.module or "").split(".")[0] for n in froms}
        if name != "lmshard.cli" and not name.startswith("lmshard.cli."):
            assert not used & {"typer", "rich", "click"}, name


def test_metadata_is_read_by_key_only_in_the_format_layer():
    """No `meta.raw`, `meta["..."]` or `json.load` of the metadata file outside lmshard.format."""
    for name, path in _modules().items():
        if name.startswith("lmshard.format"):
            continue
        text = path.read_text()
        assert ".raw[" not in text and "meta[" not in text and "METADATA_FILE).read" not in text, name


def test_runtime_imports_only_format_numpy_and_torch_on_every_path():
    """Statically, function-level imports included: the loader never reaches the prepare side."""
    modules = _modules()
    allowed_lmshard = {"lmshard.format", "lmshard.format.layout", "lmshard.format.schema", "lmshard.errors"}
    # The packing room is shared by the loader and `inspect --packing`; it may use only what
    # the runtime may, so the runtime reaches nothing more through it.
    packing = {n for n in modules if n == "lmshard.packing" or n.startswith("lmshard.packing.")}
    assert {"lmshard.packing.planner", "lmshard.packing.io", "lmshard.packing.stream"} <= packing
    for planner in sorted(packing):
        assert _imports(planner, modules[planner], modules) <= allowed_lmshard | packing, planner
    allowed_lmshard |= packing | {"lmshard.format.blocks", "lmshard.format.encoding", "lmshard.format.tokenfile",
                                  "lmshard.format.bitpack", "lmshard.format.attributes"}  # (numpy; zstandard for zstd)
    allowed_lmshard |= {"lmshard.plugins"}  # a hook named as module:function: importlib and errors only
    assert _imports("lmshard.plugins", modules["lmshard.plugins"], modules) <= {"lmshard.errors"}
    remote = {n for n in modules if n.startswith("lmshard.remote")}  # the object-store client: remote datasets only
    for name, path in modules.items():
        if not name.startswith("lmshard.runtime"):
            continue
        inner = {t for t in _imports(name, path, modules) if not t.startswith("lmshard.runtime")}
        if name == "lmshard.runtime.dataset":  # TokenDataset.decode: the dataset's own vocabulary, on its first call
            inner -= {"lmshard.tokenizers.of_dataset"}
        assert inner <= allowed_lmshard | remote, (name, inner - allowed_lmshard - remote)
        tree = ast.parse(path.read_text())
        top = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        top |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        assert not top & {"tiktoken", "typer", "rich", "datasets", "xxhash", "yaml", "pyarrow"}, (name, top)


_RUNTIME_PROBE = """
import sys
import numpy as np
import torch
from lmshard.runtime import Batch, BatchStream, TokenDataset, WindowDataset
ds = TokenDataset.synthetic(n_tokens=10_000, vocab_size=500, seed=1)
on_disk = TokenDataset(sys.argv[1], split="train")
for data in (ds, on_disk):
    next(iter(data.random_batches(2, 16, seed=0)))
    next(iter(data.random_batches(2, 16, seed=0, shift="random", doc_aligned=True, cu_seqlens=True)))
    next(iter(data.window_batches(2, 16, stride=8, seed=0)))
    data.windows(16, stride=8)[0]
    data.tokens(0, 8)
    stream = data.random_batches(2, 16, seed=0)
    stream.load_state_dict(stream.state_dict())
heavy = {"typer", "rich", "click", "tiktoken", "datasets", "xxhash", "fsspec", "s3fs", "aiohttp", "botocore"}
print(sorted({m.split(".")[0] for m in sys.modules} & heavy))
"""


def test_runtime_constructs_every_loader_without_prepare_side_libraries(tmp_path):
    from lmshard.prepare import prepare
    from lmshard.prepare.config import PrepareConfig

    (tmp_path / "a.txt").write_text("one small document for the loader to read\n" * 40)
    prepare(PrepareConfig(inputs=[str(tmp_path / "a.txt")], out=str(tmp_path / "ds"), workers=1, val_fraction=0))
    done = subprocess.run([sys.executable, "-c", _RUNTIME_PROBE, str(tmp_path / "ds")], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
