"""`lmshard prepare`: sources → clean → dedup → tokenize → shards + metadata.

One process plans work items and writes; N worker processes parse, clean, hash and tokenize
items; results come back in item order (`Pool.imap`), so dedup survivors, the train/val split
and every output byte are the same for any number of workers.

The output directory is claimed, built beside and swapped in by staging.py; the build's state
and checkpoints (for --resume) live in build.py.

Memory model: at most `2 × workers + 2` items in flight (each ≈1 MiB of text and its tokens),
the dedup set (≈16 bytes per unique document) and per-source counters (one small dict per input
file). Nothing grows with the number of tokens.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import platform
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np

from .. import __version__
from ..errors import LmshardError
from ..format import (
    METADATA_FILE,
    SPLITS,
    TOKENIZER_FILE,
    DatasetMeta,
    DedupInfo,
    KeyFile,
    RunInfo,
    ShardInfo,
    SourceInfo,
    SplitInfo,
    TokenizerInfo,
    atomic_write_json,
    load_metadata,
)
from ..tokenizers import Tokenizer, load_tokenizer
from .build import CHECKPOINT_SECONDS, Build, StopOnCtrlC, Totals, check_not_empty
from .claim import Claim, claim_output
from .config import PrepareConfig
from .dedup import KeySet, uniform_from_keys
from .pool import OrderedPool, WorkerDied
from .sources import SPLIT_INTO_PARAGRAPHS, Source, WorkItem, discover, plan
from .staging import (
    RUN_FILE,
    RUN_VERSION,
    Interrupted,
    OutputPaths,
    WriterLock,
    commit,
    link_or_copy,
    os_error,
    recover,
)
from .worker import ItemResult, WorkerConfig, hash_lines, init_worker, process_item, process_lines, run_item
from .writer import with_separators

T = TypeVar("T")
NOT_DROPS = ("records", "lines_removed", SPLIT_INTO_PARAGRAPHS)  # per-source counts that are not drops


@dataclass
class Progress:
    """Running totals passed to the progress callback after each work item."""

    bytes_done: int = 0
    bytes_total: int = 0
    docs: int = 0
    tokens: int = 0
    chars: int = 0


def prepare(config: PrepareConfig, on_progress: Callable[[Progress], None] | None = None) -> DatasetMeta:
    """Run a prepare job and return the metadata it wrote (see staging.py for how `--out` is
    claimed, built beside, resumed and swapped)."""
    started = time.time()
    paths = OutputPaths.of(config.out)
    sources = discover(config.inputs, config.format, config.exclude) if config.inputs else []
    if config.hf:
        sources.append(Source(f"hf:{config.hf}", "hf", None, 0))
    tokenizer = load_tokenizer(config.tokenizer)  # fail fast on a missing vocabulary
    try:
        with WriterLock(paths):
            recover(paths)
            claim = claim_output(config, paths, sources, tokenizer)
            if claim.complete is not None:
                return claim.complete
            if claim.commit_pending:  # killed after the build was complete: only the swap is left
                commit(paths)
                return load_metadata(paths.out)
            return _build(config, paths, sources, tokenizer, claim, on_progress, started)
    except OSError as e:
        raise os_error(e, paths.out) from None


def _build(config: PrepareConfig, paths: OutputPaths, sources: list[Source], tokenizer: Tokenizer, claim: Claim,
           on_progress: Callable[[Progress], None] | None, started: float) -> DatasetMeta:  # fmt: skip
    """Build (or go on building) the dataset in the staging directory, then swap it in."""
    staging, previous = paths.staging, claim.previous
    if claim.resumed:  # temporary files of atomic writes a kill cut short
        for stray in staging.glob(".*.tmp"):
            stray.unlink()
    else:
        staging.mkdir()
        if previous is not None:
            _link_previous(previous, paths.out, staging)
        _write_run(staging, claim, None)
    build = Build.start(config, staging, previous, claim.checkpoint)
    interrupt = StopOnCtrlC()
    kept = f"the work done so far is kept in {staging}"
    try:
        with interrupt:
            totals = _run(config, sources, tokenizer, build, on_progress, interrupt, lambda: _save(build, claim))
        shards = [info for w in build.writers.values() for info in w.close()]
        check_not_empty(config, totals, build.base, shards)
        keys = build.close_keys()
        meta = _metadata(config, sources, tokenizer, shards, totals, claim, keys, started)
        atomic_write_json(staging / TOKENIZER_FILE, tokenizer.identity())
        atomic_write_json(staging / METADATA_FILE, meta.to_json())
        commit(paths)
        return meta
    except Interrupted:
        build.abort()
        raise
    except KeyboardInterrupt:
        build.abort()
        raise Interrupted(f"{kept} (up to its last checkpoint)") from None
    except (WorkerDied, OSError, MemoryError) as e:  # the machine failed, not the input: keep the work
        build.abort()
        what = os_error(e, paths.out) if isinstance(e, OSError) else e
        if "-" in config.inputs:  # stdin cannot be read again: nothing to resume
            shutil.rmtree(staging, ignore_errors=True)
            raise LmshardError(f"{what}; nothing was kept (a run reading stdin cannot be resumed)") from None
        raise LmshardError(f"{what}; {kept}: run the same command with --resume to continue") from None
    except BaseException:
        build.abort()
        shutil.rmtree(staging, ignore_errors=True)  # an input or option error: nothing worth resuming
        raise


def _link_previous(previous: DatasetMeta, out: Path, staging: Path) -> None:
    """The appended-to dataset's shards and dedup keys, hard-linked into the build: the same
    files, never written again (copied where the filesystem has no hard links)."""
    names = [p for s in previous.shards for p in (s.path, s.index_path)]
    names += [f.path for f in previous.dedup.files] if previous.dedup else []
    for name in names:
        link_or_copy(out / name, staging / name)


def _write_run(staging: Path, claim: Claim, checkpoint: dict[str, Any] | None) -> None:
    record = {"version": RUN_VERSION, "fingerprint": claim.fingerprint, "started": claim.started_at,
              "pid": os.getpid(), "host": platform.node(), "checkpoint": checkpoint}  # fmt: skip
    atomic_write_json(staging / RUN_FILE, record)


def _save(build: Build, claim: Claim) -> None:
    """Checkpoint: make the shards and keys written so far durable, then record how far we got."""
    _write_run(build.root, claim, build.checkpoint())


def _results(config: PrepareConfig, sources: list[Source], tokenizer: Tokenizer, build: Build) -> Iterator[ItemResult]:
    """Item results in plan order from the first item the build has not done, from worker
    processes (or inline for --workers 1). With --dedup-lines, a first pass over all items finds
    repeated lines (see `_line_masks`); a resumed run repeats it (it writes nothing but masks)."""
    wcfg = WorkerConfig(
        sources=tuple(sources),
        clean=config.clean_config(),
        tokenizer=config.tokenizer,
        text_field=config.text_field,
        text_mode=config.text_mode,
        on_error=config.on_error,
    )

    def items(skip: int = 0) -> Iterator[WorkItem]:
        every = plan(sources, config.text_mode, config.text_field, config.on_error, config.hf_spec(),
                     max_chars=config.max_chars)  # fmt: skip
        return itertools.islice(every, skip, None)

    n = config.n_workers()
    with contextlib.ExitStack() as stack:
        # OrderedPool, not multiprocessing's pools: a worker killed at any moment (OOM killer,
        # segfault) is a one-line error within seconds instead of a hang; see pool.py.
        pool: OrderedPool[WorkItem, Any] | None = None
        if n > 1:
            pool = stack.enter_context(OrderedPool(n, init_worker, wcfg))
        stream = items(build.items_done)
        if config.dedup_lines:
            masks = stack.enter_context(tempfile.TemporaryFile())
            keys = stack.enter_context(open(build.root / build.key_path("line"), "wb"))
            hashes = _ordered(pool, process_lines, lambda it: hash_lines(it, wcfg), items(), n)
            index, build.line_keys = _line_masks(hashes, masks, build.line_set(), keys)
            stream = _with_masks(stream, masks, index[build.items_done :])
        yield from _ordered(pool, process_item, lambda it: run_item(it, wcfg, tokenizer), stream, n)
        if pool is not None:
            pool.close()


def _ordered(pool: OrderedPool[WorkItem, T] | None, remote: Callable[[WorkItem], T], local: Callable[[WorkItem], T],
             items: Iterator[WorkItem], n: int) -> Iterator[T]:  # fmt: skip
    """fn(item) for every item, in order; at most 2n + 2 items (and their text) in flight."""
    if pool is None:
        return map(local, items)
    return pool.imap(remote, items, window=2 * n + 2)


def _line_masks(hashes: Iterator[np.ndarray], out: IO[bytes], seen: KeySet,
                keys: IO[bytes]) -> tuple[list[tuple[int, int]], int]:  # fmt: skip
    """Pass 1 of line dedup: in input order, mark each non-blank line kept if its text was not
    seen before (in this run or the dataset appended to); store the marks as packed bits in
    `out` and the new lines' keys in `keys`. Returns (byte offset, lines) per item and the
    number of new keys. Memory: the set of unique lines (≈16 bytes each), 16 bytes per item."""
    index, new = [], 0
    for h in hashes:
        fresh = seen.add_new(h)
        bits = np.packbits(fresh).tobytes()
        index.append((out.tell(), len(h)))
        out.write(bits)
        keys.write(h[fresh].astype("<u8").tobytes())
        new += int(fresh.sum())
    keys.flush()
    os.fsync(keys.fileno())
    return index, new


def _with_masks(items: Iterator[WorkItem], masks: IO[bytes], index: list[tuple[int, int]]) -> Iterator[WorkItem]:
    """Pass 2: the same items again (the plan is deterministic), each with its keep-bits."""
    for item, (offset, count) in zip(items, index, strict=True):
        masks.seek(offset)
        yield replace(item, line_keep=(masks.read((count + 7) // 8), count))


def _run(
    config: PrepareConfig,
    sources: list[Source],
    tokenizer: Tokenizer,
    build: Build,
    on_progress: Callable[[Progress], None] | None,
    interrupt: StopOnCtrlC,
    save: Callable[[], None],
) -> Totals:
    """Stream the work items' results into the build: dedup, split, write; checkpoint every
    CHECKPOINT_SECONDS and when Ctrl-C asks to stop."""
    totals, seen, writers = build.totals, build.seen, build.writers
    progress = Progress(bytes_done=build.bytes_done, bytes_total=sum(s.size for s in sources))
    last_save = time.monotonic()
    for result in _results(config, sources, tokenizer, build):
        keep = seen.add_new(result.keys) if config.dedup == "document" else np.ones(len(result.keys), bool)
        dupes = ~keep
        keep = _limit(keep, config.max_docs, totals.docs_kept)
        _account(totals, result, keep, dupes)
        build.add_keys(result.keys[keep])
        is_val = uniform_from_keys(result.keys, config.seed) < config.val_fraction
        for split, mask in (("train", keep & ~is_val), ("val", keep & is_val)):
            if mask.any():
                tokens, lengths = with_separators(
                    result.tokens, result.lengths, mask, tokenizer.eot_id, config.eot_position
                )
                writers[split].add(tokens, lengths)
        progress.bytes_done += result.nbytes
        build.items_done += 1
        build.bytes_done = progress.bytes_done
        progress.docs, progress.tokens, progress.chars = totals.docs_kept, totals.tokens, totals.chars
        if on_progress:
            on_progress(progress)
        if config.max_docs is not None and totals.docs_kept >= config.max_docs:
            break
        if interrupt.asked:
            save()
            raise Interrupted(f"stopped after {build.items_done:,} work items; the work done is saved in {build.root}")
        if time.monotonic() - last_save >= CHECKPOINT_SECONDS:
            save()
            last_save = time.monotonic()
    totals.examples = dict(sorted(totals.examples.items()))
    totals.dedup_bytes = seen.nbytes
    return totals


def _limit(keep: np.ndarray, max_docs: int | None, kept_so_far: int) -> np.ndarray:
    """Keep only as many documents as --max-docs still allows (the first ones in order)."""
    if max_docs is None:
        return keep
    room = max(0, max_docs - kept_so_far)
    positions = np.flatnonzero(keep)
    if len(positions) <= room:
        return keep
    limited = np.zeros_like(keep)
    limited[positions[:room]] = True
    return limited


def _account(totals: Totals, result: ItemResult, keep: np.ndarray, dupes: np.ndarray) -> None:
    kept_lengths = result.lengths[keep]
    totals.docs_kept += int(keep.sum())
    totals.tokens += int(kept_lengths.sum()) + len(kept_lengths)  # + one EOT per document
    totals.chars += result.chars
    totals.duplicates += int(dupes.sum())
    for src, counts in result.counts.items():
        totals.per_source.setdefault(src, Counter()).update(counts)
        totals.records += counts.get("records", 0)
        totals.drops.update({k: v for k, v in counts.items() if k not in NOT_DROPS})
        totals.lines_removed += counts.get("lines_removed", 0)
    for name, mask in (("kept", keep), ("duplicate", dupes)):
        ids, n = np.unique(result.doc_sources[mask], return_counts=True)
        for src, count in zip(ids.tolist(), n.tolist(), strict=True):
            totals.per_source.setdefault(src, Counter())[name] += count
    for reason, example in result.examples.items():
        totals.examples.setdefault(reason, example)


def _metadata(config: PrepareConfig, sources: list[Source], tokenizer: Tokenizer, shards: list[ShardInfo],
              totals: Totals, claim: Claim, keys: tuple[KeyFile, ...], started: float) -> DatasetMeta:  # fmt: skip
    """The dataset's metadata. After --append it describes the whole dataset: the recorded
    inputs and sources are the old ones followed by this run's, so the recorded configuration
    reproduces the same token stream in one run."""
    elapsed = time.time() - started
    n_tokens = sum(s.n_tokens for s in shards)
    drops = dict(sorted(totals.drops.items()))
    drops["duplicate"] = totals.duplicates
    hf = config.hf_spec()
    recorded = config.recorded()
    previous = claim.previous
    if previous is not None:
        recorded["inputs"] = [*previous.config.get("inputs", []), *recorded["inputs"]]
    new_sources = tuple(_source_info(s, totals.per_source.get(i, Counter()), hf) for i, s in enumerate(sources))
    return DatasetMeta(
        root=Path(config.out),
        lmshard_version=__version__,
        eot_position=config.eot_position,
        tokenizer=TokenizerInfo(
            name=tokenizer.name,
            backend=tokenizer.backend,
            n_vocab=tokenizer.n_vocab,
            eot_id=tokenizer.eot_id,
            ranks_sha256=tokenizer.vocab_sha256,
        ),  # fmt: skip
        total_tokens=n_tokens,
        total_docs=sum(s.n_docs for s in shards),
        splits={split: SplitInfo.of(tuple(s for s in shards if s.split == split)) for split in SPLITS},
        records_read=totals.records,
        drops=drops,
        drop_examples=totals.examples,
        dedup=DedupInfo(
            mode=config.dedup,
            key="xxh3_64 of the cleaned UTF-8 text",
            duplicates_removed=totals.duplicates,
            lines=config.dedup_lines,
            lines_removed=totals.lines_removed,
            files=keys,
        ),  # fmt: skip
        sources=(*(previous.sources if previous else ()), *new_sources),
        config=recorded,
        run=RunInfo(
            workers=config.n_workers(),
            out=config.out,
            started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(claim.started_at)),
            elapsed_s=round(elapsed, 3),
            tokens_per_s=round(n_tokens / elapsed, 1) if elapsed > 0 else None,
            input_chars=totals.chars,
            dedup_table_bytes=totals.dedup_bytes,
            python=platform.python_version(),
            host=platform.node(),
        ),
    )


def _source_info(src: Source, counts: Counter[str], hf: Any = None) -> SourceInfo:

    return SourceInfo(
        path=src.path,
        format=src.fmt,
        bytes=src.size,
        hf=hf.describe() if src.fmt == "hf" else None,  # how the stream was split: resume and scale-out reuse it
        records=counts.get("records", 0),
        kept=counts.get("kept", 0),
        lines_removed=counts.get("lines_removed", 0),
        split_into_paragraphs=counts.get(SPLIT_INTO_PARAGRAPHS, 0),
        dropped={k: v for k, v in sorted(counts.items()) if k not in (*NOT_DROPS, "kept") and v},
    )
