"""Where an export, import or convert writes: a hidden sibling directory swapped in only when
complete, and files written under a temporary name, fsynced and renamed.

`--out DIR` must not exist, or be empty, unless `force` (`--force`; convert's `--overwrite`):
then the old DIR is renamed aside only after the new one is complete, and deleted only after
the new one has taken its place. A run that fails or is interrupted leaves DIR as it was (and
removes its own partial directory).

`force` replaces only what lmshard writes, as `prepare --overwrite` does: the files of the new
output, the files an earlier export listed in its `lmshard_export.json`, and an lmshard
dataset's own shards, index and metadata. Everything else in the old DIR (a nanoGPT folder's
`prepare.py` and `readme.md`, a dataset's `README.md`) is hard-linked into the new one before
the swap, so it is never deleted, whatever the moment of a kill.

Memory model: nothing here holds data; `TokenFile` writes what it is given.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import ConfigError
from ..format import METADATA_FILE
from ..prepare.output.staging import carry, user_entries

PROVENANCE_FILE = "lmshard_export.json"  # an export's record of what it wrote (export.py)
_BLOCKS = re.compile(r"(train|val)/shard_[0-9]{6}\.blocks(\.([0-9]+\.)?tmp)?")  # a zstd shard's frame offsets


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """The names in every folder of `path` made durable, the deepest first (files renamed into
    a subfolder, as a split's shards are)."""
    for root, _, _ in os.walk(path, topdown=False):
        _fsync_dir(Path(root))


def _check_out(out: Path, force: bool, sources: list[Path], flag: str) -> None:
    for src in sources:
        real = Path(os.path.realpath(src))
        if out == real or out.is_relative_to(real) or real.is_relative_to(out):
            raise ConfigError(f"--out {out} overlaps the input {src}; choose a directory outside it")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError(f"--out {out}: exists and is not empty; pass {flag} to replace it "
                          "(the old one stays until the new one is complete)")  # fmt: skip


@contextlib.contextmanager
def staged_output(out: str | os.PathLike[str], force: bool, sources: list[Path],
                  trainer_files: re.Pattern[str] | None = None, flag: str = "--force") -> Iterator[Path]:  # fmt: skip
    """A fresh directory beside `out` to write into; moved to `out` when the block ends without
    an error, else removed. `sources` are the inputs `out` must not overlap (read-only).
    `trainer_files`: names the target trainer reads; one of the user's that would stay beside
    the new files (an old `meta.pkl`, a shard the new export does not overwrite) is refused.
    `flag`: the option that lets a non-empty `out` be replaced, as the refusal names it."""
    target = Path(os.path.realpath(out))  # a symlinked --out: swap the directory it names
    _check_out(target, force, sources, flag)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.lmshard-interop-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)  # a leftover of an earlier run with this pid
    staging.mkdir()
    try:
        yield staging
        _fsync_tree(staging)
        _swap_in(staging, target, trainer_files)
    except BaseException as e:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(e, OSError) and e.filename is None:  # a full disk names no file: it is --out's
            e.filename = str(target)
        raise


def _swap_in(staging: Path, target: Path, trainer_files: re.Pattern[str] | None = None) -> None:
    """Rename the complete `staging` to `target`; an old `target` is renamed aside first and
    deleted only once the new one is in place."""
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    if not target.exists():
        os.replace(staging, target)
        _fsync_dir(target.parent)
        return
    kept = users_files(target, staging)
    stale = [rel for rel in kept if trainer_files is not None and trainer_files.fullmatch(rel)]
    if stale:  # not ours to delete, and the trainer would read it with the new files
        shown = ", ".join(stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
        raise ConfigError(f"--out {target}: {shown} would stay beside the new files, and the trainer reads "
                          "those too; move them out of --out and run again (nothing was changed)")  # fmt: skip
    for rel in kept:
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        carry(target / rel, staging / rel)
    _fsync_tree(staging)
    retired = target.parent / f".{target.name}.lmshard-replaced-{os.getpid()}"
    os.replace(target, retired)
    os.replace(staging, target)
    _fsync_dir(target.parent)
    shutil.rmtree(retired, ignore_errors=True)


def users_files(old: Path, new: Path) -> list[str]:
    """What the old output holds that lmshard did not write and the new one does not replace
    (paths relative to `old`)."""
    if (old / METADATA_FILE).is_file():  # an lmshard dataset: prepare's own rule (and its block offsets files)
        return [rel for rel in user_entries(old) if not (new / rel).exists() and not _BLOCKS.fullmatch(rel)]
    ours = {PROVENANCE_FILE}
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
        record = json.loads((old / PROVENANCE_FILE).read_text())  # every file an export wrote (earlier: its list)
        ours |= set(record.get("written") or [f["path"] for f in record["files"]])
    return _not_replaced(old, new, ours, "")


def _not_replaced(old: Path, new: Path, ours: set[str], prefix: str) -> list[str]:
    """Entries under `old` (relative to it, from `prefix` down) that the new output does not
    replace: a folder both hold is compared entry by entry, so a user's `train/notes.txt` stays
    beside the new `train/` shards."""
    kept = []
    for name in sorted(os.listdir(old / prefix) if prefix else os.listdir(old)):
        rel = f"{prefix}/{name}" if prefix else name
        if rel in ours:
            continue
        if not (new / rel).exists() and not (new / rel).is_symlink():
            kept.append(rel)
        elif (old / rel).is_dir() and not (old / rel).is_symlink() and (new / rel).is_dir():
            kept += _not_replaced(old, new, ours, rel)
    return kept


class TokenFile:
    """One output file written as `NAME.tmp` and renamed to NAME by `close()` after an fsync.
    `header` bytes (if any) are rewritten by `close(header=...)`, whose size must not change."""

    def __init__(self, path: Path, header: bytes = b"") -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        self._f: BinaryIO = open(self.tmp, "wb")  # noqa: SIM115 (closed in close())
        self._f.write(header)
        self.n_bytes = len(header)

    def write(self, data: np.ndarray | bytes) -> None:
        raw = data.tobytes() if isinstance(data, np.ndarray) else data
        self._f.write(raw)
        self.n_bytes += len(raw)

    def write_at(self, offset: int, data: np.ndarray) -> None:
        """Write at a byte offset (Megatron's index sections), then return to the end."""
        self._f.seek(offset)
        self._f.write(data.tobytes())
        self._f.seek(0, os.SEEK_END)

    def close(self, header: bytes | None = None) -> Path:
        if header is not None:
            self._f.seek(0)
            self._f.write(header)
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self.tmp, self.path)
        return self.path
