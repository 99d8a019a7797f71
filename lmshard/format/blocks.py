"""Per-block checksums of a shard's tokens: a damaged byte is found at its block, without
reading the rest of the shard.

A shard's token file is cut into blocks of `BLOCK_TOKENS` tokens (64 KiB of uint32; the last
block may be shorter). `shard_000000.sums` beside the shard holds one little-endian uint64 per
block, the xxh3-64 of the block's bytes; the metadata's shard entry names it (`sums_path`), its
block size (`block_tokens`) and its own xxh3-64 (`sums_xxh3_64`). Datasets written before these
fields, or by other tools, have no sums: readers check them where present and read on without.

64 KiB is the remote loader's smallest read: a random row of 1,025 tokens touches one or two
blocks, so verifying it costs at most 128 KiB of transfer, and the sums add 8 bytes per 64 KiB
(0.012%) to a dataset.

Memory model: `BlockHasher` holds one running digest and the finished blocks' sums (8 bytes per
64 KiB of tokens); `check_blocks` the blocks it is given.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import FormatError

BLOCK_TOKENS = 1 << 14
SUMS_DTYPE = np.dtype("<u8")
TOKEN_BYTES = 4


def sums_path(bin_rel: str) -> str:
    """The checksum file of the token file `bin_rel` (train/shard_000000.bin → .sums)."""
    return bin_rel.removesuffix(".bin") + ".sums"


def n_blocks(n_tokens: int, block_tokens: int = BLOCK_TOKENS) -> int:
    return -(-n_tokens // block_tokens)


def _xxhash():  # noqa: ANN202 (imported on first use: a local loader never hashes, and needs only numpy)
    import xxhash

    return xxhash


class BlockHasher:
    """The xxh3-64 of each `block_tokens`-token block of a byte stream fed in pieces of any size."""

    def __init__(self, block_tokens: int = BLOCK_TOKENS) -> None:
        self.block_bytes = block_tokens * TOKEN_BYTES
        self._digest = _xxhash().xxh3_64()
        self._filled = 0
        self._sums: list[int] = []

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            take = min(len(view), self.block_bytes - self._filled)
            self._digest.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self.block_bytes:
                self._sums.append(self._digest.intdigest())
                self._digest.reset()
                self._filled = 0

    def finish(self) -> bytes:
        """The sums file's bytes: every block's sum, the partial last block included."""
        sums = list(self._sums)
        if self._filled:
            sums.append(self._digest.intdigest())
        return np.array(sums, dtype=SUMS_DTYPE).tobytes()


def write_sums(path: Path, data: bytes) -> None:
    """Write a sums file to `NAME.sums.PID.tmp` (a name a resumed build recognises and clears,
    where a random temporary name would be left behind by a kill; the pid keeps two tasks that
    seal the same shard at once apart), made durable, then renamed into place."""
    tmp = Path(f"{path}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def block_sums(data: bytes | memoryview | np.ndarray, block_tokens: int = BLOCK_TOKENS) -> bytes:
    hasher = BlockHasher(block_tokens)
    hasher.update(np.ascontiguousarray(data).data if isinstance(data, np.ndarray) else data)
    return hasher.finish()


def bytes_xxh3(data: bytes | memoryview) -> str:
    """The xxh3-64 (hex) of bytes in memory, as the metadata records a file's."""
    return str(_xxhash().xxh3_64_hexdigest(data))


def file_xxh3(path: Path) -> str:
    """The xxh3-64 (hex) of a file's bytes, read in 8 MiB pieces: the checksum the metadata
    records for a shard, an index or a key file."""
    h = _xxhash().xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return str(h.hexdigest())


def check_blocks(where: str, data: bytes | memoryview | np.ndarray, first_block: int, sums: np.ndarray,
                 block_tokens: int) -> None:  # fmt: skip
    """FormatError naming `where` and the first block whose bytes do not match its sum. `data` holds
    whole blocks from `first_block` on (the last block of the shard may be short)."""
    view = (np.ascontiguousarray(data).data if isinstance(data, np.ndarray) else memoryview(data)).cast("B")
    size, xxhash = block_tokens * TOKEN_BYTES, _xxhash()
    for i, at in enumerate(range(0, len(view), size)):
        k = first_block + i
        got = xxhash.xxh3_64_intdigest(view[at : at + size])
        if k >= len(sums) or got != int(sums[k]):
            raise FormatError(block_damage(where, k, block_tokens))


def block_damage(where: str, block: int, block_tokens: int) -> str:
    first = block * block_tokens
    return (f"{where}: block {block} (tokens {first:,}..{first + block_tokens - 1:,}) does not match its checksum: "
            "the data is damaged; run `lmshard inspect` on the dataset, and fetch or regenerate it")  # fmt: skip
