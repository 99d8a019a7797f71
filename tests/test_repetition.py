"""Gopher's repetition rules and FineWeb's quality rules against small implementations of the
published rules written here (counting with dicts and index arithmetic instead of the module's
sets and scans), on generated documents that trip each rule and documents that pass."""

from __future__ import annotations

import random
import re
from collections import Counter

from lmshard.quality.repetition import fineweb_quality, gopher_repetition

VOCAB = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "light", "dark", "sound", "ocean", "field",
         "winter", "summer"]  # fmt: skip
STRIP = "\"'()[]{}<>,.;:!?«»“”‘’"


def words_of(text):
    return [w.strip(STRIP) for w in text.split() if w.strip(STRIP)]


def dup_stats(items):
    counts, dup, chars = {}, 0, 0
    for it in items:
        counts[it] = counts.get(it, 0) + 1
        if counts[it] > 1:
            dup += 1
            chars += len(it)
    return dup, chars


def ref_repetition(text):
    n = len(text)
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    d, c = dup_stats(paras)
    if paras and d > 0.30 * len(paras):
        return "gopher_dup_paragraphs"
    if c > 0.20 * n:
        return "gopher_dup_paragraph_chars"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    d, c = dup_stats(lines)
    if lines and d > 0.30 * len(lines):
        return "gopher_dup_lines"
    if c > 0.20 * n:
        return "gopher_dup_line_chars"
    w = words_of(text)
    for k, limit in ((2, 0.20), (3, 0.18), (4, 0.16)):
        grams = Counter(" ".join(w[i : i + k]) for i in range(len(w) - k + 1))
        if grams:
            top, times = grams.most_common(1)[0]
            if times > 1 and len(top.replace(" ", "")) * times > limit * n:
                return f"gopher_top_{k}gram"
    for k, limit in ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)):
        seen, chars, i = set(), 0, 0
        while i + k <= len(w):
            g = "\x00".join(w[i : i + k])
            if g in seen:
                chars += len(g) - (k - 1)
                i += k
            else:
                seen.add(g)
                i += 1
        if chars > limit * n:
            return f"gopher_dup_{k}gram"
    return None


def ref_fineweb(text):
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return None
    if sum(ln[-1] in ".!?\"'”’…。！？:;" for ln in lines) < 0.12 * len(lines):
        return "fineweb_line_punctuation"
    if sum(len(ln) <= 30 for ln in lines) > 0.67 * len(lines):
        return "fineweb_short_lines"
    if dup_stats(lines)[1] > 0.01 * len(text):
        return "fineweb_dup_line_chars"
    w = words_of(text)
    if w and text.count("\n") > 0.3 * len(w):
        return "fineweb_newlines"
    return None


def _document(rng):
    kind = rng.choice(["prose", "dup_lines", "dup_paras", "chant", "list", "repeat_block", "short"])
    sentences = [" ".join(rng.choices(VOCAB, k=rng.randint(6, 18))) + rng.choice([".", "!", "?", ""])
                 for _ in range(rng.randint(3, 30))]  # fmt: skip
    if kind == "dup_lines":
        sentences += rng.choices(sentences, k=rng.randint(1, len(sentences)))
    if kind == "chant":
        sentences = [" ".join(["light dark"] * rng.randint(3, 20))] + sentences[:2]
    if kind == "list":
        sentences = [rng.choice(VOCAB) for _ in range(rng.randint(5, 40))]
    if kind == "repeat_block":
        block = " ".join(rng.choices(VOCAB, k=12))
        sentences = [s + " " + (block if rng.random() < 0.5 else "") for s in sentences]
    if kind == "short":
        sentences = [s[:25] for s in sentences]
    if kind == "dup_paras":
        paras = ["\n".join(sentences[i : i + 3]) for i in range(0, len(sentences), 3)]
        paras += rng.choices(paras, k=rng.randint(1, len(paras)))
        return "\n\n".join(paras)
    return "\n".join(sentences)


def test_gopher_repetition_counts_equal_the_reference():
    rng = random.Random(4)
    docs = [_document(rng) for _ in range(2500)]
    mine = [gopher_repetition(d) for d in docs]
    assert mine == [ref_repetition(d) for d in docs]  # (document by document)
    ours = Counter(mine)
    assert len(ours) >= 8 and ours[None] >= 50, ours


def _fineweb_document(rng):
    kind = rng.choice(["any", "short_punctuated", "few_words_per_line"])
    if kind == "short_punctuated":  # short lines that do end a sentence
        lines = [" ".join(rng.choices(VOCAB, k=2)) + "." for _ in range(rng.randint(4, 30))]
        lines += [" ".join(rng.choices(VOCAB, k=12)) + "." for _ in range(rng.randint(0, 6))]
    elif kind == "few_words_per_line":  # long words, two or three a line: many newlines per word
        lines = [" ".join(w * 3 for w in rng.choices(VOCAB, k=2)) + f" {i}." for i in range(40)]
        lines += [" ".join(rng.choices(VOCAB, k=rng.randint(3, 40))) + "." for _ in range(rng.randint(0, 3))]
    else:
        return _document(rng)
    return "\n".join(lines)


def test_fineweb_quality_counts_equal_the_reference():
    rng = random.Random(6)
    docs = [_fineweb_document(rng) for _ in range(2500)]
    ours, theirs = Counter(map(fineweb_quality, docs)), Counter(map(ref_fineweb, docs))
    assert ours == theirs
    assert len(ours) == 5 and min(ours.values()) >= 20, ours
