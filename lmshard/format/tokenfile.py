"""Reading tokens from a shard's token file in any encoding (encoding.py): a range of tokens
decodes from only the blocks it touches.

`TokenFile(path, shard, encoding)` opens the file; `read(lo, hi)` returns tokens [lo, hi) as
uint32. uint32 and uint16 files are read with one `pread` of the range; a packed file with one
`pread` of the bytes the range's bits cover; a zstd file frame by frame, through a small cache
of decoded blocks (`cache_blocks`), so that consecutive reads (sliding windows, documents in
order) decode each block once. A compressed shard's block offsets (`.blocks`) are read and
checked when the file is opened: they must start at 0, never decrease and end at the file's
size, so a damaged offsets file is refused before it can point a read outside the file.

Memory model: per open file, a descriptor, for zstd its block offsets (8 bytes per block, e.g.
8 KiB per 1 M tokens in 1,024-token blocks) and at most `cache_blocks` decoded blocks
(4 bytes per token each); a read holds the stored bytes of its range.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections import OrderedDict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError
from .bitpack import unpack_bits
from .encoding import OFFSETS_DTYPE, Encoding, widen
from .layout import REGENERATE_HINT
from .shard import ShardInfo

CACHE_BLOCKS = 64  # decoded zstd blocks kept per open file: 256 KiB of uint32 at 1,024 tokens each


def check_offsets(where: Path | str, offsets: np.ndarray, n_blocks: int, n_bytes: int) -> None:
    """FormatError unless a compressed shard's block offsets run from 0 to its size, n_blocks + 1
    of them, never decreasing."""
    if len(offsets) != n_blocks + 1 or int(offsets[0]) != 0 or int(offsets[-1]) != n_bytes:
        raise FormatError(f"{where}: block offsets do not run from 0 to the token file's {n_bytes:,} bytes in "
                          f"{n_blocks} blocks; {REGENERATE_HINT}")  # fmt: skip
    if len(offsets) > 1 and not (offsets[1:] >= offsets[:-1]).all():
        raise FormatError(f"{where}: block offsets decrease; {REGENERATE_HINT}")


class TokenFile:
    """One shard's tokens, read by token range whatever the encoding (see the module docstring)."""

    def __init__(self, root: Path, shard: ShardInfo, encoding: Encoding, cache_blocks: int = CACHE_BLOCKS,
                 mapped: bool = False, fd: int | None = None) -> None:  # fmt: skip
        self.path, self.shard, self.encoding = root / shard.path, shard, encoding
        self.where = str(self.path)
        self.fd = os.open(self.path, os.O_RDONLY) if fd is None else os.dup(fd)
        self._map: mmap.mmap | None = None
        self._bytes: memoryview | None = None  # of the map: a block is a slice of it, no read at all
        self.offsets: np.ndarray | None = None
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cache_blocks = cache_blocks
        self._decompressor: Any = None
        if encoding.compressed:
            try:
                offsets = np.fromfile(root / shard.blocks_path, dtype=OFFSETS_DTYPE)
                check_offsets(root / shard.blocks_path, offsets, shard.n_blocks, shard.bin_bytes)
            except BaseException:
                os.close(self.fd)
                raise
            self.offsets = offsets
            self._decompressor = encoding.decompressor()
        if mapped and shard.bin_bytes:
            self._map = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)
            self._bytes = memoryview(self._map)

    def close(self) -> None:
        self._cache.clear()
        if self._bytes is not None:
            self._bytes.release()
            self._bytes = None
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a decoded block never views the map, but be safe
                self._map.close()
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._cache.clear()

    def __del__(self) -> None:
        try:  # noqa: SIM105 (module globals may be gone at interpreter shutdown)
            self.close()
        except Exception:
            pass

    def pread(self, lo: int, hi: int) -> bytes | memoryview:
        """Bytes [lo, hi) of the file; FormatError when the file holds fewer (changed since)."""
        data = self._bytes[lo:hi] if self._bytes is not None else os.pread(self.fd, hi - lo, lo)
        if len(data) != hi - lo:
            raise FormatError(f"{self.where}: read {len(data)} of {hi - lo} bytes at byte {lo}; the shard changed "
                              "after it was opened: run `lmshard inspect`")  # fmt: skip
        return data

    def stored_block(self, b: int) -> bytes | memoryview:
        """Block b's bytes as stored (what its checksum covers)."""
        lo, hi = self.encoding.block_span(b, self.shard.n_tokens, self.offsets)
        return self.pread(lo, hi)

    def block_tokens(self, b: int) -> int:
        bt = self.encoding.block_tokens
        return min(bt, self.shard.n_tokens - b * bt)

    def block(self, b: int) -> np.ndarray:
        """Block b's tokens (uint32), decoded; zstd blocks through the cache."""
        cached = self._cache.get(b)
        if cached is not None:
            self._cache.move_to_end(b)
            return cached
        tokens = self.encoding.decode(self.stored_block(b), self.block_tokens(b),
                                      lambda: block_where(self.where, b, self.encoding.block_tokens),
                                      self._decompressor)  # fmt: skip
        if self._cache_blocks:
            self._cache[b] = tokens
            if len(self._cache) > self._cache_blocks:
                self._cache.popitem(last=False)
        return tokens

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Tokens [lo, hi) of the shard as uint32."""
        out = np.empty(max(hi - lo, 0), dtype=np.uint32)
        self.read_into(lo, out)
        return out

    def read_into(self, lo: int, out: np.ndarray) -> None:
        """Fill `out` (uint32) with the tokens at [lo, lo + len(out))."""
        n, enc = len(out), self.encoding
        if not n:
            return
        if not enc.compressed:
            first, end = lo * enc.bits // 8, -(-((lo + n) * enc.bits) // 8)
            data = np.frombuffer(self.pread(first, end), dtype=np.uint8)
            if enc.name == "packed":
                out[:] = unpack_bits(data, enc.bits, lo * enc.bits % 8, n)
            else:
                out[:] = data.view(enc.mappable or np.uint32)
            return
        bt = enc.block_tokens
        done = 0
        for b in range(lo // bt, (lo + n - 1) // bt + 1):
            tokens = self.block(b)
            a = max(lo - b * bt, 0)
            take = min(len(tokens) - a, n - done)
            out[done : done + take] = tokens[a : a + take]
            done += take


    def read_rows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """[rows, length] uint32: row r = tokens [starts[r], starts[r] + length), for rows inside the shard:
        for a batch, each block the rows touch is read and decoded once (zstd), or every row's
        bits are unpacked in one vectorized pass (packed)."""
        starts = np.asarray(starts, dtype=np.int64)
        if not len(starts):
            return np.empty((0, length), dtype=np.uint32)
        if self.encoding.name == "packed":
            return self._packed_rows(starts, length)
        if self.encoding.compressed:
            return self._zstd_rows(starts, length)
        out = np.empty((len(starts), length), dtype=np.uint32)
        for r, lo in enumerate(starts.tolist()):
            self.read_into(lo, out[r])
        return out

    def _packed_rows(self, starts: np.ndarray, length: int) -> np.ndarray:
        bits = self.encoding.bits
        word = np.dtype("<u4" if bits <= 25 else "<u8")  # holds a token's bits at any of the 8 bit offsets
        first = starts * bits  # each row's first bit
        span = (length * bits + 7) // 8 + 1  # the bytes a row's bits cover, whatever its first bit
        buf = np.zeros((len(starts), span + 8), dtype=np.uint8)  # 8 more: a word at any of them
        mapped = np.frombuffer(self._map, dtype=np.uint8) if self._map is not None else None
        for r, byte in enumerate((first >> 3).tolist()):
            if mapped is not None:
                got = len(mapped[byte : byte + span])
                buf[r, :got] = mapped[byte : byte + span]
            else:
                got = os.preadv(self.fd, [buf[r, :span].data], byte)
            if got < span and byte + got < self.shard.bin_bytes:
                self.pread(byte, byte + span)  # a short read inside the file: raises naming it
        at = (first & 7)[:, None] + np.arange(length, dtype=np.int64) * bits  # each token's bit in its row
        words = np.ndarray((buf.size - 7,), dtype=word, buffer=buf, strides=(1,))
        # One unaligned load per token (its bits and the next ones), from the small buffer: take
        # copies it whole first, which is cheap here (never take from a view of the whole file).
        values = words.take((at >> 3) + (np.arange(len(starts)) * buf.shape[1])[:, None])
        values >>= (at & 7).astype(word)
        values &= word.type((1 << bits) - 1)
        return values.astype(np.uint32, copy=False)

    def _zstd_rows(self, starts: np.ndarray, length: int) -> np.ndarray:
        enc, bt = self.encoding, self.encoding.block_tokens
        first, last = starts // bt, (starts + length - 1) // bt
        reach = np.arange(int((last - first).max()) + 1)
        needed = np.unique(np.minimum(first[:, None] + reach, last[:, None])).tolist()
        sizes = [self.block_tokens(b) * enc.width for b in needed]
        if self._bytes is not None and self.offsets is not None:  # mapped: each frame a slice of the map
            spans = self.offsets[np.asarray(needed)[:, None] + [0, 1]].tolist()
            frames: list[bytes | memoryview] = [self._bytes[lo:hi] for lo, hi in spans]
        else:
            frames = [self.stored_block(b) for b in needed]
        try:  # every block once, in order, into one buffer of narrow ids (no cache: random rows rarely meet)
            decompress = self._decompressor.decompress
            raw = b"".join([decompress(f, max_output_size=n) for f, n in zip(frames, sizes, strict=True)])
        except Exception:  # (a damaged frame: found and named below)
            raw = b""
        if len(raw) != sum(sizes):  # block by block: a damaged one is named, one without a content size decodes
            tokens = [enc.decode(self.stored_block(b), self.block_tokens(b), partial(block_where, self.where, b, bt),
                                 self._decompressor) for b in needed]  # fmt: skip
            raw = np.concatenate(tokens).view(np.uint8).reshape(-1, 4)[:, : enc.width].tobytes()
        ids = np.frombuffer(raw, dtype=np.uint8)
        ids = ids.view("<u2") if enc.width == 2 else ids.view("<u4") if enc.width == 4 else widen(ids, enc.width)
        # Blocks a row touches are consecutive, all full but a shard's last, so its tokens are
        # one run of `ids` from where its first block landed.
        at = np.searchsorted(np.asarray(needed), first) * bt + (starts - first * bt)
        view = np.lib.stride_tricks.as_strided(ids, shape=(len(ids) - length + 1, length),
                                               strides=(ids.itemsize, ids.itemsize), writeable=False)  # fmt: skip
        out = np.empty((len(starts), length), dtype=np.uint32)
        out[...] = view[at]
        return out


def block_where(where: str, b: int, block_tokens: int) -> str:
    first = b * block_tokens
    return f"{where}: block {b} (tokens {first:,}..{first + block_tokens - 1:,})"


__all__ = ["CACHE_BLOCKS", "TokenFile", "block_where", "check_offsets"]
