"""Sealing a shard's token file in its encoding: the tokens a writer streamed to a uint32
temporary file are encoded block by block into the final file, beside its block sums (and, for
a compressed encoding, its block offsets), and the uint32 file is removed.

Every writer (prepare's shard writer, the owners of a planned run, `import`, `convert`) builds
its shards as uint32 first and calls `seal_encoded`: one encoder, so a dataset's bytes do not
depend on which path wrote it. A uint32 dataset is never re-encoded (its writers hash as they
write).

Crash safety: the encoded file is written as `NAME.bin.PID.tmp`, fsynced, and renamed over
`NAME.bin` only after its `.sums` and `.blocks` are in place; the uint32 temporary file is
removed last, so a kill at any point leaves either the uint32 file to seal again or a sealed
shard.

Memory model: one chunk of CHUNK_TOKENS tokens (4 bytes each) and its encoded bytes.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .blocks import SUMS_DTYPE, _xxhash, file_xxh3, sums_path, write_sums
from .encoding import OFFSETS_DTYPE, Encoding, blocks_path
from .layout import TOKEN_DTYPE
from .shard import ShardInfo

CHUNK_TOKENS = 1 << 20  # tokens read at a time (the encoder carries a block that two reads split)
FRAMES_AT_ONCE = 256  # zstd blocks compressed together, in parallel


@dataclass(frozen=True)
class Sealed:
    n_bytes: int
    xxh3_64: str
    sums_xxh3_64: str
    blocks_xxh3_64: str = ""


class StreamEncoder:
    """Encodes a shard's tokens as they are written: fed its uint32 bytes in pieces of any size
    (`update`, as a running checksum is), it encodes each block once it is whole into `NAME.bin.PID.tmp`,
    hashing it as it goes; `seal` encodes the last block, puts the `.sums` (and `.blocks`) in
    place, renames the encoded file over `final` and removes the uint32 file. A writer that feeds
    it while it writes never reads its tokens back, and never waits for a whole shard's encoding.

    Memory model: one block of pending uint32 bytes, up to FRAMES_AT_ONCE zstd blocks waiting to
    be compressed together (768 KiB of 3-byte ids at most), and the block sums and offsets
    (16 bytes per block)."""

    def __init__(self, final: Path, encoding: Encoding) -> None:
        self.final, self.encoding = final, encoding
        self.out = Path(f"{final}.{os.getpid()}.tmp")
        self._file = open(self.out, "wb")  # noqa: SIM115 (closed by seal or close)
        self._xxhash = _xxhash()
        self._digest, self._sums, self._offsets = self._xxhash.xxh3_64(), list[int](), [0]
        self._compressor: Any = encoding.compressor() if encoding.compressed else None
        self._pending = bytearray()
        self._block_bytes = encoding.block_tokens * TOKEN_DTYPE.itemsize
        self._frames: list[bytes] = []  # zstd blocks waiting to be compressed together
        self._threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1

    def update(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        if self._pending:  # complete the block begun by an earlier piece
            take = min(len(view), self._block_bytes - len(self._pending))
            self._pending += view[:take]
            view = view[take:]
            if len(self._pending) < self._block_bytes:
                return
            self._block(np.frombuffer(bytes(self._pending), dtype=TOKEN_DTYPE))
            self._pending.clear()
        whole = len(view) - len(view) % self._block_bytes
        tokens = np.frombuffer(view[:whole], dtype=TOKEN_DTYPE)
        bt = self.encoding.block_tokens
        for b in range(0, len(tokens), bt):
            self._block(tokens[b : b + bt])
        self._pending += view[whole:]

    def _block(self, tokens: np.ndarray) -> None:
        if self._compressor is None:
            self._stored(self.encoding.encode(tokens))
            return
        self._frames.append(self.encoding.narrow(tokens))
        if len(self._frames) >= FRAMES_AT_ONCE:
            self._compress()

    def _compress(self) -> None:
        """The pending zstd frames, compressed on the threads this process may use (independent
        frames: the same bytes as one by one)."""
        if self._frames and self._compressor is not None:
            done = self._compressor.multi_compress_to_buffer(self._frames, threads=self._threads)
            for i in range(len(done)):
                self._stored(done[i].tobytes())
            self._frames.clear()

    def _stored(self, data: bytes) -> None:
        self._file.write(data)
        self._digest.update(data)
        self._sums.append(self._xxhash.xxh3_64_intdigest(data))
        self._offsets.append(self._offsets[-1] + len(data))

    def seal(self, rel: str, tmp: Path | None) -> Sealed:
        """Finish the file and put the shard in place (see the class docstring); `rel`: the
        shard's path relative to the dataset; `tmp`: the uint32 file, removed last."""
        if self._pending:
            self._block(np.frombuffer(bytes(self._pending), dtype=TOKEN_DTYPE))
            self._pending.clear()
        self._compress()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        root = self.final.parent
        sums_bytes = np.array(self._sums, dtype=SUMS_DTYPE).tobytes()
        write_sums(root / Path(sums_path(rel)).name, sums_bytes)
        blocks_hex = ""
        if self.encoding.compressed:
            blocks_bytes = np.array(self._offsets, dtype=OFFSETS_DTYPE).tobytes()
            write_sums(root / Path(blocks_path(rel)).name, blocks_bytes)
            blocks_hex = self._xxhash.xxh3_64_hexdigest(blocks_bytes)
        os.replace(self.out, self.final)
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        xxh3 = self._xxhash.xxh3_64_hexdigest
        return Sealed(self._offsets[-1], self._digest.hexdigest(), xxh3(sums_bytes), blocks_hex)

    def close(self) -> None:
        """Stop without sealing (the encoded part is left as a PID-named temporary file)."""
        with contextlib.suppress(OSError):
            self._file.close()


def seal_encoded(tmp: Path, final: Path, rel: str, encoding: Encoding, n_tokens: int) -> Sealed:
    """Encode the uint32 file `tmp` (n_tokens tokens) into `final` (the shard's `.bin`, whose path
    relative to the dataset is `rel`), writing its `.sums` and `.blocks` beside it. When `tmp` is
    gone and `final` exists, another task sealed it a moment ago: its files are read back."""
    root = final.parent
    if not tmp.exists() and final.exists():
        blocks_file = root / Path(blocks_path(rel)).name if encoding.compressed else None
        return _read_back(final, root / Path(sums_path(rel)).name, blocks_file)
    encoder = StreamEncoder(final, encoding)
    try:
        with open(tmp, "rb") as src:
            for start in range(0, n_tokens, CHUNK_TOKENS):
                count = min(CHUNK_TOKENS, n_tokens - start)
                data = src.read(count * TOKEN_DTYPE.itemsize)
                if len(data) != count * TOKEN_DTYPE.itemsize:
                    raise OSError(f"{tmp}: holds fewer than the {n_tokens:,} tokens written to it")
                encoder.update(data)
    except BaseException:
        encoder.close()
        raise
    return encoder.seal(rel, tmp)


def _read_back(final: Path, sums_file: Path, blocks_file: Path | None) -> Sealed:
    return Sealed(final.stat().st_size, file_xxh3(final), file_xxh3(sums_file),
                  file_xxh3(blocks_file) if blocks_file else "")  # fmt: skip


def shard_entry(split: str, bin_rel: str, idx_rel: str, n_tokens: int, n_docs: int, index_xxh3: str,
                encoding: Encoding, sealed: Sealed) -> ShardInfo:  # fmt: skip
    """The metadata entry of a shard sealed in a version 2 encoding."""
    return ShardInfo(split=split, path=bin_rel, index_path=idx_rel, n_tokens=n_tokens, n_docs=n_docs,
                     xxh3_64=sealed.xxh3_64, index_xxh3_64=index_xxh3, sums_path=sums_path(bin_rel),
                     block_tokens=encoding.block_tokens, sums_xxh3_64=sealed.sums_xxh3_64, n_bytes=sealed.n_bytes,
                     blocks_path=blocks_path(bin_rel) if encoding.compressed else "",
                     blocks_xxh3_64=sealed.blocks_xxh3_64)  # fmt: skip
