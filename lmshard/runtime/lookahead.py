"""Exact prefetch, the stream's side: every stream's rows are a pure function of (seed, step,
rank), so before it serves step s it tells its store what steps s .. s + k·stride will read
(`store.announce`), and after it releases s. `stride` is the number of DataLoader workers: worker
w serves steps w, w + W, ...; each worker process has its own store.

The store decides k (`store.lookahead`): 0 for local files, where nothing is announced at all.
A stream that jumps (set_epoch, load_state_dict, a different worker stride) releases what it
announced and starts again from the step it is asked for. A step whose read failed stays
announced, so asking for it again finds it still pinned.

Memory model: the announced step numbers (k of them); the store holds their blocks.
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

_owners = itertools.count(1)
Reads = Callable[[int], tuple[np.ndarray, "np.ndarray | int"]]  # step -> (starts, lengths) it reads


class Lookahead:
    def __init__(self, store: Any, reads: Reads) -> None:
        self.store, self.reads = store, reads
        self.depth = int(getattr(store, "lookahead", 0))
        self._begin()

    def _begin(self) -> None:
        self._pid, self._owner = os.getpid(), next(_owners)
        self._held: deque[int] = deque()
        self._next: int | None = None
        self._stride = 1
        if self.depth:  # a stream dropped mid-run gives its steps back
            self._finalizer = weakref.finalize(self, self.store.release_owner, self._owner)

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store, "reads": self.reads, "depth": self.depth}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._begin()

    def before(self, step: int, stride: int = 1) -> None:
        """Announce the steps up to step + depth·stride not announced yet."""
        if not self.depth:
            return
        if self._pid != os.getpid():  # forked: the parent's announcements are the parent's
            self._begin()
        expected = self._held[0] if self._held else self._next
        if expected != step or stride != self._stride:
            self.reset()
            self._next, self._stride = step, stride
        assert self._next is not None
        while self._next <= step + self.depth * stride:
            starts, lengths = self.reads(self._next)
            self.store.announce((self._owner, self._next), starts, lengths)
            self._held.append(self._next)
            self._next += stride

    def after(self, step: int) -> None:
        """Step `step` was served: release it (and any earlier one still held)."""
        while self._held and self._held[0] <= step:
            self.store.release((self._owner, self._held.popleft()))

    def reset(self) -> None:
        if self._held:
            self.store.release_owner(self._owner)
        self._held.clear()
        self._next = None
