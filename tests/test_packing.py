"""Packing plans and packed datasets, held to a plain best-fit reference and to the tokens
themselves (numpy arrays given to `from_tokens`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmshard import packing
from lmshard.errors import ArgumentError
from lmshard.packing import io as packing_io
from lmshard.runtime import TokenDataset
from lmshard.runtime.packed import IGNORE, collate_packed


def reference_bfd(lengths: list[int], seq_len: int) -> list[int]:
    """Best-fit decreasing, one item at a time: the room left in each pack, sorted."""
    rooms: list[int] = []
    for length in sorted(lengths, reverse=True):
        fits = [r for r in rooms if r >= length]
        if fits:
            rooms[rooms.index(min(fits))] -= length
        else:
            rooms.append(seq_len - length)
    return sorted(rooms)


def pack_rooms(p: packing.PackPlan) -> list[int]:
    return sorted((p.seq_len - np.add.reduceat(p.length, p.ptr[:-1])).tolist())


def check_plan(p: packing.PackPlan, lengths: np.ndarray) -> None:
    """Every item exactly once, no pack over seq_len, no empty pack."""
    assert (np.diff(p.ptr) >= 1).all()
    assert (np.add.reduceat(p.length, p.ptr[:-1]) <= p.seq_len).all()
    items = packing.make_items(lengths, p.seq_len, p.overlong)
    got = sorted(zip(p.start.tolist(), p.length.tolist(), strict=True))
    assert got == sorted(zip(items.start.tolist(), items.length.tolist(), strict=True))


def test_bfd_matches_a_plain_best_fit_on_random_lengths() -> None:
    rng = np.random.default_rng(7)
    for _ in range(150):
        seq_len = int(rng.integers(1, 80))
        lengths = rng.integers(1, seq_len + 1, size=int(rng.integers(1, 250)))
        p = packing.plan(lengths, seq_len, "bfd")
        check_plan(p, lengths)
        assert pack_rooms(p) == reference_bfd(lengths.tolist(), seq_len)


@pytest.mark.parametrize("strategy", ["first_fit", "window_5", "greedy"])
def test_other_strategies_give_valid_plans(strategy: str) -> None:
    rng = np.random.default_rng(3)
    for _ in range(40):
        seq_len = int(rng.integers(2, 60))
        lengths = rng.integers(1, 2 * seq_len, size=int(rng.integers(1, 200)))
        check_plan(packing.plan(lengths, seq_len, strategy), lengths)


def test_greedy_is_next_fit_in_input_order() -> None:
    p = packing.plan(np.array([3, 4, 2, 5, 1]), 6, "greedy")
    packs = [p.length[p.ptr[i] : p.ptr[i + 1]].tolist() for i in range(p.n_packs)]
    assert packs == [[3], [4, 2], [5, 1]]


def test_fill_order_across_strategies() -> None:
    lengths = np.minimum(np.random.default_rng(0).lognormal(6.5, 1.2, 20_000).astype(np.int64) + 1, 9000)
    fills = [packing.plan(lengths, 4096, s).metrics()["fill"] for s in ("bfd", "first_fit", "window_200", "greedy")]
    assert fills == sorted(fills, reverse=True)
    assert fills[0] > 0.99 and fills[-1] < fills[0]


def test_overlong_policies_are_counted() -> None:
    lengths = np.array([3, 10, 4, 7])  # seq_len 4: 10 -> 4+4+2, 7 -> 4+3
    split = packing.make_items(lengths, 4, "split")
    assert split.length.tolist() == [3, 4, 4, 2, 4, 4, 3]
    assert split.start.tolist() == [0, 3, 7, 11, 13, 17, 21]
    assert (split.split_docs, split.split_pieces) == (2, 5)
    trunc = packing.make_items(lengths, 4, "truncate")
    assert trunc.length.tolist() == [3, 4, 4, 4] and (trunc.truncated_docs, trunc.truncated_tokens) == (2, 9)
    drop = packing.make_items(lengths, 4, "drop")
    assert drop.start.tolist() == [0, 13] and (drop.dropped_docs, drop.dropped_tokens) == (2, 17)
    m = packing.plan(lengths, 4, "bfd", "truncate").metrics()
    assert m["tokens"] == 15 and m["truncated_tokens"] == 9 and m["lower_bound"] == 4


def test_multiple_balances_without_losing_items() -> None:
    lengths = np.random.default_rng(1).integers(1, 50, size=300)
    for multiple in (1, 4, 7, 12):
        p = packing.plan(lengths, 128, "bfd", multiple=multiple)
        assert p.n_packs % multiple == 0
        check_plan(p, lengths)
    with pytest.raises(ArgumentError, match="multiple of 50"):
        packing.plan(np.array([5, 5, 5]), 8, "bfd", multiple=50)
    # one pack of six items and multiple=4: three packs must come out of that one pack
    few = np.ones(6, dtype=np.int64)
    p = packing.plan(few, 8, "bfd", multiple=4)
    assert p.n_packs == 4 and sorted(np.diff(p.ptr).tolist()) == [1, 1, 1, 3]
    check_plan(p, few)
    with pytest.raises(ArgumentError, match="multiple of 8"):
        packing.plan(few, 8, "bfd", multiple=8)  # 6 items cannot make 8 packs


def docs_dataset(seed: int = 0, n_docs: int = 60, seq_len: int = 32) -> tuple[TokenDataset, list[np.ndarray]]:
    """Documents of distinct tokens (the token is its global position + 1, EOT 0 never used)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2 * seq_len, size=n_docs)
    tokens = np.arange(1, int(lengths.sum()) + 1, dtype=np.uint32)
    cuts = np.cumsum(lengths)[:-1]
    data = TokenDataset.from_tokens(tokens, lengths, eot_id=0, vocab_size=int(tokens.max()) + 1)
    return data, np.split(tokens, cuts)


def test_packed_samples_agree_with_the_documents() -> None:
    T = 32
    data, docs = docs_dataset(seq_len=T)
    packs = data.packed(T, seed=3)
    seen: list[int] = []
    for i in range(len(packs)):
        s = packs[i]
        ids, labels, pos, cu = (s[k].numpy() for k in ("input_ids", "labels", "position_ids", "cu_seqlens"))
        n = s["length"]
        assert (ids[n:] == 0).all() and (labels[n:] == IGNORE).all()
        assert cu[0] == 0 and cu[-1] == T and s["max_seqlen"] == int(np.diff(cu).max())
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            assert pos[a:b].tolist() == list(range(b - a))
            if a >= n:
                continue  # the padding segment
            piece = ids[a:b]
            assert (np.diff(piece) == 1).all()  # consecutive positions of one document
            doc = next(d for d in docs if d[0] <= piece[0] <= d[-1])
            assert piece[-1] <= doc[-1]  # never crosses into the next document
            assert labels[a : b - 1].tolist() == piece[1:].tolist() and labels[b - 1] == IGNORE
        seen += ids[:n].tolist()
    assert sorted(seen) == np.concatenate(docs).tolist()  # every token exactly once


def test_same_seed_same_packs_and_epochs_reshuffle() -> None:
    data, _ = docs_dataset()
    a, b, c = data.packed(32, seed=1), data.packed(32, seed=1), data.packed(32, seed=2)
    assert all(torch.equal(a[i]["input_ids"], b[i]["input_ids"]) for i in range(len(a)))
    assert a.order().tolist() != c.order().tolist()
    first = a.order().tolist()
    a.set_epoch(1)
    assert a.order().tolist() != first and sorted(a.order().tolist()) == sorted(first)


def test_ranks_get_equal_steps_disjoint_packs_and_resume_exactly() -> None:
    data, _ = docs_dataset(n_docs=200)
    B, W = 2, 3
    packs = data.packed(32, seed=5, multiple=B * W)
    streams = [packs.batches(B, rank=r, world_size=W) for r in range(W)]
    steps = {s.steps_per_epoch for s in streams}
    assert steps == {len(packs) // (B * W)} and streams[0].left_over == 0
    for epoch in range(2):
        seen = [p for s in streams for _ in range(s.steps_per_epoch) for p in next(s)["packs"].tolist()]
        assert sorted(seen) == list(range(len(packs))), epoch
    ref = packs.batches(B, rank=1, world_size=W)
    for _ in range(5):
        next(ref)
    state = ref.state_dict()
    expected = [next(ref) for _ in range(4)]
    again = packs.batches(B, rank=1, world_size=W)
    again.load_state_dict(state)
    for e in expected:
        got = next(again)
        x, y = got
        assert torch.equal(x, e["input_ids"]) and torch.equal(y, e["labels"])
    other = data.packed(32, seed=6, multiple=B * W).batches(B, rank=1, world_size=W)
    with pytest.raises(ArgumentError, match="seed"):
        other.load_state_dict(state)


def test_padding_free_collation_keeps_only_real_tokens() -> None:
    data, _ = docs_dataset()
    packs = data.packed(32)
    samples = [packs[i] for i in range(4)]
    flat = collate_packed(samples, padding_free=True)
    padded = collate_packed(samples)
    real = [s["input_ids"][: s["length"]] for s in samples]
    assert torch.equal(flat["input_ids"][0], torch.cat(real))
    cu = flat["cu_seqlens"]
    assert cu[0] == 0 and cu[-1] == flat["input_ids"].shape[1] and cu.dtype == torch.int32
    assert padded["input_ids"].shape == (4, 32) and padded["cu_seqlens"][-1] == 4 * 32
    assert flat["max_seqlen"] == int((cu[1:] - cu[:-1]).max())


@pytest.mark.parametrize("padding_free", [False, True])
def test_stream_batches_equal_collated_samples(padding_free: bool) -> None:
    data, _ = docs_dataset(n_docs=120)
    packs = data.packed(32, seed=2, multiple=4)
    stream = packs.batches(2, rank=1, world_size=2, padding_free=padding_free)
    for step in (0, 3, stream.steps_per_epoch + 1):
        batch = stream.batch(step)
        expected = collate_packed([packs.pack(int(p)) for p in batch["packs"]], padding_free=padding_free)
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert torch.equal(batch[key], expected[key]), (step, key)
        assert batch["max_seqlen"] == expected["max_seqlen"]


def test_plans_are_cached_in_the_dataset_and_a_damaged_cache_is_rebuilt(tmp_path) -> None:
    from test_prepare import jsonl, make_texts

    from lmshard.prepare import PrepareConfig, prepare

    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "a.jsonl", make_texts(120, seed=1)))], out=str(tmp_path / "ds"),
                          workers=1, val_fraction=0.0))  # fmt: skip
    data = TokenDataset(tmp_path / "ds")
    fresh = data.packed(48, multiple=3)
    cached = list((tmp_path / "ds" / packing_io.CACHE_DIR).glob("packing-*.npz"))
    assert len(cached) == 1
    again = data.packed(48, multiple=3)  # read from the cache: the same plan
    assert np.array_equal(again.plan.start, fresh.plan.start) and np.array_equal(again.plan.ptr, fresh.plan.ptr)
    assert again.metrics == fresh.metrics
    with np.load(cached[0]) as z:  # a tampered plan (a pack emptied) is not trusted
        arrays = dict(z)
    arrays["ptr"][1] = 0
    np.savez(cached[0], **arrays)
    assert np.array_equal(data.packed(48, multiple=3).plan.ptr, fresh.plan.ptr)
    cached[0].write_bytes(b"truncated")
    assert np.array_equal(data.packed(48, multiple=3).plan.ptr, fresh.plan.ptr)
    other = data.packed(48, multiple=3, strategy="greedy")
    assert len(list((tmp_path / "ds" / packing_io.CACHE_DIR).glob("packing-*.npz"))) == 2
    assert other.plan.strategy == "greedy"
    from lmshard.inspect.verify import verify_dataset

    assert verify_dataset(tmp_path / "ds").ok  # the cache directory is not mistaken for corruption


def test_padded_batches_group_by_length_balanced_and_resumable() -> None:
    data, docs = docs_dataset(n_docs=300, seq_len=40)
    B, W, max_len = 4, 3, 50
    streams = [data.padded_batches(B, max_len, seed=1, rank=r, world_size=W, mega=5) for r in range(W)]
    steps = streams[0].steps_per_epoch
    assert steps == 300 // (B * W) and all(s.steps_per_epoch == steps for s in streams)
    seen: list[int] = []
    spreads, plain_spreads = [], []
    plain = data.padded_batches(B, max_len, seed=1, group_by_length=False)
    for _ in range(steps):
        for s in streams:
            batch = next(s)
            x, y = batch
            mask = batch["attention_mask"].bool()
            for r, (i, n) in enumerate(zip(batch["items"].tolist(), batch["lengths"].tolist(), strict=True)):
                doc = docs[i][:max_len]  # truncated at max_len
                assert n == len(doc) and x[r, :n].tolist() == doc.tolist() and mask[r].sum() == n
                assert y[r, : n - 1].tolist() == doc[1:].tolist() and (y[r, n - 1 :] == IGNORE).all()
            assert x.shape[1] == int(batch["lengths"].max())
            seen += batch["items"].tolist()
            spreads.append(int(np.ptp(batch["lengths"])))
        plain_spreads.append(int(np.ptp(next(plain)["lengths"])))
    assert len(seen) == len(set(seen)) == steps * B * W  # no document twice in an epoch
    assert np.mean(spreads) < np.mean(plain_spreads) / 2  # grouping makes rows of similar length
    ref = data.padded_batches(B, max_len, seed=1, rank=2, world_size=W, mega=5)
    for _ in range(3):
        next(ref)
    state = ref.state_dict()
    want = next(ref)
    again = data.padded_batches(B, max_len, seed=1, rank=2, world_size=W, mega=5)
    again.load_state_dict(state)
    assert torch.equal(next(again)["input_ids"], want["input_ids"])
    with pytest.raises(ArgumentError, match="mega"):
        data.padded_batches(B, max_len, seed=1, rank=2, world_size=W).load_state_dict(state)


def test_streams_split_over_dataloader_workers_in_step_order() -> None:
    """In step order over the workers; the state is saved after the last batch trained on
    (the stream here, which the workers serve, refuses a plain state_dict) and resumes there."""
    data, _ = docs_dataset(n_docs=150)
    for make in (lambda: data.packed(32, seed=4).batches(2), lambda: data.padded_batches(2, 40, seed=4)):
        direct = make()
        expected = [next(direct)["input_ids"] for _ in range(8)]
        served = make()
        loader = torch.utils.data.DataLoader(served, batch_size=None, num_workers=2)
        got = [b for b, _ in zip(loader, range(6), strict=False)]
        assert all(torch.equal(a["input_ids"], b) for a, b in zip(got, expected, strict=False))
        with pytest.raises(ArgumentError, match="handed out by DataLoader workers"):
            served.state_dict()
        again = make()
        again.load_state_dict(served.state_dict(after=got[-1]))
        assert all(torch.equal(next(again)["input_ids"], b) for b in expected[6:])
