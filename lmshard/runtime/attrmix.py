"""Mixtures over one attribute of one dataset (`Mixture.by_attribute`): quality buckets as
sources with weights, and soft sampling by a weight of the attribute.

**Buckets.** `edges=[e1, ..., ek]` cut the attribute into k + 1 buckets: below e1, [e1, e2), ...,
at or above ek. Each bucket is a `TokenDataset(path, where=...)` (where.py) and `weights` its
token share in the mixture, held as every mixture holds its weights (mixing.py).

**Soft sampling.** `weight=f` (a numpy-vectorized function of the attribute's values, such as
`lambda q: q ** 2`) draws documents in proportion to f(value) × their tokens, up to the
resolution of `bins`: the attribute's range is cut into `bins` equal-width buckets, and each
bucket's share is the exact sum of f(value) × tokens over its documents (read from the
attribute files and indexes). Within a bucket, documents are drawn in proportion to their tokens.
Documents whose value is NaN or infinite are never drawn, nor are those of a bucket whose
weights are all 0.

**Within a selection.** `where=` restricts every bucket (and, with `weight=`, the mass) to the
documents that pass it: English documents weighted by quality, say.

Memory model: two passes over the split's attribute files and indexes, one shard at a time;
the mixture's buckets are datasets with their own selections (one bit per document each).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentError
from .dataset import TokenDataset
from .where import Where, attribute_columns


def _numeric(data: TokenDataset, attribute: str) -> Any:
    fields = data.meta.attributes if data.meta is not None else ()
    found = next((f for f in fields if f.name == attribute), None)
    if found is None:
        have = ", ".join(f.name for f in fields) or "none (prepared without --attribute)"
        raise ArgumentError(f"the dataset {data.path} has no attribute {attribute!r}; its attributes: {have}")
    if found.dtype == "category":
        raise ArgumentError(f"{attribute} is a category; bucket it with where= (e.g. {attribute} == 'en') and pass "
                            "the datasets to Mixture")  # fmt: skip
    return found


def bucket_sources(path: Any, attribute: str, edges: Sequence[float], weights: Sequence[float], split: str,
                   options: dict[str, Any]) -> list[tuple[TokenDataset, float]]:  # fmt: skip
    """[(bucket dataset, weight)] of `edges` (see the module docstring)."""
    cuts = _numbers("edges", edges)
    if not cuts or any(b <= a for a, b in zip(cuts, cuts[1:], strict=False)):
        raise ArgumentError(f"edges={edges!r} must be one or more increasing numbers (k edges make k + 1 "
                            "buckets)")  # fmt: skip
    weights = _numbers("weights", weights)
    if len(weights) != len(cuts) + 1:
        raise ArgumentError(f"{len(cuts)} edges make {len(cuts) + 1} buckets, and {len(weights)} weights were "
                            "given; pass one weight per bucket")  # fmt: skip
    options = dict(options)
    base = options.pop("where", None)
    _numeric(TokenDataset(path, split, **options), attribute)
    wheres = [f"{attribute} < {cuts[0]!r}"]
    wheres += [f"{lo!r} <= {attribute} < {hi!r}" for lo, hi in zip(cuts, cuts[1:], strict=False)]
    wheres.append(f"{attribute} >= {cuts[-1]!r}")
    wheres = [_and(base, w) for w in wheres]
    out = []
    for i, (where, weight) in enumerate(zip(wheres, weights, strict=True)):
        if weight:
            try:
                out.append((TokenDataset(path, split, where=where, **options), weight))
            except ArgumentError:
                raise ArgumentError(f"bucket {i + 1} of {len(wheres)} ({where}) holds no document of {path}; give it "
                                    "weight 0 or move the edges") from None  # fmt: skip
    return out


def _numbers(name: str, values: Any) -> list[float]:
    """`values` as finite floats, or a one-line ArgumentError."""
    try:
        out = [float(v) for v in values if not isinstance(v, bool | str)]
        if len(out) == len(values) and all(np.isfinite(out)):
            return out
    except (TypeError, ValueError):
        pass
    raise ArgumentError(f"{name}={values!r} must be a list of finite numbers")


def check_options(options: dict[str, Any]) -> None:
    """The TokenDataset options a bucket takes: not a load-time split."""
    if "val_fraction" in options:
        raise ArgumentError("by_attribute takes no val_fraction= (its buckets are selections of a prepared split); "
                            "open the datasets yourself and pass them to Mixture")  # fmt: skip


def _and(base: str | None, condition: str) -> str:
    """A bucket's condition within the documents `where=` chose (none: all)."""
    return condition if base is None else f"({base}) and ({condition})"


def soft_sources(path: Any, attribute: str, weight: Callable[[np.ndarray], Any], bins: int, split: str,
                 options: dict[str, Any]) -> list[tuple[TokenDataset, float]]:  # fmt: skip
    """[(bucket dataset, the exact mass of f × tokens over its documents)] (see the module docstring)."""
    if not isinstance(bins, int) or isinstance(bins, bool) or not 1 <= bins <= 4096:
        raise ArgumentError(f"bins={bins!r} must be an int from 1 to 4096")
    if not callable(weight):
        raise ArgumentError("weight= is a function of the attribute's values (a numpy array), e.g. lambda q: q ** 2")
    options = dict(options)
    base = options.pop("where", None)
    data = TokenDataset(path, split, **options)
    field = _numeric(data, attribute)
    store, fields = data.store, data.meta.attributes  # type: ignore[union-attr]
    chosen = Where(base, fields) if base is not None else None

    def values_of(k: int) -> np.ndarray:  # shard k's values, NaN where `where=` leaves the document out
        columns = attribute_columns(store, k, fields, [field.name, *(chosen.used if chosen else [])])
        values = columns[field.name].astype(np.float64)
        return values if chosen is None else np.where(chosen.mask(columns), values, np.nan)

    lo, hi, shards = np.inf, -np.inf, range(len(store.shards))
    for k in shards:  # pass 1: the range of the values
        values = values_of(k)
        values = values[np.isfinite(values)]
        if len(values):
            lo, hi = min(lo, float(values.min())), max(hi, float(values.max()))
    if not np.isfinite(lo):
        raise ArgumentError(f"{attribute} has no value that is a number in {data.path}; nothing can be drawn")
    # (edges a float32 column holds exactly: where= compares it in float32, and each document lands where counted)
    edges = np.unique(np.linspace(lo, hi, bins + 1)[1:-1].astype(np.float32).astype(np.float64))
    edges = edges[(edges > lo) & (edges < hi)]
    mass = np.zeros(len(edges) + 1)
    for k in shards:  # pass 2: f(value) × tokens, summed per bucket
        values = values_of(k)
        lengths = np.diff(np.asarray(store.index(k), dtype=np.int64))
        ok = np.isfinite(values)
        try:
            with np.errstate(all="ignore"):
                w = np.broadcast_to(np.asarray(weight(values[ok]), dtype=np.float64), (int(ok.sum()),))
        except Exception as e:  # the user's function: whatever it raises or returns
            raise ArgumentError(f"weight= failed on the values of {attribute} ({type(e).__name__}: {e}); it takes "
                                "a numpy array and returns one weight per value, e.g. lambda q: q ** 2") from None
        if not np.isfinite(w).all() or (w < 0).any():
            raise ArgumentError(f"weight= gave {w[~np.isfinite(w) | (w < 0)][0]!r} for a value of {attribute}; "
                                "a weight is a finite number >= 0")  # fmt: skip
        np.add.at(mass, np.searchsorted(edges, values[ok], side="right"), w * lengths[ok])
    if not mass.sum():
        raise ArgumentError(f"weight= is 0 for every document of {data.path}; nothing can be drawn")
    bounds = [lo, *edges.tolist(), hi]  # (bounded: a NaN or infinite value is in no bucket, as in no mass)
    wheres = [f"{a!r} <= {attribute} < {b!r}" for a, b in zip(bounds[:-2], bounds[1:-1], strict=True)]
    wheres = [_and(base, w) for w in [*wheres, f"{bounds[-2]!r} <= {attribute} <= {hi!r}"]]
    return [(TokenDataset(path, split, where=w, **options), m)
            for w, m in zip(wheres, mass.tolist(), strict=True) if m]  # fmt: skip
