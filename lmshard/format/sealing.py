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
shard (which `reopen_sealed` turns back into the uint32 file when a resumed run must extend it).

Memory model: one chunk of CHUNK_TOKENS tokens (4 bytes each) and its encoded bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .blocks import SUMS_DTYPE, _xxhash, sums_path, write_sums
from .encoding import OFFSETS_DTYPE, Encoding, blocks_path, widen
from .layout import TOKEN_DTYPE
from .shard import ShardInfo

CHUNK_TOKENS = 1 << 20  # a multiple of every encoding's block size


@dataclass(frozen=True)
class Sealed:
    n_bytes: int
    xxh3_64: str
    sums_xxh3_64: str
    blocks_xxh3_64: str = ""


def seal_encoded(tmp: Path, final: Path, rel: str, encoding: Encoding, n_tokens: int) -> Sealed:
    """Encode the uint32 file `tmp` (n_tokens tokens) into `final` (the shard's `.bin`, whose path
    relative to the dataset is `rel`), writing its `.sums` and `.blocks` beside it. When `tmp` is
    gone and `final` exists, another task sealed it a moment ago: its files are read back."""
    root = final.parent
    sums_file, blocks_file = root / Path(sums_path(rel)).name, root / Path(blocks_path(rel)).name
    if not tmp.exists() and final.exists():
        return _read_back(final, sums_file, blocks_file if encoding.compressed else None)
    xxhash = _xxhash()
    digest, sums, offsets = xxhash.xxh3_64(), [], [0]
    compressor = encoding.compressor() if encoding.compressed else None
    bt, at = encoding.block_tokens, 0
    out = Path(f"{final}.{os.getpid()}.tmp")
    with open(tmp, "rb") as src, open(out, "wb") as dst:
        for start in range(0, n_tokens, CHUNK_TOKENS):
            count = min(CHUNK_TOKENS, n_tokens - start)
            tokens = np.frombuffer(src.read(count * TOKEN_DTYPE.itemsize), dtype=TOKEN_DTYPE)
            if len(tokens) != count:
                raise OSError(f"{tmp}: holds fewer than the {n_tokens:,} tokens written to it")
            for b in range(0, count, bt):
                data = encoding.encode(tokens[b : b + bt], compressor)
                dst.write(data)
                digest.update(data)
                sums.append(xxhash.xxh3_64_intdigest(data))
                at += len(data)
                offsets.append(at)
        dst.flush()
        os.fsync(dst.fileno())
    sums_bytes = np.array(sums, dtype=SUMS_DTYPE).tobytes()
    write_sums(sums_file, sums_bytes)
    blocks_hex = ""
    if encoding.compressed:
        blocks_bytes = np.array(offsets, dtype=OFFSETS_DTYPE).tobytes()
        write_sums(blocks_file, blocks_bytes)
        blocks_hex = xxhash.xxh3_64_hexdigest(blocks_bytes)
    os.replace(out, final)
    tmp.unlink()
    return Sealed(at, digest.hexdigest(), xxhash.xxh3_64_hexdigest(sums_bytes), blocks_hex)


def _read_back(final: Path, sums_file: Path, blocks_file: Path | None) -> Sealed:
    from .blocks import file_xxh3

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


def reopen_sealed(final: Path, encoding: Encoding, n_tokens: int, tmp: Path) -> None:
    """Write the first `n_tokens` tokens of the sealed token file `final` back to the uint32 file
    `tmp`, for a resumed writer to extend (it was sealed after the checkpoint it goes on from)."""
    bt = encoding.block_tokens
    offsets = np.fromfile(final.with_suffix(".blocks"), dtype=OFFSETS_DTYPE) if encoding.compressed else None
    decompressor = encoding.decompressor() if encoding.compressed else None
    with open(final, "rb") as src, open(tmp, "wb") as dst:
        for b in range(-(-n_tokens // bt)):
            count = min(bt, n_tokens - b * bt)
            lo, hi = encoding.block_span(b, b * bt + count, offsets)
            src.seek(lo)
            data = src.read(hi - lo)
            if decompressor is not None:  # the block may hold more than the checkpoint's tokens
                tokens = widen(np.frombuffer(decompressor.decompress(data), dtype=np.uint8), encoding.width)[:count]
            else:
                tokens = encoding.decode(data, count, str(final))
            dst.write(tokens.tobytes())
        dst.flush()
        os.fsync(dst.fileno())
