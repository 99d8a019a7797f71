"""SentencePiece `.model` files through the `sentencepiece` backend, on models trained here from
local text (no downloads). The independent truth for ids is Google's `sentencepiece` library
itself, loaded separately from the same file with its defaults."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lmshard.errors import TokenizerError
from lmshard.tokenizers import gate, load_tokenizer
from lmshard.tokenizers.base import utf8_safe
from lmshard.tokenizers.sp_backend import is_sentencepiece_model

sentencepiece = pytest.importorskip("sentencepiece")
REPO = Path(__file__).resolve().parent.parent


def _lines() -> list[str]:
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "docs").glob("*.md")))
    return [line for line in text.splitlines() if line.strip()] + [t for _, t in gate.sample()[:12]]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A Llama 2-shaped SentencePiece BPE: byte fallback, <unk> <s> </s>, trained on the docs."""
    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_lines()), model_writer=out, vocab_size=2000, model_type="bpe",
        byte_fallback=True, character_coverage=0.9995, split_digits=True, minloglevel=2,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("sp") / "tokenizer.model"
    path.write_bytes(out.getvalue())
    return path


def truth(model: Path, texts: list[str]) -> list[list[int]]:
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    return [sp.encode(utf8_safe(t), out_type=int) for t in texts]


def test_ids_equal_sentencepiece_and_specials_are_its_control_pieces(model):
    tok = load_tokenizer(str(model))
    assert (tok.backend, tok.vocab_format) == ("sentencepiece", "sentencepiece")
    assert (tok.eot_token, tok.bos_token, tok.adds_bos) == ("</s>", "<s>", True)
    texts = [*_lines()[:300], *(t for _, t in gate.sample()), "a</s>b <s> <unk>", "数字 12345 😀 \U0001f9ff"]
    tokens, lengths = tok.encode_batch(texts)
    assert len(lengths) == len(texts)
    got = np.split(tokens, np.cumsum(lengths)[:-1])
    want = truth(model, texts)
    for text, g, w in zip(texts, got, want, strict=True):
        assert g.tolist() == w, text[:80]
    assert tok.eot_id not in tokens and tok.bos_id not in tokens  # control pieces never come from text
    assert tok.decode(want[0]) == sentencepiece.SentencePieceProcessor(model_file=str(model)).decode(want[0])


def test_separator_must_be_a_control_piece(model):
    assert load_tokenizer(str(model), separator="<s>").eot_token == "<s>"
    with pytest.raises(TokenizerError, match="ordinary piece"):
        load_tokenizer(str(model), separator="the")
    with pytest.raises(TokenizerError, match="not a piece"):
        load_tokenizer(str(model), separator="<|nothing|>")
    with pytest.raises(TokenizerError, match="'<unk>' is an ordinary piece"):  # piece 0, the unknown piece
        load_tokenizer(str(model), separator="<unk>")


def test_a_model_path_that_names_nothing_is_no_such_file(no_network):
    for spec in ("bad/nonexistent.model", "nonexistent.model"):
        with pytest.raises(TokenizerError, match=f"^{spec}: no such file$"):
            load_tokenizer(spec)


def test_the_sentencepiece_backend_takes_only_a_model_file(model):
    with pytest.raises(TokenizerError, match="not a SentencePiece model file"):
        load_tokenizer("gpt2", "sentencepiece")
    with pytest.raises(TokenizerError, match="encoded by the sentencepiece backend, not tokenizers"):
        load_tokenizer(str(model), "tokenizers")


def test_a_tiktoken_file_named_tokenizer_model_is_not_taken_for_sentencepiece(tmp_path, model):
    ranks = tmp_path / "tokenizer.model"
    ranks.write_bytes(b"IQ== 0\nIg== 1\n")
    assert not is_sentencepiece_model(str(ranks))
    assert is_sentencepiece_model(str(model))
    versioned = tmp_path / "tokenizer.model.v3"  # as mistral-common names its files
    versioned.write_bytes(model.read_bytes())
    assert load_tokenizer(str(versioned)).backend == "sentencepiece"
    damaged = tmp_path / "damaged.model"
    damaged.write_bytes(model.read_bytes()[:100])
    with pytest.raises(TokenizerError, match="not a SentencePiece model"):
        load_tokenizer(str(damaged))


def test_prepare_writes_bos_text_eot_per_document(tmp_path, model):
    docs = _lines()[:400]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "lmshard", "prepare", str(src), "--out", str(out), "--tokenizer", str(model),
           "--workers", "2", "--dedup", "none", "--no-normalize", "--val-fraction", "0"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / "dataset_metadata.json").read_text())
    assert (meta["tokenizer"]["backend"], meta["tokenizer"]["vocab_format"]) == ("sentencepiece", "sentencepiece")
    stream = np.concatenate([np.fromfile(p, dtype=np.uint32) for p in sorted((out / "train").glob("*.bin"))])
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    bos, eos = sp.bos_id(), sp.eos_id()
    want = [x for d in docs for x in [bos, *sp.encode(d, out_type=int), eos]]
    assert stream.tolist() == want
    check = subprocess.run([sys.executable, "-m", "lmshard", "inspect", str(out)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # The dataset keeps the model (inspect decodes with it anywhere), checked against the metadata.
    assert (out / "tokenizer.model").read_bytes() == model.read_bytes()
    sample = subprocess.run([sys.executable, "-m", "lmshard", "inspect", str(out), "--sample", "1"],
                            capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert sample.returncode == 0 and "undecoded" not in sample.stdout, sample.stdout + sample.stderr
    assert any(all(w in sample.stdout for w in d.split()[:4]) for d in docs if len(d.split()) >= 4), sample.stdout
    damaged = bytearray(model.read_bytes())
    damaged[-1] ^= 1
    (out / "tokenizer.model").write_bytes(bytes(damaged))
    check = subprocess.run([sys.executable, "-m", "lmshard", "inspect", str(out)], capture_output=True, text=True)
    assert check.returncode != 0 and "tokenizer.model" in check.stdout + check.stderr, check.stdout + check.stderr
