"""Tokenizers behind one interface (`base.Tokenizer`), one module per backend, and the
vocabularies they load (`vocab`: known vocabularies, the install directory, offline fetch).

`load_tokenizer(spec)` picks the backend for a `--tokenizer` value: tiktoken today; Hugging Face
`tokenizer.json` vocabularies and an accelerated exact backend join it as modules here.
"""

from __future__ import annotations

from .base import Tokenizer
from .vocab import TOKENIZER_NAMES, VOCABULARIES, cache_dir, fetch


def load_tokenizer(spec: str = "gpt2") -> Tokenizer:
    """The backend for a `--tokenizer` value (a known name or a vocabulary file). Raises
    `TokenizerError`, naming the command that installs it, when the vocabulary is missing."""
    from .tiktoken_backend import TiktokenTokenizer

    return TiktokenTokenizer(spec)


__all__ = ["TOKENIZER_NAMES", "VOCABULARIES", "Tokenizer", "cache_dir", "fetch", "load_tokenizer"]
