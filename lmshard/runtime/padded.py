"""Padded batches of whole documents, optionally grouped by length (for padded, not packed,
training: the LMMS-Engine design's `group_by_length`).

    stream = TokenDataset("data/mycorpus").padded_batches(8, max_len=2048, group_by_length=True)
    batch = next(stream)    # input_ids, labels, attention_mask [8, L]; L = the longest row

Each epoch shuffles the documents from (seed, epoch); with `group_by_length`, it cuts that order
into mega-batches of `mega` global batches, sorts each mega-batch by length (longest first) and
cuts it into global batches, whose order is shuffled again: rows of a batch have similar lengths
(little padding) while the order of batches stays random, as Hugging Face's
LengthGroupedSampler does. A global batch of B × world_size documents is dealt out B per rank,
so every rank gets the same number of steps per epoch (the documents left over after the last
full global batch wait for another epoch's shuffle). Documents longer than `max_len` are
truncated (default), split into pieces, or dropped, and counted (`stream.items`).

labels[i] is the token after input_ids[i] in the same document; -100 at each document's last
token and on padding. attention_mask is 1 on real tokens.

Memory model: per document 8 (start) + 8 (length) bytes, plus the orders of the last two epochs
used (8 bytes per document each); a batch reads its own tokens only.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError
from ..packing import make_items
from . import checks, growth
from .batches import resolve_rank
from .packed import IGNORE, PackedBatch
from .sampling import step_rng
from .stepstream import StepStream

_ORDER_SALT = 0x6A0B7E


class PaddedStream(StepStream):
    """An endless, resumable stream of padded batches of whole documents for one rank."""

    def __init__(self, data: Any, batch_size: int, max_len: int, *, seed: int = 0, group_by_length: bool = True,
                 mega: int = 50, overlong: str = "truncate", pad_id: int | None = None, rank: int | None = None,
                 world_size: int | None = None, device: str | torch.device | None = None,
                 pad_to_max: bool = False) -> None:  # fmt: skip
        self.data = data
        self.batch_size, self.max_len = checks.positive("batch_size", batch_size), checks.positive("max_len", max_len)
        self.seed, self.group_by_length = checks.seed(seed), checks.flag("group_by_length", group_by_length)
        self.mega, self.pad_to_max = checks.positive("mega", mega), checks.flag("pad_to_max", pad_to_max)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.device = checks.device((getattr(data, "device", None) or "cpu") if device is None else device)
        high = data.vocab_size - 1
        self.pad_id = data.eot_id if pad_id is None else checks.integer("pad_id", pad_id, low=0, high=high)
        self.overlong = overlong
        self.items = make_items(data.store.doc_lengths(), self.max_len, overlong)
        g = self.global_batch_size
        self.steps_per_epoch = len(self.items.length) // g
        if self.steps_per_epoch == 0:
            raise ArgumentError(f"{len(self.items.length)} documents cannot fill one global batch of {g} "
                                "(batch_size × world_size); lower batch_size")  # fmt: skip
        self.step = 0
        self._orders: dict[int, np.ndarray] = {}  # the last two epochs: reading ahead may cross an epoch's end

    kind = "padded"

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's documents as [steps_per_epoch, global batch] item ids."""
        if epoch in self._orders:
            return self._orders[epoch]
        rng = step_rng(self.seed, epoch, _ORDER_SALT)
        g, steps = self.global_batch_size, self.steps_per_epoch
        perm = rng.permutation(len(self.items.length))[: steps * g]
        if self.group_by_length:
            chunk = self.mega * g
            for a in range(0, len(perm), chunk):
                part = perm[a : a + chunk]
                perm[a : a + chunk] = part[np.argsort(-self.items.length[part], kind="stable")]
            batches = perm.reshape(steps, g)[rng.permutation(steps)]
        else:
            batches = perm.reshape(steps, g)
        self._orders = {**dict(list(self._orders.items())[-1:]), epoch: batches}
        return batches

    def state_dict(self, in_hand: int = 0, after: Any = None) -> dict[str, Any]:
        return {"kind": "padded", "step": self._reported(self._resumes_at(in_hand, after)), "seed": self.seed,
                "max_len": self.max_len,
                "group_by_length": self.group_by_length, "mega": self.mega, "overlong": self.overlong,
                "documents": len(self.items.length), "global_batch_size": self.global_batch_size,
                **checks.data_of(self.data), **self._grown_state(),
                **self._skip_state(), **self._augment_state()}  # fmt: skip

    def _dataset(self) -> Any:
        return self.data if hasattr(self.data, "data_id") else None

    def _over(self, part: growth.Prefix | None) -> PaddedStream:
        """Itself, or a copy that draws its epochs over the first documents of `part`."""
        if part is None:
            return self
        head = copy.copy(self)
        head.items = make_items(self.data.store.doc_lengths()[: part.n_docs], self.max_len, self.overlong)
        head.steps_per_epoch, head._orders = len(head.items.length) // self.global_batch_size, {}
        return head

    def _per_epoch(self, sampler: PaddedStream) -> int:
        if sampler.steps_per_epoch == 0:
            raise ArgumentError(f"the split before it grew has {len(sampler.items.length)} documents, fewer than one "
                                f"global batch of {self.global_batch_size}; start from step 0")  # fmt: skip
        return sampler.steps_per_epoch

    def _ids(self, step: int) -> np.ndarray:
        return self._global_ids(step)[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def _global_ids(self, step: int) -> np.ndarray:
        drawer, epoch, within = self._epoch_of(step)
        return drawer.order(epoch)[within]

    def global_reads(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        ids = self._global_ids(step)
        return self.items.start[ids], self.items.length[ids]

    def reads(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        ids = self._ids(step)
        return self.items.start[ids], self.items.length[ids]

    @property
    def store(self) -> Any:
        return self.data.store

    def batch(self, step: int) -> PackedBatch:
        """Batch `step` for this rank: a pure function of (lengths, options, seed, step, rank)."""
        ids = self._ids(step)
        starts, lengths = self.items.start[ids], self.items.length[ids]
        L = self.max_len if self.pad_to_max else int(lengths.max())
        tokens = np.full((len(ids), L), self.pad_id, dtype=np.uint32)
        self.data.store.read_spans(starts, lengths, tokens.reshape(-1), np.arange(len(ids), dtype=np.int64) * L)
        x = tokens.view(np.int32).astype(np.int64)
        mask = np.arange(L)[None, :] < lengths[:, None]
        labels = np.full_like(x, IGNORE)
        labels[:, :-1] = x[:, 1:]
        labels[~mask] = IGNORE
        labels[np.arange(len(ids)), lengths - 1] = IGNORE
        out = PackedBatch({"input_ids": torch.from_numpy(x), "labels": torch.from_numpy(labels),
                           "attention_mask": torch.from_numpy(mask.astype(np.int64))})  # fmt: skip
        out["items"], out["lengths"] = ids, lengths
        return self._finish(out, step)
