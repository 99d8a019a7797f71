"""Every public argument of the runtime loader is checked when a dataset or stream is built: a
misuse is one `ArgumentError` line naming the argument, its value and the fix, never a raw
torch/numpy error nor a silently wrong stream. Valid edge values still give the right tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_prepare import jsonl, make_texts

from lmshard import TokenDataset
from lmshard.errors import ArgumentError
from lmshard.prepare import PrepareConfig, prepare
from lmshard.runtime import sampling
from lmshard.runtime.batches import resolve_rank
from lmshard.runtime.dataset import WindowDataset


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    """A small prepared dataset whose val split holds a few hundred tokens."""
    tmp = tmp_path_factory.mktemp("args")
    src = jsonl(tmp / "a.jsonl", make_texts(300, seed=3))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp / "ds"), workers=1, val_fraction=0.02))
    return tmp / "ds"


def split_tokens(root, split: str) -> np.ndarray:
    """A split's token stream, read with numpy from the shard files the metadata lists."""
    meta = json.loads((root / "dataset_metadata.json").read_text())
    return np.concatenate([np.fromfile(root / s["path"], dtype="<u4") for s in meta["splits"][split]["shards"]])


def syn(n: int = 10_000) -> TokenDataset:
    return TokenDataset.synthetic(n, vocab_size=100, doc_len=50)


class Tok:
    """A tokenizer without `encode_batch`."""

    eot_id, n_vocab = 0, 10


def a_state(**change):
    """A resume state of `syn().random_batches(4, 32, seed=5)`, with keys changed (None: removed)."""
    state = syn().random_batches(4, 32, seed=5).state_dict() | change
    return {k: v for k, v in state.items() if v is not None}


def resume(state, seed: int = 5) -> None:
    syn().random_batches(4, 32, seed=seed).load_state_dict(state)


def mem(tokens, doc_lengths=None, eot_id=9, vocab_size=10) -> TokenDataset:
    return TokenDataset.from_tokens(np.asarray(tokens), doc_lengths, eot_id=eot_id, vocab_size=vocab_size)


SPEC = sampling.ShiftSpec.parse(1, 8)


def val_size(disk) -> int:
    return len(split_tokens(disk, "val"))


# (id, build, what the message must name (argument and value), words of the fix)
CASES = [
    ("window shift 0", lambda d: syn().window_batches(4, 32, shift=0), "shift=0", "shift=1"),
    ("random shift 0", lambda d: syn().random_batches(4, 32, shift=0), "shift=0", "shift=1"),
    ("windows shift 0", lambda d: syn().windows(32, shift=0), "shift=0", "shift=1"),
    ("negative shift", lambda d: syn().random_batches(4, 32, shift=-2), "shift=-2", "shift=1"),
    ("shift past seq_len", lambda d: syn().random_batches(4, 32, shift=40), "shift=40", "at most seq_len"),
    ("shift misspelt", lambda d: syn().random_batches(4, 32, shift="rand"), "shift='rand'", "shift='random'"),
    ("shift bool", lambda d: syn().random_batches(4, 32, shift=True), "shift=True", "not a bool"),
    ("shift float", lambda d: syn().windows(32, shift=1.0), "shift=1.0", "shift=1"),
    ("windows random bare index", lambda d: syn().windows(32, shift="random")[0], "shift='random'", "batch_sampler"),
    ("windows shift not drawn", lambda d: syn().windows(32, shift="random")[0, 3], "shift=3", "batch_sampler"),
    ("windows bad key", lambda d: syn().windows(32)[0, 1, 2], "(window, shift)", "ds[i, shift]"),
    ("grouped shift 3", lambda d: syn().random_batches(4, 64, shift=3, grouped=True), "shift=3", "divides seq_len"),
    ("window stride 0", lambda d: syn().window_batches(4, 32, stride=0), "stride=0", "stride=None"),
    ("windows stride 0", lambda d: syn().windows(32, stride=0), "stride=0", "stride=None"),
    ("windows stride negative", lambda d: syn().windows(32, stride=-5), "stride=-5", "stride=None"),
    ("window stride float", lambda d: syn().window_batches(4, 32, stride=2.5), "stride=2.5", "an int"),
    ("batch_size float", lambda d: syn().random_batches(8.0, 32), "batch_size=8.0", "batch_size=8"),
    ("batch_size str", lambda d: syn().random_batches("8", 32), "batch_size='8'", "batch_size=8"),
    ("batch_size bool", lambda d: syn().random_batches(True, 32), "batch_size=True", "not a bool"),
    ("batch_size 0", lambda d: syn().window_batches(0, 32), "batch_size=0", "at least 1"),
    ("seq_len 0", lambda d: syn().random_batches(4, 0), "seq_len=0", "at least 1"),
    ("seq_len negative", lambda d: syn().windows(-1), "seq_len=-1", "at least 1"),
    ("seq_len None", lambda d: syn().window_batches(4, None), "seq_len=None", "an int"),
    ("no cuda", lambda d: syn().random_batches(4, 32, device="cuda"), "device='cuda'", "pass device='cpu'"),
    ("no cuda:1", lambda d: syn().random_batches(4, 32, device=torch.device("cuda:1")), "cuda:1", "device='cpu'"),
    ("device gpu", lambda d: syn().random_batches(4, 32, device="gpu"), "device='gpu'", "device='cuda'"),
    ("device cuda:x", lambda d: syn().window_batches(4, 32, device="cuda:x"), "device='cuda:x'", "device='cuda"),
    ("device mps", lambda d: syn().random_batches(4, 32, device="mps"), "device='mps'", ".to("),
    ("device int", lambda d: syn().random_batches(4, 32, device=[0]), "device=[0]", "device='cpu'"),
    ("windows too long", lambda d: syn(1000).windows(1000), "1000 tokens", "lower seq_len"),
    ("window_batches too long", lambda d: syn(1000).window_batches(1, 998, shift=3), "shift = 1001", "lower seq_len"),
    ("val split too small", lambda d: TokenDataset(d, "val").random_batches(2, val_size(d)), "split 'val'", "larger"),
    ("val windows too long", lambda d: TokenDataset(d, "val").windows(val_size(d)), "split 'val'", "lower seq_len"),
    ("windows fill no batch", lambda d: syn(1000).window_batches(40, 32), "batch_size=40", "lower batch_size"),
    ("rank outside world", lambda d: syn().random_batches(4, 32, rank=2, world_size=2), "rank=2", "below world_size"),
    ("negative rank", lambda d: syn().window_batches(4, 32, rank=-1, world_size=2), "rank=-1", "below world_size"),
    ("world_size 0", lambda d: syn().random_batches(4, 32, rank=0, world_size=0), "world_size=0", "at least 1"),
    ("rank float", lambda d: syn().random_batches(4, 32, rank=1.0, world_size=2), "rank=1.0", "rank=1"),
    ("world_size str", lambda d: resolve_rank(0, "2"), "world_size='2'", "world_size=2"),
    ("seed negative", lambda d: syn().random_batches(4, 32, seed=-1), "seed=-1", "at least 0"),
    ("seed float", lambda d: syn().window_batches(4, 32, seed=1.5), "seed=1.5", "an int"),
    ("synthetic seed", lambda d: TokenDataset.synthetic(100, seed=-1), "seed=-1", "at least 0"),
    ("synthetic vocab 1", lambda d: TokenDataset.synthetic(100, vocab_size=1), "vocab_size=1", "at least 2"),
    ("synthetic no tokens", lambda d: TokenDataset.synthetic(0), "n_tokens=0", "at least 1"),
    ("synthetic doc_len 0", lambda d: TokenDataset.synthetic(100, doc_len=0), "doc_len=0", "at least 1"),
    ("doc_aligned str", lambda d: syn().random_batches(4, 32, doc_aligned="no"), "doc_aligned='no'", "True or False"),
    ("shuffle str", lambda d: syn().window_batches(4, 32, shuffle="False"), "shuffle='False'", "True or False"),
    ("prefetch int", lambda d: syn().random_batches(4, 32, prefetch=0), "prefetch=0", "True or False"),
    ("cu_seqlens None", lambda d: syn().window_batches(4, 32, cu_seqlens=None), "cu_seqlens=None", "True or False"),
    ("from_tokens floats", lambda d: mem(np.linspace(0, 5, 12)), "tokens", "integer"),
    ("from_tokens negative", lambda d: mem([3, -1, 2]), "-1", "token ids in [0, vocab_size)"),
    ("from_tokens past vocab", lambda d: mem([3, 12, 2]), "12", "token ids in [0, vocab_size)"),
    ("from_tokens 2-D", lambda d: mem(np.zeros((3, 4), np.uint32)), "shape (3, 4)", "one-dimensional"),
    ("from_tokens empty", lambda d: mem(np.zeros(0, np.uint32)), "tokens", "at least one token"),
    ("from_tokens eot", lambda d: mem(np.arange(5), eot_id=10), "eot_id=10", "below vocab_size"),
    ("from_tokens vocab", lambda d: mem(np.arange(5), eot_id=0, vocab_size=0), "vocab_size=0", "at least 1"),
    ("doc_lengths floats", lambda d: mem(np.arange(10), [4.5, 5.5]), "doc_lengths", "integer"),
    ("doc_lengths sum", lambda d: mem(np.arange(10), [4, 5]), "doc_lengths", "sum to the 10 tokens"),
    ("from_text name", lambda d: TokenDataset.from_text(d / "x.txt", "gpt2"), "tokenizer='gpt2'", "load_tokenizer"),
    ("from_text object", lambda d: TokenDataset.from_text(d / "x.txt", Tok()), "encode_batch", "load_tokenizer"),
    ("split unknown", lambda d: TokenDataset(d, "test"), "split='test'", "split='train'"),
    ("split not str", lambda d: TokenDataset(d, 0), "split=0", "split='train'"),
    ("path int", lambda d: TokenDataset(3), "path=3", "directory"),
    ("max_open_shards 0", lambda d: TokenDataset(d, max_open_shards=0), "max_open_shards=0", "at least 1"),
    ("rss_limit negative", lambda d: TokenDataset(d, rss_limit=-1), "rss_limit=-1", "rss_limit=None"),
    ("rss_limit float", lambda d: TokenDataset(d, rss_limit=1.5e9), "rss_limit=1500000000.0", "rss_limit=1500000000"),
    ("tokens negative start", lambda d: syn().tokens(-1, 5), "start=-1", "[0, 10000)"),
    ("tokens float length", lambda d: syn().tokens(0, 2.5), "length=2.5", "an int"),
    ("resume other seed", lambda d: resume(a_state(), seed=6), "seed=5", "with the saved seed"),
    ("resume no step", lambda d: resume(a_state(step=None)), "'step'", "state_dict()"),
    ("resume str step", lambda d: resume(a_state(step="7")), "step='7'", "state_dict()"),
    ("resume negative step", lambda d: resume(a_state(step=-3)), "step=-3", "state_dict()"),
    ("resume no seed", lambda d: resume(a_state(seed=None)), "'seed'", "state_dict()"),
    ("resume a list", lambda d: syn().random_batches(4, 32).load_state_dict([("step", 3)]), "state=", "dict"),
    ("set_epoch negative", lambda d: syn().window_batches(4, 32).set_epoch(-1), "epoch=-1", "at least 0"),
    ("set_epoch float", lambda d: syn().window_batches(4, 32).set_epoch(1.5), "epoch=1.5", "an int"),
    ("cpu_batch negative", lambda d: syn().random_batches(4, 32).cpu_batch(-1), "step=-1", "at least 0"),
    ("WindowDataset data", lambda d: WindowDataset("train", 32, 32), "data='train'", "TokenDataset"),
    ("ShiftSpec 0", lambda d: sampling.ShiftSpec.parse(0, 32), "shift=0", "shift=1"),
    ("RandomOffsets seq_len", lambda d: sampling.RandomOffsets(1000, 0, SPEC, 0), "seq_len=0", "at least 1"),
    ("WindowOffsets", lambda d: sampling.WindowOffsets(1000, 8, 8, SPEC, 0, 0, True), "global_batch=0", "least 1"),
    ("feistel ids past n", lambda d: sampling.feistel_permute(np.arange(4), 3, key=2), "ids", "pass ids in [0, n)"),
    ("count_windows stride", lambda d: sampling.count_windows(1000, 8, 0, 1), "stride=0", "at least 1"),
    ("counter_block high", lambda d: sampling.counter_block(0, 0, 1, 4, 0), "high", "at least 1"),
]


@pytest.mark.parametrize("build,names,fix", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_misuse_is_one_line_naming_the_argument_and_the_fix(disk, monkeypatch, build, names, fix):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answer on a GPU machine
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ArgumentError) as caught:
        build(disk)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert "\n" not in message and names in message and fix in message, message


@pytest.mark.parametrize("var,value", [("RANK", "abc"), ("WORLD_SIZE", "2.0")])
def test_torchrun_variables_that_are_not_ints(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ArgumentError, match=rf"environment variable {var}='{value}'.*pass {var.lower()}="):
        syn().random_batches(4, 32)


def test_shift_equal_to_seq_len_labels_the_next_block(disk):
    ref = split_tokens(disk, "train")
    data = TokenDataset(disk)
    for b in (next(data.random_batches(4, 16, shift=16, seed=2)), next(data.window_batches(4, 16, shift=16))):
        for r, o in enumerate(b.offsets.tolist()):
            assert b.x[r].tolist() == ref[o : o + 16].tolist() and b.y[r].tolist() == ref[o + 16 : o + 32].tolist()
    grouped = next(data.random_batches(2, 16, shift=16, grouped=True))
    assert grouped.x.shape == (2, 1, 16)


def test_stride_equal_to_seq_len_is_the_default(disk):
    ref = split_tokens(disk, "train")
    data = TokenDataset(disk)
    a, b = data.windows(24, stride=24), data.windows(24)
    assert len(a) == len(b) == (len(ref) - 25) // 24 + 1
    for i in (0, 5, len(a) - 1):
        assert a[i][0].tolist() == b[i][0].tolist() == ref[24 * i : 24 * i + 24].tolist()
    assert data.window_batches(4, 24, stride=24).steps_per_epoch == data.window_batches(4, 24).steps_per_epoch


def test_exactly_one_window_fits(disk):
    """The val split of n tokens holds one window of n - 1 tokens and its shifted labels, no more."""
    ref = split_tokens(disk, "val")
    n = len(ref)
    data = TokenDataset(disk, "val")
    w = data.windows(n - 1)
    assert len(w) == 1 and w[0][0].tolist() == ref[:-1].tolist() and w[0][1].tolist() == ref[1:].tolist()
    stream = data.window_batches(1, n - 1)
    b = next(stream)
    assert stream.steps_per_epoch == 1 and b.offsets.tolist() == [0] and b.y[0].tolist() == ref[1:].tolist()
    assert next(data.random_batches(3, n - 1)).offsets.tolist() == [0, 0, 0]


def test_numpy_ints_and_torch_devices_are_accepted():
    data = TokenDataset.synthetic(np.int64(2000), vocab_size=np.int32(100), doc_len=np.int64(50), seed=np.uint8(1))
    stream = data.random_batches(np.int64(4), np.int32(32), seed=np.int64(3), rank=np.int64(1), world_size=2,
                                 device=torch.device("cpu"), doc_aligned=np.bool_(True))  # fmt: skip
    b = next(stream)
    assert b.x.shape == (4, 32) and stream.global_batch_size == 8
    windows = data.window_batches(np.int64(4), 32, stride=np.int64(8), shift=np.int64(2), seed=np.int64(1))
    assert json.loads(json.dumps(windows.state_dict()))["stride"] == 8  # numpy ints would not serialize
    assert len(data.windows(np.int64(32), stride=np.int16(16), shift=np.int8(2))) == (2000 - 34) // 16 + 1


def test_state_in_hand_resumes_at_the_batch_not_yet_used(disk):
    """A loop that has drawn batch k but not trained on it saves state_dict(in_hand=1): the
    resumed stream's first batch is batch k again, for random, packed and padded streams."""
    ds = TokenDataset(disk)
    builds = [lambda: ds.random_batches(batch_size=2, seq_len=16, seed=4),
              lambda: ds.packed(64, seed=4).batches(batch_size=2),
              lambda: ds.padded_batches(2, 64, seed=4)]  # fmt: skip
    for build in builds:
        stream = build()
        for _ in range(3):
            next(stream)
        in_hand = next(stream)  # the 4th batch, drawn and not used
        state = stream.state_dict(in_hand=1)
        assert state["step"] == 3 == stream.state_dict()["step"] - 1
        again = build()
        again.load_state_dict(state)
        assert torch.equal(next(again)[0], in_hand[0])
        with pytest.raises(ArgumentError, match="in_hand=5, but the stream has handed out only 4 batches"):
            stream.state_dict(in_hand=5)
        with pytest.raises(ArgumentError, match="in_hand=-1 must be at least 0"):
            stream.state_dict(in_hand=-1)


def test_validation_names_the_val_split(disk):
    assert TokenDataset(disk, split="validation").n_tokens == TokenDataset(disk, split="val").n_tokens > 0
    with pytest.raises(ArgumentError, match="'validation', 'valid', 'dev' for 'val'"):
        TokenDataset(disk, split="test")
