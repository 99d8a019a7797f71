"""The Gopher quality rules against a small implementation of the published rules written here
(regular expressions instead of the module's string methods), on generated documents that trip
each rule and on documents that pass them all."""

from __future__ import annotations

import random
import re
from collections import Counter

from lmshard.quality.gopher import GopherQuality, gopher_quality

PROSE = ("the river runs to the sea and that is what we have with the stone of time " * 5).split()


def reference(text: str) -> str | None:
    words = [w for w in (re.sub(r"^[\"'()\[\]{}<>,.;:!?«»“”‘’]+|[\"'()\[\]{}<>,.;:!?«»“”‘’]+$", "", t)
                         for t in re.findall(r"\S+", text)) if w]  # fmt: skip
    if not 50 <= len(words) <= 100_000:
        return "gopher_word_count"
    if not 3 <= sum(map(len, words)) / len(words) <= 10:
        return "gopher_word_length"
    if (len(re.findall("#", text)) + len(re.findall(r"\.\.\.", text)) + len(re.findall("…", text))) > 0.1 * len(words):
        return "gopher_symbols"
    lines = [ln.strip() for ln in re.split(r"\r\n|\r|\n", text) if ln.strip()]
    if len([ln for ln in lines if re.match(r"[•‣⁃◦▪\-*]", ln)]) > 0.9 * len(lines):
        return "gopher_bullets"
    if len([ln for ln in lines if re.search(r"(\.\.\.|…)$", ln)]) > 0.3 * len(lines):
        return "gopher_ellipsis_lines"
    if len([w for w in words if re.search(r"[^\W\d_]", w)]) < 0.8 * len(words):
        return "gopher_alphabetic"
    if len({w.lower() for w in words} & {"the", "be", "to", "of", "and", "that", "have", "with"}) < 2:
        return "gopher_stop_words"
    return None


def _document(rng: random.Random) -> str:
    kind = rng.choice(["ok", "short", "long_words", "hashes", "bullets", "ellipses", "numbers", "no_stop", "mixed"])
    words = [rng.choice(PROSE) for _ in range(rng.randint(55, 200))]
    if kind == "short":
        words = words[: rng.randint(1, 49)]
    elif kind == "long_words":
        words = ["extraordinarily" + w for w in words]
    elif kind == "hashes":
        words = [w + (" #tag" if rng.random() < 0.2 else "") for w in words]
    elif kind == "no_stop":
        words = [w for w in words if w not in ("the", "to", "and", "that", "have", "with", "of")] + ["the"] * 50
        words = [w if w != "the" else "river" for w in words][:-1] + ["the"]
    elif kind == "numbers":
        words = [w if rng.random() < 0.7 else str(rng.randint(100, 999)) for w in words]
    per_line = rng.randint(3, 12)
    lines = [" ".join(words[i : i + per_line]) for i in range(0, len(words), per_line)]
    if kind == "bullets":
        lines = [("• " if rng.random() < 0.95 else "") + ln for ln in lines]
    if kind == "ellipses":
        lines = [ln + ("..." if rng.random() < 0.5 else "") for ln in lines]
    if kind == "mixed":
        lines = [rng.choice(["- ", "", "* "]) + ln + rng.choice(["", "…", "."]) for ln in lines]
    return "\n".join(lines)


def test_drop_counts_by_reason_equal_the_reference():
    rng = random.Random(3)
    docs = [_document(rng) for _ in range(3000)]
    ours = Counter(gopher_quality(d) for d in docs)
    theirs = Counter(reference(d) for d in docs)
    assert ours == theirs
    assert len(ours) == 8 and min(ours.values()) >= 20, ours  # every rule dropped some, and some were kept
    assert all(gopher_quality(d) == reference(d) for d in docs)


def test_thresholds_are_options():
    text = " ".join(["the", "and"] + ["word"] * 10)
    assert gopher_quality(text) == "gopher_word_count"
    assert GopherQuality(min_words=5)(text) is None
