"""Record formats parsed as one stream rather than cut into byte ranges: CSV (a quoted field may
span lines) and a `.json` file holding one array (an element may span any number of lines). The
planner reads them in order and hands their records to the workers in batches (sources.py).

Memory model: one CSV row, or one JSON element plus one 1 MiB block of the file.
"""

from __future__ import annotations

import codecs
import csv
import json
import re
import sys
from collections.abc import Iterator
from typing import Any, cast

from ...errors import InputError
from .decompress import DamagedInput
from .files import MAX_RECORD_BYTES, SNIFF_BYTES, Source, open_binary, text_stream
from .reading import Headed, changed, grew
from .records import Record, _field, _undecodable, bad, binary_record, damaged_record, json_problem, with_domain


def iter_csv(src: Source, text_field: str) -> Iterator[Record]:
    """CSV rows (quoted fields may span lines, so CSV is parsed here rather than split by bytes),
    each numbered by the line it starts on. A row is a dict as csv.DictReader makes it (the header's
    names; missing values None, extra ones a list under None); a blank line is no row."""
    stream, raw = text_stream(src)
    stream.reconfigure(errors="surrogateescape")
    csv.field_size_limit(min(MAX_RECORD_BYTES, sys.maxsize))
    reader = csv.reader(stream)
    try:
        if (wrong := binary_record(cast(Headed, stream.buffer).peek(SNIFF_BYTES))) is not None:
            yield wrong
            return
        header = next(reader, None)
        if header is None:
            return
        if text_field not in header:
            raise InputError(
                f"{src.path}: no column '{text_field}' (columns: "
                f"{', '.join(repr(name) for name in header[:12])}); name the text column with --text-field"
            )
        end = reader.line_num
        for values in reader:
            start, end = end + 1, reader.line_num  # (a quoted value may run over lines: the row's first)
            if not values:
                continue
            row: dict[Any, Any] = dict(zip(header, values, strict=False))  # (a short or long row: below)
            if len(values) > len(header):
                row[None] = values[len(header):]
            row.update((name, None) for name in header[len(values):])
            yield _csv_record(row, start, text_field)
    except DamagedInput as e:
        yield damaged_record(reader.line_num + 1, e, f"{reader.line_num:,} lines")
    except csv.Error as e:
        raise InputError(f"{src.path}:{reader.line_num}: malformed CSV ({e}); fix the file") from None
    finally:
        raw.close()


def _csv_record(row: dict[Any, Any], number: int, text_field: str) -> Record:
    text = row.get(text_field)
    if not isinstance(text, str):
        return bad(number, "missing_field", f"no field '{text_field}' in this row")
    if _undecodable(text):
        return bad(number, "decode_error", f"line {number} is not valid UTF-8")
    if getattr(text_field, "domain", None) is None:  # (no --val-by FIELD: the row's other fields are not read)
        return Record(number, text)
    return with_domain(Record(number, text), {k: v for k, v in row.items() if v is not None}, text_field)


def iter_json_array(src: Source, text_field: str) -> Iterator[Record]:
    """Objects of a `.json` file holding one array (`first_byte(src) == b"["`), decoded
    incrementally: never the whole file, at most one element plus one block in memory."""
    stream, raw = open_binary(src)
    blocks = _text_blocks(stream)
    decoder = json.JSONDecoder()
    number, line, buf, pos = 0, 1, "", 0  # records read; the line at `pos` in `buf`
    try:
        while not buf.strip(_JSON_SPACE):
            more = next(blocks, None)
            if more is None:
                return
            buf += more
        pos = _JSON_GAP.match(buf).end()  # type: ignore[union-attr]
        if not buf.startswith("[", pos):  # only stdin is not sniffed (files of JSON lines are planned as such)
            raise InputError(f"{src.path}: not a JSON array (--format json); for JSON lines pass --format jsonl")
        line, pos = line + buf.count("\n", 0, pos), pos + 1
        while True:
            gap = _JSON_GAP_OR_COMMA.match(buf, pos).end()  # type: ignore[union-attr]
            line, pos = line + buf.count("\n", pos, gap), gap
            if buf.startswith("]", pos):
                return
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as e:
                more = next(blocks, None) if len(buf) - pos <= MAX_RECORD_BYTES else None
                if more is None:
                    raise _bad_element(src, number + 1, line + buf.count("\n", pos, e.pos), buf[pos:], e) from None
                buf, pos = buf[pos:] + more, 0
                continue
            number += 1
            line, pos = line + buf.count("\n", pos, end), end
            record = _field(obj, number, text_field)
            if record.text is not None and _undecodable(record.text):
                record = bad(number, "decode_error", f"record {number} is not valid UTF-8")
            yield record
    except DamagedInput as e:
        yield damaged_record(number + 1, e, f"{number:,} records")
    finally:
        raw.close()


_JSON_SPACE = " \t\r\n\ufeff"  # JSON whitespace, and a byte-order mark before the array
_JSON_GAP = re.compile(f"[{_JSON_SPACE}]*")
_JSON_GAP_OR_COMMA = re.compile(f"[{_JSON_SPACE},]*")


def _text_blocks(stream: Any) -> Iterator[str]:
    """A binary stream as text blocks; bytes that are not UTF-8 survive as surrogate escapes."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    while block := stream.read(1 << 20):
        yield decoder.decode(block)
    yield decoder.decode(b"", final=True)


def _bad_element(src: Source, number: int, line: int, rest: str, e: json.JSONDecodeError) -> InputError:
    """An element that is not JSON ends the array for any --on-error: after it, nothing says
    where the next element starts. In a file still being written, the element the parser
    stopped at may be the one cut at the size the file had when the run started: said so."""
    if src.inode and grew(src.path, src.size, src.inode):
        return changed(src.path, f"it grew past the {src.size:,} bytes it held when the run started, and its "
                                 "JSON array is not closed there")  # fmt: skip
    why = "the file ends before the array is closed" if not rest.strip() else f"invalid JSON ({json_problem(e)})"
    return InputError(
        f"{src.path}:{line}: record {number}: {why}; fix the file, or convert it to JSON lines (one object "
        "per line). --on-error skip cannot skip it: a JSON array cannot be read past a bad element"
    )
