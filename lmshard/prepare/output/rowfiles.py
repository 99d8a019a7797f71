"""Files of fixed-width rows, one per kept document, that a build keeps with the dataset for
`--append`: its dedup keys (`dedup/doc_keys_NNNNNN.u64`: one little-endian uint64 a row) and,
with --near-dedup, its MinHash signatures (`dedup/near_sigs_NNNNNN.u32`: n_hashes little-endian
uint32 a row). Rows go in the dataset's document order (plan order, both splits) into files of
`per_file` rows each, numbered on after those of the dataset appended to; a resumed build cuts
them back to the rows its checkpoint recorded.

Memory model: one open file and the rows of one work item at a time; reading, 8 MiB of rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from ...format import KeyFile, file_xxh3
from .writer import close_quietly

KEY_DTYPE = np.dtype("<u8")  # a document key
SIG_DTYPE = np.dtype("<u4")  # a MinHash signature's value


class RowFiles:
    """Appends rows to the build's files `dedup/NAME_NNNNNN.SUFFIX`, `per_file` rows each."""

    def __init__(self, root: Path, name: str, dtype: np.dtype, width: int, per_file: int,
                 previous: tuple[KeyFile, ...], rows: int = 0) -> None:  # fmt: skip
        """`previous`: the appended-to dataset's files (those of this name are taken); `rows`:
        this build's rows at its checkpoint (its files are cut back to them)."""
        self.root, self.name, self.dtype, self.width, self.per_file = root, name, dtype, width, per_file
        self.suffix = f"{dtype.kind}{dtype.itemsize * 8}"
        self.previous = tuple(f for f in previous if f.path.startswith(f"dedup/{name}_"))
        self.rows = rows
        (root / "dedup").mkdir(parents=True, exist_ok=True)
        part = rows // per_file
        for later in root.glob(f"dedup/{name}_*.{self.suffix}"):  # parts begun after the checkpoint
            if later.name > Path(self.path(part)).name:
                later.unlink()
        self._file: IO[bytes] | None = None
        self._open(part)

    @property
    def row_bytes(self) -> int:
        return self.width * self.dtype.itemsize

    def path(self, part: int) -> str:
        return f"dedup/{self.name}_{len(self.previous) + part:06d}.{self.suffix}"

    def _open(self, part: int) -> None:
        path = self.root / self.path(part)
        self._file = open(path, "r+b" if path.exists() else "wb")  # noqa: SIM115 (closed in close/abort)
        self._file.truncate((self.rows - part * self.per_file) * self.row_bytes)
        self._file.seek(0, os.SEEK_END)
        self._part = part

    def add(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        while self._file is not None and len(rows):
            part = self.rows // self.per_file
            if part != self._part:  # the open file is full: make it durable, go on in the next
                self.sync()
                self._file.close()
                self._open(part)
            room = (part + 1) * self.per_file - self.rows
            self._file.write(rows[:room].tobytes())
            self.rows += len(rows[:room])
            rows = rows[room:]

    def sync(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def counts(self) -> list[int]:
        """Rows in each of this build's files: full ones, then the rest (one empty file when
        there are no rows)."""
        full, rest = divmod(self.rows, self.per_file)
        return [self.per_file] * full + ([rest] if rest or not full else [])

    def stored(self) -> Iterator[np.ndarray]:
        """The rows recorded so far, in order: the appended-to dataset's, then this build's."""
        own = tuple(KeyFile(path=self.path(p), n_keys=n, xxh3_64="") for p, n in enumerate(self.counts()))
        return read_rows(self.root, self.previous + own, self.dtype, self.width, (8 << 20) // self.row_bytes)

    def close(self) -> tuple[KeyFile, ...]:
        """The files the dataset lists: the appended-to dataset's and this build's."""
        self.sync()
        if self._file is not None:
            self._file.close()
            self._file = None
        counts = self.counts()
        if self._part >= len(counts):  # opened as the last one filled up, and nothing came
            (self.root / self.path(self._part)).unlink()
        own = tuple(KeyFile(path=self.path(p), n_keys=n, xxh3_64=file_xxh3(self.root / self.path(p)))
                    for p, n in enumerate(counts))  # fmt: skip
        return self.previous + own

    def abort(self) -> None:
        if self._file is not None:
            close_quietly(self._file)
            self._file = None


def read_rows(root: Path, files: tuple[KeyFile, ...], dtype: np.dtype, width: int = 1,
              chunk: int = 1 << 16) -> Iterator[np.ndarray]:  # fmt: skip
    """The rows of `files` (each holding `n_keys` rows of `width` values), in order, `chunk`
    rows at a time ([rows] for width 1, else [rows, width]); OSError when a file is shorter
    than its entry says."""
    size = width * dtype.itemsize
    for f in files:
        if not f.n_keys:
            continue
        with open(root / f.path, "rb") as fh:
            left = f.n_keys
            while left:
                data = fh.read(min(left, chunk) * size)
                if len(data) < size:
                    raise OSError(f"{root / f.path}: shorter than recorded ({f.n_keys} rows)")
                rows = np.frombuffer(data[: len(data) // size * size], dtype=dtype)
                left -= len(rows) // width
                yield rows if width == 1 else rows.reshape(-1, width)
