"""Where each row of each batch starts: pure functions of a few integers.

A *global batch* at step s has G = batch_size × world_size rows; rank r takes rows
[r·B, (r+1)·B). Row offsets depend only on (seed, step) — and the epoch for windows — never on
the rank count or the number of DataLoader workers, so a run resumes exactly from
(seed, step), even on another world size with the same global batch. Nothing here holds a
permutation: window order comes from a keyed Feistel bijection, O(1) memory per epoch.

Memory model: the offsets of the last two blocks of up to 64 steps drawn (8 bytes per row).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..errors import ArgumentError, ConfigError
from . import checks
from .keyed import counter_block, feistel_permute, keyed_ints, step_rng


def proper_divisors(n: int) -> list[int]:
    n = checks.integer("n", n)
    return [d for d in range(1, n) if n % d == 0]


@dataclass(frozen=True)
class ShiftSpec:
    """A fixed label shift, or 'random': a proper divisor of seq_len drawn per batch."""

    fixed: int | None
    choices: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.choices or not all(checks.is_int(c) and c >= 1 for c in self.choices):
            raise ArgumentError(f"choices={self.choices!r} must be shifts >= 1; build it with ShiftSpec.parse")
        if self.fixed is not None and self.choices != (self.fixed,):
            raise ArgumentError(f"fixed={self.fixed!r} needs choices=({self.fixed!r},); build it with ShiftSpec.parse")

    @classmethod
    def parse(cls, shift: int | str, seq_len: int) -> ShiftSpec:
        """shift: an int in [1, seq_len] (labels `shift` tokens ahead of x; 0 would make y == x and
        more than seq_len would skip tokens), or "random"."""
        seq_len = checks.positive("seq_len", seq_len)
        if isinstance(shift, str):
            if shift != "random":
                raise ArgumentError(f"shift={checks.show(shift)} is neither an int nor 'random'; pass shift=1 "
                                    "(next-token labels) or shift='random'")  # fmt: skip
            divisors = proper_divisors(seq_len)
            if not divisors:
                raise ArgumentError(f"shift='random' draws a proper divisor of seq_len, and seq_len={seq_len} has "
                                    "none; pass seq_len > 1 or an int shift")  # fmt: skip
            return cls(None, tuple(divisors))
        m = checks.integer("shift", shift)
        if m < 1:
            raise ArgumentError(f"shift={m} must be at least 1 (shift=0 makes y equal to x); pass shift=1 for "
                                "next-token labels")  # fmt: skip
        if m > seq_len:
            raise ArgumentError(f"shift={m} is more than seq_len={seq_len}, so labels would skip tokens; pass a "
                                "shift at most seq_len")  # fmt: skip
        return cls(m, (m,))

    @property
    def max(self) -> int:
        return max(self.choices)

    def draw(self, rng: np.random.Generator) -> int:
        return self.fixed if self.fixed is not None else int(rng.choice(self.choices))

    def describe(self) -> int | str:
        """As a resume state records it: the fixed shift, or "random"."""
        return self.fixed if self.fixed is not None else "random"

    def check_grouped(self, grouped: object, seq_len: int) -> bool:
        """grouped=True reshapes rows to [seq_len // shift, shift]: every shift must divide seq_len."""
        grouped = checks.flag("grouped", grouped)
        if grouped and any(seq_len % s for s in self.choices):
            raise ArgumentError(f"grouped=True reshapes rows to [seq_len // shift, shift], and shift="
                                f"{self.describe()!r} does not divide seq_len={seq_len}; pass a shift that divides "
                                "seq_len, shift='random', or grouped=False")  # fmt: skip
        return grouped


class DocStarts:
    """Document starts drawn uniformly over the documents of a split (every document equally
    likely), redrawing those too close to the end. Memory: one cumulative count per shard."""

    def __init__(self, doc_counts: np.ndarray, doc_start: Callable[[int, int], int]) -> None:
        self.doc_cum = np.concatenate([[0], np.cumsum(doc_counts)])  # documents before each shard
        self.n_docs = int(self.doc_cum[-1])
        self.doc_start = doc_start  # (shard, document in shard) -> token offset in the split

    def head(self, shards: int) -> DocStarts:
        """The same draw over the documents of the first `shards` shards only."""
        return DocStarts(np.diff(self.doc_cum)[:shards], self.doc_start)

    def draw_rows(self, seed: int, rows: np.ndarray, limits: np.ndarray) -> np.ndarray:
        """The start of each global row in `rows` (row order): a document drawn from
        (seed, row, attempt), redrawn while its start is past the row's limit."""
        out = np.full(len(rows), -1, dtype=np.int64)
        pending = np.arange(len(rows))
        for attempt in range(1000):
            if not len(pending):
                return out
            g = keyed_ints(seed ^ _DOC_SALT, rows[pending] * 1024 + attempt, self.n_docs)
            k = np.searchsorted(self.doc_cum, g, side="right") - 1
            starts = np.array([self.doc_start(int(a), int(b)) for a, b in zip(k, g - self.doc_cum[k], strict=True)],
                              dtype=np.int64)  # fmt: skip
            ok = starts <= limits[pending]
            out[pending[ok]] = starts[ok]
            pending = pending[~ok]
        raise ConfigError("no document start leaves room for seq_len tokens; lower seq_len")

    def draw(self, rng: np.random.Generator, count: int, limit: int) -> np.ndarray:
        """`count` starts no later than `limit`."""
        out = np.empty(count, dtype=np.int64)
        for r in range(count):
            for _ in range(1000):  # documents too close to the end are redrawn
                g = int(rng.integers(0, self.n_docs))
                k = int(np.searchsorted(self.doc_cum, g, side="right")) - 1
                start = self.doc_start(k, g - int(self.doc_cum[k]))
                if start <= limit:
                    break
            else:
                raise ConfigError("no document start leaves room for seq_len tokens; lower seq_len")
            out[r] = start
        return out


class Offsets(ABC):
    """Where the rows of a step start: the one interface `BatchStream` draws from.

    Two orders. "steps" (`rows`): a step's rows are drawn from (seed, step), so they depend on
    the global batch. "rows" (`rows_at`): the run's row g is drawn from (seed, g), whatever step
    it falls in, so runs at any batch size, or a batch-size schedule, read one sequence of rows
    (runtime/schedule.py)."""

    shift: ShiftSpec  # the label shift(s) rows are read for
    seq_len: int  # the rows' length (without the shift)
    steps_per_epoch: int | None  # steps in one pass over the data, or None (no epochs)
    order: str = "steps"
    by_len: bool = False  # rows numbered among the rows of their own seq_len (windows)
    n_rows: int | None = None  # rows (windows) in one epoch, in row order; None: no epochs

    @abstractmethod
    def rows(self, step: int, count: int) -> tuple[np.ndarray, int]:
        """The `count` row offsets of global step `step`, and the shift of that step."""

    @abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """What else (beside seed, seq_len and the global batch) decides the rows: a resume
        state from a stream whose fingerprint differs is refused."""

    def rows_at(self, step: int, first: int, count: int, run: int | None = None) -> tuple[np.ndarray, int]:
        """Row order: the offsets of the run's rows [first, first + count), drawn at step `step`
        (whose shift they share); `run`: steps from `step` on that draw `count` rows each, the
        next one from first + count (None: all), so they may be drawn at once."""
        raise ConfigError(f"{type(self).__name__} draws in step order only")

    def over(self, n_tokens: int, shards: int) -> Offsets:
        """The same sampler over the first `n_tokens` of the split (its first `shards` shards):
        what it drew before the split grew (runtime/growth.py)."""
        raise ConfigError(f"{type(self).__name__} cannot continue on a grown split")

    def epoch_of(self, step: int) -> int | None:
        """The epoch step `step` belongs to (None: no epochs)."""
        return None if self.steps_per_epoch is None else step // self.steps_per_epoch

    def epoch_start(self, epoch: int) -> int:
        """The first step of `epoch`."""
        if self.steps_per_epoch is None:
            raise ConfigError("random batches have no epochs; resume them with load_state_dict")
        return epoch * self.steps_per_epoch


class RandomOffsets(Offsets):
    """Uniform row starts over the concatenated split: every start that leaves room for
    seq_len + shift tokens is equally likely, so each shard is drawn in proportion to its size.
    With `doc_starts`, rows start at a document start instead, every document equally likely."""

    steps_per_epoch = None

    def __init__(self, n_tokens: int, seq_len: int, shift: ShiftSpec, seed: int,
                 doc_starts: DocStarts | None = None, order: str = "steps") -> None:  # fmt: skip
        n_tokens, seq_len = checks.nonnegative("n_tokens", n_tokens), checks.positive("seq_len", seq_len)
        self.order = order
        seed = checks.seed(seed)
        _check_shift(shift)
        checks.fits("the split", n_tokens, seq_len, shift.max)
        self.n_tokens, self.seq_len, self.shift, self.seed = n_tokens, seq_len, shift, seed
        self.doc_starts = doc_starts
        self._cache: list[Any] = []  # blocks of steps drawn: (first step, rows, shifts, offsets), or row blocks

    def fingerprint(self) -> dict[str, Any]:
        return {"shift": self.shift.describe(), "doc_aligned": self.doc_starts is not None}

    def over(self, n_tokens: int, shards: int) -> RandomOffsets:
        starts = None if self.doc_starts is None else self.doc_starts.head(shards)
        return RandomOffsets(n_tokens, self.seq_len, self.shift, self.seed, starts, self.order)

    def rows_at(self, step: int, first: int, count: int, run: int | None = None) -> tuple[np.ndarray, int]:
        c = recall(self._cache, lambda c: holds_rows(c, step, first, count),
                   lambda: self._row_block(step, first, count, run))  # fmt: skip
        return c[4][step - c[0]], int(c[3][step - c[0]])

    def _row_block(self, step: int, first: int, count: int, run: int | None) -> tuple[int, int, int, np.ndarray,
                                                                                      np.ndarray]:  # fmt: skip
        """Rows of the steps [step, step + n), row g keyed (seed, g): (step, first row, rows a
        step, shifts, offsets)."""
        n = max(1, min(_BLOCK_STEPS, _BLOCK_ROWS // count, run or _BLOCK_STEPS))
        shifts = self._shifts(step, n)
        rows = np.arange(first, first + n * count, dtype=np.int64)
        # one range for every row, room for the largest shift: a row's draw does not depend on its step's shift
        limit = self.n_tokens - (self.seq_len + self.shift.max)
        if self.doc_starts is None:
            offsets = keyed_ints(self.seed, rows, limit + 1)
        else:
            offsets = self.doc_starts.draw_rows(self.seed, rows, np.full(len(rows), limit))
        return step, first, count, shifts, offsets.reshape(n, count)

    def _shifts(self, first: int, n: int) -> np.ndarray:
        """The shifts of steps [first, first + n): each a pure function of (seed, step)."""
        if self.shift.fixed is not None:
            return np.full(n, self.shift.fixed, dtype=np.int64)
        picks = counter_block(self.seed ^ _SHIFT_SALT, first, n, 1, len(self.shift.choices))[:, 0]
        return np.asarray(self.shift.choices, dtype=np.int64)[picks]

    def rows(self, step: int, count: int) -> tuple[np.ndarray, int]:
        if self.doc_starts is None:  # the hot path: counter-based, drawn for a block of steps at once
            c = recall(self._cache, lambda c: c[1] == count and c[0] <= step < c[0] + len(c[2]),
                       lambda: self._block(step, count))  # fmt: skip
            return c[3][step - c[0]], int(c[2][step - c[0]])
        rng = step_rng(self.seed, step)
        shift = self.shift.draw(rng)
        limit = self.n_tokens - (self.seq_len + shift)  # last valid start
        return self.doc_starts.draw(rng, count, limit), shift

    def _block(self, step: int, count: int) -> tuple[int, int, np.ndarray, np.ndarray]:
        """Offsets of the steps [first, first + n) around `step`, aligned so that every step
        belongs to one block whatever step a stream starts (or resumes) at."""
        n = max(1, min(_BLOCK_STEPS, _BLOCK_ROWS // count))
        first = step - step % n
        shifts = self._shifts(first, n)
        offsets = counter_block(self.seed, first, n, count, self.n_tokens - (self.seq_len + shifts) + 1)
        return first, count, shifts, offsets


_SHIFT_SALT = 0x5EED5EED5EED
_DOC_SALT = 0xD0C5D0C5D0C5


def holds_rows(c: tuple[Any, ...], step: int, first: int, count: int) -> bool:
    """Whether a row block (step, first row, rows a step, ..., offsets) holds `step`'s rows."""
    return c[2] == count and c[0] <= step < c[0] + len(c[-1]) and first == c[1] + (step - c[0]) * count


class WindowOffsets(Offsets):
    """Windows starting at i·stride of the concatenated split, shuffled per epoch (or in order).
    The set of windows is counted with the largest shift, so it does not depend on the shift a
    step draws: with shift="random" every window has room for any label span, and each step
    draws its shift from (seed, step), shared by all its rows and ranks, as random batches do."""

    by_len = True

    def __init__(self, n_tokens: int, seq_len: int, stride: int, shift: ShiftSpec, global_batch: int, seed: int,
                 shuffle: bool, order: str = "steps") -> None:  # fmt: skip
        _check_shift(shift)
        self.order = order
        global_batch, seed = checks.positive("global_batch", global_batch), checks.seed(seed)
        stride = checks.positive("stride", stride)  # a Python int: the resume state must be JSON
        self.n_windows = self.n_rows = count_windows(n_tokens, seq_len, stride, shift.max)
        checks.fits("the split", n_tokens, seq_len, shift.max)
        self.steps_per_epoch: int = self.n_windows // global_batch
        if self.steps_per_epoch == 0 and (order == "steps" or self.n_windows == 0):
            raise ArgumentError(f"{self.n_windows} windows cannot fill one global batch of {global_batch} rows; "
                                "lower batch_size or stride")  # fmt: skip
        self.stride, self.shift, self.seed, self.shuffle = stride, shift, seed, checks.flag("shuffle", shuffle)
        self.seq_len, self.global_batch = seq_len, global_batch
        self._cache: list[Any] = []  # (epoch, first step, rows, starts), or row blocks

    def fingerprint(self) -> dict[str, Any]:
        return {"shift": self.shift.describe(), "stride": self.stride, "shuffle": self.shuffle}

    def over(self, n_tokens: int, shards: int) -> WindowOffsets:
        return WindowOffsets(n_tokens, self.seq_len, self.stride, self.shift, self.global_batch, self.seed,
                             self.shuffle, self.order)  # fmt: skip

    def rows_at(self, step: int, first: int, count: int, run: int | None = None) -> tuple[np.ndarray, int]:
        """Row g (among the rows of this seq_len) is window g mod n of epoch g // n: epochs
        follow one another with no window dropped, an epoch's end may fall inside a step."""
        c = recall(self._cache, lambda c: holds_rows(c, step, first, count),
                   lambda: self._row_block(step, first, count, run))  # fmt: skip
        return c[4][step - c[0]], self._shift(step)

    def _row_block(self, step: int, first: int, count: int, run: int | None) -> tuple[Any, ...]:
        n = max(1, min(_BLOCK_STEPS, _BLOCK_ROWS // count, run or _BLOCK_STEPS))
        epoch, within = np.divmod(np.arange(first, first + n * count, dtype=np.int64), self.n_windows)
        if not self.shuffle:
            starts = within * self.stride
        else:
            starts = np.empty(len(within), dtype=np.int64)
            for e in np.unique(epoch).tolist():
                mine = epoch == e
                key = int(step_rng(self.seed, e, 2).integers(2**32))
                starts[mine] = feistel_permute(within[mine], self.n_windows, key=key) * self.stride
        return step, first, count, None, starts.reshape(n, count)

    def _shift(self, step: int) -> int:
        if self.shift.fixed is not None:
            return self.shift.fixed
        pick = counter_block(self.seed ^ _SHIFT_SALT, step, 1, 1, len(self.shift.choices))[0, 0]
        return self.shift.choices[int(pick)]

    def rows(self, step: int, count: int) -> tuple[np.ndarray, int]:
        epoch, within = divmod(step, self.steps_per_epoch)
        if not self.shuffle:
            starts = np.arange(within * count, (within + 1) * count, dtype=np.int64) * self.stride
            return starts, self._shift(step)
        # Permute a block of steps at once: the Feistel rounds are numpy calls whose fixed cost
        # dominates on one batch. Which ids a step gets does not depend on the block.
        c = recall(self._cache, lambda c: c[0] == epoch and c[2] == count and c[1] <= within < c[1] + len(c[3]),
                   lambda: self._block(epoch, within, count))  # fmt: skip
        return c[3][within - c[1]], self._shift(step)

    def _block(self, epoch: int, within: int, count: int) -> tuple[int, int, int, np.ndarray]:
        n = max(1, min(_BLOCK_STEPS, _BLOCK_ROWS // count))
        first = within - within % n
        last = min(first + n, self.steps_per_epoch)
        ids = np.arange(first * count, last * count, dtype=np.int64)
        key = int(step_rng(self.seed, epoch, 2).integers(2**32))
        starts = feistel_permute(ids, self.n_windows, key=key) * self.stride
        return epoch, first, count, starts.reshape(last - first, count)


_BLOCK_STEPS = 64  # steps drawn at once (random offsets and window permutations)
_BLOCK_ROWS = 1 << 16  # ... but at most this many rows (512 KB of offsets) per block
T = TypeVar("T")


def recall(cache: list[T], hit: Callable[[T], bool], make: Callable[[], T]) -> T:
    """The entry of `cache` (the last two blocks of steps drawn) that `hit`s, else a new one
    from `make`: a stream that announces its next steps (lookahead.py) reads two blocks in turn
    near the end of one."""
    for entry in reversed(cache):
        if hit(entry):
            return entry
    entry = make()
    cache[:] = [*cache[-1:], entry]
    return entry


def _check_shift(shift: object) -> None:
    if not isinstance(shift, ShiftSpec):
        raise ArgumentError(f"shift={checks.show(shift)} is not a ShiftSpec; pass ShiftSpec.parse(shift, seq_len)")


def count_windows(n_tokens: int, seq_len: int, stride: int, shift: int) -> int:
    """Windows of seq_len + shift tokens starting at 0, stride, 2·stride, ... in n_tokens."""
    n_tokens, seq_len = checks.nonnegative("n_tokens", n_tokens), checks.positive("seq_len", seq_len)
    stride, shift = checks.positive("stride", stride), checks.positive("shift", shift)
    span = seq_len + shift
    return 0 if n_tokens < span else (n_tokens - span) // stride + 1
