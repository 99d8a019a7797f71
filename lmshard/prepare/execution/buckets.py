"""The dedup stage of a planned run: documents' keys partitioned into hash buckets, each bucket
resolved on its own, in parallel, by whichever task or worker holds it.

**Buckets.** Their number is fixed by the plan from the input's size alone (taskplan.bucket_count:
a power of two from 32 to 4096, one per 256 MiB of input), never from the task or worker count,
so a bucket's work stays bounded however many tasks share a run, and the answer (which
documents repeat an earlier one) never depends on how the work was dealt. A document's bucket
is its key modulo the bucket count (keys are xxh3-64: their low bits are uniform).

**Files.** A tokenized unit writes its keys already partitioned (`partition`): the `bkeys`
section of its data file (unitfiles.py) holds B+1 little-endian uint64 offsets, then the keys
grouped by bucket (uint64, in document order within a bucket), then each key's document number
within the unit (uint32). Bucket b reads only its own slice of each unit's file: two small
reads, never the whole file. Its result, `dedup/bucket_B.dups`, holds U+1 uint64 offsets (U
units) and then, unit by unit, the numbers of that unit's documents in this bucket that are
duplicates (uint32, increasing), so the select stage reads one unit's slice of each bucket the
same way.

**Survivors.** Within a bucket the keys are taken in plan order (unit, then document), and the
first occurrence of each key survives: the same documents a single process keeps when it meets
them in order.

Memory model: a bucket holds its own keys, 12 bytes per document of the bucket plus the sort
(np.unique), about 1/B of the run's documents; a unit's partitioning holds its keys twice.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ...format import atomic_write_bytes, atomic_write_json
from ...quality.minhash import MinHashConfig
from ...quality.near import group_edges, unique_edges
from ..stops import stop_point
from .unitfiles import SECTIONS

_U64, _U32 = np.dtype("<u8"), np.dtype("<u4")


def _slice(path: Path, count: int, b: int, tail_dtype: np.dtype[Any] | None = None,
           in_unit: str | None = None) -> tuple[np.ndarray, ...]:  # fmt: skip
    """Entry b's slice of a file laid out as `count`+1 uint64 offsets, then the entries' values
    (uint64 keys, or uint32 document numbers), then (tail_dtype) as many values again. `in_unit`:
    the layout is that section (`bkeys`, `nkeys`) of a unit's data file (its header says where).
    A few positioned reads of one open file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        base = 0
        if in_unit:
            base = int(np.frombuffer(os.pread(fd, 8, 8 + 8 * SECTIONS.index(in_unit)), dtype=_U64)[0])
        lo, hi = np.frombuffer(os.pread(fd, 16, base + b * 8), dtype=_U64).astype(np.int64)
        total = int(np.frombuffer(os.pread(fd, 8, base + count * 8), dtype=_U64)[0])
        head = base + (count + 1) * 8
        first_dtype = _U64 if tail_dtype is not None else _U32
        first = np.frombuffer(_pread(fd, (hi - lo) * first_dtype.itemsize, head + lo * first_dtype.itemsize),
                              dtype=first_dtype)  # fmt: skip
        if tail_dtype is None:
            return (first,)
        at = head + total * first_dtype.itemsize + lo * tail_dtype.itemsize
        return first, np.frombuffer(_pread(fd, (hi - lo) * tail_dtype.itemsize, at), dtype=tail_dtype)
    finally:
        os.close(fd)


def _pread(fd: int, n: int, at: int) -> bytes:
    data = os.pread(fd, n, at)
    while len(data) < n:  # (a regular file gives all at once; a short read goes on where it stopped)
        more = os.pread(fd, n - len(data), at + len(data))
        if not more:
            raise OSError(f"unexpected end of a dedup file ({n - len(data)} bytes short)")
        data += more
    return data


def resolve(tokenized: Path, out: Path, n_units: int, n_buckets: int, bucket: int, exact: bool = True,
            minhash: MinHashConfig | None = None) -> int:  # fmt: skip
    """Find bucket `bucket`'s duplicates over every unit's `bkeys` and write them with their
    marker (`out/bucket_B.dups`, `.done`); returns how many (skipped when already done: -1).
    `minhash` (--near-dedup): also its near-duplicate edges (`near_edges`)."""
    marker = out / f"bucket_{bucket:06d}.done"
    if marker.exists():
        return -1
    edges = near_edges(tokenized, out, n_units, n_buckets, bucket, minhash) if minhash is not None else 0
    keys, units, docs = [], [], []
    for u in range(n_units if exact else 0):
        k, d = _slice(tokenized / f"unit_{u:06d}.bin", n_buckets, bucket, _U32, in_unit="bkeys")
        keys.append(k)
        docs.append(d)
        units.append(np.full(len(k), u, dtype=np.int64))
    k = np.concatenate(keys) if keys else np.zeros(0, _U64)
    _, first = np.unique(k, return_index=True)  # np.unique's index is each key's first occurrence
    dup = np.ones(len(k), dtype=bool)
    dup[first] = False
    dup_units = np.concatenate(units)[dup] if units else np.zeros(0, np.int64)
    dup_docs = np.concatenate(docs)[dup] if docs else np.zeros(0, _U32)
    offsets = np.zeros(n_units + 1, dtype=_U64)
    np.cumsum(np.bincount(dup_units, minlength=n_units), out=offsets[1:])
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".bucket_{bucket:06d}.dups.tmp"
    with open(tmp, "wb") as f:
        f.write(offsets.tobytes() + dup_docs.astype(_U32).tobytes())  # already by unit, then document
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out / f"bucket_{bucket:06d}.dups")
    atomic_write_json(marker, {"duplicates": int(dup.sum()), "near_edges": edges})
    stop_point("bucket", bucket)
    return int(dup.sum())


def near_edges(tokenized: Path, out: Path, n_units: int, n_buckets: int, bucket: int,
               minhash: MinHashConfig) -> int:  # fmt: skip
    """The bucket's near-duplicate edges over every unit's `nkeys` (quality/near.py's groups;
    documents numbered unit << 32 | document, which is plan order), written as
    `out/bucket_B.near`: (member, representative) uint64 pairs. Returns how many."""
    keys, ids = [], []
    for u in range(n_units):
        k, d = _slice(tokenized / f"unit_{u:06d}.bin", n_buckets, bucket, _U32, in_unit="nkeys")
        keys.append(k)
        ids.append((np.uint64(u) << np.uint64(32)) | d.astype(np.uint64))
    member, rep = group_edges(np.concatenate(keys) if keys else np.zeros(0, _U64),
                              np.concatenate(ids) if ids else np.zeros(0, _U64),
                              lambda want: unit_signatures(tokenized, want, minhash.n_hashes), minhash)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / f"bucket_{bucket:06d}.near", np.stack([member, rep], axis=1).astype(_U64).tobytes())
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
                out[row] = np.frombuffer(_pread(fd, width, at + d * width), dtype="<u4")
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


def unit_duplicates(dedup: Path, n_units: int, n_buckets: int, u: int, n_docs: int) -> np.ndarray:
    """A bool per document of unit `u`: True where some bucket found it repeats an earlier one."""
    dup = np.zeros(n_docs, dtype=bool)
    for b in range(n_buckets):
        (docs,) = _slice(dedup / f"bucket_{b:06d}.dups", n_units, u)
        dup[docs.astype(np.int64)] = True
    return dup


def buckets_of(n_buckets: int, n_tasks: int, task: int) -> range:
    """Task `task`'s buckets: a contiguous share (empty for some tasks when buckets < tasks)."""
    return range(task * n_buckets // n_tasks, (task + 1) * n_buckets // n_tasks)
