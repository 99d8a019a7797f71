"""The output directory's life cycle: one writer at a time, a dataset built beside `--out` and
swapped in only when complete, and the run record that lets an interrupted run resume.

For `--out DIR/ds` a run uses three hidden siblings of `ds`:

    DIR/.ds.lmshard-lock       the one-writer lock (flock; the file names the holder's pid and host)
    DIR/.ds.lmshard-partial/   the dataset being built; its _PREPARE_IN_PROGRESS file holds the
                               run's fingerprint and its latest checkpoint
    DIR/.ds.lmshard-retired/   a replaced dataset between the swap and its removal

`ds` itself only ever changes by a rename: a fresh run renames the finished build to `ds` (or,
into an existing empty `ds`, moves its entries, metadata last); an
`--overwrite` or `--append` run exchanges the two directories in one step (Linux renameat2
RENAME_EXCHANGE; two renames elsewhere, recovered by the next run if cut between them). So a
reader sees the old dataset or the new one, whole; a killed run leaves the old one untouched.

Memory model: a few small JSON records; nothing here grows with the data.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, LmshardError
from ..format import IN_PROGRESS_FILE, METADATA_FILE, SPLITS, TOKENIZER_FILE

RUN_FILE = IN_PROGRESS_FILE  # inside the build: fingerprint + checkpoint (JSON)
RUN_VERSION = 1
_OURS = {METADATA_FILE, TOKENIZER_FILE, IN_PROGRESS_FILE, "dedup", *SPLITS}  # what a dataset directory holds


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during prepare, after the work so far was saved: `kept` says where (the CLI adds
    the exact command that resumes)."""

    def __init__(self, kept: str) -> None:
        super().__init__(kept)
        self.kept = kept


@dataclass(frozen=True)
class OutputPaths:
    out: Path
    staging: Path
    retired: Path
    lock: Path

    @classmethod
    def of(cls, out: str) -> OutputPaths:
        path = Path(os.path.abspath(out))
        if path.is_symlink():  # build beside the real directory, and swap that
            path = path.resolve()
        parent, name = path.parent, path.name
        return cls(path, parent / f".{name}.lmshard-partial", parent / f".{name}.lmshard-retired",
                   parent / f".{name}.lmshard-lock")  # fmt: skip


class WriterLock:
    """An exclusive flock on the lock file beside `--out`: a second prepare on the same output is
    refused while the first lives; the kernel drops the lock when its holder dies (kill -9, OOM),
    so a stale lock never needs clearing by hand. The file is removed on release; a writer that
    raced with the removal notices (inode changed) and locks the new file instead."""

    def __init__(self, paths: OutputPaths) -> None:
        self.paths = paths
        self._fd: int | None = None

    def __enter__(self) -> WriterLock:
        path = self.paths.lock
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise LmshardError(f"{path.parent}: a part of this --out path is a file, not a directory; "
                               "choose another --out") from None  # fmt: skip
        except OSError as e:
            raise LmshardError(f"{path.parent}: cannot create the directory for --out ({e.strerror})") from None
        for _ in range(100):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise LmshardError(
                    f"{path}: cannot create the lock file beside --out ({e.strerror}); "
                    "--out must be inside a directory you can write"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_text(fd)
                os.close(fd)
                raise ConfigError(
                    f"{self.paths.out}: another prepare is writing it ({holder or 'holder unknown'}); "
                    "wait for it to finish, or stop it, then run again"
                ) from None
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    os.close(fd)
                    raise
                # a filesystem without locks: fall through, unprotected but working
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the previous holder removed the file between our open and our lock
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            os.write(fd, f"pid {os.getpid()} on {platform.node()}, since {started}\n".encode())
            self._fd = fd
            return self
        raise LmshardError(f"{path}: could not take the lock (it kept being replaced)")

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self.paths.lock.unlink()
            os.close(self._fd)
            self._fd = None


def _read_text(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""


def inside(out: Path) -> bool:
    """Whether the current directory is `out` or inside it (a swap would strand the shell there)."""
    try:
        cwd = Path.cwd().resolve()
    except OSError:
        return False
    return cwd == out or out in cwd.parents


def kind_of_output(out: Path) -> tuple[str, list[str]]:
    """What `--out` holds: missing, file, empty, dataset (complete; other files of the user's
    may sit beside it), unfinished (only lmshard's own names: a run of an older lmshard that wrote
    in place) or foreign (no dataset, other files); and the names that are not lmshard's."""
    if not out.exists():
        return "missing", []
    if not out.is_dir():
        return "file", []
    entries = os.listdir(out)
    foreign = sorted(set(entries) - _OURS)
    if not entries:
        return "empty", []
    if METADATA_FILE in entries:
        return "dataset", foreign
    return ("foreign" if foreign else "unfinished"), foreign


def read_run(staging: Path) -> dict[str, Any] | None:
    """The build's run record, or None when there is none (or it is unreadable)."""
    try:
        data = json.loads((staging / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == RUN_VERSION else None


def recover(paths: OutputPaths) -> None:
    """Finish or undo what a run killed during its swap left, and remove a replaced dataset."""
    if not paths.out.exists() and paths.retired.exists():
        # cut between the two renames of a swap: the new build is complete when it has metadata
        built = (paths.staging / METADATA_FILE).exists() and read_run(paths.staging) is not None
        os.rename(paths.staging if built else paths.retired, paths.out)
    if paths.out.is_dir() and (paths.out / METADATA_FILE).exists():
        (paths.out / RUN_FILE).unlink(missing_ok=True)  # a swapped-in build's record, left by a kill
    if paths.staging.is_dir() and read_run(paths.staging) is None:
        shutil.rmtree(paths.staging)  # an old dataset moved aside by a swap, or a build that never began
    if paths.retired.exists():
        shutil.rmtree(paths.retired)


def commit(paths: OutputPaths) -> None:
    """Put the finished build at `--out` in one step, then drop what it replaced."""
    out, staging = paths.out, paths.staging
    kind, foreign = kind_of_output(out)
    for name in foreign:  # the user's own files beside the dataset move with it (hard links)
        if (out / name).is_dir() and not (out / name).is_symlink():
            shutil.copytree(out / name, staging / name, symlinks=True, copy_function=link_or_copy)
        else:
            link_or_copy(out / name, staging / name, follow=False)
    _fsync_dir(staging)
    if kind == "missing":
        os.rename(staging, out)
    elif kind == "empty":  # keep the user's directory (its mode, owner, mount); metadata moves last
        names = sorted(os.listdir(staging), key=lambda n: (n == METADATA_FILE, n))
        for name in names:
            os.rename(staging / name, out / name)
        staging.rmdir()
    elif _exchange(staging, out):
        os.rename(staging, paths.retired)
    else:
        os.rename(out, paths.retired)
        os.rename(staging, out)
    _fsync_dir(out.parent)
    (out / RUN_FILE).unlink(missing_ok=True)
    _fsync_dir(out)
    if paths.retired.exists():
        shutil.rmtree(paths.retired, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries atomically (renameat2 RENAME_EXCHANGE); False where the
    kernel, C library or filesystem cannot, so the caller falls back to two renames."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _fsync_dir(path: Path) -> None:
    """Make renames and creations inside `path` durable (power loss), where the OS allows."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def link_or_copy(src: str | Path, dst: str | Path, follow: bool = True) -> None:
    """`dst` as a hard link to `src` (the same bytes, never rewritten), or a copy where the
    filesystem has no hard links. `follow=False` links a symlink itself."""
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst, follow_symlinks=follow)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EXDEV, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        shutil.copy2(src, dst, follow_symlinks=follow)


def difference(started: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The first way two run fingerprints differ, in the user's words; None when they match."""
    for key in sorted(set(started.get("config", {})) | set(now.get("config", {}))):
        a, b = started.get("config", {}).get(key), now.get("config", {}).get(key)
        if a != b:
            return f"--{key.replace('_', '-')} was {a!r} when the run started and is {b!r} now"
    a_src = {s[0]: s for s in started.get("sources", [])}
    b_src = {s[0]: s for s in now.get("sources", [])}
    for path in a_src.keys() - b_src.keys():
        return f"input {path} was read by the run and is not an input now"
    for path in b_src.keys() - a_src.keys():
        return f"input {path} was not an input when the run started"
    for path, was in a_src.items():
        if was != b_src[path]:
            return f"input {path} changed since the run started (size or modification time)"
    if [s[0] for s in started.get("sources", [])] != [s[0] for s in now.get("sources", [])]:
        return "the inputs are in a different order than when the run started"
    for key in ("tokenizer", "appending_to", "format"):
        if started.get(key) != now.get(key):
            what = {"tokenizer": "the tokenizer's vocabulary", "appending_to": "the dataset being appended to",
                    "format": "the lmshard version's output format"}[key]  # fmt: skip
            return f"{what} changed since the run started"
    return None
