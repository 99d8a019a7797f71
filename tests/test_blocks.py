"""Per-block checksums (format/blocks.py): every writer keeps them, they match an independent
hash of each 64 KiB block read with numpy, and old datasets without them still open."""

from __future__ import annotations

import json

import numpy as np
import xxhash
from conftest import write

from lmshard.format import load_metadata
from lmshard.format.blocks import BLOCK_TOKENS, BlockHasher, block_sums
from lmshard.prepare import PrepareConfig, prepare
from lmshard.runtime import TokenDataset


def test_hasher_in_pieces_equals_whole():
    data = np.random.default_rng(0).integers(0, 2**32, 3 * BLOCK_TOKENS + 5, dtype=np.uint32).tobytes()
    h = BlockHasher()
    for at in range(0, len(data), 12345):
        h.update(data[at : at + 12345])
    assert h.finish() == block_sums(data)
    want = [xxhash.xxh3_64_intdigest(data[a : a + 4 * BLOCK_TOKENS]) for a in range(0, len(data), 4 * BLOCK_TOKENS)]
    assert np.frombuffer(h.finish(), "<u8").tolist() == want
    assert block_sums(b"") == b""


def _prepare(tmp_path, **options):
    texts = [f"document {i} " + "word " * (i * 37 % 3000) for i in range(400)]
    src = write(tmp_path / "in.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), tokenizer="gpt2", val_fraction=0.1, **options))
    return out


def test_every_shard_has_sums_matching_numpy(tmp_path):
    for options in ({"tokens_per_shard": 40_000}, {"tokens_per_shard": 40_000, "workers": 2, "num_tasks": 3}):
        out = _prepare(tmp_path, **options)
        meta = load_metadata(out)
        for shard in meta.shards:
            tokens = np.fromfile(out / shard.path, dtype="<u4").tobytes()
            sums = np.fromfile(out / shard.sums_path, dtype="<u8")
            size = 4 * shard.block_tokens
            want = [xxhash.xxh3_64_intdigest(tokens[a : a + size]) for a in range(0, len(tokens), size)]
            assert sums.tolist() == want
            assert shard.sums_xxh3_64 == xxhash.xxh3_64_hexdigest(sums.tobytes())


def test_dataset_without_sums_still_opens(tmp_path):
    out = _prepare(tmp_path, tokens_per_shard=40_000)
    raw = json.loads((out / "dataset_metadata.json").read_text())
    for split in raw["splits"].values():
        for shard in split["shards"]:
            (out / shard.pop("sums_path")).unlink()
            del shard["block_tokens"], shard["sums_xxh3_64"]
    (out / "dataset_metadata.json").write_text(json.dumps(raw))
    ds = TokenDataset(out)
    assert ds.tokens(0, 10).shape == (10,)
