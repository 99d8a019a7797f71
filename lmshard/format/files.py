"""A dataset directory on disk, held to its metadata before anything maps or reads its data.

A dataset may come from someone else (downloaded, copied, tampered), so every reader makes the
same checks, and each has one owner here:

- `load_metadata`: the metadata file parses and validates (`schema.parse_metadata`).
- `check_shard_files`: a shard's `.bin` and `.idx` resolve, symlinks followed, to regular files
  inside the dataset directory, of exactly the sizes the metadata records. Every count a reader
  later sizes a map, a read or an array by is then backed by bytes that exist: `n_tokens` 10**15
  is refused by a stat, not by trying.
- `check_index`: a shard's document index runs from 0 to its `n_tokens`, strictly increasing.

`lmshard inspect` (inspect/verify.py) and the runtime loader (runtime/store.py) both call them.

Memory model: `check_index` holds one boolean per document of the index it checks; the rest
is a few stats per shard, and `read_document` one document.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import FormatError
from .layout import (
    IN_PROGRESS_FILE,
    INDEX_DTYPE,
    MAX_TOKENIZER_BYTES,
    METADATA_FILE,
    REGENERATE_HINT,
    TOKENIZER_FILE,
    VOCAB_COPIES,
)
from .schema import DatasetMeta, ShardInfo, parse_metadata
from .tokenfile import TokenFile


def load_metadata(root: str | os.PathLike[str]) -> DatasetMeta:
    """Read and validate a dataset's metadata; raise `FormatError` naming the fix if invalid.

    Checks the metadata alone; `check_shard_files` holds it against the files on disk.
    """
    root = Path(root)
    path = root / METADATA_FILE
    if not path.is_file():
        if (root / IN_PROGRESS_FILE).exists():
            raise FormatError(f"{root}: a prepare run did not finish here; {REGENERATE_HINT}")
        raise FormatError(f"{root}: no {METADATA_FILE}; not an lmshard dataset (create one with `lmshard prepare`)")
    # A copied dataset may be someone else's: a regular file inside it, of a metadata's size.
    size = dataset_file_size(root, METADATA_FILE)
    if size > MAX_METADATA_BYTES:
        raise FormatError(f"{path}: {size:,} bytes, more than any lmshard metadata; {REGENERATE_HINT}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO swapped in opens without waiting
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise FormatError(f"{path}: not a regular file; {REGENERATE_HINT}")
            data = f.read(min(info.st_size, MAX_METADATA_BYTES) + 1)  # one more byte: a file that grew
        if len(data) > MAX_METADATA_BYTES:
            raise FormatError(f"{path}: more than {MAX_METADATA_BYTES:,} bytes, more than any lmshard metadata; "
                              f"{REGENERATE_HINT}")  # fmt: skip
        raw = json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or UTF-8, an int of 4,300+ digits
        raise FormatError(f"{path}: unreadable ({e}); {REGENERATE_HINT}") from None
    return parse_metadata(root, raw)


MAX_METADATA_BYTES = 1 << 30  # a few hundred bytes per shard and per input file: far below this


def dataset_file_size(root: Path, rel: str) -> int:
    """Size in bytes of the file `rel` of the dataset at `root`. FormatError, naming the file,
    unless it resolves (symlinks followed) to a regular file inside `root`: a copied dataset
    may hold a link to anywhere, or a FIFO that would block a read."""
    path = root / rel
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(os.path.realpath(root)):
        raise FormatError(f"{path}: resolves to {real}, outside the dataset directory; {REGENERATE_HINT}")
    try:
        info = os.stat(real)
    except FileNotFoundError:
        raise FormatError(f"{path}: is missing; {REGENERATE_HINT}") from None
    except OSError as e:
        raise FormatError(f"{path}: unreadable ({e.strerror}); {REGENERATE_HINT}") from None
    if not stat.S_ISREG(info.st_mode):
        raise FormatError(f"{path}: not a regular file; {REGENERATE_HINT}")
    return info.st_size


def check_shard_files(root: Path, shard: ShardInfo) -> None:
    """FormatError, naming the file and the field, unless the shard's token file holds
    `n_tokens` × 4 bytes (format version 2: its recorded `n_bytes`) and its index `(n_docs + 1)`
    × 8 (and its sums and block offsets files, where kept, 8 per block), all inside the dataset
    at `root`."""
    for rel, key, count, expected in shard_file_sizes(shard):
        size = dataset_file_size(root, rel)
        if size != expected:
            raise FormatError(f"{root / rel}: {size} bytes, but '{key}' {count} in the metadata means {expected}; "
                              f"{REGENERATE_HINT}")  # fmt: skip


def shard_file_sizes(shard: ShardInfo) -> list[tuple[str, str, int, int]]:
    """(relative path, the metadata field that sizes it, that field's value, the size it means)
    of each of a shard's files: what a local or remote reader holds the files to."""
    files = [(shard.path, "n_tokens", shard.n_tokens, shard.bin_bytes),
             (shard.index_path, "n_docs", shard.n_docs, shard.idx_bytes)]  # fmt: skip
    if shard.sums_path:
        files.append((shard.sums_path, "n_tokens", shard.n_tokens, shard.sums_bytes))
    if shard.blocks_path:
        files.append((shard.blocks_path, "n_tokens", shard.n_tokens, shard.blocks_bytes))
    if shard.src_path:
        files.append((shard.src_path, "n_docs", shard.n_docs, shard.src_bytes))
    if shard.attr_path:
        files.append((shard.attr_path, "n_docs", shard.n_docs, shard.attr_bytes))
    return files


def check_index(path: Path, offsets: np.ndarray, n_tokens: int) -> None:
    """FormatError unless `offsets` (a shard's document index, any uint64 array or map) starts
    at 0, ends at the shard's `n_tokens` and increases strictly: every document holds at least
    its separator. Two vectorized comparisons, no loop over documents."""
    first, last = int(offsets[0]), int(offsets[-1])
    if first != 0 or last != n_tokens:
        raise FormatError(f"{path}: document index spans {first}..{last}, not 0..{n_tokens} ('n_tokens'); "
                          f"{REGENERATE_HINT}")  # fmt: skip
    rising = offsets[1:] > offsets[:-1]  # uint64 compared as uint64: no signed copy of the index
    if not rising.all():
        at = int(rising.argmin()) + 1
        raise FormatError(f"{path}: document index is not strictly increasing (entry {at}: {int(offsets[at])} "
                          f"after {int(offsets[at - 1])}); {REGENERATE_HINT}")  # fmt: skip


def read_document(meta: DatasetMeta, shard: ShardInfo, i: int) -> np.ndarray:
    """Tokens of document `i` of `shard` (separator included), read with two small preads
    after `check_shard_files`, so a read never runs past what the files hold."""
    if not 0 <= i < shard.n_docs:
        raise FormatError(f"{shard.path}: no document {i} (it holds {shard.n_docs})")
    check_shard_files(meta.root, shard)
    with open(meta.abspath(shard.index_path), "rb") as f:
        f.seek(i * INDEX_DTYPE.itemsize)
        start, end = (int(x) for x in np.frombuffer(f.read(2 * INDEX_DTYPE.itemsize), dtype=INDEX_DTYPE))
    if not 0 <= start < end <= shard.n_tokens:
        raise FormatError(f"{meta.abspath(shard.index_path)}: document {i} spans {start}..{end}, outside "
                          f"0..{shard.n_tokens} or empty; {REGENERATE_HINT}")  # fmt: skip
    tokens = TokenFile(meta.root, shard, meta.encoding, cache_blocks=0)
    try:
        return tokens.read(start, end)
    finally:
        tokens.close()


def find_shard(meta: DatasetMeta, name: str) -> ShardInfo:
    """A shard by its relative path, with or without the .bin suffix (`train/shard_000003`)."""
    wanted = name if name.endswith(".bin") else f"{name}.bin"
    for shard in meta.shards:
        if shard.path == wanted:
            return shard
    raise FormatError(f"no shard {name!r} in {meta.root}; shards are named like train/shard_000000")


def dataset_files(meta: DatasetMeta) -> list[str]:
    """Every file of a dataset, relative to its root, the metadata last."""
    files = [f for s in meta.shards for f in s.files()]
    files += [f.path for f in meta.dedup.files] if meta.dedup else []
    vocab = VOCAB_COPIES.get(meta.tokenizer.vocab_format)
    return files + [TOKENIZER_FILE] + ([vocab] if vocab else []) + [METADATA_FILE]


def file_checksums(meta: DatasetMeta) -> dict[str, str]:
    """{relative path: xxh3-64 hex} of every file whose checksum the metadata records: shards,
    their indexes and block sums, and the dedup key files."""
    sums = {s.path: s.xxh3_64 for s in meta.shards} | {s.index_path: s.index_xxh3_64 for s in meta.shards}
    sums |= {s.sums_path: s.sums_xxh3_64 for s in meta.shards if s.sums_path}
    sums |= {s.blocks_path: s.blocks_xxh3_64 for s in meta.shards if s.blocks_path}
    sums |= {s.src_path: s.src_xxh3_64 for s in meta.shards if s.src_path}
    sums |= {s.attr_path: s.attr_xxh3_64 for s in meta.shards if s.attr_path}
    return sums | ({f.path: f.xxh3_64 for f in meta.dedup.files} if meta.dedup else {})


def read_small(root: Path, rel: str, sink: Callable[[bytes], object]) -> None:
    """Feed `sink` the bytes of the dataset's small file `rel` (tokenizer_state.json, the
    tokenizer.json copy) in 1 MiB blocks. FormatError unless it is a regular file inside the
    dataset of at most MAX_TOKENIZER_BYTES, held to that again on the file opened and the bytes
    read: someone else's dataset may swap in a FIFO or a larger file after the first check."""
    path = root / rel
    dataset_file_size(root, rel)  # inside the dataset (symlinks resolved), a regular file
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens without waiting
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FormatError(f"{path}: not a regular file; {REGENERATE_HINT}")
        if info.st_size > MAX_TOKENIZER_BYTES:
            raise _too_large(path, f"{info.st_size:,} bytes")
        read = 0  # bytes: the file may still grow while it is read
        while block := f.read(1 << 20):
            read += len(block)
            if read > MAX_TOKENIZER_BYTES:
                raise _too_large(path, f"more than {read - len(block):,} bytes")
            sink(block)


def _too_large(path: Path, size: str) -> FormatError:
    return FormatError(f"{path}: {size}, more than any tokenizer file ({MAX_TOKENIZER_BYTES >> 20} MiB); "
                       f"not read; {REGENERATE_HINT}")  # fmt: skip
