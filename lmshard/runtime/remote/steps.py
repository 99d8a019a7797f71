"""The bookkeeping of blockfetch.py's fetches and announced steps.

Memory model: an event per fetch in flight; per announced step its block numbers and the slot
pinned for each (8 + 8 bytes per block).
"""

from __future__ import annotations

import threading

import numpy as np

from .blockpool import BlockPool


class Fetch:
    """Blocks being fetched by one thread: the others wait on `done`."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class Step:
    """Announced steps: their blocks, the slot pinned for each so far (-1: not yet), and all of
    them once every block is pinned."""

    __slots__ = ("blocks", "slots", "held", "live")

    def __init__(self, blocks: list[int]) -> None:
        self.blocks, self.live = blocks, True
        self.slots = np.full(len(blocks), -1, dtype=np.int64)
        self.held: np.ndarray | None = None

    def pin(self, pool: BlockPool) -> None:
        """(lock held) Pin the step's blocks the pool holds now and were not pinned for it yet."""
        found = np.array(pool.lookup(self.blocks), dtype=np.int64)
        new = (self.slots < 0) & (found >= 0)
        pool.pin(found[new])
        self.slots[new] = found[new]
        if (self.slots >= 0).all():
            self.held = self.slots
