"""Input discovery and planning: files, directories and globs become an ordered list of sources,
and each source becomes an ordered stream of work items for the tokenizing workers.

A work item is the unit of parallel work: a newline-aligned block of a line-based file (about
1 MiB), a group of small whole-text files, one parquet row group, one arrow record batch, or a
batch of records parsed here for formats that cannot be split by bytes (CSV, JSON arrays). The
order of sources and of items within a source never depends on the number of workers, so the
output does not either.

Memory model: one block (≤ BLOCK_BYTES plus one record of at most MAX_RECORD_BYTES) at a time
in this process; parquet/arrow items carry only a locator, and the worker reads the data itself.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..errors import InputError
from .files import (
    MAX_RECORD_BYTES,
    Source,
    arrow_batches,
    detect,
    known_type,
    open_arrow,
    open_binary,
    parquet_row_groups,
)
from .records import Record, binary_record, example, iter_csv, iter_json_array, settle

BLOCK_BYTES = 1 << 20  # bytes of input per work item for line-based formats (4 MiB: +130 MB peak RSS, no faster)
FILES_PER_ITEM = 256  # small whole-text files are grouped to amortise inter-process overhead
RECORDS_PER_ITEM = 2048  # records per item for formats parsed in the planning process


@dataclass(frozen=True)
class WorkItem:
    """One unit of worker input. `payload` is raw bytes (line formats), a list of texts (records
    parsed here), a list of source indices (whole files), or None (worker reads `locator`)."""

    source: int
    seq: int
    kind: str  # lines | texts | files | parquet | arrow
    first_line: int = 1
    payload: Any = None
    locator: int = 0
    nbytes: int = 0  # input bytes this item accounts for, for progress
    skipped: dict[str, int] = field(default_factory=dict)  # records dropped while planning, by problem
    examples: dict[str, str] = field(default_factory=dict)  # the first such record of each problem
    line_keep: tuple[bytes, int] | None = None  # line dedup: packed keep-bits of its lines, count


def discover(inputs: list[str], fmt_override: str | None = None, exclude: list[str] | None = None) -> list[Source]:
    """Expand files, directories (recursively, sorted by path) and globs into sources, leaving
    out paths that match any `exclude` glob (fnmatch against the whole path)."""
    sources: list[Source] = []
    for spec in inputs:
        if spec == "-":
            sources.append(detect("-", fmt_override))
            continue
        if os.path.isdir(spec):
            paths = sorted(str(p) for p in Path(spec).rglob("*") if p.is_file() and known_type(p, fmt_override))
        elif os.path.exists(spec):
            paths = [spec]
        else:
            paths = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
        paths = [p for p in paths if not any(fnmatch.fnmatch(p, pat) for pat in exclude or ())]
        if not paths:
            raise InputError(f"{spec}: no input files found (check the path, glob or --exclude)")
        sources.extend(detect(p, fmt_override) for p in paths)
    return sources


def plan(sources: list[Source], text_mode: str, text_field: str, on_error: str, hf: Any = None) -> Iterator[WorkItem]:
    """All work items of all sources, in input order. `hf` is the `HFSpec` of an "hf" source."""
    files: list[int] = []
    files_bytes = 0
    for i, src in enumerate(sources):
        whole_file = src.fmt == "text" and text_mode == "file" and src.path != "-"
        if whole_file:
            files.append(i)
            files_bytes += src.size
            if len(files) < FILES_PER_ITEM and files_bytes < BLOCK_BYTES:
                continue
        if files:
            yield WorkItem(files[0], 0, "files", payload=files, nbytes=files_bytes)
            files, files_bytes = [], 0
        if whole_file:
            continue
        yield from _plan_source(i, src, text_mode, text_field, on_error, hf)
    if files:
        yield WorkItem(files[0], 0, "files", payload=files, nbytes=files_bytes)


def _plan_source(i: int, src: Source, text_mode: str, text_field: str, on_error: str, hf: Any) -> Iterator[WorkItem]:
    if src.fmt == "hf":
        from .hf import hf_records

        yield from _batch_records(i, src, (settle(src, r, on_error) for r in hf_records(hf)))
    elif src.fmt == "parquet":
        yield from _plan_parquet(i, src)
    elif src.fmt == "arrow":
        yield from _plan_arrow(i, src)
    elif src.fmt in ("csv", "json"):
        parse = iter_csv if src.fmt == "csv" else iter_json_array
        yield from _batch_records(i, src, parse(src, text_field, on_error))
    else:
        paragraph = src.fmt == "text" and text_mode == "paragraph"
        yield from _plan_lines(i, src, paragraph, on_error)


def _plan_lines(i: int, src: Source, paragraph: bool, on_error: str) -> Iterator[WorkItem]:
    """Newline-aligned blocks (blank-line-aligned for paragraphs) of a line-based file."""
    stream, raw = open_binary(src)
    try:
        carry, line, seq, last_pos = b"", 1, 0, 0
        while True:
            block = stream.read(BLOCK_BYTES)
            if seq == 0 and not carry and (binary := binary_record(block)):
                settle(src, binary, on_error)
                yield WorkItem(i, 0, "texts", payload=[], skipped={"binary_file": 1},
                               examples={"binary_file": example(src, binary)}, nbytes=src.size)  # fmt: skip
                return
            data = carry + block
            if not block:
                if data:
                    yield WorkItem(i, seq, "lines", line, data, nbytes=_delta(raw, last_pos))
                return
            cut = _last_boundary(data, paragraph)
            if cut < 0:
                if len(data) > MAX_RECORD_BYTES:
                    raise InputError(
                        f"{src.path}:{line}: a record longer than {MAX_RECORD_BYTES >> 20} MiB "
                        "with no line break; split the file into records, one per line"
                    )
                carry = data
                continue
            chunk, carry = data[:cut], data[cut:]
            pos = raw.tell() if src.path != "-" else last_pos
            yield WorkItem(i, seq, "lines", line, chunk, nbytes=pos - last_pos)
            last_pos = pos
            line += chunk.count(b"\n")
            seq += 1
    finally:
        if src.path != "-":
            raw.close()


def _delta(raw: IO[bytes], last: int) -> int:
    try:
        return raw.tell() - last
    except (OSError, ValueError):
        return 0


def _last_boundary(data: bytes, paragraph: bool) -> int:
    """Index just past the last record boundary in `data`, or -1."""
    if paragraph:
        cut = max(data.rfind(b"\n\n"), data.rfind(b"\n\r\n"))
        if cut < 0:
            return -1
        return data.index(b"\n", cut + 1) + 1
    cut = data.rfind(b"\n")
    return cut + 1 if cut >= 0 else -1


def _batch_records(i: int, src: Source, records: Iterator[Record]) -> Iterator[WorkItem]:
    """Group settled records into items of RECORDS_PER_ITEM texts; records with a problem
    (only there under --on-error skip) are counted, with the first example of each."""
    texts: list[tuple[int, str]] = []
    skipped: dict[str, int] = {}
    examples: dict[str, str] = {}
    seq = 0
    for record in records:
        if record.text is None:
            problem = str(record.problem)
            skipped[problem] = skipped.get(problem, 0) + 1
            examples.setdefault(problem, example(src, record))
        else:
            texts.append((record.number, record.text))
        if len(texts) >= RECORDS_PER_ITEM:
            yield WorkItem(i, seq, "texts", payload=texts, skipped=skipped, examples=examples)
            texts, skipped, examples, seq = [], {}, {}, seq + 1
    if texts or skipped or seq == 0:
        yield WorkItem(i, seq, "texts", payload=texts, skipped=skipped, examples=examples, nbytes=src.size)


def _plan_parquet(i: int, src: Source) -> Iterator[WorkItem]:
    n = parquet_row_groups(src)
    for rg in range(n):
        yield WorkItem(i, rg, "parquet", locator=rg, nbytes=src.size // max(n, 1))
    if n == 0:
        yield WorkItem(i, 0, "texts", payload=[], nbytes=src.size)


def _plan_arrow(i: int, src: Source) -> Iterator[WorkItem]:
    n = sum(1 for _ in arrow_batches(open_arrow(src.path)))
    for b in range(n):
        yield WorkItem(i, b, "arrow", locator=b, nbytes=src.size // max(n, 1))
    if n == 0:
        yield WorkItem(i, 0, "texts", payload=[], nbytes=src.size)
