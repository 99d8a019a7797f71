"""Repetition rules: Gopher's (Rae et al. 2021, appendix A.1.1, table A1) and FineWeb's
additions (Penedo et al. 2024, "The FineWeb Datasets", section 3.3.2), as document filters
returning the reason of the first rule a document fails (None: keep it).

`gopher_repetition` drops a document when:

| reason | rule | threshold |
|---|---|---|
| `gopher_dup_paragraphs` | duplicated paragraphs (split on blank lines) / paragraphs | 0.30 |
| `gopher_dup_paragraph_chars` | characters in duplicated paragraphs / characters | 0.20 |
| `gopher_dup_lines` | duplicated lines / lines | 0.30 |
| `gopher_dup_line_chars` | characters in duplicated lines / characters | 0.20 |
| `gopher_top_2gram` … `_4gram` | characters of the top repeated word n-gram × its count / characters | .20 .18 .16 |
| `gopher_dup_5gram` … `_10gram` | characters of word n-grams that repeat an earlier one / characters | 0.15 … 0.10 |

A duplicated element is one equal to an earlier one. An n-gram's characters are those of its
words joined without spaces. For the duplicated n-grams, the text is scanned from its first
word: an n-gram seen before counts its characters and the scan jumps past it, else the scan moves
one word on.

`fineweb_quality` drops a document when:

| reason | rule | threshold |
|---|---|---|
| `fineweb_line_punctuation` | lines ending in terminal punctuation / lines, below | 0.12 |
| `fineweb_short_lines` | lines of at most 30 characters / lines, above | 0.67 |
| `fineweb_dup_line_chars` | characters in duplicated lines / characters, above | 0.01 |
| `fineweb_newlines` | newlines / words, above | 0.3 |

Lines are the non-blank lines, stripped; words are as in `gopher.py`.

Memory model: one document's lines, paragraphs and words, and a few int64 arrays of its word
count for the n-grams.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .gopher import split_words

TERMINAL = (".", "!", "?", '"', "'", "”", "’", "…", "。", "！", "？", ":", ";")
_PARAGRAPHS = re.compile(r"\n\s*\n")


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(how many of `items` equal an earlier one, how many characters those hold)."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count += 1
            chars += len(item)
        else:
            seen.add(item)
    return count, chars


class _NGrams:
    """Ids of a document's word n-grams, for growing n: `of(n)[i]` names words i..i+n-1, equal
    exactly when the n-grams are. Words are numbered (a dict); an n-gram is ranked by its first
    word's number and the rank of the (n-1)-gram after it (np.unique): no hashing, no collision,
    one np.unique per n."""

    def __init__(self, words: list[str]) -> None:
        number: dict[str, int] = {}
        self.words = np.array([number.setdefault(w, len(number)) for w in words], dtype=np.int64)
        self.grams = {1: self.words}

    def of(self, n: int) -> np.ndarray:
        k = max(self.grams)
        while k < n:
            k += 1
            tail = self.grams[k - 1]
            pairs = self.words[: len(self.words) - k + 1] * (int(tail.max(initial=0)) + 1) + tail[1:]
            self.grams[k] = np.unique(pairs, return_inverse=True)[1].astype(np.int64).reshape(-1)
        return self.grams[n]


def _repeated_ngram_chars(ngrams: _NGrams, n: int, ends: np.ndarray) -> int:
    """Characters of the n-grams that repeat an earlier one, scanning from the first word: a
    repeat counts its words' characters and the scan jumps past it (`ends`: the cumulative word
    lengths, from 0)."""
    ids = ngrams.of(n)
    if not len(ids) or int(ids.max()) + 1 == len(ids):
        return 0  # no n-gram occurs twice (the ids are ranks: as many as distinct n-grams)
    grams = ids.tolist()
    seen: set[int] = set()
    chars, i, last = 0, 0, len(grams) - 1
    cum = ends.tolist()
    while i <= last:
        gram = grams[i]
        if gram in seen:
            chars += cum[i + n] - cum[i]
            i += n
        else:
            seen.add(gram)
            i += 1
    return chars


def _top_ngram_chars(ngrams: _NGrams, n: int, ends: np.ndarray) -> int:
    """Characters of the most frequent n-gram times its count (0 unless it occurs twice); among
    equally frequent ones, the first to occur (as Counter.most_common ranks them)."""
    grams = ngrams.of(n)
    if len(grams) < 2 or int(grams.max()) + 1 == len(grams):
        return 0
    _, first, counts = np.unique(grams, return_index=True, return_counts=True)
    top = counts.max()
    if top < 2:
        return 0
    at = int(first[counts == top].min())
    return int(ends[at + n] - ends[at]) * int(top)


@dataclass(frozen=True)
class GopherRepetition:
    dup_paragraphs: float = 0.30
    dup_paragraph_chars: float = 0.20
    dup_lines: float = 0.30
    dup_line_chars: float = 0.20
    top_ngrams: tuple[tuple[int, float], ...] = ((2, 0.20), (3, 0.18), (4, 0.16))
    dup_ngrams: tuple[tuple[int, float], ...] = ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))

    def __call__(self, text: str) -> str | None:
        size = len(text)
        if not size:
            return None
        paragraphs = [p.strip() for p in _PARAGRAPHS.split(text) if p.strip()]
        count, chars = _duplicates(paragraphs)
        if paragraphs and count / len(paragraphs) > self.dup_paragraphs:
            return "gopher_dup_paragraphs"
        if chars / size > self.dup_paragraph_chars:
            return "gopher_dup_paragraph_chars"
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        count, chars = _duplicates(lines)
        if lines and count / len(lines) > self.dup_lines:
            return "gopher_dup_lines"
        if chars / size > self.dup_line_chars:
            return "gopher_dup_line_chars"
        words = split_words(text)
        ends = np.concatenate([[0], np.cumsum([len(w) for w in words], dtype=np.int64)])
        ngrams = _NGrams(words)
        for n, limit in self.top_ngrams:
            if len(words) >= n and _top_ngram_chars(ngrams, n, ends) / size > limit:
                return f"gopher_top_{n}gram"
        for n, limit in self.dup_ngrams:
            if len(words) >= n and _repeated_ngram_chars(ngrams, n, ends) / size > limit:
                return f"gopher_dup_{n}gram"
        return None


@dataclass(frozen=True)
class FineWebQuality:
    min_punctuated_lines: float = 0.12
    short_line_chars: int = 30
    max_short_lines: float = 0.67
    max_dup_line_chars: float = 0.01
    max_newlines_per_word: float = 0.3

    def __call__(self, text: str) -> str | None:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if not lines:
            return None
        if sum(line.endswith(TERMINAL) for line in lines) / len(lines) < self.min_punctuated_lines:
            return "fineweb_line_punctuation"
        if sum(len(line) <= self.short_line_chars for line in lines) / len(lines) > self.max_short_lines:
            return "fineweb_short_lines"
        if _duplicates(lines)[1] / len(text) > self.max_dup_line_chars:
            return "fineweb_dup_line_chars"
        words = split_words(text)
        if words and text.count("\n") / len(words) > self.max_newlines_per_word:
            return "fineweb_newlines"
        return None


gopher_repetition = GopherRepetition()
fineweb_quality = FineWebQuality()
