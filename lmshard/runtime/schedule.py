"""Batch-size and sequence-length schedules: which global batch and seq_len each step has.

    schedule = Schedule([(0, 8, 512), (1000, 32, 512), (5000, 64, 1024)])
    schedule = Schedule([{"tokens": 0, "batch_size": 8, "seq_len": 512},
                         {"tokens": 2e9, "batch_size": 32, "seq_len": 1024}])

Each phase starts at a step (or at the first step that begins at or after a token count) and
holds a **global** batch size (rows per optimizer step across all ranks, as Megatron's
`--rampup-batch-size` counts) and a seq_len. A stream in row order (`order="rows"`) draws row g
of the run from (seed, g), so a schedule only decides where the steps cut the one sequence of
rows: no row is skipped or repeated where the batch size changes, and a run resumes at any step
and world size from the step alone (`first_row`). A window stream numbers the rows of each
seq_len on their own (`rows_of_len`): its windows of that length continue their epochs.

Memory model: a few integers per phase.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentError, ConfigError
from . import checks
from .sampling import Offsets

ORDERS = ("rows", "steps")
_FIX = ("pass schedule=[(step, global_batch_size, seq_len), ...] starting at step 0, or dicts with "
        "'step' or 'tokens', 'batch_size' and 'seq_len'")  # fmt: skip


@dataclass(frozen=True)
class Phase:
    """Steps [step, next phase's step) draw `global_batch` rows of `seq_len` tokens each."""

    step: int
    global_batch: int
    seq_len: int
    row: int  # the run's rows before this phase
    tokens: int  # the run's tokens (seq_len per row) before this phase


class Schedule:
    """Phases of (first step, global batch, seq_len), the first at step 0 (see the module)."""

    def __init__(self, phases: Iterable[Any]) -> None:
        if isinstance(phases, Schedule):
            phases = phases.record()
        if isinstance(phases, str | bytes | Mapping) or not isinstance(phases, Iterable):
            raise ArgumentError(f"schedule={checks.show(phases)} is not a list of phases; {_FIX}")
        entries = list(phases)
        if not entries:
            raise ArgumentError(f"schedule=[] has no phase; {_FIX}")
        self.phases: list[Phase] = []
        for i, entry in enumerate(entries):
            step, g, t = self._entry(i, entry)
            if i == 0 and step != 0:
                raise ArgumentError(f"schedule phase 1 starts at step {step}; the first phase starts at step 0 (or "
                                    "tokens 0)")  # fmt: skip
            if self.phases and step <= self.phases[-1].step:
                raise ArgumentError(f"schedule phase {i + 1} starts at step {step}, not after phase {i}'s step "
                                    f"{self.phases[-1].step}; list the phases in order, each at a later "
                                    "step")  # fmt: skip
            self._add(step, g, t)
        self._steps = [p.step for p in self.phases]
        self._rows = [p.row for p in self.phases]

    def _add(self, step: int, g: int, t: int) -> None:
        if self.phases and (g, t) == (self.phases[-1].global_batch, self.phases[-1].seq_len):
            return  # a phase that changes nothing is the previous one going on
        row = tokens = 0
        if self.phases:
            last = self.phases[-1]
            row = last.row + (step - last.step) * last.global_batch
            tokens = last.tokens + (step - last.step) * last.global_batch * last.seq_len
        self.phases.append(Phase(step, g, t, row, tokens))

    def _entry(self, i: int, entry: Any) -> tuple[int, int, int]:
        where = f"schedule phase {i + 1}"
        if isinstance(entry, Mapping):
            unknown = sorted(set(entry) - {"step", "tokens", "batch_size", "global_batch_size", "seq_len"})
            if unknown or ("step" in entry) == ("tokens" in entry) or "seq_len" not in entry or \
                    ("batch_size" in entry) == ("global_batch_size" in entry):  # fmt: skip
                raise ArgumentError(f"{where}={checks.show(entry)}: a phase has 'step' or 'tokens', 'batch_size' (the "
                                    "global batch) and 'seq_len'")  # fmt: skip
            g = entry.get("batch_size", entry.get("global_batch_size"))
            g = checks.positive(f"{where}: batch_size", g)
            t = checks.positive(f"{where}: seq_len", entry["seq_len"])
            if "step" in entry:
                return checks.nonnegative(f"{where}: step", entry["step"]), g, t
            return self._step_at_tokens(where, entry["tokens"]), g, t
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise ArgumentError(f"{where}={checks.show(entry)} is not (step, global_batch_size, seq_len); {_FIX}")
        step = checks.nonnegative(f"{where}: step", entry[0])
        return step, checks.positive(f"{where}: batch_size", entry[1]), checks.positive(f"{where}: seq_len", entry[2])

    def _step_at_tokens(self, where: str, tokens: Any) -> int:
        """The first step that begins at or after `tokens` under the phases so far."""
        if isinstance(tokens, float) and tokens.is_integer():
            tokens = int(tokens)  # 2e9 as written in a config
        tokens = checks.nonnegative(f"{where}: tokens", tokens)
        if not self.phases:
            return tokens  # 0 for a valid first phase; anything else is refused by the caller
        last = self.phases[-1]
        per_step = last.global_batch * last.seq_len
        return last.step + max(1, math.ceil((tokens - last.tokens) / per_step))

    @classmethod
    def constant(cls, global_batch: int, seq_len: int) -> Schedule:
        return cls([(0, global_batch, seq_len)])

    def record(self) -> list[list[int]]:
        """As a state records it: [[step, global batch, seq_len], ...]."""
        return [[p.step, p.global_batch, p.seq_len] for p in self.phases]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.record() == other.record()

    def __hash__(self) -> int:
        return hash(str(self.record()))

    def __repr__(self) -> str:
        return f"Schedule({[tuple(p) for p in self.record()]})"

    @property
    def constant_shape(self) -> bool:
        return len(self.phases) == 1

    @property
    def max_batch(self) -> int:
        return max(p.global_batch for p in self.phases)

    @property
    def max_seq_len(self) -> int:
        return max(p.seq_len for p in self.phases)

    @property
    def seq_lens(self) -> list[int]:
        return sorted({p.seq_len for p in self.phases})

    def phase(self, step: int) -> Phase:
        return self.phases[bisect.bisect_right(self._steps, step) - 1]

    def first_row(self, step: int) -> int:
        """Rows the run draws before step `step`."""
        p = self.phase(step)
        return p.row + (step - p.step) * p.global_batch

    def tokens_before(self, step: int) -> int:
        """Tokens (seq_len a row) the run draws before step `step`."""
        p = self.phase(step)
        return p.tokens + (step - p.step) * p.global_batch * p.seq_len

    def step_of_row(self, row: int) -> int:
        """The step that draws row `row`."""
        p = self.phases[bisect.bisect_right(self._rows, row) - 1]
        return p.step + (row - p.row) // p.global_batch

    def rows_of_len(self, step: int) -> int:
        """Rows of step `step`'s seq_len drawn before it: where that length's own sequence is."""
        me = self.phase(step)
        before = 0
        for i, p in enumerate(self.phases):
            if p.step >= me.step:
                break
            if p.seq_len == me.seq_len:
                before += (self.phases[i + 1].step - p.step) * p.global_batch
        return before + (step - me.step) * me.global_batch

    def steps_in_phase(self, step: int) -> int | None:
        """Steps from `step` to the end of its phase (None: the last phase, no end)."""
        i = bisect.bisect_right(self._steps, step)
        return None if i == len(self.phases) else self.phases[i].step - step

    def splice(self, later: Schedule, from_step: int) -> Schedule:
        """This schedule before `from_step`, `later` from it on."""
        kept = [p for p in self.record() if p[0] < from_step]
        now = later.phase(from_step)
        rest = [p for p in later.record() if p[0] > from_step]
        return Schedule([*kept, [from_step, now.global_batch, now.seq_len], *rest])

    def first_difference(self, other: Schedule) -> int | None:
        """The first step at which the two schedules draw a different shape (None: never)."""
        steps = sorted({*self._steps, *other._steps})
        for s in steps:
            a, b = self.phase(s), other.phase(s)
            if (a.global_batch, a.seq_len) != (b.global_batch, b.seq_len):
                return s
        return None

    def per_rank(self, world_size: int) -> None:
        """Every phase's global batch must split evenly over `world_size` ranks."""
        for p in self.phases:
            if p.global_batch % world_size:
                raise ArgumentError(f"schedule: the global batch {p.global_batch} of the phase at step {p.step} does "
                                    f"not split over world_size={world_size} ranks; pass global batch sizes that "
                                    f"are multiples of {world_size}")  # fmt: skip


def parse_order(order: object, default: str) -> tuple[str, bool]:
    """(the order, whether it was given): None takes `default`."""
    if order is None:
        return default, False
    if order not in ORDERS:
        raise ArgumentError(f"order={checks.show(order)}: pass order='rows' (row g of the run comes from (seed, g), "
                            "whatever the batch size) or order='steps' (rows drawn per step; whole epochs of "
                            "steps)")  # fmt: skip
    return str(order), True


def resolve(schedule: object, batch_size: object, seq_len: object, world_size: int) -> Schedule:
    """The schedule of a stream: `schedule` (global batch sizes), or batch_size (per rank) × world_size and seq_len."""
    if schedule is None:
        if batch_size is None or seq_len is None:
            missing = "batch_size" if batch_size is None else "seq_len"
            raise ArgumentError(f"{missing}=None: pass batch_size and seq_len, each an int, or schedule=[(step, "
                                "global_batch_size, seq_len), ...]")  # fmt: skip
        b, t = checks.positive("batch_size", batch_size), checks.positive("seq_len", seq_len)
        return Schedule.constant(b * world_size, t)
    if batch_size is not None or seq_len is not None:
        raise ArgumentError("pass batch_size and seq_len, or a schedule (whose batch sizes are global), not both")
    made = schedule if isinstance(schedule, Schedule) else Schedule(schedule)  # type: ignore[arg-type]
    made.per_rank(world_size)
    return made


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
        if seq_len == self.schedule.phases[0].seq_len:
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
        if "schedule" in state:
            saved = Schedule(state["schedule"])
        elif "seq_len" in state and "global_batch_size" in state:
            saved = Schedule.constant(state["global_batch_size"], state["seq_len"])
        else:
            return  # refused by _load (a required key is missing)
        if self.order == "steps":
            return  # one shape, checked by _load
        at = self._data(self._position(step))
        if from_step is not None:
            from_step = checks.integer("from_step", from_step, low=step,
                                       fix=f"pass a from_step at or after the state's step {step}: the steps before it "
                                           "have been trained on")  # fmt: skip
            effective = saved.splice(self._given, self._data(self._position(from_step)))
        elif saved == self._given:
            effective = saved
        elif not self._scheduled:  # one shape given: it holds from the resumed step on
            effective = saved.splice(self._given, at)
        else:
            differ = saved.first_difference(self._given)
            raise ArgumentError(f"cannot resume: the state's schedule {saved.record()} and this stream's "
                                f"{self._given.record()} differ from step {differ}; build the stream with the saved "
                                "schedule, or pass from_step=S to follow the new one from step S on")  # fmt: skip
        effective.per_rank(self.world_size)
        self.schedule = effective

    def _global_rows(self, position: int) -> tuple[np.ndarray, int, int]:
        """Every rank's rows at `position`: offsets, the step's shift, its seq_len."""
        d = self._data(position)
        phase = self.schedule.phase(d)
        offsets = self._offsets(phase.seq_len)
        if offsets.order == "steps":
            rows, shift = offsets.rows(d, phase.global_batch)
        else:
            first = self.schedule.rows_of_len(d) if offsets.by_len else self.schedule.first_row(d)
            rows, shift = offsets.rows_at(d, first, phase.global_batch, self.schedule.steps_in_phase(d))
        return rows, shift, phase.seq_len
