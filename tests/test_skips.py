"""Skip ranges (`stream.skip(a, b, mode)`, runtime/skips.py), checked against the same stream
without a skip: with mode="data" the run's step t >= a draws the batch of step t + (b - a) and
its steps go on one by one; with mode="steps" its step numbers move past the range and step
t >= b draws the batch of step t - (b - a). The ranges are in the state: a run restarted inside
and after the range, at another world size, draws the batches stated, for window, random, packed
and padded streams."""

from __future__ import annotations

import pytest
import torch

from lmshard import TokenDataset
from lmshard.errors import ArgumentError


@pytest.fixture(scope="module")
def ds():
    return TokenDataset.synthetic(n_tokens=60_000, vocab_size=500, seed=2, doc_len=37)


def _make(ds, kind, rank=0, world=1, batch=4):
    if kind == "windows":
        return ds.window_batches(batch, 16, seed=3, rank=rank, world_size=world)
    if kind == "random":
        return ds.random_batches(batch, 16, seed=3, rank=rank, world_size=world)
    if kind == "packed":
        return ds.packed(48).batches(batch, rank=rank, world_size=world)
    return ds.padded_batches(batch, 48, seed=3, rank=rank, world_size=world)


def _x(batch):
    return batch.x if hasattr(batch, "x") else batch["input_ids"]


KINDS = ["windows", "random", "packed", "padded"]


@pytest.mark.parametrize("kind", KINDS)
def test_mode_data_moves_the_data_past_the_range_and_the_steps_go_on(ds, kind):
    plain = [_x(b) for b, _ in zip(_make(ds, kind), range(30), strict=False)]
    stream = _make(ds, kind).skip(10, 15)
    got = [next(stream) for _ in range(25)]
    assert [b.step for b in got] == list(range(25))
    for t, b in enumerate(got):
        assert torch.equal(_x(b), plain[t if t < 10 else t + 5]), t


@pytest.mark.parametrize("kind", KINDS)
def test_mode_steps_moves_the_step_numbers_past_the_range_and_keeps_the_data(ds, kind):
    plain = [_x(b) for b, _ in zip(_make(ds, kind), range(20), strict=False)]
    stream = _make(ds, kind).skip(10, 15, mode="steps")
    got = [next(stream) for _ in range(20)]
    assert [b.step for b in got] == [*range(10), *range(15, 25)]
    assert all(torch.equal(_x(b), plain[i]) for i, b in enumerate(got))
    assert stream.state_dict()["step"] == 25


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["data", "steps"])
def test_a_run_restarted_inside_and_after_the_range_at_another_world_size(ds, kind, mode):
    """Two ranks × 2 rows skip [10, 15); states saved inside the range (step 12) and after it
    (step 18) resume on one rank × 4 rows, whose batches are the two ranks' rows together."""
    ranks = [_make(ds, kind, r, 2, 2).skip(10, 15, mode) for r in range(2)]
    served = {}
    states = {}
    for _ in range(22):
        pair = [next(s) for s in ranks]
        served[pair[0].step] = torch.cat([_x(p) for p in pair])
        if pair[0].step in (11, 17):
            states[pair[0].step + 1] = ranks[0].state_dict()
    for saved in (12, 18):
        state = states.get(saved)
        if state is None:  # mode "steps": 12 is never handed out; resume from the state after step 9
            continue
        assert state["skips"] == [[10, 15]] and state["skip_mode"] == mode
        one = _make(ds, kind, 0, 1, 4)  # no skip() here: the state carries the range
        one.load_state_dict(state)
        for _ in range(3):
            b = next(one)
            assert torch.equal(_x(b), served[b.step]), (saved, b.step)
    if mode == "steps":  # a state saved before the range: the next steps handed out are 15, 16 ...
        early = _make(ds, kind, 0, 2, 2).skip(10, 15, mode)
        for _ in range(10):
            next(early)
        resumed = _make(ds, kind, 0, 1, 4)
        resumed.load_state_dict(early.state_dict())
        assert next(resumed).step == 15


def test_skips_are_checked(ds):
    stream = ds.random_batches(2, 16)
    with pytest.raises(ArgumentError, match="pass a stop after start=5"):
        stream.skip(5, 5)
    stream.skip(5, 8)
    with pytest.raises(ArgumentError, match="overlap a range already skipped"):
        stream.skip(7, 9)
    with pytest.raises(ArgumentError, match="one stream skips one way"):
        stream.skip(20, 30, mode="steps")
    with pytest.raises(ArgumentError, match="pass 'data'"):
        ds.random_batches(2, 16).skip(1, 2, mode="batches")


def test_trace_and_exposure_follow_the_skip(ds):
    plain = ds.window_batches(4, 16, seed=3)
    skipped = ds.window_batches(4, 16, seed=3).skip(3, 6)
    assert skipped.trace(4) == plain.trace(7)
    full = plain.exposure(13)  # steps 0..12 without a skip: 0..9 with it, moved past 3..5
    counted = skipped.exposure(10)
    assert (counted <= full).all() and counted.sum() == sum(
        len({(p.doc) for p in row}) for t in (*range(3), *range(6, 13)) for row in plain.trace(t))  # fmt: skip


def test_a_range_the_stream_has_handed_out_is_refused(ds):
    """Skipping steps already drawn would rewrite what the run's past steps trained on (their
    trace and exposure): refused; a stream loaded from the checkpoint before the range skips it."""
    stream = ds.window_batches(4, 16, seed=3)
    before = stream.state_dict()
    for _ in range(10):
        next(stream)
    past = stream.trace(3)
    with pytest.raises(ArgumentError, match=r"handed out steps up to 9 already.*load the checkpoint saved before "
                                            r"step 2 first"):  # fmt: skip
        stream.skip(2, 4)
    assert stream.trace(3) == past and "skips" not in stream.state_dict()
    stream.skip(10, 12)  # still to come: fine
    again = ds.window_batches(4, 16, seed=3)
    again.load_state_dict(before)
    again.skip(30, 32)
    again.load_state_dict(stream.state_dict())  # a state's ranges join the stream's ranges still to come
    assert again.state_dict()["skips"] == [[10, 12], [30, 32]]


def test_a_skipped_step_number_is_not_traced(ds):
    stream = ds.window_batches(4, 16, seed=3).skip(5, 9, mode="steps")
    assert stream.trace(9) == ds.window_batches(4, 16, seed=3).trace(5)
    with pytest.raises(ArgumentError, match=r"step 6 was skipped \(steps 5 .. 8, mode='steps'\): no batch was handed "
                                            r"out as it; the batch after step 4 is step 9's"):  # fmt: skip
        stream.trace(6)


def test_a_range_given_before_loading_a_later_state_is_refused(ds):
    """skip() then load_state_dict() of a checkpoint past the range: the checkpoint's run drew
    those steps, so the range would rewrite its past; refused, and the stream is left as it was."""
    run = ds.window_batches(4, 16, seed=3)
    for _ in range(20):
        next(run)
    fresh = ds.window_batches(4, 16, seed=3).skip(5, 10)
    with pytest.raises(ArgumentError, match=r"skip\(5, 10\) is before this state's step 20"):
        fresh.load_state_dict(run.state_dict())
    assert fresh.step == 0 and fresh.state_dict()["skips"] == [[5, 10]]


def test_a_staged_stream_skipping_from_its_next_step_draws_the_step_after_the_range(ds):
    """A staged stream prefetches its next batch; a skip from that step on must drop it."""
    staged = ds.window_batches(4, 16, seed=3)
    staged.staged = True
    for _ in range(3):
        next(staged)
    staged.skip(3, 10)
    assert torch.equal(next(staged).x, ds.window_batches(4, 16, seed=3).cpu_batch(10).x)
