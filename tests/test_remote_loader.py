"""The loader on datasets at a URL, against moto's real S3 API server on loopback: every kind of
batch equals the local dataset's for the same seed (the local loader is the independent truth,
itself tested against numpy reads of the files), DataLoader workers, a server that goes away and
comes back, damaged objects and cache files, the bounded disk cache and the exact prefetch.
Clocks are driven (Retry(sleep=...)); nothing here waits on time."""

from __future__ import annotations

import gc
import json
import pickle
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write

from lmshard import Mixture, TokenDataset
from lmshard.errors import ArgumentError, FormatError
from lmshard.format import BLOCK_TOKENS
from lmshard.prepare import PrepareConfig, prepare
from lmshard.remote import RemoteError, Retry
from lmshard.remote.objects import Remote

BLOCK_BYTES = BLOCK_TOKENS * 4


def _prepare(root: Path, name: str, n_docs: int = 400, salt: str = "", **options) -> Path:
    texts = [f"{salt}document {i} " + "word " * (i * 37 % 3000) for i in range(n_docs)]
    src = write(root / f"{name}.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = root / name
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), tokenizer="gpt2", val_fraction=0.1, **options))
    return out


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Local datasets: `many` (14 shards of 40,000 tokens: three blocks each, the last short),
    `one` (one shard of 33 blocks), `other` (different text, for mixtures)."""
    root = tmp_path_factory.mktemp("remote-loader")
    return {"many": _prepare(root, "many", tokens_per_shard=40_000), "one": _prepare(root, "one"),
            "other": _prepare(root, "other", n_docs=200, salt="other ", tokens_per_shard=30_000)}  # fmt: skip


def upload(server, url: str, local: Path, prefix: str = "ds") -> str:
    """Every file of a local dataset under `prefix` of the bucket, with boto3; the dataset's URL."""
    bucket, client = url.removeprefix("s3://"), server.client()
    for path in sorted(local.rglob("*")):
        if path.is_file() and ".lmshard-cache" not in path.parts:
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(local)}")
    return f"{url}/{prefix}"


class Requests:
    """Every ranged request the loader sends (Remote.read_ranges): (object, bytes, thread name)."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[tuple[str, int, str]] = []
        original = Remote.read_ranges

        def counted(remote, rels, starts, ends):
            name = threading.current_thread().name
            self.calls += [(r, b - a, name) for r, a, b in zip(rels, starts, ends, strict=True)]
            return original(remote, rels, starts, ends)

        monkeypatch.setattr(Remote, "read_ranges", counted)

    def bytes_of(self, suffix: str = ".bin") -> int:
        return sum(n for r, n, _ in self.calls if r.endswith(suffix))

    def count(self, suffix: str = ".bin") -> int:
        return sum(1 for r, _, _ in self.calls if r.endswith(suffix))


class Clock:
    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def same(a, b) -> None:
    """Two batches (Batch or PackedBatch) hold the same tensors."""
    keys = a.keys()
    assert keys == b.keys()
    for k in keys:
        va, vb = a[k], b[k]
        if isinstance(va, torch.Tensor):
            assert torch.equal(va, vb), k
        elif isinstance(va, np.ndarray):
            assert np.array_equal(va, vb), k
        else:
            assert va == vb, k


def crossing(store, offsets: np.ndarray, length: int) -> int:
    """Rows that start in one shard and end in another."""
    first = np.searchsorted(store.starts, offsets, side="right")
    last = np.searchsorted(store.starts, offsets + length - 1, side="right")
    return int((first != last).sum())


def test_every_stream_equals_the_local_dataset(s3, datasets):
    server, url = s3
    local_path = datasets["many"]
    local, remote = TokenDataset(local_path), TokenDataset(upload(server, url, local_path))
    assert len(remote.store.shards) == len(local.store.shards) >= 10
    assert (remote.n_tokens, remote.n_docs, remote.vocab_size) == (local.n_tokens, local.n_docs, local.vocab_size)
    assert np.array_equal(remote.tokens(39_000, 5_000), local.tokens(39_000, 5_000))  # across a shard boundary
    makers = [
        lambda d: d.random_batches(8, 300, seed=3),
        lambda d: d.random_batches(4, 64, seed=5, shift="random", doc_aligned=True, cu_seqlens=True),
        lambda d: d.window_batches(8, 256, seed=2),
        lambda d: d.window_batches(4, 500, stride=300, shuffle=False),
        lambda d: d.random_batches(2, 10_000, seed=1),  # rows over three blocks (a short last one, a shard's end)
        lambda d: d.random_batches(2, 40_000, seed=2),  # rows longer than two blocks
        lambda d: d.packed(512, seed=1).batches(4),
        lambda d: d.packed(300, strategy="greedy", seed=4).batches(3, padding_free=True),
        lambda d: d.padded_batches(4, 400, seed=2),
    ]
    crossed = 0
    for make in makers:
        a, b = make(local), make(remote)
        for _ in range(40):
            x, y = next(a), next(b)
            same(x, y)
            if hasattr(x, "offsets"):
                crossed += crossing(local.store, x.offsets, 300)
    assert crossed > 0  # some rows ran across a shard boundary
    staged, truth = remote.random_batches(8, 300, seed=6), local.random_batches(8, 300, seed=6)
    staged.staged = True  # the CUDA path's pinned ring, run on the CPU
    for _ in range(20):
        same(next(staged), next(truth))
    windows = remote.windows(256, stride=100)
    assert torch.equal(windows[17].input_ids, local.windows(256, stride=100)[17].input_ids)


def test_mixture_of_a_local_and_a_remote_source(s3, datasets, tmp_path):
    server, url = s3
    remote_other = upload(server, url, datasets["other"])
    mixed = Mixture({str(datasets["many"]): 0.6, remote_other: 0.4})
    truth = Mixture({str(datasets["many"]): 0.6, str(datasets["other"]): 0.4})
    assert mixed.fingerprint() == truth.fingerprint()  # the same content: the same resume state
    toml = write(tmp_path / "mix.toml", f'[[source]]\npath = "{datasets["many"]}"\nweight = 0.6\n'
                                        f'[[source]]\npath = "{remote_other}"\nweight = 0.4\n')  # fmt: skip
    assert Mixture.from_file(toml).fingerprint() == truth.fingerprint()  # a URL in a mixture file stays a URL
    for make in (lambda m: m.random_batches(4, 200, seed=7), lambda m: m.window_batches(4, 128, seed=1),
                 lambda m: m.packed_batches(4, 256, seed=3)):  # fmt: skip
        a, b = make(mixed), make(truth)
        for _ in range(25):
            same(next(a), next(b))


def test_dataloader_workers_and_pickling(s3, datasets, tmp_path):
    server, url = s3
    local = TokenDataset(datasets["many"])
    limit = 12 * (BLOCK_BYTES + 8)  # 12 of the 42 blocks: the workers evict each other's files
    remote = TokenDataset(upload(server, url, datasets["many"]), cache_dir=tmp_path / "cache", cache_limit=limit)
    next(remote.random_batches(8, 300, seed=1))  # a pool, a thread and connections exist now
    state = pickle.dumps(remote.store)
    assert len(state) < 20_000  # no pool, thread or socket: a few integers per shard
    copy = pickle.loads(state)
    assert np.array_equal(copy.gather(np.array([5, 80_000]), 100), local.store.gather(np.array([5, 80_000]), 100))
    for context in ("fork", "spawn"):
        stream = remote.random_batches(8, 300, seed=9)
        loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2, multiprocessing_context=context)
        truth = local.random_batches(8, 300, seed=9)
        for batch, _ in zip(loader, range(12), strict=False):
            same(batch, next(truth))
    held = _cache_bytes(tmp_path / "cache")
    usage = int.from_bytes((tmp_path / "cache" / "blocks" / "usage").read_bytes(), "little")
    assert 0 < held <= limit and usage >= held  # one count for all the processes sharing the directory


def test_server_stopped_then_restarted(s3, datasets):
    server, url = s3
    ds_url = upload(server, url, datasets["many"])
    clock = Clock()
    # A pool of 8 blocks for 42: blocks are evicted, so the stream keeps needing the server.
    remote = TokenDataset(ds_url, pool_limit=8 * BLOCK_BYTES, prefetch_steps=2,
                          retry=Retry(attempts=3, base=1.0, cap=5.0, sleep=clock, random=lambda: 1.0))  # fmt: skip
    stream = remote.random_batches(2, 128, seed=4)
    truth = TokenDataset(datasets["many"]).random_batches(2, 128, seed=4)
    for _ in range(5):
        same(next(stream), next(truth))
    saved = stream.state_dict()
    server.stop()
    try:
        with pytest.raises(RemoteError) as e:
            for _ in range(500):
                next(stream)
        message = str(e.value)
        assert "\n" not in message and "after 3 attempts" in message and "check that the endpoint" in message
        assert re.search(r"s3://[^ ]+/ds/train/shard_\d{6}\.(bin|sums)", message), message
        assert clock.waits and set(clock.waits) <= {1.0, 2.0}  # driven, never waited
    finally:
        server.start()
    server.make_bucket(url.removeprefix("s3://"))  # moto keeps objects in memory: put them back
    upload(server, url, datasets["many"])
    resumed = remote.random_batches(2, 128, seed=4)
    resumed.load_state_dict(saved)
    for _ in range(30):
        same(next(resumed), next(truth))


def _damage(path: Path, at: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    return bytes(data)


def test_damaged_block_is_named_without_reading_the_shard(s3, datasets, monkeypatch):
    server, url = s3
    ds_url = upload(server, url, datasets["one"])
    bucket, client = url.removeprefix("s3://"), server.client()
    shard = datasets["one"] / "train" / "shard_000000.bin"
    size = shard.stat().st_size
    assert size > 30 * BLOCK_BYTES
    client.put_object(Bucket=bucket, Key="ds/train/shard_000000.bin", Body=_damage(shard, 20 * BLOCK_BYTES + 7))
    requests = Requests(monkeypatch)
    remote = TokenDataset(ds_url)
    assert np.array_equal(remote.tokens(0, 1000), TokenDataset(datasets["one"]).tokens(0, 1000))  # block 0 is fine
    block = r"shard_000000\.bin: block 20 \(tokens 327,680\.\.344,063\) does not match its checksum"
    with pytest.raises(FormatError, match=block):
        remote.tokens(20 * BLOCK_TOKENS + 100, 50)
    assert requests.bytes_of() == 2 * BLOCK_BYTES  # block 0, then block 20
    before = requests.bytes_of()
    small = TokenDataset(ds_url, pool_limit=8 * BLOCK_BYTES)  # a pool smaller than the shard
    stream = small.window_batches(2, 1000, shuffle=False)  # reads the shard in order
    with pytest.raises(FormatError, match=block):
        for _ in range(1000):
            next(stream)
    assert requests.bytes_of() - before < size  # the shard was never read whole
    # A pool that holds the split: the first round reads it whole, the damaged block is left out
    # of the pool, and only a reader that needs it fetches it again, and names it.
    before = requests.bytes_of()
    stream = TokenDataset(ds_url).window_batches(2, 1000, shuffle=False)
    with pytest.raises(FormatError, match=block):
        for _ in range(1000):
            next(stream)
    fetched = requests.bytes_of() - before  # the shard once, and block 20 again by each that needed it
    assert size < fetched <= size + 4 * BLOCK_BYTES, (fetched, size)


def _cache_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in (cache / "blocks").rglob("*.blk"))


def test_disk_cache_stays_under_its_limit(s3, datasets, tmp_path):
    server, url = s3
    ds_url = upload(server, url, datasets["many"])
    limit = 10 * (BLOCK_BYTES + 8)  # 10 of the 42 blocks
    remote = TokenDataset(ds_url, cache_dir=tmp_path, cache_limit=limit, pool_limit=4 * BLOCK_BYTES)
    local = TokenDataset(datasets["many"])
    a, b = local.window_batches(8, 1024, seed=1), remote.window_batches(8, 1024, seed=1)
    for _ in range(a.steps_per_epoch + 5):  # an epoch of all 42 blocks, through a cache of 10
        same(next(a), next(b))
        assert _cache_bytes(tmp_path) <= limit
    usage = int.from_bytes((tmp_path / "blocks" / "usage").read_bytes(), "little")
    assert usage == _cache_bytes(tmp_path) > limit // 2


def test_disk_cache_serves_the_next_epoch_and_refetches_a_damaged_file(s3, datasets, tmp_path, monkeypatch):
    server, url = s3
    ds_url = upload(server, url, datasets["many"])
    local = TokenDataset(datasets["many"])
    requests = Requests(monkeypatch)

    def epoch() -> None:
        remote = TokenDataset(ds_url, cache_dir=tmp_path, cache_limit=1 << 30)  # a fresh pool each time
        a, b = local.window_batches(4, 256, seed=1), remote.window_batches(4, 256, seed=1)
        for _ in range(a.steps_per_epoch):
            same(next(a), next(b))

    epoch()
    first = requests.count()
    assert first > 0 and len(list(tmp_path.rglob("*.blk"))) == 42
    epoch()
    assert requests.count() == first  # the second epoch came from the disk cache alone
    victim = sorted(tmp_path.rglob("*.blk"))[5]
    victim.write_bytes(_damage(victim, 100))
    before = requests.bytes_of()
    epoch()
    assert requests.count() == first + 1  # the damaged file's block, fetched again
    assert requests.bytes_of() - before <= BLOCK_BYTES
    epoch()
    assert requests.count() == first + 1  # and cached again, good this time


def test_exact_prefetch_fetches_announced_steps_on_its_thread(s3, datasets, monkeypatch):
    server, url = s3
    ds_url = upload(server, url, datasets["many"])
    requests = Requests(monkeypatch)
    remote = TokenDataset(ds_url, prefetch_steps=4)
    stream = remote.random_batches(4, 300, seed=8)
    truth = TokenDataset(datasets["many"]).random_batches(4, 300, seed=8)
    same(next(stream), next(truth))  # step 0; steps 1..4 announced
    remote.store.drain()
    ahead = remote.store.geometry.spans(np.concatenate([stream._rows(s)[0] for s in range(1, 5)]), 301)
    assert set(ahead.tolist()) <= set(remote.store.blocks.pool.where)  # fetched before they were asked for
    assert {name for _, _, name in requests.calls if name != "MainThread"} == {"lmshard-prefetch"}
    by_reader = sum(1 for _, _, name in requests.calls if name == "MainThread")
    for _ in range(4):
        same(next(stream), next(truth))
    assert sum(1 for _, _, name in requests.calls if name == "MainThread") == by_reader  # nothing left to fetch


def test_a_pool_smaller_than_the_lookahead_reads_on(s3, datasets):
    """Announced steps that need more than the pool holds are fetched by the reader when it gets
    to them: no deadlock, the same batches."""
    server, url = s3
    ds_url = upload(server, url, datasets["many"])
    local = TokenDataset(datasets["many"])
    for pool in (0, 3 * BLOCK_BYTES):
        remote = TokenDataset(ds_url, pool_limit=pool, prefetch_steps=16)
        for make in (lambda d: d.random_batches(8, 2000, seed=1), lambda d: d.packed(1024).batches(4)):
            a, b = make(local), make(remote)
            for _ in range(10):
                same(next(a), next(b))
            del a, b
            gc.collect()  # a stream dropped mid-run gives back what it announced
            remote.store.drain()
            assert not remote.store.blocks.pool.pins.any()


def test_dataset_without_block_sums(s3, datasets, tmp_path):
    server, url = s3
    plain = tmp_path / "plain"
    for path in datasets["many"].rglob("*"):
        if path.is_file() and path.suffix != ".sums" and ".lmshard-cache" not in path.parts:
            write(plain / path.relative_to(datasets["many"]), path.read_bytes())
    raw = json.loads((plain / "dataset_metadata.json").read_text())
    for split in raw["splits"].values():
        for shard in split["shards"]:
            for key in ("sums_path", "block_tokens", "sums_xxh3_64"):
                shard.pop(key)
    (plain / "dataset_metadata.json").write_text(json.dumps(raw))
    local = TokenDataset(plain)
    for cache in (None, tmp_path / "cache", tmp_path / "cache"):  # the second pass reads the cache's copies
        options = {"cache_dir": cache, "cache_limit": 1 << 30} if cache else {}
        remote = TokenDataset(upload(server, url, plain), **options)
        a, b = local.random_batches(4, 300, seed=2), remote.random_batches(4, 300, seed=2)
        for _ in range(20):
            same(next(a), next(b))


def test_one_line_errors_name_the_fix(s3, datasets, tmp_path):
    server, url = s3
    ds_url = upload(server, url, datasets["many"])
    with pytest.raises(ArgumentError, match=r"cache_dir= needs cache_limit=.*pass e\.g\. cache_limit="):
        TokenDataset(ds_url, cache_dir=tmp_path)
    with pytest.raises(ArgumentError, match=r"cache_dir= applies to datasets at a URL.*drop it"):
        TokenDataset(datasets["many"], cache_dir=tmp_path, cache_limit=1 << 20)
    server.client().delete_object(Bucket=url.removeprefix("s3://"), Key="ds/train/shard_000003.idx")
    with pytest.raises(FormatError, match=r"ds/train/shard_000003\.idx: missing; re-run `lmshard prepare`"):
        TokenDataset(ds_url)


def test_objects_gone_after_the_dataset_was_opened_say_so(s3, datasets):
    """A dataset replaced (or deleted) under a reader that opened it: the next read of an object
    that is gone names it and says to open the dataset again."""
    server, url = s3
    ds_url = upload(server, url, datasets["many"])
    remote = TokenDataset(ds_url, pool_limit=0)
    stream = remote.random_batches(2, 64, seed=1)
    next(stream)
    bucket = url.removeprefix("s3://")
    for key in [o["Key"] for o in server.client().list_objects_v2(Bucket=bucket, Prefix="ds/train/")["Contents"]]:
        server.client().delete_object(Bucket=bucket, Key=key)
    with pytest.raises(RemoteError) as e:
        for _ in range(50):
            next(stream)
    message = str(e.value)
    assert re.search(r"/ds/train/shard_\d{6}\.(bin|sums): GET .* failed \(HTTP 404", message), message
    assert message.endswith("the dataset was replaced (prepare --overwrite) or deleted after it was opened: open it "
                            "again to read the one there now") and "\n" not in message  # fmt: skip


def test_a_dataset_on_a_web_server(http_server, datasets):
    """https://-style datasets: a web server lists nothing, so the files are held to the metadata
    as they are read."""
    local_path = datasets["many"]
    for path in local_path.rglob("*"):
        if path.is_file() and ".lmshard-cache" not in path.parts:
            write(http_server.root / "ds" / path.relative_to(local_path), path.read_bytes())
    local, remote = TokenDataset(local_path), TokenDataset(f"{http_server.url}/ds")
    for make in (lambda d: d.random_batches(8, 300, seed=3), lambda d: d.packed(512).batches(4)):
        a, b = make(local), make(remote)
        for _ in range(10):
            same(next(a), next(b))


class _Waited(threading.Event):
    """An event that says when somebody waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout=None):
        self.waiting.set()
        return super().wait(timeout)


def test_a_reader_waiting_on_a_fetch_that_fails_fetches_the_blocks_itself():
    """Thread A's fetch of block 3 fails (the store was away) while B waits for it: B raises no
    error it did not see, but fetches block 3 itself; A gets its own error."""
    from lmshard.runtime.remote.blockfetch import Blocks

    class Reader:
        block_tokens = 16

        def __init__(self):
            self.calls, self.started, self.go = 0, threading.Event(), threading.Event()

        def read(self, blocks, held=None, through=None, spare=0, claim=None, rest=(), lenient=False):
            self.calls += 1
            if self.calls == 1:
                self.started.set()
                self.go.wait(60)
                raise RemoteError("s3://b/ds/train/shard_000000.bin: GET failed; the store was away")
            return {g: np.full(16, g, dtype=np.uint32) for g in blocks}

    reader = Reader()
    pool = Blocks(reader, 8 * 16 * 4)  # eight slots
    results: dict[str, object] = {}

    def pin(name):
        try:
            slots, outside = pool.pin([3])
            results[name] = pool.pool.slot(int(slots[0]), 16).copy() if slots[0] >= 0 else outside[3]
        except RemoteError as e:
            results[name] = e

    a = threading.Thread(target=pin, args=("a",))
    a.start()
    assert reader.started.wait(60)
    waited = pool._loading[3].done = _Waited()
    b = threading.Thread(target=pin, args=("b",))
    b.start()
    assert waited.waiting.wait(60)  # B waits on A's fetch
    reader.go.set()
    a.join(60)
    b.join(60)
    assert isinstance(results["a"], RemoteError)
    assert np.array_equal(results["b"], np.full(16, 3, dtype=np.uint32)) and reader.calls == 2


@pytest.mark.parametrize("prefetch_steps", [0, 8])
def test_a_pass_over_a_split_the_pool_holds_fetches_each_byte_once(s3, datasets, monkeypatch, prefetch_steps):
    """Random batches over a split smaller than the pool: every block fetched at most once (the
    blocks a request reads through between two it needs go into the pool too, and a block the
    prefetch thread is fetching is waited for), so the bytes fetched are the split's at most.
    With prefetch, the first round reads the whole split in requests of up to 16 MiB."""
    server, url = s3
    ds_url = upload(server, url, datasets["one"], prefix=f"once{prefetch_steps}")
    requests = Requests(monkeypatch)
    remote = TokenDataset(ds_url, prefetch_steps=prefetch_steps)
    stream = remote.random_batches(8, 256, seed=3)
    truth = TokenDataset(datasets["one"]).random_batches(8, 256, seed=3)
    steps = 3 * remote.n_tokens // (8 * 256)  # each token drawn about three times
    for _ in range(steps):
        same(next(stream), next(truth))
    remote.store.drain()
    size = sum((datasets["one"] / s.path).stat().st_size for s in remote.meta.split_shards("train"))
    assert requests.bytes_of() <= size, (requests.bytes_of(), size)
    if prefetch_steps:  # the first round read the split whole: one request for its one shard of 2 MiB
        assert [(r, n) for r, n, _ in requests.calls if r.endswith(".bin")] == [("train/shard_000000.bin", size)]


def test_a_resident_remote_split_is_fetched_once_and_draws_with_no_request(s3, datasets, monkeypatch):
    """resident=True on a dataset at a URL: the upload reads each token byte once, and the
    batches after it send no request at all, equal to the local dataset's."""
    server, url = s3
    local_path = datasets["many"]
    at = upload(server, url, local_path)
    requests = Requests(monkeypatch)
    remote = TokenDataset(at, device="cpu", resident=True)
    local = TokenDataset(local_path)
    assert remote.resident.n_tokens == local.n_tokens
    assert requests.bytes_of() == sum((local_path / s.path).stat().st_size for s in local.store.shards)
    before = len(requests.calls)
    for make in (lambda d: d.random_batches(8, 300, seed=3), lambda d: d.packed(512, seed=1).batches(4),
                 lambda d: d.packed(300, strategy="greedy").batches(3, padding_free=True)):  # fmt: skip
        a, b = make(local), make(remote)
        for _ in range(20):
            same(next(a), next(b))
    assert len(requests.calls) == before
    # a pool far smaller than the split: the batches still come from the device copy alone
    small = TokenDataset(at, device="cpu", resident=True, pool_limit=4 * BLOCK_BYTES)
    before = len(requests.calls)
    for make in (lambda d: d.window_batches(4, 700, seed=1), lambda d: d.packed(512, seed=2).batches(4)):
        a, b = make(local), make(small)
        for _ in range(20):
            same(next(a), next(b))
    assert len(requests.calls) == before
