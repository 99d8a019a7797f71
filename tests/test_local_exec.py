"""The local executor (`prepare --num-tasks N`, lmshard/prepare/local_exec.py) when processes
die: a killed main process takes its workers with it, a killed worker is one line naming the
fix, and `--resume` then finishes with the one-machine bytes."""

from __future__ import annotations

import os
import signal
import time

import pytest
from proctree import finish, start_prepare, wait_for_workers, wait_gone
from test_prepare import jsonl, make_texts
from test_stages import _files


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("localexec")
    return jsonl(tmp / "in" / "a.jsonl", make_texts(40_000, seed=4))  # ~100 units of 64 KiB: seconds of work


@pytest.fixture(autouse=True)
def small_units(monkeypatch):
    monkeypatch.setenv("LMSHARD_UNIT_BYTES", str(64 << 10))


def _args(corpus, out):
    return [str(corpus), "--out", str(out), "--num-tasks", "3", "--workers", "2", "--tokenizer-backend", "tiktoken"]


def _first_unit_done(out, proc, timeout=120.0):
    tok = out.parent / f".{out.name}.lmshard-work" / "tokenize"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None and not any(tok.glob("unit_*.done")):
        time.sleep(0.002)
    assert proc.poll() is None, "the run ended before it could be killed midway"


def _finish_and_compare(corpus, tmp_path, out):
    again = start_prepare([*_args(corpus, out), "--resume"])
    code, err = finish(again, 300)
    assert code == 0, err
    one = start_prepare(
        [str(corpus), "--out", str(tmp_path / "one"), "--workers", "1", "--tokenizer-backend", "tiktoken"]
    )
    assert finish(one, 300)[0] == 0
    assert _files(out) == _files(tmp_path / "one")


def test_killing_the_main_process_takes_its_workers_along(tmp_path, corpus):
    out = tmp_path / "o"
    proc = start_prepare(_args(corpus, out))
    workers = wait_for_workers(proc, 2)
    assert len(workers) == 2
    _first_unit_done(out, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert wait_gone(workers, timeout=5.0) == []  # not left waiting for tasks forever
    _finish_and_compare(corpus, tmp_path, out)


def test_a_killed_worker_is_one_line_and_resume_finishes(tmp_path, corpus):
    out = tmp_path / "o"
    proc = start_prepare(_args(corpus, out))
    workers = wait_for_workers(proc, 2)
    assert len(workers) == 2
    _first_unit_done(out, proc)
    os.kill(workers[0], signal.SIGKILL)
    code, err = finish(proc, 120)
    assert code == 1, err
    assert "a worker process died" in err and "--resume" in err and "Traceback" not in err, err
    assert wait_gone(workers, timeout=5.0) == []
    _finish_and_compare(corpus, tmp_path, out)
