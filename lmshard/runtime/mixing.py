"""How a mixture's rows are split between its sources, and the store that reads them.

`RowTree` assigns global row g to a source by a binary tree over the sources: a node with
(integer) weight b gives row n of its own rows to its left half (weight a) when
floor((a·n + p) / b) steps up, p a phase drawn from the seed. Any k consecutive rows of a node
then give the left half floor or ceil of a·k/b of them, so with two sources every window of k
rows is within one row of its target, and with more within one row per tree level. Row g is
also row m of its source, m the closed-form count of the source's earlier rows. Nothing is
carried between steps: the assignment is a pure function of (weights, seed, g).

`same_tokenization` refuses sources tokenized differently, naming their vocabularies.

Memory model: a handful of integers per tree node; `MixedStore` holds the sources' stores.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from .keyed import keyed_ints
from .span import _Span, widened

if TYPE_CHECKING:
    from .dataset import TokenDataset

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
        """One row view over the maps of every shard of every source (see `span._Span`), when
        every source is mapped with all its shards open; else None (rows are read per source)."""
        if length not in self._spans:
            usable = all(st.mapped and len(st.shards) <= st.max_open for st in self.stores)
            arrays = [st._tokens(k) for st in self.stores for k in range(len(st.shards))] if usable else []
            addresses = [a.__array_interface__["data"][0] for a in arrays]
            usable = usable and len({a.dtype for a in arrays}) <= 1  # one dtype (not uint32 and uint16 sources)
            usable = usable and len({a % arrays[0].itemsize for a in addresses}) <= 1  # the view steps in whole tokens
            starts = [st.starts[:-1] + base for st, base in zip(self.stores, self.bases.tolist(), strict=False)]
            ends = np.concatenate([*starts, [self.n_tokens]])
            self._spans[length] = _Span(arrays, ends, length) if usable else None
        return self._spans[length]

    def gather(self, offsets: np.ndarray, length: int, scratch: np.ndarray | None = None,
               key: Any = None) -> np.ndarray:  # fmt: skip
        span = self._span(length)
        if span is not None:
            at, cross = span.locate(offsets)
            if cross is None:
                return widened(span.view[at])
        n = len(offsets) * length
        out = scratch[:n].reshape(len(offsets), length) if scratch is not None and len(scratch) >= n else None
        if out is None:
            out = np.empty((len(offsets), length), dtype=np.uint32)
        self.read_rows(offsets, out, key)
        return out

    def read_rows(self, offsets: np.ndarray, out: np.ndarray, key: Any = None) -> None:
        span = self._span(out.shape[1])
        if span is not None:
            at, cross = span.locate(offsets)
            if cross is None:
                out[...] = span.view[at]
                return
        source, local = self.locate(offsets)
        for s in np.unique(source).tolist():
            mine = source == s
            out[mine] = self.stores[s].gather(local[mine], out.shape[1], key=key)

    def read_into(self, offset: int, out: np.ndarray) -> None:
        """len(out) tokens from `offset`, which must lie inside one source."""
        s = int(np.searchsorted(self.bases, offset, side="right")) - 1
        self.stores[s].read_into(offset - int(self.bases[s]), out)

    def read_spans(self, starts: np.ndarray, lengths: np.ndarray, out: np.ndarray, at: np.ndarray) -> None:
        """`store.read_spans` of each source for its spans (each span inside one source)."""
        source, local = self.locate(starts)
        for s in np.unique(source).tolist():
            mine = source == s
            self.stores[s].read_spans(local[mine], np.asarray(lengths)[mine], out, np.asarray(at)[mine])

    @property
    def lookahead(self) -> int:
        """Steps to announce ahead: the most any source wants (0 when every source is local)."""
        return max(getattr(st, "lookahead", 0) for st in self.stores)

    @property
    def chunk_steps(self) -> int:
        """Steps per announcement: the fewest any source that prefetches wants."""
        return min([st.chunk_steps for st in self.stores if getattr(st, "lookahead", 0)] or [1])

    def announce(self, key: Any, parts: list[tuple[np.ndarray, np.ndarray | int]]) -> None:
        """Tell each source that prefetches what the coming steps read of it, a part per step
        (maybe empty) as `read_rows` will split the step's rows."""
        split = [(self.locate(starts), lengths) for starts, lengths in parts]
        for s, store in enumerate(self.stores):
            if store.lookahead:
                mine = [(local[source == s], n if np.ndim(n) == 0 else np.asarray(n)[source == s])
                        for (source, local), n in split]  # fmt: skip
                store.announce(key, mine)

    def release(self, key: Any) -> None:
        for st in self.stores:
            st.release(key)

    def release_owner(self, owner: int) -> None:
        for st in self.stores:
            st.release_owner(owner)

    def doc_starts_in(self, lo: int, hi: int) -> np.ndarray:
        s = int(self.locate(np.array([lo]))[0][0])
        base = int(self.bases[s])
        return self.stores[s].doc_starts_in(lo - base, hi - base) + base


# What decides the tokens: the vocabulary file (by sha256), size and special ids. Not the name (a
# Hugging Face tokenizer is named by the path it was loaded from) nor the encoder backend (exact).
_IDENTITY = ("ranks_sha256", "n_vocab", "eot_id", "bos_id")
# What else decides the tokens around each document, in words, and the prepare option that sets it.
_SPECIALS = {"eot_id": ("end-of-text id", "--separator"), "bos_id": ("BOS id", "--bos"),
             "eot_position": ("separator position", "--eot-position")}  # fmt: skip


def same_tokenization(names: list[str], datasets: list[TokenDataset]) -> None:
    """Every source must be tokenized the same way: the first is the reference. The vocabulary
    is compared first, so two vocabularies are named as such, not by an id they happen to differ in."""

    def identity(d: TokenDataset) -> dict[str, Any]:
        if d.meta is None:
            return {"n_vocab": d.vocab_size, "eot_id": d.eot_id, "bos_id": d.bos_id}
        info = d.meta.tokenizer.to_json()
        return {k: info.get(k) for k in _IDENTITY} | {"eot_position": d.meta.eot_position}

    ref = identity(datasets[0])
    for name, data in zip(names[1:], datasets[1:], strict=True):
        mine = identity(data)
        if any(ref.get(k) != mine.get(k) for k in ("ranks_sha256", "n_vocab")):
            raise ConfigError(f"mixture sources were tokenized with different vocabularies: {names[0]} with "
                              f"{_vocabulary(datasets[0])}, {name} with {_vocabulary(data)}; prepare every source "
                              "with one tokenizer")  # fmt: skip
        for key, (what, flag) in _SPECIALS.items():
            if ref.get(key) != mine.get(key):
                raise ConfigError(f"mixture sources {names[0]} and {name} share a vocabulary but differ in the "
                                  f"{what} ({ref.get(key)!r} vs {mine.get(key)!r}); prepare every source with "
                                  f"the same tokenizer and {flag}")  # fmt: skip


def _vocabulary(d: TokenDataset) -> str:
    """A source's vocabulary as a user names it: the tokenizer and its size."""
    if d.meta is None:
        return f"a vocabulary of {d.vocab_size:,} ids (in memory)"
    return f"{d.meta.tokenizer.name} ({d.meta.tokenizer.n_vocab:,} ids)"
