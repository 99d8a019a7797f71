"""What every store of a split offers beyond its own way of reading rows: document boundaries
from the per-shard document indexes, many spans read in one call, and the prefetch hooks.

A store that reads a local file (`store.TokenStore`) has nothing to prefetch: its `lookahead` is
0 and `announce`/`release` do nothing, so streams skip them. A remote store
(`remote.store.RemoteStore`) fetches the blocks of announced steps ahead of time.

Memory model: nothing of its own; `doc_lengths` returns 8 bytes per document.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..format import ShardInfo


class SplitReads:
    """Mixed into a store: needs `starts` (each shard's first token in the split, then the total),
    `shards`, `n_docs`, `index(k)` and `read_into(offset, out)`."""

    starts: np.ndarray
    shards: list[ShardInfo]
    n_docs: int
    lookahead = 0  # steps a stream should announce ahead of the one it serves

    def index(self, k: int) -> np.ndarray:
        raise NotImplementedError

    def read_into(self, offset: int, out: np.ndarray) -> None:
        raise NotImplementedError

    def announce(self, key: Any, parts: list[tuple[np.ndarray, np.ndarray | int]]) -> None:
        """Coming steps will read, each, `lengths` tokens at each of `starts` (a part per step)."""

    def release(self, key: Any) -> None:
        """The steps announced under `key` were served, or will not be."""

    def release_owner(self, owner: int) -> None:
        """Every announcement under a key (owner, ...). May be called from a finalizer on any
        thread: it must take no lock."""

    def read_spans(self, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray, at: np.ndarray) -> None:
        """out[at[i] : at[i] + lengths[i]] = the tokens at starts[i], for every i (out is flat)."""
        for s, n, a in zip(starts.tolist(), lengths.tolist(), at.tolist(), strict=True):
            self.read_into(s, out[a : a + n])

    def shard_of(self, offset: int) -> int:
        return int(np.searchsorted(self.starts, offset, side="right")) - 1

    def doc_lengths(self) -> np.ndarray:
        """The length in tokens (separators included) of every document of the split, in stream
        order, as int64: 8 bytes per document, built shard by shard from the document indexes
        (no token is read). Documents never cross a shard boundary."""
        out = np.empty(self.n_docs, dtype=np.int64)
        at = 0
        for k in range(len(self.shards)):
            idx = self.index(k)
            n = len(idx) - 1
            np.subtract(idx[1:], idx[:-1], out=out[at : at + n], casting="unsafe")
            at += n
        return out

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
