"""The Gopher quality rules (Rae et al. 2021, "Scaling Language Models: Methods, Analysis &
Insights from Training Gopher", appendix A.1.1), as a document filter: `gopher_quality(text)`
returns None to keep the document, or the reason of the first rule it fails.

| reason | drops a document... | default |
|---|---|---|
| `gopher_word_count` | with fewer than `min_words` or more than `max_words` words | 50, 100,000 |
| `gopher_word_length` | whose mean word length is outside [min, max] characters | 3, 10 |
| `gopher_symbols` | with more than `max_symbol_ratio` "#" or ellipses ("...", "…") per word | 0.1 |
| `gopher_bullets` | with more than `max_bullet_lines` of its lines starting with a bullet | 0.9 |
| `gopher_ellipsis_lines` | with more than `max_ellipsis_lines` of its lines ending with an ellipsis | 0.3 |
| `gopher_alphabetic` | with fewer than `min_alpha_words` of its words holding a letter | 0.8 |
| `gopher_stop_words` | with fewer than `min_stop_words` distinct STOP_WORDS (the, be, to, of, and...) | 2 |

Words are the text's whitespace-separated tokens with punctuation stripped from their ends
(those left empty are not words); lines are split on newlines, blank lines left out. Bullets:
•, ‣, ⁃, ◦, ▪, -, *, and "1." / "a)" style numbering is not a bullet.

Memory model: one document's words and lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STOP_WORDS = frozenset(("the", "be", "to", "of", "and", "that", "have", "with"))
BULLETS = ("•", "‣", "⁃", "◦", "▪", "-", "*")
ELLIPSES = ("...", "…")
_STRIP = "\"'()[]{}<>,.;:!?«»“”‘’"
_LETTER = re.compile(r"[^\W\d_]")  # a letter: a word character that is neither a digit nor _


def split_words(text: str) -> list[str]:
    """The text's words: whitespace-separated tokens with punctuation stripped from their ends,
    those left empty dropped."""
    return [w for w in (t.strip(_STRIP) for t in text.split()) if w]


@dataclass(frozen=True)
class GopherQuality:
    """The rule set's thresholds (the published ones by default)."""

    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_ratio: float = 0.1
    max_bullet_lines: float = 0.9
    max_ellipsis_lines: float = 0.3
    min_alpha_words: float = 0.8
    min_stop_words: int = 2

    def __call__(self, text: str) -> str | None:
        """None to keep `text`, else the reason (see the module docstring) of the first rule it fails."""
        words = split_words(text)
        n = len(words)
        if not self.min_words <= n <= self.max_words:
            return "gopher_word_count"
        mean = sum(len(w) for w in words) / n
        if not self.min_mean_word_length <= mean <= self.max_mean_word_length:
            return "gopher_word_length"
        symbols = text.count("#") + text.count("...") + text.count("…")
        if symbols / n > self.max_symbol_ratio:
            return "gopher_symbols"
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines and sum(line.startswith(BULLETS) for line in lines) / len(lines) > self.max_bullet_lines:
            return "gopher_bullets"
        if lines and sum(line.endswith(ELLIPSES) for line in lines) / len(lines) > self.max_ellipsis_lines:
            return "gopher_ellipsis_lines"
        if sum(1 for w in words if w.isalpha() or _LETTER.search(w)) / n < self.min_alpha_words:
            return "gopher_alphabetic"
        if len(STOP_WORDS.intersection(w.lower() for w in words)) < self.min_stop_words:
            return "gopher_stop_words"
        return None


gopher_quality = GopherQuality()
