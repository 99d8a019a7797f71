"""The loader and `inspect` on datasets at a URL stored in every shard encoding (uint16, packed,
zstd), against moto's real S3 API server on loopback: batches equal those of the same text
prepared as uint32 and read locally (the independent truth: no decoding at all), for GPT-2's
vocabulary and one of more than 65,536 ids; a block is fetched as its stored bytes, the disk
cache keeps those bytes, and damaged blocks, frames and block offsets are named by shard and
block."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import write
from test_hf_tokenizer import big  # noqa: F401  (big: the module-scoped >65,536-id vocabulary)
from test_remote_loader import Requests, same, upload

from lmshard import TokenDataset
from lmshard.errors import EXIT_CORRUPT, FormatError
from lmshard.format import DatasetMeta, load_metadata
from lmshard.format.encoding import OFFSETS_DTYPE
from lmshard.prepare import PrepareConfig, prepare

CASES = [("gpt2", "uint16"), ("gpt2", "packed"), ("gpt2", "zstd"), ("big", "packed"), ("big", "zstd")]


def _texts(vocab: str, high_words: list[str]) -> list[str]:
    if vocab == "gpt2":
        return [f"document {i} " + "word " * (i * 37 % 2000) + f"end {i}" for i in range(200)]
    n = len(high_words)  # every word one id above 65,535
    return [" ".join(high_words[(7 * i + j) % n] for j in range(i * 13 % 400 + 1)) + f" doc {i}" for i in range(300)]


@pytest.fixture(scope="module")
def built(big, tmp_path_factory):  # noqa: F811
    """built(vocab, encoding): the dataset of that vocabulary's texts in that encoding, prepared
    once (several shards of several blocks each, a short last block)."""
    root, made = tmp_path_factory.mktemp("encodings"), {}
    tokenizers = {"gpt2": "gpt2", "big": str(big["file"])}

    def make(vocab: str, encoding: str) -> Path:
        if (vocab, encoding) not in made:
            lines = "".join(json.dumps({"text": t}) + "\n" for t in _texts(vocab, big["high_words"]))
            src = write(root / f"{vocab}.jsonl", lines)
            out = root / f"{vocab}-{encoding}"
            prepare(PrepareConfig(inputs=[str(src)], out=str(out), tokenizer=tokenizers[vocab], val_fraction=0.1,
                                  tokens_per_shard=70_000, shard_encoding=encoding, workers=1))  # fmt: skip
            made[vocab, encoding] = out
        return made[vocab, encoding]

    return make


def _span(meta: DatasetMeta, shard_path: str, b: int) -> tuple[int, int]:
    """(first byte, end byte) of block b in the local copy's token file."""
    shard = next(s for s in meta.shards if s.path == shard_path)
    offsets = np.fromfile(meta.abspath(shard.blocks_path), dtype=OFFSETS_DTYPE) if shard.blocks_path else None
    return meta.encoding.block_span(b, shard.n_tokens, offsets)


def _stored(meta: DatasetMeta, shard_path: str, b: int) -> bytes:
    """Block b's stored bytes, read from the local copy of the dataset."""
    lo, hi = _span(meta, shard_path, b)
    return meta.abspath(shard_path).read_bytes()[lo:hi]


def _makers():
    return [
        lambda d: d.random_batches(8, 300, seed=3),
        lambda d: d.random_batches(4, 64, seed=5, shift="random", doc_aligned=True, cu_seqlens=True),
        lambda d: d.window_batches(4, 500, stride=300, shuffle=False),  # in order, across shard boundaries
        lambda d: d.random_batches(2, 20_000, seed=1),  # rows over many blocks
        lambda d: d.packed(512, seed=1).batches(4),
        lambda d: d.padded_batches(4, 400, seed=2),
    ]


@pytest.mark.parametrize(("vocab", "encoding"), CASES)
def test_batches_equal_the_local_uint32_dataset(s3, built, vocab, encoding, tmp_path, monkeypatch):
    server, url = s3
    truth_path, path = built(vocab, "uint32"), built(vocab, encoding)
    meta = load_metadata(path)
    assert meta.encoding.name == encoding and len(meta.split_shards("train")) >= 2
    if vocab == "big":
        assert meta.tokenizer.n_vocab > 1 << 16 and int(TokenDataset(truth_path).tokens(0, 5000).max()) > 0xFFFF
    bt = meta.encoding.block_tokens
    local, ds_url = TokenDataset(truth_path), upload(server, url, path)
    requests = Requests(monkeypatch)

    remote = TokenDataset(ds_url)
    assert (remote.n_tokens, remote.n_docs) == (local.n_tokens, local.n_docs)
    # One block read: exactly its stored bytes are fetched (a zstd frame, 2 bytes or `bits` bits a token).
    assert np.array_equal(remote.tokens(2 * bt + 10, 50), local.tokens(2 * bt + 10, 50))
    assert requests.bytes_of(".bin") == len(_stored(meta, "train/shard_000000.bin", 2))
    edge = int(remote.store.starts[1])
    assert np.array_equal(remote.tokens(edge - 3000, 6000), local.tokens(edge - 3000, 6000))  # across shards
    for make in _makers():
        a, b = make(local), make(remote)
        for _ in range(12):
            same(next(a), next(b))
    offsets_reads = collections.Counter(r for r, _, _ in requests.calls if r.endswith(".blocks"))
    if encoding == "zstd":  # each shard's block offsets fetched once, on its first read
        assert len(offsets_reads) >= 2 and set(offsets_reads.values()) == {1}
    else:
        assert not offsets_reads

    # Through a small pool and the disk cache (no prefetch: the same blocks each time), twice.
    options = {"pool_limit": 6 * bt * 4, "prefetch_steps": 0, "cache_dir": tmp_path, "cache_limit": 1 << 30}
    for run in range(2):
        fetched = requests.count(".bin")
        remote = TokenDataset(ds_url, **options)
        for make in _makers()[:4]:
            a, b = make(local), make(remote)
            for _ in range(8):
                same(next(a), next(b))
        if run == 1:
            assert requests.count(".bin") == fetched  # the second run came from the disk cache alone
    files = sorted(tmp_path.rglob("*.blk"))
    assert files
    by_sum = {s.xxh3_64: s.path for s in meta.shards}
    for f in files:  # the cache keeps each block as stored, then its sum
        shard_path = by_sum[f.parent.name.rsplit("-", 1)[0]]
        assert f.read_bytes()[:-8] == _stored(meta, shard_path, int(f.stem))


def _put(server, url: str, key: str, data: bytes) -> None:
    server.client().put_object(Bucket=url.removeprefix("s3://"), Key=f"ds/{key}", Body=data)


def _block_message(shard: str, b: int, bt: int) -> str:
    return rf"ds/{shard}\.bin: block {b} \(tokens {b * bt:,}\.\.{(b + 1) * bt - 1:,}\)"


@pytest.mark.parametrize("encoding", ["uint16", "packed", "zstd"])
def test_a_damaged_block_is_named_by_shard_and_block(s3, built, encoding):
    server, url = s3
    path = built("gpt2", encoding)
    meta, ds_url = load_metadata(path), upload(server, url, path)
    bt, shard = meta.encoding.block_tokens, "train/shard_000001"
    lo, hi = _span(meta, f"{shard}.bin", 3)
    data = bytearray((path / f"{shard}.bin").read_bytes())
    data[(lo + hi) // 2] ^= 0x40  # inside block 3 (a zstd frame's compressed data)
    _put(server, url, f"{shard}.bin", bytes(data))
    remote = TokenDataset(ds_url)
    first = int(remote.store.starts[1])
    truth = TokenDataset(built("gpt2", "uint32"))
    assert np.array_equal(remote.tokens(first + 10, 100), truth.tokens(first + 10, 100))  # block 0 is fine
    with pytest.raises(FormatError, match=_block_message(shard, 3, bt) + " does not match its checksum"):
        remote.tokens(first + 3 * bt + 5, 20)
    stream = TokenDataset(ds_url, prefetch_steps=2).window_batches(2, 1000, shuffle=False)
    with pytest.raises(FormatError, match=_block_message(shard, 3, bt)):
        for _ in range(1000):
            next(stream)


def _edit_metadata(path: Path, shard: str, **fields: str) -> None:
    raw = json.loads((path / "dataset_metadata.json").read_text())
    for split in raw["splits"].values():
        for entry in split["shards"]:
            if entry["path"] == f"{shard}.bin":
                entry.update(fields)
    (path / "dataset_metadata.json").write_text(json.dumps(raw))


def test_a_frame_that_does_not_decode_is_named(s3, built, tmp_path):
    """A zstd frame damaged where its sum was written after the damage (the sums vouch for the
    bytes, the frame's own checksum does not): the read names the shard and block."""
    import xxhash

    server, url = s3
    path = tmp_path / "ds"
    for f in built("gpt2", "zstd").rglob("*"):
        if f.is_file():
            write(path / f.relative_to(built("gpt2", "zstd")), f.read_bytes())
    meta, shard = load_metadata(path), "train/shard_000000"
    offsets = np.fromfile(path / f"{shard}.blocks", dtype=OFFSETS_DTYPE)
    data = bytearray((path / f"{shard}.bin").read_bytes())
    data[(int(offsets[2]) + int(offsets[3])) // 2] ^= 0x40
    sums = np.fromfile(path / f"{shard}.sums", dtype="<u8")
    sums[2] = xxhash.xxh3_64_intdigest(bytes(data[offsets[2] : offsets[3]]))
    (path / f"{shard}.bin").write_bytes(bytes(data))
    (path / f"{shard}.sums").write_bytes(sums.tobytes())
    _edit_metadata(path, shard, sums_xxh3_64=xxhash.xxh3_64_hexdigest(sums.tobytes()),
                   xxh3_64=xxhash.xxh3_64_hexdigest(bytes(data)))  # fmt: skip
    remote, bt = TokenDataset(upload(server, url, path)), meta.encoding.block_tokens
    with pytest.raises(FormatError, match=_block_message(shard, 2, bt) + r": does not decode") as e:
        remote.tokens(2 * bt + 1, 10)
    assert "\n" not in str(e.value) and "lmshard inspect" in str(e.value)


def test_damaged_block_offsets_are_refused(s3, built, tmp_path):
    import xxhash

    server, url = s3
    source, shard = built("gpt2", "zstd"), "train/shard_000000"
    offsets = np.fromfile(source / f"{shard}.blocks", dtype=OFFSETS_DTYPE)
    # Bytes that differ from the metadata's checksum.
    ds_url = upload(server, url, source)
    flipped = offsets.copy()
    flipped[1] += 1
    _put(server, url, f"{shard}.blocks", flipped.tobytes())
    with pytest.raises(FormatError, match=rf"ds/{shard}\.blocks: does not match the 'blocks_xxh3_64' of its metadata"):
        TokenDataset(ds_url).tokens(0, 10)
    # Offsets that match their checksum but decrease: refused before they locate any frame.
    path = tmp_path / "ds"
    for f in source.rglob("*"):
        if f.is_file():
            write(path / f.relative_to(source), f.read_bytes())
    bad = offsets.copy()
    bad[1], bad[2] = bad[2], bad[1]
    (path / f"{shard}.blocks").write_bytes(bad.tobytes())
    _edit_metadata(path, shard, blocks_xxh3_64=xxhash.xxh3_64_hexdigest(bad.tobytes()))
    with pytest.raises(FormatError, match=rf"ds2/{shard}\.blocks: block offsets decrease"):
        TokenDataset(upload(server, url, path, prefix="ds2")).tokens(0, 10)


@pytest.mark.parametrize("encoding", ["uint16", "packed", "zstd"])
def test_inspect_of_a_url_verifies_every_encoding(s3, built, encoding):
    from typer.testing import CliRunner

    from lmshard.cli import app

    server, url = s3
    path = built("gpt2", encoding)
    meta, ds_url, runner = load_metadata(path), upload(server, url, path), CliRunner()
    result = runner.invoke(app, ["inspect", ds_url, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] and report["n_tokens"] == meta.n_tokens()
    bt, shard = meta.encoding.block_tokens, "train/shard_000001"
    data = bytearray((path / f"{shard}.bin").read_bytes())
    data[_span(meta, f"{shard}.bin", 3)[0] + 5] ^= 0x01  # inside block 3
    _put(server, url, f"{shard}.bin", bytes(data))
    result = runner.invoke(app, ["inspect", ds_url, "--json"])
    assert result.exit_code == EXIT_CORRUPT, result.output
    problems = json.loads(result.stdout)["problems"]
    assert problems and problems[0].startswith(f"{shard}.bin: block 3 (tokens {3 * bt:,}..{4 * bt - 1:,})"), problems
    assert not any("lmshard-remote-" in p or "/tmp" in p for p in problems), problems
    assert runner.invoke(app, ["inspect", ds_url, "--quick"]).exit_code == 0  # no token data read
