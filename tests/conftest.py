"""Shared fixtures. The independent truth for token ids is tiktoken's own `r50k_base` encoding
(GPT-2's vocabulary), loaded through tiktoken's own code path from the provisioned file."""

from __future__ import annotations

import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from lmshard.format import INDEX_DTYPE, TOKEN_DTYPE
from lmshard.tokenizers import VOCABULARIES, cache_dir

# Set before any test module imports `datasets` (huggingface_hub reads it once, at import), so it
# cannot be a fixture; `make test` exports it too. setdefault leaves a caller's choice alone.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
GPT2_EOT = 50256


@pytest.fixture(scope="session")
def reference():
    """tiktoken.get_encoding('r50k_base'), reading the vocabulary lmshard provisioned. Points
    TIKTOKEN_CACHE_DIR at it for the session and restores the variable afterwards."""
    import tiktoken

    directory = cache_dir()
    if not any(directory.glob("*")):
        pytest.fail(f"no vocabulary in {directory}: run `make setup` (lmshard tokenizer fetch gpt2)")
    assert VOCABULARIES["r50k_base"].sha256  # the file tiktoken verifies itself on load
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(directory))
        yield tiktoken.get_encoding("r50k_base")


@pytest.fixture
def eager_pool(monkeypatch):
    """prepare runs its stages in the worker pool however small the input (it would otherwise
    run a small input's in this process), so tests with --workers N exercise the pool, here and
    in the runs started as processes."""
    from lmshard.prepare.execution import plainplan

    monkeypatch.setattr(plainplan, "POOL_BYTES", 0)
    monkeypatch.setenv("LMSHARD_POOL_BYTES", "0")


@pytest.fixture
def small_items(monkeypatch):
    """Work items of about 2 KiB of input (not 1 MiB), 3 whole text files (not 256) or 16 parsed
    records (not 2,048), so that small test inputs span many items. The planner runs in the main
    process, so the patch holds for spawned workers too. prepare reports progress once per item:
    count the calls to check that a test's input really spans many."""
    import lmshard.prepare.documents.sources as sources

    monkeypatch.setattr(sources, "BLOCK_BYTES", 2048)
    monkeypatch.setattr(sources, "FILES_PER_ITEM", 3)
    monkeypatch.setattr(sources, "RECORDS_PER_ITEM", 16)


def read_docs(root: Path, split: str) -> list[np.ndarray]:
    """Every document of a split, read with numpy straight from the .bin/.idx files in shard
    order (shard files sorted by name), EOT separators included."""
    docs: list[np.ndarray] = []
    for bin_path in sorted((root / split).glob("shard_*.bin")):
        tokens = np.fromfile(bin_path, dtype=TOKEN_DTYPE)
        offsets = np.fromfile(bin_path.with_suffix(".idx"), dtype=INDEX_DTYPE)
        docs.extend(tokens[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True))
    return docs


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def traced_peak(fn: Callable[[], object]) -> int:
    """The peak of Python-traced memory while `fn` runs (numpy buffers included)."""
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.fixture
def no_network(monkeypatch):
    """Fail any attempt of this process to open a network connection: proves that an offline
    code path never tries the network (rather than timing it, which a slow machine would fail)."""
    import socket

    attempts: list[object] = []

    def refuse(self, address, *args, **kwargs):
        attempts.append(address)
        raise OSError(f"test: network connection to {address!r} attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 API server on loopback for the session (tests/servers.py), stopped by pid.
    Use `s3` for a test: it points the environment at this server."""
    from servers import S3Server

    server = S3Server()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch, request):
    """The S3 server with the AWS_* variables pointing at it, and a fresh bucket for this test.
    Returns (server, "s3://bucket")."""
    import re

    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    if s3_server.proc is None:  # a test stopped it: start it again
        s3_server.start()
    bucket = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + f"-{os.getpid() % 1000}"
    s3_server.make_bucket(bucket)
    return s3_server, f"s3://{bucket}"


@pytest.fixture
def http_server(tmp_path):
    """A byte-range HTTP file server on loopback serving tmp_path/www (tests/range_http.py)."""
    from servers import HttpServer

    root = tmp_path / "www"
    root.mkdir()
    server = HttpServer(root)
    server.start()
    yield server
    server.stop()

