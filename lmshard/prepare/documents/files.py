"""The I/O leaf of the prepare pipeline: what an input file is, and how its bytes are opened.

Planning (`sources.py`) and parsing (`records.py`) both read files only through this module,
which imports nothing else of lmshard's but its errors, `reading.py` (how a file is opened
as the run recorded it), `urlfile.py` (how an object at a URL is) and `decompress.py` (how a
compressed one is read, and its damage named): the format and compression of a path, opening
its bytes, and sniffing binary data. Parquet and arrow
files are pyarrow's to read (`columnar.py`).

Memory model: nothing is read here beyond what a caller asks for (`read_prefix` reads at most
its limit + 1 bytes).
"""

from __future__ import annotations

import io
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import IO, cast

from ...errors import InputError
from .decompress import DamagedInput, decompressed
from .reading import Headed, InputFile, read_error
from .urlfile import URLInput

Raw = InputFile | URLInput  # an input opened as the run recorded it: a local file or pipe, or an object at a URL

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
    size: int  # bytes on disk (compressed) when the run started, 0 for stdin and pipes; read up to this many
    stream: bool = False  # stdin or a pipe (a FIFO, `<(...)`): read once, in order, never sought
    inode: int = 0  # the file's inode when the run started (0: not recorded): reading checks it is the same file
    # An object at a URL: `url` opens it (credentials and all), `path` is that URL redacted, the
    # name every message, record and fingerprint shows; `version` is the ETag (or modification
    # time) its listing gave when the run started, for --resume's fingerprint; a Hugging Face
    # stream's, in a plan: which data files it was planned with (hfread.stream_mark).
    url: str = field(default="", repr=False)
    version: str = ""
    # A stream (stdin, a pipe) a planned run saved to a file of its work folder before planning:
    # read from that file like any other, named `path` ('-') in every message, record and total.
    spool: str = ""

    @property
    def piped(self) -> bool:
        """stdin or a pipe, read as it comes or from the file a planned run saved it to: its text
        is never one document whatever its size (--text-mode auto splits it into paragraphs)."""
        return self.stream or bool(self.spool)


def detect(path: str, fmt_override: str | None = None) -> Source:
    """Work out format and compression from the file name (`name.jsonl.gz` etc.)."""
    if path == "-":
        return Source("-", fmt_override or "jsonl", None, 0, stream=True)
    p = Path(path)
    fmt, compression = kind_of(path, p.name, fmt_override)
    try:
        st = p.stat()
    except OSError as e:
        raise read_error(path, e) from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO, `<(...)` (/dev/fd/N), a device: read as stdin is
        return Source(str(p), fmt, compression, 0, stream=True)
    return Source(str(p), fmt, compression, st.st_size, inode=st.st_ino)


def kind_of(shown: str, name: str, fmt_override: str | None) -> tuple[str, str | None]:
    """(format, compression) of a file called `name` (`shown` in the message if it has none)."""
    suffixes = [s.lower() for s in PurePosixPath(name).suffixes]
    compression = COMPRESSION_BY_SUFFIX.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    fmt = fmt_override or (FORMAT_BY_SUFFIX.get(suffixes[-1]) if suffixes else None)
    if fmt is None:
        raise InputError(
            f"{shown}: unknown file type; name it .txt/.jsonl/.json/.csv/.parquet/.arrow "
            "(optionally .gz/.zst/.bz2/.xz) or pass --format"
        )
    return fmt, compression


def known_type(path: PurePath, fmt_override: str | None) -> bool:
    """Whether a directory walk can read this file: any file with --format, else one whose
    suffix (before a compression suffix) names a format. Which entries a walk visits at all
    (not hidden ones, not lmshard's own outputs) is decided in `walk.py`."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSION_BY_SUFFIX:
        suffixes = suffixes[:-1]
    return bool(fmt_override) or bool(suffixes and suffixes[-1] in FORMAT_BY_SUFFIX)


def type_suffix(path: PurePath) -> str:
    """How a walk names the type of a file it cannot read: the last suffix, with the one before
    it when the last is a compression (".png", ".1.gz" for a man page, ".tar.gz"), or ""."""
    suffixes = [s.lower() for s in path.suffixes]
    n = 2 if len(suffixes) > 1 and suffixes[-1] in COMPRESSION_BY_SUFFIX else 1
    return "".join(suffixes[-n:])


def compression_of(path: str) -> str | None:
    """The compression a file name says ("gzip" for `x.1.gz`), or None."""
    return COMPRESSION_BY_SUFFIX.get(Path(path).suffix.lower())


def open_binary(source: Source, start: int = 0) -> tuple[IO[bytes], Raw]:
    """Return (data, raw file) for `source`, from byte `start` of an uncompressed file; the data
    from the start has no UTF-8 byte-order mark, and `raw.tell()` measures progress. A compressed
    stream raises `DamagedInput` where its data ends early or fails a check; the OS's errors are
    the input's (`InputReadError`)."""
    raw = open_raw(source)
    if start:
        raw.seek(start)
        return cast(IO[bytes], raw), raw
    if source.compression is None and raw.seekable():  # the mark is skipped, so raw.tell() is where the data is
        raw.skip_mark()
        return cast(IO[bytes], Headed(raw, marked=False)), raw
    data = cast(IO[bytes], raw) if source.compression is None else decompressed(source, raw)
    return cast(IO[bytes], Headed(data)), raw


def open_raw(source: Source) -> Raw:
    """The file of `source` as the run recorded it (`reading.InputFile`), the stream, or the
    object at its URL (`urlfile.URLInput`, up to the size recorded)."""
    if source.url:  # size 0 and no version: not recorded (a walk's sniff), or empty: its size is asked for
        return URLInput(source.url, source.path, source.size if source.size or source.version else None)
    if source.spool:
        return InputFile(source.spool, source.size, source.inode, lines=source.compression is None)
    if source.path == "-":
        return InputFile("-", file=sys.stdin.buffer)
    if source.stream or not source.inode:  # a pipe; or a file the run did not record (a walk's sniff)
        return InputFile(source.path)
    return InputFile(source.path, source.size, source.inode, lines=source.compression is None)


def read_prefix(source: Source, limit: int) -> bytes:
    """The first `limit` decompressed bytes of a source, plus one more to detect overflow."""
    stream, raw = open_binary(source)
    try:
        data = stream.read(limit + 1)
        if len(data) <= limit:
            stream.read(1)  # at the end: raises the damage, if any, found after the bytes returned
        return data
    finally:
        raw.close()


def first_byte(source: Source) -> bytes:
    """The first byte of a source's data that is not whitespace or a UTF-8 byte-order mark
    (b"" for none): b"[" marks a JSON array. Reads a block at a time until it is found."""
    stream, raw = open_binary(source)
    try:
        while block := stream.read(SNIFF_BYTES):
            if rest := block.lstrip(b" \t\r\n").removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n"):
                return rest[:1]
        return b""
    except DamagedInput:
        return b""  # nothing readable before the damage: the line reader reports it
    finally:
        raw.close()


def fits(source: Source, limit: int) -> bool:
    """Whether a source's data is at most `limit` bytes: its size on disk, or for a compressed
    file, counted by decompressing at most `limit` + 1 bytes a block at a time."""
    if source.compression is None:
        return source.size <= limit
    stream, raw = open_binary(source)
    try:
        seen = 0
        while seen <= limit and (block := stream.read(min(1 << 20, limit + 1 - seen))):
            seen += len(block)
        return seen <= limit
    except DamagedInput:
        return True  # damaged before the limit: read whole, where the damage is reported
    finally:
        raw.close()


def text_stream(src: Source) -> tuple[io.TextIOWrapper, Raw]:
    """A strict UTF-8 text view of a source (for formats parsed record by record)."""
    stream, raw = open_binary(src)
    return io.TextIOWrapper(stream, encoding="utf-8", errors="strict", newline=""), raw


def nul_offset(block: bytes) -> int | None:
    """Offset of the first NUL byte in a block's sniffed prefix: text input has none, so one
    means a binary file was passed by mistake."""
    pos = block.find(b"\x00", 0, SNIFF_BYTES)
    return None if pos < 0 else pos
