"""`--val-by input` and `--val-by FIELD`: a val part of each domain, of a token budget
(`--val-tokens`), chosen by the documents' keyed draw: the same documents for any worker count,
task count or executor. A domain is an input file (`input`), or a value of a record field (any
other name: a field of each JSON, CSV, parquet, arrow or Hugging Face record, a nested one as
`a.b`; a number is taken as JSON writes it). With a field, every document keeps its domain as
a category attribute named after the field (`domain_attr`), so `val_streams(by=NAME)`,
`where="NAME == 'wiki'"` and `inspect --attributes` see it.

**The rule.** A domain's surviving documents (after every dedup) are taken in order of their
draw u = `uniform_from_keys(key, seed)` (the draw `--val-fraction` compares), documents of equal
draw together (identical texts, under `--dedup none`), until their tokens as written
(separators included) reach --val-tokens: the group that reaches it is in val. Never more than
half the domain's surviving tokens: a group that would pass half is left in train, and the taking
stops there. So val is {u <= t} for the domain's threshold t, a domain keeps at least half its
tokens in train, and a domain of one document (or of one group) has no val.

**In the stages.** The select stage marks every surviving document train and records in each
unit's summary, per domain, its surviving tokens and its candidates: its documents in order of
u until they reach --val-tokens (a document of val is among them: the documents before it in its
domain, and so in its unit, hold fewer tokens than the budget). The fold of the summaries
(barrier.py, `layout.select_join`) adds the tokens and keeps, per domain, the first candidates of
the union until --val-tokens, the same test. The task that makes the layout reads the
thresholds off the top summary (`thresholds`), moves the chosen documents from train to val in
their units' rows (`move_rows`) and keeps the thresholds (and a field's labels) in the layout;
every reader of a unit's split (`unit_split`: the layout's lengths, the write stage's parts of
shards) marks a train document of domain d with u <= t_d as val, from the unit's keys and
inputs or domains. A field's domains are kept per document as the xxh3-64 of the label (the
tokenize stage's `domains` section), and their labels in the units' markers.

Memory model: candidates are four int64 (the draw's bits, tokens, unit, document), 43 bytes of
base64 each in a summary; a unit's summary holds, per domain it reads, its documents up to
--val-tokens (all of them in a unit smaller than that), and every fold's summary up to
--val-tokens per domain: about domains × --val-tokens / mean document tokens candidates, read
whole by the task that makes the layout; the thresholds one float per domain, and the readers'
tables of them (8 bytes per input; 16 per label) once per process. A field has at most 65,536
values (a category's labels), counted in each unit and each fold.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ..documents.dedup import uniform_from_keys
from ..domains import check_labels, field_of, label_keys
from . import unitfiles

_table: list[Any] = [None, None]  # the thresholds last made a table (unit_split), and the table
_codes: list[Any] = [None, None]  # the labels last made a table (`_labels`), and the table


def _pack(docs: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(docs, dtype="<i8").tobytes()).decode()


def _unpack(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<i8").reshape(-1, 4)


def _prefix(docs: np.ndarray, budget: int, cap: int | None = None) -> np.ndarray:
    """The first of `docs` (rows: draw bits, tokens, unit, document) in order of draw, groups of
    equal draw whole, until their tokens reach `budget`; with `cap`, no group that would take
    them past it (nor any after it)."""
    docs = docs[np.lexsort((docs[:, 3], docs[:, 2], docs[:, 0]))]  # (a draw's bits sort as the draw: both >= 0)
    if not len(docs):
        return docs
    first = np.flatnonzero(np.r_[True, docs[1:, 0] != docs[:-1, 0]])  # each group's first row
    ends = np.r_[first[1:], len(docs)]
    totals = np.cumsum(docs[:, 1])[ends - 1]  # tokens up to each group's end
    taken = min(int(np.searchsorted(totals, budget, side="left")) + 1, len(first))  # groups to reach the budget
    if cap is not None:
        taken = min(taken, int(np.searchsorted(totals, cap, side="right")))
    return docs[: ends[taken - 1]] if taken > 0 else docs[:0]


def candidates(draws: np.ndarray, tokens: np.ndarray, groups: np.ndarray, kept: np.ndarray, unit: int,
               budget: int, field: str | None = None, labels: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    """A unit's part of the summary: per domain, its surviving tokens and its candidates.
    `groups`: each document's input, or with --val-by `field` its domain's key (`labels`: the
    unit's domains)."""
    out: dict[str, list[Any]] = {}
    names = dict(zip(label_keys(labels).tolist(), labels, strict=True)) if field is not None else None
    for g in np.unique(groups[kept]).tolist():
        mine = np.flatnonzero(kept & (groups == g))
        docs = np.stack([draws[mine].view(np.int64), tokens[mine], np.full(len(mine), unit), mine], axis=1)
        out[str(g) if names is None else names[g]] = [int(tokens[mine].sum()), _pack(_prefix(docs, budget))]
    return {"budget": budget, "inputs": out} | ({"field": field} if field is not None else {})


def join(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of several parts: tokens added, candidates cut to the budget again."""
    budget = parts[0]["budget"]
    merged: dict[str, list[Any]] = {}
    for part in parts:
        for i, (tokens, docs) in part["inputs"].items():
            have = merged.setdefault(i, [0, []])
            have[0] += tokens
            have[1].append(_unpack(docs))
    field = parts[0].get("field")
    check_labels(merged, field, "the records read")
    out = {i: [t, _pack(_prefix(np.concatenate(d), budget))] for i, (t, d) in merged.items()}
    return {"budget": budget, "inputs": out} | ({"field": field} if field else {})


def thresholds(val: dict[str, Any]) -> dict[str, float]:
    """Per domain with a val part (an input's number, or a label), its threshold t (val: its
    documents with u <= t)."""
    out = {}
    for i, (tokens, docs) in val["inputs"].items():
        chosen = _prefix(_unpack(docs), val["budget"], tokens // 2)
        if len(chosen):
            out[i] = float(chosen[-1:, 0].view(np.float64)[0])
    return out


def move_rows(rows: list[list[int]], val: dict[str, Any], limits: dict[str, float]) -> list[list[int]]:
    """The units' stream rows (layout.py: train docs, tokens, val docs, tokens, ...) with the
    chosen documents moved from train to val."""
    rows = [list(row) for row in rows]
    for i, (_, packed) in val["inputs"].items():
        t = limits.get(i)
        docs = _unpack(packed)
        for _, tokens, unit, _ in docs[docs[:, 0].view(np.float64) <= t].tolist() if t is not None else ():
            row = rows[unit]
            row[0], row[1], row[2], row[3] = row[0] - 1, row[1] - tokens, row[2] + 1, row[3] + tokens
    return rows


def val_rows(summary: dict[str, Any], seed: int, val_by: str) -> tuple[list[list[int]], dict[str, Any]]:
    """The units' stream rows of a --val-by run's select summary, its val chosen, and what the
    layout keeps for the readers of the units' splits (`unit_split`): the seed and thresholds
    (with a field: per label, and every label, which the write stage numbers as a category)."""
    limits = thresholds(summary["val"])
    rows = move_rows(summary["streams"], summary["val"], limits)
    if field_of(val_by) is None:
        return rows, {"seed": seed, "inputs": limits}
    labels = sorted(summary["val"]["inputs"])
    if len(set(label_keys(labels).tolist())) < len(labels):  # (two labels of one xxh3-64: never seen)
        raise InputError(f"--val-by {val_by}: two of its values have the same 64-bit hash; name another field")
    return rows, {"seed": seed, "field": val_by, "domains": limits, "labels": labels}


def unit_split(work: Path, u: int, val_by: dict[str, Any] | None) -> np.ndarray:
    """Unit u's split (layout.py: one int8 per document, 0 train, 1 val, negative dropped), with
    `--val-by`'s thresholds (`val_rows`' second value, kept in the layout) applied."""
    split = np.fromfile(work / "select" / f"unit_{u:06d}.split", dtype=np.int8)
    if not val_by or not val_by.get("domains", val_by.get("inputs")):
        return split
    field = "field" in val_by
    arrays = unitfiles.read_sections(work / "tokenize", u, ("keys", "domains" if field else "sources"))
    draws = uniform_from_keys(arrays["keys"], int(val_by["seed"]))
    t = _domain_limits(val_by, arrays["domains"]) if field else _input_limits(val_by, arrays["sources"])
    split[(split == 0) & (draws <= t)] = 1
    return split


def _input_limits(val_by: dict[str, Any], sources: np.ndarray) -> np.ndarray:
    """Each document's threshold by its input (-1: its input has no val)."""
    if _table[0] is not val_by:  # (the layout's head is read once per process: one table per run)
        limits = {int(i): float(t) for i, t in val_by["inputs"].items()}
        table = np.full(max(limits) + 1, -1.0)
        table[list(limits)] = list(limits.values())
        _table[:] = [val_by, table]
    table = _table[1]
    src = sources.astype(np.int64)
    return np.where(src < len(table), table[np.minimum(src, len(table) - 1)], -1.0)


def _domain_limits(val_by: dict[str, Any], domains: np.ndarray) -> np.ndarray:
    """Each document's threshold by its domain's key (-1: its domain has no val)."""
    places, limits = _places(val_by, domains), _labels(val_by)[2]
    return np.where(places >= 0, limits[places], -1.0)


def domain_codes(val_by: dict[str, Any], domains: np.ndarray) -> np.ndarray:
    """Each document's domain as its category code (uint16: its label's place in the layout's
    sorted labels), from its key."""
    places = _places(val_by, domains)
    assert (places >= 0).all()  # (every written document's domain is a label)
    return places.astype("<u2")


def _places(val_by: dict[str, Any], domains: np.ndarray) -> np.ndarray:
    """Each domain key's label, as its place in the layout's labels (-1: none of them: a domain
    whose every document was dropped)."""
    keys, order, _ = _labels(val_by)
    if not len(keys):
        return np.full(len(domains), -1)
    at = np.minimum(np.searchsorted(keys, domains), len(keys) - 1)
    return np.where(keys[at] == domains, order[at], -1)


def _labels(val_by: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The labels' keys sorted, the place of each in the labels, and each label's threshold (-1:
    no val); made once per layout and process."""
    if _codes[0] is not val_by:
        labels = val_by["labels"]
        keys = label_keys(labels)
        order = np.argsort(keys)
        limits = np.array([float(val_by["domains"].get(x, -1.0)) for x in labels], dtype=np.float64)
        _codes[:] = [val_by, (keys[order], order, limits)]
    return _codes[1]  # type: ignore[no-any-return]


def attr_rows(section: Callable[[str], np.ndarray], chosen: np.ndarray, columns: Sequence[int],
              val_by: dict[str, Any] | None) -> np.ndarray:  # fmt: skip
    """The chosen documents' attribute records (bytes: one row each, `columns` wide) from a
    unit's sections (`section(name)`): its `attrs`, and with --val-by FIELD the domain's
    category code last, the column `domain_attr` names."""
    field = val_by is not None and "field" in val_by
    own = sum(columns) - (2 if field else 0)
    rows = section("attrs").reshape(-1, own)[chosen] if own else np.zeros((len(chosen), 0), np.uint8)
    if field:
        assert val_by is not None
        codes = domain_codes(val_by, section("domains")[chosen])
        rows = np.concatenate([rows, codes.view(np.uint8).reshape(-1, 2)], axis=1)
    return rows
