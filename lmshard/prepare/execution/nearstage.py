"""--near-dedup in a planned run: after the dedup stage, the clusters of every group's edges
(quality/near.py) are found once, by the last dedup task to finish (or the first select task
that finds them missing: every task that makes them makes the same), and written as
`dedup/near.removed`: the removed documents' ids (unit << 32 | document, sorted, uint64), then
each one's survivor's id; `dedup/near.json` holds their count and examples. The select stage
reads one unit's slice of it.

Memory model: the clusters hold about 70 bytes per distinct edge at their peak (about one edge
per near-duplicate document; quality/clusters.py); a unit's slice is two binary searches in the
memory-mapped file; the examples read the keys of the units their candidates are in (8 bytes per
document) and decode up to 2 × NEAR_EXAMPLES short documents.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...format import atomic_write_bytes, atomic_write_json
from ...quality.near import components
from ...tokenizers import Tokenizer
from ..documents.sources import Source
from .buckets import read_edges, unit_signatures
from .nearpass import CANDIDATES, NEAR_EXAMPLES, SNIPPET_CHARS
from .unitfiles import read_section, sections

REMOVED = "near.removed"
SUMMARY = "near.json"


def ensure_clusters(work: Path, n_groups: int, n_hashes: int, tokenizer: Tokenizer, sources: list[Source],
                    specials: int, duplicates: Callable[[int], np.ndarray] | None) -> None:  # fmt: skip
    """Find the clusters unless `dedup/near.removed` exists (see the module docstring).
    `duplicates(u)`: unit u's exact duplicates (document numbers; None: no exact dedup)."""
    dedup = work / "dedup"
    if (dedup / REMOVED).exists():
        return
    removed, survivor = components(*read_edges(dedup, n_groups))
    tokenized = work / "tokenize"
    examples = _examples(tokenized, removed, survivor, n_hashes, tokenizer, sources, specials, duplicates)
    atomic_write_json(dedup / SUMMARY, {"removed": len(removed), "examples": examples})
    # (every task that finds them writes the same bytes: a later one's rename changes nothing)
    atomic_write_bytes(dedup / REMOVED, removed.astype("<u8").tobytes() + survivor.astype("<u8").tobytes())


def unit_near(work: Path, u: int, n_docs: int) -> np.ndarray:
    """Per document of unit u: its survivor's id, or -1 when it is kept."""
    path = work / "dedup" / REMOVED
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


def _examples(tokenized: Path, removed: np.ndarray, survivor: np.ndarray, n_hashes: int, tokenizer: Tokenizer,
              sources: list[Source], specials: int,
              exact: Callable[[int], np.ndarray] | None) -> list[dict[str, Any]]:  # fmt: skip
    """The examples a one-process run gives (nearpass.py): of the first CANDIDATES removed
    documents whose key differs from their survivor's, the first NEAR_EXAMPLES that are not
    exact copies (`exact(u)`: the numbers of unit u's exact duplicates), with their survivors, as
    short texts."""
    keys: dict[int, np.ndarray] = {}

    def key(i: int) -> int:
        if i >> 32 not in keys:
            keys[i >> 32] = read_section(tokenized, i >> 32, "keys")
        return int(keys[i >> 32][i & 0xFFFFFFFF])

    candidates: list[tuple[int, int]] = []
    for r, s in zip(removed.tolist(), survivor.tolist(), strict=True):
        if len(candidates) == CANDIDATES:
            break
        if key(r) != key(s):
            candidates.append((r, s))
    dups: dict[int, set[int]] = {}
    out: list[dict[str, Any]] = []
    for r, s in candidates:
        if exact is not None and r >> 32 not in dups:
            dups[r >> 32] = set(exact(r >> 32).tolist())
        if exact is not None and r & 0xFFFFFFFF in dups[r >> 32]:
            continue  # an exact copy of an earlier document: counted with the duplicates
        sigs = unit_signatures(tokenized, np.array(sorted({r, s}), dtype=np.uint64), n_hashes)
        agree = round(float((sigs[0] == sigs[-1]).mean()), 3)
        out.append({"removed": _document(tokenized, r, tokenizer, sources, specials),
                    "survivor": _document(tokenized, s, tokenizer, sources, specials), "agreement": agree})  # fmt: skip
        if len(out) == NEAR_EXAMPLES:
            break
    return out


def _document(tokenized: Path, i: int, tokenizer: Tokenizer, sources: list[Source], specials: int) -> dict[str, Any]:
    """{source, text} of document i (unit << 32 | document)."""
    u, d = i >> 32, i & 0xFFFFFFFF
    lengths = read_section(tokenized, u, "lengths")
    start = int(lengths[:d].sum()) + specials * d
    offset = sections(tokenized, u)["tokens"][0] + 4 * start
    ids = np.fromfile(tokenized / f"unit_{u:06d}.bin", dtype="<u4", count=int(lengths[d]) + specials, offset=offset)
    ids = ids[(ids != tokenizer.eot_id) & (ids != (tokenizer.bos_id if tokenizer.bos_id is not None else -1))]
    source = sources[int(read_section(tokenized, u, "sources")[d])].path
    return {"source": source, "text": tokenizer.decode(ids.tolist())[:SNIPPET_CHARS]}
