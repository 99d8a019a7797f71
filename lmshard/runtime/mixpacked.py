"""Packed batches of a mixture (`Mixture.packed_batches`): each row a pack of the source the
mixture's row tree assigns it to, each source's packs reshuffled each time they are used up.

Memory model: each source's plan and the pack orders of its last two epochs (see packed.py), and
per grown source the plan of each era before (runtime/growth.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError, ConfigError
from . import checks, growth
from .batches import resolve_rank
from .curriculum import CurriculumTree
from .mixing import RowTree
from .packed import IGNORE, PackedBatch, PackedDataset, PackedStream, build_rows
from .resident import stream_device
from .schedule import resolve as resolve_schedule
from .stepstream import StepStream


class MixturePackedStream(StepStream):
    """Packed batches of a mixture: row g of the run is pack m mod n of its source's order for
    that source's epoch m // n (m: the row's index within its source, n: the source's packs).
    Rank r takes rows [r·B, (r+1)·B) of each global batch, so every rank gets the same steps;
    there are no global epochs. Resumes from `state_dict()` like the other streams. Rows are
    numbered across steps, so a schedule of batch sizes (runtime/schedule.py) cuts the same
    sequence of rows into other steps, and a curriculum's weights follow the rows' tokens."""

    kind = "mixture/packed"

    def __init__(self, mix: Any, sources: list[PackedDataset], batch_size: int | None, *, rank: int | None,
                 world_size: int | None, device: str | torch.device | None, padding_free: bool,
                 schedule: Any = None) -> None:  # fmt: skip
        self.mix, self.sources = mix, sources
        self.seq_len, self.seed = sources[0].seq_len, sources[0].seed
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.schedule = self._given = resolve_schedule(schedule, batch_size, None if schedule is not None else
                                                       self.seq_len, self.world_size)  # fmt: skip
        if self.schedule.seq_lens != [self.seq_len]:
            raise ArgumentError(f"schedule seq_lens {self.schedule.seq_lens}: packed rows are their plans' seq_len "
                                f"{self.seq_len}; schedule the batch size only")  # fmt: skip
        self._scheduled = not self.schedule.constant_shape
        self._res = mix.resident  # the mixture on the device: rows built there
        self.device = stream_device(mix.device if device is None else device, self._res, "this mixture")
        self.tree: Any = RowTree(mix.int_weights, self.seed) if mix.curriculum is None else \
            CurriculumTree(mix.curriculum, self.seq_len, self.seed)  # fmt: skip
        self._assembler = PackedStream(sources[0], 1, rank=0, world_size=1, padding_free=padding_free)
        self.step = 0

    @property
    def batch_size(self) -> int:  # type: ignore[override]
        """Rows per step on this rank at the next step."""
        return self.schedule.phase(self._data(self.step)).global_batch // self.world_size

    def _load(self, state: Any, step: int, keep_going: bool, from_step: int | None = None) -> None:
        state = dict(state)
        self._resume_shape(state, step, from_step)
        state.setdefault("order", "rows")  # (states saved before it was recorded drew the same rows)
        super()._load(state, step, keep_going)

    @property
    def epoch(self) -> int | None:
        """None: a mixture's sources have epochs of their own (`Mixture.stream_report`)."""
        return None

    def set_epoch(self, epoch: int) -> None:
        raise ConfigError("a mixture's sources have epochs of their own; resume with load_state_dict")

    def state_dict(self, in_hand: int = 0, after: Any = None) -> dict[str, Any]:
        plan = self.sources[0].plan
        step = self._resumes_at(in_hand, after)
        return {"kind": self.kind, "step": self._reported(step), "seed": self.seed, "order": "rows",
                "seq_len": self.seq_len, "strategy": plan.strategy, "overlong": plan.overlong,
                "global_batch_size": self.schedule.phase(self._data(step)).global_batch,
                **({"schedule": self.schedule.record()} if not self.schedule.constant_shape else {}),
                "packs": [len(p) for p in self.sources], "mixture": self.mix.fingerprint(),
                "curriculum": None if self.mix.curriculum is None else self.mix.curriculum.record(),
                **self._grown_state(),
                **self._skip_state(), **self._augment_state()}  # fmt: skip

    eras: list[list[tuple[growth.Era, PackedDataset]]] = []

    def _regrow_sources(self, state: dict[str, Any], position: int, keep_going: bool) -> bool:
        """The eras of the sources that grew since the state's run began (runtime/growth.py)."""

        def make(s: int, part: growth.Prefix | None) -> tuple[PackedDataset, int]:
            packs = self.sources[s] if part is None else self.sources[s].head(part.n_docs)
            return packs, len(packs)

        self.eras, self._grown = growth.mixture_eras(self.mix, self.tree, state, position, keep_going,
                                                     self.schedule.first_row, make)  # fmt: skip
        self.eras = self.eras if any(self.eras) else []
        return True

    def _items(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(source and pack of each row; every row's items, in row order, at their addresses in
        the joint store: starts, lengths, items per row)."""
        step = self._data(checks.nonnegative("step", step))
        b = self.schedule.phase(step).global_batch // self.world_size
        first = self.schedule.first_row(step) + self.rank * b
        source, local = self.tree.assign(np.arange(first, first + b, dtype=np.int64))
        ids = np.empty(b, dtype=np.int64)
        drawn: list[Any] = [None] * b  # each row's packs (a grown source's era's own)
        for s in np.unique(source).tolist():
            mine = np.flatnonzero(source == s)
            eras: list[tuple[growth.Era, Any]] = self.eras[s] if self.eras else []
            eras = eras or [(growth.Era(0, 0, len(self.sources[s])), self.sources[s])]
            for where, era, packs in growth.split_by_era(eras, local[mine]):
                rows = mine[where]
                epoch, within = np.divmod(era.local(local[rows]), len(packs))
                for e in np.unique(epoch).tolist():
                    ids[rows[epoch == e]] = packs.order(e)[within[epoch == e]]
                for r in rows.tolist():
                    drawn[r] = packs
        parts = [drawn[r].items(ids[r : r + 1]) for r in range(b)]
        starts = np.concatenate([p[0] + self.mix.store.bases[s] for p, s in zip(parts, source.tolist(), strict=True)])
        return source, ids, starts, np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])

    def reads(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        _, _, starts, lengths, _ = self._items(step)
        return starts, lengths

    def trace_reads(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        _, _, starts, lengths, counts = self._items(step)
        return starts, lengths, counts

    @property
    def store(self) -> Any:
        return self.mix.store

    def batch(self, step: int) -> PackedBatch:
        """Batch `step` for this rank: a pure function of (weights, plans, seed, step, rank)."""
        source, ids, starts, lengths, counts = self._items(step)
        ref = self.sources[0]
        if self._res is None:
            rows = build_rows(starts, lengths, counts, self.seq_len, ref.pad_id, ref.mask_boundary_labels,
                              self.mix.store.read_spans)  # fmt: skip
        else:
            rows = self._res.packed_rows(starts, lengths, counts, self.seq_len, ref.pad_id, ref.mask_boundary_labels,
                                         IGNORE)  # fmt: skip
        out = self._assembler.assemble(rows, ids, self.seq_len)
        out["sources"] = source
        return self._finish(out, step)
