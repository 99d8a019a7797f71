"""A --near-dedup build's MinHash signature files: one row of n_hashes little-endian uint32 per
kept document, in the dataset's document order (plan order, both splits), in files of
KEYS_PER_FILE rows, `dedup/near_sigs_NNNNNN.u32` numbered on after those of the dataset
appended to. They stay with the dataset so that `--append` checks new documents against it.

Memory model: one open file and the rows of one work item at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from ...format import KeyFile, file_xxh3
from .writer import close_quietly

SIG_DTYPE = np.dtype("<u4")


class SignatureFiles:
    """Appends signature rows to the build's files, `per_file` rows each, cut back on resume."""

    def __init__(self, root: Path, n_hashes: int, per_file: int, previous: tuple[KeyFile, ...], rows: int = 0) -> None:
        """`previous`: the appended-to dataset's signature files; `rows`: this build's rows at its checkpoint."""
        self.root, self.n_hashes, self.per_file = root, n_hashes, per_file
        self.previous = tuple(f for f in previous if f.kind == "near")
        self.rows = rows
        (root / "dedup").mkdir(parents=True, exist_ok=True)
        part = rows // per_file
        for later in root.glob("dedup/near_sigs_*.u32"):  # parts begun after the checkpoint
            if later.name > Path(self.path(part)).name:
                later.unlink()
        self._file: IO[bytes] | None = None
        self._open(part)

    def path(self, part: int) -> str:
        return f"dedup/near_sigs_{len(self.previous) + part:06d}.u32"

    def _open(self, part: int) -> None:
        path = self.root / self.path(part)
        self._file = open(path, "r+b" if path.exists() else "wb")  # noqa: SIM115 (closed in close/abort)
        self._file.truncate((self.rows - part * self.per_file) * self.n_hashes * SIG_DTYPE.itemsize)
        self._file.seek(0, os.SEEK_END)
        self._part = part

    def add(self, signatures: np.ndarray) -> None:
        signatures = np.ascontiguousarray(signatures, dtype=SIG_DTYPE)
        while self._file is not None and len(signatures):
            part = self.rows // self.per_file
            if part != self._part:  # the open file is full: make it durable, go on in the next
                self.sync()
                self._file.close()
                self._open(part)
            room = (part + 1) * self.per_file - self.rows
            self._file.write(signatures[:room].tobytes())
            self.rows += len(signatures[:room])
            signatures = signatures[room:]

    def sync(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> tuple[KeyFile, ...]:
        """The signature files the dataset lists: the appended-to dataset's and this build's."""
        self.sync()
        if self._file is not None:
            self._file.close()
            self._file = None
        full, rest = divmod(self.rows, self.per_file)
        counts = [self.per_file] * full + ([rest] if rest or not full else [])
        if self._part >= len(counts):  # opened as the last one filled up, and nothing came
            (self.root / self.path(self._part)).unlink()
        own = tuple(KeyFile(path=self.path(p), n_keys=n, xxh3_64=file_xxh3(self.root / self.path(p)))
                    for p, n in enumerate(counts))  # fmt: skip
        return self.previous + own

    def abort(self) -> None:
        if self._file is not None:
            close_quietly(self._file)
            self._file = None


def read_signatures(root: Path, files: tuple[KeyFile, ...], n_hashes: int,
                    chunk: int = 1 << 16) -> Iterator[np.ndarray]:  # fmt: skip
    """The rows of a dataset's signature files, in order, `chunk` rows at a time; OSError when a
    file is shorter than its entry says."""
    width = n_hashes * SIG_DTYPE.itemsize
    for f in files:
        with open(root / f.path, "rb") as fh:
            left = f.n_keys
            while left:
                data = fh.read(min(left, chunk) * width)
                if len(data) < width:
                    raise OSError(f"{root / f.path}: shorter than its {f.n_keys} signatures")
                rows = np.frombuffer(data[: len(data) // width * width], dtype=SIG_DTYPE).reshape(-1, n_hashes)
                left -= len(rows)
                yield rows
