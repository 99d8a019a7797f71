"""`stream.trace(step)`: the documents of a batch's rows in closed form, checked against the
batch itself: each row's traced pieces, read as documents straight from the shard files with
numpy, are exactly the tokens the loader returned for that row, for random, window, packed,
padded and mixture streams, at several steps and ranks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import read_docs, write

from lmshard import Mixture, TokenDataset
from lmshard.errors import ArgumentError
from lmshard.prepare import PrepareConfig, prepare


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace")
    made = []
    for name, n in (("a", 400), ("b", 150)):
        texts = [f"{name} document {i}: " + " ".join(["river", "stone", "light", "north"][i % 4] * (i % 9 + 1)
                                                      for _ in range(i % 40 + 2)) for i in range(n)]  # fmt: skip
        write(tmp / f"{name}.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
        prepare(PrepareConfig(inputs=[str(tmp / f"{name}.jsonl")], out=str(tmp / name), workers=1, val_fraction=0.0,
                              tokens_per_shard=2000, quiet=True))  # fmt: skip
        made.append(tmp / name)
    return made


def _tokens(docs: list[np.ndarray], row: list) -> list[int]:
    """The row's traced pieces as tokens, each read from the shard files (numpy, no lmshard)."""
    for p in row:
        assert p.length == len(docs[p.doc]) and 0 <= p.start < p.end <= p.length
    return [t for p in row for t in docs[p.doc][p.start : p.end].tolist()]


@pytest.mark.parametrize("kind", ["random", "windows", "random_shift2"])
def test_random_and_window_rows_are_their_traced_documents(roots, kind):
    docs = read_docs(roots[0], "train")
    ds = TokenDataset(roots[0])
    for rank in (0, 1):
        shift = 2 if kind == "random_shift2" else 1
        make = ds.window_batches if kind == "windows" else ds.random_batches
        stream = make(3, 40, seed=4, shift=shift, rank=rank, world_size=2)
        for step in range(5):
            batch = next(stream)
            traced = stream.trace()  # the batch just handed out
            assert traced == stream.trace(step)
            for r in range(3):
                read = batch.x[r].tolist() + batch.y[r][-shift:].tolist()  # the row's seq_len + shift tokens
                assert _tokens(docs, traced[r]) == read, (rank, step, r)
                assert traced[r][0].at == 0 and sum(p.end - p.start for p in traced[r]) == 40 + shift
    assert len({p.shard for row in traced for p in row} | {s.path for s in ds.meta.shards}) == len(ds.meta.shards)


def test_packed_and_padded_rows_are_their_traced_documents(roots):
    docs = read_docs(roots[0], "train")
    ds = TokenDataset(roots[0])
    packed = ds.packed(64, strategy="bfd").batches(3, rank=1, world_size=2)
    padded = ds.padded_batches(3, 48, seed=2, rank=1, world_size=2)
    for stream in (packed, padded):
        for step in range(4):
            batch = next(stream)
            for r, row in enumerate(stream.trace(step)):
                n = sum(p.end - p.start for p in row)
                assert batch.x[r][:n].tolist() == _tokens(docs, row), (step, r)
    whole = [p for row in packed.trace(0) for p in row]
    assert all(p.start == 0 and p.end == p.length for p in whole if p.length <= 64)  # whole, but the overlong


def test_mixture_rows_name_their_source(roots):
    a, b = TokenDataset(roots[0]), TokenDataset(roots[1])
    docs = [read_docs(roots[0], "train"), read_docs(roots[1], "train")]
    mix = Mixture([(a, 0.5), (b, 0.5)])
    stream = mix.random_batches(4, 32, seed=1)
    seen = set()
    for _ in range(4):
        batch = next(stream)
        for r, row in enumerate(stream.trace()):
            source = {p.source for p in row}
            assert len(source) == 1  # a row never crosses a source
            seen |= source
            read = batch.x[r].tolist() + batch.y[r][-1:].tolist()
            assert _tokens(docs[source.pop()], row) == read
    assert seen == {0, 1}


def test_trace_before_any_batch_names_the_step():
    ds = TokenDataset.synthetic(n_tokens=5000, vocab_size=100, seed=1)
    stream = ds.random_batches(2, 16)
    with pytest.raises(ArgumentError, match="no batch handed out yet; pass the step"):
        stream.trace()
    assert [p.doc for p in stream.trace(3)[0]] == [p.doc for p in stream.trace(3)[0]]


def test_lmshard_trace_reads_a_runs_state_from_a_checkpoint(roots, tmp_path):
    """`lmshard trace DATASET --state ckpt.pt --key data --steps 2:4 --json`: each step's rows,
    rank by rank, are the pieces each rank's own stream traces (the global batch rebuilt from the
    state, no replay); `--text` adds each piece's text; a wrong --key is one line."""
    import torch
    from typer.testing import CliRunner

    from lmshard.cli import app

    ds = TokenDataset(roots[0])
    ranks = [ds.window_batches(2, 24, seed=5, rank=r, world_size=2) for r in range(2)]
    for _ in range(5):
        next(ranks[0])
    torch.save({"model": {}, "data": ranks[0].state_dict()}, tmp_path / "ckpt.pt")
    runner = CliRunner()
    result = runner.invoke(app, ["trace", str(roots[0]), "--state", str(tmp_path / "ckpt.pt"), "--key", "data",
                                 "--steps", "2:4", "--json", "--text"])  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [line["step"] for line in lines] == [2, 3]
    for line in lines:
        want = [(r, i, p.to_json()) for r in range(2) for i, row in enumerate(ranks[r].trace(line["step"]))
                for p in row]  # fmt: skip
        got = [(row["rank"], row["row"], {k: v for k, v in p.items() if k != "text"}) for row in line["rows"]
               for p in row["pieces"]]  # fmt: skip
        assert got == want
        piece = line["rows"][0]["pieces"][0]
        assert piece["text"] == ds.decode(ds.tokens(piece["offset"], piece["end"] - piece["start"]))[:160]
    plain = runner.invoke(app, ["trace", str(roots[0]), "--state", str(tmp_path / "ckpt.pt"), "--key", "data"])
    assert plain.exit_code == 0 and plain.output.startswith("step 5\n  rank 0 row 0: doc "), plain.output
    wrong = runner.invoke(app, ["trace", str(roots[0]), "--state", str(tmp_path / "ckpt.pt"), "--key", "loader"])
    said = [line for line in wrong.output.splitlines() if line.strip()]
    assert wrong.exit_code != 0 and "'loader' is not in the checkpoint (it holds: data, model)" in " ".join(said)


@pytest.mark.parametrize("kind", ["random", "windows", "packed", "padded", "mixture"])
def test_exposure_equals_a_count_over_the_replayed_steps(roots, kind):
    """stream.exposure(s): per document, the rows of steps [0, s) of every rank it appeared in;
    equal to a count made by drawing s batches on each of 2 ranks and tracing each one."""
    a, b = TokenDataset(roots[0]), TokenDataset(roots[1])

    def make(rank):
        if kind == "random":
            return a.random_batches(3, 40, seed=4, rank=rank, world_size=2)
        if kind == "windows":
            return a.window_batches(3, 40, seed=4, rank=rank, world_size=2)
        if kind == "packed":
            return a.packed(64, strategy="bfd").batches(3, rank=rank, world_size=2)
        if kind == "padded":
            return a.padded_batches(3, 48, seed=2, rank=rank, world_size=2)
        return Mixture([(a, 0.7), (b, 0.3)]).random_batches(3, 40, seed=4, rank=rank, world_size=2)

    steps = 25
    sizes = [a.n_docs, b.n_docs] if kind == "mixture" else [a.n_docs]
    counted = [np.zeros(n, dtype=np.int64) for n in sizes]
    for rank in (0, 1):
        stream = make(rank)
        for step in range(steps):
            next(stream)
            for row in stream.trace(step):
                for source, doc in {(p.source, p.doc) for p in row}:
                    counted[source][doc] += 1
    got = make(0).exposure(steps)
    got = got if isinstance(got, list) else [got]
    assert [g.tolist() for g in got] == [c.tolist() for c in counted]
    assert sum(int(c.sum()) for c in counted) >= steps * 6  # every row holds at least one document


def test_lmshard_trace_exposure_counts_the_steps_before_the_state(roots, tmp_path):
    """`lmshard trace --exposure --exposure-out counts.npy --json` on a state at step 12: the
    summary and the written counts equal stream.exposure(12), which replay checks above."""
    from typer.testing import CliRunner

    from lmshard.cli import app

    ds = TokenDataset(roots[0])
    stream = ds.random_batches(4, 32, seed=8)
    for _ in range(12):
        next(stream)
    (tmp_path / "state.json").write_text(json.dumps(stream.state_dict()))
    result = CliRunner().invoke(app, ["trace", str(roots[0]), "--state", str(tmp_path / "state.json"), "--exposure",
                                      "--exposure-out", str(tmp_path / "counts.npy"), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.splitlines()[-1])
    want = stream.exposure()
    assert np.load(tmp_path / "counts.npy").tolist() == want.tolist()
    assert summary["steps"] == 12 and summary["seen"] == int((want > 0).sum()) and summary["documents"] == ds.n_docs
    assert summary["times"]["1"] == int((want == 1).sum()) and summary["most"][0][1] == int(want.max())


def test_trace_names_each_documents_input_and_record(tmp_path):
    """Provenance: each traced document names its input file and record (line), and that line of
    the original input, read with json, is the document's text (the dataset's tokens decoded
    without the separator); two inputs, on the one-process path and planned in 3 tasks."""
    from lmshard.prepare.execution import local_exec

    lines = {}
    for name in ("one", "two"):
        texts = [f"{name} text number {i}: " + "alpha beta " * (i % 6) + "gamma " * (i * 37 % 400)
                 for i in range(240)]  # (larger than a unit: files cut into byte ranges)
        write(tmp_path / "in" / f"{name}.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
        lines[name] = texts
    common = {"inputs": [str(tmp_path / "in")], "val_fraction": 0.0, "quiet": True, "tokens_per_shard": 400}
    prepare(PrepareConfig(out=str(tmp_path / "local"), workers=1, **common))
    from lmshard.prepare.execution.units import _WINDOW

    local_exec.run(PrepareConfig(out=str(tmp_path / "planned"), workers=1, unit_size=_WINDOW, **common), 3)
    for root in ("local", "planned"):
        ds = TokenDataset(tmp_path / root)
        stream = ds.random_batches(4, 24, seed=2)
        seen = 0
        for _ in range(6):
            next(stream)
            for row in stream.trace():
                for p in row:
                    name = p.input.rsplit("/", 1)[-1].removesuffix(".jsonl")
                    whole = ds.tokens(p.offset - p.start, p.length)[:-1]  # the document, its EOT left out
                    assert ds.decode(whole) == lines[name][p.record - 1], (root, p)
                    seen += 1
        assert seen > 24
    assert sorted((tmp_path / "local" / "train").glob("*.src")) and \
        [p.read_bytes() for p in sorted((tmp_path / "local" / "train").glob("*.src"))] == \
        [p.read_bytes() for p in sorted((tmp_path / "planned" / "train").glob("*.src"))]  # fmt: skip


def test_the_trace_command_names_what_it_cannot_read_and_prints_skipped_steps(roots, tmp_path):
    """A mixture's or a text stream's state is one line saying where to trace it; a step number
    left out by a mode="steps" skip prints as skipped; --exposure takes one step, not a range."""
    from typer.testing import CliRunner

    import lmshard
    from lmshard.cli import app

    runner = CliRunner()
    ds = TokenDataset(roots[0])

    def traced(state: dict, *args: str):
        (tmp_path / "state.json").write_text(json.dumps(state))
        return runner.invoke(app, ["trace", str(roots[0]), "--state", str(tmp_path / "state.json"), *args])

    mix = Mixture({roots[0]: 0.5, roots[1]: 0.5}).window_batches(2, 24, seed=1)
    said = traced(mix.state_dict())
    assert said.exit_code != 0 and "a mixture (mixture/windows/24): trace it in Python" in " ".join(said.output.split())
    write(tmp_path / "t.jsonl", "".join(json.dumps({"text": f"text {i} " + "w " * i}) + "\n" for i in range(60)))
    text = lmshard.stream(str(tmp_path / "t.jsonl")).windows(2, 16)
    next(iter(text))
    said = traced(text.state_dict())
    assert said.exit_code != 0 and "the state of a text stream" in " ".join(said.output.split())
    for call in (text.exposure, lambda: text.skip(3, 5)):
        with pytest.raises(ArgumentError, match="a text stream does not"):
            call()
    skipped = ds.window_batches(2, 24, seed=1).skip(3, 5, mode="steps")
    for _ in range(7):
        next(skipped)
    said = traced(skipped.state_dict(), "--steps", "2:6")
    assert [line.split(":")[0] for line in said.output.splitlines() if line.startswith("step")] == [
        "step 2", "step 3", "step 4", "step 5"] and "step 3: skipped (steps 3 .. 4" in said.output  # fmt: skip
    ranged = traced(skipped.state_dict(), "--exposure", "--steps", "2:6")
    assert ranged.exit_code != 0 and "--exposure counts the steps before one step" in " ".join(ranged.output.split())
    nothing = traced(ds.window_batches(2, 24, seed=1).state_dict(), "--exposure")
    assert nothing.exit_code == 0 and nothing.output.startswith("before step 0 (no step yet): 0 of ")


def test_a_datasets_tokenizer_encodes_one_text(roots, reference):
    ds = TokenDataset(roots[0])
    assert ds.tokenizer.encode("hello <|endoftext|> world") == reference.encode_ordinary("hello <|endoftext|> world")
