"""The Hugging Face tokenizer backend, on tokenizers built here (no downloads). The independent
truth for ids is the `tokenizers` library itself, loaded from the same file with its defaults;
for the hub cache layout it is huggingface_hub's own cache scanner and offline lookup."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors

from lmshard.errors import TokenizerError
from lmshard.tokenizers import load_tokenizer
from lmshard.tokenizers.hf_backend import HFTokenizer

LETTERS = "abcdefghijklmnopqrstuvwxyz"
BOT, EOT = "<|begin_of_text|>", "<|end_of_text|>"
N_WORDS = 70_000  # four-letter tokens: with 256 bytes and 676 pairs, ids reach about 70,900


@pytest.fixture(autouse=True)
def _restore_parallelism(monkeypatch):
    # HFTokenizer sets TOKENIZERS_PARALLELISM for its process; keep that out of other tests.
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


def byte_level(vocab: dict[str, int], merges: list[tuple[str, str]]) -> tokenizers.Tokenizer:
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def with_bos_template(tok: tokenizers.Tokenizer, bos: str) -> None:
    """Llama 3's post-processor: ByteLevel, then a template putting BOS before each text."""
    template = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), template])


def alphabet() -> dict[str, int]:
    return {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}


def small(tmp: Path, specials: list[str], *, plain: list[str] = (), bos_template: str | None = None) -> Path:
    """A byte-level tokenizer.json of 256 byte tokens plus `specials` (special) and `plain`
    (ordinary added tokens), saved as tmp/tokenizer.json."""
    tok = byte_level(alphabet(), [])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens(list(plain))
    if bos_template:
        with_bos_template(tok, bos_template)
    tmp.mkdir(parents=True, exist_ok=True)
    tok.save(str(tmp / "tokenizer.json"))
    return tmp / "tokenizer.json"


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A Llama-3-like byte-level BPE with more than 65,536 ids: 256 bytes, all 676 letter pairs,
    70,000 four-letter words (pair + pair) in random order, then <|begin_of_text|> and
    <|end_of_text|> above them and a post-processor that puts BOS before each text. Saved with
    the special tokens (big.json) and without (plain.json: the truth for special-looking text)."""
    rng = random.Random(7)
    vocab = alphabet()
    pairs = ["".join(p) for p in itertools.product(LETTERS, repeat=2)]
    rng.shuffle(pairs)
    merges = [(p[0], p[1]) for p in pairs]
    words = rng.sample([a + b for a, b in itertools.product(pairs, repeat=2)], N_WORDS)
    merges += [(w[:2], w[2:]) for w in words]
    for token in pairs + words:
        vocab[token] = len(vocab)
    tmp = tmp_path_factory.mktemp("big")
    byte_level(vocab, merges).save(str(tmp / "plain.json"))
    tok = byte_level(vocab, merges)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (BOT, EOT)])
    with_bos_template(tok, BOT)
    tok.save(str(tmp / "big.json"))
    # Words BPE really forms whole: the middle pair must not merge before both outer ones.
    rank = {p: i for i, p in enumerate(pairs)}
    high = [w for w in words if vocab[w] > 0xFFFF and rank[w[1:3]] > min(rank[w[:2]], rank[w[2:]])]
    return {"file": tmp / "big.json", "plain": tmp / "plain.json", "high_words": high, "vocab": vocab}


@pytest.fixture(scope="module")
def hf_big(big):
    return HFTokenizer(str(big["file"]))


@pytest.fixture(scope="module")
def reference(big):
    """tokenizers' own loading of big.json, with its defaults (specials parsed in text)."""
    return tokenizers.Tokenizer.from_file(str(big["file"]))


def reference_ids(ref: tokenizers.Tokenizer | Path, texts: list[str]) -> list[list[int]]:
    ref = tokenizers.Tokenizer.from_file(str(ref)) if isinstance(ref, Path) else ref
    return [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]


# --- encoding against the library's own encode_batch ----------------------------------------

words = st.sampled_from(["the", " cat", "abcd", " zz", "\n", "  ", "é", "日本", "🙂", "<|", "|>"])
texts = st.lists(st.one_of(st.text(max_size=40), st.lists(words, max_size=20).map("".join)), max_size=8)


@settings(max_examples=80, deadline=None)
@given(texts)
def test_encode_batch_equals_tokenizers(reference, hf_big, texts):
    tokens, lengths = hf_big.encode_batch(texts)
    expected = reference_ids(reference, texts)
    assert tokens.dtype == np.dtype("<u4") and lengths.dtype == np.int64
    assert lengths.tolist() == [len(e) for e in expected]
    assert tokens.tolist() == [i for e in expected for i in e]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    assert [hf_big.decode(tokens[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=True)] == texts


def test_ids_above_65535_come_back_intact(big, reference, hf_big):
    text = " ".join(big["high_words"][:200])
    tokens, _ = hf_big.encode_batch([text])
    expected = reference_ids(reference, [text])[0]
    assert tokens.tolist() == expected
    assert int(tokens.max()) > 0xFFFF  # would wrap if anything on the way were 16-bit
    assert {big["vocab"][w] for w in big["high_words"][:200]} <= set(tokens.tolist())


def test_special_token_text_is_ordinary_text(big, reference, hf_big):
    text = f"a document that mentions {EOT} and {BOT} in its prose"
    tokens, _ = hf_big.encode_batch([text])
    assert tokens.tolist() == reference_ids(big["plain"], [text])[0]  # as if the specials did not exist
    assert hf_big.eot_id not in tokens.tolist() and hf_big.bos_id not in tokens.tolist()
    assert hf_big.eot_id in reference_ids(reference, [text])[0]  # the library's default would
    assert hf_big.decode(tokens) == text


def test_no_special_tokens_added_and_empty_input(hf_big):
    tokens, lengths = hf_big.encode_batch(["x"])
    assert hf_big.bos_id not in tokens.tolist() and lengths.tolist() == [1]
    tokens, lengths = hf_big.encode_batch([])
    assert tokens.dtype == np.dtype("<u4") and tokens.size == 0 and lengths.size == 0


# --- what the tokenizer reports ---------------------------------------------------------------


def test_identity_of_a_tokenizer_json(big, reference, hf_big):
    raw = big["file"].read_bytes()
    data = json.loads(raw)
    top = max([*data["model"]["vocab"].values(), *(t["id"] for t in data["added_tokens"])])
    ident = hf_big.identity()
    assert hf_big.n_vocab == ident["n_vocab"] == top + 1 > 0x10000
    assert ident["ranks_sha256"] == hf_big.vocab_sha256 == hashlib.sha256(raw).hexdigest()
    assert hf_big.vocab_file == big["file"] and hf_big.name == str(big["file"])
    assert (ident["eot_token"], ident["eot_id"]) == (EOT, reference.token_to_id(EOT))
    assert (ident["bos_token"], ident["bos_id"]) == (BOT, reference.token_to_id(BOT))
    assert ident["adds_bos"] is True  # from the post-processor alone: there is no config file
    assert ident["source"] == {"kind": "file"} and ident["backend"] == "tokenizers"
    assert ident["tokenizers_version"] == tokenizers.__version__
    json.dumps(ident)  # written as tokenizer_state.json


def save_pretrained_dir(tmp: Path, source: Path, config: dict, special_map: dict | None = None) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tokenizer.json").write_bytes(source.read_bytes())
    (tmp / "tokenizer_config.json").write_text(json.dumps(config))
    if special_map is not None:
        (tmp / "special_tokens_map.json").write_text(json.dumps(special_map))
    return tmp


def test_save_pretrained_directory_config_decides(tmp_path, big):
    eos = {"__type": "AddedToken", "content": EOT, "special": True}  # the dict form
    path = save_pretrained_dir(tmp_path / "d", big["file"], {"eos_token": eos, "bos_token": BOT,
                                                             "add_bos_token": False})  # fmt: skip
    tok = load_tokenizer(str(path))
    assert isinstance(tok, HFTokenizer) and tok.vocab_file == path / "tokenizer.json"
    assert (tok.eot_token, tok.bos_token) == (EOT, BOT)
    assert tok.adds_bos is False  # the config's explicit add_bos_token wins over the template
    assert tok.identity()["source"] == {"kind": "directory"} and tok.identity()["eot_source"] == "eos_token"


def test_config_adds_bos_without_template(tmp_path):
    path = small(tmp_path / "m", ["<s>", "</s>", "<unk>"])
    (tmp_path / "m" / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}))
    tok = HFTokenizer(str(tmp_path / "m"))
    ref = tokenizers.Tokenizer.from_file(str(path))
    assert (tok.eot_token, tok.eot_id) == ("</s>", ref.token_to_id("</s>"))
    assert (tok.bos_token, tok.bos_id, tok.adds_bos) == ("<s>", ref.token_to_id("<s>"), True)
    assert HFTokenizer(str(path)).adds_bos is True  # the file's path: the config beside it counts too
    (tmp_path / "m" / "tokenizer_config.json").write_text("{}")
    assert HFTokenizer(str(tmp_path / "m")).adds_bos is False  # nothing adds it now


def test_bos_from_the_post_processor_template(tmp_path):
    # A BOS named nowhere but in the template (not one of the well-known names).
    path = small(tmp_path, ["<|startoftext|>", "<|endoftext|>"], bos_template="<|startoftext|>")
    tok = HFTokenizer(str(path))
    bos_id = tokenizers.Tokenizer.from_file(str(path)).token_to_id("<|startoftext|>")
    assert (tok.bos_token, tok.bos_id, tok.adds_bos) == ("<|startoftext|>", bos_id, True)
    assert tok.eot_token == "<|endoftext|>"


@pytest.mark.parametrize("bos", [None, "<missing>", "a"])
def test_config_bos_null_or_not_special_means_none(tmp_path, bos):
    # The config decides even against a well-known name in the vocabulary ("<s>").
    path = small(tmp_path, ["<s>", "</s>"])
    save_pretrained_dir(tmp_path, path, {"bos_token": bos, "add_bos_token": True})
    tok = HFTokenizer(str(tmp_path))
    assert (tok.bos_token, tok.bos_id, tok.adds_bos) == (None, None, False)
    (tmp_path / "tokenizer_config.json").unlink()
    assert HFTokenizer(str(tmp_path)).bos_token == "<s>"


def test_special_tokens_map_overrides_tokenizer_config(tmp_path):
    small(tmp_path, ["<|endoftext|>", "<sep>"])
    save_pretrained_dir(tmp_path, tmp_path / "tokenizer.json", {"eos_token": "<|endoftext|>"},
                        {"eos_token": {"content": "<sep>"}})  # fmt: skip
    assert HFTokenizer(str(tmp_path)).eot_token == "<sep>"


def test_qwen_chat_eos_gives_way_to_document_separator(tmp_path):
    # Qwen2.5 base: tokenizer_config says eos <|im_end|> (chat), bos null; documents are
    # separated by <|endoftext|> in pretraining.
    path = small(tmp_path, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    save_pretrained_dir(tmp_path, path, {"eos_token": "<|im_end|>", "bos_token": None, "pad_token": "<|endoftext|>"})
    tok = HFTokenizer(str(tmp_path))
    ref = tokenizers.Tokenizer.from_file(str(path))
    assert (tok.eot_token, tok.eot_id) == ("<|endoftext|>", ref.token_to_id("<|endoftext|>"))
    assert (tok.bos_token, tok.bos_id, tok.adds_bos) == (None, None, False)
    assert HFTokenizer(str(tmp_path), separator="<|im_end|>").eot_id == ref.token_to_id("<|im_end|>")


def test_separator_override_and_refusals(big, reference, tmp_path):
    assert HFTokenizer(str(big["file"]), separator=BOT).eot_id == reference.token_to_id(BOT)
    small(tmp_path, ["<|endoftext|>", "<|im_end|>"], plain=["<word>"])
    with pytest.raises(TokenizerError, match=r"'<\|eot\|>' is not in the vocabulary; pass a special token") as e:
        HFTokenizer(str(tmp_path), separator="<|eot|>")
    assert "one of: <|endoftext|>, <|im_end|>" in str(e.value) and "\n" not in str(e.value)
    for ordinary in ("a", "<word>"):  # a vocabulary entry and a non-special added token
        with pytest.raises(TokenizerError, match="is an ordinary token"):
            HFTokenizer(str(tmp_path), separator=ordinary)


def test_no_recognisable_eos_asks_for_separator(tmp_path):
    small(tmp_path, ["<pad>", "<mask>"])
    with pytest.raises(TokenizerError, match=r"cannot tell which token separates documents.*--separator") as e:
        HFTokenizer(str(tmp_path / "tokenizer.json"))
    assert "<pad>, <mask>" in str(e.value) and "\n" not in str(e.value)
    assert HFTokenizer(str(tmp_path / "tokenizer.json"), separator="<pad>").eot_token == "<pad>"


# --- bad files ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, words",
    [
        (b'{"version": "1.0", "model": ', "not a JSON tokenizer file"),
        (b"\xff\xfe{}", "not a JSON tokenizer file"),
        (b'{"model": {"type": "BPE"}, "n": ' + b"9" * 5000 + b"}", "not a JSON tokenizer file"),  # int digit cap
        (b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not a JSON tokenizer file"),  # RecursionError
        (b'{"vocab": {"a": 0}}', 'no "model" section'),
        (b'{"version": "1.0", "model": {"type": "NoSuchModel"}}', "not a tokenizer.json this tokenizers version"),
    ],
)
def test_malformed_tokenizer_json_is_one_line_naming_the_file(tmp_path, content, words):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    with pytest.raises(TokenizerError) as e:
        HFTokenizer(str(path))
    assert str(e.value).startswith(str(path)) and words in str(e.value) and "\n" not in str(e.value)


def test_missing_paths(tmp_path):
    with pytest.raises(TokenizerError, match="no such file or directory"):
        load_tokenizer(str(tmp_path / "absent.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerError, match="holds no tokenizer.json"):
        load_tokenizer(str(tmp_path / "empty"))


def hub_spies(monkeypatch) -> list[tuple[str, str]]:
    """Record each cache lookup (repo id, revision), finding nothing; fail on any network use."""
    import lmshard.tokenizers.hf_resolve as hf_resolve

    looked_up: list[tuple[str, str]] = []

    def no_network(*_a, **_k):
        raise AssertionError("went to the network")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hf_resolve, "_cached", lambda repo, rev, _cache: looked_up.append((repo, rev)))
    monkeypatch.setattr(hf_resolve, "_unreachable", lambda: "the hub is unreachable (test)")
    monkeypatch.setattr(hf_resolve, "_download", no_network)
    return looked_up


@pytest.mark.parametrize(
    "spec", ["./tok/tokenizer.json", "./tok", ".tok/x", "../tok/x", "~/lmshard-no-such-dir/tok", "/no/such/tok",
             "no/such/dir", "tok/", "absent.json", "org/name.json"],
)  # fmt: skip
def test_a_missing_path_is_no_such_file_never_a_hub_name(tmp_path, monkeypatch, spec):
    """What can only be a path (a leading . / or ~, a .json name, more than one slash) and names
    nothing is a one-line "no such file", with no cache lookup or network, HF_HUB_OFFLINE unset."""
    monkeypatch.chdir(tmp_path)
    looked_up = hub_spies(monkeypatch)
    for untrusted in (False, True):
        with pytest.raises(TokenizerError) as e:
            load_tokenizer(spec, untrusted=untrusted)
        assert str(e.value) == f"{spec}: no such file or directory (and not a hub name such as org/name)"
    assert looked_up == []


def test_org_name_stays_a_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    looked_up = hub_spies(monkeypatch)
    for spec in ("org/name", "org/name@v1.0", "Org-1/name_2.5"):
        with pytest.raises(TokenizerError, match="not in the local Hugging Face cache .*or pass the path"):
            load_tokenizer(spec)
    assert looked_up == [("org/name", "main"), ("org/name", "v1.0"), ("Org-1/name_2.5", "main")]


# --- hub names from the local cache ---------------------------------------------------------


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def cache_repo(cache: Path, repo_id: str, files: dict[str, bytes], commit: str, ref: str = "main") -> None:
    """A repository as huggingface_hub lays it out: blobs named by etag (sha256 for LFS files like
    tokenizer.json, the git blob sha1 for small ones), snapshot entries as relative symlinks to
    them, and refs/<ref> holding the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "snapshots" / commit).mkdir(parents=True)
    for name, data in files.items():
        etag = hashlib.sha256(data).hexdigest() if name == "tokenizer.json" else git_blob_sha1(data)
        (repo / "blobs" / etag).write_bytes(data)
        (repo / "snapshots" / commit / name).symlink_to(Path("..", "..", "blobs", etag))
    (repo / "refs" / ref).write_text(commit)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    home = tmp_path / "hf_home"
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home / "hub"


def test_hub_name_resolves_from_local_cache_offline(tmp_path, hub, no_network):
    path = small(tmp_path / "src", ["<s>", "</s>", "<doc>"], bos_template="<s>")
    files = {"tokenizer.json": path.read_bytes(),  # the config names a separator no default would pick
             "tokenizer_config.json": json.dumps({"eos_token": "<doc>", "bos_token": "<s>"}).encode()}  # fmt: skip
    commit = hashlib.sha1(b"a commit").hexdigest()
    cache_repo(hub, "some-org/tiny-lm", files, commit)
    from huggingface_hub import hf_hub_download, scan_cache_dir

    scanned = scan_cache_dir(hub)  # the library's own reading of the layout: one repo, one revision
    assert [(r.repo_id, [v.commit_hash for v in r.revisions]) for r in scanned.repos] == [("some-org/tiny-lm",
                                                                                          [commit])]  # fmt: skip
    expected = hf_hub_download("some-org/tiny-lm", "tokenizer.json", cache_dir=hub, local_files_only=True)
    tok = load_tokenizer("some-org/tiny-lm")
    assert no_network == []
    assert isinstance(tok, HFTokenizer) and tok.vocab_file == Path(expected) and tok.name == "some-org/tiny-lm"
    assert tok.vocab_sha256 == hashlib.sha256(files["tokenizer.json"]).hexdigest()
    assert (tok.eot_token, tok.bos_token, tok.adds_bos) == ("<doc>", "<s>", True)
    assert tok.identity()["source"] == {"kind": "hub", "repo_id": "some-org/tiny-lm", "revision": "main",
                                        "commit": commit}  # fmt: skip
    assert HFTokenizer(f"some-org/tiny-lm@{commit}").identity()["source"]["commit"] == commit


def test_hub_cache_variable_wins_over_hf_home(tmp_path, hub, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    path = small(tmp_path / "src", ["<|endoftext|>"])
    cache_repo(elsewhere, "org/other", {"tokenizer.json": path.read_bytes()}, "c" * 40)
    with pytest.raises(TokenizerError, match="not in the local Hugging Face cache"):
        HFTokenizer("org/other")
    monkeypatch.setenv("HF_HUB_CACHE", str(elsewhere))
    assert HFTokenizer("org/other").eot_token == "<|endoftext|>"


def assert_not_cached(spec: str, cache: Path, command: str, tried: list[object], probes: int = 0) -> str:
    """`tried`: the connections attempted (the no_network fixture); at most `probes` of them, so
    the answer never waits on retries, however slow the machine."""
    with pytest.raises(TokenizerError) as e:
        load_tokenizer(spec)
    assert len(tried) <= probes, tried
    message = str(e.value)
    assert "\n" not in message and "not in the local Hugging Face cache" in message
    assert str(cache) in message and f"`{command}`" in message and "or pass the path of a tokenizer.json" in message
    return message


def test_uncached_name_fails_fast_with_the_fix(tmp_path, hub, no_network):
    files = "tokenizer.json tokenizer_config.json special_tokens_map.json"
    message = assert_not_cached("meta-llama/Meta-Llama-3-8B", hub, f"hf download meta-llama/Meta-Llama-3-8B {files}",
                                no_network)  # fmt: skip
    assert "HF_HUB_OFFLINE is set" in message
    cache_repo(hub, "org/tiny", {"tokenizer.json": small(tmp_path, ["</s>"]).read_bytes()}, "d" * 40)
    assert_not_cached("org/tiny@v2", hub, f"hf download org/tiny {files} --revision v2", no_network)  # not this rev


def test_uncached_name_with_unreachable_hub_fails_fast(hub, monkeypatch, no_network):
    # Online mode, but the endpoint refuses connections: one probe, no retries with backoff.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    message = assert_not_cached("org/absent", hub, "hf download org/absent tokenizer.json tokenizer_config.json "
                                                    "special_tokens_map.json", no_network, probes=1)  # fmt: skip
    assert "unreachable" in message


# --- threads --------------------------------------------------------------------------------

THREAD_PROBE = textwrap.dedent(
    """
    import os, sys
    from lmshard.tokenizers.hf_backend import HFTokenizer
    texts = ["some text to encode, " * 50] * 256
    def threads():
        return len(os.listdir("/proc/self/task"))
    before = threads()
    HFTokenizer(sys.argv[1]).encode_batch(texts)
    single = threads()
    HFTokenizer(sys.argv[1], threads=2).encode_batch(texts)
    print(before, single, threads())
    """
)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads through /proc")
def test_default_is_single_threaded_and_threads_2_starts_a_pool(tmp_path):
    path = small(tmp_path, ["<|endoftext|>"])
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", THREAD_PROBE, str(path)], capture_output=True, text=True,
                         env=env, check=True, timeout=60).stdout  # fmt: skip
    before, single, pooled = map(int, out.split())
    assert single == before  # threads=1: the Rayon pool never started
    assert pooled > single  # and the probe can tell when it does


def test_the_callers_environment_is_left_as_it_was(tmp_path, monkeypatch):
    """The parallelism switches are set around each encode call, never left behind."""
    path = small(tmp_path, ["<|endoftext|>"])
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")  # the caller's own choice
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    tok = HFTokenizer(str(path), threads=1)
    seen = []

    class Spy:  # the library's tokenizer, recording the environment it encodes under
        def __init__(self, inner):
            self.inner = inner

        def encode_batch(self, *a, **k):
            seen.append(os.environ.get("TOKENIZERS_PARALLELISM"))
            return self.inner.encode_batch(*a, **k)

        encode_batch_fast = encode_batch

    tok._lazy["tok"] = Spy(tok._tok)  # (the object `_tok` builds on first use)
    tokens, _ = tok.encode_batch(["some words", "more"])
    assert len(tokens) > 0 and seen == ["false"]
    assert os.environ.get("TOKENIZERS_PARALLELISM") == "true" and "RAYON_NUM_THREADS" not in os.environ


def test_a_config_nested_too_deeply_is_one_line(tmp_path):
    small(tmp_path / "m", ["<|endoftext|>"])
    (tmp_path / "m" / "tokenizer_config.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json: not a readable JSON file .*; fix or delete it"):
        HFTokenizer(str(tmp_path / "m"))
