"""Where a stream's state comes from when DataLoader workers hand its batches out.

`DataLoader(stream, batch_size=None, num_workers=W)` iterates copies of the stream in W worker
processes: the stream in the training process never hands out a batch, so its step stays where
it was loaded, and a state saved from it would resume at that step, repeating the batches trained
on since. `state_dict(after=batch)` (the last batch trained on, or its step) saves the state
after it instead; and a stream whose forked workers have started refuses a plain `state_dict()`,
saying so, rather than saving the stale step. The mark is a page of memory shared with the forked
workers (made with the stream, before any fork), which a worker sets when it starts; workers
started by `spawn` share no memory and are not seen (`after=` holds there too).

Memory model: one page of shared memory per stream, released with it.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import weakref
from collections.abc import Iterator
from typing import Any

from ..errors import ArgumentError
from . import checks

_PAGES: dict[int, mmap.mmap] = {}  # per stream (by key): the page its forked workers mark
_KEYS = itertools.count()
_SERVED = ("this stream's batches are handed out by DataLoader workers, which count its steps in their own "
           "processes, so this one's count has not moved since it was loaded; pass the last batch you trained on: "
           "state_dict(after=batch)")  # fmt: skip


class WorkerServed:
    """The state's position of a stream that DataLoader workers may serve (mixed into the
    streams' classes, after SkipSteps: each stream gets its page when it is made)."""

    _served_key: int | None = None
    step: int  # the stream's next position

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        self = super().__new__(cls)
        key = next(_KEYS)  # a page shared with the DataLoader workers that will be forked from this process
        _PAGES[key] = mmap.mmap(-1, mmap.PAGESIZE)
        self._served_key = key
        weakref.finalize(self, _PAGES.pop, key, None)
        return self

    def _position(self, step: int) -> int:
        raise NotImplementedError  # SkipSteps: the position of the run's step `step`

    def _page(self) -> mmap.mmap | None:
        return _PAGES.get(self._served_key) if self._served_key is not None else None

    def _worker_started(self) -> None:
        """In a DataLoader worker: mark the stream as served by workers (seen by the process it
        was forked from)."""
        if (page := self._page()) is not None:
            page[0] = 1

    @contextlib.contextmanager
    def _loading(self) -> Iterator[None]:
        """A state loaded in the block: this process's count is the run's again (until workers
        serve the stream), and the load's own checks read it; a refused load leaves the mark."""
        page = self._page()
        was = page[0] if page is not None else 0
        if page is not None:
            page[0] = 0
        try:
            yield
        except BaseException:
            if page is not None:
                page[0] = was
            raise

    def _resumes_at(self, in_hand: int, after: Any) -> int:
        """The position a state saved now resumes at: the next, less `in_hand` batches drawn but not
        trained on; or, with `after` (the last batch trained on, or its step), the one after it."""
        if after is None:
            if (page := self._page()) is not None and page[0] == 1:
                raise ArgumentError(_SERVED)
            return checks.rewind(self.step, in_hand)
        if in_hand:
            raise ArgumentError(f"in_hand={in_hand} and after= both given: pass after= alone, the last batch you "
                                "trained on")  # fmt: skip
        step = checks.integer("after", getattr(after, "step", after), low=0,
                              fix="pass the last batch you trained on (a Batch), or its step")  # fmt: skip
        return self._position(step + 1)


__all__ = ["WorkerServed"]
