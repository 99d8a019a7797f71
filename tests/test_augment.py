"""Augmentation hooks (`stream.augment(fn)`, runtime/augment.py): every batch goes through the
hook with its step, rank and a generator seeded from (seed, step, rank), so the transformed batches
are the same for any DataLoader worker count and on a resumed run; the state records the hook, and
a stream with another hook (or none) refuses it."""

from __future__ import annotations

import json
from itertools import islice

import pytest
import torch
from conftest import write

import lmshard
from lmshard import TokenDataset, load_config
from lmshard.errors import ArgumentError, InputError
from lmshard.prepare import PrepareConfig, prepare

SEEN: list[tuple[int, int]] = []


def mask_some(batch, *, step, rank, generator):
    """Zero about a tenth of x, drawn from the generator; note (step, rank)."""
    SEEN.append((step, rank))
    x = batch.x if hasattr(batch, "x") else batch["input_ids"]
    x[torch.rand(x.shape, generator=generator) < 0.1] = 0
    return batch


def other(batch, *, step, rank, generator):
    return batch


def forgets(batch, *, step, rank, generator):
    return None


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("augment")
    texts = [f"document {i}: " + "word " * (i % 40 + 3) for i in range(400)]
    write(tmp / "in.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    prepare(PrepareConfig(inputs=[str(tmp / "in.jsonl")], out=str(tmp / "ds"), workers=1, val_fraction=0.0,
                          quiet=True))  # fmt: skip
    return TokenDataset(tmp / "ds")


def _x(batch) -> torch.Tensor:
    return batch.x if hasattr(batch, "x") else batch["input_ids"]


STREAMS = {
    "windows": lambda ds, **kw: ds.window_batches(4, 32, seed=1, **kw),
    "random": lambda ds, **kw: ds.random_batches(4, 32, seed=1, **kw),
    "packed": lambda ds, **kw: ds.packed(64, seed=1).batches(4, **kw),
    "padded": lambda ds, **kw: ds.padded_batches(4, 64, seed=1, **kw),
}


@pytest.mark.parametrize("kind", sorted(STREAMS))
def test_a_hook_transforms_each_batch_as_a_function_of_step_and_rank(ds, kind):
    make = STREAMS[kind]
    plain = [_x(b).clone() for b in islice(make(ds), 6)]
    SEEN.clear()
    hooked = make(ds).augment(mask_some)
    got = [_x(b).clone() for b in islice(hooked, 6)]
    assert [(s, 0) for s in range(6)] == SEEN
    for p, g in zip(plain, got, strict=True):  # zeros where the hook drew them, the batch elsewhere
        assert torch.equal(g[g != 0], p[g != 0]) and 0 < int((g == 0).sum()) < g.numel() // 4
    # the same transformed batches from DataLoader workers, and from a resumed stream
    loader = torch.utils.data.DataLoader(make(ds).augment(mask_some), batch_size=None, num_workers=2)
    workers = [_x(b).clone() for b in islice(loader, 6)]
    assert all(torch.equal(a, b) for a, b in zip(got, workers, strict=True))
    first = make(ds).augment(mask_some)
    for _ in range(3):
        next(first)
    again = make(ds).augment(mask_some)
    again.load_state_dict(first.state_dict())
    assert all(torch.equal(_x(next(again)), g) for g in got[3:])
    assert first.state_dict()["augment"] == "test_augment.mask_some"


def test_a_state_is_refused_by_a_stream_with_another_hook_or_none(ds):
    state = ds.window_batches(4, 32, seed=1).augment(mask_some).state_dict()
    with pytest.raises(ArgumentError, match=r"saved with augment='test_augment.mask_some', and this stream has "
                                            r"augment=None; pass the same hook"):  # fmt: skip
        ds.window_batches(4, 32, seed=1).load_state_dict(state)
    with pytest.raises(ArgumentError, match="augment='test_augment.other'"):
        ds.window_batches(4, 32, seed=1).augment(other).load_state_dict(state)
    with pytest.raises(ArgumentError, match="augment=None, and this stream has augment='test_augment.mask_some'"):
        ds.packed(64, seed=1).batches(4).augment(mask_some).load_state_dict(ds.packed(64, seed=1).batches(4)
                                                                            .state_dict())  # fmt: skip


def test_hook_mistakes_are_one_line(ds):
    with pytest.raises(ArgumentError, match="augment=3 is not callable"):
        ds.window_batches(4, 32).augment(3)
    with pytest.raises(ArgumentError, match=r"the augment hook test_augment.forgets returned None at step 0"):
        next(ds.window_batches(4, 32).augment(forgets))


def test_a_text_stream_takes_a_hook_too(ds, tmp_path):
    write(tmp_path / "in.jsonl", "".join(json.dumps({"text": f"text {i} " + "w " * i}) + "\n" for i in range(80)))
    stream = lmshard.stream(str(tmp_path / "in.jsonl"))
    plain = [b.x.clone() for b in islice(stream.windows(2, 16), 4)]
    batches = stream.windows(2, 16).augment(mask_some)
    got = [b.x.clone() for b in islice(batches, 4)]
    assert all(torch.equal(g[g != 0], p[g != 0]) for p, g in zip(plain, got, strict=True))
    assert any((g == 0).any() for g in got)
    with pytest.raises(ArgumentError, match="augment"):
        stream.windows(2, 16).load_state_dict(batches.state_dict())


def test_a_loader_file_names_its_hook(ds, tmp_path):
    hooks = write(tmp_path / "hooks.py", "def flip(batch, *, step, rank, generator):\n    batch.x[:, 0] = step\n"
                                         "    return batch\n")  # fmt: skip
    config = tmp_path / "loader.toml"
    config.write_text(f'dataset = "{ds.path}"\naugment = "{hooks}:flip"\n[sample]\nshape = "windows"\n'
                      "batch_size = 2\nseq_len = 16\n")  # fmt: skip
    stream = load_config(config)
    assert [int(next(stream).x[0, 0]) for _ in range(3)] == [0, 1, 2]
    assert stream.state_dict()["augment"].endswith("hooks.flip")
    config.write_text(f'dataset = "{ds.path}"\naugment = "{hooks}:nothing"\n[sample]\nbatch_size = 2\nseq_len = 16\n')
    with pytest.raises(InputError, match=r"loader.toml: augment = '.*hooks.py:nothing': .* has no function 'nothing'"):
        load_config(config)


def test_trace_reads_the_state_of_a_hooked_run(ds):
    """A hook changes tokens, not which documents a step drew: `lmshard trace` reads its state."""
    from lmshard.runtime.trace import stream_of_state

    run = ds.window_batches(4, 32, seed=1).augment(mask_some)
    for _ in range(3):
        next(run)
    assert stream_of_state(ds, run.state_dict()).trace(1) == ds.window_batches(4, 32, seed=1).trace(1)


def test_a_hook_named_by_its_file_travels_to_workers_as_its_name(ds, tmp_path):
    """A function loaded from a .py path cannot be pickled by reference (a spawned DataLoader
    worker could not import it): the stream pickles its name and imports it again; a loader
    file's relative path is read beside the file."""
    import pickle

    write(tmp_path / "conf" / "hooks.py", "def flip(batch, *, step, rank, generator):\n    batch.x[:, 0] = step + 1\n"
                                          "    return batch\n")  # fmt: skip
    stream = ds.window_batches(2, 16, seed=1).augment(f"{tmp_path / 'conf' / 'hooks.py'}:flip")
    again = pickle.loads(pickle.dumps(stream))
    assert [int(next(again).x[0, 0]) for _ in range(2)] == [1, 2]
    (tmp_path / "conf" / "loader.toml").write_text(f'dataset = "{ds.path}"\naugment = "hooks.py:flip"\n[sample]\n'
                                                   'shape = "windows"\nbatch_size = 2\nseq_len = 16\n')  # fmt: skip
    assert int(next(load_config(tmp_path / "conf" / "loader.toml")).x[0, 0]) == 1


def test_a_partial_is_named_with_its_arguments():
    import functools

    from lmshard.runtime.augment import name_of

    assert name_of(functools.partial(other, rank=1)) == "test_augment.other(rank=1)"
    assert name_of(functools.partial(other, rank=1)) != name_of(functools.partial(other, rank=2))
