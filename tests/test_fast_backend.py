"""The splintr backend and the exactness gate. The independent truth is tiktoken's own
`Encoding.encode_ordinary` (the `reference` fixture), never the code under test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import splintr
from hypothesis import given, settings
from hypothesis import strategies as st
from tiktoken_ext.openai_public import r50k_pat_str

from lmshard.errors import TokenizerError
from lmshard.tokenizers import gate, load_tokenizer, tiktoken_backend
from lmshard.tokenizers import splintr_backend as backend
from lmshard.tokenizers.splintr_backend import SplintrTokenizer
from lmshard.tokenizers.tiktoken_backend import TiktokenTokenizer
from lmshard.tokenizers.vocab import VOCABULARIES, cache_file, resolve

# Text where a fast tokenizer is most likely to differ: lone surrogates (and a pair spelled as
# two code points), special-token text, letters new in Unicode 17, odd whitespace, contractions.
HARD = ["\ud800", "\udfff", "\udc80", "\ud83d\ude00", "<|endoftext|>", "<|fim_prefix|>", "<|endoftext",
        "\u088f", "\U00010940", "\ufffd", "\x85", "\u2028", "\u3000", "\x1c", "\u200b", "'s", "'LL", "'VE",
        " \t!", "  ", "\n\n", "123456", "é", "😀", "日本"]  # fmt: skip


@pytest.fixture(scope="module")
def fast():
    return SplintrTokenizer("gpt2")


@pytest.fixture(scope="module")
def slow():
    return TiktokenTokenizer("gpt2")


@pytest.fixture
def gate_dir(tmp_path, monkeypatch):
    """Passed gates are remembered in a fresh directory, so each test runs the gate itself."""
    monkeypatch.setattr(gate, "gate_dir", lambda: tmp_path / "gate")
    return tmp_path / "gate"


texts = st.lists(
    st.lists(st.one_of(st.text(st.characters(exclude_categories=()), max_size=30), st.sampled_from(HARD)),
             max_size=12).map("".join),
    max_size=6,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(texts)
def test_encode_batch_equals_tiktoken_encode_ordinary(reference, fast, texts):
    tokens, lengths = fast.encode_batch(texts)
    expected = [reference.encode_ordinary(t) for t in texts]
    assert tokens.dtype == np.dtype("<u4") and lengths.dtype == np.int64
    assert lengths.tolist() == [len(e) for e in expected]
    assert tokens.tolist() == [i for e in expected for i in e]


@pytest.mark.parametrize("text", ["a" * 200_000, " " * 200_000, "7" * 200_000, "ab " * 70_000, "\n" * 200_000])
def test_pathological_runs_are_identical(reference, fast, text):
    tokens, lengths = fast.encode_batch([text, "x"])
    assert tokens.tolist() == reference.encode_ordinary(text) + reference.encode_ordinary("x")


def test_special_token_text_and_surrogates(reference, fast):
    tokens, _ = fast.encode_batch(["a <|endoftext|> b", "x\ud800y"])
    assert 50256 not in tokens.tolist()
    assert tokens.tolist() == reference.encode_ordinary("a <|endoftext|> b") + reference.encode_ordinary("x\ud800y")


def test_identity_and_decode_match_tiktoken(fast, slow):
    mine, theirs = fast.identity(), slow.identity()
    for key in ("name", "base_encoding", "n_vocab", "eot_id", "eot_token", "ranks_sha256", "pat_str", "special_tokens"):
        assert mine[key] == theirs[key], key
    assert mine["backend"] == "splintr" and mine["splintr_version"] == splintr.__version__
    ids = [50256, 31373, 995, 156, 95]  # a special token, words, and two bytes of a 3-byte character
    assert fast.decode(ids) == slow.decode(ids)


def test_a_corrupt_installed_vocabulary_is_refused(tmp_path, monkeypatch):
    ranks = resolve("gpt2")[2].read_bytes()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    cache_file(VOCABULARIES["r50k_base"], tmp_path).write_bytes(ranks.replace(b" 50255", b" 50254"))
    with pytest.raises(TokenizerError, match="sha256 .* is not the expected"):
        SplintrTokenizer("gpt2")
    with pytest.raises(TokenizerError, match="sha256 .* is not the expected"):  # an error, not a fallback
        load_tokenizer("gpt2", "auto", warn=pytest.fail)


# ---------------------------------------------------------------------------------------------
# The gate


class OneTokenOff(SplintrTokenizer):
    """Changes the first token of any text holding special-token text."""

    def encode_batch(self, texts):
        tokens, lengths = super().encode_batch(texts)
        tokens = tokens.copy()
        starts = np.cumsum(lengths) - lengths
        for i, text in enumerate(texts):
            if "<|endoftext|>" in text:
                tokens[starts[i]] += 1
        return tokens, lengths


class DropsSurrogates(SplintrTokenizer):
    """Deletes lone surrogates instead of encoding them as U+FFFD."""

    def encode_batch(self, texts):
        return super().encode_batch([t.encode("utf-8", "ignore").decode() for t in texts])


class EquivalentLookingPattern(SplintrTokenizer):
    """tiktoken's own pattern minus its possessive quantifiers: equivalent as a regex, but run by
    splintr's regex engine with Unicode 17 tables (the trap splintr_backend avoids)."""

    def __init__(self, spec="gpt2"):
        super().__init__(spec)
        ranks = resolve(spec)[2].read_bytes()
        self._encoder = splintr.Tokenizer.from_bytes(ranks, r50k_pat_str.replace("++", "+"), {"<|endoftext|>": 50256})


def test_the_sample_is_deterministic_and_covers_the_hard_cases():
    joined = "".join(text for _, text in gate.sample())
    for piece in ("a" * 20_000, " " * 20_000, "\n" * 5_000, "<|endoftext|>", "<|fim_prefix|>", "\ud800", "'VE",
                  "\ufffd", "\u088f's", "日本語", "😀"):  # fmt: skip
        assert piece in joined, piece
    assert 50_000 < len(joined.encode("utf-8", "surrogatepass")) < 300_000
    # the same text in a fresh interpreter: no state, no randomness from the environment
    code = "from lmshard.tokenizers import gate; print(gate.sample_sha256())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == gate.sample_sha256()


def test_the_sample_passes_for_gpt2(fast, slow):
    assert gate.check_sample(fast, slow) is None


@pytest.mark.parametrize(
    ("broken", "where"),
    [(OneTokenOff, r"sample 'special-token text' \(342 chars\): token 0 is 28 '=' from splintr, 27 '<' from "
                   r"tiktoken \(181 vs 181 tokens\)$"),
     (DropsSurrogates, r"sample 'lone surrogates' \(19 chars\): token 0 is 397 'ab' from splintr, 64 'a' from"),
     (EquivalentLookingPattern, r"sample 'U\+0800-2FFF, every third' .* 338 \"'s\" from splintr, 6 \"'\" from ")],
)  # fmt: skip
def test_the_gate_names_the_first_difference(slow, broken, where):
    problem = gate.check_sample(broken("gpt2"), slow)
    assert problem is not None and re.match(where, problem), problem


def test_check_exact_reports_exceptions_lengths_and_fields(fast, slow):
    class Raises(SplintrTokenizer):
        def encode_batch(self, texts):
            raise ValueError("boom")

    class Short(SplintrTokenizer):
        def encode_batch(self, texts):
            tokens, lengths = super().encode_batch(texts)
            return tokens[:-1], lengths - np.eye(len(lengths), dtype=np.int64)[-1]

    assert gate.check_exact(Raises("gpt2"), slow, ["x"]) == "splintr raised ValueError on the sample: boom"
    short = gate.check_exact(Short("gpt2"), slow, ["a", "hello world"])
    assert short == "sample '#1' (11 chars): token 1 is (end) from splintr, 995 ' world' from tiktoken (1 vs 2 tokens)"
    other = SplintrTokenizer("gpt2")
    other.eot_id = 0
    assert gate.check_exact(other, slow, ["x"]) == "eot_id is 0 for splintr, 50256 for tiktoken"
    assert gate.check_exact(fast, slow, []) is None


def test_auto_falls_back_with_a_warning_and_splintr_refuses(gate_dir, monkeypatch):
    monkeypatch.setattr(backend, "SplintrTokenizer", DropsSurrogates)
    warnings: list[str] = []
    tok = load_tokenizer("gpt2", "auto", warn=warnings.append)
    assert tok.backend == "tiktoken"
    assert len(warnings) == 1 and "falling back to tiktoken: sample 'lone surrogates'" in warnings[0]
    with pytest.raises(TokenizerError, match="splintr is not exact for gpt2 here .*sample 'lone surrogates'"):
        load_tokenizer("gpt2", "splintr")
    assert not gate_dir.exists() or not any(gate_dir.iterdir())  # a failure is never remembered


def test_a_splintr_that_cannot_load_falls_back(gate_dir, monkeypatch):
    class CannotLoad(SplintrTokenizer):
        def __init__(self, spec, **kwargs):
            raise ValueError("Regex compilation error")

    monkeypatch.setattr(backend, "SplintrTokenizer", CannotLoad)
    warnings: list[str] = []
    assert load_tokenizer("gpt2", "auto", warn=warnings.append).backend == "tiktoken"
    assert "splintr could not load gpt2: ValueError: Regex compilation error" in warnings[0]


def test_a_vocabulary_without_an_exact_pattern_falls_back(gate_dir, monkeypatch):
    monkeypatch.delitem(backend.SPLINTR_PATTERNS, "r50k_base")
    warnings: list[str] = []
    assert load_tokenizer("gpt2", "auto", warn=warnings.append).backend == "tiktoken"
    assert warnings[0].endswith("falling back to tiktoken: splintr has no exact pattern for r50k_base")
    with pytest.raises(TokenizerError, match="no exact pattern for r50k_base"):
        SplintrTokenizer("gpt2")


def test_auto_takes_splintr_and_remembers_the_pass(gate_dir, monkeypatch):
    assert load_tokenizer("gpt2", "auto").backend == "splintr"
    (record,) = gate_dir.glob("*.json")
    assert json.loads(record.read_text())["splintr_version"] == splintr.__version__

    def no_reference(spec):
        raise AssertionError("a remembered pass loads no reference")

    monkeypatch.setattr(tiktoken_backend, "TiktokenTokenizer", no_reference)
    assert load_tokenizer("gpt2", "splintr").backend == "splintr"
    # a different backend class (or source) is another key: the broken one is checked, and fails
    monkeypatch.undo()
    monkeypatch.setattr(gate, "gate_dir", lambda: gate_dir)
    monkeypatch.setattr(backend, "SplintrTokenizer", OneTokenOff)
    with pytest.raises(TokenizerError, match="special-token text"):
        load_tokenizer("gpt2", "splintr")


def test_a_change_to_the_reference_code_runs_the_gate_again(gate_dir, monkeypatch, tmp_path):
    """A remembered pass is keyed by the code that decided it, the tiktoken reference and the
    shared helpers included: edit one of them and the next run checks again."""
    assert {p.name for p in gate.SUPPORT_SOURCES} >= {"base.py", "tiktoken_backend.py"}
    copies = []
    for p in gate.SUPPORT_SOURCES:
        copies.append(tmp_path / p.name)
        copies[-1].write_bytes(p.read_bytes())
    monkeypatch.setattr(gate, "SUPPORT_SOURCES", tuple(copies))
    assert load_tokenizer("gpt2", "auto").backend == "splintr"
    assert len(list(gate_dir.glob("*.json"))) == 1
    copies[0].write_bytes(copies[0].read_bytes() + b"\n# edited\n")
    checked = []
    real = gate.check_exact
    monkeypatch.setattr(gate, "check_exact", lambda *a, **k: checked.append(1) or real(*a, **k))
    assert load_tokenizer("gpt2", "auto").backend == "splintr"
    assert checked == [1] and len(list(gate_dir.glob("*.json"))) == 2


def test_a_change_to_the_backend_source_runs_the_gate_again(gate_dir, monkeypatch, tmp_path):
    """The accelerated backend's own source (splintr_backend.py) is part of a pass's key too."""
    copy = tmp_path / "splintr_backend.py"
    copy.write_bytes(Path(backend.__file__).read_bytes())
    real_getfile = gate.inspect.getfile  # the stdlib's: the copy for the backend class, else as ever
    monkeypatch.setattr(gate.inspect, "getfile", lambda o: str(copy) if o is SplintrTokenizer else real_getfile(o))
    assert load_tokenizer("gpt2", "auto").backend == "splintr"
    copy.write_bytes(copy.read_bytes() + b"\n# edited\n")
    checked = []
    real = gate.check_exact
    monkeypatch.setattr(gate, "check_exact", lambda *a, **k: checked.append(1) or real(*a, **k))
    assert load_tokenizer("gpt2", "auto").backend == "splintr"
    assert load_tokenizer("gpt2", "auto").backend == "splintr"  # remembered again: no third check
    assert checked == [1] and len(list(gate_dir.glob("*.json"))) == 2


def test_gated_skips_the_check(gate_dir, monkeypatch):
    monkeypatch.setattr(backend, "SplintrTokenizer", OneTokenOff)
    assert type(load_tokenizer("gpt2", "splintr", gated=True)) is OneTokenOff


def test_without_splintr_auto_is_silent_and_splintr_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "splintr", None)  # `import splintr` now raises ImportError
    warnings: list[str] = []
    assert load_tokenizer("gpt2", "auto", warn=warnings.append).backend == "tiktoken" and warnings == []
    with pytest.raises(TokenizerError, match=r"needs the fast extra: pip install 'lmshard\[fast\]'"):
        load_tokenizer("gpt2", "splintr")


def test_a_missing_vocabulary_is_not_a_gate_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    with pytest.raises(TokenizerError, match="lmshard tokenizer fetch cl100k_base"):
        load_tokenizer("cl100k_base", "auto", warn=pytest.fail)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux /proc")
def test_one_rayon_thread_per_process_by_default():
    code = """if True:
        import os
        from lmshard.tokenizers.splintr_backend import SplintrTokenizer
        before = len(os.listdir("/proc/self/task"))
        tok = SplintrTokenizer("gpt2")
        tok.encode_batch(["some text"] * 64 + ["a long text " * 50_000])  # splintr goes parallel
        print(len(os.listdir("/proc/self/task")) - before, tok.threads, os.environ.get("RAYON_NUM_THREADS"))
    """
    env = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["1", "1", "None"]  # one pool thread; the variable is not left set
