"""MinHash signatures and LSH bands of documents, for near-duplicate detection.

A document's text is normalised (`normalize`: case folded, accents and punctuation removed,
digits made 0, whitespace collapsed), cut into words, and its set of word n-grams (shingles,
`n_grams` words each) is hashed: each word by xxh3-64, each shingle by a polynomial of its
words' hashes (64-bit, wrapping). The signature is, for each of `bands × rows` hash functions,
the least value the function takes over the shingles. A hash function is a seeded 64-bit mix
(splitmix64's finaliser of the shingle hash xor a per-function seed), so the signature needs no
large prime arithmetic and every value uses all 64 bits. Two documents agree on one signature
value with probability equal to the Jaccard similarity of their shingle sets.

The signature is cut into `bands` bands of `rows` values; a band's key is the xxh3-64 of its
values. Two documents that share a band key (in the same band) are candidates: with Jaccard
similarity J they share at least one with probability 1 - (1 - J^rows)^bands, the LSH S-curve.
`MinHashConfig()` is FineWeb's published configuration: 5-grams, 14 bands × 8 rows (112
hashes): 92% of pairs at J = 0.8 collide, 99.7% at 0.9, 5.3% at 0.5 and 0.9% at 0.4.

Everything here is a pure function of the text and the configuration: the same on every
worker, task and machine.

Memory model: one document's words and shingles (a few uint64 arrays of its word count) and a
[hashes, shingles] block of at most MAX_BLOCK uint64 values at a time.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_BLOCK = 1 << 20  # uint64 values per [hashes, shingles] block (8 MiB)
_PUNCTUATION = re.compile(r"[^\w\s]|_", re.UNICODE)
_DIGIT = re.compile(r"\d")
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _xxhash() -> Any:
    import xxhash

    return xxhash


@dataclass(frozen=True)
class MinHashConfig:
    """Shingle size and the LSH layout; `seed` picks the hash functions."""

    n_grams: int = 5
    bands: int = 14
    rows: int = 8
    seed: int = 1

    def __post_init__(self) -> None:
        for name in ("n_grams", "bands", "rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: pass 1 or more")

    @property
    def n_hashes(self) -> int:
        return self.bands * self.rows

    def to_json(self) -> dict[str, Any]:
        return {"n_grams": self.n_grams, "bands": self.bands, "rows": self.rows, "seed": self.seed,
                "hash": "splitmix64(xxh3_64 shingle ^ seed_i)", "normalize": "casefold, no accents, no punctuation, "
                "digits 0, whitespace collapsed"}  # fmt: skip

    def collision_probability(self, jaccard: float) -> float:
        """The chance that two documents of this Jaccard similarity share a band."""
        return float(1 - (1 - jaccard**self.rows) ** self.bands)

    def seeds(self) -> np.ndarray:
        """One 64-bit seed per hash function, derived from `seed`."""
        return _splitmix(np.arange(1, self.n_hashes + 1, dtype=np.uint64) + np.uint64(self.seed) * np.uint64(0x9E37))


def normalize(text: str) -> str:
    """Case folded, accents removed (NFKD without combining marks), punctuation as spaces,
    every digit 0, runs of whitespace as one space: copies that differ only there are equal."""
    text = unicodedata.normalize("NFKD", text.casefold())
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = _DIGIT.sub("0", _PUNCTUATION.sub(" ", text))
    return " ".join(text.split())


def _splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def shingles(text: str, n_grams: int) -> np.ndarray:
    """The distinct hashes (uint64) of the normalised text's word n-grams; a text of fewer than
    `n_grams` words is one shingle of all its words (none when it has no word)."""
    words = normalize(text).split(" ")
    if words == [""]:
        return np.zeros(0, dtype=np.uint64)
    xxhash = _xxhash()
    hashes = np.fromiter((xxhash.xxh3_64_intdigest(w.encode()) for w in words), dtype=np.uint64, count=len(words))
    n = min(n_grams, len(hashes))
    combined = np.zeros(len(hashes) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):  # h = sum of word_j * K^(n-1-j), wrapping: the order of the words counts
            combined = combined * np.uint64(0x100000001B3) + hashes[j : len(hashes) - n + 1 + j]
    return np.unique(combined)


def signature(text: str, config: MinHashConfig = MinHashConfig()) -> np.ndarray:
    """The text's MinHash signature: `config.n_hashes` uint64 values (all 2^64 - 1 for a text
    without words, which then shares bands only with other such texts)."""
    return signature_of(shingles(text, config.n_grams), config.seeds())


def signature_of(shingle_hashes: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """min over the shingles of each seeded hash function, in blocks of at most MAX_BLOCK values."""
    out = np.full(len(seeds), _MASK, dtype=np.uint64)
    if not len(shingle_hashes):
        return out
    step = max(1, MAX_BLOCK // len(seeds))
    for a in range(0, len(shingle_hashes), step):
        block = _splitmix(shingle_hashes[None, a : a + step] ^ seeds[:, None])
        np.minimum(out, block.min(axis=1), out=out)
    return out


def band_keys(signatures: np.ndarray, config: MinHashConfig = MinHashConfig()) -> np.ndarray:
    """[documents, bands] uint64: each band's key, the xxh3-64 of its `rows` values (as
    little-endian bytes) with the band's number in the seed, so equal values in two bands differ."""
    signatures = np.ascontiguousarray(np.atleast_2d(signatures), dtype="<u8")
    xxhash = _xxhash()
    rows = config.rows
    keys = np.empty((len(signatures), config.bands), dtype=np.uint64)
    for d, sig in enumerate(signatures):
        raw = sig.tobytes()
        for b in range(config.bands):
            keys[d, b] = xxhash.xxh3_64_intdigest(raw[b * rows * 8 : (b + 1) * rows * 8], seed=b)
    return keys


def clusters(keys: np.ndarray) -> np.ndarray:
    """For each document (rows of `keys`, in plan order), the first document of its cluster:
    documents that share a band key, directly or through others, form one cluster, and its first
    document survives. The same for any order in which the keys were computed."""
    n, bands = keys.shape
    parent = np.arange(n, dtype=np.int64)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = int(parent[i])
        return i

    for b in range(bands):
        order = np.argsort(keys[:, b], kind="stable")  # equal keys together, in plan order
        ordered = keys[order, b]
        same = np.flatnonzero(ordered[1:] == ordered[:-1]) + 1
        for j in same.tolist():
            x, y = root(int(order[j - 1])), root(int(order[j]))
            if x != y:
                parent[max(x, y)] = min(x, y)  # the earlier document is the root: the survivor
    return np.array([root(i) for i in range(n)], dtype=np.int64)
