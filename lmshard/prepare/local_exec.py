"""The local executor of a planned run (`prepare --num-tasks N`, the default executor), with the
stages fused as one process tree allows.

On a remote engine the stages are separate jobs: every tokenize task, then every dedup bucket,
then the merge. On one machine that order wastes time (the merge would wait for the last unit,
and the dedup stage re-reads every key only to find what the merge can find as it goes), so
here the units (not whole tasks: tasks only group units for remote schedulers) are tokenized
`--workers` at a time in processes of their own, in plan order, while this process merges
them in plan order as each completes, deduplicating in memory exactly as a one-machine
prepare does. The output is the same bytes; each unit still writes its results and marker, so
a killed run started again skips the units it finished, and `status`/`run-task` see the work
directory as on any planned run.

Memory model: each worker holds one work item's text and result at a time (≈1 MiB of text and
its tokens; a unit's results go to disk as they are made); this process holds what a merge
holds (one unit's per-item table, one item's arrays, the dedup key set of 8 bytes per
document) plus one future per unit left to merge.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from .config import PrepareConfig
from .pool import STOP_SIGNALS, WorkerDied, start_method, stop_signals_ignored
from .stages import merge, plan_run, tokenize_unit, worker_config
from .taskplan import work_dir

_here: dict[str, Any] = {}  # what forked workers inherit: (config, plan, sources, tokenizer, worker config)


def run(config: PrepareConfig, n_tasks: int, unit_bytes: int | None = None,
        on_progress: Callable[[Any], None] | None = None) -> Any:  # fmt: skip
    """Tokenize every unit not yet done and merge, as described above; returns the metadata.
    `on_progress`: as for prepare, called as the merge goes."""
    plan, sources, tokenizer = plan_run(config, n_tasks, unit_bytes)
    size = int(plan["unit_bytes"])  # as planned: the workers validate the same plan
    done = work_dir(config.out) / "tokenize"
    todo = [u for u in range(len(plan["units"])) if not (done / f"unit_{u:06d}.done").exists()]
    workers = min(config.n_workers(), len(todo))
    if workers <= 1:  # one core, or (almost) nothing left: each unit just before it is merged
        wcfg = worker_config(config, sources, tokenizer)

        def inline(u: int) -> None:
            tokenize_unit(config, plan, sources, tokenizer, wcfg, u)

        return merge(config, n_tasks, size, ready=inline, dedup_stage=False, on_progress=on_progress)
    method = start_method()  # fork only where it is safe: then the workers inherit the tokenizer
    _here.update(args=(config, n_tasks, size), state=(plan, sources, tokenizer))
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method), initializer=_start,
                               initargs=(config, n_tasks, size, method == "fork"))  # fmt: skip
    try:
        with stop_signals_ignored():  # the workers start now (on the first submits), ignoring Ctrl-C and SIGTERM
            futures: dict[int, Future[bool]] = {u: pool.submit(_unit, u) for u in todo}

        def ready(u: int) -> None:
            future = futures.pop(u, None)
            if future is None:
                return
            try:
                future.result()  # a worker's error is raised here, as the merge reaches its unit
            except BrokenProcessPool:
                why = (f"a worker process died while it tokenized unit {u} or another (killed, as the out-of-memory "
                       "killer does?); the units it finished are kept: re-run the same command with --resume (with "
                       "fewer --workers if memory ran out)")  # fmt: skip
                raise WorkerDied(why) from None

        meta = merge(config, n_tasks, size, ready=ready, dedup_stage=False, on_progress=on_progress)
    except BaseException:  # a stop (Ctrl-C, SIGTERM) or an error: the units in progress are not waited for
        _stop_workers(pool)
        raise
    finally:
        _here.clear()
    pool.shutdown(wait=True)
    return meta


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """End the workers now: they ignore Ctrl-C and SIGTERM, and a unit in progress may take
    long. A unit killed midway has no marker, so a resumed run redoes it."""
    for proc in list((pool._processes or {}).values()):
        proc.kill()
    # Then the pool's own thread finds them dead and closes its queues (its way out of a broken
    # pool), so nothing writes to a closed pipe as this process exits.
    pool.shutdown(wait=True, cancel_futures=True)


def _start(config: PrepareConfig, n_tasks: int, unit_bytes: int, forked: bool) -> None:
    """Worker initializer: the parent's plan, sources and tokenizer when forked (one thread
    each), else loaded here. A worker whose parent dies (kill -9, the OOM killer) exits: its
    siblings hold the task queue open, so it would otherwise wait for a task forever."""
    for sig in STOP_SIGNALS:  # Ctrl-C and SIGTERM to the process group are the parent's to handle: it stops us
        signal.signal(sig, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    if forked and "state" in _here:
        plan, sources, tokenizer = _here["state"]
        tokenizer.use_threads(1)
    else:
        plan, sources, tokenizer = plan_run(config, n_tasks, unit_bytes)
    _here.update(args=(config,), state=(plan, sources, tokenizer), wcfg=worker_config(config, sources, tokenizer))


def _exit_with_parent(parent: int, every: float = 0.5) -> None:
    while os.getppid() == parent:
        time.sleep(every)
    os._exit(1)  # the unit in progress stays unfinished (no marker): a re-run redoes it


def _unit(u: int) -> bool:
    config = _here["args"][0]
    plan, sources, tokenizer = _here["state"]
    return tokenize_unit(config, plan, sources, tokenizer, _here["wcfg"], u)
