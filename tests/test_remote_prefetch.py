"""The first prefetch round of a split the pool holds (runtime/remote/prefetch.py): it reads the
whole split, leaves out what the disk cache holds and what fails its check, and a round that
`announce` claimed is never left undone. Fake readers show what each read was asked; the moto S3
server of the suite (conftest) counts the bytes a damaged or partly cached split costs."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from test_remote_loader import BLOCK_BYTES, Requests, _damage, _prepare, upload

from lmshard import TokenDataset
from lmshard.errors import FormatError
from lmshard.format import BLOCK_TOKENS
from lmshard.runtime.remote import prefetch
from lmshard.runtime.remote.blockfetch import Blocks


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """A local dataset of one shard of 33 blocks (test_remote_loader's `one`)."""
    return _prepare(tmp_path_factory.mktemp("remote-prefetch"), "one")


class Reader:
    """A split of `total` blocks of 16 tokens (block g holds g); records each read's blocks and
    rest, and hands back the rest as read through."""

    block_tokens = 16

    def __init__(self, total: int) -> None:
        self.base = np.array([0, total], dtype=np.int64)
        self.calls: list[tuple[list[int], list[int]]] = []

    def read(self, blocks, held=None, through=None, spare=0, claim=None, rest=(), lenient=False):
        self.calls.append((sorted(blocks), sorted(rest)))
        extra = [g for g in rest if g not in set(blocks)]
        if claim is not None:
            claim(extra)
        if through is not None:
            through.update((g, memoryview(np.full(16, g, dtype=np.uint32).tobytes())) for g in extra)
        return {g: np.full(16, g, dtype=np.uint32) for g in blocks}

    def decode(self, g, stored):
        return np.frombuffer(stored, dtype=np.uint32)

    def remember(self, stored):
        pass


def test_the_first_round_reads_the_rest_of_a_split_the_pool_holds():
    """40 blocks, a pool of 100 slots: the first round asked for 25 reads the other 15 too (however
    many it asks for itself), and they are in the pool, unpinned; later rounds read only theirs."""
    reader = Reader(40)
    blocks = Blocks(reader, 100 * 16 * 4)
    blocks.announce(("s", 0), list(range(25)))
    blocks.drain()
    assert reader.calls == [(list(range(25)), list(range(25, 40)))]
    assert sorted(blocks.pool.where) == list(range(40))
    slot = blocks.pool.where[33]
    assert blocks.pool.pins[slot] == 0 and np.array_equal(blocks.pool.slot(slot, 16), np.full(16, 33))
    small = Blocks(Reader(40), 30 * 16 * 4)  # a pool smaller than the split: only what is asked for
    small.announce(("s", 0), [1, 2])
    small.drain()
    assert small.reader.calls == [([1, 2], [])]


def test_a_round_announce_claimed_is_undone_when_the_pool_closes_first(monkeypatch):
    """announce claims the first round before its thread runs; the pool is closed before the
    thread takes it: the round's blocks are freed, so a reader asking for one fetches it itself
    instead of waiting for a fetch nobody will make. The same after close."""
    go = threading.Event()
    original = prefetch._prefetch

    def late(ref):
        go.wait(60)
        original(ref)

    monkeypatch.setattr(prefetch, "_prefetch", late)
    for announce_first in (True, False):
        reader = Reader(40)
        blocks = Blocks(reader, 100 * 16 * 4)
        if announce_first:
            blocks.announce(("s", 0), [3, 4])
            assert 3 in blocks._loading  # claimed for the thread
            blocks.close()
        else:
            blocks.close()
            blocks.announce(("s", 0), [3, 4])
        go.set()
        assert not blocks._loading and not blocks._rounds
        slots, outside = blocks.pin([3])  # returns: nothing left to wait for
        got = blocks.pool.slot(int(slots[0]), 16) if slots[0] >= 0 else outside[3]
        assert np.array_equal(got, np.full(16, 3))


def test_cached_blocks_are_not_fetched_by_the_whole_split_read(s3, one, monkeypatch, tmp_path):
    """Every other block of the split in the disk cache, a pool that holds the split: a pass of
    random batches fetches the others only (no request reads through a cached one)."""
    server, url = s3
    ds_url = upload(server, url, one, prefix="cachegaps")
    cache = tmp_path / "cache"
    warm = TokenDataset(ds_url, cache_dir=cache, cache_limit=1 << 30, prefetch_steps=0, pool_limit=0)
    n_blocks = -(-warm.n_tokens // BLOCK_TOKENS)
    for b in range(0, n_blocks, 2):
        warm.tokens(b * BLOCK_TOKENS, 10)
    cached = len(list((cache / "blocks").rglob("*.blk")))
    assert cached == (n_blocks + 1) // 2
    requests = Requests(monkeypatch)
    remote = TokenDataset(ds_url, cache_dir=cache, cache_limit=1 << 30)
    stream, truth = remote.random_batches(8, 256, seed=3), TokenDataset(one).random_batches(8, 256, seed=3)
    for _ in range(3 * remote.n_tokens // (8 * 256)):
        assert torch_equal(next(stream), next(truth))
    remote.store.drain()
    assert requests.bytes_of() <= (n_blocks - cached) * BLOCK_BYTES, requests.bytes_of() // BLOCK_BYTES


def torch_equal(a, b) -> bool:
    return bool((a.x == b.x).all() and (a.y == b.y).all())


def test_a_damaged_block_of_the_first_round_keeps_the_rest_of_the_split(s3, one, monkeypatch):
    """A block the first batch reads is damaged: the first round keeps the rest of the split it
    read, the reader that needs the block fetches it and names it, and the split is fetched once
    (with that block again)."""
    server, url = s3
    local = TokenDataset(one)
    first = next(local.random_batches(8, 256, seed=3))
    bad = int(first.offsets.min()) // BLOCK_TOKENS  # a block of step 0
    ds_url = upload(server, url, one, prefix="damaged")
    shard = one / "train" / "shard_000000.bin"
    size = shard.stat().st_size
    server.client().put_object(Bucket=url.removeprefix("s3://"), Key="damaged/train/shard_000000.bin",
                               Body=_damage(shard, bad * BLOCK_BYTES + 7))  # fmt: skip
    requests = Requests(monkeypatch)
    remote = TokenDataset(ds_url)
    with pytest.raises(FormatError, match=rf"shard_000000\.bin: block {bad} \("):
        next(remote.random_batches(8, 256, seed=3))
    remote.store.drain()
    assert size < requests.bytes_of() <= size + 2 * BLOCK_BYTES, requests.bytes_of() / size
