"""After the dedup stage: which documents each unit keeps (the select stage), and where every
shard and key file of the dataset begins and ends (the layout), before any of them is written.

**Select** (one per unit, in parallel). A unit's documents get their fate from the buckets'
duplicates and the train/val split (a function of each document's key and --seed, as in a
local run): `select/unit_N.split` holds one int8 per document (-1 duplicate, -2
near-duplicate, 0 train, 1 val), and `select/unit_N.json` (written last: the unit's marker) its
documents and tokens per split, its kept documents and its newlines (one row of 6 integers),
and its totals for the metadata (records, drops and their first examples, per-source counts),
made by the same accounting a local run does per work item. A select task joins its units' rows and totals into
its summary, and the tasks' summaries are joined into the stage's (barrier.py, `select_join`):
the units' rows in plan order and the run's totals, which the layout and the finish read as one
file.

**Layout** (once, small). The output is three streams of whole documents in plan order: the
train shards and the val shards (each closes before a document that would take it past
--tokens-per-shard; a longer document gets a shard of its own), and the dedup key files
(KEYS_PER_FILE keys each). Where a stream's next boundary falls is found from the units'
rows in the select summary, and only a unit where a boundary falls inside is opened (its lengths, 8 bytes per
document), so the work is proportional to units and shards, not tokens. Each shard or key file
is a **piece**; its documents from one unit are a **part**, which knows where in the piece it
goes (tokens and documents before it). A write task writes the parts of the units its plan
task tokenized, so one large shard is written by many tasks at once (owners.py). The layout is
written once as tables beside its head `layout.json`, linked into place last like the plan's, and
read a row at a time (layoutfiles.py): a write task reads its own parts and their pieces.

Memory model: select holds one unit's lengths, keys and sources (20 bytes per document) and
the duplicates of it from each bucket; the layout holds the units' per-stream totals and one
unit's lengths at a time, and the pieces (a few dozen bytes each).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...format import SPLITS, in_folder
from ..documents.dedup import uniform_from_keys
from ..documents.worker import ItemResult
from ..output.build import KEYS_PER_FILE, Totals, account
from ..stops import stop_point
from . import valby, volatile
from .layoutfiles import LAYOUT_FILE, Layout, write_layout
from .linenumbers import RELATIVE
from .nearstage import unit_near
from .plantables import TaskTable
from .unitfiles import read_section, read_sections, unit_marker

STREAMS = (*SPLITS, "keys", "near", "lines")


def unit_arrays(tokenized: Path, u: int) -> dict[str, np.ndarray]:
    """Unit u's per-document arrays (lengths, keys, sources), read whole (20 bytes per document),
    and its kept lines' keys (--dedup-lines), from one open of its data file."""
    return read_sections(tokenized, u, ("lengths", "keys", "sources", "lines", "domains"))


def select_unit(work: Path, u: int, duplicates: Callable[[int], np.ndarray] | None, seed: int, val_fraction: float,
                specials: int, near_dedup: bool = False, near_base: int = 0, val_tokens: int = 0,
                val_field: str | None = None) -> bool:  # fmt: skip
    """The select stage for unit u (see the module docstring); False when already done.
    `duplicates(u)`: the numbers of unit u's documents that repeat an earlier one (None: no
    exact deduplication). `val_tokens` (--val-by; `val_field`: a record field's): val is chosen
    later (valby.py)."""
    out = work / "select"
    marker = out / f"unit_{u:06d}.json"
    if marker.exists():
        return False
    tokenized = work / "tokenize"
    arrays = unit_arrays(tokenized, u)
    n_docs = len(arrays["keys"])
    dup = np.zeros(n_docs, bool)
    if duplicates is not None:
        dup[duplicates(u)] = True
    near = (unit_near(work, u, n_docs, near_base) >= 0) & ~dup if near_dedup else np.zeros(n_docs, bool)
    draws = uniform_from_keys(arrays["keys"], seed)
    is_val = draws < val_fraction
    split = np.where(dup, -1, np.where(near, -2, is_val.astype(np.int8))).astype(np.int8)
    totals, at = Totals(), 0
    tokenized_marker = unit_marker(tokenized, u)
    for row in tokenized_marker["table"]:
        d = row["docs"]
        item = ItemResult(seq=(0, 0), tokens=np.zeros(0, np.uint32), lengths=arrays["lengths"][at : at + d],
                          keys=arrays["keys"][at : at + d], doc_sources=arrays["sources"][at : at + d],
                          counts={int(k): Counter(v) for k, v in row["counts"].items()}, examples=row["examples"],
                          chars=row["chars"], nbytes=row["nbytes"])  # fmt: skip
        account(totals, item, split[at : at + d] >= 0, dup[at : at + d], specials, near[at : at + d])
        at += d
    streams = []  # per split its documents and tokens as written, then the documents kept (one key each)
    for s in range(len(SPLITS)):
        mine = split == s
        streams += [int(mine.sum()), int(arrays["lengths"][mine].sum()) + specials * int(mine.sum())]
    streams += [int((split >= 0).sum()), int(tokenized_marker.get("lines", 0))]  # and its newlines: linenumbers.py
    streams.append(len(arrays["lines"]))  # and its lines' keys to store (--dedup-lines)
    in_folder(lambda: volatile.write_bytes(out / f"unit_{u:06d}.split", split.tobytes()), out)
    summary = {"streams": [streams], "totals": totals.to_json()}
    if val_tokens:
        written = arrays["lengths"].astype(np.int64) + specials
        groups = arrays["domains"] if val_field is not None else arrays["sources"]
        summary["val"] = valby.candidates(draws, written, groups, split == 0, u, val_tokens, val_field,
                                          tokenized_marker.get("labels", []))  # fmt: skip
    volatile.write_json(marker, summary)
    stop_point("select", u)
    return True


def select_join(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The select summary of consecutive units (or tasks, or groups of tasks: barrier.py): their
    stream rows in plan order and their totals added up."""
    totals = Totals()
    for part in parts:
        add_totals(totals, Totals.parse(part["totals"]))
    out = {"streams": [row for part in parts for row in part["streams"]], "totals": totals.to_json()}
    if val := [part["val"] for part in parts if "val" in part]:
        out["val"] = valby.join(val)
    return out


def select_summary(work: Path, units: range, unread: int | None = None) -> dict[str, Any]:
    """The select summary of `units`, from their markers; from unit `unread` on (--max-docs:
    units never read, maxdocs.unread_from) without: each kept nothing."""
    nothing = {"streams": [[0] * (2 * len(SPLITS) + 3)], "totals": Totals().to_json()}
    return select_join([json.loads((work / "select" / f"unit_{u:06d}.json").read_text())
                        if unread is None or u < unread else nothing for u in units])  # fmt: skip


def add_totals(totals: Totals, part: Totals) -> None:
    """Add `part` (the totals of later documents) into `totals`: the first example of each drop
    reason wins, as in a run that meets the documents in plan order."""
    for name in ("records", "docs_kept", "tokens", "chars", "duplicates", "lines_removed"):
        setattr(totals, name, getattr(totals, name) + getattr(part, name))
    totals.drops.update(part.drops)
    totals.line_drops.update(part.line_drops)
    totals.drop_chars.update(part.drop_chars)
    for src, counts in part.per_source.items():
        totals.per_source.setdefault(src, type(counts)()).update(counts)
    for reason, example in part.examples.items():
        totals.examples.setdefault(reason, example)


def _stream(row: list[int], stream: str) -> tuple[int, int]:
    """A unit's documents and tokens (keys, signatures: one per kept document; line keys: one
    per line met first) in `stream`."""
    if stream in SPLITS:
        s = SPLITS.index(stream)
        return row[2 * s], row[2 * s + 1]
    if stream == "lines":
        return row[6], row[6]
    return row[4], row[4]


def stream_lengths(work: Path, u: int, stream: str, specials: int, val_by: dict[str, Any] | None = None) -> np.ndarray:
    """The lengths, as written, of unit u's documents in `stream` (1 per kept document for keys);
    `val_by`: --val-by's thresholds (valby.py)."""
    if stream == "lines":
        return np.ones(len(read_section(work / "tokenize", u, "lines")), dtype=np.int64)
    split = valby.unit_split(work, u, val_by if stream in SPLITS else None)
    if stream in ("keys", "near"):
        return np.ones(int((split >= 0).sum()), dtype=np.int64)
    lengths = read_section(work / "tokenize", u, "lengths")
    return lengths[split == SPLITS.index(stream)] + specials


def pieces_of(work: Path, rows: list[list[int]], stream: str, capacity: int, specials: int,
              first: int = 0, val_by: dict[str, Any] | None = None) -> list[list[Any]]:  # fmt: skip
    """A stream's pieces, [stream, number, tokens, docs, parts], as a writer filling them
    greedily in plan order would cut them (see the module docstring), numbered from `first`
    (--append: after the dataset's own). A part is the piece's
    documents from one unit: [unit, first doc, end doc, tokens before it in the piece, documents
    before it, its tokens] (documents numbered among the unit's documents of the stream)."""
    pieces: list[list[Any]] = []
    cur: list[Any] | None = None

    def add(u: int, i0: int, i1: int, tokens: int) -> None:
        assert cur is not None
        cur[4].append([u, i0, i1, cur[2], cur[3], tokens])
        cur[2] += tokens
        cur[3] += i1 - i0

    def close() -> None:
        nonlocal cur
        if cur is not None:
            pieces.append(cur)
            cur = None

    for u, row in enumerate(rows):
        d, t = _stream(row, stream)
        if d == 0:
            continue
        if cur is not None and cur[2] + t <= capacity:  # the whole unit fits the open piece
            add(u, 0, d, t)
            continue
        if cur is None and t <= capacity:
            cur = [stream, first + len(pieces), 0, 0, []]
            add(u, 0, d, t)
            continue
        ends = np.cumsum(stream_lengths(work, u, stream, specials, val_by))
        i = 0
        while i < d:
            if cur is None:
                cur = [stream, first + len(pieces), 0, 0, []]
            before = int(ends[i - 1]) if i else 0
            fit = int(np.searchsorted(ends[i:], capacity - cur[2] + before, side="right"))
            if fit == 0 and cur[2] == 0:
                fit = 1  # a document longer than a shard gets a shard of its own
            if fit == 0:
                close()
                continue
            add(u, i, i + fit, int(ends[i + fit - 1]) - before)
            i += fit
            if i < d:
                close()
    close()
    return pieces


def make_layout(work: Path, unit_ranges: list[list[int]], rows: list[list[int]], tokens_per_shard: int,
                specials: int, keys: bool = True, near_hashes: int = 0, first: dict[str, int] | None = None,
                lines: bool = False, units: Sequence[Any] = (), source_base: int = 0,
                attr_columns: Sequence[int] = (), val_by: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Every piece of the dataset and its parts, and each write task's share of the parts (see
    the module docstring): `pieces` [stream, number, tokens, docs, [first part, end part]],
    `parts` [piece, unit, first doc, end doc, tokens before, documents before, tokens], `tasks`
    (per task, its parts: those of the units in its range of `unit_ranges`, the plan's tasks),
    `readers` (per unit, the parts that read it). `rows`: per unit, its stream totals (the
    select stage's summary). `first`: per stream, the number of its first file (--append: the
    files of the dataset appended to come first). `lines` (--dedup-lines): the line key files,
    after the document keys. `units` (the plan's) and `source_base` (--append: the sources of
    the dataset appended to) give the provenance numbering: `records`, per unit what its
    documents' record numbers are offset by (format/provenance.py), and `source_base`.
    `attr_columns` (--attribute): the bytes of a value of each attribute column (none: none kept).
    `val_by`: --val-by's thresholds (valby.py), kept in the layout for the write stage."""
    n_units = len(rows)
    at = {s: 0 for s in STREAMS} | (first or {})
    pieces = [p for s in SPLITS for p in pieces_of(work, rows, s, tokens_per_shard, specials, at[s], val_by)]
    if keys:  # (--dedup none keeps no keys)
        found = pieces_of(work, rows, "keys", KEYS_PER_FILE, specials, at["keys"])
        pieces += found or [["keys", at["keys"], 0, 0, []]]  # a run that keeps nothing lists its (empty) key file
    if lines:
        found = pieces_of(work, rows, "lines", KEYS_PER_FILE, specials, at["lines"])
        pieces += found or [["lines", at["lines"], 0, 0, []]]  # (a local run lists its line key file, even empty)
    if near_hashes:  # --near-dedup: the kept documents' signatures, in files of as many rows
        pieces += pieces_of(work, rows, "near", KEYS_PER_FILE, specials, at["near"]) or [["near", at["near"], 0, 0, []]]
    parts: list[list[Any]] = []
    for k, piece in enumerate(pieces):
        start = len(parts)
        parts += [[k, *part] for part in piece[4]]
        piece[4] = [start, len(parts)]
    readers: list[list[int]] = [[] for _ in range(n_units)]  # per unit: the parts that read its data
    for p, part in enumerate(parts):
        readers[part[1]].append(p)
    # A write task writes the parts of the units its plan task tokenized: its share of the data, as in every
    # stage, whatever the shards' sizes (the many small parts of the val shards and key files spread with them).
    tasks = [[p for u in range(first, end) for p in readers[u]] for first, end in unit_ranges]
    return {"pieces": pieces, "parts": parts, "tasks": tasks, "readers": readers, "near_hashes": near_hashes,
            "records": record_offsets(units, [row[5] for row in rows]) if len(units) else [],
            "source_base": source_base, "attr_columns": list(attr_columns), "val_by": val_by}  # fmt: skip


def record_offsets(units: Sequence[Any], newlines: list[int]) -> list[int]:
    """Per unit, what its documents' record numbers (`numbers`, counted from the unit's own start
    for a byte range: linenumbers.py) are offset by to be numbered in their file: the newlines
    of the ranges of the file before it. One pass over the plan's units."""
    out, line, last = [], 1, None
    for u, unit in enumerate(units):
        if unit[0] != last:
            line, last = 1, unit[0]
        out.append(line - 1 if unit[1] in RELATIVE else 0)
        line += newlines[u]
    return out


def ensure_layout(work: Path, unit_ranges: TaskTable, rows: Callable[[], tuple[list[list[int]], dict[str, Any] | None]],
                  tokens_per_shard: int,
                  specials: int, keys: bool = True, near_hashes: int = 0, first: dict[str, int] | None = None,
                  lines: bool = False, units: Sequence[Any] = (), source_base: int = 0,
                  attr_columns: Sequence[int] = ()) -> Layout:  # fmt: skip
    """The layout in `work` (layoutfiles.py), made if absent (every task that makes one makes
    the same) from the units' stream totals and --val-by's thresholds (`rows()`: from the select
    stage's summary)."""
    if not (work / LAYOUT_FILE).exists():
        try:
            made, val_by = rows()
            layout = make_layout(work, list(unit_ranges), made, tokens_per_shard, specials, keys, near_hashes, first,
                                 lines, units[:] if len(units) else (), source_base, attr_columns, val_by)  # fmt: skip
        except FileNotFoundError:  # another task made it first and has begun writing (its units' files go)
            if not (work / LAYOUT_FILE).exists():
                raise
        else:
            write_layout(work, layout, STREAMS)
    return Layout(work, unit_ranges, STREAMS)
