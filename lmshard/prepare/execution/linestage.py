"""--dedup-lines in a planned run: two stages before the tokenize stage find which lines were
met before, in plan order, so that a unit is tokenized with the same lines removed whatever the
plan.

1. **lines** (per task: its units). Each unit is cut into the same work items the tokenize
   stage cuts it into, and each item's non-blank cleaned lines are hashed (the worker's
   `hash_lines`): `lines/unit_NNNNNN.bin` holds the magic `LMSLINE1`, the number of items, each
   item's line count and the lines' keys (uint64, in order), written under a temporary name and
   renamed (the file is its marker). The task then gathers its units' keys, partitioned by
   dedup bucket, into one key file (`keys/lines_TTTTTT.bin`, keyfiles.py; ids unit << 32 |
   line, which is plan order); with --append, its share of the dataset's line key files too
   (`keys/prevlines_TTTTTT.bin`).
2. **linedup** (per group of buckets, buckets.py's `resolve`): the lines whose key appeared
   earlier in plan order (or in the dataset appended to), as `lines/group_GGGGGG.dups`,
   grouped by the task that holds them.

The tokenize stage then reads its task's slice of each group's file once, and per unit turns
the lines not repeated into each item's keep-bits (`masks`), and keeps the keys of the lines it
met first in the unit's data file (its `lines` section), from which the write stage writes the
dataset's line key files (`dedup/line_keys_NNNNNN.u64`, KEYS_PER_FILE keys each, in plan
order: the lines a local run stores, in its order).

Memory model: a unit's line keys (8 bytes per line) while it is hashed or tokenized; a task's
line keys with their ids and their sort (16 bytes per line of its units) while they are
gathered; a group, its buckets' keys (16 bytes per line of the group); a tokenize task, its
lines that repeat (8 bytes each).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ...format import atomic_file
from ..config import PrepareConfig
from ..documents.records import record_fields
from ..documents.sources import Source, WorkItem
from ..documents.worker import WorkerConfig, hash_lines
from ..stops import stop_point
from . import volatile
from .buckets import unit_part
from .keyfiles import line_keys_path, write_line_keys
from .linenumbers import RELATIVE
from .unitfiles import first_line, load_unit
from .units import unit_items

_MAGIC = b"LMSLINE1"
_U64 = np.dtype("<u8")


def unit_lines_path(work: Path, u: int) -> Path:
    return work / "lines" / f"unit_{u:06d}.bin"


def hash_unit(config: PrepareConfig, plan: dict[str, Any], sources: list[Source], wcfg: WorkerConfig, work: Path,
              u: int, spread: Callable[[Iterator[WorkItem]], Iterator[np.ndarray]] | None = None) -> bool:  # fmt: skip
    """The lines stage for unit u (see the module docstring); False when already done. `spread`:
    the unit's work items read here and hashed elsewhere (itempool.spread), in order."""
    path = unit_lines_path(work, u)
    if path.exists():
        return False
    unit = load_unit(plan, u)
    counts, hashes = [], []
    fields = record_fields(config.text_field, config.val_by)  # (the records the tokenize stage reads, and skips)
    try:
        items = unit_items(sources, unit, config.text_mode, fields, config.max_chars, wcfg.hf)
        for h in spread(items) if spread is not None else (hash_lines(item, wcfg) for item in items):
            counts.append(len(h))
            hashes.append(h)
    except InputError:  # stopping: named at its absolute line, as the tokenize stage names it
        if unit.kind not in RELATIVE:  # (numbered from its file's start already)
            raise
        numbered = replace(unit, first_line=first_line(work / "tokenize", plan, sources[unit.source], u, wcfg.hf))
        for item in unit_items(sources, numbered, config.text_mode, fields,
                               config.max_chars, wcfg.hf):  # fmt: skip
            hash_lines(item, wcfg)
        raise
    with atomic_file(path, volatile.sync) as f:
        f.write(_MAGIC + np.array([len(counts), *counts], dtype=_U64).tobytes())
        f.write(np.concatenate(hashes).astype(_U64).tobytes() if hashes else b"")
    stop_point("lines", u)
    return True


def unit_lines(work: Path, u: int) -> tuple[np.ndarray, np.ndarray]:
    """(per item its line count, the unit's line keys in order) of unit u."""
    data = unit_lines_path(work, u).read_bytes()
    if data[:8] != _MAGIC:
        raise OSError(f"{unit_lines_path(work, u)}: not a unit's line keys")
    n = int(np.frombuffer(data, dtype=_U64, count=1, offset=8)[0])
    counts = np.frombuffer(data, dtype=_U64, count=n, offset=16).astype(np.int64)
    return counts, np.frombuffer(data, dtype=_U64, offset=16 + 8 * n)


def write_task_lines(work: Path, units: range, task: int, n_buckets: int) -> bool:
    """Task `task`'s line key file from its units' files, unless it exists; True when it ran."""
    path = line_keys_path(work, task)
    if path.exists():
        return False
    keys, ids = [], []
    for u in units:
        k = unit_lines(work, u)[1]
        keys.append(k)
        ids.append((np.uint64(u) << np.uint64(32)) | np.arange(len(k), dtype=np.uint64))
    write_line_keys(path, _joined(keys), _joined(ids), n_buckets)
    return True


def write_previous_lines(work: Path, dataset: Path, files: list[str], task: int, n_buckets: int) -> bool:
    """Task `task`'s share of an appended-to dataset's line key files (`files`, paths in
    `dataset`), ids 0 (they are never repeats, only what later lines repeat), unless written."""
    path = line_keys_path(work, task, previous=True)
    if path.exists():
        return False
    keys = _joined([np.fromfile(dataset / f, dtype=_U64) for f in files])
    write_line_keys(path, keys, np.zeros(len(keys), _U64), n_buckets)
    return True


def masks(work: Path, u: int, repeated: np.ndarray) -> tuple[list[tuple[bytes, int]], np.ndarray]:
    """Unit u's per-item keep-bits (documents/worker.py's `_LineFilter` consumes them) and
    the keys of its lines kept, from `repeated`: the ids (unit << 32 | line, sorted) of its
    task's lines met before."""
    counts, keys = unit_lines(work, u)
    keep = np.ones(len(keys), dtype=bool)
    keep[unit_part(repeated, u)] = False
    ends = np.cumsum(counts)
    out = [(np.packbits(keep[end - n : end]).tobytes(), int(n)) for n, end in zip(counts.tolist(), ends.tolist(),
                                                                                   strict=True)]  # fmt: skip
    return out, keys[keep]


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(_U64) if parts else np.zeros(0, _U64)
