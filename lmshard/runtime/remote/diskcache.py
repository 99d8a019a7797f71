"""A bounded local disk cache of a remote dataset's verified blocks, for later epochs.

Layout under the `cache_dir` the user gives:

    blocks/<shard xxh3-64>-<block tokens>/<block>.blk   a block's stored bytes, then their xxh3-64 (8 bytes, LE)
    blocks/usage                                         the bytes the block files hold (int64, LE)
    blocks/lock                                          taken with flock around every change

A block is kept as its shard's token file stores it, in the dataset's encoding (uint32 tokens,
uint16, packed bits or a zstd frame), so a compressed dataset takes its compressed size here too;
the trailer is the block's sum, as in the shard's `.sums`, and the reader decodes the block after
checking it. A block is named by its shard's checksum (of the stored file: two encodings of the
same tokens never share a file), so a regenerated dataset never reads an old block, and two
datasets that share a shard share its blocks. A file appears under its name only whole (it is
written under a temporary name and renamed), and the caller checks it every time it is read
(against the shard's block sums, or the trailer for a shard without them): a damaged file is
removed and the block fetched again.

**The limit.** Every insertion and removal holds an exclusive `flock` on `blocks/lock`, so the
processes of one machine (DataLoader workers, ranks) that share the directory keep one count,
`blocks/usage`: a writer makes room before it adds a file, removing the least recently used
files (a hit refreshes a file's mtime) until the count plus the new file is a tenth below the
limit, and the count is recounted from the files themselves at every such round. The count is
raised before a file appears, so a writer that dies in between leaves it high (until the next
recount), never the directory over. The directory therefore never holds more than the limit,
whichever process writes; processes sharing it should pass the same limit (each holds the
directory to its own). The lock is held for one file (a write of one block, at most 64 KiB, and
a rename, or a round of removal), never while waiting on the network, so the cache cannot
deadlock, and a process that dies while holding it releases it with its descriptors. A writer
that died mid-file leaves a temporary file, removed at the next round. A cache that cannot be
written (a full disk) is warned about once and read on without. `flock` is per machine: give
each node its own (local) directory.

Memory model: one block read at a time; a round of removal lists the directory (one entry per
cached file) while it runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError, warn

TRAILER = 8  # bytes of xxh3-64 after a block's stored bytes
_SLACK = 10  # a round of removal frees a tenth of the limit beyond what is asked


class DiskCache:
    def __init__(self, cache_dir: str | os.PathLike[str], limit: int) -> None:
        self.root = Path(cache_dir) / "blocks"
        self.limit = limit
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cache_dir={str(cache_dir)!r}: cannot create it ({e.strerror}); pass a writable "
                              "local directory") from None  # fmt: skip
        self._fd: int | None = None
        self._pid = os.getpid()
        self._thread_lock = threading.Lock()  # flock is per open file: threads of one process need their own
        self._tmp = 0
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _fd=None, _pid=os.getpid(), _thread_lock=threading.Lock(), _tmp=0, _warned=False)

    def path(self, key: str, block: int) -> Path:
        return self.root / key / f"{block}.blk"

    def get(self, key: str, block: int, size: int) -> bytes | None:
        """The file of a block (stored bytes and trailer, unchecked; `size` bytes expected), or None."""
        path = f"{self.root}/{key}/{block}.blk"  # a str, not a Path: this runs for every block read
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # not cached (or the cache cannot be read: the block is fetched)
            return None
        try:
            data = os.read(fd, size + 1)
            with contextlib.suppress(OSError):  # least recently used goes first: a hit counts as a use
                os.utime(fd)
        except OSError:
            return None
        finally:
            os.close(fd)
        return data

    def has(self, key: str, block: int) -> bool:
        """Whether a block's file is there (one stat; its bytes are checked when read)."""
        return os.path.exists(f"{self.root}/{key}/{block}.blk")

    def discard(self, key: str, block: int) -> None:
        """Remove a block's file (found damaged)."""
        with contextlib.suppress(OSError), self._locked():
            self._remove([self.path(key, block)])

    def put_many(self, items: Sequence[tuple[str, int, bytes]]) -> None:
        """Add (key, block, stored bytes + trailer) files, making room first; files already there
        (another process fetched the block too) are left as they are. A cache that cannot be
        written (a full disk) only means fewer blocks cached: one warning, and reads go on."""
        try:
            for key, block, data in items:  # the lock is taken per file: other writers wait for one file at most
                with self._locked():
                    self._put(self.path(key, block), data, self._usage())
        except OSError as e:
            if not self._warned:
                self._warned = True
                warn(f"{self.root}: cannot write the block cache ({e.strerror or e}); reading on without it")

    def _put(self, path: Path, data: bytes, used: int) -> int:
        """(lock held) One file; the bytes held after. The count is raised before the file
        appears: a writer that dies in between leaves the count high, never the directory over."""
        if len(data) > self.limit or path.exists():
            return used
        if used + len(data) > self.limit:
            used = self._make_room(len(data))
            if used + len(data) > self.limit:
                return used
        path.parent.mkdir(exist_ok=True)
        self._set_usage(used + len(data))
        self._tmp += 1
        tmp = path.parent / f".tmp-{os.getpid()}-{self._tmp}"
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError:
            self._set_usage(used)
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return used + len(data)

    # -- the ledger, under the lock ----------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._pid != os.getpid():  # a forked child: the parent's descriptor shares its flock, and
            self._fd, self._pid, self._thread_lock = None, os.getpid(), threading.Lock()  # its lock may be held
        with self._thread_lock:
            if self._fd is None:
                self._fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _usage(self) -> int:
        try:
            raw = (self.root / "usage").read_bytes()
        except FileNotFoundError:
            raw = b""
        if len(raw) != 8:
            return self._make_room(0, evict=False)
        return int.from_bytes(raw, "little")

    def _set_usage(self, used: int) -> None:
        fd = os.open(self.root / "usage", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, used.to_bytes(8, "little"), 0)
        finally:
            os.close(fd)

    def _files(self) -> list[tuple[int, int, Path]]:
        """(mtime ns, size, path) of every block file; leftovers of dead writers are removed (the
        lock is held, so no live writer has a temporary file)."""
        out = []
        for d in os.scandir(self.root):
            if not d.is_dir(follow_symlinks=False):
                continue
            for f in os.scandir(d.path):
                with contextlib.suppress(FileNotFoundError):
                    if f.name.startswith(".tmp-"):
                        os.unlink(f.path)
                    elif f.name.endswith(".blk"):
                        st = f.stat(follow_symlinks=False)
                        out.append((st.st_mtime_ns, st.st_size, Path(f.path)))
        return out

    def _make_room(self, need: int, evict: bool = True) -> int:
        """Recount the files, remove the least recently used until `need` more bytes fit with a
        tenth of the limit to spare; the bytes held after."""
        files = self._files()
        used = sum(size for _, size, _ in files)
        if evict and used + need > self.limit:
            target = max(0, self.limit - need - self.limit // _SLACK)
            files.sort()
            gone = []
            for _, size, path in files:
                if used <= target:
                    break
                gone.append(path)
                used -= size
            self._remove(gone, count=False)
        self._set_usage(used)
        return used

    def _remove(self, paths: list[Path], count: bool = True) -> None:
        freed = 0
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                size = path.stat().st_size
                path.unlink()
                freed += size
        if count and freed:
            self._set_usage(max(0, self._usage() - freed))
