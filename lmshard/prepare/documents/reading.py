"""How an input file's bytes are read: as the run found it when it started, from its start without
a UTF-8 byte-order mark, and with every failure named as that input's.

- `InputFile` reads a regular file up to the size recorded when the run started (`Source.size`),
  so a file still being appended to is read the same way however late a worker opens it: its
  last line is kept only when it is whole (a record half-written at that size is left for the
  next run, never reported as a bad line), however the reads fall: a planner's blocks, a
  worker's whole read, a scale-out unit's range. A file that is replaced or shrinks before it
  is read to that size is refused, "changed while reading". It reads pipes and stdin as they come.
- Every operating-system error while opening or reading an input (a permission, an I/O error,
  a file gone) becomes an `InputReadError` naming the input: it never reaches the caller as a
  bare `OSError`, which the run would blame on `--out`; and it crosses from a worker process to
  the main one intact (an `LmshardError` pickles by its message).
- `Headed` takes a UTF-8 byte-order mark (Windows Notepad, Excel's "CSV UTF-8") off the start
  of any input's data, compressed or not; `foreign_encoding` recognises the byte-order marks of
  UTF-16 and UTF-32 (PowerShell's `>` writes UTF-16) for a message that says how to re-encode.

Memory model: nothing beyond what a caller asks for; `Headed` holds at most the few bytes it
looked ahead (or, after `peek`, the bytes peeked).
"""

from __future__ import annotations

import errno
import io
import os
import shlex
from pathlib import PurePath
from typing import IO, Any

from ...errors import InputError, LmshardError

UTF8_BOM = b"\xef\xbb\xbf"
# The byte-order marks of encodings a text file may be in by mistake; UTF-32 LE's mark begins
# with UTF-16 LE's, so the longer marks come first.
FOREIGN_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32", "little-endian"),
    (b"\x00\x00\xfe\xff", "UTF-32", "big-endian"),
    (b"\xff\xfe", "UTF-16", "little-endian"),
    (b"\xfe\xff", "UTF-16", "big-endian"),
)
UTF16_SNIFF = 64  # leading bytes that, alternating NUL and ASCII, mark UTF-16 text without a mark
# How far back from the recorded size the start of an unfinished last line is looked for (bytes):
# files.MAX_RECORD_BYTES, past which a reader refuses the line anyway.
LAST_LINE_REACH = 256 << 20
SEARCH_BYTES = 64 << 10  # bytes per backward read while looking for that line's start


class InputReadError(InputError):
    """The operating system could not read an input (a permission, an I/O error, a file gone).
    The input may be sound, so a run keeps its work and can be resumed once the file reads."""

    def at(self, path: str, line: int) -> InputReadError:
        """The same error naming the line that reading had reached: "a.jsonl:1234: ..."."""
        message = str(self)
        return type(self)(f"{path}:{line}{message[len(path) :]}") if message.startswith(f"{path}: ") else self


class InputGone(InputReadError):
    """An input moved or deleted after the run started. The run's work is kept for a --resume
    once it is back; without it the inputs differ, which --resume refuses, so the run must
    start again."""


def nothing_kept(what: object, stream_path: str) -> LmshardError:
    """A run reading stdin or a pipe (`stream_path`) stopped by `what`: the stream was read once,
    so nothing of the run is kept and no --resume is offered."""
    name = "stdin" if stream_path == "-" else f"the pipe {stream_path}"
    return LmshardError(f"{what}; nothing was kept (a run reading {name} cannot be resumed)")


def work_kept(what: object, kept: str, gone: bool) -> LmshardError:
    """A run stopped by a machine or store that failed, not by its input: `what` went wrong, and
    `kept` says where its work is; an input gone (`gone`) says itself when --resume can go on."""
    if gone:
        return LmshardError(f"{what} ({kept})")
    return LmshardError(f"{what}; {kept}: run the same command with --resume to continue")


def read_error(path: str, e: OSError, offset: int = 0) -> InputReadError:
    """An OSError while opening or reading input `path` (`offset` bytes into it) as one line
    naming the input and the fix."""
    why = os.strerror(e.errno) if e.errno else str(e) or type(e).__name__  # pyarrow puts its own text in strerror
    if e.errno in (errno.EACCES, errno.EPERM):
        return InputReadError(f"{path}: cannot read this input ({why}); make it readable "
                              f"(chmod u+r {shlex.quote(path)}) or leave it out of the inputs")  # fmt: skip
    if e.errno == errno.ENOENT:
        return InputGone(f"{path}: this input is gone ({why}): moved or deleted after the run started; put it back "
                         "and run the same command with --resume, or leave it out of the inputs and start again "
                         "with --overwrite")  # fmt: skip
    at = f" after {offset:,} bytes" if offset else ""
    return InputReadError(f"{path}: cannot read this input{at} ({why}); check the disk or filesystem it is on, "
                          "or copy it to another one")  # fmt: skip


def changed(path: str, how: str) -> InputError:
    """The error for an input that changed under the run: `how` says what was seen."""
    return InputError(f"{path}: changed while reading: {how}; run again once nothing writes to it")


def cannot_stream(path: str, fmt: str) -> InputError:
    return InputError(f"{path}: a pipe, and a {fmt} file is read by seeking, which a pipe cannot do; "
                      "save it to a file and pass that")  # fmt: skip


class InputFile(io.BufferedIOBase):
    """An input opened for reading: a regular file read up to `size` bytes (None: to its end,
    for pipes, stdin and files the run did not record), which must still be the file of inode
    `inode` (0: not checked). `lines`: data made of lines, whose last line is kept only when
    whole if the file grew past `size` (a writer still appending to it). `tell` counts the bytes
    read, so it works on a pipe too."""

    def __init__(self, path: str, size: int | None = None, inode: int = 0, *, lines: bool = False,
                 file: IO[bytes] | None = None) -> None:  # fmt: skip
        """`file`: an open stream to read instead of opening `path` (stdin)."""
        super().__init__()
        self.name, self.mode = path, "rb"
        self._size, self._end, self._lines, self._pos = size, size, lines and size is not None, 0
        self._own = False  # stdin is left open for whoever else reads it
        try:
            self._f: IO[bytes] = file if file is not None else open(path, "rb")  # noqa: SIM115 (closed by close)
        except OSError as e:
            raise read_error(path, e) from None
        self._own = file is None
        # Where the last line at `size` starts when it has no line end there (looked for by the
        # first read, so that a check that only opens the file reads nothing); None: no such line,
        # or one too long to leave out. The first read into it decides whether it is kept.
        self._tail: int | None = None
        if size is not None:
            self._check(inode)

    def _check(self, inode: int) -> None:
        """Refuse a file that is not the one the run recorded: replaced, or shorter than it was."""
        st = self._stat()
        if inode and st.st_ino != inode:
            self.close()
            raise changed(self.name, "it was replaced by another file after the run started")
        if self._size is not None and st.st_size < self._size:
            self.close()
            raise changed(self.name, f"it held {self._size:,} bytes when the run started and holds {st.st_size:,} now")

    def _stat(self) -> os.stat_result:
        try:
            return os.fstat(self._f.fileno())
        except OSError as e:
            raise read_error(self.name, e, self._pos) from None

    def _pread(self, n: int, offset: int) -> bytes:
        try:
            return os.pread(self._f.fileno(), n, offset)
        except OSError as e:
            raise read_error(self.name, e, offset) from None

    def _last_line_start(self, size: int) -> int | None:
        """The offset just past the last line end before `size` (0: none), when the data does
        not end with one there; None when it does, or when that line reaches further back than
        LAST_LINE_REACH. One short read backwards for a file of ordinary lines."""
        if size == 0 or self._pread(1, size - 1) == b"\n":
            return None
        at = size
        while at > max(0, size - LAST_LINE_REACH):
            start = max(0, at - SEARCH_BYTES)
            block = self._pread(at - start, start)
            if (k := block.rfind(b"\n")) >= 0:
                return start + k + 1
            at = start
        return 0 if at == 0 else None

    def _settle_tail(self) -> None:
        """Decide, before any of it is returned, whether the unfinished last line is read: not
        when the file has grown since and the line goes on past `size` (a writer mid-record);
        a line whose line end was written later was whole at that size, and is kept."""
        tail, size, self._tail = self._tail, self._size, None
        assert tail is not None and size is not None  # a tail is found only in a file of known size
        if self._stat().st_size > size and self._pread(1, size) not in (b"\n", b"\r"):
            self._end = tail

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._size is not None

    def read(self, size: int | None = -1) -> bytes:
        want = -1 if size is None or size < 0 else size
        if self._end is not None:
            if self._lines:
                self._lines, self._tail = False, self._last_line_start(self._end)
            if self._tail is not None and (want < 0 or self._pos + want > self._tail):
                self._settle_tail()
            left = max(0, self._end - self._pos)
            want = left if want < 0 else min(want, left)
        if want == 0:
            return b""
        data = self._read(want)
        if self._end is not None and len(data) < want:
            raise changed(self.name, f"it held {self._size:,} bytes when the run started and ends after "
                                     f"{self._pos + len(data):,} now")  # fmt: skip
        self._pos += len(data)
        return data

    def read1(self, size: int | None = -1) -> bytes:
        return self.read(size if size is not None and size >= 0 else io.DEFAULT_BUFFER_SIZE)

    def _read(self, want: int) -> bytes:
        """`want` bytes (-1: all), fewer only at the end of the data."""
        parts: list[bytes] = []
        got = 0
        try:
            while want < 0 or got < want:
                block = self._f.read(want - got if want >= 0 else -1)
                if not block:
                    break
                parts.append(block)
                got += len(block)
        except OSError as e:
            raise read_error(self.name, e, self._pos + got) from None
        return b"".join(parts)

    def skip_mark(self) -> None:
        """Go past the UTF-8 byte-order mark the file starts with, if any (at its start)."""
        if self.read(len(UTF8_BOM)) != UTF8_BOM:
            self.seek(0)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence != io.SEEK_SET:
            raise io.UnsupportedOperation("an input is sought from its start only")
        try:
            self._f.seek(offset)
        except OSError as e:
            raise read_error(self.name, e, offset) from None
        self._pos = offset
        return offset

    def tell(self) -> int:
        return self._pos

    def fileno(self) -> int:
        return self._f.fileno()

    def close(self) -> None:
        if not self.closed and self._own:
            self._f.close()
        super().close()


def grew(path: str, size: int, inode: int) -> bool:
    """Whether the file at `path`, recorded at `size` bytes, is the same file and larger now."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (not inode or st.st_ino == inode) and st.st_size > size


class Headed(io.BufferedIOBase):
    """An input's data from its start, without the UTF-8 byte-order mark it may begin with
    (`marked`: whether it may still be there, or was skipped already). `peek(n)` shows the
    first `n` bytes (the mark taken off) without consuming them."""

    def __init__(self, inner: Any, marked: bool = True) -> None:
        super().__init__()
        self._inner = inner
        self._head: bytes | None = None if marked else b""  # read ahead, not yet returned; None: not started

    def readable(self) -> bool:
        return True

    def _fill(self, n: int) -> bytes:
        head = self._head or b""
        while len(head) < n and (more := self._inner.read(n - len(head))):
            head += more
        if self._head is None:
            head = head.removeprefix(UTF8_BOM)
        self._head = head
        return head

    def peek(self, size: int = 0) -> bytes:
        return self._fill(max(size, len(UTF8_BOM)))[: max(size, 1)]

    def read(self, size: int | None = -1) -> bytes:
        head = self._fill(len(UTF8_BOM)) if self._head is None else self._head
        if size is None or size < 0:
            self._head = b""
            return head + self._inner.read()
        data, self._head = head[:size], head[size:]
        return data + self._inner.read(size - len(data)) if len(data) < size else data

    def read1(self, size: int | None = -1) -> bytes:
        return self.read(size if size is not None and size >= 0 else io.DEFAULT_BUFFER_SIZE)


def foreign_encoding(block: bytes) -> tuple[str, str] | None:
    """(encoding, how it was recognised) for data that starts with a UTF-16 or UTF-32
    byte-order mark, or reads as UTF-16 without one (NUL bytes alternating with ASCII); None
    for anything else. ("UTF-16", "a little-endian byte-order mark")."""
    for mark, name, order in FOREIGN_BOMS:
        if block.startswith(mark):
            return name, f"a {order} byte-order mark"
    head = block[: UTF16_SNIFF - UTF16_SNIFF % 2] if len(block) >= UTF16_SNIFF else b""
    for nul, text, name in ((1, 0, "UTF-16LE"), (0, 1, "UTF-16BE")):
        if head and not any(head[nul::2]) and all(0x09 <= b < 0x7F for b in head[text::2]):
            return name, "no byte-order mark, NUL bytes between ASCII letters"
    return None


def reencode_fix(path: str, encoding: str, compressed: bool) -> str:
    """How to turn a file in `encoding` into UTF-8, with the command for this file."""
    if compressed:
        return f"decompress it, re-encode it as UTF-8 (iconv -f {encoding} -t UTF-8) and compress it again"
    p = PurePath(path)
    target = str(p.with_name(f"{p.stem}.utf8{p.suffix}"))
    return (f"re-encode it as UTF-8: iconv -f {encoding} -t UTF-8 {shlex.quote(path)} > {shlex.quote(target)} "
            f"(in Python: read it with encoding='{encoding.lower()}', write it with encoding='utf-8')")  # fmt: skip
