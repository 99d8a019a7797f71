"""Reading a remote split's blocks: from the local disk cache when it holds them, else with
ranged GETs, every block checked before anyone uses it, then decoded to uint32 tokens.

Blocks are numbered across the split (shard 0's blocks, then shard 1's, ...), each the
dataset encoding's `block_tokens` tokens (format/encoding.py: 16,384 in uint32, uint16 and
packed, fewer in zstd; the last block of a shard may be shorter). Block b of a shard is the
stored bytes `encoding.block_span(b, ...)`: 64 KiB from b·64 KiB in uint32, 32 KiB in uint16,
2,048·bits bytes in packed, and in zstd the frame [offsets[b], offsets[b + 1]) that the shard's
`.blocks` file gives. That file is fetched once per shard, on first use, held to the metadata's
`blocks_xxh3_64` and checked to run from 0 to the token file's size, so an offset never points
a request outside the file.

A request covers a run of adjacent blocks of one shard (at most `MAX_RUN_BYTES`, 16 MiB: 256
uint32 blocks), reading through gaps of up to `MAX_GAP_BYTES` between the blocks asked for
(unless a block in the gap is had already); the blocks read through are checked and handed back
as stored, so that the pool keeps (and decodes) those it has room for and no later request
fetches them again. The runs of one call are sent concurrently (`Remote.read_ranges`). Each
block's stored bytes are held to its shard's block sums (format/blocks.py), then decoded; a block that
does not match its sum, or does not decode, is a `FormatError` naming the shard's URL and the
block. The sums file itself is fetched once per shard, on first use, and held to the metadata's
`sums_xxh3_64`. A shard without sums (datasets written before them) is read in the same units
unchecked (a zstd frame still checks its own content when it decodes): only the disk cache's
own copies are checked (against the trailer written with them).

The disk cache keeps blocks as stored (a zstd block takes its compressed size there), so a
cached block is held to the same sum as a fetched one and decoded after it is read. A uint32
block's stored bytes are its tokens: it is used as read, without a copy.

Memory model: the blocks of one call, as stored and decoded (they go on into the pool or the
caller's rows); per shard read so far, its block sums (8 bytes per block) and in zstd its block
offsets (8 bytes per block).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

from ...errors import FormatError
from ...format import REGENERATE_HINT, TOKEN_DTYPE, Encoding, ShardInfo
from ...format.blocks import SUMS_DTYPE, block_damage, bytes_xxh3
from ...format.encoding import OFFSETS_DTYPE
from ...format.tokenfile import block_where, check_offsets
from ...remote import Remote, redact
from ...remote.retry import MISSING_FIX, RemoteMissing
from .diskcache import TRAILER, DiskCache

MAX_RUN_BYTES = 16 << 20  # stored bytes per request (at least one block): 256 uint32 blocks
MAX_GAP_BYTES = 256 << 10  # unneeded stored bytes a request may read through to join two runs: 4 uint32 blocks


@contextlib.contextmanager
def objects_of_an_opened_dataset() -> Iterator[None]:
    """A missing object of a dataset that was opened whole: it was replaced or deleted since."""
    try:
        yield
    except RemoteMissing as e:
        raise RemoteMissing(f"{str(e).removesuffix('; ' + MISSING_FIX)}; the dataset was replaced (prepare "
                            "--overwrite) or deleted after it was opened: open it again to read the one there "
                            "now") from None  # fmt: skip


def _trailer(data: bytes | memoryview) -> bytes:
    return np.array([_sum(data)], dtype=SUMS_DTYPE).tobytes()  # one block: its xxh3-64, 8 bytes LE


def _sum(data: bytes | memoryview) -> int:
    """The xxh3-64 of a block's stored bytes, as the sums file holds it."""
    return int(bytes_xxh3(data), 16)


class BlockReader:
    """Fetches, checks and decodes blocks of one split: `read(blocks)` -> {block: uint32 tokens}."""

    def __init__(self, remote: Remote, shards: list[ShardInfo], encoding: Encoding, cache: DiskCache | None) -> None:
        self.remote, self.shards, self.encoding, self.cache = remote, shards, encoding, cache
        self.block_tokens = bt = encoding.block_tokens
        counts = [-(-s.n_tokens // bt) for s in shards]
        self.base = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # first block of each shard
        self._sums: dict[int, np.ndarray | None] = {}  # a shard here has its offsets loaded too
        self._offsets: dict[int, np.ndarray] = {}
        self._urls: dict[int, str] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_sums", "_offsets", "_urls", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _sums={}, _offsets={}, _urls={}, _lock=threading.Lock())

    def where(self, k: int) -> str:
        """Shard k's URL, credentials taken out (made once: a decode names it per block)."""
        url = self._urls.get(k)
        if url is None:
            url = self._urls[k] = redact(self.remote.url_of(self.shards[k].path))
        return url

    def locate(self, g: int) -> tuple[int, int, int]:
        """(shard, block within it, its tokens) of block g."""
        k = int(np.searchsorted(self.base, g, side="right")) - 1
        b = g - int(self.base[k])
        return k, b, min(self.block_tokens, self.shards[k].n_tokens - b * self.block_tokens)

    def span(self, k: int, b: int) -> tuple[int, int]:
        """(first byte, end byte) of block b of shard k in its token file (zstd: offsets loaded)."""
        return self.encoding.block_span(b, self.shards[k].n_tokens, self._offsets.get(k))

    def sums(self, k: int) -> np.ndarray | None:
        """Shard k's block sums, fetched and checked on first use; None without sums."""
        if k not in self._sums:
            self.load([k])
        return self._sums[k]

    def load(self, shards: Sequence[int]) -> None:
        """Fetch the sums files (and in zstd the block offsets files) of those of `shards` not
        loaded yet, concurrently, each held to its size and to its checksum in the metadata.
        One thread fetches at a time (the reader and the prefetch thread may want the same shard
        first): each file is fetched once."""
        if all(k in self._sums for k in shards):
            return
        with self._lock:
            todo = [k for k in dict.fromkeys(shards) if k not in self._sums]
            files = [(k, "sums") for k in todo if self.shards[k].sums_path]
            files += [(k, "blocks") for k in todo if self.encoding.compressed]
            rels = [self._file(k, kind)[0] for k, kind in files]
            with objects_of_an_opened_dataset():
                data = self.remote.read_ranges(rels, [0] * len(rels), [self._file(k, kind)[1] for k, kind in files])
            got = dict(zip(files, data, strict=True))
            for k in todo:
                raw = got.get((k, "sums"))
                self._held(k, "sums", raw)
                if self.encoding.compressed:
                    self._offsets[k] = self._offsets_of(k, got[(k, "blocks")])
                self._sums[k] = None if raw is None else np.frombuffer(raw, dtype=SUMS_DTYPE)  # k is loaded

    def _file(self, k: int, kind: str) -> tuple[str, int, str, str]:
        """(path, size, metadata checksum, its field) of shard k's sums or block offsets file."""
        shard = self.shards[k]
        if kind == "sums":
            return shard.sums_path, shard.sums_bytes, shard.sums_xxh3_64, "sums_xxh3_64"
        n_blocks = int(self.base[k + 1] - self.base[k])
        return shard.blocks_path, (n_blocks + 1) * OFFSETS_DTYPE.itemsize, shard.blocks_xxh3_64, "blocks_xxh3_64"

    def _held(self, k: int, kind: str, raw: bytes | None) -> None:
        rel, _, digest, field = self._file(k, kind)
        if raw is not None and bytes_xxh3(raw) != digest:
            raise FormatError(f"{redact(self.remote.url_of(rel))}: does not match the '{field}' of its metadata; "
                              f"{REGENERATE_HINT}")  # fmt: skip

    def _offsets_of(self, k: int, raw: bytes) -> np.ndarray:
        self._held(k, "blocks", raw)
        offsets = np.frombuffer(raw, dtype=OFFSETS_DTYPE)
        url = redact(self.remote.url_of(self.shards[k].blocks_path))
        check_offsets(url, offsets, int(self.base[k + 1] - self.base[k]), self.shards[k].bin_bytes)
        return offsets

    def read(self, blocks: Sequence[int], held: Callable[[int], bool] | None = None,
             through: dict[int, memoryview] | None = None, spare: int = 0,
             claim: Callable[[list[int]], None] | None = None, rest: Sequence[int] = (),
             lenient: bool = False) -> dict[int, np.ndarray]:  # fmt: skip
        """Every block in `blocks` as uint32 tokens, checked: from the disk cache where it holds a
        good copy, the rest fetched (and then added to the cache). `held(block)`: the blocks had
        already (in the pool, or on their way), which a request does not read through; the
        blocks it did read through between two of these are checked and their stored bytes put
        in `through`, for the pool to keep (`decode` them). `spare`: how many more blocks the
        pool has free slots for, which requests may read through across gaps of any size (up to
        MAX_RUN_BYTES a request): a cold pass in a few large requests. `claim(blocks)` is told
        the blocks the requests will read through before they are sent. `rest`: more blocks to
        read through as if they were in gaps (those not in the disk cache, which no request reads
        through). A block read through that does not match its sum is left out of `through`, not
        an error of this call; `lenient`: so is a block of `blocks` (left out of the result)."""
        wanted = sorted(set(blocks))
        self.load([self.locate(g)[0] for g in wanted] + [self.locate(g)[0] for g in rest])
        stored: dict[int, memoryview] = {}
        missing = []
        for g in wanted:
            got = self._cached(g)
            if got is None:
                missing.append(g)
            else:
                stored[g] = got
        asked = set(wanted)
        if rest:
            fetch = [g for g in rest if g not in asked and not self._in_cache(g)]
            cached = set(rest) - set(fetch) - asked
            if cached:
                had = held
                held = lambda g: g in cached or (had is not None and had(g))  # noqa: E731
            spare, rest = max(0, spare - len(fetch)), fetch
        fetched = self._fetch(sorted(missing + list(rest)), asked, held, spare, claim, lenient) if missing else {}
        if through is not None:
            through.update((g, data) for g, data in fetched.items() if g not in asked)
        fetched = {g: data for g, data in fetched.items() if g in asked}
        stored.update(fetched)
        # A decompressor per call: reads run on several threads at once, and one is not thread-safe.
        decompressor = self.encoding.decompressor() if self.encoding.compressed else None
        out = {g: self._decode(g, data, decompressor) for g, data in stored.items()}
        if fetched and self.cache is not None:  # only blocks that decode
            self.cache.put_many([self._entry(g, data) for g, data in fetched.items()])
        return out

    def decode(self, g: int, stored: memoryview) -> np.ndarray:
        """Block g's checked stored bytes (from `read`'s `through`) as uint32 tokens."""
        return self._decode(g, stored, self.encoding.decompressor() if self.encoding.compressed else None)

    def remember(self, stored: dict[int, memoryview]) -> None:
        """Add blocks read through (checked, decoded) to the disk cache, as fetched blocks are."""
        if stored and self.cache is not None:
            self.cache.put_many([self._entry(g, data) for g, data in stored.items()])

    def _decode(self, g: int, stored: memoryview, decompressor: Any) -> np.ndarray:
        if self.encoding.name == "uint32":
            return np.frombuffer(stored, dtype=TOKEN_DTYPE)
        k, b, n = self.locate(g)
        where = partial(block_where, self.where(k), b, self.block_tokens)  # made only for an error
        return self.encoding.decode(stored, n, where, decompressor)

    def _in_cache(self, g: int) -> bool:
        """Whether the disk cache has a file for block g (unchecked: a read checks it)."""
        if self.cache is None:
            return False
        k, b, _ = self.locate(g)
        return self.cache.has(self._key(k), b)

    def _key(self, k: int) -> str:
        return f"{self.shards[k].xxh3_64}-{self.block_tokens}"

    def _cached(self, g: int) -> memoryview | None:
        """Block g's stored bytes from the disk cache, held to the shard's sum where there is one
        (one hash), else to the trailer written with them; None (and the file removed when it is
        there but damaged or stale) when the cache has no good copy."""
        if self.cache is None:
            return None
        k, b, _ = self.locate(g)
        lo, hi = self.span(k, b)
        size = hi - lo + TRAILER
        data = self.cache.get(self._key(k), b, size)
        if data is None:
            return None
        body = memoryview(data)[:-TRAILER]
        sums = self.sums(k)
        if len(data) == size:
            expected = sums[b : b + 1].tobytes() if sums is not None else data[-TRAILER:]
            if _trailer(body) == expected:
                return body
        self.cache.discard(self._key(k), b)  # damaged or stale: fetch it again
        return None

    def _entry(self, g: int, stored: memoryview) -> tuple[str, int, bytes]:
        k, b, _ = self.locate(g)
        sums = self.sums(k)
        trailer = sums[b : b + 1].tobytes() if sums is not None else _trailer(stored)
        return self._key(k), b, bytes(stored) + trailer

    def runs(self, blocks: list[int], held: Callable[[int], bool] | None = None,
             spare: int = 0) -> list[tuple[int, int, int, int, int]]:  # fmt: skip
        """(shard, first block, blocks, first byte, end byte) of each request: blocks of a shard
        at most `MAX_GAP_BYTES` apart coalesced (the blocks between are read too, checked, and
        given to the caller as well) unless a block between is `held` already, at most
        MAX_RUN_BYTES per request. `blocks` is sorted, their shards loaded."""
        out: list[tuple[int, int, int, int, int]] = []
        for g in blocks:
            k, b, _ = self.locate(g)
            lo, hi = self.span(k, b)
            fits = bool(out) and out[-1][0] == k and hi - out[-1][3] <= MAX_RUN_BYTES
            gap = range(g - b + out[-1][1] + out[-1][2], g) if fits else range(0)
            wide = fits and lo - out[-1][4] > MAX_GAP_BYTES
            if fits and (not wide or len(gap) <= spare) and (held is None or not any(held(h) for h in gap)):
                spare -= len(gap) if wide else 0
                _, first, _, start, _ = out[-1]
                out[-1] = (k, first, b - first + 1, start, hi)
            else:
                out.append((k, b, 1, lo, hi))
        return out

    def _fetch(self, blocks: list[int], asked: set[int], held: Callable[[int], bool] | None = None, spare: int = 0,
               claim: Callable[[list[int]], None] | None = None,
               lenient: bool = False) -> dict[int, memoryview]:  # fmt: skip
        """The stored bytes of `blocks` (sorted) and of the blocks their requests read through,
        fetched and each held to its sum (a damaged one not `asked` for, or any with `lenient`,
        is left out)."""
        runs = self.runs(blocks, held, spare)
        if claim is not None:
            claim([g for k, b, n, _, _ in runs for g in range(int(self.base[k]) + b, int(self.base[k]) + b + n)
                   if g not in asked])  # fmt: skip
        with objects_of_an_opened_dataset():
            data = self.remote.read_ranges([self.shards[k].path for k, *_ in runs], [r[3] for r in runs],
                                           [r[4] for r in runs])  # fmt: skip
        out: dict[int, memoryview] = {}
        for (k, b, n, start, _), raw in zip(runs, data, strict=True):
            sums, view, first = self.sums(k), memoryview(raw), int(self.base[k]) + b
            for i in range(n):
                lo, hi = self.span(k, b + i)
                block = view[lo - start : hi - start]
                if sums is not None and _sum(block) != int(sums[b + i]):
                    if lenient or first + i not in asked:
                        continue
                    raise FormatError(block_damage(self.where(k), b + i, self.block_tokens))
                out[first + i] = block
        return out
