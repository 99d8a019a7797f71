"""`lmshard prepare`: raw text → cleaned, deduplicated, tokenized shards with their metadata.

Three rooms, and the run that ties them together:

- `documents/`: the per-document pipeline (inputs, records, cleaning, keys, tokenizing: the worker);
- `execution/`: the plan, the stages and their engines (the local pool, Slurm, Ray, run-task, status);
- `output/`: the output's durability (the claim of `--out`, staging and swap, the build, the writers);
- `pipeline`: the run: a large input as staged tasks in the worker pool, anything else read in
  this process and written as it goes; `config`: `PrepareConfig` and `resolve_config` (flags >
  config file > preset > demo defaults), with `values` (option values checked as their types) and
  `domains` (what --val-by names as a domain); `stops`: stop points for fault tests.

    from lmshard.prepare import PrepareConfig, prepare
    meta = prepare(PrepareConfig(inputs=["corpus/"], out="data/corpus"))

`presets()` lists the named datasets; `resolve_config(preset=NAME, ...)` applies one, as `--preset NAME` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # type checkers see the real names; at run time they load on first use
    from .config import PrepareConfig
    from .configfile import resolve_config
    from .documents.hf import Preset, presets
    from .pipeline import Progress, prepare

__all__ = ["PrepareConfig", "Preset", "Progress", "prepare", "presets", "resolve_config"]


def __getattr__(name: str) -> Any:
    """The public names, imported on first use: a worker process imports only `worker` and
    what it needs (not the pipeline, staging and claim machinery of the main process), which
    is about 0.1 s of each worker's start."""
    if name == "PrepareConfig":
        from . import config

        return config.PrepareConfig
    if name == "resolve_config":
        from . import configfile

        return configfile.resolve_config
    if name in ("Progress", "prepare"):
        from . import pipeline

        return getattr(pipeline, name)
    if name in ("Preset", "presets"):
        from .documents import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'lmshard.prepare' has no attribute {name!r}")
