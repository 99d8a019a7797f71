"""Blocks of a remote split in memory: the pool, the fetches in flight, and the exact prefetch.

`pin(blocks)` makes blocks readable and keeps them until `unpin`: those in the pool are pinned
at once; those another thread is fetching are waited for; the rest are fetched on this thread
(`BlockReader.read`: disk cache, else ranged GETs; checked, and decoded to uint32 whatever the
dataset's encoding). A block the pool has no room for (every slot pinned) is read into memory
of its own for this call, so a reader never waits for room and the pool never deadlocks.

**Exact prefetch** (prefetch.py): streams announce the blocks of their next steps, and a
background thread fetches them into the pool.

After a fork (DataLoader workers) or in an unpickled copy, the pool, the thread and the
connections are built again on first use: nothing is shared between processes but the disk
cache.

Memory model: the pool (`pool_limit` bytes of decoded uint32 tokens, see blockpool.py); beyond
it, the stored bytes of each fetch in flight (a reader's call; a prefetch round, up to the
split's for the first round of a split the pool holds: prefetch.py), and the decoded blocks of
a reader the pool had no room for, for its call.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import FormatError
from .blockpool import BlockPool
from .blockread import BlockReader
from .prefetch import ROUND_TOKENS, Prefetch
from .steps import Fetch


class Blocks(Prefetch):
    """A split's pool of blocks, the fetches in flight and the exact prefetch (`Prefetch`)."""

    def __init__(self, reader: BlockReader, pool_limit: int) -> None:
        self.reader, self.pool_limit = reader, pool_limit
        self._start()

    def _start(self) -> None:
        self._pid = os.getpid()
        self.pool = BlockPool(self.pool_limit, self.reader.block_tokens)
        self.round_blocks = max(1, ROUND_TOKENS // self.reader.block_tokens)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._loading = {}
        self._steps = {}
        self._queue = deque()
        self._ready = deque()
        self._thread = None
        self._rounds = 0
        self._stalled = False
        self._closed = False
        self._rest_tried = False

    def __getstate__(self) -> dict[str, Any]:
        return {"reader": self.reader, "pool_limit": self.pool_limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()

    def _check_process(self) -> None:
        if self._pid != os.getpid():  # a forked child: the parent's threads and sockets are not ours
            self.reader = _rebuilt(self.reader)
            self._start()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._drop_ready()
            self._wake.notify_all()

    # -- reading ---------------------------------------------------------------------------

    def lookup(self, blocks: list[int]) -> tuple[np.ndarray | None, int]:
        """(the slot of every block, or None unless the pool holds them all; the pool's eviction
        count). A reader may copy from these slots without pinning them, then check `moved`."""
        self._check_process()
        with self._lock:
            slots = self.pool.lookup(blocks)
            if min(slots, default=0) < 0:
                return None, 0
            self.pool.used[slots] = True
            return np.array(slots, dtype=np.int64), self.pool.evictions

    def moved(self, evictions: int) -> bool:
        """Whether a slot may have been refilled since `lookup` returned `evictions`."""
        return self.pool.evictions != evictions

    def pin(self, blocks: list[int]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """(slot of each block, -1 for one read outside the pool; {block: tokens} of those)."""
        self._check_process()
        with self._lock:
            slots = self.pool.lookup(blocks)
            if min(slots, default=0) >= 0:
                found = np.array(slots, dtype=np.int64)
                self.pool.pin(found)
                return found, {}
        return self._pin_slow(blocks)

    def unpin(self, slots: np.ndarray) -> None:
        held = slots[slots >= 0]
        if len(held):
            with self._lock:
                self.pool.unpin(held)

    def _pin_slow(self, blocks: list[int]) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        held: dict[int, int] = {}
        outside: dict[int, np.ndarray] = {}
        try:
            for _ in range(3):  # a block fetched by another thread may be evicted before we pin it
                todo = [g for g in blocks if g not in held and g not in outside]
                if not todo:
                    break
                self._gather(todo, held, outside)
            todo = [g for g in blocks if g not in held and g not in outside]
            if todo:
                got = self.reader.read(todo)
                outside.update((g, got[g]) for g in todo)
        except BaseException:
            self.unpin(np.array(list(held.values()), dtype=np.int64))
            raise
        return np.array([held.get(g, -1) for g in blocks], dtype=np.int64), outside

    def _gather(self, todo: list[int], held: dict[int, int], outside: dict[int, np.ndarray]) -> None:
        """One pass: pin what the pool has, fetch what nobody is fetching, wait for the rest."""
        with self._lock:
            mine, waits = [], []
            for g in todo:
                s = self.pool.where.get(g, -1)
                if s >= 0:
                    self.pool.pin(np.array([s]))
                    held[g] = s
                elif g in self._loading:
                    waits.append(self._loading[g])
                else:
                    mine.append(g)
            fetch, slots = self._claim(mine)
        if mine:
            self._fill(mine, slots, fetch, held, outside)
        for f in waits:
            # Another thread's fetch: its blocks are in the pool now, or, where it failed, ours to fetch on the
            # next pass. A reader never takes on a failure it did not see: the prefetch of an earlier stream may
            # have failed a moment before the store came back.
            f.done.wait()

    def _claim(self, blocks: list[int]) -> tuple[Fetch, list[int]]:
        """(lock held) Slots for `blocks` (maybe fewer), marked as being fetched by this thread."""
        fetch = Fetch()
        for g in blocks:
            self._loading[g] = fetch
        return fetch, self.pool.reserve(blocks)

    def _fill(self, blocks: list[int], slots: list[int], fetch: Fetch, held: dict[int, int] | None,
              outside: dict[int, np.ndarray] | None, rest: Sequence[int] = ()) -> None:  # fmt: skip
        """Fetch `blocks`, copy them into their slots (busy: nobody else touches them) and
        publish them; pinned for the caller when `held` is given. Blocks beyond `slots` go to
        `outside`; `rest` is read through where it can be kept. On failure the slots are freed
        and waiters fetch again."""
        claimed: dict[int, int] = {}  # read-through blocks this fetch brings into the pool: block -> slot
        bringing = Fetch()  # others wait for those as for any fetch

        def claim(gs: list[int]) -> None:
            """Free slots for the blocks the requests read through (before they are sent)."""
            with self._lock:
                for g in gs:
                    if g in self.pool.where or g in self._loading:
                        continue
                    s = self.pool.take_free(g)
                    if s < 0:
                        return
                    claimed[g], self._loading[g] = s, bringing

        # The prefetch thread (held None) may read through gaps the pool's free slots can keep: a cold pass in a few
        # large requests. A reader fetching for its own batch keeps its requests small: its batch comes first.
        spare = 0 if held is not None else max(0, self.pool.free_count - len(blocks))
        try:
            through: dict[int, memoryview] = {}
            # The prefetch thread leaves out a block that fails its check (a reader that needs it fetches it and
            # names it): the rest of the round, maybe the whole split, is kept.
            got = self.reader.read(blocks, self._had, through, spare, claim, rest, lenient=held is None)
            for g, s in zip(blocks, slots, strict=False):
                if g in got:
                    tokens = got[g]
                    self.pool.slot(s, len(tokens))[...] = tokens
        except BaseException:
            with self._lock:
                for g, s in itertools.zip_longest(blocks, slots):
                    self._loading.pop(g, None)
                    if s is not None:
                        self.pool.abandon(s)
                for g, s in claimed.items():
                    self._loading.pop(g, None)
                    self.pool.abandon(s)
            fetch.done.set()
            bringing.done.set()
            raise
        with self._lock:
            for g, s in itertools.zip_longest(blocks, slots):
                self._loading.pop(g, None)
                if g not in got:  # (prefetch) damaged: left to the reader that needs it
                    if s is not None:
                        self.pool.abandon(s)
                    continue
                if s is None:
                    if outside is not None:
                        outside[g] = got[g]
                    continue
                self.pool.publish(g, s, pinned=held is not None)
                if held is not None:
                    held[g] = s
            self._wake.notify_all()
        fetch.done.set()
        self._keep(through, claimed, bringing)

    def _had(self, block: int) -> bool:
        """Whether the pool holds `block` or a fetch is on its way with it (read without the lock:
        a stale answer only costs a request that reads through, or not, a block it need not)."""
        return block in self.pool.where or block in self._loading

    def _keep(self, through: dict[int, memoryview], claimed: dict[int, int], bringing: Fetch) -> None:
        """The blocks a fetch read through, decoded into the free slots claimed for them before
        the requests went out (never evicting: a block read on the way is worth less than one in
        use), so each byte the store sent is fetched once while the pool has room. A block with
        no slot is dropped undecoded, and one that failed its check or does not decode is dropped
        (a reader that needs it fetches it, and names it). They go to the disk cache after the
        pool: readers do not wait for the cache."""
        done: dict[int, memoryview] = {}
        try:
            for g, s in claimed.items():
                if g not in through:
                    continue
                try:
                    tokens = self.reader.decode(g, through[g])
                except FormatError:
                    continue
                self.pool.slot(s, len(tokens))[...] = tokens  # busy: nobody else touches it
                done[g] = through[g]
        finally:
            with self._lock:
                for g, s in claimed.items():
                    self._loading.pop(g, None)
                    if g in done:
                        self.pool.publish(g, s, pinned=False)
                        self.pool.used[s] = False  # not read yet: the first to go when the pool fills
                    else:
                        self.pool.abandon(s)
                self._wake.notify_all()
            bringing.done.set()
        if done:
            self.reader.remember(done)

def _rebuilt(reader: BlockReader) -> BlockReader:
    import pickle

    return pickle.loads(pickle.dumps(reader))  # noqa: S301 (our own object, never from outside)
