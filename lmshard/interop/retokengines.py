"""`lmshard retokenize --num-tasks N --executor local|slurm|ray|none`: a planned retokenize's
tasks (retoktasks.py) run on an engine: a pool of processes here, Slurm job arrays (prepare's
slurm.py: an array per stage, the finish after them, within the cluster's job limits; each runs
`lmshard run-task`), Ray tasks, or the commands printed for any "task i of N" scheduler.

Memory model: the coordinator holds the plan and the source's metadata; each task, its own
(retoktasks.py).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from typing import Any

from .retokplan import plan
from .retoktasks import STAGES, Tasks

_held: dict[str, Tasks] = {}  # a local worker's plan, loaded once (`_load`)


def _load(out: str) -> None:
    _held["tasks"] = Tasks.of(out)


def _task(work: tuple[str, int]) -> int:
    return _held["tasks"].run(*work)


def run_local(out: str | os.PathLike[str], workers: int) -> Any:
    """Every task of each stage in a pool of `workers` processes (one task each at a time), then
    the finish here; returns the new dataset's metadata."""
    from ..format import load_metadata
    from ..prepare.execution.pool import OrderedPool, start_method

    tasks = Tasks.of(out)
    n = max(1, min(workers, tasks.n_tasks))
    for stage in STAGES[:-1]:
        items = [(stage, t) for t in range(tasks.n_tasks)]
        if n == 1:
            for item in items:
                tasks.run(*item)
            continue
        pool: OrderedPool[Any, Any] = OrderedPool(n, _load, os.path.realpath(out), start=start_method())
        with pool:
            for _ in pool.imap(_task, items, 2 * n):
                pass
    tasks.run("finish", 0)
    return load_metadata(out)


def _ray_task(stage: str, out: str, task: int, cwd: str) -> int:
    os.chdir(cwd)
    return Tasks.of(out).run(stage, task)


def run_ray(out: str | os.PathLike[str], address: str | None = None) -> Any:
    """Every task of each stage as a Ray task (one CPU each), then the finish here; returns the
    new dataset's metadata."""
    from ..format import load_metadata
    from ..prepare.execution.ray_exec import each_stage

    tasks = Tasks.of(out)
    each_stage(STAGES[:-1], tasks.n_tasks, _ray_task, (os.path.realpath(out),), (os.getcwd(),), address)
    tasks.run("finish", 0)
    return load_metadata(out)


EXECUTORS = ("local", "none", "slurm", "ray")


def planned(dataset: str, out: str, n_tasks: int, executor: str, options: dict[str, Any], *, overwrite: bool,
            workers: int | None, sbatch_args: str | None, max_jobs: int | None, ray_address: str | None,
            say: Callable[[str], None]) -> Any:  # fmt: skip
    """Plan the retokenize as `n_tasks` tasks and run them with `executor`: the new dataset's
    metadata where they ran from here (local, ray), else None (submitted to Slurm, or the
    commands said for another scheduler)."""
    from ..errors import ConfigError
    from ..remote.urls import local_only

    if executor not in EXECUTORS:
        raise ConfigError(f"--executor {executor}: pass one of {', '.join(EXECUTORS)}")
    if max_jobs is not None and max_jobs < 3:
        raise ConfigError(f"--max-jobs {max_jobs}: a run queues at least 3 jobs (two arrays and the finish)")
    local_only(out, "retokenize --num-tasks")
    plan(dataset, out, n_tasks, overwrite=overwrite, **options)
    quoted = shlex.quote(str(out))
    if executor == "local":
        return run_local(out, workers or len(os.sched_getaffinity(0)))
    if executor == "ray":
        return run_ray(out, ray_address)
    if executor == "slurm":
        from ..prepare.execution import slurm

        jobs = slurm.submit(str(out), n_tasks, sbatch_args, max_jobs, STAGES[:-1])
        say(f"submitted {n_tasks} tasks of each stage: encode (job {jobs['encode']}), write (job {jobs['write']}), "
            f"and the finish (job {jobs['finish']}); follow with: lmshard status {quoted}")  # fmt: skip
        return None
    say(f"planned {n_tasks} tasks; run each stage's tasks, one stage after the other, then the finish:")
    for stage in STAGES[:-1]:
        say(f"  lmshard run-task --stage {stage} --task I {quoted}    # I = 0 .. {n_tasks - 1}")
    say(f"  lmshard run-task --stage finish {quoted}")
    return None
