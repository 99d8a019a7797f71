"""The I/O leaf of the prepare pipeline: what an input file is, and how its bytes are opened.

Planning (`sources.py`) and parsing (`records.py`) both read files only through this module,
which imports nothing else of lmshard's but its errors, `reading.py` (how a file is opened
as the run recorded it) and `urlfile.py` (how an object at a URL is): the format and
compression of a path, decompressing streams, and sniffing binary data. Parquet and arrow
files are pyarrow's to read (`columnar.py`).

Memory model: nothing is read here beyond what a caller asks for (`read_prefix` reads at most
its limit + 1 bytes).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import stat
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import IO, Any, cast

from ...errors import InputError, missing_dependency
from .reading import Headed, InputFile, changed, grew, read_error
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
    # time) its listing gave when the run started, for --resume's fingerprint.
    url: str = field(default="", repr=False)
    version: str = ""
    # A stream (stdin, a pipe) a planned run saved to a file of its work folder before planning:
    # read from that file like any other, named `path` ('-') in every message, record and total.
    spool: str = ""


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
    data = cast(IO[bytes], raw) if source.compression is None else _decompressed(source, raw)
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


def _decompressed(source: Source, file: Raw) -> IO[bytes]:
    raw = cast(IO[bytes], file)
    inner: Any
    errors: tuple[type[BaseException], ...] = ()
    careful: Callable[[], Any] | None = None
    if source.compression == "gzip":
        fast, errors = _gzip_reader() if not source.stream else (None, ())  # its careful re-read seeks
        inner = fast.GzipFile(fileobj=raw) if fast else gzip.GzipFile(fileobj=raw)
        if fast:  # on damage, the standard reader finds exactly where the good data ends
            careful = lambda: gzip.GzipFile(fileobj=rewound(raw))  # noqa: E731
    elif source.compression == "bz2":
        inner = bz2.BZ2File(raw)
    elif source.compression == "xz":
        inner = lzma.LZMAFile(raw)  # noqa: SIM115  # closed with `raw` by the caller
    else:
        inner = _ZstdFrames(raw, source.path)
    return cast(IO[bytes], Decompressed(inner, source, errors, careful))


def rewound(raw: IO[bytes]) -> IO[bytes]:
    """`raw`, sought back to its start."""
    raw.seek(0)
    return raw


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


class DamagedInput(InputError):
    """A compressed input whose data ends early ("truncated_compression") or fails its
    decompressor ("corrupt_compression": bad data, a CRC mismatch). `what` says which, `offset`
    how many uncompressed bytes came before it; parsers turn it into a record problem that names
    the line or record, so --on-error decides whether the records before it are kept."""

    def __init__(self, message: str, problem: str = "corrupt_compression", what: str = "", offset: int = 0) -> None:
        super().__init__(message)  # message alone in args: the exception still pickles
        self.problem, self.what, self.offset = problem, what, offset


class Decompressed(io.BufferedIOBase):
    """The uncompressed bytes of a compressed file. Damage is raised only after every byte
    decoded before it was returned (`read` returns what it has and raises on the next call), so a
    reader keeps all records before it; a decompressor's own errors (EOFError, zlib.error, ...)
    never escape."""

    def __init__(self, inner: Any, source: Source, errors: tuple[type[BaseException], ...] = (),
                 careful: Callable[[], Any] | None = None) -> None:  # fmt: skip
        """`errors`: the inner reader's own damage errors, beyond DECOMPRESSION_ERRORS.
        `careful`: makes a standard reader from the file's start, for a fast `inner` that may
        stop short of the last good byte on damage."""
        super().__init__()
        self._inner, self._source, self._careful = inner, source, careful
        self._errors: tuple[type[BaseException], ...] = (*DECOMPRESSION_ERRORS, *errors, OSError, _CodecError)
        self.offset = 0  # uncompressed bytes returned so far
        self.damage: DamagedInput | None = None

    def readable(self) -> bool:
        return True

    def read1(self, size: int | None = -1) -> bytes:
        if self.damage is not None:
            raise self.damage
        try:
            data: bytes = self._inner.read1(size if size and size > 0 else BLOCK_READ)
        except self._errors as e:
            if isinstance(e, OSError) and e.errno is not None:
                raise  # the disk, not the data: reported as an OSError
            if self._careful is not None:
                return self._switch_to_careful(size)
            self.damage = damaged(self._source, e, self.offset)
            raise self.damage from None
        self.offset += len(data)
        return data

    def _switch_to_careful(self, size: int | None) -> bytes:
        """Go on with the standard reader from where the fast one stopped (damage is rare: the
        file is decompressed again up to that point)."""
        self._inner, self._careful = self._careful(), None  # type: ignore[misc]
        self._errors = (*DECOMPRESSION_ERRORS, OSError, _CodecError)
        skip = self.offset
        while skip > 0:
            try:
                got = len(self._inner.read1(min(skip, BLOCK_BYTES_SKIP)))
            except self._errors as e:  # cannot happen: the fast reader decoded these bytes
                if isinstance(e, OSError) and e.errno is not None:
                    raise
                self.damage = damaged(self._source, e, self.offset - skip)
                raise self.damage from None
            if got == 0:
                break
            skip -= got
        return self.read1(size)

    def read(self, size: int | None = -1) -> bytes:
        parts: list[bytes] = []
        want = size if size is not None and size >= 0 else -1
        while want != 0:
            try:
                data = self.read1(want if want > 0 else BLOCK_READ)
            except DamagedInput:
                if parts:
                    break  # deliver the good bytes; the next read raises
                raise
            if not data:
                break
            parts.append(data)
            want = max(want - len(data), 0) if want > 0 else -1
        return b"".join(parts)


BLOCK_READ = 1 << 16  # uncompressed bytes per read when the caller names no size
BLOCK_BYTES_SKIP = 1 << 20  # uncompressed bytes per read when skipping what was already returned


def damaged(source: Source, error: BaseException, offset: int) -> DamagedInput:
    """A decompressor's error as a `DamagedInput`: truncated, a checksum mismatch, or corrupt data.
    Data cut at the size the file had when the run started, in a file that has grown since, is
    no damage: the file is still being written, and that is raised instead."""
    problem, what = damage_kind(error, source.compression or "compressed")
    if problem == "truncated_compression" and source.inode and grew(source.path, source.size, source.inode):
        raise changed(source.path, f"it grew past the {source.size:,} bytes it held when the run started, "
                                   f"and its {source.compression} data is cut there")  # fmt: skip
    message = f"{source.path}: {what} after {offset:,} uncompressed bytes; re-download or re-create the file"
    return DamagedInput(message, problem, what, offset)


# What decompressors raise for damaged data (bz2 raises a plain OSError, without an errno).
DECOMPRESSION_ERRORS: tuple[type[BaseException], ...] = (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)


def _gzip_reader() -> tuple[Any, tuple[type[BaseException], ...]]:
    """ISA-L's gzip reader and its error types (the `isal` package, in the `fast` extra), or
    (None, ()) without it. It decompresses the same bytes about three times faster and checks the
    same CRC and length, but on damaged data it drops some of the good bytes before the damage
    (all of a large read), so `Decompressed` re-reads a damaged file with the standard reader."""
    try:
        from isal import igzip, isal_zlib
    except ImportError:
        return None, ()
    return igzip, (cast("type[BaseException]", isal_zlib.error),)


def damage_kind(error: BaseException, codec: str) -> tuple[str, str]:
    """(problem, what) for a decompressor's error: ("truncated_compression", "truncated gzip
    data"), or "corrupt_compression" with a checksum mismatch or corrupt data, and its detail."""
    detail = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, EOFError):
        return "truncated_compression", f"truncated {codec} data"
    if "crc" in detail.lower() or "checksum" in detail.lower():
        return "corrupt_compression", f"{codec} checksum mismatch ({detail})"
    return "corrupt_compression", f"corrupt {codec} data ({detail})"


class _CodecError(Exception):
    """A zstd decoding error, kept apart from the optional package's own exception type."""


class _ZstdFrames:
    """zstd frames one after another, read with one decompressor per frame: python-zstandard's
    stream reader ends quietly inside a truncated frame, so frame ends are tracked here."""

    RAW_READ = 1 << 14  # compressed bytes per call; output is this times the ratio (~100x for text)

    def __init__(self, raw: IO[bytes], path: str) -> None:
        try:
            import zstandard
        except ImportError:
            raise missing_dependency("zstandard", "zstd", f"{path}: reading .zst") from None
        self._raw, self._zstd = raw, zstandard
        self._frame = zstandard.ZstdDecompressor().decompressobj()
        self._fed = False  # whether the current frame has had input
        self._out, self._pos = b"", 0

    def read1(self, size: int) -> bytes:
        while self._pos >= len(self._out):
            if self._frame.eof:
                rest = self._frame.unused_data
                self._frame, self._fed = self._zstd.ZstdDecompressor().decompressobj(), False
            else:
                rest = b""
            chunk = rest or self._raw.read(self.RAW_READ)
            if not chunk:
                if self._fed:
                    raise EOFError("zstd frame ended early")
                return b""
            self._fed = True
            try:
                self._out, self._pos = self._frame.decompress(chunk), 0
            except self._zstd.ZstdError as e:
                raise _CodecError(str(e).removeprefix("zstd decompressor error: ")) from None
        data = self._out[self._pos : self._pos + size]
        self._pos += len(data)
        return data


def nul_offset(block: bytes) -> int | None:
    """Offset of the first NUL byte in a block's sniffed prefix: text input has none, so one
    means a binary file was passed by mistake."""
    pos = block.find(b"\x00", 0, SNIFF_BYTES)
    return None if pos < 0 else pos
