"""A batch stream's shape at each step and where its rows come from (`Scheduled`, mixed into
`BatchStream`): the schedule's phases (runtime/schedule.py), the offsets of each seq_len, and
the row or step order.

Memory model: one offsets object per seq_len of the schedule (each holds its last two blocks of
rows drawn; see sampling.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ArgumentError, ConfigError
from . import checks
from .sampling import Offsets
from .schedule import Phase, Schedule, resumed


class Scheduled:
    """A batch stream's shape at each step, and where its rows come from: the schedule's
    phases, the offsets of each seq_len, row or step order (mixed into `BatchStream`)."""

    schedule: Schedule  # the one the stream follows (a resumed run's past, then what it was built with)
    _given: Schedule  # the one it was built with
    _scheduled: bool  # built with several phases (not one batch shape)
    _make: Any  # (seq_len, order) -> the offsets of rows of that length
    _order_given: bool
    _lens: dict[int, Offsets]
    offsets: Offsets
    _base: Offsets
    world_size: int
    kind: str
    step: int
    _pending: Any
    _ahead: Any

    def _data(self, position: int) -> int:
        raise NotImplementedError  # SkipSteps

    def _position(self, step: int) -> int:
        raise NotImplementedError  # SkipSteps

    @property
    def order(self) -> str:
        """ "rows": row g of the run is drawn from (seed, g), at any batch size; "steps": a
        step's rows from (seed, step), and window epochs of whole steps."""
        return self.offsets.order

    def _phase(self, position: int) -> Phase:
        return self.schedule.phase(self._data(position))

    @property
    def batch_size(self) -> int:
        """Rows per step on this rank, at the next step (a schedule's global batch / world_size)."""
        return self._phase(self.step).global_batch // self.world_size

    @property
    def seq_len(self) -> int:
        """Tokens per row at the next step."""
        return self._phase(self.step).seq_len

    def _offsets(self, seq_len: int) -> Offsets:
        """The offsets of rows of `seq_len` tokens."""
        if seq_len == self._base.seq_len:  # (the length the stream was built for)
            return self.offsets
        if seq_len not in self._lens:
            if self._make is None:
                raise ConfigError(f"this stream cannot draw rows of {seq_len} tokens; build it with "
                                  "TokenDataset.random_batches or window_batches")  # fmt: skip
            self._lens[seq_len] = self._make(seq_len, self.order)
        return self._lens[seq_len]

    @property
    def steps_per_epoch(self) -> int | None:
        """Steps in one pass over all windows (window streams; in row order, whole steps at the
        next step's batch size, as an epoch's end may fall inside a step); None for random batches."""
        if self.order == "steps":
            return self.offsets.steps_per_epoch
        n = self._offsets(self.seq_len).n_rows
        return None if n is None else n // self.global_batch_size

    @property
    def epoch(self) -> int | None:
        """The epoch of the next batch's first row (window streams, counted on across a growth);
        None for random batches."""
        if self.order == "steps":
            return self.offsets.epoch_of(self._data(self.step))
        n = self._offsets(self.seq_len).n_rows
        return None if n is None else self.schedule.rows_of_len(self._data(self.step)) // n

    def set_epoch(self, epoch: int) -> None:
        """Jump to the first step of `epoch` (window streams); its order comes from (seed, epoch).
        In row order: the first step whose rows all belong to `epoch` or later."""
        if self.steps_per_epoch is None:
            raise ConfigError(f"{self.kind} batches have no epochs; resume them with load_state_dict")
        epoch = checks.nonnegative("epoch", epoch)
        if self.order == "steps":
            self.step = self.offsets.epoch_start(epoch)
        elif not self.schedule.constant_shape:
            raise ConfigError("set_epoch needs one batch shape; a scheduled stream resumes with load_state_dict")
        else:
            n, g = self._offsets(self.seq_len).n_rows or 0, self.global_batch_size
            self.step = -(-epoch * n // g)
        self._pending = None
        self._ahead.reset()

    @property
    def global_batch_size(self) -> int:
        """Rows per optimizer step across all ranks at the next step (batch_size × world_size)."""
        return self._phase(self.step).global_batch

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step across all ranks at the next step."""
        return self.global_batch_size * self.seq_len

    @property
    def tokens_seen(self) -> int:
        """Tokens (seq_len a row, all ranks) of the steps handed out so far."""
        return self.schedule.tokens_before(self._data(self.step))

    def _load_order(self, state: dict[str, Any]) -> None:
        """The state's order: adopted by a stream built without `order=`, else it must be this one."""
        saved = state.get("order", "steps")  # states saved before row order existed drew by step
        if saved == self.order or self.kind.startswith("mixture/") or state.get("kind") != self.kind:
            return  # a mixture draws the same rows in either order; another kind is refused by _load
        if saved not in ("rows", "steps"):
            raise ArgumentError(f"state['order']={checks.show(saved)} is neither 'rows' nor 'steps'; "
                                f"{checks.STATE_FIX}")  # fmt: skip
        if self._order_given or self._make is None or not self.schedule.constant_shape:
            raise ArgumentError(f"cannot resume: the state was drawn in order={saved!r} and this stream draws in "
                                f"order={self.order!r}; build the stream with order={saved!r} to continue that "
                                "run")  # fmt: skip
        T = self.schedule.phases[0].seq_len
        self.offsets, self._lens = self._make(T, saved), {}
        self._base = self.offsets

    def _load_schedule(self, state: dict[str, Any], step: int, from_step: int | None) -> None:
        """The schedule the resumed stream follows (see load_state_dict)."""
        if self.order == "rows":
            found = resumed(state, self._given, self._scheduled, step, from_step,
                            lambda s: self._data(self._position(s)), self.world_size)  # fmt: skip
            self.schedule = found or self.schedule
            for T in self.schedule.seq_lens:  # a length this stream cannot draw is refused now, not mid-run
                self._offsets(T)

    def _global_rows(self, position: int) -> tuple[np.ndarray, int, int]:
        """Every rank's rows at `position`: offsets, the step's shift, its seq_len."""
        d = self._data(position)
        schedule = self.schedule
        if schedule.constant_shape:  # (the common case, without the phase lookups)
            phase, offsets = schedule.phases[0], self.offsets
            if offsets.order == "rows":
                rows, shift = offsets.rows_at(d, d * phase.global_batch, phase.global_batch)
                return rows, shift, phase.seq_len
        phase, first, left = schedule.locate(d)
        offsets = self._offsets(phase.seq_len)
        if offsets.order == "steps":
            rows, shift = offsets.rows(d, phase.global_batch)
        else:
            if offsets.by_len and len(schedule.seq_lens) > 1:
                first = schedule.rows_of_len(d)
            rows, shift = offsets.rows_at(d, first, phase.global_batch, left)
        return rows, shift, phase.seq_len
