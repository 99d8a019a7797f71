"""Other trainers' token files read as blocks of whole documents, for `lmshard import`
(importer.py): a nanoGPT uint16 file (each document ends right after the EOT id), llm.c and
modded-nanogpt shards (a 1 KiB header, each document starting with the EOT id, and running on
from one shard into the next), and a Megatron-LM IndexedDataset (PREFIX.bin/.idx: each document
its sequences). Every count a file's header gives is held to its size before anything is sized
by it, with llm.c's and Megatron's own checks, and refused in one line naming the file.

Memory model: one block of BLOCK_TOKENS input tokens and its uint32 copy, a document cut by a
block's end (carried to the next), and Megatron's sequence offsets (8 bytes per sequence, as
Megatron's own reader maps them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..format import TOKEN_DTYPE
from .layouts import LLMC_HEADER_BYTES, LLMC_HEADER_INTS, LLMC_V1, LLMC_V7, MEGATRON_HEADER, read_megatron_header
from .source import Block

BLOCK_TOKENS = 1 << 24  # input tokens read at a time


def megatron_files(prefix: Path) -> list[Path]:
    stem = prefix.with_suffix("") if prefix.suffix in (".bin", ".idx") else prefix
    files = [stem.with_name(stem.name + ".bin"), stem.with_name(stem.name + ".idx")]
    for path in files:
        if not path.is_file():
            raise InputError(f"{path}: no such file (a Megatron dataset is PREFIX.bin and PREFIX.idx)")
    return files


def nanogpt_blocks(path: Path, eot: int) -> Iterator[Block]:
    """Documents of a nanoGPT uint16 token file: each ends right after an EOT id."""
    size = path.stat().st_size
    if size % 2:
        raise InputError(f"{path}: {size:,} bytes, not a whole number of uint16 tokens (truncated?)")
    tokens = np.memmap(path, dtype="<u2", mode="r") if size else np.zeros(0, "<u2")
    carry = np.zeros(0, TOKEN_DTYPE)  # the start of a document the previous block cut
    for start in range(0, len(tokens), BLOCK_TOKENS):
        block = np.concatenate([carry, np.asarray(tokens[start : start + BLOCK_TOKENS], dtype=TOKEN_DTYPE)])
        ends = np.flatnonzero(block == eot) + 1
        if len(ends):
            yield Block(block[: ends[-1]], np.diff(ends, prepend=0))
        carry = block[ends[-1] :] if len(ends) else block
    if len(carry):
        raise InputError(f"{path}: the last {len(carry):,} tokens are not followed by the EOT id {eot}; "
                         "a nanoGPT file ends with one (pass --eot-id if its separator is another id)")  # fmt: skip


class LlmcBlocks:
    """Documents of llm.c / modded-nanogpt shards, in file order: each starts with the EOT id,
    and one may run on from a shard into the next (carried over). A split's first shard may
    begin inside a document whose start fineweb.py wrote into the shard before it (the val
    shard, before the first train shard): the tokens before the split's first document start
    are left out, and `partial` is 1 when there were any. A split whose shards hold tokens but
    no document start is refused (the separator id is not the files')."""

    def __init__(self, files: list[Path], eot: int, fmt: str, split: str = "train") -> None:
        self.files, self.eot, self.fmt, self.split, self.partial = files, eot, fmt, split, 0

    def __iter__(self) -> Iterator[Block]:
        carry, started, dropped = np.zeros(0, TOKEN_DTYPE), False, 0
        carried = (0, 0)  # the carried document's file and number there
        for k, path in enumerate(self.files):
            in_file = 0  # the documents this file has started so far
            dtype, n_tokens = llmc_header(path, self.fmt)
            tokens = np.memmap(path, dtype=dtype, mode="r", offset=LLMC_HEADER_BYTES, shape=(n_tokens,)) \
                if n_tokens else np.zeros(0, dtype)  # fmt: skip
            for start in range(0, n_tokens, BLOCK_TOKENS):
                block = np.concatenate([carry, np.asarray(tokens[start : start + BLOCK_TOKENS], dtype=TOKEN_DTYPE)])
                starts = np.flatnonzero(block == self.eot)
                if not started and len(starts):  # the tail of a document begun before this split
                    dropped += int(starts[0])
                    self.partial, started = int(dropped > 0), True
                    block, starts = block[starts[0] :], starts - starts[0]
                if not started:
                    dropped += len(block)
                    carry = np.zeros(0, TOKEN_DTYPE)
                    continue
                inherited = int(len(carry) > 0)  # a carry begins with its document's start: the first of `starts`
                files = np.full(len(starts), k, dtype=np.int64)
                numbers = in_file + 1 - inherited + np.arange(len(starts), dtype=np.int64)
                if inherited:
                    files[0], numbers[0] = carried
                in_file += len(starts) - inherited
                if len(starts) > 1:
                    yield Block(block[: starts[-1]], np.diff(starts), (files[:-1], numbers[:-1]))
                if len(starts):
                    carried = (int(files[-1]), int(numbers[-1]))
                carry = block[starts[-1] :] if len(starts) else block
        if len(carry):
            yield Block(carry, np.array([len(carry)]), (np.array([carried[0]]), np.array([carried[1]])))
        if not started and dropped:
            raise InputError(f"{self.files[0]}: the {self.split} shards hold {dropped:,} tokens but no document start "
                             f"(the id {self.eot}); pass --eot-id with the id that begins each document (llm.c's "
                             "GPT-2 shards: 50256; Llama 3: 128000)")  # fmt: skip


def llmc_header(path: Path, fmt: str) -> tuple[np.dtype, int]:
    """(token dtype, token count) of an llm.c shard, held to its size: llm.c's own checks."""
    header = np.fromfile(path, dtype="<i4", count=LLMC_HEADER_INTS)
    if len(header) < LLMC_HEADER_INTS:
        raise InputError(f"{path}: {path.stat().st_size:,} bytes, shorter than an llm.c header (1,024)")
    kinds: list[tuple[int, int, np.dtype]] = [LLMC_V1] if fmt == "modded-nanogpt" else [LLMC_V1, LLMC_V7]
    kind = next((k for k in kinds if (int(header[0]), int(header[1])) == k[:2]), None)
    if kind is None:
        known = ", ".join(f"magic {m} version {v}" for m, v, _ in kinds)
        raise InputError(f"{path}: magic {int(header[0])} version {int(header[1])}, not a {fmt} shard ({known})")
    n_tokens, dtype = int(header[2]), np.dtype(kind[2])
    if path.stat().st_size != LLMC_HEADER_BYTES + n_tokens * dtype.itemsize:
        raise InputError(f"{path}: {path.stat().st_size:,} bytes, but its header says {n_tokens:,} {dtype.name} "
                         f"tokens ({LLMC_HEADER_BYTES + n_tokens * dtype.itemsize:,} bytes with the header): "
                         "truncated?")  # fmt: skip
    return dtype, n_tokens


def megatron_blocks(bin_path: Path, idx_path: Path) -> Iterator[Block]:
    """Documents of a Megatron IndexedDataset, each the concatenation of its sequences."""
    dtype, seq_starts, doc_idx = megatron_index(bin_path, idx_path)
    starts = seq_starts[doc_idx]  # token offset of each document's start, and the end
    tokens = np.memmap(bin_path, dtype=dtype, mode="r") if seq_starts[-1] else np.zeros(0, dtype)
    first, n_docs = 0, len(starts) - 1
    while first < n_docs:
        last = int(np.searchsorted(starts, starts[first] + BLOCK_TOKENS, side="right")) - 1
        last = min(max(last, first + 1), n_docs)
        ends = starts[first : last + 1] - starts[first]
        block = np.asarray(tokens[starts[first] : starts[last]])
        if len(block) and (int(block.min()) < 0):
            raise InputError(f"{bin_path}: negative token id {int(block.min())}")
        yield Block(block.astype(TOKEN_DTYPE), np.diff(ends))  # empty documents (length 0) included
        first = last


def megatron_index(bin_path: Path, idx_path: Path) -> tuple[np.dtype, np.ndarray, np.ndarray]:
    """(token dtype, token offset of each sequence plus the end, document indices), every
    count held to the file sizes before an array is sized by it."""
    with open(idx_path, "rb") as f:
        dtype, n_seq, n_doc_idx = read_megatron_header(str(idx_path), f.read(MEGATRON_HEADER.size))
    expected = MEGATRON_HEADER.size + 12 * n_seq + 8 * n_doc_idx
    if (size := idx_path.stat().st_size) != expected:
        extra = " (multimodal sequence modes are not supported)" if size == expected + n_seq else ""
        raise InputError(f"{idx_path}: {size:,} bytes, but its header's counts ({n_seq:,} sequences, {n_doc_idx:,} "
                         f"document indices) mean {expected:,}{extra}")  # fmt: skip
    at = MEGATRON_HEADER.size
    lengths = np.fromfile(idx_path, dtype="<i4", count=n_seq, offset=at).astype(np.int64)
    pointers = np.fromfile(idx_path, dtype="<i8", count=n_seq, offset=at + 4 * n_seq)
    doc_idx = np.fromfile(idx_path, dtype="<i8", count=n_doc_idx, offset=at + 12 * n_seq)
    seq_starts = np.concatenate([[0], np.cumsum(lengths)])
    if (lengths < 0).any() or not np.array_equal(pointers, seq_starts[:-1] * dtype.itemsize):
        raise InputError(f"{idx_path}: sequence lengths and byte pointers do not describe one contiguous .bin")
    if bin_path.stat().st_size != int(seq_starts[-1]) * dtype.itemsize:
        raise InputError(f"{bin_path}: {bin_path.stat().st_size:,} bytes, but {idx_path.name} describes "
                         f"{int(seq_starts[-1]):,} {dtype.name} tokens ({int(seq_starts[-1]) * dtype.itemsize:,} "
                         "bytes): truncated or not its .bin")  # fmt: skip
    if not len(doc_idx) or doc_idx[0] != 0 or doc_idx[-1] != n_seq or (np.diff(doc_idx) < 0).any():
        raise InputError(f"{idx_path}: document indices do not run from 0 up to the sequence count {n_seq}")
    return dtype, seq_starts, doc_idx
