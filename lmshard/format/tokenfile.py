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
2 KiB per 1 M tokens in 4,096-token blocks) and at most `cache_blocks` decoded blocks
(4 bytes per token each); a read holds the stored bytes of its range.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError
from .bitpack import unpack_bits
from .blocks import block_damage
from .encoding import OFFSETS_DTYPE, Encoding
from .layout import REGENERATE_HINT
from .shard import ShardInfo

CACHE_BLOCKS = 64  # decoded zstd blocks kept per open file: 1 MiB of uint32 at 4,096 tokens each


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

    def __init__(self, root: Path, shard: ShardInfo, encoding: Encoding, cache_blocks: int = CACHE_BLOCKS) -> None:
        self.path, self.shard, self.encoding = root / shard.path, shard, encoding
        self.where = str(self.path)
        self.fd = os.open(self.path, os.O_RDONLY)
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

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._cache.clear()

    def __del__(self) -> None:
        try:  # noqa: SIM105 (module globals may be gone at interpreter shutdown)
            self.close()
        except Exception:
            pass

    def pread(self, lo: int, hi: int) -> bytes:
        """Bytes [lo, hi) of the file; FormatError when the file holds fewer (changed since)."""
        data = os.pread(self.fd, hi - lo, lo)
        if len(data) != hi - lo:
            raise FormatError(f"{self.where}: read {len(data)} of {hi - lo} bytes at byte {lo}; the shard changed "
                              "after it was opened: run `lmshard inspect`")  # fmt: skip
        return data

    def stored_block(self, b: int) -> bytes:
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
        where = block_where(self.where, b, self.encoding.block_tokens)
        tokens = self.encoding.decode(self.stored_block(b), self.block_tokens(b), where, self._decompressor)
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


def block_where(where: str, b: int, block_tokens: int) -> str:
    first = b * block_tokens
    return f"{where}: block {b} (tokens {first:,}..{first + block_tokens - 1:,})"


__all__ = ["CACHE_BLOCKS", "TokenFile", "block_damage", "block_where", "check_offsets"]
