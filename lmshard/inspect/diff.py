"""`lmshard inspect A --diff B`: the documents added, removed and kept between two versions of a
dataset (a dataset and its `--append`ed copy, two preparations of a crawl), by document key: the
xxh3-64 of each document's cleaned text.

A side's keys are its stored ones where it keeps them for every document (dedup on: its
`doc_keys` files, in the order prepare kept the documents), a document's split and place found
from its key as prepare chose them (overlap.py); otherwise each document is read back and
decoded with the dataset's vocabulary and keyed. A document kept twice (`--dedup none`) counts
once. Examples name each document's place and, where the dataset keeps provenance, its input
and record.

Memory model: 8 bytes per document of each side for the keys (16 where places are stored), and
the examples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..format import SPLITS, SRC_DTYPE, DatasetMeta
from ..prepare.documents.dedup import uniform_from_keys
from .overlap import _key, documents

EXAMPLES = 5


@dataclass
class Diff:
    a: str
    b: str
    a_documents: int = 0
    b_documents: int = 0
    kept: int = 0  # distinct documents in both
    added: int = 0  # distinct documents of B not in A
    removed: int = 0  # distinct documents of A not in B
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"added": [], "removed": []})

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "a_documents": self.a_documents, "b_documents": self.b_documents,
                "kept": self.kept, "added": self.added, "removed": self.removed, "examples": self.examples}  # fmt: skip


def diff(a: DatasetMeta, b: DatasetMeta, decoders: tuple[Callable[[list[int]], str], Callable[[list[int]], str]],
         ) -> Diff:  # fmt: skip
    """The documents of `b` not in `a` (added), of `a` not in `b` (removed) and in both (kept)."""
    (keys_a, where_a), (keys_b, where_b) = _keyed(a, decoders[0]), _keyed(b, decoders[1])
    result = Diff(str(a.root), str(b.root), len(keys_a), len(keys_b))
    in_b, in_a = np.isin(keys_b, keys_a), np.isin(keys_a, keys_b)
    result.kept = len(np.unique(keys_b[in_b]))
    result.added, result.removed = len(np.unique(keys_b[~in_b])), len(np.unique(keys_a[~in_a]))
    for kind, meta, mask, where in (("added", b, ~in_b, where_b), ("removed", a, ~in_a, where_a)):
        for i in np.flatnonzero(mask)[:EXAMPLES].tolist():
            result.examples[kind].append(_example(meta, where(i)))
    return result


def _keyed(meta: DatasetMeta, decode: Callable[[list[int]], str]) -> tuple[np.ndarray, Callable[[int], str]]:
    """(every document's key, a function from a document's position in that array to its place
    `train/shard_000000:5`)."""
    stored = _stored(meta)
    if stored is not None:
        return stored
    places: list[str] = []
    keys: list[int] = []
    for where, text in documents(meta, tuple(s for s in SPLITS if s in meta.splits), decode):
        places.append(where)
        keys.append(_key(text))
    return np.array(keys, dtype=np.uint64), places.__getitem__


def _stored(meta: DatasetMeta) -> tuple[np.ndarray, Callable[[int], str]] | None:
    """The stored keys of a dataset that keeps one for every document, with their places."""
    dedup = meta.dedup
    files = [f for f in dedup.files if f.kind == "doc"] if dedup and dedup.mode == "document" else []
    seed, val_fraction = meta.config.get("seed"), meta.config.get("val_fraction")
    if (not files or sum(f.n_keys for f in files) != meta.total_docs or seed is None or val_fraction is None
            or meta.config.get("val_by")):  # (--val-by's split is not the fraction's draw: read from the documents)
        return None
    keys = np.concatenate([np.fromfile(meta.abspath(f.path), dtype="<u8") for f in files])
    split_of = np.where(uniform_from_keys(keys, int(seed)) < float(val_fraction), 1, 0)
    rank = np.zeros(len(keys), dtype=np.int64)  # each document's number within its split
    for s in (0, 1):
        mine = split_of == s
        rank[mine] = np.arange(int(mine.sum()))

    def where(i: int) -> str:
        shards = meta.split_shards(SPLITS[int(split_of[i])])
        ends = np.cumsum([sh.n_docs for sh in shards])
        k = int(np.searchsorted(ends, int(rank[i]), side="right"))
        return f"{shards[k].path.removesuffix('.bin')}:{int(rank[i]) - (int(ends[k - 1]) if k else 0)}"

    return keys, where


def _example(meta: DatasetMeta, where: str) -> dict[str, Any]:
    """A document's place, and its input and record where the dataset keeps provenance."""
    path, _, i = where.rpartition(":")
    shard = next(s for s in meta.shards if s.path.removesuffix(".bin") == path)
    out: dict[str, Any] = {"document": where}
    if shard.src_path:
        record = np.fromfile(meta.abspath(shard.src_path), dtype=SRC_DTYPE, count=1, offset=int(i) * SRC_DTYPE.itemsize)
        if len(record):
            out |= {"input": meta.sources[int(record["source"][0])].path, "record": int(record["record"][0])}
    return out
