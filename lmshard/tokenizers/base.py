"""The tokenizer interface: what prepare, inspect and the demo need of any backend.

Backends: `tiktoken` (the reference for tiktoken vocabularies), `splintr` (an accelerated exact
encoder of the same vocabularies, admitted only after the exactness gate in `gate`), and
`tokenizers` (Hugging Face `tokenizer.json` vocabularies: Llama 3, Qwen, Mistral, GPT-NeoX…).

Memory model of a backend: its vocabulary, plus one batch's tokens during `encode_batch`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..format import TOKEN_DTYPE


class Tokenizer(ABC):
    """What the pipeline needs of a tokenizer backend."""

    name: str  # the --tokenizer value as recorded ("gpt2", "cl100k_base", a hub name, a path)
    backend: str  # which implementation encodes ("tiktoken", "splintr", "tokenizers")
    n_vocab: int  # ids are in [0, n_vocab)
    eot_id: int  # the document separator written after (or before) each document
    eot_token: str  # its text, e.g. "<|endoftext|>", "<|end_of_text|>", "</s>"
    bos_id: int | None = None  # the vocabulary's beginning-of-sequence token, if it has one
    bos_token: str | None = None
    adds_bos: bool = False  # the tokenizer's own configuration puts a BOS before each text (Llama, Mistral)
    vocab_sha256: str  # sha256 of the vocabulary file: two tokenizers with equal hashes agree
    vocab_format: str = "tiktoken"  # that file's format: "tiktoken" (ranks) or "tokenizer.json" (Hugging Face)
    vocab_file: Path | None = None  # a file the dataset keeps a copy of so inspect can decode (tokenizer.json)
    vocab_bytes: bytes | None = None  # that file's bytes exactly as hashed into vocab_sha256: the copy to write

    @abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(uint32 tokens of all texts back to back, int64 tokens per text). No special tokens
        are added, and text that looks like a special token is encoded as ordinary text."""

    def encode(self, text: str) -> list[int]:
        """The ids of one text, as `encode_batch` gives them (no special tokens, no separator)."""
        tokens, _ = self.encode_batch([text])
        return [int(t) for t in tokens]

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str: ...

    def use_threads(self, threads: int) -> None:  # noqa: B027  (a no-op unless the backend has a pool)
        """How many threads this process's encode calls may use from now on: a worker forked
        from prepare's main process inherits its tokenizer, loaded for the main process's
        threads, and sets 1. Backends without a thread pool (tiktoken) ignore it."""

    def load_for_forks(self) -> None:  # noqa: B027  (a no-op for backends that load everything up front)
        """Load now what this process's first encode would load, so that workers forked after
        it share it (copy-on-write) instead of each loading its own. Only where loading starts
        no thread: the caller checks that it may still fork."""

    def special_identity(self) -> dict[str, Any]:
        """The identity fields every backend records alike: name, backend, size, separator, BOS
        and the vocabulary's hash (under the schema's key `ranks_sha256`)."""
        return {"name": self.name, "backend": self.backend, "n_vocab": self.n_vocab, "eot_id": self.eot_id,
                "eot_token": self.eot_token, "bos_id": self.bos_id, "bos_token": self.bos_token,
                "adds_bos": self.adds_bos, "ranks_sha256": self.vocab_sha256}  # fmt: skip

    @abstractmethod
    def identity(self) -> dict[str, Any]:
        """Everything that pins the vocabulary: name, backend, n_vocab, eot_id, bos_id, a sha256
        of the vocabulary file (key `ranks_sha256`), and backend details; written as
        tokenizer_state.json."""


def flatten(ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-text id lists as (uint32 tokens back to back, int64 tokens per text): one numpy array
    per text, then one concatenate (measured faster than fromiter over a chain of all ids or
    array(list(...)) on 1 MiB batches, about 2% of encoding time)."""
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    if not len(ids):
        return np.empty(0, TOKEN_DTYPE), lengths
    return np.concatenate([np.asarray(i, dtype=TOKEN_DTYPE) for i in ids]), lengths


def utf8_safe(text: str) -> str:
    """`text` as tiktoken's `encode_ordinary` encodes it: a surrogate pair written as two code
    points becomes the character it spells, each lone surrogate becomes U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
