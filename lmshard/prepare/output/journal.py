"""The local record of a run publishing to a URL (publish.py): where its work directory is,
what it has uploaded, and the files a dataset consists of.

Memory model: one entry per object uploaded or begun (a few hundred bytes each); each upload is
one appended, fsynced line on disk.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...format import atomic_write_json
from ...remote import redact
from ...tokenizers.vocab import cache_home

JOURNAL = "publish.json"
# What a run uploads before its commit: shards, key files and tokenizer files, in a generation or not.
UPLOADED = re.compile(r"(g-[^/]+/)?((train|val)/shard_[0-9]{6}\.(bin|idx|sums|blocks|src)|"
                      r"dedup/(doc|line)_keys_[0-9]{6}\.u64|dedup/near_sigs_[0-9]{6}\.u32|tokenizer_state\.json|tokenizer\.json|tokenizer\.model)")
LOG_END = " ."  # ends every whole line of the upload log
STARTED = "-"  # a log line's digest field for a PUT begun (its object may exist)


def work_root(url: str) -> Path:
    """The local work directory of a run publishing to `url` ($LMSHARD_PUBLISH_DIR, else under
    $LMSHARD_CACHE_DIR or ~/.cache/lmshard): it needs room for the dataset being built."""
    key = hashlib.sha256(redact(url).rstrip("/").encode()).hexdigest()[:20]
    return Path(os.environ.get("LMSHARD_PUBLISH_DIR") or cache_home() / "publish") / key


def refuse_to_discard(root: Path, url: str, left: list[Path], overwrite: bool, append: bool, resumable: bool) -> None:
    """An interrupted run of this machine left a build (`left`: its paths that exist): as for a
    local --out, running the same command again goes no further, so hours of work are never
    thrown away by it. --overwrite discards it; so does deleting the build (its uploads are then
    removed by the next run). A copy's or import's leftovers have nothing to resume: cleared. A
    copy or import (not `resumable`) is refused where a prepare left its build."""
    stale = Journal.load(root / JOURNAL)
    if stale is None or overwrite or not left or not stale.state.get("resumable", True):
        return
    if not resumable:  # (lmshard cp, import --out URL): only a prepare can resume the build
        raise ConfigError(f"{url}: an interrupted prepare run of this machine left its build in {root}; resume it "
                          "with prepare --resume (with its options), or pass --force to discard it")  # fmt: skip
    when = time.ctime((root / JOURNAL).stat().st_mtime)
    sent = f" and {len(stale.started):,} objects uploaded under {url}" if stale.started else ""
    drop = (f"delete {' and '.join(map(str, left))} to discard it (the next run removes its objects)"
            if append else "--overwrite to discard it")  # fmt: skip
    raise ConfigError(f"{url}: an interrupted prepare run of this machine (started {when}) left its build in "
                      f"{root}{sent}; pass {'--append ' if append else ''}--resume (with its options) to continue "
                      f"it, or {drop}")  # fmt: skip


class Journal:
    """publish.json (the run and its generation) and publish.log beside it: one line
    `xxh3-64 relative/path` per upload, appended as each completes (a line cut short by a
    crash is ignored)."""

    def __init__(self, path: Path, state: dict[str, Any], uploaded: dict[str, str] | None = None,
                 started: set[str] | None = None) -> None:  # fmt: skip
        self.path, self.state, self.uploaded = path, state, uploaded or {}
        self.started = started or set(self.uploaded)  # every object a PUT was begun for
        self._lock = threading.Lock()

    @classmethod
    def create(cls, path: Path, state: dict[str, Any]) -> Journal:
        atomic_write_json(path, state)
        path.with_suffix(".log").unlink(missing_ok=True)
        return cls(path, state)

    @classmethod
    def load(cls, path: Path) -> Journal | None:
        try:
            state = json.loads(path.read_text())
            lines = path.with_suffix(".log").read_text().split("\n") if path.with_suffix(".log").exists() else []
        except (OSError, ValueError):
            return None
        pairs = [line.removesuffix(LOG_END).split(" ", 1) for line in lines if line.endswith(LOG_END)]
        done = {rel: digest for digest, rel in pairs if digest != STARTED}
        return cls(path, state, done, {rel for _, rel in pairs})

    def forget(self) -> None:
        """Remove the journal: what it lists is gone, or is the dataset now."""
        self.path.unlink(missing_ok=True)
        self.path.with_suffix(".log").unlink(missing_ok=True)

    def begin(self, rel: str) -> None:
        """Note a PUT about to start, so that a crash leaves no object nobody knows of."""
        if rel not in self.started:
            self._append(STARTED, rel)
            self.started.add(rel)

    def record(self, rel: str, digest: str) -> None:
        self._append(digest, rel)
        self.uploaded[rel] = digest

    def _append(self, digest: str, rel: str) -> None:
        with self._lock, open(self.path.with_suffix(".log"), "a") as log:
            log.write(f"{digest} {rel}{LOG_END}\n")
            log.flush()
            os.fsync(log.fileno())


def holder_state(holder: dict[str, Any]) -> str:
    """Whether a writer lock's holder is "alive" or "dead" (a process of this machine, or not
    any more), or "unknown" (another machine's, or a holder record that cannot be read)."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return "unknown"
    if pid == os.getpid():
        return "unknown"  # this process: an earlier run of the same program (the Python API)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "dead"
    except PermissionError:
        return "alive"
    return "alive"
