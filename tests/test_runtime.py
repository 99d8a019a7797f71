"""The runtime loader, checked against the token stream read independently with numpy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from test_prepare import jsonl, make_texts

from lmshard import TokenDataset
from lmshard.errors import ArgumentError, ConfigError, FormatError
from lmshard.prepare import PrepareConfig, prepare

EOT = 50256


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rt")
    texts = make_texts(1500, seed=11) + ["long " * 3000]  # one document bigger than a shard
    prepare(PrepareConfig(inputs=[str(jsonl(tmp / "a.jsonl", texts))], out=str(tmp / "ds"), workers=1,
                          tokens_per_shard=2500, val_fraction=0.05))  # fmt: skip
    return tmp / "ds"


def stream_of(root, split="train") -> np.ndarray:
    """The split's concatenated token stream, read with numpy from the files listed in metadata."""
    meta = json.loads((root / "dataset_metadata.json").read_text())
    return np.concatenate([np.fromfile(root / s["path"], dtype="<u4") for s in meta["splits"][split]["shards"]])


def test_open_and_counts(ds):
    train = TokenDataset(ds, "train")
    assert train.n_tokens == len(stream_of(ds)) and train.n_docs > 1000
    assert np.array_equal(train.tokens(2400, 300), stream_of(ds)[2400:2700])  # crosses a shard


def test_rows_equal_stream_and_labels_are_shifted(ds):
    ref = stream_of(ds)
    for shift in (1, 3):
        batches = TokenDataset(ds).random_batches(batch_size=8, seq_len=64, seed=5, shift=shift)
        for _ in range(20):
            b = next(batches)
            assert b.x.dtype == torch.int64 and b.x.shape == (8, 64)
            for r, o in enumerate(b.offsets.tolist()):
                assert b.x[r].tolist() == ref[o : o + 64].tolist()
                assert b.y[r].tolist() == ref[o + shift : o + shift + 64].tolist()


def test_random_shift_is_a_proper_divisor_and_grouped(ds):
    ref = stream_of(ds)
    batches = TokenDataset(ds).random_batches(batch_size=4, seq_len=24, seed=2, shift="random", grouped=True)
    shifts = set()
    for _ in range(60):
        b = next(batches)
        m = b.shift
        shifts.add(m)
        assert 24 % m == 0 and m < 24
        assert b.x.shape == (4, 24 // m, m)
        o = int(b.offsets[0])
        assert b.y[0].reshape(-1).tolist() == ref[o + m : o + m + 24].tolist()
    assert len(shifts) > 3


def test_same_seed_same_batches_and_prefetch_does_not_change_them(ds):
    a = TokenDataset(ds).random_batches(4, 32, seed=9)
    b = TokenDataset(ds).random_batches(4, 32, seed=9, prefetch=False)
    c = TokenDataset(ds).random_batches(4, 32, seed=10)
    for _ in range(10):
        xa, xb, xc = next(a).x, next(b).x, next(c).x
        assert torch.equal(xa, xb) and not torch.equal(xa, xc)


def test_ranks_take_disjoint_rows_of_the_global_batch(ds):
    world = [TokenDataset(ds).random_batches(4, 32, seed=1, rank=r, world_size=3) for r in range(3)]
    single = TokenDataset(ds).random_batches(12, 32, seed=1, rank=0, world_size=1)
    assert world[0].global_batch_size == 12
    for _ in range(5):
        parts = [next(w) for w in world]
        whole = next(single)
        assert np.array_equal(np.concatenate([p.offsets for p in parts]), whole.offsets)
        assert len({o for p in parts for o in p.offsets.tolist()}) == 12


def test_world_size_4_state_resumes_at_world_size_2(ds):
    four = [TokenDataset(ds).random_batches(2, 16, seed=4, rank=r, world_size=4) for r in range(4)]
    for _ in range(3):
        for s in four:
            next(s)
    state = four[0].state_dict()
    expected = np.concatenate([next(s).offsets for s in four])
    two = [TokenDataset(ds).random_batches(4, 16, seed=4, rank=r, world_size=2) for r in range(2)]
    for s in two:
        s.load_state_dict(state)
    assert np.array_equal(np.concatenate([next(s).offsets for s in two]), expected)
    # row order (the default): another global batch continues the run's rows from the saved step
    rows = np.concatenate([next(TokenDataset(ds).random_batches(8, 16, seed=4, order="rows")).offsets
                           for _ in range(1)])  # fmt: skip
    whole = TokenDataset(ds).random_batches(6, 16, seed=4)
    wider = [next(whole).offsets for _ in range(6)]  # rows 0..35 of the same run
    three = TokenDataset(ds).random_batches(3, 16, seed=4, world_size=2)
    three.load_state_dict(state)  # saved after 3 steps of 8 rows: rows 24.. come next
    assert np.array_equal(next(three).offsets, np.concatenate(wider)[24:27])
    assert rows.tolist() == np.concatenate(wider)[:8].tolist()
    stepwise = [TokenDataset(ds).random_batches(2, 16, seed=4, rank=r, world_size=4, order="steps") for r in range(4)]
    with pytest.raises(ArgumentError, match="global_batch_size"):
        TokenDataset(ds).random_batches(3, 16, seed=4, world_size=2, order="steps").load_state_dict(
            stepwise[0].state_dict()
        )


def test_resume_in_a_new_process(ds, tmp_path):
    stream = TokenDataset(ds).random_batches(4, 32, seed=77, shift="random")
    for _ in range(7):
        next(stream)
    (tmp_path / "state.json").write_text(json.dumps(stream.state_dict()))
    expected = [next(stream).x.tolist() for _ in range(3)]
    code = textwrap.dedent(f"""
        import json
        from lmshard import TokenDataset
        s = TokenDataset({str(ds)!r}).random_batches(4, 32, seed=77, shift="random")
        s.load_state_dict(json.load(open({str(tmp_path / "state.json")!r})))
        print(json.dumps([next(s).x.tolist() for _ in range(3)]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == expected


def test_resume_refuses_another_seed_kind_or_seq_len(ds):
    data = TokenDataset(ds)
    saved = data.random_batches(4, 32, seed=5)
    for _ in range(3):
        next(saved)
    state = saved.state_dict()
    others = {
        "seed": data.random_batches(4, 32, seed=6),
        "kind": data.window_batches(4, 32, seed=5),
    }
    for key, other in others.items():
        with pytest.raises(ArgumentError, match=f"cannot resume: saved {key}="):
            other.load_state_dict(state)
    stepwise = data.random_batches(4, 32, seed=5, order="steps").state_dict()
    with pytest.raises(ArgumentError, match="cannot resume: saved seq_len="):
        data.random_batches(4, 16, seed=5, order="steps").load_state_dict(stepwise)
    shorter = data.random_batches(4, 16, seed=5)  # row order: the run goes on with rows of 16 tokens
    shorter.load_state_dict(state)
    assert shorter.state_dict()["schedule"] == [[0, 4, 32], [3, 4, 16]] and next(shorter).x.shape == (4, 16)
    windows = data.window_batches(4, 32, stride=32, seed=5).state_dict()
    with pytest.raises(ArgumentError, match="saved kind='windows/32'"):
        data.window_batches(4, 32, stride=16, seed=5).load_state_dict(windows)
    same = data.random_batches(4, 32, seed=5)
    same.load_state_dict(state)
    assert same.step == 3 and torch.equal(next(same).x, next(saved).x)


@pytest.mark.parametrize("differs", ["shift", "doc_aligned", "shuffle"])
def test_resume_refuses_a_stream_that_draws_other_rows(differs):
    data = TokenDataset.synthetic(20_000, vocab_size=100, doc_len=50)
    if differs == "shuffle":
        saved, other = data.window_batches(4, 32, seed=5), data.window_batches(4, 32, seed=5, shuffle=False)
    else:
        saved = data.random_batches(4, 32, seed=5)
        other = data.random_batches(4, 32, seed=5, **({"shift": 2} if differs == "shift" else {"doc_aligned": True}))
    next(saved)
    assert not np.array_equal(next(saved).offsets, other.cpu_batch(1).offsets)  # the two really differ
    with pytest.raises(ArgumentError, match="cannot resume"):
        other.load_state_dict(saved.state_dict())


def test_resume_state_fingerprint_and_older_states():
    """The state names the offsets' fingerprint; a state saved before it was recorded still loads."""
    data = TokenDataset.synthetic(20_000, vocab_size=100, doc_len=50)
    stream = data.random_batches(4, 32, seed=5, shift=2, doc_aligned=True)
    state = stream.state_dict()
    assert state["shift"] == 2 and state["doc_aligned"] is True
    assert data.window_batches(4, 32, stride=16, seed=5).state_dict()["stride"] == 16
    old = {k: v for k, v in state.items() if k not in ("shift", "doc_aligned")} | {"step": 7}
    stream.load_state_dict(old)
    assert stream.step == 7
    assert data.window_batches(4, 32, shift="random").state_dict()["shift"] == "random"


def test_window_batches_with_a_random_shift_grouped():
    """[B, T//s, s] with y the s-shifted x, read against the raw tokens; the shift is drawn per
    step (several differ), shared by both ranks, and the windows are those of the largest shift."""
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, 1000, size=5_000).astype(np.uint32)
    data = TokenDataset.from_tokens(tokens, eot_id=999, vocab_size=1000)
    T, B, stride = 24, 3, 10
    streams = [data.window_batches(B, T, stride=stride, shift="random", grouped=True, seed=2, rank=r, world_size=2)
               for r in range(2)]  # fmt: skip
    n_windows = (len(tokens) - (T + 12)) // stride + 1  # 12: the largest proper divisor of 24
    assert streams[0].steps_per_epoch == n_windows // (B * 2)
    shifts, starts = set(), []
    for _ in range(streams[0].steps_per_epoch):
        a, b = next(streams[0]), next(streams[1])
        assert a.shift == b.shift and T % a.shift == 0 and a.shift < T
        shifts.add(a.shift)
        for batch in (a, b):
            s = batch.shift
            assert batch.x.shape == (B, T // s, s) and batch.y.shape == (B, T // s, s)
            for row, o in enumerate(batch.offsets.tolist()):
                assert o % stride == 0
                starts.append(o)
                assert batch.x[row].flatten().tolist() == tokens[o : o + T].tolist()
                assert batch.y[row].flatten().tolist() == tokens[o + s : o + s + T].tolist()
    assert len(shifts) > 2
    assert len(set(starts)) == len(starts) == streams[0].steps_per_epoch * B * 2  # no window twice
    state = streams[0].state_dict()
    again = data.window_batches(B, T, stride=stride, shift="random", grouped=True, seed=2, rank=0, world_size=2)
    again.load_state_dict(state)
    nxt, ref = next(again), next(streams[0])
    assert nxt.shift == ref.shift and torch.equal(nxt.x, ref.x)


def test_grouped_needs_a_shift_that_divides_seq_len():
    data = TokenDataset.synthetic(10_000, vocab_size=100)
    with pytest.raises(ArgumentError, match="shift"):
        data.random_batches(4, 64, shift=3, grouped=True)


def test_offsets_uniform_over_unequal_shards(ds):
    """Chi-square over 20 equal-width bins of the split: flat if every position is equally likely."""
    train = TokenDataset(ds)
    stream = train.random_batches(256, 8, seed=3)
    offsets = np.concatenate([next(stream).offsets for _ in range(200)])
    bins = np.histogram(offsets, bins=20, range=(0, train.n_tokens - 9 + 1))[0]
    expected = len(offsets) / 20
    chi2 = ((bins - expected) ** 2 / expected).sum()
    assert chi2 < 43.8  # p = 0.001 for 19 degrees of freedom
    assert np.ptp(TokenDataset(ds).store.sizes) > 1000  # the shards really are unequal


def test_windows_map_style_equal_stream_slices(ds):
    ref = stream_of(ds)
    w = TokenDataset(ds).windows(seq_len=50, stride=30)
    assert len(w) == (len(ref) - 51) // 30 + 1
    for i in (0, 1, 77, len(w) - 1):
        x, y = w[i]
        assert x.tolist() == ref[i * 30 : i * 30 + 50].tolist()
        assert y.tolist() == ref[i * 30 + 1 : i * 30 + 51].tolist()
    sampler = torch.utils.data.DistributedSampler(w, num_replicas=2, rank=1, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(w, batch_size=8, sampler=sampler)
    x, y = next(iter(loader))
    assert x.shape == (8, 50)


def test_window_batches_cover_each_window_once_per_epoch(ds):
    stream = TokenDataset(ds).window_batches(batch_size=8, seq_len=40, stride=40, seed=1)
    n_windows = (stream.store.n_tokens - 41) // 40 + 1
    seen = np.concatenate([next(stream).offsets for _ in range(stream.steps_per_epoch)])
    assert len(set(seen.tolist())) == len(seen) == stream.steps_per_epoch * 8 > n_windows - 8
    assert set((seen // 40).tolist()) <= set(range(n_windows))
    epoch1 = next(stream).offsets
    stream.set_epoch(0)
    assert np.array_equal(next(stream).offsets, seen[:8]) and not np.array_equal(epoch1, seen[:8])


@pytest.mark.parametrize("shift", [2, 3])
def test_windows_and_window_batches_with_shift(ds, shift):
    """y is x moved `shift` tokens on, and the last window still has room for its labels."""
    ref = stream_of(ds)
    w = TokenDataset(ds).windows(seq_len=50, stride=30, shift=shift)
    assert len(w) == (len(ref) - 50 - shift) // 30 + 1
    for i in (0, 1, 77, len(w) - 1):
        x, y = w[i]
        assert x.tolist() == ref[i * 30 : i * 30 + 50].tolist()
        assert y.tolist() == ref[i * 30 + shift : i * 30 + 50 + shift].tolist()
    for shuffle in (True, False):
        stream = TokenDataset(ds).window_batches(4, 40, stride=25, shift=shift, seed=3, shuffle=shuffle)
        assert stream.steps_per_epoch == ((len(ref) - 40 - shift) // 25 + 1) // 4
        for step in range(6):
            b = next(stream)
            assert b.shift == shift and b.y.shape == (4, 40)
            if not shuffle:
                assert b.offsets.tolist() == [25 * (4 * step + r) for r in range(4)]
            for r, o in enumerate(b.offsets.tolist()):
                assert o % 25 == 0
                assert b.x[r].tolist() == ref[o : o + 40].tolist()
                assert b.y[r].tolist() == ref[o + shift : o + 40 + shift].tolist()


def test_window_indexes_outside_the_dataset_raise_index_error(ds):
    """IndexError ends plain iteration (`list(windows)`), and a negative index is not wrapped."""
    w = TokenDataset(ds).windows(seq_len=50, stride=30)
    for i in (len(w), -1):
        with pytest.raises(IndexError):
            w[i]
    small = TokenDataset.synthetic(100, vocab_size=10, doc_len=7).windows(seq_len=20, stride=20, shift=2)
    assert [x.tolist()[0] for x, _ in small] == [x.tolist()[0] for x, _ in (small[i] for i in range(4))]
    assert len(small) == 4  # starts 0, 20, 40, 60: 60 + 22 <= 100, 80 + 22 > 100


def test_set_epoch_jumps_to_the_first_step_of_that_epoch(ds):
    stream = TokenDataset(ds).window_batches(8, 40, seed=1)
    for _ in range(stream.steps_per_epoch):
        next(stream)
    epoch1 = [next(stream).offsets.tolist() for _ in range(3)]
    other = TokenDataset(ds).window_batches(8, 40, seed=1)
    other.set_epoch(1)
    assert [next(other).offsets.tolist() for _ in range(3)] == epoch1
    with pytest.raises(ConfigError, match="no epochs"):
        TokenDataset(ds).random_batches(8, 40).set_epoch(1)
    in_order = TokenDataset(ds).window_batches(8, 40, stride=20, shuffle=False)
    first = next(in_order).offsets.tolist()
    assert first == list(range(0, 160, 20))
    in_order.set_epoch(1)
    assert next(in_order).offsets.tolist() == first and in_order.step == in_order.steps_per_epoch + 1


def test_doc_starts_inside_a_range_match_the_index(ds):
    """What cu_seqlens is built from, at the awkward places: ranges that begin exactly on a
    shard start or a document start, and ranges that span several shards."""
    starts = doc_starts_of(ds)
    store = TokenDataset(ds).store
    rng = np.random.default_rng(0)
    los = [*store.starts[:-1].tolist(), *starts[::97].tolist(), *rng.integers(0, store.n_tokens - 6000, 30).tolist()]
    for lo in los:
        for hi in (h for h in (lo + 1, lo + 300, lo + 6000) if h <= store.n_tokens):
            expected = starts[(starts > lo) & (starts < hi)]
            assert store.doc_starts_in(lo, hi).tolist() == expected.tolist(), (lo, hi)


def test_dataloader_workers_keep_the_global_order(ds):
    for factory in (lambda: TokenDataset(ds).random_batches(4, 32, seed=8),
                    lambda: TokenDataset(ds).window_batches(4, 32, seed=8)):  # fmt: skip
        direct = factory()
        expected = [next(direct).offsets.tolist() for _ in range(6)]
        loader = torch.utils.data.DataLoader(factory(), batch_size=None, num_workers=2)
        got = [b.offsets.tolist() for b, _ in zip(loader, range(6), strict=False)]
        assert got == expected


def test_a_stream_served_by_dataloader_workers_saves_the_state_after_the_last_batch(ds):
    """DataLoader workers hand the batches out in their own processes, so the stream here does
    not move: a plain state_dict() is refused saying so (never the stale step 0, which would
    train on the same batches again), and state_dict(after=batch) resumes exactly at the batch
    after it; once a state is loaded here, the stream counts here again."""
    def make():
        return TokenDataset(ds).random_batches(4, 32, seed=8)

    stream = make()
    loader = iter(torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2))
    for _ in range(5):
        last = next(loader)
    del loader
    with pytest.raises(ArgumentError, match=r"handed out by DataLoader workers.*state_dict\(after=batch\)"):
        stream.state_dict()
    state = stream.state_dict(after=last)
    assert state["step"] == last.step + 1 == 5 and stream.state_dict(after=last.step) == state
    with pytest.raises(ArgumentError, match="pass after= alone"):
        stream.state_dict(in_hand=1, after=last)
    ref, again = make(), make()
    expected = [next(ref).offsets.tolist() for _ in range(8)][5:]
    again.load_state_dict(state)
    assert [next(again).offsets.tolist() for _ in range(3)] == expected
    stream.load_state_dict(state)
    next(stream)
    assert stream.state_dict()["step"] == 6 and make().state_dict()["step"] == 0


def test_doc_aligned_rows_start_at_documents(ds):
    ref = stream_of(ds)
    stream = TokenDataset(ds).random_batches(16, 32, seed=6, doc_aligned=True)
    for _ in range(10):
        for o in next(stream).offsets.tolist():
            assert o == 0 or ref[o - 1] == EOT  # EOT is written after each document


def doc_starts_of(root, split="train") -> np.ndarray:
    """Global offsets of every document start of a split, from the .idx files read with numpy."""
    meta = json.loads((root / "dataset_metadata.json").read_text())
    starts, base = [], 0
    for s in meta["splits"][split]["shards"]:
        starts.append(np.fromfile(root / s["index_path"], dtype="<u8")[:-1].astype(np.int64) + base)
        base += s["n_tokens"]
    return np.concatenate(starts)


def test_cu_seqlens_match_the_document_index(ds):
    starts = set(doc_starts_of(ds).tolist())
    stream = TokenDataset(ds).random_batches(8, 64, seed=12, cu_seqlens=True)
    for _ in range(10):
        b = next(stream)
        expected = [0]
        for r, o in enumerate(b.offsets.tolist()):
            expected += [r * 64 + t for t in range(1, 64) if o + t in starts] + [(r + 1) * 64]
        assert b.cu_seqlens.dtype == torch.int32 and b.cu_seqlens.tolist() == expected
        assert b.max_seqlen == max(np.diff(expected)) and len(expected) > 8 + 1


def test_cu_seqlens_by_hand():
    """Documents of 7 tokens; rows [0, 20) and [20, 40): starts 7, 14 and 21, 28, 35."""
    data = TokenDataset.synthetic(100, vocab_size=10, doc_len=7)
    b = next(data.window_batches(2, 20, shuffle=False, cu_seqlens=True))
    assert b.offsets.tolist() == [0, 20]
    assert b.cu_seqlens.tolist() == [0, 7, 14, 20, 21, 28, 35, 40] and b.max_seqlen == 7


def test_open_files_are_bounded(ds):
    train = TokenDataset(ds, max_open_shards=3)
    stream = train.random_batches(32, 16, seed=1)
    for _ in range(20):
        next(stream)
        assert train.store.open_files <= 3
    assert len(train.store.shards) > 10


def test_bad_dataset_errors_name_the_shard(ds, tmp_path):
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(ds, copy)
    for shard, cut in ((sorted((copy / "train").glob("*.bin"))[2], 4), (sorted((copy / "train").glob("*.idx"))[4], 8)):
        whole = shard.read_bytes()
        shard.write_bytes(whole[:-cut])  # one token, one offset short
        with pytest.raises(FormatError, match=shard.name):
            TokenDataset(copy)
        shard.write_bytes(whole)
    with pytest.raises(ArgumentError, match="split='test'"):
        TokenDataset(ds, "test")


def test_from_text_and_synthetic(tmp_path, reference):
    from lmshard.tokenizers import load_tokenizer

    (tmp_path / "t.txt").write_text("tiny corpus, tiny corpus. " * 40)
    with pytest.raises(ArgumentError, match="needs a tokenizer object"):
        TokenDataset.from_text(tmp_path / "t.txt", "gpt2")
    data = TokenDataset.from_text(tmp_path / "t.txt", load_tokenizer("gpt2"))
    assert data.tokens(0, data.n_tokens).tolist() == reference.encode_ordinary("tiny corpus, tiny corpus. " * 40) + [
        EOT
    ]
    x, y = next(data.random_batches(2, 16))
    assert x.shape == (2, 16)
    mem = TokenDataset.from_tokens(np.arange(12, dtype=np.uint32), [5, 7], eot_id=11, vocab_size=12)
    assert mem.n_docs == 2 and mem.store.doc_counts.tolist() == [2] and mem.tokens(3, 4).tolist() == [3, 4, 5, 6]
    with pytest.raises(ArgumentError, match="sum to the 12 tokens"):
        TokenDataset.from_tokens(np.arange(12), [5, 6], eot_id=11, vocab_size=12)
    syn = TokenDataset.synthetic(10_000, vocab_size=100, doc_len=50)
    b = next(syn.random_batches(4, 20, cu_seqlens=True, doc_aligned=True))
    assert int(b.x.max()) < 100 and b.x.shape == (4, 20)


def test_runtime_imports_no_cli_or_tokenizer_modules():
    heavy = "{'typer', 'rich', 'tiktoken', 'datasets', 'click'}"
    code = (
        "import sys; from lmshard import TokenDataset; TokenDataset.synthetic(1000);"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_single_shard_fast_path_rows_equal_stream(tmp_path):
    src = jsonl(tmp_path / "a.jsonl", make_texts(300, seed=4))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "one"), workers=1, val_fraction=0.0))
    ref = stream_of(tmp_path / "one")
    data = TokenDataset(tmp_path / "one")
    assert len(data.store.shards) == 1
    stream = data.random_batches(16, 48, seed=2, shift=2)
    for _ in range(10):
        b = next(stream)
        for r, o in enumerate(b.offsets.tolist()):
            assert b.x[r].tolist() == ref[o : o + 48].tolist()
            assert b.y[r].tolist() == ref[o + 2 : o + 50].tolist()


def test_staged_path_equals_direct_path_on_cpu(ds):
    """The CUDA path (ring of host buffers, copy, widening on the device) run on the CPU must
    hand out the same batches as the direct CPU path, and both must match the stream."""
    ref = stream_of(ds)
    for kw in ({"shift": 1}, {"shift": "random", "grouped": True}, {"shift": 2, "cu_seqlens": True}):
        direct = TokenDataset(ds).random_batches(6, 40, seed=4, **kw)
        staged = TokenDataset(ds).random_batches(6, 40, seed=4, **kw)
        staged.staged = True
        for _ in range(12):
            a, b = next(direct), next(staged)
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and a.shift == b.shift
            for r, o in enumerate(b.offsets.tolist()):
                assert b.y[r].reshape(-1).tolist() == ref[o + b.shift : o + b.shift + 40].tolist()
            if a.cu_seqlens is not None:
                assert torch.equal(a.cu_seqlens, b.cu_seqlens)
        assert staged._ring is not None and direct._ring is None


def test_x_and_y_are_contiguous_int64(ds):
    """x and y share one allocation but each must be a contiguous tensor (`y.view(-1)` in a loss)."""
    for stream in (TokenDataset(ds).random_batches(4, 32, seed=1), TokenDataset(ds).window_batches(4, 32)):
        x, y = next(stream)
        assert x.is_contiguous() and y.is_contiguous() and y.dtype == torch.int64
        assert torch.equal(y.view(-1).reshape(4, 32)[:, :-1], x[:, 1:])


def test_offsets_drawn_in_blocks_equal_the_per_step_formula(ds):
    """Offsets are drawn for many steps at once; each step's rows must still be the pure
    per-step function, whatever step the stream starts at and whatever the row count."""
    from lmshard.runtime.keyed import counter_ints
    from lmshard.runtime.sampling import _SHIFT_SALT, RandomOffsets, ShiftSpec

    n, T = 100_000, 24
    for count, spec in ((3, ShiftSpec.parse(1, T)), (5000, ShiftSpec.parse("random", T))):
        offsets = RandomOffsets(n, T, spec, seed=77)
        for step in (130, 5, 63, 64, 65, 0, 1000):  # out of order: blocks are recomputed
            rows, shift = offsets.rows(step, count)
            if spec.fixed is None:
                expected_shift = spec.choices[int(counter_ints(77 ^ _SHIFT_SALT, step, 1, len(spec.choices))[0])]
            else:
                expected_shift = spec.fixed
            assert shift == expected_shift
            assert rows.tolist() == counter_ints(77, step, count, n - (T + shift) + 1).tolist()


def _mapped_rss_kb(path) -> int:
    """Resident kB of this process's mappings of `path`, from /proc/self/smaps."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5:  # a mapping's header line
                inside = line.rstrip().endswith(str(path))
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_splits_past_the_rss_limit_are_read_not_mapped(tmp_path):
    """Under the limit the shard is mapped and its touched pages stay in RSS; past it, rows are
    read with preadv: nothing of the shard becomes resident in the process, and rows are the same."""
    texts = make_texts(16000, seed=8)
    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "a.jsonl", texts))], out=str(tmp_path / "d"), workers=1,
                          val_fraction=0.0))  # fmt: skip
    shard = next((tmp_path / "d" / "train").glob("*.bin"))
    size = shard.stat().st_size
    ref = np.fromfile(shard, dtype="<u4")
    assert size > 2 << 20
    for limit in (size, size - 1):  # the boundary: mapped at exactly the split's size, read one byte below
        data = TokenDataset(tmp_path / "d", rss_limit=limit)
        stream = data.random_batches(4, 4096, seed=3)  # 64 KiB read per batch
        seen = []
        for i in range(200):  # reads ~13 MB, twice the shard
            b = next(stream)
            if i % 10 == 9:  # reading smaps costs more than a batch
                seen.append(_mapped_rss_kb(shard))
        o = int(b.offsets[-1])
        assert b.x[-1].tolist() == ref[o : o + 4096].tolist() and b.y[-1].tolist() == ref[o + 1 : o + 4097].tolist()
        if limit == size:  # mapped: what was touched stays resident
            assert data.store.mapped and seen == sorted(seen) and seen[-1] > 0.9 * size / 1024
        else:
            assert not data.store.mapped and max(seen) == 0
        data.store.close()


@pytest.mark.parametrize("rss_limit", [None, 0])
def test_rows_cross_shards_in_both_read_modes(ds, rss_limit):
    ref = stream_of(ds)
    data = TokenDataset(ds, rss_limit=rss_limit)
    assert data.store.mapped == (rss_limit is None)
    assert np.array_equal(data.tokens(2400, 300), ref[2400:2700])  # crosses a shard
    stream = data.random_batches(8, 700, seed=5, shift=2)  # rows of 702 often cross 2,500-token shards
    staged = TokenDataset(ds, rss_limit=rss_limit).random_batches(8, 700, seed=5, shift=2)
    staged.staged = True
    for _ in range(20):
        b, c = next(stream), next(staged)
        assert torch.equal(b.x, c.x) and torch.equal(b.y, c.y)
        for r, o in enumerate(b.offsets.tolist()):
            assert b.x[r].tolist() == ref[o : o + 700].tolist()
            assert b.y[r].tolist() == ref[o + 2 : o + 702].tolist()


def test_a_shard_truncated_while_open_is_a_clear_error(tmp_path):
    src = jsonl(tmp_path / "a.jsonl", make_texts(300, seed=4))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "one"), workers=1, val_fraction=0.0))
    data = TokenDataset(tmp_path / "one", rss_limit=0)
    shard = next((tmp_path / "one" / "train").glob("*.bin"))
    stream = data.random_batches(4, 64, seed=1)
    next(stream)
    os.truncate(shard, 400)
    with pytest.raises(FormatError, match=f"{shard.name}.*changed after it was opened"):
        for _ in range(50):
            next(stream)


@pytest.mark.parametrize("rss_limit", [None, 0])
def test_a_pickled_stream_continues_with_its_own_files(ds, rss_limit):
    """DataLoader workers started by spawn receive the stream pickled: open maps and descriptors
    must not travel, and the copy must continue the same batches."""
    import pickle

    stream = TokenDataset(ds, rss_limit=rss_limit).random_batches(4, 32, seed=6)
    next(stream)
    copy = pickle.loads(pickle.dumps(stream))
    assert copy.store.open_files == 0
    for _ in range(5):
        a, b = next(stream), next(copy)
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_every_valid_offset_is_drawn_and_none_past_the_end():
    """A split of 30 tokens, rows of 24 + shift 3: exactly the starts 0..3 fit, all must appear."""
    data = TokenDataset.synthetic(30, vocab_size=10, doc_len=6)
    stream = data.random_batches(16, 24, shift=3, seed=1)
    seen = np.concatenate([next(stream).offsets for _ in range(20)])
    assert set(seen.tolist()) == {0, 1, 2, 3}
    aligned = data.random_batches(16, 11, doc_aligned=True, seed=1)
    seen = np.concatenate([next(aligned).offsets for _ in range(20)])
    assert set(seen.tolist()) == {0, 6, 12, 18}  # 18 + 11 + 1 = 30 fits, 24 does not
    with pytest.raises(ArgumentError, match="fewer than seq_len"):
        data.random_batches(2, 28, shift=3)


@pytest.mark.parametrize("rank,world", [(2, 2), (-1, 2), (0, 0)])
def test_rank_outside_the_world_is_refused(ds, rank, world):
    with pytest.raises(ArgumentError, match="not in|world_size=0 must be at least 1"):
        TokenDataset(ds).random_batches(4, 32, rank=rank, world_size=world)


def test_batch_reads_as_a_pair_and_as_a_mapping():
    data = TokenDataset.synthetic(20_000, vocab_size=100, doc_len=50)
    batch = next(data.random_batches(4, 32, seed=1, cu_seqlens=True))
    x, y = batch
    assert batch[0] is x and batch[1] is y and batch["input_ids"] is x and batch["labels"] is y
    assert batch.keys() == ["input_ids", "labels", "cu_seqlens", "max_seqlen"]
    assert "cu_seqlens" in batch and "position_ids" not in batch
    assert torch.equal(batch["cu_seqlens"], batch.cu_seqlens) and batch["max_seqlen"] == batch.max_seqlen

    def model(input_ids, labels, cu_seqlens, max_seqlen):  # a forward() taking keyword arguments
        return input_ids, labels, max_seqlen

    assert model(**batch)[2] == batch.max_seqlen and dict(batch.items())["labels"] is y
    plain = next(data.random_batches(4, 32, seed=1))
    assert plain.keys() == ["input_ids", "labels"]
    with pytest.raises(KeyError):
        plain["cu_seqlens"]


def test_window_items_read_as_pairs_and_mappings_and_collate_as_such():
    data = TokenDataset.synthetic(5_000, vocab_size=100, doc_len=50)
    ds = data.windows(16, stride=8)
    item = ds[3]
    x, y = item
    assert torch.equal(item["input_ids"], x) and torch.equal(item["labels"], y) and item[0] is x
    assert x.tolist() == data.tokens(24, 16).astype(np.int64).tolist() and y.tolist() == data.tokens(25, 16).tolist()
    batch = torch.utils.data.default_collate([ds[i] for i in range(4)])
    bx, by = batch
    assert bx.shape == (4, 16) and torch.equal(batch["input_ids"], bx) and torch.equal(batch["labels"], by)
    with pytest.raises(KeyError):
        item["position_ids"]
