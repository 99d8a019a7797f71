"""An lmshard dataset read for export: checked cheaply first, then streamed in blocks of whole
documents with the separator moved to the side the target format wants.

The source is opened read-only and held to its metadata with the format layer's own checks
(`load_metadata`, `check_shard_files`, `check_index`) before any token is read. While the
tokens stream past, two vectorized checks cost nothing extra: the EOT token sits at every
document boundary, and every id is below `n_vocab`. A full `lmshard inspect` (checksums) is
not repeated here.

The shard's tokens are read in whatever encoding the dataset stores them (format/tokenfile.py),
decoded to uint32; a zstd frame that does not decode is an error naming the shard and block.

Memory model: one shard's document index (8 bytes per document) and one block of about
BLOCK_TOKENS tokens (uint32: 64 MiB), or one document when a single document is longer, and
its stored bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError, FormatError
from ..format import (
    INDEX_DTYPE,
    SPLITS,
    DatasetMeta,
    ShardInfo,
    check_index,
    check_shard_files,
    load_metadata,
)
from ..format.tokenfile import TokenFile

BLOCK_TOKENS = 1 << 24  # tokens read per block: 64 MiB of uint32
INSPECT_HINT = "run `lmshard inspect` on it, and re-run `lmshard prepare` with --overwrite if it fails"


@dataclass(frozen=True)
class Block:
    """Whole documents back to back (`tokens`, uint32) and their lengths in tokens, separators
    included (one EOT each, on the side the reader asked for). `origin`, where a reader of
    several files gives it: each document's file (an index into the reader's files) and its
    number in that file, from 1 (a document that runs on into the next file is the first's)."""

    tokens: np.ndarray
    lengths: np.ndarray
    origin: tuple[np.ndarray, np.ndarray] | None = None  # per document: its input file (index) and number there


@dataclass(frozen=True, kw_only=True)
class Job:
    """One export's work: the source, its splits, and where and how the files go."""

    meta: DatasetMeta
    splits: tuple[str, ...]
    root: Path  # the staging directory
    name: str
    tokens_per_shard: int
    eod_id: int | None = None  # the id written at each document end, where it is not the separator
    source: str = ""  # what the provenance names as the source (a URL); default: the dataset directory
    concat_tokens: int | None = None  # mds: samples of this many tokens of the concatenated documents


def open_source(root: str | os.PathLike[str], split: str) -> tuple[DatasetMeta, tuple[str, ...]]:
    """The dataset's metadata, with every shard of the splits to export held to its sizes, and
    those splits: `split` itself, or for `all` every split that has documents."""
    if not Path(root).is_dir():
        raise ConfigError(f"{root}: no such directory")
    meta = load_metadata(root)
    if split == "all":
        splits = tuple(s for s in SPLITS if meta.n_docs(s))
    elif split in SPLITS:
        if not meta.n_docs(split):
            raise ConfigError(f"{root}: the {split} split holds no documents; choose another --split")
        splits = (split,)
    else:
        raise ConfigError(f"--split {split!r}: use train, val or all")
    for name in splits:
        for shard in meta.split_shards(name):
            check_shard_files(meta.root, shard)
    return meta, splits


def blocks(meta: DatasetMeta, split: str, eot_position: str, block_tokens: int | None = None) -> Iterator[Block]:
    """The documents of `split` in order, in blocks of about `block_tokens` tokens, each with its
    EOT token `after` or `before` its text (moved when the dataset has it on the other side; a
    BOS stays right before the text)."""
    size = block_tokens or BLOCK_TOKENS
    for shard in meta.split_shards(split):
        if shard.n_docs:
            yield from shard_blocks(meta, shard, eot_position, size)


def shard_blocks(meta: DatasetMeta, shard: ShardInfo, eot_position: str, size: int) -> Iterator[Block]:
    idx_path = meta.abspath(shard.index_path)
    offsets = np.fromfile(idx_path, dtype=INDEX_DTYPE)  # its size was checked against n_docs
    check_index(idx_path, offsets, shard.n_tokens)
    tokens = TokenFile(meta.root, shard, meta.encoding)  # any encoding, decoded to uint32
    try:
        first = 0
        while first < shard.n_docs:
            start = int(offsets[first])
            # the last document boundary within `size` tokens of the block's start (at least one document)
            last = int(np.searchsorted(offsets, start + size, side="right")) - 1
            last = min(max(last, first + 1), shard.n_docs)
            ends = offsets[first : last + 1].astype(np.int64) - start
            block = tokens.read(start, int(offsets[last]))
            _check(meta, shard, block, ends)
            yield Block(_move_separator(block, ends, meta, eot_position), np.diff(ends))
            first = last
    finally:
        tokens.close()


def _check(meta: DatasetMeta, shard: ShardInfo, block: np.ndarray, ends: np.ndarray) -> None:
    """The two facts an export relies on, checked on the block in hand."""
    eot, n_vocab = meta.tokenizer.eot_id, meta.tokenizer.n_vocab
    at = ends[1:] - 1 if meta.eot_position == "after" else ends[:-1]
    if (missing := int((block[at] != eot).sum())) != 0:
        raise FormatError(f"{meta.abspath(shard.path)}: {missing} document boundaries without the EOT token "
                          f"{eot}; {INSPECT_HINT}")  # fmt: skip
    if len(block) and int(block.max()) >= n_vocab:
        raise FormatError(f"{meta.abspath(shard.path)}: token id {int(block.max())} is not below n_vocab "
                          f"{n_vocab}; {INSPECT_HINT}")  # fmt: skip


def _move_separator(block: np.ndarray, ends: np.ndarray, meta: DatasetMeta, wanted: str) -> np.ndarray:
    """Each document's EOT moved to the `wanted` side: the rest of the document slides one token
    over, so `BOS text EOT` becomes `EOT BOS text` and back."""
    if meta.eot_position == wanted:
        return block
    out = np.empty_like(block)
    eot = meta.tokenizer.eot_id
    if wanted == "before":  # [BOS] text EOT -> EOT [BOS] text
        out[1:] = block[:-1]
        out[ends[:-1]] = eot
    else:  # EOT [BOS] text -> [BOS] text EOT
        out[:-1] = block[1:]
        out[ends[1:] - 1] = eot
    return out
