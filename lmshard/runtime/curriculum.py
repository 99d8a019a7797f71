"""Mixture weights that change with the token position: curricula and anneals.

    mix = Mixture(["data/web", "data/code"],
                  curriculum=[(0, [0.9, 0.1]), (1_000_000_000, [0.3, 0.7])])   # a linear ramp
    mix = Mixture(..., curriculum=[...], ramp="step")                           # piecewise constant

`Curriculum` holds the knots: (token position, weights), the first at 0; between two knots the
weights ramp linearly (`ramp="linear"`) or hold the earlier knot's (`ramp="step"`); after the
last they hold. A row's position is the run's tokens before it (seq_len a row).

**Which source a row comes from** (`CurriculumTree`, the same interface as `mixing.RowTree`).
The run's rows are cut into segments of R = 64 rows (and at each knot's row: the first row that
starts at or after its token), each with the average weights of its rows (for a linear ramp,
the weights at its middle). A binary tree over the sources splits each node's rows between its
halves: the node's j-th row goes left when floor(A + r'·ρ + p) steps up, where ρ is the left
half's share of the node's weight in that segment, r' the row's place among the node's rows in
the segment, A the node's left target summed over the earlier segments and p a phase drawn from
the seed, all counted in integers of 2**-40 of a row (exact: every process gets the same rows,
and a share as small as 1e-12 is drawn at its size). Each step is 0 or 1 row, so any k
consecutive rows of a node give its left half within one row of its target share; with two
sources every window of rows is within one row of the schedule's integral. A row's source and
its index among the source's rows are a pure function of (curriculum, seed, row): a resumed run,
at any batch size or world size, draws what the uninterrupted one drew.

The sums over earlier segments are computed once per chunk of 4,096 segments and kept at chunk
starts, so a stream that resumes at row g adds up g / 64 numbers once (a few milliseconds per
10^8 rows).

Memory model: per tree node, two integers per chunk reached (262,144 rows) and 4,096 × 4 for
each of the last chunks used (up to three).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..errors import ArgumentError
from . import checks
from .keyed import keyed_ints

RAMPS = ("linear", "step")
SEGMENT = 64  # rows with one set of weights
CHUNK = 4096  # segments whose sums are computed at once
_BITS = 40
_ONE = 1 << _BITS  # shares and targets are counted in 2**-40 of a row: exact integer arithmetic


class Curriculum:
    """Knots of (token position, weights): see the module."""

    def __init__(self, knots: Iterable[Any], n_sources: int, ramp: str = "linear",
                 names: list[str] | None = None) -> None:  # fmt: skip
        if ramp not in RAMPS:
            raise ArgumentError(f"ramp={checks.show(ramp)}: pass ramp='linear' (weights ramp between knots) or "
                                "ramp='step' (each knot's weights hold until the next)")  # fmt: skip
        self.ramp = ramp
        names = names or [str(i) for i in range(n_sources)]
        fix = "pass curriculum=[(tokens, [weight per source]), ...], the first at tokens 0"
        if isinstance(knots, str | bytes) or not isinstance(knots, Iterable):
            raise ArgumentError(f"curriculum={checks.show(knots)} is not a list of knots; {fix}")
        self.knots: list[tuple[int, list[float]]] = []
        for i, knot in enumerate(list(knots)):
            if not isinstance(knot, list | tuple) or len(knot) != 2:
                raise ArgumentError(f"curriculum knot {i + 1}={checks.show(knot)} is not (tokens, weights); {fix}")
            at, weights = knot
            if isinstance(at, float) and at.is_integer():
                at = int(at)
            at = checks.nonnegative(f"curriculum knot {i + 1}: tokens", at)
            if (i == 0) != (at == 0) or (self.knots and at <= self.knots[-1][0]):
                raise ArgumentError(f"curriculum knot {i + 1} is at {at:,} tokens; the first knot is at 0 and each "
                                    "next one later")  # fmt: skip
            self.knots.append((at, _weights(i, weights, names)))
        if not self.knots:
            raise ArgumentError(f"curriculum=[] has no knot; {fix}")
        self._at = np.array([k for k, _ in self.knots], dtype=np.float64)
        self._w = np.array([w for _, w in self.knots], dtype=np.float64)

    def record(self) -> list[Any]:
        """As a resume state and the mixture's fingerprint record it."""
        return [self.ramp, [[k, w] for k, w in self.knots]]

    def knot_rows(self, seq_len: int) -> np.ndarray:
        """The row each knot takes effect at: the first row that starts at or after its token."""
        return -(-self._at.astype(np.int64) // seq_len)

    def weights(self, starts: np.ndarray, ends: np.ndarray, seq_len: int) -> np.ndarray:
        """[segments, sources]: the average weights of the rows [start, end) of each segment,
        which lie between two knots (for a linear ramp: the weights at the segment's middle)."""
        piece = np.searchsorted(self.knot_rows(seq_len), starts, side="right") - 1
        out = self._w[piece].copy()
        if self.ramp == "linear" and len(self.knots) > 1:
            inside = piece < len(self.knots) - 1
            j = piece[inside]
            middle = (starts[inside] + ends[inside]) / 2 * seq_len
            t = np.clip((middle - self._at[j]) / (self._at[j + 1] - self._at[j]), 0.0, 1.0)
            out[inside] = self._w[j] + (self._w[j + 1] - self._w[j]) * t[:, None]
        return out


def _weights(i: int, weights: Any, names: list[str]) -> list[float]:
    """A knot's weights: one finite number of at least 0 per source, not all 0; normalised."""
    if isinstance(weights, dict):
        unknown = sorted(set(map(str, weights)) - set(names))
        if unknown:
            raise ArgumentError(f"curriculum knot {i + 1} names {unknown[0]!r}, not a source of the mixture "
                                f"({', '.join(names)})")  # fmt: skip
        weights = [weights.get(n, 0) for n in names]
    if not isinstance(weights, list | tuple) or len(weights) != len(names):
        raise ArgumentError(f"curriculum knot {i + 1}: weights={checks.show(weights)} must give one weight per "
                            f"source ({len(names)})")  # fmt: skip
    ok = all(isinstance(w, numbers.Real) and not isinstance(w, bool) and np.isfinite(float(w)) and float(w) >= 0
             for w in weights)  # fmt: skip
    if not ok or sum(float(w) for w in weights) <= 0:
        raise ArgumentError(f"curriculum knot {i + 1}: weights={checks.show(weights)} must be finite numbers of at "
                            "least 0, not all 0")  # fmt: skip
    total = sum(float(w) for w in weights)
    return [float(w) / total for w in weights]


class CurriculumTree:
    """`RowTree` for a curriculum: `assign(rows)` → (source, index within the source),
    `counts(n)` → each source's rows among the first n (see the module)."""

    def __init__(self, curriculum: Curriculum, seq_len: int, seed: int) -> None:
        self.curriculum, self.seq_len, self.seed = curriculum, seq_len, seed
        n = len(curriculum.knots[0][1])
        self.nodes: list[tuple[int, int, int]] = []  # (lo, mid, hi) of each inner node, parents first
        self._index: dict[tuple[int, int], int] = {}
        todo = [(0, n)]
        while todo:
            lo, hi = todo.pop(0)
            if hi - lo > 1:
                mid = (lo + hi) // 2
                self._index[lo, hi] = len(self.nodes)
                self.nodes.append((lo, mid, hi))
                todo += [(lo, mid), (mid, hi)]
        self.n_sources = n
        self.phase = np.array([keyed_ints(seed, np.array([lo * 4096 + hi]), _ONE)[0] for lo, _, hi in self.nodes],
                              dtype=np.int64)  # fmt: skip
        # segments: every SEGMENT rows, and also at each knot's row, so that a segment lies between two knots
        knots = curriculum.knot_rows(seq_len)
        self._extra = np.unique(knots[knots % SEGMENT != 0])  # knot rows off the grid
        self._extra_at = self._extra // SEGMENT + 1 + np.arange(len(self._extra))  # their segments' numbers
        zero = np.zeros(len(self.nodes), dtype=np.int64)
        self._starts = [(zero, zero)]  # per chunk reached: each node's target at its first segment (whole, part)
        self._chunks: dict[int, tuple[np.ndarray, ...]] = {}

    def _chunk(self, c: int) -> tuple[np.ndarray, ...]:
        """Chunk c's [nodes, CHUNK + 1] targets (whole rows, and parts of 2**-40) and node rows at
        each segment start, and [nodes, CHUNK] shares (in 2**-40)."""
        found = self._chunks.get(c)
        if found is not None:
            return found
        while len(self._starts) <= c:  # the sums up to chunk c, once
            whole, part, _, _ = self._compute(len(self._starts) - 1)
            self._starts.append((whole[:, -1].copy(), part[:, -1].copy()))
        out = self._compute(c)
        self._chunks = {k: v for k, v in self._chunks.items() if k == c - 1 or k == c + 1}
        self._chunks[c] = out
        return out

    def _segment_start(self, i: np.ndarray) -> np.ndarray:
        """The first row of segments i."""
        out = i * SEGMENT
        if not len(self._extra_at):
            return out
        at = np.searchsorted(self._extra_at, i)  # off-grid starts before segment i
        hit = (at < len(self._extra_at)) & (self._extra_at[np.minimum(at, len(self._extra_at) - 1)] == i)
        out = (i - at) * SEGMENT
        if hit.any():
            out[hit] = self._extra[at[hit]]
        return out

    def _segment_of(self, rows: np.ndarray) -> np.ndarray:
        """The segment each row lies in."""
        return rows // SEGMENT + np.searchsorted(self._extra, rows, side="right")

    def _compute(self, c: int) -> tuple[np.ndarray, ...]:
        bounds = self._segment_start(np.arange(c * CHUNK, (c + 1) * CHUNK + 1, dtype=np.int64))  # rows at each start
        w = self.curriculum.weights(bounds[:-1], bounds[1:], self.seq_len)
        whole0, part0 = self._starts[c]
        k = len(self.nodes)
        whole = np.empty((k, CHUNK + 1), dtype=np.int64)
        part = np.empty((k, CHUNK + 1), dtype=np.int64)
        rows = np.empty((k, CHUNK + 1), dtype=np.int64)
        share = np.empty((k, CHUNK), dtype=np.int64)
        rows_of: dict[tuple[int, int], np.ndarray] = {(0, self.n_sources): bounds}
        for v, (lo, mid, hi) in enumerate(self.nodes):
            node_rows = rows_of[lo, hi]
            total = w[:, lo:hi].sum(axis=1)
            rho = np.divide(w[:, lo:mid].sum(axis=1), total, out=np.full(CHUNK, 0.5), where=total > 0)
            share[v] = np.round(rho * _ONE).astype(np.int64)  # the left half's share, in 2**-40
            # the target in 2**-40 of a row: at most 64 rows × 2**40 a segment, 2**58 a chunk (int64 holds it)
            run = part0[v] + np.concatenate([[0], np.cumsum(np.diff(node_rows) * share[v])])
            whole[v], part[v] = whole0[v] + (run >> _BITS), run & (_ONE - 1)
            rows[v] = node_rows
            left = whole[v] + ((part[v] + self.phase[v]) >> _BITS)
            rows_of[lo, mid], rows_of[mid, hi] = left, node_rows - left
        return whole, part, rows, share

    def assign(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(rows, dtype=np.int64)
        seg = self._segment_of(rows)
        source = np.zeros(len(rows), dtype=np.int64)
        local = rows.copy()
        for c in np.unique(seg // CHUNK).tolist():
            at = np.flatnonzero(seg // CHUNK == c)
            self._walk(0, self.n_sources, at, seg[at] - c * CHUNK, source, local, self._chunk(c))
        return source, local

    def _walk(self, lo: int, hi: int, at: np.ndarray, s: np.ndarray, source: np.ndarray, local: np.ndarray,
              chunk: tuple[np.ndarray, ...]) -> None:  # fmt: skip
        if hi - lo == 1:
            source[at] = lo
            return
        whole, part, node_rows, share = chunk
        v = self._index[lo, hi]
        mid = self.nodes[v][1]
        j = local[at]
        r = j - node_rows[v, s]  # the row's place among the node's rows of its segment (< 64)
        before = whole[v, s] + ((part[v, s] + r * share[v, s] + self.phase[v]) >> _BITS)
        after = whole[v, s] + ((part[v, s] + (r + 1) * share[v, s] + self.phase[v]) >> _BITS)
        left = after > before
        local[at] = np.where(left, before, j - before)
        self._walk(lo, mid, at[left], s[left], source, local, chunk)
        self._walk(mid, hi, at[~left], s[~left], source, local, chunk)

    def counts(self, n: int) -> list[int]:
        """Each source's rows among the run's first n rows."""
        n = checks.nonnegative("n", n)
        c, s = divmod(int(self._segment_of(np.array([n]))[0]), CHUNK)
        whole, part, node_rows, share = self._chunk(c)
        out = [0] * self.n_sources

        def walk(lo: int, hi: int, j: int) -> None:
            if hi - lo == 1:
                out[lo] = j
                return
            v = self._index[lo, hi]
            r = j - int(node_rows[v, s])
            left = int(whole[v, s]) + ((int(part[v, s]) + r * int(share[v, s]) + int(self.phase[v])) >> _BITS)
            walk(lo, self.nodes[v][1], left)
            walk(self.nodes[v][1], hi, j - left)

        walk(0, self.n_sources, n)
        return out
