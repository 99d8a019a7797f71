"""tiktoken-format ranks files that are not OpenAI's (`lmshard.tokenizers.families`): Qwen's and
Llama 3's shapes by family name, and any other with a PATH.json definition beside it. The ranks
files are built here from the r50k ranks `make setup` provisions, cut to their first few
thousand ranks (a valid BPE: every merge's parts rank lower). The independent truth is tiktoken's
own `Encoding(name, pat_str, mergeable_ranks, special_tokens).encode_ordinary`, on NFC text for
Qwen, with the patterns as Qwen and Meta publish them."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import splintr
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import TokenizerError
from lmshard.tokenizers import VOCABULARIES, cache_dir, families, gate, is_hf_spec, load_tokenizer
from lmshard.tokenizers import splintr_backend as backend
from lmshard.tokenizers.vocab import cache_file

# As published: Qwen's PAT_STR (tokenization_qwen.py) and Meta's Llama 3 pat_str (tokenizer.py).
QWEN_PAT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
LLAMA3_PAT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
N_RANKS = {"qwen": 151_643, "llama3": 128_000}  # the families' files' sizes, which lmshard checks
N_REAL = {"qwen": 5000, "llama3": 6000}  # of them, the first r50k ranks; the rest cannot occur in text
TEXTS = ["Hello world, it's 2024-06-07: 1234567 tokens!", "Cafe\u0301 \u212b \u00c5 A\u030a e\u0301\u0301",
         "<|endoftext|> <|im_start|> <|begin_of_text|> <|eot_id|>", "  \n\n\tindent\r\n", "日本語 😀 ﬁ", "",
         "\ud800 lone surrogate", "I'LL don't WE'VE"]  # fmt: skip


def _ranks_file(path: Path, family: str | int) -> Path:
    """A ranks file of the family's size (or of `family` ranks, all r50k's): its first ranks
    r50k's, the rest tokens starting with the bytes FF FE, which UTF-8 text never holds (so no
    text reaches them)."""
    r50k = cache_file(VOCABULARIES["r50k_base"], cache_dir()).read_bytes().splitlines()
    real, size = (family, family) if isinstance(family, int) else (N_REAL[family], N_RANKS[family])
    filler = (base64.b64encode(b"\xff\xfe" + i.to_bytes(3, "big")) + b" %d" % i for i in range(real, size))
    path.write_bytes(b"\n".join([*r50k[:real], *filler]) + b"\n")
    return path


def _vocab_sha256(path: Path, family: str) -> str:
    """The ranks file's sha256 followed by the definition: pattern, special tokens, normalization."""
    pattern = QWEN_PAT if family == "qwen" else LLAMA3_PAT
    definition = {"pattern": pattern, "special_tokens": _specials(family), "nfc": family == "qwen"}
    return hashlib.sha256(path.read_bytes() + json.dumps(definition, sort_keys=True).encode()).hexdigest()


def _truth(path: Path, pattern: str, specials: dict[str, int], nfc: bool = False):
    ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in path.read_bytes().splitlines())}
    enc = tiktoken.Encoding(path.name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    return lambda text: enc.encode_ordinary(unicodedata.normalize("NFC", text) if nfc else text)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("families")
    return {"qwen": _ranks_file(tmp / "qwen.tiktoken", "qwen"),
            "llama3": _ranks_file(tmp / "tokenizer.model", "llama3")}  # fmt: skip


@pytest.fixture(autouse=True)
def gate_dir(tmp_path, monkeypatch):
    """Passed gates are remembered in a fresh directory, so each test runs the gate itself."""
    monkeypatch.setattr(gate, "gate_dir", lambda: tmp_path / "gate")
    return tmp_path / "gate"


def test_a_family_refuses_a_file_of_another_size(files):
    """qwen: on Llama 3's file (or any file of another rank count) would label the wrong ids as
    its special tokens: refused, naming the family whose file it is."""
    with pytest.raises(TokenizerError, match=rf"ranks, where the qwen family's file has {N_RANKS['qwen']:,}; "
                                             r"it is a llama3:PATH file"):
        load_tokenizer(f"qwen:{files['llama3']}")
    assert families.FAMILIES["qwen"].n_ranks != families.FAMILIES["llama3"].n_ranks


def test_a_changed_definition_changes_the_vocabularys_hash(tmp_path, files):
    """--append compares the hash: a PATH.json whose pattern changed is another vocabulary."""
    ranks = tmp_path / "my.tiktoken"
    ranks.write_bytes(files["qwen"].read_bytes())
    definition = {"pattern": QWEN_PAT, "special_tokens": {"<|endoftext|>": N_RANKS["qwen"]}}
    families.sidecar(ranks).write_text(json.dumps(definition))
    before = load_tokenizer(str(ranks), "tiktoken").vocab_sha256
    families.sidecar(ranks).write_text(json.dumps({**definition, "pattern": LLAMA3_PAT}))
    assert load_tokenizer(str(ranks), "tiktoken").vocab_sha256 != before


def _specials(family: str) -> dict[str, int]:
    n = N_RANKS[family]
    if family == "qwen":
        names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *(f"<|extra_{i}|>" for i in range(205))]
    else:
        named = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                 "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                 "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]  # fmt: skip
        names = named + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)]
    return {t: n + i for i, t in enumerate(names)}


def test_the_family_patterns_are_the_published_ones_and_splintrs_constants():
    assert families.FAMILIES["qwen"].pattern == QWEN_PAT == splintr.QWEN2_PATTERN
    assert families.FAMILIES["llama3"].pattern == LLAMA3_PAT == splintr.LLAMA3_PATTERN
    llama = _specials("llama3")
    assert len(llama) == 256 and llama["<|reserved_special_token_247|>"] == 128_255 and llama["<|eot_id|>"] == 128_009


@pytest.mark.parametrize("family", ["qwen", "llama3"])
@pytest.mark.parametrize("backend_name", ["auto", "tiktoken"])
def test_ids_equal_tiktoken_and_identity(files, family, backend_name):
    spec = f"{family}:{files[family]}"
    tok = load_tokenizer(spec, backend_name, warn=pytest.fail)
    assert tok.backend == ("splintr" if backend_name == "auto" else "tiktoken")
    pattern = QWEN_PAT if family == "qwen" else LLAMA3_PAT
    truth = _truth(files[family], pattern, _specials(family), nfc=family == "qwen")
    tokens, lengths = tok.encode_batch(TEXTS)
    assert [t.tolist() for t in np.split(tokens, np.cumsum(lengths)[:-1])] == [truth(t) for t in TEXTS]
    n = N_RANKS[family]
    assert (tok.name, tok.vocab_sha256, tok.vocab_format) == (spec, _vocab_sha256(files[family], family), "tiktoken")
    if family == "qwen":
        assert (tok.n_vocab, tok.eot_token, tok.eot_id, tok.bos_id, tok.adds_bos) == \
               (n + 208, "<|endoftext|>", n, None, False)  # fmt: skip
        assert tok.identity()["normalize"] == "NFC"
    else:
        assert (tok.n_vocab, tok.eot_token, tok.eot_id, tok.bos_token, tok.bos_id, tok.adds_bos) == \
               (n + 256, "<|end_of_text|>", n + 1, "<|begin_of_text|>", n, True)  # fmt: skip
    assert tok.decode(truth("Hello world")) == "Hello world"


@pytest.fixture(scope="module")
def fast_and_truth(files):
    return [(load_tokenizer(f"{family}:{files[family]}", "splintr", gated=True),
             _truth(files[family], pattern, _specials(family), nfc=family == "qwen"))
            for family, pattern in (("qwen", QWEN_PAT), ("llama3", LLAMA3_PAT))]  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(st.characters(exclude_categories=()), max_size=40), min_size=1, max_size=5))
def test_splintr_equals_tiktoken_on_any_text(fast_and_truth, texts):
    for tok, truth in fast_and_truth:
        tokens, lengths = tok.encode_batch(texts)
        assert [t.tolist() for t in np.split(tokens, np.cumsum(lengths)[:-1])] == [truth(t) for t in texts]


def test_separator_may_be_any_special_token(files):
    tok = load_tokenizer(f"qwen:{files['qwen']}", "auto", separator="<|im_end|>")
    assert (tok.eot_token, tok.eot_id) == ("<|im_end|>", N_RANKS["qwen"] + 2)
    with pytest.raises(TokenizerError, match=r"--separator '<\|eot_id\|>' is not a special token of this vocab"):
        load_tokenizer(f"qwen:{files['qwen']}", "tiktoken", separator="<|eot_id|>")


def test_a_definition_beside_the_file(tmp_path):
    ranks = _ranks_file(tmp_path / "mine.tiktoken", 3000)
    specials = {"<|endoftext|>": 3000, "<|doc|>": 3001, "<|bos|>": 3005}
    definition = {"pattern": splintr.GPT2_PATTERN, "special_tokens": specials, "separator": "<|doc|>", "bos": "<|bos|>"}
    families.sidecar(ranks).write_text(json.dumps(definition))
    tok = load_tokenizer(str(ranks), "auto", warn=pytest.fail)
    truth = _truth(ranks, splintr.GPT2_PATTERN, specials)
    assert tok.backend == "splintr" and tok.encode_batch(TEXTS[:1])[0].tolist() == truth(TEXTS[0])
    assert (tok.n_vocab, tok.eot_id, tok.bos_id, tok.adds_bos) == (3006, 3001, 3005, True)
    # a pattern that is not splintr's own: tiktoken, with a warning; splintr refuses
    definition["pattern"] = LLAMA3_PAT.replace("{1,3}", "{1,2}")
    families.sidecar(ranks).write_text(json.dumps(definition))
    warnings: list[str] = []
    tok = load_tokenizer(str(ranks), "auto", warn=warnings.append)
    assert tok.backend == "tiktoken" and tok.encode_batch(["x 12345"])[0].tolist() == \
           _truth(ranks, definition["pattern"], specials)("x 12345")  # fmt: skip
    assert len(warnings) == 1 and "splintr has no exact pattern for this split pattern" in warnings[0]
    with pytest.raises(TokenizerError, match="has no exact pattern .*use --tokenizer-backend tiktoken"):
        load_tokenizer(str(ranks), "splintr")


@pytest.mark.parametrize(("definition", "said"), [
    ({"special_tokens": {"<|endoftext|>": 3000}}, 'needs a string "pattern" and "special_tokens"'),
    ({"pattern": "x", "special_tokens": {"<|endoftext|>": 5}}, "special token <|endoftext|> has id 5 (from"),
    ({"pattern": "x", "special_tokens": {"<|a|>": 3000}, "bos": "<|b|>"}, "bos '<|b|>' is not one of its special"),
    ({"pattern": "(", "special_tokens": {"<|endoftext|>": 3000}}, "tiktoken refuses its split pattern"),
])  # fmt: skip
def test_a_bad_definition_is_one_line_naming_its_file(tmp_path, definition, said):
    ranks = _ranks_file(tmp_path / "mine.tiktoken", 3000)
    families.sidecar(ranks).write_text(json.dumps(definition))
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(str(ranks), "tiktoken")
    assert said in str(e.value) and "mine.tiktoken" in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_file_without_a_definition_names_the_fixes(tmp_path):
    ranks = _ranks_file(tmp_path / "mine.tiktoken", 3000)
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(str(ranks), "auto")
    message = str(e.value)
    assert message.startswith(f"{ranks}: sha256 ") and "no mine.tiktoken.json beside it defines one" in message
    assert f"qwen:{ranks} or llama3:{ranks}" in message and "\n" not in message


def test_an_unknown_family_lists_the_known_ones(files):
    assert not is_hf_spec(f"mistral:{files['qwen']}") and not is_hf_spec(f"qwen:{files['qwen']}")
    with pytest.raises(TokenizerError, match=r"unknown tokenizer family 'mistral'; use one of qwen:PATH, llama3:PATH"):
        load_tokenizer(f"mistral:{files['qwen']}")
    with pytest.raises(TokenizerError, match=r"nowhere\.tiktoken: no such vocabulary file"):
        load_tokenizer("qwen:/nowhere.tiktoken")
    bad = files["qwen"].with_name("bad.tiktoken")
    bad.write_bytes(b"YQ== 0\nnot a line\n")
    with pytest.raises(TokenizerError, match=r"bad\.tiktoken: line 2 is not '<base64 token> <rank>'"):
        load_tokenizer(f"qwen:{bad}")


def test_fetch_says_the_file_is_the_vocabulary(files):
    done = CliRunner().invoke(app, ["tokenizer", "fetch", f"qwen:{files['qwen']}"], env={"COLUMNS": "400"})
    assert done.exit_code == 1 and "is read from its own file: there is nothing to fetch" in done.output


def test_a_planted_divergence_is_caught_and_auto_falls_back(files, gate_dir, monkeypatch):
    """splintr given GPT-2's split instead of Llama 3's (digits in runs, not threes): a pass the
    gate remembered for the right pattern does not admit it."""
    spec = f"llama3:{files['llama3']}"
    assert load_tokenizer(spec, "auto", warn=pytest.fail).backend == "splintr"  # passed, remembered
    monkeypatch.setattr(backend, "splintr_constant", lambda pattern: "GPT2_PATTERN")
    warnings: list[str] = []
    tok = load_tokenizer(spec, "auto", warn=warnings.append)
    assert tok.backend == "tiktoken" and len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith(f"{spec}: the splintr backend is not exact here, falling back to tiktoken: sample ")
    with pytest.raises(TokenizerError, match="--tokenizer-backend splintr is not exact for"):
        load_tokenizer(spec, "splintr")


@pytest.mark.parametrize("family", ["llama3", "qwen"])
def test_prepare_writes_the_familys_separator_and_bos(tmp_path, files, family):
    docs = ["First document, 12345 tokens.", "Cafe\u0301 \u212b <|endoftext|> done", "third\n\n  one"]
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    spec, out = f"{family}:{files[family]}", tmp_path / "ds"
    cmd = [sys.executable, "-m", "lmshard", "prepare", str(src), "--out", str(out), "--tokenizer", spec,
           "--workers", "2", "--dedup", "none", "--no-normalize", "--val-fraction", "0"]  # fmt: skip
    separator = "<|im_end|>" if family == "qwen" else None
    cmd += ["--separator", separator] if separator else []
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "tiktoken")}  # a fresh gate cache
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    assert done.returncode == 0, done.stderr
    meta = json.loads((out / "dataset_metadata.json").read_text())["tokenizer"]
    stream = np.concatenate([np.fromfile(p, dtype=np.uint32) for p in sorted((out / "train").glob("*.bin"))])
    n = N_RANKS[family]
    truth = _truth(files[family], QWEN_PAT if family == "qwen" else LLAMA3_PAT, _specials(family), family == "qwen")
    if family == "llama3":
        want = [x for d in docs for x in [n, *truth(d), n + 1]]  # BOS text EOT, as Llama 3's tokenizer adds BOS
        assert (meta["bos_id"], meta["eot_id"], meta["n_vocab"]) == (n, n + 1, n + 256)
    else:
        want = [x for d in docs for x in [*truth(d), n + 2]]  # --separator <|im_end|>
        assert (meta["bos_id"], meta["eot_id"], meta["n_vocab"]) == (None, n + 2, n + 208)
    assert (meta["name"], meta["backend"], meta["vocab_format"]) == (spec, "splintr", "tiktoken")
    assert stream.tolist() == want
