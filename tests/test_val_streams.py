"""Per-domain evaluation streams (`TokenDataset.val_streams`, `Mixture.val_streams`,
runtime/valstreams.py). Independent truths: numpy reading the val split's raw `.bin`, `.idx` and
`.src` files, and the reference tokenizer's decoding with the dedup key and MinHash bands
computed here from the decoded text."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import xxhash

from lmshard import Mixture, TokenDataset
from lmshard.errors import ArgumentError
from lmshard.format import load_metadata
from lmshard.prepare import PrepareConfig, prepare
from lmshard.quality.minhash import MinHashConfig, band_keys, signature

WORDS = ["river", "stone", "light", "cloud", "paper", "window", "garden", "music", "table", "bread", "storm", "glass"]


def _docs(name: str, n: int, rng: random.Random) -> list[str]:
    return [f"{name} {i}: " + " ".join(rng.choices(WORDS, k=rng.randint(20, 120))) for i in range(n)]


@pytest.fixture(scope="module")
def domains(tmp_path_factory):
    """Two inputs with exact and near copies planted across them (and within each), prepared
    with --near-dedup; and the same without it."""
    root = tmp_path_factory.mktemp("valstreams")
    rng = random.Random(3)
    web, code = _docs("web", 700, rng), _docs("code", 500, rng)
    code += web[:40]  # exact copies of web documents
    code += [t.replace(" ", "  ", 1) + " river" for t in web[40:80]]  # near copies (one word more)
    inputs = []
    for name, texts in (("web", web), ("code", code)):
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        inputs.append(str(path))
    near = root / "near"
    prepare(PrepareConfig(inputs=inputs, out=str(near), val_fraction=0.2, near_dedup=True, workers=1, quiet=True,
                          tokens_per_shard=20_000))  # fmt: skip
    plain = root / "plain"
    prepare(PrepareConfig(inputs=inputs, out=str(plain), val_fraction=0.2, workers=1, quiet=True))
    return near, plain, inputs


def _split_docs(root: Path, split: str) -> tuple[list[np.ndarray], np.ndarray]:
    """The split's documents (tokens, separator included) and each one's input number."""
    meta = load_metadata(root)
    docs, sources = [], []
    for shard in meta.split_shards(split):
        tokens = np.fromfile(root / shard.path, dtype="<u4")
        index = np.fromfile(root / shard.index_path, dtype="<u8").astype(np.int64)
        docs += [tokens[a:b] for a, b in zip(index[:-1], index[1:], strict=True)]
        sources.append(np.fromfile(root / shard.src_path, dtype=[("source", "<u4"), ("record", "<u8")])["source"])
    return docs, np.concatenate(sources)


def test_one_stream_per_input_equals_its_val_documents_in_windows(domains):
    near, _, inputs = domains
    streams = TokenDataset(near, "val").val_streams(tokens=3000, seq_len=64, batch_size=5)
    assert list(streams) == inputs
    docs, sources = _split_docs(near, "val")
    for i, name in enumerate(inputs):
        stream = np.concatenate([d for d, s in zip(docs, sources, strict=True) if s == i])
        windows = (min(3000, len(stream)) - 1) // 64
        got = streams[name]
        assert got.windows == windows > 0 and got.tokens == windows * 64
        x = np.concatenate([b[0].numpy() for b in got])
        y = np.concatenate([b[1].numpy() for b in got])
        want = np.stack([stream[w * 64 : w * 64 + 65] for w in range(windows)])
        assert np.array_equal(x, want[:, :-1]) and np.array_equal(y, want[:, 1:])
        assert [len(b[0]) for b in got] == [5] * (windows // 5) + ([windows % 5] if windows % 5 else [])
        again = TokenDataset(near, "val").val_streams(tokens=3000, seq_len=64, batch_size=5)[name]
        assert all(np.array_equal(a[0], b[0]) for a, b in zip(got, again, strict=True))  # the same on every call


def test_the_streams_share_no_document_with_train_exactly_or_nearly(domains, reference):
    near, plain, _ = domains
    config = MinHashConfig(**{k: v for k, v in load_metadata(near).dedup.near["minhash"].items()
                              if k in ("n_grams", "bands", "rows", "threshold", "seed")})  # fmt: skip

    def keyed(root: Path, split: str) -> tuple[set[int], set[int]]:
        texts = [reference.decode(d[:-1].tolist()) for d in _split_docs(root, split)[0]]
        keys = {xxhash.xxh3_64_intdigest(t.encode()) for t in texts}
        bands = {int(k) for t in texts for k in band_keys(signature(t, config), config)[0]}
        return keys, bands

    streamed = TokenDataset(near, "val").val_streams(tokens=10**9, seq_len=32)
    assert sum(s.tokens for s in streamed.values()) > 0
    val_keys, val_bands = keyed(near, "val")  # (every val document is in a stream: tokens=10**9)
    train_keys, train_bands = keyed(near, "train")
    assert not val_keys & train_keys and not val_bands & train_bands
    plain_val, plain_bands = keyed(plain, "val")  # without --near-dedup the planted near copies stay
    plain_train, plain_train_bands = keyed(plain, "train")
    assert not plain_val & plain_train and plain_bands & plain_train_bands  # (so the check above can fail)
    with pytest.warns(UserWarning, match="without --near-dedup"):
        TokenDataset(plain, "val").val_streams(tokens=100, seq_len=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TokenDataset(near, "val").val_streams(tokens=100, seq_len=8)


def test_mixture_streams_and_mistakes(domains):
    near, plain, inputs = domains
    mix = Mixture({str(near): 0.5, str(plain): 0.5})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = mix.val_streams(tokens=500, seq_len=16)
        by = mix.val_streams(tokens=500, seq_len=16, by="input")
    assert list(whole) == mix.names and sorted(by) == sorted(f"{n}/{i}" for n in mix.names for i in inputs)
    one = TokenDataset(near, "val").val_streams(tokens=500, seq_len=16, by=None)["val"]
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(whole[mix.names[0]], one, strict=True))
    with pytest.raises(ArgumentError, match="split='val'"):
        TokenDataset(near).val_streams(tokens=10, seq_len=4)
    with pytest.raises(ArgumentError, match="category attribute"):
        TokenDataset(near, "val").val_streams(tokens=10, seq_len=4, by="language")
    with pytest.raises(ArgumentError, match="seq_len"):
        TokenDataset(near, "val").val_streams(tokens=10, seq_len=0)


def test_one_stream_per_label_of_a_category(tmp_path):
    pytest.importorskip("py3langid")
    rng = random.Random(1)
    english = "the river and stone of a garden is near where we walk with light in the morning"
    german = "der Fluss und Stein des Gartens ist sehr nah wo wir mit Licht am Morgen gehen"
    texts = [" ".join(rng.choices(words.split(" "), k=30)) + "." for words in (english, german) for _ in range(60)]
    (tmp_path / "l.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "ds"
    prepare(PrepareConfig(inputs=[str(tmp_path / "l.jsonl")], out=str(out), val_fraction=0.5, workers=1, quiet=True,
                          attributes=["language"], near_dedup=True))  # fmt: skip
    streams = TokenDataset(out, "val").val_streams(tokens=10**6, seq_len=8, by="language")
    labels = load_metadata(out).attributes[0].labels
    data = (out / load_metadata(out).split_shards("val")[0].attr_path).read_bytes()
    n = load_metadata(out).n_docs("val")
    codes = np.frombuffer(data[: 2 * n], dtype="<u2")
    assert sorted(streams) == sorted({labels[c] for c in codes}) and len(streams) >= 2
    docs, _ = _split_docs(out, "val")
    for label, stream in streams.items():
        tokens = np.concatenate([d for d, c in zip(docs, codes, strict=True) if labels[c] == label])
        assert stream.windows == (len(tokens) - 1) // 8


def test_selections_repeated_inputs_short_domains_and_mixture_sources(domains, tmp_path):
    near, _, inputs = domains
    empty = tmp_path / "noval"  # no val split: a load-time one carves it
    prepare(PrepareConfig(inputs=inputs, out=str(empty), val_fraction=0, workers=1, quiet=True))
    fraction = 0.051332367258146404
    carved = TokenDataset(empty, "train", val_fraction=fraction, split_seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a load-time split warns: held out by number)
        side = TokenDataset(empty, "val", val_fraction=fraction, split_seed=3)
        mix = Mixture([(carved, 1.0), (str(near), 1.0)])
        mixed = mix.val_streams(tokens=10**9, seq_len=8)
        per_input = side.val_streams(tokens=10**9, seq_len=8)
    # a load-time split's val side, reopened from the mixture's train side: exactly that side
    assert mixed[mix.names[0]].store.n_tokens == side.n_tokens
    assert side.n_tokens + carved.n_tokens == TokenDataset(empty).n_tokens
    assert sorted(per_input) == sorted(inputs)  # (by input, within the side)
    assert sum(s.store.n_tokens for s in per_input.values()) == side.n_tokens
    x, y = next(iter(TokenDataset(near, "val").val_streams(tokens=100, seq_len=8, by=None)["val"]))
    assert y.view(-1).shape == (len(y) * 8,) and x.is_contiguous()  # (as a loss's targets.view(-1) needs)
    short = TokenDataset(near, "val").val_streams(tokens=10**9, seq_len=10**6)
    assert short == {}  # every domain too short for one window: none
    # two inputs of one path (the file replaced, then appended): told apart
    path = tmp_path / "x.jsonl"
    rng = random.Random(8)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _docs("first", 200, rng)))
    out = tmp_path / "again"
    prepare(PrepareConfig(inputs=[str(path)], out=str(out), val_fraction=0.2, near_dedup=True, workers=1, quiet=True))
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _docs("second", 200, rng)))
    prepare(PrepareConfig(inputs=[str(path)], out=str(out), val_fraction=0.2, near_dedup=True, workers=1, quiet=True,
                          append=True))  # fmt: skip
    names = sorted(TokenDataset(out, "val").val_streams(tokens=10**9, seq_len=8))
    assert names == [f"{path}#1", f"{path}#2"]
    with pytest.warns(UserWarning, match="no val stream"):
        got = Mixture({str(empty): 0.5, str(near): 0.5}).val_streams(tokens=100, seq_len=8)
    assert list(got) == [str(near)]


def test_a_domain_reads_only_the_indexes_of_the_shards_that_hold_it(tmp_path, monkeypatch):
    rng = random.Random(4)
    inputs = []
    for i in range(6):  # six inputs, one after another in the val split's shards
        path = tmp_path / f"in{i}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _docs(f"input{i}", 60, rng)))
        inputs.append(str(path))
    out = tmp_path / "ds"
    prepare(PrepareConfig(inputs=inputs, out=str(out), val_fraction=0.5, workers=1, quiet=True, near_dedup=True,
                          tokens_per_shard=3000))  # fmt: skip
    val = TokenDataset(out, "val")
    assert len(val.store.shards) >= 4
    reads: list[int] = []
    real = type(val.store).index
    monkeypatch.setattr(type(val.store), "index", lambda self, k: reads.append(k) or real(self, k))
    streams = val.val_streams(tokens=10**9, seq_len=8)
    assert sorted(streams) == inputs
    src = [np.fromfile(out / s.src_path, dtype=[("source", "<u4"), ("record", "<u8")])["source"]
           for s in load_metadata(out).split_shards("val")]  # fmt: skip
    holding = sum(len(np.unique(s)) for s in src)  # (shard, domain) pairs: what opening may read
    assert len(reads) == holding < len(inputs) * len(src)
