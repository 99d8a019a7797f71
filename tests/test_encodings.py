"""Shard encodings (uint16, packed, zstd) against the uint32 dataset of the same inputs: the
truth is the uint32 shards read with numpy. For GPT-2 and for a vocabulary of more than 65,536
ids (test_hf_tokenizer's `big`), every encoding must decode to exactly those tokens, through the
format's reader, `read_document` and every stream of the loader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from test_hf_prepare import corpus as big_corpus  # noqa: F401  (module fixture: documents with ids > 65,535)
from test_hf_tokenizer import big  # noqa: F401  (the > 65,536-id vocabulary)
from test_prepare import jsonl, make_texts
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import ConfigError, FormatError
from lmshard.format import INDEX_DTYPE, TOKEN_DTYPE, Encoding, load_metadata, read_document
from lmshard.format.bitpack import bits_for
from lmshard.format.tokenfile import TokenFile
from lmshard.prepare import PrepareConfig, prepare
from lmshard.runtime import Mixture, TokenDataset

ENCODINGS = ("uint16", "packed", "zstd")


def _prepare(tmp: Path, inputs: list[Path], name: str, encoding: str | None, **kw) -> Path:
    out = tmp / name
    prepare(PrepareConfig(inputs=[str(p) for p in inputs], out=str(out), shard_encoding=encoding, workers=2,
                          val_fraction=0.1, tokens_per_shard=kw.pop("tokens_per_shard", 20_000), quiet=True, **kw))
    return out


def _truth(root: Path, split: str) -> np.ndarray:
    """The uint32 dataset's split, read with numpy."""
    meta = load_metadata(root)
    parts = [np.fromfile(root / s.path, dtype=TOKEN_DTYPE) for s in meta.split_shards(split)]
    return np.concatenate(parts) if parts else np.zeros(0, TOKEN_DTYPE)


@pytest.fixture(scope="module")
def gpt2_sets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("enc")
    src = jsonl(tmp / "docs.jsonl", make_texts(1500, seed=3))
    return {e: _prepare(tmp, [src], e, None if e == "uint32" else e) for e in ("uint32", *ENCODINGS)}


@pytest.fixture(scope="module")
def big_sets(tmp_path_factory, big, big_corpus):  # noqa: F811
    tmp = tmp_path_factory.mktemp("encbig")
    return {e: _prepare(tmp, [big_corpus[0]], e, None if e == "uint32" else e, tokenizer=str(big["file"]),
                        tokens_per_shard=3000)
            for e in ("uint32", "packed", "zstd")}  # fmt: skip


def _check_decodes(sets: dict[str, Path], encoding: str) -> None:
    ref, root = load_metadata(sets["uint32"]), load_metadata(sets[encoding])
    assert root.encoding.name == encoding and ref.encoding.name == "uint32"
    raw = json.loads((sets[encoding] / "dataset_metadata.json").read_text())
    # (zstd with the dictionary it trains is version 3)
    assert raw["encoding"]["name"] == encoding
    assert raw["format_version"] == (3 if "dictionary" in raw["encoding"] else 2)
    assert json.loads((sets["uint32"] / "dataset_metadata.json").read_text())["format_version"] == 1
    assert [s.n_tokens for s in root.shards] == [s.n_tokens for s in ref.shards] and len(ref.shards) > 2
    rng = np.random.default_rng(0)
    for shard, plain in zip(root.shards, ref.shards, strict=True):
        want = np.fromfile(ref.root / plain.path, dtype=TOKEN_DTYPE)
        # the document index is the same file: positions stay in tokens
        assert (root.root / shard.index_path).read_bytes() == (ref.root / plain.index_path).read_bytes()
        f = TokenFile(root.root, shard, root.encoding)
        assert np.array_equal(f.read(0, shard.n_tokens), want)
        for _ in range(30):
            lo = int(rng.integers(0, shard.n_tokens))
            hi = min(shard.n_tokens, lo + int(rng.integers(1, 3000)))
            assert np.array_equal(f.read(lo, hi), want[lo:hi])
        starts = rng.integers(0, shard.n_tokens - 64, 17)
        assert np.array_equal(f.read_rows(starts, 64), want[starts[:, None] + np.arange(64)])
        f.close()
        offsets = np.fromfile(ref.root / plain.index_path, dtype=INDEX_DTYPE)
        i = int(rng.integers(0, shard.n_docs))
        assert np.array_equal(read_document(root, shard, i), want[offsets[i] : offsets[i + 1]])


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_encoding_decodes_to_the_uint32_tokens_gpt2(gpt2_sets, encoding):
    _check_decodes(gpt2_sets, encoding)


@pytest.mark.parametrize("encoding", ["packed", "zstd"])
def test_every_encoding_decodes_to_the_uint32_tokens_above_65535(big_sets, encoding):
    _check_decodes(big_sets, encoding)
    tokens = _truth(big_sets["uint32"], "train")
    assert int(tokens.max()) > 0xFFFF  # the ids a uint16 file could not hold are there
    meta = load_metadata(big_sets[encoding])
    assert meta.encoding.bits == (17 if encoding == "packed" else 24)


def _bytes_per_token(root: Path) -> float:
    meta = load_metadata(root)
    return sum(s.bin_bytes for s in meta.shards) / meta.total_tokens


def test_sizes_per_token(gpt2_sets, big_sets):
    assert _bytes_per_token(gpt2_sets["uint32"]) == 4.0
    assert _bytes_per_token(gpt2_sets["uint16"]) == 2.0
    for sets in (gpt2_sets, big_sets):
        n_vocab = load_metadata(sets["packed"]).tokenizer.n_vocab
        limit = math.ceil(math.log2(n_vocab)) / 8
        assert limit <= _bytes_per_token(sets["packed"]) <= limit * 1.01
        assert _bytes_per_token(sets["zstd"]) < _bytes_per_token(sets["packed"])
    packed = load_metadata(big_sets["packed"])
    assert packed.encoding.bits == bits_for(packed.tokenizer.n_vocab) == 17


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("rss_limit", [None, 0], ids=["mapped", "read"])
def test_the_loader_serves_the_same_batches(gpt2_sets, encoding, rss_limit):
    ref = TokenDataset(gpt2_sets["uint32"], rss_limit=rss_limit)
    ds = TokenDataset(gpt2_sets[encoding], rss_limit=rss_limit)
    assert ds.n_tokens == ref.n_tokens and ds.n_docs == ref.n_docs
    for B, T in ((8, 128), (3, 1500)):  # rows inside one block, and across several
        a, b = iter(ref.random_batches(B, T, seed=5, shift="random")), iter(ds.random_batches(B, T, seed=5,
                                                                                              shift="random"))
        for _ in range(20):
            assert all(np.array_equal(x, y) for x, y in zip(next(a), next(b), strict=True))
    wa, wb = ref.window_batches(4, 256), ds.window_batches(4, 256)
    for _ in range(30):
        assert all(np.array_equal(x, y) for x, y in zip(next(wa), next(wb), strict=True))
    pa, pb = ref.packed(512).batches(4), ds.packed(512).batches(4)
    for _ in range(10):
        x, y = next(pa), next(pb)
        assert np.array_equal(x["input_ids"], y["input_ids"]) and np.array_equal(x["labels"], y["labels"])
    assert np.array_equal(ref.store.doc_lengths(), ds.store.doc_lengths())
    assert np.array_equal(ref.tokens(100, 5000), ds.tokens(100, 5000))


def test_many_batches_equal(gpt2_sets):
    ref, ds = TokenDataset(gpt2_sets["uint32"]), TokenDataset(gpt2_sets["zstd"])
    a, b = iter(ref.random_batches(16, 300, seed=1)), iter(ds.random_batches(16, 300, seed=1))
    for _ in range(50):
        assert all(np.array_equal(x, y) for x, y in zip(next(a), next(b), strict=True))


def test_a_mixture_of_encodings_is_the_mixture_of_their_tokens(gpt2_sets):
    plain = Mixture([(TokenDataset(gpt2_sets["uint32"]), 0.7), (TokenDataset(gpt2_sets["uint32"], split="val"), 0.3)])
    mixed = Mixture([(TokenDataset(gpt2_sets["zstd"]), 0.7), (TokenDataset(gpt2_sets["uint16"], split="val"), 0.3)])
    a, b = iter(plain.random_batches(8, 200, seed=2)), iter(mixed.random_batches(8, 200, seed=2))
    for _ in range(30):
        assert all(np.array_equal(x, y) for x, y in zip(next(a), next(b), strict=True))


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output
    return result.exit_code, " ".join(result.output.split())


def test_uint16_is_refused_for_a_larger_vocabulary_in_one_line(tmp_path, big, big_corpus):  # noqa: F811
    code, out = _cli("prepare", str(big_corpus[0]), "--out", str(tmp_path / "u16"), "--tokenizer", str(big["file"]),
                     "--shard-encoding", "uint16")  # fmt: skip
    size = len(json.loads(big["file"].read_text())["model"]["vocab"]) + 2  # the message names the vocabulary's size
    assert code != 0 and "65,535" in out and f"{size:,}" in out and "packed" in out, out
    assert not (tmp_path / "u16").exists()
    with pytest.raises(ConfigError, match="65,535"):
        Encoding.choose("uint16", 70_000)
    code, out = _cli("prepare", str(big_corpus[0]), "--out", str(tmp_path / "x"), "--shard-encoding", "bzip")
    assert code != 0 and "uint32, uint16, packed, zstd" in out


def test_append_keeps_the_encoding_and_refuses_another(tmp_path):
    first = jsonl(tmp_path / "a.jsonl", make_texts(300, seed=1))
    more = jsonl(tmp_path / "b.jsonl", make_texts(300, seed=2))
    out = _prepare(tmp_path, [first], "ds", "zstd")
    prepare(PrepareConfig(inputs=[str(more)], out=str(out), append=True, workers=2, val_fraction=0.1,
                          tokens_per_shard=20_000, quiet=True))  # fmt: skip
    whole = _prepare(tmp_path, [first, more], "whole", None)
    meta = load_metadata(out)
    assert meta.encoding.name == "zstd" and all(s.blocks_path for s in meta.shards)
    for split in ("train", "val"):
        got = TokenDataset(out, split=split)
        assert np.array_equal(got.tokens(0, got.n_tokens), _truth(whole, split))
    with pytest.raises(ConfigError, match="keeps the dataset's encoding"):
        prepare(PrepareConfig(inputs=[str(more)], out=str(out), append=True, shard_encoding="uint16", quiet=True,
                              val_fraction=0.1))  # fmt: skip
    assert load_metadata(out).config["shard_encoding"] == "zstd"


def test_planned_runs_write_the_same_encoded_bytes(tmp_path):
    src = jsonl(tmp_path / "docs.jsonl", make_texts(800, seed=6))
    local = _prepare(tmp_path, [src], "local", "zstd")
    planned = _prepare(tmp_path, [src], "planned", "zstd", num_tasks=3)
    for rel in load_metadata(local).shards:
        for f in rel.files():
            assert (local / f).read_bytes() == (planned / f).read_bytes()


def test_a_damaged_zstd_block_stops_the_loader_naming_shard_and_block(tmp_path):
    src = jsonl(tmp_path / "docs.jsonl", make_texts(600, seed=8))
    out = _prepare(tmp_path, [src], "ds", "zstd", tokens_per_shard=10**9)
    meta = load_metadata(out)
    shard = meta.split_shards("train")[0]
    offsets = np.fromfile(out / shard.blocks_path, dtype="<u8")
    block = 3
    path = out / shard.path
    data = bytearray(path.read_bytes())
    data[int(offsets[block] + offsets[block + 1]) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    ds = TokenDataset(out)
    with pytest.raises(FormatError, match=rf"shard_000000\.bin: block {block} \(tokens"):
        ds.tokens(block * meta.encoding.block_tokens, 10)
    starts = np.array([block * meta.encoding.block_tokens + 5])
    with pytest.raises(FormatError, match=rf"block {block} "):
        ds.store.read_rows(starts, np.empty((1, 100), np.uint32))


def test_version_2_and_3_metadata_is_held_to_its_encoding(gpt2_sets, tmp_path):
    raw = json.loads((gpt2_sets["zstd"] / "dataset_metadata.json").read_text())
    assert raw["format_version"] == 3 and "dictionary" in raw["encoding"]

    def refused(edit, match: str) -> None:
        doc = json.loads(json.dumps(raw))
        edit(doc)
        root = tmp_path / "m"
        root.mkdir(exist_ok=True)
        (root / "dataset_metadata.json").write_text(json.dumps(doc))
        with pytest.raises(FormatError, match=match):
            load_metadata(root)

    shard = lambda d: d["splits"]["train"]["shards"][0]  # noqa: E731
    refused(lambda d: shard(d).pop("n_bytes"), "'n_bytes' is missing")
    refused(lambda d: shard(d).pop("blocks_path"), "'blocks_path' is missing")
    refused(lambda d: shard(d).pop("sums_path"), "'sums_path' is missing")
    refused(lambda d: d.update(format_version=1), "belong to format version 2")
    refused(lambda d: d["encoding"].update(name="uint32"), "format version 3 with encoding 'uint32'")
    refused(lambda d: d["encoding"].pop("dictionary"), "format version 3 with encoding 'zstd'")
    refused(lambda d: d.update(format_version=2), "format version 2 with encoding 'zstd'")
    refused(lambda d: d.update(format_version=4), "this lmshard reads 1 to 3")
    refused(lambda d: d["encoding"]["dictionary"].update(sha256="0" * 64), "does not match its size and sha256")
    refused(lambda d: d["encoding"]["dictionary"].update(base64="*"), "is not base64")
    refused(lambda d: d["encoding"].update(dictionary=[]), "'dictionary' is not an object")
    refused(lambda d: d["encoding"].update(name="lz9"), "not one of uint32, uint16, packed, zstd")
    refused(lambda d: d["encoding"].update(width=1), "'width' 1 cannot hold")
    refused(lambda d: d.update(dtype="uint16"), "is not uint32/little")
    u16 = json.loads((gpt2_sets["uint16"] / "dataset_metadata.json").read_text())
    raw = u16
    refused(lambda d: shard(d).update(n_bytes=shard(d)["n_bytes"] + 2), "'n_bytes' .* is not what")


def test_overwrite_replaces_every_file_of_a_zstd_dataset(tmp_path):
    """The block offsets are the dataset's own files: an --overwrite must not keep the old ones."""
    a = jsonl(tmp_path / "a.jsonl", make_texts(400, seed=11))
    b = jsonl(tmp_path / "b.jsonl", make_texts(500, seed=12))
    out = _prepare(tmp_path, [a], "ds", "zstd")
    prepare(PrepareConfig(inputs=[str(b)], out=str(out), shard_encoding="zstd", workers=2, val_fraction=0.1,
                          tokens_per_shard=30_000, overwrite=True, quiet=True))  # fmt: skip
    truth = _prepare(tmp_path, [b], "truth", None, tokens_per_shard=30_000)
    got = TokenDataset(out)
    assert np.array_equal(got.tokens(0, got.n_tokens), _truth(truth, "train"))
    assert sorted(p.name for p in (out / "train").iterdir()) == sorted(
        Path(f).name for s in load_metadata(out).split_shards("train") for f in s.files())


def test_a_resume_leaves_no_partial_encoded_shard(tmp_path, monkeypatch):
    """A run killed while it seals its shards leaves their encodings in progress
    (shard_N.bin.PID.tmp); the resumed run seals them again and none reaches the dataset."""
    from proctree import finish, kill_group, start_prepare, wait_stopped

    src = jsonl(tmp_path / "a.jsonl", make_texts(6000, seed=5))
    out = tmp_path / "ds"
    args = [str(src), "--out", str(out), "--workers", "2", "--tokens-per-shard", "10000000", "--shard-encoding",
            "zstd", "--val-fraction", "0.1", "--quiet"]  # fmt: skip
    monkeypatch.setenv("LMSHARD_BLOCK_BYTES", str(1 << 16))  # many work items
    monkeypatch.setenv("LMSHARD_STOP_AT", "item:10")
    proc = start_prepare(args)
    assert wait_stopped(proc) is not None
    monkeypatch.delenv("LMSHARD_STOP_AT")
    kill_group(proc.pid)
    proc.communicate()
    cut = tmp_path / ".ds.lmshard-partial" / "train" / "shard_000000.bin.4242.tmp"  # as a kill in a seal leaves it
    cut.parent.mkdir()
    cut.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(60))
    code, err = finish(start_prepare([*args, "--resume"]), 300)
    assert code == 0, err
    assert not list(out.rglob("*.tmp"))
    truth = _prepare(tmp_path, [src], "truth", None, tokens_per_shard=10_000_000)
    got = TokenDataset(out)
    assert np.array_equal(got.tokens(0, got.n_tokens), _truth(truth, "train"))


def test_a_frame_header_claiming_a_huge_size_is_named_not_a_memory_error(tmp_path):
    src = jsonl(tmp_path / "docs.jsonl", make_texts(600, seed=9))
    out = _prepare(tmp_path, [src], "ds", "zstd", tokens_per_shard=10**9)
    shard = load_metadata(out).split_shards("train")[0]
    offsets = np.fromfile(out / shard.blocks_path, dtype="<u8")
    data = bytearray((out / shard.path).read_bytes())
    data[int(offsets[2]) + 4] ^= 0x80  # the frame header's descriptor: an 8-byte content size follows
    (out / shard.path).write_bytes(bytes(data))
    ds = TokenDataset(out)
    every = ds.meta.encoding.block_tokens
    with pytest.raises(FormatError, match=r"block 2 \(tokens"):
        ds.tokens(2 * every + 10, 50)
    with pytest.raises(FormatError, match=r"block 2 \(tokens"):
        ds.store.read_rows(np.array([2 * every + 10, 5]), np.empty((2, 100), np.uint32))
    code, text = _cli("inspect", str(out))
    assert code == 3 and "block 2" in text, text


def test_frames_without_a_content_size_are_read(tmp_path, monkeypatch):
    """A valid zstd frame need not state its content size (other writers may leave it out)."""
    import zstandard

    src = jsonl(tmp_path / "docs.jsonl", make_texts(600, seed=10))
    truth = _prepare(tmp_path, [src], "truth", None, tokens_per_shard=10**9)
    monkeypatch.setattr(Encoding, "compressor", lambda self: zstandard.ZstdCompressor(
        level=self.level, write_checksum=True, write_content_size=False))  # fmt: skip
    out = _prepare(tmp_path, [src], "ds", "zstd", tokens_per_shard=10**9)
    shard = load_metadata(out).split_shards("train")[0]
    first = (out / shard.path).read_bytes()[: int(np.fromfile(out / shard.blocks_path, dtype="<u8")[1])]
    assert zstandard.frame_content_size(first) == -1
    ref, ds = TokenDataset(truth), TokenDataset(out)
    a, b = iter(ref.random_batches(8, 1500, seed=3)), iter(ds.random_batches(8, 1500, seed=3))
    for _ in range(10):
        assert all(np.array_equal(x, y) for x, y in zip(next(a), next(b), strict=True))
    assert _cli("inspect", str(out))[0] == 0
