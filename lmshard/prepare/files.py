"""The I/O leaf of the prepare pipeline: what an input file is, and how its bytes are opened.

Planning (`sources.py`) and parsing (`records.py`) both read files only through this module,
which imports nothing else of lmshard's but its errors: the format and compression of a path,
decompressing streams, sniffing binary data, and the arrow/parquet readers.

Memory model: nothing is read here beyond what a caller asks for (`read_prefix` reads at most
its limit + 1 bytes); arrow files are memory-mapped.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from ..errors import InputError, missing_dependency

MAX_RECORD_BYTES = 256 << 20  # one line / record larger than this is refused, not buffered
SNIFF_BYTES = 65536  # a NUL byte in this many leading bytes marks a file as binary
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


def known_type(path: Path, fmt_override: str | None) -> bool:
    """Whether a directory walk takes this file: a known type, and not hidden (.git, swaps)."""
    if path.name.startswith("."):
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


def text_stream(src: Source) -> tuple[io.TextIOWrapper, IO[bytes]]:
    """A strict UTF-8 text view of a source (for formats parsed record by record)."""
    stream, raw = open_binary(src)
    return io.TextIOWrapper(stream, encoding="utf-8", errors="strict", newline=""), raw


def nul_offset(block: bytes) -> int | None:
    """Offset of the first NUL byte in a block's sniffed prefix: text input has none, so one
    means a binary file was passed by mistake."""
    pos = block.find(b"\x00", 0, SNIFF_BYTES)
    return None if pos < 0 else pos


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


def parquet_row_groups(src: Source) -> int:
    import pyarrow.parquet as pq

    try:
        return int(pq.ParquetFile(src.path).metadata.num_row_groups)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise InputError(f"{src.path}: not a readable parquet file ({e})") from None
