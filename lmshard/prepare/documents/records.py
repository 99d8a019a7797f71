"""Record parsers: turn the bytes of one work item (or one planned source) into `Record`s.

A `Record` is a document's text with its line or record number, or, for a record that cannot be
read, the problem ("decode_error", "json_error", "missing_field", ...) and its detail. Whether a
problem stops the run (`--on-error fail`) or is counted and skipped (`--on-error skip`) is
decided in one place, `settle`, which planning and the workers both call.

Memory model: one work item's records (≤ ~1 MiB of text, or one row group / record batch).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from ...errors import InputError
from .clean import has_surrogate
from .decompress import DamagedInput
from .files import (
    Source,
    nul_offset,
    read_prefix,
)
from .reading import foreign_encoding, reencode_fix


class Record(NamedTuple):
    """One record of an input: a document's text, or why it could not be read."""

    number: int  # 1-based line number (text, jsonl, csv) or record number (json array, parquet, arrow, hf)
    text: str | None  # None when the record was not read as a document
    problem: str | None = None  # a key of PROBLEMS (an input problem), or a drop reason such as "too_long"
    detail: str = ""  # what exactly was wrong, for the message: "invalid JSON (Expecting ',' at column 57)"
    repaired: bool = False  # --decode-errors replace: bytes that were not UTF-8 became U+FFFD
    domain: str | None = None  # --val-by FIELD: the value of that field, as text (`with_domain`)


def bad(number: int, problem: str, detail: str) -> Record:
    return Record(number, None, problem, detail)


# Input problems that --on-error governs, and the fix each message suggests (length filters and
# empty documents are policy, not errors: they are counted and never stop a run).
PROBLEMS = {
    "decode_error": "re-encode the file as UTF-8",
    "json_error": "fix the line",
    "not_an_object": "make each line a JSON object",
    "not_records": "a .json file holds an array of records ([{...}, {...}]) or JSON lines (one object per line)",
    "missing_field": "name the right field with --text-field",
    "wrong_type": "make the field a string in every record, or name the text field with --text-field",
    "missing_domain": "give every record the field, or name the domain field with --val-by (a nested one as a.b)",
    "wrong_domain": "make the field a string or a number in every record",
    "wrong_encoding": "re-encode it as UTF-8",  # a UTF-16/32 file; `settle` gives the command for it
    "binary_file": "remove the file from the inputs",
    "truncated_compression": "re-download or re-create the file",  # the data ends before its end marker
    "corrupt_compression": "re-download or re-create the file",  # bad compressed data, or a checksum mismatch
}
# What --on-error skip does with a problem, where that is not simply skipping one record.
SKIP_KEEPS = {
    "truncated_compression": "to keep the records before the damage and skip the rest of the file",
    "corrupt_compression": "to keep the records before the damage and skip the rest of the file",
}
STDIN_HINT = "stdin is read as JSON lines: for plain text pass --format text (with --text-mode line or paragraph)"
_PARAGRAPH = re.compile(r"\n[ \t\r]*\n")
_ESCAPED = re.compile("[\udc80-\udcff]")


def settle(src: Source, record: Record, on_error: str) -> Record:
    """The --on-error policy, decided here and nowhere else: under "fail" a record with an
    input problem stops the run with one line naming file, record and fix; otherwise the
    record passes on, to be kept or counted under its problem."""
    if record.problem in PROBLEMS and on_error == "fail":
        detail = record.detail or record.problem.replace("_", " ")
        fix = PROBLEMS[record.problem]
        if record.problem == "wrong_encoding":  # its detail starts with the encoding's name
            fix = reencode_fix(src.path, detail.split(" ", 1)[0], src.compression is not None)
        elif record.problem == "binary_file" and (codec := detail.partition("-compressed ")[0]) in COMPRESSED:
            _, suffix, tool = COMPRESSED[codec]
            if src.compression is not None:  # (decompressed once by its suffix: compressed twice)
                detail = f"{codec}-compressed data once decompressed (compressed twice)"
                fix = f"decompress it once ({tool}) and name the file for what is left"
            elif src.piped:
                fix = f"decompress it before the pipe ({tool} FILE{suffix} | lmshard prepare - ...)"
            else:
                fix = f"name the file with the suffix {suffix}, which prepare reads decompressed, or decompress it " \
                    f"({tool})"  # fmt: skip
        elif src.path == "-" and record.problem in ("json_error", "not_an_object"):
            fix = f"{fix} ({STDIN_HINT})"
        elif src.fmt == "json" and record.problem in ("json_error", "not_an_object"):  # a .json read as JSON lines
            fix = f"{fix} ({PROBLEMS['not_records']})"
        skip = SKIP_KEEPS.get(record.problem, "to count and skip it")
        raise InputError(f"{src.path}:{record.number}: {detail}; {fix}, or pass --on-error skip {skip}")
    return record


def example(src: Source, record: Record) -> str:
    """How a dropped record is shown in the metadata's drop examples: file, record and why."""
    return f"{src.path}:{record.number}: {record.detail or str(record.problem).replace('_', ' ')}"


def damaged_record(number: int, damage: DamagedInput, done: str) -> Record:
    """The record where a compressed input's damage starts; `done` says how far reading got
    ("8,525 lines", "12 records")."""
    return bad(number, damage.problem, f"{damage.what} after {done} ({damage.offset:,} uncompressed bytes read)")


def _decode_lines(payload: bytes, first: int, replace: bool = False) -> Iterator[tuple[int, str | None, bool]]:
    """(number, text, repaired) of the lines of `payload`; a line that is not valid UTF-8 comes
    back as None, or with `replace` (--decode-errors replace) with U+FFFD for its bad bytes."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        for k, raw in enumerate(payload.split(b"\n")):
            try:
                yield first + k, raw.decode("utf-8"), False
            except UnicodeDecodeError:
                yield first + k, (raw.decode("utf-8", errors="replace") if replace else None), replace
        return
    for k, line in enumerate(text.split("\n")):
        yield first + k, line, False


def parse_jsonl(payload: bytes, first: int, text_field: str, replace: bool = False) -> Iterator[Record]:
    """The records of a block of JSON lines. With orjson installed (the `fast` extra), each line
    is parsed by it first, about twice as fast; any line it refuses (a blank line, invalid
    UTF-8 or JSON, and what only the standard parser accepts: NaN, lone surrogate escapes) and
    any record with a problem go through the standard path, so every record and message is the
    standard parser's. `replace`: --decode-errors replace (a line that is not UTF-8 is read with
    U+FFFD for its bad bytes)."""
    fast = _fast_loads()
    if fast is None:
        yield from _parse_lines(_decode_lines(payload, first, replace), text_field)
        return
    loads, refused = fast
    domain = getattr(text_field, "domain", None)
    for k, raw in enumerate(payload.split(b"\n")):
        try:
            obj = loads(raw)
        except refused:
            yield from _parse_lines(_decode_lines(raw, first + k, replace), text_field)
            continue
        record = _field(obj, first + k, text_field)
        # As the standard parser reads it: a record with a problem, or a float domain (orjson makes huge ints floats)
        if record.problem is not None or (domain is not None and isinstance(domain_value(obj, domain), float)):
            record = next(_parse_lines(_decode_lines(raw, first + k, replace), text_field))
        yield record


def _parse_lines(lines: Iterator[tuple[int, str | None, bool]], text_field: str) -> Iterator[Record]:
    """The standard parser over numbered lines (None: not UTF-8); blank lines are skipped. A
    repaired line (--decode-errors replace) is parsed as any other, and its record marked."""
    loads = json.loads
    for number, line, repaired in lines:
        if repaired:
            for r in _parse_lines(iter([(number, line, False)]), text_field):
                yield r._replace(repaired=r.problem is None)
            continue
        if line is None:
            yield bad(number, "decode_error", f"line {number} is not valid UTF-8")
            continue
        if not line.strip():
            continue
        try:
            # A byte-order mark starts a line where files that had one were joined (`cat`).
            obj = loads(line.removeprefix("\ufeff"))
        except json.JSONDecodeError as e:
            yield bad(number, "json_error", f"invalid JSON ({json_problem(e)} at column {e.colno})")
            continue
        except RecursionError:
            yield bad(number, "json_error", "invalid JSON (nested too deeply)")
            continue
        yield _field(obj, number, text_field)


_FAST_JSON: list[tuple[Callable[[bytes], Any], type[Exception]] | None] = []


def _fast_loads() -> tuple[Callable[[bytes], Any], type[Exception]] | None:
    """orjson's `loads` and the error it raises, imported on first use (it costs ~25 ms), or None."""
    if not _FAST_JSON:
        try:
            import orjson
        except ImportError:
            _FAST_JSON.append(None)
        else:
            _FAST_JSON.append((orjson.loads, orjson.JSONDecodeError))
    return _FAST_JSON[0]


def json_problem(e: json.JSONDecodeError) -> str:
    """What the JSON parser found wrong, without the " at" some of its messages end with
    ("Unterminated string starting at"), which the caller's own "at column N" follows."""
    return e.msg.removesuffix(" at")


def _field(obj: Any, number: int, text_field: str) -> Record:
    if not isinstance(obj, dict):
        return bad(number, "not_an_object", f"a JSON {type(obj).__name__}, not an object")
    if text_field not in obj:
        keys = ", ".join(list(obj)[:8])
        return bad(number, "missing_field", f"no field '{text_field}' (fields: {keys})")
    return with_domain(typed_text(number, obj[text_field], text_field), obj, text_field)


class RecordFields(str):
    """The text field's name (a str, so every parser takes it where it takes --text-field's
    name) and the name of the field that holds each record's domain (`prepare --val-by FIELD`):
    a top-level field, or a nested one as `a.b` (a top-level field of that exact name first)."""

    domain: str

    def __new__(cls, text_field: str, domain: str) -> RecordFields:
        made = super().__new__(cls, text_field)
        made.domain = domain
        return made

    def __reduce__(self) -> tuple[Any, ...]:  # (pickled to the workers with their configuration)
        return (RecordFields, (str(self), self.domain))


def record_fields(text_field: str, val_by: str | None) -> str:
    """What the parsers read of each record: the text field, and with `--val-by FIELD` its domain."""
    return RecordFields(text_field, val_by) if val_by not in (None, "input") else text_field


def with_domain(record: Record, obj: Any, fields: str) -> Record:
    """`record`, read from the mapping `obj`, with its domain when `fields` names a domain field
    (`RecordFields`): the field's value as text (a string as it is, a number as JSON writes it),
    or the problem of a record without one (a missing field, null, a list or an object, or text
    that is not valid Unicode)."""
    name = getattr(fields, "domain", None)
    if name is None or record.problem is not None:
        return record
    value = domain_value(obj, name)
    if value is _MISSING:
        return bad(record.number, "missing_domain", f"no field '{name}' (--val-by {name})")
    if isinstance(value, str):
        if has_surrogate(value):
            return bad(record.number, "wrong_domain", f"field '{name}' (--val-by) is not valid UTF-8 text")
        return record._replace(domain=value)
    if isinstance(value, bool | int | float):
        return record._replace(domain=json.dumps(value))
    return bad(record.number, "wrong_domain", f"field '{name}' (--val-by) is {_what(value)}, not a string or number")


def domain_value(obj: Any, name: str) -> Any:
    """The value of the field `name` in `obj`: a top-level field of that exact name, else the
    nested field `a.b`; `_MISSING` when there is none."""
    value = obj.get(name, _MISSING) if isinstance(obj, dict) else _MISSING
    if value is _MISSING and "." in name:
        value = obj
        for part in name.split("."):
            value = value.get(part, _MISSING) if isinstance(value, dict) else _MISSING
    return value


_MISSING = object()


def typed_text(number: int, value: Any, text_field: str) -> Record:
    """A record whose text field holds `value`: its text, or the "wrong_type" problem saying
    what it holds instead (null, a number, a list...)."""
    if isinstance(value, str):
        return Record(number, value)
    return bad(number, "wrong_type", f"field '{text_field}' is {_what(value)}, not a string")


def _what(value: Any) -> str:
    if value is None:
        return "null"
    kinds = ((bool, "a boolean"), (int, "a number"), (float, "a number"), (list, "a list"), (dict, "an object"),
             (bytes, "binary data"))  # fmt: skip
    return next((name for kind, name in kinds if isinstance(value, kind)), f"a {type(value).__name__}")


def parse_text_lines(payload: bytes, first: int, paragraph: bool, replace: bool = False) -> Iterator[Record]:
    """A text block's lines or paragraphs; `replace`: --decode-errors replace."""
    if paragraph:
        yield from _paragraphs(payload, first, replace)
        return
    for number, line, repaired in _decode_lines(payload, first, replace):
        if line is None:
            yield bad(number, "decode_error", f"line {number} is not valid UTF-8")
        elif line.strip():
            yield Record(number, line.rstrip("\r"), repaired=repaired)


def _paragraphs(payload: bytes, first: int, replace: bool = False) -> Iterator[Record]:
    """Blank-line-separated paragraphs, numbered by their first line of text (wherever a work item
    was cut among the blank lines before); one with invalid UTF-8 is that one bad record, not
    the whole block (bytes not UTF-8 survive decoding as surrogate escapes, then are found)."""
    text = payload.decode("utf-8", errors="surrogateescape")
    pos, number = 0, first
    for m in [*_PARAGRAPH.finditer(text), None]:
        end = m.start() if m is not None else len(text)
        para, seg = text[pos:end].strip("\r\n"), text[pos:end]
        if para.strip():
            at = number + text.count("\n", pos, pos + len(seg) - len(seg.lstrip()))
            if _undecodable(para) and replace:
                yield Record(at, _replaced(para), repaired=True)
            elif _undecodable(para):
                yield bad(at, "decode_error", f"invalid UTF-8 in the paragraph at line {at}")
            else:
                yield Record(at, para)
        if m is not None:
            number += text.count("\n", pos, m.end())
            pos = m.end()


# Compressed data read as it is (stdin, a pipe, a file without its compression's suffix): the
# magic bytes it starts with, the suffix that has prepare decompress a file, the tool that does.
COMPRESSED = {"gzip": (b"\x1f\x8b\x08", ".gz", "zcat"), "zstd": (b"\x28\xb5\x2f\xfd", ".zst", "zstdcat"),
              "xz": (b"\xfd7zXZ\x00", ".xz", "xzcat"), "bzip2": (b"BZh", ".bz2", "bzcat")}  # fmt: skip


def binary_record(block: bytes) -> Record | None:
    """The problem record for a file whose first block is not UTF-8 text: "wrong_encoding" for
    UTF-16 or UTF-32 text, "binary_file" for compressed data (named by its magic bytes) or a NUL
    byte in its sniffed prefix."""
    if (encoding := foreign_encoding(block)) is not None:
        name, how = encoding
        return bad(1, "wrong_encoding", f"{name} text ({how}), not UTF-8")
    for codec, (magic, _, _) in COMPRESSED.items():  # (bzip2: "BZh", a level digit, then its block's magic)
        if block.startswith(magic) and (codec != "bzip2" or block[3:10][:1].isdigit() and block[4:10] == b"1AY&SY"):
            return bad(1, "binary_file", f"{codec}-compressed data, read as it is")
    pos = nul_offset(block)
    return None if pos is None else bad(1, "binary_file", f"binary data (NUL byte at offset {pos})")


def read_whole_file(src: Source, byte_limit: int, truncate: bool, replace: bool = False) -> Record:
    """One file as one document. Reads at most `byte_limit` + 1 bytes: beyond that the file
    cannot fit `--max-chars` (a character is at most 4 bytes), so it is cut there when
    `truncate`, and otherwise dropped with reason "too_long" (nothing more is read). `replace`:
    --decode-errors replace (bytes that are not UTF-8 read as U+FFFD, not the file dropped)."""
    try:
        data = read_prefix(src, byte_limit)
    except DamagedInput as e:
        return bad(1, e.problem, f"{e.what} after {e.offset:,} uncompressed bytes")
    if (binary := binary_record(data)) is not None:
        return binary
    over = len(data) > byte_limit
    data = data[:byte_limit]
    repaired = False
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        cut = over and e.start >= len(data) - 3  # a character cut by the byte limit
        if not cut and not replace:
            number = 1 + data[: e.start].count(b"\n")
            return bad(number, "decode_error", f"invalid UTF-8 at line {number}")
        if cut:  # (the first bad byte is there: what comes before it decodes)
            text = data[: e.start].decode("utf-8")
        else:
            text, repaired = data.decode("utf-8", errors="replace"), True
    if over and not truncate:
        return Record(1, None, "too_long", f"over {byte_limit:,} bytes (4 per character at most), so over --max-chars")
    return Record(1, text, repaired=repaired)


def _replaced(text: str) -> str:
    """Text read with errors='surrogateescape', its bytes that were not UTF-8 made U+FFFD."""
    return text.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")


def _undecodable(text: str) -> bool:
    """Text read with errors='surrogateescape' carries bytes that were not UTF-8 as U+DC80-DCFF."""
    return not text.isascii() and _ESCAPED.search(text) is not None
