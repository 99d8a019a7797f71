"""What a worker of the stages' pool runs (itempool.py): its initializer, and the items it is
given (units and the later stages' items, `items`; a spread unit's work items, `tokenized` and
`hashed`), with the run it works from: inherited when forked (`here`), loaded at its start when
spawned, or, forked before the run was planned (itempool.early_pool), built at its first item.

Memory model: the run (the plan's head and a few rows of its tables, the tokenizer) and what
the item in hand holds (see each stage's module).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import LmshardError
from ..config import PrepareConfig
from ..documents.sources import WorkItem
from ..documents.worker import ItemResult, hash_lines, run_item
from ..stops import ignore_stop_signals, stop_point
from . import volatile

if TYPE_CHECKING:
    from .run import Run

here: dict[str, Any] = {}  # what forked workers inherit: the run (or how to build it), whether they were forked


def start(make: Callable[..., Run], config: PrepareConfig, n_tasks: int, unit_bytes: int, forked: bool,
          parent: int | None = None) -> None:  # fmt: skip
    """Worker initializer: the parent's run (plan, sources, tokenizer) when forked (one thread
    each), else loaded here. `parent`: the pool's process (see `detach`)."""
    detach(parent)
    if forked and "run" in here:
        here["run"].tokenizer.use_threads(1)
        return
    try:
        here["run"] = make(config, n_tasks, unit_bytes)
    except LmshardError as e:  # (a store that stopped answering): raised by the first item, not a broken pool
        here["failed"] = e


def detach(parent: int | None = None) -> None:
    """A worker ignores Ctrl-C and SIGTERM to the process group (the parent's to handle: it
    stops the workers), and exits when its parent dies (kill -9, the OOM killer): its siblings
    hold the task queue open, so it would otherwise wait for a task forever. The parent is the
    pool's process as it recorded itself before forking (`here["parent"]`) or passed (`parent`,
    to a spawned worker), not this process's parent now: one killed while this worker was
    starting has been replaced by init already. An itempool.early_pool's worker initializer: its
    run is built at its first item (`worker_run`)."""
    ignore_stop_signals()
    pool = parent if parent is not None else here.get("parent", os.getppid())
    threading.Thread(target=_exit_with_parent, args=(pool,), daemon=True).start()


def _exit_with_parent(parent: int, every: float = 0.5) -> None:
    while os.getppid() == parent:
        time.sleep(every)
    os._exit(1)  # the item in progress stays unfinished (no marker): a re-run redoes it


def ready() -> None:
    if "failed" in here:
        raise here["failed"]


def worker_run() -> Run:
    """This worker's run: inherited, loaded at its start, or (an `early_pool`'s) built now, its
    work files unsynced as the run's (volatile.inherit)."""
    ready()
    if "run" not in here:
        run = here["make"]()  # (one that fails is tried again by the next item: its own error)
        run.tokenizer.use_threads(1)
        volatile.inherit(run.work)
        here["run"] = run
    return here["run"]  # type: ignore[no-any-return]


def hashed(item: WorkItem) -> np.ndarray:
    return hash_lines(item, worker_run().wcfg)


def tokenize(item: WorkItem) -> ItemResult:
    run = worker_run()
    return run_item(item, run.wcfg, run.tokenizer)


def tokenized(item: WorkItem) -> ItemResult:
    result = tokenize(item)
    stop_point("worker-item", item.seq if item.source == 0 else None)  # key: the item number in the first input
    return result


def items(stage: str, items: list[int], stop: Any = None) -> None:
    run = worker_run()
    for i in items:
        run.do(stage, i, stop)
