"""The on-disk contract of an lmshard dataset (format version 1).

Writer, `inspect` and the runtime loader all import this module; it imports none of them, and
neither torch nor tiktoken, so a training node can read a dataset with numpy alone. The layout,
field by field, is documented in docs/format.md:

    DATASET/
      dataset_metadata.json      # written last, atomically: its presence means "complete"
      tokenizer_state.json       # everything needed to rebuild the tokenizer
      train/shard_000000.bin     # tokens, little-endian uint32, no header
      train/shard_000000.idx     # document offsets, little-endian uint64, n_docs + 1 entries
      val/...

Memory model: metadata is a few hundred bytes per shard and per source file; `read_document`
reads one document. Nothing here holds a shard.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import FormatError

FORMAT_NAME = "lmshard"
FORMAT_VERSION = 1
TOKEN_DTYPE = np.dtype("<u4")  # uint32 holds any vocabulary up to 4.29e9 ids; no uint16 overflow
INDEX_DTYPE = np.dtype("<u8")  # document start offsets in tokens, plus the shard's end
METADATA_FILE = "dataset_metadata.json"
TOKENIZER_FILE = "tokenizer_state.json"
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


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """One shard as the metadata describes it. Paths are relative to the dataset root."""

    split: str
    path: str
    index_path: str
    n_tokens: int
    n_docs: int
    xxh3_64: str
    index_xxh3_64: str

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "index_path": self.index_path,
            "n_tokens": self.n_tokens,
            "n_docs": self.n_docs,
            "xxh3_64": self.xxh3_64,
            "index_xxh3_64": self.index_xxh3_64,
        }


@dataclass(frozen=True, kw_only=True)
class TokenizerInfo:
    """The tokenizer's identity: enough to refuse a dataset made with another vocabulary."""

    name: str
    n_vocab: int
    eot_id: int
    ranks_sha256: str


@dataclass(frozen=True, kw_only=True)
class DatasetMeta:
    """A validated `dataset_metadata.json`, with the raw dict kept for reporting."""

    root: Path
    tokenizer: TokenizerInfo
    eot_position: str
    shards: tuple[ShardInfo, ...]
    raw: dict[str, Any]

    def split_shards(self, split: str) -> tuple[ShardInfo, ...]:
        return tuple(s for s in self.shards if s.split == split)

    def n_tokens(self, split: str | None = None) -> int:
        return sum(s.n_tokens for s in self.shards if split in (None, s.split))

    def n_docs(self, split: str | None = None) -> int:
        return sum(s.n_docs for s in self.shards if split in (None, s.split))

    def abspath(self, relative: str) -> Path:
        return self.root / relative


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, then rename it into place.

    A reader sees either the old file or the whole new one, never a torn write.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def _fail(root: Path, what: str) -> FormatError:
    return FormatError(f"{root / METADATA_FILE}: {what}; {REGENERATE_HINT}")


def _inside(root: Path, rel: Any, field: str) -> str:
    """Refuse paths that are absolute or climb out of the dataset directory."""
    if not isinstance(rel, str) or not rel:
        raise _fail(root, f"shard field '{field}' is missing")
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts:
        raise _fail(root, f"shard path {rel!r} escapes the dataset directory")
    return rel


def _parse_shard(root: Path, split: str, entry: Any) -> ShardInfo:
    if not isinstance(entry, dict):
        raise _fail(root, f"a shard entry of split '{split}' is not an object")
    try:
        n_tokens, n_docs = int(entry["n_tokens"]), int(entry["n_docs"])
        checks = str(entry["xxh3_64"]), str(entry["index_xxh3_64"])
    except (KeyError, TypeError, ValueError) as e:
        raise _fail(root, f"shard entry {entry.get('path')!r} lacks a valid {e}") from None
    if n_tokens < 0 or n_docs < 0:
        raise _fail(root, f"shard {entry.get('path')!r} has a negative count")
    return ShardInfo(
        split=split,
        path=_inside(root, entry.get("path"), "path"),
        index_path=_inside(root, entry.get("index_path"), "index_path"),
        n_tokens=n_tokens,
        n_docs=n_docs,
        xxh3_64=checks[0],
        index_xxh3_64=checks[1],
    )


def _read_json(root: Path) -> dict[str, Any]:
    path = root / METADATA_FILE
    if not path.is_file():
        if (root / IN_PROGRESS_FILE).exists():
            raise FormatError(f"{root}: a prepare run did not finish here; {REGENERATE_HINT}")
        raise FormatError(f"{root}: no {METADATA_FILE}; not an lmshard dataset (create one with `lmshard prepare`)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _fail(root, f"unreadable ({e})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        raise _fail(root, "not lmshard metadata")
    return raw


def load_metadata(root: str | os.PathLike[str]) -> DatasetMeta:
    """Read and validate a dataset's metadata; raise `FormatError` naming the fix if invalid.

    Checks the schema only; `lmshard.verify` compares it with the files on disk.
    """
    root = Path(root)
    raw = _read_json(root)
    if raw.get("format_version") != FORMAT_VERSION:
        raise _fail(
            root,
            f"format version {raw.get('format_version')!r}, this lmshard reads {FORMAT_VERSION}",
        )
    if raw.get("dtype") != "uint32" or raw.get("byte_order") != "little":
        raise _fail(root, f"dtype {raw.get('dtype')!r}/{raw.get('byte_order')!r} is not uint32/little")
    tok = raw.get("tokenizer") or {}
    try:
        tokenizer = TokenizerInfo(
            name=str(tok["name"]),
            n_vocab=int(tok["n_vocab"]),
            eot_id=int(tok["eot_id"]),
            ranks_sha256=str(tok["ranks_sha256"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise _fail(root, f"tokenizer entry lacks a valid {e}") from None
    if raw.get("eot_position") not in EOT_POSITIONS:
        raise _fail(root, f"eot_position {raw.get('eot_position')!r} is not one of {EOT_POSITIONS}")
    splits = raw.get("splits")
    if not isinstance(splits, dict):
        raise _fail(root, "'splits' is missing")
    for split, entry in splits.items():  # verify sums every split it finds, not only train and val
        if not isinstance(entry, dict) or not isinstance(entry.get("shards", []), list):
            raise _fail(root, f"split '{split}' is not an object with a list of shards")
    shards = tuple(
        _parse_shard(root, split, entry) for split in SPLITS for entry in (splits.get(split) or {}).get("shards", [])
    )
    return DatasetMeta(
        root=root,
        tokenizer=tokenizer,
        eot_position=str(raw["eot_position"]),
        shards=shards,
        raw=raw,
    )


def read_document(meta: DatasetMeta, shard: ShardInfo, i: int) -> np.ndarray:
    """Tokens of document `i` of `shard` (separator included), read with two small preads."""
    if not 0 <= i < shard.n_docs:
        raise FormatError(f"{shard.path}: no document {i} (it holds {shard.n_docs})")
    with open(meta.abspath(shard.index_path), "rb") as f:
        f.seek(i * INDEX_DTYPE.itemsize)
        start, end = np.frombuffer(f.read(2 * INDEX_DTYPE.itemsize), dtype=INDEX_DTYPE)
    with open(meta.abspath(shard.path), "rb") as f:
        f.seek(int(start) * TOKEN_DTYPE.itemsize)
        return np.frombuffer(f.read(int(end - start) * TOKEN_DTYPE.itemsize), dtype=TOKEN_DTYPE)


def find_shard(meta: DatasetMeta, name: str) -> ShardInfo:
    """A shard by its relative path, with or without the .bin suffix (`train/shard_000003`)."""
    wanted = name if name.endswith(".bin") else f"{name}.bin"
    for shard in meta.shards:
        if shard.path == wanted:
            return shard
    raise FormatError(f"no shard {name!r} in {meta.root}; shards are named like train/shard_000000")
