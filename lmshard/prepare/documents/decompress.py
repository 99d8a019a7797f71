"""Compressed inputs read as their uncompressed bytes (gzip, bz2, xz, zstd), and damage found in
them named: where the data ends early or fails a check (`DamagedInput`), after how many good
bytes, so a parser keeps every record before it and --on-error decides about the rest.

Memory model: one block of decompressed data (64 KiB per read unless the caller asks for more;
a zstd frame's output of one 16 KiB compressed read).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from collections.abc import Callable
from typing import IO, Any, Protocol, cast

from ...errors import InputError, missing_dependency
from .reading import changed, grew


class Input(Protocol):
    """What this module reads of an input (files.Source)."""

    @property
    def path(self) -> str: ...
    @property
    def compression(self) -> str | None: ...
    @property
    def size(self) -> int: ...
    @property
    def stream(self) -> bool: ...
    @property
    def inode(self) -> int: ...


def decompressed(source: Input, file: Any) -> IO[bytes]:
    """The uncompressed bytes of `source`, a compressed input open as `file` (a `Decompressed`)."""
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

    def __init__(self, inner: Any, source: Input, errors: tuple[type[BaseException], ...] = (),
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


def damaged(source: Input, error: BaseException, offset: int) -> DamagedInput:
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
