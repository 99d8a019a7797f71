"""The output directory's life cycle: one writer at a time, a dataset built beside `--out` and
swapped in only when complete, and the run record that lets an interrupted run resume.

For `--out DIR/ds` a run uses three hidden siblings of `ds`:

    DIR/.ds.lmshard-lock       the one-writer lock (flock; the file names the holder's pid and host)
    DIR/.ds.lmshard-partial/   the dataset being built; its _PREPARE_IN_PROGRESS file holds the
                               run's fingerprint (its work is in DIR/.ds.lmshard-work/)
    DIR/.ds.lmshard-retired/   the replaced dataset between the two renames of a swap (where
                               an atomic exchange is unavailable)
    DIR/.ds.lmshard-trash-*/   replaced datasets being deleted (never renamed back)

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
import glob
import json
import os
import platform
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import ConfigError, LmshardError
from ...format import IN_PROGRESS_FILE, METADATA_FILE, SPLITS, TOKENIZER_FILE, DatasetMeta
from ..stops import stop_point

RUN_FILE = IN_PROGRESS_FILE  # inside the build: the run's fingerprint, start, pid and host (JSON)
RUN_VERSION = 1
DICT_FILE = ".zstd_dictionary"  # inside a zstd build: its dictionary for every writer (dictfile.py), until the swap
_OURS = {METADATA_FILE, TOKENIZER_FILE, IN_PROGRESS_FILE, DICT_FILE, "dedup", *SPLITS}  # what a dataset directory holds


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM: `signum`) during prepare, after the work so far was saved: `kept`
    says where (the CLI adds the exact command that resumes). `complete`: the dataset the run
    had put in place when the signal came (nothing to resume: the CLI says so)."""

    def __init__(self, kept: str, signum: int = 2, complete: str | None = None) -> None:  # 2: SIGINT
        super().__init__(kept)
        self.kept = kept
        self.signum = signum
        self.complete = complete


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
            try:
                path = path.resolve(strict=True)
            except (OSError, RuntimeError) as e:  # a dangling link, or a loop
                raise ConfigError(f"{out}: a symbolic link that leads nowhere ({e}); choose another --out") from None
        parent, name = path.parent, path.name
        return cls(path, parent / f".{name}.lmshard-partial", parent / f".{name}.lmshard-retired",
                   parent / f".{name}.lmshard-lock")  # fmt: skip

    def trash(self) -> Path:
        """A fresh name for a directory on its way to deletion: once renamed there, nothing
        ever renames it back, so a deletion cut short is simply finished by the next run."""
        return self.out.parent / f".{self.out.name}.lmshard-trash-{os.getpid()}-{time.time_ns()}"

    def empty_trash(self) -> None:
        """Delete what earlier swaps replaced; what cannot be deleted (permissions) is left,
        never in the way of a run."""
        for path in self.out.parent.glob(f".{glob.escape(self.out.name)}.lmshard-trash-*"):
            shutil.rmtree(path, ignore_errors=True)


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


def os_error(e: OSError, out: Path, resumable: bool = False) -> LmshardError:
    """An operating-system failure of the output side as a one-line message naming the file and
    the fix (the readers name an input's own failures: `reading.InputReadError`). A failure
    naming no file is a write's: the output's. One naming a file outside the output gets no
    advice about --out. `resumable`: the work is kept for a --resume, which the caller says, so
    the fix stops short of starting again elsewhere."""
    where = e.filename or out
    if e.filename is not None and not _is_output(os.fsdecode(e.filename), out):
        return LmshardError(f"{where}: {e.strerror or e}")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        if resumable:
            return LmshardError(f"{where}: no space left on the device; free space")
        return LmshardError(f"{where}: no space left on the device; free space (or choose another --out) and re-run")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        if resumable:
            return LmshardError(f"{where}: {e.strerror}; make it writable")
        return LmshardError(f"{where}: {e.strerror}; choose an --out in a directory you can write")
    if e.errno == errno.ENOTDIR:
        return LmshardError(f"{where}: a part of the --out path is a file, not a directory; choose another --out")
    return LmshardError(f"{where}: {e.strerror or e}")


def _is_output(path: str, out: Path) -> bool:
    """Whether `path` is --out, inside it, or among the entries a run keeps beside it."""
    p = Path(os.path.abspath(path))
    if p == out or out in p.parents:
        return True
    return out.parent in p.parents and p.relative_to(out.parent).parts[0].startswith(f".{out.name}.lmshard-")


def inside(out: Path) -> bool:
    """Whether the current directory is `out` or inside it (a swap would strand the shell there)."""
    try:
        cwd, real = Path(os.path.realpath(os.getcwd())), Path(os.path.realpath(out))
    except OSError:
        return False
    return cwd == real or real in cwd.parents


def kind_of_output(out: Path) -> tuple[str, list[str]]:
    """What `--out` holds: missing, file, empty, dataset (complete; other files of the user's
    may sit beside it), unfinished (only lmshard's own names, and files that only lmshard
    writes: a run of an older lmshard that wrote in place) or foreign (no dataset, other files,
    or only folders named train/ and val/ with none of lmshard's files in them); and the names
    that are not lmshard's (all of them, for a foreign folder of lmshard-like names)."""
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
    if not foreign and not _written_by_lmshard(out, entries):
        return "foreign", sorted(entries)
    return ("foreign" if foreign else "unfinished"), foreign


def _written_by_lmshard(out: Path, entries: list[str]) -> bool:
    """Whether a folder of lmshard's names holds a file only lmshard writes: its run record, its
    tokenizer state, or a shard or key file (train/shard_000000.bin, dedup/doc_keys_000000.u64)."""
    if IN_PROGRESS_FILE in entries or TOKENIZER_FILE in entries:
        return True
    subs = [out / sub for sub in (*SPLITS, "dedup") if sub in entries]
    return any(_OUR_FILE.fullmatch(n) for sub in subs if sub.is_dir() for n in os.listdir(sub))


def read_run(staging: Path) -> dict[str, Any] | None:
    """The build's run record, or None when there is none (or it is unreadable)."""
    try:
        data = json.loads((staging / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == RUN_VERSION else None


def recover(paths: OutputPaths) -> None:
    """Finish or undo what a run killed during its swap left, and delete replaced datasets."""
    if not paths.out.exists() and paths.retired.exists():
        # cut between the two renames of a swap: the new build is complete when it has metadata
        built = (paths.staging / METADATA_FILE).exists() and read_run(paths.staging) is not None
        os.rename(paths.staging if built else paths.retired, paths.out)
    if paths.retired.exists():
        os.rename(paths.retired, paths.trash())
    if paths.out.is_dir() and (paths.out / METADATA_FILE).exists():
        for left in (RUN_FILE, DICT_FILE):  # a swapped-in build's record and dictionary, left by a kill
            (paths.out / left).unlink(missing_ok=True)
    if paths.staging.is_dir() and read_run(paths.staging) is None:
        os.rename(paths.staging, paths.trash())  # an old dataset moved aside by a swap, or a build that never began
    paths.empty_trash()


def commit(paths: OutputPaths) -> None:
    """Put the finished build at `--out` in one step, then delete what it replaced."""
    out, staging = paths.out, paths.staging
    kind, _ = kind_of_output(out)
    for rel in user_entries(out):  # the user's own files in the dataset move with it (hard links)
        carry(out / rel, staging / rel)
    for folder, _, _ in os.walk(staging, topdown=False):  # every folder's names (the shards', the key files',
        _fsync_dir(Path(folder))  # a user's own in theirs), the deepest first, the build's own last
    if kind == "empty":
        out.rmdir()  # (a kill here: --out is missing and the build complete; --resume renames it)
    if kind in ("missing", "empty"):
        os.rename(staging, out)
    elif _exchange(staging, out):
        stop_point("swap")  # the new dataset at --out, the old one under the build's name
        os.rename(staging, paths.trash())
    else:
        os.rename(out, paths.retired)
        stop_point("swap")  # between the two renames: --out missing, recover() finishes the swap
        os.rename(staging, out)
        stop_point("swap")
        os.rename(paths.retired, paths.trash())
    stop_point("swap")  # swapped; the build's run record and the trash are still there
    _fsync_dir(out.parent)
    (out / RUN_FILE).unlink(missing_ok=True)
    (out / DICT_FILE).unlink(missing_ok=True)  # (the metadata holds it)
    _fsync_dir(out)
    paths.empty_trash()


_OUR_FILE = re.compile(r"shard_[0-9]{6}\.(bin|idx|sums|blocks|src)(\.([0-9]+\.)?tmp)?|(doc|line)_keys_[0-9]{6}\.u64|"
                       r"near_sigs_[0-9]{6}\.u32")


def user_entries(out: Path) -> list[str]:
    """What in a dataset directory is not lmshard's: other top-level names, and anything in
    train/, val/ or dedup/ not named like a shard or key file. Relative paths."""
    if not out.is_dir():
        return []
    found = sorted(set(os.listdir(out)) - _OURS)
    for sub in (*SPLITS, "dedup"):
        if (out / sub).is_dir() and not (out / sub).is_symlink():
            found += [f"{sub}/{n}" for n in sorted(os.listdir(out / sub)) if not _OUR_FILE.fullmatch(n)]
    return found


def carry(src: Path, dst: Path) -> None:
    """`src` (a file, link or directory tree) hard-linked at `dst`, replacing what an earlier,
    interrupted attempt left there."""
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    elif dst.exists() or dst.is_symlink():
        dst.unlink()
    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True, copy_function=link_or_copy)
    else:
        link_or_copy(src, dst, follow=False)


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


def link_previous(previous: DatasetMeta, out: Path, staging: Path) -> None:
    """The appended-to dataset's shards and dedup keys (a DatasetMeta's files), hard-linked into
    the build: the same files, never written again (copied where the filesystem has no hard
    links)."""
    names = [p for s in previous.shards for p in s.files()]
    names += [f.path for f in previous.dedup.files] if previous.dedup else []
    for name in names:
        link_or_copy(out / name, staging / name)
