"""How a mixture's rows are split between its sources, and the store that reads them.

`RowTree` assigns global row g to a source by a binary tree over the sources: a node with
(integer) weight b gives row n of its own rows to its left half (weight a) when
floor((a·n + p) / b) steps up, p a phase drawn from the seed. Any k consecutive rows of a node
then give the left half floor or ceil of a·k/b of them, so with two sources every window of k
rows is within one row of its target, and with more within one row per tree level. Row g is
also row m of its source, m the closed-form count of the source's earlier rows. Nothing is
carried between steps: the assignment is a pure function of (weights, seed, g).

Memory model: a handful of integers per tree node; `MixedStore` holds the sources' stores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .sampling import keyed_ints
from .store import _Span

# Weights are held as integers out of SCALE (a weight's rounding is below 1e-9). Exact in int64:
# a·r + p < SCALE² < 2**63 (r < b ≤ SCALE), and a·q ≤ n (a ≤ b, q = n // b).
SCALE = 1 << 30


def integer_weights(weights: list[float]) -> list[int]:
    """Weights (summing to 1) as integers summing to SCALE (largest remainder), each at least 1."""
    exact = [w * SCALE for w in weights]
    out = [max(1, int(x)) for x in exact]
    order = sorted(range(len(out)), key=lambda i: exact[i] - int(exact[i]), reverse=True)
    for i in order[: max(0, SCALE - sum(out))]:
        out[i] += 1
    while sum(out) > SCALE:  # tiny weights raised to 1 take it from the largest
        out[out.index(max(out))] -= 1
    return out


class RowTree:
    """The binary split of rows between sources: `assign` maps global rows to (source, the
    row's index within the source), `counts` gives each source's rows among the first n."""

    def __init__(self, weights: list[int], seed: int) -> None:
        self.weights, self.seed = weights, seed
        self._nodes: dict[tuple[int, int], tuple[int, int, int, int]] = {}

    def _node(self, lo: int, hi: int) -> tuple[int, int, int, int]:
        """(mid, a, b, phase) of the node over sources [lo, hi), computed once per node."""
        found = self._nodes.get((lo, hi))
        if found is not None:
            return found
        mid = (lo + hi) // 2
        a, b = sum(self.weights[lo:mid]), sum(self.weights[lo:hi])
        phase = int(keyed_ints(self.seed, np.array([lo * 4096 + hi]), b)[0])
        self._nodes[lo, hi] = (mid, a, b, phase)
        return self._nodes[lo, hi]

    @staticmethod
    def _left(n: np.ndarray, a: int, b: int, p: int) -> np.ndarray:
        """floor((a·n + p) / b), exact in int64 for any row n below 2**62 (n = q·b + r)."""
        q, r = np.divmod(n, b)
        return a * q + (a * r + p) // b

    def assign(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        source = np.zeros(len(rows), dtype=np.int64)
        local = np.asarray(rows, dtype=np.int64).copy()
        self._walk(0, len(self.weights), np.arange(len(rows)), source, local)
        return source, local

    def _walk(self, lo: int, hi: int, at: np.ndarray, source: np.ndarray, local: np.ndarray) -> None:
        if hi - lo == 1:
            source[at] = lo
            return
        mid, a, b, p = self._node(lo, hi)
        n = local[at]
        q, r = np.divmod(n, b)
        d, rem = np.divmod(a * r + p, b)
        before = a * q + d  # _left(n)
        left = rem >= b - a  # _left(n + 1) = _left(n) + 1: the remainder wraps when a is added
        local[at] = np.where(left, before, n - before)
        self._walk(lo, mid, at[left], source, local)
        self._walk(mid, hi, at[~left], source, local)

    def counts(self, n: int, lo: int = 0, hi: int | None = None) -> list[int]:
        hi = len(self.weights) if hi is None else hi
        if hi - lo == 1:
            return [n]
        mid, a, b, p = self._node(lo, hi)
        left = int(self._left(np.array([n]), a, b, p)[0])  # _left(0) = p // b = 0: p < b
        return self.counts(left, lo, mid) + self.counts(n - left, mid, hi)


class MixedStore:
    """The sources' token streams laid end to end in one address space (source i at base[i]),
    so a `BatchStream` reads a mixture as it reads one split. A row never crosses a source."""

    def __init__(self, datasets: list[Any]) -> None:  # TokenDatasets (not imported: no cycle)
        self.stores = [d.store for d in datasets]
        sizes = [s.n_tokens for s in self.stores]
        self.bases = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.n_tokens = int(self.bases[-1])
        self._spans: dict[int, Any] = {}

    def locate(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, offset within the source) of each address."""
        offsets = np.asarray(offsets, dtype=np.int64)
        source = np.searchsorted(self.bases, offsets, side="right") - 1
        return source, offsets - self.bases[source]

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (DataLoader workers under spawn) without the spans: views over maps would be
        pickled as copies of the tokens; each worker builds its own."""
        return {**self.__dict__, "_spans": {}}

    def _span(self, length: int) -> Any:
        """One row view over the maps of every shard of every source (see `store._Span`), when
        every source is mapped with all its shards open; else None (rows are read per source)."""
        if length not in self._spans:
            usable = all(st.mapped and len(st.shards) <= st.max_open for st in self.stores)
            arrays = [st._tokens(k) for st in self.stores for k in range(len(st.shards))] if usable else []
            addresses = [a.__array_interface__["data"][0] for a in arrays]
            usable = usable and len({a % 4 for a in addresses}) <= 1  # the view steps in whole tokens
            starts = [st.starts[:-1] + base for st, base in zip(self.stores, self.bases.tolist(), strict=False)]
            ends = np.concatenate([*starts, [self.n_tokens]])
            self._spans[length] = _Span(arrays, ends, length) if usable else None
        return self._spans[length]

    def gather(self, offsets: np.ndarray, length: int, scratch: np.ndarray | None = None) -> np.ndarray:
        span = self._span(length)
        if span is not None:
            at, cross = span.locate(offsets)
            if cross is None:
                return span.view[at]
        n = len(offsets) * length
        out = scratch[:n].reshape(len(offsets), length) if scratch is not None and len(scratch) >= n else None
        if out is None:
            out = np.empty((len(offsets), length), dtype=np.uint32)
        self.read_rows(offsets, out)
        return out

    def read_rows(self, offsets: np.ndarray, out: np.ndarray) -> None:
        span = self._span(out.shape[1])
        if span is not None:
            at, cross = span.locate(offsets)
            if cross is None:
                out[...] = span.view[at]
                return
        source, local = self.locate(offsets)
        for s in np.unique(source).tolist():
            mine = source == s
            out[mine] = self.stores[s].gather(local[mine], out.shape[1])

    def read_into(self, offset: int, out: np.ndarray) -> None:
        """len(out) tokens from `offset`, which must lie inside one source."""
        s = int(np.searchsorted(self.bases, offset, side="right")) - 1
        self.stores[s].read_into(offset - int(self.bases[s]), out)

    def doc_starts_in(self, lo: int, hi: int) -> np.ndarray:
        s = int(self.locate(np.array([lo]))[0][0])
        base = int(self.bases[s])
        return self.stores[s].doc_starts_in(lo - base, hi - base) + base
