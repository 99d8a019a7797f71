"""The files of an lmshard dataset (format version 1): names, dtypes, and crash-safe writes.

The layout, field by field, is documented in docs/format.md:

    DATASET/
      dataset_metadata.json      # written last, atomically: its presence means "complete"
      tokenizer_state.json       # everything needed to rebuild the tokenizer
      tokenizer.json             # Hugging Face vocabularies only: a copy of the tokenizer's file
      train/shard_000000.bin     # tokens, little-endian uint32, no header
      train/shard_000000.idx     # document offsets, little-endian uint64, n_docs + 1 entries
      val/...

Memory model: nothing here holds more than the bytes it is asked to write.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np

T = TypeVar("T")

FORMAT_NAME = "lmshard"
FORMAT_VERSION = 3  # the newest version written: 1 for uint32 shards, 3 for zstd with a dictionary, else 2
TOKEN_DTYPE = np.dtype("<u4")  # uint32 holds any vocabulary up to 4.29e9 ids; no uint16 overflow
INDEX_DTYPE = np.dtype("<u8")  # document start offsets in tokens, plus the shard's end
METADATA_FILE = "dataset_metadata.json"
TOKENIZER_FILE = "tokenizer_state.json"
VOCAB_COPY = "tokenizer.json"  # a Hugging Face vocabulary's own file, kept so inspect can decode
# The copy of its vocabulary file a dataset keeps, by `tokenizer.vocab_format`; none for tiktoken
# ranks (OpenAI's are known by name; others are defined beside their file).
VOCAB_COPIES = {"tokenizer.json": VOCAB_COPY, "sentencepiece": "tokenizer.model"}
MAX_TOKENIZER_BYTES = 256 << 20  # a tokenizer file named by a dataset (untrusted) larger than this is not read
IN_PROGRESS_FILE = "_PREPARE_IN_PROGRESS"
SPLITS = ("train", "val")
EOT_POSITIONS = ("after", "before")

_UMASK = os.umask(0)
os.umask(_UMASK)  # read once: mkstemp creates files 0600, outputs should follow the umask

REGENERATE_HINT = "re-run `lmshard prepare` with --overwrite to regenerate it"


def shard_paths(split: str, index: int) -> tuple[str, str]:
    """Relative paths of shard `index` of `split`: its token file and its document index."""
    stem = f"{split}/shard_{index:06d}"
    return f"{stem}.bin", f"{stem}.idx"


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, private: bool = False,
                       sync: Callable[[int], None] | None = None) -> None:  # fmt: skip
    """Write `data` to a temporary file beside `path`, fsync it, then rename it into place.

    A reader sees either the old file or the whole new one, never a torn write. `private`: readable
    by its owner only (a file that holds credentials), whatever the umask. `sync`: what syncs the
    file instead of os.fsync (a planned run's work file: prepare/execution/volatile.py).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o600 if private else 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            (sync or os.fsync)(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_file(path: Path, sync: Callable[[int], None] = os.fsync) -> Iterator[BinaryIO]:
    """A file written under a temporary name beside `path`, then flushed, synced by `sync` and
    renamed to `path`; removed if the block raises. The name is this host's (`.NAME.HOST.tmp`,
    locked while it is written, `_host_tmp`), so a task run again after a kill overwrites what the
    killed one left instead of leaving it beside; where a live writer of this host holds it, one of
    this process's own (`.NAME.PID-RANDOM.tmp`). Two copies of one task running at once (a requeued
    job while the first still runs, on this host or another) each write a file of their own and
    rename it into place: one name shared would have one truncate the file the other is writing.
    Its folder is made where it is missing (a file whose folder is there costs no lookup for it),
    not the folder above: a task still running when the finish removed the work folder fails
    there instead of making the work folder again."""
    held = in_folder(lambda: _host_tmp(path), path.parent, parents=False)
    if held is None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
        f: BinaryIO = open(tmp, "wb")  # noqa: SIM115
    else:
        f, tmp = held
    with f:  # (the lock held until the file is renamed or removed)
        try:
            yield f
            f.flush()
            sync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def _host_tmp(path: Path) -> tuple[BinaryIO, Path] | None:
    """`.NAME.HOST.tmp` beside `path`, open, emptied and locked (flock) for this process, with
    its name; None where a live process holds its lock (or the filesystem has no flock). The lock
    is taken on the file the name leads to after it is held (checked by inode): a writer renames
    its file into place only while it holds the lock, so the file locked here is never the one it
    renamed. One open, one stat and the rename: a file costs one stat more than a name of its own."""
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.tmp")
    for _ in range(3):
        f = open(os.open(tmp, os.O_CREAT | os.O_RDWR, 0o666), "r+b")  # noqa: SIM115 (closed by atomic_file)
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(f.fileno()).st_ino == os.stat(tmp).st_ino:
                f.truncate(0)  # (what a killed writer left)
                return f, tmp
        except OSError:  # held by a live writer of this host, or no flock: a name of this process's own
            f.close()
            return None
        f.close()  # renamed into place by the writer that held it a moment ago: again
    return None


def atomic_write_json(path: str | os.PathLike[str], obj: Any, private: bool = False,
                      sync: Callable[[int], None] | None = None) -> None:  # fmt: skip
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode(), private, sync)


def in_folder(make: Callable[[], T], folder: Path, parents: bool = True) -> T:
    """`make()` (a file created in `folder`), run again after making `folder` when it finds the
    folder missing: tried first, so each of many files costs no stat or mkdir of its folder (a
    request to a parallel filesystem's metadata servers each). `parents=False`: `folder` only,
    its parent missing is an error."""
    try:
        return make()
    except FileNotFoundError:
        folder.mkdir(parents=parents, exist_ok=True)
        return make()


def write_vocab_copy(directory: Path, vocab_format: str, data: bytes | None) -> None:
    """The dataset's copy of its vocabulary file (`VOCAB_COPIES`, by format), the bytes hashed
    into its `ranks_sha256`: inspect decodes with it on any machine. Nothing for a format
    without a copy, or when the tokenizer holds no file's bytes."""
    name = VOCAB_COPIES.get(vocab_format)
    if data is not None and name is not None:
        atomic_write_bytes(directory / name, data)
