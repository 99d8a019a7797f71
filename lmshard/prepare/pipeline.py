"""`lmshard prepare`: sources → clean → dedup → tokenize → shards + metadata.

Two ways to the same bytes. A large input (execution/plainplan.use_stages: 16 MiB of files or
more, a Hugging Face dataset) runs as the staged tasks of a planned run (local_exec.py,
stages.py), in the worker pool or, with one worker, in this process. Everything else (small
inputs, which start fastest this way; stdin and pipes, read once) runs here: one process
plans work items and writes; N worker processes parse, clean, hash and tokenize items; results
come back in item order (`Pool.imap`), so dedup survivors, the train/val split and every output
byte are the same for any number of workers.

The output directory is claimed, built beside and swapped in by staging.py; the build's state
and checkpoints (for --resume) live in build.py.

Memory model: at most `2 × workers + 2` items in flight (each ≈1 MiB of text and its tokens),
the dedup set (≈16 bytes per unique document) and per-source counters (one small dict per input
file). Nothing grows with the number of tokens.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..format import (
    METADATA_FILE,
    TOKENIZER_FILE,
    DatasetMeta,
    atomic_write_json,
    load_metadata,
    write_vocab_copy,
)
from ..format.provenance import records
from ..remote.urls import output_url
from ..tokenizers import Tokenizer
from .config import PrepareConfig
from .documents.dedup import uniform_from_keys
from .documents.reading import InputGone, InputReadError, nothing_kept, work_kept
from .documents.sources import Source, Sources, WorkItem, note_growth
from .documents.worker import ItemResult
from .execution.feed import Recount, early_pool, item_results
from .execution.nearpass import add_examples, remove_spool
from .execution.pool import OrderedPool, WorkerDied
from .execution.runplan import load_run, worker_config
from .execution.taskplan import PLAN_FILE, remove_work, work_dir
from .output.build import (
    CHECKPOINT_SECONDS,
    Build,
    Progress,
    StopOnSignal,
    Totals,
    account,
    check_not_empty,
    sigterm_stops,
)
from .output.claim import Claim, bos_written, claim_output, refuse_for_streams, write_run
from .output.dictfile import keep, trained
from .output.metadata import dataset_metadata, warn_empty_val
from .output.staging import (
    Interrupted,
    OutputPaths,
    WriterLock,
    commit,
    link_previous,
    os_error,
    read_run,
    recover,
)
from .output.writer import with_separators
from .stops import stop_point


def prepare(config: PrepareConfig, on_progress: Callable[[Progress], None] | None = None) -> DatasetMeta:
    """Run a prepare job and return the metadata it wrote (see staging.py for how `--out` is
    claimed, built beside, resumed and swapped). A large input read from files runs as staged
    tasks in the worker pool instead (local_exec.py), with the same bytes; so does a config with
    `num_tasks` (a plan of that many tasks, every stage run here: the command line's
    `--num-tasks N`; other executors are the command line's).
    SIGTERM ends it as Ctrl-C does (in the main thread, where SIGTERM has its default action)."""
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
    paths = OutputPaths.of(config.out)
    with contextlib.ExitStack() as stack:
        sources, tokenizer = load_run(config)  # (fails fast on a missing vocabulary)
        if not config.append:
            config.encoding(tokenizer.n_vocab)  # fail fast on uint16 for a larger vocabulary
        from .execution import plainplan

        # --num-tasks: a plan of that many tasks, every stage run here (--executor local). Else every stage in the
        # worker pool; and a --resume of a run the stages left (its plan is there), whatever --workers and the
        # input's size would choose now: their work is theirs to go on with. So is a build one process left with a
        # checkpoint (read in one process when it started: another LMSHARD_STAGED_BYTES, or version, may not).
        planned = config.num_tasks is not None or (config.resume and (work_dir(config.out) / PLAN_FILE).exists())
        if planned or (plainplan.use_stages(config, sources) and not (config.resume and _checkpointed(paths))):
            from .execution import local_exec  # (here: a small run imports none of the stages' modules)

            if config.num_tasks is not None:
                return local_exec.run(config, config.num_tasks, None, on_progress, (sources, tokenizer),
                                      started=started)  # fmt: skip
            tasks, unit_bytes = plainplan.plain_plan(config, sources)  # (tasks here only size the units)
            return local_exec.run(config, tasks, unit_bytes, on_progress, (sources, tokenizer), adopt=True,
                                  started=started)  # fmt: skip
        refuse_for_streams(config, sources)  # (what one pass over stdin or a pipe cannot do)
        # Workers forked now, while this process runs one thread, inherit the tokenizer (feed.early_pool).
        early = early_pool(config.n_workers(), sources, tokenizer)
        if early is not None:
            stack.enter_context(early)
        try:
            with WriterLock(paths):
                recover(paths)
                claim = claim_output(config, paths, sources, tokenizer)
                if claim.complete is not None:  # --resume of a run that finished: nothing to do
                    if on_progress:
                        on_progress(Progress(note=f"resuming: {paths.out} is already complete; nothing to do",
                                             complete=True))  # fmt: skip
                    return claim.complete
                if claim.commit_pending:  # killed after the build was complete: only the swap is left
                    commit(paths)
                    return load_metadata(paths.out)
                if not claim.resumed:  # (--overwrite discarded a build the stages left: their work folder goes too)
                    remove_work(work_dir(config.out))
                return _build(config, paths, sources, tokenizer, claim, on_progress, started, early)
        except OSError as e:
            raise os_error(e, paths.out) from None


def _checkpointed(paths: OutputPaths) -> bool:
    """Whether --out has a build one reading process left with a checkpoint, which --resume goes on with."""
    run = read_run(paths.staging)
    return run is not None and run.get("checkpoint") is not None


def _build(config: PrepareConfig, paths: OutputPaths, sources: Sources, tokenizer: Tokenizer, claim: Claim,
           on_progress: Callable[[Progress], None] | None, started: float,
           early: OrderedPool[WorkItem, Any] | None = None) -> DatasetMeta:  # fmt: skip
    """Build (or go on building) the dataset in the staging directory, then swap it in."""
    staging, previous = paths.staging, claim.previous
    if claim.resumed:  # temporary files of atomic writes a kill cut short, and its shards' encodings in progress
        for stray in [*staging.glob(".*.tmp"), *staging.glob("*/shard_*.bin.*.tmp")]:
            stray.unlink()
    else:
        wcfg = worker_config(config, sources, tokenizer)
        dictionary = None if previous else trained(config, sources, tokenizer, wcfg)  # (a stop here leaves nothing)
        staging.mkdir()
        if previous is not None:
            link_previous(previous, paths.out, staging)
        keep(staging, dictionary)
        write_run(staging, claim, None)
    build = Build.start(config, staging, previous, claim.checkpoint, tokenizer.n_vocab)
    tokens_before = build.totals.tokens  # the appended-to dataset's and a resumed checkpoint's
    if claim.resumed:
        build.note = build.resume_note(claim.checkpoint)
    write_vocab_copy(staging, tokenizer.vocab_format, tokenizer.vocab_bytes)
    interrupt = StopOnSignal()
    kept = f"the work done so far is kept in {staging}"
    try:
        with interrupt:
            save = lambda: _save(build, claim)  # noqa: E731
            totals = _run(config, sources, tokenizer, build, on_progress, interrupt, save, early)
        note_growth(sources, totals.per_source)
        shards = [info for w in build.writers.values() for info in w.close()]
        check_not_empty(config, totals, build.base, shards)
        keys = build.close_keys()
        remove_spool(staging)
        meta = dataset_metadata(config, sources, tokenizer, shards, totals, claim, keys, started, tokens_before)
        atomic_write_json(staging / TOKENIZER_FILE, tokenizer.identity())
        atomic_write_json(staging / METADATA_FILE, meta.to_json())
        commit(paths)
        warn_empty_val(meta)
        return meta
    except Interrupted as e:
        build.abort()
        _unresumable(sources, staging, e)
        raise
    except KeyboardInterrupt as e:  # a second Ctrl-C or SIGTERM, or one outside the build loop
        build.abort()
        _unresumable(sources, staging, e)
        raise Interrupted(f"{kept} (up to its last checkpoint)", getattr(e, "signum", 2)) from None
    except (WorkerDied, OSError, MemoryError, InputReadError) as e:  # the machine failed, not the input: keep the work
        build.abort()
        if stream := next((s for s in sources if s.stream), None):  # read once: nothing to resume
            shutil.rmtree(staging, ignore_errors=True)
            raise nothing_kept(os_error(e, paths.out) if isinstance(e, OSError) else e, stream.path) from None
        what = os_error(e, paths.out, resumable=True) if isinstance(e, OSError) else e
        raise work_kept(what, kept, isinstance(e, InputGone)) from None
    except BaseException:
        build.abort()
        shutil.rmtree(staging, ignore_errors=True)  # an input or option error: nothing worth resuming
        raise


def _unresumable(sources: list[Source], staging: Path, e: KeyboardInterrupt) -> None:
    """A run reading stdin or a pipe cannot be resumed (the data is gone): when one is
    interrupted, its work is deleted, and the CLI offers no --resume."""
    if any(s.stream for s in sources):
        shutil.rmtree(staging, ignore_errors=True)
        raise Interrupted("", getattr(e, "signum", 2)) from None


def _save(build: Build, claim: Claim) -> None:
    """Checkpoint: make the shards and keys written so far durable, then record how far we got."""
    write_run(build.root, claim, build.checkpoint())


def _run(
    config: PrepareConfig,
    sources: list[Source],
    tokenizer: Tokenizer,
    build: Build,
    on_progress: Callable[[Progress], None] | None,
    interrupt: StopOnSignal,
    save: Callable[[], None],
    early: OrderedPool[WorkItem, Any] | None = None,
) -> Totals:
    """Stream the work items' results into the build: dedup, split, write; checkpoint every
    CHECKPOINT_SECONDS and when Ctrl-C or SIGTERM asks to stop."""
    totals, seen, writers, source_base = build.totals, build.seen, build.writers, build.source_base
    bos = bos_written(config, tokenizer)
    progress = Progress(bytes_done=build.bytes_done, bytes_total=sum(s.size for s in sources), docs=totals.docs_kept,
                        tokens=totals.tokens, bytes_at_start=build.bytes_done, tokens_at_start=totals.tokens,
                        note=build.note)  # fmt: skip
    if on_progress and build.note:
        on_progress(progress)
        progress.note = None
    last_save = time.monotonic()
    recount = Recount() if config.max_docs is not None else None
    for result in item_results(config, sources, tokenizer, build, early, recount):
        keep = seen.add_new(result.keys) if config.dedup == "document" else np.ones(len(result.keys), bool)
        dupes = ~keep
        near = None
        if result.near_of is not None:  # --near-dedup: a near-copy of an earlier document (not an exact one)
            near = keep & (result.near_of >= 0)
            keep = keep & ~near
        if recount is not None:
            cut = _cut(keep, config.max_docs, totals.docs_kept)
            if cut is not None:  # the N-th kept document is here: the item counts up to it, no further
                result, keep, dupes = _prefix(result, recount.prefix(cut), cut), keep[:cut], dupes[:cut]
                near = near[:cut] if near is not None else None
            recount.items.popleft()
        account(totals, result, keep, dupes, 1 if bos is None else 2, near)
        if near is not None and near.any():
            add_examples(build, result, near)
        if build.keys is not None:
            build.keys.add(result.keys[keep])
        if build.near is not None and result.signatures is not None:
            build.near.add(result.signatures[keep])
        is_val = uniform_from_keys(result.keys, config.seed) < config.val_fraction
        assert result.numbers is not None  # (every document's record: its provenance)
        for split, mask in (("train", keep & ~is_val), ("val", keep & is_val)):
            if mask.any():
                tokens, lengths = with_separators(
                    result.tokens, result.lengths, mask, tokenizer.eot_id, config.eot_position, bos
                )
                src = records(result.doc_sources[mask] + source_base, result.numbers[mask])
                writers[split].add(tokens, lengths, src, None if result.attrs is None else result.attrs[mask])
        progress.bytes_done += result.nbytes
        build.items_done += 1
        build.bytes_done = progress.bytes_done
        progress.docs, progress.tokens, progress.chars = totals.docs_kept, totals.tokens, totals.chars
        if on_progress:
            on_progress(progress)
        if config.max_docs is not None and totals.docs_kept >= config.max_docs:
            break
        if time.monotonic() - last_save >= CHECKPOINT_SECONDS:
            save()
            last_save = time.monotonic()
        stop_point("item")  # (before the signal check: a test's signal to a held run is acted on at this item)
        if interrupt.asked:
            save()
            items = f"{build.items_done:,} work item{'' if build.items_done == 1 else 's'}"
            raise Interrupted(f"stopped after {items}; the work done is saved in {build.root}", interrupt.signum)
    totals.examples = dict(sorted(totals.examples.items()))
    totals.dedup_bytes = seen.nbytes
    return totals


def _cut(keep: np.ndarray, max_docs: int | None, kept_so_far: int) -> int | None:
    """--max-docs: the number of the item's documents up to and including the N-th kept one,
    when it is in this item; else None. A run so limited counts what it read up to that
    document's record, whatever the work items (a planned run cuts the same: layout.py)."""
    if max_docs is None:
        return None
    room = max_docs - kept_so_far
    positions = np.flatnonzero(keep)
    return int(positions[room - 1]) + 1 if 0 < room <= len(positions) else None


def _prefix(result: ItemResult, read: ItemResult, docs: int) -> ItemResult:
    """`result` cut after its first `docs` documents, with the counts of `read` (the item read
    that far)."""
    n_tokens = int(result.lengths[:docs].sum())
    return replace(result, tokens=result.tokens[:n_tokens], lengths=result.lengths[:docs], keys=result.keys[:docs],
                   doc_sources=result.doc_sources[:docs], counts=read.counts, examples=read.examples,
                   chars=read.chars, signatures=None if result.signatures is None else result.signatures[:docs],
                   near_of=None if result.near_of is None else result.near_of[:docs],
                   numbers=None if result.numbers is None else result.numbers[:docs],
                   attrs=None if result.attrs is None else result.attrs[:docs])  # fmt: skip
