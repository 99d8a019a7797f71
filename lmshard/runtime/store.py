"""Token storage for the runtime: one split of a dataset as a single concatenated token stream.

Shards are memory-mapped lazily, at most `max_open` at a time (least recently used are
unmapped), and the rows of a batch are gathered from a map into a new array, or into the
caller's (pinned) buffer. Touched pages of a shared file mapping count in the
process's RSS, which is why RSS seems to grow without bound under nanoGPT's persistent memmap
(nanoGPT#287) and why nanoGPT re-creates its memmap every batch. Here, after every
`release_bytes` of tokens read, each open map is told `MADV_DONTNEED`: its pages leave the
process's RSS but stay in the kernel's page cache, so re-reading them costs a minor fault, not
disk I/O. Between releases the maps' share of RSS grows with what is read (a page fault maps
64 KB around it, or a whole large folio of the page cache), so it stays bounded however much is
read (docs/performance.md has the measurement). Open maps that together are no larger than
`release_bytes` (default 256 MiB) are never released: they cannot grow past their own size, and
re-faulting released pages would cost every batch time.

Memory model: per shard one cumulative offset (8 bytes); per *open* shard a file mapping and a
memory-mapped view of its `.idx` (pages loaded on demand, released as above); no token data is
kept between reads. The in-memory store (small text files, synthetic data) holds its tokens.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import FormatError
from ..format import INDEX_DTYPE, TOKEN_DTYPE, DatasetMeta, ShardInfo, load_metadata


@dataclass
class _Open:
    map: mmap.mmap
    tokens: np.ndarray  # uint32 view of `map`
    index: np.ndarray  # document start offsets within the shard, plus its end

    def close(self) -> None:
        self.tokens = self.index = np.zeros(0, TOKEN_DTYPE)
        with contextlib.suppress(BufferError):  # a caller still holds a view: let GC unmap it
            self.map.close()


class TokenStore:
    """The tokens of one split, addressed by global offset across its shards in order."""

    def __init__(
        self,
        shards: list[ShardInfo],
        root: Path,
        max_open: int = 64,
        arrays: list[tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        self.root = root
        self.shards = shards
        self.sizes = np.array([s.n_tokens for s in shards], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.doc_counts = np.array([s.n_docs for s in shards], dtype=np.int64)
        self.n_tokens = int(self.starts[-1])
        self.n_docs = int(self.doc_counts.sum())
        self.max_open = max(1, max_open)
        self._arrays = arrays  # in-memory shards: (tokens, index) pairs
        self._open: OrderedDict[int, _Open] = OrderedDict()
        self.release_bytes = 256 << 20  # bytes read between MADV_DONTNEED passes
        self._read_since_release = 0
        self._windows: dict[int, np.ndarray] = {}  # row length -> row view of a single-shard split

    @classmethod
    def from_dataset(cls, meta: DatasetMeta, split: str, max_open: int = 64) -> TokenStore:
        shards = [s for s in meta.split_shards(split) if s.n_tokens]
        for shard in shards:
            _check_sizes(meta, shard)
        return cls(shards, meta.root, max_open)

    @classmethod
    def from_arrays(cls, tokens: np.ndarray, index: np.ndarray) -> TokenStore:
        tokens = np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE)
        index = np.asarray(index, dtype=INDEX_DTYPE)
        info = ShardInfo(split="memory", path="<memory>", index_path="<memory>", n_tokens=len(tokens),
                         n_docs=len(index) - 1, xxh3_64="", index_xxh3_64="")  # fmt: skip
        return cls([info], Path("."), arrays=[(tokens, index)])

    def close(self) -> None:
        self._windows = {}
        while self._open:
            self._open.popitem()[1].close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown os may already be gone
            self.close()

    @property
    def open_files(self) -> int:
        return len(self._open)

    def _get(self, k: int) -> _Open:
        entry = self._open.get(k)
        if entry is not None:
            self._open.move_to_end(k)
            return entry
        shard = self.shards[k]
        with open(self.root / shard.path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # the map outlives the fd
        index = np.memmap(self.root / shard.index_path, dtype=INDEX_DTYPE, mode="r")
        entry = _Open(mapped, np.frombuffer(mapped, dtype=TOKEN_DTYPE), index)
        self._open[k] = entry
        if len(self._open) > self.max_open:
            self._open.popitem(last=False)[1].close()
        return entry

    def _tokens(self, k: int) -> np.ndarray:
        return self._arrays[k][0] if self._arrays is not None else self._get(k).tokens

    def _account(self, nbytes: int) -> None:
        """Release mapped pages from RSS every `release_bytes` read (they stay in page cache),
        unless the open maps are no larger than that: they cannot add more to RSS than their
        size, and re-mapping released pages costs a page fault per 64 KB touched afterwards
        (~10 us per batch of 128 KB on a small split that fits the budget)."""
        self._read_since_release += nbytes
        if self._read_since_release >= self.release_bytes:
            self._read_since_release = 0
            if sum(len(e.map) for e in self._open.values()) > self.release_bytes:
                for entry in self._open.values():
                    entry.map.madvise(mmap.MADV_DONTNEED)

    def shard_of(self, offset: int) -> int:
        return int(np.searchsorted(self.starts, offset, side="right")) - 1

    def read_into(self, offset: int, out: np.ndarray) -> None:
        """Fill `out` (uint32, contiguous) with the tokens at [offset, offset + len(out)),
        crossing shard boundaries as needed."""
        done, n = 0, len(out)
        k = self.shard_of(offset)
        while done < n:
            local = offset + done - int(self.starts[k])
            take = min(n - done, int(self.sizes[k]) - local)
            out[done : done + take] = self._tokens(k)[local : local + take]
            done += take
            k += 1
        self._account(n * TOKEN_DTYPE.itemsize)

    def gather(self, offsets: np.ndarray, length: int) -> np.ndarray:
        """A new [rows, length] uint32 array: row r holds the tokens at [offsets[r], + length)."""
        view = self._row_view(offsets, length)
        if view is None:
            out = np.empty((len(offsets), length), dtype=TOKEN_DTYPE)
            self.read_rows(offsets, out)
            return out
        out = view[offsets]  # one C loop over the rows, straight into a new array
        self._account(out.nbytes)
        return out

    def read_rows(self, offsets: np.ndarray, out: np.ndarray) -> None:
        """Fill each row of `out` ([rows, length] uint32, e.g. a pinned buffer) from the matching
        offset: a slice copy per row (a memcpy; several times faster than a fancy-indexed gather
        from the flat array), `read_into` for the rare row that crosses a shard boundary."""
        rows, length = out.shape
        view = self._row_view(offsets, length)
        if view is not None:
            out[...] = view[offsets]
            self._account(out.nbytes)
            return
        shards = np.searchsorted(self.starts, offsets, side="right") - 1
        local = (offsets - self.starts[shards]).tolist()
        inside = (offsets - self.starts[shards] + length <= self.sizes[shards]).tolist()
        arrays = {k: self._tokens(k) for k in set(shards.tolist())}
        for r, k in enumerate(shards.tolist()):
            if inside[r]:
                out[r] = arrays[k][local[r] : local[r] + length]
            else:
                self.read_into(int(offsets[r]), out[r])
        self._account(rows * length * TOKEN_DTYPE.itemsize)

    def _row_view(self, offsets: np.ndarray, length: int) -> np.ndarray | None:
        """For a single-shard split, a [starts, length] sliding-window view of its tokens (no
        copy), so that rows are gathered by one fancy index: one C loop instead of a Python loop
        of slice copies (24 vs 38 us for 32 rows of 1,025). None when rows need shard lookups."""
        if len(self.shards) != 1 or int(offsets.max()) + length > self.n_tokens:
            return None
        view = self._windows.get(length)
        if view is None:  # one per row length: a few at most (random shifts)
            view = self._windows[length] = np.lib.stride_tricks.sliding_window_view(self._tokens(0), length)
        return view

    def index(self, k: int) -> np.ndarray:
        return self._arrays[k][1] if self._arrays is not None else self._get(k).index

    def doc_start(self, k: int, i: int) -> int:
        """Global offset of document `i` of shard `k`."""
        return int(self.starts[k]) + int(self.index(k)[i])

    def doc_starts_in(self, lo: int, hi: int) -> np.ndarray:
        """Global offsets of document starts strictly inside (lo, hi)."""
        found = []
        k = self.shard_of(lo)
        while k < len(self.shards) and self.starts[k] < hi:
            base = int(self.starts[k])
            idx = self.index(k)
            a, b = np.searchsorted(idx, [lo - base + 1, hi - base], side="left")
            found.append(np.asarray(idx[a:b], dtype=np.int64) + base)
            if base > lo:
                found.append(np.array([base], dtype=np.int64))  # a shard boundary is a doc start
            k += 1
        return np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)


def _check_sizes(meta: DatasetMeta, shard: ShardInfo) -> None:
    for rel, expected in ((shard.path, shard.n_tokens * TOKEN_DTYPE.itemsize),
                          (shard.index_path, (shard.n_docs + 1) * INDEX_DTYPE.itemsize)):  # fmt: skip
        path = meta.abspath(rel)
        size = path.stat().st_size if path.is_file() else -1
        if size != expected:
            what = "is missing" if size < 0 else f"has {size} bytes, metadata says {expected}"
            raise FormatError(f"{path}: {what}; run `lmshard inspect {meta.root}` and re-run prepare")


def open_store(path: str | os.PathLike[str], split: str, max_open: int = 64) -> tuple[DatasetMeta, TokenStore]:
    meta = load_metadata(path)
    if split not in meta.raw["splits"]:
        raise FormatError(f"{path}: no split {split!r} (splits: {', '.join(meta.raw['splits'])})")
    store = TokenStore.from_dataset(meta, split, max_open)
    if store.n_tokens == 0:
        raise FormatError(f"{path}: split {split!r} holds no tokens; prepare more data or use another split")
    return meta, store
