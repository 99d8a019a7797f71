"""`lmshard retokenize --num-tasks N`: a retokenize as N tasks of two stages and a finish, on any
engine (the local pool, Slurm arrays, Ray, or `lmshard run-task` under any "task i of N"
scheduler), writing the bytes a one-process retokenize writes.

**Plan** (retokplan.py, once): the source and the vocabulary checked, `--out` claimed, and in the
work folder beside it tables of the source's shards (the units: one per shard that holds
documents, in order, train's then val's) and key files, from which task t reads only its own
rows: units [t·U/N, (t+1)·U/N).

1. **encode** (per task: its units): each source shard held to its checksums and decoded,
   every document's text held to its stored tokens, encoded with the new vocabulary (in a pool
   of the task's own with `--workers`), its tokens with separators written to
   `encode/unit_U.tokens` and its lengths to `unit_U.lengths`, then `unit_U.json` (docs, tokens:
   the unit's marker) last. The tasks fold their units' rows into the stage's summary
   (prepare's barrier.py), and the task that completes it lays out the shards: per split, each
   closes before a document that would take it past --tokens-per-shard (ShardWriter's rule), found
   from the units' totals, opening only the units a boundary falls in. `layout.i64` holds a row
   per new shard (split, number, first unit and document, last unit and end document).
2. **write** (per task: its share of the new shards, and of the source's key files, copied and
   checked): each shard written whole by one task from the units' files, with the source's
   provenance and attribute records, into `build/`; its entry (`write/piece_P.json`) last.
3. **finish** (once): the metadata from the write stage's summary (the entries), then `build/`
   swapped into `--out` (an old one renamed aside first, removed last) and the work folder removed.

Every item writes under a temporary name and its marker last, so a task killed anywhere is
finished by running it again; a task checks that the stage before it is complete from one file.

Cost per task, whatever the plan's size (scripts/bench_retokenize_tasks.py counts it): the
plan's head and the source's head, its own rows of the tables; an encode task reads its shards
and writes 4 bytes per new token and 8 per document; a write task reads the layout rows of its
shards, the encoded tokens, lengths and records they hold, and writes the shards. Once-steps:
the plan (the source's metadata, a row per source shard), the layout (the stage's summary, 3
integers per source shard, and the lengths of the shards a boundary falls in), and the finish
(the source's metadata, the write summary, an entry per new shard; the work folder removed).

Memory model, per task: an encode task holds one shard's index and up to 2 × workers blocks
(the one-process run's); a write task one unit's lengths, tokens read as they are written (one
part at a time) and one source shard's provenance and attribute records; the task that lays out
the shards, the units' rows (2 integers each) and one unit's lengths.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError
from ..format import (
    METADATA_FILE,
    SPLITS,
    TOKEN_DTYPE,
    ShardInfo,
    atomic_write_json,
    check_shard_files,
    load_metadata,
)
from ..format.attributes import row_dtype
from ..prepare.execution.barrier import is_complete, read_summary, task_done, task_finished
from .convert import copy_checked
from .output import _check_out, _swap_in
from .retokenize import Setup, attribute_records, encoder, numbered_blocks, per_doc_records, write_metadata
from .retokplan import PLAN_FILE, atomic_bytes, load, read_rows

STAGES = ("encode", "write", "finish")
LAYOUT_FILE = "layout.i64"  # a row per new shard: split, number, first unit, its first doc, last unit, end doc
ROW_BYTES = 6 * 8


@dataclasses.dataclass
class Tasks:
    """A planned retokenize: what every task works from."""

    work: Path
    head: dict[str, Any]
    s: Setup

    @classmethod
    def of(cls, out: str | os.PathLike[str], workers: int = 1) -> Tasks:
        """The plan in `out`'s work folder, held to the source and the vocabulary it was made with."""
        return cls(*load(out, workers))

    def units(self, rows: range) -> list[tuple[str, int, ShardInfo]]:
        """Units `rows`: source shards that hold documents, each with its split and the split's
        documents before it (Setup.units), read from the plan's table."""
        width = row_dtype(self.s.meta.attributes).itemsize if self.s.meta.attributes else 0
        return [(row["split"], row["first"], dataclasses.replace(ShardInfo.parse(row["split"], row["shard"]),
                                                                 attr_width=width))
                for row in read_rows(self.work / "units", rows)]  # fmt: skip

    def unit(self, u: int) -> ShardInfo:
        return self.units(range(u, u + 1))[0][2]

    @property
    def n_units(self) -> int:
        return int(self.head["units"])

    @property
    def n_tasks(self) -> int:
        return int(self.head["n_tasks"])

    def share(self, n_items: int, task: int) -> range:
        """Task `task`'s items of `n_items`: a contiguous range, as even as can be."""
        return range(task * n_items // self.n_tasks, (task + 1) * n_items // self.n_tasks)

    def run(self, stage: str, task: int) -> int:
        """Task `task` of `stage` (its items with a marker skipped); how many items it did."""
        if stage not in STAGES:
            raise ConfigError(f"--stage {stage}: a retokenize's stages are {', '.join(STAGES)}")
        if not 0 <= task < self.n_tasks:
            raise ConfigError(f"task {task} is not in [0, {self.n_tasks}); tasks are numbered from 0")
        if stage == "finish":
            return self.finish()
        before = STAGES[STAGES.index(stage) - 1] if stage != "encode" else None
        if before is not None and not is_complete(self.work, before):
            raise ConfigError(f"--stage {stage}: the {before} stage is not complete; run every {before} task first "
                              f"(lmshard status {self.head_out()})")  # fmt: skip
        if task_finished(self.work, stage, self.n_tasks, task):  # (a task run again: its marker folded, or folded now)
            if not is_complete(self.work, stage) and task_done(self.work, stage, self.n_tasks, task, None, _join):
                self._after(stage)
            return 0
        summary = self.encode(task) if stage == "encode" else self.write(task)
        if task_done(self.work, stage, self.n_tasks, task, summary, _join):
            self._after(stage)
        return len(summary["rows"])

    def _after(self, stage: str) -> None:
        """What the task that completes `stage` does once: after the encode stage, the layout."""
        if stage == "encode":
            self.lay_out()

    def head_out(self) -> str:
        return str(self.work.parent / self.work.name.removeprefix(".").removesuffix(".lmshard-work"))

    # -- encode --------------------------------------------------------------------------------

    def encode(self, task: int) -> dict[str, Any]:
        mine = self.share(self.n_units, task)
        rows = []
        folder = self.work / "encode"
        folder.mkdir(exist_ok=True)
        with encoder(self.s, self.s.config.n_workers()) as encoded:
            for u, (split, first, shard) in zip(mine, self.units(mine), strict=True):
                marker = folder / f"unit_{u:06d}.json"
                if not marker.exists():
                    row = _encode_unit(self.s, shard, folder / f"unit_{u:06d}",
                                       encoded(numbered_blocks(self.s.meta, shard, split, first)))  # fmt: skip
                    atomic_write_json(marker, row)
                rows.append([SPLITS.index(split), *json.loads(marker.read_text()).values()])
        return {"rows": rows}

    def lay_out(self) -> None:
        """The new shards' rows (module docstring), written once the encode stage is complete."""
        rows = read_summary(self.work, "encode")["rows"]  # per unit: split, documents, tokens
        capacity = self.s.config.tokens_per_shard
        pieces: list[list[int]] = []
        for code in range(len(SPLITS)):
            mine = [u for u, row in enumerate(rows) if row[0] == code]
            number, start, filled = 0, None, 0  # the open shard's number, first (unit, doc), tokens
            for u in mine:
                _, docs, tokens = rows[u]
                if start is None:
                    start = (u, 0)
                if filled + tokens <= capacity:  # the rest of the unit fits in the open shard
                    filled += tokens
                    continue
                lengths, d = np.fromfile(self.work / "encode" / f"unit_{u:06d}.lengths", dtype=np.int64), 0
                while d < docs:
                    ends = np.cumsum(lengths[d:])
                    fit = int(np.searchsorted(ends, capacity - filled, side="right"))
                    if fit == 0 and filled == 0:
                        fit = 1  # a document longer than a shard gets a shard of its own
                    if fit == 0 or d + fit < docs:  # the shard closes before document d + fit
                        d += fit
                        pieces.append([code, number, *start, u, d])
                        number, start, filled = number + 1, (u, d), 0
                    else:
                        filled += int(ends[-1])
                        d = docs
            if start is not None:
                pieces.append([code, number, *start, mine[-1], rows[mine[-1]][1]])
        atomic_bytes(self.work / LAYOUT_FILE, np.asarray(pieces, dtype="<i8").reshape(-1, 6).tobytes())

    # -- write ---------------------------------------------------------------------------------

    def write(self, task: int) -> dict[str, Any]:
        if not (self.work / LAYOUT_FILE).exists():  # the task that completed the encode stage stopped before it
            self.lay_out()
        n_pieces = (self.work / LAYOUT_FILE).stat().st_size // ROW_BYTES
        mine = self.share(n_pieces, task)
        table = np.fromfile(self.work / LAYOUT_FILE, dtype="<i8", count=6 * len(mine),
                            offset=mine.start * ROW_BYTES).reshape(-1, 6)  # (its own rows only)
        folder = self.work / "write"
        folder.mkdir(exist_ok=True)
        for key in read_rows(self.work / "keys", self.share(int(self.head["keys"]), task)):
            copy_checked(self.s.meta, key["path"], self.work / "build", key["xxh3_64"])  # (of the text: any vocabulary)
        entries = []
        records = _Records(self)
        for p, row in zip(mine, table, strict=True):
            marker = folder / f"piece_{p:06d}.json"
            if not marker.exists():
                atomic_write_json(marker, self._write_piece(row, records).to_json())
            entries.append([SPLITS[int(row[0])], json.loads(marker.read_text())])
        return {"rows": entries}

    def _write_piece(self, row: np.ndarray, records: _Records) -> ShardInfo:
        code, number, u0, d0, u1, d1 = (int(x) for x in row)
        writer = self.s.writer(self.work / "build", SPLITS[code], number)
        for u in range(u0, u1 + 1):
            if u == u1 and d1 == 0:
                continue  # (the shard closed before the unit's first document)
            base = self.work / "encode" / f"unit_{u:06d}"
            lengths = np.fromfile(f"{base}.lengths", dtype=np.int64)
            lo, hi = d0 if u == u0 else 0, d1 if u == u1 else len(lengths)
            starts = np.concatenate([[0], np.cumsum(lengths)])
            tokens = np.fromfile(f"{base}.tokens", dtype=TOKEN_DTYPE, count=int(starts[hi] - starts[lo]),
                                 offset=int(starts[lo]) * TOKEN_DTYPE.itemsize)  # fmt: skip
            src, attrs = records.of(u)
            writer.add(tokens, lengths[lo:hi], src[lo:hi], None if attrs is None else attrs[lo:hi])
        shards = writer.close()
        if len(shards) != 1:
            raise InputError(f"{self.work}: shard {number} of {SPLITS[code]} came out as {len(shards)} shards, not as "
                             "laid out; remove the work folder and plan again")  # fmt: skip
        return shards[0]

    # -- finish --------------------------------------------------------------------------------

    def finish(self) -> int:
        target = Path(self.head_out())
        build = self.work / "build"
        if not build.is_dir() and (target / METADATA_FILE).is_file():  # swapped in by a finish stopped after
            self._remove()
            return 0
        if not is_complete(self.work, "write"):
            raise ConfigError(f"--stage finish: the write stage is not complete; run every write task first "
                              f"(lmshard status {target})")  # fmt: skip
        shards = tuple(ShardInfo.parse(split, entry) for split, entry in read_summary(self.work, "write")["rows"])
        if not (build / METADATA_FILE).is_file():  # (the source's whole metadata: its counts, keys, sources)
            write_metadata(dataclasses.replace(self.s, meta=load_metadata(self.head["dataset"])), build, shards)
        _check_out(target, bool(self.head["overwrite"]), [self.s.meta.root], "--overwrite")
        _swap_in(build, target)
        self._remove()
        return len(shards)

    def _remove(self) -> None:
        """The work folder removed, the plan last (a finish stopped meanwhile is run again), but
        for the Slurm jobs' logs (`slurm/`), which stay for the user to read."""
        for entry in self.work.iterdir() if self.work.is_dir() else ():
            if entry.is_dir() and entry.name != "slurm":
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.name != PLAN_FILE and entry.is_file():
                entry.unlink(missing_ok=True)
        (self.work / PLAN_FILE).unlink(missing_ok=True)
        if self.work.is_dir() and not any(self.work.iterdir()):
            self.work.rmdir()


class _Records:
    """The provenance and attribute records of the source shard last asked for (a write task's
    parts come unit after unit)."""

    def __init__(self, tasks: Tasks) -> None:
        self.tasks, self.unit = tasks, -1
        self.held: tuple[np.ndarray, np.ndarray | None] = (np.zeros(0), None)

    def of(self, u: int) -> tuple[np.ndarray, np.ndarray | None]:
        from ..format.provenance import SRC_DTYPE

        if u != self.unit:
            meta, shard = self.tasks.s.meta, self.tasks.unit(u)
            src = per_doc_records(meta, shard, shard.src_path, shard.src_xxh3_64, SRC_DTYPE)
            self.unit, self.held = u, (src, None if not meta.attributes else attribute_records(meta, shard))
        return self.held


def _encode_unit(s: Setup, shard: ShardInfo, base: Path, encoded: Any) -> dict[str, int]:
    """A source shard's documents encoded into `base`.tokens and `base`.lengths; its row."""
    from .retokenize import _check_source

    check_shard_files(s.meta.root, shard)
    _check_source(s.meta, shard)
    lengths = []
    with open(f"{base}.tokens.tmp", "wb") as f:
        for tokens, lens in encoded:
            f.write(np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE).tobytes())
            lengths.append(lens)
        f.flush()
        os.fsync(f.fileno())
    os.replace(f"{base}.tokens.tmp", f"{base}.tokens")
    joined = np.concatenate(lengths).astype(np.int64) if lengths else np.zeros(0, np.int64)
    atomic_bytes(Path(f"{base}.lengths"), joined.tobytes())
    if len(joined) != shard.n_docs:
        raise InputError(f"{s.meta.abspath(shard.path)}: {len(joined)} documents read, {shard.n_docs} in the metadata")
    return {"docs": len(joined), "tokens": int(joined.sum())}

def _join(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A stage's summary: its tasks' rows, in task order."""
    return {"rows": [row for part in parts for row in part["rows"]]}


def status(out: str | os.PathLike[str]) -> dict[str, Any]:
    """Per stage: its items done of its items, per task too (from a listing of the stage's
    folder while it runs; from its summary once complete); None before the layout is made."""
    t = Tasks.of(out)
    totals = {"encode": t.n_units}
    if (t.work / LAYOUT_FILE).exists():
        totals["write"] = (t.work / LAYOUT_FILE).stat().st_size // ROW_BYTES
    stages: dict[str, Any] = {}
    for stage, prefix in (("encode", "unit_"), ("write", "piece_")):
        total = totals.get(stage)
        if total is None:
            stages[stage] = {"total": None, "done": 0, "tasks": []}
            continue
        complete = is_complete(t.work, stage)
        names = set() if complete or not (t.work / stage).is_dir() else set(os.listdir(t.work / stage))
        tasks = []
        for task in range(t.n_tasks):
            items = t.share(total, task)
            done = len(items) if complete else sum(f"{prefix}{i:06d}.json" in names for i in items)
            tasks.append({"task": task, "items": len(items), "done": done})
        stages[stage] = {"total": total, "done": sum(x["done"] for x in tasks), "tasks": tasks}
    return {"stages": stages}
