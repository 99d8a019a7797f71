"""`TokenDataset.packed(seq_len, strategy="stream", buffer=N)`: packs made as the split is read,
in windows of about N documents from a shuffled order of blocks (`lmshard/packing/stream.py`),
with no plan of the whole split.

    packs = TokenDataset("data/web").packed(4096, strategy="stream", buffer=10_000)
    for batch in packs.batches(8):      # input_ids, labels, position_ids, cu_seqlens, max_seqlen
        ...

The stream has no end: each rank goes on into its next epoch (a new block order) when its part of
the split runs out, so every rank takes as many steps as the loop asks. `state_dict()` is
(epoch, window, packs handed out of it, step); resuming re-plans one window.

Memory model: `packing/stream.py`'s (the block order and one window's plan), plus the rows of one
batch. The loader reads rows in this process: no DataLoader workers are needed or used.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import torch

from .. import packing
from ..errors import ArgumentError
from ..packing import stream as streampack
from . import checks
from .batches import resolve_rank
from .packed import PackedBatch, build_rows

HISTORY = 16


class StreamPacked:
    """Constant-memory packing of a split (see the module docstring)."""

    def __init__(self, data: Any, seq_len: int, *, buffer: int = streampack.DEFAULT_BUFFER, overlong: str = "split",
                 seed: int = 0, pad_id: int | None = None, mask_boundary_labels: bool = True,
                 shuffle: bool = True) -> None:  # fmt: skip
        self.data, self.seq_len = data, checks.positive("seq_len", seq_len)
        self.buffer = checks.positive("buffer", buffer)
        if overlong not in packing.OVERLONG:
            raise ArgumentError(f"overlong={checks.show(overlong)} is not a policy; pass 'split' (the default), "
                                "'truncate' or 'drop'")  # fmt: skip
        self.overlong, self.seed = overlong, checks.seed(seed)
        self.shuffle = checks.flag("shuffle", shuffle)
        self.mask_boundary_labels = checks.flag("mask_boundary_labels", mask_boundary_labels)
        high = data.vocab_size - 1
        self.pad_id = data.eot_id if pad_id is None else checks.integer("pad_id", pad_id, low=0, high=high)
        store = data.store
        self.layout = streampack.Layout(np.array([s.n_docs for s in store.shards]))  # (no index is read for this)
        if self.layout.n_blocks == 0:
            raise ArgumentError(f"{data!r} has no document to pack")

    def __repr__(self) -> str:
        return f"StreamPacked({self.data!r}, seq_len={self.seq_len}, buffer={self.buffer})"

    def window(self, epoch: int, rank: int, world: int, w: int, order: np.ndarray) -> tuple[Any, np.ndarray] | None:
        """Window w's plan with its items' starts in the split (None: past the end of the rank's
        part; a plan of None: every document of the window dropped as overlong)."""
        blocks = self.layout.window_blocks(order, rank, world, self.buffer, w)
        if not len(blocks):
            return None
        store = self.data.store
        starts, lengths = [], []
        for b in blocks.tolist():
            k, lo, hi = self.layout.block(b)
            idx = np.asarray(store.index(k)[lo : hi + 1], dtype=np.int64)
            starts.append(idx[:-1] + int(store.starts[k]))
            lengths.append(np.diff(idx))
        glob, lens = np.concatenate(starts), np.concatenate(lengths)
        plan = streampack.plan_window(lens, self.seq_len, self.overlong)
        if plan is None:
            return None, np.zeros(0, np.int64)
        local = np.cumsum(lens) - lens
        doc = np.searchsorted(local, plan.start, side="right") - 1
        return plan, glob[doc] + (plan.start - local[doc])

    def batches(self, batch_size: int, *, rank: int | None = None, world_size: int | None = None,
                device: str | torch.device | None = None) -> StreamPackedBatches:  # fmt: skip
        return StreamPackedBatches(self, batch_size, rank=rank, world_size=world_size, device=device)


class StreamPackedBatches:
    """Batches of stream-packed rows for one rank, without end; `state_dict(in_hand=0)` /
    `load_state_dict` resume exactly; `metrics()` is the fill of the packs served."""

    def __init__(self, packs: StreamPacked, batch_size: int, *, rank: int | None = None,
                 world_size: int | None = None, device: str | torch.device | None = None) -> None:  # fmt: skip
        self.packs, self.batch_size = packs, checks.positive("batch_size", batch_size)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        if packs.layout.n_blocks < self.world_size:
            raise ArgumentError(f"strategy='stream' gives each rank whole blocks of {streampack.BLOCK_DOCS:,} "
                                f"documents, and this split has {packs.layout.n_blocks} for {self.world_size} ranks; "
                                "use fewer ranks, or strategy='bfd' (a plan of the whole split)")  # fmt: skip
        data_device = getattr(packs.data, "device", None) or "cpu"  # the dataset's (a resident one's)
        self.device = checks.device(data_device if device is None else device)
        self.epoch = self.w = self.p = self.step = 0
        self._history: collections.deque[tuple[int, int, int, int]] = collections.deque([(0, 0, 0, 0)], HISTORY)
        self._cached: tuple[tuple[int, int], Any] | None = None
        self._order: tuple[int, np.ndarray] | None = None
        self.served_rows = self.served_tokens = 0

    def __iter__(self) -> StreamPackedBatches:
        return self

    def _window(self) -> Any:
        key = (self.epoch, self.w)
        if self._cached is None or self._cached[0] != key:
            if self._order is None or self._order[0] != self.epoch:
                self._order = (self.epoch, self.packs.layout.order(self.packs.seed, self.epoch, self.packs.shuffle))
            found: Any = self.packs.window(self.epoch, self.rank, self.world_size, self.w, self._order[1])
            if found is not None and found[0] is not None:  # the window's pack order, drawn once per window
                found = (*found, streampack.pack_order(found[0].n_packs, self.packs.seed, self.epoch, self.rank, self.w,
                                                       self.packs.shuffle))  # fmt: skip
            self._cached = (key, found)
        return self._cached[1]  # type: ignore[no-any-return]

    def _next_pack(self) -> tuple[np.ndarray, np.ndarray]:
        empty = 0
        while True:
            found = self._window()
            if found is None:  # the rank's part of this epoch is done
                self.epoch, self.w, self.p = self.epoch + 1, 0, 0
                empty += 1
                if empty > 2:
                    raise ArgumentError(f"rank {self.rank} of {self.world_size} has no packable document in the "
                                        f"split; use fewer ranks, a larger seq_len or overlong='split'")  # fmt: skip
                continue
            plan, starts, *drawn = found
            if plan is None or self.p >= plan.n_packs:
                self.w, self.p = self.w + 1, 0
                continue
            q = int(drawn[0][self.p])
            self.p += 1
            a, b = int(plan.ptr[q]), int(plan.ptr[q + 1])
            return starts[a:b], plan.length[a:b]

    def __next__(self) -> PackedBatch:
        parts = [self._next_pack() for _ in range(self.batch_size)]
        starts = np.concatenate([s for s, _ in parts])
        lengths = np.concatenate([n for _, n in parts])
        counts = np.array([len(s) for s, _ in parts], dtype=np.int64)
        T = self.packs.seq_len
        rows = build_rows(starts, lengths, counts, T, self.packs.pad_id, self.packs.mask_boundary_labels,
                          self.packs.data.store.read_spans)  # fmt: skip
        cu = np.concatenate([np.zeros(1, np.int32)] + [seg[1:] + r * T for r, seg in enumerate(rows["segments"])])
        fields = {k: rows[k].to(self.device) for k in ("input_ids", "labels", "position_ids")}
        fields["cu_seqlens"] = torch.from_numpy(cu.astype(np.int32)).to(self.device)
        fields["max_seqlen"] = int(np.diff(cu).max())
        step = self.step
        self.step += 1
        self.served_rows += self.batch_size
        self.served_tokens += int(lengths.sum())
        self._history.append((self.epoch, self.w, self.p, self.step))
        return PackedBatch(fields, step)

    def metrics(self) -> dict[str, Any]:
        rows = self.served_rows
        return {"steps": self.step, "packs": rows, "tokens": self.served_tokens,
                "fill": self.served_tokens / (rows * self.packs.seq_len) if rows else 0.0}  # fmt: skip

    def state_dict(self, in_hand: int = 0) -> dict[str, Any]:
        want = self.step - checks.nonnegative("in_hand", in_hand)
        found = next((h for h in self._history if h[3] == want), None)
        if found is None:
            raise ArgumentError(f"in_hand={in_hand}: the stream keeps its last {HISTORY} positions; pass in_hand at "
                                f"most {min(self.step, HISTORY - 1)}")  # fmt: skip
        epoch, w, p, step = found
        pk = self.packs
        return {"kind": "stream_packed", "epoch": epoch, "window": w, "pack": p, "step": step, "rank": self.rank,
                "world_size": self.world_size, "batch_size": self.batch_size, "seq_len": pk.seq_len,
                "buffer": pk.buffer, "seed": pk.seed, "overlong": pk.overlong, "shuffle": pk.shuffle,
                **checks.data_of(pk.data)}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any], grown: str | None = None) -> None:
        """Continue from `state`; one saved on other data (also on this split before it grew) is refused."""
        mine = self.state_dict() if self.step == 0 else {**self.state_dict(), "step": 0}
        if not isinstance(state, dict) or state.get("kind") != "stream_packed":
            raise ArgumentError("not the state of a stream-packed stream; pass what its state_dict() returned")
        checks.cannot_grow("stream-packed", state.get("data"), mine.get("data"), grown)
        for key in ("rank", "world_size", "batch_size", "seq_len", "buffer", "seed", "overlong", "shuffle"):
            if state.get(key) != mine[key]:
                raise ArgumentError(f"the state was saved with {key}={state.get(key)!r} and this stream has "
                                    f"{key}={mine[key]!r}; resume with the same {key}")  # fmt: skip
        self.epoch, self.w = checks.state_int(state, "epoch", 0), checks.state_int(state, "window", 0)
        self.p, self.step = checks.state_int(state, "pack", 0), checks.state_int(state, "step", 0)
        self._history.clear()
        self._history.append((self.epoch, self.w, self.p, self.step))
