"""A run continued on a grown dataset (`load_state_dict(state, grown="continue")`,
runtime/growth.py): a state saved before `prepare --append` is refused by default in one line that
names the option; with it, the rest of the epoch the state was in equals the uninterrupted run's
on the old data, the next epoch covers the grown split once, and the state saved after it resumes
the same batches at another world size. Random batches have no epochs: from the resumed step on
they draw over the grown split, and every earlier step keeps its batch."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import write

from lmshard import Mixture, TokenDataset
from lmshard.errors import ArgumentError
from lmshard.prepare import PrepareConfig, prepare


def _texts(n: int, salt: str) -> str:
    return "".join(json.dumps({"text": f"{salt} document {i}: " + "word " * (i % 30 + 5)}) + "\n" for i in range(n))


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """(the dataset before, the same dataset after an --append of 100 more documents, a third
    dataset for mixtures)."""
    tmp = tmp_path_factory.mktemp("grown")
    write(tmp / "a.jsonl", _texts(300, "first"))
    write(tmp / "b.jsonl", _texts(100, "second"))
    write(tmp / "c.jsonl", _texts(200, "other"))
    for inputs, out in (("a", "ds"), ("c", "other")):
        prepare(PrepareConfig(inputs=[str(tmp / f"{inputs}.jsonl")], out=str(tmp / out), workers=1,
                              val_fraction=0.0, quiet=True))  # fmt: skip
    shutil.copytree(tmp / "ds", tmp / "old")
    prepare(PrepareConfig(inputs=[str(tmp / "b.jsonl")], out=str(tmp / "ds"), workers=1, val_fraction=0.0,
                          append=True, quiet=True))  # fmt: skip
    return TokenDataset(tmp / "old"), TokenDataset(tmp / "ds"), TokenDataset(tmp / "other")


def _doc_starts(ds: TokenDataset) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(ds.store.doc_lengths())[:-1]])


STREAMS = {
    "windows": lambda ds, **kw: ds.window_batches(kw.pop("batch", 2), 32, seed=1, **kw),
    "packed": lambda ds, **kw: ds.packed(64, seed=1, multiple=4).batches(kw.pop("batch", 2), **kw),
    "padded": lambda ds, **kw: ds.padded_batches(kw.pop("batch", 2), 64, seed=1, **kw),
}


def _rows(batch) -> torch.Tensor:
    return batch.x if hasattr(batch, "x") else batch["input_ids"]


def _row(batch, i: int) -> torch.Tensor:
    """Row i of a batch (a padded batch's without its padding, which depends on the rows beside it)."""
    row = _rows(batch)[i]
    return row[: int(batch["lengths"][i])] if "lengths" in batch else row


def _continued(make, old: TokenDataset, new: TokenDataset, steps: int):
    """(a mixture's run on the old data after `steps` steps, its state, the stream over the grown
    data that continued it); the state alone is refused, naming the grown source and the option."""
    run = make(old)
    for _ in range(steps):
        next(run)
    state = run.state_dict()
    with pytest.raises(ArgumentError, match="source .*grown='continue'"):
        make(new).load_state_dict(state)
    grown = make(new)
    grown.load_state_dict(state, grown="continue")
    return run, state, grown


def _starts(stream, step: int) -> np.ndarray:
    """The split offsets the global batch at `step` reads, sorted."""
    starts = stream.global_reads(step)[0]
    return np.sort(np.asarray(starts))


@pytest.mark.parametrize("kind", sorted(STREAMS))
def test_an_epoch_stream_finishes_its_epoch_on_the_old_data_then_covers_the_grown_split(versions, kind):
    old, new, _ = versions
    make = STREAMS[kind]
    run = make(old)
    spe = run.steps_per_epoch
    at = spe + spe // 3  # inside the second epoch
    for _ in range(at):
        next(run)
    state = run.state_dict()
    rest = [_rows(next(run)).clone() for _ in range(spe - spe // 3)]  # the uninterrupted run's epoch end

    with pytest.raises(ArgumentError, match=r"the split has grown by [\d,]+ tokens since \(an --append\); pass "
                                            r"grown='continue' to load_state_dict"):  # fmt: skip
        make(new).load_state_dict(state)
    grown = make(new)
    grown.load_state_dict(state, grown="continue")
    assert grown.epoch == 1  # the epoch the state was in, on the old data
    assert all(torch.equal(_rows(next(grown)), r) for r in rest)

    # the next epoch: the grown split's own, every window / pack / document of it once
    boundary = 2 * spe
    assert grown.step == boundary and grown.steps_per_epoch == make(new).steps_per_epoch and grown.epoch == 2
    seen = np.concatenate([_starts(grown, boundary + i) for i in range(grown.steps_per_epoch)])
    assert len(np.unique(seen)) == len(seen)
    if kind == "windows":
        assert len(seen) == grown.steps_per_epoch * 2 and seen.max() > old.n_tokens
        assert not np.any(seen % 32)
    else:  # every document of the grown split, old and new, once (packs a multiple of the batch)
        everything = _doc_starts(new)
        assert set(seen.tolist()) <= set(everything.tolist())
        assert len(seen) == len(everything) and (seen >= old.n_tokens).sum() == new.n_docs - old.n_docs

    # the state after the growth resumes the same batches at another world size, and keeps the
    # steps before the growth as they were
    later = grown.state_dict()
    assert later["grown"] == [[boundary, state["data"]]]
    expect = [next(grown) for _ in range(3)]
    for rank in (0, 1):
        half = make(new, batch=1, rank=rank, world_size=2)
        half.load_state_dict(later)
        assert all(torch.equal(_row(next(half), 0), _row(e, rank)) for e in expect)
    again = make(new, batch=1, rank=0, world_size=2)
    again.load_state_dict(later)
    assert np.array_equal(_starts(again, at), _starts(make(old), at))
    assert np.array_equal(_starts(again, boundary - 1), _starts(make(old), boundary - 1))


def test_random_batches_draw_over_the_grown_split_from_the_resumed_step(versions):
    old, new, _ = versions
    run = old.random_batches(4, 32, seed=5)
    for _ in range(7):
        next(run)
    state = run.state_dict()
    with pytest.raises(ArgumentError, match="grown='continue'"):
        new.random_batches(4, 32, seed=5).load_state_dict(state)
    grown = new.random_batches(4, 32, seed=5)
    grown.load_state_dict(state, grown="continue")
    after = np.concatenate([next(grown).offsets for _ in range(200)])
    assert after.max() > old.n_tokens  # the new documents are drawn
    fresh = new.random_batches(4, 32, seed=5)
    assert np.array_equal(grown.cpu_batch(9).offsets, fresh.cpu_batch(9).offsets)  # as a run on the grown split
    later = grown.state_dict()
    assert later["grown"] == [[7, state["data"]]]
    back = new.random_batches(2, 32, seed=5, rank=1, world_size=2)
    back.load_state_dict(later)
    for step in range(7):  # steps before the growth: the old run's batches, as trace lists them
        assert torch.equal(back.cpu_batch(step).x, old.random_batches(2, 32, seed=5, rank=1, world_size=2)
                           .cpu_batch(step).x)  # fmt: skip
    assert torch.equal(next(back).x, grown.cpu_batch(207).x[2:])


def test_a_second_growth_keeps_the_first(versions, tmp_path):
    """A state saved after one growth, loaded onto a split grown again: both growths recorded."""
    old, new, _ = versions
    third = tmp_path / "third"
    shutil.copytree(new.path, third)
    write(tmp_path / "d.jsonl", _texts(80, "third"))
    prepare(PrepareConfig(inputs=[str(tmp_path / "d.jsonl")], out=str(third), workers=1, val_fraction=0.0,
                          append=True, quiet=True))  # fmt: skip
    run = old.window_batches(2, 32, seed=1)
    for _ in range(5):
        next(run)
    once = new.window_batches(2, 32, seed=1)
    once.load_state_dict(run.state_dict(), grown="continue")
    for _ in range(run.steps_per_epoch):  # into the grown split's first epoch
        next(once)
    state = once.state_dict()
    twice = TokenDataset(third).window_batches(2, 32, seed=1)
    twice.load_state_dict(state, grown="continue")
    assert [g[0] for g in twice.state_dict()["grown"]] == [run.steps_per_epoch,
                                                           run.steps_per_epoch + once.steps_per_epoch]  # fmt: skip
    assert torch.equal(next(twice).x, next(once).x)
    assert torch.equal(twice.cpu_batch(2).x, old.window_batches(2, 32, seed=1).cpu_batch(2).x)


def test_a_changed_split_is_refused_even_when_asked(versions, tmp_path):
    old, _, other = versions
    state = other.window_batches(2, 32, seed=1).state_dict()
    with pytest.raises(ArgumentError, match="the data changed since"):
        old.window_batches(2, 32, seed=1).load_state_dict(state, grown="continue")
    with pytest.raises(ArgumentError, match="grown='maybe': pass grown='continue'"):
        old.window_batches(2, 32, seed=1).load_state_dict(state, grown="maybe")


@pytest.mark.parametrize("stride", [None, 32])
def test_a_mixture_continues_each_grown_source_on_its_own(versions, stride):
    """One source grew, the other did not: the rows of the other are the uninterrupted run's at
    every step; the grown one's rows are the old run's up to the resumed step (random) or to the
    end of that source's epoch (windows), and its next epoch covers every window of its grown split
    once."""
    old, new, other = versions
    kind = "random_batches" if stride is None else "window_batches"
    extra = {} if stride is None else {"stride": stride}

    def make(ds, batch=2, **kw):
        return getattr(Mixture({ds: 0.5, other: 0.5}), kind)(batch, 32, seed=3, **extra, **kw)

    run, state, grown = _continued(make, old, new, 150)
    mix_old, mix_new = Mixture({old: 0.5, other: 0.5}), Mixture({new: 0.5, other: 0.5})
    steps = 1200
    was = [mix_old.locate(run.cpu_batch(s).offsets) for s in range(steps)]
    now = [mix_new.locate(grown.cpu_batch(s).offsets) for s in range(steps)]
    source = np.concatenate([w[0] for w in was])
    assert np.array_equal(source, np.concatenate([n[0] for n in now]))
    before, after = np.concatenate([w[1] for w in was]), np.concatenate([n[1] for n in now])
    assert np.array_equal(before[source == 1], after[source == 1])  # the source that did not grow
    local = grown.offsets.tree.assign(np.arange(len(source)))[1]
    m0 = int(((source == 0) & (np.arange(len(source)) < 150 * 2)).sum())  # its rows before the resume
    if stride is None:
        boundary = m0
    else:
        n_old = (old.n_tokens - 33) // 32 + 1
        boundary = -(-m0 // n_old) * n_old
    grew = source == 0
    assert np.array_equal(before[grew & (local < boundary)], after[grew & (local < boundary)])
    assert not np.array_equal(before[grew & (local >= boundary)], after[grew & (local >= boundary)])
    assert after[grew].max() > old.n_tokens
    if stride is not None:
        n_new = (new.n_tokens - 33) // 32 + 1
        epoch = after[grew & (local >= boundary) & (local < boundary + n_new)]
        assert len(epoch) == n_new and np.array_equal(np.sort(epoch), np.arange(n_new) * 32)
    half = make(new, batch=1, rank=1, world_size=2)
    half.load_state_dict(grown.state_dict())
    assert torch.equal(next(half).x[0], next(grown).x[1])


def test_trace_of_a_step_before_the_growth_is_unchanged(versions):
    old, new, _ = versions
    run = old.window_batches(2, 32, seed=1)
    for _ in range(10):
        next(run)
    grown = new.window_batches(2, 32, seed=1)
    grown.load_state_dict(run.state_dict(), grown="continue")
    assert grown.trace(4) == old.window_batches(2, 32, seed=1).trace(4)


def test_a_packed_mixture_continues_a_grown_source_at_its_own_epoch(versions):
    old, new, other = versions

    def make(ds, batch=2, **kw):
        return Mixture({ds: 0.5, other: 0.5}).packed_batches(batch, 64, seed=2, **kw)

    run, _, grown = _continued(make, old, new, 40)
    n_old = len(old.packed(64, seed=2))
    m0 = grown.tree.counts(40 * 2)[0]
    boundary = -(-m0 // n_old) * n_old
    same = different = 0
    for step in range(40, 400):
        a, b = run.batch(step), grown.batch(step)
        local = grown.tree.assign(np.arange(step * 2, step * 2 + 2))[1]
        for r in range(2):
            rows_equal = torch.equal(a["input_ids"][r], b["input_ids"][r])
            if a["sources"][r] == 1 or local[r] < boundary:
                assert rows_equal
                same += 1
            else:
                different += not rows_equal
    assert same and different
    half = make(new, batch=1, rank=1, world_size=2)
    half.load_state_dict(grown.state_dict())
    assert torch.equal(next(half)["input_ids"][0], grown.batch(grown.step)["input_ids"][1])


def test_lmshard_trace_reads_a_state_saved_after_a_growth(versions):
    """`lmshard trace` rebuilds the stream from the state: a step before the growth is traced to
    the old run's documents, a step after it to the grown split's."""
    from lmshard.runtime.trace import stream_of_state

    old, new, _ = versions
    run = old.packed(64, seed=1).batches(2)
    for _ in range(3):
        next(run)
    grown = new.packed(64, seed=1).batches(2)
    grown.load_state_dict(run.state_dict(), grown="continue")
    for _ in range(run.steps_per_epoch):
        next(grown)
    rebuilt = stream_of_state(new, grown.state_dict())
    assert rebuilt.trace(1) == old.packed(64, seed=1).batches(2).trace(1)
    assert rebuilt.trace(grown.step) == grown.trace(grown.step)


def test_a_state_saved_after_a_growth_is_refused_on_the_data_before_it(versions):
    old, new, _ = versions
    for make in (lambda ds: ds.window_batches(2, 32, seed=1), lambda ds: ds.packed(64, seed=1).batches(2),
                 lambda ds: Mixture({ds: 0.5, versions[2]: 0.5}).random_batches(2, 32, seed=1)):  # fmt: skip
        run = make(old)
        for _ in range(3):
            next(run)
        grown = make(new)
        grown.load_state_dict(run.state_dict(), grown="continue")
        with pytest.raises(ArgumentError, match=r"went on from split train of 7,650 tokens .* onto more data"):
            make(old).load_state_dict(grown.state_dict(), grown="continue")


def test_a_refused_load_leaves_the_stream_as_it_was(versions):
    """Neither the state's skip ranges nor its growth stay on a stream that refused the state."""
    old, new, _ = versions
    run = old.window_batches(2, 32, seed=1).skip(10, 20)
    for _ in range(5):
        next(run)
    fresh = new.window_batches(2, 32, seed=1)
    want = fresh.cpu_batch(12).x
    with pytest.raises(ArgumentError, match="grown='continue'"):
        fresh.load_state_dict(run.state_dict())
    other = new.window_batches(2, 32, seed=1, shift=2)
    with pytest.raises(ArgumentError, match="saved shift=1"):
        other.load_state_dict(run.state_dict(), grown="continue")
    assert "skips" not in fresh.state_dict() and "grown" not in other.state_dict()
    assert torch.equal(fresh.cpu_batch(12).x, want) and fresh.step == 0
    packed = new.packed(64, seed=2).batches(2)
    with pytest.raises(ArgumentError, match="saved seed=1"):
        packed.load_state_dict(STREAMS["packed"](old).state_dict(), grown="continue")
    assert "grown" not in packed.state_dict()


def test_streams_that_cannot_continue_say_so_and_in_memory_data_too(versions):
    old, new, _ = versions
    for make in (lambda ds: ds.packed(64, strategy="stream").batches(2), lambda ds: ds.windows(32).batch_sampler(2)):
        with pytest.raises(ArgumentError, match="do not continue on a grown split"):
            make(new).load_state_dict(make(old).state_dict(), grown="continue")
    small, big = TokenDataset.synthetic(4096, doc_len=64), TokenDataset.synthetic(8192, doc_len=64)
    with pytest.raises(ArgumentError, match="in-memory dataset .*start from step 0"):
        big.window_batches(2, 32).load_state_dict(small.window_batches(2, 32).state_dict(), grown="continue")


def test_trace_of_a_state_saved_before_the_growth_reads_the_grown_dataset(versions):
    """`lmshard trace` of a checkpoint from before an --append: past steps are the old run's."""
    from lmshard.runtime.trace import stream_of_state

    old, new, _ = versions
    run = old.window_batches(2, 32, seed=1)
    for _ in range(6):
        next(run)
    assert stream_of_state(new, run.state_dict()).trace(3) == old.window_batches(2, 32, seed=1).trace(3)


def test_trace_rebuilds_a_packed_state_made_with_multiple(versions):
    """A packed stream planned with `multiple=` records it, so `lmshard trace` rebuilds its plan."""
    from lmshard.runtime.trace import stream_of_state

    _, new, _ = versions
    run = new.packed(64, seed=1, multiple=4).batches(2)
    for _ in range(3):
        next(run)
    state = run.state_dict()
    assert state["multiple"] == 4
    assert stream_of_state(new, state).trace(1) == new.packed(64, seed=1, multiple=4).batches(2).trace(1)
