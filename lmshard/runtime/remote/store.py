"""Token storage for a split of a dataset at a URL (s3://, gs://, az://, hf://, https://): the
remote counterpart of `TokenStore` (runtime/store.py), with the same reads, so every stream
works on it.

Opening reads the metadata once (`lmshard.remote.dataset.open_remote`, which follows the
redirect of a replaced dataset to its current generation, whose objects never change) and lists
the split's objects once, to hold every shard's files (block sums and zstd block offsets
included) to the sizes the metadata gives. A shard's document index is fetched when first needed
(document-aligned rows, cu_seqlens, packing) and held to the metadata's `index_xxh3_64`; its
block sums and block offsets likewise (blockread.py).

Tokens are read in whole checksum blocks of the dataset's encoding (16,384 tokens, 64 KiB of
uint32; fewer in zstd), each checked against its sum and decoded to uint32 before use, through
a bounded in-memory pool of decoded blocks (blockfetch.py) and an optional bounded disk cache of
blocks as stored (diskcache.py). A batch's rows are gathered from the pool by one fancy index,
as from mapped shards (rowplan.py: a row that runs into a block in another slot then gets its
tail from there). Streams announce the rows of their next `lookahead` steps, and a background
thread fetches them (exact prefetch).

Pickled (DataLoader workers) without its pool, thread, connections or indexes: each process
builds its own on first read, and shares only the disk cache.

Memory model: the pool (`pool_limit`, default 256 MiB of decoded uint32 tokens, per process);
per shard a few integers and, once read, its block sums and in zstd its block offsets (8 bytes
per block each); the document indexes of at most `max_open` shards (8 bytes per document); in a
call that the pool has no room for, that call's blocks.
"""

from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ArgumentError, FormatError
from ...format import (
    INDEX_DTYPE,
    REGENERATE_HINT,
    UINT32,
    DatasetMeta,
    Encoding,
    ShardInfo,
    check_index,
    shard_file_sizes,
)
from ...format.blocks import BLOCK_TOKENS, bytes_xxh3
from ...remote import Remote, Retry, redact
from ...remote.dataset import open_remote
from ...remote.urls import scheme
from .. import checks
from ..reads import SplitReads
from .blockfetch import Blocks
from .blockread import BlockReader, objects_of_an_opened_dataset
from .diskcache import DiskCache
from .rowplan import Geometry, RowPlan, new_rows

DEFAULT_POOL_LIMIT = 256 << 20
DEFAULT_LOOKAHEAD = 8


class RemoteStore(SplitReads):
    """The tokens of one split of a remote dataset, addressed like `TokenStore`'s."""

    mapped = False  # never memory-mapped: MixedStore gathers its rows through `gather`

    def __init__(self, remote: Remote, shards: list[ShardInfo], *, max_open: int, pool_limit: int,
                 cache: DiskCache | None, lookahead: int, encoding: Encoding = UINT32) -> None:  # fmt: skip
        self.remote, self.shards = remote, shards
        self.sizes = np.array([s.n_tokens for s in shards], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.doc_counts = np.array([s.n_docs for s in shards], dtype=np.int64)
        self.n_tokens, self.n_docs = int(self.starts[-1]), int(self.doc_counts.sum())
        self.max_open, self.lookahead = max_open, lookahead
        self.chunk_steps = lookahead  # steps per announcement (see announce)
        if encoding.version == 1:  # uint32: blocks of the shards' sums, whatever size they were written in
            encoding = dataclasses.replace(encoding, block_tokens=_block_tokens(remote, shards))
        self.encoding = encoding
        self.block_tokens = bt = encoding.block_tokens
        self.reader = BlockReader(remote, shards, encoding, cache)
        self.blocks = Blocks(self.reader, pool_limit)
        self.geometry = Geometry(self.starts, self.sizes, self.reader.base, bt)
        self._plans: dict[Any, RowPlan] = {}  # announced steps' rows (keys (owner, step))
        self._dropped: deque[int] = deque()  # owners whose announcements go at the next call
        self._indexes: OrderedDict[int, np.ndarray] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_indexes": OrderedDict(), "_plans": {}, "_dropped": deque()}

    def close(self) -> None:
        self.blocks.close()

    def drain(self) -> None:
        """Wait until the blocks of the announced steps are fetched (as far as the pool holds
        them): to warm up before timing, or to see what the prefetch did."""
        self._tidy()
        self.blocks.drain()

    @property
    def open_files(self) -> int:
        return 0

    # -- exact prefetch ----------------------------------------------------------------------

    def announce(self, key: Any, parts: list[tuple[np.ndarray, np.ndarray | int]]) -> None:
        """Coming steps read `lengths` tokens at `starts` each (a part per step): their blocks are
        fetched ahead, and for rows of one length per step (batch streams) the plan is kept for
        the reads (`gather(..., key=(key, part))`)."""
        self._tidy()
        starts = np.concatenate([np.asarray(a, dtype=np.int64) for a, _ in parts])
        if not len(starts):
            return
        if all(np.ndim(n) == 0 for _, n in parts):
            counts = [len(a) for a, _ in parts]
            lengths = np.repeat(np.array([int(n) for _, n in parts], dtype=np.int64), counts)  # type: ignore[call-overload]
            plan = RowPlan(self.geometry, starts, lengths, np.concatenate([[0], np.cumsum(counts)]).tolist())
            self._plans[key] = plan
            blocks = plan.blocks
        else:
            lengths = np.concatenate([np.broadcast_to(np.asarray(n, dtype=np.int64), len(a)) for a, n in parts])
            blocks = self.geometry.spans(starts, lengths).tolist()
        self.blocks.announce(key, blocks)
        # Chunks of steps small enough that the pool holds four: a step's blocks are fetched (and
        # pinned) with its chunk's, so a chunk larger than the pool would never be prefetched.
        per_step = max(1.0, len(blocks) / len(parts))
        self.chunk_steps = max(1, min(self.lookahead, int(self.blocks.pool.n / (4 * per_step))))

    def release(self, key: Any) -> None:
        self._plans.pop(key, None)
        self.blocks.release(key)

    def release_owner(self, owner: int) -> None:
        """Every announcement under a key (owner, ...), released at this store's next call: this
        may run in a finalizer, on any thread, in the middle of anything, so it takes no lock."""
        self._dropped.append(owner)

    def _tidy(self) -> None:
        while self._dropped:
            owner = self._dropped.popleft()
            for key in [k for k in self._plans if k[0] == owner]:
                del self._plans[key]
            self.blocks.release_owner(owner)

    # -- reading -----------------------------------------------------------------------------

    def gather(self, offsets: np.ndarray, length: int, scratch: np.ndarray | None = None,
               key: Any = None) -> np.ndarray:  # fmt: skip
        """[rows, length] uint32 (see `TokenStore.gather`): a new array when the pool holds every
        row's blocks, else read into `scratch` (or a new array). `key`: (announcement, part) of
        these rows, whose plan and pinned blocks are used as they are."""
        return self._rows(np.asarray(offsets, dtype=np.int64), length, None, scratch, key)

    def read_rows(self, offsets: np.ndarray, out: np.ndarray, key: Any = None) -> None:
        """Fill each row of `out` ([rows, length] uint32, e.g. a pinned buffer) from its offset."""
        self._rows(np.asarray(offsets, dtype=np.int64), out.shape[1], out, None, key)

    def _rows(self, offsets: np.ndarray, length: int, out: np.ndarray | None, scratch: np.ndarray | None,
              key: Any) -> np.ndarray:  # fmt: skip
        pool = self.blocks.pool
        if self._dropped:
            self._tidy()
        if key is not None:  # an announced step: when all its chunk's blocks are pinned, no lock, no lookup
            plan = self._plans.get(key[0])
            if plan is not None and plan.simple and plan.matches(key[1], offsets, length):
                held = self.blocks.held(key[0])
                if held is not None:
                    return plan.gather(key[1], held, pool, out)
        plan = RowPlan.of(self.geometry, offsets, length)
        if plan.simple:  # the pool may hold them all: copied unpinned, and again pinned if a slot moved meanwhile
            slots, evictions = self.blocks.lookup(plan.blocks)
            if slots is not None:
                rows = plan.gather(0, slots, pool, out)
                if not self.blocks.moved(evictions):
                    return rows
        slots, outside = self.blocks.pin(plan.blocks)
        try:
            if plan.simple and not outside:
                return plan.gather(0, slots, pool, out)
            rows = new_rows(len(offsets), length, scratch) if out is None else out
            self._copy_each(offsets, np.full(len(offsets), length), rows.reshape(-1),
                            np.arange(len(offsets)) * length, plan.need, slots, outside)  # fmt: skip
            return rows
        finally:
            self.blocks.unpin(slots)

    def read_into(self, offset: int, out: np.ndarray) -> None:
        """Fill `out` with the tokens at [offset, offset + len(out)), across shards as needed."""
        self.read_spans(np.array([offset]), np.array([len(out)]), out, np.zeros(1, dtype=np.int64))

    def read_spans(self, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray, at: np.ndarray) -> None:
        """Many spans at once: their blocks are fetched together (concurrently), then copied."""
        if self._dropped:
            self._tidy()
        keep = np.asarray(lengths) > 0
        starts, lengths, at = np.asarray(starts)[keep], np.asarray(lengths)[keep], np.asarray(at)[keep]
        if not len(starts):
            return
        need = self.geometry.spans(np.asarray(starts, dtype=np.int64), lengths)
        blocks = need.tolist()
        slots, evictions = self.blocks.lookup(blocks)
        if slots is not None:  # as in _rows: copied unpinned, and again pinned if a slot moved meanwhile
            self._copy_each(starts, lengths, out, at, need, slots, {})
            if not self.blocks.moved(evictions):
                return
        slots, outside = self.blocks.pin(blocks)
        try:
            self._copy_each(starts, lengths, out, at, need, slots, outside)
        finally:
            self.blocks.unpin(slots)

    def _copy_each(self, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray, at: np.ndarray, need: np.ndarray,
                   slots: np.ndarray, outside: dict[int, np.ndarray]) -> None:  # fmt: skip
        """Span by span, block by block (the blocks are pinned or in `outside`)."""
        slot_of = dict(zip(need.tolist(), slots.tolist(), strict=True))
        bt, pool, base = self.block_tokens, self.blocks.pool, self.geometry.base
        for o, n, a in zip(starts.tolist(), lengths.tolist(), at.tolist(), strict=True):
            while n > 0:
                k = self.shard_of(o)
                local = o - int(self.starts[k])
                b = local // bt
                g, within, size = int(base[k]) + b, local - b * bt, min(bt, int(self.sizes[k]) - b * bt)
                take = min(n, size - within)
                src = outside[g] if g in outside else pool.slot(slot_of[g], size)
                out[a : a + take] = src[within : within + take]
                o, a, n = o + take, a + take, n - take

    # -- document indexes --------------------------------------------------------------------

    def index(self, k: int) -> np.ndarray:
        """Shard k's document index, fetched on first use and held to the metadata's
        `index_xxh3_64` (at most `max_open` kept, least recently used dropped)."""
        found = self._indexes.get(k)
        if found is not None:
            self._indexes.move_to_end(k)
            return found
        shard = self.shards[k]
        url = redact(self.remote.url_of(shard.index_path))
        with objects_of_an_opened_dataset():
            data = self.remote.read_range(shard.index_path, 0, shard.idx_bytes)
        if len(data) != shard.idx_bytes or bytes_xxh3(data) != shard.index_xxh3_64:
            raise FormatError(f"{url}: does not match the size and 'index_xxh3_64' of its metadata; "
                              f"{REGENERATE_HINT}")  # fmt: skip
        index = np.frombuffer(data, dtype=INDEX_DTYPE)
        check_index(Path(url), index, shard.n_tokens)
        self._indexes[k] = index
        if len(self._indexes) > self.max_open:
            self._indexes.popitem(last=False)
        return index


def _block_tokens(remote: Remote, shards: list[ShardInfo]) -> int:
    """A uint32 split's block size: its shards' (one size for all), or 16,384 tokens (64 KiB) for
    shards without sums. (In format version 2 the encoding gives it, and the sums must match.)"""
    sizes = {s.block_tokens for s in shards if s.sums_path}
    if len(sizes) > 1:
        raise FormatError(f"{redact(remote.url)}: its shards have block sums of different sizes "
                          f"({', '.join(map(str, sorted(sizes)))} tokens); {REGENERATE_HINT}")  # fmt: skip
    return sizes.pop() if sizes else BLOCK_TOKENS


def check_objects(remote: Remote, split: str, shards: list[ShardInfo]) -> None:
    """Every shard's objects exist with the sizes the metadata gives (one listing of the split;
    plain web servers list nothing, so their files are held to it as they are read)."""
    if scheme(remote.url) in ("http", "https"):
        return
    listing = remote.listing(split)
    for shard in shards:
        for rel, key, count, expected in shard_file_sizes(shard):
            size = listing.get(rel)
            if size != expected:
                found = f"{size} bytes, but '{key}' {count} in the metadata means {expected}" if size else "missing"
                raise FormatError(f"{redact(remote.url_of(rel))}: {found}; {REGENERATE_HINT}")


def open_remote_store(url: str, split: str, max_open: int, *, cache_dir: str | os.PathLike[str] | None,
                      cache_limit: int | None, pool_limit: int | None, prefetch_steps: int | None,
                      storage_options: dict[str, Any] | None,
                      retry: Retry | None) -> tuple[DatasetMeta, RemoteStore, Path | None]:  # fmt: skip
    """(metadata, store, where packing plans are cached) of a split of the dataset at `url`."""
    if storage_options is not None and not isinstance(storage_options, dict):
        raise ArgumentError(f"storage_options={checks.show(storage_options)} is not a dict; pass the filesystem's "
                            "options as a dict, e.g. {'anon': True}")  # fmt: skip
    if retry is not None and not isinstance(retry, Retry):
        raise ArgumentError(f"retry={checks.show(retry)} is not a lmshard.remote.Retry; pass Retry(attempts=...)")
    pool = DEFAULT_POOL_LIMIT if pool_limit is None else checks.nonnegative("pool_limit", pool_limit)
    ahead = DEFAULT_LOOKAHEAD if prefetch_steps is None else checks.nonnegative("prefetch_steps", prefetch_steps)
    cache = None
    if cache_dir is not None:
        if not isinstance(cache_dir, str | os.PathLike):
            raise ArgumentError(f"cache_dir={checks.show(cache_dir)} is not a path; pass a local directory")
        if cache_limit is None:
            raise ArgumentError("cache_dir= needs cache_limit=, the most bytes the cache may hold on disk; pass e.g. "
                                "cache_limit=100 << 30 (100 GiB)")  # fmt: skip
        cache = DiskCache(cache_dir, checks.positive("cache_limit", cache_limit))
    elif cache_limit is not None:
        raise ArgumentError("cache_limit= without cache_dir=; pass cache_dir= too (a local directory) to keep blocks "
                            "on disk")  # fmt: skip
    meta, remote = open_remote(url, storage_options, retry)
    if split not in meta.splits:
        raise FormatError(f"{redact(url)}: no split {split!r} (splits: {', '.join(meta.splits)})")
    check_objects(remote, split, list(meta.split_shards(split)))
    shards = [s for s in meta.split_shards(split) if s.n_tokens]
    if not shards:
        raise FormatError(f"{redact(url)}: split {split!r} holds no tokens; prepare more data or use another split")
    store = RemoteStore(remote, shards, max_open=max_open, pool_limit=pool, cache=cache, lookahead=ahead,
                        encoding=meta.encoding)  # fmt: skip
    plans = None if cache_dir is None else Path(cache_dir) / "plans"
    return meta, store, plans
