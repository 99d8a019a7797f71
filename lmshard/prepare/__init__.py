"""`lmshard prepare`: raw text → cleaned, deduplicated, tokenized shards with their metadata.

The rooms, in the order a document passes through them:

- `config`: `PrepareConfig` and `resolve_config` (flags > config file > preset > demo defaults);
- `files`: the I/O leaf (what an input file is, opening and decompressing it), over `reading`
  (a file read as the run recorded it, its byte-order mark, its OS errors named as the input's);
- `sources`: inputs → an ordered stream of work items; `records`: bytes → `Record`s, and the
  one `--on-error` decision (`settle`); `columnar`: parquet and arrow; `hf`: Hugging Face
  datasets and presets;
- `worker`: per item, parse → clean (`clean`) → key → tokenize, in worker processes (`pool`);
- `pipeline`: the run itself: dedup (`dedup`) and split in input order, shards (`writer`),
  metadata last.

    from lmshard.prepare import PrepareConfig, prepare
    meta = prepare(PrepareConfig(inputs=["corpus/"], out="data/corpus"))

`presets()` lists the named datasets; `resolve_config(preset=NAME, ...)` applies one, as `--preset NAME` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # type checkers see the real names; at run time they load on first use
    from .config import PrepareConfig, resolve_config
    from .hf import Preset, presets
    from .pipeline import Progress, prepare

__all__ = ["PrepareConfig", "Preset", "Progress", "prepare", "presets", "resolve_config"]


def __getattr__(name: str) -> Any:
    """The public names, imported on first use: a worker process imports only `worker` and
    what it needs (not the pipeline, staging and claim machinery of the main process), which
    is about 0.1 s of each worker's start."""
    if name in ("PrepareConfig", "resolve_config"):
        from . import config

        return getattr(config, name)
    if name in ("Progress", "prepare"):
        from . import pipeline

        return getattr(pipeline, name)
    if name in ("Preset", "presets"):
        from . import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'lmshard.prepare' has no attribute {name!r}")
