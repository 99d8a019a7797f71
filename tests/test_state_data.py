"""A loader state knows the data it was saved on: every stream's `state_dict()` records the
split's `data_id` (a digest of its shard checksums, its split and tokens), and a state loaded onto
other data is refused in one line saying what changed: grown by N tokens (an --append), or
changed. The same data loads as before, and a state saved before states recorded it loads too."""

from __future__ import annotations

import json

import pytest
from conftest import write

from lmshard import TokenDataset
from lmshard.errors import ArgumentError
from lmshard.prepare import PrepareConfig, prepare


def _texts(n: int, salt: str) -> str:
    return "".join(json.dumps({"text": f"{salt} document {i}: " + "word " * (i % 30 + 5)}) + "\n" for i in range(n))


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """(a dataset's state-taking streams before, the same dataset after an --append, another)."""
    tmp = tmp_path_factory.mktemp("statedata")
    write(tmp / "a.jsonl", _texts(300, "first"))
    write(tmp / "b.jsonl", _texts(100, "second"))
    prepare(PrepareConfig(inputs=[str(tmp / "a.jsonl")], out=str(tmp / "ds"), workers=1, val_fraction=0.0,
                          quiet=True))  # fmt: skip
    before = TokenDataset(tmp / "ds")
    streams = _streams(before)
    for s in streams.values():
        for _ in range(3):
            next(iter(s)) if not hasattr(s, "__next__") else next(s)
    states = {k: s.state_dict() for k, s in streams.items()}
    prepare(PrepareConfig(inputs=[str(tmp / "b.jsonl")], out=str(tmp / "ds"), workers=1, val_fraction=0.0,
                          append=True, quiet=True))  # fmt: skip
    return states, before.n_tokens, tmp / "ds"


def _streams(ds: TokenDataset) -> dict:
    return {"random": ds.random_batches(2, 32, seed=1), "windows": ds.window_batches(2, 32, seed=1),
            "packed": ds.packed(64, strategy="bfd").batches(2), "padded": ds.padded_batches(2, 64, seed=1),
            "stream_packed": ds.packed(64, strategy="stream").batches(2),
            "sampler": ds.windows(32).batch_sampler(2, seed=1)}  # fmt: skip


@pytest.mark.parametrize("kind", ["random", "windows", "packed", "padded", "stream_packed", "sampler"])
def test_a_state_loaded_onto_a_grown_dataset_is_refused_naming_the_growth(grown, kind):
    states, n_before, root = grown
    after = TokenDataset(root)
    grew = after.n_tokens - n_before
    assert grew > 0 and states[kind]["data"].endswith(f":train:{n_before}")
    with pytest.raises(Exception, match=rf"cannot resume: the state was saved on split train of {n_before:,} tokens "
                                        rf".*the split has grown by {grew:,} tokens since \(an --append\??\)"):
        _streams(after)[kind].load_state_dict(states[kind])


def test_the_same_data_loads_and_an_old_state_without_data_loads_too(tmp_path):
    write(tmp_path / "a.jsonl", _texts(200, "x"))
    prepare(PrepareConfig(inputs=[str(tmp_path / "a.jsonl")], out=str(tmp_path / "ds"), workers=1, val_fraction=0.0,
                          quiet=True))  # fmt: skip
    a, b = TokenDataset(tmp_path / "ds").random_batches(2, 16, seed=3), None
    first = [next(a).x for _ in range(4)]
    state = a.state_dict()
    after = [next(a).x for _ in range(2)]
    b = TokenDataset(tmp_path / "ds").random_batches(2, 16, seed=3)
    b.load_state_dict(state)
    assert all((next(b).x == x).all() for x in after) and len(first) == 4
    old = {k: v for k, v in state.items() if k != "data"}  # saved before states recorded their data
    c = TokenDataset(tmp_path / "ds").random_batches(2, 16, seed=3)
    c.load_state_dict(old)
    assert (next(c).x == after[0]).all()


def test_another_dataset_of_the_same_size_is_named_as_changed(tmp_path):
    """Two datasets with as many tokens, in another order: 'the data changed since'."""
    lines = _texts(120, "x").splitlines(keepends=True)
    for name, order in (("one", lines), ("two", lines[::-1])):
        write(tmp_path / f"{name}.jsonl", "".join(order))
        prepare(PrepareConfig(inputs=[str(tmp_path / f"{name}.jsonl")], out=str(tmp_path / name), workers=1,
                              val_fraction=0.0, quiet=True))  # fmt: skip
    one, two = TokenDataset(tmp_path / "one"), TokenDataset(tmp_path / "two")
    assert one.n_tokens == two.n_tokens
    state = one.window_batches(2, 16).state_dict()
    with pytest.raises(ArgumentError, match="the data changed since .*resume on that dataset, or start this one"):
        two.window_batches(2, 16).load_state_dict(state)


def test_a_state_on_the_same_tokens_in_another_encoding_names_the_conversion(tmp_path):
    """A state saved on a dataset, loaded on its `lmshard convert` copy (the same tokens, other
    shard bytes): refused, naming the encoding and the way back, which resumes."""
    from lmshard.interop.convert import convert_dataset

    write(tmp_path / "a.jsonl", _texts(120, "x"))
    prepare(PrepareConfig(inputs=[str(tmp_path / "a.jsonl")], out=str(tmp_path / "ds"), workers=1,
                          val_fraction=0.0, quiet=True))  # fmt: skip
    convert_dataset(tmp_path / "ds", "uint16", tmp_path / "u16")
    convert_dataset(tmp_path / "u16", "uint32", tmp_path / "back")
    stream = TokenDataset(tmp_path / "ds").random_batches(2, 16, seed=1)
    next(stream)
    state = stream.state_dict()
    with pytest.raises(ArgumentError, match="the same tokens in another shard encoding: `lmshard convert` it back"):
        TokenDataset(tmp_path / "u16").random_batches(2, 16, seed=1).load_state_dict(state)
    TokenDataset(tmp_path / "back").random_batches(2, 16, seed=1).load_state_dict(state)


def test_a_packed_state_records_its_shuffle(grown):
    """A packed stream's state records shuffle: a state of an unshuffled stream is refused by a
    shuffled one (their packs come in other orders); a state saved before it was recorded loads."""
    _, _, root = grown
    ds = TokenDataset(root)
    plain = ds.packed(64, shuffle=False).batches(2)
    state = plain.state_dict()
    assert state["shuffle"] is False
    with pytest.raises(ArgumentError, match="saved shuffle=False, this stream has shuffle=True"):
        ds.packed(64).batches(2).load_state_dict(state)
    ds.packed(64).batches(2).load_state_dict({k: v for k, v in state.items() if k != "shuffle"})
