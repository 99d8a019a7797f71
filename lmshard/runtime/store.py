"""Token storage for the runtime: one split of a dataset as a single concatenated token stream.

Reads use `os.preadv` straight into the caller's buffer (often a pinned one) instead of
memory-mapping: a memmap's touched pages show up in the process's RSS and grow with every
batch (the "memmap leak" of nanoGPT#287), while pread leaves caching to the kernel's page
cache and copies each token once. At most `max_open` shard files are open at a time (LRU).

Memory model: per shard one cumulative offset (8 bytes) in memory; per *open* shard a file
descriptor and a memory-mapped view of its `.idx` (pages loaded on demand); no token data is
kept between reads. The in-memory store (small text files, synthetic data) holds its tokens.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import FormatError
from ..format import INDEX_DTYPE, TOKEN_DTYPE, DatasetMeta, ShardInfo, load_metadata


@dataclass
class _Open:
    fd: int
    index: np.ndarray  # document start offsets within the shard, plus its end


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
        while self._open:
            os.close(self._open.popitem()[1].fd)

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
        fd = os.open(self.root / shard.path, os.O_RDONLY)
        index = np.memmap(self.root / shard.index_path, dtype=INDEX_DTYPE, mode="r")
        entry = _Open(fd, index)
        self._open[k] = entry
        if len(self._open) > self.max_open:
            os.close(self._open.popitem(last=False)[1].fd)
        return entry

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
            if self._arrays is not None:
                out[done : done + take] = self._arrays[k][0][local : local + take]
            else:
                got = os.preadv(self._get(k).fd, [out[done : done + take].data], local * TOKEN_DTYPE.itemsize)
                if got != take * TOKEN_DTYPE.itemsize:
                    raise FormatError(f"{self.shards[k].path}: short read at token {local}; run `lmshard inspect`")
            done += take
            k += 1

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
