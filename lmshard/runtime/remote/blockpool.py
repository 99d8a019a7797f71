"""The in-memory pool of a remote split's verified, decoded blocks: a fixed arena of slots of
`block_tokens` uint32 tokens (64 KiB at 16,384 tokens; smaller for zstd's blocks).

A slot holds one checksum block as uint32 tokens, whatever the encoding it was stored in (the
last block of a shard may be shorter). `where` maps a block (its number in the split, shards in
order) to its slot. A slot is *pinned* while a reader copies from it or while a step that was
announced and not yet served needs it, and *busy* while a fetch fills it; neither kind is ever
evicted. Other slots are evicted by the clock algorithm (a slot read since the hand last passed
gets a second chance).

Every method is called with the owner's lock held (`blockfetch.Blocks`). Copying out of a pinned
slot needs no lock; a reader that did not pin checks `evictions` after its copy (a slot is only
ever refilled after an eviction that bumped it) and reads again pinned if it moved.

Memory model: the arena, `limit` bytes rounded down to whole slots and one slot of slack,
allocated lazily by the OS (untouched pages cost nothing), plus 14 bytes per slot of
bookkeeping and one dict entry per resident block. Nothing grows with the dataset.
"""

from __future__ import annotations

import numpy as np

from ...format import TOKEN_DTYPE


class BlockPool:
    def __init__(self, limit: int, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.n = max(0, limit // (block_tokens * TOKEN_DTYPE.itemsize))
        # One block of slack after the last slot: a row that runs on out of a slot is read whole
        # by the row view and its tail copied in afterwards (RemoteStore._rows).
        self.arena = np.empty((self.n + 1) * block_tokens if self.n else 0, dtype=TOKEN_DTYPE)
        self.owner = np.full(self.n, -1, dtype=np.int64)  # the block a slot holds (or is being filled with)
        self.pins = np.zeros(self.n, dtype=np.int32)
        self.busy = np.zeros(self.n, dtype=bool)
        self.used = np.zeros(self.n, dtype=bool)  # read since the clock hand last passed
        self.where: dict[int, int] = {}  # resident block -> slot
        self.hand = 0
        self.evictions = 0  # bumped before an evicted slot is refilled: a reader that did not pin checks it
        self._free = list(range(self.n - 1, -1, -1))
        self._views: dict[int, np.ndarray] = {}

    def lookup(self, blocks: list[int]) -> list[int]:
        """The slot of each block, -1 where it is not resident."""
        get = self.where.get
        return [get(g, -1) for g in blocks]

    def pin(self, slots: np.ndarray) -> None:
        """Keep `slots` (distinct, resident) until `unpin`; they count as read."""
        self.pins[slots] += 1
        self.used[slots] = True

    def unpin(self, slots: np.ndarray) -> None:
        self.pins[slots] -= 1  # distinct slots: no ufunc.at needed

    def reserve(self, blocks: list[int]) -> list[int]:
        """Busy slots for `blocks`, evicting unpinned ones as needed: one per block, or fewer
        when the pool has no more to give (the caller reads the rest outside the pool)."""
        want = len(blocks)
        got = [self._free.pop() for _ in range(min(want, len(self._free)))]
        if len(got) < want:
            got += self._evict(want - len(got)).tolist()
        for g, s in zip(blocks, got, strict=False):
            self.owner[s], self.busy[s] = g, True
        return got

    @property
    def free_count(self) -> int:
        """Slots never used yet."""
        return len(self._free)

    def take_free(self, block: int) -> int:
        """A never-used slot, busy for `block`, or -1 when there is none (nothing is evicted)."""
        if not self._free:
            return -1
        s = self._free.pop()
        self.owner[s], self.busy[s] = block, True
        return s

    def publish(self, block: int, slot: int, pinned: bool) -> None:
        """A busy slot now holds its block's verified tokens."""
        self.busy[slot] = False
        self.where[block] = slot
        if pinned:
            self.pins[slot] += 1
        self.used[slot] = True

    def abandon(self, slot: int) -> None:
        """A busy slot whose fetch failed goes back to the free list."""
        self.busy[slot], self.owner[slot] = False, -1
        self._free.append(slot)

    def _evict(self, count: int) -> np.ndarray:
        """Up to `count` slots taken from resident, unpinned, idle blocks by the clock: those not
        read since the hand last passed first; the hand clears the marks it passes."""
        if count <= 0 or not self.n:
            return np.zeros(0, dtype=np.int64)
        order = (np.arange(self.n) + self.hand) % self.n
        ok = (self.pins[order] == 0) & ~self.busy[order] & (self.owner[order] >= 0)
        cold = ok & ~self.used[order]
        at = np.flatnonzero(cold)[:count]
        if len(at) == count and count:
            passed = order[: at[-1] + 1]
            self.used[passed[ok[: at[-1] + 1]]] = False
            pick = order[at]
        else:  # a full turn: every evictable slot loses its mark, the warm ones are taken too
            self.used[order[ok]] = False
            pick = np.concatenate([order[at], order[ok & ~cold][: count - len(at)]])
        if len(pick):
            self.hand = int(pick[-1] + 1) % self.n
            self.evictions += 1
        for s in pick.tolist():
            del self.where[int(self.owner[s])]
            self.owner[s] = -1
        return pick

    def slot(self, s: int, n: int) -> np.ndarray:
        """The first `n` tokens of slot `s`."""
        at = s * self.block_tokens
        return self.arena[at : at + n]

    def rows(self, length: int) -> np.ndarray:
        """[positions, length] view over the whole arena: row p is arena[p : p + length], so a
        row that lies in one slot (or runs on into the next slot, when that slot holds the next
        block) is gathered by one fancy index, as `span._Span` does over mapped shards."""
        view = self._views.get(length)
        if view is None:
            size = TOKEN_DTYPE.itemsize
            n = max(len(self.arena) - length + 1, 0)
            view = np.lib.stride_tricks.as_strided(self.arena, (n, length), (size, size), writeable=False)
            self._views[length] = view
        return view

    @property
    def free_or_evictable(self) -> int:
        """Slots a reservation could take now."""
        return len(self._free) + int(((self.pins == 0) & ~self.busy & (self.owner >= 0)).sum())
