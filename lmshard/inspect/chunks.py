"""A shard's token file read in checked chunks, whatever its encoding: the loop `lmshard inspect`
verifies a shard with and `lmshard convert` copies one with.

Each chunk is a run of whole checksum blocks (`.sums`: the xxh3-64 of each block's stored
bytes), read with one `pread`; every block's bytes are held to its sum, then decoded (the
fixed-width encodings as one run, zstd frame by frame). A damaged block is named by its number
and a frame that does not decode is left out of the decoded runs, so the rest of the chunk is
still checked. A zstd shard's block offsets are held to their recorded checksum before they
locate anything.

Memory model: one chunk's stored bytes and its decoded tokens (4 bytes each), and the scratch
of decoding DECODE_TOKENS of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import xxhash

from ..errors import FormatError
from ..format import REGENERATE_HINT, DatasetMeta, ShardInfo, file_xxh3
from ..format.tokenfile import TokenFile

DECODE_TOKENS = 1 << 20  # tokens unpacked at a time: a packed run takes ~32 bytes of scratch per token


def open_tokens(meta: DatasetMeta, shard: ShardInfo) -> TokenFile:
    """The shard's token file, opened to be read block by block. FormatError naming the file
    when a compressed shard's block offsets (`.blocks`) differ from their recorded checksum or
    do not run from 0 to the file's size."""
    if shard.blocks_path:
        path = meta.abspath(shard.blocks_path)
        if (digest := file_xxh3(path)) != shard.blocks_xxh3_64:
            raise FormatError(f"{path}: checksum {digest} != {shard.blocks_xxh3_64} in metadata (corrupt block "
                              f"offsets); {REGENERATE_HINT}")  # fmt: skip
    return TokenFile(meta.root, shard, meta.encoding, cache_blocks=0)


def read_sums(meta: DatasetMeta, shard: ShardInfo) -> np.ndarray | None:
    """The shard's per-block sums (their size checked by `check_shard_files`), held to their own
    recorded checksum; None where the dataset keeps none. FormatError naming the file when they
    differ."""
    if not shard.sums_path:
        return None
    path = meta.abspath(shard.sums_path)
    raw = path.read_bytes()
    if (digest := xxhash.xxh3_64_hexdigest(raw)) != shard.sums_xxh3_64:
        raise FormatError(f"{path}: checksum {digest} != {shard.sums_xxh3_64} in metadata (corrupt block sums); "
                          f"{REGENERATE_HINT}")  # fmt: skip
    return np.frombuffer(raw, dtype="<u8")


def block_size(meta: DatasetMeta, shard: ShardInfo) -> int:
    """Tokens per checksum block: the shard's recorded size, else its encoding's."""
    return shard.block_tokens or meta.encoding.block_tokens


@dataclass(frozen=True)
class Chunk:
    """Whole blocks of a shard as stored (`data`), what each block's bytes say, and the tokens
    they decode to: `runs` of (first token, uint32 tokens), one per stretch of blocks that
    decode (a damaged zstd frame does not)."""

    data: bytes | memoryview
    runs: list[tuple[int, np.ndarray]]
    damaged: list[int]  # blocks whose stored bytes differ from their sum
    undecodable: list[int]  # blocks that do not decode


def stored_chunks(file: TokenFile, sums: np.ndarray | None, size: int, chunk_tokens: int) -> Iterator[Chunk]:
    """The shard in chunks of whole `size`-token blocks, about `chunk_tokens` tokens each, each
    block's stored bytes held to its sum (where `sums` is given) and decoded."""
    n_tokens, enc = file.shard.n_tokens, file.encoding
    n_blocks, per, decompressor = -(-n_tokens // size), max(1, chunk_tokens // size), None
    if file.offsets is not None:  # byte offsets of the blocks and the end; fixed width: by arithmetic
        bounds, decompressor = file.offsets, enc.decompressor()
    else:
        bounds = (np.minimum(np.arange(n_blocks + 1, dtype=np.int64) * size, n_tokens) * enc.bits + 7) // 8
    for first in range(0, n_blocks, per):
        ks, base = range(first, min(first + per, n_blocks)), int(bounds[first])
        data = file.pread(base, int(bounds[ks[-1] + 1]))
        view, cut = memoryview(data), [int(x) - base for x in bounds[first : ks[-1] + 2]]
        damaged = [k for i, k in enumerate(ks) if sums is not None and (k >= len(sums) or int(sums[k])
                   != xxhash.xxh3_64_intdigest(view[cut[i] : cut[i + 1]]))]  # fmt: skip
        start, end = first * size, min((ks[-1] + 1) * size, n_tokens)
        tokens, undecodable = np.empty(end - start, np.uint32), []
        if decompressor is None:  # fixed width: one run, decoded a piece of whole blocks at a time
            step = max(1, DECODE_TOKENS // size) * size
            for at in range(0, end - start, step):
                n, lo = min(step, end - start - at), at * enc.bits // 8  # (a block starts on a byte)
                tokens[at : at + n] = enc.decode(view[lo : lo + enc.n_bytes(n)], n)
            yield Chunk(data, [(start, tokens)], damaged, [])
            continue
        for i, k in enumerate(ks):
            at = k * size - start
            try:
                tokens[at : at + file.block_tokens(k)] = enc.decode(view[cut[i] : cut[i + 1]], file.block_tokens(k),
                                                                    "", decompressor)  # fmt: skip
            except FormatError:
                undecodable.append(k)
        yield Chunk(data, _runs(tokens, start, [(k * size, (k + 1) * size) for k in undecodable]), damaged, undecodable)


def _runs(tokens: np.ndarray, start: int, holes: list[tuple[int, int]]) -> list[tuple[int, np.ndarray]]:
    """(first token, tokens) of each stretch of `tokens` (which begin at token `start`) between
    the `holes` (token ranges, in order)."""
    runs, at, end = [], start, start + len(tokens)
    for lo, hi in [*holes, (end, end)]:
        if lo > at:
            runs.append((at, tokens[at - start : lo - start]))
        at = min(hi, end)
    return runs
