"""Where a mixture's rows start (`MixtureOffsets`): the source from the mixture's tree
(`mixing.RowTree`, or `curriculum.CurriculumTree`), the offset from that source's own sampler
(random offsets keyed by the row, or windows with per-source epochs).

Memory model: the tree's and two blocks of up to 64 steps of offsets (8 bytes per row).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import growth
from .curriculum import CurriculumTree
from .keyed import feistel_permute, keyed_ints, step_rng
from .mixing import RowTree
from .sampling import Offsets, ShiftSpec, count_windows, holds_rows, recall

_SHIFT_SALT = 0x5EED5EED5EED
_BLOCK_STEPS = 64
_SMALL_SOURCE = 4096  # windows: below this, a source's epoch orders are drawn many at a time


class MixtureOffsets(Offsets):
    """Rows of a step: sources from the tree, offsets from each source's own sampler (random
    offsets, or windows with per-source epochs). The shift is drawn per step, shared by all."""

    steps_per_epoch = None
    order = "rows"  # the same rows in either order: row g of the run is drawn from (seed, g)

    def __init__(self, mix: Any, seq_len: int, shift: ShiftSpec, seed: int, stride: int | None) -> None:
        self.by_len = stride is not None  # a source's windows of one length go on through the other lengths' phases
        self.mix, self.seq_len, self.shift, self.seed, self.stride = mix, seq_len, shift, seed, stride
        self.tree: Any = RowTree(mix.int_weights, seed) if mix.curriculum is None else \
            CurriculumTree(mix.curriculum, seq_len, seed)  # fmt: skip
        self.store = mix.store
        self.sizes = np.array([d.n_tokens for d in mix.datasets], dtype=np.int64)
        self.windows = (
            None if stride is None else [count_windows(int(n), seq_len, stride, shift.max) for n in self.sizes]
        )
        self._cache: list[Any] = []  # (first step, first row, rows a step, shifts, offsets)
        # per source, the eras of a source that grew while the run went on (runtime/growth.py):
        # (era, (its split's tokens, its windows)); none: one era, the split as it is
        self.eras: list[list[tuple[growth.Era, Any]]] = [[] for _ in self.sizes]

    def fingerprint(self) -> dict[str, Any]:
        return {"shift": self.shift.describe(), "stride": self.stride, "mixture": self.mix.fingerprint(),
                "curriculum": None if self.mix.curriculum is None else self.mix.curriculum.record()}  # fmt: skip

    def regrow(self, state: dict[str, Any], position: int, keep_going: bool, rows_before: Any) -> list[list[Any]]:
        """Take the eras of the sources that grew since the state's run began (runtime/growth.py)
        and return what the state records of them."""

        def make(s: int, part: growth.Prefix | None) -> tuple[tuple[int, int], int | None]:
            size = int(self.sizes[s]) if part is None else part.n_tokens
            n = None if self.stride is None else count_windows(size, self.seq_len, self.stride, self.shift.max)
            return (size, n or 0), n

        self.eras, record = growth.mixture_eras(self.mix, self.tree, state, position, keep_going, rows_before, make)
        self._cache = []
        return record

    def _shift(self, step: int) -> int:
        if self.shift.fixed is not None:
            return self.shift.fixed
        return int(step_rng(self.seed ^ _SHIFT_SALT, step).choice(self.shift.choices))

    def rows(self, step: int, count: int) -> tuple[np.ndarray, int]:
        return self.rows_at(step, step * count, count)

    def rows_at(self, step: int, first: int, count: int, run: int | None = None) -> tuple[np.ndarray, int]:
        # Steps are drawn a block at a time (as RandomOffsets does): the tree and the keyed draw
        # are a dozen numpy calls whose fixed cost dominates one batch. A row's offset depends on
        # the row alone (and its step's shift), not on the block it was drawn in.
        c = recall(self._cache, lambda c: holds_rows(c, step, first, count),
                   lambda: self._block(step, first, count, run))  # fmt: skip
        return c[4][step - c[0]], int(c[3][step - c[0]])

    def _block(self, step: int, first: int, count: int, run: int | None) -> tuple[Any, ...]:
        n = max(1, min(_BLOCK_STEPS, (1 << 16) // count, run or _BLOCK_STEPS))
        shifts = np.array([self._shift(step + i) for i in range(n)], dtype=np.int64)
        source, local = self.tree.assign(np.arange(first, first + n * count, dtype=np.int64))
        if self.windows is None:  # all sources in one call: row m of source s is keyed (m, s)
            sizes = self.sizes[source]
            for s, eras in enumerate(self.eras):  # a source that grew: its rows before drew over less
                for era, (size, _) in eras:
                    sizes[(source == s) & (local >= era.start)] = size
            high = sizes - (self.seq_len + np.repeat(shifts, count)) + 1
            out = keyed_ints(self.seed, local * len(self.sizes) + source, high)
        else:
            out = np.empty(len(source), dtype=np.int64)
            for s in np.unique(source).tolist():
                mine = np.flatnonzero(source == s)
                if not self.eras[s]:
                    out[mine] = self._source_windows(s, local[mine], self.windows[s])
                    continue
                for where, era, (_, windows) in growth.split_by_era(self.eras[s], local[mine]):
                    at = mine[where]
                    out[at] = self._source_windows(s, era.local(local[at]), windows)
        return step, first, count, shifts, (out + self.store.bases[source]).reshape(n, count)

    def _source_windows(self, s: int, m: np.ndarray, n: int) -> np.ndarray:
        """Window starts of rows m of source s: window m mod n of the order of epoch m // n. A
        source of few windows is used up many times in a block of steps, so its orders are
        drawn for all those epochs at once (argsort of keyed draws); a large one takes a keyed
        Feistel permutation per epoch (one or two per block). Either is a pure function of
        (seed, source, epoch): which one applies depends on n alone."""
        key = self.seed * 1_000_003 + s
        assert self.stride is not None
        epoch, within = np.divmod(m, n)
        if n <= _SMALL_SOURCE:
            epochs, at = np.unique(epoch, return_inverse=True)
            draws = keyed_ints(key, (epochs[:, None] * n + np.arange(n)).ravel(), 1 << 62).reshape(len(epochs), n)
            return np.argsort(draws, axis=1, kind="stable")[at, within] * self.stride
        out = np.empty(len(m), dtype=np.int64)
        for e in np.unique(epoch).tolist():
            mine = epoch == e
            perm_key = int(step_rng(key, e, 2).integers(2**32))
            out[mine] = feistel_permute(within[mine], n, key=perm_key)
        return out * self.stride
