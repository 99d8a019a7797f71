"""Record parsers: turn the bytes of one work item into (line or record number, text) pairs.

Every parser yields `(number, text, reason)`: `reason` is None for a document, or a drop
reason ("decode_error", "json_error", "missing_field", ...) for a record that could not be
read. Under `--on-error fail` the caller turns the first reason into an `InputError` naming
the file and record; under `--on-error skip` it is counted.

Memory model: one work item's records (≤ ~1 MiB of text, or one row group / record batch).
"""

from __future__ import annotations

import csv
import json
import re
import sys
from collections.abc import Iterator
from typing import Any

from .errors import InputError
from .sources import MAX_RECORD_BYTES, Source, arrow_batches, open_arrow, text_stream

Record = tuple[int, "str | None", "str | None"]

FIXES = {
    "decode_error": "re-encode the file as UTF-8",
    "json_error": "fix the line",
    "not_an_object": "make each line a JSON object",
    "missing_field": "name the right field with --text-field",
    "binary_file": "remove the file from the inputs",
}
_PARAGRAPH = re.compile(r"\n[ \t\r]*\n")
_ESCAPED = re.compile("[\udc80-\udcff]")


def problem(src: Source, number: int, reason: str, detail: str) -> InputError:
    """The one-line error for a bad record under --on-error fail."""
    fix = FIXES.get(reason, "fix the record")
    return InputError(f"{src.path}:{number}: {detail}; {fix}, or pass --on-error skip to count and skip it")


def _decode_lines(src: Source, payload: bytes, first: int) -> Iterator[tuple[int, str | None]]:
    """Lines of `payload` as text; a line that is not valid UTF-8 comes back as None."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        for k, raw in enumerate(payload.split(b"\n")):
            try:
                yield first + k, raw.decode("utf-8")
            except UnicodeDecodeError:
                yield first + k, None
        return
    for k, line in enumerate(text.split("\n")):
        yield first + k, line


def parse_jsonl(src: Source, payload: bytes, first: int, text_field: str, details: dict[str, str]) -> Iterator[Record]:
    loads = json.loads
    for number, line in _decode_lines(src, payload, first):
        if line is None:
            details.setdefault("decode_error", f"line {number} is not valid UTF-8")
            yield number, None, "decode_error"
            continue
        if not line.strip():
            continue
        try:
            obj = loads(line)
        except json.JSONDecodeError as e:
            details.setdefault("json_error", f"invalid JSON ({e.msg} at column {e.colno})")
            yield number, None, "json_error"
            continue
        yield _field(obj, number, text_field, details)


def _field(obj: Any, number: int, text_field: str, details: dict[str, str]) -> Record:
    if not isinstance(obj, dict):
        details.setdefault("not_an_object", f"a JSON {type(obj).__name__}, not an object")
        return number, None, "not_an_object"
    text = obj.get(text_field)
    if not isinstance(text, str):
        what = "no" if text is None else f"a non-string ({type(text).__name__})"
        keys = ", ".join(list(obj)[:8])
        details.setdefault("missing_field", f"{what} field '{text_field}' (fields: {keys})")
        return number, None, "missing_field"
    return number, text, None


def parse_text_lines(
    src: Source, payload: bytes, first: int, paragraph: bool, details: dict[str, str]
) -> Iterator[Record]:
    if paragraph:
        yield from _paragraphs(src, payload, first, details)
        return
    for number, line in _decode_lines(src, payload, first):
        if line is None:
            details.setdefault("decode_error", f"line {number} is not valid UTF-8")
            yield number, None, "decode_error"
        elif line.strip():
            yield number, line.rstrip("\r"), None


def _paragraphs(src: Source, payload: bytes, first: int, details: dict[str, str]) -> Iterator[Record]:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as e:
        number = first + payload[: e.start].count(b"\n")
        details.setdefault("decode_error", f"invalid UTF-8 at line {number}")
        yield number, None, "decode_error"
        return
    pos, number = 0, first
    for m in _PARAGRAPH.finditer(text):
        para = text[pos : m.start()].strip("\r\n")
        if para.strip():
            yield number, para, None
        number += text.count("\n", pos, m.end())
        pos = m.end()
    tail = text[pos:].strip("\r\n")
    if tail.strip():
        yield number, tail, None


def read_whole_file(src: Source, byte_limit: int, details: dict[str, str]) -> Record:
    """One file as one document. Reads at most `byte_limit` + 1 bytes: beyond that the file
    cannot fit `--max-chars` (a character is at most 4 bytes), and reason "too_long" is given."""
    from .sources import binary_error, read_prefix

    data = read_prefix(src, byte_limit)
    if (err := binary_error(src, data[:65536])) is not None:
        details.setdefault("binary_file", str(err).split(": ", 1)[1].split(";")[0])
        return 1, None, "binary_file"
    truncated = len(data) > byte_limit
    data = data[:byte_limit]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if not (truncated and e.start >= len(data) - 3):  # a character cut by the byte limit
            number = 1 + data[: e.start].count(b"\n")
            details.setdefault("decode_error", f"invalid UTF-8 at line {number}")
            return number, None, "decode_error"
        text = data[: e.start].decode("utf-8")
    if not data:
        return 1, "", None
    return 1, text, ("too_long_bytes" if truncated else None)


def _column(table: Any, src: Source, text_field: str) -> list[Any]:
    names = table.schema.names
    if text_field not in names:
        raise InputError(
            f"{src.path}: no column '{text_field}' (columns: {', '.join(names[:12])}); "
            "name the text column with --text-field"
        )
    return table.column(text_field).to_pylist()


def _values(values: list[Any], first: int, text_field: str, details: dict[str, str]) -> Iterator[Record]:
    for k, value in enumerate(values):
        if isinstance(value, str):
            yield first + k, value, None
        else:
            details.setdefault("missing_field", f"field '{text_field}' is {type(value).__name__}")
            yield first + k, None, "missing_field"


def parse_parquet(src: Source, row_group: int, text_field: str, details: dict[str, str]) -> Iterator[Record]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(src.path)
    first = sum(pf.metadata.row_group(g).num_rows for g in range(row_group))
    if text_field not in pf.schema_arrow.names:
        _column(pf.schema_arrow.empty_table(), src, text_field)
    table = pf.read_row_group(row_group, columns=[text_field])
    yield from _values(_column(table, src, text_field), first, text_field, details)


def parse_arrow(src: Source, batch: int, text_field: str, details: dict[str, str]) -> Iterator[Record]:
    first = 0
    for b, rb in enumerate(arrow_batches(open_arrow(src.path))):
        if b == batch:
            yield from _values(_column(rb, src, text_field), first, text_field, details)
            return
        first += rb.num_rows


def _undecodable(text: str) -> bool:
    """Text read with errors='surrogateescape' carries bytes that were not UTF-8 as U+DC80-DCFF."""
    return not text.isascii() and _ESCAPED.search(text) is not None


def iter_csv(src: Source, text_field: str, on_error: str) -> Iterator[Record]:
    """CSV rows (quoted fields may span lines, so CSV is parsed here rather than split by bytes)."""
    stream, raw = text_stream(src)
    stream.reconfigure(errors="surrogateescape")
    csv.field_size_limit(min(MAX_RECORD_BYTES, sys.maxsize))
    details: dict[str, str] = {}
    try:
        reader = csv.DictReader(stream)
        if reader.fieldnames is None:
            return
        if text_field not in reader.fieldnames:
            raise InputError(
                f"{src.path}: no column '{text_field}' (columns: "
                f"{', '.join(reader.fieldnames[:12])}); name the text column with --text-field"
            )
        for row in reader:
            number = reader.line_num
            text = row.get(text_field)
            record: Record = (number, text, None) if isinstance(text, str) else (number, None, "missing_field")
            if record[1] is not None and _undecodable(record[1]):
                record = (number, None, "decode_error")
            yield checked(src, record, on_error, details)
    except csv.Error as e:
        raise InputError(f"{src.path}: malformed CSV ({e}); fix the file") from None
    finally:
        raw.close()


def iter_json_array(src: Source, text_field: str, on_error: str) -> Iterator[Record]:
    """Objects of a `.json` file holding one array, decoded incrementally (never the whole file);
    a `.json` file that is really JSON lines is read as such."""
    stream, raw = text_stream(src)
    stream.reconfigure(errors="surrogateescape")
    decoder = json.JSONDecoder()
    details: dict[str, str] = {}
    try:
        buf = stream.read(1 << 20).lstrip()
        if not buf:
            return
        if not buf.startswith("["):
            yield from _json_lines_from_text(src, buf, stream, text_field, on_error)
            return
        buf, number, eof = buf[1:], 0, False
        while True:
            buf = buf.lstrip().lstrip(",").lstrip()
            if buf.startswith("]"):
                return
            try:
                obj, end = decoder.raw_decode(buf)
            except json.JSONDecodeError as e:
                if eof or len(buf) > MAX_RECORD_BYTES:
                    raise InputError(f"{src.path}: record {number + 1}: invalid JSON ({e.msg}); fix the file") from None
                more = stream.read(1 << 20)
                eof = not more
                buf += more
                continue
            number += 1
            buf = buf[end:]
            record = _field(obj, number, text_field, details)
            if record[1] is not None and _undecodable(record[1]):
                record = (number, None, "decode_error")
            yield checked(src, record, on_error, details)
    finally:
        raw.close()


def _json_lines_from_text(src: Source, head: str, stream: Any, text_field: str, on_error: str) -> Iterator[Record]:
    details: dict[str, str] = {}
    number = 0
    for line in _chain_lines(head, stream):
        number += 1
        if not line.strip():
            continue
        try:
            record = _field(json.loads(line), number, text_field, details)
        except json.JSONDecodeError as e:
            details.setdefault("json_error", f"invalid JSON ({e.msg} at column {e.colno})")
            record = (number, None, "json_error")
        yield checked(src, record, on_error, details)


def _chain_lines(head: str, stream: Any) -> Iterator[str]:
    lines = head.split("\n")
    carry = lines.pop()  # a partial line: the stream's next line completes it
    yield from lines
    for line in stream:
        yield (carry + line).rstrip("\n")
        carry = ""
    if carry:
        yield carry


def checked(src: Source, record: Record, on_error: str, details: dict[str, str]) -> Record:
    number, _, reason = record
    if reason is not None and on_error == "fail":
        raise problem(src, number, reason, details.get(reason, reason.replace("_", " ")))
    return record
