"""A Hugging Face vocabulary end to end: prepare → inspect → loader, with ids above 65,535.

The vocabulary is the Llama-3-like byte-level BPE built in test_hf_tokenizer (more than 65,536
ids; <|begin_of_text|> and <|end_of_text|> above them; a post-processor that adds the BOS). The
truth is the `tokenizers` library's own encoding of each document, plus the separators the
metadata records, read back with numpy from the raw .bin files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from conftest import read_docs, write
from test_hf_tokenizer import BOT, EOT, big  # noqa: F401  (big: the module-scoped vocabulary fixture)

from lmshard.errors import ConfigError
from lmshard.format import load_metadata
from lmshard.inspect.audit import decoder_for
from lmshard.inspect.verify import verify_dataset
from lmshard.prepare import PrepareConfig, prepare
from lmshard.runtime import TokenDataset


@pytest.fixture(autouse=True)
def _restore_parallelism(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # the backend sets it for its process


def test_append_takes_the_same_tokenizer_file_spelled_another_way(tmp_path, corpus, big, monkeypatch):  # noqa: F811
    first = _prepare(tmp_path, corpus, big)
    more = write(tmp_path / "more.jsonl", "".join(json.dumps({"text": f"{t} (again)"}) + "\n" for t in corpus[1]))
    monkeypatch.chdir(big["file"].parent)
    cfg = PrepareConfig(inputs=[str(more)], out=str(tmp_path / "ds"), tokenizer=f"./{big['file'].name}",
                        val_fraction=0.1, tokens_per_shard=2000, append=True)  # fmt: skip
    meta = prepare(cfg)
    assert meta.total_docs == 2 * first.total_docs
    other = tmp_path / "other.json"
    other.write_text(big["file"].read_text().replace('"<|end_of_text|>"', '"<|end_of_texts|>"', 1))
    with pytest.raises(ConfigError, match="--append: the dataset was tokenized with"):
        prepare(PrepareConfig(inputs=[str(more)], out=str(tmp_path / "ds"), tokenizer=str(other), append=True,
                              separator="<|end_of_texts|>", val_fraction=0.1, tokens_per_shard=2000))  # fmt: skip


@pytest.fixture(scope="module")
def corpus(big, tmp_path_factory):  # noqa: F811
    """Documents made of words whose ids are above 65,535, mixed with prose, unicode and text
    that looks like the special tokens."""
    high = big["high_words"]
    texts = [f"{' '.join(high[7 * i : 7 * i + 7])} doc {i} é 日本 {BOT if i % 5 == 0 else ''}" for i in range(300)]
    texts += [f"plain prose number {i}, {EOT} inside" for i in range(20)]
    path = tmp_path_factory.mktemp("hfin") / "docs.jsonl"
    write(path, "".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path, texts


def _special_ids(big):  # noqa: F811
    ref = tokenizers.Tokenizer.from_file(str(big["file"]))
    return ref.token_to_id(BOT), ref.token_to_id(EOT)


def _prepare(tmp_path, corpus, big, **kw):  # noqa: F811
    cfg = PrepareConfig(inputs=[str(corpus[0])], out=str(tmp_path / "ds"), tokenizer=str(big["file"]),
                        val_fraction=0.1, tokens_per_shard=2000, **kw)  # fmt: skip
    return prepare(cfg)


def _expected(big, texts, specials):  # noqa: F811
    ref = tokenizers.Tokenizer.from_file(str(big["file"]))
    ref.encode_special_tokens = True  # the special-looking text is ordinary text, as in prepare
    return [[*specials[0], *e.ids, *specials[1]] for e in ref.encode_batch(texts, add_special_tokens=False)]


def test_round_trip_with_ids_above_65535(tmp_path, corpus, big, eager_pool):  # noqa: F811
    meta = _prepare(tmp_path, corpus, big, workers=2)
    root = tmp_path / "ds"
    bos, eot = _special_ids(big)
    assert bos > 0xFFFF and eot > 0xFFFF
    tok = meta.tokenizer
    assert (tok.backend, tok.vocab_format, tok.bos_id, tok.eot_id) == ("splintr", "tokenizer.json", bos, eot)
    assert tok.ranks_sha256 == hashlib.sha256(big["file"].read_bytes()).hexdigest()
    assert (root / "tokenizer.json").read_bytes() == big["file"].read_bytes()
    # Every document, in input order across both splits, is BOS + tokenizers' ids + EOT.
    docs = {tuple(d.tolist()) for split in ("train", "val") for d in read_docs(root, split)}
    expected = _expected(big, corpus[1], ([bos], [eot]))
    assert docs == {tuple(e) for e in expected} and len(expected) == meta.n_docs()
    train = read_docs(root, "train")
    assert [d.tolist() for d in train] == [e for e in expected if tuple(e) in {tuple(t.tolist()) for t in train}]
    high = np.concatenate(train)
    assert int(high.max()) > 0xFFFF and int((high > 0xFFFF).sum()) > 1000
    # The special-looking text inside documents never became a special id.
    assert sum(int((d == bos).sum()) for d in train) == len(train)
    assert sum(int((d == eot).sum()) for d in train) == len(train)

    report = verify_dataset(root)
    assert report.ok, report.problems
    decode = decoder_for(load_metadata(root))
    assert decode is not None and decode(train[0].tolist()) == f"{BOT}{corpus[1][0]}{EOT}"

    ds = TokenDataset(root, split="train")
    assert (ds.bos_id, ds.eot_id, ds.vocab_size) == (bos, eot, tok.n_vocab)
    assert ds.vocab_size > 0xFFFF + 2


def test_inspect_decodes_with_the_datasets_copy_and_catches_a_swapped_one(tmp_path, corpus, big):  # noqa: F811
    _prepare(tmp_path, corpus, big)
    root = tmp_path / "ds"
    moved = shutil.copy(big["file"], tmp_path / "elsewhere.json")
    big["file"].rename(tmp_path / "gone.json")  # the file the dataset was prepared from is gone
    try:
        decode = decoder_for(load_metadata(root))
        assert decode is not None and decode(read_docs(root, "train")[0].tolist()).startswith(BOT)
        (root / "tokenizer.json").write_bytes(big["plain"].read_bytes())  # another vocabulary
        report = verify_dataset(root, quick=True)
        assert not report.ok and any("tokenizer.json" in str(p) and "sha256" in str(p) for p in report.problems)
        why: list[str] = []
        assert decoder_for(load_metadata(root), why) is None
        assert "tokenizer.json" in why[0] and "sha256" in why[0]
    finally:
        (tmp_path / "gone.json").rename(big["file"])
    assert moved.exists()


def test_a_damaged_bos_is_reported(tmp_path, corpus, big):  # noqa: F811
    meta = _prepare(tmp_path, corpus, big)
    shard = tmp_path / "ds" / meta.split_shards("train")[0].path
    tokens = np.fromfile(shard, dtype="<u4")
    tokens[0] = 5  # the first document's BOS
    tokens.tofile(shard)
    problems = [str(p) for p in verify_dataset(tmp_path / "ds").problems]
    assert any(f"1 document starts without the BOS token {meta.tokenizer.bos_id}" in p for p in problems), problems


def test_bos_and_separator_options(tmp_path, corpus, big):  # noqa: F811
    bos, eot = _special_ids(big)
    meta = _prepare(tmp_path, corpus, big, bos="no", eot_position="before")
    assert meta.tokenizer.bos_id is None
    docs = read_docs(tmp_path / "ds", "train")
    assert all(d[0] == eot and bos not in d.tolist() for d in docs)
    meta = _prepare(tmp_path, corpus, big, overwrite=True, separator=BOT, bos="no")
    assert meta.tokenizer.eot_id == bos and all(d[-1] == bos for d in read_docs(tmp_path / "ds", "train"))
    with pytest.raises(ConfigError, match="--append.*--separator"):
        _prepare(tmp_path, corpus, big, append=True)  # the dataset's separator differs
    with pytest.raises(ConfigError, match="no BOS token"):
        prepare(PrepareConfig(inputs=[str(corpus[0])], out=str(tmp_path / "g"), tokenizer="gpt2", bos="yes"))


# --- the command line, in a subprocess as a user runs it ---------------------------------------


def _lmshard(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("lmshard")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, env=env, check=False)


def test_an_uncached_hub_name_fails_with_one_line_offline(tmp_path, corpus):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = _lmshard("prepare", str(corpus[0]), "--out", str(tmp_path / "o"), "--tokenizer", "org/not-cached",
                    env=env)  # fmt: skip
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    assert "not in the local Hugging Face cache" in errors[0] and "hf download org/not-cached" in errors[0]
    assert "Traceback" not in done.stderr and not (tmp_path / "o").exists()


def test_cli_prepare_and_inspect_a_tokenizer_json(tmp_path, corpus, big):  # noqa: F811
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = _lmshard("prepare", str(corpus[0]), "--out", str(tmp_path / "o"), "--tokenizer", str(big["file"]), env=env)
    assert done.returncode == 0, done.stderr
    bos, eot = _special_ids(big)
    assert f"EOT {eot}, BOS {bos}; splintr" in " ".join(done.stdout.split())
    done = _lmshard("inspect", str(tmp_path / "o"), "--doc", "train/shard_000000:0", "--json", env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["tokenizer"]["bos_id"] == bos
    assert report["samples"][0]["text"] == corpus[1][0]  # its own text: no BOS before it, no EOT after it


def test_inspect_never_reads_a_fifo_or_huge_file_named_by_untrusted_metadata(
    tmp_path,
    corpus,
    big,  # noqa: F811
    monkeypatch,
):
    from lmshard.tokenizers.hf_backend import HFTokenizer

    _prepare(tmp_path, corpus, big)
    real, read = HFTokenizer._read, []

    def spy(path, *args):
        read.append(str(path))
        return real(path, *args)

    monkeypatch.setattr(HFTokenizer, "_read", staticmethod(spy))
    root = tmp_path / "ds"
    (root / "tokenizer.json").unlink()
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(300 << 20)  # sparse: larger than any tokenizer.json
    directory = tmp_path / "tokdir"  # a save_pretrained directory: its files are not bounded
    directory.mkdir()
    shutil.copy(big["file"], directory / "tokenizer.json")
    meta_path = root / "dataset_metadata.json"
    for target in (fifo, huge, directory):
        meta = json.loads(meta_path.read_text())
        meta["tokenizer"]["name"] = str(target)
        meta_path.write_text(json.dumps(meta))
        why: list[str] = []
        assert decoder_for(load_metadata(root), why) is None  # returns: a FIFO read would block forever
        assert "tokenizer.json" in why[0]
    assert read == [], "a file named by the metadata was read"


def test_inspect_reads_the_copy_alone_and_a_hub_name_from_the_cache_only(
    tmp_path,
    corpus,
    big,  # noqa: F811
    monkeypatch,
):
    """Config files planted beside the dataset's tokenizer.json copy are never read, and a hub
    name in the metadata is looked up in the local cache only: no download, no network probe,
    even with HF_HUB_OFFLINE unset."""
    import lmshard.tokenizers.hf_backend as hf_backend
    import lmshard.tokenizers.hf_resolve as hf_resolve

    _prepare(tmp_path, corpus, big)
    root = tmp_path / "ds"
    huge = root / "tokenizer_config.json"
    with open(huge, "wb") as f:
        f.truncate(300 << 20)
    (root / "special_tokens_map.json").symlink_to("/dev/zero")
    configs_read = []
    real = hf_backend._read_configs
    monkeypatch.setattr(hf_backend, "_read_configs", lambda c: configs_read.append(dict(c)) or real(c))
    decode = decoder_for(load_metadata(root))
    assert decode is not None and configs_read == [{}]

    def no_network(*_a, **_k):
        raise AssertionError("inspect went to the network")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(hf_resolve, "_download", no_network)
    monkeypatch.setattr(hf_resolve, "_unreachable", no_network)
    (root / "tokenizer.json").unlink()
    meta = json.loads((root / "dataset_metadata.json").read_text())
    meta["tokenizer"]["name"] = "some-org/some-model"
    (root / "dataset_metadata.json").write_text(json.dumps(meta))
    why: list[str] = []
    assert decoder_for(load_metadata(root), why) is None and "tokenizer.json" in why[0]


def test_verify_hashes_the_copy_in_blocks_and_refuses_an_oversized_one(
    tmp_path,
    corpus,
    big,  # noqa: F811
    monkeypatch,
):
    import lmshard.format.files as files_mod

    _prepare(tmp_path, corpus, big)
    root = tmp_path / "ds"
    assert verify_dataset(root).ok
    monkeypatch.setattr(files_mod, "MAX_TOKENIZER_BYTES", 1000)  # (read_small's cap)
    report = verify_dataset(root, quick=True)
    assert not report.ok and any("not read" in p.what for p in report.problems), report.problems


def test_truncation_or_padding_saved_in_the_file_never_cut_a_document(tmp_path, big):  # noqa: F811
    from lmshard.tokenizers.hf_backend import HFTokenizer

    tok = tokenizers.Tokenizer.from_file(str(big["file"]))
    tok.enable_truncation(max_length=8)
    tok.enable_padding(pad_id=5)
    tok.save(str(tmp_path / "tokenizer.json"))
    texts = [" ".join(big["high_words"][:30]) + " and more words", "hi"]
    tokens, lengths = HFTokenizer(str(tmp_path / "tokenizer.json")).encode_batch(texts)
    assert lengths.tolist() == [len(ids) for ids in _expected(big, texts, ([], []))]
    assert tokens.tolist() == [i for ids in _expected(big, texts, ([], [])) for i in ids] and lengths[0] > 8
