"""`lmshard prepare`: sources → clean → dedup → tokenize → shards + metadata.

One process plans work items and writes; N worker processes parse, clean, hash and tokenize
items; results come back in item order (`Pool.imap`), so dedup survivors, the train/val split
and every output byte are the same for any number of workers.

Memory model: at most `2 × workers + 2` items in flight (each ≈1 MiB of text and its tokens),
the dedup set (≈16 bytes per unique document), the current shards' offsets, and per-source
counters (one small dict per input file). Nothing grows with the number of tokens.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, TypeVar

import numpy as np

from .. import __version__
from ..errors import ConfigError, LmshardError
from ..format import (
    IN_PROGRESS_FILE,
    METADATA_FILE,
    SPLITS,
    TOKENIZER_FILE,
    DatasetMeta,
    DedupInfo,
    RunInfo,
    ShardInfo,
    SourceInfo,
    SplitInfo,
    TokenizerInfo,
    atomic_write_json,
)
from ..tokenizers import Tokenizer, load_tokenizer
from .config import PrepareConfig
from .dedup import KeySet, uniform_from_keys
from .pool import OrderedPool
from .sources import Source, WorkItem, discover, plan
from .worker import ItemResult, WorkerConfig, hash_lines, init_worker, process_item, process_lines, run_item
from .writer import ShardWriter, with_separators

T = TypeVar("T")


@dataclass
class Progress:
    """Running totals passed to the progress callback after each work item."""

    bytes_done: int = 0
    bytes_total: int = 0
    docs: int = 0
    tokens: int = 0
    chars: int = 0


@dataclass
class Totals:
    """Counts that end up in the metadata."""

    records: int = 0
    docs_kept: int = 0
    tokens: int = 0
    chars: int = 0
    duplicates: int = 0
    drops: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    per_source: dict[int, Counter[str]] = field(default_factory=dict)
    dedup_bytes: int = 0
    lines_removed: int = 0


def prepare(config: PrepareConfig, on_progress: Callable[[Progress], None] | None = None) -> DatasetMeta:
    """Run a prepare job and return the metadata it wrote."""
    started = time.time()
    out = Path(config.out)
    sources = discover(config.inputs, config.format, config.exclude) if config.inputs else []
    if config.hf:
        sources.append(Source(f"hf:{config.hf}", "hf", None, 0))
    tokenizer = load_tokenizer(config.tokenizer)  # fail fast on a missing vocabulary
    _claim_output(out, config)
    writers = {s: ShardWriter(out, s, config.tokens_per_shard) for s in SPLITS}
    try:
        totals = _run(config, sources, tokenizer, writers, on_progress)
        shards = [info for w in writers.values() for info in w.close()]
        meta = _metadata(config, sources, tokenizer, shards, totals, started)
        atomic_write_json(out / TOKENIZER_FILE, tokenizer.identity())
        atomic_write_json(out / METADATA_FILE, meta.to_json())
        (out / IN_PROGRESS_FILE).unlink(missing_ok=True)
        return meta
    except BaseException as e:
        for w in writers.values():
            w.abort()
        _remove_outputs(out)
        if isinstance(e, OSError) and not isinstance(e, LmshardError):
            raise _os_error(e, out) from None
        raise


def _os_error(e: OSError, out: Path) -> LmshardError:
    """An operating-system failure as a one-line message naming the file and the fix."""
    where = e.filename or out
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return LmshardError(f"{where}: no space left on the device; free space (or choose another --out) and re-run")
    return LmshardError(f"{where}: {e.strerror or e}; nothing partial was kept")


def _claim_output(out: Path, config: PrepareConfig) -> None:
    """Refuse to clobber a dataset or a foreign directory; mark the run as in progress."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out}: exists and is not a directory; choose another --out")
    entries = set(os.listdir(out)) if out.is_dir() else set()
    ours = entries & {METADATA_FILE, IN_PROGRESS_FILE}
    if ours and not config.overwrite:
        what = "holds a dataset" if METADATA_FILE in ours else "holds an unfinished prepare run"
        raise ConfigError(f"{out}: {what}; pass --overwrite to replace it, or choose another --out")
    if entries - {METADATA_FILE, IN_PROGRESS_FILE, TOKENIZER_FILE, *SPLITS} and not config.overwrite:
        raise ConfigError(f"{out}: not empty and not an lmshard dataset; choose an empty or new --out")
    if config.overwrite:
        _remove_outputs(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / IN_PROGRESS_FILE, {"config": config.recorded(), "pid": os.getpid()})


def _remove_outputs(out: Path) -> None:
    """Remove only what prepare writes, never other files the user keeps in the directory."""
    for name in (METADATA_FILE, TOKENIZER_FILE):
        (out / name).unlink(missing_ok=True)
    for split in SPLITS:
        shutil.rmtree(out / split, ignore_errors=True)
    (out / IN_PROGRESS_FILE).unlink(missing_ok=True)


def _results(config: PrepareConfig, sources: list[Source], tokenizer: Tokenizer) -> Iterator[ItemResult]:
    """Item results in plan order, from worker processes (or inline for --workers 1). With
    --dedup-lines, a first pass over the same items finds repeated lines (see `_line_masks`)."""
    wcfg = WorkerConfig(
        sources=tuple(sources),
        clean=config.clean_config(),
        tokenizer=config.tokenizer,
        text_field=config.text_field,
        text_mode=config.text_mode,
        on_error=config.on_error,
    )

    def items() -> Iterator[WorkItem]:
        return plan(sources, config.text_mode, config.text_field, config.on_error, config.hf_spec())

    n = config.n_workers()
    with contextlib.ExitStack() as stack:
        # OrderedPool, not multiprocessing's pools: a worker killed at any moment (OOM killer,
        # segfault) is a one-line error within seconds instead of a hang; see pool.py.
        pool: OrderedPool[WorkItem, Any] | None = None
        if n > 1:
            pool = stack.enter_context(OrderedPool(n, init_worker, wcfg))
        stream = items()
        if config.dedup_lines:
            masks = stack.enter_context(tempfile.TemporaryFile())
            index = _line_masks(_ordered(pool, process_lines, lambda it: hash_lines(it, wcfg), items(), n), masks)
            stream = _with_masks(stream, masks, index)
        yield from _ordered(pool, process_item, lambda it: run_item(it, wcfg, tokenizer), stream, n)
        if pool is not None:
            pool.close()


def _ordered(pool: OrderedPool[WorkItem, T] | None, remote: Callable[[WorkItem], T], local: Callable[[WorkItem], T],
             items: Iterator[WorkItem], n: int) -> Iterator[T]:  # fmt: skip
    """fn(item) for every item, in order; at most 2n + 2 items (and their text) in flight."""
    if pool is None:
        return map(local, items)
    return pool.imap(remote, items, window=2 * n + 2)


def _line_masks(hashes: Iterator[np.ndarray], out: IO[bytes]) -> list[tuple[int, int]]:
    """Pass 1 of line dedup: in input order, mark each non-blank line kept if its text was not
    seen before; store the marks as packed bits in `out`. Returns (byte offset, lines) per item.
    Memory: the set of unique lines (≈16 bytes each) and 16 bytes per work item."""
    seen, index = KeySet(), []
    for h in hashes:
        bits = np.packbits(seen.add_new(h)).tobytes()
        index.append((out.tell(), len(h)))
        out.write(bits)
    return index


def _with_masks(items: Iterator[WorkItem], masks: IO[bytes], index: list[tuple[int, int]]) -> Iterator[WorkItem]:
    """Pass 2: the same items again (the plan is deterministic), each with its keep-bits."""
    for item, (offset, count) in zip(items, index, strict=True):
        masks.seek(offset)
        yield replace(item, line_keep=(masks.read((count + 7) // 8), count))


def _run(
    config: PrepareConfig,
    sources: list[Source],
    tokenizer: Tokenizer,
    writers: dict[str, ShardWriter],
    on_progress: Callable[[Progress], None] | None,
) -> Totals:
    totals = Totals()
    progress = Progress(bytes_total=sum(s.size for s in sources))
    seen = KeySet()
    for result in _results(config, sources, tokenizer):
        keep = seen.add_new(result.keys) if config.dedup == "document" else np.ones(len(result.keys), bool)
        dupes = ~keep
        keep = _limit(keep, config.max_docs, totals.docs_kept)
        _account(totals, result, keep, dupes)
        is_val = uniform_from_keys(result.keys, config.seed) < config.val_fraction
        for split, mask in (("train", keep & ~is_val), ("val", keep & is_val)):
            if mask.any():
                tokens, lengths = with_separators(
                    result.tokens, result.lengths, mask, tokenizer.eot_id, config.eot_position
                )
                writers[split].add(tokens, lengths)
        progress.bytes_done += result.nbytes
        progress.docs, progress.tokens, progress.chars = totals.docs_kept, totals.tokens, totals.chars
        if on_progress:
            on_progress(progress)
        if config.max_docs is not None and totals.docs_kept >= config.max_docs:
            break
    totals.examples = dict(sorted(totals.examples.items()))
    totals.dedup_bytes = seen.nbytes
    return totals


def _limit(keep: np.ndarray, max_docs: int | None, kept_so_far: int) -> np.ndarray:
    """Keep only as many documents as --max-docs still allows (the first ones in order)."""
    if max_docs is None:
        return keep
    room = max_docs - kept_so_far
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
        totals.drops.update({k: v for k, v in counts.items() if k not in ("records", "lines_removed")})
        totals.lines_removed += counts.get("lines_removed", 0)
    for name, mask in (("kept", keep), ("duplicate", dupes)):
        ids, n = np.unique(result.doc_sources[mask], return_counts=True)
        for src, count in zip(ids.tolist(), n.tolist(), strict=True):
            totals.per_source.setdefault(src, Counter())[name] += count
    for reason, example in result.examples.items():
        totals.examples.setdefault(reason, example)


def _metadata(
    config: PrepareConfig,
    sources: list[Source],
    tokenizer: Tokenizer,
    shards: list[ShardInfo],
    totals: Totals,
    started: float,
) -> DatasetMeta:
    elapsed = time.time() - started
    n_tokens = sum(s.n_tokens for s in shards)
    drops = dict(sorted(totals.drops.items()))
    drops["duplicate"] = totals.duplicates
    hf = config.hf_spec()
    return DatasetMeta(
        root=Path(config.out),
        lmshard_version=__version__,
        eot_position=config.eot_position,
        tokenizer=TokenizerInfo(name=tokenizer.name, backend=tokenizer.backend, n_vocab=tokenizer.n_vocab,
                                eot_id=tokenizer.eot_id, ranks_sha256=tokenizer.vocab_sha256),  # fmt: skip
        total_tokens=n_tokens,
        total_docs=sum(s.n_docs for s in shards),
        splits={split: SplitInfo.of(tuple(s for s in shards if s.split == split)) for split in SPLITS},
        records_read=totals.records,
        drops=drops,
        drop_examples=totals.examples,
        dedup=DedupInfo(mode=config.dedup, key="xxh3_64 of the cleaned UTF-8 text",
                        duplicates_removed=totals.duplicates, lines=config.dedup_lines,
                        lines_removed=totals.lines_removed),  # fmt: skip
        sources=tuple(_source_info(s, totals.per_source.get(i, Counter()), hf) for i, s in enumerate(sources)),
        config=config.recorded(),
        run=RunInfo(
            workers=config.n_workers(),
            out=config.out,
            started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            elapsed_s=round(elapsed, 3),
            tokens_per_s=round(n_tokens / elapsed, 1) if elapsed > 0 else None,
            input_chars=totals.chars,
            dedup_table_bytes=totals.dedup_bytes,
            python=platform.python_version(),
            host=platform.node(),
        ),
    )


def _source_info(src: Source, counts: Counter[str], hf: Any = None) -> SourceInfo:
    not_drops = ("records", "kept", "lines_removed")
    return SourceInfo(
        path=src.path,
        format=src.fmt,
        bytes=src.size,
        hf=hf.describe() if src.fmt == "hf" else None,  # how the stream was split: resume and scale-out reuse it
        records=counts.get("records", 0),
        kept=counts.get("kept", 0),
        lines_removed=counts.get("lines_removed", 0),
        dropped={k: v for k, v in sorted(counts.items()) if k not in not_drops and v},
    )
