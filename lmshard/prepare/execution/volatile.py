"""Work files written without an fsync when every task of a planned run runs on this machine.

A planned run's stages hand their results on through files of its work folder: each unit's
tokens (4 bytes a token), its keys, its split. Synced one by one, they reach the disk although
the write stage copies the tokens into the shards seconds later and the finish deletes them: on
one machine that is twice the dataset's bytes forced to the disk, where the dataset needs them
once. When the run's tasks all run here (the local executor: a plain prepare's stages in
the worker pool, `--num-tasks N` without another executor), no sync is needed: a process killed
(Ctrl-C, SIGKILL, the OOM killer) leaves every byte it wrote in the page cache, where the run's
next attempt reads it. Only a crash of the machine itself (power loss, a kernel panic) loses
written bytes that were never synced, and a marker written after them may survive it.

So a local run records the boot it ran in (Linux's boot id) and its host in its work folder
before it plans (`local_run`), and sets LMSHARD_VOLATILE_WORK for its planning and its tasks
(the workers inherit it; those forked before it, `inherit`); `sync` then skips the fsync of a
work file (its plan and its tables, a stream's saved copy, each unit's data, and its markers,
summaries and layout: `write_json`, `write_bytes`). This holds only
where nothing but a crash of this machine loses written bytes: a local filesystem
(`LOCAL_FILESYSTEMS`); on a network or FUSE filesystem, or where the boot id cannot be read,
every file is synced as before.

Whatever reads the work folder next checks the mark (`stale`): a claim of `--out` (`prepare`,
with any executor) finding it written in an earlier boot, or on another machine, discards the
work folder (and the build beside `--out`, unless the build is complete) and starts over rather
than read a file a crash may have cut; `run-task` refuses it and `status` says so. A run that
stops but lives (Ctrl-C, SIGTERM, an error) makes its work durable on the way out (`settle`: one
sync of the filesystem, then the mark removed), and so does a claim that hands the work to other
executors, so nothing is discarded that was saved: only a run killed outright (SIGKILL, the OOM
killer) and resumed on another machine or after a restart starts over. The dataset's own files
(shards, key files, metadata) are synced as always, and the tasks of other executors (Slurm,
Ray, run-task) sync everything: another machine may read their files.

Memory model: none.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...format import atomic_write_bytes, atomic_write_json

ENV = "LMSHARD_VOLATILE_WORK"  # set for the tasks of a local run (internal: not an option)
MARK = "volatile.json"  # in the work folder: {"boot_id", "host"} of the local run that left files unsynced
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# Filesystems whose written bytes only a crash of this machine loses: a network or FUSE filesystem
# (NFS, Lustre, GPFS, CephFS, ...) can lose a client's cached writes otherwise, so runs there sync.
LOCAL_FILESYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "jfs", "tmpfs", "ramfs",
                     "overlay"}  # fmt: skip


def boot_id() -> str | None:
    """This boot of the machine (Linux), or None where it cannot be read."""
    try:
        with open(BOOT_ID) as f:
            return f.read().strip() or None
    except OSError:
        return None


def filesystem(path: Path) -> str | None:
    """The type of the filesystem `path` is on (/proc/self/mounts: the longest mount point above
    it), or None where it cannot be told."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) > 2]
    except OSError:
        return None
    real = os.path.realpath(path)
    found = [(m, kind) for m, kind in mounts if real == m or real.startswith(m.rstrip("/") + "/")]
    return max(found, key=lambda x: len(x[0]))[1] if found else None


def active() -> bool:
    """Whether this process runs a task of a local run (its work files unsynced)."""
    return os.environ.get(ENV) == "1"


def sync(fd: int) -> None:
    """fsync a work file, unless this process runs a task of a local run (see the module docstring)."""
    if not active():
        os.fsync(fd)


def write_bytes(path: Path, data: bytes) -> None:
    """A work file written atomically (format's `atomic_write_bytes`), synced by `sync`."""
    atomic_write_bytes(path, data, sync=sync)


def write_json(path: Path, obj: Any) -> None:
    """A work file of JSON written atomically, synced by `sync` (a marker, a summary). Compact:
    indented JSON is encoded in Python, not C, and a summary of a run of 40,000 small files (a
    count per input) took ten times as long to write."""
    atomic_write_bytes(path, json.dumps(obj, separators=(",", ":")).encode() + b"\n", sync=sync)


@contextlib.contextmanager
def local_run(work: Path) -> Iterator[None]:
    """Plan or run the stages of a local run: its boot recorded in `work`, and work files unsynced, where
    the boot can be read and `work` is on a local filesystem. A run that stops but lives (Ctrl-C,
    SIGTERM, an error) makes its work durable first (`settle`): any machine may resume it."""
    boot = boot_id()
    work.mkdir(parents=True, exist_ok=True)
    if boot is None or filesystem(work) not in LOCAL_FILESYSTEMS:
        yield
        return
    if not (work / MARK).exists():
        atomic_write_json(work / MARK, {"boot_id": boot, "host": socket.gethostname()})
    before = os.environ.get(ENV)
    os.environ[ENV] = "1"
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):  # (a sync that fails keeps the mark: the work stays this machine's)
            settle(work)
        raise
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def inherit(work: Path) -> None:
    """In a worker forked before its run's `local_run` began (itempool.early_pool): leave work
    files unsynced as the run's other processes do, when `work` holds this boot's mark."""
    if (work / MARK).exists() and stale(work) is None:
        os.environ[ENV] = "1"


def settle(work: Path) -> None:
    """Make a local run's unsynced work durable (a sync of its filesystem), then drop its mark:
    from then on any executor on any machine may go on with it. Nothing to do without a mark; a
    sync that fails raises (OSError) and keeps the mark."""
    mark = work / MARK
    if not mark.exists():
        return
    fd = os.open(work, os.O_RDONLY)
    try:
        syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)  # (Linux: this filesystem only)
        if syncfs is None:
            os.sync()
        elif syncfs(fd) != 0:  # (a write the device failed: the mark stays, the work is not trusted elsewhere)
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(work))
        mark.unlink()
        os.fsync(fd)  # (the mark's removal durable too)
    finally:
        os.close(fd)


def stale(work: Path) -> str | None:
    """Why `work` cannot be trusted: a local run left its files unsynced in an earlier boot of
    this machine, or on another machine (a description for the message); None when it can."""
    try:
        recorded = json.loads((work / MARK).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return "before a crash (its mark is unreadable)"
    if not isinstance(recorded, dict):
        return "before a crash (its mark is unreadable)"
    if recorded.get("host") not in (None, socket.gethostname()):
        return f"on another machine ({recorded.get('host')})"
    return "before this machine restarted" if recorded.get("boot_id") != boot_id() else None


__all__ = ["inherit", "local_run", "settle", "stale", "sync", "write_bytes", "write_json"]
