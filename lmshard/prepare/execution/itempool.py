"""A pool of worker processes that run the items of a planned run's stages (run.py): the local
executor's workers (local_exec.py), and those of a task with several CPUs (stages.py).

Workers are forked where that is safe (they inherit the run: plan, inputs, tokenizer), else
started and given the run's configuration to load it themselves. They ignore Ctrl-C and SIGTERM
(the process that owns the pool stops them at once, killing an item in progress, which has no
marker and is redone), and exit when that process dies. What a worker runs is poolworker.py.

Memory model: each worker holds what its stage's item holds (see each stage's module); the
owner holds one future per batch of items of the current stage, and while it reads units
spread over the workers (`units_in_pool`), at most 2 × workers + 2 work items and their
results (≈1 MiB of text and its tokens each; a Hugging Face dataset's, RECORDS_PER_ITEM
records each, whatever their size; over the units they come from: each one's line
counts, and with --dedup-lines its kept lines' keys) and the per-document arrays of the unit
being written.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, as_completed, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, TypeVar

from ...errors import ConfigError, InputError, LmshardError
from ..documents.sources import WorkItem
from ..stops import stop_signals_held
from . import poolworker as worker
from .pool import WorkerDied, _widen, how_ended, start_method
from .unitfiles import Abandoned, open_unit
from .units import SIZED

if TYPE_CHECKING:
    from .run import Run

T = TypeVar("T")
BATCHES_PER_WORKER = 2  # the later stages' items go to the workers in this many batches each


def start_sharing(tokenizer: Any) -> str:
    """`start_method()`, after the tokenizer loaded for the forks what its first encode would
    (`Tokenizer.load_for_forks`: splintr's tables of a tokenizer.json) where they will fork:
    checked again after it, in case the load started a thread (then they are spawned)."""
    if start_method() == "fork":
        tokenizer.load_for_forks()
    return start_method()


@contextlib.contextmanager
def early_pool(workers: int, tokenizer: Any, make: Callable[[], Run]) -> Iterator[ProcessPoolExecutor | None]:
    """`workers` processes forked now, before the run is planned, where forking is safe (None
    where it is not): for a run whose planning starts threads in this process (it opens a
    Hugging Face dataset), after which its workers could only be spawned, each importing and
    loading again (≈0.5 s of a core). They inherit `tokenizer` and build the run with `make()`
    at their first item (the plan's head: `Run.of` as a task). Stopped when the block ends."""
    if start_sharing(tokenizer) != "fork":
        yield None
        return
    worker.here["make"], worker.here["parent"] = make, os.getpid()
    forks = multiprocessing.get_context("fork")
    pool = _widened(ProcessPoolExecutor(workers, mp_context=forks, initializer=worker.detach))
    try:
        with stop_signals_held():
            ready = [_submit(pool, "tokenize", worker.ready) for _ in range(workers)]  # (forked now, all of them)
        for f in ready:
            _result(f, "tokenize", pool)
        yield pool
    finally:
        worker.here.pop("make", None)
        _stop_workers(pool)


@contextlib.contextmanager
def item_pool(r: Run, workers: int, early: ProcessPoolExecutor | None = None) -> Iterator[ProcessPoolExecutor]:
    """A pool of `workers` processes that run items of `r` (or `early`'s, of as many, which stops
    them); stopped at once on an error or a stop."""
    if early is not None:
        worker.here["run"], worker.here["forked"] = r, True
        try:
            yield early
        except BaseException:  # (as below: the items in progress are not waited for)
            _stop_workers(early)
            raise
        finally:
            for key in ("run", "forked", "ready"):
                worker.here.pop(key, None)
        return
    method = start_sharing(r.tokenizer)  # fork only where it is safe: then the workers inherit the tokenizer
    worker.here["run"], worker.here["forked"], worker.here["parent"] = r, method == "fork", os.getpid()
    start = (type(r).of, r.config, r.plan["n_tasks"], r.plan["unit_bytes"], method == "fork", os.getpid())
    context = multiprocessing.get_context(method)
    pool = _widened(ProcessPoolExecutor(workers, mp_context=context, initializer=worker.start, initargs=start))
    try:
        yield pool
    except BaseException:  # a stop (Ctrl-C, SIGTERM) or an error: the items in progress are not waited for
        _stop_workers(pool)
        raise
    finally:
        worker.here.clear()
    _stop_workers(pool)  # every item done, the workers idle: ended at once (an orderly exit waits ≈50 ms for them)


def _widened(pool: ProcessPoolExecutor) -> ProcessPoolExecutor:
    """`pool` with its task and result pipes widened (pool._widen): a spread unit's work item
    and its tokens (≈1 MiB each; up to a few MiB for a Hugging Face dataset's records) cross in
    one write, not in 64 KiB pieces that each wait for this process's GIL (its reading thread
    and its result thread share it)."""
    queues: list[Any] = [getattr(pool, "_call_queue", None), getattr(pool, "_result_queue", None)]  # (CPython's)
    _widen(*(q._reader for q in queues if hasattr(q, "_reader")))
    return pool


def in_pool(pool: ProcessPoolExecutor, stage: str, items: list[int], workers: int,
            done: Callable[[str, int], None] | None = None) -> None:  # fmt: skip
    """Run `items` of `stage` in `pool`; `done(stage, item)` as each batch finishes."""
    # Units one at a time (long, and the progress follows them); the small items of the later stages in a few
    # batches per worker, so that this process schedules a few dozen calls, not thousands.
    size = 1 if stage in ("lines", "tokenize") else max(1, -(-len(items) // (BATCHES_PER_WORKER * workers)))
    with stop_signals_held():  # workers started now cannot die of Ctrl-C or SIGTERM: this process stops them
        futures = {_submit(pool, stage, worker.items, stage, items[k : k + size]): items[k : k + size]
                   for k in range(0, len(items), size)}  # fmt: skip
    _wait(pool, futures, stage, done)


def in_pool_until(pool: ProcessPoolExecutor, stage: str, items: list[int], workers: int,
                  done: Callable[[str, int], None], enough: Callable[[], bool],
                  stop_for: Callable[[int], Any], here: Callable[[int], None] | None = None,
                  large: Collection[int] = ()) -> list[int]:  # fmt: skip
    """Run `items` of `stage` in plan order, `workers` at a time, until `enough()` (asked as each
    finishes: `done(stage, item)` first), each given `stop_for(item)` (maxdocs.UnitStop: with a
    `room` when every item before it is done); the items in progress then finish or are given up
    (unitfiles.Abandoned). Returns those never started or given up, in order. An item of `large`
    (`large_units`) waits until every item before it is done, then `here(item)` runs it (read in
    this process, its work items spread over the workers, with its room: it calls `done`).

    An item started without a room that fails on its input (InputError: a bad record, a file
    gone; ConfigError: a file changed since the plan) may have read past the N-th kept document,
    where one process never reads: its error waits until the items before it are done. If they
    hold N by then, it is given up; else it runs again with its room, and only an error before
    its N-th is raised."""
    left, running, given_up = items[::-1], dict[Future[None], int](), list[int]()
    failed: dict[int, LmshardError] = {}
    roomed: set[int] = set()

    def submit(i: int, stop: Any) -> None:
        if stop.room is not None:
            roomed.add(i)
        running[_submit(pool, stage, worker.items, stage, [i], stop)] = i

    while running or failed or (left and not enough()):
        with stop_signals_held():
            while left and len(running) < workers and not enough() and left[-1] not in large:
                i = left.pop()
                submit(i, stop_for(i))
        if left and left[-1] in large and not (running or failed or enough()):
            assert here is not None
            here(left.pop())  # (every item before it is done)
            continue
        finished = wait(running, return_when=FIRST_COMPLETED)[0] if running else set()
        for f in finished:
            i = running.pop(f)
            try:
                _result(f, stage, pool)
            except Abandoned:
                given_up.append(i)
                continue
            except (InputError, ConfigError) as e:
                if i in roomed:
                    raise
                failed[i] = e
                continue
            done(stage, i)
        if failed:  # the first one failed; the others wait for it
            i = min(failed)
            if enough():
                given_up += list(failed)
                failed.clear()
            elif (stop := stop_for(i)).room is not None:
                del failed[i]
                with stop_signals_held():
                    submit(i, stop)
            elif not running and not left:  # (nothing before it left to run: it cannot wait for anything)
                raise failed[i]
    return sorted(given_up + left)


def units_in_pool(pool: ProcessPoolExecutor, r: Run, stage: str, units: list[int], workers: int,
                  done: Callable[[str, int], None] | None = None,
                  step: Callable[[Any], None] | None = None, local: bool = False) -> None:  # fmt: skip
    """The `units` of the lines or the tokenize stage in `pool`. A unit larger than half again a
    worker's share of them (a compressed file is one unit whatever its size) would keep one
    worker busy while the others wait: each such unit is read here, first, and its work items
    hashed or tokenized by every worker (`spread`; `step(result)` as each comes back), as one
    reading process does; then the others, a unit per worker."""
    large = large_units(r, units, workers, local)
    if large:
        started(pool, workers, stage)
    if stage == "tokenize":  # (one window over the units: the next one's items go out as this one's come back)
        masks = r.line_masks if r.config.dedup_lines else None
        opened = ((u, open_unit(r.config, r.plan, r.sources, r.tokenizer, r.wcfg, u, masks)) for u in large)
        chain = _Chain(pool, workers, step, ((u, unit) for u, unit in opened if unit is not None))
        for u, unit in chain.units():
            unit.write(chain.results(u))
            if done is not None:
                done(stage, u)
    else:
        for u in large:
            r.do(stage, u, spread=spread(pool, workers, stage, step))
            if done is not None:
                done(stage, u)
    spread_here = set(large)
    in_pool(pool, stage, [u for u in units if u not in spread_here], workers, done)


def large_units(r: Run, units: list[int], workers: int, local: bool = False) -> list[int]:
    """The units of `units` that `units_in_pool` spreads over `workers`: larger than half again
    a worker's share (of bytes as planned: a compressed file's are its compressed bytes). None
    of a plan whose units are not sized in bytes (a Hugging Face stream's shards, a saved
    dataset's rows): those are streamed by several workers at once."""
    if any(r.plan["units"][u][1] not in SIZED for u in units):
        return list(units) if local and workers > 1 else []
    share = sum(r.plan["units"][u][4] for u in units) / workers
    return [u for u in units if r.plan["units"][u][4] > 1.5 * share]


def started(pool: ProcessPoolExecutor, workers: int, stage: str) -> None:
    """The pool's workers started now, if they are not yet (a pool starts them as items are
    submitted), with Ctrl-C and SIGTERM ignored as they start: forked before this process opens
    an input (whose reader may start threads). Spawned ones (this process runs threads: it
    opened a Hugging Face dataset, say) load the run while this process goes on reading; one
    that could not (a store that stopped answering) says so at the first item it takes."""
    with stop_signals_held():
        ready = worker.here["ready"] = [_submit(pool, stage, worker.ready) for _ in range(workers)]
    for f in ready if worker.here.get("forked") else ():
        _result(f, stage, pool)


Spread = Callable[[Iterator[WorkItem]], Iterator[Any]]  # work items in, their results out, in order


def spread(pool: ProcessPoolExecutor, workers: int, stage: str = "tokenize",
           step: Callable[[Any], None] | None = None) -> Spread:  # fmt: skip
    """Work items tokenized (the lines stage: their lines hashed) by `pool`'s workers
    (`started`), their results in order; at most `2 × workers + 2` in flight (each ≈1 MiB of
    text and its tokens). While spawned workers are still loading the run, the items are
    tokenized here, as one reading process does before its pool is up."""

    def results(items: Iterator[WorkItem]) -> Iterator[Any]:
        window: deque[Future[Any]] = deque()

        def take() -> Any:
            result = _result(window.popleft(), stage, pool)
            if step is not None:
                step(result)
            return result

        for item in items:
            window.append(_send(pool, stage, item))
            if len(window) > 2 * workers + 1:
                yield take()
        while window:
            yield take()

    return results


class _Chain:
    """The work items of consecutive units spread over the pool in one window of `2 × workers
    + 2` (`spread`'s): the next unit is opened and its items go out while the last results of
    the one before come back, so no unit waits for the window to drain (a Hugging Face dataset
    of small data files holds a few items a unit). `units()`: each unit opened, in order;
    `results(u)`: unit u's results, in order, to be taken before the next unit's."""

    def __init__(self, pool: ProcessPoolExecutor, workers: int, step: Callable[[Any], None] | None,
                 opened: Iterator[tuple[int, Any]]) -> None:  # fmt: skip
        self.pool, self.limit, self.step, self.opened = pool, 2 * workers + 2, step, opened
        self.ready: deque[tuple[int, Any]] = deque()  # units opened, their results not taken yet
        self.reading: tuple[int, Iterator[WorkItem]] | None = None
        self.window: deque[tuple[int, Future[Any]]] = deque()

    def _fill(self) -> None:
        while len(self.window) < self.limit:
            if self.reading is None:
                nxt = next(self.opened, None)
                if nxt is None:
                    return
                self.ready.append(nxt)
                self.reading = (nxt[0], nxt[1].items())
            item = next(self.reading[1], None)
            if item is None:
                self.reading = None
                continue
            self.window.append((self.reading[0], _send(self.pool, "tokenize", item)))

    def units(self) -> Iterator[tuple[int, Any]]:
        while True:
            if not self.ready:
                self._fill()
                if not self.ready:
                    return
            yield self.ready.popleft()

    def results(self, u: int) -> Iterator[Any]:
        while True:
            self._fill()
            if not self.window or self.window[0][0] != u:
                return
            result = _result(self.window.popleft()[1], "tokenize", self.pool)
            if self.step is not None:
                self.step(result)
            yield result


def run_items(r: Run, stage: str, items: list[int], workers: int) -> None:
    """Items of one stage in a pool of `workers` processes: one task of a planned run that
    holds many cores (a node of a cluster, `run-task` with the CPUs the scheduler granted)."""
    with item_pool(r, workers) as pool:
        if stage in ("lines", "tokenize"):
            units_in_pool(pool, r, stage, items, workers)
        else:
            in_pool(pool, stage, items, workers)


def _wait(pool: ProcessPoolExecutor, futures: dict[Future[None], list[int]], stage: str,
          done: Callable[[str, int], None] | None) -> None:  # fmt: skip
    for f in as_completed(futures):  # each as it finishes: the progress line follows the units
        _result(f, stage, pool)
        if done is not None:
            for i in futures[f]:
                done(stage, i)


def _submit(pool: ProcessPoolExecutor, stage: str, fn: Callable[..., T], *args: Any) -> Future[T]:
    try:
        return pool.submit(fn, *args)  # (refused once a worker died)
    except BrokenProcessPool:
        raise _broken(pool, stage) from None


def _send(pool: ProcessPoolExecutor, stage: str, item: WorkItem) -> Future[Any]:
    """A spread work item tokenized (the lines stage: its lines hashed) by a worker; while the
    workers `started` started are not all ready (spawned ones load the run first), here, as a
    done future (no worker's stop point; its error raised where its result is taken)."""
    if all(f.done() for f in worker.here.get("ready", ())):  # (forked ones always are)
        return _submit(pool, stage, worker.hashed if stage == "lines" else worker.tokenized, item)
    done: Future[Any] = Future()
    try:
        done.set_result(worker.hashed(item) if stage == "lines" else worker.tokenize(item))
    except Exception as e:
        done.set_exception(e)
    return done


def _result(f: Future[T], stage: str, pool: ProcessPoolExecutor) -> T:
    try:
        return f.result()  # a worker's error is raised here
    except BrokenProcessPool:
        raise _broken(pool, stage) from None


def _broken(pool: ProcessPoolExecutor, stage: str) -> WorkerDied:
    return WorkerDied(f"a worker process {_died(pool)} during the {stage} stage; the work it finished is kept: "
                      "re-run the same command with --resume (with fewer --workers if memory ran out)")


def _died(pool: ProcessPoolExecutor) -> str:
    """How the worker that broke `pool` ended, in pool.py's words (its pid, the signal that
    killed it), when its exit status says: the pool ends the others with SIGTERM after it."""
    procs = list((pool._processes or {}).values())
    ended: list[tuple[int | None, int]] = []
    for _ in range(20):  # (the pool's own thread reaps them too: the code can show a moment later)
        ended = [(p.pid, p.exitcode) for p in procs if p.exitcode]
        if any(code != -signal.SIGTERM for _, code in ended):
            break
        time.sleep(0.05)
    first = next((e for e in ended if e[1] != -signal.SIGTERM), ended[0] if ended else None)
    if first is None:
        return "died (killed, as the out-of-memory killer does?)"
    return f"(pid {first[0]}) {how_ended(first[1])}"


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """End the workers now: they ignore Ctrl-C and SIGTERM, and an item in progress may take
    long (killed midway, it has no marker: a resumed run redoes it). A second stop signal waits
    until every worker is killed. A worker killed while it sent a result leaves half a message
    in the result pipe, whose writing end this process holds too: closed here, it gives the
    pool's thread an end of file (a broken pool, its way out) rather than a wait for the rest."""
    with stop_signals_held():
        for proc in list((pool._processes or {}).values()):
            proc.kill()
        if (writer := getattr(getattr(pool, "_result_queue", None), "_writer", None)) is not None:
            writer.close()
        pool.shutdown(wait=True, cancel_futures=True)  # (its thread closes its queues: no write to a closed pipe)
