"""Packing plans on disk: a split's document lengths read from a prepared dataset's indexes
(without torch), and the plan cache.

`cached_plan` keeps plans in a directory its caller names (`<dataset>/.lmshard-cache/` for a
local dataset; under the loader's `cache_dir` for one at a URL, whose lengths come from its
store's document indexes) under a key of every input (the lengths' blake2b digest, seq_len,
strategy, overlong, multiple): a cached file is trusted only after its stored key and its
arrays' consistency are checked, written by tmp + rename, and a directory that cannot be
written only means no cache.

Memory model: the lengths (8 bytes per document) and one plan (see planner.py) at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from ..errors import FormatError
from ..format import INDEX_DTYPE, check_index, check_shard_files, load_metadata
from .planner import Items, PackPlan, plan


def dataset_lengths(path: str | os.PathLike[str], split: str = "train") -> np.ndarray:
    """Every document length of a split of a prepared dataset, from its document indexes only
    (each checked as the loader checks it), without torch: what `inspect --packing` plans from."""
    meta = load_metadata(path)
    if split not in meta.splits:
        raise FormatError(f"{path}: no split {split!r} (splits: {', '.join(meta.splits)})")
    parts = []
    for shard in meta.split_shards(split):
        check_shard_files(meta.root, shard)
        if shard.n_tokens:
            offsets = np.fromfile(meta.root / shard.index_path, dtype=INDEX_DTYPE)
            check_index(meta.root / shard.index_path, offsets, shard.n_tokens)
            parts.append(np.diff(offsets).astype(np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


CACHE_DIR = ".lmshard-cache"
_COUNTS = ("docs", "tokens", "split_docs", "split_pieces", "truncated_docs", "truncated_tokens", "dropped_docs",
           "dropped_tokens")  # fmt: skip


def plan_key(lengths: np.ndarray, seq_len: int, strategy: str, overlong: str, multiple: int) -> str:
    digest = hashlib.blake2b(np.ascontiguousarray(lengths, dtype="<i8").tobytes(), digest_size=16).hexdigest()
    return f"{digest}-{seq_len}-{strategy}-{overlong}-{multiple}"


def cached_plan(directory: Path | None, lengths: np.ndarray, seq_len: int, strategy: str = "bfd",
                overlong: str = "split", multiple: int = 1) -> PackPlan:  # fmt: skip
    """`plan(...)`, read from (or saved to) `directory` when one is given (a local dataset's is
    `<dataset>/.lmshard-cache`, `CACHE_DIR`)."""
    if directory is None:
        return plan(lengths, seq_len, strategy, overlong, multiple)
    key = plan_key(lengths, seq_len, strategy, overlong, multiple)
    path = Path(directory) / f"packing-{hashlib.blake2b(key.encode(), digest_size=8).hexdigest()}.npz"
    found = _load(path, key, lengths, seq_len, strategy, overlong, multiple)
    if found is not None:
        return found
    made = plan(lengths, seq_len, strategy, overlong, multiple)
    with contextlib.suppress(OSError):  # a read-only dataset: no cache, same plan
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                counts = np.array([getattr(made.items, k) for k in _COUNTS], dtype=np.int64)
                np.savez(f, key=np.array(key), start=made.start, length=made.length, ptr=made.ptr, counts=counts)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return made


def _load(path: Path, key: str, lengths: np.ndarray, seq_len: int, strategy: str, overlong: str,
          multiple: int) -> PackPlan | None:  # fmt: skip
    """The cached plan if the file holds this key and consistent arrays; None otherwise."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) != key:
                return None
            start, length, ptr, counts = (
                np.asarray(z[k], dtype=np.int64) for k in ("start", "length", "ptr", "counts")
            )
    except (OSError, ValueError, KeyError, EOFError):
        return None
    total = int(np.asarray(lengths).sum())
    ok = (len(counts) == len(_COUNTS) and len(ptr) >= 2 and ptr[0] == 0 and ptr[-1] == len(start) == len(length)
          and bool((np.diff(ptr) >= 1).all()) and bool(((length >= 1) & (length <= seq_len)).all())
          and bool((start >= 0).all()) and bool((start + length <= total).all())
          and (len(ptr) - 1) % multiple == 0
          and int(length.sum()) == int(counts[1] - counts[5] - counts[7]))  # fmt: skip
    if not ok:
        return None
    items = Items(start, length, **{k: int(v) for k, v in zip(_COUNTS, counts.tolist(), strict=True)})
    return PackPlan(seq_len, strategy, overlong, multiple, start, length, ptr, items)
