"""Batches on the device: gather rows, widen to int64 in one copy, hand out x and y.

On the CPU a batch's rows are gathered from the memory-mapped shard into a new uint32 array
(one fancy index on a single-shard split; see store.py for splits that are read) and widened
to int64 by one copy into a [2, B, T] tensor whose halves are x and y (both contiguous): three
passes over the batch's memory in all.
On CUDA (or whenever `staged` is set, which is how the test suite runs this path on the CPU),
a ring of pinned host buffers is allocated once; each batch is read into one, copied with
`non_blocking=True` on a side stream, and widened on the device; the next batch's host copy is
started before the current batch is returned (`prefetch`).
Over a resident split (runtime/resident.py) only the rows' offsets leave the host: the device
gathers x and y from its copy of the split and widens them there.

Memory model: on CUDA, `ring` host buffers of batch_size × (seq_len + max shift) int32; on the
CPU one uint32 gather per batch, freed when the batch is built (or, where rows are read rather
than gathered from a map, one scratch buffer of that size, reused); over a resident split, the
batch's index and output tensors on the device. Nothing accumulates while iterating besides the
batches the caller holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError
from . import checks, growth
from .augment import Augmented
from .batch import Batch, RowStore
from .checks import resolve_rank
from .lookahead import Lookahead
from .resident import Resident, no_workers, stream_device
from .ring import Ring
from .sampling import Offsets
from .schedule import Schedule
from .schedule import resolve as resolve_schedule
from .scheduled import Scheduled
from .served import WorkerServed
from .skips import SkipSteps
from .trace import Audited


class BatchStream(SkipSteps, WorkerServed, Scheduled, Audited, Augmented, torch.utils.data.IterableDataset):
    """An endless, resumable stream of batches for one rank.

    Use it directly (`next(stream)`: batches on `device`, next one prefetched), or hand it to a
    `DataLoader(stream, batch_size=None, num_workers=W)`: worker w produces steps w, w+W, ... on
    the CPU and the loader interleaves them back into step order, so the sequence is the same
    for any W. `state_dict()` is a few integers; `load_state_dict()` continues the same stream,
    also at another world size if the global batch size is unchanged. `staged` (default: on
    for non-CPU devices) routes batches through the ring of pinned host buffers. Over a
    `resident` split (runtime/resident.py) the rows are gathered on the device itself, the
    same batches; `device` defaults to the resident copy's, else the CPU.
    """

    def __init__(
        self,
        store: RowStore,
        offsets: Offsets,
        *,
        batch_size: int | None = None,
        seq_len: int | None = None,
        schedule: Any = None,
        make: Callable[[int, str], Offsets] | None = None,
        order_given: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        device: str | torch.device | None = None,
        resident: Resident | None = None,
        seed: int,
        kind: str,
        cu_seqlens: bool = False,
        grouped: bool = False,
        prefetch: bool = True,
        data: str | None = None,
        dataset: Any = None,
    ) -> None:
        super().__init__()
        # a TokenStore, or a mixture's MixedStore: anything that gathers rows by offset
        if not callable(getattr(store, "gather", None)) or not isinstance(offsets, Offsets):
            got = f"store={checks.show(store)}, offsets={checks.show(offsets)}"
            raise ArgumentError(f"{got}: not a TokenStore and Offsets; build streams with TokenDataset.random_batches "
                                "or window_batches")  # fmt: skip
        self.store, self.offsets = store, offsets
        self._base = offsets  # the offsets over the split as it is (for the seq_len the stream was built with)
        self.seed, self.kind = checks.seed(seed), str(kind)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        # the run's global batch and seq_len at each step (runtime/schedule.py); one phase without a schedule
        self.schedule = self._given = resolve_schedule(schedule, batch_size, seq_len, self.world_size)
        self._scheduled = not self.schedule.constant_shape  # one shape: a resume may change it
        if self.schedule.phases[0].seq_len != getattr(offsets, "seq_len", self.schedule.phases[0].seq_len):
            raise ArgumentError("offsets are drawn for another seq_len than the schedule's first; build streams with "
                                "TokenDataset.random_batches or window_batches")  # fmt: skip
        if not self.schedule.constant_shape and offsets.order != "rows":
            raise ArgumentError("a schedule needs order='rows' (row g of the run drawn from (seed, g), whatever the "
                                "batch size); pass order='rows'")  # fmt: skip
        self._make, self._order_given = make, order_given  # (seq_len, order) -> the offsets of another seq_len
        self._lens: dict[int, Offsets] = {}
        self._res = resident  # the split on the device (runtime/resident.py): batches gathered there
        self.device = stream_device(device, resident, "this split")
        self.cu_seqlens = checks.flag("cu_seqlens", cu_seqlens)
        self.grouped = checks.flag("grouped", grouped)
        for T in self.schedule.seq_lens:
            self._offsets(T).shift.check_grouped(self.grouped, T)
        self.prefetch = checks.flag("prefetch", prefetch)
        self.data = data  # the dataset's data_id: a state records it, and a load onto other data is refused
        self.dataset = dataset  # the TokenDataset it reads, if one: a state saved before it grew may continue
        self._grown: list[list[Any]] = []  # what a state records of the split's growths (runtime/growth.py)
        self.step = 0  # the next step to hand out
        self.staged = self.device.type != "cpu"
        self._ring: Ring | None = None
        self._ring_for: Schedule | None = None
        self._scratch: np.ndarray | None = None
        self._pending: tuple[int, Any] | None = None
        self._ahead = Lookahead(store, self._reads)  # exact prefetch, for stores that fetch (remote ones)

    def __repr__(self) -> str:
        return (f"BatchStream({self.kind}, batch_size={self.batch_size}, seq_len={self.seq_len}, rank={self.rank}/"
                f"{self.world_size}, global_batch_size={self.global_batch_size}, step={self.step})")  # fmt: skip

    def state_dict(self, in_hand: int = 0, after: Any = None) -> dict[str, Any]:
        """A few integers (and the offsets' fingerprint: shift, doc alignment, stride, order).
        `in_hand`: batches already drawn but not trained on yet (1 in a loop that draws the next
        batch before it checkpoints, as nanoGPT's does): the resumed stream hands them out again.
        `after`: the last batch trained on (or its step), for a stream served by DataLoader
        workers, whose count does not move in this process (runtime/served.py)."""
        step = self._resumes_at(in_hand, after)
        phase = self._phase(step)
        return {"kind": self.kind, "seed": self.seed, "step": self._reported(step), "order": self.order,
                "seq_len": phase.seq_len, "global_batch_size": phase.global_batch, "world_size": self.world_size,
                **({"schedule": self.schedule.record()} if not self.schedule.constant_shape else {}),
                **self.offsets.fingerprint(), **({"data": self.data} if self.data is not None else {}),
                **({"grown": self._grown} if self._grown else {}), **self._skip_state(),
                **self._augment_state()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any], grown: str | None = None, from_step: int | None = None) -> None:
        """Continue from `state`, refused unless it comes from a stream that draws the same rows.
        A fingerprint key missing from the state (saved by lmshard 0.1 before it recorded it)
        is not checked. A state saved before `prepare --append` grew the split is refused unless
        `grown="continue"`: the epoch it was in finishes on the old data, and the new documents
        join from the next epoch (random batches: from the resumed step; runtime/growth.py).

        In row order the batch shape may change: a stream built with another batch_size, seq_len
        or world size continues the saved run's rows from its step with its own shape (the
        state keeps the past's schedule). A stream built with a schedule other than the saved
        one is refused unless `from_step` (at or after the saved step) says where the new one
        takes over; the saved one holds before it. A state saved in the other order is loaded
        in its order when the stream was built without `order=` (states of lmshard before 0.3
        are in step order)."""
        if not isinstance(state, Mapping):
            raise ArgumentError(f"state={checks.show(state)} is not a dict; {checks.STATE_FIX}")
        keep_going = growth.choice(grown)
        step = checks.state_int(dict(state), "step", low=0)
        names = ("_skips", "_skip_mode", "offsets", "_grown", "schedule", "_lens")
        kept: list[tuple[Any, str]] = [(self, k) for k in names]
        kept += [(self.offsets, "eras")] if hasattr(self.offsets, "eras") else []
        with self._loading(), checks.unchanged_on_error(*kept):
            self._load_order(dict(state))
            self._load_skips(dict(state))  # (before the schedule: a step's data position counts them)
            self._load_schedule(dict(state), step, from_step)
            mine, required = self.state_dict(), ("kind", "seed", "seq_len", "global_batch_size")
            self._load(dict(state), step, keep_going, mine, required)
        self.step = self._position(step)
        self._pending, self._scratch = None, None
        self._ahead.reset()

    def _load(self, state: dict[str, Any], step: int, keep_going: bool, mine: dict[str, Any],
              required: tuple[str, ...]) -> None:  # fmt: skip
        """load_state_dict's checks, and the eras the state brings (its skips are loaded already)."""
        self._check_augment(state)
        if self.dataset is not None and self.data is not None:
            self._regrow(dict(state), self._data(self._position(step)), keep_going)
        elif hasattr(self.offsets, "regrow"):  # a mixture's: each source on its own
            self._grown = self.offsets.regrow(dict(state), self._data(self._position(step)), keep_going,
                                              self.schedule.first_row)  # fmt: skip
            if self._grown and len(self.schedule.seq_lens) > 1:
                raise ArgumentError("cannot continue a schedule of several seq_lens on a grown mixture source; "
                                    "continue on the data the state was saved on, or start from step 0")  # fmt: skip
        else:
            checks.same_data(state.get("data"), self.data)
        for key in (*required, *self.offsets.fingerprint()):
            if key == "mixture" and self._grown:
                continue  # checked source by source (regrow)
            if key in ("seq_len", "global_batch_size") and self.order == "rows":
                continue  # the schedule (_load_schedule)
            if key not in state and key in required:
                raise ArgumentError(f"state has no {key!r}; {checks.STATE_FIX}")
            if key in state and state[key] != mine[key]:
                what = key + (" (batch_size × world_size)" if key == "global_batch_size" else "")
                raise ArgumentError(f"cannot resume: saved {key}={checks.show(state[key])}, this stream has "
                                    f"{key}={mine[key]!r}; build this stream with the saved {what} to continue that "
                                    "run")  # fmt: skip

    def _regrow(self, state: dict[str, Any], position: int, keep_going: bool) -> None:
        """Take the eras of the data the state's run read (runtime/growth.py)."""
        base = self._base
        eras, samplers, self._grown = growth.eras_for(
            self.dataset, state, position, keep_going,
            lambda part: base if part is None else base.over(part.n_tokens, part.shards),
            lambda sampler: sampler.steps_per_epoch)  # fmt: skip
        if len(eras) > 1 and self.order == "rows" and base.n_rows is not None:
            raise ArgumentError("cannot continue window batches in row order on a grown split (their epochs end "
                                "inside steps); continue on the data the state was saved on, or start a new run "
                                "on the grown split")  # fmt: skip
        if len(eras) > 1 and len(self.schedule.seq_lens) > 1:
            raise ArgumentError("cannot continue a schedule of several seq_lens on a grown split; start from step 0")
        self.offsets = growth.GrownOffsets(eras, samplers) if len(eras) > 1 else base

    def trace_reads(self, position: int) -> tuple[np.ndarray, np.ndarray | int, None]:
        """This rank's rows at `position`: their offsets, their reads' length, one span a row."""
        offsets, length = self._reads(position)
        return offsets, length, None

    def global_reads(self, position: int) -> tuple[np.ndarray, int]:
        offsets, shift, seq_len = self._global_rows(position)
        return offsets, seq_len + shift

    # -- producing batches -------------------------------------------------------------------

    def _rows(self, step: int) -> tuple[np.ndarray, int, int]:
        """This rank's rows at position `step`: offsets, shift, seq_len."""
        offsets, shift, seq_len = self._global_rows(step)
        b = len(offsets) // self.world_size
        return offsets[self.rank * b : (self.rank + 1) * b], shift, seq_len

    def _reads(self, step: int) -> tuple[np.ndarray, int]:
        """What step `step` reads on this rank: its row offsets and the tokens per row."""
        offsets, shift, seq_len = self._rows(step)
        return offsets, seq_len + shift

    def _finish(self, buf: torch.Tensor, step: int, offsets: np.ndarray, shift: int, T: int) -> Batch:
        """x, y from buf ([rows, T + shift] int32, host or device): one widening copy of an
        overlapping [2, rows, T] view into a new int64 tensor whose halves are x, y."""
        rows = len(offsets)
        pair = torch.empty((2, rows, T), dtype=torch.int64, device=buf.device)
        rows_view = buf.as_strided((2, rows, T), (shift, buf.stride(0), 1))
        if pair.device.type != "cpu":
            pair.copy_(rows_view)
        else:
            # numpy's cast copy runs on this thread. torch splits a copy this size over its
            # intra-op threads, and on a machine whose cores are busy with other work it waits
            # milliseconds for the second one (2 cores: ~3 ms per batch on average instead of ~30 us).
            np.copyto(pair.numpy(), rows_view.numpy())
        return self._batch(pair, step, offsets, shift, T)

    def _batch(self, pair: torch.Tensor, step: int, offsets: np.ndarray, shift: int, T: int) -> Batch:
        """The batch of x, y = pair[0], pair[1] ([2, rows, T] int64), with what the stream adds."""
        rows = len(offsets)
        x, y = pair[0], pair[1]
        if self.grouped:
            x = x.view(rows, T // shift, shift)
            y = y.view(rows, T // shift, shift)
        batch = Batch(x, y, self._reported(step), shift, offsets)
        if self.cu_seqlens:
            batch.cu_seqlens, batch.max_seqlen = self._boundaries(offsets, x.device, T)
        return self._augmented(batch, batch.step)

    def _skips_changed(self) -> None:
        self._pending = None  # a batch staged for the next position may be another step's now
        self._ahead.reset()

    def _boundaries(self, offsets: np.ndarray, device: torch.device, T: int) -> tuple[torch.Tensor, int]:
        cuts = [np.array([0], dtype=np.int64)]
        for r, o in enumerate(offsets.tolist()):
            inside = self.store.doc_starts_in(o, o + T) - o
            cuts.append(r * T + np.concatenate([inside, [T]]))
        cu = np.concatenate(cuts)
        host = torch.from_numpy(cu.astype(np.int32))
        return (host.to(device) if self._res is None else self._res.send(host)), int(np.diff(cu).max())

    def cpu_batch(self, step: int) -> Batch:
        """Batch `step` for this rank, on the CPU: a pure function of (seed, step, rank)."""
        return self._cpu_batch(self._position(checks.nonnegative("step", step)))

    def _cpu_batch(self, step: int) -> Batch:
        offsets, shift, T = self._rows(step)
        if self._scratch is None:  # rows read (not gathered from a map) land here; never handed out
            self._scratch = np.empty(self._most_tokens(), dtype=np.uint32)
        rows = self.store.gather(offsets, T + shift, self._scratch, key=self._ahead.key(step))
        return self._finish(torch.from_numpy(rows.view(np.int32)), step, offsets, shift, T)

    def _served(self, step: int, stride: int = 1) -> Batch:
        """`_cpu_batch(step)` as the next of a sequence of steps `stride` apart: the store is
        told the rows of the steps after it (exact prefetch) and then that this one is done."""
        self._ahead.before(step, stride)
        batch = self._cpu_batch(step)
        self._ahead.after(step)
        return batch

    def _submit(self, step: int) -> tuple[int, Any]:
        offsets, shift, T = self._rows(step)
        if self._ring is None or self._ring_for != self.schedule:
            self._ring, self._ring_for = Ring(self.device, self._most_tokens()), self.schedule
        host = self._ring.host(len(offsets), T + shift)
        self._ahead.before(step)
        self.store.read_rows(offsets, host.numpy().view(np.uint32), key=self._ahead.key(step))
        self._ahead.after(step)
        moved, event = self._ring.send(host)
        return step, (moved, event, offsets, shift, T)

    def _most_tokens(self) -> int:
        """The most tokens one step reads on this rank, over the whole schedule."""
        return max(p.global_batch // self.world_size * (p.seq_len + self._offsets(p.seq_len).shift.max)
                   for p in self.schedule.phases)  # fmt: skip

    def __next__(self) -> Batch:
        if self._res is not None:
            offsets, shift, T = self._rows(self.step)
            batch = self._batch(self._res.pair(offsets, shift, T), self.step, offsets, shift, T)
            self.step += 1
            return batch
        if not self.staged:
            batch = self._served(self.step)
            self.step += 1  # after the read: a step whose read failed is asked for again
            return batch
        if self._pending is None or self._pending[0] != self.step:
            self._pending = self._submit(self.step)
        step, (moved, event, offsets, shift, T) = self._pending
        assert self._ring is not None
        buf = self._ring.receive(moved, event)
        batch = self._finish(buf, step, offsets, shift, T)
        self.step += 1
        self._pending = self._submit(self.step) if self.prefetch else None
        return batch

    def __iter__(self) -> Iterator[Batch]:
        info = torch.utils.data.get_worker_info()
        no_workers(self._res)
        if info is None:
            return self
        return self._worker_steps(info.id, info.num_workers)

    def _worker_steps(self, worker: int, workers: int) -> Iterator[Batch]:
        self._worker_started()
        step = self.step + worker
        while True:
            yield self._served(step, workers)
            step += workers
