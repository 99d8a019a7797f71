"""The tiktoken backend: tiktoken's Rust BPE over a vocabulary installed by `vocab`.

Memory model: one vocabulary (about 1-20 MB of ranks); encode_batch holds one batch's tokens.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..format import TOKEN_DTYPE
from .base import Tokenizer
from .vocab import cache_file, resolve


@contextmanager
def _tiktoken_cache(directory: Path) -> Iterator[None]:
    """Point tiktoken's own file cache at `directory` for the duration of a load."""
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(directory)
    try:
        yield
    finally:
        if old is None:
            del os.environ["TIKTOKEN_CACHE_DIR"]
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


class TiktokenTokenizer(Tokenizer):
    """The reference backend: tiktoken's Rust BPE, ordinary text only (no special tokens parsed).

    >>> tok = TiktokenTokenizer("gpt2")            # doctest: +SKIP
    >>> tokens, lengths = tok.encode_batch(["Hello world", "Bye"])
    """

    def __init__(self, spec: str = "gpt2") -> None:
        import tiktoken
        from tiktoken_ext import openai_public

        name, vocab, file = resolve(spec)
        with tempfile.TemporaryDirectory() as tmp:
            # tiktoken reads the ranks through its cache; give it a private one holding our
            # verified file, so nothing is downloaded and nothing is written elsewhere.
            os.symlink(file.resolve(), cache_file(vocab, Path(tmp)))
            with _tiktoken_cache(Path(tmp)):
                definition = getattr(openai_public, vocab.base)()
        definition["name"] = name
        self._enc = tiktoken.Encoding(**definition)
        self.name = name
        self.backend = "tiktoken"
        self.spec = spec
        self.base = vocab.base
        self.vocab_sha256 = vocab.sha256
        self.n_vocab = self._enc.n_vocab
        self.eot_id = self._enc.eot_token
        self.eot_token = "<|endoftext|>"
        self._tiktoken_version = getattr(tiktoken, "__version__", "unknown")

    def identity(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.backend,
            "base_encoding": self.base,
            "n_vocab": self.n_vocab,
            "eot_id": self.eot_id,
            "eot_token": self.eot_token,
            "bos_id": None,
            "ranks_sha256": self.vocab_sha256,
            "pat_str": self._enc._pat_str,
            "special_tokens": dict(self._enc._special_tokens),
            "tiktoken_version": self._tiktoken_version,
        }

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        # encode_to_numpy skips the Python list of ints (about 25% faster than encode_ordinary
        # here); disallowed_special=() makes "<|endoftext|>" in the text ordinary text.
        parts = [self._enc.encode_to_numpy(t, disallowed_special=()) for t in texts]
        lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        if not parts:
            return np.empty(0, TOKEN_DTYPE), lengths
        return np.concatenate(parts).astype(TOKEN_DTYPE, copy=False), lengths

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))
