"""Exact prefetch into a remote split's pool of blocks (blockfetch.py's `Blocks`, which holds
the state this half shares with its readers).

A stream knows the rows of its next steps, so it `announce`s them (a key and
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

The first round reads the whole split when the pool can hold it: it waits for every request
of the round (up to `pool_limit` bytes), so the first batch does too; the rounds after it fetch
only what the announced steps need. A request that fails is retried for itself alone
(`Remote.read_ranges`), not with the whole round.

Memory model: per announced step its block numbers and the slot pinned for each (16 bytes per
block); while a round is fetched, its stored bytes (up to the split's, for the first round of a
split the pool holds) and, with a disk cache, a copy of the blocks being written to it, beyond
the pool.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import LmshardError
from .blockpool import BlockPool
from .blockread import BlockReader
from .steps import Fetch, Step

ROUND_TOKENS = 1 << 22  # tokens fetched per background round: 256 blocks, 16 MiB of uint32
_IDLE_SECONDS = 1.0  # how often an idle fetch thread checks that its pool still exists

Round = tuple[list[Step], list[int], list[int], Fetch, list[int]]  # steps, blocks, slots, fetch, rest


class Prefetch:
    """`announce`, `release` and the fetch thread of `Blocks`."""

    reader: BlockReader
    pool: BlockPool
    round_blocks: int
    _lock: threading.Lock
    _wake: threading.Condition
    _loading: dict[int, Fetch]
    _steps: dict[Any, Step]
    _queue: deque[Step]
    _ready: deque[Round]  # rounds claimed by `announce`, for the fetch thread to send
    _thread: threading.Thread | None
    _rounds: int  # background rounds in flight
    _stalled: bool  # the next queued step waits for room in the pool
    _closed: bool
    _rest_tried: bool  # the first round's read of the whole split (`_rest`)

    def _check_process(self) -> None:
        raise NotImplementedError

    def _claim(self, blocks: list[int]) -> tuple[Fetch, list[int]]:
        raise NotImplementedError

    def _fill(self, blocks: list[int], slots: list[int], fetch: Fetch, held: dict[int, int] | None,
              outside: dict[int, np.ndarray] | None, rest: Sequence[int] = ()) -> None:  # fmt: skip
        raise NotImplementedError

    def _drop_ready(self) -> None:
        """(lock held) Undo the rounds `announce` claimed that no thread will send: their blocks
        freed for a reader to fetch, their waiters woken."""
        while self._ready:
            _, wanted, slots, fetch, _ = self._ready.popleft()
            for g in wanted:
                self._loading.pop(g, None)
            for s in slots:
                self.pool.abandon(s)
            self._rounds -= 1
            fetch.done.set()

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
                if not self._rounds and not self._closed:  # claimed here: a reader asking for them waits for it
                    work = self._next_round()
                    if work is not None:
                        self._ready.append(work)
                try:
                    self._ensure_thread()
                except BaseException:
                    self._drop_ready()
                    raise
                self._wake.notify_all()

    def held(self, key: Any) -> np.ndarray | None:
        """The slots of every block announced under `key` (aligned with them), all pinned until
        its release; None while some are not."""
        self._check_process()
        step = self._steps.get(key)
        return None if step is None else step.held

    def release(self, key: Any) -> None:
        """Announced steps were served (or will not be): their blocks may go."""
        self._check_process()
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
        self._check_process()
        with self._wake:
            for key in [k for k in self._steps if isinstance(k, tuple) and k[0] == owner]:
                self.release_locked(key)

    def drain(self) -> None:
        """Wait until the background thread has done every round it can do now: the announced
        steps fetched, or left to the reader where the pool has no room for them."""
        self._check_process()
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

    def _next_round(self) -> Round | None:
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
        in a few large requests, each byte once, where it would need every block anyway. Tried by
        the first round only (after it, a block missing from the pool is one the disk cache holds,
        or one that failed its check)."""
        if self._rest_tried:
            return []
        self._rest_tried = True
        total = int(self.reader.base[-1])
        rest = total - len(self.pool.where) - len(self._loading)  # `wanted` is claimed: in _loading
        if rest <= 0 or rest > self.pool.free_count:
            return []
        return [g for g in range(total) if g not in self.pool.where and g not in self._loading]

    def _round(self, work: Round) -> None:
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


def _prefetch(ref: weakref.ref[Prefetch]) -> None:
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
