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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError
from ..packing import io as packing_io
from . import checks, growth
from .batches import resolve_rank
from .packedbatch import PackedBatch
from .sampling import step_rng
from .stepstream import StepStream

IGNORE = -100
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

    def batches(self, batch_size: int, *, rank: int | None = None, world_size: int | None = None,
                device: str | torch.device = "cpu", padding_free: bool = False) -> PackedStream:  # fmt: skip
        """A resumable stream of collated batches for one rank (see `PackedStream`)."""
        return PackedStream(self, batch_size, rank=rank, world_size=world_size, device=device,
                            padding_free=padding_free)  # fmt: skip


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
    segments = []
    for r in range(n_rows):
        mine = np.concatenate([[0], np.cumsum(lengths[row == r])])
        segments.append((np.append(mine, T) if real[r] < T else mine).astype(np.int32))
    return {"input_ids": torch.from_numpy(ids.reshape(n_rows, T)), "labels": torch.from_numpy(label_rows),
            "position_ids": torch.from_numpy(position.reshape(n_rows, T)), "length": real,
            "segments": segments}  # fmt: skip


def collate_packed(samples: Sequence[Mapping[str, Any]], padding_free: bool = False) -> dict[str, Any]:
    """Samples of a PackedDataset as one batch: input_ids/labels/position_ids [B, seq_len] and
    the segments of the batch flattened into one cu_seqlens (int32) with its max_seqlen.
    padding_free: only each sample's real tokens, concatenated into one [1, total] row (the
    shape of Hugging Face's DataCollatorWithFlattening), its segments in cu_seqlens."""
    if not samples:
        raise ArgumentError("collate_packed got no samples; pass at least one")
    cus, at = [torch.zeros(1, dtype=torch.int32)], 0
    keys = ("input_ids", "labels", "position_ids")
    if padding_free:
        parts: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
        for s in samples:
            n = int(s["length"])
            for k in keys:
                parts[k].append(s[k][:n])
            cu = s["cu_seqlens"]
            cu = cu[cu <= n] if int(cu[-1]) != n else cu
            cus.append(cu[1:] + at)
            at += n
        out: dict[str, Any] = {k: torch.cat(v).unsqueeze(0) for k, v in parts.items()}
    else:
        out = {k: torch.stack([s[k] for s in samples]) for k in keys}
        for s in samples:
            cus.append(s["cu_seqlens"][1:] + at)
            at += len(s["input_ids"])
    cu_all = torch.cat(cus)
    out["cu_seqlens"] = cu_all
    out["max_seqlen"] = int((cu_all[1:] - cu_all[:-1]).max())
    return out


class PackedStream(StepStream):
    """Epoch after epoch, step s of epoch e gives this rank packs
    order(e)[s·G + rank·B : s·G + (rank+1)·B] with G = B × world_size: every rank the same
    steps per epoch (len // G; exact when the plan was made with multiple=G), no pack twice in an
    epoch. `state_dict()` is a few integers; `load_state_dict()` continues exactly."""

    def __init__(self, packs: PackedDataset, batch_size: int, *, rank: int | None = None,
                 world_size: int | None = None, device: str | torch.device = "cpu",
                 padding_free: bool = False) -> None:  # fmt: skip
        self.packs, self.batch_size = packs, checks.positive("batch_size", batch_size)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.device, self.padding_free = checks.device(device), checks.flag("padding_free", padding_free)
        g = self.batch_size * self.world_size
        self.steps_per_epoch = len(packs) // g
        if self.steps_per_epoch == 0:
            raise ArgumentError(f"{len(packs)} packs cannot fill one global batch of {g} (batch_size × world_size); "
                                "lower batch_size or seq_len")  # fmt: skip
        self.left_over = len(packs) % g
        self.step = 0  # global step across epochs

    kind = "packed"

    @property
    def seed(self) -> int:
        return self.packs.seed

    def state_dict(self, in_hand: int = 0) -> dict[str, Any]:
        plan = self.packs.plan
        return {"kind": "packed", "step": self._reported(checks.rewind(self.step, in_hand)), "seed": self.packs.seed,
                "seq_len": plan.seq_len, "strategy": plan.strategy, "overlong": plan.overlong, "packs": plan.n_packs,
                **({"multiple": plan.multiple} if plan.multiple != 1 else {}),
                "global_batch_size": self.global_batch_size, "shuffle": self.packs.shuffle,
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
        packs, epoch, within = self._epoch_of(step)
        first = within * self.global_batch_size + self.rank * self.batch_size
        return packs.order(epoch)[first : first + self.batch_size]

    def batch(self, step: int) -> PackedBatch:
        """Batch `step` for this rank: a pure function of (plan, seed, step, rank)."""
        packs = self._epoch_of(step)[0]
        ids = self._ids(step)
        return self._finish(self.assemble(packs.rows(ids), ids, self.packs.seq_len), step)

    def reads(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        starts, lengths, _ = self._epoch_of(step)[0].items(self._ids(step))
        return starts, lengths

    def trace_reads(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        return self._epoch_of(step)[0].items(self._ids(step))  # each row: its items one after another

    def global_reads(self, step: int) -> tuple[np.ndarray, np.ndarray]:
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
        if self.padding_free:
            keep = (torch.arange(T)[None, :] < torch.from_numpy(rows["length"])[:, None]).flatten()
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
