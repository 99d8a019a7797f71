"""The local executor (`prepare --num-tasks N`, lmshard/prepare/local_exec.py) when processes
die: a killed main process takes its workers with it, a killed worker is one line naming the
fix, and `--resume` then finishes with the one-machine bytes."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from proctree import finish, signal_stopped, start_prepare, wait_for_workers, wait_gone, wait_stopped
from test_prepare import jsonl, make_texts
from test_stages import _files

from lmshard.format import IN_PROGRESS_FILE


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("localexec")
    return jsonl(tmp / "in" / "a.jsonl", make_texts(40_000, seed=4))  # ~100 units of 64 KiB: seconds of work


@pytest.fixture(autouse=True)
def small_units(monkeypatch):
    monkeypatch.setenv("LMSHARD_UNIT_BYTES", str(64 << 10))


def _args(corpus, out):
    return [str(corpus), "--out", str(out), "--num-tasks", "3", "--workers", "2", "--tokenizer-backend", "tiktoken"]


def _held_midway(out, proc):
    """The run (started with LMSHARD_STOP_AT) stopped itself midway; the pid that stopped."""
    pid = wait_stopped(proc)
    assert pid is not None, "the run ended before its stop point"
    tok = out.parent / f".{out.name}.lmshard-work" / "tokenize"
    assert any(tok.glob("unit_*.done"))
    return pid


def _finish_and_compare(corpus, tmp_path, out):
    again = start_prepare([*_args(corpus, out), "--resume"])
    code, err = finish(again, 300)
    assert code == 0, err
    one = start_prepare(
        [str(corpus), "--out", str(tmp_path / "one"), "--workers", "1", "--tokenizer-backend", "tiktoken"]
    )
    assert finish(one, 300)[0] == 0
    assert _files(out) == _files(tmp_path / "one")


def test_killing_the_main_process_takes_its_workers_along(tmp_path, corpus, monkeypatch):
    out = tmp_path / "o"
    monkeypatch.setenv("LMSHARD_STOP_AT", "item:3")  # the main process, once it merged 3 items
    proc = start_prepare(_args(corpus, out))
    workers = wait_for_workers(proc, 2)
    assert len(workers) == 2
    assert _held_midway(out, proc) == proc.pid
    monkeypatch.delenv("LMSHARD_STOP_AT")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert wait_gone(workers, timeout=5.0) == []  # not left waiting for tasks forever
    _finish_and_compare(corpus, tmp_path, out)


def test_a_killed_worker_is_one_line_and_resume_finishes(tmp_path, corpus, monkeypatch):
    out = tmp_path / "o"
    monkeypatch.setenv("LMSHARD_STOP_AT", "unit=4")  # the worker that wrote unit 4, before reporting it
    proc = start_prepare(_args(corpus, out))
    workers = wait_for_workers(proc, 2)
    assert len(workers) == 2
    held = _held_midway(out, proc)
    assert held in workers
    monkeypatch.delenv("LMSHARD_STOP_AT")
    os.kill(held, signal.SIGKILL)
    code, err = finish(proc, 120)
    assert code == 1, err
    assert "a worker process died" in err and "--resume" in err and "Traceback" not in err, err
    assert wait_gone(workers, timeout=5.0) == []
    _finish_and_compare(corpus, tmp_path, out)


@pytest.mark.parametrize(("sig", "code", "words"), [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                     (signal.SIGINT, 130, "interrupted")])  # fmt: skip
def test_a_stop_signal_to_the_group_stops_the_run_and_resume_finishes(tmp_path, corpus, monkeypatch, sig, code,
                                                                      words):  # fmt: skip
    """scancel (SIGTERM) or Ctrl-C (SIGINT) reaches every process of the group: the workers leave
    it to the main process, which stops with a checkpoint and the --resume advice (not a worker
    "killed, as the out-of-memory killer does", nor a traceback per worker), and ends them."""
    out = tmp_path / "o"
    monkeypatch.setenv("LMSHARD_STOP_AT", "unit=3")  # the worker that wrote unit 3, before reporting it
    monkeypatch.setenv("LMSHARD_CHECKPOINT_SECONDS", "0")  # a checkpoint per merged item: the merge is seen to run
    proc = start_prepare(_args(corpus, out))
    workers = wait_for_workers(proc, 2)
    assert len(workers) == 2
    assert _held_midway(out, proc) in workers
    monkeypatch.delenv("LMSHARD_STOP_AT")
    record = out.parent / f".{out.name}.lmshard-partial" / IN_PROGRESS_FILE
    deadline = time.monotonic() + 120  # the merge of units 0-2, then it waits for unit 3, held
    while time.monotonic() < deadline and not _checkpointed(record):
        time.sleep(0.01)
    assert _checkpointed(record), "the merge did not start"
    signal_stopped(proc.pid, sig)
    status, err = finish(proc, 120)
    assert status == code and words in err and "--resume" in err, err
    assert "Traceback" not in err and "out-of-memory" not in err, err
    assert wait_gone(workers, timeout=5.0) == []
    _finish_and_compare(corpus, tmp_path, out)


def test_ctrl_c_with_idle_workers_is_one_message(tmp_path, corpus, monkeypatch):
    """Every unit tokenized, the workers idle while the merge is held: Ctrl-C to the group is one
    "interrupted" message, not a KeyboardInterrupt traceback from each waiting worker."""
    out = tmp_path / "o"
    plan = tmp_path / "plan"  # the same plan, made without running it: how many units (one work item each)
    assert finish(start_prepare([*_args(corpus, plan), "--executor", "none"]), 120)[0] == 0
    units = len(json.loads((tmp_path / ".plan.lmshard-work" / "plan.json").read_text())["units"])
    # held at its last item: the merge has waited for every unit, so the workers are idle, waiting for tasks
    monkeypatch.setenv("LMSHARD_STOP_AT", f"item:{units}")
    proc = start_prepare(_args(corpus, out))
    workers = wait_for_workers(proc, 2)
    assert len(workers) == 2
    assert _held_midway(out, proc) == proc.pid
    monkeypatch.delenv("LMSHARD_STOP_AT")
    done = out.parent / f".{out.name}.lmshard-work" / "tokenize"
    assert len(list(done.glob("unit_*.done"))) == units
    signal_stopped(proc.pid, signal.SIGINT)
    code, err = finish(proc, 120)
    assert code == 130 and "interrupted" in err and "--resume" in err, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert wait_gone(workers, timeout=5.0) == []
    _finish_and_compare(corpus, tmp_path, out)


def _checkpointed(record):
    try:
        return bool(json.loads(record.read_text())["checkpoint"])
    except (OSError, ValueError, KeyError):
        return False
