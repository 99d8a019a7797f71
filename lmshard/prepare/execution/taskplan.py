"""The scale-out plan: a prepare run's inputs cut into units and dealt to N tasks, persisted
beside the output so that every task of every engine (Slurm array, Ray, any "task i of N"
scheduler) works from the same plan.

**Units.** Inputs are enumerated as `prepare` does (sorted paths, `discover`), then cut:

- an uncompressed line-based file (JSON lines, text read by line or by paragraph, and text that
  --text-mode auto splits into paragraphs) larger than `unit_bytes` into byte ranges that start
  just past a record boundary (a newline; a blank line for paragraphs), found by reading a few
  KB at each multiple of `unit_bytes`, never the whole file;
- a parquet file into its row groups;
- anything else (compressed files, CSV, JSON arrays, arrow, small files) is one unit.

Units concatenated in plan order are exactly the input in `prepare`'s order, and `unit_items`
gives a unit's work items with the lines (and line numbers: a range's first line number is found
by the task that tokenizes it) that the single-machine plan gives, so the stages that take the
units' documents in plan order (stages.py) see the single-machine document sequence. The plan
also fixes the number of dedup buckets (`bucket_count`), from the input's size alone, and the
dedup stage's items, groups of consecutive buckets (`group_count`), from the buckets, the input's
size and the processes that share them.

**Tasks.** Units are dealt to N tasks as contiguous runs balanced by bytes (a task ends at the
first unit boundary past its share of the total), so each task reads neighbouring data. A task
may be empty when there are fewer units than tasks.

**Persistence.** `ensure_plan` writes `plan.json` into the work directory once (a temporary file
hard-linked into place, so two tasks starting together cannot both create it) and validates it
on every later call: another configuration, input set, vocabulary or task count is refused,
naming the difference.

Memory model: one entry per unit (a few dozen bytes); a 64 KiB read window while cutting
(planning reads a few KB at each cut, never a whole file).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...errors import ConfigError, InputError
from ...format import atomic_write_json
from ...remote.urls import has_credentials
from ..documents.columnar import parquet_row_groups
from ..documents.files import Source, first_byte, open_raw
from ..documents.hf import saved_rows, shard_records, source_bytes, stream_shards
from ..documents.records import binary_record
from ..documents.sources import BLOCK_BYTES, RECORDS_PER_ITEM, WorkItem, _plan_lines, batch_records, plan
from ..output.claim import difference
from .plantables import (
    SOURCES,
    TASKS,
    UNITS,
    SourceTable,
    TaskTable,
    UnitTable,
    identity,
    source_row,
    write_tables,
)

PLAN_FILE = "plan.json"
PLAN_VERSION = 7  # 3: per-task key files (keyfiles.py); 4: dedup items are groups of buckets; 5: a stream's copy;
# 6: line stages (--dedup-lines), a unit's kept lines in its data file; 7: its records' numbers
# A unit of a large line-based file: ~20 s of one core's tokenizing (LMSHARD_UNIT_BYTES: for benchmarks).
UNIT_BYTES = int(os.environ.get("LMSHARD_UNIT_BYTES", 64 << 20))
_WINDOW = 64 << 10
_LINE_FORMATS = ("jsonl", "text")


@dataclass(frozen=True)
class Unit:
    """Part of one source: the whole file, the bytes [start, end), parquet row group `start`, a
    saved Hugging Face split's rows [start, end), or shard `start` of a stream's `end` shards."""

    source: int
    kind: str  # file | range | row_group | rows | shard
    start: int
    end: int
    nbytes: int  # input bytes it accounts for, for balancing
    first_line: int = 1  # the number of a range's first line in its file (for messages); 0: not known yet


def work_dir(out: str | os.PathLike[str]) -> Path:
    """Where a scale-out run keeps its plan, the tasks' outputs and markers: `.NAME.lmshard-work`
    beside the output, as the build's `.NAME.lmshard-partial`, so `NAME` only ever holds a
    complete dataset."""
    out = Path(out)
    return out.parent / f".{out.name}.lmshard-work"


MIN_BUCKETS, MAX_BUCKETS = 32, 4096  # dedup buckets (buckets.py)
BYTES_PER_BUCKET = 256 << 20


def bucket_count(total_bytes: int) -> int:
    """Buckets for a run over `total_bytes` of input: a power of two, one per 256 MiB, 32 to 4096."""
    want = max(1, -(-total_bytes // BYTES_PER_BUCKET))
    return min(MAX_BUCKETS, max(MIN_BUCKETS, 1 << (want - 1).bit_length()))


PAIRS = 1 << 24  # dedup groups x tasks, at most: the files the dedup stage opens, and the select stage


def group_count(n_buckets: int, n_tasks: int, total_bytes: int | None = None, processes: int | None = None) -> int:
    """The dedup stage's items: a power of two, as many as the processes that can share them
    (`processes`: the tasks times each task's workers) or one per BYTES_PER_BUCKET of input,
    whichever is more, at most `n_buckets`; and at most PAIRS / `n_tasks`. So a group holds the
    keys of at most BYTES_PER_BUCKET of input below those caps, a run in one process resolves a
    small input in one group (one read of its key file), and a run of many processes gets a group
    for each. Without the input's size and processes: every bucket a group (as at scale)."""
    want = n_buckets if total_bytes is None or processes is None else \
        max(1, processes, -(-total_bytes // BYTES_PER_BUCKET))
    groups = min(n_buckets, 1 << (want - 1).bit_length())
    while groups > 1 and groups * n_tasks > PAIRS:
        groups //= 2
    return groups


UNITS_PER_TASK = 4  # a task gets about this many units by default: balance without tiny units


def unit_size_for(sources: list[Source], n_tasks: int, requested: int | None = None) -> int:
    """Bytes per unit: `requested` (--unit-size), else the inputs' bytes over 4 units per task,
    between 64 KiB and UNIT_BYTES, so that 8 tasks over 32 MB get 8 MB units each rather than
    one 64 MiB unit for one task and nothing for seven (whole compressed files and small files
    stay one unit whatever the size)."""
    if requested is not None:
        return requested
    total = sum(s.size for s in sources)
    return max(_WINDOW, min(UNIT_BYTES, -(-total // (n_tasks * UNITS_PER_TASK))))


def largest_whole(sources: list[Source]) -> int:
    """Bytes of the largest input that is one unit whatever its size (a compressed file, CSV, a
    JSON array, arrow; `_cut`), from names, sizes and a JSON file's first byte: staged tasks
    cannot spread it."""
    return max((s.size for s in sources if s.compression is not None or s.fmt not in (*_LINE_FORMATS, "json", "parquet")
                or (s.fmt == "json" and first_byte(s) == b"[")), default=0)  # fmt: skip


def cut_units(sources: list[Source], text_mode: str, max_chars: int, unit_bytes: int = UNIT_BYTES,
              hf: Any = None, n_tasks: int = 1) -> list[Unit]:  # fmt: skip
    """Every source as units, in input order (see the module docstring). `hf`: the HFSpec of a
    Hugging Face source: a saved split cut into ranges of rows (sized to `n_tasks`), a stream
    into its shards."""
    if unit_bytes < _WINDOW:
        raise ConfigError(f"unit_bytes={unit_bytes} is below {_WINDOW}; pass at least {_WINDOW} bytes")
    units: list[Unit] = []
    for i, src in enumerate(sources):
        if src.stream:
            name = "stdin" if src.path == "-" else src.path
            raise ConfigError(f"{name}: a scale-out run reads files that every task can open; save the input to a "
                              "file")  # fmt: skip
        if src.fmt == "hf":
            units.extend(_cut_rows(i, hf, n_tasks) if hf.kind() == "saved" else _cut_shards(i, hf))
            continue
        units.extend(_cut(i, src, text_mode, max_chars, unit_bytes))
    return units


MIN_ROWS, ROWS_PER_UNIT = 256, 8 * RECORDS_PER_ITEM  # a saved Hugging Face split's rows per unit, at most


def _cut_rows(i: int, hf: Any, n_tasks: int) -> list[Unit]:
    """A saved Hugging Face split as units of rows: about UNITS_PER_TASK per task, from MIN_ROWS
    to ROWS_PER_UNIT rows each (the last one shorter); a unit's rows stand for its bytes when
    tasks are balanced."""
    n = saved_rows(hf)
    size = min(ROWS_PER_UNIT, max(MIN_ROWS, -(-n // (n_tasks * UNITS_PER_TASK))))
    return [Unit(i, "rows", a, min(n, a + size), min(n, a + size) - a)
            for a in range(0, n, size)] or [Unit(i, "rows", 0, 0, 0)]  # fmt: skip


def _cut_shards(i: int, hf: Any) -> list[Unit]:
    """A Hugging Face stream (a hub id, a directory of data files) as a unit per shard (data
    file), numbered relative to its start as a byte range is (linenumbers.py); each stands for
    one byte of input when tasks are balanced (their sizes are not known before they are read)."""
    n = stream_shards(hf)
    return [Unit(i, "shard", s, n, 1, 1 if s == 0 else 0) for s in range(n)]


def _cut(i: int, src: Source, text_mode: str, max_chars: int, unit_bytes: int) -> list[Unit]:
    whole = [Unit(i, "file", 0, src.size, src.size)]
    if src.fmt == "parquet":
        n = parquet_row_groups(src)
        return [Unit(i, "row_group", g, g + 1, src.size // n) for g in range(n)] if n > 1 else whole
    if src.compression is not None or src.size <= unit_bytes or src.fmt not in (*_LINE_FORMATS, "json"):
        return whole
    if src.fmt == "json" and first_byte(src) == b"[":  # a JSON array: parsed as a whole
        return whole
    if src.fmt == "text" and (text_mode == "file" or (text_mode == "auto" and src.size <= max_chars and not src.piped)):
        return whole  # one document
    with open_raw(src) as f:
        if binary_record(f.read(BLOCK_BYTES)) is not None:  # one "binary_file" record, as prepare reads it
            return whole
    paragraph = src.fmt == "text" and text_mode != "line"
    cuts = [0, *_boundaries(src, unit_bytes, paragraph), src.size]
    # A range's first line number (0: not known yet) is found by the task that tokenizes it
    # (stages.first_line), so that planning reads a few KB per cut, never the whole file.
    return [Unit(i, "range", a, b, b - a, 1 if a == 0 else 0) for a, b in zip(cuts[:-1], cuts[1:], strict=False)]


def count_newlines(src: Source, start: int, end: int) -> int:
    """Newlines in the bytes [start, end) of an uncompressed file, read one block at a time."""
    n = 0
    with open_raw(src) as f:
        f.seek(start)
        while start < end and (block := f.read(min(BLOCK_BYTES, end - start))):
            n += block.count(b"\n")
            start += len(block)
    return n


def unit_items(i: int, src: Source, unit: Unit, text_mode: str, text_field: str, max_chars: int,
               hf: Any = None) -> Iterator[WorkItem]:  # fmt: skip
    """The work items of one unit: concatenated over a source's units in plan order, the same
    records, with the same line numbers, as `sources.plan` gives for the whole source (`hf`: the
    HFSpec of a Hugging Face source, with the fields its records keep)."""
    if unit.kind == "shard":  # a stream's shard, its records batched here as `plan` batches the stream's
        yield from batch_records(i, src, shard_records(hf, unit.start, unit.end, max(unit.first_line, 1) - 1,
                                                       src.version))  # fmt: skip
    elif unit.kind == "row_group":
        yield WorkItem(i, unit.start, "parquet", locator=unit.start, nbytes=unit.nbytes)
    elif unit.kind == "rows":  # a saved Hugging Face split: items of RECORDS_PER_ITEM rows, as `plan` batches them
        for a in range(unit.start, unit.end, RECORDS_PER_ITEM) if unit.end > unit.start else [0]:
            yield WorkItem(i, a // RECORDS_PER_ITEM, "hf_rows", locator=a,
                           payload=min(unit.end, a + RECORDS_PER_ITEM), nbytes=0)  # fmt: skip
    elif unit.kind == "range":
        paragraph = src.fmt == "text" and text_mode != "line"
        items = _plan_lines(i, src, paragraph, (unit.start, unit.end, unit.first_line))
        first = next(items, None)
        if first is not None:  # --text-mode auto counts a file it splits into paragraphs once
            auto = unit.start == 0 and src.fmt == "text" and text_mode == "auto" and not src.piped
            yield replace(first, split_file=auto and first.kind == "lines")
            yield from items
    else:
        for item in plan([src], text_mode, text_field, max_chars=max_chars):  # source 0 of one: renumbered
            yield replace(item, source=i, payload=[i] if item.kind == "files" else item.payload)


def _boundaries(src: Source, unit_bytes: int, paragraph: bool) -> list[int]:
    """Record boundaries (offsets just past a newline, or past a blank line's last newline)
    at or after each multiple of unit_bytes, increasing; one that reaches the end is dropped."""
    found: list[int] = []
    size = src.size
    with open_raw(src) as f:
        for target in range(unit_bytes, size, unit_bytes):
            if found and found[-1] >= target:
                continue  # a long record already carried the last cut past this multiple
            cut = _next_boundary(f, target, size, paragraph)
            if cut is None:
                break
            found.append(cut)
    return found


def _next_boundary(f: Any, target: int, size: int, paragraph: bool) -> int | None:
    """The first boundary ending at or after `target` (and before `size`): just past a newline,
    or for paragraphs just past the newline that ends a blank line (LF or CRLF)."""
    patterns = (b"\n\n", b"\n\r\n") if paragraph else (b"\n",)
    back = max(len(p) for p in patterns)
    at = max(0, target - back)
    while at < size:
        f.seek(at)
        data = f.read(_WINDOW + back)
        hits = [k + len(p) for p in patterns if (k := data.find(p, max(0, target - len(p) - at))) >= 0]
        if hits:
            cut = at + min(hits)
            return cut if cut < size else None
        if len(data) <= back:
            return None
        at += len(data) - back  # overlap by a pattern's length: one split across windows is found
    return None


def assign(units: list[Unit], n_tasks: int) -> list[tuple[int, int]]:
    """Each task's units as a contiguous range [first, end) of the plan, balanced by bytes: a
    task takes units until it passes its share of the total, always at least one while every
    later task can still have one (with fewer units than tasks, the first tasks stay empty)."""
    if n_tasks < 1:
        raise ConfigError(f"--num-tasks {n_tasks}: pass at least 1")
    total = sum(u.nbytes for u in units) or 1
    ranges, first, done = [], 0, 0
    for t in range(n_tasks):
        last = t == n_tasks - 1
        share = total * (t + 1) / n_tasks
        limit = len(units) if last else max(first, len(units) - (n_tasks - t - 1))  # a unit for each later task
        end = first
        while end < limit and (last or end == first or done + units[end].nbytes / 2 <= share):
            done += units[end].nbytes
            end += 1
        ranges.append((first, end))
        first = end
    return ranges


def make_plan(fingerprint: dict[str, Any], sources: list[Source], units: list[Unit], n_tasks: int,
              unit_bytes: int = UNIT_BYTES, hf: Any = None, workers: int = 1) -> dict[str, Any]:  # fmt: skip
    """The plan in memory: the run's fingerprint (see claim.py), the sources (with the identity
    the fingerprint gave each: its modification time or version), units and tasks; the dedup
    buckets sized to the inputs' bytes (`hf`: a Hugging Face source's HFSpec, whose are guessed),
    and their groups to the bytes and the processes (`workers` per task)."""
    total = sum(s.size for s in sources) + (source_bytes(hf) if hf is not None else 0)
    buckets = bucket_count(total)
    return {"version": PLAN_VERSION, "n_tasks": n_tasks, "unit_bytes": unit_bytes, "fingerprint": fingerprint,
            "buckets": buckets, "groups": group_count(buckets, n_tasks, total, n_tasks * workers),
            "sources": [source_row(s, ident) for s, ident in zip(sources, fingerprint["sources"], strict=True)],
            "units": [[u.source, u.kind, u.start, u.end, u.nbytes] for u in units],
            "tasks": [list(r) for r in assign(units, n_tasks)]}  # fmt: skip


def _head(plan: dict[str, Any]) -> dict[str, Any]:
    """What plan.json holds: the plan but its tables, and the fingerprint but its inputs."""
    head = {k: v for k, v in plan.items() if k not in ("units", "tasks", "sources")}
    head["fingerprint"] = {k: v for k, v in plan["fingerprint"].items() if k != "sources"}
    head |= {"n_units": len(plan["units"]), "n_sources": len(plan["sources"])}
    return head


def ensure_plan(work: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """The plan in `work`: created from `plan` if absent, else the existing one, refused if it
    was made for another configuration or task count."""
    path = work / PLAN_FILE
    if not path.exists():
        work.mkdir(parents=True, exist_ok=True)
        tmp = work / f".{PLAN_FILE}.{os.getpid()}.tmp"
        # The tasks read their inputs from the plan, so a URL's credentials must stay in it: then
        # only its owner may read it (it goes with the work folder once the dataset is complete).
        inputs = [str(i) for i in plan.get("prepare", {}).get("inputs", [])] + [str(s[5]) for s in plan["sources"]]
        private = any(has_credentials(i) for i in inputs)
        write_tables(work, plan["units"], plan["tasks"], plan["sources"], private)  # (before the head: its marker)
        atomic_write_json(tmp, _head(plan), private=private)
        try:
            os.link(tmp, path)  # fails if another task created it first: then validate theirs
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    existing = load_plan(work)
    why = plan_difference(existing, plan)
    if why is not None:
        raise ConfigError(f"{path} was made for another run: {why}; run with the plan's options, or delete {work} "
                          "to plan again")  # fmt: skip
    return existing


def load_plan(work: Path) -> dict[str, Any]:
    """The plan's head with its tables as sequences read a row at a time (plantables.py)."""
    path = work / PLAN_FILE
    try:
        plan = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no plan; run `lmshard prepare ... --num-tasks N` first") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable plan ({e}); delete {work} and plan again") from None
    if not isinstance(plan, dict) or plan.get("version") != PLAN_VERSION:
        raise InputError(f"{path}: plan version {plan.get('version') if isinstance(plan, dict) else None!r} is not "
                         f"{PLAN_VERSION}; delete {work} and plan again with this lmshard")  # fmt: skip
    plan["units"] = UnitTable(work / UNITS, plan["n_units"])
    plan["tasks"] = TaskTable(work / TASKS, plan["n_tasks"])
    plan["sources"] = SourceTable(work / SOURCES, plan["n_sources"])
    return plan


def plan_difference(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """What differs between a stored plan and a run's (`new["fingerprint"]` without "sources":
    a task's, which checks the inputs it reads as it reads them)."""
    if old.get("n_tasks") != new["n_tasks"]:
        return f"--num-tasks was {old.get('n_tasks')} and is {new['n_tasks']} now"
    if old.get("unit_bytes") != new["unit_bytes"]:
        return f"the unit size was {old.get('unit_bytes')} bytes and is {new['unit_bytes']} now"
    stored = dict(old.get("fingerprint", {}))
    if "sources" in new["fingerprint"]:  # the planner's: every input, as the plan recorded it
        stored["sources"] = [identity(r) for r in old["sources"]]
    return difference(stored, new["fingerprint"])


def units_of(plan: dict[str, Any], task: int) -> list[Unit]:
    """Task `task`'s units."""
    n = plan["n_tasks"]
    if not 0 <= task < n:
        raise ConfigError(f"task {task} is not in [0, {n}); the plan has {n} tasks (numbered from 0)")
    first, end = plan["tasks"][task]
    return [Unit(*u) for u in plan["units"][first:end]]


def describe(plan: dict[str, Any]) -> dict[str, Any]:
    """Sizes for a status line: units, tasks, bytes per task (min/max)."""
    per_task = [sum(u[4] for u in plan["units"][a:b]) for a, b in plan["tasks"]]
    return {"units": len(plan["units"]), "tasks": plan["n_tasks"], "bytes": sum(per_task),
            "task_bytes_min": min(per_task), "task_bytes_max": max(per_task)}  # fmt: skip
