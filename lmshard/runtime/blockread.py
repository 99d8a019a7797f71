"""Reading a remote split's blocks: from the local disk cache when it holds them, else with
ranged GETs, and every block checked before anyone uses it.

Blocks are numbered across the split (shard 0's blocks, then shard 1's, ...). A request covers
a run of adjacent blocks of one shard (at most `MAX_RUN`, 4 MiB); the runs of one call are sent
concurrently (`Remote.read_ranges`). Each block is held to its shard's block sums
(format/blocks.py); a mismatch is a `FormatError` naming the shard's URL and the block. The sums
file itself is fetched once per shard, on first use, and held to the metadata's
`sums_xxh3_64`. A shard without sums (datasets written before them) is read in the same 64 KiB
units unchecked: only the disk cache's own copies are checked (against the trailer written with
them).

Memory model: the blocks of one call (they go on into the pool or the caller's rows); per shard
read so far, its block sums (8 bytes per 64 KiB of tokens).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import FormatError
from ..format import REGENERATE_HINT, TOKEN_DTYPE, ShardInfo, check_blocks
from ..format.blocks import SUMS_DTYPE, block_sums, bytes_xxh3
from ..remote import Remote, redact
from ..remote.retry import MISSING_FIX, RemoteMissing
from .diskcache import TRAILER, DiskCache

MAX_RUN = 64  # blocks per request: 4 MiB
MAX_GAP = 4  # unneeded blocks a request may read through to join two runs: 256 KiB


@contextlib.contextmanager
def objects_of_an_opened_dataset() -> Iterator[None]:
    """A missing object of a dataset that was opened whole: it was replaced or deleted since."""
    try:
        yield
    except RemoteMissing as e:
        raise RemoteMissing(f"{str(e).removesuffix('; ' + MISSING_FIX)}; the dataset was replaced (prepare "
                            "--overwrite) or deleted after it was opened: open it again to read the one there "
                            "now") from None  # fmt: skip


def _trailer(data: bytes | memoryview, block_tokens: int) -> bytes:
    return block_sums(data, block_tokens)  # one block: its xxh3-64, 8 bytes LE


class BlockReader:
    """Fetches and checks blocks of one split: `read(blocks)` -> {block: uint32 tokens}."""

    def __init__(self, remote: Remote, shards: list[ShardInfo], block_tokens: int, cache: DiskCache | None) -> None:
        self.remote, self.shards, self.block_tokens, self.cache = remote, shards, block_tokens, cache
        counts = [-(-s.n_tokens // block_tokens) for s in shards]
        self.base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # first block of each shard
        self._sums: dict[int, np.ndarray | None] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_sums", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _sums={}, _lock=threading.Lock())

    def where(self, k: int) -> str:
        return redact(self.remote.url_of(self.shards[k].path))

    def locate(self, g: int) -> tuple[int, int, int]:
        """(shard, block within it, its tokens) of block g."""
        k = int(np.searchsorted(self.base, g, side="right")) - 1
        b = g - int(self.base[k])
        return k, b, min(self.block_tokens, self.shards[k].n_tokens - b * self.block_tokens)

    def sums(self, k: int) -> np.ndarray | None:
        """Shard k's block sums, fetched and checked on first use; None without sums."""
        if k not in self._sums:
            self.load_sums([k])
        return self._sums[k]

    def load_sums(self, shards: Sequence[int]) -> None:
        """Fetch the sums files of those of `shards` not loaded yet, concurrently, each held to
        its size and to the metadata's `sums_xxh3_64`."""
        todo = [k for k in dict.fromkeys(shards) if k not in self._sums]
        fetch = [k for k in todo if self.shards[k].sums_path]
        rels = [self.shards[k].sums_path for k in fetch]
        with objects_of_an_opened_dataset():
            data = self.remote.read_ranges(rels, [0] * len(rels), [self.shards[k].sums_bytes for k in fetch])
        got = dict(zip(fetch, data, strict=True))
        for k in todo:
            shard, raw = self.shards[k], got.get(k)
            if raw is not None and bytes_xxh3(raw) != shard.sums_xxh3_64:
                raise FormatError(f"{redact(self.remote.url_of(shard.sums_path))}: does not match the "
                                  f"'sums_xxh3_64' of its metadata; {REGENERATE_HINT}")  # fmt: skip
            with self._lock:
                self._sums[k] = None if raw is None else np.frombuffer(raw, dtype=SUMS_DTYPE)

    def read(self, blocks: Sequence[int]) -> dict[int, np.ndarray]:
        """Every block in `blocks`, checked: from the disk cache where it holds a good copy, the
        rest fetched (and then added to the cache)."""
        out: dict[int, np.ndarray] = {}
        missing = []
        if self.cache is not None:  # a cached block is held to its shard's sums
            self.load_sums([self.locate(g)[0] for g in blocks])
        for g in sorted(set(blocks)):
            got = self._cached(g)
            if got is None:
                missing.append(g)
            else:
                out[g] = got
        if missing:
            fetched = self._fetch(missing)
            out.update(fetched)
            if self.cache is not None:
                self.cache.put_many([self._entry(g, a) for g, a in fetched.items()])
        return out

    def _key(self, k: int) -> str:
        return f"{self.shards[k].xxh3_64}-{self.block_tokens}"

    def _cached(self, g: int) -> np.ndarray | None:
        if self.cache is None:
            return None
        k, b, n = self.locate(g)
        size = n * TOKEN_DTYPE.itemsize + TRAILER
        data = self.cache.get(self._key(k), b, size)
        if data is None:
            return None
        body = memoryview(data)[:-TRAILER]
        sums = self.sums(k)
        if len(data) == size:  # held to the shard's sum where there is one (one hash), else to the trailer
            expected = sums[b : b + 1].tobytes() if sums is not None else data[-TRAILER:]
            if _trailer(body, self.block_tokens) == expected:
                return np.frombuffer(body, dtype=TOKEN_DTYPE)
        self.cache.discard(self._key(k), b)  # damaged or stale: fetch it again
        return None

    def _entry(self, g: int, tokens: np.ndarray) -> tuple[str, int, bytes]:
        k, b, _ = self.locate(g)
        sums = self.sums(k)
        body = tokens.tobytes()
        trailer = sums[b : b + 1].tobytes() if sums is not None else _trailer(body, self.block_tokens)
        return self._key(k), b, body + trailer

    def runs(self, blocks: list[int]) -> list[tuple[int, int, int]]:
        """(shard, first block, blocks) of each request: blocks of a shard at most `MAX_GAP`
        apart coalesced (the blocks between are read too, checked and dropped), at most
        MAX_RUN per request. `blocks` is sorted."""
        out: list[tuple[int, int, int]] = []
        for g in blocks:
            k, b, _ = self.locate(g)
            if out and out[-1][0] == k and b - (out[-1][1] + out[-1][2]) <= MAX_GAP and b - out[-1][1] < MAX_RUN:
                out[-1] = (k, out[-1][1], b - out[-1][1] + 1)
            else:
                out.append((k, b, 1))
        return out

    def _fetch(self, blocks: list[int]) -> dict[int, np.ndarray]:
        bt, size = self.block_tokens, TOKEN_DTYPE.itemsize
        runs = self.runs(blocks)
        wanted = set(blocks)
        self.load_sums([k for k, _, _ in runs])  # before the tokens: a bad sums file is named as such
        starts = [b * bt * size for _, b, _ in runs]
        ends = [min((b + n) * bt, self.shards[k].n_tokens) * size for k, b, n in runs]
        with objects_of_an_opened_dataset():
            data = self.remote.read_ranges([self.shards[k].path for k, _, _ in runs], starts, ends)
        out: dict[int, np.ndarray] = {}
        for (k, b, n), raw in zip(runs, data, strict=True):
            sums = self.sums(k)
            if sums is not None:
                check_blocks(self.where(k), raw, b, sums, bt)
            tokens = np.frombuffer(raw, dtype=TOKEN_DTYPE)
            first = int(self.base[k]) + b
            for i in range(n):
                if first + i in wanted:
                    out[first + i] = tokens[i * bt : (i + 1) * bt]
        return out
