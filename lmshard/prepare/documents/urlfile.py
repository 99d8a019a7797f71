"""An input at a URL (`s3://`, `gs://`, `az://`, `hf://`, `http(s)://`), read as `reading.InputFile`
reads a local file: from any offset, up to the size the run recorded when it started, with every
failure named as that input's.

Bytes come in ranged GETs (fsspec's `cat_file`), each one through the retry policy
(`lmshard.remote.Retry`): a connection dropped in the middle of a read is retried from the
offset reached, with backoff and jitter, and after the budget the read ends in one line naming
the (redacted) URL. That line is an `InputReadError`, so a run keeps its work for --resume, as
it does when a disk fails; an object deleted after the run started is `InputGone`.

A read that goes on from where the last one ended (a planner's blocks, a decompressor) fetches
READ_BYTES at a time; the first read after a seek (parquet's footer, a scale-out cut) fetches
what it asks for, at least SEEK_READ_BYTES. No request asks for more than MAX_GET_BYTES.

Memory model: one fetched block (READ_BYTES, or what a caller asked for, at most MAX_GET_BYTES
per request).
"""

from __future__ import annotations

import io
from typing import Any

from ...remote.retry import RemoteError, Retry
from ...remote.urls import filesystem
from .reading import InputGone, InputReadError, changed

READ_BYTES = 8 << 20  # bytes per GET while reading on: 8 requests per 64 MiB unit
SEEK_READ_BYTES = 256 << 10  # at least this many bytes per GET after a seek (a 64 KiB cut window, a parquet footer)
MAX_GET_BYTES = 64 << 20  # one GET asks for at most this many bytes: a retry repeats no more than that


class URLInput(io.BufferedIOBase):
    """The object at `url`, shown as `name` (the URL with any credentials taken out), read up to
    `size` bytes (None: its size now, asked once). `tell` counts the bytes read."""

    def __init__(self, url: str, name: str, size: int | None = None, retry: Retry | None = None) -> None:
        super().__init__()
        self.name, self.mode = name, "rb"
        self._url, self._retry = url, retry or Retry()
        self._fs, self._path = filesystem(url)
        self._size = size
        self._pos = 0
        self._block, self._block_at = b"", 0  # the last fetch: bytes [block_at, block_at + len(block))

    @property
    def size(self) -> int:
        if self._size is None:
            self._size = int(self._call("HEAD", lambda: self._fs.size(self._path)))
        return self._size

    def _call(self, what: str, fn: Any) -> Any:
        """`fn()` under the retry policy; a failure for good is the input's error, in one line."""
        gone: list[bool] = []

        def attempt() -> Any:
            try:
                return fn()
            except FileNotFoundError:
                gone.append(True)
                return None

        try:
            result = self._retry.call(self._url, what, attempt)
        except RemoteError as e:
            raise InputReadError(str(e)) from None
        if gone:
            raise InputGone(f"{self.name}: this input is gone (no such object now): deleted after the run started; "
                            "put it back and run the same command with --resume, or leave it out of the inputs and "
                            "start again with --overwrite")  # fmt: skip
        return result

    def _fetch(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object, which must hold them all (it held `size` bytes)."""
        data = bytes(self._call(f"GET bytes {start}-{end - 1}",
                                lambda: self._fs.cat_file(self._path, start=start, end=end)))  # fmt: skip
        if len(data) > end - start:
            raise InputReadError(f"{self.name}: the server sent {len(data):,} bytes for a range of {end - start:,} "
                                 "(it ignores byte ranges); serve the file from a server that honours them, or "
                                 "copy it to local disk")  # fmt: skip
        if len(data) < end - start:
            raise changed(self.name, f"it held {self.size:,} bytes when the run started and ends after "
                                     f"{start + len(data):,} now")  # fmt: skip
        return data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self._pos + size)
        parts: list[bytes] = []
        while self._pos < end:
            offset = self._pos - self._block_at
            if not 0 <= offset < len(self._block):
                self._fill(end)
                offset = 0
            part = self._block[offset : offset + end - self._pos]
            parts.append(part)
            self._pos += len(part)
        return b"".join(parts)

    def _fill(self, end: int) -> None:
        """Fetch the block that starts at the current position: READ_BYTES when reading on from
        the last block, else at least SEEK_READ_BYTES; at least what is asked, up to `end`."""
        on = self._pos == self._block_at + len(self._block) and bool(self._block)
        want = max(end - self._pos, READ_BYTES if on else SEEK_READ_BYTES)
        stop = min(self.size, self._pos + min(want, MAX_GET_BYTES))
        self._block, self._block_at = b"", self._pos  # the old block goes before the new one comes
        self._block = self._fetch(self._pos, stop)

    def read1(self, size: int | None = -1) -> bytes:
        return self.read(size if size is not None and size >= 0 else io.DEFAULT_BUFFER_SIZE)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def skip_mark(self) -> None:
        """Go past the UTF-8 byte-order mark the object starts with, if any (at its start)."""
        if self.read(3) != b"\xef\xbb\xbf":
            self.seek(0)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.name}: seek to {base + offset}, before the start")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._block = b""
        super().close()
