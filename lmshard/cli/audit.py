"""`lmshard trace`: the documents a training run's batches held, from its loader state, in closed
form (lmshard.runtime.trace): no batch is replayed and no token is read unless `--text` asks for
the documents' text.

`register` adds the command to the `app` commands.py builds, wrapped in its `user_errors`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from . import render

TEXT_CHARS = 160  # --text: the characters of each piece shown (on one line)


def register(app: typer.Typer, user_errors: Callable[[], Callable[[Any], Any]]) -> None:
    """Add `trace` to `app`."""
    app.command("trace")(user_errors()(trace))


def trace(
    dataset: str = typer.Argument(..., metavar="DATASET", help="The dataset the run trained on (a directory or URL)."),
    state: Path = typer.Option(..., "--state", metavar="FILE", help="The loader state: a JSON file, or a checkpoint "
                               "saved with torch.save holding it (see --key)."),  # fmt: skip
    key: str | None = typer.Option(None, "--key", metavar="KEY", help="Where the state is in a checkpoint: a key, "
                                   "or keys joined by dots (nanoGPT: data)."),  # fmt: skip
    steps: str | None = typer.Option(None, "--steps", metavar="A[:B]", help="The step, or steps A to B-1, to trace. "
                                     "Default: the state's own step (the next batch it hands out)."),  # fmt: skip
    text: bool = typer.Option(False, "--text", help="Also print the start of each piece's text."),
    exposure: bool = typer.Option(False, "--exposure", help="Instead: how many times each document was seen in the "
                                  "steps before the state's (all ranks), summed up."),  # fmt: skip
    exposure_out: Path | None = typer.Option(None, "--exposure-out", metavar="FILE.npy", help="With --exposure: also "
                                             "write each document's count (uint32, stream order)."),  # fmt: skip
    as_json: bool = typer.Option(False, "--json", help="A JSON object per step, on one line each."),
) -> None:
    """The documents of a run's batches at given steps, from its loader state.

    Each row's documents: number, shard, input and record, and the tokens of it in the row, for
    random, window, packed and padded states; with --exposure, how many times each document was
    seen before the state's step (--steps A: before step A)."""
    from ..errors import ArgumentError
    from ..runtime import TokenDataset
    from ..runtime.checks import data_split
    from ..runtime.trace import stream_of_state

    saved = _load_state(state, key)
    split = data_split(saved.get("data", "")) or "train"  # the data_id names the split
    carve: dict[str, Any] = {}
    if "?" in split:  # a where= selection: split?condition
        split, carve["where"] = split.split("?", 1)
    if "@" in split:  # a load-time split: split@fraction/seed (runtime/subset.py)
        split, how = split.split("@", 1)
        fraction, _, seed = how.partition("/")
        carve |= {"val_fraction": float(fraction), "split_seed": int(seed or 0)}
    data = TokenDataset(dataset, split=split, **carve)
    stream = stream_of_state(data, saved)
    if exposure or exposure_out is not None:
        if steps is not None and ":" in steps:
            raise ArgumentError(f"--steps {steps}: --exposure counts the steps before one step; pass --steps A "
                                "(the steps before A), or leave it out (before the state's step)")  # fmt: skip
        _exposure(stream, int(saved.get("step", 0)) if steps is None else _steps(steps, 0)[0], exposure_out, as_json)
        return
    first, last = _steps(steps, int(saved.get("step", 0)))
    world = int(saved.get("world_size") or 1)  # (each step's rows split over the ranks: its own batch size)
    if not 0 <= first < last:
        raise ArgumentError(f"--steps {steps}: pass A or A:B with 0 <= A < B")
    for step in range(first, last):
        if (gone := stream.skipped(step)) is not None:  # a step number the run never handed out (mode "steps")
            shown = f"skipped (steps {gone[0]} .. {gone[1] - 1}, mode 'steps'): no batch"
            render.out.print(json.dumps({"step": step, "skipped": True}) if as_json else f"step {step:,}: {shown}",
                             highlight=False)  # fmt: skip
            continue
        rows = stream.trace(step)
        per_rank = max(1, len(rows) // world)
        if as_json:
            out = [{"rank": r // per_rank, "row": r % per_rank, "pieces": [_piece(p, data, text) for p in row]}
                   for r, row in enumerate(rows)]  # fmt: skip
            render.out.print(json.dumps({"step": step, "rows": out}), highlight=False, soft_wrap=True)
            continue
        render.out.print(f"step {step:,}", highlight=False)
        for r, row in enumerate(rows):
            shown = "; ".join(_line(p) for p in row)
            render.out.print(f"  rank {r // per_rank} row {r % per_rank}: {escape(shown)}", highlight=False,
                             soft_wrap=True)  # fmt: skip
            if text:
                for p in row:
                    render.out.print(f"    doc {p.doc:,}: {escape(repr(_text(p, data)))}", highlight=False,
                                     soft_wrap=True)  # fmt: skip


def _load_state(path: Path, key: str | None) -> dict[str, Any]:
    from ..errors import ArgumentError, InputError

    if not path.is_file():
        raise InputError(f"--state {path}: no such file")
    try:
        if path.suffix == ".json":
            found: Any = json.loads(path.read_text(encoding="utf-8"))
        else:
            import torch

            found = torch.load(path, map_location="cpu", weights_only=True)  # (a checkpoint: tensors and dicts)
    except Exception as e:  # (not JSON, not a checkpoint torch can read safely)
        raise InputError(f"--state {path}: not a JSON file or a torch checkpoint ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None  # fmt: skip
    for part in key.split(".") if key else []:
        if not isinstance(found, dict) or part not in found:
            keys = ", ".join(sorted(map(str, found))[:8]) if isinstance(found, dict) else type(found).__name__
            raise ArgumentError(f"--key {key}: {part!r} is not in the checkpoint (it holds: {keys})")
        found = found[part]
    if not isinstance(found, dict) or "kind" not in found:
        hint = "; pass --key with where the loader state is" if isinstance(found, dict) else ""
        raise ArgumentError(f"--state {path}: not a loader state (no 'kind'){hint}")
    return found


def _steps(spec: str | None, default: int) -> tuple[int, int]:
    from ..errors import ArgumentError

    if spec is None:
        return default, default + 1
    a, _, b = spec.partition(":")
    try:
        return int(a), int(b) if b else int(a) + 1
    except ValueError:
        raise ArgumentError(f"--steps {spec}: pass a step (41237) or a range (41200:41300)") from None


def _line(p: Any) -> str:
    origin = f" from {p.input}:{p.record}" if p.input else ""
    return f"doc {p.doc:,} ({p.shard} #{p.index:,}){origin} tokens {p.start:,}-{p.end:,} of {p.length:,}" + (
        f" [source {p.source}]" if p.source else "")  # fmt: skip


def _piece(p: Any, data: Any, text: bool) -> dict[str, Any]:
    out = p.to_json()
    if text:
        out["text"] = _text(p, data)
    return out


def _text(p: Any, data: Any) -> str:
    return str(data.decode(data.tokens(p.offset, p.end - p.start)))[:TEXT_CHARS]


def _exposure(stream: Any, steps: int, out: Path | None, as_json: bool) -> None:
    """The exposure summary of steps [0, steps), and the counts written to `out`."""
    import numpy as np

    counts = np.asarray(stream.exposure(steps))
    seen = int((counts > 0).sum())
    top = np.argsort(-counts, kind="stable")[:5]
    summary: dict[str, Any] = {"steps": steps, "documents": len(counts), "seen": seen,
               "times": {"0": len(counts) - seen, "1": int((counts == 1).sum()), "2": int((counts == 2).sum()),
                         "3+": int((counts >= 3).sum())},
               "most": [[int(d), int(counts[d])] for d in top.tolist() if counts[d] > 0]}  # fmt: skip
    if out is not None:
        np.save(out, counts.astype(np.uint32))
        summary["written"] = str(out)
    if as_json:
        render.out.print(json.dumps(summary), highlight=False, soft_wrap=True)
        return
    share = seen / len(counts) if len(counts) else 0.0
    times = summary["times"]
    when = f"steps 0..{steps - 1:,}" if steps else "before step 0 (no step yet)"
    most = "; most seen: " + ", ".join(f"doc {d:,} ({n:,}x)" for d, n in summary["most"]) if summary["most"] else ""
    render.out.print(f"{when}: {seen:,} of {len(counts):,} documents seen ({share:.1%}); once {times['1']:,}, "
                     f"twice {times['2']:,}, 3+ times {times['3+']:,}{most}"
                     + (f"; counts written to {escape(str(out))}" if out else ""), highlight=False,
                     soft_wrap=True)  # fmt: skip


def diff_datasets(first: str, second: str, as_json: bool) -> int:
    """`lmshard inspect A --diff B` (inspect/diff.py); the exit code."""
    from ..errors import ConfigError
    from ..format import load_metadata
    from ..inspect import audit
    from ..inspect.diff import diff

    metas, decoders = [], []
    for path in (first, second):
        audit.require_dataset(Path(path))
        meta = load_metadata(path)
        why: list[str] = []
        decoder = audit.decoder_for(meta, why)
        if decoder is None:
            what = why[0] if why else "cannot decode it"
            raise ConfigError(f"{meta.root}: --diff compares documents' texts, and {what}")
        metas.append(meta)
        decoders.append(decoder)
    result = diff(metas[0], metas[1], (decoders[0], decoders[1]))
    if as_json:
        render.out.print(json.dumps(result.to_json()), highlight=False, soft_wrap=True)
        return 0
    render.out.print(f"{escape(result.b)} against {escape(result.a)}: added {result.added:,}, removed "
                     f"{result.removed:,}, kept {result.kept:,} documents ({result.b_documents:,} and "
                     f"{result.a_documents:,} in all)", highlight=False, soft_wrap=True)  # fmt: skip
    for kind, examples in result.examples.items():
        for e in examples:
            origin = f" from {e['input']}:{e['record']}" if "input" in e else ""
            render.out.print(f"  {kind}: {escape(e['document'])}{escape(origin)}", highlight=False, soft_wrap=True)
    return 0


def decontamination(dataset: Path, benchmarks: list[str], as_json: bool) -> int:
    """`inspect DATASET --decontaminate FILE`: what prepare --decontaminate would remove (inspect/decon.py)."""
    from ..errors import ConfigError
    from ..format import load_metadata
    from ..inspect import audit, decon

    audit.require_dataset(dataset)
    meta, why = load_metadata(dataset), list[str]()
    decoder = audit.decoder_for(meta, why)
    if decoder is None:
        raise ConfigError(f"{dataset}: --decontaminate compares texts, and {why[0] if why else 'cannot decode it'}")
    said = decon.report(meta, benchmarks, decoder)
    if as_json:
        render.out.print_json(data=said)
        return 0
    render.out.print(f"{escape(str(dataset))}: {said['documents']:,} documents against {said['grams']:,} benchmark "
              f"{said['n']}-grams", highlight=False, soft_wrap=True)  # fmt: skip
    for name, splits in said["contaminated"].items():
        shown = ", ".join(f"{split} {n:,}" for split, n in splits.items()) or "none"
        render.out.print(f"  {escape(name)}: {shown}", highlight=False)
    for e in said["examples"]:
        render.out.print(f"  {e['document']} ({e['benchmark']}): {escape(e['text'])}\n    item: {escape(e['item'])}",
                         highlight=False, soft_wrap=True)  # fmt: skip
    return 0


def attribute_distributions(dataset: str, names: list[str], split: str, as_json: bool) -> int:
    """`inspect DATASET --attribute NAME`: the attributes' distributions over a split (inspect/attributes.py)."""
    from ..errors import ConfigError
    from ..format import load_metadata
    from ..inspect import audit
    from ..inspect.attributes import distributions
    from ..remote import is_url

    if is_url(dataset):
        raise ConfigError("--attribute reads a local dataset; run it on a local copy (`lmshard cp URL DIR`)")
    audit.require_dataset(Path(dataset))
    found = distributions(load_metadata(Path(dataset)), names, split)
    if as_json:
        render.out.print_json(data={"dataset": dataset, "split": split, "attributes": found})
    else:
        render.attributes(found, f"{dataset} [{split}]")
    return 0
