"""The splintr backend: splintr's Rust BPE (`splintr-rs`, the `fast` extra) over the same
sha256-verified tiktoken vocabularies as the tiktoken backend (OpenAI's, and the ranks files of
`families`), producing the same token ids about five times faster per core.

It is admitted by the exactness gate (`gate.accelerated`), never trusted blindly. What makes it
exact, measured against tiktoken 0.14 with splintr-rs 0.22.0 (see tests/test_fast_backend.py):

- the split pattern is splintr's own constant for the base encoding (`GPT2_PATTERN` for r50k
  and p50k, `CL100K_BASE_PATTERN`, `O200K_BASE_PATTERN`). splintr's regex engine rejects
  tiktoken's possessive quantifiers, and an equivalent pattern spelled any other way goes
  through that engine's Unicode 17 tables, which know 4,657 code points that tiktoken's tables
  leave unassigned (so "\\u088f's" splits differently). splintr recognises its constants and
  runs a pre-tokenizer that agrees with tiktoken on every code point. A vocabulary of `families`
  is taken only when its pattern is, character for character, one of splintr's constants
  (`splintr_constant`), which splintr is then given;
- special tokens are never matched in the text: `encode_batch_flat` of a tokenizer built from
  ranks bytes treats "<|endoftext|>" as ordinary text, as tiktoken's `encode_ordinary` does;
- text that UTF-8 cannot hold (lone surrogates, which splintr refuses with UnicodeEncodeError)
  is repaired exactly as tiktoken's `encode_ordinary` repairs it (`utf8_safe`).

Nothing is downloaded: splintr gets the bytes of our verified ranks file (`from_bytes`), never a
model name (`from_pretrained` loads splintr's bundled copies, not the file lmshard verified).

Threads: `encode_batch_flat` releases the GIL (single-text calls hold it) and spreads a batch
of 32 KiB of text or more over splintr's Rayon pool. prepare runs one tokenizer per worker
process, so the pool gets one thread per process by default (`threads=1`): two processes of one
thread each encode as fast as one process of two threads on two cores, and oversubscribing is
slower. The pool starts at a process's first encode, sized by the tokenizer that makes it, which
Rayon reads once from RAYON_NUM_THREADS (a value the user exported wins over `threads`). Until
then the process runs no extra thread, so prepare can fork workers that inherit the loaded
tokenizer (`use_threads(1)` in each) instead of loading their own.

Memory model: splintr's tables for one vocabulary (resident size grows by about 15 MB for
r50k, 24 MB for cl100k, 39 MB for o200k), its cache of recently encoded pieces, and one batch's
output: 4 bytes per token plus 8 bytes per text, returned to the caller without a copy.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import TokenizerError
from ..format import TOKEN_DTYPE
from . import families
from .base import Tokenizer, utf8_safe
from .tiktoken_backend import definition, tiktoken_identity
from .vocab import read_verified, resolve

# tiktoken base encoding -> the name of splintr's pattern constant that reproduces its split.
# r50k and p50k share tiktoken's r50k_pat_str; cl100k and o200k were checked on every code point
# and the linux-docs corpus against ranks rebuilt byte-exact (matching sha256) from splintr's
# bundled copies. Vocabularies not listed here are refused.
SPLINTR_PATTERNS = {
    "r50k_base": "GPT2_PATTERN",
    "p50k_base": "GPT2_PATTERN",
    "cl100k_base": "CL100K_BASE_PATTERN",
    "o200k_base": "O200K_BASE_PATTERN",
}

_pool_lock = threading.Lock()
_pool_threads: int | None = None  # the Rayon pool size of this process, once splintr started it
_pool_pid = 0  # the process that started it: a process forked from it inherits the count, not the threads


def pool_lost() -> bool:
    """True in a process forked after its parent started splintr's pool: the pool's threads
    did not come along, and a parallel encode here would wait on them for ever. Such a
    process must encode with another backend (`lmshard.streaming` switches to tiktoken's or
    tokenizers', which give the same ids)."""
    return _pool_threads is not None and _pool_pid != os.getpid()


@contextlib.contextmanager
def _rayon_threads(threads: int) -> Iterator[int]:
    """RAYON_NUM_THREADS set to `threads` (or the user's own value, which wins) for the block;
    yields the size set. Rayon sizes this process's pool once, from the environment, when the
    pool starts."""
    user = os.environ.get("RAYON_NUM_THREADS")
    wanted = int(user) if user and user.isdigit() and int(user) > 0 else threads
    os.environ["RAYON_NUM_THREADS"] = str(wanted)
    try:
        yield wanted
    finally:
        if user is None:
            del os.environ["RAYON_NUM_THREADS"]
        else:
            os.environ["RAYON_NUM_THREADS"] = user


def _start_pool(encoder: Any, threads: int) -> int:
    """Start splintr's Rayon pool with `threads` threads unless it runs already (or the user set
    RAYON_NUM_THREADS); return its size. The pool starts at the first parallel call, so the
    variable is set around that first call only. splintr goes parallel only for batches of
    32 KiB of text or more, hence the 64 KiB of "a " (2 ms with the thread's start)."""
    global _pool_threads, _pool_pid
    with _pool_lock:
        if _pool_threads is None:
            with _rayon_threads(threads) as wanted:
                encoder.encode_batch_flat(["a " * (1 << 15)])
            _pool_threads, _pool_pid = wanted, os.getpid()
        return _pool_threads


def load_pooled(load: Callable[[], Any], threads: int) -> Any:
    """`load()`, a splintr loader that may start this process's pool itself (its tokenizer.json
    reader does), run so that the pool gets `threads` threads as `_start_pool` would give it."""
    global _pool_threads, _pool_pid
    with _pool_lock:
        if _pool_threads is not None:
            return load()
        with _rayon_threads(threads) as wanted:
            encoder = load()
            encoder.encode_batch_flat(["a " * (1 << 15)])
        _pool_threads, _pool_pid = wanted, os.getpid()
        return encoder


def splintr_encode(encoder: Any, texts: Sequence[str], threads: int) -> tuple[np.ndarray, np.ndarray]:
    """`Tokenizer.encode_batch` through any splintr encoder (a tiktoken vocabulary's, or the
    one splintr loads from a tokenizer.json), in one GIL-free call, starting this process's
    pool with `threads` threads if no encode started it yet. The tokens are a read-only view of
    splintr's output buffer (no copy)."""
    if _pool_threads is None:
        _start_pool(encoder, threads)
    try:
        ids, offsets = encoder.encode_batch_flat(texts)
    except UnicodeEncodeError:  # rare: a lone surrogate somewhere in the batch
        ids, offsets = encoder.encode_batch_flat([utf8_safe(t) for t in texts])
    tokens = np.frombuffer(ids, dtype=TOKEN_DTYPE)
    lengths = np.diff(np.frombuffer(offsets, dtype="<u8")).astype(np.int64)
    return tokens, lengths


def splintr_constant(pattern: str) -> str | None:
    """The name of splintr's pattern constant spelled exactly as `pattern`, if there is one."""
    import splintr

    return next((n for n in sorted(dir(splintr)) if n.endswith("_PATTERN") and getattr(splintr, n) == pattern), None)


def _last_rank(ranks: bytes) -> int:
    """The highest rank of a tiktoken ranks file, which lists its tokens in rank order."""
    last = ranks.rstrip().rsplit(b"\n", 1)[-1]
    return int(last.split()[1])


class SplintrTokenizer(Tokenizer):
    """splintr's BPE on a tiktoken vocabulary, ordinary text only; same ids as the tiktoken
    backend. Load it through `load_tokenizer(spec, "auto" | "splintr")`, which runs the gate.

    >>> tok = SplintrTokenizer("gpt2")            # doctest: +SKIP
    >>> tokens, lengths = tok.encode_batch(["Hello world", "Bye"])
    """

    def __init__(self, spec: str = "gpt2", *, threads: int = 1, separator: str | None = None) -> None:
        import splintr

        if threads < 1:
            raise TokenizerError(f"splintr threads must be at least 1, not {threads}")
        self.backend = "splintr"
        self.spec = spec
        self.threads = threads  # the pool size asked for: the pool starts at this process's first encode
        self.nfc = False  # text encoded as given (a family's definition may ask for NFC)
        self._splintr_version = getattr(splintr, "__version__", "unknown")
        ranked = families.load(spec)
        if ranked is not None:
            self._from_family(splintr, ranked, separator)
            return
        name, vocab, file = resolve(spec)  # the checks first: tiktoken's definition is read after
        if vocab.base not in SPLINTR_PATTERNS:
            raise TokenizerError(f"{spec}: the splintr backend has no exact pattern for {vocab.base}; "
                                 "use --tokenizer-backend tiktoken")  # fmt: skip
        # The pattern and special tokens, without tiktoken parsing the ranks (splintr parses its
        # bytes itself): about 0.1 s saved for r50k, 0.3 s for o200k.
        _, _, _, found = definition(spec, with_ranks=False)
        ranks = read_verified(file, vocab.sha256)
        self.splintr_pattern: str = getattr(splintr, SPLINTR_PATTERNS[vocab.base])
        self._special_tokens: dict[str, int] = dict(found["special_tokens"])
        self._encoder = splintr.Tokenizer.from_bytes(ranks, self.splintr_pattern, self._special_tokens)
        self.name = name
        self.base = vocab.base
        self.vocab_sha256 = vocab.sha256
        self.pat_str: str = found["pat_str"]  # tiktoken's pattern, whose split this reproduces
        self.n_vocab = found.get("explicit_n_vocab") or max(_last_rank(ranks), *self._special_tokens.values()) + 1
        self.eot_token = "<|endoftext|>"
        self.eot_id = self._special_tokens[self.eot_token]

    def _from_family(self, splintr: Any, ranked: families.RanksVocabulary, separator: str | None) -> None:
        constant = splintr_constant(ranked.pattern)
        if constant is None:
            raise TokenizerError(f"{ranked.spec}: the splintr backend has no exact pattern for this vocabulary's "
                                 "split pattern (it is none of splintr's own); "
                                 "use --tokenizer-backend tiktoken")  # fmt: skip
        self.splintr_pattern = getattr(splintr, constant)
        self._special_tokens = dict(ranked.special_tokens)
        self._encoder = splintr.Tokenizer.from_bytes(ranked.data, self.splintr_pattern, self._special_tokens)
        families.describe(self, ranked, separator)
        self.base, self.pat_str, self.nfc = ranked.kind, ranked.pattern, ranked.nfc

    def identity(self) -> dict[str, Any]:
        return {**tiktoken_identity(self, self.base, self.pat_str, self._special_tokens),
                "splintr_pattern": self.splintr_pattern, "splintr_version": self._splintr_version}  # fmt: skip

    def use_threads(self, threads: int) -> None:
        if _pool_threads is None:  # later, the pool this process started keeps its size
            self.threads = threads

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """As `Tokenizer.encode_batch`, in one GIL-free splintr call (`splintr_encode`)."""
        return splintr_encode(self._encoder, families.nfc(texts) if self.nfc else texts, self.threads)

    def decode(self, ids: Sequence[int]) -> str:
        # tiktoken's decode: the tokens' bytes as UTF-8, invalid sequences as U+FFFD
        return bytes(self._encoder.decode_bytes(list(ids))).decode("utf-8", errors="replace")
