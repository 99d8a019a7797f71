"""Packing plans: which documents go into which fixed-length row, decided from the document
lengths alone (the per-shard document index), never from the tokens.

A plan is a pure function of (document lengths, seq_len, strategy, overlong policy, multiple):

- *items*: documents longer than seq_len are first cut (`overlong="split"`: seq_len pieces and a
  remainder), cut short (`"truncate"`) or left out (`"drop"`), all counted; every item then fits
  one pack.
- *strategies*: `bfd` (best-fit decreasing over every item of the split: each item, longest
  first, goes into the open pack it fills most tightly); `first_fit` (first-fit decreasing: the
  oldest open pack with room); `window_N` (first-fit decreasing inside consecutive windows of N
  items in input order, the bounded-memory variant the LMMS-Engine design offers, e.g.
  `window_1000`); `greedy` (next-fit in input order: a pack is closed as soon as the next item
  does not fit, as streaming packers do).
- *multiple*: the pack count is raised to a multiple of this (world size × batch size) by moving
  one small item out of each of a few packs into new packs, so every rank gets the same number of
  steps without dropping or repeating anything.

`bfd` runs over runs of equal length, not over documents: open packs are kept in groups by the
room they have left (0..seq_len), and a run of c items of length L goes into the group with the
least room that still fits L, each pack of that group taking as many as fit before the next
group is tried. Its cost grows with the number of distinct (length, room) pairs visited, so
tens of millions of lengths plan in seconds. `first_fit` and `window_N` walk the items one by one
over a max-tree of the packs' room (O(log packs) each, a Python loop: a few µs per item);
`greedy` is one Python pass.

Memory model: per item 8 (start) + 4 (length) + 8 (pack) bytes plus the sort order (8), per
pack 8 bytes of CSR offsets; nothing per document besides numpy arrays.
"""

from __future__ import annotations

import bisect
import math
import reprlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ArgumentError

STRATEGIES = ("bfd", "first_fit", "window_N", "greedy")
OVERLONG = ("split", "truncate", "drop")
DEFAULT_WINDOW = 1000
ALL_STRATEGIES = ("bfd", "first_fit", f"window_{DEFAULT_WINDOW}", "greedy")


def _show(value: object) -> str:
    return reprlib.repr(value)


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ArgumentError(f"{name}={_show(value)} must be a positive int; pass {name}=1 or more")
    return int(value)


def parse_strategy(strategy: object) -> tuple[str, int]:
    """("bfd" | "first_fit" | "greedy", 0) or ("window", N) from "window_N"."""
    if isinstance(strategy, str):
        if strategy in ("bfd", "first_fit", "greedy"):
            return strategy, 0
        if strategy.startswith("window_"):
            n = strategy[len("window_") :]
            if n.isdigit() and int(n) > 0:
                return "window", int(n)
    raise ArgumentError(f"strategy={_show(strategy)} is not a packing strategy; pass 'bfd' (the default), "
                        f"'first_fit', 'window_{DEFAULT_WINDOW}' (any window of N items) or 'greedy'")  # fmt: skip


@dataclass
class Items:
    """The packing items of a split: where each starts in the split's token stream, how long it
    is, and what the overlong policy did (counts)."""

    start: np.ndarray  # int64
    length: np.ndarray  # int64, each in [1, seq_len]
    docs: int
    tokens: int
    split_docs: int = 0
    split_pieces: int = 0
    truncated_docs: int = 0
    truncated_tokens: int = 0
    dropped_docs: int = 0
    dropped_tokens: int = 0


def make_items(lengths: np.ndarray, seq_len: int, overlong: str = "split") -> Items:
    """Items from document lengths (in stream order) under the overlong policy."""
    seq_len = _positive("seq_len", seq_len)
    if overlong not in OVERLONG:
        raise ArgumentError(f"overlong={_show(overlong)} is not a policy; pass 'split' (the default), "
                            "'truncate' or 'drop'")  # fmt: skip
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1 or (lengths <= 0).any():
        raise ArgumentError("document lengths must be a one-dimensional array of positive integers")
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    long = lengths > seq_len
    n_long = int(long.sum())
    items = Items(starts, lengths.copy(), docs=len(lengths), tokens=int(lengths.sum()))
    if not n_long:
        return items
    excess = int((lengths[long] - seq_len).sum())
    if overlong == "truncate":
        items.length[long] = seq_len
        items.truncated_docs, items.truncated_tokens = n_long, excess
    elif overlong == "drop":
        keep = ~long
        items.start, items.length = starts[keep], lengths[keep]
        items.dropped_docs, items.dropped_tokens = n_long, int(lengths[long].sum())
    else:  # split: piece j of a document starts at j·seq_len inside it
        pieces = -(-lengths // seq_len)  # ceil
        total = int(pieces.sum())
        owner = np.repeat(np.arange(len(lengths)), pieces)
        first = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(pieces[:-1], out=first[1:])
        j = np.arange(total, dtype=np.int64) - first[owner]
        items.start = starts[owner] + j * seq_len
        items.length = np.minimum(lengths[owner] - j * seq_len, seq_len)
        items.split_docs, items.split_pieces = n_long, int(pieces[long].sum())
    return items


def _bfd(length: np.ndarray, seq_len: int) -> tuple[np.ndarray, int]:
    """Best-fit decreasing: (pack of each item, number of packs). Ties: among packs with the same
    room, the one that reached that room first; items of equal length in input order. (Packs of
    equal room are interchangeable for what follows, so any tie rule gives the same pack count
    and the same fill of every pack, up to order.)"""
    # Longest first, equal lengths in input order; a stable sort of 16-bit keys is a radix sort.
    key = seq_len - length
    order = np.argsort(key.astype(np.uint16) if seq_len < 1 << 16 else key, kind="stable")
    sorted_len = length[order]
    pack_sorted = np.empty(len(length), dtype=np.int64)
    bounds = np.flatnonzero(np.diff(sorted_len)) + 1
    run_starts = np.concatenate([[0], bounds]).astype(np.int64)
    run_ends = np.concatenate([bounds, [len(length)]]).astype(np.int64)
    groups: dict[int, list[np.ndarray]] = {}  # room -> FIFO of pack-id arrays
    rooms: list[int] = []  # sorted rooms that have packs
    n_packs = 0

    def push(room: int, ids: np.ndarray) -> None:
        if room not in groups:
            groups[room] = []
            bisect.insort(rooms, room)
        groups[room].append(ids)

    def pop(room: int, k: int) -> np.ndarray:
        chunks, taken, have = groups[room], [], 0
        while have < k:
            head = chunks[0]
            want = k - have
            if len(head) <= want:
                taken.append(chunks.pop(0))
                have += len(head)
            else:
                taken.append(head[:want])
                chunks[0] = head[want:]
                have = k
        if not chunks:
            del groups[room]
            rooms.pop(bisect.bisect_left(rooms, room))
        return taken[0] if len(taken) == 1 else np.concatenate(taken)

    for a, b in zip(run_starts.tolist(), run_ends.tolist(), strict=True):
        L = int(sorted_len[a])
        pos = a
        while pos < b:
            c = b - pos
            i = bisect.bisect_left(rooms, L)
            if i == len(rooms):  # nothing fits: new packs, each taking as many as fit
                m = seq_len // L
                full, rest = divmod(c, m)
                n_new = full + (1 if rest else 0)
                ids = np.arange(n_packs, n_packs + n_new, dtype=np.int64)
                pack_sorted[pos:b] = n_packs + np.arange(c, dtype=np.int64) // m
                n_packs += n_new
                if full and seq_len - m * L:
                    push(seq_len - m * L, ids[:full])
                if rest:
                    push(seq_len - rest * L, ids[full:])
                pos = b
                break
            room = rooms[i]
            m = room // L  # a pack of this room takes m items before its room drops below L
            have = sum(len(x) for x in groups[room])
            k = min(have, -(-c // m))
            ids = pop(room, k)
            take = min(c, k * m)
            pack_sorted[pos : pos + take] = ids[np.arange(take, dtype=np.int64) // m]
            pos += take
            full, rest = divmod(take, m)
            if full and room - m * L:
                push(room - m * L, ids[:full])
            if rest:
                push(room - rest * L, ids[full:])
    pack = np.empty(len(length), dtype=np.int64)
    pack[order] = pack_sorted
    return pack, n_packs


def _first_fit(length: np.ndarray, seq_len: int, window: int = 0) -> tuple[np.ndarray, int]:
    """First-fit decreasing (over all items, or inside consecutive windows of `window` items):
    a max-tree over the packs' room finds the oldest pack with room in O(log packs)."""
    n = len(length)
    pack = np.empty(n, dtype=np.int64)
    n_packs = 0
    span = window or n
    for w0 in range(0, n, span):
        part = length[w0 : w0 + span]
        order = np.argsort(-part, kind="stable")
        size = 1
        while size < len(part):
            size *= 2
        tree = [0] * (2 * size)  # room of each pack; unused leaves have room 0
        used = 0
        got = [0] * len(part)
        for j, L in zip(order.tolist(), part[order].tolist(), strict=True):
            if tree[1] >= L:
                node = 1
                while node < size:
                    node = 2 * node if tree[2 * node] >= L else 2 * node + 1
                leaf = node - size
            else:
                leaf, used = used, used + 1
                node = leaf + size
                tree[node] = seq_len
            tree[node] -= L
            node //= 2
            while node:
                tree[node] = max(tree[2 * node], tree[2 * node + 1])
                node //= 2
            got[j] = leaf
        pack[w0 : w0 + span] = np.asarray(got, dtype=np.int64) + n_packs
        n_packs += used
    return pack, n_packs


def _greedy(length: np.ndarray, seq_len: int) -> tuple[np.ndarray, int]:
    """Next-fit in input order."""
    got, p, room = [0] * len(length), -1, 0
    for j, L in enumerate(length.tolist()):
        if room < L:
            p, room = p + 1, seq_len
        room -= L
        got[j] = p
    return np.asarray(got, dtype=np.int64), p + 1


def _balance(length: np.ndarray, pack: np.ndarray, n_packs: int, multiple: int) -> tuple[np.ndarray, int]:
    """Raise the pack count to a multiple of `multiple` by moving small items into packs of their
    own: the smallest item of each of the packs holding the most items, and, when fewer packs
    hold two or more items than packs are needed, the next smallest ones too. Every donor keeps
    at least one item; only when there are fewer items than packs needed is it an error."""
    extra = -n_packs % multiple
    if not extra:
        return pack, n_packs
    if len(length) < n_packs + extra:
        raise ArgumentError(f"{len(length)} items fill {n_packs} packs, and {n_packs + extra} are needed to give every "
                            f"rank the same steps (a multiple of {multiple}); lower world_size × batch_size or "
                            "seq_len")  # fmt: skip
    counts = np.bincount(pack, minlength=n_packs)
    chosen = np.argsort(-counts, kind="stable")[:extra]  # the packs holding the most items (ties: lower id)
    if len(chosen) == extra and (counts[chosen] >= 2).all():
        where = np.flatnonzero(np.isin(pack, chosen))
        by = where[np.lexsort((where, length[where], pack[where]))]  # per pack: smallest item, then input order
        moved = by[np.concatenate([[True], pack[by][1:] != pack[by][:-1]])]
    else:  # few packs to take from: rank every item inside its pack, smallest first
        by = np.lexsort((np.arange(len(length)), length, pack))
        first = np.repeat(np.cumsum(counts) - counts, counts)
        rank = np.empty(len(length), dtype=np.int64)
        rank[by] = np.arange(len(length)) - first
        spare = np.flatnonzero(rank < counts[pack] - 1)  # a pack keeps its largest item
        moved = spare[np.lexsort((spare, -counts[pack[spare]], rank[spare]))][:extra]
    pack = pack.copy()
    pack[moved] = n_packs + np.arange(extra, dtype=np.int64)
    return pack, n_packs + extra


@dataclass
class PackPlan:
    """A packing plan: pack p holds items `ptr[p]:ptr[p+1]` of `start`/`length`, in input order inside the
    pack; item i covers tokens [start[i], start[i] + length[i]) of the split's stream."""

    seq_len: int
    strategy: str
    overlong: str
    multiple: int
    start: np.ndarray
    length: np.ndarray
    ptr: np.ndarray
    items: Items = field(repr=False)

    @property
    def n_packs(self) -> int:
        return len(self.ptr) - 1

    def pack_items(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        """(starts, lengths) of pack p's items."""
        a, b = int(self.ptr[p]), int(self.ptr[p + 1])
        return self.start[a:b], self.length[a:b]

    def metrics(self, world_size: int = 1, batch_size: int = 1) -> dict[str, Any]:
        """Fill, the lower bound and its gap, what the overlong policy did, documents per pack and
        steps per rank, as one JSON-able dict."""
        real = int(self.length.sum())
        lower = math.ceil(real / self.seq_len) if real else 0
        per_pack = np.diff(self.ptr)
        it = self.items
        g = world_size * batch_size
        return {
            "strategy": self.strategy,
            "seq_len": self.seq_len,
            "packs": self.n_packs,
            "lower_bound": lower,
            "gap_to_lower_bound": (self.n_packs - lower) / lower if lower else 0.0,
            "capacity": self.n_packs * self.seq_len,
            "tokens": real,
            "fill": real / (self.n_packs * self.seq_len) if self.n_packs else 0.0,
            "documents": it.docs,
            "items": len(self.length),
            "items_per_pack_mean": float(per_pack.mean()) if len(per_pack) else 0.0,
            "items_per_pack_max": int(per_pack.max()) if len(per_pack) else 0,
            "overlong": self.overlong,
            "split_documents": it.split_docs,
            "split_pieces": it.split_pieces,
            "truncated_documents": it.truncated_docs,
            "truncated_tokens": it.truncated_tokens,
            "dropped_documents": it.dropped_docs,
            "dropped_tokens": it.dropped_tokens,
            "world_size": world_size,
            "batch_size": batch_size,
            "steps_per_rank": self.n_packs // g,
            "packs_left_over": self.n_packs % g,
        }


def plan(lengths: np.ndarray, seq_len: int, strategy: str = "bfd", overlong: str = "split",
         multiple: int = 1) -> PackPlan:  # fmt: skip
    """Plan packs for documents of these lengths (stream order). Deterministic: no randomness at
    all (the pack order is shuffled by whoever reads the plan)."""
    kind, window = parse_strategy(strategy)
    multiple = _positive("multiple", multiple)
    items = make_items(lengths, seq_len, overlong)
    if len(items.length) == 0:
        raise ArgumentError(f"no document is left to pack at seq_len={seq_len} with overlong={overlong!r}; "
                            "pass overlong='split' or a larger seq_len")  # fmt: skip
    if kind == "bfd":
        pack, n = _bfd(items.length, seq_len)
    elif kind == "greedy":
        pack, n = _greedy(items.length, seq_len)
    else:
        pack, n = _first_fit(items.length, seq_len, window)
    pack, n = _balance(items.length, pack, n, multiple)
    order = np.argsort(pack, kind="stable")  # input order inside each pack
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pack, minlength=n), out=ptr[1:])
    return PackPlan(seq_len, strategy, overlong, multiple, items.start[order], items.length[order], ptr, items)


def compare(lengths: np.ndarray, seq_len: int, strategies: tuple[str, ...] = ALL_STRATEGIES,
            overlong: str = "split", world_size: int = 1, batch_size: int = 1) -> list[dict[str, Any]]:  # fmt: skip
    """`metrics` of every strategy side by side, each planned with its pack count raised to a
    multiple of world_size × batch_size as the packed stream plans it (what `inspect --packing`
    reports)."""
    g = _positive("world_size", world_size) * _positive("batch_size", batch_size)
    return [plan(lengths, seq_len, s, overlong, multiple=g).metrics(world_size, batch_size) for s in strategies]
