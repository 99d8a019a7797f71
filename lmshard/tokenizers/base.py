"""The tokenizer interface: what prepare, inspect and the demo need of any backend.

Memory model of a backend: its vocabulary, plus one batch's tokens during `encode_batch`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np


class Tokenizer(ABC):
    """What the pipeline needs of a tokenizer backend."""

    name: str  # the --tokenizer value as recorded ("gpt2", "cl100k_base", ...)
    backend: str  # which implementation encodes ("tiktoken")
    n_vocab: int  # ids are in [0, n_vocab)
    eot_id: int  # the document separator written before or after each document
    vocab_sha256: str  # sha256 of the vocabulary file: two tokenizers with equal hashes agree

    @abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(uint32 tokens of all texts back to back, int64 tokens per text); text that looks
        like a special token is encoded as ordinary text."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """Everything that pins the vocabulary: name, backend, n_vocab, eot_id, a sha256 of the
        vocabulary file, and backend details; written as tokenizer_state.json."""
