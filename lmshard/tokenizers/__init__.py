"""Tokenizers behind one interface (`base.Tokenizer`), one module per backend, and the
vocabularies they load (`vocab`: known tiktoken vocabularies, the install directory, offline
fetch; `hf_backend`: Hugging Face tokenizer.json files, save_pretrained directories and hub
names resolved from the local cache).

`load_tokenizer(spec, backend)` picks the backend for a `--tokenizer` value:

- a tiktoken vocabulary (gpt2, r50k_base, …, or a .tiktoken file), or a ranks file of another
  family (`families`: `qwen:PATH`, `llama3:PATH`, or PATH with its definition in PATH.json):
  `tiktoken`, or `splintr` when installed (`lmshard[fast]`) and exact on the built-in sample of
  `gate`; `auto` takes splintr when it passes and falls back to tiktoken with a warning when it
  does not;
- a tokenizer.json file, a directory holding one, or a hub name (`org/name`): `tokenizers`, or
  `splintr` when installed and exact (`hf_fast`: splintr's loader of the same file, behind a
  gate against `tokenizers` on a sample built from the vocabulary), with the same `auto` rule.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..errors import TokenizerError
from .base import Tokenizer
from .families import is_ranks_spec, split_spec
from .sp_backend import is_sentencepiece_model
from .vocab import TOKENIZER_NAMES, VOCABULARIES, cache_dir, fetch

BACKENDS = ("auto", "tiktoken", "splintr", "tokenizers", "sentencepiece")


def is_hf_spec(spec: str) -> bool:
    """A Hugging Face tokenizer: a .json file, a directory, or a hub name such as org/name."""
    path = Path(spec)
    if spec.endswith(".tiktoken") or spec in TOKENIZER_NAMES or split_spec(spec) is not None:
        return False  # FAMILY:PATH is a ranks file (a hub name has no colon)
    return spec.endswith(".json") or path.is_dir() or ("/" in spec and not path.is_file())


def load_tokenizer(
    spec: str = "gpt2",
    backend: str = "auto",
    *,
    separator: str | None = None,
    warn: Callable[[str], None] | None = None,
    gated: bool = False,
    threads: int = 1,
    untrusted: bool = False,
    splintr_form: str | None = None,
) -> Tokenizer:
    """The backend for a `--tokenizer` value. Raises `TokenizerError`, naming the command that
    installs it, when the vocabulary is missing. `separator` names the special token written
    between documents (default: the vocabulary's own end-of-text token). `warn` receives the
    reason when `auto` falls back from the accelerated backend to tiktoken or tokenizers. `gated=True` skips the
    exactness gate: the caller ran it for this spec and backend in this run (prepare's workers).
    `threads`: how many threads a backend with its own thread pool (splintr, tokenizers) may use
    in this process: 1 in each of prepare's workers, which are the parallelism; tiktoken's
    per-text encode takes one thread whatever this says. `untrusted`: the spec was read from a
    dataset's metadata (see `hf_resolve.resolve`). `splintr_form`: with `gated`, how the run's
    splintr read a tokenizer.json ("ranks" or "json", `hf_fast`)."""
    if backend not in BACKENDS:
        raise TokenizerError(f"unknown tokenizer backend {backend!r}; use one of {', '.join(BACKENDS)}")
    if spec.endswith(".model") and split_spec(spec) is None and not Path(spec).exists():  # a path, not a hub name
        raise TokenizerError(f"{spec}: no such file")
    if is_sentencepiece_model(spec):
        if backend not in ("auto", "sentencepiece"):
            raise TokenizerError(f"{spec}: a SentencePiece model is encoded by the sentencepiece backend, "
                                 f"not {backend}")  # fmt: skip
        from .sp_backend import SentencePieceTokenizer

        return SentencePieceTokenizer(spec, separator=separator)
    if backend == "sentencepiece":
        raise TokenizerError(f"{spec} is not a SentencePiece model file; --tokenizer-backend sentencepiece takes one "
                             "(a tokenizer.model); use auto")  # fmt: skip
    if is_hf_spec(spec):
        if backend == "tiktoken":
            raise TokenizerError(f"{spec}: a Hugging Face tokenizer is encoded by the splintr or tokenizers backend, "
                                 "not tiktoken; use --tokenizer-backend auto, splintr or tokenizers")  # fmt: skip
        from .hf_fast import accelerated_hf

        return accelerated_hf(spec, backend=backend, warn=warn, gated=gated, threads=threads, separator=separator,
                              untrusted=untrusted, form_of_run=splintr_form)  # fmt: skip
    if backend == "tokenizers":
        raise TokenizerError(f"{spec} is a tiktoken vocabulary; use --tokenizer-backend tiktoken, splintr or auto")
    if separator not in (None, "<|endoftext|>") and not is_ranks_spec(spec):
        raise TokenizerError(f"{spec} separates documents with <|endoftext|> only, not {separator!r}")
    from .tiktoken_backend import TiktokenTokenizer

    if backend == "tiktoken":
        return TiktokenTokenizer(spec, separator=separator)
    from .gate import accelerated

    return accelerated(spec, required=backend == "splintr", warn=warn, gated=gated, threads=threads,
                       separator=separator)  # fmt: skip


__all__ = ["BACKENDS", "TOKENIZER_NAMES", "VOCABULARIES", "Tokenizer", "cache_dir", "fetch", "is_hf_spec",
           "load_tokenizer"]  # fmt: skip
