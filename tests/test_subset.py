"""Load-time splits (`TokenDataset(..., val_fraction=)`): the two sides are checked against the
prepared split read with numpy: each side's token stream is its documents, whole and in split
order, the sides share no document and together are the split, and an --append keeps every old
document on its side."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from test_prepare import jsonl, make_texts

from lmshard.errors import ArgumentError
from lmshard.prepare import PrepareConfig, prepare
from lmshard.runtime import TokenDataset

COMMON = {"workers": 1, "tokens_per_shard": 3000, "val_fraction": 0}


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("subset")
    prepare(PrepareConfig(inputs=[str(jsonl(tmp / "a.jsonl", make_texts(800, seed=3)))], out=str(tmp / "ds"),
                          **COMMON))  # fmt: skip
    return tmp / "ds"


def _documents(root) -> list[np.ndarray]:
    """The prepared train split's documents, read with numpy from the shard and index files."""
    meta = json.loads((root / "dataset_metadata.json").read_text())
    docs = []
    for shard in meta["splits"]["train"]["shards"]:
        tokens = np.fromfile(root / shard["path"], dtype="<u4")
        index = np.fromfile(root / shard["index_path"], dtype="<u8")
        docs += [tokens[a:b] for a, b in zip(index[:-1], index[1:], strict=True)]
    return docs


def _side(data: TokenDataset) -> np.ndarray:
    return data.tokens(0, data.n_tokens)


def _which(docs: list[np.ndarray], stream: np.ndarray) -> list[int]:
    """The documents (in order) whose concatenation `stream` is: matched greedily by their tokens."""
    found, at = [], 0
    for d, doc in enumerate(docs):
        if at + len(doc) <= len(stream) and np.array_equal(stream[at : at + len(doc)], doc):
            found.append(d)
            at += len(doc)
    assert at == len(stream), "the side's stream is not whole documents of the split in order"
    return found


def test_the_sides_are_disjoint_whole_documents_and_together_the_split(ds):
    docs = _documents(ds)
    train = TokenDataset(ds, val_fraction=0.1, split_seed=4)
    val = TokenDataset(ds, "val", val_fraction=0.1, split_seed=4)
    held, kept = _which(docs, _side(val)), _which(docs, _side(train))
    assert sorted(held + kept) == list(range(len(docs))) and not set(held) & set(kept)
    assert 40 <= len(held) <= 120  # about 10% of 800, seeded
    assert val.n_docs == len(held) and train.n_tokens + val.n_tokens == sum(len(d) for d in docs)
    assert held != _which(docs, _side(TokenDataset(ds, "val", val_fraction=0.1, split_seed=5)))  # the seed decides
    # batches of every shape come from the side's own stream
    stream = _side(val)
    for batch in (next(val.random_batches(4, 24, seed=1)), next(val.window_batches(3, 24, seed=1))):
        for row, o in zip(batch.x, batch.offsets.tolist(), strict=True):
            assert row.tolist() == stream[o : o + 24].tolist()
    packed = next(val.packed(64, seed=0).batches(2))
    assert torch.isin(packed["input_ids"][packed["labels"] != -100], torch.from_numpy(stream.astype(np.int64))).all()


def test_a_side_is_the_same_in_another_process(ds):
    code = ("import sys; from lmshard.runtime import TokenDataset; d = TokenDataset(sys.argv[1], 'val', "
            "val_fraction=0.1, split_seed=4); b = next(d.random_batches(4, 16, seed=2)); "
            "print(d.data_id, b.offsets.tolist())")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, str(ds)], capture_output=True, text=True, check=True).stdout
    here = TokenDataset(ds, "val", val_fraction=0.1, split_seed=4)
    assert out.split()[0] == here.data_id
    assert out.strip().endswith(str(next(here.random_batches(4, 16, seed=2)).offsets.tolist()))


def test_an_append_keeps_every_old_document_on_its_side(tmp_path):
    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "a.jsonl", make_texts(300, seed=1)))], out=str(tmp_path / "d"),
                          **COMMON))  # fmt: skip
    before = {side: _side(TokenDataset(tmp_path / "d", side, val_fraction=0.2)) for side in ("train", "val")}
    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "b.jsonl", make_texts(200, seed=9)))], out=str(tmp_path / "d"),
                          append=True, **COMMON))  # fmt: skip
    after = {side: _side(TokenDataset(tmp_path / "d", side, val_fraction=0.2)) for side in ("train", "val")}
    for side in ("train", "val"):  # old shards first and unchanged: each side's old stream is a prefix of the new
        assert len(after[side]) > len(before[side])
        assert np.array_equal(after[side][: len(before[side])], before[side])


def test_a_state_and_a_trace_know_the_side(ds):
    val = TokenDataset(ds, "val", val_fraction=0.1)
    stream = val.random_batches(2, 16, seed=3)
    batch = next(stream)
    with pytest.raises(ArgumentError, match="cannot resume"):
        TokenDataset(ds).random_batches(2, 16, seed=3).load_state_dict(stream.state_dict())
    docs, read = _documents(ds), val.tokens(int(batch.offsets[0]), 17)  # the row's x and its last label
    pieces = stream.trace(0)[0]
    assert sum(p.end - p.start for p in pieces) == 17
    for p in pieces:  # each piece names its document of the prepared split, and where it is in the row
        assert np.array_equal(docs[p.doc][p.start : p.end], read[p.at : p.at + p.end - p.start])


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"val_fraction": 0}, "between 0 and 1"),
    ({"val_fraction": 1.5}, "between 0 and 1"),
    ({"val_fraction": True}, "between 0 and 1"),
    ({"val_fraction": 1e-9}, "leaves the val side"),
])  # fmt: skip
def test_load_time_split_mistakes_are_one_line(ds, kwargs, words):
    with pytest.raises(ArgumentError) as caught:
        TokenDataset(ds, "val", **kwargs)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_dataset_with_a_val_split_is_refused(tmp_path):
    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "a.jsonl", make_texts(200, seed=1)))], out=str(tmp_path / "d"),
                          workers=1, val_fraction=0.1))  # fmt: skip
    with pytest.raises(ArgumentError, match="has a val split already"):
        TokenDataset(tmp_path / "d", val_fraction=0.05)


def test_a_loader_file_names_a_load_time_split(ds, tmp_path):
    import lmshard

    conf = tmp_path / "loader.toml"
    conf.write_text(f'seed = 2\ndataset = "{ds}"\nsplit = "val"\nval_fraction = 0.1\nsplit_seed = 4\n'
                    "[sample]\nbatch_size = 2\nseq_len = 16\n")  # fmt: skip
    got = lmshard.load_config(conf)
    truth = TokenDataset(ds, "val", val_fraction=0.1, split_seed=4).random_batches(2, 16, seed=2)
    assert got.state_dict() == truth.state_dict() and torch.equal(next(got).x, next(truth).x)


def test_a_run_on_a_load_time_split_does_not_continue_on_a_grown_dataset(tmp_path):
    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "a.jsonl", make_texts(300, seed=1)))], out=str(tmp_path / "d"),
                          **COMMON))  # fmt: skip
    run = TokenDataset(tmp_path / "d", "val", val_fraction=0.2).random_batches(2, 16, seed=1)
    next(run)
    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "b.jsonl", make_texts(100, seed=9)))], out=str(tmp_path / "d"),
                          append=True, **COMMON))  # fmt: skip
    for grown in (None, "continue"):
        with pytest.raises(ArgumentError, match="continues only on the data it was saved on") as caught:
            TokenDataset(tmp_path / "d", "val", val_fraction=0.2).random_batches(2, 16, seed=1).load_state_dict(
                run.state_dict(), grown=grown)
        assert "\n" not in str(caught.value)
