"""The C4 cleaning rules (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a
Unified Text-to-Text Transformer", section 2.2, with the thresholds of the code that built C4) as
a document filter that edits: `c4_quality(text)` keeps a document with the lines that fail a line
rule removed (an `Edit`), or returns the reason of the document rule it fails.

Each line (`str.splitlines`) is stripped, then, in this order, a line that:

| rule | ... | is | default |
|---|---|---|---|
| `c4_long_word` | holds a word (whitespace-separated) over `max_word_length` characters | removed | 1,000 |
| citations | holds `[1]`, `[]`, `[edit]` or `[citation needed]` | stripped of them | |
| `c4_end_mark` | does not end in `.` `?` `!` `"`, or ends in `...` | removed | |
| `c4_short_line` | has fewer than `min_words_per_line` words | removed | 5 |
| `c4_lorem_ipsum` | holds "lorem ipsum" (any case) | dropped with its document | |
| `c4_javascript` | holds "javascript" (any case) | removed | |
| `c4_curly_bracket` | holds "{" | dropped with its document | |
| `c4_policy` | holds one of `POLICY` (any case: "terms of use", "uses cookies"...) | removed | |

The removed lines of a kept document are counted by rule (the `Edit`'s `removed`: prepare's
`line_drops`, with the first line each rule removed).

A rule sees only the lines the rules above it kept: a "{" on a line without an end mark does
not drop the document. Then a document whose kept lines hold fewer than `min_sentences`
sentences (3) is dropped as `c4_too_few_sentences`; the kept lines joined by newlines are its new
text. Sentences are counted per kept line as its sentence ends (a run of `.` `!` `?`, closing
quotes or brackets after it, then a space or the line's end), at least one a line; C4 counted
them with NLTK's punkt, which also knows abbreviations ("Dr. Smith" is one sentence there, two
here).

Memory model: one document's lines and the kept ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .edit import Edit

END_MARKS = (".", "?", "!", '"')
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
_CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)")


@dataclass(frozen=True)
class C4Quality:
    """The rule set's thresholds (C4's by default; datatrove's C4QualityFilter uses
    `min_words_per_line=3, min_sentences=5`)."""

    min_words_per_line: int = 5
    min_sentences: int = 3
    max_word_length: int = 1000

    def __call__(self, text: str) -> Edit | str | None:
        """The kept lines as an `Edit` (None when that is `text` itself), or the reason the
        document is dropped (see the module docstring)."""
        kept: list[str] = []
        removed: dict[str, tuple[int, str]] = {}
        sentences = 0
        for line in text.splitlines():
            line = line.strip()
            if len(line) > self.max_word_length and any(len(w) > self.max_word_length for w in line.split()):
                _count(removed, "c4_long_word", line)
                continue
            line = _CITATION.sub("", line)  # not stripped again, as in C4: "end. [1]" has no end mark
            if not line.endswith(END_MARKS) or line.endswith("..."):
                _count(removed, "c4_end_mark", line)
                continue
            if len(line.split()) < self.min_words_per_line:
                _count(removed, "c4_short_line", line)
                continue
            lower = line.lower()
            if "lorem ipsum" in lower:
                return "c4_lorem_ipsum"
            if "javascript" in lower:
                _count(removed, "c4_javascript", line)
                continue
            if "{" in line:
                return "c4_curly_bracket"
            if any(p in lower for p in POLICY):
                _count(removed, "c4_policy", line)
                continue
            sentences += max(1, len(_SENTENCE_END.findall(line)))
            kept.append(line)
        if sentences < self.min_sentences:
            return "c4_too_few_sentences"
        edited = "\n".join(kept).strip()
        return None if edited == text else Edit(edited, removed)


def _count(removed: dict[str, tuple[int, str]], reason: str, line: str) -> None:
    n, first = removed.get(reason, (0, line))
    removed[reason] = (n + 1, first)


c4_quality = C4Quality()
