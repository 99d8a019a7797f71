"""The dedup stage of a planned run: documents' keys partitioned into hash buckets, each bucket
resolved on its own, in parallel, by whichever task or worker holds it.

**Buckets.** Their number is fixed by the plan from the input's size alone (taskplan.bucket_count:
a power of two from 32 to 4096, one per 256 MiB of input), never from the task or worker count,
so a bucket's work stays bounded however many tasks share a run, and the answer (which
documents repeat an earlier one) never depends on how the work was dealt. A document's bucket
is its key modulo the bucket count (keys are xxh3-64: their low bits are uniform).

**Groups.** The dedup stage's items are groups of consecutive buckets (taskplan.group_count): as
many as the run's processes (tasks × workers) or one per 256 MiB of input, whichever is more, up
to every bucket, while groups × tasks stays within PAIRS (2^24), else as many groups as that
allows (256 for 65,536 tasks). A run in one process resolves a small input in one group. A
group reads one slice of each task's key file (its buckets are contiguous there) and writes one
file of duplicates, so the dedup stage opens groups × tasks key files and the select stage
groups × tasks files of duplicates: at most 2^24 each however many tasks a run has, where one
item per bucket would open buckets × tasks (2.7 × 10^8 each at 4,096 buckets and 65,536
tasks). Which documents are duplicates does not depend on the grouping.

**Files** (keyfiles.py). Each tokenize task writes its documents' keys already partitioned by
bucket into one file; group g reads its buckets' slice of each task's file (a few positioned
reads per task: the files a group opens are the plan's tasks, never its units) and writes its
duplicates, grouped by task, as `dedup/group_G.dups`, so a select task reads its own slice of
each group's file the same way.

**Survivors.** Within a bucket the keys are taken in plan order (task, unit, then document),
and the first occurrence of each key survives: the same documents a single process keeps when
it meets them in order. (Keys of different buckets differ, so a group resolves its buckets in
one pass.)

Memory model: a group holds its buckets' keys, 16 bytes per document of the group plus the sort
(np.unique), 1/G of the run's documents (G groups: one per 256 MiB of input or more, below the
4,096 buckets and the PAIRS cap); with --near-dedup 16 more bytes per band of each of them (352
at the default 22 bands); a select task holds its documents' duplicates (8 bytes each).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from ...quality.minhash import MinHashConfig
from ...quality.near import group_edges, unique_edges
from ..stops import stop_point
from . import volatile
from .keyfiles import group_keys, read_group, write_partitioned
from .plantables import pread_all
from .unitfiles import SECTIONS

_U64 = np.dtype("<u8")
Signatures = Callable[[np.ndarray], np.ndarray]  # documents' ids → their [n, n_hashes] signatures


def group_buckets(n_buckets: int, n_groups: int, group: int) -> range:
    """The buckets of group `group`: a contiguous range."""
    return range(group * n_buckets // n_groups, (group + 1) * n_buckets // n_groups)


def resolve(work: Path, tasks: list[list[int]], n_buckets: int, n_groups: int, group: int, exact: bool = True,
            minhash: MinHashConfig | None = None, previous: Sequence[int] = (),
            signatures: Signatures | None = None, lines: bool = False) -> int:  # fmt: skip
    """Find group `group`'s duplicates over every task's key file (`tasks`: the plan's unit
    ranges) and write them with their marker (`dedup/group_G.dups`, `.done`); returns how many
    (skipped when already done: -1). `minhash` (--near-dedup): also its near-duplicate edges.
    `previous` (--append): the tasks holding a share of the appended-to dataset's keys, which
    come before every new document (and are never duplicates themselves); `signatures`: with
    --near-dedup, the signatures of documents by id (default: the units' own). `lines`
    (--dedup-lines): the lines' keys instead (linestage.py), into `lines/group_G.dups`."""
    out = work / ("lines" if lines else "dedup")
    marker = out / f"group_{group:06d}.done"
    if marker.exists():
        return -1
    writers = [t for t, (first, end) in enumerate(tasks) if end > first]
    buckets = group_buckets(n_buckets, n_groups, group)
    edges = near_edges(work, writers, buckets, group, minhash, previous, signatures) if minhash is not None else 0
    keys, ids, owners = [], [], []
    for t in previous if exact else []:
        k, i = group_keys(work, t, buckets, "exact", previous=True, lines=lines)
        keys.append(k)
        ids.append(i)
        owners.append(np.full(len(k), -1, dtype=np.int64))
    for t in writers if exact else []:
        k, i = group_keys(work, t, buckets, "exact", lines=lines)
        keys.append(k)
        ids.append(i)
        owners.append(np.full(len(k), t, dtype=np.int64))
    k = np.concatenate(keys) if keys else np.zeros(0, _U64)
    _, first = np.unique(k, return_index=True)  # np.unique's index is each key's first occurrence
    dup = np.ones(len(k), dtype=bool)
    dup[first] = False
    owner = np.concatenate(owners) if owners else np.zeros(0, np.int64)
    dup &= owner >= 0  # (the dataset appended to is kept whole)
    out.mkdir(parents=True, exist_ok=True)
    write_partitioned(out / f"group_{group:06d}.dups", owner[dup], np.concatenate(ids)[dup] if ids else k[:0],
                      len(tasks))  # fmt: skip
    volatile.write_json(marker, {"duplicates": int(dup.sum()), "near_edges": edges})
    stop_point("linebucket" if lines else "bucket", group)
    return int(dup.sum())


def near_edges(work: Path, writers: list[int], buckets: range, group: int, minhash: MinHashConfig,
               previous: Sequence[int] = (), signatures: Signatures | None = None) -> int:  # fmt: skip
    """The group's near-duplicate edges over the `near` sections of the tasks' key files (and
    of the shares of an appended-to dataset's, whose documents are numbered first)
    (quality/near.py's groups; documents numbered unit << 32 | document, which is plan order),
    written as `dedup/group_G.near`: (member, representative) uint64 pairs. Returns how many."""
    keys, ids = [], []
    for t in previous:
        k, i = group_keys(work, t, buckets, "near", previous=True)
        keys.append(k)
        ids.append(i)
    for t in writers:
        k, i = group_keys(work, t, buckets, "near")
        keys.append(k)
        ids.append(i)
    tokenized = work / "tokenize"
    lookup = signatures or (lambda want: doc_signatures(tokenized, want, minhash.n_hashes))
    member, rep = group_edges(np.concatenate(keys) if keys else np.zeros(0, _U64),
                              np.concatenate(ids) if ids else np.zeros(0, _U64), lookup, minhash)  # fmt: skip
    (work / "dedup").mkdir(parents=True, exist_ok=True)
    volatile.write_bytes(work / "dedup" / f"group_{group:06d}.near",
                       np.stack([member, rep], axis=1).astype(_U64).tobytes())  # fmt: skip
    return len(member)


def doc_signatures(tokenized: Path, ids: np.ndarray, n_hashes: int, base: int = 0, dataset: Path | None = None,
                   files: Sequence[str] = ()) -> np.ndarray:  # fmt: skip
    """The signatures of documents `ids` (sorted): those numbered below unit `base` are rows of an
    appended-to dataset's signature files (`files`, in `dataset`: file << 32 | row), the others
    the units' (base + unit) << 32 | document."""
    out = np.empty((len(ids), n_hashes), dtype=np.uint32)
    units = (ids >> np.uint64(32)).astype(np.int64)
    old = units < base
    width = 4 * n_hashes
    for f in np.unique(units[old]).tolist():
        assert dataset is not None
        fd = os.open(dataset / files[f], os.O_RDONLY)
        try:
            for row in np.flatnonzero(units == f).tolist():
                r = int(ids[row] & np.uint64(0xFFFFFFFF))
                out[row] = np.frombuffer(pread_all(fd, width, r * width), dtype="<u4")
        finally:
            os.close(fd)
    if (~old).any():
        out[~old] = unit_signatures(tokenized, ids[~old] - (np.uint64(base) << np.uint64(32)), n_hashes)
    return out


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


def read_edges(dedup: Path, groups: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
    """The near-duplicate edges of `groups`, each pair once: (members, representatives)."""
    pairs = [np.fromfile(dedup / f"group_{g:06d}.near", dtype=_U64).reshape(-1, 2) for g in groups]
    both = np.concatenate(pairs) if pairs else np.zeros((0, 2), _U64)
    return unique_edges(both[:, 0], both[:, 1])


def task_duplicates(dedup: Path, n_tasks: int, n_groups: int, task: int) -> np.ndarray:
    """The ids (unit << 32 | document, sorted) of task `task`'s documents that some group found
    repeat an earlier one: its slice of each group's duplicates."""
    found = [read_group(dedup / f"group_{g:06d}.dups", n_tasks, task) for g in range(n_groups)]
    return np.sort(np.concatenate(found)) if found else np.zeros(0, _U64)


def unit_part(ids: np.ndarray, u: int) -> np.ndarray:
    """The document numbers of unit u among sorted ids (unit << 32 | document)."""
    lo, hi = np.searchsorted(ids, [np.uint64(u) << np.uint64(32), np.uint64(u + 1) << np.uint64(32)])
    return (ids[lo:hi] & np.uint64(0xFFFFFFFF)).astype(np.int64)


def groups_of(n_groups: int, n_tasks: int, task: int) -> range:
    """Task `task`'s dedup groups: a contiguous share (empty for some tasks when groups < tasks)."""
    return range(task * n_groups // n_tasks, (task + 1) * n_groups // n_tasks)
