"""Splits of several shards: rows gathered across shard maps, rows that cross shard boundaries,
and batches whose rows are in more shards than may be open at once, all checked against the
token stream read independently with numpy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_prepare import jsonl, make_texts

from lmshard import TokenDataset
from lmshard.prepare import PrepareConfig, prepare


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """About 30 shards of ~1,000 tokens: rows of a few hundred tokens often cross a boundary."""
    tmp = tmp_path_factory.mktemp("ms")
    prepare(PrepareConfig(inputs=[str(jsonl(tmp / "a.jsonl", make_texts(600, seed=3)))], out=str(tmp / "ds"),
                          workers=1, tokens_per_shard=1000, val_fraction=0.0))  # fmt: skip
    return tmp / "ds"


def stream_of(root) -> np.ndarray:
    meta = json.loads((root / "dataset_metadata.json").read_text())
    return np.concatenate([np.fromfile(root / s["path"], dtype="<u4") for s in meta["splits"]["train"]["shards"]])


def check_rows(batch, ref: np.ndarray, seq_len: int) -> None:
    for r, o in enumerate(batch.offsets.tolist()):
        assert batch.x[r].tolist() == ref[o : o + seq_len].tolist()
        assert batch.y[r].tolist() == ref[o + batch.shift : o + batch.shift + seq_len].tolist()


def crossing(data: TokenDataset, offsets: np.ndarray, length: int) -> int:
    """How many rows cross a shard boundary, from the shard sizes in the metadata."""
    ends = np.cumsum([s.n_tokens for s in data.store.shards])
    first = np.searchsorted(ends, offsets, side="right")
    return int((first != np.searchsorted(ends, offsets + length - 1, side="right")).sum())


def test_mapped_rows_across_shards_equal_the_stream(shards):
    ref = stream_of(shards)
    data = TokenDataset(shards)
    assert data.store.mapped and 20 < len(data.store.shards) <= 64  # all maps fit: one gather over them
    stream = data.random_batches(4, 100, seed=9)
    crossed = whole = 0
    for _ in range(60):
        b = next(stream)
        check_rows(b, ref, 100)
        n = crossing(data, b.offsets, 101)
        crossed, whole = crossed + n, whole + (n == 0)
    assert crossed > 10 and whole > 10  # batches with and without rows that cross were drawn


@pytest.mark.parametrize("seq_len", [1500, 3000])
def test_rows_longer_than_a_shard(shards, seq_len):
    """Every row crosses at least one boundary; rows of 3,000 tokens span three or four shards."""
    ref = stream_of(shards)
    for kw in ({}, {"rss_limit": 0}):
        stream = TokenDataset(shards, **kw).random_batches(4, seq_len, seed=2, shift=3)
        for _ in range(5):
            check_rows(next(stream), ref, seq_len)


def test_the_same_batches_however_the_rows_are_read(shards):
    """Gathered over all maps, copied row by row (more shards than max_open_shards), read with
    preadv, and through the staged (CUDA) path: the same batches, equal to the stream."""
    ref = stream_of(shards)
    readers = [TokenDataset(shards), TokenDataset(shards, max_open_shards=4), TokenDataset(shards, rss_limit=0)]
    streams = [d.random_batches(8, 150, seed=4, shift="random") for d in readers]
    staged = readers[0].random_batches(8, 150, seed=4, shift="random")
    staged.staged = True
    streams.append(staged)
    for _ in range(30):
        batches = [next(s) for s in streams]
        check_rows(batches[0], ref, 150)
        for b in batches[1:]:
            assert torch.equal(b.x, batches[0].x) and torch.equal(b.y, batches[0].y)
    assert readers[1].store.open_files <= 4


def test_read_mode_batch_in_more_shards_than_may_be_open(shards):
    """A batch whose 32 rows fall in more shards than max_open_shards: a shard opened late in the
    batch closes one opened early; its rows must still come from the right file."""
    ref = stream_of(shards)
    data = TokenDataset(shards, max_open_shards=3, rss_limit=0)
    stream = data.random_batches(32, 100, seed=1)
    for _ in range(10):
        b = next(stream)
        assert len(set(np.searchsorted(data.store.starts, b.offsets, side="right").tolist())) > 3
        check_rows(b, ref, 100)
        assert data.store.open_files <= 3


def test_window_batches_and_windows_across_shards(shards):
    ref = stream_of(shards)
    data = TokenDataset(shards)
    stream = data.window_batches(8, 120, stride=97, shift=2, seed=5)
    for _ in range(stream.steps_per_epoch):
        check_rows(next(stream), ref, 120)
    ds = data.windows(120, stride=97, shift=2)
    for i in (0, 1, len(ds) // 2, len(ds) - 1):
        x, y = ds[i]
        o = i * 97
        assert x.tolist() == ref[o : o + 120].tolist() and y.tolist() == ref[o + 2 : o + 122].tolist()


def test_batches_continue_after_the_store_is_closed(shards):
    """Closing the store drops the maps and the views over them; the next batch maps again."""
    ref = stream_of(shards)
    data = TokenDataset(shards)
    stream = data.random_batches(8, 64, seed=6)
    check_rows(next(stream), ref, 64)
    data.store.close()
    assert data.store.open_files == 0
    for _ in range(5):
        check_rows(next(stream), ref, 64)


@pytest.mark.parametrize("rss_limit", [None, 0])
def test_rows_at_the_edges_of_every_shard(shards, rss_limit):
    """Rows that end exactly at a shard's last token, cross it by one, start at its first token or
    at the last token of the one before: gathered and read into a buffer, equal to the stream."""
    ref = stream_of(shards)
    store = TokenDataset(shards, rss_limit=rss_limit).store
    ends = np.cumsum([s.n_tokens for s in store.shards])[:-1]
    for length in (1, 65, 1025):
        edges = np.concatenate([ends - length, ends - length + 1, ends - 1, ends, [0, len(ref) - length]])
        offsets = np.unique(edges[(edges >= 0) & (edges + length <= len(ref))])
        expected = np.stack([ref[o : o + length] for o in offsets.tolist()])
        assert np.array_equal(store.gather(offsets, length), expected)
        out = np.zeros((len(offsets), length), dtype=np.uint32)
        store.read_rows(offsets, out)
        assert np.array_equal(out, expected)


def test_read_mode_row_crossing_into_a_shard_not_yet_open(shards):
    """Two rows in two shards with max_open_shards=2: the crossing row also needs the next shard,
    which closes the least recently used one; the other row must still be read from its own."""
    ref = stream_of(shards)
    store = TokenDataset(shards, max_open_shards=2, rss_limit=0).store
    starts = store.starts.tolist()
    offsets = np.array([starts[6] - 10, starts[1] + 5])  # row 0 crosses from shard 5 into shard 6
    for _ in range(2):  # the second time round shards 5 and 6 are the open ones
        out = np.zeros((2, 40), dtype=np.uint32)
        store.read_rows(offsets, out)
        assert out.tolist() == [ref[o : o + 40].tolist() for o in offsets.tolist()]
        assert store.open_files <= 2
