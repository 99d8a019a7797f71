"""`lmshard inspect A --overlap [B]`: documents shared between the splits of dataset A, or
between dataset A and dataset B (a training set and an evaluation set), exactly and nearly.

Each side's documents come with their key and MinHash signature:
- **stored**: a dataset made with dedup and `--near-dedup` (its `doc_keys` files: the xxh3-64 of
  each kept document's cleaned text, and its `near_sigs` files, in the same order) is compared
  from those alone: a document's split is the function
  of its key, `seed` and `val_fraction` that prepare used, and its place (`train/shard_000000:5`)
  follows from its rank in the split. Only the examples are read back from the shards.
- **decoded**: otherwise each document is read back from the shards and decoded with the
  dataset's own vocabulary (the separators and BOS left out), then keyed and signed.
Both sides use one MinHash configuration: a stored side's (quality/minhash.py; the default
when neither side stores signatures).
- **exact**: equal keys;
- **near**: documents whose signatures share a band and agree on at least `threshold` of their
  values (an estimate of the Jaccard similarity of their word n-gram sets), not counted as exact.
The second side (B, or A's val split) is indexed by band; the first (A, or A's train split) is
scanned against it, so put the smaller set second.

Memory model: per document of the indexed side its band keys and its signature (about 1 KiB),
and the reported examples; the scanned side one document (a stored one: its keys and the
signature files' memory maps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..format import SPLITS, DatasetMeta, load_metadata
from ..format.tokenfile import TokenFile
from ..prepare.documents.dedup import uniform_from_keys
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
    minhash: MinHashConfig = field(default_factory=MinHashConfig)
    examples: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "second": self.second, "scanned": self.scanned, "indexed": self.indexed,
                "exact": self.exact, "near": self.near, "near_threshold": self.threshold,
                "minhash": self.minhash.to_json(), "examples": self.examples}  # fmt: skip


def documents(meta: DatasetMeta, splits: tuple[str, ...],
              decode: Callable[[list[int]], str]) -> Iterator[tuple[str, str]]:  # fmt: skip
    """(where, text) of every document of the splits, in order: `train/shard_000000:5`."""
    for shard in (s for split in splits for s in meta.split_shards(split)):
        if not shard.n_tokens:
            continue
        index = np.fromfile(meta.abspath(shard.index_path), dtype="<u8")
        tokens = TokenFile(meta.root, shard, meta.encoding)
        try:
            for i in range(shard.n_docs):
                yield f"{shard.path.removesuffix('.bin')}:{i}", _text(meta, tokens, index, i, decode)
        finally:
            tokens.close()


def _text(meta: DatasetMeta, tokens: TokenFile, index: np.ndarray, i: int, decode: Callable[[list[int]], str]) -> str:
    specials = {meta.tokenizer.eot_id} | ({meta.tokenizer.bos_id} if meta.tokenizer.bos_id is not None else set())
    ids = tokens.read(int(index[i]), int(index[i + 1]))
    return decode([t for t in ids.tolist() if t not in specials])


def text_at(meta: DatasetMeta, where: str, decode: Callable[[list[int]], str]) -> str:
    """The text of the document at `where` (`train/shard_000000:5`)."""
    path, _, i = where.rpartition(":")
    shard = next(s for s in meta.shards if s.path.removesuffix(".bin") == path)
    tokens = TokenFile(meta.root, shard, meta.encoding)
    try:
        return _text(meta, tokens, np.fromfile(meta.abspath(shard.index_path), dtype="<u8"), int(i), decode)
    finally:
        tokens.close()


def _key(text: str) -> int:
    import xxhash

    return int(xxhash.xxh3_64_intdigest(text.encode("utf-8")))


Side = tuple[DatasetMeta, tuple[str, ...]]  # a dataset and the splits compared
Row = tuple[str, int, np.ndarray, "str | None"]  # where, key, signature, text (None: read it when needed)


def stored_minhash(meta: DatasetMeta) -> MinHashConfig | None:
    """The MinHash configuration of a dataset that stores a signature per kept document."""
    near = meta.dedup.near if meta.dedup else None
    if not near or not any(f.kind == "near" for f in meta.dedup.files):  # type: ignore[union-attr]
        return None
    return MinHashConfig.parse(near["minhash"])


def _stored_rows(meta: DatasetMeta, splits: tuple[str, ...], config: MinHashConfig) -> Iterator[Row] | None:
    """The side's rows from its stored keys and signatures, of `config` (None when it keeps none)."""
    dedup = meta.dedup
    files = [f for f in dedup.files if f.kind == "doc"] if dedup and dedup.mode == "document" else []
    seed, val_fraction = meta.config.get("seed"), meta.config.get("val_fraction")
    if (not files or sum(f.n_keys for f in files) != meta.total_docs or seed is None or val_fraction is None
            or meta.config.get("val_by")):  # (--val-by's split is not the fraction's draw: read from the documents)
        return None
    sig_files = [f for f in dedup.files if f.kind == "near"]  # type: ignore[union-attr]
    keys = np.concatenate([np.fromfile(meta.abspath(f.path), dtype="<u8") for f in files])
    sigs = [np.memmap(meta.abspath(f.path), dtype="<u4", mode="r").reshape(-1, config.n_hashes)
            for f in sig_files if f.n_keys]  # fmt: skip
    split_of = np.where(uniform_from_keys(keys, int(seed)) < float(val_fraction), 1, 0)

    starts = np.cumsum([0] + [len(block) for block in sigs])

    def rows() -> Iterator[Row]:  # split by split, each in its shards' order (plan order), as `documents`
        for name in splits:
            shards = meta.split_shards(name)
            ends = np.cumsum([sh.n_docs for sh in shards])
            for rank, i in enumerate(np.flatnonzero(split_of == SPLITS.index(name)).tolist()):
                k = int(np.searchsorted(ends, rank, side="right"))
                f = int(np.searchsorted(starts, i, side="right")) - 1
                where = f"{shards[k].path.removesuffix('.bin')}:{rank - (int(ends[k - 1]) if k else 0)}"
                yield where, int(keys[i]), np.asarray(sigs[f][i - int(starts[f])]), None

    return rows()


def _rows(side: Side, decode: Callable[[list[int]], str], config: MinHashConfig, stored: bool = True) -> Iterator[Row]:
    found = _stored_rows(*side, config) if stored and stored_minhash(side[0]) == config else None
    if found is not None:
        return found
    return ((where, _key(text), signature(text, config), text) for where, text in documents(*side, decode))


def overlap(first: Side, second: Side, decoders: tuple[Any, Any], threshold: float = 0.8,
            on_progress: Callable[[int], None] | None = None, stored: bool = True) -> Overlap:  # fmt: skip
    """Exact and near overlap of `first` (meta, splits) against `second` (see the module
    docstring); `stored`: use the datasets' stored keys and signatures where they have them."""
    (meta_a, split_a), (meta_b, split_b) = first, second
    config = (stored_minhash(meta_b) or stored_minhash(meta_a) if stored else None) or MinHashConfig()
    result = Overlap(f"{meta_a.root} [{', '.join(split_a)}]", f"{meta_b.root} [{', '.join(split_b)}]",
                     threshold=threshold, minhash=config)  # fmt: skip
    exact: dict[int, str] = {}
    buckets: list[dict[int, list[int]]] = [{} for _ in range(config.bands)]
    signatures: list[np.ndarray] = []
    places: list[str] = []
    for where, key, sig, _ in _rows(second, decoders[1], config, stored):
        exact.setdefault(key, where)
        for b, band in enumerate(band_keys(sig, config)[0].tolist()):
            buckets[b].setdefault(band, []).append(len(signatures))
        signatures.append(np.asarray(sig))
        places.append(where)
    result.indexed = len(places)
    for where, key, sig, text in _rows(first, decoders[0], config, stored):
        result.scanned += 1
        if on_progress is not None and result.scanned % 1000 == 0:
            on_progress(result.scanned)
        match = exact.get(key)
        if match is not None:
            result.exact += 1
            _example(result, "exact", where, match, 1.0, text, meta_a, decoders[0], meta_b)
            continue
        candidates = {j for b, band in enumerate(band_keys(sig, config)[0].tolist()) for j in buckets[b].get(band, ())}
        best = max(((float((signatures[j] == sig).mean()), j) for j in candidates), default=(0.0, -1))
        if best[0] >= threshold:
            result.near += 1
            _example(result, "near", where, places[best[1]], best[0], text, meta_a, decoders[0], meta_b)
    return result


def _example(result: Overlap, kind: str, where: str, other: str, similarity: float, text: str | None,
             meta: DatasetMeta, decode: Callable[[list[int]], str], other_meta: DatasetMeta) -> None:  # fmt: skip
    """An example of a match, each side named with its dataset: `DATASET/train/shard_000000:5`."""
    if sum(e["kind"] == kind for e in result.examples) < EXAMPLES:
        text = text if text is not None else text_at(meta, where, decode)
        result.examples.append({"kind": kind, "first": f"{meta.root}/{where}",
                                "second": f"{other_meta.root}/{other}", "similarity": round(similarity, 3),
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
