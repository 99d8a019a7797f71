"""strategy="stream": constant-memory packing of a prepared split. Checked against the document
index read with numpy, against the windows `inspect --packing` simulates, and against the
uninterrupted run for resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_prepare import jsonl, make_texts

from lmshard import TokenDataset
from lmshard.errors import ArgumentError
from lmshard.packing import stream as streampack
from lmshard.prepare import PrepareConfig, prepare


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sp")
    texts = make_texts(3000, seed=11)
    prepare(PrepareConfig(inputs=[str(jsonl(tmp / "a.jsonl", texts))], out=str(tmp / "ds"), workers=1,
                          val_fraction=0, tokens_per_shard=20_000))  # fmt: skip
    return TokenDataset(tmp / "ds")


def _items_of_epoch(packs, rank: int, world: int) -> list[tuple[int, int]]:
    """(start, length) of every item the rank's windows of epoch 0 pack."""
    order = packs.layout.order(packs.seed, 0, packs.shuffle)
    out, w = [], 0
    while (found := packs.window(0, rank, world, w, order)) is not None:
        plan, starts = found
        out += list(zip(starts.tolist(), plan.length.tolist(), strict=True))
        w += 1
    return out


def test_an_epoch_packs_every_document_of_the_split_once_across_ranks(ds):
    packs = ds.packed(64, strategy="stream", buffer=700, overlong="split")
    assert packs.layout.n_blocks > 3 and len(ds.store.shards) > 1  # blocks from several shards
    items = sorted(it for r in range(3) for it in _items_of_epoch(packs, r, 3))
    index = ds.store.doc_lengths()
    starts = np.concatenate([[0], np.cumsum(index)[:-1]])
    want = sorted((int(s) + j * 64, int(min(64, n - j * 64))) for s, n in zip(starts, index, strict=True)
                  for j in range(-(-int(n) // 64)))  # fmt: skip
    assert items == want  # the split's documents, overlong ones cut in 64-token pieces, each once


def test_it_never_plans_the_whole_split(ds, monkeypatch):
    """No per-document array of the split: the store's whole-split lengths are never asked for."""
    monkeypatch.setattr(type(ds.store), "doc_lengths", lambda self: pytest.fail("planned the whole split"))
    b = ds.packed(128, strategy="stream", buffer=500).batches(4)
    for _ in range(30):
        batch = next(b)
        assert batch["input_ids"].shape == (4, 128)


def test_rows_hold_the_split_tokens_of_their_items(ds):
    packs = ds.packed(96, strategy="stream", buffer=300, seed=3)
    plan, starts = packs.window(0, 0, 1, 0, packs.layout.order(3, 0))
    order = streampack.pack_order(plan.n_packs, 3, 0, 0, 0, True)
    batch = next(packs.batches(2))
    for r in range(2):
        a, z = int(plan.ptr[order[r]]), int(plan.ptr[order[r] + 1])
        want = np.concatenate([ds.tokens(int(s), int(n)) for s, n in zip(starts[a:z], plan.length[a:z], strict=True)])
        row = batch["input_ids"][r].numpy()
        assert np.array_equal(row[: len(want)], want) and (row[len(want) :] == ds.eot_id).all()
        assert (batch["position_ids"][r].numpy()[: len(want)] < 96).all()


def test_resume_is_exact_and_the_stream_has_no_end(ds):
    packs = ds.packed(128, strategy="stream", buffer=400, seed=9)
    whole = packs.batches(8, rank=1, world_size=2)
    served = [next(whole) for _ in range(200)]  # well past the rank's first epoch
    assert whole.epoch >= 1
    first = packs.batches(8, rank=1, world_size=2)
    for _ in range(57):
        next(first)
    state = json.loads(json.dumps(first.state_dict(in_hand=3)))
    again = packs.batches(8, rank=1, world_size=2)
    again.load_state_dict(state)
    for k in range(54, 200):
        assert np.array_equal(next(again)["input_ids"].numpy(), served[k]["input_ids"].numpy()), k
    with pytest.raises(ArgumentError, match="saved with world_size=2 and this stream has world_size=3"):
        packs.batches(8, rank=1, world_size=3).load_state_dict(state)


def test_inspect_reports_the_fill_the_loader_serves(ds, tmp_path):
    packs = ds.packed(256, strategy="stream", buffer=1000, seed=0)
    counts = [len(ds.store.index(k)) - 1 for k in range(len(ds.store.shards))]
    m = streampack.metrics(ds.store.doc_lengths(), counts, 256, 1000, seed=0)
    served = sum(plan.n_packs for plan, _ in (packs.window(0, 0, 1, w, packs.layout.order(0, 0))
                                             for w in range(-(-packs.layout.n_blocks // 1)))
                 if plan is not None)  # fmt: skip
    assert m["packs"] == served and m["tokens"] == ds.n_tokens
    bfd = ds.packed(256, strategy="bfd").metrics
    assert bfd["fill"] - 0.02 <= m["fill"] <= bfd["fill"]


def test_inspect_packing_prints_stream_packing_beside_bfd(ds):
    from typer.testing import CliRunner

    from lmshard.cli import app

    result = CliRunner().invoke(app, ["inspect", str(ds.path), "--packing", "256", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["strategy"]: r for r in json.loads(result.output)["strategies"]}
    counts = [len(ds.store.index(k)) - 1 for k in range(len(ds.store.shards))]
    assert rows["stream_10000"] == streampack.metrics(ds.store.doc_lengths(), counts, 256, 10_000)
    assert {"bfd", "greedy", "stream_10000"} <= set(rows)
    result = CliRunner().invoke(app, ["inspect", str(ds.path), "--packing", "256", "--strategy", "stream_500"])
    assert result.exit_code == 0 and "stream_500" in result.output
