"""--max-docs: the cut after the N-th kept document, made once the select stage is complete, so
that the dataset is the same whatever the plan (its units and tasks).

The dataset ends at the N-th document, in input order, that survives deduplication, and counts
what was read up to that document's record. A planned run tokenizes and selects every unit
(the units are read in parallel, before any count is known), then the task that completes the
select stage (the one that lays out the shards) cuts, from the units' kept counts in the select
summary:

- the unit u where the N-th kept document falls: its fates after that document become `CUT`
  (its `.split` file rewritten), and its totals are counted again by reading its work items up
  to that document's record (the worker's `stop_after`), with its documents' fates;
- every unit after u keeps nothing (its stream totals zeroed; its newlines and its lines' keys
  stay: line numbers of earlier units and the line key files do not depend on the cut);
- the run's totals are those of the units before u (their select markers, which a --max-docs
  run keeps) and u's own.

It writes `select/cut.json` (the unit, the documents kept of it, the units' stream totals after
the cut, the run's totals) last; the layout and the finish read it instead of the select
summary. The work is proportional to the units before the cut (a small file each) plus one
unit read again.

Memory model: the select summary's rows (7 integers per unit), one unit's per-document arrays
(20 bytes per document) and one work item at a time.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...format import SPLITS
from ..documents.dedup import KeySet
from ..documents.sources import Source
from ..documents.worker import ItemResult, WorkerConfig, run_item
from ..output.build import Totals, account
from . import volatile
from .layout import add_totals, unit_arrays
from .linenumbers import RELATIVE, tag
from .unitfiles import load_unit, read_section
from .units import unit_items

CUT = -3  # a document after the N-th kept one: not read by a one-process run
CUT_FILE = "cut.json"


def unread_from(work: Path) -> int | None:
    """The first unit a local --max-docs run never read (`EarlyStop`: the one after the unit
    that holds the N-th kept document), as its `ENOUGH` file says; None before it is written."""
    try:
        return int(json.loads((work / "tokenize" / ENOUGH).read_text())["from"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cut_path(work: Path) -> Path:
    return work / "select" / CUT_FILE


def ensure_cut(work: Path, plan: dict[str, Any], sources: list[Source], wcfg: WorkerConfig, config: Any,
               rows: list[list[int]], specials: int,
               line_masks: Callable[[int], Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The cut (see the module docstring), made unless `select/cut.json` exists (every task that
    makes it makes the same). `rows`: the select summary's stream rows; `line_masks(u)`
    (--dedup-lines): unit u's items' line keep-bits."""
    path = cut_path(work)
    if path.exists():
        cut: dict[str, Any] = json.loads(path.read_text())
        return cut
    kept = np.cumsum([row[4] for row in rows])
    at = int(np.searchsorted(kept, config.max_docs))  # the first unit whose kept documents reach N
    if at >= len(rows):  # fewer kept documents than N: nothing to cut
        cut = {"unit": -1, "docs": 0, "streams": rows, "totals": None}
    else:
        want = config.max_docs - (int(kept[at - 1]) if at else 0)
        split_path = work / "select" / f"unit_{at:06d}.split"
        split = np.fromfile(split_path, dtype=np.int8)
        docs = int(np.flatnonzero(split >= 0)[want - 1]) + 1  # up to and including the N-th kept document
        split[docs:] = CUT
        volatile.write_bytes(split_path, split.tobytes())  # (a temporary name of its own: tasks may cut at once)
        own = _recount(work, plan, sources, wcfg, config, at, split, docs, specials, line_masks)
        joined = Totals()
        for v in range(at):  # (one marker at a time)
            add_totals(joined, Totals.parse(json.loads((work / "select" / f"unit_{v:06d}.json").read_text())["totals"]))
        add_totals(joined, own)
        totals = joined.to_json()
        lengths = unit_arrays(work / "tokenize", at)["lengths"]
        row: list[int] = []
        for s in range(len(SPLITS)):
            mine = split == s
            row += [int(mine.sum()), int(lengths[mine].sum()) + specials * int(mine.sum())]
        row += [int((split >= 0).sum()), *rows[at][5:]]
        after = [[0, 0, 0, 0, 0, *r[5:]] for r in rows[at + 1 :]]
        cut = {"unit": at, "docs": docs, "streams": [*rows[:at], row, *after], "totals": totals}
    volatile.write_json(path, cut)
    return cut


def _recount(work: Path, plan: dict[str, Any], sources: list[Source], wcfg: WorkerConfig, config: Any, u: int,
             split: np.ndarray, docs: int, specials: int,
             line_masks: Callable[[int], Any] | None) -> Totals:  # fmt: skip
    """Unit u's totals up to its document `docs - 1`: its work items read again (no tokenizing)
    as the tokenize stage read them, the last one up to that document's record, each accounted
    with its documents' fates as the select stage accounts them."""
    unit = load_unit(plan, u)
    arrays = unit_arrays(work / "tokenize", u)
    items = unit_items(sources, unit, config.text_mode, config.text_field, config.max_chars,
                       wcfg.hf)  # fmt: skip
    if line_masks is not None:
        items = (replace(item, line_keep=keep) for item, keep in zip(items, line_masks(u)[0], strict=True))
    numbered = unit.kind not in RELATIVE or unit.start == 0  # else numbered from the unit's start, as when tokenized
    totals, at = Totals(), 0
    for item in items:
        r = run_item(item, wcfg, None, sign=False, stop_after=docs - at)
        d = len(r.keys)
        fates = split[at : at + d]
        whole = ItemResult(seq=(0, 0), tokens=np.zeros(0, np.uint32), lengths=arrays["lengths"][at : at + d],
                           keys=arrays["keys"][at : at + d], doc_sources=arrays["sources"][at : at + d],
                           counts=r.counts, examples=r.examples if numbered else tag(r.examples, u), chars=r.chars,
                           nbytes=item.nbytes)  # fmt: skip
        account(totals, whole, fates >= 0, fates == -1, specials, fates == -2)
        at += d
        if at >= docs:
            break
    return totals


class EarlyStop:
    """--max-docs on one machine (local_exec.py): the units are tokenized in plan order, a few at
    a time, until those done from the first on hold N kept documents; the units not started by
    then are never read, and no stage writes a file for them (`unread_from`; with --dedup-lines
    they are written as units of no documents that keep their lines' keys: unitfiles.skip_unit). The
    dataset is the one of a run that tokenized every unit: whether a document is kept depends on
    the units before it only (its key met earlier or not), and every unit after the one that
    holds the N-th kept document keeps nothing (the cut above). Counted as the select stage keeps
    them: a document whose key is new (with --dedup none, every one). Not with --near-dedup,
    where a cluster can join two documents through a later one: every unit is read.

    Within a unit too (`stop_for`): the unit started once every unit before it is done knows
    how many kept documents it lacks, and the keys before it, so it ends after the work item
    that holds the N-th (one process stops there too); the units started after it are given up
    between two items once the N are counted (`ENOUGH`, a file the workers look for): they come
    after the cut, and keep nothing.

    Memory model: the keys of the kept documents counted so far (≈16 bytes each, as a
    one-process run's dedup set; in the pool a copy of them goes to the worker of each unit that
    can stop within: ≈16 bytes × N, once per such unit) and the numbers of the units done out of
    order."""

    def __init__(self, work: Path, max_docs: int, dedup: bool, done: Iterable[int]) -> None:
        self.tokenized, self.want = work / "tokenize", max_docs
        self.seen = KeySet() if dedup else None
        self.kept = self.next = 0  # kept documents of the units before `next`, all done
        self.ready = set(done)
        self._advance()

    @property
    def enough(self) -> bool:
        return self.kept >= self.want

    @property
    def flag(self) -> Path:
        return self.tokenized / ENOUGH

    def stop_for(self, u: int, here: bool = False) -> UnitStop:
        """Unit u's stop: within it when every unit before it is done, else only given up.
        `here`: tokenized in this process, next, counting into the kept keys themselves (`done`
        then takes its count); else with a copy of them (to a worker)."""
        if u != self.next:
            return UnitStop(None, None, self.flag)
        return UnitStop(self.want - self.kept, self.seen if here else copy.deepcopy(self.seen), self.flag)

    def mark(self) -> None:
        """Once N kept documents are counted: the units in progress are given up (`ENOUGH`), and
        every unit from the one after the N-th kept document's is never read (`unread_from`).
        Also when they were counted before it could say so (a resumed run, stopped between the
        last unit it needed and this mark; or one whose `ENOUGH` named no unit)."""
        if self.enough and unread_from(self.tokenized.parent) is None:
            volatile.write_json(self.flag, {"from": self.next})

    def done(self, u: int, counted: UnitStop | None = None) -> None:
        """Unit u is tokenized (`counted`: by the stop that counted its keys into ours, here)."""
        if counted is not None and counted.room is not None and u == self.next:
            self.kept += counted.counted
            self.next += 1
        else:
            self.ready.add(u)
        self._advance()

    def _advance(self) -> None:
        while self.next in self.ready and not self.enough:
            keys = read_section(self.tokenized, self.next, "keys")
            self.kept += int(self.seen.add_new(keys).sum()) if self.seen is not None else len(keys)
            self.ready.discard(self.next)
            self.next += 1


ENOUGH = "enough"  # in the tokenize folder of a local --max-docs run: its N kept documents are counted


class UnitStop:
    """What a unit of a local --max-docs run stops at (unitfiles.tokenize_unit): `enough(keys)`
    after each work item, True once the unit holds `room` new documents (keys not in `seen`, the
    kept keys before it, nor earlier in the unit; every document without dedup); never when
    `room` is None. `abandoned()`: the run has its N documents (its `flag` file exists)."""

    def __init__(self, room: int | None, seen: KeySet | None, flag: Path) -> None:
        self.room, self.seen, self.flag = room, seen, flag
        self.counted = 0  # new documents counted

    def enough(self, keys: np.ndarray) -> bool:
        if self.room is None:
            return False
        new = int(self.seen.add_new(keys).sum()) if self.seen is not None else len(keys)
        self.counted += new
        self.room -= new
        return self.room <= 0

    def abandoned(self) -> bool:
        return self.flag.exists()


def near_examples(examples: list[dict[str, Any]], ids: list[int], cut: dict[str, Any], base: int) -> list[Any]:
    """The near-duplicate examples a one-process run met before the cut: those whose removed
    document (`ids`, unit << 32 | document, the units numbered from `base`) is not after it."""
    if cut["unit"] < 0:
        return examples
    last = ((cut["unit"] + base) << 32) | (cut["docs"] - 1)
    return [e for e, i in zip(examples, ids, strict=True) if i <= last]
