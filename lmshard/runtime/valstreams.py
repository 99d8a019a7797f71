"""Per-domain validation: `TokenDataset.val_streams(tokens, seq_len)` and `Mixture.val_streams`
give one fixed evaluation stream per domain of a dataset's val split, the cheapest early signal
of a bad mixture (the loss per domain).

**Domains.** `by="input"` (the default): each input file the documents came from (their
provenance, format/provenance.py), named by its path; `by=NAME`: each label of a category
attribute (`prepare --attribute`, such as `language`); `by=None`: the whole split as one.

**A stream** is the domain's documents in split order, laid end to end, cut into windows of
`seq_len` + 1 tokens at stride `seq_len` (x and y, shifted by one), up to `tokens` tokens:
`len(stream)` batches of at most `batch_size` rows, the last one shorter, the same batches on
every call and in every process (no randomness: each window is read once). A domain with fewer
val tokens gives what it has (`stream.tokens` says how many); one too short for a window is left
out. A dataset opened with `val_fraction=` or `where=` gives its domains' documents on that side
or in that selection. Inputs of the same path are told apart as `path#N` (N: the input's number).

**Disjoint from train.** The val split's documents are those prepare held out, after its
deduplication over both splits: no val document's text equals a train document's, and with
`--near-dedup` none is a near-copy of one (MinHash, at its threshold). A dataset prepared with
`--dedup none`, or without `--near-dedup`, may hold such pairs, as may a load-time split
(`val_fraction=`, held out by number): the streams warn once, and `lmshard inspect DATASET
--overlap splits` counts them.

Memory model: per domain, its documents' selection (one bit per document of the shards that
hold some of them; opening reads those shards' document indexes, so a domain in a few shards
costs a few shards); a batch at a time.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError, FormatError
from ..format import REGENERATE_HINT, SRC_DTYPE, bytes_xxh3
from . import checks
from .subset import Both, SubsetStore


class ValStream:
    """One domain's evaluation batches (see the module docstring): iterate for (x, y) int64
    tensors of [rows, seq_len]."""

    def __init__(self, name: str, store: Any, tokens: int, seq_len: int, batch_size: int, device: Any) -> None:
        self.name, self.store, self.seq_len, self.batch_size, self.device = name, store, seq_len, batch_size, device
        self.windows = max(0, (min(tokens, store.n_tokens) - 1) // seq_len)
        self.tokens = self.windows * seq_len  # (the tokens predicted: y's)

    def __len__(self) -> int:
        return math.ceil(self.windows / self.batch_size)

    def __repr__(self) -> str:
        return f"ValStream({self.name!r}, windows={self.windows:,}, tokens={self.tokens:,})"

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for first in range(0, self.windows, self.batch_size):
            offsets = np.arange(first, min(self.windows, first + self.batch_size), dtype=np.int64) * self.seq_len
            rows = torch.from_numpy(self.store.gather(offsets, self.seq_len + 1).astype(np.int64))
            x, y = rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
            yield (x.to(self.device), y.to(self.device)) if self.device is not None else (x, y)


class _Domain:
    """A `SubsetStore` pick: the documents of one domain (a code per document of each shard)."""

    def __init__(self, codes: list[np.ndarray], code: int, shards: np.ndarray) -> None:
        self.shards = set(shards.tolist())  # the shards that hold some of its documents
        self.bits = {k: np.packbits(codes[k] == code) for k in self.shards}

    def absent(self, k: int) -> bool:
        return k not in self.shards

    def __call__(self, k: int, first: int, n: int) -> np.ndarray:
        return np.unpackbits(self.bits[k], count=n).astype(bool) if k in self.bits else np.zeros(n, bool)


def streams(data: Any, tokens: object, seq_len: object, batch_size: object, by: object,
            device: Any) -> dict[str, ValStream]:  # fmt: skip
    """{domain: ValStream} of `data` (a TokenDataset of a val split; see the module docstring)."""
    tokens = checks.positive("tokens", tokens)
    seq_len = checks.positive("seq_len", seq_len)
    batch_size = checks.positive("batch_size", batch_size)
    _warn_overlap(data)
    if by is None:
        found = {data.split: ValStream(data.split, data.store, tokens, seq_len, batch_size, device)}
    else:
        store = data.store  # (a load-time split or a where= selection: its documents of each domain)
        base, prior = (store.base, store.pick) if isinstance(store, SubsetStore) else (store, None)
        names, codes = _codes(data, base, by)
        where: dict[int, list[int]] = {}  # each domain's shards (one pass over the codes)
        for k, c in enumerate(codes):
            for code in np.unique(c).tolist():
                where.setdefault(code, []).append(k)
        found = {}
        for code, shards in sorted(where.items()):
            domain = _Domain(codes, code, np.array(shards))
            pick = domain if prior is None else Both(prior, domain)
            found[names[code]] = ValStream(names[code], SubsetStore(base, pick), tokens, seq_len, batch_size, device)
    return {name: stream for name, stream in found.items() if stream.windows}  # (too short for a window: none)


def _codes(data: Any, store: Any, by: object) -> tuple[list[str], list[np.ndarray]]:
    """(the domains' names, per shard of `store`, the prepared split, each document's domain number)."""
    meta = data.meta
    if meta is None:
        raise ArgumentError(f"val_streams(by={by!r}) reads a prepared split's files; pass by=None for a dataset in "
                            "memory")  # fmt: skip
    if by == "input":
        if not all(s.src_path for s in store.shards):
            raise ArgumentError(f"{data.path} keeps no provenance (prepared by an older lmshard), so its documents' "
                                "inputs are not known; pass by=None, or prepare it again")  # fmt: skip
        paths = [s.path for s in meta.sources]  # (an input read twice, an appended file of the same name: #2)
        names = [p if paths.count(p) == 1 else f"{p}#{i + 1}" for i, p in enumerate(paths)]
        return names, [_sources(store, k) for k in range(len(store.shards))]
    field = next((f for f in meta.attributes if f.name == by and f.dtype == "category"), None)
    if field is None:
        have = [f.name for f in meta.attributes if f.dtype == "category"]
        raise ArgumentError(f"by={checks.show(by)}: pass 'input', None, or a category attribute of {data.path} "
                            f"({', '.join(have) or 'it has none'})")  # fmt: skip
    from .where import attribute_columns

    codes = [attribute_columns(store, k, meta.attributes, [field.name])[field.name].astype(np.int64)
             if store.shards[k].n_docs else np.zeros(0, np.int64) for k in range(len(store.shards))]  # fmt: skip
    return list(field.labels), codes


def _sources(store: Any, k: int) -> np.ndarray:
    """Shard k's documents' input numbers (its .src, held to its checksum)."""
    shard = store.shards[k]
    from .where import read_part

    data = read_part(store, shard.src_path, 0, shard.src_bytes)
    if len(data) != shard.src_bytes or bytes_xxh3(data) != shard.src_xxh3_64:
        raise FormatError(f"{shard.src_path}: does not match its size and 'src_xxh3_64' in the metadata; "
                          f"{REGENERATE_HINT}")  # fmt: skip
    return np.frombuffer(data, dtype=SRC_DTYPE)["source"].astype(np.int64)


def _warn_overlap(data: Any) -> None:
    """Say once when the val split may share documents with train (see the module docstring)."""
    meta = data.meta
    if meta is None:
        return
    if "@" in getattr(data, "_carved", ""):  # (held out by number, not by text)
        why, what = "is a load-time split", "copies"
    elif meta.dedup is None or meta.dedup.mode == "none":
        why, what = "was prepared without deduplication", "copies"
    else:
        why, what = ("", "") if meta.dedup.near else ("was prepared without --near-dedup", "near-copies")
    if why:
        warnings.warn(f"{data.path} {why}: its val documents may have {what} in train; `lmshard inspect DATASET "
                      "--overlap splits` counts them", stacklevel=4)  # fmt: skip
