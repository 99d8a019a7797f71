"""Load-time selection by attribute: `TokenDataset(path, where="fineweb_short_lines < 0.5 and
language == 'en'")` draws only from the documents whose attributes (`prepare --attribute`,
format/attributes.py) pass, with every sampler lmshard has (runtime/subset.py lays them end to
end). Nothing is rewritten: another threshold is another `where`.

**The expression** is a Python-style condition over the dataset's attribute names: numbers,
comparisons (`<`, `<=`, `>`, `>=`, `==`, `!=`, chained as in `0.2 < x <= 0.5`), `in` / `not in`
a list, `and`, `or`, `not`, parentheses, and arithmetic between columns (`+ - * /`). A category
compares with its labels as strings (`language in ('en', 'de')`); a label the column does not
have is refused, as is a name the dataset has no column for. A NaN (a ratio over nothing) passes
no comparison, `!=` and `not in` included (and so passes `not` of one: `not x > 0.3` keeps
it). A float32 column is compared in float32: `x <= 0.1` keeps a stored 0.1. Parsed with
Python's `ast` (at most 10,000 characters, 64 levels deep), evaluated on numpy columns: never
`eval`.

Memory model: per shard, the columns it names while its selection is computed (their values);
the selection kept is one bit per document of the split (`np.packbits`).
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentError, FormatError
from ..format.attributes import DTYPES, AttrField, Columns, local_columns, read_columns
from ..remote.urls import redact

_COMPARE = {ast.Lt: np.less, ast.LtE: np.less_equal, ast.Gt: np.greater, ast.GtE: np.greater_equal,
            ast.Eq: np.equal, ast.NotEq: np.not_equal}  # fmt: skip
_ARITH = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.divide}
_MAX_CHARS, _MAX_DEPTH = 10_000, 64


def _nan(value: Any) -> Any:
    return np.isnan(value) if np.asarray(value).dtype.kind == "f" else False


class Where:
    """A parsed `where=` expression over a dataset's attributes: `mask(rows)` is True for each
    record that passes. Picklable (kept as its text, parsed again where needed)."""

    def __init__(self, text: str, fields: Sequence[AttrField]) -> None:
        if not isinstance(text, str) or not text.strip():
            raise ArgumentError(f"where={text!r} is not a condition; pass one over the dataset's attributes, e.g. "
                                "where=\"fineweb_short_lines < 0.5\"")  # fmt: skip
        self.text, self.fields = text.strip(), tuple(fields)
        self.columns = {f.name: f for f in self.fields}
        if len(self.text) > _MAX_CHARS:
            raise self._fail(f"{len(self.text):,} characters; a condition is at most {_MAX_CHARS:,}")
        try:
            self.tree = ast.parse(self.text, mode="eval").body
        except SyntaxError as e:
            raise ArgumentError(f"where={self.text!r} does not parse ({e.msg}); write a condition such as "
                                "\"quality > 0.7 and language == 'en'\"") from None  # fmt: skip
        except (RecursionError, MemoryError, ValueError):
            raise self._fail("nested too deeply to read; write a flatter condition") from None
        self.used: list[str] = []
        self._check(self.tree, 0)
        self._check_bool(self.tree)
        self.text = ast.unparse(self.tree)  # (one spelling of a condition: spaces and parentheses aside)

    def __getstate__(self) -> dict[str, Any]:
        return {"text": self.text, "fields": self.fields}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["text"], state["fields"])  # type: ignore[misc]

    def _fail(self, what: str) -> ArgumentError:
        return ArgumentError(f"where={self.text!r}: {what}")

    def _check(self, node: ast.AST, depth: int) -> None:
        """Refuse anything but the grammar of the module docstring, naming it."""
        if depth > _MAX_DEPTH:
            raise self._fail(f"nested more than {_MAX_DEPTH} levels deep; write a flatter condition")
        if isinstance(node, ast.Name):
            if node.id not in self.columns:
                close = difflib.get_close_matches(node.id, list(self.columns), n=1)
                have = ", ".join(self.columns) or "none (prepared without --attribute)"
                hint = f"did you mean {close[0]}? " if close else ""
                raise self._fail(f"the dataset has no attribute {node.id!r}; {hint}its attributes: {have}")
            self.used.append(node.id)
            return
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float | str):
                raise self._fail(f"{node.value!r} is not a number or a label")
            if isinstance(node.value, int) and abs(node.value) > 1 << 64:
                raise self._fail(f"{ast.unparse(node)[:40]}... is too large a number")
            return
        allowed = (ast.BoolOp, ast.UnaryOp, ast.Compare, ast.BinOp, ast.Tuple, ast.List, ast.And, ast.Or, ast.Not,
                   ast.USub, ast.UAdd, *_COMPARE, *_ARITH, ast.In, ast.NotIn, ast.Load)  # fmt: skip
        if not isinstance(node, allowed):
            raise self._fail(f"{ast.unparse(node) if isinstance(node, ast.expr) else type(node).__name__!s} is not "
                             "allowed; use attribute names, numbers, labels in quotes, comparisons, in, and, or, "
                             "not, + - * /")  # fmt: skip
        for child in ast.iter_child_nodes(node):
            self._check(child, depth + 1)

    def _check_bool(self, node: ast.AST) -> None:
        """The expression as a whole (and each operand of and/or/not) is a condition, not a value."""
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self._check_bool(v)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._check_bool(node.operand)
        elif not isinstance(node, ast.Compare):
            example = f"; compare it, e.g. {ast.unparse(node)} > 0.5" if isinstance(node, ast.Name) else ""
            raise self._fail(f"{ast.unparse(node)} is a value, not a condition{example}")

    def mask(self, rows: Any) -> np.ndarray:
        """True for each document of `rows` (a shard's attribute columns, or records) that passes."""
        with np.errstate(all="ignore"):
            out = self._eval(self.tree, rows)
        return np.broadcast_to(np.asarray(out, dtype=bool), (len(rows),)).copy()

    def _eval(self, node: ast.AST, rows: np.ndarray) -> Any:
        if isinstance(node, ast.BoolOp):
            parts = [self._eval(v, rows) for v in node.values]
            combine = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
            out = parts[0]
            for p in parts[1:]:
                out = combine(out, p)
            return out
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return np.logical_not(self._eval(node.operand, rows))
        if isinstance(node, ast.UnaryOp):  # (a sign: of a number, never of a condition)
            value = self._number(node.operand, rows)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            return _ARITH[type(node.op)](self._number(node.left, rows), self._number(node.right, rows))
        if isinstance(node, ast.Compare):
            out, left = None, node.left
            for op, right in zip(node.ops, node.comparators, strict=True):
                step = self._compare(left, op, right, rows)
                out, left = step if out is None else np.logical_and(out, step), right
            return out
        return self._number(node, rows)

    def _number(self, node: ast.AST, rows: np.ndarray) -> Any:
        if isinstance(node, ast.Name):
            f = self.columns[node.id]
            if f.dtype == "category":
                raise self._fail(f"{f.name} is a category; compare it with its labels (== 'x', in ('x', 'y'))")
            column = rows[f.name]  # float32 compared in float32 (a number written in the condition is rounded to it)
            return column.astype(np.int64) if f.dtype == "uint32" else column  # (uint32 arithmetic would wrap)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                raise self._fail(f"{node.value!r} is a label; compare a category attribute with it")
            return float(node.value)  # type: ignore[arg-type]
        if isinstance(node, ast.Compare | ast.BoolOp) or (isinstance(node, ast.UnaryOp) and
                                                           isinstance(node.op, ast.Not)):  # fmt: skip
            raise self._fail(f"{ast.unparse(node)} is a condition where a number is needed")
        if isinstance(node, ast.Tuple | ast.List):
            raise self._fail(f"{ast.unparse(node)} is a list; use it after in / not in")
        return self._eval(node, rows)

    def _compare(self, left: ast.AST, op: ast.cmpop, right: ast.AST, rows: np.ndarray) -> np.ndarray:
        category = next((self.columns[n.id] for n in (left, right) if isinstance(n, ast.Name) and
                         self.columns[n.id].dtype == "category"), None)  # fmt: skip
        if isinstance(op, ast.In | ast.NotIn):
            if not isinstance(right, ast.Tuple | ast.List):
                raise self._fail(f"after {'not in' if isinstance(op, ast.NotIn) else 'in'} comes a list, e.g. "
                                 "in ('en', 'de')")  # fmt: skip
            values = [self._code(category, v) if category else self._constant(v) for v in right.elts]
            column = self._column(left, rows, category)
            kind = column.dtype if isinstance(column, np.ndarray) and column.dtype.kind == "f" else None
            found = np.isin(column, np.array(values, dtype=kind)) if values else np.zeros(len(rows), bool)
            return ~found & ~_nan(column) if isinstance(op, ast.NotIn) else found  # (NaN passes no comparison)
        if category is not None:
            if not isinstance(op, ast.Eq | ast.NotEq):
                raise self._fail(f"{category.name} is a category: compare it with == or !=, or use in")
            name, label = (left, right) if isinstance(left, ast.Name) and left.id == category.name else (right, left)
            column = self._column(name, rows, category)
            code = self._code(category, label)
            return column == code if isinstance(op, ast.Eq) else column != code
        a, b = self._number(left, rows), self._number(right, rows)
        out = _COMPARE[type(op)](a, b)
        return out & ~_nan(a) & ~_nan(b) if isinstance(op, ast.NotEq) else out  # (NaN passes no comparison)

    def _column(self, node: ast.AST, rows: np.ndarray, category: AttrField | None) -> Any:
        if category is not None:
            if not (isinstance(node, ast.Name) and node.id == category.name):
                raise self._fail(f"{ast.unparse(node)}: a category compares by its name with labels")
            return rows[category.name]
        return self._number(node, rows)

    def _code(self, category: AttrField, node: ast.AST) -> int:
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            raise self._fail(f"{category.name} is a category; compare it with a label in quotes, e.g. "
                             f"{category.name} == {category.labels[0]!r}")  # fmt: skip
        if node.value not in category.labels:
            same = [x for x in category.labels if x.lower() == node.value.lower()]  # (EN for en)
            close = same or difflib.get_close_matches(node.value, category.labels, n=3)
            hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
            raise self._fail(f"{category.name} has no label {node.value!r}; {hint}it has {len(category.labels)} "
                             f"labels, listed in the metadata's attributes")  # fmt: skip
        return category.labels.index(node.value)

    def _constant(self, node: ast.AST) -> float:
        value = node.value if isinstance(node, ast.Constant) else None
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._fail(f"{ast.unparse(node)} in a list is not a number")
        return float(value)


def attribute_columns(store: Any, k: int, fields: Sequence[AttrField], names: Sequence[str]) -> Columns:
    """The columns `names` of shard k's attribute file (format/attributes.py), each read alone: a
    ranged read at a URL, a seek and a read on disk."""
    shard = store.shards[k]
    if not shard.attr_path:
        raise FormatError(f"{shard.path}: no attribute file; the dataset keeps no attributes")
    remote = getattr(store, "remote", None)
    if remote is None:  # (one open for all the columns)
        return local_columns(store.root, shard, tuple(fields), names)
    return read_columns(lambda offset, size: read_part(store, shard.attr_path, offset, size), shard, tuple(fields),
                        names, redact(remote.url_of(shard.attr_path)))  # fmt: skip


def read_part(store: Any, rel: str, offset: int, size: int) -> bytes:
    """Bytes [offset, offset + size) of the dataset's file `rel` (a shard's .src or .attr): a
    ranged read at a URL, a seek and a read on disk. The caller holds them to their checksum."""
    remote = getattr(store, "remote", None)
    if remote is None:
        with open(store.root / rel, "rb") as f:
            f.seek(offset)
            return f.read(size)
    from .remote.blockread import objects_of_an_opened_dataset

    with objects_of_an_opened_dataset():
        return bytes(remote.read_range(rel, offset, offset + size)) if size else b""


class Selected:
    """`where`'s choice of each document of a split, one bit per document (computed once, a
    shard's attribute file at a time): `SubsetStore`'s `pick`."""

    def __init__(self, store: Any, where: Where) -> None:
        self.where = where
        self.bits = [np.packbits(where.mask(attribute_columns(store, k, where.fields, where.used)))
                     if store.shards[k].n_docs
                     else np.zeros(0, np.uint8) for k in range(len(store.shards))]  # fmt: skip

    def __call__(self, k: int, first: int, n: int) -> np.ndarray:
        return np.unpackbits(self.bits[k], count=n).astype(bool)


def attribute_values(data: Any, name: str) -> np.ndarray:
    """`TokenDataset.attribute`: the column `name` of the documents `data` holds, in order."""
    fields = data.meta.attributes if data.meta is not None else ()
    if name not in {f.name for f in fields}:
        have = ", ".join(f.name for f in fields) or "none (prepared without --attribute)"
        raise ArgumentError(f"{data.path} has no attribute {name!r}; its attributes: {have}")
    store = data.store  # (a subset's documents: its pick over the prepared split, runtime/subset.py)
    base, pick = (store.base, store.pick) if hasattr(store, "pick") else (store, None)
    out, first = [], 0
    for k, shard in enumerate(base.shards):
        if shard.n_docs and (pick is None or not getattr(pick, "absent", lambda _: False)(k)):
            values = attribute_columns(base, k, fields, [name])[name]
            out.append(values if pick is None else values[pick(k, first, shard.n_docs)])
        first += shard.n_docs
    kind = next(f.dtype for f in fields if f.name == name)
    return np.concatenate(out) if out else np.zeros(0, dtype=DTYPES[kind])
