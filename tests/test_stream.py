"""lmshard.stream: text tokenized as it trains. Checked against prepare's own output read back
as raw tokens, against a hand-computed split of the records, and against the uninterrupted run
for every resume."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from conftest import GPT2_EOT, write
from test_prepare import make_texts

import lmshard
from lmshard import TokenDataset
from lmshard.errors import ArgumentError, InputError
from lmshard.prepare import PrepareConfig, prepare


def write_parts(root: Path, parts: int, per_part: int, seed: int = 0) -> list[str]:
    """`parts` JSONL files of distinct documents (each names its file and line); their texts in order."""
    root.mkdir(parents=True, exist_ok=True)
    texts = make_texts(parts * per_part, seed=seed)
    out = []
    for p in range(parts):
        chunk = [f"part {p} record {i} {t}" for i, t in enumerate(texts[p * per_part : (p + 1) * per_part])]
        (root / f"part{p:02d}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in chunk))
        out += chunk
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    texts = write_parts(root / "src", parts=7, per_part=60)
    return root, texts


def prepared(root: Path, inputs: list[str], name: str, **kw) -> TokenDataset:
    prepare(PrepareConfig(inputs=inputs, out=str(root / name), dedup="none", workers=1, **{"val_fraction": 0, **kw}))
    return TokenDataset(root / name)


def all_tokens(ds: TokenDataset) -> np.ndarray:
    return ds.tokens(0, ds.n_tokens)


def epoch_tokens(stream, **kw) -> np.ndarray:
    return np.concatenate([t for _, t, _ in stream.documents(epochs=1, **kw)()])


def test_one_epoch_in_order_equals_prepare_no_dedup_read_back(corpus):
    root, _ = corpus
    want = all_tokens(prepared(root, [str(root / "src")], "ds"))
    assert np.array_equal(epoch_tokens(lmshard.stream(str(root / "src"))), want)
    # the windows of one epoch are the prepared token stream cut in rows, in order
    batches = lmshard.stream(str(root / "src"), epochs=1).windows(4, 32)
    rows = torch.cat([b.x for b in batches]).numpy().ravel()
    assert np.array_equal(rows, want[: len(rows)]) and len(want) - len(rows) < 4 * 32 + 1


def test_the_val_split_is_prepares(corpus):
    root, _ = corpus
    prepared(root, [str(root / "src")], "split", val_fraction=0.2)
    for split in ("train", "val"):
        stream = lmshard.stream(str(root / "src"), split=split, val_fraction=0.2)
        assert np.array_equal(epoch_tokens(stream), all_tokens(TokenDataset(root / "split", split=split))), split


def test_parquet_directory_and_saved_dataset_read_through_datasets(tmp_path):
    texts = make_texts(150, seed=3)
    data = datasets.Dataset.from_dict({"text": texts})
    data.save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "pq").mkdir()
    data.to_parquet(str(tmp_path / "pq" / "train-00000-of-00001.parquet"))
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    want = all_tokens(prepared(tmp_path, [str(tmp_path / "a.jsonl")], "ds"))
    assert np.array_equal(epoch_tokens(lmshard.stream(hf=str(tmp_path / "pq"))), want)
    assert np.array_equal(epoch_tokens(lmshard.stream(str(tmp_path / "saved"))), want)


@pytest.mark.parametrize("parts", [7, 2], ids=["whole-shards", "round-robin"])
def test_three_ranks_by_two_workers_read_disjoint_records_that_cover_the_source(tmp_path, parts, reference):
    texts = write_parts(tmp_path / "src", parts=parts, per_part=420 // parts)
    stream = lmshard.stream(str(tmp_path / "src"))
    assert stream.documents(readers=6).whole == (parts >= 6)
    seen = []
    for reader in range(6):
        docs = [bytes(t[:-1].astype(np.uint32)) for _, t, _ in stream.documents(reader=reader, readers=6, epochs=1)()]
        assert docs, reader
        seen += docs
    enc = lambda t: bytes(np.asarray(reference.encode_ordinary(t), dtype=np.uint32))  # noqa: E731
    want = sorted(enc(t) for t in texts)
    assert sorted(seen) == want  # every record once: disjoint, and together the source
    if parts == 2:  # round-robin: reader c holds records c, c+6, c+12... of the source
        first = [t for _, t, _ in stream.documents(reader=4, readers=6, epochs=1)()][:3]
        for k, t in enumerate(first):
            assert bytes(t[:-1].astype(np.uint32)) == enc(texts[4 + 6 * k])


def _drain(batches, n=None):
    out = []
    with batches:  # closes the DataLoader workers of a loop left early
        for b in batches:
            out.append(b)
            if n is not None and len(out) == n:
                break
    return out


def _same(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


def test_dataloader_workers_are_the_readers_of_the_rank(corpus):
    root, _ = corpus
    stream = lmshard.stream(str(root / "src"), epochs=1)
    # This process encodes first (splintr's pool starts here, when auto picks splintr): the forked
    # workers cannot use that pool and must still give the same batches, without waiting for ever.
    next(iter(stream.documents()()))
    got = _drain(stream.windows(2, 32, num_workers=2))
    inproc = []
    for w in range(2):  # what each worker should read: reader w of the rank's 2, in its own process
        b = stream.windows(2, 32, num_workers=2)
        inproc.append([item["rows"] for item in b.reader(w)])
    interleave = [r for pair in zip(*inproc, strict=False) for r in pair]
    longer = max(inproc, key=len)
    interleave += longer[min(map(len, inproc)) :]
    assert len(got) == len(interleave)
    for batch, rows in zip(got, interleave, strict=True):
        assert np.array_equal(batch.x.numpy(), rows[:, :32])


SHAPES = {
    "windows": lambda s: s.windows(3, 24, stride=16, shift="random"),
    "packed-bfd": lambda s: s.packed(3, 64, buffer=40, overlong="split"),
    "packed-greedy": lambda s: s.packed(3, 64, strategy="greedy", buffer=10, overlong="truncate"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("shuffle_buffer", [0, 50])
def test_stop_and_resume_gives_the_uninterrupted_batches(corpus, shape, shuffle_buffer):
    root, _ = corpus
    make = lambda: SHAPES[shape](lmshard.stream(str(root / "src"), shuffle_buffer=shuffle_buffer, seed=5))  # noqa: E731
    whole = _drain(make(), 60)  # past the end of an epoch of some readers
    first = make()
    head = _drain(first, 23)
    state = first.state_dict(in_hand=2)  # two drawn and not trained on
    assert state["step"] == 21
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(state)))  # a few integers, through JSON
    tail = _drain(resumed, 60 - 21)
    for k, b in enumerate(head[:21] + tail):
        assert _same(b, whole[k]), k
        assert b.step == k if hasattr(b, "step") else True


def test_resume_with_dataloader_workers_at_an_odd_step(corpus):
    root, _ = corpus
    make = lambda: lmshard.stream(str(root / "src"), shuffle_buffer=30).packed(2, 64, buffer=20, num_workers=2)  # noqa: E731
    whole = _drain(make(), 30)
    first = make()
    _drain(first, 13)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    for k, b in enumerate(_drain(resumed, 17)):
        assert _same(b, whole[13 + k]), k


def test_shuffle_buffer_permutes_within_windows_and_keeps_every_document(corpus):
    root, _ = corpus
    plain = [bytes(t) for _, t, _ in lmshard.stream(str(root / "src")).documents(epochs=1)()]
    mixed = [bytes(t) for _, t, _ in lmshard.stream(str(root / "src"), shuffle_buffer=64, seed=1).documents(epochs=1)()]
    assert sorted(plain) == sorted(mixed) and plain != mixed


def test_a_changed_world_size_or_option_is_refused_with_the_reason(corpus):
    root, _ = corpus
    b = lmshard.stream(str(root / "src")).windows(2, 16, rank=0, world_size=2)
    _drain(b, 3)
    state = b.state_dict()
    with pytest.raises(ArgumentError, match="saved with world_size=2 and this stream has 3"):
        lmshard.stream(str(root / "src")).windows(2, 16, rank=0, world_size=3).load_state_dict(state)
    with pytest.raises(ArgumentError, match="saved with seq_len=16 and this stream has seq_len=32"):
        lmshard.stream(str(root / "src")).windows(2, 32, rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(ArgumentError, match="saved on rank 0 and this stream is rank 1: each rank .* its own") as e:
        lmshard.stream(str(root / "src")).windows(2, 16, rank=1, world_size=2).load_state_dict(state)
    assert "pass rank=0" not in str(e.value)  # (rank 1 given rank 0's state would read rank 0's records)


def test_a_finite_stream_on_many_ranks_needs_an_agreed_end(corpus):
    root, _ = corpus
    b = lmshard.stream(str(root / "src"), epochs=1).windows(2, 16, rank=1, world_size=3)
    with pytest.raises(ArgumentError, match="initialise torch.distributed first"):
        iter(b)
    steps = [len(_drain(lmshard.stream(str(root / "src"), epochs=2).windows(2, 16, rank=r, world_size=3,
                                                                             steps_per_epoch=40)))
             for r in range(3)]  # fmt: skip
    assert steps == [80, 80, 80]


def test_too_many_readers_for_the_documents_is_one_line(tmp_path):
    write_parts(tmp_path / "src", parts=1, per_part=3)
    b = lmshard.stream(str(tmp_path / "src")).windows(1, 4, rank=4, world_size=5)
    with pytest.raises(InputError, match="reader 4 of 5 .* got no document up to epoch 0"):
        next(iter(b))


def test_a_source_of_only_empty_documents_says_so_not_fewer_readers(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_text("".join(json.dumps({"text": ""}) + "\n" for _ in range(5)))
    b = lmshard.stream(str(tmp_path / "src")).windows(1, 4)
    with pytest.raises(InputError, match="the source gave no document: every record was empty or dropped") as e:
        next(iter(b))
    assert "fewer" not in str(e.value)


def test_stdin_is_refused(tmp_path):
    with pytest.raises(InputError, match="cannot read stdin"):
        lmshard.stream("-")


def test_a_slow_stream_says_it_is_the_bottleneck(corpus, capsys):
    """Driven by a clock the test moves: waiting 1 unit per batch against 1 unit of training."""
    root, _ = corpus
    now = [0.0]

    def clock() -> float:
        now[0] += 0.5  # each reading of the clock: half a unit later
        return now[0]

    b = lmshard.stream(str(root / "src")).windows(1, 16, clock=clock)
    _drain(b, 49)
    assert "bottleneck" not in capsys.readouterr().err  # not before 50 steps
    _drain(b, 2)
    err = capsys.readouterr().err
    assert "the stream is the bottleneck" in err and "prepare the data once" in err
    assert 0.3 < b.metrics()["waiting_share"] < 0.7


def test_packed_rows_hold_each_document_once_and_report_fill(corpus):
    root, texts = corpus
    b = lmshard.stream(str(root / "src"), epochs=1).packed(1, 256, buffer=1000, shuffle=False)
    rows = _drain(b)
    stream = lmshard.stream(str(root / "src"))
    docs = [t for _, t, _ in stream.documents(epochs=1)()]
    segments = []
    for r in rows:
        ids, cu = r["input_ids"][0].numpy(), r["cu_seqlens"].numpy()
        segments += [bytes(ids[a:z].astype(np.uint32)) for a, z in zip(cu[:-1], cu[1:], strict=True)]
    for d in docs[: len(docs) // 2]:  # the last, partial batch is left out: check the first half
        assert bytes(d.astype(np.uint32)) in segments
    m = b.metrics()
    real = sum(int((r["labels"][0] != -100).sum()) + int(r["cu_seqlens"].numel() - 1) for r in rows)
    assert m["packs"] == len(rows) and 0.9 < m["fill"] <= 1.0 and real >= m["fill"] * 256 * len(rows) * 0.9


_RANK = """
import json, os, sys, torch, torch.distributed as dist, lmshard
dist.init_process_group("gloo")
rank = dist.get_rank()
b = lmshard.stream(sys.argv[1], epochs=1).windows(2, 16, num_workers=2)
steps = 0
for x, y in b:
    steps += 1
own = sum(1 for _ in lmshard.stream(sys.argv[1], epochs=1).documents(reader=2 * rank, readers=6)())
os.write(1, (json.dumps({"rank": rank, "steps": steps, "docs": own}) + "\\n").encode())  # one write: ranks share stdout
"""


def test_three_ranks_with_two_workers_each_stop_together_at_the_shortest_ranks_count(tmp_path):
    """Real torch.distributed (gloo on loopback): 3 ranks whose parts differ in length take the
    same number of steps, and no rank hangs at the end of the epoch."""
    from test_train_ddp import free_port, launch

    write_parts(tmp_path / "src", parts=7, per_part=40)  # 7 shards over 6 readers: reader 0 has two
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    done = launch([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr",
                   "127.0.0.1", "--master-port", str(free_port()), str(script), str(tmp_path / "src")])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2]
    assert len({r["steps"] for r in ranks}) == 1 and ranks[0]["steps"] > 0
    assert len({r["docs"] for r in ranks}) > 1  # the parts were uneven: the agreement did the work


def test_each_shard_is_opened_once_per_epoch_however_many_windows_it_fills(tmp_path, monkeypatch):
    """Windows of 256 documents from a 1,000-record file: read once, not re-read from its start
    for every window (which would grow with the square of the file)."""
    from lmshard.streaming.sources import Shard

    write_parts(tmp_path / "src", parts=1, per_part=1000)
    opened = []
    real = Shard.documents

    def counting(self, counts, skip=0, every=1, phase=0):
        opened.append(skip)
        return real(self, counts, skip, every, phase)

    monkeypatch.setattr(Shard, "documents", counting)
    docs = list(lmshard.stream(str(tmp_path / "src"), epochs=2).documents()())
    assert len(docs) == 2000 and opened == [0, 0]


def test_a_reader_that_draws_empty_shards_for_an_epoch_goes_on(tmp_path):
    """Shuffled shard order: in some epochs a reader's only shard holds no kept document."""
    (tmp_path / "src").mkdir()
    parts = {"a": [f"long document a{i}" for i in range(5)], "b": [f"long document b{i}" for i in range(5)],
             "c": ["x", "y"]}  # c's two records are shorter than min_chars
    for name, texts in parts.items():
        (tmp_path / "src" / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    stream = lmshard.stream(str(tmp_path / "src"), shuffle_buffer=2, min_chars=5)
    for reader in range(3):
        it = stream.documents(reader=reader, readers=3)()
        assert len([next(it) for _ in range(60)]) == 60  # many epochs, some of them empty for this reader


def test_packing_mistakes_are_refused_and_never_hang(tmp_path):
    write_parts(tmp_path / "src", parts=1, per_part=5)
    with pytest.raises(ArgumentError, match="overlong='zap' is not a policy"):
        lmshard.stream(str(tmp_path / "src")).packed(1, 8, overlong="zap")
    with pytest.raises(ArgumentError, match="a stream packs with 'bfd'"):
        lmshard.stream(str(tmp_path / "src")).packed(1, 8, strategy="stream")
    for epochs in (None, 1):  # every document is longer than 8 tokens and dropped: one line, not a hang
        with pytest.raises(InputError, match="no document of this reader's part can be packed"):
            next(iter(lmshard.stream(str(tmp_path / "src"), epochs=epochs).packed(1, 8, overlong="drop")))


def test_a_readers_error_in_a_dataloader_worker_is_the_same_one_line(tmp_path):
    write_parts(tmp_path / "src", parts=1, per_part=1)
    with pytest.raises(InputError) as e:
        _drain(lmshard.stream(str(tmp_path / "src")).windows(1, 4, num_workers=2))
    assert str(e.value).startswith("lmshard.stream: reader 1 of 2") and "\n" not in str(e.value)


def test_resume_refuses_other_cleaning_or_split_options(corpus):
    root, _ = corpus
    b = lmshard.stream(str(root / "src")).windows(2, 16)
    _drain(b, 2)
    state = b.state_dict()
    for option in ({"min_chars": 200}, {"val_fraction": 0.5}, {"normalize": "none"}, {"text_field": "body"}):
        key = next(iter(option))
        with pytest.raises(ArgumentError, match=f"saved with {key}="):
            lmshard.stream(str(root / "src"), **option).windows(2, 16).load_state_dict(state)
    with pytest.raises(ArgumentError, match="the state is not whole"):
        lmshard.stream(str(root / "src")).windows(2, 16).load_state_dict({**state, "readers": [[1, 2]]})


def test_a_missing_path_and_an_unknown_option_are_one_line(tmp_path):
    with pytest.raises(InputError) as e:
        lmshard.stream(str(tmp_path / "data" / "train.jsonl"))
    assert "--hf" not in str(e.value) and "train.jsonl" in str(e.value)
    from lmshard.errors import ConfigError

    with pytest.raises(ConfigError, match="lmshard.stream: no option 'nonsense'"):
        lmshard.stream(str(tmp_path), nonsense=1)


def test_a_parquet_directory_read_by_datasets_in_dataloader_workers_loses_nothing(tmp_path):
    (tmp_path / "pq").mkdir()
    texts = make_texts(200, seed=8)
    for k in range(2):
        datasets.Dataset.from_dict({"text": texts[k::2]}).to_parquet(str(tmp_path / "pq" / f"part{k}.parquet"))
    stream = lmshard.stream(hf=str(tmp_path / "pq"), epochs=1)
    inproc = sum(len(t) for _, t, _ in stream.documents()())
    rows = _drain(stream.windows(1, 16, num_workers=2))
    assert inproc // 17 - 2 <= len(rows) <= inproc // 16  # both files' tokens, not one worker's share of each


def test_option_mistakes_and_a_changed_seed_are_refused(corpus):
    root, _ = corpus
    src = str(root / "src")
    with pytest.raises(ArgumentError, match="windows\\(\\) takes no option 'shuffle'"):
        lmshard.stream(src).windows(2, 16, shuffle=False)
    with pytest.raises(ArgumentError, match="split='val' holds no document without val_fraction"):
        lmshard.stream(src, split="val")
    assert lmshard.stream(Path(src)).n_shards == 7  # a Path is an input too
    b = lmshard.stream(src, shuffle_buffer=8, seed=3).packed(2, 64, overlong="split")
    _drain(b, 2)
    state = b.state_dict()
    with pytest.raises(ArgumentError, match="saved with seed=3 and this stream has seed=4"):
        lmshard.stream(src, shuffle_buffer=8, seed=4).packed(2, 64).load_state_dict(state)
    with pytest.raises(ArgumentError, match="saved with overlong='split'"):
        lmshard.stream(src, shuffle_buffer=8, seed=3).packed(2, 64, overlong="truncate").load_state_dict(state)


def test_a_finite_stream_too_small_for_one_batch_says_so(tmp_path):
    write_parts(tmp_path / "src", parts=1, per_part=2)
    with pytest.raises(InputError, match="ended before its first batch"):
        next(iter(lmshard.stream(str(tmp_path / "src"), epochs=1).windows(2, 4096)))


def test_a_stream_takes_decode_errors_replace(tmp_path):
    """lmshard.stream(decode_errors="replace") reads a line with a Latin-1 byte as text with
    U+FFFD, as prepare does, where the default drops it."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.jsonl").write_bytes(b'{"text": "caf\xe9 au lait and more words here"}\n')
    plain = list(lmshard.stream(str(tmp_path / "src"), epochs=1, on_error="skip").documents(epochs=1)())
    kept = list(lmshard.stream(str(tmp_path / "src"), epochs=1, decode_errors="replace").documents(epochs=1)())
    assert plain == [] and len(kept) == 1


def test_stream_windows_are_contiguous_as_a_model_that_flattens_them_needs(corpus):
    """nanoGPT's loss is F.cross_entropy(logits.view(-1, V), targets.view(-1)): a stream's x and
    y are contiguous int64, as a prepared dataset's are, so view(-1) works on them as they come."""
    import torch.nn.functional as F

    root, _ = corpus
    batch = next(iter(lmshard.stream(str(root / "src")).windows(3, 16, shift=1)))
    assert batch.x.is_contiguous() and batch.y.is_contiguous() and batch.y.dtype == torch.int64
    logits = torch.zeros(3, 16, 50257)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), batch.y.view(-1), ignore_index=-1)
    assert torch.isclose(loss, torch.log(torch.tensor(50257.0)))  # uniform logits: log V


_RESUME = """
import json, os, sys, torch, torch.distributed as dist, lmshard
dist.init_process_group("gloo")
rank, src, ckpt = dist.get_rank(), sys.argv[1], sys.argv[2]
def windows():
    return lmshard.stream(src, seed=5, shuffle_buffer=32).windows(2, 16)
whole = [b.x.tolist() for b, _ in zip(windows(), range(6))]
b = windows()
for _ in zip(range(3), b):  # (range first: zip would draw a fourth batch from b before range ends)
    pass
state = b.state_dict(gather=True)  # every rank calls it; rank 0 holds them all and saves
if rank == 0:
    torch.save(state, ckpt)
dist.barrier()
resumed = windows()
resumed.load_state_dict(torch.load(ckpt, weights_only=False))
after = [b.x.tolist() for b, _ in zip(resumed, range(3))]
os.write(1, (json.dumps({"rank": rank, "same": after == whole[3:], "ranks": len(state["ranks"])}) + "\\n").encode())
"""


def test_a_two_rank_stream_resumes_exactly_from_rank_0s_checkpoint(tmp_path):
    """Real torch.distributed (gloo): every rank calls state_dict(gather=True), rank 0 alone
    saves it (as nanoGPT saves its checkpoints), and each rank resumes from that one file with
    exactly the batches an uninterrupted run draws next."""
    from test_train_ddp import free_port, launch

    write_parts(tmp_path / "src", parts=4, per_part=60)
    script = tmp_path / "resume.py"
    script.write_text(_RESUME)
    done = launch([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                   "127.0.0.1", "--master-port", str(free_port()), str(script), str(tmp_path / "src"),
                   str(tmp_path / "ckpt.pt")])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = sorted((json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")),
                   key=lambda r: r["rank"])  # fmt: skip
    assert ranks == [{"rank": 0, "same": True, "ranks": 2}, {"rank": 1, "same": True, "ranks": 2}], ranks


_GATHER_PEERS = """
import json, os, sys, lmshard, torch.distributed as dist
from lmshard.errors import LmshardError
dist.init_process_group("gloo")
rank, src = dist.get_rank(), sys.argv[1]
# two tensor-parallel peers of one data-parallel rank: the same stream (rank 0 of 1) on both
b = lmshard.stream(src, seed=5).windows(2, 16, rank=0, world_size=1)
for _ in zip(range(3), b):
    pass
state = b.state_dict(gather=True)
try:  # process 1 asks for more than the stream keeps: every process raises, none waits
    b.state_dict(in_hand=99 if rank == 1 else 0, gather=True)
    failed = ""
except LmshardError as e:
    failed = str(e)
os.write(1, (json.dumps({"rank": rank, "ranks": [s["rank"] for s in state["ranks"]], "failed": failed}) + "\\n"
              ).encode())
dist.barrier()
dist.destroy_process_group()
"""


def test_gather_with_peers_sharing_a_stream_rank_and_a_failing_rank(tmp_path):
    """Real torch.distributed (gloo), 2 processes that share stream rank 0 (as tensor-parallel
    peers do): the gathered state holds that rank once; a state that fails on process 1 is
    raised on both processes (no hang), naming the rank."""
    from test_train_ddp import free_port, launch

    write_parts(tmp_path / "src", parts=2, per_part=40)
    script = tmp_path / "peers.py"
    script.write_text(_GATHER_PEERS)
    done = launch([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                   "127.0.0.1", "--master-port", str(free_port()), str(script), str(tmp_path / "src")])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = sorted((json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")),
                  key=lambda r: r["rank"])  # fmt: skip
    assert [s["ranks"] for s in said] == [[0], [0]]
    assert all(s["failed"].startswith("state_dict(gather=True): rank 0: in_hand=99") for s in said), said


@pytest.mark.parametrize(("shape", "workers"), [("windows", 0), ("packed", 0), ("windows", 2)])
def test_a_text_streams_batches_trace_to_their_input_lines(tmp_path, reference, shape, workers):
    """`batches.trace()` of a text stream: every row is the concatenation of its pieces, and each
    piece is tokens [start, end) of its input's line `record`, read back with json and encoded
    with tiktoken's own gpt2 (plus the end of text); shuffled, several files, read by DataLoader
    workers. A step not handed out (or too old) is one line."""
    texts = {}
    for name in ("a", "b", "c"):
        texts[name] = [f"{name} line {i}: " + "word " * (i * 7 % 40 + 1) for i in range(50)]
        write(tmp_path / "in" / f"{name}.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts[name]))
    stream = lmshard.stream(str(tmp_path / "in"), shuffle_buffer=16, seed=4)
    batches = stream.windows(3, 24, num_workers=workers) if shape == "windows" else stream.packed(3, 64)
    it = iter(batches)
    checked = 0
    for _ in range(6):
        batch = next(it)
        rows = torch.cat([batch.x, batch.y[:, -1:]], 1) if shape == "windows" else batch["input_ids"]
        for r, pieces in enumerate(batches.trace()):
            at = 0
            for p in pieces:
                name = Path(p.input).name.removesuffix(".jsonl")
                tokens = reference.encode_ordinary(texts[name][p.record - 1]) + [GPT2_EOT]
                assert p.length == len(tokens) and p.at == at
                assert rows[r, p.at : p.at + p.end - p.start].tolist() == tokens[p.start : p.end], p
                at += p.end - p.start
                checked += 1
            if shape == "windows":
                assert at == rows.shape[1]
            else:  # the rest of a pack is padding (the end of text id)
                assert at <= rows.shape[1] and (rows[r, at:] == GPT2_EOT).all()
    assert checked > 18
    assert batches.trace(batches.step - 2)
    with pytest.raises(ArgumentError, match="a text stream traces the batches it handed out"):
        batches.trace(batches.step + 3)
    batches.close()
