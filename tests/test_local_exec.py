"""The local executor (`prepare --num-tasks N`, lmshard/prepare/execution/local_exec.py) when processes
die or are stopped: a killed main process takes its workers with it, a killed worker is one line
naming its stage and the fix, a stop signal to the whole group is one message from the main
process (the workers leave it to it), and `--resume` then finishes with the one-machine bytes.

The main process only schedules: every stop point here holds a worker (a pool process) on an
item of a stage (`unit=K`, `bucket=K`, `select=K`, `part=K`, `piece=K`), after the item's
marker."""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from pathlib import Path

import pytest
from proctree import finish, signal_stopped, start_prepare, wait_for_workers, wait_gone, wait_stopped
from test_prepare import jsonl, make_texts
from test_stages import _files

# One held item per stage the workers run (the corpus has ~200 units, 32 dedup buckets, 3 pieces
# (the train and val shards and the key file) and hundreds of parts of them, one per unit each).
HELD = {"tokenize": "unit=4", "dedup": "bucket=4", "select": "select=4", "write": "part=4", "seal": "piece=1"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("localexec")
    return jsonl(tmp / "in" / "a.jsonl", make_texts(40_000, seed=4))  # ~200 units of 64 KiB: seconds of work


@pytest.fixture(scope="module")
def one_machine(corpus, tmp_path_factory):
    """The files of the same corpus prepared by one process, uninterrupted."""
    out = tmp_path_factory.mktemp("reference") / "one"
    code, err = finish(start_prepare([str(corpus), "--out", str(out), "--workers", "1",
                                      "--tokenizer-backend", "tiktoken"]), 300)  # fmt: skip
    assert code == 0, err
    return _files(out)


@pytest.fixture(autouse=True)
def small_units(monkeypatch):
    monkeypatch.setenv("LMSHARD_UNIT_BYTES", str(64 << 10))


def _args(corpus, out):
    return [str(corpus), "--out", str(out), "--num-tasks", "3", "--workers", "2", "--tokenizer-backend", "tiktoken"]


def _work(out):
    return out.parent / f".{out.name}.lmshard-work"


def _held_midway(out, proc):
    """The run (started with LMSHARD_STOP_AT) stopped itself midway; the pid that stopped."""
    pid = wait_stopped(proc)
    assert pid is not None, "the run ended before its stop point"
    assert any((_work(out) / "tokenize").glob("unit_*.done"))
    return pid


def _finish_and_compare(corpus, out, one_machine):
    again = start_prepare([*_args(corpus, out), "--resume"])
    code, err = finish(again, 300)
    assert code == 0, err
    got = _files(out)
    assert sorted(got) == sorted(one_machine)
    assert [name for name in got if got[name] != one_machine[name]] == []
    assert not _work(out).exists() and not (out.parent / f".{out.name}.lmshard-partial").exists()


def _half_a_result(_: int) -> None:
    """In a pool worker: the start of a result message (its length, then a few of its bytes) on
    the pool's result pipe, then the end of the worker, as a worker killed while it sent a large
    result leaves them."""
    import gc
    import struct
    from multiprocessing.queues import SimpleQueue

    results = next(q for q in gc.get_objects() if isinstance(q, SimpleQueue))
    os.write(results._writer.fileno(), struct.pack("!i", 1 << 20) + b"x" * 100)
    os._exit(1)


def test_stopping_a_pool_with_half_a_result_in_its_pipe_ends(tmp_path):
    """A Ctrl-C or SIGTERM stops the stages' pool by killing its workers (itempool._stop_workers):
    one killed while it sent a result left half a message in the result pipe, and the pool's
    thread waited for its rest for ever (the run never exited). Stopping such a pool ends."""
    import multiprocessing
    import threading
    from concurrent.futures import ProcessPoolExecutor

    from lmshard.prepare.execution import itempool

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
    future = pool.submit(_half_a_result, 0)
    deadline = time.monotonic() + 60
    while not future.done() and all(p.is_alive() for p in list((pool._processes or {}).values())):
        assert time.monotonic() < deadline, "the worker never wrote"
        time.sleep(0.01)
    stopper = threading.Thread(target=itempool._stop_workers, args=(pool,), daemon=True)
    stopper.start()
    stopper.join(60)  # (a hang: the test fails, rather than wait with it)
    assert not stopper.is_alive(), "stopping the pool waited for the rest of a message that never comes"


def test_killing_the_main_process_takes_its_workers_along(tmp_path, corpus, one_machine, monkeypatch):
    """kill -9 of the main process (the OOM killer's pick, say) while a worker is held on a unit
    and the other works or waits for tasks: both exit, rather than wait for tasks forever."""
    out = tmp_path / "o"
    monkeypatch.setenv("LMSHARD_STOP_AT", HELD["tokenize"])
    proc = start_prepare(_args(corpus, out))
    workers = wait_for_workers(proc, 2)
    assert len(workers) == 2
    held = _held_midway(out, proc)
    assert held in workers
    monkeypatch.delenv("LMSHARD_STOP_AT")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()  # (not communicate: the held worker keeps the output pipes open)
    os.killpg(proc.pid, signal.SIGCONT)  # the held worker goes on, and finds its parent gone
    try:
        assert wait_gone(workers, timeout=60.0) == []  # (the timeout only guards a hang)
    finally:
        finish(proc, 60)  # (kills the group if a worker is still there)
    _finish_and_compare(corpus, out, one_machine)


@pytest.mark.parametrize("stage", list(HELD))
def test_a_killed_worker_is_one_line_and_resume_finishes(tmp_path, corpus, one_machine, monkeypatch, stage):
    out = tmp_path / "o"
    monkeypatch.setenv("LMSHARD_STOP_AT", HELD[stage])  # the worker that did this item, before reporting it
    proc = start_prepare(_args(corpus, out))
    workers = wait_for_workers(proc, 2)
    assert len(workers) == 2
    held = _held_midway(out, proc)
    assert held in workers
    monkeypatch.delenv("LMSHARD_STOP_AT")
    os.kill(held, signal.SIGKILL)
    code, err = finish(proc, 120)
    assert code == 1, err
    said = " ".join(err.split())
    assert (f"a worker process (pid {held}) was killed by SIGKILL (as the out-of-memory killer does) during the "
            f"{stage} stage" in said and "--resume" in said), err
    assert "Traceback" not in err, err
    assert len([line for line in err.splitlines() if line.startswith("error")]) == 1, err
    assert wait_gone(workers, timeout=60.0) == []
    assert not (_work(out) / "volatile.json").exists()  # (a worker died; the run stopped and made its work durable)
    _finish_and_compare(corpus, out, one_machine)


@pytest.mark.parametrize(("sig", "code", "words", "stage"),
                         [(signal.SIGTERM, 143, "terminated (SIGTERM)", "tokenize"),
                          (signal.SIGINT, 130, "interrupted", "dedup"),
                          (signal.SIGTERM, 143, "terminated (SIGTERM)", "select"),
                          (signal.SIGINT, 130, "interrupted", "write"),
                          (signal.SIGTERM, 143, "terminated (SIGTERM)", "seal")])  # fmt: skip
def test_a_stop_signal_to_the_group_stops_the_run_and_resume_finishes(tmp_path, corpus, one_machine, monkeypatch,
                                                                      sig, code, words, stage):  # fmt: skip
    """scancel (SIGTERM) or Ctrl-C (SIGINT) reaches every process of the group while a worker is
    held on an item: the workers leave it to the main process, which stops with the --resume
    advice (not a worker "killed, as the out-of-memory killer does", nor a traceback per
    worker), and ends them."""
    out = tmp_path / "o"
    monkeypatch.setenv("LMSHARD_STOP_AT", HELD[stage])
    proc = start_prepare(_args(corpus, out))
    workers = wait_for_workers(proc, 2)
    assert len(workers) == 2
    assert _held_midway(out, proc) in workers
    monkeypatch.delenv("LMSHARD_STOP_AT")
    signal_stopped(proc.pid, sig)
    status, err = finish(proc, 120)
    assert status == code and words in err and "--resume" in err, err
    assert "Traceback" not in err and "out-of-memory" not in err and "KeyboardInterrupt" not in err, err
    assert wait_gone(workers, timeout=60.0) == []
    assert not (_work(out) / "volatile.json").exists()  # its work made durable on the way out: any machine resumes it
    _finish_and_compare(corpus, out, one_machine)


def test_ctrl_c_with_idle_workers_is_one_message(tmp_path, corpus, one_machine, monkeypatch):
    """One worker held on the last unit and every other unit tokenized, so the other worker is
    idle, waiting for a task (the next stage is not submitted before this one ends): Ctrl-C to
    the group is one "interrupted" message, not a KeyboardInterrupt traceback from the waiting
    worker."""
    out = tmp_path / "o"
    plan = tmp_path / "plan"  # the same plan, made without running it: how many units
    assert finish(start_prepare([*_args(corpus, plan), "--executor", "none"]), 120)[0] == 0
    units = json.loads((_work(plan) / "plan.json").read_text())["n_units"]
    monkeypatch.setenv("LMSHARD_STOP_AT", f"unit={units - 1}")
    proc = start_prepare(_args(corpus, out))
    workers = wait_for_workers(proc, 2)
    assert len(workers) == 2
    assert _held_midway(out, proc) in workers
    monkeypatch.delenv("LMSHARD_STOP_AT")
    done = _work(out) / "tokenize"
    deadline = time.monotonic() + 300  # (only guards a hang: the other worker has a fixed amount of work left)
    while len(list(done.glob("unit_*.done"))) < units and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert len(list(done.glob("unit_*.done"))) == units
    signal_stopped(proc.pid, signal.SIGINT)
    code, err = finish(proc, 120)
    assert code == 130 and "interrupted" in err and "--resume" in err, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert wait_gone(workers, timeout=60.0) == []
    _finish_and_compare(corpus, out, one_machine)


def test_progress_follows_each_unit_as_it_finishes_not_the_whole_stage():
    """The pool's futures are reported one by one as they finish: with unit 1 done and unit 0
    still running, unit 1 is reported (the run log's progress line moves) before unit 0 ends."""
    import threading
    from concurrent.futures import Future

    from lmshard.prepare.execution import itempool

    futures: dict[Future[None], list[int]] = {Future(): [0], Future(): [1]}
    first, second = list(futures)
    reported: list[int] = []
    seen_one = threading.Event()

    def done(stage, i):
        reported.append(i)
        seen_one.set()

    waiter = threading.Thread(target=itempool._wait, args=(None, futures, "tokenize", done))  # (no pool: none breaks)
    waiter.start()
    second.set_result(None)
    assert seen_one.wait(60)  # an event, not a clock: unit 1 was reported while unit 0 runs
    assert reported == [1] and waiter.is_alive()
    first.set_result(None)
    waiter.join(60)
    assert reported == [1, 0] and not waiter.is_alive()


# Imported first by every Python process whose path holds its folder (the workers, however
# started, too): os.fsync records the path of each file it syncs to the file named by $SYNCED.
_RECORDING = """
import os
real = os.fsync
def fsync(fd):
    with open(os.environ["SYNCED"], "a") as f:
        f.write(os.readlink(f"/proc/self/fd/{fd}") + "\\n")
    real(fd)
os.fsync = fsync
"""


def test_a_local_run_syncs_its_dataset_but_not_its_work_files(tmp_path, corpus):
    """The local executor's tasks leave the work folder's files unsynced (volatile.py: the plan,
    each unit's tokens and split, each task's keys, every marker and summary; its next attempt reads them
    from the page cache) but sync every shard of the dataset, and each of its folders before the swap (the
    shards' names renamed into them); a plan for other executors (`--executor none`) is synced,
    and so are the unit files of its tasks (`run-task`, here the tokenize task): another machine
    may read them."""
    import subprocess
    import sys

    synced = tmp_path / "synced.txt"
    (tmp_path / "site" / "sitecustomize.py").parent.mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_RECORDING)
    path = os.pathsep.join([str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = os.environ | {"SYNCED": str(synced), "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    lmshard = [sys.executable, "-m", "lmshard"]
    out = tmp_path / "o"
    subprocess.run([*lmshard, "prepare", *_args(corpus, out)[:-2], "--quiet"], env=env, check=True)
    paths = synced.read_text().splitlines()
    work = [p for p in paths if ".lmshard-work" in p]
    assert [Path(p).name.lstrip(".").split(".")[0] for p in work] == ["volatile"]  # its boot, first (not its plan)
    shards = {p.relative_to(out).as_posix() for p in out.rglob("shard_*.bin")}
    assert shards and all(any(f"lmshard-partial/{s}" in p for p in paths) for s in shards)  # (written, then sealed)
    folders = {p.name for p in out.iterdir() if p.is_dir()}  # their names renamed into place, made durable
    assert {"train", "val", "dedup"} <= folders and all(any(p.endswith(f"lmshard-partial/{d}") for p in paths)
                                                       for d in folders)  # fmt: skip
    synced.unlink()
    planned = tmp_path / "p"
    subprocess.run([*lmshard, "prepare", *_args(corpus, planned)[:-2], "--executor", "none", "--quiet"], env=env,
                   check=True)  # fmt: skip
    tables = {Path(p).name.lstrip(".").split(".")[0] for p in synced.read_text().splitlines() if ".p.lmshard-work" in p}
    assert tables == {"plan_units", "plan_tasks", "plan_sources", "plan"}  # (the plan, for tasks of any machine)
    subprocess.run([*lmshard, "run-task", "--stage", "tokenize", "--task", "0", str(planned)], env=env, check=True)
    units = [p for p in synced.read_text().splitlines() if "/tokenize/.unit_" in p and ".bin." in p]
    assert len(units) == len(list((planned.parent / ".p.lmshard-work" / "tokenize").glob("unit_*.bin"))) > 0


def test_a_small_input_goes_through_its_stages_in_this_process_whatever_the_workers(tmp_path, monkeypatch):
    """Below LMSHARD_POOL_BYTES (4 MiB) of input the local executor starts no pool: the pool's
    start costs more than its workers save there (bench_scaleout.py, section 3). The same bytes
    as one process either way; with the threshold at 0 the pool is used."""
    from lmshard.prepare import PrepareConfig, prepare
    from lmshard.prepare.execution import itempool, local_exec, plainplan

    src = jsonl(tmp_path / "a.jsonl", make_texts(3000, seed=5))
    assert src.stat().st_size < plainplan.POOL_BYTES == 4 << 20
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "one"), workers=1, val_fraction=0.1))
    real, pools = itempool.item_pool, []

    def counted(r, workers, early=None):
        pools.append(workers)
        return real(r, workers, early)

    monkeypatch.setattr(local_exec, "item_pool", counted)
    local_exec.run(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "here"), workers=2, val_fraction=0.1), 3)
    assert pools == [] and _files(tmp_path / "here") == _files(tmp_path / "one")
    monkeypatch.setattr(plainplan, "POOL_BYTES", 0)
    local_exec.run(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "pool"), workers=2, val_fraction=0.1), 3)
    assert pools == [2] and _files(tmp_path / "pool") == _files(tmp_path / "one")


def test_a_plain_prepare_of_a_small_input_on_its_stages_plans_one_unit(tmp_path, monkeypatch):
    """A plain prepare whose stages run in this process (less than 4 MiB of files; here with
    --val-by, which only the stages do) plans one task of one unit of up to 4 MiB, its many
    small files sharing it, where the plan sized to the workers had a unit per file; --unit-size
    still decides where it is given. The bytes are the same either way."""
    from lmshard.prepare import PrepareConfig, prepare
    from lmshard.prepare.execution import run as run_module

    root = tmp_path / "in"
    texts = make_texts(200, seed=9)
    for i, text in enumerate(texts):
        jsonl(root / f"{i:03d}.jsonl", [text])
    plans = []
    real = run_module.Run.of.__func__

    def seen(cls, config, n_tasks, unit_bytes=None, **kw):
        r = real(cls, config, n_tasks, unit_bytes, **kw)
        plans.append((r.plan["n_tasks"], [u[1] for u in r.plan["units"]]))
        return r

    monkeypatch.setattr(run_module.Run, "of", classmethod(seen))
    options = dict(workers=2, val_by="input", val_tokens=20, val_fraction=0.0)
    prepare(PrepareConfig(inputs=[str(root)], out=str(tmp_path / "one"), **options))
    assert plans == [(1, ["files"])]
    prepare(PrepareConfig(inputs=[str(root)], out=str(tmp_path / "sized"), unit_size=64 << 10, **options))
    assert plans[1][0] == 2 * 2 and set(plans[1][1]) == {"files"} and len(plans[1][1]) > 1  # (units of 64 KiB)
    assert _files(tmp_path / "one") == _files(tmp_path / "sized")


def test_a_worker_killed_while_a_unit_is_spread_is_one_line_and_resume_finishes(tmp_path, monkeypatch):
    """One .gz file (one unit) read by the main process, its work items tokenized by both
    workers (itempool.spread): a worker killed after its 2nd item is one line naming the
    tokenize stage, and --resume finishes with one machine's bytes."""
    import gzip

    src = tmp_path / "in.jsonl.gz"
    src.write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in make_texts(3000, seed=8)).encode(),
                                  mtime=0))  # fmt: skip
    monkeypatch.setenv("LMSHARD_BLOCK_BYTES", str(1 << 14))  # many work items
    one = tmp_path / "one"
    code, err = finish(start_prepare([str(src), "--out", str(one), "--workers", "1"]), 300)
    assert code == 0, err
    monkeypatch.setenv("LMSHARD_POOL_BYTES", "0")
    monkeypatch.setenv("LMSHARD_STOP_AT", "worker-item:2")  # each worker stops after its 2nd item
    out, args = tmp_path / "o", [str(src), "--out", str(tmp_path / "o"), "--workers", "2"]
    proc = start_prepare(args)
    workers = wait_for_workers(proc, 2)
    held = wait_stopped(proc)
    assert held in workers, "the run ended before its stop point"
    monkeypatch.delenv("LMSHARD_STOP_AT")
    os.kill(held, signal.SIGKILL)
    code, err = finish(proc, 120)
    said = " ".join(err.split())
    assert code == 1 and "Traceback" not in err, err
    assert f"a worker process (pid {held}) was killed by SIGKILL" in said and "tokenize stage" in said, err
    assert wait_gone(workers, timeout=60.0) == []
    code, err = finish(start_prepare([*args, "--resume"]), 300)
    assert code == 0, err
    assert _files(out) == _files(one)


# Imported first by every Python process whose path holds its folder (a spawned worker): where
# $LMSHARD_TEST_DISK is "ERRNO BYTES", the files the tokenize stage writes go to a device that
# fails with ERRNO after BYTES (faults.py).
_FULL_DISK = """
import os
if os.environ.get("LMSHARD_TEST_DISK"):
    from types import SimpleNamespace
    from faults import full_disk
    import lmshard.format.layout as layout
    code, budget = map(int, os.environ["LMSHARD_TEST_DISK"].split())
    full_disk(SimpleNamespace(setattr=lambda *a, **k: setattr(*a[:3])), [layout], budget, code)
"""


@pytest.mark.parametrize(("code", "words", "pool"), [(errno.ENOSPC, "no space left on the device", False),
                                                     (errno.EDQUOT, "no space left on the device", False),
                                                     (errno.EIO, "Input/output error", False),
                                                     (errno.ENOSPC, "no space left on the device", True)])  # fmt: skip
def test_a_full_or_failing_disk_under_the_stages_is_one_line_and_resume_finishes(tmp_path, monkeypatch, code, words,
                                                                                pool):  # fmt: skip
    """A device that fills up or fails while the stages write their work files, in this process
    or in a worker of the pool (forked: the fault goes with it): one line naming the fault and
    --resume (the work kept, as a run read in one process says it), and once space is back
    --resume ends with one machine's bytes."""
    from faults import full_disk

    from lmshard.errors import LmshardError
    from lmshard.format import layout
    from lmshard.prepare import PrepareConfig, prepare
    from lmshard.prepare.execution import plainplan

    src = jsonl(tmp_path / "in" / "a.jsonl", make_texts(2000, seed=6))  # (~2 MB: the stages run in this process)
    options = {"inputs": [str(src)], "workers": 2, "tokenizer_backend": "tiktoken"}
    prepare(PrepareConfig(out=str(tmp_path / "one"), **options | {"workers": 1}))
    if pool:  # workers started afresh (spawned: this process runs threads) fill their disk at start-up
        monkeypatch.setattr(plainplan, "POOL_BYTES", 0)
        monkeypatch.setattr(plainplan, "ONE_UNIT_BYTES", 0)  # (units sized to the workers: each written by one)
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "sitecustomize.py").write_text(_FULL_DISK)
        path = [str(tmp_path / "site"), str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])]
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
        monkeypatch.setenv("LMSHARD_TEST_DISK", f"{code} 400000")
    device = full_disk(monkeypatch, [layout], budget=400_000, code=code)  # (the units' token and key files)
    out = tmp_path / "o"
    with pytest.raises(LmshardError) as e:
        prepare(PrepareConfig(out=str(out), **options))
    message = str(e.value)
    assert words in message and "run the same command with --resume" in message and "\n" not in message, message
    assert "another --out" not in message and "re-run" not in message, message  # (one fix: --resume)
    assert (device.failures >= 1) != pool and _work(out).exists()  # (in the pool: a worker's device filled)
    assert "worker" not in message  # (the fault, not a worker's death or bug)
    monkeypatch.undo()  # space is back
    prepare(PrepareConfig(out=str(out), resume=True, **options))
    assert _files(out) == _files(tmp_path / "one")


def _small_run(tmp_path, monkeypatch):
    """A plain prepare of 2 MB, in units of 256 KiB: read in one process into `one`, then the
    options that run it on the stages in this process."""
    from lmshard.prepare import PrepareConfig, prepare

    src = jsonl(tmp_path / "in" / "a.jsonl", make_texts(2000, seed=6))
    options = {"inputs": [str(src)], "workers": 2, "tokenizer_backend": "tiktoken", "unit_size": 256 << 10}
    prepare(PrepareConfig(out=str(tmp_path / "one"), **options))
    return options


def test_a_small_local_run_syncs_each_shard_file_once_at_its_seal(tmp_path, monkeypatch):
    """A local run whose shards hold less than owners.SYNCED_PARTS_BYTES leaves its parts to the
    seal: each file of the dataset is synced once. One that syncs its parts (a larger run, a
    cluster's tasks) syncs a shard's file at each part written into it and at its seal. Their
    bytes are the same."""
    from collections import Counter

    from lmshard.prepare import PrepareConfig, prepare
    from lmshard.prepare.execution import owners

    options = _small_run(tmp_path, monkeypatch)
    synced, real = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    counts = {}
    for name, floor in (("once", owners.SYNCED_PARTS_BYTES), ("parts", 0)):
        monkeypatch.setattr(owners, "SYNCED_PARTS_BYTES", floor)
        synced.clear()
        prepare(PrepareConfig(out=str(tmp_path / name), **options))
        build = f".{name}.lmshard-partial"
        counts[name] = Counter(p.split(build)[1] for p in synced if build in p)
    train = "/train/shard_000000.bin.tmp"
    assert set(counts["once"].values()) == {1} and counts["once"][train] == 1, counts["once"]
    assert counts["parts"][train] >= 3, counts["parts"]  # (several units' parts, then the seal)
    assert _files(tmp_path / "once") == _files(tmp_path / "parts") == _files(tmp_path / "one")


@pytest.mark.parametrize("failing", ["train/shard_000000.bin.tmp", "dedup/doc_keys_000000.u64.tmp"])
def test_a_seal_whose_sync_fails_keeps_the_units_and_resume_writes_its_parts_again(tmp_path, monkeypatch, failing):
    """A small local run's parts are not synced on their own: when the sync of a piece at its
    seal fails (EIO; the device may have dropped the pages it could not write: here the file is
    cut to nothing), the run stops in one line naming --resume, the units' data is still there,
    and the resumed run writes the piece's parts again from it: one process's bytes. The first
    piece sealed (the train shard), and the key file, which every unit has a part in, sealed
    after the shards."""
    from lmshard.errors import LmshardError
    from lmshard.prepare import PrepareConfig, prepare
    from lmshard.prepare.execution import owners

    options = _small_run(tmp_path, monkeypatch)
    real = owners._durable

    def fail_at(f):
        if f.name.endswith(failing):
            os.ftruncate(f.fileno(), 0)  # (what a failed writeback may leave)
            raise OSError(errno.EIO, "Input/output error")
        real(f)

    monkeypatch.setattr(owners, "_durable", fail_at)
    out = tmp_path / "o"
    with pytest.raises(LmshardError) as e:
        prepare(PrepareConfig(out=str(out), **options))
    message = str(e.value)
    assert "Input/output error" in message and "run the same command with --resume" in message, message
    tokenized = _work(out) / "tokenize"
    units = sorted(p.stem for p in tokenized.glob("unit_*.done"))
    assert len(units) >= 2 and sorted(p.stem for p in tokenized.glob("unit_*.bin")) == units  # (none released)
    shards = {p.relative_to(_work(out).parent / ".o.lmshard-partial").as_posix()
              for p in (_work(out).parent / ".o.lmshard-partial").rglob("shard_*.bin")}  # (those sealed)
    assert shards == (set() if failing.startswith("train") else {"train/shard_000000.bin", "val/shard_000000.bin"})
    monkeypatch.setattr(owners, "_durable", real)
    prepare(PrepareConfig(out=str(out), resume=True, **options))
    assert _files(out) == _files(tmp_path / "one")


def test_a_staged_run_that_ignores_sigint_keeps_ignoring_it(tmp_path, corpus, one_machine, monkeypatch):
    """A job started in the background (SIGINT ignored, as a shell does) is not stopped by the
    terminal's Ctrl-C to its group, with a worker held on a unit: the run goes on to one
    machine's bytes (its pool's workers ignore it too)."""
    import subprocess

    from proctree import LMSHARD

    out = tmp_path / "o"
    monkeypatch.setenv("LMSHARD_STOP_AT", HELD["tokenize"])
    proc = subprocess.Popen([*LMSHARD, "prepare", *_args(corpus, out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
    _held_midway(out, proc)
    monkeypatch.delenv("LMSHARD_STOP_AT")
    signal_stopped(proc.pid, signal.SIGINT)
    code, err = finish(proc, 300)
    assert code == 0, err
    assert _files(out) == one_machine



def _plain_staged_killed(tmp_path, corpus, monkeypatch, stop):
    """A plain prepare of `corpus` into tmp_path/o on the stages (2 workers), SIGKILLed with its
    group once a process of it stopped at `stop`; its --out and arguments but --workers."""
    out = tmp_path / "o"
    args = [str(corpus), "--out", str(out), "--tokenizer-backend", "tiktoken"]
    monkeypatch.setenv("LMSHARD_STOP_AT", stop)
    proc = start_prepare([*args, "--workers", "2"])
    assert wait_stopped(proc) is not None, "the run ended before its stop point"
    monkeypatch.delenv("LMSHARD_STOP_AT")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    return out, args


def test_a_plain_staged_run_resumed_with_one_worker_goes_on_with_its_stages(tmp_path, corpus, one_machine, monkeypatch):
    """A plain prepare in the pool killed in its write stage, resumed with --workers 1 (its
    stages in this process): it goes on with the stages' work rather than start over; temporary
    files a killed write left in the build are not shipped; no work folder stays; the run's time
    and rate are the resumed run's own (no unit left to tokenize: 0 tokens/s)."""
    out, args = _plain_staged_killed(tmp_path, corpus, monkeypatch, HELD["write"])
    staging = tmp_path / ".o.lmshard-partial"
    for stray in (".dataset_metadata.json.k3j2.tmp", "train/.shard_000000.idx.ab12.tmp"):  # (atomic writes cut short)
        (staging / stray).write_text("{")
    began = time.time()
    code, err = finish(start_prepare([*args, "--workers", "1", "--resume"]), 300)
    took = time.time() - began
    assert code == 0 and "units tokenized" in err and "starting over" not in err, err
    assert _files(out) == one_machine
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]  # (no work folder, no build left beside it)
    run = json.loads((out / "dataset_metadata.json").read_text())["run"]
    assert run["elapsed_s"] <= took and run["tokens_per_s"] == 0.0, run
    done = next(line for line in err.splitlines() if line.startswith("done: "))
    assert done.endswith("s, no tokens made by this run (all were before it)"), done  # (not "0 tokens/s")


def test_an_overwrite_with_one_worker_removes_the_work_the_pool_left(tmp_path, corpus, one_machine, monkeypatch):
    """A plain prepare in the pool killed midway, then --overwrite with --workers 1: the work
    folder of the killed run goes with its build, and a new one is made and removed."""
    out, args = _plain_staged_killed(tmp_path, corpus, monkeypatch, HELD["select"])
    assert _work(out).exists()
    code, err = finish(start_prepare([*args, "--workers", "1", "--overwrite"]), 300)
    assert code == 0, err
    assert _files(out) == one_machine and sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_an_input_gone_before_the_plan_says_the_work_is_kept(tmp_path, monkeypatch):
    """An input moved away after the stages claimed --out, before they planned: one line naming it
    and that the work is kept; put back, --resume ends with one machine's bytes."""
    from lmshard.errors import LmshardError
    from lmshard.prepare import PrepareConfig, prepare
    from lmshard.prepare.execution import local_exec

    inputs = tmp_path / "in"
    jsonl(inputs / "a.jsonl", make_texts(300, seed=1))
    b = jsonl(inputs / "b.jsonl", make_texts(300, seed=2))
    options = {"inputs": [str(inputs)], "workers": 2, "tokenizer_backend": "tiktoken"}
    prepare(PrepareConfig(out=str(tmp_path / "one"), **options | {"workers": 1}))
    real = local_exec.begin
    monkeypatch.setattr(local_exec, "begin", lambda *a, **k: (real(*a, **k), b.rename(tmp_path / "away"))[0])
    out = tmp_path / "o"
    with pytest.raises(LmshardError) as e:
        prepare(PrepareConfig(out=str(out), **options))
    said = str(e.value)
    assert f"{b}: this input is gone" in said and f"the work done so far is kept in {_work(out)}" in said, said
    monkeypatch.setattr(local_exec, "begin", real)
    (tmp_path / "away").rename(b)
    prepare(PrepareConfig(out=str(out), resume=True, **options))
    assert _files(out) == _files(tmp_path / "one")


@pytest.mark.skipif(not hasattr(__import__("fcntl"), "F_GETPIPE_SZ"), reason="pipe sizes are Linux's")
def test_the_stages_pool_moves_a_work_item_and_its_tokens_in_one_pipe_write(tmp_path):
    """The pool's task and result pipes are widened, as the one-reading pool's are (a spread
    unit's items and their tokens, ≈1 MiB each, each cross in one write, not in 64 KiB pieces
    that each wait for this process's GIL): their capacity, read from the kernel, is at least
    1 MiB, where a pipe starts at 64 KiB."""
    import fcntl

    from lmshard.prepare import PrepareConfig
    from lmshard.prepare.execution import itempool
    from lmshard.prepare.execution.run import Run

    src = jsonl(tmp_path / "a.jsonl", make_texts(50, seed=1))
    r = Run.of(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "o"), workers=2), 1)
    with itempool.item_pool(r, 2) as pool:
        pipes = [pool._call_queue._reader, pool._result_queue._reader]
        assert all(fcntl.fcntl(p.fileno(), fcntl.F_GETPIPE_SZ) >= 1 << 20 for p in pipes)
        itempool.started(pool, 2, "tokenize")  # (and the workers start and answer through them)
