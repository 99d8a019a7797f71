"""Device-resident splits (runtime/resident.py) on the CPU: every stream kind over a resident
split gives the host path's batches, step for step, in every encoding; states move between the
two; a split over its budget is refused (resident=True) or falls back (resident="auto") in one
line. The truth is the host path, which the rest of the suite checks against numpy."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from test_encodings import big_sets, gpt2_sets  # noqa: F401  (module fixtures: one corpus in every encoding)
from test_hf_prepare import corpus as big_corpus  # noqa: F401  (needed by big_sets)
from test_hf_tokenizer import big  # noqa: F401  (needed by big_sets)
from test_prepare import jsonl, make_texts

from lmshard.errors import ArgumentError
from lmshard.format.bitpack import bits_for
from lmshard.prepare import PrepareConfig, prepare
from lmshard.runtime import Mixture, TokenDataset
from lmshard.runtime.resident import Resident, resident_bytes
from lmshard.runtime.store import TokenStore

STEPS = 100


def _same(a, b, steps: int = STEPS) -> None:
    """`steps` batches of two streams equal in every field (tensors, arrays and scalars)."""
    for _ in range(steps):
        p, q = next(a), next(b)
        assert list(p.keys()) == list(q.keys())
        assert p.step == q.step and np.array_equal(getattr(p, "offsets", 0), getattr(q, "offsets", 0))
        for field in list(p.keys()):  # (iterating a batch gives x and y, not its keys)
            u, v = p[field], q[field]
            if isinstance(u, torch.Tensor):
                assert u.dtype == v.dtype and u.device == v.device and torch.equal(u, v), field
            else:
                assert np.array_equal(u, v), field


def _pair(**kw):
    host = TokenDataset.synthetic(300_000, vocab_size=50257, doc_len=257, **kw)
    return host, TokenDataset.synthetic(300_000, vocab_size=50257, doc_len=257, **kw).make_resident("cpu")


STREAMS = {
    "random": lambda d: d.random_batches(8, 64, seed=3),
    "random/shift": lambda d: d.random_batches(8, 60, seed=3, shift="random", grouped=False),
    "random/grouped": lambda d: d.random_batches(4, 60, seed=3, shift=3, grouped=True),
    "random/aligned+cu": lambda d: d.random_batches(8, 64, seed=3, doc_aligned=True, cu_seqlens=True),
    "random/steps": lambda d: d.random_batches(8, 64, seed=3, order="steps"),
    "random/schedule": lambda d: d.random_batches(schedule=[(0, 4, 32), (30, 8, 64), (60, 2, 128)], seed=4),
    "windows": lambda d: d.window_batches(16, 128, seed=3),
    "windows/rows": lambda d: d.window_batches(16, 128, seed=3, order="rows", stride=100),
    "windows/schedule": lambda d: d.window_batches(schedule=[(0, 8, 64), (50, 4, 128)], seed=3),
    "packed": lambda d: d.packed(256, seed=1).batches(4),
    "packed/free": lambda d: d.packed(256, seed=1, mask_boundary_labels=True).batches(4, padding_free=True),
    "packed/rows": lambda d: d.packed(200, seed=2, strategy="greedy").batches(schedule=[(0, 2, 200), (40, 6, 200)]),
}


@pytest.mark.parametrize("kind", list(STREAMS))
def test_every_stream_kind_gives_the_host_path_batches(kind):
    host, res = _pair()
    assert res.resident is not None and host.resident is None
    _same(STREAMS[kind](host), STREAMS[kind](res))


def _mixtures():
    a = TokenDataset.synthetic(100_000, vocab_size=50257, doc_len=200, seed=1)
    b = TokenDataset.synthetic(150_000, vocab_size=50257, doc_len=90, seed=2)
    return Mixture({a: 0.3, b: 0.7}), Mixture({a: 0.3, b: 0.7}, device="cpu", resident=True)


MIXED = {
    "random": lambda m: m.random_batches(8, 64, seed=1, cu_seqlens=True),
    "windows": lambda m: m.window_batches(8, 64, seed=1),
    "packed": lambda m: m.packed_batches(4, 128, seed=1),
    "packed/free": lambda m: m.packed_batches(seed=1, padding_free=True, schedule=[(0, 4, 128), (50, 2, 128)]),
}


@pytest.mark.parametrize("kind", list(MIXED))
def test_mixtures_give_the_host_path_batches(kind):
    host, res = _mixtures()
    assert res.resident.n_tokens == 250_000 and res.resident.layout == "uint32"
    _same(MIXED[kind](host), MIXED[kind](res))


def test_a_curriculum_mixture_gives_the_host_path_batches():
    a = TokenDataset.synthetic(100_000, vocab_size=1000, doc_len=200, seed=1)
    b = TokenDataset.synthetic(100_000, vocab_size=1000, doc_len=50, seed=2)
    curriculum = [(0, [0.9, 0.1]), (40_000, [0.2, 0.8])]
    host = Mixture([a, b], curriculum=curriculum)
    res = Mixture([a, b], curriculum=curriculum, device="cpu", resident="auto")
    _same(host.random_batches(8, 64, seed=5), res.random_batches(8, 64, seed=5))


@pytest.mark.parametrize("bits", [1, 5, 13, 16, 17, 24, 31, 32])
def test_take_reads_every_width_as_numpy_does(bits):
    """The device copy in each stored width (the bit stream for widths other than 16 and 32)
    read back at random addresses, against the tokens themselves."""
    rng = np.random.default_rng(bits)
    n = 100_003  # not a multiple of 32: the last word is partial
    tokens = rng.integers(0, 1 << bits, size=n, dtype=np.uint64).astype(np.uint32)
    tokens[:5] = (1 << bits) - 1  # the largest id, every bit set
    store = TokenStore.from_arrays(tokens, np.array([0, n]))
    res = Resident(store, torch.device("cpu"), bits)
    assert res.nbytes == resident_bytes(n, bits)
    at = rng.integers(0, n, size=(3, 7, 500))
    at[0, 0, :5] = [0, 1, n - 1, n - 2, 31]
    got = res.take(torch.from_numpy(at)).numpy()
    want = tokens[at].astype(np.int64) if bits < 32 else tokens[at].view(np.int32).astype(np.int64)
    assert got.dtype == np.int64 and np.array_equal(got, want)


def test_a_chunked_upload_crosses_chunks_and_shards(monkeypatch):
    monkeypatch.setattr("lmshard.runtime.resident.CHUNK", 96)
    tokens = np.random.default_rng(0).integers(0, 1 << 17, size=10_001).astype(np.uint32)
    store = TokenStore.from_arrays(tokens, np.array([0, 10_001]))
    for bits in (17, 32):
        got = Resident(store, torch.device("cpu"), bits).take(torch.arange(10_001)).numpy()
        assert np.array_equal(got, tokens)


@pytest.mark.parametrize("encoding", ["uint16", "packed", "zstd"])
def test_each_stored_encoding_stays_compact_and_gives_the_uint32_batches(gpt2_sets, encoding):  # noqa: F811
    ref = TokenDataset(gpt2_sets["uint32"])
    res = TokenDataset(gpt2_sets[encoding], device="cpu", resident=True)
    assert res.resident.layout == "uint16"  # GPT-2: 16 bits a token however it is stored
    assert res.resident.nbytes == 2 * ref.n_tokens
    for make in (lambda d: d.random_batches(8, 300, seed=5, shift="random"), lambda d: d.window_batches(4, 256),
                 lambda d: d.packed(512).batches(4)):  # fmt: skip
        _same(make(ref), make(res), 20)


def test_a_larger_vocabulary_stays_in_its_bits(big_sets):  # noqa: F811
    ref = TokenDataset(big_sets["uint32"])
    assert int(ref.tokens(0, ref.n_tokens).max()) > 65_535  # ids that need the 17th bit are there
    bits = bits_for(ref.vocab_size)
    for encoding, layout in (("uint32", "uint32"), ("packed", f"packed/{bits}"), ("zstd", "packed/24")):
        res = TokenDataset(big_sets[encoding], device="cpu", resident=True)
        assert res.resident.layout == layout
        _same(ref.random_batches(8, 200, seed=1), res.random_batches(8, 200, seed=1), 30)
        _same(ref.packed(256).batches(2), res.packed(256).batches(2), 10)


def test_a_mixture_of_encodings_takes_the_widest(gpt2_sets):  # noqa: F811
    plain = Mixture([(TokenDataset(gpt2_sets["uint32"]), 0.7), (TokenDataset(gpt2_sets["uint32"], split="val"), 0.3)])
    mixed = Mixture([(TokenDataset(gpt2_sets["zstd"]), 0.7), (TokenDataset(gpt2_sets["uint16"], split="val"), 0.3)],
                    device="cpu", resident=True)  # fmt: skip
    assert mixed.resident.layout == "uint16"
    wide = Mixture([(TokenDataset(gpt2_sets["uint32"]), 0.7), (TokenDataset(gpt2_sets["uint16"], split="val"), 0.3)],
                   device="cpu", resident=True)  # fmt: skip
    assert wide.resident.layout == "uint32"
    _same(plain.random_batches(8, 200, seed=2), mixed.random_batches(8, 200, seed=2), 30)
    _same(plain.random_batches(8, 200, seed=2), wide.random_batches(8, 200, seed=2), 30)


def test_a_load_time_split_is_resident_as_its_side(tmp_path):
    out = tmp_path / "ds"
    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "d.jsonl", make_texts(300, seed=1)))], out=str(out),
                          shard_encoding="uint16", tokens_per_shard=5_000, val_fraction=0, quiet=True))  # fmt: skip
    host = TokenDataset(out, split="val", val_fraction=0.2, split_seed=3)
    res = TokenDataset(out, split="val", val_fraction=0.2, split_seed=3, device="cpu", resident=True)
    assert res.resident.n_tokens == host.n_tokens < TokenDataset(out).n_tokens
    assert res.resident.layout == "uint16"
    _same(host.random_batches(4, 128, seed=1), res.random_batches(4, 128, seed=1), 30)


@pytest.mark.parametrize("kind", ["random", "windows/rows", "packed/rows"])
def test_a_state_saved_on_one_path_resumes_on_the_other(kind):
    host, res = _pair()
    for first, second in ((host, res), (res, host)):
        a = STREAMS[kind](first)
        for _ in range(37):
            next(a)
        state = a.state_dict()
        b = STREAMS[kind](second)
        b.load_state_dict(state)
        assert b.state_dict() == state
        _same(a, b, 30)


def test_over_budget_is_refused_when_forced_and_falls_back_on_auto(gpt2_sets):  # noqa: F811
    with pytest.raises(ArgumentError) as e:
        TokenDataset(gpt2_sets["uint16"], device="cpu", resident=True, resident_budget=1e-12)
    msg = str(e.value)
    assert "\n" not in msg and "resident_budget=1e-12" in msg and "resident='auto'" in msg
    with pytest.warns(UserWarning, match="gathered on the host") as caught:
        auto = TokenDataset(gpt2_sets["uint16"], device="cpu", resident="auto", resident_budget=1e-12)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert auto.resident is None
    _same(TokenDataset(gpt2_sets["uint16"]).random_batches(4, 64), auto.random_batches(4, 64), 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fits = TokenDataset(gpt2_sets["uint16"], device="cpu", resident="auto")
    assert fits.resident is not None


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"resident": "yes", "device": "cpu"}, "resident='yes'"),
        ({"resident": 1, "device": "cpu"}, "resident=1"),
        ({"resident": True}, "needs the device"),
        ({"resident": True, "device": "cpu", "resident_budget": 0}, "resident_budget=0"),
        ({"resident": True, "device": "cpu", "resident_budget": 1.5}, "resident_budget=1.5"),
        ({"resident": True, "device": "tpu"}, "device"),
    ],
)
def test_bad_resident_arguments_are_one_line(gpt2_sets, kw, match):  # noqa: F811
    with pytest.raises(ArgumentError, match=match) as e:
        TokenDataset(gpt2_sets["uint32"], **kw)
    assert "\n" not in str(e.value)


def test_a_stream_on_another_device_or_in_workers_is_refused():
    _, res = _pair()
    assert res.random_batches(2, 16).device == torch.device("cpu")
    elsewhere = TokenDataset.synthetic(1000).make_resident("cpu")
    elsewhere.resident.device = torch.device("cuda", 0)  # (as a copy on a GPU would say)
    for make in (lambda: elsewhere.random_batches(2, 16, device="cpu"), lambda: elsewhere.packed(64).batches(2,
                                                                                                           device="cpu")):
        with pytest.raises(ArgumentError, match="resident on cuda:0; draw its batches there") as e:
            make()
        assert "\n" not in str(e.value)
    stream = res.random_batches(2, 16)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=1)
    with pytest.raises(ArgumentError, match="training process"):
        next(iter(loader))
    packed = torch.utils.data.DataLoader(res.packed(64).batches(2), batch_size=None, num_workers=1)
    with pytest.raises(ArgumentError, match="training process"):
        next(iter(packed))
    # without workers a DataLoader hands the stream's own batches through
    host, _ = _pair()
    _same(iter(host.random_batches(2, 16)), iter(torch.utils.data.DataLoader(res.random_batches(2, 16),
                                                                             batch_size=None)), 5)  # fmt: skip


def test_a_loader_configuration_file_opens_its_data_resident(tmp_path, gpt2_sets):  # noqa: F811
    from lmshard.loadconfig import open_config

    conf = tmp_path / "loader.toml"
    conf.write_text(f'seed = 4\ndataset = "{gpt2_sets["uint16"]}"\n[sample]\nbatch_size = 4\nseq_len = 64\n')
    data, stream = open_config(conf, device="cpu", resident=True)
    assert data.resident is not None and data.resident.layout == "uint16"
    _same(TokenDataset(gpt2_sets["uint16"]).random_batches(4, 64, seed=4), stream, 20)
    conf.write_text(f'[[source]]\npath = "{gpt2_sets["uint16"]}"\nweight = 1\n[sample]\nbatch_size = 2\nseq_len = 32\n')
    mix, _ = open_config(conf, device="cpu", resident="auto")
    assert mix.resident is not None
    assert open_config(conf, device="cpu")[0].resident is None


def test_padded_and_stream_packed_batches_of_a_resident_split_come_from_the_host_path():
    host, res = _pair()
    _same(host.padded_batches(4, 300), res.padded_batches(4, 300), 20)
    a, b = (d.packed(256, strategy="stream", buffer=64).batches(4) for d in (host, res))
    for _ in range(20):
        p, q = next(a), next(b)
        assert all(torch.equal(p[k], q[k]) for k in ("input_ids", "labels", "position_ids", "cu_seqlens"))


@pytest.mark.parametrize("mode", [0.0, 1.0, np.False_, np.True_, "on", None])
def test_only_true_false_and_auto_choose_residence(mode):
    with pytest.raises(ArgumentError, match="pass True") as e:
        TokenDataset.synthetic(1000).make_resident("cpu", mode)
    assert "\n" not in str(e.value)


def test_a_resident_stream_is_never_pickled_into_a_worker():
    import pickle

    _, res = _pair()
    stream = res.random_batches(2, 16)
    for thing in (stream, res, res.packed(64).batches(2)):
        with pytest.raises(ArgumentError, match="iterate it in the training process") as e:
            pickle.dumps(thing)
        assert "\n" not in str(e.value)


def test_the_streams_default_device_is_the_copys_own_spelling():
    data = TokenDataset.synthetic(1000).make_resident(torch.device("cpu"))
    assert data.device == data.resident.device == torch.device("cpu")
    host = TokenDataset.synthetic(1000).make_resident("cpu", False)
    assert host.resident is None and host.random_batches(2, 16).device == torch.device("cpu")


def test_a_mixture_file_and_a_text_stream_config(tmp_path, gpt2_sets):  # noqa: F811
    from lmshard.loadconfig import open_config

    (tmp_path / "mix.toml").write_text(f'[[source]]\npath = "{gpt2_sets["uint16"]}"\nweight = 1\n')
    mix = Mixture.from_file(tmp_path / "mix.toml", device="cpu", resident=True)
    assert mix.resident.layout == "uint16"
    with pytest.raises(ArgumentError, match="takes no seed="):
        Mixture.from_file(tmp_path / "mix.toml", seed=1)
    conf = tmp_path / "stream.toml"
    conf.write_text('[stream]\ninputs = ["a.txt"]\ntokenizer = "gpt2"\n[sample]\nshape = "windows"\nbatch_size = 2\n'
                    "seq_len = 16\n")  # fmt: skip
    with pytest.raises(ArgumentError, match="no split to upload") as e:
        open_config(conf, device="cpu", resident=True)
    assert "\n" not in str(e.value)
