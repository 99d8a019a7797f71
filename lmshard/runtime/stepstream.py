"""What the packed, padded and packed-mixture streams share (`StepStream`): a global step across
epochs, `batch(step)` a pure function of it, resume from `state_dict()` (also onto a split that
grew since, runtime/growth.py), skip ranges, trace, and DataLoader worker splitting.

Memory model: nothing beyond the subclass's own (its plan or document order); the eras of a split
that grew are a few integers each and their own samplers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError
from . import checks, growth
from .augment import Augmented
from .lookahead import Lookahead
from .packedbatch import PackedBatch
from .resident import no_workers
from .schedule import resumed
from .served import WorkerServed
from .skips import SkipSteps
from .trace import Audited


class StepStream(SkipSteps, WorkerServed, Audited, Augmented, torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """What the packed and padded streams share: a global step across epochs, `batch(step)` a
    pure function of it, resume from `state_dict()`, and DataLoader worker splitting."""

    batch_size: int
    world_size: int
    steps_per_epoch: int
    step: int
    device: torch.device
    kind = "stream"
    _ahead: Lookahead | None = None
    _res: Any = None  # the split on the device (runtime/resident.py), for streams that build rows there
    schedule: Any  # (row-order streams: packed, packed mixtures) the run's batch sizes by step
    _given: Any
    _scheduled: bool

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def batch(self, step: int) -> PackedBatch:
        raise NotImplementedError

    def reads(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """What batch `step` reads: its items' starts and lengths (told to the store ahead)."""
        raise NotImplementedError

    @property
    def store(self) -> Any:
        raise NotImplementedError

    def _served(self, step: int, stride: int = 1) -> PackedBatch:
        """`batch(step)`, the store told the reads of the steps after it first (lookahead.py);
        over a resident split (runtime/resident.py) nothing is read from the store."""
        if self._res is not None:
            return self.batch(step)
        ahead = self._ahead
        if ahead is None:
            ahead = self._ahead = Lookahead(self.store, self.reads)
        ahead.before(step, stride)
        out = self.batch(step)
        ahead.after(step)
        return out

    def state_dict(self, in_hand: int = 0, after: Any = None) -> dict[str, Any]:
        """A few integers and the options that fix the batches. `in_hand`: batches drawn but not
        trained on yet, which the resumed stream hands out again; `after`: the last batch trained
        on, served by DataLoader workers (see BatchStream.state_dict)."""
        raise NotImplementedError

    def trace_reads(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(starts, lengths, items per row or None for one a row) of this rank's rows at `step`."""
        starts, lengths = self.reads(step)
        return starts, lengths, None

    @property
    def epoch(self) -> int | None:
        """The epoch of the next batch (counted on across a growth)."""
        return int(self._epoch_of(self.step)[1])

    def set_epoch(self, epoch: int) -> None:
        epoch = checks.nonnegative("epoch", epoch)
        found = growth.epoch_start(self._eras, epoch)
        self.step = epoch * self.steps_per_epoch if found is None else found
        if self._ahead is not None:
            self._ahead.reset()

    # -- a split that grew while the run went on (runtime/growth.py) --------------------------

    _eras: list[growth.Era] = []  # none: one era, the split as it is
    _samplers: list[Any] = []
    _grown: list[list[Any]] = []

    def _dataset(self) -> Any:
        """The TokenDataset read, when the stream can continue on it once it grew."""
        return None

    def _over(self, part: growth.Prefix | None) -> Any:
        """What draws the epochs over the first documents `part` holds (None: the whole split)."""
        raise NotImplementedError

    def _per_epoch(self, sampler: Any) -> int:
        raise NotImplementedError

    def _epoch_of(self, step: int) -> tuple[Any, int, int]:
        """(what draws it, epoch, step within the epoch) of the batch at `step`."""
        position = self._data(checks.nonnegative("step", step))
        if not self._eras:
            return self._over(None), *divmod(position, self.steps_per_epoch)
        i = growth.era_of([e.start for e in self._eras], position)
        era = self._eras[i]
        return self._samplers[i], *divmod(era.local(position), self._per_epoch(self._samplers[i]))

    def _regrow_sources(self, state: dict[str, Any], position: int, keep_going: bool) -> bool:
        """A mixture's: take the eras of its sources (runtime/growth.py); False where there are none."""
        return False

    def _grown_state(self) -> dict[str, Any]:
        return {"grown": self._grown} if self._grown else {}

    def load_state_dict(self, state: Mapping[str, Any], grown: str | None = None, from_step: int | None = None) -> None:
        """Continue from `state`, refused unless every option it records matches this stream.
        `grown="continue"` continues a state saved before `prepare --append` grew the split: the
        epoch it was in finishes on the old data, the new documents join from the next one.
        `from_step`: where a row-order stream's new schedule takes over (see BatchStream)."""
        if not isinstance(state, Mapping):
            raise ArgumentError(f"state={checks.show(state)} is not a dict; {checks.STATE_FIX}")
        keep_going = growth.choice(grown)
        step = checks.state_int(dict(state), "step", low=0)
        kept = ("_skips", "_skip_mode", "_eras", "_samplers", "_grown", *(("eras",) if hasattr(self, "eras") else ()),
                *(k for k in ("order", "schedule") if k in vars(self)))  # fmt: skip
        with self._loading(), checks.unchanged_on_error(*[(self, k) for k in kept]):
            self._load_skips(dict(state))  # (first: a step's data position, which a schedule reads, counts them)
            if from_step is None:
                self._load(state, step, keep_going)
            elif "schedule" not in vars(self):
                raise ArgumentError(f"from_step={checks.show(from_step)}: this {self.kind} stream has no schedule")
            else:
                self._load(state, step, keep_going, from_step)  # type: ignore[call-arg]
        self.step = self._position(step)
        if self._ahead is not None:
            self._ahead.reset()

    def _load(self, state: Mapping[str, Any], step: int, keep_going: bool) -> None:
        """load_state_dict's checks, and the eras the state brings (its skips are loaded already)."""
        data = self._dataset()
        self._check_augment(state)
        if data is None:
            if not self._regrow_sources(dict(state), self._data(self._position(step)), keep_going):
                checks.same_data(state.get("data"), self.state_dict().get("data"))
        else:
            eras, samplers, self._grown = growth.eras_for(data, dict(state), self._data(self._position(step)),
                                                          keep_going, self._over, self._per_epoch)  # fmt: skip
            self._eras, self._samplers = (eras, samplers) if len(eras) > 1 else ([], [])
        mine = self.state_dict()
        grew = state.get("data") != mine.get("data") or state.get("mixture") != mine.get("mixture")
        sized = ("packs", "documents", "mixture") if grew else ()  # checked above; the counts follow the data
        for key, value in mine.items():
            if key in ("shuffle", "multiple") and key not in state:
                continue  # (recorded since: a state saved before is not checked for it)
            unchecked = ("step", "data", "skips", "skip_mode", "grown", "augment", *sized)
            if key not in unchecked and state.get(key) != value:
                saved = checks.show(state.get(key))
                raise ArgumentError(f"cannot resume: saved {key}={saved}, this stream has {key}={value!r}; build "
                                    f"the {self.kind} stream with the saved options")  # fmt: skip

    def _resume_shape(self, state: dict[str, Any], step: int, from_step: int | None) -> None:
        """Row order: take the schedule the resumed run follows (schedule.resumed), and put this
        stream's shape keys in `state`, checked there, so that the option checks pass over them."""
        found = resumed(state, self._given, self._scheduled, step, from_step, lambda s: self._data(self._position(s)),
                        self.world_size)  # fmt: skip
        self.schedule = found or self.schedule
        mine = self.state_dict()
        state.pop("schedule", None)
        state.update({k: mine[k] for k in ("global_batch_size", "schedule") if k in mine})

    def _finish(self, out: PackedBatch, step: int) -> PackedBatch:
        for k, v in out.items():
            if isinstance(v, torch.Tensor) and v.device != self.device:  # (a resident copy's: without a wait)
                out[k] = v.to(self.device) if self._res is None else self._res.send(v)
        out.step = self._reported(step)
        return self._augmented(out, out.step)

    def _skips_changed(self) -> None:
        if self._ahead is not None:
            self._ahead.reset()

    def __iter__(self) -> Iterator[PackedBatch]:
        """Itself; inside a worker w of W of `DataLoader(stream, batch_size=None)`: steps w,
        w+W, ... from the current step, which the loader interleaves back into step order."""
        info = torch.utils.data.get_worker_info()
        no_workers(self._res)
        if info is None:
            return self
        return self._worker_steps(info.id, info.num_workers)

    def _worker_steps(self, worker: int, workers: int) -> Iterator[PackedBatch]:
        self._worker_started()
        step = self.step + worker
        while True:
            yield self._served(step, workers)
            step += workers

    def __next__(self) -> PackedBatch:
        out = self._served(self.step)
        self.step += 1  # after the read: a step whose read failed is asked for again
        return out
