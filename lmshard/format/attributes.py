"""Per-document attributes (`prepare --attribute`): scores and statistics kept beside each shard,
chosen from at load time (`TokenDataset(..., where="fineweb_short_lines < 0.5")`) without a
rewrite.

**The schema** is the metadata's `attributes`: a list of `{"name", "dtype", "by"}` objects, in
column order, and for a category `"labels"`:

    float32   a score or ratio (NaN where it is not defined: a word ratio of a text without words)
    uint32    a count (characters, words, lines)
    category  uint16, an index into `labels` (the language a model found, say)

`by` names the `--attribute` that made the column. Names are identifiers (letters, digits, `_`,
not starting with a digit), unique in a dataset.

**The file** `shard_N.attr`, beside the shard's `.bin`, `.idx` and `.src`: one fixed-width
record per document in the shard's document order, the columns packed back to back,
little-endian, no padding (`row_dtype`). Its size is `n_docs` × the row's bytes and its xxh3-64
is the shard entry's `attr_xxh3_64`, like every other file of the shard. A dataset prepared
without `--attribute` has no schema and no such files, and reads as before.

Memory model: the schema (a few hundred bytes); `row_dtype` is a numpy dtype.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from .fields import _get, _Invalid

DTYPES = {"float32": "<f4", "uint32": "<u4", "category": "<u2"}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_LABELS = 1 << 16


@dataclass(frozen=True)
class AttrField:
    """One column: its name, type, the `--attribute` that made it, and a category's labels."""

    name: str
    dtype: str
    by: str = ""
    labels: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "by": self.by}
        if self.dtype == "category":
            out["labels"] = list(self.labels)
        return out

    @classmethod
    def parse(cls, raw: Any) -> AttrField:
        if not isinstance(raw, dict):
            raise _Invalid("an entry of 'attributes' is not an object")
        name, dtype = _get(raw, "name", str), _get(raw, "dtype", str)
        if not NAME.fullmatch(name):
            raise _Invalid(f"attribute name {name!r} is not an identifier")
        if dtype not in DTYPES:
            raise _Invalid(f"attribute {name!r} has dtype {dtype!r}, not one of {', '.join(DTYPES)}")
        labels = _get(raw, "labels", list, [])
        if dtype == "category" and (not labels or len(labels) > MAX_LABELS or
                                    not all(isinstance(x, str) for x in labels)):  # fmt: skip
            raise _Invalid(f"attribute {name!r} is a category without its labels (1 to {MAX_LABELS} strings)")
        return cls(name, dtype, _get(raw, "by", str, ""), tuple(labels))


def row_dtype(fields: tuple[AttrField, ...]) -> np.dtype:
    """The packed record of one document's attributes."""
    return np.dtype([(f.name, DTYPES[f.dtype]) for f in fields])


def attr_path(bin_rel: str) -> str:
    """The attribute file of the token file `bin_rel` (train/shard_000000.bin → .attr)."""
    return bin_rel.removesuffix(".bin") + ".attr"


def parse_schema(raw: Any) -> tuple[AttrField, ...]:
    """The metadata's `attributes` (absent: none)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _Invalid("'attributes' is not a list")
    fields = tuple(AttrField.parse(entry) for entry in raw)
    names = [f.name for f in fields]
    if len(set(names)) < len(names):
        raise _Invalid(f"attribute {next(n for n in names if names.count(n) > 1)!r} is listed twice")
    return fields
