"""Near-duplicate clusters in one process: the connected components of the edges, each document
labelled with the least id of its cluster (the first in plan order, which survives).

1. **Compact numbers** (`_compact`). Each distinct id of the 2m ends gets its rank, so the rest
   works on int32 numbers 0..n-1 in the ids' order. Ids unit << 32 | document pack with their
   position into one uint64 (high word less the least, low word, position), and one `np.sort`
   of those gives both the sorted ids and the order; other ids take an argsort of each side
   (none for a side already sorted) and a merge of the two runs.
2. **Hook, jump, contract** (`_roots`), in rounds over the edges still joining two trees:
   - every root hooks onto the least root it has an edge to (`np.minimum.at`), so each node's
     parent is less than itself and a tree's root is its least member;
   - pointer jumping over the hooked roots only, until each points at its tree's root (a node
     leaves the loop once its parent is a root: a chain of length L costs L log L, a star one step);
   - each edge is renamed to the roots of its ends, and the edges inside one tree are dropped.
   A root that hooks nowhere is the least of its neighbours, each of which hooks onto it or onto
   a lesser root that it hooks onto in the next round; so after two rounds every tree left holds
   two trees of before, and there are at most 2 log2(n) + 1 rounds. On near-duplicate clusters
   (a forest, nearly) the edges left shrink each round, and the first round is most of the work.
3. Nodes hooked in earlier rounds point at a root of their round; one last jump over every
   hooked node (about log2 of the number of rounds) gives each its cluster's least member.

Cost: one sort of the 2m ends and a handful of passes over the edges and the nodes, most of them
reads at random places; measured in docs/performance.md (scripts/bench_near_clusters.py): 1 M
edges shaped like near-duplicate clusters in about 0.15 s of a core, 4 M in about 0.75 s.

Memory model: beyond the caller's edges (16 bytes each), the peak is in step 1: the 2m ends and
their packed keys (16 bytes per edge each), the order (16, int64), a flag per end, the distinct
ids (8 bytes per node, about 1.3 nodes per edge) and the int32 numbers (8): 54 bytes per
distinct edge measured by tracemalloc at 1 M and 4 M edges, 54–60 as the rise of the peak RSS.
The rounds after it hold less (int32 ends, 4 bytes per node of parents).
"""

from __future__ import annotations

import numpy as np

_HIGH = np.uint64(32)  # an id's high word: a planned run's unit
_LOW = np.uint64(0xFFFFFFFF)  # its low word: the document in the unit


def components(child: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(removed, survivor): every document joined by the edges to an earlier one (sorted ids),
    and the first document (least id) of its cluster. An edge is a pair of ids in any order;
    repeated edges and self-loops change nothing."""
    nodes, root = _clusters(child, parent)
    removed = np.flatnonzero(root != np.arange(len(root), dtype=root.dtype))
    return nodes[removed], nodes[root[removed]]


def least_labels(child: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, least): every id that ends an edge (sorted, distinct) and the least id of its
    cluster (itself for a survivor)."""
    nodes, root = _clusters(child, parent)
    return nodes, nodes[root]


def _clusters(child: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, root): the sorted distinct ids, and per node the compact number of its cluster's
    least member."""
    child = np.asarray(child, dtype=np.uint64).ravel()
    parent = np.asarray(parent, dtype=np.uint64).ravel()
    if len(child) != len(parent):
        raise ValueError(f"{len(child)} children for {len(parent)} parents")
    nodes, ends = _compact(child, parent)
    m = len(child)
    return nodes, _roots(ends[:m], ends[m:], len(nodes))


def _compact(child: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, numbers): the distinct ids of the edges' ends sorted, and the rank among them of
    each end, children first (int32 below 2^31 nodes)."""
    ends = np.concatenate([child, parent])
    layout = _layout(ends)
    order, keys = _sort_packed(ends, layout) if layout else _sort_merged(child, parent)
    del ends
    first = np.empty(len(keys), dtype=bool)
    first[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    distinct = keys[first]
    del keys
    nodes = _unpack(distinct, layout) if layout else distinct
    kind = np.int32 if len(nodes) < 2**31 else np.int64
    rank = np.cumsum(first, dtype=kind)
    np.subtract(rank, 1, out=rank)
    del first
    numbers = np.empty(len(order), dtype=kind)
    numbers[order] = rank
    return nodes, numbers


def _layout(ends: np.ndarray) -> tuple[int, int, int] | None:
    """(low bits, index bits, least high word) when every id packs with its position into 64
    bits, order kept: its high word less the least, its low word, its position. Ids unit << 32 |
    document do, below about 2^64 / (documents per unit × ends): then one np.sort of uint64
    does what an argsort would, at a fraction of the cost."""
    if not len(ends):
        return None
    index_bits = max(1, (len(ends) - 1).bit_length())
    high = ends >> _HIGH
    base, top = int(high.min()), int(high.max())
    del high
    low_bits = int((ends & _LOW).max()).bit_length()
    return (low_bits, index_bits, base) if (top - base).bit_length() + low_bits + index_bits <= 64 else None


def _sort_packed(ends: np.ndarray, layout: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(order, keys): the argsort of `ends` and their sorted packed keys (see `_layout`).
    Overwrites `ends`."""
    low_bits, index_bits, base = layout
    packed = np.arange(len(ends), dtype=np.uint64)
    high = ends >> _HIGH
    high -= np.uint64(base)
    high <<= np.uint64(low_bits + index_bits)
    packed |= high
    del high
    ends &= _LOW
    ends <<= np.uint64(index_bits)
    packed |= ends
    packed.sort()
    order = (packed & np.uint64((1 << index_bits) - 1)).view(np.int64)
    packed >>= np.uint64(index_bits)
    return order, packed


def _unpack(keys: np.ndarray, layout: tuple[int, int, int]) -> np.ndarray:
    low_bits, _, base = layout
    ids = keys >> np.uint64(low_bits)
    ids += np.uint64(base)
    ids <<= _HIGH
    ids |= keys & np.uint64((1 << low_bits) - 1)
    return ids


def _sort_merged(child: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, sorted ends) for any ids: each side sorted unless it is already (edges as
    `unique_edges` gives them are sorted by child), then the two runs merged."""
    m = len(child)
    order_c, order_p = _order(child), _order(parent)
    runs = np.concatenate([child if order_c is None else child[order_c],
                           parent if order_p is None else parent[order_p]])  # fmt: skip
    merged = np.argsort(runs, kind="stable")  # two sorted runs: one linear merge
    source = np.concatenate([np.arange(m) if order_c is None else order_c,
                             (np.arange(m) if order_p is None else order_p) + m])  # fmt: skip
    return source[merged], runs[merged]


def _order(ids: np.ndarray) -> np.ndarray | None:
    """The argsort of `ids`, or None when they are sorted already."""
    return None if bool((ids[1:] >= ids[:-1]).all()) else np.argsort(ids)


def _roots(a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    """Per node 0..n-1, the least node joined to it by the edges (a, b) (see the module docstring)."""
    root = np.arange(n, dtype=a.dtype)
    hi, lo = np.maximum(a, b), np.minimum(a, b)
    while True:
        live = hi != lo  # edges inside one tree are done
        hi, lo = hi[live], lo[live]
        if not len(hi):
            break
        np.minimum.at(root, hi, lo)  # each root hooks onto the least root it has an edge to
        _jump(root, hi)
        a, b = root[hi], root[lo]
        hi, lo = np.maximum(a, b), np.minimum(a, b)
        del a, b
    hooked = np.flatnonzero(root != np.arange(n, dtype=root.dtype)).astype(root.dtype)  # (a root stays one)
    _jump(root, hooked)
    return root


def _jump(root: np.ndarray, at: np.ndarray) -> None:
    """Point each node of `at` at the root of its tree; a node leaves once its parent is a root."""
    up = root[at]
    while len(at):
        higher = root[up]
        moved = higher != up
        at, up = at[moved], higher[moved]
        root[at] = up
