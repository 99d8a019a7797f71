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

from ..errors import ArgumentError
from . import checks

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
        self._entry_step = 0  # the step of the last phase listed (one that changes nothing is merged)
        for i, entry in enumerate(entries):
            step, g, t = self._entry(i, entry)
            if i == 0 and step != 0:
                raise ArgumentError(f"schedule phase 1 starts at step {step}; the first phase starts at step 0 (or "
                                    "tokens 0)")  # fmt: skip
            if i and step <= self._entry_step:
                raise ArgumentError(f"schedule phase {i + 1} starts at step {step}, not after phase {i}'s step "
                                    f"{self._entry_step}; list the phases in order, each at a later "
                                    "step")  # fmt: skip
            self._entry_step = step
            self._add(step, g, t)
        self._steps = [p.step for p in self.phases]
        self._last = 0
        self._lens = sorted({p.seq_len for p in self.phases})

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
        before = last.tokens + (self._entry_step - last.step) * per_step  # where the phase listed before starts
        if tokens <= before:
            raise ArgumentError(f"{where} starts at {tokens:,} tokens, not after the phase before it (at {before:,} "
                                "tokens); list the phases in order")  # fmt: skip
        return last.step + math.ceil((tokens - last.tokens) / per_step)

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
        return self._lens

    def phase(self, step: int) -> Phase:
        return self.phases[self._index(step)]

    def _index(self, step: int) -> int:
        """The phase of `step` (the last one found is tried first: a stream asks step after step)."""
        i = self._last
        if not (self._steps[i] <= step and (i + 1 == len(self._steps) or step < self._steps[i + 1])):
            i = self._last = bisect.bisect_right(self._steps, step) - 1
        return i

    def locate(self, step: int) -> tuple[Phase, int, int | None]:
        """(the phase of `step`, the rows before it, steps left in the phase or None in the last)."""
        i = self._index(step)
        p = self.phases[i]
        left = None if i + 1 == len(self.phases) else self.phases[i + 1].step - step
        return p, p.row + (step - p.step) * p.global_batch, left

    def first_row(self, step: int) -> int:
        """Rows the run draws before step `step`."""
        p = self.phase(step)
        return p.row + (step - p.step) * p.global_batch

    def tokens_before(self, step: int) -> int:
        """Tokens (seq_len a row) the run draws before step `step`."""
        p = self.phase(step)
        return p.tokens + (step - p.step) * p.global_batch * p.seq_len

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


def resumed(state: dict[str, Any], given: Schedule, scheduled: bool, step: int, from_step: int | None,
            data_position: Any, world_size: int) -> Schedule | None:  # fmt: skip
    """The schedule a row-order stream built with `given` (`scheduled`: several phases, not one
    shape) follows when it resumes `state` at its `step`: the saved one if it is the same; the
    saved past, then `given` from `from_step` (at or after `step`) on; for one shape given, the
    saved past and that shape from `step` on. Anything else is refused in one line. None: the
    state records no shape (refused by the caller's checks). `data_position(step)`: the data
    position a step draws (skips)."""
    if "schedule" in state:
        saved = Schedule(state["schedule"])
    elif "seq_len" in state and "global_batch_size" in state:
        saved = Schedule.constant(state["global_batch_size"], state["seq_len"])
    else:
        return None
    if from_step is not None:
        from_step = checks.integer("from_step", from_step, low=step,
                                   fix=f"pass a from_step at or after the state's step {step}: the steps before it "
                                       "have been trained on")  # fmt: skip
        effective = saved.splice(given, data_position(from_step))
    elif saved == given:
        effective = saved
    elif not scheduled:  # one shape given: it holds from the resumed step on
        effective = saved.splice(given, data_position(step))
    else:
        differ = saved.first_difference(given)
        raise ArgumentError(f"cannot resume: the state's schedule {saved.record()} and this stream's {given.record()} "
                            f"differ from step {differ}; build the stream with the saved schedule, or pass "
                            "from_step=S to follow the new one from step S on")  # fmt: skip
    effective.per_rank(world_size)
    return effective


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
