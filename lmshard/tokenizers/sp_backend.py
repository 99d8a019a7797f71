"""The `sentencepiece` backend: a SentencePiece model file (`tokenizer.model` of Llama 2, Mistral
v0.1-v0.3, Gemma…), encoded by Google's `sentencepiece` library, which defines the format
(the `sentencepiece` extra). Its own normalization, byte fallback and whitespace rules apply
unchanged; ordinary text only.

Special tokens: the model's control pieces (`<s>`, `</s>`, `<bos>`, `<eos>`…), which the library
never produces from text, so text such as "</s>" inside a document stays ordinary text, as for
every backend. The separator is `--separator` (a control piece) or the model's EOS piece; the
BOS is its BOS piece, written before each document by `--bos auto`: SentencePiece models of
these families are used with a BOS before every text (Hugging Face's `add_bos_token` default for
Llama and Gemma), and a `.model` file carries no configuration saying otherwise (`--bos no`
turns it off).

A dataset keeps a copy of the model file (`tokenizer.model`), which `inspect` checks against
the metadata's sha256 and decodes with.

Not accelerated: the same model's `tokenizer.json`, where one exists (Mistral's, Gemma's), runs
through splintr once the gate admits it (docs/tokenizers.md).

Memory model: the model file (0.5-5 MB) and the library's tables for it; during `encode_batch`
one batch's Python id lists (about 40 bytes a token) and the uint32 result (4 bytes a token).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TokenizerError, missing_dependency
from .base import Tokenizer, flatten, utf8_safe


def is_sentencepiece_model(spec: str) -> bool:
    """A SentencePiece model file, whatever its name (`tokenizer.model`, Mistral's
    `tokenizer.model.v3`): a protocol buffer, whose first byte is the pieces field's tag (0x0A),
    where a tiktoken ranks file (Meta's Llama 3 tokenizer.model too) starts with base64 and a
    tokenizer.json with "{"."""
    path = Path(spec)
    if spec.endswith((".json", ".tiktoken")) or not path.is_file():
        return False
    try:
        with path.open("rb") as f:
            return f.read(1) == b"\n"
    except OSError:
        return False


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece `.model` file through the `sentencepiece` library.

    >>> tok = SentencePieceTokenizer("mistral/tokenizer.model")     # doctest: +SKIP
    >>> tok.eot_token, tok.bos_token, tok.adds_bos
    ('</s>', '<s>', True)
    """

    def __init__(self, spec: str, *, separator: str | None = None) -> None:
        try:
            import sentencepiece
        except ImportError:
            raise missing_dependency("sentencepiece", "sentencepiece", f"the SentencePiece model {spec}") from None
        path = Path(spec)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise TokenizerError(f"{path}: cannot read ({e.strerror or e})") from None
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_proto=data)
        except Exception as e:  # the library's RuntimeError (or a parse error) for a damaged file
            why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            raise TokenizerError(f"{path}: not a SentencePiece model this sentencepiece version can load "
                                 f"({why})") from None  # fmt: skip
        self.name, self.spec, self.backend, self.vocab_format = spec, spec, "sentencepiece", "sentencepiece"
        self.vocab_sha256 = hashlib.sha256(data).hexdigest()
        self.vocab_file, self.vocab_bytes = path, data  # the dataset keeps a copy (tokenizer.model) to decode with
        self.n_vocab = int(self._sp.get_piece_size())
        self._version = getattr(sentencepiece, "__version__", "unknown")
        self._specials = {self._sp.id_to_piece(i): i for i in range(self.n_vocab) if self._sp.is_control(i)}
        self._choose_specials(separator)

    def _choose_specials(self, separator: str | None) -> None:
        eos, bos = self._sp.eos_id(), self._sp.bos_id()
        if separator is not None:
            if separator not in self._specials:
                unknown = self._sp.piece_to_id(separator) == self._sp.unk_id() and separator != self._sp.id_to_piece(
                    self._sp.unk_id())  # fmt: skip
                kind = "not a piece" if unknown else "an ordinary piece"
                raise TokenizerError(f"{self.name}: separator {separator!r} is {kind} of this model; pass a control "
                                     f"piece, one of: {', '.join(self._specials) or '(none)'}")  # fmt: skip
            self.eot_token = separator
        elif eos >= 0:
            self.eot_token = self._sp.id_to_piece(eos)
        else:
            raise TokenizerError(f"{self.name}: the model has no EOS piece to separate documents; pass --separator "
                                 f"PIECE, one of: {', '.join(self._specials) or '(none)'}")  # fmt: skip
        self.eot_id = self._specials.get(self.eot_token, eos)
        self.bos_id = bos if bos >= 0 else None
        self.bos_token = self._sp.id_to_piece(bos) if bos >= 0 else None
        self.adds_bos = self.bos_id is not None

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        # One thread: prepare's worker processes are the parallelism.
        return flatten(self._sp.encode([utf8_safe(t) for t in texts], out_type=int, num_threads=1))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._sp.decode([int(i) for i in ids]))

    def identity(self) -> dict[str, Any]:
        return {
            **self.special_identity(),
            "special_tokens": dict(sorted(self._specials.items(), key=lambda kv: kv[1])),
            "sentencepiece_version": self._version,
        }
