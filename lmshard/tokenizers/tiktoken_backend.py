"""The tiktoken backend: tiktoken's Rust BPE over a vocabulary installed by `vocab`, or a ranks
file of another family with its pattern and special tokens (`families`).

Memory model: one vocabulary (about 1-20 MB of ranks); encode_batch holds one batch's tokens.
"""

from __future__ import annotations

import binascii
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TokenizerError
from ..format import TOKEN_DTYPE
from . import families
from .base import Tokenizer, utf8_safe
from .vocab import Vocabulary, read_verified, resolve


def read_ranks(file: Path, sha256: str) -> dict[bytes, int]:
    """A tiktoken ranks file (base64 token, space, rank per line), checked against `sha256`."""
    return parse_ranks(read_verified(file, sha256))


def parse_ranks(data: bytes) -> dict[bytes, int]:
    """The ranks in a tiktoken ranks file's bytes. About twice as fast as tiktoken's own loader,
    which matters for a small run's start."""
    a2b = binascii.a2b_base64
    return {a2b(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}


@contextmanager
def _ranks_from(file: Path | None, sha256: str) -> Iterator[None]:
    """tiktoken's encoding definitions (pattern, special tokens) with the ranks read from our
    verified file instead of tiktoken's download cache (or none at all: `file` None, for a
    backend that reads the file itself): nothing is fetched or written."""
    from tiktoken_ext import openai_public

    def load(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        return read_ranks(file, sha256) if file is not None else {}

    original = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = load
    try:
        yield
    finally:
        openai_public.load_tiktoken_bpe = original


def definition(spec: str, *, with_ranks: bool = True) -> tuple[str, Vocabulary, Path, dict[str, Any]]:
    """(name, vocabulary, its file, tiktoken's encoding definition) for a `--tokenizer` value;
    the definition's `mergeable_ranks` are empty unless `with_ranks`."""
    from tiktoken_ext import openai_public

    name, vocab, file = resolve(spec)
    with _ranks_from(file if with_ranks else None, vocab.sha256):
        found = getattr(openai_public, vocab.base)()
    found["name"] = name
    return name, vocab, file, found


def tiktoken_identity(tok: Tokenizer, base: str, pat_str: str, special_tokens: dict[str, int]) -> dict[str, Any]:
    """The identity every backend of a tiktoken vocabulary records alike (tokenizer_state.json)."""
    normalized = {"normalize": "NFC"} if getattr(tok, "nfc", False) else {}
    return {"name": tok.name, "backend": tok.backend, "base_encoding": base, "n_vocab": tok.n_vocab,
            "eot_id": tok.eot_id, "eot_token": tok.eot_token, "bos_id": tok.bos_id, "ranks_sha256": tok.vocab_sha256,
            "pat_str": pat_str, "special_tokens": dict(special_tokens), **normalized}  # fmt: skip


class TiktokenTokenizer(Tokenizer):
    """The reference backend: tiktoken's Rust BPE, ordinary text only (no special tokens parsed).

    >>> tok = TiktokenTokenizer("gpt2")            # doctest: +SKIP
    >>> tokens, lengths = tok.encode_batch(["Hello world", "Bye"])
    """

    def __init__(self, spec: str = "gpt2", *, separator: str | None = None) -> None:
        import tiktoken

        self.backend = "tiktoken"
        self.spec = spec
        self.nfc = False  # text encoded as given (a family's definition may ask for NFC)
        self._tiktoken_version = getattr(tiktoken, "__version__", "unknown")
        ranked = families.load(spec)
        if ranked is not None:
            self._from_family(tiktoken, ranked, separator)
            return
        name, vocab, _, found = definition(spec)
        self._enc = tiktoken.Encoding(**found)
        self.name = name
        self.base = vocab.base
        self.vocab_sha256 = vocab.sha256
        self.n_vocab = self._enc.n_vocab
        self.eot_id = self._enc.eot_token
        self.eot_token = "<|endoftext|>"

    def _from_family(self, tiktoken: Any, ranked: families.RanksVocabulary, separator: str | None) -> None:
        try:
            self._enc = tiktoken.Encoding(ranked.spec, pat_str=ranked.pattern, mergeable_ranks=parse_ranks(ranked.data),
                                          special_tokens=ranked.special_tokens)  # fmt: skip
        except ValueError as e:  # the pattern does not compile
            raise TokenizerError(f"{ranked.spec}: tiktoken refuses its split pattern ({e}); "
                                 f"correct \"pattern\" in {families.sidecar(ranked.file)}") from None  # fmt: skip
        families.describe(self, ranked, separator)
        self.base, self.nfc = ranked.kind, ranked.nfc

    def identity(self) -> dict[str, Any]:
        return {**tiktoken_identity(self, self.base, self._enc._pat_str, self._enc._special_tokens),
                "tiktoken_version": self._tiktoken_version}  # fmt: skip

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        # encode_to_numpy skips the Python list of ints (about 25% faster than encode_ordinary
        # here); disallowed_special=() makes "<|endoftext|>" in the text ordinary text. Unlike
        # encode_ordinary it refuses lone surrogates: those texts get encode_ordinary's repair.
        if self.nfc:
            texts = families.nfc(texts)
        try:
            parts = [self._enc.encode_to_numpy(t, disallowed_special=()) for t in texts]
        except UnicodeEncodeError:
            parts = [self._enc.encode_to_numpy(utf8_safe(t), disallowed_special=()) for t in texts]
        lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        if not parts:
            return np.empty(0, TOKEN_DTYPE), lengths
        return np.concatenate(parts).astype(TOKEN_DTYPE, copy=False), lengths

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))
