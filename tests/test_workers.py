"""Worker processes: results in order, errors carried across, and no hang when a process dies.

The pool is tested directly (tasks defined here run in spawned workers) and through the real
`lmshard prepare` in a subprocess, whose workers are SIGKILLed at many moments of their life:
during start-up, while loading the tokenizer, mid-run, with --dedup-lines. Every subprocess runs
in its own process group and is killed with all its workers if it overruns its timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import write
from proctree import alive, finish, start_prepare, wait_for_workers, wait_gone, wait_stopped, workers_of

from lmshard.errors import InputError
from lmshard.prepare.execution.pool import OrderedPool, WorkerBug, WorkerDied, WorkerStartFailed

RUN_TIMEOUT = 90.0  # seconds a killed prepare may take to exit before the test calls it a hang


REFUSED = "could not start: initializer refused"


# Tasks and initializers run in spawned workers, so they live at module level.
def _init(arg: str) -> None:
    if arg == "fail":
        raise InputError("initializer refused: vocabulary missing")


def _uneven(i: int) -> tuple[int, int]:
    """Early items are slow, so later ones finish first and must wait to be handed out."""
    time.sleep(0.002 * ((7 * i) % 5))
    return i, os.getpid()


def _raise(i: int) -> int:
    if i == 5:
        raise InputError("bad.jsonl:6: not valid JSON")
    if i == 7:
        raise ValueError("a bug in the worker")
    return i


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _unpicklable(i: int) -> object:
    return lambda: i


def _fail_slowly_first(i: int) -> int:
    time.sleep(0.3 if i == 0 else 0)
    raise InputError(f"bad item {i}")


def _refuse_to_load() -> None:
    raise RuntimeError("this task cannot be rebuilt in the worker")


class _Unloadable:
    """Pickles in the parent, fails to unpickle in the worker."""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_refuse_to_load, ())


def _identity(x: object) -> object:
    return x


@pytest.fixture
def deadline() -> Iterator[None]:
    """Fail (with the pool torn down by its context manager) instead of hanging the suite."""

    def expire(*_: object) -> None:
        raise TimeoutError("the pool hung")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 60)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_results_in_submission_order_from_every_worker(deadline):
    with OrderedPool(3, _init, "ok") as pool:
        out = list(pool.imap(_uneven, range(200), window=5))
        pids = {p.pid for p in pool._procs}
        pool.close()
    assert [i for i, _ in out] == list(range(200))
    assert {pid for _, pid in out} == pids  # the work was spread over all three workers


def test_lmshard_error_crosses_as_itself_and_a_bug_keeps_its_traceback(deadline):
    with OrderedPool(2, _init, "ok") as pool, pytest.raises(InputError, match="bad.jsonl:6: not valid JSON"):
        list(pool.imap(_raise, range(10), window=2))
    with OrderedPool(2, _init, "ok") as pool, pytest.raises(WorkerBug) as bug:
        list(pool.imap(_raise, range(6, 10), window=2))
    assert "ValueError: a bug in the worker" in str(bug.value) and "_raise" in str(bug.value)


def test_initializer_error_and_unpicklable_result_are_reported(deadline):
    with OrderedPool(2, _init, "fail") as pool, pytest.raises(WorkerStartFailed, match=REFUSED):
        list(pool.imap(_uneven, range(4), window=2))
    with OrderedPool(2, _init, "ok") as pool, pytest.raises(WorkerBug, match="pickle"):
        list(pool.imap(_unpicklable, range(4), window=2))


def test_an_initializer_error_is_reported_by_ready_even_after_the_worker_exited(deadline):
    """The worker says why and exits at once: `ready` must report what it said, whichever of its
    message, end-of-file and exit the parent notices first."""
    with OrderedPool(2, _init, "fail") as pool:
        for proc in pool._procs:
            proc.join(30)  # both workers gone, their messages unread
        died = pool._died(1)  # what `ready` and `imap` raise once they see the exit first
        assert isinstance(died, WorkerStartFailed) and REFUSED in str(died)
        with pytest.raises(WorkerStartFailed, match=REFUSED):
            pool.ready()


def test_errors_are_raised_in_item_order(deadline):
    """Item 1 fails first in time, but item 0 fails too: item 0's error is the one reported."""
    with OrderedPool(2, _init, "ok") as pool, pytest.raises(InputError, match="bad item 0"):
        list(pool.imap(_fail_slowly_first, range(2), window=2))


def test_initializer_error_survives_large_items_and_unloadable_task_is_reported(deadline):
    big = [b"x" * (4 << 20)] * 4  # larger than a pipe buffer: the send fails once the worker is gone
    for _ in range(3):
        with OrderedPool(2, _init, "fail") as pool, pytest.raises(WorkerStartFailed, match=REFUSED):
            list(pool.imap(_identity, big, window=4))
    with OrderedPool(2, _init, "ok") as pool, pytest.raises(WorkerBug, match="cannot be rebuilt"):
        list(pool.imap(_identity, [1, _Unloadable(), 3], window=3))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV, signal.SIGRTMIN + 2])
def test_a_worker_killed_mid_task_is_worker_died(deadline, sig):
    with OrderedPool(2, _init, "ok") as pool:
        results = pool.imap(_sleep, [0.01] * 4 + [0.5] * 20, window=6)
        assert next(results) == 0.01
        os.kill(pool._procs[1].pid, sig)  # type: ignore[arg-type]  (a real-time signal has no name)
        name = f"signal {int(sig)}" if sig > signal.SIGRTMIN else signal.Signals(sig).name
        with pytest.raises(WorkerDied, match=f"pid {pool._procs[1].pid}.*killed by {name}"):
            list(results)


def test_leaving_early_stops_every_worker(deadline):
    with OrderedPool(2, _init, "ok") as pool:
        pids = [p.pid for p in pool._procs]
        for _ in pool.imap(_sleep, [0.3] * 50, window=6):
            break
    assert wait_gone(pids, 5.0) == []  # type: ignore[arg-type]


def test_a_forked_pool_initialized_later_runs_tasks_in_order_and_reports_deaths(deadline):
    """Workers forked before their configuration exists: tasks wait for `initialize`; results,
    initializer errors and deaths behave as in a spawned pool; a forked worker holds no copy
    of the parent's pipe ends (its own task pipe reads end-of-file when the parent closes it)."""
    with OrderedPool(2, start="fork") as pool:
        with pytest.raises(RuntimeError, match="initialize"):
            next(pool.imap(_uneven, range(3), window=2))
        pool.initialize(_init, "ok")
        out = list(pool.imap(_uneven, range(60), window=4))
        assert [i for i, _ in out] == list(range(60)) and {p for _, p in out} == {p.pid for p in pool._procs}
        pids = [p.pid for p in pool._procs]
        pool.close()  # end-of-file on the task pipes: each worker must exit by itself
        assert wait_gone(pids, 5.0) == []  # type: ignore[arg-type]
    with OrderedPool(2, start="fork") as pool, pytest.raises(WorkerStartFailed, match=REFUSED):
        pool.initialize(_init, "fail")
        list(pool.imap(_uneven, range(4), window=2))
    with OrderedPool(2, start="fork") as pool:
        pool.initialize(_init, "ok")
        results = pool.imap(_sleep, [0.01] * 4 + [0.5] * 20, window=6)
        assert next(results) == 0.01
        os.kill(pool._procs[0].pid, signal.SIGKILL)  # type: ignore[arg-type]
        with pytest.raises(WorkerDied, match="killed by SIGKILL"):
            list(results)


# --- the real CLI ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """~130 MB of JSON lines (128 work items, ~20 M tokens): a few seconds of tokenizing on two
    workers even on a quiet machine, so every kill below lands while the run is still going."""
    path = tmp_path_factory.mktemp("corpus") / "big.jsonl"
    words = " ".join(f"w{k}" for k in range(600))
    write(path, "".join(json.dumps({"text": f"document {i}: {words}"}) + "\n" for i in range(32_000)))
    return path


def _assert_clean_failure(code: int | None, err: str, out: Path) -> None:
    assert code is not None, f"prepare hung after its worker was killed; stderr:\n{err}"
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "worker process" in lines[0] and "--resume" in lines[0], err
    assert "Traceback" not in err
    assert not (out / "dataset_metadata.json").exists() and not (out / "train").exists()


# When the worker dies: "start" as soon as the workers appear (interpreter start-up, imports, the
# vocabulary), else held at a stop point after its unit's Nth work item: its first, or mid-run.
@pytest.mark.slow
@pytest.mark.parametrize(("when", "sig", "extra"), [
    ("start", signal.SIGKILL, []),
    ("item:1", signal.SIGKILL, []),
    ("item:6", signal.SIGKILL, []),
    ("item:3", signal.SIGSEGV, []),
    ("item:2", signal.SIGKILL, ["--dedup-lines"]),
])  # fmt: skip
def test_killed_worker_ends_prepare_with_one_line(tmp_path, corpus, monkeypatch, when, sig, extra):
    out = tmp_path / "o"
    if when != "start":
        monkeypatch.setenv("LMSHARD_STOP_AT", when)  # each worker stops after its unit's Nth work item
    proc = start_prepare([str(corpus), "--out", str(out), "--workers", "2", *extra])
    try:
        workers = wait_for_workers(proc, 2)
        assert workers, "prepare ended before its workers started"
        victim = workers[0] if when == "start" else wait_stopped(proc)
        assert victim in workers, "prepare ended before the kill"
        os.kill(victim, sig)
        held = threading.Event()  # (set once the run ended)

        def go_on() -> None:  # a stopped process takes a catchable signal once continued; the other worker, held
            while not held.wait(0.05):  # at its own Nth item now or later, goes on (held, its full task pipe would
                for pid in workers:  # block this process's next write to it)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)

        threading.Thread(target=go_on, daemon=True).start()
        try:
            code, err = finish(proc, RUN_TIMEOUT)
        finally:
            held.set()
    finally:
        finish(proc, 1)
    _assert_clean_failure(code, err, out)
    assert f"killed by {sig.name}" in err
    assert wait_gone(workers, 10.0) == []


def _spawned(pid: int, settle: float = 0.5) -> bool | None:
    """Whether worker `pid` is a spawned interpreter (else forked); None if it was gone at once.
    A spawned worker is forked first and only then execs `spawn_main`, so it may be caught in
    between with its parent's command line: watch it for `settle` seconds before saying forked."""
    seen: bool | None = None
    deadline = time.monotonic() + settle
    while time.monotonic() < deadline:
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            break
        seen = False
        time.sleep(0.01)
    return seen


def test_forked_and_spawned_workers_write_the_same_bytes(tmp_path, corpus, monkeypatch):
    """The command line forks its workers (they carry its own command line, not `spawn_main`);
    forced to spawn, or with one worker, the dataset is byte for byte the same."""
    digests, spawned = {}, {}
    for name, start, workers in (("fork", "auto", "2"), ("spawn", "spawn", "2"), ("one", "auto", "1")):
        out = tmp_path / name
        monkeypatch.setenv("LMSHARD_WORKER_START", start)
        proc = start_prepare([str(corpus), "--out", str(out), "--workers", workers, "--max-docs", "6000"])
        try:
            found = wait_for_workers(proc, 2, timeout=20.0) if workers == "2" else []
            spawned[name] = {_spawned(w) for w in found} - {None}
            code, err = finish(proc, RUN_TIMEOUT)
        finally:
            finish(proc, 1)
        assert code == 0, err
        digests[name] = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*.bin"))}
    assert spawned == {"fork": {False}, "spawn": {True}, "one": set()}, spawned
    assert digests["fork"] == digests["spawn"] == digests["one"] and digests["one"]


@pytest.mark.slow
def test_killed_prepare_leaves_no_worker_behind(tmp_path, corpus, monkeypatch):
    """SIGKILL the main process (as a scheduler or the OOM killer would) as soon as its workers
    appear: its workers exit too (mid-run: test_local_exec.py)."""
    proc = start_prepare([str(corpus), "--out", str(tmp_path / "o"), "--workers", "2"])
    try:
        workers = wait_for_workers(proc, 2)
        assert workers, "prepare ended before its workers started"
        proc.kill()
        proc.wait(10)
        assert wait_gone(workers, 10.0) == [], "workers outlived their prepare"
    finally:
        finish(proc, 1)
    assert all(not alive(w) for w in workers) and workers_of(proc.pid) == []


def _child_that_ignores_stop_signals() -> None:
    from lmshard.prepare.stops import ignore_stop_signals

    ignore_stop_signals()
    os.kill(os.getpid(), signal.SIGTERM)  # (ignored: it goes on)
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(7)


@pytest.mark.parametrize("to", ["main thread", "process"])
def test_a_stop_signal_while_a_worker_starts_is_held_for_the_parent_not_lost(to):
    """SIGINT and SIGTERM are held while a worker starts (`stop_signals_held`: the child cannot
    die of a group's Ctrl-C before it is set up). One that reaches the parent then, sent to its
    main thread or to the process (which another of its threads may take), is taken by the
    parent's own handler once it is back, where ignoring them lost it (the run went on to the
    end); the child, set up, ignores both."""
    import multiprocessing

    from lmshard.prepare.stops import stop_signals_held

    taken: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda sig, frame: taken.append(sig))
    release, ticks = threading.Event(), [0]

    def tick() -> None:  # a thread that does not block them: the kernel takes one sent to the process there
        while not release.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    other = threading.Thread(target=tick)
    other.start()

    def send(sig: int) -> None:
        if to == "main thread":
            signal.pthread_kill(threading.main_thread().ident, sig)
        else:
            os.kill(os.getpid(), sig)

    try:
        with pytest.raises(KeyboardInterrupt), stop_signals_held():
            child = multiprocessing.get_context("fork").Process(target=_child_that_ignores_stop_signals)
            child.start()
            send(signal.SIGINT)
            send(signal.SIGTERM)
            seen = ticks[0]
            while ticks[0] < seen + 2:  # (the other thread has been back from the kernel since: it took them)
                time.sleep(0.001)
            assert taken == []  # (held meanwhile)
        child.join(60)
        assert child.exitcode == 7 and taken == [signal.SIGTERM]
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == set()  # (nothing left blocked here)
    finally:
        release.set()
        other.join()
        signal.signal(signal.SIGTERM, old)
