"""`--val-by input`: a val part of each input file, of a token budget (`--val-tokens`), chosen by
the documents' keyed draw: the same documents for any worker count, task count or executor.

**The rule.** Of an input's surviving documents (after every dedup), val holds those with the
smallest draws u = `uniform_from_keys(key, seed)` (the draw `--val-fraction` compares), in
order of u, until their tokens as written (separators included) reach the input's budget,
min(--val-tokens, half its surviving tokens): the document that reaches it is in val, and so is
every document whose draw equals its. So val is {u <= t} for the input's threshold t, and an
input keeps at least half its tokens in train (a budget of 0, an input of one token, has no val).

**In the stages.** The select stage marks every surviving document train and records in each
unit's summary, per input, the input's surviving tokens and its candidates: its documents in
order of u until they reach --val-tokens (a document of val is among them: the documents before
it in its input, and so in its unit, hold fewer tokens than the budget). The fold of the
summaries (barrier.py, `layout.select_join`) adds the tokens and keeps, per input, the first
candidates of the union until --val-tokens, the same test. The task that makes the layout reads
the thresholds off the top summary (`thresholds`), moves the chosen documents from train to val
in their units' rows (`move_rows`) and keeps the thresholds in the layout; every reader of a
unit's split (`unit_split`: the layout's lengths, the write stage's parts) marks a train
document of input i with u <= t_i as val, from the unit's keys and inputs.

Memory model: per unit, and per summary, each input's candidates (four numbers each: about
--val-tokens over the mean document's tokens of them) and tokens; the thresholds, one float per
input, held once per process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..documents.dedup import uniform_from_keys
from .unitfiles import read_sections


def _prefix(docs: list[list[Any]], budget: int) -> list[list[Any]]:
    """The first of `docs` ([u, tokens, unit, doc]) in order of u until their tokens reach
    `budget`, with every document whose u equals the last one's."""
    docs = sorted(docs, key=lambda d: (d[0], d[2], d[3]))
    total, end = 0, 0
    while end < len(docs) and total < budget:
        total += docs[end][1]
        end += 1
    while 0 < end < len(docs) and docs[end][0] == docs[end - 1][0]:
        end += 1
    return docs[:end]


def candidates(draws: np.ndarray, tokens: np.ndarray, inputs: np.ndarray, kept: np.ndarray, unit: int,
               budget: int) -> dict[str, Any]:  # fmt: skip
    """A unit's part of the summary: per input, its surviving tokens and its candidates."""
    out: dict[str, list[Any]] = {}
    for i in np.unique(inputs[kept]).tolist():
        mine = np.flatnonzero(kept & (inputs == i))
        docs = [[float(draws[d]), int(tokens[d]), unit, int(d)] for d in mine]
        out[str(i)] = [int(tokens[mine].sum()), _prefix(docs, budget)]
    return {"budget": budget, "inputs": out}


def join(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of several parts: tokens added, candidates cut to the budget again."""
    budget = parts[0]["budget"]
    merged: dict[str, list[Any]] = {}
    for part in parts:
        for i, (tokens, docs) in part["inputs"].items():
            have = merged.setdefault(i, [0, []])
            have[0] += tokens
            have[1] += docs
    return {"budget": budget, "inputs": {i: [t, _prefix(docs, budget)] for i, (t, docs) in merged.items()}}


def thresholds(val: dict[str, Any]) -> dict[int, float]:
    """Per input with a val part, its threshold t (val: its documents with u <= t)."""
    out = {}
    for i, (tokens, docs) in val["inputs"].items():
        budget = min(val["budget"], tokens // 2)
        if budget > 0 and docs:
            out[int(i)] = float(_prefix(docs, budget)[-1][0])
    return out


def move_rows(rows: list[list[int]], val: dict[str, Any], limits: dict[int, float]) -> list[list[int]]:
    """The units' stream rows (layout.py: train docs, tokens, val docs, tokens, ...) with the
    chosen documents moved from train to val."""
    rows = [list(row) for row in rows]
    for i, (_, docs) in val["inputs"].items():
        t = limits.get(int(i))
        for u_draw, tokens, unit, _ in docs:
            if t is not None and u_draw <= t:
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
        seed, limits = int(val_by["seed"]), {int(i): float(t) for i, t in val_by["inputs"].items()}
        arrays = read_sections(work / "tokenize", u, ("keys", "sources"))
        draws = uniform_from_keys(arrays["keys"], seed)
        table = np.full(int(arrays["sources"].max(initial=0)) + 1, -1.0)
        for i, t in limits.items():
            if i < len(table):
                table[i] = t
        split[(split == 0) & (draws <= table[arrays["sources"]])] = 1
    return split
