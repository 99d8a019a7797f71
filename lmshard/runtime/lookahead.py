"""Exact prefetch, the stream's side: every stream's rows are a pure function of (seed, step,
rank), so before it serves step s it tells its store what the steps up to s + k·stride will read
(`store.announce`), a chunk of up to k steps at a time (`store.chunk_steps`: fewer when the
store's memory holds few steps), and it releases a chunk once its last step is served. `stride`
is the number of DataLoader workers: worker w serves steps w, w + W, ...; each worker process
has its own store.

The store decides k (`store.lookahead`): 0 for local files, where nothing is announced at all.
A stream that jumps (set_epoch, load_state_dict, another worker stride) releases what it
announced and starts again from the step it is asked for. A step whose read failed stays
announced, so asking for it again finds it still there.

Memory model: the announced step numbers (up to 2k of them); the store holds their blocks.
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
        self._chunks: deque[list[int]] = deque()  # announced, not yet all served: their steps
        self._next = self._expect = -1  # the next step to announce, and to be served
        self._stride = 1
        if self.depth:  # a stream dropped mid-run gives its steps back (release_owner takes no lock)
            self._finalizer = weakref.finalize(self, self.store.release_owner, self._owner)

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store, "reads": self.reads, "depth": self.depth}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._begin()

    def before(self, step: int, stride: int = 1) -> None:
        """Announce, a chunk at a time, the steps up to step + depth·stride not announced yet."""
        if not self.depth:
            return
        if self._pid != os.getpid():  # forked: the parent's announcements are the parent's
            self._begin()
        if step != self._expect or stride != self._stride:
            self.reset()
            self._next, self._expect, self._stride = step, step, stride
        while self._next <= step + self.depth * stride:
            chunk = max(1, min(self.depth, int(getattr(self.store, "chunk_steps", self.depth))))
            if self._next == step:  # the step asked for now alone: fetched first, not after a whole chunk
                chunk = 1
            steps = [self._next + i * stride for i in range(chunk)]
            self.store.announce((self._owner, steps[0]), [self.reads(s) for s in steps])
            self._chunks.append(steps)
            self._next = steps[-1] + stride

    def key(self, step: int) -> Any:
        """(the key of the chunk `step` was announced in, its place in it), or None: a store may
        keep what it worked out for the chunk."""
        if self._chunks and step in self._chunks[0]:
            return (self._owner, self._chunks[0][0]), self._chunks[0].index(step)
        return None

    def after(self, step: int) -> None:
        """Step `step` was served: release the chunks it completes."""
        self._expect = step + self._stride
        while self._chunks and self._chunks[0][-1] <= step:
            self.store.release((self._owner, self._chunks.popleft()[0]))

    def reset(self) -> None:
        if self._chunks:
            self.store.release_owner(self._owner)
        self._chunks.clear()
        self._next = self._expect = -1
