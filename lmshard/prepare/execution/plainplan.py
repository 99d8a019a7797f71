"""What a plain `prepare` (no --num-tasks) plans: the plan's tasks and unit size, `plain_plan`;
whether its items run in this process or the worker pool, `small_plan`. Each is measured by
scripts/bench_scaleout.py (sections 1 and 3) and its figures are in docs/scaling.md.

Memory model: none (the inputs' sizes, one listing of a Hugging Face dataset's files).
"""

from __future__ import annotations

import os
from typing import Any

from ..config import MIN_UNIT_BYTES, PrepareConfig
from ..documents.sources import Source
from .units import SIZED, UNIT_BYTES

# A plain prepare plans this many tasks per worker (4 units each): 8 units per worker, so the
# last unit to finish leaves the others idle for a short time, and few enough that each unit's
# fixed costs (its files, fsyncs, a read of each dedup group) stay small.
TASKS_PER_WORKER = 2
# A run of less input than this goes through its stages in this process whatever --workers says: the
# pool's start (forking the workers, a round trip per item) costs more than they save (bench_scaleout.py,
# section 3: at 1 MB the stages in a pool of 2 took 1.24x their time in one process; at 8 MB, as long).
POOL_BYTES = int(os.environ.get("LMSHARD_POOL_BYTES", 4 << 20))
# Below this many bytes of files, a plain prepare with several workers plans one unit, which the main
# process reads and every worker tokenizes (at 12 MB, 16 units took 1.19x the time of one reading
# process feeding the workers, one unit 1.07x), and runs the few items of its later stages itself.
ONE_UNIT_BYTES = int(os.environ.get("LMSHARD_ONE_UNIT_BYTES", 16 << 20))


def plain_plan(config: PrepareConfig, sources: list[Source]) -> tuple[int, int | None]:
    """The tasks and unit size a plain prepare plans (its tasks only size the units): 2 tasks of
    4 units per worker, so that no worker waits long for the last; but units of up to
    UNIT_BYTES where no worker waits for another: with one worker (every unit in this
    process), and below ONE_UNIT_BYTES of files, whose one unit the workers tokenize together
    (itempool.units_in_pool); below POOL_BYTES, which run here, one unit (small files share it,
    units.py). Each unit costs its work files in every stage (at 12 MB with 2 workers, 16 units
    took 1.19x one reading process's time, one unit 1.07x). --unit-size decides where given."""
    if config.unit_size is None and _sized_below(sources, POOL_BYTES):
        return 1, max(POOL_BYTES, MIN_UNIT_BYTES)
    if config.unit_size is None and (config.n_workers() == 1 or _sized_below(sources, ONE_UNIT_BYTES)):
        return 1, UNIT_BYTES
    return TASKS_PER_WORKER * config.n_workers(), None


def _sized_below(sources: list[Source], limit: int) -> bool:
    """Less than `limit` bytes of input whose size is known: files (not a stream, a Hugging Face
    dataset). `small_plan` is the rule on a plan's units, below POOL_BYTES."""
    return all(not s.stream and s.fmt != "hf" for s in sources) and sum(s.size for s in sources) < limit


def small_plan(units: Any, limit: int | None = None) -> bool:
    """Less than `limit` (POOL_BYTES) of input in units of known size (a stream's shards and a
    saved or downloaded split's rows are not bytes): `_sized_below` on a plan, as a resumed or `--num-tasks`
    run has it."""
    return all(u[1] in SIZED for u in units) and sum(u[4] for u in units) < (POOL_BYTES if limit is None else limit)


__all__ = ["ONE_UNIT_BYTES", "POOL_BYTES", "TASKS_PER_WORKER", "plain_plan", "small_plan"]
