"""A prepare run's inputs cut into units, the pieces of work a plan deals to its tasks
(taskplan.py). Inputs are enumerated as `prepare` does (sorted paths, `discover`), then cut:

- an uncompressed line-based file (JSON lines, text read by line or by paragraph, and text that
  --text-mode auto splits into paragraphs) larger than `unit_bytes` into byte ranges that start
  just past a record boundary (a newline; a blank line for paragraphs), found by reading a few
  KB at each multiple of `unit_bytes`, never the whole file;
- a parquet file into its row groups; a saved or downloaded (--no-streaming) Hugging Face
  split into ranges of rows; a Hugging Face stream into its shards (data files);
- anything else (compressed files, CSV, JSON arrays, arrow, small files) is one unit; and
  consecutive files smaller than `unit_bytes` are one unit together (kind `files`), up to
  `unit_bytes` in all, so that a directory of many small files is not as many units, each with
  its own work files in every stage.

Units concatenated in plan order are exactly the input in `prepare`'s order, and `unit_items`
gives a unit's work items with the lines (and line numbers: a range's first line number is found
by the task that tokenizes it) that the single-machine plan gives, so the stages that take the
units' documents in plan order (stages.py) see the single-machine document sequence.

Memory model: one entry per unit (a few dozen bytes); a 64 KiB read window while cutting
(planning reads a few KB at each cut, never a whole file).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...errors import ConfigError
from ..documents.columnar import parquet_row_groups
from ..documents.files import Source, first_byte, open_raw
from ..documents.hfread import mapped, mapped_rows, row_records, shard_records, stream_shards
from ..documents.records import binary_record
from ..documents.sources import BLOCK_BYTES, RECORDS_PER_ITEM, WorkItem, _plan_lines, batch_records, plan

# A unit of a large line-based file: ~20 s of one core's tokenizing (LMSHARD_UNIT_BYTES: for benchmarks).
UNIT_BYTES = int(os.environ.get("LMSHARD_UNIT_BYTES", 64 << 20))
_WINDOW = 64 << 10
_LINE_FORMATS = ("jsonl", "text")


@dataclass(frozen=True)
class Unit:
    """Part of one source: the whole file, the bytes [start, end), parquet row group `start`, a
    saved or downloaded Hugging Face split's rows [start, end), or shard `start` of a stream's `end` shards;
    or whole sources [start, end) (`files`: `source` is the first)."""

    source: int
    kind: str  # file | range | row_group | rows | shard | files
    start: int
    end: int
    nbytes: int  # input bytes it accounts for, for balancing
    first_line: int = 1  # the number of a range's first line in its file (for messages); 0: not known yet


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


def cut_units(sources: list[Source], text_mode: str, max_chars: int, unit_bytes: int = UNIT_BYTES,
              hf: Any = None, n_tasks: int = 1) -> list[Unit]:  # fmt: skip
    """Every source as units, in input order (see the module docstring). `hf`: the HFSpec of a
    Hugging Face source: a saved or downloaded split cut into ranges of rows (sized to
    `n_tasks`), a stream into its shards."""
    if unit_bytes < _WINDOW:
        raise ConfigError(f"unit_bytes={unit_bytes} is below {_WINDOW}; pass at least {_WINDOW} bytes")
    units: list[Unit] = []
    for i, src in enumerate(sources):
        if src.stream:
            name = "stdin" if src.path == "-" else src.path
            raise ConfigError(f"{name}: a scale-out run reads files that every task can open; save the input to a "
                              "file")  # fmt: skip
        if src.fmt == "hf":
            units.extend(_cut_rows(i, hf, n_tasks) if mapped(hf) else _cut_shards(i, hf))
            continue
        units.extend(_cut(i, src, text_mode, max_chars, unit_bytes))
    return _grouped(units, unit_bytes)


def _grouped(units: list[Unit], unit_bytes: int) -> list[Unit]:
    """Runs of consecutive whole files, each smaller than `unit_bytes`, as units of several
    files, up to `unit_bytes` in all (one file alone stays a `file` unit)."""
    out: list[Unit] = []
    run: list[Unit] = []
    size = 0  # the run's bytes

    def close() -> None:
        nonlocal size
        if len(run) > 1:
            out.append(Unit(run[0].source, "files", run[0].source, run[-1].source + 1, size))
        else:
            out.extend(run)
        run.clear()
        size = 0

    for unit in units:
        small = unit.kind == "file" and unit.nbytes < unit_bytes
        if not small or (run and size + unit.nbytes > unit_bytes):
            close()
        if small:
            run.append(unit)
            size += unit.nbytes
        else:
            out.append(unit)
    close()
    return out


SIZED = ("file", "range", "row_group", "files")  # the kinds of unit whose `nbytes` are bytes of input
MIN_ROWS, ROWS_PER_UNIT = 256, 8 * RECORDS_PER_ITEM  # a saved Hugging Face split's rows per unit, at most


def _cut_rows(i: int, hf: Any, n_tasks: int) -> list[Unit]:
    """A mapped Hugging Face split (saved, or downloaded with --no-streaming) as units of rows:
    about UNITS_PER_TASK per task, from MIN_ROWS to ROWS_PER_UNIT rows each (the last one
    shorter); a unit's rows stand for its bytes when tasks are balanced."""
    n = mapped_rows(hf)
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


def unit_items(sources: Sequence[Source], unit: Unit, text_mode: str, text_field: str, max_chars: int,
               hf: Any = None) -> Iterator[WorkItem]:  # fmt: skip
    """The work items of one unit: concatenated over a source's units in plan order, the same
    records, with the same line numbers, as `sources.plan` gives for the whole source (`hf`: the
    HFSpec of a Hugging Face source, with the fields its records keep)."""
    i, src = unit.source, sources[unit.source]
    if unit.kind == "shard":  # a stream's shard, its records batched here as `plan` batches the stream's
        yield from batch_records(i, src, shard_records(hf, unit.start, unit.end, max(unit.first_line, 1) - 1,
                                                       src.version))  # fmt: skip
    elif unit.kind == "row_group":
        yield WorkItem(i, unit.start, "parquet", locator=unit.start, nbytes=unit.nbytes)
    elif unit.kind == "rows":  # a mapped Hugging Face split: items of RECORDS_PER_ITEM rows, as `plan` batches them,
        for a in range(unit.start, unit.end, RECORDS_PER_ITEM) if unit.end > unit.start else [0]:  # read here
            b = min(unit.end, a + RECORDS_PER_ITEM)
            yield WorkItem(i, a // RECORDS_PER_ITEM, "records", payload=list(row_records(hf, a, b, src.version)),
                           nbytes=0)  # fmt: skip
    elif unit.kind == "range":
        paragraph = src.fmt == "text" and text_mode != "line"
        items = _plan_lines(i, src, paragraph, (unit.start, unit.end, unit.first_line))
        first = next(items, None)
        if first is not None:  # --text-mode auto counts a file it splits into paragraphs once
            auto = unit.start == 0 and src.fmt == "text" and text_mode == "auto" and not src.piped
            yield replace(first, split_file=auto and first.kind == "lines")
            yield from items
    else:  # whole files: their sources renumbered from the unit's first
        a, b = (unit.start, unit.end) if unit.kind == "files" else (i, i + 1)
        for item in plan(list(sources[a:b]), text_mode, text_field, max_chars=max_chars):
            yield replace(item, source=item.source + a,
                          payload=[s + a for s in item.payload] if item.kind == "files" else item.payload)


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
