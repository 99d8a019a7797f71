"""Near-duplicate clusters from MinHash band keys: which documents `--near-dedup` removes, and
which earlier document each one is a near-copy of.

Documents carry ids that grow in plan order (a run's document ordinal, or unit << 32 | document
in a planned run). The decision is made in three steps, each a pure function of the documents'
signatures, so the same documents are removed for any number of workers, tasks or buckets:

1. **Groups** (`group_edges`). Documents that share a band key form a group (a key names its
   band). A group's members are taken in id order; the first is a representative, and each
   next member is checked against the representatives, in order: the first whose signature
   agrees with it on at least `agree_at_least` values gets an edge from it. A member that
   matches none becomes a representative too (at most MAX_REPRESENTATIVES per group; later
   unmatched members get no edge). Each group is decided alone, so a key's group gives the
   same edges whether its keys were gathered band by band (one process) or bucket by bucket
   (a planned run's dedup tasks). Documents without a word (no shingles: a signature of all
   2^32 - 1) share every band key with each other; they are left out of the groups, so none is
   removed as a near-duplicate (exact deduplication still removes equal ones).
2. **Clusters** (`components`, quality/clusters.py). The edges of every group join documents
   into clusters (connected components: rounds in which every root hooks onto the least root it
   has an edge to, pointer jumping flattens the hooked trees, and the edges are renamed to their
   roots, those inside one tree dropped; about linear in the edges). quality/clusterparts.py
   finds the same clusters as tasks over parts of the graph.
3. **Survivors.** The first document of a cluster in plan order (its least id) is kept; every
   other one is removed, with that survivor named.

Memory model: `group_edges` holds its keys and ids (16 bytes each), their sort, and the
signatures of the documents in groups of two or more; `components` holds about 55 bytes per
distinct edge at its peak beyond the edges themselves (quality/clusters.py), and there is about
one distinct edge per near-duplicate document (one to its group's representative, the same in
each band they share); `near_duplicates` also holds one band's keys and order (24 bytes per
document).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .clusters import components as components  # (also imported from here by the dedup stage)
from .minhash import MinHashConfig, band_key
from .sets import distinct

MAX_REPRESENTATIVES = 64  # per group: bounds the checks of a group of unrelated documents that share a key


def group_edges(keys: np.ndarray, ids: np.ndarray, signatures_of: Callable[[np.ndarray], np.ndarray],
                config: MinHashConfig) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(member, representative) id pairs of every group of equal `keys` (see the module
    docstring). `signatures_of(ids)`: the [len(ids), n_hashes] signatures of sorted, distinct ids."""
    keys = np.asarray(keys, dtype=np.uint64)
    ids = np.asarray(ids, dtype=np.uint64)
    wordless = np.isin(keys, empty_keys(config))  # (a real band's key equals one of these once in 2^58)
    keys, ids = keys[~wordless], ids[~wordless]
    order = np.lexsort((ids, keys))
    k, i = keys[order], ids[order]
    if len(k) < 2:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    starts = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
    ends = np.append(starts[1:], len(k))
    big = ends - starts >= 2
    in_group = np.repeat(big, ends - starts)
    starts, ends = starts[big], ends[big]
    if not len(starts):
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    wanted = distinct(i[in_group])
    sigs = np.asarray(signatures_of(wanted))
    need = config.agree_at_least
    members: list[int] = []
    reps_of: list[int] = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        rows = np.searchsorted(wanted, i[a:b])
        reps = [0]
        for m in range(1, b - a):
            agree = (sigs[rows[reps]] == sigs[rows[m]]).sum(axis=1)
            hit = np.flatnonzero(agree >= need)
            if len(hit):
                members.append(int(i[a + m]))
                reps_of.append(int(i[a + reps[int(hit[0])]]))
            elif len(reps) < MAX_REPRESENTATIVES:
                reps.append(m)
    return unique_edges(np.array(members, dtype=np.uint64), np.array(reps_of, dtype=np.uint64))


def unique_edges(member: np.ndarray, rep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (member, representative) pairs, sorted: a pair found in several bands once."""
    if not len(member):
        return member, rep
    order = np.lexsort((rep, member))
    member, rep = member[order], rep[order]
    new = np.empty(len(member), dtype=bool)
    new[:1] = True
    new[1:] = (member[1:] != member[:-1]) | (rep[1:] != rep[:-1])
    return member[new], rep[new]


def empty_keys(config: MinHashConfig) -> np.ndarray:
    """The band keys of a document without a word (every value 2^32 - 1), one per band."""
    rows = np.full((1, config.rows), 0xFFFFFFFF, dtype=np.uint32)
    return np.array([band_key(rows, b)[0] for b in range(config.bands)], dtype=np.uint64)


def near_duplicates(signatures: np.ndarray, config: MinHashConfig, first_new: int = 0,
                    chunk: int = 1 << 16) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(removed, survivor) over documents 0..n-1 in plan order, from their [n, n_hashes]
    signatures (a memory map serves): band by band, each band's keys grouped. Documents before
    `first_new` (a dataset appended to) are never removed. Memory: one band's keys (8 bytes
    per document) and its sort, the grouped documents' signatures, and the edges."""
    n = len(signatures)
    children, parents = [], []
    ids = np.arange(n, dtype=np.uint64)
    for b in range(config.bands):
        band = np.empty(n, dtype=np.uint64)
        for a in range(0, n, chunk):  # a band's keys from its rows, a chunk of documents at a time
            rows = np.asarray(signatures[a : a + chunk, b * config.rows : (b + 1) * config.rows])
            band[a : a + chunk] = band_key(rows, b)
        member, rep = group_edges(band, ids, lambda want: np.asarray(signatures[want.astype(np.int64)]), config)
        children.append(member)
        parents.append(rep)
    edges = unique_edges(np.concatenate(children or [ids[:0]]), np.concatenate(parents or [ids[:0]]))
    removed, survivor = components(*edges)
    new = removed >= np.uint64(first_new)
    return removed[new], survivor[new]
