"""What `prepare` logs when stderr is a file, on a clock the test drives, and what a resumed run
says it kept (runs stopped at exact points by LMSHARD_STOP_AT, never raced against a clock)."""

from __future__ import annotations

import os
import re
import shutil
import types

import pytest
from proctree import finish, kill_group, start_prepare, wait_stopped
from test_prepare import jsonl, make_texts
from test_stages import _files

from lmshard.cli.runlog import RunLog, done_line, progress_line
from lmshard.prepare.pipeline import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _log(capsys, interval: float) -> tuple[RunLog, Clock]:
    clock = Clock()
    log = RunLog(types.SimpleNamespace(log_interval=interval, quiet=False), clock=clock)
    log.plain = True
    capsys.readouterr()
    return log, clock


def test_progress_lines_come_every_interval_of_the_clock(capsys):
    log, clock = _log(capsys, 10.0)
    update = log.follow(lambda callback: callback)
    shown = []
    for t in (0.5, 4.0, 9.99, 10.0, 15.0, 19.9, 20.0, 31.0):
        clock.now = t
        update(Progress(bytes_done=int(t * 1e6), bytes_total=40_000_000, docs=int(t), tokens=int(t * 1e6)))
        lines = capsys.readouterr().err.splitlines()
        shown += [t] * len(lines)
    assert shown == [10.0, 20.0, 31.0]


def test_zero_interval_logs_every_update(capsys):
    log, clock = _log(capsys, 0.0)
    update = log.follow(lambda callback: callback)
    for t in range(5):
        clock.now = float(t)
        update(Progress(bytes_done=t, bytes_total=10, docs=t, tokens=t))
    assert len(capsys.readouterr().err.splitlines()) == 5


def test_a_resumed_run_reports_this_runs_rate_and_says_what_it_kept(capsys):
    log, clock = _log(capsys, 10.0)
    update = log.follow(lambda callback: callback)
    kept = "resuming: 9 of 10 units tokenized (9,000 documents, 900,000,000 tokens) kept from the interrupted run"
    update(Progress(bytes_done=900_000_000, bytes_total=1_000_000_000, docs=9000, tokens=900_000_000,
                    bytes_at_start=900_000_000, tokens_at_start=900_000_000, note=kept))  # fmt: skip
    assert capsys.readouterr().err.splitlines() == [kept]  # at once, before any interval passed
    clock.now = 10.0  # 10 s later: 20 M more tokens, 20 MB more input
    update(Progress(bytes_done=920_000_000, bytes_total=1_000_000_000, docs=9200, tokens=920_000_000,
                    bytes_at_start=900_000_000, tokens_at_start=900_000_000))  # fmt: skip
    (line,) = capsys.readouterr().err.splitlines()
    assert "2.00 M tokens/s" in line, line  # not 92 M tokens/s (the kept tokens over this run's 10 s)
    assert "ETA 0:00:40" in line, line  # 80 MB left at 2 MB/s


def test_progress_line_of_a_fresh_run():
    line = progress_line(Progress(bytes_done=25_000_000, bytes_total=100_000_000, docs=1, tokens=5_000_000), 5.0)
    assert line == ("prepare: 25.0 MB of 100.0 MB (25.0%) read, 1 doc, 5,000,000 tokens, 1.00 M tokens/s, "
                    "0:00:05 elapsed, ETA 0:00:15")  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return jsonl(tmp_path_factory.mktemp("runlog") / "a.jsonl", make_texts(6000, seed=3))


@pytest.fixture
def process_items(monkeypatch):
    monkeypatch.setenv("LMSHARD_BLOCK_BYTES", str(64 << 10))  # ~35 work items


def _stopped_then_killed(args: list[str]) -> None:
    proc = start_prepare(args)
    assert wait_stopped(proc) is not None, "the run ended before its stop point"
    kill_group(proc.pid)
    proc.communicate()


def _resume(args: list[str], monkeypatch) -> str:
    monkeypatch.delenv("LMSHARD_STOP_AT")
    code, err = finish(start_prepare([*args, "--resume", "--log-interval", "0"]), 300)
    assert code == 0, err
    return err


UNITS = ["--unit-size", "256K"]  # (the 2.1 MB corpus in 9 units)
NOTE = re.compile(r"^resuming: (\d+) of (\d+) units tokenized \(([\d,]+) documents, ([\d,]+) tokens\) kept from the "
                  r"interrupted run$")


def _note(err: str) -> tuple[int, int, int, int]:
    """The one resume note of a run's log: units done, units, documents, tokens."""
    said = [line for line in err.splitlines() if line.startswith("resuming:")]
    assert len(said) == 1 and (m := NOTE.match(said[0])), err
    return tuple(int(g.replace(",", "")) for g in m.groups())  # type: ignore[return-value]


def test_resume_says_what_the_interrupted_run_kept(tmp_path, corpus, process_items, monkeypatch):
    """Killed after its third unit: the resumed run says, before any progress, the units kept and
    their documents and tokens (as their markers count them), and ends with one run's bytes."""
    from lmshard.prepare.execution.taskplan import work_dir
    from lmshard.prepare.execution.unitfiles import unit_marker

    out = tmp_path / "o"
    args = [str(corpus), "--out", str(out), "--workers", "1", "--tokens-per-shard", "20000", *UNITS]
    monkeypatch.setenv("LMSHARD_STOP_AT", "unit:3")
    _stopped_then_killed(args)
    markers = [unit_marker(work_dir(out) / "tokenize", u) for u in range(3)]
    err = _resume(args, monkeypatch)
    done, units, docs, tokens = _note(err)
    assert (done, units) == (3, 9) and docs == sum(m["docs"] for m in markers) > 0
    assert tokens == sum(m["tokens"] for m in markers) + docs  # (each document's EOT counted)
    assert err.index("resuming:") < err.index("\nprepare: ")  # before the first progress line
    code, _ = finish(start_prepare([*args[:2], str(tmp_path / "whole"), *args[3:]]), 300)
    assert code == 0 and _files(out) == _files(tmp_path / "whole")  # the resumed run's bytes are one run's


def test_a_run_killed_in_its_first_unit_says_it_starts_over(tmp_path, corpus, process_items, monkeypatch):
    out = tmp_path / "o"
    args = [str(corpus), "--out", str(out), "--workers", "1"]
    monkeypatch.setenv("LMSHARD_STOP_AT", "item:3")
    _stopped_then_killed(args)
    err = _resume(args, monkeypatch)
    assert _note(err) == (0, 1, 0, 0), err
    assert os.path.exists(out / "dataset_metadata.json")


@pytest.mark.parametrize("staged", [False, True])
def test_resume_of_a_complete_run_says_so_and_prints_no_summary_as_if_it_had_worked(tmp_path, corpus, staged,
                                                                                  monkeypatch):  # fmt: skip
    import subprocess

    from proctree import LMSHARD

    if staged:
        monkeypatch.setenv("LMSHARD_POOL_BYTES", "0")  # (in the pool)
    args = [str(corpus), "--out", str(tmp_path / "o"), "--workers", "2" if staged else "1"]
    assert finish(start_prepare(args), 300)[0] == 0
    code, err = finish(start_prepare([*args, "--resume"]), 300)
    assert code == 0 and f"resuming: {tmp_path / 'o'} is already complete; nothing to do" in err.splitlines(), err
    done = subprocess.run([*LMSHARD, "prepare", *args, "--resume"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "already complete, nothing was done" in done.stdout, done.stdout
    assert "records read" not in done.stdout  # no summary table, as if this run had made it
    again = subprocess.run([*LMSHARD, "prepare", *args, "--resume", "--json"], capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert '"already_complete": true' in again.stdout


def test_a_staged_resume_says_what_the_interrupted_run_kept(tmp_path, monkeypatch):
    """A large (staged) run killed after some units, then --resume: one line before any progress
    says how many units (documents, tokens) it goes on from."""
    monkeypatch.setenv("LMSHARD_POOL_BYTES", "0")  # (the path of a large input: units sized to the workers)
    monkeypatch.setenv("LMSHARD_UNIT_BYTES", str(64 << 10))
    src = jsonl(tmp_path / "big.jsonl", make_texts(6000, seed=4))
    args = [str(src), "--out", str(tmp_path / "o"), "--workers", "2"]
    monkeypatch.setenv("LMSHARD_STOP_AT", "unit=3")
    _stopped_then_killed(args)
    err = _resume(args, monkeypatch)
    said = [line for line in err.splitlines() if line.startswith("resuming:")]
    assert len(said) == 1 and re.match(r"resuming: \d+ of \d+ units tokenized \([\d,]+ documents, [\d,]+ tokens\) "
                                       r"kept from the interrupted run$", said[0]), err  # fmt: skip
    assert int(said[0].split()[1]) >= 1


def test_a_staged_resume_counts_what_it_kept_as_the_dataset_counts(tmp_path, monkeypatch):
    """Killed once every unit is tokenized (its select stage held): the resume line's documents
    and tokens are the whole input's, so with nothing dropped they equal the finished dataset's
    (its tokens with each document's EOT, as every count of a dataset has them). Killed midway
    through the tokenize stage: the progress lines after the note count on from it and end at
    the dataset's tokens."""
    import json

    monkeypatch.setenv("LMSHARD_POOL_BYTES", "0")
    monkeypatch.setenv("LMSHARD_UNIT_BYTES", str(64 << 10))
    src = jsonl(tmp_path / "big.jsonl", make_texts(3000, seed=4))
    args = [str(src), "--out", str(tmp_path / "o"), "--workers", "2", "--no-dedup"]
    monkeypatch.setenv("LMSHARD_STOP_AT", "select=0")
    _stopped_then_killed(args)
    err = _resume(args, monkeypatch)
    said = [line for line in err.splitlines() if line.startswith("resuming:")]
    meta = json.loads((tmp_path / "o" / "dataset_metadata.json").read_text())
    assert not any(meta["drops"].values()), meta["drops"]
    docs, tokens = meta["n_docs"], meta["n_tokens"]
    assert len(said) == 1 and f"units tokenized ({docs:,} documents, {tokens:,} tokens)" in said[0], (said, err)
    shutil.rmtree(tmp_path / "o")
    monkeypatch.setenv("LMSHARD_STOP_AT", "unit=3")
    _stopped_then_killed(args)
    err = _resume(args, monkeypatch)
    lines = [line for line in err.splitlines() if line.startswith(("resuming:", "prepare:"))]
    counted = [int(m.group(1).replace(",", "")) for line in lines if (m := re.search(r"[(,] ([\d,]+) tokens", line))]
    assert len(counted) > 2 and counted == sorted(counted) and counted[-1] == tokens, lines  # (as the note counts)


def test_an_append_summary_says_what_this_run_added(tmp_path, corpus):
    import json
    import subprocess

    from proctree import LMSHARD

    first = jsonl(tmp_path / "first.jsonl", make_texts(300, seed=41))
    out = str(tmp_path / "o")
    assert subprocess.run([*LMSHARD, "prepare", str(first), "--out", out], capture_output=True).returncode == 0
    before = json.loads((tmp_path / "o" / "dataset_metadata.json").read_text())
    done = subprocess.run([*LMSHARD, "prepare", str(corpus), "--out", out, "--append"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    after = json.loads((tmp_path / "o" / "dataset_metadata.json").read_text())
    docs, tokens = after["n_docs"] - before["n_docs"], after["n_tokens"] - before["n_tokens"]
    assert done.returncode == 0 and f"appended: this run added {docs:,} docs, {tokens:,} tokens" in done.stdout, \
        done.stdout


def test_a_ctrl_c_while_the_summary_prints_exits_0_saying_the_dataset_is_complete(tmp_path, corpus, monkeypatch):
    """Ctrl-C once the dataset is in place, while the summary prints (Python's handler raises
    KeyboardInterrupt there): nothing is lost, so the run exits 0 and says the dataset is complete,
    not "interrupted: nothing was kept" with the exit of a stopped run."""
    from typer.testing import CliRunner

    import lmshard.cli.render as render
    from lmshard.cli import app

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(render, "summary", ctrl_c)
    out = tmp_path / "o"
    done = CliRunner().invoke(app, ["prepare", str(corpus), "--out", str(out), "--tokenizer-backend", "tiktoken"])
    said = " ".join(done.output.split())
    assert done.exit_code == 0 and f"interrupted: {out} was complete already" in said, said
    assert "nothing was kept" not in said and (out / "dataset_metadata.json").exists()


def test_the_done_line_of_a_run_without_a_rate_says_why(tmp_path, corpus):
    """A dataset whose planned tasks ran apart records no tokens/s (null): its done line says so,
    not that the run made no tokens; a recorded 0 (a resume with nothing left) says that."""
    import dataclasses

    from lmshard.format import load_metadata
    from lmshard.prepare import PrepareConfig, prepare

    prepare(PrepareConfig(inputs=[str(corpus)], out=str(tmp_path / "o"), workers=1))
    meta = load_metadata(tmp_path / "o")
    for rate, said in ((None, "no rate: its tasks ran apart"),
                       (0.0, "no tokens made by this run (all were before it)")):  # fmt: skip
        line = done_line(dataclasses.replace(meta, run=dataclasses.replace(meta.run, tokens_per_s=rate)), "o")
        assert line.endswith(f" s, {said}"), line


def test_the_rate_of_a_resumed_run_counts_its_own_tokens(tmp_path, corpus, process_items, monkeypatch):
    """The metadata's tokens/s (and the done line's) is this run's tokens over this run's time,
    not the kept units' tokens as well: below the whole dataset's tokens over this run's time."""
    out = tmp_path / "o"
    args = [str(corpus), "--out", str(out), "--workers", "1", *UNITS]
    monkeypatch.setenv("LMSHARD_STOP_AT", "unit:7")  # most of the input is kept
    _stopped_then_killed(args)
    kept = _note(_resume(args, monkeypatch))[3]
    run = __import__("json").loads((out / "dataset_metadata.json").read_text())
    total, rate, elapsed = run["n_tokens"], run["run"]["tokens_per_s"], run["run"]["elapsed_s"]
    assert kept > total // 2 and rate * elapsed == pytest.approx(total - kept, rel=0.05, abs=1_000), (rate, elapsed)


def test_the_resume_note_of_an_append_counts_only_its_own_units(tmp_path, corpus, process_items, monkeypatch):
    """An --append killed after two of its units: the note counts the new input's units and
    documents, not the dataset's it extends."""
    out = tmp_path / "o"
    first = jsonl(tmp_path / "first.jsonl", make_texts(3000, seed=11))
    shard = ["--tokens-per-shard", "20000", "--workers", "1", *UNITS]
    assert finish(start_prepare([str(first), "--out", str(out), *shard]), 300)[0] == 0
    args = [str(corpus), "--out", str(out), "--append", *shard]
    monkeypatch.setenv("LMSHARD_STOP_AT", "unit:2")
    _stopped_then_killed(args)
    done, units, docs, _ = _note(_resume(args, monkeypatch))
    assert (done, units) == (2, 9) and 0 < docs < 6000


@pytest.mark.parametrize("encoding", ["uint32", "zstd"])
def test_the_summary_gives_the_encoding_and_the_bytes_on_disk(tmp_path, corpus, encoding):
    import json
    import subprocess

    from proctree import LMSHARD

    out = tmp_path / "o"
    done = subprocess.run([*LMSHARD, "prepare", str(corpus), "--out", str(out), "--shard-encoding", encoding,
                           "--json"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    on_disk = sum(p.stat().st_size for split in ("train", "val") for p in (out / split).glob("*") if p.is_file())
    assert summary["encoding"] == encoding and summary["bytes_on_disk"] == on_disk > 0
    table = subprocess.run([*LMSHARD, "prepare", str(corpus), "--out", str(tmp_path / "t"), "--shard-encoding",
                            encoding], capture_output=True, text=True, timeout=300).stdout  # fmt: skip
    assert " on disk" in table and encoding in table
