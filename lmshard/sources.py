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

import bz2
import fnmatch
import glob
import gzip
import io
import lzma
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from .errors import InputError, missing_dependency

BLOCK_BYTES = 1 << 20  # bytes of input per work item for line-based formats (4 MiB: +130 MB peak RSS, no faster)
MAX_RECORD_BYTES = 256 << 20  # one line / record larger than this is refused, not buffered
FILES_PER_ITEM = 256  # small whole-text files are grouped to amortise inter-process overhead
RECORDS_PER_ITEM = 2048  # records per item for formats parsed in the planning process

TEXT_SUFFIXES = {".txt", ".md", ".text", ".rst", ".py"}
FORMAT_BY_SUFFIX = {
    **{s: "text" for s in TEXT_SUFFIXES},
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
COMPRESSION_BY_SUFFIX = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}


@dataclass(frozen=True)
class Source:
    """One input file ('-' for stdin) and how to read it."""

    path: str
    fmt: str
    compression: str | None
    size: int  # bytes on disk (compressed), 0 for stdin


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
    skipped: dict[str, int] = field(default_factory=dict)  # records dropped while planning
    line_keep: tuple[bytes, int] | None = None  # line dedup: packed keep-bits of its lines, count


def detect(path: str, fmt_override: str | None = None) -> Source:
    """Work out format and compression from the file name (`name.jsonl.gz` etc.)."""
    if path == "-":
        return Source("-", fmt_override or "jsonl", None, 0)
    p = Path(path)
    suffixes = [s.lower() for s in p.suffixes]
    compression = COMPRESSION_BY_SUFFIX.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    fmt = fmt_override or (FORMAT_BY_SUFFIX.get(suffixes[-1]) if suffixes else None)
    if fmt is None:
        raise InputError(
            f"{path}: unknown file type; name it .txt/.jsonl/.json/.csv/.parquet/.arrow "
            "(optionally .gz/.zst/.bz2/.xz) or pass --format"
        )
    return Source(str(p), fmt, compression, p.stat().st_size)


def discover(inputs: list[str], fmt_override: str | None = None, exclude: list[str] | None = None) -> list[Source]:
    """Expand files, directories (recursively, sorted by path) and globs into sources, leaving
    out paths that match any `exclude` glob (fnmatch against the whole path)."""
    sources: list[Source] = []
    for spec in inputs:
        if spec == "-":
            sources.append(detect("-", fmt_override))
            continue
        if os.path.isdir(spec):
            paths = sorted(str(p) for p in Path(spec).rglob("*") if p.is_file() and _wanted(p, fmt_override))
        elif os.path.exists(spec):
            paths = [spec]
        else:
            paths = sorted(p for p in glob.glob(spec, recursive=True) if os.path.isfile(p))
        paths = [p for p in paths if not any(fnmatch.fnmatch(p, pat) for pat in exclude or ())]
        if not paths:
            raise InputError(f"{spec}: no input files found (check the path, glob or --exclude)")
        sources.extend(detect(p, fmt_override) for p in paths)
    return sources


def _wanted(path: Path, fmt_override: str | None) -> bool:
    """Directory walks take files of known types and skip hidden files (.git, editor swaps)."""
    if any(part.startswith(".") for part in path.parts[-1:]):
        return False
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSION_BY_SUFFIX:
        suffixes = suffixes[:-1]
    return bool(fmt_override) or bool(suffixes and suffixes[-1] in FORMAT_BY_SUFFIX)


def open_binary(source: Source) -> tuple[IO[bytes], IO[bytes]]:
    """Return (decompressed stream, raw file) for `source`; `raw.tell()` measures progress."""
    raw: IO[bytes] = sys.stdin.buffer if source.path == "-" else open(source.path, "rb")  # noqa: SIM115
    if source.compression == "gzip":
        return cast(IO[bytes], gzip.GzipFile(fileobj=raw)), raw
    if source.compression == "bz2":
        return bz2.BZ2File(raw), raw
    if source.compression == "xz":
        return lzma.LZMAFile(raw), raw
    if source.compression == "zstd":
        try:
            import zstandard
        except ImportError:
            raise missing_dependency("zstandard", "zstd", f"{source.path}: reading .zst") from None
        return zstandard.ZstdDecompressor().stream_reader(raw, read_size=1 << 20), raw
    return raw, raw


def read_prefix(source: Source, limit: int) -> bytes:
    """The first `limit` decompressed bytes of a source, plus one more to detect overflow."""
    stream, raw = open_binary(source)
    try:
        return stream.read(limit + 1)
    finally:
        raw.close()


def binary_error(source: Source, block: bytes, offset: int = 0) -> InputError | None:
    """A NUL byte in text input means a binary file was passed by mistake."""
    pos = block.find(b"\x00")
    if pos < 0:
        return None
    return InputError(
        f"{source.path}: binary data (NUL byte at offset {offset + pos}); remove the file from "
        "the inputs or pass --on-error skip"
    )


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
        from .records import checked

        details: dict[str, str] = {}
        yield from _batch_records(i, src, (checked(src, r, on_error, details) for r in hf_records(hf)))
    elif src.fmt == "parquet":
        yield from _plan_parquet(i, src)
    elif src.fmt == "arrow":
        yield from _plan_arrow(i, src)
    elif src.fmt in ("csv", "json"):
        from .records import iter_csv, iter_json_array

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
            if seq == 0 and not carry and (err := binary_error(src, block[:65536])):
                if on_error == "fail":
                    raise err
                yield WorkItem(i, 0, "texts", payload=[], skipped={"binary_file": 1}, nbytes=src.size)
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


def _batch_records(i: int, src: Source, records: Iterator[tuple[int, str | None, str | None]]) -> Iterator[WorkItem]:
    """Group (record number, text, drop reason) tuples into items of RECORDS_PER_ITEM texts."""
    texts: list[tuple[int, str]] = []
    skipped: dict[str, int] = {}
    seq = 0
    for number, text, reason in records:
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
        else:
            assert text is not None
            texts.append((number, text))
        if len(texts) >= RECORDS_PER_ITEM:
            yield WorkItem(i, seq, "texts", payload=texts, skipped=skipped)
            texts, skipped, seq = [], {}, seq + 1
    if texts or skipped or seq == 0:
        yield WorkItem(i, seq, "texts", payload=texts, skipped=skipped, nbytes=src.size)


def _plan_parquet(i: int, src: Source) -> Iterator[WorkItem]:
    import pyarrow.parquet as pq

    try:
        n = pq.ParquetFile(src.path).metadata.num_row_groups
    except Exception as e:  # pyarrow raises several types for a bad file
        raise InputError(f"{src.path}: not a readable parquet file ({e})") from None
    for rg in range(n):
        yield WorkItem(i, rg, "parquet", locator=rg, nbytes=src.size // max(n, 1))
    if n == 0:
        yield WorkItem(i, 0, "texts", payload=[], nbytes=src.size)


def open_arrow(path: str) -> Any:
    """An arrow IPC reader for the file format or, as `datasets.save_to_disk` writes, the
    stream format; both memory-mapped."""
    import pyarrow as pa

    try:
        return pa.ipc.open_file(pa.memory_map(path))
    except pa.ArrowInvalid:
        try:
            return pa.ipc.open_stream(pa.memory_map(path))
        except pa.ArrowInvalid as e:
            raise InputError(f"{path}: not an arrow IPC file ({e})") from None


def arrow_batches(reader: Any) -> Iterator[Any]:
    if hasattr(reader, "num_record_batches"):
        for b in range(reader.num_record_batches):
            yield reader.get_batch(b)
    else:
        yield from reader


def _plan_arrow(i: int, src: Source) -> Iterator[WorkItem]:
    n = sum(1 for _ in arrow_batches(open_arrow(src.path)))
    for b in range(n):
        yield WorkItem(i, b, "arrow", locator=b, nbytes=src.size // max(n, 1))
    if n == 0:
        yield WorkItem(i, 0, "texts", payload=[], nbytes=src.size)


def text_stream(src: Source) -> tuple[io.TextIOWrapper, IO[bytes]]:
    """A strict UTF-8 text view of a source (for formats parsed record by record)."""
    stream, raw = open_binary(src)
    return io.TextIOWrapper(stream, encoding="utf-8", errors="strict", newline=""), raw
