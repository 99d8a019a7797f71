"""Fault injection the suite controls, without root: files whose device fills up (ENOSPC, EDQUOT)
or fails (EIO) after a byte budget, as a buffered file on a full disk behaves: a write that
overflows the buffer raises, and so does the flush at close.

`full_disk(monkeypatch, modules, budget, code)` makes every file the named modules open for
writing go through one shared budget of bytes; reading is left alone.
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
        raise OSError(self.code, os.strerror(self.code), path)


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
