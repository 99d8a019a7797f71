"""Where rows lie in a remote split's blocks, worked out once for several steps at a time: when
a stream announces them (so that their blocks are fetched ahead), and used again, step by step,
when it reads them.

Blocks are numbered across the split, shard after shard, so the blocks of a row are the
numbers from its first token's block to its last token's, even across a shard boundary. A row
touches one block or two ("crossing") when it is at most a block long; such a row is gathered
with the others by one fancy index over the pool's row view, and a crossing row's tail is then
copied in from its second block's slot, unless that slot happens to follow the first (the view
then holds it already). A plan whose rows touch more blocks is read piece by piece.

Memory model: per row a few int64 (first block, offset in it, length); per plan its distinct
blocks.
"""

from __future__ import annotations

import numpy as np

from ...format import TOKEN_DTYPE
from .blockpool import BlockPool


class Geometry:
    """The block layout of a split: `starts` (each shard's first token, then the total), `sizes`,
    `base` (each shard's first block, then the total) and `block_tokens`."""

    def __init__(self, starts: np.ndarray, sizes: np.ndarray, base: np.ndarray, block_tokens: int) -> None:
        self.starts, self.sizes, self.base, self.block_tokens = starts, sizes, base, block_tokens
        self.single = len(sizes) == 1
        short = sizes % block_tokens
        self.smallest = min([block_tokens, *short[short > 0].tolist()])  # the shortest block's tokens

    def block_of(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(block, its shard, offset within the block) of each token offset."""
        if self.single:
            b, within = np.divmod(offsets, self.block_tokens)
            return b, np.zeros(len(offsets), dtype=np.int64), within
        k = np.searchsorted(self.starts, offsets, side="right") - 1
        b, within = np.divmod(offsets - self.starts[k], self.block_tokens)
        return self.base[k] + b, k, within

    def spans(self, starts: np.ndarray, lengths: np.ndarray | int) -> np.ndarray:
        """The distinct blocks that spans of `lengths` tokens at `starts` touch, sorted."""
        first, _, _ = self.block_of(starts)
        last, _, _ = self.block_of(starts + np.maximum(np.asarray(lengths, dtype=np.int64), 1) - 1)
        if not len(first) or int((last - first).max()) <= 1:
            return distinct(np.concatenate([first, last]))
        counts = last - first + 1
        ends = np.cumsum(counts)
        return distinct(np.repeat(first - (ends - counts), counts) + np.arange(int(ends[-1])))


def distinct(blocks: np.ndarray) -> np.ndarray:
    """Sorted distinct values: for a few hundred, a sort costs less than np.unique's hashing."""
    both = np.sort(blocks)
    return both[np.concatenate([[True], both[1:] != both[:-1]])]


class RowPlan:
    """Rows at `offsets`, `lengths` tokens each, in parts (a part: the rows of one step, all of
    one length; `bounds` gives each part's first row and, last, the total): their distinct blocks
    (`need`) and where each row starts in them."""

    def __init__(self, geometry: Geometry, offsets: np.ndarray, lengths: np.ndarray, bounds: list[int]) -> None:
        self.offsets, self.lengths, self.bounds = offsets, lengths, bounds
        g0, k0, self.within = geometry.block_of(offsets)
        # The row's tokens in its first block: up to the block's end or the shard's, if sooner.
        head = np.minimum(geometry.block_tokens - self.within, geometry.starts[k0 + 1] - offsets)
        cross = np.flatnonzero(head < lengths)
        rest = (lengths - head)[cross]
        self.simple = not len(cross) or int(rest.max()) <= geometry.smallest
        if not self.simple:  # a long row, or one that runs into a short block: do they reach a third?
            g1, _, _ = geometry.block_of(offsets[cross] + lengths[cross] - 1)
            self.simple = bool((g1 == g0[cross] + 1).all())
        self.need = distinct(np.concatenate([g0, g0[cross] + 1])) if self.simple else geometry.spans(offsets, lengths)
        self.blocks = self.need.tolist()
        self.at0 = np.searchsorted(self.need, g0)
        # Crossing rows by part: (row within its part, its second block's place in `need`, head).
        self.tails: list[list[tuple[int, int, int]]] = [[] for _ in bounds[:-1]]
        part = np.searchsorted(bounds, cross, side="right") - 1
        for r, p, i1, h in zip(cross.tolist(), part.tolist(), (self.at0[cross] + 1).tolist(), head[cross].tolist(),
                               strict=True):  # fmt: skip
            self.tails[p].append((r - bounds[p], i1, h))

    @classmethod
    def of(cls, geometry: Geometry, offsets: np.ndarray, length: int) -> RowPlan:
        """One part: rows of one length."""
        return cls(geometry, offsets, np.full(len(offsets), length, dtype=np.int64), [0, len(offsets)])

    def matches(self, part: int, offsets: np.ndarray, length: int) -> bool:
        lo, hi = self.bounds[part], self.bounds[part + 1]
        if hi - lo != len(offsets) or (hi > lo and int(self.lengths[lo]) != length):
            return False
        return self.offsets[lo:hi].tobytes() == offsets.tobytes()  # int64 both: cheaper than array_equal

    def gather(self, part: int, slots: np.ndarray, pool: BlockPool, out: np.ndarray | None) -> np.ndarray:
        """A part's rows from pool slots (`slots[i]` holds block need[i]): one fancy index over
        the pool's row view, then the tails of crossing rows whose second block is not in the next
        slot. Plans with `simple` set only."""
        lo, hi = self.bounds[part], self.bounds[part + 1]
        length, bt = int(self.lengths[lo]), pool.block_tokens
        s0 = slots[self.at0[lo:hi]]
        within = self.within[lo:hi]
        rows = pool.rows(length)[s0 * bt + within]
        if out is not None:
            out[...] = rows
            rows = out
        arena = pool.arena
        for r, i1, head in self.tails[part]:
            s1 = int(slots[i1])
            if s1 != int(s0[r]) + 1 or head != bt - int(within[r]):
                rows[r, head:] = arena[s1 * bt : s1 * bt + length - head]
        return rows


def new_rows(n: int, length: int, scratch: np.ndarray | None) -> np.ndarray:
    """[n, length] uint32 in `scratch` when it is large enough, else a new array."""
    if scratch is not None and len(scratch) >= n * length:
        return scratch[: n * length].reshape(n, length)
    return np.empty((n, length), dtype=TOKEN_DTYPE)
