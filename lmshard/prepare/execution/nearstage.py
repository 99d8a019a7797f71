"""--near-dedup in a planned run: after the dedup stage, the clusters of every group's edges
(quality/near.py) are found once, by the last dedup task to finish (or the first select task
that finds them missing: every task that makes them makes the same), and written as
`dedup/near.removed`: the removed documents' ids (unit << 32 | document, sorted, uint64), then
each one's survivor's id; `dedup/near.json` holds their count and examples. The select stage
reads one unit's slice of it. Edges too many for one task in that memory are found over parts by
the select stage's tasks together instead (nearparts.py), each part's result a file of the same
form, of which a unit's part is read.

Memory model: the clusters hold about 70 bytes per distinct edge at their peak (about one edge
per near-duplicate document; quality/clusters.py); a unit's slice is two binary searches in the
memory-mapped file; the examples read the keys of the units their candidates are in (8 bytes per
document) and decode up to 2 × NEAR_EXAMPLES short documents.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...quality.near import components
from ...tokenizers import Tokenizer
from ..documents.sources import Source
from . import volatile
from .buckets import doc_signatures, read_edges
from .nearparts import PARTS, decide, result_path, take_part
from .unitfiles import read_section, sections

REMOVED = "near.removed"

NEAR_EXAMPLES = 5  # removed documents shown with their survivor in the metadata
CANDIDATES = 4 * NEAR_EXAMPLES  # the first removed documents not equal to their survivor: examples if not exact copies
SNIPPET_CHARS = 200


@dataclass(frozen=True)
class Previous:
    """An appended-to dataset's signature files (paths in `dataset`, and their rows), whose
    documents a planned run numbers file << 32 | row, before its units."""

    dataset: Path
    files: tuple[str, ...]
    rows: tuple[int, ...]

    def signatures(self, tokenized: Path, ids: np.ndarray, n_hashes: int) -> np.ndarray:
        """The signatures of documents `ids` (sorted), the dataset's and the run's units'."""
        return doc_signatures(tokenized, ids, n_hashes, len(self.files), self.dataset, self.files)

    def ordinal(self, i: int) -> int:
        """Document i's number among the dataset's documents (as a one-process run numbers it)."""
        f = i >> 32
        return sum(self.rows[:f]) + (i & 0xFFFFFFFF)
SUMMARY = "near.json"


def ensure_clusters(work: Path, n_groups: int, n_hashes: int, tokenizer: Tokenizer, sources: list[Source],
                    specials: int, duplicates: Callable[[int], np.ndarray] | None, previous: Previous | None = None,
                    tasks: tuple[int, int, int | None] = (1, 0, None)) -> None:  # fmt: skip
    """Find the clusters unless `dedup/near.removed` exists (see the module docstring).
    `duplicates(u)`: unit u's exact duplicates (document numbers; None: no exact dedup).
    `previous` (--append): the dataset's signature files, whose documents are numbered before
    the run's units (file << 32 | row) and are never removed, as a local --append numbers them.
    `tasks`: the run's tasks and units, and the select task asking (None: the task that completes
    the dedup stage, or a process that schedules): edges too many for one task are found over
    parts by the select tasks together (nearparts.py)."""
    dedup = work / "dedup"
    if (dedup / REMOVED).exists() or (dedup / PARTS / "plan.json").exists() and (dedup / SUMMARY).exists():
        return
    base = len(previous.files) if previous is not None else 0
    n_tasks, n_units, helper = tasks
    tokenized = work / "tokenize"

    def summarize(pairs: Iterable[tuple[int, int]], count: int) -> None:
        examples, ids = _examples(tokenized, pairs, n_hashes, tokenizer, sources, specials, duplicates, previous)
        volatile.write_json(dedup / SUMMARY, {"removed": count, "examples": examples, "ids": ids})

    if decide(dedup, n_groups, n_tasks, base + n_units) > 1:
        if helper is not None:
            take_part(dedup, n_groups, helper, base, (dedup / SUMMARY).exists, summarize)
        return
    removed, survivor = components(*read_edges(dedup, range(n_groups)))
    new = removed >= np.uint64(base) << np.uint64(32)
    removed, survivor = removed[new], survivor[new]
    summarize(zip(removed.tolist(), survivor.tolist(), strict=True), len(removed))
    # (every task that finds them writes the same bytes: a later one's rename changes nothing)
    volatile.write_bytes(dedup / REMOVED, removed.astype("<u8").tobytes() + survivor.astype("<u8").tobytes())


def unit_near(work: Path, u: int, n_docs: int, base: int = 0) -> np.ndarray:
    """Per document of unit u: its survivor's id, or -1 when it is kept (`base`: the units'
    first id number, after an appended-to dataset's signature files)."""
    u += base
    path = work / "dedup" / REMOVED
    if not path.exists() and (work / "dedup" / PARTS / "plan.json").exists():  # found over parts
        path = result_path(work / "dedup", u)
    near = np.full(n_docs, -1, dtype=np.int64)
    n = path.stat().st_size // 16
    if n == 0:
        return near
    both = np.memmap(path, dtype="<u8", mode="r", shape=(2, n))
    lo, hi = np.searchsorted(both[0], [np.uint64(u) << np.uint64(32), np.uint64(u + 1) << np.uint64(32)])
    docs = (both[0][lo:hi] & np.uint64(0xFFFFFFFF)).astype(np.int64)
    near[docs] = both[1][lo:hi].astype(np.int64)
    return near


def near_summary(work: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((work / "dedup" / SUMMARY).read_text())
    return summary


def _examples(tokenized: Path, pairs: Iterable[tuple[int, int]], n_hashes: int, tokenizer: Tokenizer,
              sources: list[Source], specials: int, exact: Callable[[int], np.ndarray] | None,
              previous: Previous | None = None) -> tuple[list[dict[str, Any]], list[int]]:  # fmt: skip
    """The examples the metadata gives: of the first CANDIDATES removed
    documents (`pairs`: the removed and their survivors, in id order) whose key differs from
    their survivor's, the first NEAR_EXAMPLES that are not
    exact copies (`exact(u)`: the numbers of unit u's exact duplicates), with their survivors, as
    short texts (a survivor in the dataset appended to: where it is in it); and the removed
    documents' ids."""
    base = len(previous.files) if previous is not None else 0
    keys: dict[int, np.ndarray] = {}

    def key(i: int) -> int | None:
        u = (i >> 32) - base
        if u < 0:
            return None  # (a document of the dataset appended to: a one-process run has no key for it either)
        if u not in keys:
            keys[u] = read_section(tokenized, u, "keys")
        return int(keys[u][i & 0xFFFFFFFF])

    candidates: list[tuple[int, int]] = []
    for r, s in pairs:
        if len(candidates) == CANDIDATES:
            break
        if key(r) != key(s):
            candidates.append((r, s))
    dups: dict[int, set[int]] = {}
    out: list[dict[str, Any]] = []
    shown: list[int] = []
    for r, s in candidates:
        u = (r >> 32) - base
        if exact is not None and u not in dups:
            dups[u] = set(exact(u).tolist())
        if exact is not None and r & 0xFFFFFFFF in dups[u]:
            continue  # an exact copy of an earlier document: counted with the duplicates
        ids = np.array(sorted({r, s}), dtype=np.uint64)
        sigs = previous.signatures(tokenized, ids, n_hashes) if previous else doc_signatures(tokenized, ids, n_hashes)
        agree = round(float((sigs[0] == sigs[-1]).mean()), 3)
        out.append({"removed": _document(tokenized, r, tokenizer, sources, specials, base, previous),
                    "survivor": _document(tokenized, s, tokenizer, sources, specials, base, previous),
                    "agreement": agree})  # fmt: skip
        shown.append(r)
        if len(out) == NEAR_EXAMPLES:
            break
    return out, shown


def _document(tokenized: Path, i: int, tokenizer: Tokenizer, sources: list[Source], specials: int, base: int = 0,
              previous: Previous | None = None) -> dict[str, Any]:  # fmt: skip
    """{source, text} of document i (unit << 32 | document); one of the dataset appended to:
    where it is in it (its number among the dataset's documents), with no text."""
    u, d = (i >> 32) - base, i & 0xFFFFFFFF
    if u < 0 and previous is not None:
        return {"source": "the dataset appended to", "document": previous.ordinal(i), "text": None}
    lengths = read_section(tokenized, u, "lengths")
    start = int(lengths[:d].sum()) + specials * d
    offset = sections(tokenized, u)["tokens"][0] + 4 * start
    ids = np.fromfile(tokenized / f"unit_{u:06d}.bin", dtype="<u4", count=int(lengths[d]) + specials, offset=offset)
    ids = ids[(ids != tokenizer.eot_id) & (ids != (tokenizer.bos_id if tokenizer.bos_id is not None else -1))]
    source = sources[int(read_section(tokenized, u, "sources")[d])].path
    # its record: [unit, number from the unit's start] until the finish makes it the file's (linenumbers.py)
    record = [u, int(read_section(tokenized, u, "numbers")[d])]
    return {"source": source, "text": tokenizer.decode(ids.tolist())[:SNIPPET_CHARS], "record": record}
