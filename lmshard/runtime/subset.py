"""Load-time subsets of a split: `TokenDataset(path, split="val", val_fraction=0.01, split_seed=0)`
carves a validation part out of a dataset prepared without one (and split="train" the rest of
it); `TokenDataset(path, where="...")` keeps the documents whose attributes pass (where.py). The
two combine: a side of the load-time split, restricted by `where`.

**Which side a document is on.** Document d of the prepared train split (its number in the
split, from 0) is held out when keyed(split_seed, d) < val_fraction × 2**32: a pure function of
the document's number and the seed, so every process agrees, the two sides are disjoint and
together the whole split, and a dataset grown by `prepare --append` (its old shards kept first,
unchanged) keeps every old document on its side.

**The tokens.** A subset's documents, in split order, laid end to end (`SubsetStore`): shard k of
the subset holds the chosen documents of shard k of the split, so rows, windows and packs are drawn
from that stream with every sampler lmshard has. A row is read piece by piece (a piece per
document it touches) from the split's own store: slower than the prepared split's one gather per
batch, which `prepare --val-fraction` gives. `trace` names each piece's document of the split.

A dataset that already has a val split is refused: its train and val are separate already, and
a second split of the train part would be another one.

Memory model: per shard of the split, its chosen documents and tokens (two integers), and for the
last 16 shards read, their chosen documents' starts (16 bytes a document); with `where`, one bit
per document of the split (where.py).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from ..errors import ArgumentError
from . import checks
from .keyed import keyed_ints
from .reads import SplitReads

_SALT = 0x5A11D
_KEEP = 16  # shards whose document maps are kept


def held_out(seed: int, docs: np.ndarray, fraction: float) -> np.ndarray:
    """Whether each document (its number in the split) is on the val side."""
    return keyed_ints(seed ^ _SALT, docs, 1 << 32) < int(round(fraction * (1 << 32)))


def check_fraction(value: object) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1
    if not ok:
        raise ArgumentError(f"val_fraction={checks.show(value)} must be a number between 0 and 1 (the share of "
                            "documents held out), e.g. val_fraction=0.01")  # fmt: skip
    return float(value)  # type: ignore[arg-type]


class HeldOut:
    """A load-time split's side, as a `SubsetStore` pick: shard k's documents on it."""

    def __init__(self, side: str, fraction: float, seed: int) -> None:
        self.side, self.fraction, self.seed = side, fraction, seed

    def __call__(self, k: int, first: int, n: int) -> np.ndarray:
        out = held_out(self.seed, np.arange(first, first + n, dtype=np.int64), self.fraction)
        return out if self.side == "val" else ~out


class Both:
    """Two picks at once: the documents both choose."""

    def __init__(self, *picks: Any) -> None:
        self.picks = picks

    def __call__(self, k: int, first: int, n: int) -> np.ndarray:
        return np.logical_and.reduce([pick(k, first, n) for pick in self.picks])

    def absent(self, k: int) -> bool:
        """Whether a pick knows shard k has none of its documents (its index then goes unread)."""
        return any(getattr(pick, "absent", lambda _: False)(k) for pick in self.picks)


class SubsetStore(SplitReads):
    """The documents of `base` (a store of a prepared split) that `pick(k, first, n)` chooses: a
    bool per document of shard k, which holds n documents after the split's `first`."""

    def __init__(self, base: Any, pick: Any) -> None:
        self.base, self.pick = base, pick
        counts, sizes, before, first = [], [], [], 0
        absent = getattr(pick, "absent", None)  # (a pick that knows a shard has none of its documents)
        for k in range(len(base.shards)):  # each shard's document index, read once (no token is read)
            chosen, lengths = self._chosen(k, first) if absent is None or not absent(k) else ((), np.zeros(0))
            counts.append(len(chosen))
            sizes.append(int(lengths.sum()))
            before.append(first)
            first += base.shards[k].n_docs
        self._docs_before_shard = before  # the split's documents before each of its shards
        keep = [k for k, n in enumerate(sizes) if n]
        self.real = keep  # shard of the side -> shard of the split
        self.shards = [base.shards[k] for k in keep]
        self.doc_counts = np.array([counts[k] for k in keep], dtype=np.int64)
        self.sizes = np.array([sizes[k] for k in keep], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.n_tokens, self.n_docs = int(self.starts[-1]), int(self.doc_counts.sum())
        self.source_names = getattr(base, "source_names", None)
        self.mapped = False
        self._maps: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def _chosen(self, k: int, first: int) -> tuple[np.ndarray, np.ndarray]:
        """Split shard k's documents on this side (their numbers in the shard) and their lengths."""
        idx = np.asarray(self.base.index(k), dtype=np.int64)
        mine = np.flatnonzero(self.pick(k, first, len(idx) - 1))
        return mine, idx[mine + 1] - idx[mine]

    def _map(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Side shard j: (its documents' starts in the split, its index: cumulative lengths from 0)."""
        found = self._maps.get(j)
        if found is None:
            k = self.real[j]
            chosen, lengths = self._chosen(k, self._docs_before_shard[k])
            idx = np.asarray(self.base.index(k), dtype=np.int64)
            found = (int(self.base.starts[k]) + idx[chosen], np.concatenate([[0], np.cumsum(lengths)]))
            self._maps[j] = found
            while len(self._maps) > _KEEP:
                self._maps.popitem(last=False)
        else:
            self._maps.move_to_end(j)
        return found

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": OrderedDict()}

    def index(self, k: int) -> np.ndarray:
        return self._map(k)[1]

    def spans(self, offset: int, length: int) -> list[tuple[int, int]]:
        """[(offset in the split, tokens)] that tokens [offset, offset + length) of this side are."""
        out: list[tuple[int, int]] = []
        j = self.shard_of(offset)
        local, left = offset - int(self.starts[j]), length
        while left > 0:
            starts, idx = self._map(j)
            d = int(np.searchsorted(idx, local, side="right")) - 1
            while left > 0 and d < len(starts):
                take = min(left, int(idx[d + 1]) - local)
                out.append((int(starts[d]) + local - int(idx[d]), take))
                left, local, d = left - take, local + take, d + 1
            j, local = j + 1, 0
        return out

    def read_into(self, offset: int, out: np.ndarray) -> None:
        at = 0
        for start, n in self.spans(offset, len(out)):
            self.base.read_into(start, out[at : at + n])
            at += n

    def gather(self, offsets: np.ndarray, length: int, scratch: np.ndarray | None = None,
               key: Any = None) -> np.ndarray:  # fmt: skip
        n = len(offsets) * length
        if scratch is not None and len(scratch) >= n:
            out = scratch[:n].reshape(len(offsets), length)
        else:
            out = np.empty((len(offsets), length), dtype=np.uint32)
        self.read_rows(offsets, out)
        return out

    def read_rows(self, offsets: np.ndarray, out: np.ndarray, key: Any = None) -> None:
        for r, o in enumerate(np.asarray(offsets).tolist()):
            self.read_into(int(o), out[r])

    def doc_start(self, k: int, i: int) -> int:
        return int(self.starts[k]) + int(self.index(k)[i])


def restrict(meta: Any, store: Any, split: str, fraction: object, seed: object, where: object,
             name: str) -> tuple[Any, str]:  # fmt: skip
    """(the store, what its data_id adds) of `split` of the dataset `name` as loaded: `store`
    itself, or with `val_fraction` a side of a load-time split of it (the prepared train split;
    refused when the dataset has a val split already), with `where` its documents that pass."""
    picks: list[Any] = []
    tag = ""
    if fraction is not None:
        fraction, seed = check_fraction(fraction), checks.seed(seed)
        if meta is not None and "val" in meta.splits and meta.n_tokens("val"):
            raise ArgumentError(f"{name} has a val split already ({meta.n_tokens('val'):,} tokens, prepared with "
                                "--val-fraction); load split='val' as it is, without val_fraction (a split of the "
                                "train part would hold out other documents)")  # fmt: skip
        picks.append(HeldOut(split, fraction, seed))
        tag = f"@{fraction!r}/{seed}"  # (exactly: a val side reopened from it is the same side)
    if where is not None:
        from .where import Selected, Where

        if meta is None or not meta.attributes:
            raise ArgumentError(f"where= needs attributes, and {name} keeps none; prepare it with --attribute (e.g. "
                                "--attribute fineweb_quality)")  # fmt: skip
        chosen = Where(where, meta.attributes)  # type: ignore[arg-type]
        picks.append(Selected(store, chosen))
        tag += f"?{chosen.text}"
    if not picks:
        return store, ""
    made = SubsetStore(store, picks[0] if len(picks) == 1 else Both(*picks))
    if not made.n_tokens and where is None:
        raise ArgumentError(f"val_fraction={fraction} leaves the {split} side of {name} without a document; pass "
                            "a fraction that holds out some documents and keeps some")  # fmt: skip
    if not made.n_tokens:
        raise ArgumentError(f"where={where!r} leaves the {split} split of {name} without a document; pass a "
                            "condition some of its documents pass")  # fmt: skip
    return made, tag
