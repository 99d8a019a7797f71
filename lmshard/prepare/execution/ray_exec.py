"""`prepare --num-tasks N --executor ray [--ray-address ADDR]`: the planned run's tokenize, dedup,
select and write tasks as Ray core tasks (one CPU each, retried up to `max_retries` times if a
worker dies), stage after stage, then the finish (metadata only) in this process. With an
address it joins that cluster (`auto`: the one `ray start` began on this node); without one
it starts a local Ray instance for the run and shuts it down after. The cluster's workers
must import the same lmshard and see the inputs and the output at the same paths (each task
runs in the directory the command was started in).
Needs Ray: `pip install 'lmshard[ray]'`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from ...errors import ConfigError, LmshardError
from ..config import PrepareConfig

MAX_RETRIES = 3


def _stage(stage: str, config: dict[str, Any], n_tasks: int, task: int, unit_bytes: int, cwd: str) -> Any:
    from . import stages

    os.chdir(cwd)  # relative inputs and --out mean what they meant where the run was started
    return stages.run_task(PrepareConfig(**config), n_tasks, stage, task, unit_bytes)


def run(cfg: PrepareConfig, n_tasks: int, unit_bytes: int, address: str | None = None) -> Any:
    """Every stage's tasks on Ray, stage after stage, then the finish here; returns the dataset's
    metadata."""
    from .stages import run_stages, run_task

    each_stage(run_stages(cfg)[:-1], n_tasks, _stage, (asdict(cfg), n_tasks), (unit_bytes, os.getcwd()), address)
    run_task(cfg, n_tasks, "finish", 0, unit_bytes)
    from ...format import load_metadata

    return load_metadata(cfg.out)


def each_stage(stages: Sequence[str], n_tasks: int, fn: Callable[..., Any], head: tuple[Any, ...],
               tail: tuple[Any, ...], address: str | None = None) -> None:  # fmt: skip
    """`fn(stage, *head, task, *tail)` for every task of each stage, as Ray core tasks (one CPU
    each, retried MAX_RETRIES times where a worker dies), every task of a stage before any of the
    next; LmshardError with a failed task's own message."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray: pip install 'lmshard[ray]'") from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ours = not ray.is_initialized()
    if ours:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        remote = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(fn)
        for stage in stages:
            refs = [remote.remote(stage, *head, t, *tail) for t in range(n_tasks)]
            try:
                ray.get(refs)
            except ray.exceptions.RayTaskError as e:  # the task's own error (bad input...): its message
                cause = e.cause if isinstance(e.cause, LmshardError) else e
                raise LmshardError(f"a Ray {stage} task failed: {cause}") from None
    finally:
        if ours:
            ray.shutdown()
