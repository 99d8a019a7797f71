"""The command line as users from elsewhere meet it: logs when stderr is a file (nohup, Slurm),
`--json` for scripts, `--quiet`, other tools' option spellings, and help at 80 columns."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from conftest import write
from test_prepare import jsonl, make_texts
from test_stages import _files
from typer.testing import CliRunner

from lmshard import __version__
from lmshard.cli import app

runner = CliRunner()
LMSHARD = [sys.executable, "-m", "lmshard"]
ESCAPE = re.compile(r"\x1b|\r")  # terminal control: escape sequences, carriage-return redraws


def _run(args, cwd, **kw):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "80"}
    return subprocess.run([*LMSHARD, *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env, **kw)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("users")
    return jsonl(tmp / "in" / "a.jsonl", make_texts(6000, seed=8) + make_texts(200, seed=8))  # 200 duplicates


@pytest.mark.parametrize("staged", ["", "pool", "here"], ids=["one process", "stages", "stages here"])
def test_a_redirected_stderr_gets_a_start_line_progress_and_the_summary(tmp_path, corpus, staged):
    """`lmshard prepare ... 2> log`: plain lines, no escape codes, in one process, as the stages
    in the pool (the path of a large input: forced here), and as the stages in this process (one
    worker: one unit of the whole input). `--log-interval 0` logs after every work item (64 KiB
    items) or unit (64 KiB units), which cut the 2.2 MB input into ~35: the number of progress
    lines depends on the input alone, never on how fast the machine is."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LMSHARD_BLOCK_BYTES": str(64 << 10)}
    if staged == "pool":
        env |= {"LMSHARD_POOL_BYTES": "0", "LMSHARD_UNIT_BYTES": str(64 << 10)}
    if staged == "here":  # (its one unit's work items counted as they are tokenized)
        env |= {}
    workers = "2" if staged == "pool" else "1"
    with open(tmp_path / "log", "w") as log:
        done = subprocess.run([*LMSHARD, "prepare", str(corpus), "--out", str(tmp_path / "o"), "--workers", workers,
                               "--log-interval", "0"], stdout=subprocess.PIPE, stderr=log, text=True,
                              timeout=300, env=env)  # fmt: skip
    assert done.returncode == 0
    text = (tmp_path / "log").read_text()
    lines = text.splitlines()
    meta = json.loads((tmp_path / "o" / "dataset_metadata.json").read_text())
    assert not ESCAPE.search(text), repr(text[:500])
    said = "2 workers" if staged == "pool" else "1 worker"
    assert lines[0].startswith(f"lmshard prepare: {corpus} -> {tmp_path / 'o'}; tokenizer gpt2, {said},"), lines[0]
    progress = [line for line in lines if line.startswith("prepare: ")]
    assert len(progress) >= corpus.stat().st_size // (64 << 10), text  # one line per work item, or unit
    assert all(
        re.search(r"MB( of .*%\))? read, [\d,]+ docs?, [\d,]+ tokens, [\d.]+ M tokens/s", p) for p in progress
    ), progress
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    n_train = sum(s["n_docs"] for s in train["shards"])
    assert lines[-1].startswith(f"done: {tmp_path / 'o'}: train {n_train:,} docs,"), lines[-1]
    assert f"duplicate {meta['drops']['duplicate']:,}" in lines[-1] and meta["drops"]["duplicate"] == 200
    assert val and "lmshard dataset" in done.stdout  # the table stays on stdout


def test_json_summary_equals_the_metadata_and_quiet_prints_nothing(tmp_path, corpus):
    done = _run(["prepare", str(corpus), "--out", "o", "--workers", "1", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)  # the whole of stdout is one JSON object
    meta = json.loads((tmp_path / "o" / "dataset_metadata.json").read_text())
    for split in ("train", "val"):
        shards = meta["splits"][split]["shards"]
        want = {"docs": sum(s["n_docs"] for s in shards), "tokens": sum(s["n_tokens"] for s in shards)}
        assert summary["splits"][split] == want | {"shards": len(shards)}
    assert summary["n_tokens"] == meta["n_tokens"] and summary["drops"] == {"duplicate": 200}
    assert summary["tokenizer"]["n_vocab"] == 50257 and summary["tokenizer"]["eot_id"] == 50256
    quiet = _run(["prepare", str(corpus), "--out", "q", "--workers", "1", "--quiet"], tmp_path)
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""
    both = _run(["prepare", str(corpus), "--out", "qj", "--workers", "1", "--quiet", "--json"], tmp_path)
    assert both.stderr == "" and json.loads(both.stdout)["n_tokens"] == meta["n_tokens"]


BODY = ["--text-field", "body"]
ONE = ["--workers", "1"]


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        (["--num-proc", "1", *BODY], [*ONE, *BODY]),
        (["--json-keys", "body", *ONE], [*BODY, *ONE]),
        (["--max-samples", "40", *BODY, *ONE], ["--max-docs", "40", *BODY, *ONE]),
        (["--tokens_per_shard", "700", "--val_fraction=0.2", "--no_dedup", "--text_field", "body", "--workers", "1"],
         ["--tokens-per-shard", "700", "--val-fraction=0.2", "--no-dedup", *BODY, *ONE]),
    ],
)  # fmt: skip
def test_other_tools_spellings_give_the_same_bytes(tmp_path, alias, canonical):
    """Each alias is accepted and gives the dataset of the canonical flag (which differs from the
    defaults' dataset, so an ignored alias would show)."""
    src = write(tmp_path / "b.jsonl", "".join(json.dumps({"body": t}) + "\n" for t in make_texts(120, seed=2) * 2))
    for name, flags in (("alias", alias), ("canonical", canonical)):
        result = runner.invoke(app, ["prepare", str(src), *flags, "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    assert _files(tmp_path / "alias") == _files(tmp_path / "canonical")
    default = runner.invoke(app, ["prepare", str(src), *BODY, *ONE, "--out", str(tmp_path / "default")])
    assert default.exit_code == 0
    if alias[0] not in ("--num-proc", "--json-keys"):  # (a wrong --json-keys would find no "text" field)
        assert _files(tmp_path / "alias") != _files(tmp_path / "default")


def test_every_long_option_has_an_underscore_spelling():
    """click resolves `--a_b` to the option `--a-b` for every option of prepare."""
    root = typer.main.get_command(app)
    command = root.commands["prepare"]  # type: ignore[attr-defined]
    parent = root.make_context("lmshard", ["prepare"], resilient_parsing=True)  # its settings reach prepare
    names = {o for p in command.params for o in p.opts if o.startswith("--") and "-" in o[2:]}
    assert len(names) > 20
    for name in names:
        param = next(p for p in command.params if name in p.opts)
        under = "--" + name[2:].replace("-", "_")
        value = [] if param.is_flag else ["1"]
        ctx = command.make_context("prepare", ["x", under, *value], parent=parent, resilient_parsing=True)
        assert ctx.params[param.name] is not None, name


def test_help_reads_at_80_columns(tmp_path):
    text = _run(["prepare", "--help"], tmp_path).stdout
    assert not re.search(r"<(list|bool|str|int|float)", text.split("Options")[1]), text  # metavars, not types
    assert not re.search(r"\w \.(\s|│)", text), text  # no gap where rich ate a "[default]"
    for panel in ("Inputs", "Cleaning and dedup", "Tokenizer", "Output and split", "Execution", "Logging"):
        assert f"─ {panel} ─" in text
    assert max(map(len, text.splitlines())) <= 80
    assert "Default: text." in " ".join(text.split()) and "--num-proc for --workers" in " ".join(text.split())
    table = _run(["datasets"], tmp_path).stdout
    assert "FineWeb-Edu 10B-token sample" in " ".join(table.split()) and max(map(len, table.splitlines())) <= 80
    assert _run(["-V"], tmp_path).stdout.strip() == f"lmshard {__version__}"


def test_one_of_a_thing_is_singular(tmp_path):
    src = write(tmp_path / "a.jsonl", json.dumps({"text": "one document"}) + "\n")
    done = _run(["prepare", str(src), "--out", "o", "--workers", "1", "--val-fraction", "0"], tmp_path)
    flat = " ".join(done.stdout.split())
    assert "1 doc 3 tokens 1 shard" in flat and "1 worker" in flat, done.stdout
    assert not re.search(r"\b1 (docs|shards|workers)\b", flat + done.stderr)


def test_the_loader_takes_validation_for_val(tmp_path, corpus):
    from lmshard import TokenDataset

    assert _run(["prepare", str(corpus), "--out", "o", "--workers", "1"], tmp_path).returncode == 0
    assert (
        TokenDataset(Path(tmp_path / "o"), split="validation").n_tokens == TokenDataset(tmp_path / "o", "val").n_tokens
    )


def test_inspect_in_a_log_says_what_it_verifies(tmp_path, corpus):
    assert _run(["prepare", str(corpus), "--out", "o", "--workers", "1"], tmp_path).returncode == 0
    done = _run(["inspect", "o"], tmp_path)
    assert done.returncode == 0 and done.stderr.startswith("inspect: verifying 2 shards of o"), done.stderr
    assert not ESCAPE.search(done.stderr)
    assert _run(["inspect", "o", "--json"], tmp_path).stderr == ""


def test_json_of_a_run_planned_for_elsewhere_is_still_one_object(tmp_path, corpus):
    done = _run(["prepare", str(corpus), "--out", "o", "--num-tasks", "2", "--executor", "none", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    units = json.loads((tmp_path / ".o.lmshard-work" / "plan.json").read_text())["n_units"]
    assert units == 8  # 4 per task: units are sized to the task count
    assert json.loads(done.stdout) == {"out": "o", "executor": "none", "n_tasks": 2, "units": units, "merged": False,
                                       "follow": "lmshard status o"}  # fmt: skip
    assert "lmshard run-task --stage tokenize --task I o" in done.stderr  # the commands, out of stdout's way
