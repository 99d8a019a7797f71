"""Parquet and arrow inputs: how many row groups or record batches a file holds (planning), and
the records of one of them (a worker). pyarrow reads these files by path, seeking, so they are
never read from a pipe; its operating-system errors are named as the input's. An object at a URL
is read through `urlfile.URLInput` in ranged requests: the footer, then the row group's column.

Records are numbered from 1 in the file, as lines are: row 1 is the first row of row group 0.

Memory model: one row group's or record batch's text column; arrow files are memory-mapped
(at a URL: the parts read, one fetched block at a time).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...errors import InputError, LmshardError
from .decompress import rewound
from .files import Source, open_raw
from .reading import cannot_stream, read_error
from .records import Record, typed_text, with_domain


def open_arrow(src: Source) -> Any:
    """An arrow IPC reader for the file format or, as `datasets.save_to_disk` writes, the
    stream format; both memory-mapped."""
    import pyarrow as pa

    where = _seekable(src)
    opened = (lambda: pa.memory_map(where)) if isinstance(where, str) else (lambda: rewound(where))
    try:
        try:
            return pa.ipc.open_file(opened())
        except pa.ArrowInvalid:
            try:
                return pa.ipc.open_stream(opened())
            except pa.ArrowInvalid as e:
                raise InputError(f"{src.path}: not an arrow IPC file ({e})") from None
    except OSError as e:
        raise read_error(src.path, e) from None


def _seekable(src: Source) -> Any:
    """The path of a parquet or arrow file (of a pipe a planned run saved: its copy), refused for
    a pipe and checked to be the file the run recorded (not replaced, not shrunk); for an object
    at a URL, the object opened (`urlfile.URLInput`: pyarrow reads what it needs of it in ranged
    requests)."""
    if src.stream:
        raise cannot_stream(src.path, src.fmt)
    if src.url:
        return open_raw(src)
    if src.inode:
        open_raw(src).close()
    return src.spool or src.path  # (a pipe a planned run saved: its copy)


def arrow_batches(reader: Any) -> Iterator[Any]:
    if hasattr(reader, "num_record_batches"):
        for b in range(reader.num_record_batches):
            yield reader.get_batch(b)
    else:
        yield from reader


def parquet_file(src: Source) -> Any:
    """pyarrow's ParquetFile of `src`; a file that is not parquet, or cannot be read, is one line."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(_seekable(src))
    except OSError as e:
        if e.errno:  # the file system's failure; pyarrow's OSErrors without one are about the data
            raise read_error(src.path, e) from None
        raise InputError(f"{src.path}: not a readable parquet file ({e})") from None
    except LmshardError:  # the input's own read error (an object at a URL that could not be fetched)
        raise
    except Exception as e:  # pyarrow raises several types for a bad file
        raise InputError(f"{src.path}: not a readable parquet file ({e})") from None


def parquet_row_groups(src: Source) -> int:
    return int(parquet_file(src).metadata.num_row_groups)


def _column(table: Any, src: Source, text_field: str) -> list[Any]:
    names = table.schema.names
    if text_field not in names:
        raise InputError(
            f"{src.path}: no column '{text_field}' (columns: {', '.join(names[:12])}); "
            "name the text column with --text-field"
        )
    return table.column(text_field).to_pylist()


def _records(table: Any, src: Source, first: int, text_field: str) -> Iterator[Record]:
    """The records of a table (a row group, a record batch) whose first row is record number
    `first` (1-based); with --val-by FIELD, each with its domain (records.with_domain): the
    column of FIELD's name, or of its first part (a struct holding the rest)."""
    values = _column(table, src, text_field)
    domain = getattr(text_field, "domain", None)
    name = _domain_column(table.schema.names, domain) if domain is not None else None
    rows = table.column(name).to_pylist() if name is not None else None
    for k, value in enumerate(values):
        record = typed_text(first + k, value, text_field)
        yield record if domain is None else with_domain(record, {name: rows[k]} if rows is not None else {}, text_field)


def _domain_column(names: list[str], domain: str) -> str | None:
    """The column that holds the domain field `domain` (None: none does)."""
    root = domain.split(".")[0]
    return domain if domain in names else root if root in names else None


def _read_columns(names: list[str], text_field: str) -> list[str]:
    """The columns to read for `text_field` (records.RecordFields: and the domain's)."""
    domain = getattr(text_field, "domain", None)
    extra = _domain_column(names, domain) if domain is not None else None
    return [text_field] + ([extra] if extra is not None and extra != text_field else [])


def parse_parquet(src: Source, row_group: int, text_field: str) -> Iterator[Record]:
    pf = parquet_file(src)
    first = 1 + sum(pf.metadata.row_group(g).num_rows for g in range(row_group))
    if text_field not in pf.schema_arrow.names:
        _column(pf.schema_arrow.empty_table(), src, text_field)
    yield from _records(_row_group(pf, src, row_group, text_field), src, first, text_field)


def _row_group(pf: Any, src: Source, row_group: int, text_field: str) -> Any:
    """The text column of one row group; damaged data is the input's error, naming the row group."""
    try:
        return pf.read_row_group(row_group, columns=_read_columns(pf.schema_arrow.names, text_field))
    except (MemoryError, LmshardError):
        raise  # the machine's limit, or the input's read error (a URL), not the file's fault
    except OSError as e:
        if e.errno:  # the file system's failure; pyarrow's OSErrors without one are about the data
            raise read_error(src.path, e) from None
        raise _damaged(src, row_group, e) from None
    except Exception as e:  # pyarrow raises several types for damaged data (ArrowInvalid, ...)
        raise _damaged(src, row_group, e) from None


def _damaged(src: Source, row_group: int, e: Exception) -> InputError:
    return InputError(f"{src.path}: row group {row_group}: not readable parquet data ({e}); re-create the file")


def arrow_records(src: Source, text_field: str) -> Iterator[Record]:
    """Every record of an arrow file, batch after batch (an object at a URL is read once, in
    order, rather than once per batch)."""
    first = 1
    for rb in arrow_batches(open_arrow(src)):
        yield from _records(rb, src, first, text_field)
        first += rb.num_rows


def parse_arrow(src: Source, batch: int, text_field: str) -> Iterator[Record]:
    first = 1
    for b, rb in enumerate(arrow_batches(open_arrow(src))):
        if b == batch:
            yield from _records(rb, src, first, text_field)
            return
        first += rb.num_rows
