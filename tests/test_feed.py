"""Where item results come from (prepare/execution/feed.py), and the separators around each document.

A small input is done in the main process and never pays for a worker pool; a large one starts
the pool once the rate of the first items says it pays off; the main process keeps working
until every worker is ready. Whoever does an item, the results come out in plan order and equal.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import write
from hypothesis import given, settings
from hypothesis import strategies as st

import lmshard.prepare.execution.feed as feed
from lmshard.prepare.documents.clean import CleanConfig
from lmshard.prepare.documents.sources import discover, plan
from lmshard.prepare.documents.worker import WorkerConfig, process_item, run_item
from lmshard.prepare.execution.feed import Feeder
from lmshard.prepare.output.writer import with_separators
from lmshard.tokenizers import load_tokenizer


def test_separators_with_and_without_bos():
    tokens = np.array([1, 2, 3, 4, 5], dtype=np.uint32)
    lengths, every = np.array([2, 0, 3]), np.ones(3, bool)
    out, lens = with_separators(tokens, lengths, every, 9, "after", 7)
    assert out.tolist() == [7, 1, 2, 9, 7, 9, 7, 3, 4, 5, 9] and lens.tolist() == [4, 2, 5]
    out, lens = with_separators(tokens, lengths, every, 9, "before", 7)
    assert out.tolist() == [9, 7, 1, 2, 9, 7, 9, 7, 3, 4, 5] and lens.tolist() == [4, 2, 5]
    some = np.array([True, False, True])
    out, lens = with_separators(tokens, lengths, some, 9, "after")
    assert out.tolist() == [1, 2, 9, 3, 4, 5, 9] and lens.tolist() == [3, 4]
    out, lens = with_separators(tokens, lengths, some, 9, "before", 7)
    assert out.tolist() == [9, 7, 1, 2, 9, 7, 3, 4, 5] and lens.tolist() == [4, 5]
    assert out.dtype == np.dtype("<u4")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2**32 - 1), max_size=6), st.booleans()), max_size=8),
       st.sampled_from(["after", "before"]), st.sampled_from([None, 7]))  # fmt: skip
def test_separators_match_a_plain_python_reference(docs, position, bos):
    tokens = np.array([t for d, _ in docs for t in d], dtype=np.uint32)
    lengths = np.array([len(d) for d, _ in docs], dtype=np.int64)
    keep = np.array([k for _, k in docs], dtype=bool)
    expected: list[int] = []
    for d, k in docs:
        if k:
            head = [] if bos is None else [bos]
            expected += head + d + [9] if position == "after" else [9] + head + d
    out, lens = with_separators(tokens, lengths, keep, 9, position, bos)
    assert out.tolist() == expected and out.dtype == np.dtype("<u4")
    assert lens.tolist() == [len(d) + (1 if bos is None else 2) for d, k in docs if k]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """~45 work items of one JSON-lines file (1 KiB blocks), a worker config and a tokenizer."""
    root = tmp_path_factory.mktemp("feed")
    src = write(root / "a.jsonl", "".join(json.dumps({"text": f"document {i} " + "w " * (i % 50)}) + "\n"
                                          for i in range(640)))  # fmt: skip
    sources = discover([str(src)])
    wcfg = WorkerConfig(sources=tuple(sources), clean=CleanConfig(), tokenizer="gpt2", tokenizer_backend="tiktoken")
    tok = load_tokenizer("gpt2", "tiktoken")
    return sources, wcfg, tok


def _items(sources, monkeypatch):
    import lmshard.prepare.documents.sources as sources_mod

    monkeypatch.setattr(sources_mod, "BLOCK_BYTES", 1024)
    return list(plan(sources, "auto", "text"))


def _run(feeder: Feeder, items, wcfg, tok):
    def local(item):
        return run_item(item, wcfg, tok)

    return [(r.seq, r.tokens.tolist(), r.lengths.tolist()) for r in feeder.map(process_item, local, iter(items))]


class _Clock:
    """A clock that advances `step` seconds each time it is read: each item done here takes one
    step, however fast or loaded the machine is."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def perf_counter(self) -> float:
        self.now += self.step / 2
        return self.now


def test_a_small_input_never_starts_the_pool(setup, monkeypatch):
    """At 1 KiB per ms (each item of ~1 KiB takes 1 ms on the clock driven here) the ~45 KB left
    take far less than the pool's start (POOL_START_SECONDS): the pool is never started."""
    sources, wcfg, tok = setup
    items = _items(sources, monkeypatch)
    monkeypatch.setattr(feed, "time", _Clock(0.001))
    assert sum(i.nbytes for i in items) / 1024 * 0.001 < feed.POOL_START_SECONDS
    with contextlib.ExitStack() as stack:
        feeder = Feeder(2, wcfg, stack, bytes_total=sum(s.size for s in sources))
        results = _run(feeder, items, wcfg, tok)
        assert feeder.pool is None and feeder.bytes_here == sum(i.nbytes for i in items)
    assert [r[0] for r in results] == [(0, k) for k in range(len(items))] and len(items) > 30


def test_a_large_input_starts_the_pool_and_results_stay_in_order(setup, monkeypatch):
    """Pretend the input is huge: after the first item the estimate says a pool pays off; the
    main process does items until both workers are ready, then the pool does the rest. Here the
    workers say they are not ready for 5 items (then this waits for them, however long they
    take): 6 items here, the rest in the pool, in order."""
    sources, wcfg, tok = setup
    items = _items(sources, monkeypatch)
    real_ready, asked = feed.OrderedPool.ready, []

    def ready(pool) -> bool:
        asked.append(1)
        if len(asked) <= 5:
            return False
        while not real_ready(pool):  # (a wait for the workers, not a condition on how fast they are)
            time.sleep(0.01)
        return True

    monkeypatch.setattr(feed.OrderedPool, "ready", ready)
    with contextlib.ExitStack() as stack:
        expected = _run(Feeder(1, wcfg, stack, 0), items, wcfg, tok)
        feeder = Feeder(2, wcfg, stack, bytes_total=1 << 40)
        got = _run(feeder, items, wcfg, tok)
        assert feeder.pool is not None and feeder.parallel, "the pool never took over"
        assert feeder.bytes_here == sum(i.nbytes for i in items[:6]) and len(items) > 6  # items done on both sides
    assert got == expected


@pytest.mark.parametrize("total", [None, 100])
def test_a_stream_or_a_zero_threshold_starts_the_pool_at_once(setup, monkeypatch, total):
    sources, wcfg, tok = setup
    items = _items(sources, monkeypatch)
    monkeypatch.setattr(feed, "POOL_START_SECONDS", 0.0 if total is not None else 0.5)
    with contextlib.ExitStack() as stack:
        expected = _run(Feeder(1, wcfg, stack, total), items, wcfg, tok)
        feeder = Feeder(2, wcfg, stack, bytes_total=total)
        results = feeder.map(process_item, lambda it: run_item(it, wcfg, tok), iter(items))
        assert feeder.pool is None  # a generator: nothing has run yet
        first = next(results)
        assert feeder.pool is not None, "the pool did not start before the first item"
        rest = [(r.seq, r.tokens.tolist(), r.lengths.tolist()) for r in results]
    assert [(first.seq, first.tokens.tolist(), first.lengths.tolist()), *rest] == expected


def test_prepare_output_is_the_same_in_process_and_in_the_pool(tmp_path, monkeypatch):
    """End to end: all in this process, pool at once, and the estimate's choice agree byte for byte."""
    from lmshard.prepare import PrepareConfig, prepare

    src = write(tmp_path / "a.jsonl", "".join(json.dumps({"text": f"doc {i} " + "x y " * (i % 40)}) + "\n"
                                              for i in range(3000)))  # fmt: skip
    import lmshard.prepare.documents.sources as sources_mod

    monkeypatch.setattr(sources_mod, "BLOCK_BYTES", 4096)
    trees = []
    for name, threshold in (("here", 1e9), ("pool", 0.0), ("auto", 0.5)):
        monkeypatch.setattr(feed, "POOL_START_SECONDS", threshold)
        out = tmp_path / name
        prepare(PrepareConfig(inputs=[str(src)], out=str(out), workers=2, tokens_per_shard=5000))
        trees.append({str(p.relative_to(out)): p.read_bytes() for p in sorted(Path(out).rglob("*.*"))
                      if p.suffix in (".bin", ".idx", ".u64")})  # fmt: skip
    assert trees[0] == trees[1] == trees[2] and len(trees[0]) > 4


def test_items_of_unknown_size_start_the_pool_once_this_process_spent_long_enough(tmp_path, monkeypatch):
    """CSV (like JSON arrays) is parsed here into items that do not say their size: the pool
    starts once the items done here took longer than the threshold, not never."""
    import lmshard.prepare.documents.sources as sources_mod

    monkeypatch.setattr(sources_mod, "RECORDS_PER_ITEM", 50)
    monkeypatch.setattr(feed, "POOL_START_SECONDS", 0.15)
    src = write(tmp_path / "a.csv", "id,text\n" + "".join(f"{i},row {i} of the table\n" for i in range(1000)))
    sources = discover([str(src)])
    items = list(plan(sources, "auto", "text"))
    assert len(items) == 20 and items[0].nbytes == 0
    wcfg = WorkerConfig(sources=tuple(sources), clean=CleanConfig(), tokenizer="gpt2", tokenizer_backend="tiktoken")
    tok = load_tokenizer("gpt2", "tiktoken")
    with contextlib.ExitStack() as stack:
        expected = _run(Feeder(1, wcfg, stack, src.stat().st_size), items, wcfg, tok)
        feeder = Feeder(2, wcfg, stack, bytes_total=src.stat().st_size)
        monkeypatch.setattr(feed, "time", _Clock(0.1))  # each item done here takes 0.1 s on this clock
        got = _run(feeder, items, wcfg, tok)
        assert feeder.pool is not None, "the pool never started"
    assert got == expected


def test_a_worker_that_loads_another_tokenizer_refuses_to_start(setup):
    """The main process's tokenizer identity travels to the workers; one that loads anything
    else (a file changed mid-run) stops before its first item, and the pool says so."""
    from lmshard.errors import TokenizerError
    from lmshard.prepare.documents.worker import identity_of, init_worker
    from lmshard.prepare.execution.pool import OrderedPool, WorkerDied, WorkerStartFailed

    sources, wcfg, tok = setup
    right = replace(wcfg, expect=identity_of(tok))
    init_worker(right)  # the same tokenizer: no complaint
    wrong = replace(wcfg, expect=(("backend", "tiktoken"), ("vocab_sha256", "0" * 64)))
    with pytest.raises(TokenizerError, match="loaded a different tokenizer .*vocab_sha256"):
        init_worker(wrong)
    failed = pytest.raises(WorkerStartFailed, match="could not start: .*different tokenizer")
    with OrderedPool(2, init_worker, wrong) as pool, failed:
        list(pool.imap(process_item, plan(sources, "auto", "text"), window=2))
    assert issubclass(WorkerStartFailed, WorkerDied)  # so prepare keeps the work and offers --resume


def _tokenizer_address(_: int) -> int:
    from lmshard.prepare.documents import worker

    return id(worker._state["tokenizer"])


def test_forked_workers_use_the_parents_tokenizer_without_loading_one(setup, monkeypatch):
    """Workers forked after the tokenizer loaded take the parent's object (same address in the
    copied memory) and never load one: loading is broken here, and the children inherit that."""
    import lmshard.prepare.documents.worker as worker_mod
    from lmshard.prepare.documents.worker import identity_of, init_worker, share_with_forks
    from lmshard.prepare.execution.pool import OrderedPool

    sources, wcfg, tok = setup

    def no_load(*_a, **_k):
        raise AssertionError("a forked worker loaded the tokenizer again")

    monkeypatch.setattr(worker_mod, "load_tokenizer", no_load)
    share_with_forks(tok)
    try:
        pool = OrderedPool(2, start="fork")
    finally:
        share_with_forks(None)
    with pool:
        pool.initialize(init_worker, replace(wcfg, expect=identity_of(tok)))
        addresses = list(pool.imap(_tokenizer_address, range(6), window=2))
    assert set(addresses) == {id(tok)} and "inherited" not in worker_mod._state


def test_ids_travel_back_narrow_only_when_every_one_fits(setup):
    """Workers send uint16 for vocabularies under 65,536 ids; a backend whose ids exceed what
    its n_vocab says still gets every id back intact (uint32), never wrapped."""
    from lmshard.tokenizers import Tokenizer

    sources, wcfg, _ = setup

    class Fixed(Tokenizer):
        def __init__(self, n_vocab: int, ids: list[int]) -> None:
            self.n_vocab, self.ids = n_vocab, ids

        def encode_batch(self, texts):
            return (np.array(self.ids * len(texts), dtype=np.uint32),
                    np.full(len(texts), len(self.ids), dtype=np.int64))  # fmt: skip

        def decode(self, ids):
            return ""

        def identity(self):
            return {}

    item = next(iter(plan(sources, "auto", "text")))
    narrow = run_item(item, wcfg, Fixed(50_257, [1, 50_256]))
    assert narrow.tokens.dtype == np.uint16 and set(narrow.tokens.tolist()) == {1, 50_256}
    lying = run_item(item, wcfg, Fixed(1_000, [1, 70_000]))  # n_vocab understated
    assert lying.tokens.dtype == np.uint32 and set(lying.tokens.tolist()) == {1, 70_000}
