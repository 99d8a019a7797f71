"""Map-style sliding windows: `TokenDataset.windows()` and the batch sampler that gives it a
label shift drawn per batch.

A map-style dataset has items, not batches, so a shift shared by a batch cannot come from the
item index alone. `WindowDataset.batch_sampler(batch_size, ...)` is a `torch.utils.data`
batch sampler that yields, for each step, the window indices of this rank paired with the step's
shift: `DataLoader(ds, batch_sampler=ds.batch_sampler(16, seed=1))`. It visits the windows in
the same order, with the same shifts, as `window_batches` with the same arguments (both are
`WindowOffsets`), so the two forms give identical batches.

Memory model: the dataset holds the sizes only; an item is read from the store when it is asked
for. The sampler holds one block of a few thousand window starts (see `WindowOffsets`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from ..errors import ArgumentError, ConfigError
from . import checks
from .batches import resolve_rank
from .sampling import DocStarts, RandomOffsets, ShiftSpec, WindowOffsets
from .schedule import Schedule


class _Pair(NamedTuple):
    input_ids: torch.Tensor
    labels: torch.Tensor


class WindowItem(_Pair):
    """A window: `x, y = item`, `item[0]`, and `item["input_ids"]` / `item["labels"]`. A named
    tuple, so torch's default_collate stacks a list of them into one of the same type."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            if key not in self._fields:
                raise KeyError(key)
            return getattr(self, key)
        return super().__getitem__(key)

    def keys(self) -> tuple[str, ...]:
        return self._fields


def stride_or_default(stride: int | None, seq_len: int) -> int:
    """None means seq_len (windows that neither overlap nor skip); 0 is refused, not defaulted."""
    if stride is None:
        return seq_len
    return checks.positive("stride", stride, fix="pass stride=None for windows of seq_len tokens that do not "
                           "overlap, or a stride of 1 or more")  # fmt: skip


class WindowDataset(torch.utils.data.Dataset):
    """Window i = tokens [i·stride, i·stride + seq_len) of the split as x, and the same shifted by
    the label shift as y; int64 tensors (stride None: seq_len), shaped [seq_len // shift, shift]
    when `grouped`. With an int shift, `ds[i]` works with any sampler (DataLoader,
    DistributedSampler). With shift="random", items are `ds[i, shift]` and batches come from
    `ds.batch_sampler(batch_size, ...)`, which draws one shift per step. The windows are counted
    with the largest shift; at least one must fit, or building the dataset is an error."""

    def __init__(self, data: Any, seq_len: int, stride: int | None = None, shift: int | str = 1,
                 grouped: bool = False) -> None:  # fmt: skip
        if not callable(getattr(data, "_check_windows", None)):  # a TokenDataset (duck-typed: no import cycle)
            raise ArgumentError(f"data={checks.show(data)} is not a TokenDataset; pass one, or call "
                                "TokenDataset(...).windows(seq_len)")  # fmt: skip
        self.spec = ShiftSpec.parse(shift, seq_len)
        self.data, self.seq_len, self.stride = data, int(seq_len), stride_or_default(stride, seq_len)
        self.grouped = self.spec.check_grouped(grouped, self.seq_len)
        self.n = data._check_windows(self.seq_len, self.stride, self.spec)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: int | tuple[int, int]) -> WindowItem:
        if isinstance(key, tuple):
            if len(key) != 2:
                raise ArgumentError(f"index {key!r} is not (window, shift); pass ds[i] or ds[i, shift]")
            i, shift = checks.integer("window", key[0]), checks.integer("shift", key[1])
            if shift not in self.spec.choices:
                raise ArgumentError(f"shift={shift} is not one this dataset was built for "
                                    f"({', '.join(map(str, self.spec.choices))}); take shifts from "
                                    "ds.batch_sampler(...)")  # fmt: skip
        elif self.spec.fixed is None:
            raise ArgumentError("shift='random' draws one shift per batch, which an index alone cannot carry; "
                                "pass batch_sampler=ds.batch_sampler(batch_size) to the DataLoader, or index "
                                "ds[i, shift]")  # fmt: skip
        else:
            i, shift = checks.integer("window", key), self.spec.fixed
        if not 0 <= i < self.n:
            raise IndexError(i)
        T = self.seq_len
        t = torch.from_numpy(self.data.tokens(i * self.stride, T + shift).view(np.int32))
        x, y = t[:T].long(), t[shift:].long()
        if self.grouped:
            x, y = x.view(T // shift, shift), y.view(T // shift, shift)
        return WindowItem(x, y)

    def batch_sampler(self, batch_size: int, seed: int = 0, shuffle: bool = True, rank: int | None = None,
                      world_size: int | None = None) -> WindowBatchSampler:  # fmt: skip
        """Batches of (window, shift) pairs for `DataLoader(ds, batch_sampler=...)`, the same
        rows and shifts as `window_batches` with these arguments (see `WindowBatchSampler`)."""
        return WindowBatchSampler(self, batch_size, seed=seed, shuffle=shuffle, rank=rank, world_size=world_size)


class WindowBatchSampler(torch.utils.data.Sampler[list[tuple[int, int]]]):
    """This rank's batches of one epoch: step k holds rank r's `batch_size` windows of global
    batch k and the shift drawn for it from (seed, step), the same on every rank. Every rank
    gets `len(sampler)` steps (a last partial global batch is dropped); the order is reshuffled
    per epoch by `set_epoch(e)` (the DistributedSampler convention). `state_dict()` records
    (epoch, step); after `load_state_dict`, iteration resumes at that step of that epoch."""

    def __init__(self, dataset: WindowDataset, batch_size: int, seed: int = 0, shuffle: bool = True,
                 rank: int | None = None, world_size: int | None = None) -> None:  # fmt: skip
        if not isinstance(dataset, WindowDataset):
            raise ArgumentError(f"dataset={checks.show(dataset)} is not a WindowDataset; build the sampler with "
                                "TokenDataset(...).windows(...).batch_sampler(batch_size)")  # fmt: skip
        self.batch_size = checks.positive("batch_size", batch_size)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        global_batch = self.batch_size * self.world_size
        if dataset.n < global_batch:
            raise ArgumentError(f"batch_size={self.batch_size} × world_size={self.world_size} = {global_batch} rows "
                                f"per global batch, but the dataset has {dataset.n} windows; lower batch_size or "
                                "stride")  # fmt: skip
        self.dataset, self.seed = dataset, checks.seed(seed)
        self.offsets = WindowOffsets(dataset.data.n_tokens, dataset.seq_len, dataset.stride, dataset.spec,
                                     global_batch, self.seed, shuffle)  # fmt: skip
        self.epoch, self.step = 0, 0  # the next step to yield, within the epoch

    def __len__(self) -> int:
        return self.offsets.steps_per_epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.step = checks.nonnegative("epoch", epoch), 0

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        spe, B, stride = self.offsets.steps_per_epoch, self.batch_size, self.dataset.stride
        while self.step < spe:
            starts, shift = self.offsets.rows(self.epoch * spe + self.step, B * self.world_size)
            mine = starts[self.rank * B : (self.rank + 1) * B] // stride
            self.step += 1
            yield [(int(i), shift) for i in mine]
        self.epoch, self.step = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "step": self.step, "seed": self.seed, "batch_size": self.batch_size,
                "world_size": self.world_size, "windows": self.dataset.n, **self.offsets.fingerprint(),
                **checks.data_of(self.dataset.data)}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any], grown: str | None = None) -> None:
        """Resume at (epoch, step); a state from a sampler that orders windows differently, or
        saved on other data (also on this split before it grew), is refused."""
        mine = self.state_dict()
        checks.cannot_grow("batch sampler", state.get("data"), mine.get("data"), grown)
        differ = [k for k in mine if k not in ("epoch", "step", "data") and k in state and state[k] != mine[k]]
        if differ:
            shown = ", ".join(f"{k}: saved {state[k]!r}, now {mine[k]!r}" for k in differ)
            raise ConfigError(f"this sampler orders windows differently from the saved one ({shown}); build it with "
                              "the saved arguments")  # fmt: skip
        epoch, step = checks.nonnegative("epoch", state.get("epoch")), checks.nonnegative("step", state.get("step"))
        if step > len(self):
            raise ConfigError(f"step {step} is past the {len(self)} steps of an epoch; pass a state saved by this "
                              "sampler")  # fmt: skip
        self.epoch, self.step = epoch, step


def random_offsets(data: Any, shift: int | str, seed: int, starts: DocStarts | None, T: int,
                   order: str) -> RandomOffsets:  # fmt: skip
    """A random stream's offsets for rows of T tokens."""
    spec = ShiftSpec.parse(shift, T)
    checks.fits(data._where, data.n_tokens, T, spec.max)
    return RandomOffsets(data.n_tokens, T, spec, seed, starts, order)


def window_offsets(data: Any, plan: Schedule, world: int, stride: int | None, shift: int | str, seed: int,
                   shuffle: bool, T: int, order: str) -> WindowOffsets:  # fmt: skip
    """A window stream's offsets for windows of T tokens (stride: the given one, else T)."""
    spec = ShiftSpec.parse(shift, T)
    step = stride_or_default(stride, T)
    n = data._check_windows(T, step, spec)
    g = max((p.global_batch for p in plan.phases if p.seq_len == T), default=plan.max_batch)
    if order == "steps" and n < g:
        raise ArgumentError(f"batch_size={g // world} × world_size={world} = {g} rows per global batch, but "
                            f"{data._where} has {n} windows (seq_len {T} + shift {spec.max} at stride {step}); lower "
                            "batch_size or stride")  # fmt: skip
    return WindowOffsets(data.n_tokens, T, step, spec, g, seed, shuffle, order)
