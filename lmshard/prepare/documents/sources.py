"""Input discovery and planning: files, directories, globs and URLs become an ordered list of
sources, and each source becomes an ordered stream of work items for the tokenizing workers.

A work item is the unit of parallel work: a newline-aligned block of a line-based file (about
1 MiB), a group of small whole-text files, one parquet row group, one arrow record batch, or a
batch of records parsed here for formats that cannot be split by bytes (CSV, JSON arrays, an
arrow file at a URL, read once in order). An object at a URL is planned as a local file is,
its blocks read in ranged requests (`urlfile.py`). The order of sources and of items within a
source never depends on the number of workers, so the output does not either. Records that
cannot be read travel in items like any other, and the workers apply --on-error to them, so the
first bad record in input order is the one reported.

Text files (`--text-mode auto`, the default) are one document each when they hold at most
--max-chars bytes, and otherwise blank-line-separated paragraphs, planned as blocks like any
line-based file; the first item of such a file is marked, and the workers count it per source
under SPLIT_INTO_PARAGRAPHS.

Memory model: one block (≤ BLOCK_BYTES plus one record of at most MAX_RECORD_BYTES) at a time
in this process (and one fetched block of an object at a URL, `urlfile.READ_BYTES`); parquet and
arrow items carry only a locator, and the worker reads the data itself.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ...errors import InputError, warn
from ...format import SkippedInputs
from ...remote.urls import is_url
from .clean import CleanConfig
from .columnar import arrow_batches, arrow_records, open_arrow, parquet_row_groups
from .decompress import DamagedInput
from .files import (
    MAX_RECORD_BYTES,
    Source,
    detect,
    first_byte,
    fits,
    open_binary,
    read_prefix,
)
from .inputspec import with_format
from .reading import InputReadError, grew
from .records import Record, bad, binary_record, damaged_record
from .streamed import iter_csv, iter_json_array
from .urlwalk import find_url, nothing_at_url, url_source
from .walk import Rules, Walk, describe, find, nothing_to_read

# Bytes of input per work item for line-based formats (4 MiB: +130 MB peak RSS, no faster). The output does not
# depend on it but for a zstd dataset's dictionary, sampled by work item (output/dictfile.py); LMSHARD_BLOCK_BYTES
# sets it for fault tests and benchmarks, and is in the fingerprint.
BLOCK_BYTES = int(os.environ.get("LMSHARD_BLOCK_BYTES", 1 << 20))
FILES_PER_ITEM = 256  # small whole-text files are grouped to amortise inter-process overhead
RECORDS_PER_ITEM = 2048  # records per item for formats parsed in the planning process
SPLIT_INTO_PARAGRAPHS = "split_into_paragraphs"  # per-source count: a text file over --max-chars bytes (auto mode)
GREW = "grew"  # per-source count: a file that grew while the run read it (read to its size at the start)


@dataclass(frozen=True)
class WorkItem:
    """One unit of worker input. `payload` is raw bytes (line formats), a list of `Record`s
    (parsed here, bad ones included), a list of source indices (whole files), or None (worker
    reads `locator`)."""

    source: int
    seq: int
    kind: str  # lines | records | files | parquet | arrow
    first_line: int = 1
    payload: Any = None
    locator: int = 0
    nbytes: int = 0  # input bytes this item accounts for, for progress
    split_file: bool = False  # the first item of a text file split into paragraphs by --text-mode auto
    line_keep: tuple[bytes, int] | None = None  # line dedup: packed keep-bits of its lines, count


class Sources(list[Source]):
    """The sources of a run, in input order, with what the directory walks left out: `skipped`
    (recorded in the metadata) and `hint`, a warning for skipped files that look like text."""

    def __init__(self, sources: Iterable[Source] = (), skipped: SkippedInputs | None = None,
                 hint: str | None = None) -> None:  # fmt: skip
        super().__init__(sources)
        self.skipped = skipped if skipped is not None else SkippedInputs()
        self.hint = hint


def discover(inputs: list[str], fmt_override: str | None = None, exclude: list[str] | None = None, *,
             include_hidden: bool = False, own: str | os.PathLike[str] | None = None) -> Sources:  # fmt: skip
    """Expand files, directories (recursively, sorted by path, by the rules of `walk.py`),
    globs, and URLs of objects, globs and prefixes (`urlwalk.py`) into sources, leaving out
    paths that match any `exclude` glob (fnmatch against the whole path or URL). An input that
    leaves nothing to read fails, saying what was skipped. An input written `FORMAT:INPUT`
    (`with_format`) is read in that format, whatever `fmt_override` (--format) says. `own`: the
    run's --out, whose dataset, build and work folder are not counted (walk.Rules)."""
    sources: list[Source] = []
    walks: list[Walk] = []
    for given in inputs:
        fmt, spec = with_format(given)  # `text:DIR`: this input's own format
        fmt = fmt or fmt_override
        rules = Rules(fmt, include_hidden, tuple(exclude or ()), None if own is None or is_url(str(own)) else
                      os.path.abspath(own))  # fmt: skip
        if spec == "-":
            sources.append(detect("-", fmt))
            continue
        if is_url(spec):  # an object, a glob's matches or a prefix's objects (urlwalk.py)
            found, listed = find_url(spec, rules)
            if not found.taken:
                raise nothing_at_url(spec, found)
            sources.extend(url_source(u, listed[u], fmt) for u in found.taken)
        else:
            found = find(spec, rules)
            if not found.taken and not _all_excluded(spec, found):
                raise nothing_to_read(spec, found)
            sources.extend(detect(p, fmt) for p in found.taken)
        walks.append(found)
    if not sources and walks:  # (every input a file or glob that --exclude left out, counted)
        raise InputError(f"{inputs[0]}: --exclude leaves out every input file named; nothing to read")
    skipped = sum((w.skipped() for w in walks), SkippedInputs())
    hint = skipped.text_hint(files_read=len(sources))
    warnings = [f"skipped {describe(skipped)}; {hint}"] if hint else []
    matched = set().union(*(w.matched for w in walks))
    for pattern in [p for p in exclude or () if p not in matched]:  # matched against each file's whole path
        warnings.append(f"--exclude {pattern} matched no input file (a pattern is matched against each file's "
                        "whole path as found: DIR/* leaves a directory out, */NAME a file by its name)")  # fmt: skip
    if unreadable := [d for w in walks for d in w.unreadable]:  # a whole directory of data left out: say which
        more = skipped.unreadable_dirs - len(unreadable[:3])
        warnings.append(f"could not list {', '.join(unreadable[:3])}{f' and {more} more' if more > 0 else ''}; "
                        "their files are not read: fix the permissions, or --exclude them")  # fmt: skip
    return Sources(sources, skipped, "; ".join(warnings) or None)


def _all_excluded(spec: str, found: Any) -> bool:
    """Whether `spec`, a local file or glob (not a directory, whose emptiness is worth an error),
    named only files that --exclude left out: counted, not an error."""
    return found.excluded > 0 and not found.unknown and not found.hidden_files and not os.path.isdir(spec)


def plan(sources: list[Source], text_mode: str, text_field: str, on_error: str = "fail", hf: Any = None,
         *, max_chars: int = CleanConfig.max_chars) -> Iterator[WorkItem]:  # fmt: skip
    """All work items of all sources, in input order. `hf` is the `HFSpec` of an "hf" source;
    `max_chars` decides which text files --text-mode auto splits. `on_error` is applied by the
    workers (`records.settle`), not here."""
    files: list[int] = []
    files_bytes = 0
    for i, src in enumerate(sources):
        whole_file = _whole_file(src, text_mode, max_chars)
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
        yield from _plan_source(i, src, text_mode, text_field, hf)
    if files:
        yield WorkItem(files[0], 0, "files", payload=files, nbytes=files_bytes)


def _whole_file(src: Source, text_mode: str, max_chars: int) -> bool:
    """Whether a source is read as one document: a text file in file mode (stdin or a pipe too,
    once a planned run saved it), or in auto mode when it holds at most `max_chars` bytes (so at
    most that many characters), never for stdin or a pipe."""
    if src.fmt != "text" or src.stream:
        return False
    return text_mode == "file" or (text_mode == "auto" and not src.piped and fits(src, max_chars))


def _plan_source(i: int, src: Source, text_mode: str, text_field: str, hf: Any) -> Iterator[WorkItem]:
    if src.fmt == "hf":
        from .hfread import hf_records

        yield from batch_records(i, src, hf_records(hf))
    elif src.fmt == "parquet":
        yield from _plan_parquet(i, src)
    elif src.fmt == "arrow" and src.url:  # read once, here: an IPC stream is only read in order
        yield from batch_records(i, src, arrow_records(src, text_field))
    elif src.fmt == "arrow":
        yield from _plan_arrow(i, src)
    elif src.fmt == "csv":
        yield from batch_records(i, src, iter_csv(src, text_field))
    elif src.fmt == "json" and (src.stream or first_byte(src) == b"["):  # a stream cannot be sniffed, then read
        yield from batch_records(i, src, iter_json_array(src, text_field))
    elif src.fmt == "json" and (spread := spread_value(src)) is not None:  # neither an array nor JSON lines
        yield WorkItem(i, 0, "records", payload=[spread], nbytes=src.size)
    elif src.fmt == "text" and text_mode == "auto" and not src.piped:
        items = _plan_lines(i, src, paragraph=True)
        first = next(items, None)
        if first is not None:
            yield replace(first, split_file=first.kind == "lines")
            yield from items
    else:  # JSON lines (also a .json file that holds them), and text by line or paragraph
        yield from _plan_lines(i, src, paragraph=src.fmt == "text" and by_paragraph(text_mode))


def spread_value(src: Source) -> Record | None:
    """For a `.json` file that is not an array: the "not_records" record when its first JSON
    value spans lines (one pretty-printed object, say), so it is no JSON lines either. None
    when its first line is a whole value, or nothing says otherwise: read as JSON lines, where
    a bad line is reported as such."""
    try:
        text = read_prefix(src, SPREAD_SNIFF_BYTES)[:SPREAD_SNIFF_BYTES].decode("utf-8", "surrogateescape")
    except DamagedInput:
        return None  # the line reader reports the damage where it starts
    start = len(text) - len(text.lstrip(" \t\r\n\ufeff"))  # JSON whitespace, and a byte-order mark
    end_of_line = text.find("\n", start)
    try:
        json.loads(text[start : end_of_line if end_of_line >= 0 else None])
        return None
    except (json.JSONDecodeError, RecursionError):
        pass
    first = 1 + text.count("\n", 0, start)
    try:
        _, end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as e:
        # A value still open where the sniffed bytes end (a large pretty-printed object): it spans lines past them
        if len(text) >= SPREAD_SNIFF_BYTES and e.pos >= len(text) - TRUNCATED_SLACK and text.count("\n", start) > 1:
            return bad(first, "not_records", f"one JSON value from line {first} running past its first "
                                             f"{SPREAD_SNIFF_BYTES >> 20} MiB, not one record per line")  # fmt: skip
        return None
    except RecursionError:
        return None
    last = first + text.count("\n", start, end)
    if last == first:
        return None
    return bad(first, "not_records", f"one JSON object over lines {first}-{last}, not one record per line")


SPREAD_SNIFF_BYTES = 1 << 20  # bytes of a .json file decoded to find a first value that spans lines
TRUNCATED_SLACK = 1 << 16  # a decoding error this close to the sniff's end is the value running past it


def by_paragraph(text_mode: str) -> bool:
    """Whether text read in blocks is split into paragraphs (auto, paragraph) or lines."""
    return text_mode != "line"


def _plan_lines(i: int, src: Source, paragraph: bool, span: tuple[int, int, int] | None = None) -> Iterator[WorkItem]:
    """Newline-aligned blocks (blank-line-aligned for paragraphs) of a line-based file. Damaged
    compressed data ends the file with one bad record where the damage starts. `span`: only the
    bytes [start, end) of an uncompressed file, whose first line is number `first_line` (a
    scale-out unit, which starts on a record boundary)."""
    start, end, first_line = span if span is not None else (0, None, 1)
    stream, raw = open_binary(src, start)
    try:
        carry, line, seq, last_pos = b"", first_line, 0, start
        while True:
            want = BLOCK_BYTES if end is None else min(BLOCK_BYTES, end - raw.tell())
            try:
                block = stream.read(want)
            except InputReadError as e:
                raise e.at(src.path, line) from None
            except DamagedInput as e:  # `carry` holds the line (or paragraph) the damage cut
                record = damaged_record(line, e, f"{line - 1:,} lines")
                yield WorkItem(i, seq, "records", payload=[record], nbytes=raw.tell() - last_pos)
                return
            if seq == 0 and start == 0 and not carry and (binary := binary_record(block)):
                yield WorkItem(i, 0, "records", payload=[binary], nbytes=src.size)
                return
            data = carry + block
            if not block:
                if data:
                    yield WorkItem(i, seq, "lines", line, data, nbytes=raw.tell() - last_pos)
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
            pos = raw.tell()
            yield WorkItem(i, seq, "lines", line, chunk, nbytes=pos - last_pos)
            last_pos = pos
            line += chunk.count(b"\n")
            seq += 1
    finally:
        raw.close()


def _last_boundary(data: bytes, paragraph: bool) -> int:
    """Index just past the last record boundary in `data`, or -1."""
    if paragraph:
        cut = max(data.rfind(b"\n\n"), data.rfind(b"\n\r\n"))
        if cut < 0:
            return -1
        return data.index(b"\n", cut + 1) + 1
    cut = data.rfind(b"\n")
    return cut + 1 if cut >= 0 else -1


def batch_records(i: int, src: Source, records: Iterator[Record]) -> Iterator[WorkItem]:
    """Group records, bad ones included, into items of RECORDS_PER_ITEM."""
    batch: list[Record] = []
    seq = 0
    for record in records:
        batch.append(record)
        if len(batch) >= RECORDS_PER_ITEM:
            yield WorkItem(i, seq, "records", payload=batch)
            batch, seq = [], seq + 1
    if batch or seq == 0:
        yield WorkItem(i, seq, "records", payload=batch, nbytes=src.size)


def _plan_parquet(i: int, src: Source) -> Iterator[WorkItem]:
    n = parquet_row_groups(src)
    for rg in range(n):
        yield WorkItem(i, rg, "parquet", locator=rg, nbytes=src.size // max(n, 1))
    if n == 0:
        yield WorkItem(i, 0, "records", payload=[], nbytes=src.size)


def _plan_arrow(i: int, src: Source) -> Iterator[WorkItem]:
    n = sum(1 for _ in arrow_batches(open_arrow(src)))
    for b in range(n):
        yield WorkItem(i, b, "arrow", locator=b, nbytes=src.size // max(n, 1))
    if n == 0:
        yield WorkItem(i, 0, "records", payload=[], nbytes=src.size)


def note_growth(sources: list[Source], per_source: dict[int, Counter[str]]) -> None:
    """Count (GREW) and warn about the files that are larger now than when the run started:
    each was read up to the size it had then (its last line only if whole), so the rest is not
    in the output."""
    for i, src in enumerate(sources):
        if src.inode and grew(src.path, src.size, src.inode):
            per_source.setdefault(i, Counter())[GREW] = 1
            warn(f"{src.path}: grew while the run read it; read up to the {src.size:,} bytes it held when the run "
                 "started (its last line only if whole): run again once it is complete to include the rest")
