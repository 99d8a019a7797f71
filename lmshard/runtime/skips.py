"""Skip ranges: `stream.skip(a, b)` leaves out steps a … b−1 of a run, as a loss-spike recovery
does (restart from a checkpoint before the spike, go past the batches around it), recorded in the
stream's state so that it holds across restarts and world sizes.

Steps are the run's step numbers (`batch.step`, the state's `step`). Two ways to skip, one per
stream:

- `mode="data"` (PaLM's "skip 200–500 data batches"): the run's steps go on one by one, and its
  data moves past the range: step t ≥ a draws the batch the stream would have drawn at step
  t + (b − a). Batches a … b−1 are never drawn.
- `mode="steps"`: the run's step numbers move past the range (its schedule continues at b) and
  its data does not: step b draws the batch the stream would have drawn at step a, step t ≥ b the
  one of step t − (b − a). No step a … b−1 is handed out.

Inside, a stream counts positions 0, 1, 2, … (the batches it hands out); a skip maps each position
to the step it is reported as and the step whose batch it draws. Several ranges apply in order
(each in the run's step numbers, not overlapping).

Memory model: the ranges (two ints each).
"""

from __future__ import annotations

from typing import Any

from ..errors import ArgumentError
from . import checks

MODES = ("data", "steps")


class SkipSteps:
    """The skip ranges of a stream (mixed into BatchStream and the packed and padded streams)."""

    _skips: tuple[tuple[int, int], ...] = ()
    _skip_mode: str = "data"

    step: int  # the stream's next position

    def skip(self, start: int, stop: int, mode: str = "data") -> Any:
        """Leave out steps [start, stop) (see runtime/skips.py); returns the stream. Recorded in
        `state_dict()`, so a resumed stream skips them too. Only steps still to come: a range
        the stream has handed out already is refused (load the checkpoint from before it first)."""
        a = checks.nonnegative("start", start)
        now = self._reported(self.step)
        if a < now:
            raise ArgumentError(f"skip({a}, {stop}): this stream has handed out steps up to {now - 1} already, so "
                                "skipping them now would change what the run's past steps say they trained on; load "
                                f"the checkpoint saved before step {a} first (load_state_dict), then skip")  # fmt: skip
        return self._add_skip(a, stop, mode)

    def _skips_changed(self) -> None:
        """A stream that reads ahead drops what it read for the positions a new range moves."""

    def _add_skip(self, a: int, stop: int, mode: str) -> Any:
        b = checks.integer("stop", stop, low=a + 1, fix=f"pass a stop after start={a}")
        if mode not in MODES:
            raise ArgumentError(f"mode={checks.show(mode)}: pass 'data' (the run's steps go on, its data moves past "
                                "the range) or 'steps' (its step numbers move past the range)")  # fmt: skip
        if self._skips and mode != self._skip_mode:
            raise ArgumentError(f"this stream skips with mode={self._skip_mode!r}; one stream skips one way")
        if any(a < y and x < b for x, y in self._skips):
            raise ArgumentError(f"steps [{a}, {b}) overlap a range already skipped ({list(self._skips)})")
        self._skips, self._skip_mode = tuple(sorted((*self._skips, (a, b)))), mode
        self._skips_changed()
        return self

    def _data(self, position: int) -> int:
        """The step whose batch position `position` draws."""
        return position + self._moved(position) if self._skip_mode == "data" else position

    def _reported(self, position: int) -> int:
        """The step number position `position` is handed out as."""
        return position if self._skip_mode == "data" else position + self._moved(position)

    def _position(self, step: int) -> int:
        """The position of the run's step `step` (a step inside a range of mode "steps": the
        position of the range's end, the next step handed out)."""
        if self._skip_mode == "data":
            return step
        moved = 0
        for a, b in self._skips:
            if step < a:
                break
            moved += min(step, b) - a
        return step - moved

    def _moved(self, position: int) -> int:
        """How far the ranges at or before `position` (in the run's numbering) move it."""
        moved = 0
        for a, b in self._skips:
            if position + (moved if self._skip_mode == "steps" else 0) < a:
                break
            moved += b - a
        return moved

    def _skip_state(self) -> dict[str, Any]:
        return {"skips": [list(r) for r in self._skips], "skip_mode": self._skip_mode} if self._skips else {}

    def _load_skips(self, state: dict[str, Any]) -> None:
        """Take the state's ranges too (a stream built with them, or resumed from a state that has them)."""
        saved = state.get("skips") or []
        if not isinstance(saved, list) or not all(isinstance(r, list | tuple) and len(r) == 2 for r in saved):
            raise ArgumentError(f"state['skips']={checks.show(saved)} is not a list of [start, stop]; "
                                f"{checks.STATE_FIX}")  # fmt: skip
        at = state.get("step")
        for a, b in self._skips:  # a range given before the load must still be to come at the state's step
            if [a, b] not in [list(r) for r in saved] and isinstance(at, int) and a < at:
                raise ArgumentError(f"skip({a}, {b}) is before this state's step {at}: its run drew those steps "
                                    f"already; load the checkpoint saved before step {a}, then skip")  # fmt: skip
        for a, b in saved:
            if (int(a), int(b)) not in self._skips:
                self._add_skip(checks.nonnegative("start", a), b, str(state.get("skip_mode", "data")))

    def skipped(self, step: int) -> tuple[int, int] | None:
        """The range of mode "steps" that holds the run's step `step` (no batch was handed out as
        it), or None."""
        if self._skip_mode != "steps":
            return None
        return next(((a, b) for a, b in self._skips if a <= step < b), None)
