"""The claim of `--out` that comes before every stage of a planned run (`begin`, where the run
is started: `prepare` itself, before any task).

The decision table of output/claim.py, under the writer lock:
a new build gets its staging directory `.NAME.lmshard-partial` and run record at once, an
interrupted one is resumed only with --resume (its work folder kept), and --overwrite discards
both; with --append the dataset's files are linked into the build. The tasks then write into
the staging directory, and nothing appears at `--out` until the finish (finish.py) swaps it in
whole.

Memory model: the claim's records (a few small JSON files); a new build's trained zstd
dictionary (dictfile.py), when one is asked for.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...errors import warn
from ...format import METADATA_FILE
from ...tokenizers import Tokenizer
from ..config import PrepareConfig
from ..documents.sources import Source
from ..output.claim import Claim, claim_output, write_run
from ..output.dictfile import keep, trained
from ..output.staging import OutputPaths, link_previous, recover
from . import volatile
from .runplan import worker_config
from .taskplan import PLAN_FILE


def begin(config: PrepareConfig, paths: OutputPaths, sources: list[Source], tokenizer: Tokenizer,
          work: Path) -> Claim:  # fmt: skip
    """Claim --out for a planned run (under the caller's writer lock): see the module docstring.
    A local run's work left unsynced before the machine restarted is discarded first (volatile.py)."""
    recover(paths)
    why = volatile.stale(work)
    if why is not None:
        warn(f"{work}: a local run left it unsynced {why}; it is discarded and the run starts over")
        shutil.rmtree(work)
        if not (paths.staging / METADATA_FILE).exists():  # (a complete build, synced, is only waiting for its swap)
            shutil.rmtree(paths.staging, ignore_errors=True)
    claim = claim_output(config, paths, sources, tokenizer, spooled=(work / PLAN_FILE).exists())
    if claim.complete is not None or claim.commit_pending:
        return claim
    if claim.resumed and claim.checkpoint is not None:  # a local run's build, resumed by a planned one
        shutil.rmtree(paths.staging)
        claim = Claim(claim.fingerprint, claim.started_at, previous=claim.previous)
    if not claim.resumed:
        if work.exists():  # an earlier run's work, discarded with its build (--overwrite) or never claimed
            shutil.rmtree(work)
        dictionary = None if claim.previous else trained(config, sources, tokenizer,
                                                         worker_config(config, sources, tokenizer))  # fmt: skip
        paths.staging.mkdir()
        if claim.previous is not None:  # --append: the dataset's files, linked in (the new ones are numbered after)
            link_previous(claim.previous, paths.out, paths.staging)
        keep(paths.staging, dictionary)
        write_run(paths.staging, claim, None)
    return claim


def unclaimed(out: str | os.PathLike[str], paths: OutputPaths, work: Path) -> str:
    """Why a task of the plan in `work` cannot run, its build folder being gone (deleted, as an
    interrupted --append's refusal says to discard it, or a prepare stopped between its plan and
    its claim): one line, naming both ways on. The same command claims --out afresh and, its
    build being new, discards the plan's work and plans again (`begin`)."""
    why = "has no run record" if paths.staging.exists() else "is missing"  # (a claim killed before its record)
    return (f"{out}: no build is claimed for this plan ({paths.staging} {why}); run the same `lmshard prepare` "
            f"command again to start over (it discards this plan's work), or delete {work}")


__all__ = ["begin", "unclaimed"]
