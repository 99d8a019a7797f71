"""`--val-by input`: a val part of each input file, of a token budget (`--val-tokens`), chosen by
the documents' keyed draw: the same documents for any worker count, task count or executor.

**The rule.** An input's surviving documents (after every dedup) are taken in order of their
draw u = `uniform_from_keys(key, seed)` (the draw `--val-fraction` compares), documents of equal
draw together (identical texts, under `--dedup none`), until their tokens as written
(separators included) reach --val-tokens: the group that reaches it is in val. Never more than
half the input's surviving tokens: a group that would pass half is left in train, and the taking
stops there. So val is {u <= t} for the input's threshold t, an input keeps at least half its
tokens in train, and an input of one document (or of one group) has no val.

**In the stages.** The select stage marks every surviving document train and records in each
unit's summary, per input, the input's surviving tokens and its candidates: its documents in
order of u until they reach --val-tokens (a document of val is among them: the documents before
it in its input, and so in its unit, hold fewer tokens than the budget). The fold of the
summaries (barrier.py, `layout.select_join`) adds the tokens and keeps, per input, the first
candidates of the union until --val-tokens, the same test. The task that makes the layout reads
the thresholds off the top summary (`thresholds`), moves the chosen documents from train to val
in their units' rows (`move_rows`) and keeps the thresholds in the layout; every reader of a
unit's split (`unit_split`: the layout's lengths, the write stage's parts of shards) marks a
train document of input i with u <= t_i as val, from the unit's keys and inputs.

Memory model: candidates are four int64 (the draw's bits, tokens, unit, document), 43 bytes of
base64 each in a summary; a unit's summary holds, per input it reads, its documents up to
--val-tokens (all of them in a unit smaller than that), and every fold's summary up to
--val-tokens per input: about inputs × --val-tokens / mean document tokens candidates, read
whole by the task that makes the layout; the thresholds one float per input, and `unit_split`'s
table of them (8 bytes per input) once per process.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np

from ..documents.dedup import uniform_from_keys
from .unitfiles import read_sections

_table: list[Any] = [None, None]  # the thresholds last made a table (unit_split), and the table


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


def candidates(draws: np.ndarray, tokens: np.ndarray, inputs: np.ndarray, kept: np.ndarray, unit: int,
               budget: int) -> dict[str, Any]:  # fmt: skip
    """A unit's part of the summary: per input, its surviving tokens and its candidates."""
    out: dict[str, list[Any]] = {}
    for i in np.unique(inputs[kept]).tolist():
        mine = np.flatnonzero(kept & (inputs == i))
        docs = np.stack([draws[mine].view(np.int64), tokens[mine], np.full(len(mine), unit), mine], axis=1)
        out[str(i)] = [int(tokens[mine].sum()), _pack(_prefix(docs, budget))]
    return {"budget": budget, "inputs": out}


def join(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of several parts: tokens added, candidates cut to the budget again."""
    budget = parts[0]["budget"]
    merged: dict[str, list[Any]] = {}
    for part in parts:
        for i, (tokens, docs) in part["inputs"].items():
            have = merged.setdefault(i, [0, []])
            have[0] += tokens
            have[1].append(_unpack(docs))
    return {"budget": budget, "inputs": {i: [t, _pack(_prefix(np.concatenate(d), budget))]
                                         for i, (t, d) in merged.items()}}  # fmt: skip


def thresholds(val: dict[str, Any]) -> dict[int, float]:
    """Per input with a val part, its threshold t (val: its documents with u <= t)."""
    out = {}
    for i, (tokens, docs) in val["inputs"].items():
        chosen = _prefix(_unpack(docs), val["budget"], tokens // 2)
        if len(chosen):
            out[int(i)] = float(chosen[-1:, 0].view(np.float64)[0])
    return out


def move_rows(rows: list[list[int]], val: dict[str, Any], limits: dict[int, float]) -> list[list[int]]:
    """The units' stream rows (layout.py: train docs, tokens, val docs, tokens, ...) with the
    chosen documents moved from train to val."""
    rows = [list(row) for row in rows]
    for i, (_, packed) in val["inputs"].items():
        t = limits.get(int(i))
        docs = _unpack(packed)
        for _, tokens, unit, _ in docs[docs[:, 0].view(np.float64) <= t].tolist() if t is not None else ():
            row = rows[unit]
            row[0], row[1], row[2], row[3] = row[0] - 1, row[1] - tokens, row[2] + 1, row[3] + tokens
    return rows


def val_rows(summary: dict[str, Any], seed: int) -> tuple[list[list[int]], dict[str, Any]]:
    """The units' stream rows of a --val-by run's select summary, its val chosen, and what the
    layout keeps for the readers of the units' splits (`unit_split`): the seed and thresholds."""
    limits = thresholds(summary["val"])
    rows = move_rows(summary["streams"], summary["val"], limits)
    return rows, {"seed": seed, "inputs": {str(i): t for i, t in limits.items()}}


def unit_split(work: Path, u: int, val_by: dict[str, Any] | None) -> np.ndarray:
    """Unit u's split (layout.py: one int8 per document, 0 train, 1 val, negative dropped), with
    `--val-by`'s thresholds (`val_rows`' second value, kept in the layout) applied."""
    split = np.fromfile(work / "select" / f"unit_{u:06d}.split", dtype=np.int8)
    if val_by and val_by["inputs"]:
        if _table[0] is not val_by:  # (the layout's head is read once per process: one table per run)
            limits = {int(i): float(t) for i, t in val_by["inputs"].items()}
            table = np.full(max(limits) + 1, -1.0)
            table[list(limits)] = list(limits.values())
            _table[:] = [val_by, table]
        table = _table[1]
        arrays = read_sections(work / "tokenize", u, ("keys", "sources"))
        draws = uniform_from_keys(arrays["keys"], int(val_by["seed"]))
        src = arrays["sources"].astype(np.int64)
        t = np.where(src < len(table), table[np.minimum(src, len(table) - 1)], -1.0)
        split[(split == 0) & (draws <= t)] = 1
    return split
