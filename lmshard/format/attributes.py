"""Per-document attributes (`prepare --attribute`): scores and statistics kept beside each shard,
chosen from at load time (`TokenDataset(..., where="fineweb_short_lines < 0.5")`) without a
rewrite.

**The schema** is the metadata's `attributes`: a list of `{"name", "dtype", "by"}` objects, in
column order, and for a category `"labels"`:

    float32   a score or ratio (NaN where it is not defined: a word ratio of a text without words)
    uint32    a count (characters, words, lines)
    category  uint16, an index into `labels` (the language a model found, say)

`by` names the `--attribute` that made the column. Names are identifiers (letters, digits, `_`,
not starting with a digit, not a Python keyword), unique in a dataset.

**The file** `shard_N.attr`, beside the shard's `.bin`, `.idx` and `.src`: the columns one after
the other in schema order, each its documents' values in the shard's document order,
little-endian, no padding. Column c starts at `n_docs` × (the bytes of a value of each column
before it), so a reader of one column reads `n_docs` × its width from there and nothing else.
The file's size is `n_docs` × the bytes of one document's values (`row_dtype`); the shard entry
records its xxh3-64 (`attr_xxh3_64`) and each column's (`attr_column_xxh3_64`), so a column read
alone is checked alone. A dataset prepared without `--attribute` has no schema and no such
files, and reads as before.

Memory model: the schema (a few hundred bytes); the helpers hold the columns or records given.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FormatError
from .blocks import bytes_xxh3
from .fields import _get, _Invalid
from .layout import REGENERATE_HINT

DTYPES = {"float32": "<f4", "uint32": "<u4", "category": "<u2"}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def is_name(name: str) -> bool:
    """An attribute name: an identifier of at most 64 characters that is not a Python keyword
    (a `where=` condition names it as a Python expression does)."""
    return bool(NAME.fullmatch(name)) and not keyword.iskeyword(name) and name not in ("True", "False", "None")
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
        if not is_name(name):
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


def spans(fields: tuple[AttrField, ...], n_docs: int) -> dict[str, tuple[int, int]]:
    """Where each column is in a shard's attribute file of `n_docs` documents: {name: (offset, bytes)}."""
    out, at = {}, 0
    for f in fields:
        size = n_docs * np.dtype(DTYPES[f.dtype]).itemsize
        out[f.name] = (at, size)
        at += size
    return out


def to_rows(data: bytes, dtype: np.dtype, n_docs: int) -> np.ndarray:
    """The records (of `row_dtype`) of an attribute file's bytes: the inverse of `to_columns`."""
    rows, at = np.zeros(n_docs, dtype=dtype), 0
    for name in dtype.names or ():
        kind = dtype.fields[name][0]  # type: ignore[index]
        rows[name] = np.frombuffer(data, dtype=kind, count=n_docs, offset=at)
        at += n_docs * kind.itemsize
    return rows


class Columns(dict):  # type: ignore[type-arg]
    """Some attribute columns of a shard, by name; its length is the shard's documents."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def __len__(self) -> int:
        return self.n


def read_columns(read: Callable[[int, int], bytes], shard: Any, fields: tuple[AttrField, ...],
                 names: Sequence[str], where: str) -> Columns:  # fmt: skip
    """The columns `names` of `shard`'s attribute file, each read alone (`read(offset, size)`: its
    bytes there) and held to its own xxh3-64 in the metadata; FormatError naming `where` (the file)."""
    at, out = spans(fields, shard.n_docs), Columns(shard.n_docs)
    for c, f in enumerate(fields):
        if f.name in names:
            offset, size = at[f.name]
            data = read(offset, size) if size else b""
            if len(data) != size or bytes_xxh3(data) != shard.attr_column_xxh3_64[c]:
                raise FormatError(f"{where}: column {f.name} does not match its size and checksum in the metadata "
                                  f"('attr_column_xxh3_64'); {REGENERATE_HINT}")  # fmt: skip
            out[f.name] = np.frombuffer(data, dtype=DTYPES[f.dtype])
    return out


def local_columns(root: Any, shard: Any, fields: tuple[AttrField, ...], names: Sequence[str]) -> Columns:
    """`read_columns` of a shard in the dataset directory `root` (a Path)."""
    path = root / shard.attr_path
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as e:
        raise FormatError(f"{path}: cannot be read ({e.strerror}); {REGENERATE_HINT}") from None
    with f:

        def read(offset: int, size: int) -> bytes:
            f.seek(offset)
            return f.read(size)

        return read_columns(read, shard, fields, names, str(path))


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
