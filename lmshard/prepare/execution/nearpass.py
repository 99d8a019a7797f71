"""--near-dedup in a run read in one process (small inputs, Hugging Face streams, --append,
--max-docs): a first pass over every work item computes each kept document's MinHash signature
in the workers and spools them to the build (`.near_signatures.u32.tmp`, after the signatures of
a dataset appended to); the clusters are found over the spool (quality/near.py), and the second
pass, which tokenizes, gets each document's survivor (`ItemResult.near_of`) and signature.

Documents are numbered in plan order (the dataset appended to first), so the survivor of a
cluster is its first document, as in a planned run. A resumed run repeats the first pass: it
writes nothing but the spool.

Memory model: one item's signatures at a time while spooling; then `near_duplicates` (one
band's keys, 8 bytes per document, and the grouped documents' signatures, read from the
spool's memory map); 8 bytes per work item; up to NEAR_EXAMPLES × 4 short texts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ...quality.minhash import MinHashConfig
from ...quality.near import near_duplicates
from ...tokenizers import Tokenizer
from ..documents.sources import Source
from ..documents.worker import ItemResult
from ..output.build import Build
from ..output.sigfiles import SIG_DTYPE, read_signatures

SPOOL = ".near_signatures.u32.tmp"
NEAR_EXAMPLES = 5  # removed documents shown with their survivor in the metadata
SNIPPET_CHARS = 200


@dataclass
class NearPass:
    config: MinHashConfig
    offsets: np.ndarray  # per work item, the ordinal of its first document (one more entry: the end)
    removed: np.ndarray  # ordinals of the removed documents, sorted
    survivor: np.ndarray  # the ordinal of each one's survivor
    signatures: np.ndarray  # [documents, n_hashes]: the spool's memory map
    wanted: dict[int, dict[str, Any] | None] = field(default_factory=dict)  # ordinal → its snippet, for examples


def first_pass(results: Iterator[ItemResult], build: Build, config: MinHashConfig) -> NearPass:
    """Spool every item's signatures, then find the clusters (see the module docstring)."""
    spool = build.root / SPOOL
    previous = build.near.previous if build.near else ()
    counts, n_old = [], 0
    with open(spool, "wb") as f:
        for rows in read_signatures(build.root, previous, config.n_hashes):
            f.write(rows.tobytes())
            n_old += len(rows)
        for r in results:
            assert r.signatures is not None
            f.write(np.ascontiguousarray(r.signatures, dtype=SIG_DTYPE).tobytes())
            counts.append(len(r.signatures))
    total = n_old + sum(counts)
    signatures = (np.memmap(spool, dtype=SIG_DTYPE, mode="r", shape=(total, config.n_hashes)) if total
                  else np.zeros((0, config.n_hashes), SIG_DTYPE))  # fmt: skip
    removed, survivor = near_duplicates(signatures, config, first_new=n_old)
    offsets = n_old + np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    near = NearPass(config, offsets, removed.astype(np.int64), survivor.astype(np.int64), signatures)
    for r, s in list(zip(near.removed.tolist(), near.survivor.tolist(), strict=True))[: 4 * NEAR_EXAMPLES]:
        near.wanted[r] = near.wanted[s] = None
    return near


def attach(results: Iterator[ItemResult], near: NearPass, first_item: int, build: Build, sources: list[Source],
           tokenizer: Tokenizer) -> Iterator[ItemResult]:  # fmt: skip
    """The second pass's results with each document's survivor (-1: kept) and signature; the
    first removed documents are added to the build's examples with their survivor."""
    for k, r in enumerate(results, first_item):
        lo, hi = int(near.offsets[k]), int(near.offsets[k + 1])
        if hi - lo != len(r.lengths):
            raise InputError(f"{sources[r.seq[0]].path}: the input changed between the two passes of --near-dedup "
                             f"(work item {k} had {hi - lo} documents, now {len(r.lengths)}); run again")  # fmt: skip
        ordinals = np.arange(lo, hi)
        pos = np.minimum(np.searchsorted(near.removed, ordinals), max(len(near.removed) - 1, 0))
        found = near.removed[pos] == ordinals if len(near.removed) else np.zeros(hi - lo, bool)
        r.near_of = np.where(found, near.survivor[pos] if len(near.removed) else -1, -1)
        r.signatures = np.asarray(near.signatures[lo:hi])
        if near.wanted:
            _examples(r, ordinals, near, build, sources, tokenizer)
        yield r


def _examples(r: ItemResult, ordinals: np.ndarray, near: NearPass, build: Build, sources: list[Source],
              tokenizer: Tokenizer) -> None:  # fmt: skip
    ends = np.cumsum(r.lengths)
    for d in [d for d, o in enumerate(ordinals.tolist()) if o in near.wanted]:
        o = int(ordinals[d])
        text = tokenizer.decode(r.tokens[int(ends[d] - r.lengths[d]) : int(ends[d])].tolist())
        near.wanted[o] = {"source": sources[int(r.doc_sources[d])].path, "text": text[:SNIPPET_CHARS],
                          "key": int(r.keys[d])}  # fmt: skip
        if r.near_of is None or r.near_of[d] < 0 or len(build.totals.near_examples) >= NEAR_EXAMPLES:
            continue
        s = int(r.near_of[d])
        where = "the dataset appended to" if s < near.offsets[0] else "?"
        first = near.wanted.get(s) or {"source": where, "text": None}
        if first.get("key") == int(r.keys[d]):
            continue  # an exact copy: counted with the duplicates
        agree = float((near.signatures[o] == near.signatures[s]).mean())
        mine = near.wanted[o] or {}
        build.totals.near_examples.append({"removed": {k: v for k, v in mine.items() if k != "key"},
                                           "survivor": {k: v for k, v in first.items() if k != "key"},
                                           "agreement": round(agree, 3)})  # fmt: skip


def remove_spool(root: Path) -> None:
    (root / SPOOL).unlink(missing_ok=True)
