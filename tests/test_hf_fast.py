"""splintr as the accelerated encoder of Hugging Face tokenizer.json vocabularies, on small
vocabularies of each family's shape (tests/vocab_shapes.py) trained here on local text.

The independent truth for ids is the `tokenizers` library's own loading of the same file
(`Tokenizer.from_file`) with `encode_special_tokens = True` and `add_special_tokens=False`:
lmshard's rule that special-token text inside a document is ordinary text and that no template
is added. Text UTF-8 cannot hold (lone surrogates) is repaired before the truth sees it, each
lone surrogate as U+FFFD, as lmshard documents.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import tokenizers
import vocab_shapes
from conftest import read_docs, write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, trainers

from lmshard.errors import TokenizerError
from lmshard.format import load_metadata
from lmshard.format.fields import _Invalid
from lmshard.format.parts import TokenizerInfo
from lmshard.prepare import PrepareConfig, prepare
from lmshard.tokenizers import gate, hf_fast, load_tokenizer
from lmshard.tokenizers.base import utf8_safe
from lmshard.tokenizers.hf_backend import HFTokenizer

SHAPES = vocab_shapes.SHAPES


@pytest.fixture(autouse=True)
def _restore_parallelism(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # the backend sets it around its calls


@pytest.fixture(scope="module")
def module_gate(tmp_path_factory):
    """Passed gates of this module's shared tokenizers are remembered here, never in the user's cache."""
    directory = tmp_path_factory.mktemp("module-gate")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gate, "gate_dir", lambda: directory)
        yield directory


@pytest.fixture
def gate_dir(tmp_path, monkeypatch, module_gate):
    """A fresh directory for passed gates, so the test runs the gate itself."""
    monkeypatch.setattr(gate, "gate_dir", lambda: tmp_path / "gate")
    return tmp_path / "gate"


@pytest.fixture(scope="module")
def shape_files(tmp_path_factory):
    """kind -> its tokenizer.json, trained on first use (0.1-0.3 s each) and kept for the module."""
    root = tmp_path_factory.mktemp("shapes")
    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in built:
            built[kind] = vocab_shapes.build(kind, root / kind)
        return built[kind]

    return get


@pytest.fixture(scope="module")
def accelerated(shape_files, module_gate):
    """kind -> load_tokenizer(its file, "auto"), loaded once, failing the test on a fallback warning."""
    loaded: dict[str, HFTokenizer] = {}

    def get(kind: str) -> HFTokenizer:
        if kind not in loaded:
            tok = load_tokenizer(str(shape_files(kind)), "auto", warn=pytest.fail,
                                 separator=vocab_shapes.SEPARATOR.get(kind))  # fmt: skip
            assert isinstance(tok, HFTokenizer)
            loaded[kind] = tok
        return loaded[kind]

    return get


_truths: dict[Path, tokenizers.Tokenizer] = {}


def truth(path: Path, texts: list[str]) -> list[list[int]]:
    """The tokenizers library's ids for each text, special-token text as ordinary text."""
    if path not in _truths:
        ref = tokenizers.Tokenizer.from_file(str(path))
        ref.encode_special_tokens = True
        _truths[path] = ref
    return [e.ids for e in _truths[path].encode_batch([utf8_safe(t) for t in texts], add_special_tokens=False)]


def assert_same_ids(tok: HFTokenizer, path: Path, texts: list[str]) -> None:
    """tok.encode_batch(texts), one batch, gives the truth's ids for every text, in order."""
    tokens, lengths = tok.encode_batch(texts)
    expected = truth(path, texts)
    assert tokens.dtype == np.dtype("<u4") and lengths.dtype == np.int64 and len(lengths) == len(texts)
    pieces = np.split(tokens, np.cumsum(lengths)[:-1]) if len(texts) else []
    for i, (got, want) in enumerate(zip(pieces, expected, strict=True)):
        if got.tolist() != want:
            k = _first_differing(got.tolist(), want)
            mine, theirs = got[k : k + 3].tolist(), want[k : k + 3]
            raise AssertionError(f"text {i} ({texts[i][:60]!r}…, {len(texts[i]):,} chars): token {k} is {mine} "
                                 f"from {tok.backend}, {theirs} from tokenizers")  # fmt: skip


def _first_differing(got: list[int], want: list[int]) -> int:
    return next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))


# ---------------------------------------------------------------------------------------------
# 1. Every family's shape is accelerated, and exact


def _added_token_texts(kind: str) -> list[str]:
    tokens = list(vocab_shapes.added_tokens(kind))
    return [" ".join(f"a{t}b {t} {t}{t} x {t}\n" for t in tokens), "".join(tokens), *tokens,
            *(f"The {t} token, again:{t}.  {t}  end" for t in tokens)]  # fmt: skip


RUNS = ["1234567890" * 40, "3.14159 2,718 1,234,567.89 0x1F 2024-06-07 10:30:00 +49 (0)30 12345",
        "!!!??? ... --- === *** ### $$$ %%% &&& ((())) [[[]]] {{{}}} <<<>>> /// \\\\\\ |||",
        "a1b22c333d4444e55555 1a 22b 333c", "١٢٣٤ ٣.١٤ ０１２３ ²³ ½ Ⅻ ⑫ 𝟙𝟚𝟛 ๑๒๓", "'''\"\"\"```~~~^^^___",
        "x = [1, 2, 3]; y = {'a': 1_000_000} # ok?!", "!" * 3000 + "1" * 3000 + "-" * 3000]  # fmt: skip
LONG_WORDS = ["supercalifragilistic" * 5000, "é" * 100_000, "日本語" * 33_334, "a" * 100_000]


@pytest.mark.parametrize("kind", SHAPES)
def test_every_shape_is_accelerated_and_equals_tokenizers(kind, shape_files, accelerated):
    tok, path = accelerated(kind), shape_files(kind)
    assert (tok.backend, tok.vocab_format) == ("splintr", "tokenizer.json")
    assert_same_ids(tok, path, vocab_shapes.local_documents())
    assert_same_ids(tok, path, [text for _, text in gate.sample()])
    assert_same_ids(tok, path, _added_token_texts(kind))
    assert_same_ids(tok, path, RUNS)
    assert_same_ids(tok, path, LONG_WORDS)
    assert_same_ids(tok, path, [" ", "\n", "a", "\u200b", "\ufeff", "\x00"])


# splintr encodes the empty text as "▁" where a Metaspace (prepend "first") or Prepend("▁") shape
# gives no token, and the gate's sample holds no empty text. prepare never encodes one (it drops
# empty documents), but encode_batch is public. Strict: the mark goes when lmshard handles it.
# splintr alone encodes '' as '▁' for prepend-first shapes: the empty text goes to tokenizers.


@pytest.mark.parametrize("kind", SHAPES)  # fmt: skip
def test_the_empty_text_has_no_tokens(kind, shape_files, accelerated):
    assert truth(shape_files(kind), ["", "a", ""]) == [[], truth(shape_files(kind), ["a"])[0], []]
    assert_same_ids(accelerated(kind), shape_files(kind), ["", "a", ""])


def _pieces(kind: str) -> st.SearchStrategy[str]:
    letters = st.characters(categories=("L", "N", "P", "S", "Z", "M"))
    common = ["the", " cat", "'s", "'LL", " 123", "\n\n", "  ", "\t", "\r\n", "日本", "é", "é", "▁", "🙂"]
    return st.one_of(st.text(letters, max_size=12), st.sampled_from(common + list(vocab_shapes.added_tokens(kind))))


@pytest.mark.parametrize("kind", SHAPES)
def test_arbitrary_text_equals_tokenizers(kind, shape_files, accelerated):
    tok, path = accelerated(kind), shape_files(kind)

    # derandomize: a fixed sequence of examples. The shapes test_every_assigned_code_point marks
    # would otherwise fail at random, on the rare example that draws one of their code points.
    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.lists(_pieces(kind), min_size=1, max_size=10).map("".join).filter(bool), min_size=1, max_size=4))
    def check(texts):
        assert_same_ids(tok, path, texts)

    check()


@functools.cache
def assigned_code_points() -> list[str]:
    """Every code point of categories M, P, Z, Cc, Cf and every 17th other one that this Python's
    Unicode tables assign (so none is routed), below U+30000, private use left out: each in
    contexts where normalizers (canonical order, accents), punctuation splits and letter classes
    act. 60 texts of 512 code points, about 0.3 MB."""
    points = []
    for c in range(0x30000):
        category = unicodedata.category(chr(c)) if not 0xD800 <= c <= 0xDFFF else "Cs"
        if category not in ("Cn", "Co", "Cs") and (category[0] in "MPZ" or category in ("Cc", "Cf") or c % 17 == 0):
            points.append(chr(c))
    contexts = [f" {c}a{c}\u0301\u0316{c}1{c}'s" for c in points]
    return ["".join(contexts[i : i + 512]) for i in range(0, len(contexts), 512)]


# Shapes whose Unicode tables differ from splintr's (NFC's canonical order for qwen2, neox and
# clip; punctuation for falcon; BertNormalizer for bert) on code points Python assigns, e.g.
# " \U00011a41" for falcon, "\U0001cf26" for bert, "\u0898" before U+0301 U+0316 for qwen2: the
# gate's probes find those code points and route the texts holding them to tokenizers.
@pytest.mark.parametrize("kind", SHAPES)
def test_every_assigned_code_point_equals_tokenizers(kind, shape_files, accelerated):
    assert_same_ids(accelerated(kind), shape_files(kind), assigned_code_points())


# ---------------------------------------------------------------------------------------------
# 2. The gate catches a planted divergence, and a copy splintr cannot load


def _sample_labels(path: Path) -> list[tuple[str, str]]:
    return hf_fast.hf_sample(HFTokenizer(str(path)))


def _first_difference(path: Path, changed: bytes) -> tuple[str, int]:
    """(label, token index) of the first sample text where `tokenizers` loading the changed copy
    encodes differently from the truth: what splintr loading that copy must be caught on."""
    other = tokenizers.Tokenizer.from_str(changed.decode("utf-8"))
    other.encode_special_tokens = True
    for label, text in _sample_labels(path):
        got = other.encode(utf8_safe(text), add_special_tokens=False).ids
        want = truth(path, [text])[0]
        if got != want:
            return label, _first_differing(got, want)
    raise AssertionError("the planted change makes no difference on the sample")


def _tokens(merge: list[str]) -> set[str]:
    return {merge[0], merge[1], merge[0] + merge[1]}


@pytest.mark.parametrize("plant", ["a merge removed", "two merges swapped"])
def test_a_changed_merge_is_caught_and_falls_back(plant, shape_files, gate_dir, monkeypatch):
    path = shape_files("qwen2")
    real = hf_fast.splintr_copy
    monkeypatch.setattr(hf_fast, "ranks_form", lambda parsed: None)  # splintr reads the (changed) file itself

    swap = [0]

    def changed_copy(parsed):
        data = json.loads(real(parsed))
        merges = data["model"]["merges"]
        if plant == "a merge removed":
            del merges[swap[0]]  # a frequent pair: its token and every token built on it differ
        else:  # two merges sharing no token: the first pair is merged later, the other earlier
            j = [j for j in range(20, len(merges)) if not _tokens(merges[0]) & _tokens(merges[j])][swap[0]]
            merges[0], merges[j] = merges[j], merges[0]
        return json.dumps(data, ensure_ascii=False).encode()

    # The shape is trained on the repository's docs, so whether a given removal or swap changes
    # splintr's ids on the gate's sample depends on them (splintr ranks a pair by its merged token
    # when that token is in the vocabulary, so a removed merge can change nothing): plant the first
    # that does (one that changes none leaves splintr exact, and the gate is right to admit it);
    # a removed merge, the first that both libraries read alike up to the gate's first difference
    # (the sample and token that `tokenizers` reading the changed copy first differs at).
    with monkeypatch.context() as probing:
        probing.setattr(hf_fast, "splintr_copy", changed_copy)
        # a fresh directory per attempt: a swap that passes must not be recalled for the next one
        probing.setattr(gate, "gate_dir", lambda: gate_dir.parent / f"probe_{swap[0]}")
        for attempt in range(100):
            swap[0] = attempt
            try:
                load_tokenizer(str(path), "splintr", warn=lambda _: None)
            except TokenizerError as e:
                if plant != "a merge removed":
                    break
                try:
                    label, k = _first_difference(path, changed_copy(json.loads(path.read_bytes())))
                except AssertionError:  # (tokenizers reads this copy as the original: not alike)
                    continue
                if f"sample {label!r}" in str(e) and f"token {k} is" in str(e):
                    break
        else:
            pytest.fail(f"none of 100 plants ({plant}) changes splintr's ids on the gate's sample")

    label, k = _first_difference(path, changed_copy(json.loads(path.read_bytes())))
    monkeypatch.setattr(hf_fast, "splintr_copy", changed_copy)
    warnings: list[str] = []
    tok = load_tokenizer(str(path), "auto", warn=warnings.append)
    assert tok.backend == "tokenizers"
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    if plant == "a merge removed":  # both libraries read this copy alike: the gate names the first difference
        assert f"sample {label!r}" in warnings[0] and f"token {k} is" in warnings[0], (label, k, warnings)
    else:  # splintr may order swapped merges otherwise than tokenizers does: it is caught where its ids first differ
        assert re.search(r"sample '[^']+'.*: token \d+ is \d+ .* from splintr", warnings[0]), warnings
    assert "falling back to tokenizers" in warnings[0]
    assert_same_ids(tok, path, vocab_shapes.local_documents()[:50])
    with pytest.raises(TokenizerError, match=r"splintr is not exact .*token \d+ is"):
        load_tokenizer(str(path), "splintr", warn=pytest.fail)
    assert not list(gate_dir.glob("*.json"))  # a failure is never remembered (passes are *.json; hf/ holds facts)


@pytest.mark.parametrize("plant", ["raises", "not JSON", "no model"])
def test_a_copy_splintr_cannot_load_falls_back(plant, shape_files, gate_dir, monkeypatch):
    path = shape_files("llama3")

    def broken_copy(parsed):
        if plant == "raises":
            raise ValueError("planted failure")
        return b"{not json" if plant == "not JSON" else b'{"model": {"type": "NoSuchModel"}}'

    monkeypatch.setattr(hf_fast, "splintr_copy", broken_copy)
    monkeypatch.setattr(hf_fast, "ranks_form", lambda parsed: None)  # splintr reads the (broken) copy
    warnings: list[str] = []
    tok = load_tokenizer(str(path), "auto", warn=warnings.append)
    assert tok.backend == "tokenizers"
    # splintr reads the copy at its first encode, so the gate reports what it raised there.
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert "falling back to tokenizers: splintr raised ValueError" in warnings[0], warnings
    if plant == "raises":
        assert "planted failure" in warnings[0]
    assert_same_ids(tok, path, vocab_shapes.local_documents()[:50])
    with pytest.raises(TokenizerError, match="splintr is not exact .*splintr raised ValueError"):
        load_tokenizer(str(path), "splintr")
    assert not list(gate_dir.glob("*.json"))


# ---------------------------------------------------------------------------------------------
# 3. Shapes splintr does not reproduce exactly fall back, with one warning line


def _quicktour() -> tokenizers.Tokenizer:
    """The tokenizers quicktour's BPE: a Whitespace pre-tokenizer (\\w+|[^\\w\\s]+, which drops
    whitespace) and [UNK] for characters outside the alphabet. splintr keeps the whitespace."""
    tok = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(iter(vocab_shapes.training_texts()), trainers.BpeTrainer(
        vocab_size=vocab_shapes.VOCAB_SIZE, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]",
                                                            "<|endoftext|>"], show_progress=False))  # fmt: skip
    return tok


def _t5() -> tokenizers.Tokenizer:
    """T5's shape: a Unigram model behind NFKC (standing in for its Precompiled charsmap) and
    repeated spaces folded, WhitespaceSplit + Metaspace; <pad>, </s>, <unk> at ids 0-2."""
    tok = tokenizers.Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(tokenizers.Regex(" {2,}"), " ")])
    metaspace = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), metaspace])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    specials = ["<pad>", "</s>", "<unk>", "<extra_id_0>", "<extra_id_1>"]
    trainer = trainers.UnigramTrainer(vocab_size=vocab_shapes.VOCAB_SIZE, unk_token="<unk>", special_tokens=specials,
                                      show_progress=False)  # fmt: skip
    tok.train_from_iterator(iter(vocab_shapes.local_documents()), trainer)  # the docs: an alphabet within its size
    return tok


def _single_word() -> tokenizers.Tokenizer:
    """GPT-NeoX's shape with ordinary added tokens that match only as a whole word or take the
    space before them (`single_word`, `lstrip`): splintr matches them anywhere."""
    tok = vocab_shapes.byte_level("neox")
    tok.add_tokens([AddedToken("hello", single_word=True), AddedToken(" <mask>", lstrip=True)])
    return tok


FALLBACKS = {"quicktour": _quicktour, "t5": _t5, "single_word": _single_word}


@pytest.mark.parametrize("kind", FALLBACKS)
def test_a_shape_splintr_does_not_reproduce_falls_back_exactly(kind, tmp_path, gate_dir):
    path = tmp_path / "tokenizer.json"
    FALLBACKS[kind]().save(str(path))
    warnings: list[str] = []
    tok = load_tokenizer(str(path), "auto", warn=warnings.append)
    # Whatever splintr does with this file, the ids are the truth's; today the gate refuses it.
    assert_same_ids(tok, path, vocab_shapes.local_documents() + [t for _, t in gate.sample()])
    assert_same_ids(tok, path, ["hello world, hellos! <mask> x<mask>", "  two  spaces \n\n"])
    assert tok.backend == "tokenizers", f"splintr now passes the gate for the {kind} shape: update docs/tokenizers.md"
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert "not exact" in warnings[0] and "token" in warnings[0]
    assert not list(gate_dir.glob("*.json"))


# ---------------------------------------------------------------------------------------------
# 4. prepare end to end on two workers


def _lmshard(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("lmshard")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, env=env, check=False)


@pytest.mark.parametrize("kind", ["llama3", "qwen2"])
def test_prepare_on_two_workers_writes_the_truths_ids(kind, shape_files, tmp_path, gate_dir, eager_pool):
    path = shape_files(kind)
    texts = vocab_shapes.local_documents()
    assert len(texts) >= 300
    inputs = write(tmp_path / "docs.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    meta = prepare(PrepareConfig(inputs=[str(inputs)], out=str(tmp_path / "ds"), tokenizer=str(path), workers=2,
                                 val_fraction=0.1, tokens_per_shard=5000, quiet=True))  # fmt: skip
    info = meta.tokenizer
    assert (info.backend, info.vocab_format) == ("splintr", "tokenizer.json")
    ref = tokenizers.Tokenizer.from_file(str(path))
    # Llama 3's template puts <|begin_of_text|> before each text, so prepare does; Qwen2 has no BOS.
    bos = ref.token_to_id("<|begin_of_text|>") if kind == "llama3" else None
    eot = ref.token_to_id("<|end_of_text|>" if kind == "llama3" else "<|endoftext|>")
    assert (info.bos_id, info.eot_id) == (bos, eot)
    expected = [([bos] if bos is not None else []) + ids + [eot] for ids in truth(path, texts)]
    root = tmp_path / "ds"
    train, val = read_docs(root, "train"), read_docs(root, "val")
    assert len(train) + len(val) == len(texts) == meta.n_docs() and len(val) > 0
    # Every document, in input order within each split, is (BOS +) the truth's ids + EOT.
    train_set = {tuple(d.tolist()) for d in train}
    assert sorted(train_set | {tuple(d.tolist()) for d in val}) == sorted(map(tuple, expected))
    assert [d.tolist() for d in train] == [e for e in expected if tuple(e) in train_set]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LMSHARD_CACHE_DIR": str(tmp_path / "cache")}
    done = _lmshard("inspect", str(root), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert load_metadata(root).tokenizer.vocab_format == "tokenizer.json"


# ---------------------------------------------------------------------------------------------
# 5. A pass is remembered, keyed by the file's content


def test_a_passed_gate_is_remembered_until_the_file_changes(shape_files, tmp_path, gate_dir, monkeypatch):
    path = shutil.copy(shape_files("llama3"), tmp_path / "tokenizer.json")
    real, checks = hf_fast.check_exact, []

    def counting(*args, **kwargs):
        checks.append(1)
        return real(*args, **kwargs)

    def refusing(*_args, **_kwargs):
        raise AssertionError("the gate ran again")

    real_points = hf_fast.differing_points

    monkeypatch.setattr(hf_fast, "check_exact", counting)
    assert load_tokenizer(str(path), "auto", warn=pytest.fail).backend == "splintr"
    assert len(checks) == 1 and len(list(gate_dir.glob("*.json"))) == 1
    monkeypatch.setattr(hf_fast, "check_exact", refusing)
    monkeypatch.setattr(hf_fast, "differing_points", refusing)
    assert load_tokenizer(str(path), "auto", warn=pytest.fail).backend == "splintr"
    elsewhere = shutil.copy(path, tmp_path / "same-bytes.json")  # the same bytes under another name
    assert load_tokenizer(str(elsewhere), "splintr").backend == "splintr"

    tok = tokenizers.Tokenizer.from_file(str(path))
    tok.add_tokens(["<|one more|>"])
    tok.save(str(path))
    monkeypatch.setattr(hf_fast, "check_exact", counting)
    monkeypatch.setattr(hf_fast, "differing_points", real_points)
    changed = load_tokenizer(str(path), "auto", warn=pytest.fail)
    assert changed.backend == "splintr" and len(checks) == 2 and len(list(gate_dir.glob("*.json"))) == 2
    assert_same_ids(changed, path, ["a <|one more|> b", "<|one more|><|one more|>"])


# ---------------------------------------------------------------------------------------------
# 6. Text with code points newer than Python's Unicode tables goes to tokenizers


NEWER = ["a\U0001611e\U0001611e", "\U0001611e\U0001611e's", "a\U0001611e\U0001611f 12", "x\U00016121"]


@pytest.fixture
def qwen2(shape_files, accelerated):
    # Gurung Khema (Unicode 16): two vowel signs that Unicode 16's NFC composes into one, which
    # tokenizers' tables do not know (splintr's do).
    assert all(unicodedata.category(c) == "Cn" for c in "\U0001611e\U0001611f\U00016121"), "Python knows Unicode 16"
    tok = accelerated("qwen2")
    assert tok.backend == "splintr"
    return tok, shape_files("qwen2")


def test_code_points_newer_than_pythons_tables_are_encoded_as_tokenizers_does(qwen2):
    tok, path = qwen2
    plain = vocab_shapes.local_documents()[:6]
    for text in NEWER:
        assert_same_ids(tok, path, [plain[0], text])
    mixed = [plain[0], NEWER[0], plain[1], plain[2], NEWER[1], NEWER[2], plain[3], "", NEWER[3], plain[4], plain[5]]
    assert_same_ids(tok, path, mixed)
    assert_same_ids(tok, path, plain)  # none routed


def test_a_pair_of_surrogates_spelling_a_newer_code_point_is_routed(qwen2):
    """splintr is given the repaired text, where the pair becomes the character it spells (here
    Gurung Khema's U+1612F, unassigned in Python's tables): routed as that character would be."""
    tok, path = qwen2
    spelled = "".join(chr(u) for u in (0xD818, 0xDD2F))
    assert len(spelled) == 2 and utf8_safe(spelled) == "\U0001612f"
    for text in (f"a{spelled}{spelled} x", f"{spelled}'s a{spelled}\u0334\u0301{spelled} 1"):
        tokens, _ = tok.encode_batch([text])
        assert tokens.tolist() == truth(path, [utf8_safe(text)])[0]


def test_an_ascii_code_point_the_gate_found_is_routed_too(shape_files, accelerated):
    """The gate may find an ASCII code point where the two libraries differ (a normalizer that
    maps U+0000, say): texts holding it go to tokenizers even when they are all ASCII."""
    tok = accelerated("llama3")
    routed, real = [], tok._encode_reference
    tok._encode_reference = lambda texts: routed.extend(texts) or real(texts)
    tok.route([ord("~")])
    texts = ["plain text", "a ~ tilde", "ünïcode"]
    assert_same_ids(tok, shape_files("llama3"), texts)
    assert routed == ["a ~ tilde"]
    tok.route([])
    routed.clear()
    assert_same_ids(tok, shape_files("llama3"), texts)
    assert routed == []


# A batch whose every text is routed (an input whose work item holds only such documents).
@pytest.mark.parametrize("n", [1, 4])
def test_a_batch_of_newer_code_points_only(qwen2, n):
    tok, path = qwen2
    assert_same_ids(tok, path, NEWER[:n])


# ---------------------------------------------------------------------------------------------
# 7. The tokenizers backend repairs lone surrogates


@pytest.mark.parametrize("kind", ["llama3", "gemma"])
def test_the_tokenizers_backend_encodes_a_lone_surrogate_as_ufffd(kind, shape_files):
    path = shape_files(kind)
    tok = load_tokenizer(str(path), "tokenizers")
    assert tok.backend == "tokenizers"
    tokens, lengths = tok.encode_batch(["a\ud800b", "ok", "\udfff\ud83d\ude00"])
    ref = tokenizers.Tokenizer.from_file(str(path))
    ref.encode_special_tokens = True
    want = [ref.encode(t, add_special_tokens=False).ids for t in ["a\ufffdb", "ok", "\ufffd\U0001f600"]]
    assert lengths.tolist() == [len(w) for w in want]
    assert tokens.tolist() == [i for w in want for i in w]


# ---------------------------------------------------------------------------------------------
# 8. The metadata's vocab_format, for old metadata too


def _tokenizer_entry(**extra):
    return {"name": "x", "n_vocab": 100, "eot_id": 5, "ranks_sha256": "0" * 64, **extra}


@pytest.mark.parametrize(("backend", "vocab_format"),
                         [("tokenizers", "tokenizer.json"), ("splintr", "tiktoken"), ("tiktoken", "tiktoken"),
                          (None, "tiktoken")])  # fmt: skip
def test_old_metadata_without_vocab_format(backend, vocab_format):
    raw = _tokenizer_entry(**({"backend": backend} if backend else {}))
    info = TokenizerInfo.parse(raw)
    assert info.vocab_format == vocab_format and info.hugging_face == (vocab_format == "tokenizer.json")
    assert TokenizerInfo.parse(info.to_json()) == info


def test_vocab_format_is_recorded_and_an_unknown_one_is_refused():
    info = TokenizerInfo.parse(_tokenizer_entry(backend="splintr", vocab_format="tokenizer.json"))
    assert info.hugging_face and info.to_json()["vocab_format"] == "tokenizer.json"
    with pytest.raises(_Invalid, match="'vocab_format' 'bogus' is not one of tiktoken, tokenizer.json"):
        TokenizerInfo.parse(_tokenizer_entry(backend="tokenizers", vocab_format="bogus"))
