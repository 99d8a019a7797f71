"""`lmshard prepare`: sources → clean → dedup → tokenize → shards + metadata.

One way to the bytes, at every scale: every prepare is a plan of the same stages (execution/:
tokenize, dedup, select, write, finish; the line stages before them with --dedup-lines). A
plain prepare runs them here (execution/local_exec.py): in this process for a small input or
one worker, in the worker pool otherwise (execution/plainplan.py sizes the units); `--num-tasks
N` plans N tasks and runs them here too; the command line's other executors run the same plan's
tasks on Slurm, Ray or by `run-task`. Stdin and pipes are saved first and read from the copy
(runplan.spool_streams); a Hugging Face dataset is planned by its rows or its shards.

The output directory is claimed, built beside and swapped in by output/staging.py; a killed or
interrupted run keeps its stages' finished items, which `--resume` skips.

Memory model: local_exec.py's (each stage's item in one process at a time; the plan, the layout).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import ConfigError
from ..format import DatasetMeta
from ..remote.urls import output_url
from .config import PrepareConfig
from .execution import local_exec, plainplan
from .execution.runplan import load_run
from .output.build import Progress, sigterm_stops


def prepare(config: PrepareConfig, on_progress: Callable[[Progress], None] | None = None) -> DatasetMeta:
    """Run a prepare job and return the metadata it wrote (see staging.py for how `--out` is
    claimed, built beside, resumed and swapped): the plan's stages run here (local_exec.py), a
    config with `num_tasks` as a plan of that many tasks (the command line's `--num-tasks N`;
    other executors are the command line's). SIGTERM ends it as Ctrl-C does (in the main thread,
    where SIGTERM has its default action)."""
    with sigterm_stops():
        if output_url(config.out):  # built in a local work directory, then published (output/publish.py)
            from .output.publish import prepare_remote

            return prepare_remote(config, on_progress, _prepare)
        return _prepare(config, on_progress)


def _prepare(config: PrepareConfig, on_progress: Callable[[Progress], None] | None) -> DatasetMeta:
    if config.num_tasks is not None and config.executor != "local":
        raise ConfigError(f"prepare() runs a plan of {config.num_tasks} tasks here only (executor 'local'); for "
                          f"--executor {config.executor} run `lmshard prepare --num-tasks N --executor "
                          f"{config.executor}`")  # fmt: skip
    started = time.time()
    sources, tokenizer = load_run(config)  # (fails fast on a missing vocabulary)
    if not config.append:
        config.encoding(tokenizer.n_vocab)  # fail fast on uint16 for a larger vocabulary
    if config.num_tasks is not None:
        return local_exec.run(config, config.num_tasks, None, on_progress, (sources, tokenizer), started=started)
    # A resumed plain prepare goes on with the plan it made (sized to the --workers it had): `adopt`
    tasks, unit_bytes = plainplan.plain_plan(config, sources)  # (tasks here only size the units)
    return local_exec.run(config, tasks, unit_bytes, on_progress, (sources, tokenizer), adopt=True, started=started)


__all__ = ["Progress", "prepare"]
