"""`lmshard convert`: a dataset rewritten in another shard encoding (uint32, uint16, packed, zstd;
docs/format.md), any to any, so a dataset prepared in one need not be prepared again.

Only the token files change. The tokenizer state, the vocabulary copy, the dedup key files and
the document indexes are copied byte for byte (each checksummed file held to its checksum), and
the metadata is the source's with a new `encoding` (and so `format_version`) and new shard
entries. Each shard is read in chunks of whole blocks, every block held to the source's block
sums (a damaged source is refused, never re-encoded into a dataset that would verify), decoded
to a uint32 temporary file and sealed in the new encoding by the same code every writer uses
(`format/sealing.py`): uint32 → zstd → uint32 gives back the same bytes.

Before the metadata is written, every converted shard is read back from disk, held to its new
block sums and compared, token for token, with the source. The output is built in a staging
directory beside `--out` that replaces it only when complete and verified (`output.staged_output`):
an existing `--out` is replaced only with `overwrite`, and files of the user's in it are kept.

Memory model: one chunk of CHUNK_TOKENS tokens of the source (its stored bytes and its uint32
tokens) and, while verifying, the same chunk of both datasets; sealing holds one chunk of its own.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import xxhash

from .. import __version__
from ..errors import ConfigError, FormatError
from ..format import (
    METADATA_FILE,
    REGENERATE_HINT,
    TOKENIZER_FILE,
    VOCAB_COPIES,
    DatasetMeta,
    Encoding,
    RunInfo,
    ShardInfo,
    SplitInfo,
    atomic_write_json,
    block_damage,
    check_index,
    check_shard_files,
    dataset_file_size,
    file_xxh3,
    load_metadata,
)
from ..format.dictionary import spread, train
from ..format.layout import INDEX_DTYPE, TOKEN_DTYPE
from ..format.sealing import seal_encoded, shard_entry
from ..format.tokenfile import TokenFile
from ..inspect.chunks import Chunk, block_size, open_tokens, read_sums, stored_chunks
from ..remote.urls import is_url, redact
from .output import staged_output

CHUNK_TOKENS = 1 << 22  # tokens read, decoded and compared at a time: 16 MiB of uint32


@dataclasses.dataclass(frozen=True)
class ConvertResult:
    """What a conversion wrote: the new dataset's metadata (its root: `--out`), and the source's."""

    meta: DatasetMeta
    source: DatasetMeta


def convert_dataset(dataset: str | os.PathLike[str], to: str, out: str | os.PathLike[str], *,
                    overwrite: bool = False, dictionary: bool = True) -> ConvertResult:  # fmt: skip
    """Write the dataset at `dataset` to `out` with its shards in encoding `to`, verified.
    zstd frames are compressed with a dictionary trained from the train split's tokens (evenly
    spaced runs of it: format/dictionary.py), or without one when `dictionary` is False (as
    datasets before format version 3 were).

        convert_dataset("data/owt", "zstd", "data/owt_zstd")

    ConfigError (one line) for a URL, an encoding that cannot hold the vocabulary (uint16 above
    65,536 ids) or an existing `out` without `overwrite`; FormatError for a damaged source."""
    for what, path in (("DATASET", dataset), ("--out", out)):
        if is_url(str(path)):
            raise ConfigError(f"{redact(str(path))}: convert reads and writes local directories only ({what}); "
                              "copy the dataset here, convert it, and upload the result")  # fmt: skip
    if not Path(dataset).is_dir():
        raise ConfigError(f"{dataset}: no such directory")
    meta = load_metadata(dataset)
    encoding = _target(to, meta, dictionary)
    for shard in meta.shards:
        check_shard_files(meta.root, shard)
    with staged_output(out, overwrite, [meta.root], flag="--overwrite") as staging:
        _copy_small_files(meta, staging)
        shards = [_convert_shard(meta, shard, staging, encoding) for shard in meta.shards]
        splits = {name: SplitInfo.of(tuple(s for s in shards if s.split == name)) for name in meta.splits}
        config = {**meta.config, "shard_encoding": encoding.name} if meta.config else meta.config
        step = RunInfo.step("convert", time.time(), meta.total_docs, meta.total_tokens, __version__,
                            encoding=encoding.name)  # fmt: skip
        run = dataclasses.replace(meta.run, lineage=(*RunInfo.history(meta), step))
        new = dataclasses.replace(meta, root=staging, encoding=encoding, splits=splits, config=config, run=run)
        for shard, converted in zip(meta.shards, shards, strict=True):
            _compare(meta, shard, new, converted)
        atomic_write_json(staging / METADATA_FILE, new.to_json())  # last: its presence means complete
        load_metadata(staging)  # the metadata as any reader will parse it
    return ConvertResult(dataclasses.replace(new, root=Path(os.path.realpath(out))), meta)


def _target(to: str, meta: DatasetMeta, dictionary: bool) -> Encoding:
    """The encoding `to` for the dataset's vocabulary, zstd with its dictionary; ConfigError
    naming --to."""
    encoding = Encoding.choose(to, meta.tokenizer.n_vocab, flag="--to")
    if not encoding.compressed or not dictionary:
        return encoding
    train_tokens = sum(s.n_tokens for s in meta.split_shards("train"))
    sample = np.zeros(0, np.uint32)
    if train_tokens:
        from ..runtime.dataset import TokenDataset

        ds = TokenDataset(meta.root, "train")
        sample = np.concatenate([np.asarray(ds.tokens(offset, n), np.uint32) for offset, n in spread(ds.n_tokens)])
    return encoding.with_dictionary(train(sample, encoding))


def _copy_small_files(meta: DatasetMeta, staging: Path) -> None:
    """The tokenizer state, the vocabulary copy (where the dataset keeps one) and the dedup key
    files, byte for byte; a key file must match its recorded checksum."""
    rels = [TOKENIZER_FILE]
    copy = VOCAB_COPIES.get(meta.tokenizer.vocab_format)
    if copy is not None and (meta.root / copy).exists():
        rels.append(copy)
    for rel in rels:
        copy_checked(meta, rel, staging)
    for key_file in meta.dedup.files if meta.dedup else ():
        copy_checked(meta, key_file.path, staging, key_file.xxh3_64)


def copy_checked(meta: DatasetMeta, rel: str, staging: Path, xxh3_64: str = "") -> None:
    dataset_file_size(meta.root, rel)  # a regular file inside the dataset (symlinks resolved)
    dest = staging / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(meta.root / rel, dest)
    if xxh3_64 and (digest := file_xxh3(dest)) != xxh3_64:
        raise FormatError(f"{meta.root / rel}: checksum {digest} != {xxh3_64} in the metadata (damaged); run "
                          f"`lmshard inspect` on it; {REGENERATE_HINT}")  # fmt: skip


def _convert_shard(meta: DatasetMeta, shard: ShardInfo, staging: Path, encoding: Encoding) -> ShardInfo:
    """One shard in `encoding` under `staging`: its index copied (and checked), its tokens
    decoded from the source, checked, written as uint32 and sealed."""
    copy_checked(meta, shard.index_path, staging, shard.index_xxh3_64)
    if shard.src_path:  # (its documents' provenance: the same documents, in the same order)
        copy_checked(meta, shard.src_path, staging, shard.src_xxh3_64)
    if shard.attr_path:  # (and their attributes)
        copy_checked(meta, shard.attr_path, staging, shard.attr_xxh3_64)
    idx = staging / shard.index_path
    check_index(meta.abspath(shard.index_path), np.fromfile(idx, dtype=INDEX_DTYPE), shard.n_tokens)
    tmp, final = Path(f"{staging / shard.path}.tmp"), staging / shard.path
    with open(tmp, "wb") as f:
        for chunk in checked_chunks(meta, shard, "the source"):
            for _, tokens in chunk.runs:
                f.write(np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE).data)
        f.flush()
        os.fsync(f.fileno())
    sealed = seal_encoded(tmp, final, shard.path, encoding, shard.n_tokens)
    entry = shard_entry(shard.split, shard.path, shard.index_path, shard.n_tokens, shard.n_docs, shard.index_xxh3_64,
                        encoding, sealed)  # fmt: skip
    if encoding.version == 1:  # uint32: format version 1 records no token file size (it is n_tokens × 4)
        entry = dataclasses.replace(entry, n_bytes=-1)
    return dataclasses.replace(entry, src_path=shard.src_path, src_xxh3_64=shard.src_xxh3_64,
                               attr_path=shard.attr_path, attr_xxh3_64=shard.attr_xxh3_64,
                               attr_column_xxh3_64=shard.attr_column_xxh3_64,
                               attr_width=shard.attr_width)  # fmt: skip


def checked_chunks(meta: DatasetMeta, shard: ShardInfo, what: str) -> Iterator[Chunk]:
    """The shard's chunks (inspect/chunks.py), every block held to its sums and decoded, every
    id below n_vocab and, once read through, the whole file held to its checksum; FormatError
    naming the shard and the block. `what`: the dataset, as the error names it."""
    sums, tokens, size = read_sums(meta, shard), open_tokens(meta, shard), block_size(meta, shard)
    digest = xxhash.xxh3_64()
    try:
        for chunk in stored_chunks(tokens, sums, size, CHUNK_TOKENS):
            digest.update(chunk.data)
            if bad := chunk.damaged or chunk.undecodable:
                raise FormatError(block_damage(str(meta.abspath(shard.path)), bad[0], size))
            for _, run in chunk.runs:
                if len(run) and int(run.max()) >= meta.tokenizer.n_vocab:
                    raise FormatError(f"{meta.abspath(shard.path)}: token id {int(run.max())} is not below n_vocab "
                                      f"{meta.tokenizer.n_vocab} ({what} is damaged); run `lmshard inspect` on it; "
                                      f"{REGENERATE_HINT}")  # fmt: skip
            yield chunk
    finally:
        tokens.close()
    if digest.hexdigest() != shard.xxh3_64:
        raise FormatError(f"{meta.abspath(shard.path)}: checksum {digest.hexdigest()} != {shard.xxh3_64} in the "
                          f"metadata ({what} is damaged); run `lmshard inspect` on it; {REGENERATE_HINT}")  # fmt: skip


def _compare(source: DatasetMeta, shard: ShardInfo, new: DatasetMeta, converted: ShardInfo) -> None:
    """The converted shard, read back from disk (every block held to its new sums and decoded),
    holds exactly the source shard's tokens."""
    check_shard_files(new.root, converted)
    original = TokenFile(source.root, shard, source.encoding, cache_blocks=0)
    try:
        for chunk in checked_chunks(new, converted, "the converted shard"):
            for start, tokens in chunk.runs:
                if not np.array_equal(tokens, expected := original.read(start, start + len(tokens))):
                    at = start + int(np.flatnonzero(tokens != expected)[0])
                    raise FormatError(f"{shard.path}: the {new.encoding.name} copy differs from the source at token "
                                      f"{at:,}; nothing was written to --out (report this as a bug)")  # fmt: skip
    finally:
        original.close()
