"""The layout on disk (layout.py makes it), read a row at a time, so a write task reads its own
parts and the pieces they go to, never the whole layout of a run.

Beside `layout.json` (the head: counts, and the signature width with --near-dedup; written
last, its existence says the layout is complete), little-endian int64 tables:

- `layout_pieces.bin`: per piece (a shard, a key file, a signature file) its stream (an index
  of layout.STREAMS), number, tokens, documents, first part, end part;
- `layout_parts.bin`: per part its piece, unit, first document, end document, tokens and
  documents before it in the piece, tokens;
- `layout_unit_parts.bin` and `layout_by_unit.bin`: U+1 offsets, then the parts grouped by the
  unit they read (in unit order). A write task's parts are those of its plan task's units: one
  slice.
- `layout_records.bin`: per unit, what its documents' record numbers are offset by to be
  numbered in their file (layout.record_offsets); the head holds `source_base`, the sources of
  an appended-to dataset (provenance: format/provenance.py).

Memory model: a few rows per table; nothing grows with the layout unless a caller iterates a
whole table (the finish, once: the pieces).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from ...format import SPLITS
from . import volatile
from .plantables import TaskTable, _Table, task_of_unit

LAYOUT_FILE = "layout.json"
PIECES, PARTS = "layout_pieces.bin", "layout_parts.bin"
UNIT_PARTS, BY_UNIT = "layout_unit_parts.bin", "layout_by_unit.bin"
RECORDS = "layout_records.bin"  # per unit: the offset of its documents' record numbers (provenance)
_I8 = np.dtype("<i8")


class _Rows(_Table):
    """Rows of `width` int64."""

    width = 1

    def __init__(self, path: Path, n: int) -> None:
        super().__init__(path, n)

    def _ints(self, first: int, end: int) -> np.ndarray:
        data = self._read((end - first) * 8 * self.width, first * 8 * self.width)
        return np.frombuffer(data, dtype=_I8).reshape(-1, self.width)


class RecordTable(_Rows):
    """Per unit its record-number offset (one int64)."""

    def _rows(self, first: int, end: int) -> list[Any]:
        return self._ints(first, end)[:, 0].tolist()


class PartTable(_Rows):
    width = 7

    def _rows(self, first: int, end: int) -> list[Any]:
        return self._ints(first, end).tolist()


class PieceTable(_Rows):
    width = 6

    def __init__(self, path: Path, n: int, streams: tuple[str, ...]) -> None:
        super().__init__(path, n)
        self.streams = streams

    def _rows(self, first: int, end: int) -> list[Any]:
        return [[self.streams[r[0]], r[1], r[2], r[3], [r[4], r[5]]] for r in self._ints(first, end).tolist()]

    def __reduce__(self) -> tuple[Any, ...]:
        return (PieceTable, (self.path, self.n, self.streams))


class _Grouped(_Table):
    """Per group (a unit, or a task: a run of units) its parts."""

    def __init__(self, path: Path, n: int, bounds: TaskTable | None = None) -> None:
        super().__init__(path, n)
        self.bounds = bounds  # tasks: their unit ranges; None: one group per unit

    def _rows(self, first: int, end: int) -> list[Any]:
        offsets = self.path.with_name(UNIT_PARTS)
        out = []
        for g in range(first, end):
            u0, u1 = self.bounds[g] if self.bounds is not None else (g, g + 1)
            lo, hi = np.frombuffer(self._read(8, 8 * u0, offsets) + self._read(8, 8 * u1, offsets), dtype=_I8).tolist()
            out.append(np.frombuffer(self._read(8 * (hi - lo), 8 * lo), dtype=_I8).tolist())
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Grouped, (self.path, self.n, self.bounds))


def write_layout(work: Path, layout: dict[str, Any], streams: tuple[str, ...]) -> None:
    """The layout's tables, then its head (linked into place: every task that makes one makes
    the same, and the first to link it wins)."""
    pieces = [[streams.index(p[0]), p[1], p[2], p[3], *p[4]] for p in layout["pieces"]]
    volatile.write_bytes(work / PIECES, np.array(pieces, dtype=_I8).reshape(-1, 6).tobytes())
    volatile.write_bytes(work / PARTS, np.array(layout["parts"], dtype=_I8).reshape(-1, 7).tobytes())
    counts = [len(parts) for parts in layout["readers"]]
    offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(_I8)
    volatile.write_bytes(work / UNIT_PARTS, offsets.tobytes())
    volatile.write_bytes(work / BY_UNIT, np.array([p for parts in layout["readers"] for p in parts], _I8).tobytes())
    volatile.write_bytes(work / RECORDS, np.array(layout.get("records", []), dtype=_I8).tobytes())
    head = {"pieces": len(pieces), "parts": len(layout["parts"]), "units": len(counts),
            "near_hashes": layout["near_hashes"], "source_base": layout.get("source_base", 0),
            "attr_columns": layout.get("attr_columns", []), "val_by": layout.get("val_by"),
            "tokens": sum(int(p[2]) for p in layout["pieces"] if p[0] in SPLITS)}  # fmt: skip
    tmp = work / f".{LAYOUT_FILE}.{uuid.uuid4().hex}.tmp"  # (tasks on two hosts may share a pid)
    volatile.write_json(tmp, head)
    try:
        os.link(tmp, work / LAYOUT_FILE)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


class Layout:
    """A written layout: `layout["pieces"]`, `["parts"]`, `["readers"]` (per unit its parts),
    `["tasks"]` (per write task its parts: its plan task's units'), `["near_hashes"]`, as
    make_layout's dict has them, each read a row at a time."""

    def __init__(self, work: Path, tasks: TaskTable, streams: tuple[str, ...]) -> None:
        head = json.loads((work / LAYOUT_FILE).read_text())
        self.tables: dict[str, Any] = {
            "pieces": PieceTable(work / PIECES, head["pieces"], streams),
            "parts": PartTable(work / PARTS, head["parts"]),
            "readers": _Grouped(work / BY_UNIT, head["units"]),
            "tasks": _Grouped(work / BY_UNIT, len(tasks), tasks),
            "near_hashes": head["near_hashes"],
            "records": RecordTable(work / RECORDS, len(layout_records(work))),
            "source_base": head.get("source_base", 0),
            "attr_columns": head.get("attr_columns", []),
            "val_by": head.get("val_by"),  # --val-by: its thresholds (valby.py)
            "tokens": head.get("tokens"),  # the shards' (None in a layout made before it was recorded)
        }
        self.unit_ranges = tasks
        self._task_of: dict[int, int] = {}  # part → its task, as found (a seal asks for every part of a piece)

    def __getitem__(self, key: str) -> Any:
        return self.tables[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.tables.get(key, default)

    def task_of_part(self, p: int) -> int:
        """The write task that holds part p: the plan task of the unit it reads."""
        if p not in self._task_of:
            self._task_of[p] = task_of_unit(self.unit_ranges, self.tables["parts"][p][1])
        return self._task_of[p]


def layout_records(work: Path) -> range:
    """The rows of `layout_records.bin` (its size says how many)."""
    try:
        return range(os.stat(work / RECORDS).st_size // 8)
    except FileNotFoundError:
        return range(0)
