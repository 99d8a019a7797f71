"""Scorers: `prepare --attribute NAME` (repeatable) keeps per-document numbers beside the tokens
instead of dropping by them (format/attributes.py), so a quality threshold is chosen at load
time (`TokenDataset(..., where=...)`) and tuned without preparing again.

| NAME | columns |
|---|---|
| `length` | `chars`, `words`, `lines` (uint32: characters, words as gopher.py splits them, non-blank lines) |
| `gopher_quality` | `gopher_word_count`, `gopher_word_length`, `gopher_symbols`, `gopher_bullets`, |
| | `gopher_ellipsis_lines`, `gopher_alphabetic`, `gopher_stop_words` (the counts uint32) |
| `gopher_repetition` | `gopher_dup_paragraphs`, `gopher_dup_paragraph_chars`, `gopher_dup_lines`, |
| | `gopher_dup_line_chars`, `gopher_top_2gram` … `_4gram`, `gopher_dup_5gram` … `_10gram` |
| `fineweb_quality` | `fineweb_line_punctuation`, `fineweb_short_lines`, `fineweb_dup_line_chars`, `fineweb_newlines` |
| `language` | `language` (category: the most likely language's code), `language_score` (its probability) |
| `module:function` | one float32 column named after the function: it returns a number (None: NaN) |
| `module:function=a,b` | float32 columns `a` and `b`: the function returns a dict holding those keys |

Each column of the built-ins is the statistic the filter of the same name holds to its
threshold (the reason names are the column names): `where="gopher_dup_lines <= 0.3"` keeps what
`--filter gopher_repetition`'s rule keeps. A ratio over nothing (no words, no lines) is NaN, which
no comparison passes. Scorers see the document as it is kept: cleaned, after every `--filter`
and its edits. A plugin is part of the run's fingerprint as a filter's is (filters.py).

Memory model: one document's lines, paragraphs and words; the language model (about 110 MB per
process) when `language` is asked for.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..format.attributes import AttrField, is_name, row_dtype
from ..plugins import import_callable
from .gopher import BULLETS, ELLIPSES, STOP_WORDS, split_words
from .repetition import TERMINAL, _duplicates, _NGrams, _repeated_ngram_chars, _top_ngram_chars

_PARAGRAPHS = re.compile(r"\n\s*\n")
_LETTER = re.compile(r"[^\W\d_]")
_NAN = float("nan")
_TOP, _DUP = (2, 3, 4), (5, 6, 7, 8, 9, 10)


class ScoreFailed(Exception):
    """A plugin scorer raised or returned what a scorer cannot: the run names the record (worker.py)."""


def _ratio(a: float, b: float) -> float:
    return a / b if b else _NAN


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _length(text: str) -> list[float]:
    return [len(text), len(split_words(text)), len(_lines(text))]


def _gopher(text: str) -> list[float]:
    words, lines = split_words(text), _lines(text)
    n = len(words)
    symbols = text.count("#") + text.count("...") + text.count("…")
    return [n, _ratio(sum(len(w) for w in words), n), _ratio(symbols, n),
            _ratio(sum(line.startswith(BULLETS) for line in lines), len(lines)),
            _ratio(sum(line.endswith(ELLIPSES) for line in lines), len(lines)),
            _ratio(sum(1 for w in words if w.isalpha() or _LETTER.search(w)), n),
            len(STOP_WORDS.intersection(w.lower() for w in words))]  # fmt: skip


def _repetition(text: str) -> list[float]:
    size = len(text)
    paragraphs = [p.strip() for p in _PARAGRAPHS.split(text) if p.strip()]
    p_count, p_chars = _duplicates(paragraphs)
    lines = _lines(text)
    l_count, l_chars = _duplicates(lines)
    words = split_words(text)
    ends = np.concatenate([[0], np.cumsum([len(w) for w in words], dtype=np.int64)])
    grams = _NGrams(words)
    top = [_ratio(_top_ngram_chars(grams, n, ends) if len(words) >= n else 0, size) for n in _TOP]
    dup = [_ratio(_repeated_ngram_chars(grams, n, ends) if len(words) >= n else 0, size) for n in _DUP]
    return [_ratio(p_count, len(paragraphs)), _ratio(p_chars, size), _ratio(l_count, len(lines)),
            _ratio(l_chars, size), *top, *dup]  # fmt: skip


def _fineweb(text: str) -> list[float]:
    lines, words = _lines(text), split_words(text)
    return [_ratio(sum(line.endswith(TERMINAL) for line in lines), len(lines)),
            _ratio(sum(len(line) <= 30 for line in lines), len(lines)),
            _ratio(_duplicates(lines)[1], len(text)), _ratio(text.count("\n"), len(words))]  # fmt: skip


def _language(text: str) -> list[float]:
    from .language import identifier

    code, score = identifier().classify(text)
    return [_codes()[code], float(score)]


@functools.cache
def _codes() -> dict[str, int]:
    return {label: i for i, label in enumerate(_labels())}


def _labels() -> list[str]:
    from .language import identifier

    return list(identifier().labels)


def _cols(names: Sequence[str], dtype: str = "float32") -> list[tuple[str, str]]:
    return [(n, dtype) for n in names]


BUILTIN: dict[str, tuple[Callable[[], list[tuple[str, str]]], Callable[[str], list[float]]]] = {
    "length": (lambda: _cols(("chars", "words", "lines"), "uint32"), _length),
    "gopher_quality": (lambda: [("gopher_word_count", "uint32"), *_cols(("gopher_word_length", "gopher_symbols",
                       "gopher_bullets", "gopher_ellipsis_lines", "gopher_alphabetic")),
                       ("gopher_stop_words", "uint32")], _gopher),
    "gopher_repetition": (lambda: _cols(("gopher_dup_paragraphs", "gopher_dup_paragraph_chars", "gopher_dup_lines",
                          "gopher_dup_line_chars", *(f"gopher_top_{n}gram" for n in _TOP),
                          *(f"gopher_dup_{n}gram" for n in _DUP))), _repetition),
    "fineweb_quality": (lambda: _cols(("fineweb_line_punctuation", "fineweb_short_lines", "fineweb_dup_line_chars",
                        "fineweb_newlines")), _fineweb),
    "language": (lambda: [("language", "category"), ("language_score", "float32")], _language),
}  # fmt: skip


def _plugin_names(spec: str) -> tuple[str, tuple[str, ...]]:
    """(module:function, its column names) of a plugin scorer."""
    target, eq, names = spec.partition("=")
    cols = tuple(n.strip() for n in names.split(",")) if eq else (target.rpartition(":")[2],)
    for col in cols:
        if not is_name(col):
            raise ConfigError(f"--attribute {spec}: {col!r} is not an attribute name (letters, digits and _, not "
                              "starting with a digit, not a Python keyword); name the columns as "
                              "module:function=a,b")  # fmt: skip
    return target, cols


def schema(specs: Sequence[str]) -> tuple[AttrField, ...]:
    """The columns `--attribute specs` make, in order; ConfigError, one line, for a name that is
    neither a built-in nor module:function, or a column named twice."""
    fields: list[AttrField] = []
    for spec in specs:
        if spec in BUILTIN:
            cols = BUILTIN[spec][0]()
        elif ":" in spec:
            cols = _cols(_plugin_names(spec)[1])
        else:
            close = difflib.get_close_matches(spec, list(BUILTIN), n=1, cutoff=0.5)
            guess = f"; did you mean {close[0]}?" if close else ""
            raise ConfigError(f"--attribute {spec}: not a built-in scorer ({', '.join(BUILTIN)}) nor "
                              f"module:function{guess}")  # fmt: skip
        for name, dtype in cols:
            labels = tuple(_labels()) if dtype == "category" else ()
            fields.append(AttrField(name, dtype, spec, labels))
    names = [f.name for f in fields]
    for f in fields:
        if names.count(f.name) > 1:
            raise ConfigError(f"--attribute {f.by}: the column {f.name!r} is made twice; give each scorer once (a "
                              "plugin's columns other names: module:function=a,b)")  # fmt: skip
    return tuple(fields)


class Scorer:
    """Every `--attribute` of a run, as one function of a kept document's text."""

    def __init__(self, specs: Sequence[str]) -> None:
        self.specs = tuple(specs)
        self.fields = schema(self.specs)
        self.dtype = row_dtype(self.fields)
        self._parts: list[tuple[str, Callable[[str], Any], tuple[str, ...] | None]] = []
        for spec in self.specs:
            if spec in BUILTIN:
                self._parts.append((spec, BUILTIN[spec][1], None))
            else:
                target, cols = _plugin_names(spec)
                fn = import_callable(target, f"--attribute {spec}")
                self._parts.append((spec, fn, cols if "=" in spec else None))

    def row(self, text: str) -> tuple[float, ...]:
        values: list[float] = []
        for spec, fn, cols in self._parts:
            if spec in BUILTIN:
                values.extend(fn(text))
                continue
            try:
                got = fn(text)
            except Exception as e:  # the user's code: whatever it raises
                raise ScoreFailed(f"--attribute {spec} raised {type(e).__name__}: {str(e)[:160]}") from None
            values.extend(_plugin_values(spec, got, cols))
        return tuple(values)


def _number(spec: str, value: Any) -> float:
    if value is None:
        return _NAN
    if isinstance(value, int | float | np.integer | np.floating):
        try:
            return float(value)
        except OverflowError:  # (an int past the float range)
            raise ScoreFailed(f"--attribute {spec} returned {str(value)[:40]}..., past the range of a number it "
                              "can keep (float32)") from None
    raise ScoreFailed(f"--attribute {spec} returned {type(value).__name__} {str(value)[:40]!r}; a scorer returns a "
                      "number (None: not known)")  # fmt: skip


def _plugin_values(spec: str, got: Any, cols: tuple[str, ...] | None) -> list[float]:
    if cols is None:
        return [_number(spec, got)]
    if not isinstance(got, dict):
        if len(cols) == 1:
            return [_number(spec, got)]
        raise ScoreFailed(f"--attribute {spec} returned {type(got).__name__}; it names {len(cols)} columns, so it "
                          f"returns a dict with the keys {', '.join(cols)}")  # fmt: skip
    missing = [c for c in cols if c not in got]
    if missing:
        raise ScoreFailed(f"--attribute {spec} returned a dict without {missing[0]!r}; it returns the keys "
                          f"{', '.join(cols)}")  # fmt: skip
    return [_number(spec, got[c]) for c in cols]
