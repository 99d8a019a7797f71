"""`lmshard inspect A --overlap [B]`: documents shared between the splits of dataset A, or
between dataset A and dataset B (a training set and an evaluation set), exactly and nearly.

Each document is read back from the shards and decoded with the dataset's own vocabulary (the
separators and BOS left out): the text the dataset was made from, after cleaning.
- **exact**: equal texts (the xxh3-64 of the UTF-8 text, the key `prepare` deduplicates by);
- **near**: documents whose MinHash signatures (quality/minhash.py, the default configuration:
  word 5-grams, 14 bands × 8 rows) share a band and agree on at least `threshold` of their
  values (an estimate of the Jaccard similarity of their 5-gram sets), not counted as exact.
The second side (B, or A's val split) is indexed by band; the first (A, or A's train split) is
scanned against it, so put the smaller set second.

Memory model: per document of the indexed side its 14 band keys and its signature (about 1 KiB),
and the reported examples; the scanned side one document at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..format import DatasetMeta, load_metadata
from ..format.tokenfile import TokenFile
from ..quality.minhash import MinHashConfig, band_keys, signature

EXAMPLES = 5
SNIPPET = 100


@dataclass
class Overlap:
    first: str  # "A [train]"
    second: str
    scanned: int = 0  # documents of the first side
    indexed: int = 0  # documents of the second side
    exact: int = 0  # first-side documents equal to a second-side one
    near: int = 0  # first-side documents near one (not exact)
    threshold: float = 0.8
    examples: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "second": self.second, "scanned": self.scanned, "indexed": self.indexed,
                "exact": self.exact, "near": self.near, "near_threshold": self.threshold,
                "minhash": MinHashConfig().to_json(), "examples": self.examples}  # fmt: skip


def documents(meta: DatasetMeta, splits: tuple[str, ...],
              decode: Callable[[list[int]], str]) -> Iterator[tuple[str, str]]:  # fmt: skip
    """(where, text) of every document of the splits, in order: `train/shard_000000:5`."""
    specials = {meta.tokenizer.eot_id} | ({meta.tokenizer.bos_id} if meta.tokenizer.bos_id is not None else set())
    for shard in (s for split in splits for s in meta.split_shards(split)):
        if not shard.n_tokens:
            continue
        index = np.fromfile(meta.abspath(shard.index_path), dtype="<u8")
        tokens = TokenFile(meta.root, shard, meta.encoding)
        try:
            for i in range(shard.n_docs):
                ids = tokens.read(int(index[i]), int(index[i + 1]))
                text = decode([t for t in ids.tolist() if t not in specials])
                yield f"{shard.path.removesuffix('.bin')}:{i}", text
        finally:
            tokens.close()


def _key(text: str) -> int:
    import xxhash

    return int(xxhash.xxh3_64_intdigest(text.encode("utf-8")))


Side = tuple[DatasetMeta, tuple[str, ...]]  # a dataset and the splits compared


def overlap(first: Side, second: Side, decoders: tuple[Any, Any],
            threshold: float = 0.8, on_progress: Callable[[int], None] | None = None) -> Overlap:  # fmt: skip
    """Exact and near overlap of `first` (meta, splits) against `second` (see the module docstring)."""
    config = MinHashConfig()
    (meta_a, split_a), (meta_b, split_b) = first, second
    result = Overlap(f"{meta_a.root} [{', '.join(split_a)}]", f"{meta_b.root} [{', '.join(split_b)}]",
                     threshold=threshold)  # fmt: skip
    exact: dict[int, str] = {}
    buckets: list[dict[int, list[int]]] = [{} for _ in range(config.bands)]
    signatures: list[np.ndarray] = []
    places: list[str] = []
    for where, text in documents(meta_b, split_b, decoders[1]):
        exact.setdefault(_key(text), where)
        sig = signature(text, config)
        for b, key in enumerate(band_keys(sig, config)[0].tolist()):
            buckets[b].setdefault(key, []).append(len(signatures))
        signatures.append(sig)
        places.append(where)
    result.indexed = len(places)
    for where, text in documents(meta_a, split_a, decoders[0]):
        result.scanned += 1
        if on_progress is not None and result.scanned % 1000 == 0:
            on_progress(result.scanned)
        match = exact.get(_key(text))
        if match is not None:
            result.exact += 1
            _example(result, "exact", where, match, 1.0, text)
            continue
        sig = signature(text, config)
        candidates = {j for b, key in enumerate(band_keys(sig, config)[0].tolist()) for j in buckets[b].get(key, ())}
        best = max(((float((signatures[j] == sig).mean()), j) for j in candidates), default=(0.0, -1))
        if best[0] >= threshold:
            result.near += 1
            _example(result, "near", where, places[best[1]], best[0], text)
    return result


def _example(result: Overlap, kind: str, where: str, other: str, similarity: float, text: str) -> None:
    if sum(e["kind"] == kind for e in result.examples) < EXAMPLES:
        result.examples.append({"kind": kind, "first": where, "second": other, "similarity": round(similarity, 3),
                                "text": " ".join(text.split())[:SNIPPET]})  # fmt: skip


def sides(a: str, b: str | None) -> tuple[Side, Side]:
    """(first, second): A's train split against its val split, or all of A against all of B."""
    meta_a = load_metadata(a)
    if b is None:
        if not meta_a.n_docs("val"):
            raise ConfigError(f"{a}: no val documents to compare its train split with; name a second dataset: "
                              f"`lmshard inspect {a} --overlap EVAL_DATASET`")  # fmt: skip
        return (meta_a, ("train",)), (meta_a, ("val",))
    meta_b = load_metadata(b)
    return (meta_a, tuple(meta_a.splits)), (meta_b, tuple(meta_b.splits))
