"""--near-dedup in a run read in one process (small inputs, stdin or a pipe read once, a small
--append, --max-docs with --near-dedup): a first pass over every work item computes each kept
document's MinHash signature in the workers and spools them to the build
(`.near_signatures.u32.tmp`, after the signatures of a dataset appended to); the clusters are
found over the spool (quality/near.py), and the second pass, which tokenizes, gets each
document's survivor (`ItemResult.near_of`) and signature.

Documents are numbered in plan order (the dataset appended to first), so the survivor of a
cluster is its first document, as in a planned run. A resumed run repeats the first pass: it
writes nothing but the spool.

Memory model: one item's signatures at a time while spooling; then `near_duplicates` (one
band's keys, 8 bytes per document, and the grouped documents' signatures, read from the
spool's memory map; the first pass's document keys, 8 bytes per document, to choose the
examples); 8 bytes per work item; up to 2 × CANDIDATES short texts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...quality.minhash import MinHashConfig
from ...quality.near import near_duplicates
from ...tokenizers import Tokenizer
from ..documents.sources import Source
from ..documents.worker import ItemResult
from ..output.build import Build
from ..output.rowfiles import SIG_DTYPE, read_rows

SPOOL = ".near_signatures.u32.tmp"
NEAR_EXAMPLES = 5  # removed documents shown with their survivor in the metadata
CANDIDATES = 4 * NEAR_EXAMPLES  # the first removed documents not equal to their survivor: examples if not exact copies
SNIPPET_CHARS = 200


@dataclass
class NearPass:
    offsets: np.ndarray  # per work item, the ordinal of its first document (one more entry: the end)
    removed: np.ndarray  # ordinals of the removed documents, sorted
    survivor: np.ndarray  # the ordinal of each one's survivor
    signatures: np.ndarray  # [documents, n_hashes]: the spool's memory map
    wanted: set[int] = field(default_factory=set)  # example candidates and their survivors: their texts are kept


def first_pass(results: Iterator[ItemResult], build: Build, config: MinHashConfig) -> NearPass:
    """Spool every item's signatures, then find the clusters (see the module docstring)."""
    spool = build.root / SPOOL
    previous = build.near.previous if build.near else ()
    counts, n_old, keys = [], 0, []
    with open(spool, "wb") as f:
        for rows in read_rows(build.root, previous, SIG_DTYPE, config.n_hashes):
            f.write(rows.tobytes())
            n_old += len(rows)
        for r in results:
            assert r.signatures is not None
            f.write(np.ascontiguousarray(r.signatures, dtype=SIG_DTYPE).tobytes())
            counts.append(len(r.signatures))
            keys.append(r.keys)
    total = n_old + sum(counts)
    signatures = (np.memmap(spool, dtype=SIG_DTYPE, mode="r", shape=(total, config.n_hashes)) if total
                  else np.zeros((0, config.n_hashes), SIG_DTYPE))  # fmt: skip
    removed, survivor = near_duplicates(signatures, config, first_new=n_old)
    offsets = n_old + np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    near = NearPass(offsets, removed.astype(np.int64), survivor.astype(np.int64), signatures)
    new_keys = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
    key = lambda o: int(new_keys[o - n_old]) if o >= n_old else None  # noqa: E731 (an old document's: not needed)
    candidates = [(r, s) for r, s in zip(near.removed.tolist(), near.survivor.tolist(), strict=True)
                  if key(r) != key(s)][:CANDIDATES]  # fmt: skip
    near.wanted = {o for pair in candidates for o in pair}
    return near


def attach(results: Iterator[ItemResult], near: NearPass, first_item: int, build: Build, sources: list[Source],
           tokenizer: Tokenizer) -> Iterator[ItemResult]:  # fmt: skip
    """The second pass's results with each document's survivor (-1: kept), signature and first
    ordinal; the texts of the example candidates and their survivors are kept in the build's
    totals (so a resumed run has them too)."""
    k = first_item - 1
    for k, r in enumerate(results, first_item):
        if k + 1 >= len(near.offsets):
            raise InputError(_changed(sources, r, f"work item {k} was not there in the first pass"))
        lo, hi = int(near.offsets[k]), int(near.offsets[k + 1])
        if hi - lo != len(r.lengths):
            raise InputError(_changed(sources, r, f"work item {k} had {hi - lo} documents, now {len(r.lengths)}"))
        ordinals = np.arange(lo, hi)
        pos = np.minimum(np.searchsorted(near.removed, ordinals), max(len(near.removed) - 1, 0))
        found = near.removed[pos] == ordinals if len(near.removed) else np.zeros(hi - lo, bool)
        r.near_of = np.where(found, near.survivor[pos] if len(near.removed) else -1, -1)
        r.near_first = lo
        r.signatures = np.asarray(near.signatures[lo:hi])
        for d in [d for d, o in enumerate(ordinals.tolist()) if o in near.wanted]:
            _keep_text(r, d, lo + d, near, build, sources, tokenizer)
        yield r
    if k + 2 != len(near.offsets):
        raise InputError(f"the input changed between the two passes of --near-dedup (the first had "
                         f"{len(near.offsets) - 1} work items, the second {k + 1}); run again")  # fmt: skip


def _changed(sources: list[Source], r: ItemResult, what: str) -> str:
    return f"{sources[r.seq[0]].path}: the input changed between the two passes of --near-dedup ({what}); run again"


def _keep_text(r: ItemResult, d: int, o: int, near: NearPass, build: Build, sources: list[Source],
               tokenizer: Tokenizer) -> None:  # fmt: skip
    """Keep document d's source and first characters (and, for a removed one, its agreement
    with its survivor) for the examples."""
    snippets = build.totals.near_snippets
    if str(o) in snippets:
        return
    ends = np.cumsum(r.lengths)
    text = tokenizer.decode(r.tokens[int(ends[d] - r.lengths[d]) : int(ends[d])].tolist())
    snippets[str(o)] = {"source": sources[int(r.doc_sources[d])].path, "text": text[:SNIPPET_CHARS]}
    if r.numbers is not None:  # its line (or row) in that file
        snippets[str(o)]["record"] = int(r.numbers[d])
    if r.near_of is not None and r.near_of[d] >= 0:
        s = int(r.near_of[d])
        snippets[str(o)]["agreement"] = round(float((near.signatures[o] == near.signatures[s]).mean()), 3)


def add_examples(build: Build, r: ItemResult, near: np.ndarray) -> None:
    """Up to NEAR_EXAMPLES of the item's near-duplicates (`near`: removed as such, not as exact
    copies) with their survivors, in plan order, into the build's totals."""
    snippets, examples = build.totals.near_snippets, build.totals.near_examples
    assert r.near_of is not None
    for d in np.flatnonzero(near).tolist():
        o, s = r.near_first + d, int(r.near_of[d])
        if len(examples) >= NEAR_EXAMPLES or str(o) not in snippets:
            continue
        removed = dict(snippets[str(o)])
        agreement = removed.pop("agreement", None)
        survivor = snippets.get(str(s)) or {"source": "the dataset appended to", "document": s, "text": None}
        examples.append({"removed": removed, "survivor": survivor, "agreement": agreement})


def remove_spool(root: Path) -> None:
    (root / SPOOL).unlink(missing_ok=True)
