"""Shard writing: whole documents appended to `.bin` files, with their `.idx` offsets.

Each shard is written under a temporary name, fsynced, and renamed into place only when it is
complete, with its xxh3-64 computed on the way out; `dataset_metadata.json` is written after
every shard (see `format.py`). A shard holds whole documents: one closes before a document that
would take it past `tokens_per_shard`, and a single document longer than that gets a shard of
its own, so every shard's document index is self-contained.

Memory model: the writer keeps only the current shard's offsets (8 bytes per document in it)
and one incoming batch; token data goes straight to the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import numpy as np
import xxhash

from ..format import INDEX_DTYPE, TOKEN_DTYPE, ShardInfo, atomic_write_bytes, shard_paths


def with_separators(
    tokens: np.ndarray, lengths: np.ndarray, keep: np.ndarray, eot: int, position: str
) -> tuple[np.ndarray, np.ndarray]:
    """Select the documents where `keep` is True from a flat token array and add one EOT token
    to each, after or before it. Returns (tokens, lengths) of the selected documents."""
    if keep.all():
        chosen, lens = tokens, lengths
    else:
        chosen, lens = tokens[np.repeat(keep, lengths)], lengths[keep]
    ends = np.cumsum(lens)
    at = ends if position == "after" else ends - lens
    return np.insert(chosen, at, np.uint32(eot)).astype(TOKEN_DTYPE, copy=False), lens + 1


class ShardWriter:
    """Appends documents of one split to numbered shards under `root/split/`."""

    def __init__(self, root: Path, split: str, tokens_per_shard: int) -> None:
        self.root, self.split, self.capacity = root, split, tokens_per_shard
        self.shards: list[ShardInfo] = []
        self._file: BinaryIO | None = None
        self._hash = xxhash.xxh3_64()
        self._n_tokens = 0
        self._offsets: list[np.ndarray] = []

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append documents given as one flat token array (separators included) and lengths."""
        while len(lengths):
            ends = np.cumsum(lengths)
            fit = int(np.searchsorted(ends, self.capacity - self._n_tokens, side="right"))
            if fit == 0 and self._n_tokens == 0:
                fit = 1  # a document longer than a shard gets a shard of its own
            if fit == 0:
                self._finish()
                continue
            cut = int(ends[fit - 1])
            self._write(tokens[:cut], ends[:fit])
            tokens, lengths = tokens[cut:], lengths[fit:]
            if len(lengths):
                self._finish()

    def close(self) -> list[ShardInfo]:
        if self._file is not None:
            self._finish()
        return self.shards

    def abort(self) -> None:
        """Drop the shard being written (its temporary file); finished shards stay on disk."""
        if self._file is not None:
            name = self._file.name
            self._file.close()
            self._file = None
            Path(name).unlink(missing_ok=True)

    def _write(self, tokens: np.ndarray, ends: np.ndarray) -> None:
        if self._file is None:
            self._open()
        assert self._file is not None
        data = np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE)
        raw = data.data.cast("B")  # the array's own bytes: no copy
        self._file.write(raw)
        self._hash.update(raw)
        self._offsets.append((ends + self._n_tokens).astype(INDEX_DTYPE))
        self._n_tokens += len(data)

    def _open(self) -> None:
        bin_rel, _ = shard_paths(self.split, len(self.shards))
        path = self.root / bin_rel
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(f"{path}.tmp", "wb")  # noqa: SIM115 (closed in _finish/abort)
        self._hash = xxhash.xxh3_64()
        self._n_tokens = 0
        self._offsets = [np.zeros(1, dtype=INDEX_DTYPE)]

    def _finish(self) -> None:
        assert self._file is not None
        bin_rel, idx_rel = shard_paths(self.split, len(self.shards))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        index = np.concatenate(self._offsets).astype(INDEX_DTYPE).tobytes()
        atomic_write_bytes(self.root / idx_rel, index)
        os.replace(self.root / f"{bin_rel}.tmp", self.root / bin_rel)
        self.shards.append(
            ShardInfo(
                split=self.split,
                path=bin_rel,
                index_path=idx_rel,
                n_tokens=self._n_tokens,
                n_docs=sum(len(o) for o in self._offsets) - 1,
                xxh3_64=self._hash.hexdigest(),
                index_xxh3_64=xxhash.xxh3_64_hexdigest(index),
            )
        )
        self._n_tokens = 0
