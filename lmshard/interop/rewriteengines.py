"""`lmshard retokenize|score ... --num-tasks N --executor local|slurm|ray|none`: a planned
rewrite's tasks (retoktasks.py, scoretasks.py) run on an engine: a pool of processes here, Slurm
job arrays (prepare's slurm.py: an array per stage, the finish after them, within the cluster's
job limits; each runs `lmshard run-task`), Ray tasks, or the commands printed for any "task i of
N" scheduler.

Memory model: the coordinator holds the plan's head; each task, its own (retoktasks.py,
scoretasks.py).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, InputError
from .rewrite import Planned, planned, read_head

EXECUTORS = ("local", "none", "slurm", "ray")
_held: dict[str, Planned] = {}  # a local worker's plan, loaded once (`_load`)


def tasks_for(out: str | os.PathLike[str], workers: int = 1) -> Planned:
    """The planned rewrite in `out`'s work folder, its tasks' `workers` processes each."""
    from .retoktasks import Tasks
    from .scoretasks import ScoreTasks

    kind = planned(out)
    if kind is None:
        raise InputError(f"{out}: no retokenize or score is planned there")
    return Tasks.of(out, workers) if kind == "retokenize" else ScoreTasks.of(out, workers)


def progress(out: str | os.PathLike[str]) -> dict[str, Any]:
    """The planned rewrite's progress (`Planned.status`), from its head and work folder alone:
    neither vocabulary nor scorer is loaded."""
    from .retoktasks import Tasks
    from .scoretasks import ScoreTasks

    kind = planned(out)
    if kind is None:
        raise InputError(f"{out}: no retokenize or score is planned there")
    cls: type[Planned] = Tasks if kind == "retokenize" else ScoreTasks
    bare = cls.__new__(cls)  # (the fields status reads: the work folder, the head, the source's head)
    Planned.__init__(bare, *read_head(out, kind))
    return bare.status()


def _load(out: str) -> None:
    _held["tasks"] = tasks_for(out)


def _task(work: tuple[str, int]) -> int:
    return _held["tasks"].run(*work, record=False)


def run_local(out: str | os.PathLike[str], workers: int) -> Any:
    """Every task of each stage in a pool of `workers` processes (one task each at a time), then
    the finish here; returns the new dataset's metadata."""
    from ..format import load_metadata
    from ..prepare.execution.pool import OrderedPool, start_method

    tasks = tasks_for(out)
    n = max(1, min(workers, tasks.n_tasks))
    for stage in tasks.STAGES[:-1]:
        items = [(stage, t) for t in range(tasks.n_tasks)]
        if n == 1:
            for item in items:
                tasks.run(*item, record=False)
            continue
        pool: OrderedPool[Any, Any] = OrderedPool(n, _load, os.path.realpath(out), start=start_method())
        with pool:
            for _ in pool.imap(_task, items, 2 * n):
                pass
    tasks.run("finish", 0)
    return load_metadata(out)


def _ray_task(stage: str, out: str, task: int, cwd: str) -> int:
    os.chdir(cwd)
    return tasks_for(out).run(stage, task)


def run_ray(out: str | os.PathLike[str], address: str | None = None) -> Any:
    """Every task of each stage as a Ray task (one CPU each), then the finish here; returns the
    new dataset's metadata."""
    from ..format import load_metadata
    from ..prepare.execution.ray_exec import each_stage

    tasks = tasks_for(out)
    each_stage(tasks.STAGES[:-1], tasks.n_tasks, _ray_task, (os.path.realpath(out),), (os.getcwd(),), address)
    tasks.run("finish", 0)
    return load_metadata(out)


def check(out: str, executor: str, max_jobs: int | None, arrays: int) -> str:
    """Refuse, before planning, what no engine can run (`arrays`: the run's stages before the
    finish); the output's real path, which the plan and every task name it by."""
    from ..remote.urls import local_only

    if executor not in EXECUTORS:
        raise ConfigError(f"--executor {executor}: pass one of {', '.join(EXECUTORS)}")
    if max_jobs is not None and max_jobs < arrays + 1:
        raise ConfigError(f"--max-jobs {max_jobs}: this run queues at least {arrays + 1} jobs (an array per stage "
                          "and the finish)")  # fmt: skip
    local_only(out, "--num-tasks")
    return os.path.realpath(out)


def run(out: str, executor: str, *, workers: int | None, sbatch_args: str | None, max_jobs: int | None,
        ray_address: str | None, say: Callable[[str], None]) -> Any:  # fmt: skip
    """Run the rewrite planned for `out` with `executor`: the new dataset's metadata where the
    tasks ran from here (local, ray), else None (submitted to Slurm, or the commands said)."""
    tasks = tasks_for(out)
    quoted, stages = shlex.quote(str(out)), tasks.STAGES[:-1]
    if executor == "local":
        return run_local(out, workers or len(os.sched_getaffinity(0)))
    if executor == "ray":
        return run_ray(out, ray_address)
    if executor == "slurm":
        from ..prepare.execution import slurm

        jobs = slurm.submit(str(out), tasks.n_tasks, sbatch_args, max_jobs, stages)
        arrays = ", ".join(f"{stage} (job {jobs[stage]})" for stage in stages)
        say(f"submitted {tasks.n_tasks} tasks of each stage: {arrays}, and the finish (job {jobs['finish']}); "
            f"follow with: lmshard status {quoted}")  # fmt: skip
        return None
    say(f"planned {tasks.n_tasks} tasks; run each stage's tasks, one stage after the other, then the finish:")
    for stage in stages:
        say(f"  lmshard run-task --stage {stage} --task I {quoted}    # I = 0 .. {tasks.n_tasks - 1}")
    say(f"  lmshard run-task --stage finish {quoted}")
    return None
