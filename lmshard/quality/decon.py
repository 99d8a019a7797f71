"""Benchmark decontamination (`prepare --decontaminate FILE`, repeatable; `inspect --decontaminate`).

**Benchmarks.** Each file is one benchmark, named by its stem (or `NAME=PATH`): JSONL or parquet
records, every string field of which (and every list of strings, joined) is an item, or plain
text, one item per non-empty line. Items are normalised to words: Unicode NFKC, lowercase, runs
of letters and digits (so whitespace, case and punctuation do not hide a copy).

**A match.** A document is contaminated when it shares an n-gram of words (n = 13 by default)
with an item, or holds a whole item of 8 to n − 1 words (short questions, answers, one-line
items). Items under 8 words are not matched: such runs of words occur in ordinary text. The index
holds a 64-bit hash of every n-gram of every item (and of each short item, by its length), in
sorted arrays; a document's n-grams are hashed with numpy (polynomials modulo 2**64 over its
words' bytes, then over its words) and looked up with one `searchsorted` per length. The index is built
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

SHORTEST = 8  # words: a shorter item is not matched
MODES = ("documents", "lines")
_WORD = re.compile(r"[^\W_]+")
_NONWORD = re.compile(r"[\W_]+")
_ODD = np.uint64(0x9E3779B97F4A7C15)  # the polynomial's base (odd, so invertible modulo 2**64)
_NAME = re.compile(r"[A-Za-z0-9_]+")


def words(text: str) -> list[str]:
    """The normalised words of `text`: what an item or a document is compared by."""
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


def word_hashes(text: str) -> np.ndarray:
    """A 64-bit hash of each normalised word of `text` (the words of `words`), in numpy: a
    polynomial over the word's UTF-8 bytes, then mixed (splitmix64's finaliser)."""
    norm = _NONWORD.sub(" ", unicodedata.normalize("NFKC", text).lower())
    b = np.frombuffer(norm.encode("utf-8"), dtype=np.uint8)
    if not len(b):
        return np.zeros(0, dtype=np.uint64)
    letter = b != 32
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


def read_benchmark(spec: str) -> Benchmark:
    """`PATH` or `NAME=PATH`: its items (see the module docstring); ConfigError, one line, for a
    file that cannot be read or holds no item."""
    name, sep, path = spec.partition("=")
    if not sep or not _NAME.fullmatch(name):
        name, path = Path(spec).name.split(".")[0], spec
    name = "_".join(_NAME.findall(name)) or "benchmark"
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
        for b, bench in enumerate(self.benchmarks):
            for item in bench.items:
                hashes = word_hashes(item)
                if len(hashes) < SHORTEST:
                    continue
                size = min(len(hashes), n)
                found.setdefault(size, []).append((grams(hashes, size), b))
        self.index: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for size, parts in found.items():
            keys = np.concatenate([g for g, _ in parts])
            owner = np.concatenate([np.full(len(g), b, dtype=np.int32) for g, b in parts])
            order = np.argsort(keys, kind="stable")
            self.index[size] = (keys[order], owner[order])
        self.grams = sum(len(k) for k, _ in self.index.values())

    def matches(self, text: str) -> int | None:
        """The first benchmark (by number) that `text` shares an n-gram or a whole short item with, or None."""
        hashes = word_hashes(text)
        if len(hashes) < SHORTEST:
            return None
        hit: int | None = None
        for size, (keys, owner) in self.index.items():
            g = grams(hashes, size)
            if not len(g):
                continue
            at = np.searchsorted(keys, g)
            inside = at < len(keys)
            ok = np.zeros(len(g), dtype=bool)
            ok[inside] = keys[at[inside]] == g[inside]
            if ok.any():
                b = int(owner[at[ok]].min())
                hit = b if hit is None else min(hit, b)
        return hit

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

    def sources(self) -> dict[str, list[str]]:
        """What a run's metadata records: per benchmark, its file and the sha256 of its bytes."""
        return {b.name: [b.path, file_sha256(b.path)] for b in self.benchmarks}
