"""An ordered process pool that cannot hang when a process dies, on either side.

Why not `multiprocessing.Pool` or `ProcessPoolExecutor`: their workers share one task queue and
one result queue guarded by locks. A worker SIGKILLed (the OOM killer, a segfault in a native
library) while it holds the queue's lock, or halfway through writing a result, leaves the
survivors and the parent's manager thread waiting forever; and when the parent itself is
killed, idle workers sleep on the queue indefinitely. Both were observed with lmshard's earlier
`ProcessPoolExecutor` (a hang in ~2 of 60 runs with a worker killed early).

Here every worker has two private pipes and nothing is shared, so no lock can be orphaned:

- parent → worker: tasks `(seq, fn, item)`; a thread in the worker drains this pipe into a local
  queue, so a send never waits on work in progress, and it sees end-of-file the moment the
  parent dies (the parent holds the only write end) and ends the worker at once;
- worker → parent: results `(seq, ok, value)`; the parent waits on every result pipe and every
  worker's process sentinel together (`multiprocessing.connection.wait`), so a worker that dies
  at any moment, including mid-message, is an end-of-file or a ready sentinel: `WorkerDied`,
  never a blocked read.

Results are handed out in submission order whatever the number of workers, so callers stay
byte-deterministic; each task goes to the least-loaded worker, so a slow item does not stall
the others.

Memory model: at most `window` items in flight between the caller and the workers (sent,
being processed, or finished but waiting for an earlier one), each with its result; at most
`PER_WORKER` tasks queued inside any one worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Generic, TypeVar

from ...errors import LmshardError
from ..stops import ignore_stop_signals, stop_signals_held

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

T = TypeVar("T")
R = TypeVar("R")
READY = -2  # the seq of the message a worker sends once its initializer has run
INIT = -3  # the seq of the initializer sent to a pool started without one
PIPE_BYTES = 4 << 20  # capacity asked for each pipe (see `_widen`)
PER_WORKER = 2  # tasks queued in one worker: one running, one ready to start without a round trip
JOIN_SECONDS = 5.0  # how long an orderly shutdown waits for a worker before killing it
# Ctrl-C, and SIGTERM: how a scheduler stops a job (Slurm's scancel and its time limit send it to
# every process of the job). Workers ignore both; the parent stops them (build.StopOnSignal).


class WorkerDied(LmshardError):
    """A worker process ended without being asked to (killed, out of memory, crashed)."""


class WorkerStartFailed(WorkerDied):
    """A worker's initializer raised (a tokenizer that would not load in it, say): the worker
    stopped before its first task, so the caller's work so far is sound and can be kept."""


class WorkerBug(Exception):
    """An unexpected exception inside a worker; carries the worker's own traceback text."""


def start_method() -> str:
    """How to start workers: "fork" where it is safe and pays, else "spawn".

    A spawned worker is a fresh interpreter that imports lmshard, numpy and the tokenizer
    library again: about 0.3 s of a core before it loads the vocabulary. A forked one starts
    with all of that already in memory (shared copy-on-write) in a few milliseconds. Forking is
    only safe while the process runs a single thread: the child gets a copy of the memory but
    only the calling thread, so a lock another thread held stays held forever in the child, and
    a native thread pool (Rayon's, in splintr and tokenizers) would be missing its threads. So
    "fork" only on Linux (macOS system libraries are not fork-safe), in a process that runs one
    thread, counted by the kernel (/proc/self/task) so native threads count too.
    `LMSHARD_WORKER_START=fork|spawn` overrides the choice (fork still only where it is safe)."""
    wanted = os.environ.get("LMSHARD_WORKER_START", "auto")
    if wanted == "spawn" or sys.platform != "linux" or "fork" not in mp.get_all_start_methods():
        return "spawn"
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        return "spawn"
    return "fork" if threads == 1 else "spawn"


class OrderedPool(Generic[T, R]):
    """`n` worker processes that run `fn(item)` and return results in item order.

    `initializer(arg)` runs once in each worker before its first task (e.g. to load a
    tokenizer). It can be given later, with `initialize`: a pool forked early, before this
    process starts threads or loads anything big, gets its configuration once it is known.
    Use as a context manager: leaving it stops every worker, killing any that is still busy
    (on an error, or when the caller stops reading results early).
    """

    def __init__(self, n: int, initializer: Callable[[Any], None] | None = None, arg: Any = None,
                 *, start: str = "spawn") -> None:  # fmt: skip
        """`start`: "spawn", or "fork" (only where `start_method` says it is safe)."""
        ctx: Any = mp.get_context(start)
        self._procs: list[BaseProcess] = []
        self._tasks: list[Connection] = []
        self._results: list[Connection] = []
        self._initialized = initializer is not None
        try:
            for _ in range(n):
                task_r, task_w = ctx.Pipe(duplex=False)
                result_r, result_w = ctx.Pipe(duplex=False)
                _widen(task_w, result_w)
                # A forked worker closes its copies of this process's pipe ends (its own and the
                # earlier workers'), which would otherwise keep their end-of-file from ever coming.
                others = (*self._tasks, *self._results, task_w, result_r) if start == "fork" else ()
                proc = ctx.Process(target=_worker_main, args=(task_r, result_w, initializer, arg, others),
                                   daemon=True)  # fmt: skip
                with stop_signals_held():  # the child cannot die of them: they are the parent's to handle
                    proc.start()
                # Drop our copies of the worker's ends: the worker's death must read as end-of-file here.
                task_r.close()
                result_w.close()
                self._procs.append(proc)
                self._tasks.append(task_w)
                self._results.append(result_r)
            # Which worker a ready pipe or sentinel belongs to, built once (looked up per answer).
            self._by_conn = {id(c): k for k, c in enumerate(self._results)}
            self._ready = [False] * n
            self._by_sentinel = {p.sentinel: k for k, p in enumerate(self._procs)}
        except BaseException:
            self.kill()
            raise

    def initialize(self, initializer: Callable[[Any], None], arg: Any) -> None:
        """Have every worker of a pool started without an initializer run `initializer(arg)`
        (before any task); `ready` then says when they all have."""
        if self._initialized:
            raise RuntimeError("the pool's workers were initialized already")
        for k in range(len(self._procs)):
            self._send(k, (INIT, initializer, arg))
        self._initialized = True

    def __enter__(self) -> OrderedPool[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def imap(self, fn: Callable[[T], R], items: Iterable[T], window: int) -> Iterator[R]:
        """`fn(item)` for every item, in order; at most `window` items in flight. A worker
        that dies raises `WorkerDied`; an `LmshardError` in a worker is re-raised here as is."""
        if window < 1:
            raise ValueError("window must be at least 1")
        if not self._initialized:
            raise RuntimeError("call initialize() before imap() on a pool started without an initializer")
        n = len(self._procs)
        load = [0] * n
        finished: dict[int, tuple[bool, Any]] = {}  # seq → (ok, result or exception)
        source = iter(items)
        sent = handed_out = 0
        exhausted = False
        while True:
            while not exhausted and sent - handed_out < window and min(load) < PER_WORKER:
                try:
                    item = next(source)
                except StopIteration:
                    exhausted = True
                    break
                k = load.index(min(load))
                self._send(k, (sent, fn, item))
                load[k] += 1
                sent += 1
            if handed_out in finished:
                ok, value = finished.pop(handed_out)
                if not ok:  # raised in item order, so the first bad item is the one reported
                    raise value
                yield value
                handed_out += 1
            elif exhausted and handed_out == sent:
                return
            else:
                for k, seq, ok, value in self._receive():
                    load[k] -= 1
                    finished[seq] = (ok, value)

    def ready(self) -> bool:
        """Whether every worker has run its initializer, without waiting: callers do the work
        themselves until then (a worker's start costs more than a small input's whole run). An
        initializer's error is raised here, and a worker that died before it was ready is
        `WorkerDied`, as it would be in `imap`. Call it only before `imap`."""
        for k, conn in enumerate(self._results):
            if self._ready[k]:
                continue
            try:
                while not self._ready[k] and conn.poll():
                    seq, ok, value = conn.recv()
                    if not ok and seq < 0:
                        raise self._failed(k, value)
                    self._ready[k] = seq == READY
            except (EOFError, OSError):
                raise self._died(k) from None
            if not self._ready[k] and not self._procs[k].is_alive():
                raise self._died(k)
        return all(self._ready)

    def close(self) -> None:
        """Orderly shutdown of idle workers: end-of-file on their task pipes, then join."""
        for conn in self._tasks:
            conn.close()
        for proc in self._procs:
            proc.join(JOIN_SECONDS)
        self.kill()

    def kill(self) -> None:
        """Stop every worker now (SIGKILL to the processes this pool started, by their pid)."""
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join()
            proc.close()
        self._procs = []
        for conn in (*self._tasks, *self._results):
            conn.close()

    def _send(self, k: int, task: tuple[int, Callable[[Any], Any], Any]) -> None:
        try:
            self._tasks[k].send(task)
        except (BrokenPipeError, ConnectionResetError):
            raise self._died(k) from None

    def _receive(self) -> Iterator[tuple[int, int, bool, Any]]:
        """Block until a worker answers or dies; yield (worker, seq, ok, result or exception)
        of each answer. An error not tied to one item (seq -1) is raised at once."""
        ready = wait([*self._results, *self._by_sentinel])
        for conn in ready:
            if not isinstance(conn, Connection):
                continue
            k = self._by_conn[id(conn)]
            try:
                seq, ok, value = conn.recv()
            except (EOFError, OSError):
                raise self._died(k) from None
            except Exception as e:  # the message arrived whole but does not unpickle here
                raise WorkerBug(f"worker {k} sent a result that cannot be read: {e!r}") from None
            if not ok and seq < 0:
                raise self._failed(k, value)
            if seq == READY:
                self._ready[k] = True
                continue
            yield k, seq, ok, value
        for r in ready:
            if isinstance(r, int):
                raise self._died(self._by_sentinel[r])

    def _failed(self, k: int, error: BaseException) -> BaseException:
        """The error a worker reported outside any task: its initializer's (`WorkerStartFailed`),
        or, once it was ready, a task it could not read (as is)."""
        if self._ready[k]:
            return error
        return WorkerStartFailed(f"worker process {k} could not start: {error}")

    def _died(self, k: int) -> BaseException:
        """Why worker `k` is gone: what it said before exiting (its initializer's error, say,
        which can arrive just before its end-of-file or exit), else how it ended."""
        conn = self._results[k]
        with contextlib.suppress(EOFError, OSError):
            while conn.poll():
                seq, ok, value = conn.recv()
                if not ok and seq < 0:
                    return self._failed(k, value)
                self._ready[k] = self._ready[k] or seq == READY
        proc = self._procs[k]
        proc.join(1.0)  # the pipe can report the death a moment before the exit code exists
        return WorkerDied(f"worker process {k} (pid {proc.pid}) {how_ended(proc.exitcode)}; if it ran out of memory, "
                          "lower --workers or --max-chars")  # fmt: skip


def _widen(*conns: Connection) -> None:
    """Pipes of PIPE_BYTES where the system allows (Linux: up to /proc/sys/fs/pipe-max-size,
    1 MiB by default): a 1 MiB work item or result then crosses in one write instead of sixteen
    64 KiB round trips, each of which waits for the reading thread to get its GIL back."""
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
    if setsize is None:
        return
    for conn in conns:
        for size in (PIPE_BYTES, 1 << 20):
            try:
                fcntl.fcntl(conn.fileno(), setsize, size)
                break
            except OSError:  # over the limit an unprivileged process may set: try the default limit
                continue


def how_ended(exitcode: int | None) -> str:
    """How a worker process ended, from its exit status: the signal that killed it, or its code."""
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-exitcode}"
        hint = " (as the out-of-memory killer does)" if name == "SIGKILL" else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {exitcode}"


def _worker_main(tasks: Connection, results: Connection, initializer: Callable[[Any], None] | None, arg: Any,
                 others: tuple[Connection, ...] = ()) -> None:  # fmt: skip
    """A worker's whole life: start the task reader, initialise (with what the first message
    brings, when the pool was started without an initializer), then answer tasks in order."""
    ignore_stop_signals()  # Ctrl-C and SIGTERM are the parent's to handle: it stops us
    for conn in others:
        conn.close()
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    threading.Thread(target=_read_tasks, args=(tasks, inbox), daemon=True).start()
    try:
        if initializer is None:
            first = inbox.get()
            if isinstance(first, BaseException):
                raise first
            seq, initializer, arg = first
            if seq != INIT or initializer is None:
                raise RuntimeError(f"a worker started without an initializer got task {seq} first")
        initializer(arg)
    except BaseException as e:
        _answer(results, -1, False, _portable(e))
        os._exit(1)
    _answer(results, READY, True, None)
    while True:
        task = inbox.get()
        if isinstance(task, BaseException):  # the reader could not read a task: say so, then stop
            _answer(results, -1, False, _portable(task))
            os._exit(1)
        seq, fn, item = task
        try:
            _answer(results, seq, True, fn(item))
        except BaseException as e:
            _answer(results, seq, False, _portable(e))


def _read_tasks(tasks: Connection, inbox: queue.SimpleQueue[Any]) -> None:
    """Move tasks from the pipe into the worker's queue. End-of-file means the parent closed
    the pool or died: either way nobody will read another result, so end the process now."""
    try:
        while True:
            inbox.put(tasks.recv())
    except (EOFError, OSError):
        os._exit(0)
    except BaseException as e:  # a task that does not unpickle here (or no memory to do it)
        inbox.put(e)


def _answer(results: Connection, seq: int, ok: bool, value: Any) -> None:
    try:
        results.send((seq, ok, value))
    except (BrokenPipeError, ConnectionResetError):
        os._exit(0)  # the parent is gone
    except Exception as e:  # the result itself cannot be pickled: report that instead
        results.send((seq, False, _portable(e)))


def _portable(e: BaseException) -> BaseException:
    """An exception that survives pickling: lmshard's own errors as they are (their message
    says the fix), operating-system errors as plain `OSError`s; anything else as a `WorkerBug`
    carrying the worker's traceback."""
    if isinstance(e, LmshardError):
        return e
    if isinstance(e, OSError):  # the machine's failure (a file gone, EIO), not a bug: the parent keeps the work
        return OSError(e.errno, e.strerror, e.filename)
    return WorkerBug("in a worker process:\n" + "".join(traceback.format_exception(e)))
