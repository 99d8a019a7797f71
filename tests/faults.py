"""Fault injection the suite controls, without root: files whose device fills up (ENOSPC, EDQUOT)
or fails (EIO) after a byte budget, as a buffered file on a full disk behaves: a write that
overflows the buffer raises, and so does the flush at close.

`full_disk(monkeypatch, modules, budget, code)` makes every file the named modules open for
writing go through one shared budget of bytes; reading is left alone.

On the reading side, `failing_reads(monkeypatch, name, after, code)` makes the input files whose
name ends with `name` fail (EIO) at byte `after`, as a bad sector does: a plain OSError without
a file name. `unreadable(monkeypatch, name)` makes opening them fail with
EACCES, as `chmod 000` does for anyone but root. Both patch the one place prepare opens its
inputs (`lmshard.prepare.documents.reading`), so they hold in this process and in workers forked from it.
"""

from __future__ import annotations

import builtins
import errno
import os
from typing import Any

BUFFER = 1 << 16  # bytes a file buffers before it writes to the device, as io.BufferedWriter


class Device:
    """A shared byte budget; once spent, every write to the device fails with `code`."""

    def __init__(self, budget: int, code: int = errno.ENOSPC) -> None:
        self.left, self.code, self.failures = budget, code, 0

    def take(self, path: str, n: int) -> int:
        if n <= self.left:
            self.left -= n
            return n
        self.failures += 1
        raise OSError(self.code, os.strerror(self.code))  # as write(2) reports it: no file name


class FaultyFile:
    """A writable file that buffers like Python's and writes through `Device`."""

    def __init__(self, real: Any, device: Device) -> None:
        self._real, self._device, self._buf = real, device, bytearray()
        self.name = real.name

    def write(self, data: Any) -> int:
        raw = memoryview(data).cast("B")
        self._buf += raw
        if len(self._buf) >= BUFFER:
            self.flush()
        return len(raw)

    def flush(self) -> None:
        if self._buf:
            self._device.take(self.name, len(self._buf))
            self._real.write(self._buf)
            self._buf.clear()
        self._real.flush()

    def close(self) -> None:
        try:
            self.flush()
        finally:  # the descriptor is closed even when the flush fails, as Python's files do
            self._buf.clear()
            self._real.close()

    def seek(self, *args: Any) -> int:
        self.flush()
        return self._real.seek(*args)

    def tell(self) -> int:
        return self._real.tell() + len(self._buf)

    def truncate(self, *args: Any) -> int:
        self.flush()
        return self._real.truncate(*args)

    def __getattr__(self, name: str) -> Any:  # fileno, read, closed...
        return getattr(self._real, name)

    def __enter__(self) -> FaultyFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def full_disk(monkeypatch, modules: list[Any], budget: int, code: int = errno.ENOSPC) -> Device:
    """Route the files `modules` open for writing through a device of `budget` bytes."""
    device = Device(budget, code)

    def faulty_open(path, mode="r", *args, **kwargs):
        real = builtins.open(path, mode, *args, **kwargs)  # noqa: SIM115 (closed by its user)
        return FaultyFile(real, device) if any(c in mode for c in "wa+") and "b" in mode else real

    for module in modules:
        monkeypatch.setattr(module, "open", faulty_open, raising=False)
    return device


class FailingReads:
    """A file open for reading whose device fails with `code` at byte `after`, as a bad sector
    there would: reads before it succeed, any read that reaches it fails."""

    def __init__(self, real: Any, after: int, code: int) -> None:
        self._real, self._after, self._code = real, after, code
        self._pos = 0  # counted here: a pipe has no tell()

    def read(self, n: int = -1) -> bytes:
        left = self._after - self._pos
        if left <= 0:
            raise OSError(self._code, os.strerror(self._code))  # no file name: the kernel's read(2) gives none
        data = self._real.read(left if n is None or n < 0 else min(n, left))
        self._pos += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = self._real.seek(offset, whence)
        return self._pos

    def __getattr__(self, name: str) -> Any:  # seek, fileno, close...
        return getattr(self._real, name)


def _inputs_open(monkeypatch, name: str, wrap: Any) -> None:
    import lmshard.prepare.documents.reading as reading

    def faulty_open(path, mode="r", *args, **kwargs):
        if str(path).endswith(name) and mode == "rb":
            return wrap(path)
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(reading, "open", faulty_open, raising=False)


def failing_reads(monkeypatch, name: str, after: int, code: int = errno.EIO) -> None:
    """Reading an input whose path ends with `name` fails with `code` after `after` bytes."""
    _inputs_open(monkeypatch, name, lambda path: FailingReads(builtins.open(path, "rb"), after, code))  # noqa: SIM115


def unreadable(monkeypatch, name: str) -> None:
    """Opening an input whose path ends with `name` fails with EACCES (chmod 000, even as root)."""

    def refuse(path: str) -> Any:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    _inputs_open(monkeypatch, name, refuse)
