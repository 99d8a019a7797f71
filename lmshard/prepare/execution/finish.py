"""The end of a planned run (once, after the write stage): the pieces a killed writer left
unsealed sealed, the metadata made from the select stage's totals and the pieces' entries with
output/metadata.py (after the dataset an --append extends: its shards, key
files and totals first), the swap into --out, and the work folder removed.

Memory model: the run's totals and the pieces' entries (a few hundred bytes per shard and key
file); one 8 MiB block while sealing.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import replace
from pathlib import Path

from ...errors import InputError
from ...format import (
    METADATA_FILE,
    SPLITS,
    TOKENIZER_FILE,
    DatasetMeta,
    KeyFile,
    ShardInfo,
    atomic_write_json,
    write_vocab_copy,
)
from ...tokenizers import Tokenizer
from ..config import PrepareConfig
from ..documents.sources import Source, note_growth
from ..output.build import Totals, check_not_empty
from ..output.claim import Claim
from ..output.dictfile import run_encoding
from ..output.staging import Interrupted, OutputPaths, commit, read_run
from ..stops import stop_signals_held
from .barrier import is_complete, read_summary
from .layout import add_totals
from .layoutfiles import Layout
from .owners import missing_parts, seal_piece
from .taskplan import PLAN_FILE, SWAPPED_FILE, remove_work


def finish(config: PrepareConfig, paths: OutputPaths, work: Path, layout: Layout, totals: Totals,
           sources: list[Source], tokenizer: Tokenizer, previous: DatasetMeta | None = None,
           attempt: tuple[float, int] | None = None) -> DatasetMeta:  # fmt: skip
    """The metadata from the units' totals (added up by the select stage's summary) and the
    pieces' entries, then the swap (under the caller's writer lock); the work folder is removed
    once the dataset is in place. `previous` (--append): the dataset this run extends, whose
    shards, key files and totals come first, as a local --append lists them. `attempt`: when
    this process ran every stage (a local run), its start and the tokens it found done (a
    resumed run's), so the run's time and rate are its own; else its time from the claim on, and
    no rate where the tasks ran apart (Slurm, by hand)."""
    from ..output.metadata import dataset_metadata, warn_empty_val

    sealed = read_summary(work, "write").get("pieces", {}) if is_complete(work, "write") else {}
    for k in range(len(layout["pieces"])) if len(sealed) < len(layout["pieces"]) else ():
        if str(k) not in sealed and not (work / "write" / f"piece_{k:06d}.json").exists():
            # written, but not sealed by a write task (one killed after its parts)
            seal_piece(work, paths.staging, layout, k, run_encoding(config, tokenizer.n_vocab, previous, paths.staging),
                       take_over=True)  # fmt: skip
    missing = [] if is_complete(work, "write") else missing_parts(work, layout)
    if missing:
        tasks = sorted({layout.task_of_part(p) for p in missing})
        raise InputError(f"{len(missing)} of {len(layout['parts'])} parts of shards and key files are not written yet; "
                         f"run the write stage of task{'s' if len(tasks) > 1 else ''} {', '.join(map(str, tasks))} "
                         "first")  # fmt: skip
    run = read_run(paths.staging)
    if run is None:
        raise InputError(f"{paths.staging}: no run record; the build was not claimed by this run: start it again "
                         "with --overwrite")  # fmt: skip
    claim = Claim(run["fingerprint"], run.get("started", time.time()), previous=previous)
    base = Totals.of_dataset(previous) if previous is not None else Totals()
    new, totals = totals, Totals.parse(base.to_json())
    add_totals(totals, new)
    totals.examples = dict(sorted(totals.examples.items()))
    totals.near_examples = new.near_examples  # (Run.totals: this run's, each record numbered in its file)
    note_growth(sources, totals.per_source)
    entries = [sealed.get(str(k)) or json.loads((work / "write" / f"piece_{k:06d}.json").read_text())
               for k in range(len(layout["pieces"]))]  # (from the write stage's summary: one file for them all)
    pieces = layout["pieces"]
    shards = [s for split in SPLITS for s in (previous.split_shards(split) if previous is not None else ())
              + tuple(ShardInfo.parse(p[0], e) for p, e in zip(pieces, entries, strict=True) if p[0] == split)]
    old = previous.dedup.files if previous is not None and previous.dedup else ()
    own = {kind: tuple(KeyFile.parse(e) for p, e in zip(pieces, entries, strict=True) if p[0] == kind)
           for kind in ("keys", "near", "lines")}  # fmt: skip
    # (as a local run lists them: the dataset's keys, this run's document then line keys, then every signature file,
    # the dataset's first)
    keys = (tuple(f for f in old if f.kind != "near") + (own["keys"] if config.dedup == "document" else ())
            + own["lines"] + (tuple(f for f in old if f.kind == "near") if config.near_dedup else ())
            + own["near"])  # fmt: skip
    check_not_empty(config, totals, base, shards)
    started, done_before = attempt or (claim.started_at, 0)
    meta = dataset_metadata(config, sources, tokenizer, shards, totals, claim, keys, started,  # type: ignore[arg-type]
                            base.tokens + done_before)  # fmt: skip
    if attempt is None and config.executor != "ray":  # tasks run apart (run-task, Slurm): its time from the claim
        meta = replace(meta, run=replace(meta.run, tokens_per_s=None))  # held queues and idle gaps: no rate
    # (a Ray run's driver runs its stages back to back, then this finish: its time from the claim is its own)
    if "labels" in (layout.get("val_by") or {}):  # --val-by FIELD: its category column's labels (valby.py)
        meta = replace(meta, attributes=config.attribute_fields(layout["val_by"]["labels"] or [""]))  # (none: empty)
    for stray in strays(paths.staging):  # every piece is sealed: a sealer or a write killed midway left it
        stray.unlink()
    write_vocab_copy(paths.staging, tokenizer.vocab_format, tokenizer.vocab_bytes)
    atomic_write_json(paths.staging / TOKENIZER_FILE, tokenizer.identity())
    atomic_write_json(paths.staging / METADATA_FILE, meta.to_json())
    # Ctrl-C or SIGTERM during the swap and the work folder's removal is taken once both are done: it stops the
    # run as a complete one (Interrupted.complete: nothing to resume, nothing left beside the dataset). (A kill
    # meanwhile, or an interrupt raised in the removal: the plan, then the mark, are removed last; a removal
    # stopped midway is finished by the next finish or the same prepare with --resume, which find the mark, as
    # `status` and every task find the dataset complete.)
    swapped = False
    try:
        with stop_signals_held():
            (work / SWAPPED_FILE).touch()  # (with the build gone: swapped, taskplan.swapped; its name is the mark)
            commit(paths)
            swapped = True
            with contextlib.suppress(KeyboardInterrupt):
                remove_work(work, (PLAN_FILE, SWAPPED_FILE))
    except KeyboardInterrupt as e:
        if not swapped:  # (one raised in the swap itself, not a signal: the swap is recover()'s to finish)
            raise
        raise Interrupted("", getattr(e, "signum", 2), complete=str(paths.out)) from None
    warn_empty_val(meta)
    return meta


def strays(staging: Path) -> list[Path]:
    """The temporary files a killed run's writes can leave in a build whose pieces are all
    sealed: an atomic write's (`.NAME.*.tmp`, in the build or a split's folder), a piece's file
    being written or sealed (`shard_*.tmp`, a key file's `*_NNNNNN.*.tmp` in dedup/). Only
    names lmshard writes: the files of an appended-to dataset linked in are never among them."""
    found = [*staging.glob(".*.tmp"), *staging.glob("*/.*.tmp"), *staging.glob("*/shard_*.tmp")]
    found += [p for kind in ("doc_keys", "near_sigs", "line_keys") for p in staging.glob(f"dedup/{kind}_*.tmp")]
    return sorted(set(found))


__all__ = ["finish", "strays"]
