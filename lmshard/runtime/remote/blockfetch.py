"""Blocks of a remote split in memory: the pool, the fetches in flight, and the exact prefetch.

`pin(blocks)` makes blocks readable and keeps them until `unpin`: those in the pool are pinned
at once; those another thread is fetching are waited for; the rest are fetched on this thread
(`BlockReader.read`: disk cache, else ranged GETs; checked, and decoded to uint32 whatever the
dataset's encoding). A block the pool has no room for (every slot pinned) is read into memory
of its own for this call, so a reader never waits for room and the pool never deadlocks.

**Exact prefetch.** A stream knows the rows of its next steps, so it `announce`s them (a key and
the blocks they touch) as it serves earlier ones, and `release`s a step once served. The pool's
blocks of an announced step are pinned at once; the rest are queued for a background thread,
which fetches the queue in order, a round of blocks of up to `ROUND_TOKENS` tokens at a time
sent concurrently (runs of adjacent blocks coalesced, `blockread.py`), and pins them for their
step. When the pool's free slots can hold every block of the split it does not have, the first
round reads the whole split (`_rest`): a cold pass in a few large requests. The round for the
first announced steps is claimed by `announce` itself, so a reader asking for them next waits
for it instead of fetching its rows apart. The thread only takes slots that are free or
evictable (not pinned, not being filled); when the pool has none left it waits for a release,
and the steps it did not reach are fetched by the reader when it gets there. A fetch that fails
(on the background thread or another reader's) is not kept: a reader that was waiting on it
fetches the blocks itself, so the error a reader raises is always one of its own requests (a
prefetch that failed a moment before the store came back never fails a batch).

After a fork (DataLoader workers) or in an unpickled copy, the pool, the thread and the
connections are built again on first use: nothing is shared between processes but the disk
cache.

Memory model: the pool (`pool_limit` bytes of decoded uint32 tokens, see blockpool.py); blocks
in flight beyond the pool only for a reader the pool had no room for (the blocks of its own
call, as stored and decoded); per announced step its block numbers (8 bytes per block).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import weakref
from collections import deque
from typing import Any

import numpy as np

from ...errors import LmshardError
from .blockpool import BlockPool
from .blockread import BlockReader
from .steps import Fetch, Step

ROUND_TOKENS = 1 << 22  # tokens fetched per background round: 256 blocks, 16 MiB of uint32
_IDLE_SECONDS = 1.0  # how often an idle fetch thread checks that its pool still exists


_Round = tuple[list[Step], list[int], list[int], Fetch, list[int]]  # steps, blocks, slots, fetch, rest


class Blocks:
    def __init__(self, reader: BlockReader, pool_limit: int) -> None:
        self.reader, self.pool_limit = reader, pool_limit
        self._start()

    def _start(self) -> None:
        self._pid = os.getpid()
        self.pool = BlockPool(self.pool_limit, self.reader.block_tokens)
        self.round_blocks = max(1, ROUND_TOKENS // self.reader.block_tokens)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._loading: dict[int, Fetch] = {}
        self._steps: dict[Any, Step] = {}
        self._queue: deque[Step] = deque()
        self._ready: deque[_Round] = deque()  # rounds claimed by `announce`, for the fetch thread to send
        self._thread: threading.Thread | None = None
        self._rounds = 0  # background rounds in flight
        self._stalled = False  # the next queued step waits for room in the pool
        self._closed = False

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
              outside: dict[int, np.ndarray] | None, rest: list[int] | None = None) -> None:  # fmt: skip
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
            got = self.reader.read(blocks, self._had, through, spare, claim, rest or ())
            for g, s in zip(blocks, slots, strict=False):
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
        no slot is dropped undecoded."""
        done: dict[int, memoryview] = {}
        try:
            for g, s in claimed.items():
                if g not in through:
                    continue  # read through but damaged: dropped, fetched again by whoever needs it
                tokens = self.reader.decode(g, through[g])
                self.pool.slot(s, len(tokens))[...] = tokens  # busy: nobody else touches it
                done[g] = through[g]
            if done:
                self.reader.remember(done)
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

    # -- exact prefetch --------------------------------------------------------------------

    def announce(self, key: Any, blocks: list[int]) -> None:
        """The blocks coming steps will read: pin the pool's now, queue the rest."""
        self._check_process()
        step = Step(blocks)
        with self._wake:
            self.release_locked(key)
            self._steps[key] = step
            step.pin(self.pool)
            if step.held is None and self.pool.n:
                self._queue.append(step)
                if not self._rounds:  # claimed here, so a reader asking for them now waits for this round
                    work = self._next_round()
                    if work is not None:
                        self._ready.append(work)
                self._ensure_thread()
                self._wake.notify_all()

    def held(self, key: Any) -> np.ndarray | None:
        """The slots of every block announced under `key` (aligned with them), all pinned until
        its release; None while some are not."""
        step = self._steps.get(key)
        return None if step is None else step.held

    def release(self, key: Any) -> None:
        """Announced steps were served (or will not be): their blocks may go."""
        with self._wake:
            self.release_locked(key)

    def release_locked(self, key: Any) -> None:
        step = self._steps.pop(key, None)
        if step is not None:
            step.live = False
            self.pool.unpin(step.slots[step.slots >= 0])
            step.held = None
            if self._stalled:  # the fetch thread waits for room: there may be some now
                self._wake.notify_all()

    def release_owner(self, owner: int) -> None:
        """Every announcement under a key (owner, ...)."""
        with self._wake:
            for key in [k for k in self._steps if isinstance(k, tuple) and k[0] == owner]:
                self.release_locked(key)

    def drain(self) -> None:
        """Wait until the background thread has done every round it can do now: the announced
        steps fetched, or left to the reader where the pool has no room for them."""
        with self._wake:
            self._wake.wait_for(lambda: self._closed or not self._rounds and not self._plan()[0])

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=_prefetch, args=(weakref.ref(self),), daemon=True,
                                            name="lmshard-prefetch")  # fmt: skip
            self._thread.start()

    def _plan(self) -> tuple[int, list[int]]:
        """(lock held) How many queued steps the next round takes, and the blocks it fetches for
        them: steps in order, up to `round_blocks` blocks, while the pool has room for them."""
        taken, wanted, seen = 0, list[int](), set[int]()
        room = self.pool.free_or_evictable
        self._stalled = False
        for step in self._queue:
            if step.live:
                missing = [g for g in step.blocks if g not in self.pool.where and g not in self._loading
                           and g not in seen]  # fmt: skip
                if wanted and len(wanted) + len(missing) > self.round_blocks:
                    break  # the next round: a reader waiting for this one's first steps gets them sooner
                if len(missing) > room - len(wanted):
                    self._stalled = True  # no room until a step is released; the reader fetches what it needs
                    break
                wanted += missing
                seen.update(missing)
            taken += 1
        return taken, wanted

    def _next_round(self) -> _Round | None:
        """(lock held) The steps of the next round, the blocks to fetch for them, their slots and
        the rest of the split to read through (`_rest`); None when there is nothing to do now."""
        taken, wanted = self._plan()
        if not taken:
            return None
        steps = [step for step in (self._queue.popleft() for _ in range(taken)) if step.live]
        self._rounds += 1
        fetch, slots = self._claim(wanted)
        return steps, wanted, slots, fetch, self._rest(wanted) if wanted else []

    def _rest(self, wanted: list[int]) -> list[int]:
        """(lock held) Every other block of the split that the pool does not hold and nobody is
        fetching, when the pool's free slots can take them all besides `wanted`; else none. A
        split that fits in the pool is then read whole by the first round, its requests reading
        through these as through gaps (runs of up to MAX_RUN_BYTES): a cold pass of random steps
        in a few large requests, each byte once, where it would need every block anyway."""
        total = int(self.reader.base[-1])
        rest = total - len(self.pool.where) - len(self._loading) - len(wanted)
        if rest <= 0 or rest > self.pool.free_count - len(wanted):
            return []
        skip = set(wanted)
        return [g for g in range(total) if g not in self.pool.where and g not in self._loading and g not in skip]

    def _round(self, work: _Round) -> None:
        steps, wanted, slots, fetch, rest = work
        try:
            if wanted:
                with contextlib.suppress(LmshardError):  # a reader that needs these blocks fetches them itself
                    self._fill(wanted, slots, fetch, None, None, rest)
        finally:
            with self._wake:
                for step in steps:
                    if step.live:  # pin what it now has here (a block another reader fetches is not waited for)
                        step.pin(self.pool)
                self._rounds -= 1
                self._wake.notify_all()


def _prefetch(ref: weakref.ref[Blocks]) -> None:
    """The background fetch thread: rounds of the queue, while its pool exists and is open."""
    while True:
        blocks = ref()
        if blocks is None:
            return
        with blocks._wake:
            if blocks._closed:
                return
            work = blocks._ready.popleft() if blocks._ready else blocks._next_round()
            if work is None:
                blocks._wake.wait(_IDLE_SECONDS)
        if work is not None:
            blocks._round(work)
        del blocks, work


def _rebuilt(reader: BlockReader) -> BlockReader:
    import pickle

    return pickle.loads(pickle.dumps(reader))  # noqa: S301 (our own object, never from outside)
