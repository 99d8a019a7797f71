"""Benchmark decontamination (`prepare --decontaminate FILE`, repeatable; `inspect --decontaminate`).

**Benchmarks.** Each file is one benchmark, named by its stem (or `NAME=PATH`): JSONL or parquet
records, every string field of which (and every list of strings, joined) is an item, or plain
text, one item per non-empty line. Items are normalised to words: Unicode NFKC, lowercase, runs
of ASCII letters and digits and of other characters outside ASCII (so whitespace, case and ASCII
punctuation do not hide a copy).

**A match.** A document is contaminated when it shares an n-gram of words (n = 13 by default)
with an item, or holds a whole item of 8 to n − 1 words (short questions, answers, one-line
items). Items under 8 words are not matched: such runs of words occur in ordinary text. The index
holds a 64-bit hash of every n-gram of every item (and of each short item, by its length), in
sorted arrays; a document's n-grams are hashed with numpy (polynomials modulo 2**64 over its
words' bytes, then over its words), passed through a bitmap of the index's hashes, and the few
that pass looked up with `searchsorted`; short items are found by their first 8 words, then
checked whole. The index is built
once per process: in the one that configures a run, before its workers fork, so they share it.

**What is removed.** The document (its reason `contaminated_<benchmark>`, the first benchmark
that matched, counted in the metadata's drops with an example), or with `lines` only the lines
that match, the rest kept (an `Edit`; a document left empty is dropped).

**Memory model.** 8 bytes per indexed n-gram (about 8 per word of the benchmarks' items, times
the short lengths present); per document, 8 bytes per word per length checked.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from .edit import Edit
from .sets import distinct

SHORTEST = 8  # words: a shorter item is not matched
MODES = ("documents", "lines")
_WORD = re.compile("[a-z0-9\u0080-\U0010ffff]+")
_ODD = np.uint64(0x9E3779B97F4A7C15)  # the polynomial's base (odd, so invertible modulo 2**64)
_NAME = re.compile(r"[A-Za-z0-9_]+")


def words(text: str) -> list[str]:
    """The normalised words of `text`, what an item or a document is compared by: after NFKC and
    lowercasing, runs of ASCII letters and digits and of characters outside ASCII."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).lower())


_POWERS = [np.ones(1, dtype=np.uint64), np.ones(1, dtype=np.uint64)]  # Q**i and Q**-i (mod 2**64), grown as needed


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Q**i and Q**-i modulo 2**64 for i < n."""
    if len(_POWERS[0]) < n:
        size = max(n, 2 * len(_POWERS[0]))
        inverse = np.uint64(pow(int(_ODD), -1, 1 << 64))
        with np.errstate(over="ignore"):
            _POWERS[0] = np.cumprod(np.concatenate([[np.uint64(1)], np.full(size - 1, _ODD, dtype=np.uint64)]))
            _POWERS[1] = np.cumprod(np.concatenate([[np.uint64(1)], np.full(size - 1, inverse, dtype=np.uint64)]))
    return _POWERS[0][:n], _POWERS[1][:n]


def _runs(values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Σ values[k]·Q**(k - start) over each run [start, end), modulo 2**64."""
    up, down = _powers(len(values) + 1)
    with np.errstate(over="ignore"):
        prefix = np.concatenate([[np.uint64(0)], np.cumsum(values * up[: len(values)], dtype=np.uint64)])
        return (prefix[ends] - prefix[starts]) * down[starts]


_WORD_BYTE = np.zeros(256, dtype=bool)  # a-z, 0-9, and every byte of a character outside ASCII
_WORD_BYTE[[*range(ord("a"), ord("z") + 1), *range(ord("0"), ord("9") + 1), *range(128, 256)]] = True


def word_hashes(text: str) -> np.ndarray:
    """A 64-bit hash of each normalised word of `text` (the words of `words`), in numpy: a
    polynomial over the word's UTF-8 bytes, then mixed (splitmix64's finaliser)."""
    b = np.frombuffer(unicodedata.normalize("NFKC", text).lower().encode("utf-8", "replace"), dtype=np.uint8)
    if not len(b):
        return np.zeros(0, dtype=np.uint64)
    letter = _WORD_BYTE[b]
    edges = np.diff(np.concatenate([[False], letter, [False]]).astype(np.int8))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    z = _runs(b.astype(np.uint64) + np.uint64(1), starts, ends)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def grams(hashes: np.ndarray, n: int) -> np.ndarray:
    """The hash of every run of n consecutive words: Σ h[j+i]·Q**i over i < n, modulo 2**64."""
    m = len(hashes) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.uint64)
    starts = np.arange(m)
    return _runs(hashes, starts, starts + n)


@dataclass
class Benchmark:
    name: str
    path: str
    items: list[str]


def name_and_path(spec: str) -> tuple[str, str]:
    """`NAME=PATH`, or `PATH` named by its file's stem."""
    name, sep, path = spec.partition("=")
    if not sep or not _NAME.fullmatch(name):
        name, path = Path(spec).name.split(".")[0], spec
    return "_".join(_NAME.findall(name)) or "benchmark", path


def benchmark_sources(specs: list[str]) -> dict[str, list[str]]:
    """What a run's metadata records of its benchmarks: per name, the file and the sha256 of its bytes."""
    out = {}
    for spec in specs:
        name, path = name_and_path(spec)
        try:
            out[name] = [path, file_sha256(path)]
        except OSError as e:
            raise ConfigError(f"--decontaminate {spec}: cannot read it ({e})") from None
    return out


def from_filter(name: str, args: str) -> Decontaminator:
    """The filter `decontaminate=N:MODE:FILE|FILE...` that `prepare --decontaminate` adds."""
    n, mode, files = args.split(":", 2)
    return Decontaminator(files.split("|"), int(n), mode)


def read_benchmark(spec: str) -> Benchmark:
    """`PATH` or `NAME=PATH`: its items (see the module docstring); ConfigError, one line, for a
    file that cannot be read or holds no item."""
    name, path = name_and_path(spec)
    p = Path(path)
    try:
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq

            records: list[Any] = pq.read_table(p).to_pylist()
        elif p.suffix in (".jsonl", ".json"):
            records = []
            with p.open(encoding="utf-8") as f:
                for i, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            records.append(json.loads(line))
                        except json.JSONDecodeError as e:
                            raise ConfigError(f"--decontaminate {spec}: line {i} is not JSON ({e.msg}); write one "
                                              "record per line") from None  # fmt: skip
        else:
            records = [line for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--decontaminate {spec}: cannot read it ({e}); pass a JSONL, parquet or text file") from None
    except ImportError:
        raise ConfigError(f"--decontaminate {spec}: reading parquet needs pyarrow; install it, or convert the "
                          "file to JSONL") from None  # fmt: skip
    items = [t for r in records for t in _texts(r)]
    if not any(len(words(t)) >= SHORTEST for t in items):
        raise ConfigError(f"--decontaminate {spec}: no item of {SHORTEST} words or more; pass the benchmark's "
                          "questions (JSONL/parquet fields, or one per line)")  # fmt: skip
    return Benchmark(name, str(p), items)


def _texts(record: Any) -> list[str]:
    if isinstance(record, str):
        return [record]
    if isinstance(record, dict):
        out = []
        for v in record.values():
            if isinstance(v, str):
                out.append(v)
            elif isinstance(v, list) and v and all(isinstance(x, str) for x in v):
                out.append(" ".join(v))
        return out
    return []


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Decontaminator:
    """The index of a run's benchmarks and the check of a text against it (see the module)."""

    def __init__(self, specs: list[str], n: int = 13, mode: str = "documents") -> None:
        if not isinstance(n, int) or n < SHORTEST:
            raise ConfigError(f"--decontaminate-n {n}: pass {SHORTEST} or more words (13 is the usual n)")
        if mode not in MODES:
            raise ConfigError(f"decontaminate mode {mode!r}: pass 'documents' or 'lines'")
        self.n, self.mode = n, mode
        self.benchmarks = [read_benchmark(s) for s in specs]
        names = [b.name for b in self.benchmarks]
        if len(set(names)) != len(names):
            raise ConfigError(f"--decontaminate: two benchmarks are named {max(names, key=names.count)!r}; name them "
                              "NAME=PATH")  # fmt: skip
        # per length (n, and each short item's), sorted hashes and the benchmark each came from
        found: dict[int, list[tuple[np.ndarray, int]]] = {}
        self.items: list[tuple[int, str]] = []  # per indexed item: (its benchmark, its text)
        firsts = []  # the hash of the first SHORTEST words of each short item
        for b, bench in enumerate(self.benchmarks):
            for item in bench.items:
                hashes = word_hashes(item)
                if len(hashes) < SHORTEST:
                    continue
                size = min(len(hashes), n)
                found.setdefault(size, []).append((grams(hashes, size), len(self.items)))
                self.items.append((b, item))
                if size < n:
                    firsts.append(grams(hashes[:SHORTEST], SHORTEST))
        self.index: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for size, parts in found.items():
            keys = np.concatenate([g for g, _ in parts])
            owner = np.concatenate([np.full(len(g), i, dtype=np.int64) for g, i in parts])  # the item of each hash
            order = np.argsort(keys, kind="stable")
            self.index[size] = (keys[order], owner[order])
        self.grams = sum(len(k) for k, _ in self.index.values())
        # A short item (fewer than n words) is found by its first SHORTEST words, then checked whole; a
        # bit per hash value (of the n-grams and those first words) skips most lookups.
        self.short = sorted(size for size in self.index if size < n)
        self.firsts = distinct(np.concatenate(firsts)) if firsts else np.zeros(0, dtype=np.uint64)
        every = np.concatenate([self.index[n][0] if n in self.index else np.zeros(0, np.uint64), self.firsts])
        self._bits = max(16, min(30, int(len(every) * 16).bit_length()))
        self._seen = np.zeros(1 << (self._bits - 3), dtype=np.uint8)
        where = every >> np.uint64(64 - self._bits)
        np.bitwise_or.at(self._seen, (where >> np.uint64(3)).astype(np.int64),
                         (np.uint8(1) << (where & np.uint64(7)).astype(np.uint8)))  # fmt: skip

    def _maybe(self, g: np.ndarray) -> np.ndarray:
        """Where `g` may be in the index (no false negative; few false positives)."""
        where = g >> np.uint64(64 - self._bits)
        return np.flatnonzero(self._seen[(where >> np.uint64(3)).astype(np.int64)] >> (where & np.uint64(7)).astype(
            np.uint8) & 1)  # fmt: skip

    @staticmethod
    def _find(keys: np.ndarray, g: np.ndarray) -> np.ndarray:
        """The positions in `keys` (sorted) of the values of `g` that are there, else -1."""
        at = np.minimum(np.searchsorted(keys, g), max(len(keys) - 1, 0))
        return np.where(keys[at] == g, at, -1) if len(keys) else np.full(len(g), -1)

    def matches(self, text: str) -> int | None:
        """The first benchmark (by number) that `text` shares an n-gram or a whole short item with, or None."""
        found = self.match(text)
        return None if found is None else found[0]

    def match(self, text: str) -> tuple[int, str] | None:
        """(the first benchmark `text` matches, the text of an item of it that it matches), or None."""
        hashes = word_hashes(text)
        if len(hashes) < SHORTEST:
            return None
        found: list[int] = []
        if self.n in self.index and len(hashes) >= self.n:
            g = grams(hashes, self.n)
            maybe = self._maybe(g)
            keys, owner = self.index[self.n]
            at = self._find(keys, g[maybe])
            found += owner[at[at >= 0]].tolist()
        if self.short:
            g = grams(hashes, SHORTEST)
            maybe = self._maybe(g)
            starts = maybe[self._find(self.firsts, g[maybe]) >= 0]
            for size in self.short:  # (few starts: the rare places a short item's first words are)
                fits = starts[starts + size <= len(hashes)]
                if len(fits):
                    keys, owner = self.index[size]
                    at = self._find(keys, _runs(hashes, fits, fits + size))
                    found += owner[at[at >= 0]].tolist()
        return min((self.items[i] for i in found), key=lambda bi: bi[0]) if found else None

    def reason(self, b: int) -> str:
        return f"contaminated_{self.benchmarks[b].name}"[:64]

    def __call__(self, text: str) -> Any:
        """As a filter (quality/filters.py): None, a reason, or with mode "lines" an Edit."""
        if self.mode == "documents":
            b = self.matches(text)
            return None if b is None else self.reason(b)
        lines = text.split("\n")
        verdicts = [self.matches(line) for line in lines]
        if all(v is None for v in verdicts):
            return None
        kept = [line for line, v in zip(lines, verdicts, strict=True) if v is None]
        first = next(v for v in verdicts if v is not None)
        removed = {self.reason(first): (sum(v is not None for v in verdicts),
                                        next(line for line, v in zip(lines, verdicts, strict=True) if v is not None))}
        return Edit("\n".join(kept), removed)

