"""Language identification as a document filter, taking arguments: `--filter language=CODES`
or `language=CODES:MIN`. CODES are one or more comma-separated language codes (ISO 639, as the
model names them: `en`, `de`, `zh`...); MIN is a probability from 0 to 1.

| reason | drops a document when |
|---|---|
| `language_not_<codes>` (`language_not_en`, `language_not_en_de`) | its most likely language is not one of CODES |
| `language_low_score` | it is, with a probability below MIN (default 0: no threshold) |

The model is py3langid's (Lui & Baldwin's langid.py: naive Bayes over byte n-grams, 140
languages, shipped inside the package; nothing is downloaded). It reads the whole text; its
probabilities are normalised over all its languages, the scores scaled by one over the square
root of the text's length in bytes so that they stay comparable across lengths.

Memory model: the model (about 110 MB), loaded once per process on first use; per document, its
UTF-8 bytes and n-gram counts.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@functools.cache
def identifier() -> Any:
    """py3langid's identifier with normalised probabilities, loaded once per process."""
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError:
        raise ConfigError("--filter language needs the py3langid package: pip install 'lmshard[lang]'") from None
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


@dataclass(frozen=True)
class LanguageFilter:
    """Keep a document whose most likely language is one of `languages`, with a probability of
    at least `min_score`."""

    languages: tuple[str, ...]
    min_score: float = 0.0

    @functools.cached_property
    def not_listed(self) -> str:
        reason = "language_not_" + "_".join(self.languages)
        return reason if len(reason) <= 64 else "language_not_listed"  # a reason is at most 64 characters

    def __call__(self, text: str) -> str | None:
        language, score = identifier().classify(text)
        if language not in self.languages:
            return self.not_listed
        if score < self.min_score:
            return "language_low_score"
        return None


def language_filter(name: str, args: str) -> LanguageFilter:
    """The filter `name` = `language=ARGS` (see the module docstring); ConfigError, one line,
    for arguments it cannot read or a code the model does not know."""
    codes, _, score = args.partition(":")
    languages = tuple(code.strip() for code in codes.split(",") if code.strip())
    if not languages:
        raise ConfigError(f"--filter {name}: name the languages to keep, such as language=en or language=en,de:0.65")
    labels = identifier().labels
    unknown = [code for code in languages if code not in labels]
    if unknown:
        raise ConfigError(f"--filter {name}: the model knows no language {unknown[0]!r}; it knows "
                          f"{', '.join(sorted(labels))}")  # fmt: skip
    try:
        min_score = float(score) if score else 0.0
    except ValueError:
        min_score = -1.0
    if not 0.0 <= min_score <= 1.0:
        raise ConfigError(f"--filter {name}: the minimum probability after ':' must be a number from 0 to 1, "
                          f"not {score!r}")  # fmt: skip
    return LanguageFilter(languages, min_score)
