"""`lmshard retokenize --num-tasks N`: a GPT-2 dataset of many shards retokenized to a
Llama-3-like vocabulary as planned tasks (stages run in any task order, by hand through
`run-task`, in the local pool) writes byte for byte the files a one-process retokenize writes;
a stage run before the one it needs, a changed source and other options are refused in one line,
and a task stopped midway is finished by running it again."""

from __future__ import annotations

import json
import os
import re
import time

import numpy as np
import pytest
from proctree import _tgkill
from test_hf_tokenizer import big  # noqa: F401  (module fixture: the big vocabulary)
from test_prepare import jsonl, make_texts
from test_retokenize import _prepare
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import ConfigError, InputError
from lmshard.format import load_metadata
from lmshard.interop import retoktasks
from lmshard.interop.retokenize import retokenize_dataset
from lmshard.prepare.execution.taskplan import work_dir


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A GPT-2 dataset in shards of at most 6,000 tokens, with an attribute and a val split."""
    tmp = tmp_path_factory.mktemp("retok_tasks")
    texts = make_texts(900, seed=43)
    inputs = [jsonl(tmp / "a.jsonl", texts[:500] + texts[:30]), jsonl(tmp / "b.jsonl", texts[500:])]
    root = _prepare(tmp / "gpt2", inputs, attributes=["length"], tokens_per_shard=6_000)
    meta = load_metadata(root)
    assert len(meta.split_shards("train")) > 8 and meta.n_docs("val") > 0
    return root


def _files(root):
    """Every file under `root` with its bytes; the metadata without its run record (how it ran)."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == "dataset_metadata.json":
            meta = json.loads(data)
            meta["run"] = [step["op"] for step in meta["run"]["lineage"]]  # (not where, when, how many workers)
            data = json.dumps(meta, sort_keys=True).encode()
        out[str(path.relative_to(root))] = data
    return out


@pytest.fixture(scope="module")
def one(source, big, tmp_path_factory):  # noqa: F811
    """The one-process retokenize the planned runs must equal, in shards of at most 5,000 tokens."""
    out = tmp_path_factory.mktemp("one") / "one"
    retokenize_dataset(source, str(big["file"]), out, tokens_per_shard=5_000, workers=1)
    return _files(out)


def _by_hand(source, out, n, big, order=reversed):  # noqa: F811
    retoktasks.plan(source, out, n, tokenizer=str(big["file"]), tokens_per_shard=5_000)
    for stage in ("encode", "write"):
        for task in order(range(n)):
            retoktasks.Tasks.of(out).run(stage, task)
    # the tasks removed what their marks made redundant: the finish is left a unit per pair of neighbours at most
    left = sorted(p.name for folder in ("encode", "write") for p in (work_dir(out) / folder).iterdir())
    assert len(left) <= 2 * (n - 1) and not [name for name in left if name.endswith(".json")], left
    retoktasks.Tasks.of(out).run("finish", 0)
    assert not work_dir(out).exists()
    return _files(out)


@pytest.mark.parametrize("n", [1, 4, 13])
def test_planned_tasks_in_any_order_write_the_one_process_bytes(tmp_path, source, one, big, n):  # noqa: F811
    got = _by_hand(source, tmp_path / "re", n, big)
    assert got.keys() == one.keys()
    assert [f for f in one if got[f] != one[f]] == []
    meta = load_metadata(tmp_path / "re")
    assert len(meta.split_shards("train")) > 8 and meta.lmshard_version
    assert {s.n_docs for s in meta.shards} != {1}  # (shards of several documents, cut inside source shards)


def test_documents_longer_than_a_shard_get_their_own_in_tasks_too(tmp_path, big, monkeypatch):  # noqa: F811
    """Two documents of some 4,000 tokens among short ones, in shards of 1,500: each long one
    gets a shard of its own, whichever source shard and task it comes from. (The vocabulary is
    named by a relative path where the plan is made; the tasks run elsewhere.)"""
    texts = make_texts(120, seed=5)
    texts[30] = texts[90] = " ".join(texts[:60])  # (the same text twice: one is a duplicate, dropped)
    texts[70] = " ".join(texts[60:120:2][::-1])
    source = _prepare(tmp_path / "gpt2", [jsonl(tmp_path / "a.jsonl", texts)], tokens_per_shard=3_000)
    assert len(load_metadata(source).shards) > 4
    retokenize_dataset(source, str(big["file"]), tmp_path / "one", tokens_per_shard=1_500, workers=1)
    want = _files(tmp_path / "one")
    meta = load_metadata(tmp_path / "one")
    assert sum(s.n_docs == 1 and s.n_tokens > 1_500 for s in meta.shards) == 2  # (the case this test is about)
    assert any(s.n_docs > 1 for s in meta.shards)
    monkeypatch.chdir(big["file"].parent)
    retoktasks.plan(source, tmp_path / "re", 5, tokenizer=big["file"].name, tokens_per_shard=1_500)
    monkeypatch.chdir(tmp_path)
    tasks = retoktasks.Tasks.of(tmp_path / "re")
    for stage in ("encode", "write", "finish"):
        for task in range(5 if stage != "finish" else 1):
            tasks.run(stage, task)
    assert _files(tmp_path / "re") == want


def test_run_task_by_hand_status_and_refusals(tmp_path, source, one, big):  # noqa: F811
    out = tmp_path / "re"
    runner = CliRunner()
    planned = runner.invoke(app, ["retokenize", str(source), "--tokenizer", str(big["file"]), "--out", str(out),
                                  "--tokens-per-shard", "5000", "--num-tasks", "3", "--executor", "none"])  # fmt: skip
    assert planned.exit_code == 0, planned.output
    assert f"lmshard run-task --stage encode --task I {out}" in planned.output and not out.exists()
    early = runner.invoke(app, ["run-task", "--stage", "write", "--task", "0", str(out)])
    assert early.exit_code == 1 and "the encode stage is not complete" in early.output, early.output
    assert "Traceback" not in early.output
    for task in (2, 0):
        done = runner.invoke(app, ["run-task", "--stage", "encode", "--task", str(task), str(out), "--workers", "2"])
        assert done.exit_code == 0, done.output
    shown = runner.invoke(app, ["status", str(out)])
    assert shown.exit_code == 0 and "encode: 2 of 3 tasks complete" in shown.output, shown.output
    assert f"run: lmshard run-task --stage encode --task 1 {out}" in shown.output
    again = runner.invoke(app, ["retokenize", str(source), "--tokenizer", str(big["file"]), "--out", str(out),
                                "--tokens-per-shard", "4000", "--num-tasks", "3", "--executor", "none"])  # fmt: skip
    assert again.exit_code == 1 and "--tokens-per-shard 5000 (now 4000)" in again.output, again.output
    for stage, tasks in (("encode", [1, 1]), ("write", [0, 1, 2, 0])):  # (a task run again does nothing more)
        for task in tasks:
            done = runner.invoke(app, ["run-task", "--stage", stage, "--task", str(task), str(out)])
            assert done.exit_code == 0, done.output
    assert "finish: not run" in runner.invoke(app, ["status", str(out)]).output
    done = runner.invoke(app, ["run-task", "--stage", "finish", str(out)])
    assert done.exit_code == 0, done.output
    assert _files(out) == one and not work_dir(out).exists()


def test_the_local_executor_and_a_task_stopped_midway(tmp_path, source, one, big):  # noqa: F811
    out = tmp_path / "re"
    retoktasks.plan(source, out, 4, tokenizer=str(big["file"]), tokens_per_shard=5_000)
    tasks = retoktasks.Tasks.of(out)
    tasks.run("encode", 1)
    # as if task 1 had been killed writing its last unit: its marker and the unit's are not there yet
    units = list(tasks.share(tasks.n_units, 1))
    folder = work_dir(out) / "encode"
    (folder / f"unit_{units[-1]:06d}.json").unlink(missing_ok=True)  # (a finished task removed its own)
    (folder / f"unit_{units[-1]:06d}.lengths").unlink()
    with open(folder / f"unit_{units[-1]:06d}.tokens.tmp", "wb") as f:
        f.write(b"\xff" * 1000)  # a half-written file of the killed task
    marks = list((work_dir(out) / "done" / "encode").rglob("*.json"))
    assert len(marks) == 1
    marks[0].unlink()
    done = CliRunner().invoke(app, ["retokenize", str(source), "--tokenizer", str(big["file"]), "--out", str(out),
                                    "--tokens-per-shard", "5000", "--num-tasks", "4", "--workers", "2"])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "in 4 tasks" in done.output
    assert _files(out) == one


def test_a_changed_source_or_a_full_out_is_refused(tmp_path, source, big):  # noqa: F811
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not empty; pass --overwrite"):
        retoktasks.plan(source, tmp_path / "full", 2, tokenizer=str(big["file"]))
    assert not work_dir(tmp_path / "full").exists()
    retoktasks.plan(source, tmp_path / "full", 2, tokenizer=str(big["file"]), overwrite=True)
    tasks = retoktasks.Tasks.of(tmp_path / "full")
    for stage, task in (("encode", 0), ("encode", 1), ("write", 0), ("write", 1), ("finish", 0)):
        tasks.run(stage, task)
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"  # (not lmshard's: kept beside the new dataset)
    assert load_metadata(tmp_path / "full").n_docs() == load_metadata(source).n_docs()
    copy = tmp_path / "src"
    os.system(f"cp -r {source} {copy}")
    retoktasks.plan(copy, tmp_path / "re", 2, tokenizer=str(big["file"]))
    meta = json.loads((copy / "dataset_metadata.json").read_text())
    meta["config"]["seed"] = 7  # the source rewritten since the plan
    (copy / "dataset_metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="the source dataset changed since the retokenize was planned"):
        retoktasks.Tasks.of(tmp_path / "re").run("encode", 0)
    retoktasks.plan(source, tmp_path / "other", 2, tokenizer=str(big["file"]))
    head_file = work_dir(tmp_path / "other") / "rewrite.json"
    head_file.write_text(json.dumps(json.loads(head_file.read_text()) | {"lmshard": "0.0.1"}))
    with pytest.raises(InputError, match="planned by lmshard 0.0.1 \\(this is "):
        retoktasks.Tasks.of(tmp_path / "other")
    assert not (work_dir(tmp_path / "re") / "encode").exists()  # (nothing encoded)
    assert np.fromfile(copy / load_metadata(copy).shards[0].path, dtype="<u4").size > 0  # (the source untouched)


def test_a_task_stopped_by_sigterm_is_shown_stopped_and_run_again(tmp_path, source, one, big):  # noqa: F811
    """`run-task` stopped at its second source shard (LMSHARD_STOP_AT) and sent SIGTERM, as a
    scheduler's time limit sends it: it exits 143, `status` shows it stopped by SIGTERM with the
    shard it finished, and the same command again finishes it; the one-process bytes."""
    import sys

    out = tmp_path / "re"
    retoktasks.plan(source, out, 2, tokenizer=str(big["file"]), tokens_per_shard=5_000)
    cmd = [sys.executable, "-m", "lmshard", "run-task", "--stage", "encode", "--task", "0", str(out), "--workers", "1"]
    returncode, err = _terminated_at(cmd, tmp_path, "unit=1!")
    assert returncode == 143 and "stopped: encode task 0 stopped by SIGTERM" in err, err
    shown = CliRunner().invoke(app, ["status", str(out)])
    assert re.search(r"task 0: 2 of \d+ \(stopped on \S+ \(pid \d+\) by SIGTERM\); run: lmshard run-task --stage "
                     r"encode --task 0", " ".join(shown.output.split())), shown.output  # fmt: skip
    tasks = retoktasks.Tasks.of(out)
    for stage, task in (("encode", 0), ("encode", 1), ("write", 0), ("write", 1), ("finish", 0)):
        tasks.run(stage, task)
    assert _files(out) == one


def test_the_local_executor_stopped_by_sigterm_dies_of_it_and_the_command_again_finishes(tmp_path, source, one,
                                                                                          big):  # noqa: F811
    """`retokenize --num-tasks 2` on the local pool with one worker runs its tasks in this
    process: SIGTERM (a scheduler's) ends it as it ends any command, and the same command again
    goes on from what is done."""
    import signal
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "lmshard", "retokenize", str(source), "--tokenizer", str(big["file"]), "--out",
           str(tmp_path / "re"), "--tokens-per-shard", "5000", "--num-tasks", "2", "--workers", "1"]  # fmt: skip
    returncode, err = _terminated_at(cmd, tmp_path, "unit=3!")
    assert returncode == -signal.SIGTERM and "error" not in err, (returncode, err)
    assert not (tmp_path / "re").exists() and not list((work_dir(tmp_path / "re") / "tasks").glob("*"))
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert _files(tmp_path / "re") == one


def _terminated_at(cmd, cwd, stop_at):
    """`cmd` run until it stops itself at `stop_at` (LMSHARD_STOP_AT), then sent SIGTERM and
    woken, as a scheduler's time limit stops a task: its exit status and stderr."""
    import signal
    import subprocess
    from pathlib import Path

    child = subprocess.Popen(cmd, cwd=cwd, env=os.environ | {"LMSHARD_STOP_AT": stop_at}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120  # a timeout, never a condition
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            assert time.monotonic() < deadline and child.poll() is None, child.communicate()
            time.sleep(0.02)
        # To its main thread, which waits for it: a process-directed signal may be taken by another of its
        # threads (a tokenizer's), and the main thread would wait for ever (proctree.signal_stopped)
        if not _tgkill(child.pid, child.pid, signal.SIGTERM):
            child.send_signal(signal.SIGTERM)
        child.send_signal(signal.SIGCONT)
        _, err = child.communicate(timeout=120)
    finally:
        child.kill()
    return child.returncode, err
