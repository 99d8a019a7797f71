"""The dedup stage's inputs and outputs as one file per writer: each tokenize task's keys
partitioned by dedup bucket, and each dedup group's duplicates partitioned by task, so that a
group reads one slice of one file per task and a select task one slice of one file per group,
never one file per unit.

**Task keys** (`WORK/keys/task_TTTTTT.bin`, written by tokenize task T once its units are
done, from their data files): the magic `LMSKEYS1`, then three little-endian uint64: the
number of buckets B, where the `near` section starts, and the file's end; then the `exact`
section, then `near`. A section is B+1 uint64 offsets (entries before each bucket), the keys
(uint64) grouped by bucket, then each key's document id (uint64: unit << 32 | document, which
is plan order), in plan order within a bucket. `exact` holds one key per document (a hash of
its text); `near` (--near-dedup) one per band of its MinHash signature, in the bucket of the
key's value. Written under a temporary name, fsynced and renamed: the file is its own marker.

**Keys of an appended-to dataset** (`WORK/keys/previous_TTTTTT.bin`, --append): task T's
share of the dataset's key files (every N-th from the T-th), in the same layout with ids 0.

**Line keys** (--dedup-lines, linestage.py): `WORK/keys/lines_TTTTTT.bin`, task T's lines'
keys (ids unit << 32 | line), and `WORK/keys/prevlines_TTTTTT.bin`, its share of an
appended-to dataset's line key files (ids 0), in the same layout with an empty `near` section.

**Group duplicates** (`dedup/group_GGGGGG.dups`, buckets.py): T+1 uint64 offsets, then the
ids (uint64) of the duplicate documents of the group's buckets, grouped by the task that
tokenized them.

A partition is found with two positioned reads of 16 bytes and 8 bytes, then one read per
array: a few reads of one open file, whatever the plan's size.

Memory model: writing a task's keys holds them with their ids (16 bytes per document; with
--near-dedup 16 more per band of each document: 352 bytes at the default 22 bands) and their
sort; reading holds one partition.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...format import atomic_file
from ...quality.minhash import MinHashConfig, band_keys
from . import volatile
from .plantables import pread_all
from .unitfiles import read_section

_MAGIC = b"LMSKEYS1"
_HEAD = len(_MAGIC) + 3 * 8
_U64 = np.dtype("<u8")


def task_keys_path(work: Path, task: int) -> Path:
    return work / "keys" / f"task_{task:06d}.bin"


def previous_keys_path(work: Path, task: int) -> Path:
    """Task `task`'s share of the keys of the dataset an --append extends."""
    return work / "keys" / f"previous_{task:06d}.bin"


def line_keys_path(work: Path, task: int, previous: bool = False) -> Path:
    """Task `task`'s lines' keys (--dedup-lines; `previous`: its share of an appended-to dataset's)."""
    return work / "keys" / f"{'prevlines' if previous else 'lines'}_{task:06d}.bin"


def write_line_keys(path: Path, keys: np.ndarray, ids: np.ndarray, n_buckets: int) -> None:
    """A key file of lines' keys and their ids (see the module docstring)."""
    _write_keys(path, partition(keys.astype(_U64), ids.astype(_U64), n_buckets), b"", n_buckets)


def write_task_keys(work: Path, units: range, task: int, n_buckets: int, minhash: MinHashConfig | None,
                    base: int = 0) -> bool:  # fmt: skip
    """Write task `task`'s key file from its `units`' data files, unless it exists; True when it
    ran. `base`: the near-duplicate ids' first unit number (--append --near-dedup: the dataset's
    signature files are numbered before the run's units)."""
    path = task_keys_path(work, task)
    if path.exists():
        return False
    tokenized = work / "tokenize"
    keys, ids, bkeys, bids = [], [], [], []
    for u in units:
        k = read_section(tokenized, u, "keys")
        keys.append(k)
        ids.append(_ids(u, np.arange(len(k))))
        if minhash is not None:
            sigs = read_section(tokenized, u, "sigs").reshape(-1, minhash.n_hashes)
            bkeys.append(band_keys(sigs, minhash).reshape(-1))
            bids.append(_ids(base + u, np.repeat(np.arange(len(sigs)), minhash.bands)))
    _write_keys(path, partition(_joined(keys), _joined(ids), n_buckets), partition(_joined(bkeys), _joined(bids),
                                                                                   n_buckets), n_buckets)  # fmt: skip
    return True


def write_previous_keys(work: Path, dataset: Path, files: list[str], task: int, n_buckets: int,
                        near: Sequence[tuple[int, str]] = (),
                        minhash: MinHashConfig | None = None) -> bool:  # fmt: skip
    """Write task `task`'s share of an appended-to dataset's keys as a key file of the same layout,
    unless it exists; True when it ran: its document keys (key `files`, paths relative to
    `dataset`; ids 0: these documents are never duplicates, only what later ones repeat), and
    with --near-dedup the band keys of its signature files (`near`: (number, path)), with ids
    number << 32 | row, numbered before the run's units."""
    path = previous_keys_path(work, task)
    if path.exists():
        return False
    keys = _joined([np.fromfile(dataset / f, dtype=_U64) for f in files])
    bkeys, bids = [], []
    for number, rel in near:
        assert minhash is not None
        sigs = np.fromfile(dataset / rel, dtype="<u4").reshape(-1, minhash.n_hashes)
        bkeys.append(band_keys(sigs, minhash).reshape(-1))
        bids.append(_ids(number, np.repeat(np.arange(len(sigs)), minhash.bands)))
    _write_keys(path, partition(keys, np.zeros(len(keys), _U64), n_buckets),
                partition(_joined(bkeys), _joined(bids), n_buckets), n_buckets)  # fmt: skip
    return True


def _write_keys(path: Path, exact: bytes, near: bytes, n_buckets: int) -> None:
    """A key file of two sections, durably (temporary name, fsync, rename: the file is its marker)."""
    with atomic_file(path, volatile.sync) as f:
        f.write(_MAGIC + np.array([n_buckets, _HEAD + len(exact), _HEAD + len(exact) + len(near)], _U64).tobytes())
        f.write(exact)
        f.write(near)


def _ids(u: int, docs: np.ndarray) -> np.ndarray:
    return (np.uint64(u) << np.uint64(32)) | docs.astype(np.uint64)


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(_U64) if parts else np.zeros(0, _U64)


def partition(keys: np.ndarray, ids: np.ndarray, n_buckets: int) -> bytes:
    """Keys and their ids as a section: grouped by bucket (key modulo `n_buckets`), in their
    given order within a bucket."""
    bucket = (keys % np.uint64(n_buckets)).astype(np.int64)
    order = np.argsort(bucket, kind="stable")
    offsets = np.zeros(n_buckets + 1, dtype=_U64)
    np.cumsum(np.bincount(bucket, minlength=n_buckets), out=offsets[1:])
    return offsets.tobytes() + keys[order].astype(_U64).tobytes() + ids[order].astype(_U64).tobytes()


def group_keys(work: Path, task: int, buckets: range, section: str, previous: bool = False,
               lines: bool = False) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The (keys, ids) of `buckets` (consecutive) in task `task`'s key file (`previous`: its share
    of the appended-to dataset's; `lines`: of lines' keys), `section` exact or near: one slice
    of each array."""
    if lines:
        path = line_keys_path(work, task, previous)
    else:
        path = previous_keys_path(work, task) if previous else task_keys_path(work, task)
    fd = os.open(path, os.O_RDONLY)
    try:
        head = pread_all(fd, _HEAD, 0)
        if head[: len(_MAGIC)] != _MAGIC:
            raise OSError(f"{path}: not a task key file")
        n_buckets, near_at, _ = np.frombuffer(head[len(_MAGIC) :], dtype=_U64).astype(int).tolist()
        keys, ids = read_partition(fd, _HEAD if section == "exact" else near_at, n_buckets, buckets.start, 2,
                                   buckets.stop)  # fmt: skip
        return keys, ids
    finally:
        os.close(fd)


def read_partition(fd: int, base: int, count: int, i: int, arrays: int, stop: int | None = None) -> list[np.ndarray]:
    """Partition i (to `stop`, exclusive: partitions i..stop-1 at once) of a section at `base`
    laid out as `count`+1 uint64 offsets, then `arrays` uint64 arrays of as many entries each,
    grouped the same way."""
    stop = i + 1 if stop is None else stop
    lo = int(np.frombuffer(pread_all(fd, 8, base + 8 * i), dtype=_U64)[0])
    hi = int(np.frombuffer(pread_all(fd, 8, base + 8 * stop), dtype=_U64)[0])
    total = int(np.frombuffer(pread_all(fd, 8, base + 8 * count), dtype=_U64)[0])
    start = base + 8 * (count + 1)
    return [np.frombuffer(pread_all(fd, 8 * (hi - lo), start + 8 * (a * total + lo)), dtype=_U64)
            for a in range(arrays)]


def write_partitioned(path: Path, groups: np.ndarray, values: np.ndarray, count: int) -> None:
    """`values` (uint64, in order) with their group numbers (increasing, < `count`) as a file
    of `count`+1 offsets then the values, atomically (volatile.write_bytes)."""
    offsets = np.zeros(count + 1, dtype=_U64)
    np.cumsum(np.bincount(groups.astype(np.int64), minlength=count), out=offsets[1:])
    volatile.write_bytes(path, offsets.tobytes() + values.astype(_U64).tobytes())


def read_group(path: Path, count: int, i: int) -> np.ndarray:
    """Group i's values of a file `write_partitioned` wrote."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_partition(fd, 0, count, i, 1)[0]
    finally:
        os.close(fd)
