"""The plan's tables on disk, read a row at a time, so a task reads its own units and inputs
from a plan of any size, never the whole plan.

Beside `plan.json` (the head: options, counts, the fingerprint but for the inputs), three
tables, each written before the head (the head's existence says the plan is complete):

- `plan_units.bin`: one 32-byte row per unit: source (int32), kind (int32: file, range,
  row_group, rows), start, end, bytes accounted (int64 each), little-endian;
- `plan_tasks.bin`: N+1 int64: task t holds units [row t, row t+1);
- `plan_sources.jsonl` and `plan_sources.idx` (one uint64 offset per line, then the end): one
  JSON line per input: path, format, compression, size, inode, URL (credentials and all: the
  plan is then readable by its owner only), version, and the size and modification time (ns;
  an object's version) the run's fingerprint gave it, so a task checks the inputs it reads, and
  only those, against the plan; and for stdin or a pipe, the file the planner saved it to.

`UnitTable`, `TaskTable` and `SourceTable` are read-only sequences over them (positioned
reads of one row of a file each table object opens once, a few rows cached); iterating one
reads the whole table (the planner and the local executor, which hold the plan anyway).

Memory model: a handful of rows and an open file per table; nothing grows with the plan unless
a caller iterates a whole table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from ...errors import ConfigError
from ...format import atomic_write_bytes
from ..documents.files import Source
from ..documents.reading import read_error
from . import volatile

KINDS = ("file", "range", "row_group", "rows", "shard", "files")
_UNIT = np.dtype([("source", "<i4"), ("kind", "<i4"), ("start", "<i8"), ("end", "<i8"), ("nbytes", "<i8")])
_I8, _U8 = np.dtype("<i8"), np.dtype("<u8")
UNITS, TASKS, SOURCES, SOURCE_INDEX = "plan_units.bin", "plan_tasks.bin", "plan_sources.jsonl", "plan_sources.idx"
PLAN_FILE = "plan.json"  # the plan's head (taskplan.py), written after these tables


def write_tables(work: Path, units: list[list[Any]], tasks: list[list[int]], sources: list[list[Any]],
                 private: bool) -> None:  # fmt: skip
    """The three tables (the sources' in two files, lines and their offsets), each renamed into
    place whole; synced except in a local run (volatile.py: its boot recorded first, as for its
    other work files)."""
    rows = np.zeros(len(units), dtype=_UNIT)
    for i, (source, kind, start, end, nbytes) in enumerate(units):
        rows[i] = (source, KINDS.index(kind), start, end, nbytes)
    atomic_write_bytes(work / UNITS, rows.tobytes(), private, volatile.sync)
    bounds = [first for first, _ in tasks] + [tasks[-1][1] if tasks else 0]
    atomic_write_bytes(work / TASKS, np.array(bounds, dtype=_I8).tobytes(), private, volatile.sync)
    lines = [(json.dumps(s) + "\n").encode() for s in sources]
    offsets = np.concatenate([[0], np.cumsum([len(line) for line in lines], dtype=np.int64)]).astype(_U8)
    atomic_write_bytes(work / SOURCES, b"".join(lines), private, volatile.sync)
    atomic_write_bytes(work / SOURCE_INDEX, offsets.tobytes(), private, volatile.sync)


def start_again(work: Path) -> str:
    """How to discard a planned run and plan again (its build beside `work` goes with it, or the
    next prepare finds it and asks for --resume): the same prepare with --overwrite; an
    --append's, whose --overwrite would replace the dataset appended to, by deleting both."""
    try:
        append = bool(json.loads((work / PLAN_FILE).read_text())["prepare"].get("append"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        append = False
    if append:
        build = work.with_name(work.name.removesuffix(".lmshard-work") + ".lmshard-partial")
        return f"delete {build} and {work} to discard this --append run and plan again"
    return "run the same prepare with --overwrite to discard this run and plan again"


def pread_all(fd: int, n: int, at: int) -> bytes:
    """n bytes of open file `fd` at offset `at` (a short read goes on where it stopped)."""
    data = os.pread(fd, n, at)
    while len(data) < n:  # (a regular file gives all at once)
        more = os.pread(fd, n - len(data), at + len(data))
        if not more:
            raise OSError(f"unexpected end of a work file ({n - len(data)} bytes short)")
        data += more
    return data


class _Table(Sequence[Any]):
    """A read-only sequence of `n` rows of a table file, read a row (or a slice) at a time."""

    def __init__(self, path: Path, n: int) -> None:
        self.path, self.n = path, n
        self._cache: dict[int, Any] = {}
        self._fds: dict[Path, int] = {}

    def _read(self, n: int, at: int, path: Path | None = None) -> bytes:
        """n bytes at offset `at` of the table's file (or `path`, one beside it), each file opened
        once per table object: a binary search, or a task's rows, are positioned reads of an open
        file, not an open each (a metadata request on a parallel filesystem)."""
        path = path or self.path
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY)
        try:
            return pread_all(fd, n, at)
        except OSError:
            raise ConfigError(f"{path}: shorter than the plan says; {start_again(path.parent)}") from None

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            os.close(fd)

    def __len__(self) -> int:
        return self.n

    def _rows(self, first: int, end: int) -> list[Any]:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            first, end, step = i.indices(self.n)
            return self._rows(first, end)[::step] if end > first else []
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        if i not in self._cache:
            if len(self._cache) > 4096:  # (a binary search's rows, a task's own: a few dozen bytes each)
                self._cache.clear()
            self._cache[i] = self._rows(i, i + 1)[0]
        return self._cache[i]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows(0, self.n))

    def __reduce__(self) -> tuple[Any, ...]:  # to the pool's workers: the path, not the rows read
        return (type(self), (self.path, self.n))


class UnitTable(_Table):
    """Units as [source, kind, start, end, nbytes] (units.Unit's fields)."""

    def _rows(self, first: int, end: int) -> list[Any]:
        data = self._read((end - first) * _UNIT.itemsize, first * _UNIT.itemsize)
        return [[int(r["source"]), KINDS[int(r["kind"])], int(r["start"]), int(r["end"]), int(r["nbytes"])]
                for r in np.frombuffer(data, dtype=_UNIT)]  # fmt: skip


class TaskTable(_Table):
    """Tasks as [first unit, end unit]."""

    def _rows(self, first: int, end: int) -> list[Any]:
        bounds = np.frombuffer(self._read((end - first + 1) * 8, first * 8), dtype=_I8).tolist()
        return [[bounds[k], bounds[k + 1]] for k in range(end - first)]


def task_of_unit(tasks: Sequence[Any], u: int) -> int:
    """The task that holds unit u: a binary search of the tasks' first units, a row read per
    probe (an empty task starts where the next one does, which then holds the unit)."""
    lo, hi = 0, len(tasks)
    while lo < hi:  # the last task whose first unit is <= u
        mid = (lo + hi) // 2
        if tasks[mid][0] <= u:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


class SourceTable(_Table):
    """Inputs as their rows: [path, fmt, compression, size, inode, url, version, identity's size,
    identity's mark (modification time in ns, an object's version, or 0), spool (a stream's file
    in the work folder, or "")]."""

    def _rows(self, first: int, end: int) -> list[Any]:
        index = self.path.with_name(SOURCE_INDEX)
        at = np.frombuffer(self._read((end - first + 1) * 8, first * 8, index), dtype=_U8).astype(int).tolist()
        text = self._read(at[-1] - at[0], at[0]).decode()
        return [json.loads(line) for line in text.splitlines()]


class PlanSources(Sequence[Source]):
    """The plan's inputs as `Source`s, each checked against the plan when first used: a task
    reads the inputs of its own units and stats only those."""

    def __init__(self, table: SourceTable) -> None:
        self.table = table
        self._checked: dict[int, Source] = {}

    def __len__(self) -> int:
        return len(self.table)

    @overload
    def __getitem__(self, i: int) -> Source: ...
    @overload
    def __getitem__(self, i: slice) -> list[Source]: ...
    def __getitem__(self, i: int | slice) -> Source | list[Source]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i not in self._checked:
            self._checked[i] = checked_source(self.table[i], self.table.path.parent)
        return self._checked[i]

    def __reduce__(self) -> tuple[Any, ...]:
        return (PlanSources, (self.table,))


def source_row(src: Source, identity: list[Any]) -> list[Any]:
    """A source's row, with the identity the fingerprint gave it ([path, fmt, size, mark])."""
    return [src.path, src.fmt, src.compression, src.size, src.inode, src.url, src.version, *identity[2:4], src.spool]


def identity(row: list[Any]) -> list[Any]:
    """The fingerprint's identity of a source row."""
    return [row[0], row[1], row[7], row[8]]


def checked_source(row: list[Any], work: Path) -> Source:
    """The Source of a plan row, refused when the file changed since the plan was made."""
    path, fmt, compression, size, inode, url, version, planned_size, mark, spool = row
    src = Source(path, fmt, compression, size, inode=inode, url=url, version=version, spool=spool)
    if spool:  # a stream saved in the work folder: its reads check the file is the one planned
        return src
    if url or fmt == "hf" or not isinstance(mark, int) or not mark:
        return src  # (an object's version was fixed by the listing that planned it)
    try:
        st = os.stat(path)
    except OSError as e:  # gone or unreadable since it was planned: the input's error, as a reader names it
        raise read_error(path, e) from None
    if (st.st_size, st.st_mtime_ns) != (planned_size, mark):
        what = (f"size {planned_size:,} then, {st.st_size:,} now" if st.st_size != planned_size else
                "the same size, modified since")  # fmt: skip
        raise ConfigError(f"{path} changed after the run was planned ({what}); restore it (its contents and "
                          f"modification time), or {start_again(work)}")  # fmt: skip
    return src
