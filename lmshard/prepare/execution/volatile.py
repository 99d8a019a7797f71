"""Work files written without an fsync when every task of a planned run runs on this machine.

A planned run's stages hand their results on through files of its work folder: each unit's
tokens (4 bytes a token), its keys, its split. Synced one by one, they reach the disk although
the write stage copies the tokens into the shards seconds later and the finish deletes them: on
one machine that is twice the dataset's bytes forced to the disk, where the one-reader path writes
them once. When the run's tasks all run here (the local executor: a plain prepare's stages in
the worker pool, `--num-tasks N` without another executor), no sync is needed: a process killed
(Ctrl-C, SIGKILL, the OOM killer) leaves every byte it wrote in the page cache, where the run's
next attempt reads it. Only a crash of the machine itself (power loss, a kernel panic) loses
written bytes that were never synced, and a marker written after them may survive it.

So a local run records the boot it ran in (Linux's boot id) in its work folder before it starts
its tasks (`local_run`), and sets LMSHARD_VOLATILE_WORK for them (the workers inherit it); `sync`
then skips the fsync of a work file (its data, and its markers and summaries: `write_json`,
`write_bytes`). A later attempt that finds the work folder written in an earlier boot (`stale`)
discards it, and the build beside `--out`, and starts over rather than read a file the crash may
have cut. Where the boot id cannot be read, every file is synced. The
dataset's own files (shards, key files, metadata) are synced as always, and the tasks of other
executors (Slurm, Ray, run-task) sync everything: another machine may read their files.

Memory model: none.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...format import atomic_write_bytes, atomic_write_json

ENV = "LMSHARD_VOLATILE_WORK"
MARK = "volatile.json"  # in the work folder: {"boot_id": the boot a local run wrote it in}
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    """This boot of the machine (Linux), or None where it cannot be read."""
    try:
        with open(BOOT_ID) as f:
            return f.read().strip() or None
    except OSError:
        return None


def sync(fd: int) -> None:
    """fsync a work file, unless this process runs a task of a local run (see the module docstring)."""
    if os.environ.get(ENV) != "1":
        os.fsync(fd)


def write_bytes(path: Path, data: bytes, private: bool = False) -> None:
    """A work file written atomically (format's `atomic_write_bytes`), synced by `sync`."""
    atomic_write_bytes(path, data, private, sync)


def write_json(path: Path, obj: Any) -> None:
    """A work file of JSON written atomically, synced by `sync` (a marker, a summary)."""
    atomic_write_json(path, obj, sync=sync)


@contextlib.contextmanager
def local_run(work: Path) -> Iterator[None]:
    """Run the stages of a local run: its boot recorded in `work`, and work files unsynced."""
    boot = boot_id()
    if boot is None:
        yield
        return
    work.mkdir(parents=True, exist_ok=True)
    mark = work / MARK
    if not mark.exists():
        tmp = work / f".{MARK}.tmp"
        with open(tmp, "w") as f:
            json.dump({"boot_id": boot}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, mark)
    before = os.environ.get(ENV)
    os.environ[ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def stale(work: Path) -> bool:
    """Whether `work` holds files a local run left unsynced in an earlier boot of this machine."""
    try:
        recorded = json.loads((work / MARK).read_text()).get("boot_id")
    except (OSError, ValueError, AttributeError):
        return (work / MARK).exists()  # (unreadable: cut by a crash as well)
    return recorded != boot_id()


__all__ = ["local_run", "stale", "sync", "write_bytes", "write_json"]
