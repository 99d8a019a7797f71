"""MinHash signatures and LSH bands of documents, for near-duplicate detection.

A document's text is normalised (`normalize`: case folded, accents and punctuation removed,
digits made 0, whitespace collapsed), cut into words, and its set of word n-grams (shingles,
`n_grams` words each) is hashed: each word by xxh3-64, each shingle by a polynomial of its
words' hashes (64-bit, wrapping). The signature is, for each of `bands × rows` hash functions,
the least value the function takes over the shingles, kept as its high 32 bits (uint32: half
the bytes to store; two different minima agree by chance once in 2^32). A hash function is a
seeded 64-bit mix (splitmix64's finaliser of the shingle hash xor a per-function seed). Two
documents agree on one signature value with probability equal to the Jaccard similarity of
their shingle sets, so the fraction of values they agree on estimates it.

The signature is cut into `bands` bands of `rows` values; a band's key is a 64-bit hash of its
values, seeded by the band's number. Two documents that share a band key are candidates: with
Jaccard similarity J they share at least one with probability 1 - (1 - J^rows)^bands, the LSH
S-curve. A candidate pair is a near-duplicate when its signatures agree on at least
`threshold` of their values (near.py).

`MinHashConfig()`: word 5-grams (FineWeb's), 110 hash functions as 22 bands × 5 rows, and a
threshold of 0.7. FineWeb's 14 × 8 without a check finds 92% of the pairs at J = 0.8 and takes
5.3% at J = 0.5; 22 × 5 finds 99.98% of them as candidates (and half of those at 0.5), and the
check keeps 99.5% at 0.8 and none at 0.5 (an agreement of 0.7 over 110 values is 4.3 standard
deviations above 0.5): docs/quality.md has the table.

Everything here is a pure function of the text and the configuration: the same on every
worker, task and machine.

Memory model: one document's words and shingles (a few uint64 arrays of its word count), a
[hashes, shingles] block of at most MAX_BLOCK uint64 values at a time (two such arrays while it
is mixed), and per process a table of the characters `normalize` has met (at most _CHARS_CACHED
entries, a few MB).
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import numpy as np

from .sets import distinct

MAX_BLOCK = 1 << 20  # uint64 values per [hashes, shingles] block (8 MiB)
_PUNCTUATION = re.compile(r"[^\w\s]|_", re.UNICODE)
_DIGIT = re.compile(r"\d")
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)
_CHARS_CACHED = 1 << 16  # distinct characters whose mapping `normalize` keeps (~80 bytes each)


class _CharMap(dict[int, str]):
    """`str.translate` table of what `normalize` makes of each character after NFKD: nothing for
    a combining mark, a space for punctuation (`_PUNCTUATION`), 0 for a digit (`_DIGIT`), else
    itself. Each character's entry is worked out from those definitions the first time it is
    met, so one C-level `translate` does per character what a generator and two regex passes
    did (about 7x faster on English prose); the same output by construction, since both regexes
    match single characters."""

    def __missing__(self, code: int) -> str:
        char = chr(code)
        mapped = "" if unicodedata.combining(char) else _DIGIT.sub("0", _PUNCTUATION.sub(" ", char))
        if len(self) < _CHARS_CACHED:  # bounded: text in many scripts cannot grow it without end
            self[code] = mapped
        return mapped


_CHAR_MAP = _CharMap()


def _xxhash() -> Any:
    import xxhash

    return xxhash


@dataclass(frozen=True)
class MinHashConfig:
    """Shingle size and the LSH layout; `seed` picks the hash functions."""

    n_grams: int = 5
    bands: int = 22
    rows: int = 5
    threshold: float = 0.7
    seed: int = 1

    def __post_init__(self) -> None:
        for name in ("n_grams", "bands", "rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: pass 1 or more")
        if self.n_grams > 64 or self.n_hashes > 1024:
            raise ValueError(f"{self.n_grams}-grams, {self.bands} x {self.rows} hashes: pass at most 64 words and "
                             "1024 hashes (bands x rows)")  # fmt: skip
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold={self.threshold}: pass a fraction in (0, 1]")

    @property
    def n_hashes(self) -> int:
        return self.bands * self.rows

    def to_json(self) -> dict[str, Any]:
        return {"n_grams": self.n_grams, "bands": self.bands, "rows": self.rows, "threshold": self.threshold,
                "seed": self.seed, "hash": "high 32 bits of splitmix64(xxh3_64 shingle ^ seed_i)",
                "normalize": "casefold, no accents, no punctuation, digits 0, whitespace collapsed"}  # fmt: skip

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> MinHashConfig:
        return cls(n_grams=int(raw["n_grams"]), bands=int(raw["bands"]), rows=int(raw["rows"]),
                   threshold=float(raw["threshold"]), seed=int(raw["seed"]))  # fmt: skip

    @property
    def agree_at_least(self) -> int:
        """Signature values a candidate pair must agree on to be near-duplicates."""
        return max(1, math.ceil(self.threshold * self.n_hashes - 1e-9))

    def collision_probability(self, jaccard: float) -> float:
        """The chance that two documents of this Jaccard similarity share a band."""
        return float(1 - (1 - jaccard**self.rows) ** self.bands)

    def detection_probability(self, jaccard: float) -> float:
        """The chance that two documents of this Jaccard similarity are found near-duplicates:
        they share a band and agree on at least `agree_at_least` values (binomial)."""
        n, k = self.n_hashes, self.agree_at_least
        agree = sum(math.comb(n, i) * jaccard**i * (1 - jaccard) ** (n - i) for i in range(k, n + 1))
        return self.collision_probability(jaccard) * float(agree)

    def seeds(self) -> np.ndarray:
        """One 64-bit seed per hash function, derived from `seed`."""
        return _splitmix(np.arange(1, self.n_hashes + 1, dtype=np.uint64) + np.uint64(self.seed) * np.uint64(0x9E37))


def normalize(text: str) -> str:
    """Case folded, accents removed (NFKD without combining marks), punctuation as spaces,
    every digit 0, runs of whitespace as one space: copies that differ only there are equal."""
    text = unicodedata.normalize("NFKD", text.casefold()).translate(_CHAR_MAP)
    return " ".join(text.split())


def _splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _splitmix_inplace(x: np.ndarray) -> np.ndarray:
    """`_splitmix` in place on a uint64 array, with one temporary of its size: the same values
    without allocating a new array for each of its eight operations."""
    t = np.right_shift(x, np.uint64(30))
    x ^= t
    x *= np.uint64(0xBF58476D1CE4E5B9)  # uint64 array ops wrap without a warning
    np.right_shift(x, np.uint64(27), out=t)
    x ^= t
    x *= np.uint64(0x94D049BB133111EB)
    np.right_shift(x, np.uint64(31), out=t)
    x ^= t
    return x


def shingles(text: str, n_grams: int) -> np.ndarray:
    """The distinct hashes (uint64) of the normalised text's word n-grams; a text of fewer than
    `n_grams` words is one shingle of all its words (none when it has no word)."""
    words = normalize(text).split(" ")
    if words == [""]:
        return np.zeros(0, dtype=np.uint64)
    xxhash = _xxhash()
    hashes = np.fromiter(map(xxhash.xxh3_64_intdigest, map(str.encode, words)), dtype=np.uint64, count=len(words))
    n = min(n_grams, len(hashes))
    combined = np.zeros(len(hashes) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):  # h = sum of word_j * K^(n-1-j), wrapping: the order of the words counts
            combined = combined * np.uint64(0x100000001B3) + hashes[j : len(hashes) - n + 1 + j]
    return distinct(combined)


def signature(text: str, config: MinHashConfig = MinHashConfig()) -> np.ndarray:
    """The text's MinHash signature: `config.n_hashes` uint32 values (all 2^32 - 1 for a text
    without words, which then shares bands only with other such texts)."""
    return signature_of(shingles(text, config.n_grams), _seeds(config))


@functools.lru_cache(maxsize=16)
def _seeds(config: MinHashConfig) -> np.ndarray:
    """`config.seeds()`, worked out once per configuration (read-only: it is shared)."""
    seeds = config.seeds()
    seeds.setflags(write=False)
    return seeds


def signature_of(shingle_hashes: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """min over the shingles of each seeded hash function (its high 32 bits), in blocks of at
    most MAX_BLOCK values."""
    out = np.full(len(seeds), _MASK, dtype=np.uint64)
    step = max(1, MAX_BLOCK // len(seeds))
    for a in range(0, len(shingle_hashes), step):
        block = _splitmix_inplace(np.bitwise_xor(shingle_hashes[None, a : a + step], seeds[:, None]))
        np.minimum(out, block.min(axis=1), out=out)
    return (out >> np.uint64(32)).astype(np.uint32)


def band_keys(signatures: np.ndarray, config: MinHashConfig = MinHashConfig()) -> np.ndarray:
    """[documents, bands] uint64: each band's key (`band_key`), every band at once. Memory: a
    few [documents, bands] uint64 arrays."""
    signatures = np.atleast_2d(signatures)
    return _band_hash(signatures.reshape(len(signatures), config.bands, config.rows), 0)


def band_key(rows: np.ndarray, band: int) -> np.ndarray:
    """The keys of band `band` from its [documents, rows] values: a 64-bit hash of the values
    seeded with the band's number, so equal values in two bands give different keys."""
    return _band_hash(np.asarray(rows)[:, None, :], band)[:, 0]


def _band_hash(values: np.ndarray, first_band: int) -> np.ndarray:
    """[documents, bands] keys of [documents, bands, rows] values, the bands numbered from
    `first_band`: each row's value mixed in turn (splitmix64) into the band's seed."""
    n, bands, rows = values.shape
    with np.errstate(over="ignore"):
        start = np.arange(first_band + 1, first_band + bands + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        h = np.broadcast_to(start, (n, bands))
        for j in range(rows):
            h = _splitmix(h ^ values[:, :, j].astype(np.uint64)) * np.uint64(0x100000001B3)
        return _splitmix(h)
