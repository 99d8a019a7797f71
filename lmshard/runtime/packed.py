"""Packed datasets: whole documents packed into rows of seq_len tokens by a plan made from the
document index (`lmshard/packing/planner.py`), shuffled after planning and reshuffled per epoch.

    packs = TokenDataset("data/mycorpus").packed(4096, strategy="bfd", seed=0)
    packs.metrics                       # fill, the lower bound, split/truncated/dropped counts
    sample = packs[0]                   # input_ids, labels, position_ids, cu_seqlens, max_seqlen
    loader = DataLoader(packs, batch_size=8, collate_fn=collate_packed)
    stream = packs.batches(8)           # or a resumable stream, the same steps on every rank

A sample's `labels` are already shifted, as `y` is in lmshard's other batches: labels[i] is the
token after input_ids[i] in the same document, and -100 at the last token of every document
(the next token belongs to another document; `mask_boundary_labels=False` keeps it when that
document is in the same pack) and on padding. `position_ids` restart at 0 at each document and
at the padding. `cu_seqlens` (int32) holds the segment boundaries, padding as a last segment.
A model that shifts labels itself (Hugging Face's causal LMs) wants `input_ids` as labels instead.

The plan is cached in the dataset directory (`lmshard/packing/io.py`: `cached_plan`); for a
dataset at a URL, under its `cache_dir` (or kept in memory only, without one).

Memory model: the plan (per item 8 + 8 bytes, per pack 8 bytes) and the permutations of the pack
ids of the last two epochs used (8 bytes per pack each); a sample reads its own tokens only (seq_len uint32).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError, ConfigError
from ..packing import io as packing_io
from . import checks, growth
from .batches import resolve_rank
from .packedbatch import PackedBatch, collate_packed, row_segments
from .resident import send, stream_device
from .sampling import step_rng
from .schedule import parse_order
from .schedule import resolve as resolve_schedule
from .stepstream import StepStream

IGNORE = -100
__all__ = ["IGNORE", "PackedDataset", "PackedStream", "build_rows", "collate_packed"]
_EPOCH_SALT = 0x9AC4ED


class PackedDataset(torch.utils.data.Dataset):
    """Map-style: item i is pack `order[i]` of the epoch set by `set_epoch` (works with
    DataLoader and DistributedSampler). `multiple` raises the pack count to a multiple of it
    (pass world_size × batch_size) so that `batches()` gives every rank the same steps."""

    def __init__(
        self,
        data: Any,
        seq_len: int,
        *,
        strategy: str = "bfd",
        overlong: str = "split",
        seed: int = 0,
        multiple: int = 1,
        pad_id: int | None = None,
        mask_boundary_labels: bool = True,
        shuffle: bool = True,
    ) -> None:
        if not hasattr(data, "store") or not hasattr(data, "eot_id"):  # a TokenDataset (not imported: no cycle)
            raise ArgumentError(
                f"data={checks.show(data)} is not a TokenDataset; call TokenDataset(...).packed(seq_len)"
            )
        self.data, self.seq_len = data, checks.positive("seq_len", seq_len)
        self.seed, self.shuffle = checks.seed(seed), checks.flag("shuffle", shuffle)
        self.mask_boundary_labels = checks.flag("mask_boundary_labels", mask_boundary_labels)
        high = data.vocab_size - 1
        self.pad_id = data.eot_id if pad_id is None else checks.integer("pad_id", pad_id, low=0, high=high)
        self.plan = packing_io.cached_plan(data.plan_dir, data.store.doc_lengths(), self.seq_len, strategy, overlong,
                                           multiple)  # fmt: skip
        self.epoch = 0
        self._orders: dict[int, np.ndarray] = {}

    def __repr__(self) -> str:
        return (f"PackedDataset({self.data!r}, seq_len={self.seq_len}, strategy={self.plan.strategy!r}, "
                f"packs={len(self)}, fill={self.metrics['fill']:.4f})")  # fmt: skip

    @property
    def metrics(self) -> dict[str, Any]:
        return self.plan.metrics()

    def __len__(self) -> int:
        return self.plan.n_packs

    def head(self, n_docs: int) -> PackedDataset:
        """The same packing over the split's first `n_docs` documents only (what a run drew from
        before the split grew: runtime/growth.py); its plan is cached like any other."""
        head = copy.copy(self)
        plan = self.plan
        head.plan = packing_io.cached_plan(self.data.plan_dir, self.data.store.doc_lengths()[:n_docs], self.seq_len,
                                           plan.strategy, plan.overlong, plan.multiple)  # fmt: skip
        head._orders = {}
        return head

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle the packs from (seed, epoch)."""
        self.epoch = checks.nonnegative("epoch", epoch)

    def order(self, epoch: int | None = None) -> np.ndarray:
        """The pack ids in the order of `epoch` (default: the current one); the last two built
        are kept."""
        e = self.epoch if epoch is None else checks.nonnegative("epoch", epoch)
        if e not in self._orders:  # two kept: a stream reading ahead across an epoch's end needs both
            n = self.plan.n_packs
            perm = step_rng(self.seed, e, _EPOCH_SALT).permutation(n) if self.shuffle else np.arange(n)
            self._orders = {**dict(list(self._orders.items())[-1:]), e: perm}
        return self._orders[e]

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not checks.is_int(i) or not 0 <= int(i) < len(self):
            raise IndexError(i)
        return self.pack(int(self.order()[int(i)]))

    def pack(self, p: int) -> dict[str, Any]:
        """Pack `p` of the plan (not shuffled) as a sample."""
        rows = self.rows(np.array([p]))
        sample = {k: v[0] for k, v in rows.items() if k in ("input_ids", "labels", "position_ids")}
        cu = rows["segments"][0]
        return {**sample, "cu_seqlens": torch.from_numpy(cu), "max_seqlen": int(np.diff(cu).max()),
                "length": int(rows["length"][0])}  # fmt: skip

    def rows(self, packs: np.ndarray) -> dict[str, Any]:
        """Packs as [N, seq_len] int64 input_ids, labels and position_ids built with whole-array
        numpy operations, plus each row's real length and segment boundaries (int32, padding as
        a last segment)."""
        starts, lengths, counts = self.items(packs)
        return build_rows(starts, lengths, counts, self.seq_len, self.pad_id, self.mask_boundary_labels,
                          self.data.store.read_spans)  # fmt: skip

    def items(self, packs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The items of `packs`, row after row: their starts in the split and lengths, and how
        many items each pack holds."""
        plan = self.plan
        packs = np.asarray(packs, dtype=np.int64)
        counts = plan.ptr[packs + 1] - plan.ptr[packs]
        first_of_row = np.cumsum(counts) - counts
        take = np.repeat(plan.ptr[packs] - first_of_row, counts) + np.arange(int(counts.sum()))
        return plan.start[take], plan.length[take], counts

    def batches(self, batch_size: int | None = None, *, rank: int | None = None, world_size: int | None = None,
                device: str | torch.device | None = None, padding_free: bool = False, schedule: Any = None,
                order: str | None = None) -> PackedStream:  # fmt: skip
        """A resumable stream of collated batches for one rank (see `PackedStream`)."""
        return PackedStream(self, batch_size, rank=rank, world_size=world_size, device=device,
                            padding_free=padding_free, schedule=schedule, order=order)  # fmt: skip


def build_rows(starts: np.ndarray, lengths: np.ndarray, counts: np.ndarray, T: int, pad_id: int,
               mask_boundary_labels: bool, read_spans: Any) -> dict[str, Any]:  # fmt: skip
    """Rows of T tokens from items (`starts`/`lengths`, `counts` per row, in row order) read with
    one `store.read_spans(starts, lengths, out, at)`: [N, T] int64 input_ids, labels and position_ids built with
    whole-array numpy operations, each row's real length, and its segment boundaries (int32,
    padding as a last segment)."""
    n_rows = len(counts)
    first_of_row = np.cumsum(counts) - counts
    row = np.repeat(np.arange(n_rows), counts)
    ends = np.cumsum(lengths)  # over all items of all rows
    row_base = np.repeat(ends[first_of_row] - lengths[first_of_row], counts)
    at = ends - lengths - row_base + row * T  # where each item lands in the flat [N*T] buffer
    tokens = np.full(n_rows * T, pad_id, dtype=np.uint32)
    read_spans(starts, lengths, tokens, at)
    real = np.bincount(row, weights=lengths, minlength=n_rows).astype(np.int64)
    ids = tokens.view(np.int32).astype(np.int64)
    labels = np.full(len(ids), IGNORE, dtype=np.int64)
    labels[:-1] = ids[1:]
    item_ends = at + lengths - 1
    row_ends = np.arange(n_rows) * T + real - 1
    labels[item_ends if mask_boundary_labels else row_ends] = IGNORE
    pad = np.arange(T)[None, :] >= real[:, None]
    label_rows = labels.reshape(n_rows, T)
    label_rows[pad] = IGNORE
    seg_start = np.zeros(len(ids), dtype=np.int64)
    seg_start[at] = at
    padded = np.flatnonzero(real < T)
    seg_start[padded * T + real[padded]] = padded * T + real[padded]  # the padding is a segment too
    np.maximum.accumulate(seg_start, out=seg_start)
    position = np.arange(len(ids), dtype=np.int64) - seg_start
    segments = row_segments(lengths, counts, real, T)
    return {"input_ids": torch.from_numpy(ids.reshape(n_rows, T)), "labels": torch.from_numpy(label_rows),
            "position_ids": torch.from_numpy(position.reshape(n_rows, T)), "length": real,
            "segments": segments}  # fmt: skip


class PackedStream(StepStream):
    """Epoch after epoch, step s of epoch e gives this rank packs
    order(e)[s·G + rank·B : s·G + (rank+1)·B] with G = B × world_size: every rank the same
    steps per epoch (len // G; exact when the plan was made with multiple=G), no pack twice in an
    epoch. `state_dict()` is a few integers; `load_state_dict()` continues exactly.

    order="rows" (the default with a schedule of batch sizes, runtime/schedule.py): the run's
    row g is pack order(g // n)[g mod n] of the n packs, whatever the batch size, so every batch
    size reads the same packs in the same order and a batch-size change on resume continues them
    (an epoch may end inside a step; no pack is left out). The rows are the plan's seq_len."""

    def __init__(self, packs: PackedDataset, batch_size: int | None = None, *, rank: int | None = None,
                 world_size: int | None = None, device: str | torch.device | None = None,
                 padding_free: bool = False, schedule: Any = None, order: str | None = None) -> None:  # fmt: skip
        self.packs = packs
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self._res = getattr(packs.data, "resident", None)  # the split on the device: rows built there
        self.device = stream_device(getattr(packs.data, "device", None) if device is None else device, self._res,
                                    "this split")  # fmt: skip
        self.padding_free = checks.flag("padding_free", padding_free)
        T = packs.seq_len
        self.schedule = self._given = resolve_schedule(schedule, batch_size, None if schedule is not None else T,
                                                       self.world_size)  # fmt: skip
        if self.schedule.seq_lens != [T]:
            raise ArgumentError(f"schedule seq_lens {self.schedule.seq_lens}: a packed stream's rows are its plan's "
                                f"seq_len {T}; pack once per length, or use random or window batches for a "
                                "seq_len schedule")  # fmt: skip
        self._scheduled = not self.schedule.constant_shape
        self.order, self._order_given = parse_order(order, "rows" if self._scheduled else "steps")
        if self._scheduled and self.order != "rows":
            raise ArgumentError("a schedule needs order='rows'; pass order='rows'")
        g = self.schedule.phases[0].global_batch
        self.steps_per_epoch = len(packs) // g
        if self.steps_per_epoch == 0 and self.order == "steps":
            raise ArgumentError(f"{len(packs)} packs cannot fill one global batch of {g} (batch_size × world_size); "
                                "lower batch_size or seq_len")  # fmt: skip
        self.left_over = len(packs) % g
        self.step = 0  # global step across epochs

    kind = "packed"

    @property
    def seed(self) -> int:
        return self.packs.seed

    @property
    def batch_size(self) -> int:  # type: ignore[override]
        """Rows per step on this rank at the next step."""
        return self.schedule.phase(self._data(self.step)).global_batch // self.world_size

    @property
    def epoch(self) -> int | None:
        if self.order == "steps":
            return super().epoch
        return self.schedule.first_row(self._data(self.step)) // len(self.packs)

    def set_epoch(self, epoch: int) -> None:
        """Jump to the first step of `epoch`; in row order, the first step whose rows all belong to it or later."""
        if self.order == "steps":
            return super().set_epoch(epoch)
        if self._scheduled:
            raise ConfigError("set_epoch needs one batch size; a scheduled stream resumes with load_state_dict")
        self.step = -(-checks.nonnegative("epoch", epoch) * len(self.packs) // self.global_batch_size)
        if self._ahead is not None:
            self._ahead.reset()

    def _row_ids(self, first: int, count: int) -> np.ndarray:
        """Row order: the packs of the run's rows [first, first + count)."""
        epoch, within = np.divmod(np.arange(first, first + count, dtype=np.int64), len(self.packs))
        out = np.empty(count, dtype=np.int64)
        for e in np.unique(epoch).tolist():
            mine = epoch == e
            out[mine] = self.packs.order(e)[within[mine]]
        return out

    def _load(self, state: Mapping[str, Any], step: int, keep_going: bool, from_step: int | None = None) -> None:
        state = dict(state)
        saved = state.get("order", "steps")  # states saved before row order existed drew by step
        if saved != self.order and saved in ("rows", "steps") and state.get("kind") == self.kind:
            if self._order_given or self._scheduled:
                raise ArgumentError(f"cannot resume: the state was drawn in order={saved!r} and this stream in "
                                    f"order={self.order!r}; build the stream with order={saved!r}")  # fmt: skip
            self.order = saved
        if self.order == "rows":
            self._resume_shape(state, step, from_step)
        elif from_step is not None:
            raise ArgumentError("from_step= moves a row-order stream onto a new schedule; this stream draws by step")
        state["order"] = saved
        super()._load(state, step, keep_going)
        if self.order == "rows" and self._eras:
            raise ArgumentError("cannot continue packed batches in row order on a grown split (their epochs end "
                                "inside steps); continue on the data the state was saved on, or start a new run "
                                "on the grown split")  # fmt: skip

    def state_dict(self, in_hand: int = 0, after: Any = None) -> dict[str, Any]:
        plan = self.packs.plan
        step = self._resumes_at(in_hand, after)
        return {"kind": "packed", "step": self._reported(step), "seed": self.packs.seed, "order": self.order,
                "seq_len": plan.seq_len, "strategy": plan.strategy, "overlong": plan.overlong, "packs": plan.n_packs,
                **({"multiple": plan.multiple} if plan.multiple != 1 else {}),
                "global_batch_size": self.schedule.phase(self._data(step)).global_batch,
                **({"schedule": self.schedule.record()} if not self.schedule.constant_shape else {}),
                "shuffle": self.packs.shuffle,
                **checks.data_of(self.packs.data), **self._grown_state(),
                **self._skip_state(), **self._augment_state()}  # fmt: skip

    def _dataset(self) -> Any:
        return self.packs.data if hasattr(self.packs.data, "data_id") else None

    def _over(self, part: growth.Prefix | None) -> PackedDataset:
        return self.packs if part is None else self.packs.head(part.n_docs)

    def _per_epoch(self, sampler: PackedDataset) -> int:
        steps = len(sampler) // self.global_batch_size
        if steps == 0:
            raise ArgumentError(f"the split before it grew packs into {len(sampler)} packs, fewer than one global "
                                f"batch of {self.global_batch_size}; start from step 0")  # fmt: skip
        return steps

    def _ids(self, step: int) -> np.ndarray:
        if self.order == "rows":
            d = self._data(checks.nonnegative("step", step))
            b = self.schedule.phase(d).global_batch // self.world_size
            return self._row_ids(self.schedule.first_row(d) + self.rank * b, b)
        packs, epoch, within = self._epoch_of(step)
        first = within * self.global_batch_size + self.rank * self.batch_size
        return packs.order(epoch)[first : first + self.batch_size]

    def _sampler(self, step: int) -> PackedDataset:
        """The plan step `step` draws from (in step order, an era's over a split that grew)."""
        return self.packs if self.order == "rows" else self._epoch_of(step)[0]

    def batch(self, step: int) -> PackedBatch:
        """Batch `step` for this rank: a pure function of (plan, seed, step, rank)."""
        packs = self._sampler(step)
        ids = self._ids(step)
        if self._res is None:
            return self._finish(self.assemble(packs.rows(ids), ids, self.packs.seq_len), step)
        rows = self._res.packed_rows(*packs.items(ids), packs.seq_len, packs.pad_id, packs.mask_boundary_labels,
                                     IGNORE)  # fmt: skip
        return self._finish(self.assemble(rows, ids, packs.seq_len), step)

    def reads(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        starts, lengths, _ = self._sampler(step).items(self._ids(step))
        return starts, lengths

    def trace_reads(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        return self._sampler(step).items(self._ids(step))  # each row: its items one after another

    def global_reads(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        if self.order == "rows":
            d = self._data(checks.nonnegative("step", step))
            starts, lengths, _ = self.packs.items(self._row_ids(self.schedule.first_row(d),
                                                                self.schedule.phase(d).global_batch))  # fmt: skip
            return starts, lengths
        packs, epoch, within = self._epoch_of(step)
        g = self.global_batch_size
        starts, lengths, _ = packs.items(packs.order(epoch)[within * g : (within + 1) * g])
        return starts, lengths

    @property
    def store(self) -> Any:
        return self.packs.data.store

    def assemble(self, rows: dict[str, Any], ids: np.ndarray, T: int) -> PackedBatch:
        """A batch from `PackedDataset.rows` output: padded [B, T] rows with cu_seqlens over
        them (padding as a segment of its own), or with `padding_free` one [1, real tokens] row."""
        keys = ("input_ids", "labels", "position_ids")
        if self.padding_free:  # each row's first length tokens, gathered where the rows are
            device, lengths = rows["input_ids"].device, np.asarray(rows["length"], dtype=np.int64)
            base = np.arange(len(lengths)) * T - (np.cumsum(lengths) - lengths)
            sent = send(np.concatenate([base, lengths]), device)  # (where the rows are: no wait on CUDA)
            total = int(lengths.sum())
            keep = torch.repeat_interleave(sent[: len(base)], sent[len(base) :], output_size=total)
            keep += torch.arange(total, device=device)
            out = PackedBatch({k: rows[k].flatten()[keep].unsqueeze(0) for k in keys})
            bounds = [
                seg if seg[-1] == n else seg[:-1] for seg, n in zip(rows["segments"], rows["length"], strict=True)
            ]
            shifts = np.cumsum(rows["length"]) - rows["length"]
        else:
            out = PackedBatch({k: rows[k] for k in keys})
            bounds, shifts = rows["segments"], np.arange(len(ids)) * T
        cu = np.concatenate([[0], *[b[1:] + o for b, o in zip(bounds, shifts.tolist(), strict=True)]])
        out["cu_seqlens"] = torch.from_numpy(cu.astype(np.int32))
        out["max_seqlen"] = int(np.diff(cu).max())
        out["packs"] = ids
        return out
