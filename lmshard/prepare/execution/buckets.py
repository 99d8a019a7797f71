"""The dedup stage of a planned run: documents' keys partitioned into hash buckets, each bucket
resolved on its own, in parallel, by whichever task or worker holds it.

**Buckets.** Their number is fixed by the plan from the input's size alone (taskplan.bucket_count:
a power of two from 32 to 4096, one per 256 MiB of input), never from the task or worker count,
so a bucket's work stays bounded however many tasks share a run, and the answer (which
documents repeat an earlier one) never depends on how the work was dealt. A document's bucket
is its key modulo the bucket count (keys are xxh3-64: their low bits are uniform).

**Files** (keyfiles.py). Each tokenize task writes its documents' keys already partitioned by
bucket into one file; bucket b reads its slice of each task's file (a few positioned reads per
task: the files a bucket opens are the plan's tasks, never its units) and writes its
duplicates, grouped by task, as `dedup/bucket_B.dups`, so a select task reads its own slice of
each bucket's file the same way.

**Survivors.** Within a bucket the keys are taken in plan order (task, unit, then document),
and the first occurrence of each key survives: the same documents a single process keeps when
it meets them in order.

Memory model: a bucket holds its own keys, 16 bytes per document of the bucket plus the sort
(np.unique), about 1/B of the run's documents; a select task holds its documents' duplicates
(8 bytes each).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...format import atomic_write_bytes, atomic_write_json
from ...quality.minhash import MinHashConfig
from ...quality.near import group_edges, unique_edges
from ..stops import stop_point
from .keyfiles import bucket_keys, read_group, write_partitioned
from .plantables import pread_all
from .unitfiles import SECTIONS

_U64 = np.dtype("<u8")


def resolve(work: Path, tasks: list[list[int]], n_buckets: int, bucket: int, exact: bool = True,
            minhash: MinHashConfig | None = None) -> int:  # fmt: skip
    """Find bucket `bucket`'s duplicates over every task's key file (`tasks`: the plan's unit
    ranges) and write them with their marker (`dedup/bucket_B.dups`, `.done`); returns how many
    (skipped when already done: -1). `minhash` (--near-dedup): also its near-duplicate edges."""
    out = work / "dedup"
    marker = out / f"bucket_{bucket:06d}.done"
    if marker.exists():
        return -1
    writers = [t for t, (first, end) in enumerate(tasks) if end > first]
    edges = near_edges(work, writers, bucket, minhash) if minhash is not None else 0
    keys, ids, owners = [], [], []
    for t in writers if exact else []:
        k, i = bucket_keys(work, t, bucket, "exact")
        keys.append(k)
        ids.append(i)
        owners.append(np.full(len(k), t, dtype=np.int64))
    k = np.concatenate(keys) if keys else np.zeros(0, _U64)
    _, first = np.unique(k, return_index=True)  # np.unique's index is each key's first occurrence
    dup = np.ones(len(k), dtype=bool)
    dup[first] = False
    out.mkdir(parents=True, exist_ok=True)
    write_partitioned(out / f"bucket_{bucket:06d}.dups", np.concatenate(owners)[dup] if owners else k[:0],
                      np.concatenate(ids)[dup] if ids else k[:0], len(tasks))  # fmt: skip
    atomic_write_json(marker, {"duplicates": int(dup.sum()), "near_edges": edges})
    stop_point("bucket", bucket)
    return int(dup.sum())


def near_edges(work: Path, writers: list[int], bucket: int, minhash: MinHashConfig) -> int:
    """The bucket's near-duplicate edges over the `near` sections of the tasks' key files
    (quality/near.py's groups; documents numbered unit << 32 | document, which is plan order),
    written as `dedup/bucket_B.near`: (member, representative) uint64 pairs. Returns how many."""
    keys, ids = [], []
    for t in writers:
        k, i = bucket_keys(work, t, bucket, "near")
        keys.append(k)
        ids.append(i)
    tokenized = work / "tokenize"
    member, rep = group_edges(np.concatenate(keys) if keys else np.zeros(0, _U64),
                              np.concatenate(ids) if ids else np.zeros(0, _U64),
                              lambda want: unit_signatures(tokenized, want, minhash.n_hashes), minhash)  # fmt: skip
    (work / "dedup").mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(work / "dedup" / f"bucket_{bucket:06d}.near",
                       np.stack([member, rep], axis=1).astype(_U64).tobytes())  # fmt: skip
    return len(member)


def unit_signatures(tokenized: Path, ids: np.ndarray, n_hashes: int) -> np.ndarray:
    """The signatures of documents `ids` (unit << 32 | document, sorted): one positioned read
    each from their units' `sigs` sections."""
    out = np.empty((len(ids), n_hashes), dtype=np.uint32)
    width = 4 * n_hashes
    units = (ids >> np.uint64(32)).astype(np.int64)
    for u in np.unique(units).tolist():
        at = int(np.frombuffer(_header_entry(tokenized / f"unit_{u:06d}.bin", "sigs"), dtype=_U64)[0])
        fd = os.open(tokenized / f"unit_{u:06d}.bin", os.O_RDONLY)
        try:
            for row in np.flatnonzero(units == u).tolist():
                d = int(ids[row] & np.uint64(0xFFFFFFFF))
                out[row] = np.frombuffer(pread_all(fd, width, at + d * width), dtype="<u4")
        finally:
            os.close(fd)
    return out


def _header_entry(path: Path, section: str) -> bytes:
    with open(path, "rb") as f:
        f.seek(8 + 8 * SECTIONS.index(section))
        return f.read(8)


def read_edges(dedup: Path, n_buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Every bucket's near-duplicate edges, each pair once: (members, representatives)."""
    pairs = [np.fromfile(dedup / f"bucket_{b:06d}.near", dtype=_U64).reshape(-1, 2) for b in range(n_buckets)]
    both = np.concatenate(pairs) if pairs else np.zeros((0, 2), _U64)
    return unique_edges(both[:, 0], both[:, 1])


def task_duplicates(dedup: Path, n_tasks: int, n_buckets: int, task: int) -> np.ndarray:
    """The ids (unit << 32 | document, sorted) of task `task`'s documents that some bucket found
    repeat an earlier one: its slice of each bucket's duplicates."""
    found = [read_group(dedup / f"bucket_{b:06d}.dups", n_tasks, task) for b in range(n_buckets)]
    return np.sort(np.concatenate(found)) if found else np.zeros(0, _U64)


def unit_part(ids: np.ndarray, u: int) -> np.ndarray:
    """The document numbers of unit u among sorted ids (unit << 32 | document)."""
    lo, hi = np.searchsorted(ids, [np.uint64(u) << np.uint64(32), np.uint64(u + 1) << np.uint64(32)])
    return (ids[lo:hi] & np.uint64(0xFFFFFFFF)).astype(np.int64)


def buckets_of(n_buckets: int, n_tasks: int, task: int) -> range:
    """Task `task`'s buckets: a contiguous share (empty for some tasks when buckets < tasks)."""
    return range(task * n_buckets // n_tasks, (task + 1) * n_buckets // n_tasks)
