"""Map-style sliding windows with every shift mode: `windows(shift="random", grouped=True)` and
its batch sampler, read against the raw tokens and against `window_batches`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmshard.errors import ArgumentError, ConfigError
from lmshard.runtime import TokenDataset, WindowItem

T, B, STRIDE = 24, 3, 10


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(4).integers(0, 1000, size=5_000).astype(np.uint32)


@pytest.fixture(scope="module")
def data(tokens):
    return TokenDataset.from_tokens(tokens, eot_id=999, vocab_size=1000)


def _loader(ds, **kw):
    return torch.utils.data.DataLoader(ds, batch_sampler=ds.batch_sampler(B, **kw))


def test_random_shift_batches_match_window_batches_and_the_raw_tokens(data, tokens):
    """Two ranks over two epochs: each step's batch is window_batches' batch for the same
    arguments, the shift is shared by the ranks and varies, x and y are the raw tokens at
    i·stride (y moved by the shift), and every window appears at most once per epoch."""
    ds = data.windows(T, stride=STRIDE, shift="random", grouped=True)
    assert len(ds) == (len(tokens) - (T + 12)) // STRIDE + 1  # counted with the largest shift, 12
    samplers = [ds.batch_sampler(B, seed=2, rank=r, world_size=2) for r in range(2)]
    streams = [data.window_batches(B, T, stride=STRIDE, shift="random", grouped=True, seed=2, rank=r, world_size=2)
               for r in range(2)]  # fmt: skip
    assert len(samplers[0]) == len(samplers[1]) == streams[0].steps_per_epoch == len(ds) // (B * 2)
    shifts = set()
    for _epoch in range(2):
        seen = []
        pairs = [list(s) for s in samplers]  # one epoch of (window, shift) lists per rank
        loaders = [iter(torch.utils.data.DataLoader(ds, batch_sampler=p)) for p in pairs]
        for step in range(len(samplers[0])):
            shift = pairs[0][step][0][1]
            shifts.add(shift)
            assert T % shift == 0 and shift < T
            for r in range(2):
                assert {s for _, s in pairs[r][step]} == {shift}
                batch, ref = next(loaders[r]), next(streams[r])
                assert isinstance(batch, WindowItem) and ref.shift == shift
                assert batch.input_ids.shape == (B, T // shift, shift)
                assert torch.equal(batch["input_ids"], ref.x) and torch.equal(batch["labels"], ref.y)
                for row, (i, _) in enumerate(pairs[r][step]):
                    seen.append(i)
                    o = i * STRIDE
                    assert batch.input_ids[row].flatten().tolist() == tokens[o : o + T].tolist()
                    assert batch.labels[row].flatten().tolist() == tokens[o + shift : o + shift + T].tolist()
        assert len(set(seen)) == len(seen) == len(samplers[0]) * B * 2
    assert len(shifts) > 2


def test_items_take_an_explicit_shift_and_refuse_a_bare_index(data, tokens):
    ds = data.windows(T, stride=STRIDE, shift="random")
    x, y = ds[5, 4]
    assert x.tolist() == tokens[50:74].tolist() and y.tolist() == tokens[54:78].tolist()
    with pytest.raises(ArgumentError, match="batch_sampler"):
        ds[5]
    with pytest.raises(ArgumentError, match="shift=5"):
        ds[5, 5]  # 5 does not divide 24
    with pytest.raises(IndexError):
        ds[len(ds), 2]


def test_fixed_shift_grouped_items_collate_with_any_sampler(data, tokens):
    ds = data.windows(T, stride=STRIDE, shift=4, grouped=True)
    x, y = ds[3]
    assert x.shape == y.shape == (6, 4)
    assert x.flatten().tolist() == tokens[30:54].tolist() and y.flatten().tolist() == tokens[34:58].tolist()
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=5, shuffle=True)))
    assert batch.input_ids.shape == (5, 6, 4)
    with pytest.raises(ArgumentError, match="does not divide"):
        data.windows(T, shift=5, grouped=True)
    fixed = _loader(ds, seed=1)
    assert {tuple(b.input_ids.shape) for b in fixed} == {(B, 6, 4)}


def test_the_sampler_resumes_mid_epoch_and_refuses_another_order(data):
    ds = data.windows(T, stride=STRIDE, shift="random")
    first = ds.batch_sampler(B, seed=7)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    rest = list(it)
    again = ds.batch_sampler(B, seed=7)
    again.load_state_dict(state)
    assert (state["epoch"], state["step"]) == (0, 5)
    assert list(again) == rest and again.epoch == 1
    epoch1 = ds.batch_sampler(B, seed=7)
    epoch1.set_epoch(1)
    assert list(epoch1) == list(first) and list(first) != rest
    with pytest.raises(ConfigError, match="seed: saved 7, now 8"):
        ds.batch_sampler(B, seed=8).load_state_dict(state)


def test_workers_give_the_same_batches(data):
    ds = data.windows(T, stride=STRIDE, shift="random")
    plain = [b.labels for b in _loader(ds, seed=3)]
    sampler = ds.batch_sampler(B, seed=3)
    workers = [b.labels for b in torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=2)]
    assert len(plain) == len(workers) > 0 and all(torch.equal(a, b) for a, b in zip(plain, workers, strict=True))


def test_too_few_windows_for_a_global_batch(data):
    ds = TokenDataset.synthetic(200, vocab_size=10).windows(T, stride=STRIDE, shift="random")
    with pytest.raises(ArgumentError, match="windows; lower batch_size"):
        ds.batch_sampler(len(ds), world_size=2, rank=0)


def test_a_batch_reads_each_attribute_by_name_but_keys_are_the_model_inputs():
    """batch["shift"] (a loop written for mappings) is batch.shift; keys() and model(**batch)
    stay input_ids and labels (and what is set of cu_seqlens...); an unknown name says what reads."""
    import numpy as np

    from lmshard.runtime.batches import Batch

    b = Batch(x=torch.zeros(2, 4, dtype=torch.int64), y=torch.ones(2, 4, dtype=torch.int64), step=7, shift=2,
              offsets=np.array([0, 9]))  # fmt: skip
    assert b["shift"] == 2 and b["step"] == 7 and b["offsets"].tolist() == [0, 9] and b["x"] is b.x
    assert b.keys() == ["input_ids", "labels"] and "shift" not in b
    with pytest.raises(KeyError, match="a batch reads as input_ids, labels .* shift"):
        b["shfit"]
