"""`lmshard inspect DS --attribute NAME`: the distribution of per-document attributes
(`prepare --attribute`, format/attributes.py) over a split, to choose a `where=` threshold.

For a number: its documents, how many are NaN and how many infinite, min, mean and max of the
others, and a histogram of `bins` equal-width buckets from min to max (whole numbers for a
count): per bucket its documents, their share of the split's tokens, and the share of the
documents at or above it (what `where="x >= bucket start"` keeps). For a category: documents
and tokens per label, most documents first.

Memory model: two passes over the split's attribute files, one shard's file and index at a
time; per attribute, its histogram (or a count per label).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError, FormatError
from ..format import INDEX_DTYPE, REGENERATE_HINT, DatasetMeta
from ..format.attributes import AttrField, local_columns

BINS = 10


def _edges(lo: float, hi: float, bins: int, whole: bool) -> np.ndarray:
    """`bins` equal buckets from lo to hi, the last holding hi; for counts (`whole`), whole numbers:
    bucket [a, b) holds a .. b - 1, one bucket a number where there are fewer numbers than bins."""
    if not whole:
        return np.linspace(lo, hi, bins + 1) if hi > lo else np.array([lo, lo])
    return np.unique(np.round(np.linspace(lo, hi + 1, min(bins, int(hi - lo) + 1) + 1)))


def chosen(meta: DatasetMeta, names: Sequence[str]) -> list[AttrField]:
    """The attributes `names` asks for (`all`: every one); ConfigError naming what the dataset has."""
    fields = {f.name: f for f in meta.attributes}
    if not fields:
        raise ConfigError(f"{meta.root}: keeps no attributes (prepared without --attribute); prepare it with "
                          "--attribute NAME (docs/quality.md)")  # fmt: skip
    if "all" in names:
        return list(fields.values())
    wanted: list[str] = []
    for name in names:  # a column, or the --attribute that made some (length: chars, words, lines)
        made = [f.name for f in meta.attributes if f.by == name]
        if name not in fields and not made:
            close = difflib.get_close_matches(name, [*fields, *(f.by for f in meta.attributes)], n=1)
            raise ConfigError(f"--attribute {name}: {meta.root} has no such attribute"
                              f"{f'; did you mean {close[0]}?' if close else ''} It has {', '.join(fields)} (or "
                              "pass all)")  # fmt: skip
        wanted += [name] if name in fields else made
    return [fields[n] for n in dict.fromkeys(wanted)]


def _shards(meta: DatasetMeta, split: str, names: list[str]) -> Iterator[tuple[Any, np.ndarray]]:
    """(the columns `names`, token counts) of each document of each shard of `split`, checked."""
    for shard in meta.split_shards(split):
        if shard.n_docs:
            index = np.fromfile(meta.abspath(shard.index_path), dtype=INDEX_DTYPE).astype(np.int64)
            yield local_columns(meta.root, shard, meta.attributes, names), np.diff(index)


def distributions(meta: DatasetMeta, names: Sequence[str], split: str, bins: int = BINS) -> list[dict[str, Any]]:
    """Per attribute asked for, its distribution over `split` (see the module docstring)."""
    fields = chosen(meta, names)
    if split not in meta.splits or not meta.n_docs(split):
        raise ConfigError(f"{meta.root}: its {split} split holds no document; pass --split train or val")
    total, names_of = meta.n_tokens(split), [f.name for f in fields]
    out: list[dict[str, Any]] = []
    stats = {f.name: {"docs": 0, "nan": 0, "inf": 0, "min": np.inf, "max": -np.inf, "sum": 0.0} for f in fields}
    labels = {f.name: np.zeros((len(f.labels), 2), np.int64) for f in fields if f.dtype == "category"}
    for rows, tokens in _shards(meta, split, names_of):  # pass 1: the ranges (and the categories' counts)
        for f in fields:
            s = stats[f.name]
            s["docs"] += len(rows)
            if f.dtype == "category":
                codes = rows[f.name].astype(np.int64)
                if len(codes) and int(codes.max()) >= len(f.labels):
                    raise FormatError(f"{meta.root}: a document's {f.name} is {int(codes.max())}, not one of its "
                                      f"{len(f.labels)} labels; run `lmshard inspect` on it; {REGENERATE_HINT}")
                np.add.at(labels[f.name], codes, np.stack([np.ones(len(rows), np.int64), tokens], axis=1))
                continue
            v = rows[f.name].astype(np.float64)
            ok = np.isfinite(v)
            s["nan"] += int(np.isnan(v).sum())
            s["inf"] += int(np.isinf(v).sum())
            if ok.any():
                s["min"], s["max"] = min(s["min"], float(v[ok].min())), max(s["max"], float(v[ok].max()))
                s["sum"] += float(v[ok].sum())
    edges = {f.name: _edges(stats[f.name]["min"], stats[f.name]["max"], bins, f.dtype == "uint32") for f in fields
             if f.dtype != "category" and np.isfinite(stats[f.name]["min"])}  # fmt: skip
    counts = {name: np.zeros((len(cut) - 1, 2), np.int64) for name, cut in edges.items()}
    for rows, tokens in _shards(meta, split, list(edges)) if edges else ():  # pass 2: the histograms
        for name, cut in edges.items():
            v = rows[name].astype(np.float64)
            ok = np.isfinite(v)
            at = np.clip(np.searchsorted(cut, v[ok], side="right") - 1, 0, len(cut) - 2)
            np.add.at(counts[name], at, np.stack([np.ones(len(at), np.int64), tokens[ok]], axis=1))
    for f in fields:
        s = stats[f.name]
        entry: dict[str, Any] = {"name": f.name, "dtype": f.dtype, "by": f.by, "docs": s["docs"]}
        if f.dtype == "category":
            order = np.argsort(-labels[f.name][:, 0], kind="stable")
            entry["labels"] = [{"label": f.labels[i], "docs": int(labels[f.name][i, 0]),
                                "token_share": float(labels[f.name][i, 1] / total)}
                               for i in order if labels[f.name][i, 0]]  # fmt: skip
        else:
            known = s["docs"] - s["nan"] - s["inf"]
            entry |= {"nan": s["nan"], "inf": s["inf"], "min": s["min"] if known else None,
                      "max": s["max"] if known else None, "mean": s["sum"] / known if known else None}  # fmt: skip
            if f.name in edges:
                cut, c = edges[f.name], counts[f.name]
                above = np.cumsum(c[::-1, 1])[::-1] / total  # the tokens of the documents at or above each bucket
                entry["histogram"] = [{"from": float(cut[i]), "to": float(cut[i + 1]), "docs": int(c[i, 0]),
                                       "token_share": float(c[i, 1] / total), "at_or_above": float(above[i])}
                                      for i in range(len(c))]  # fmt: skip
        out.append(entry)
    return out
