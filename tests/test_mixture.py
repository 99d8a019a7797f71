"""Weighted mixtures, checked against the sources' own tokens: source A's tokens lie in
[0, 500) and source B's in [500, 998), so each row's source is read off its tokens."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from test_prepare import jsonl, make_texts

from lmshard.errors import ArgumentError, ConfigError, InputError
from lmshard.prepare import PrepareConfig, prepare
from lmshard.runtime import Mixture, TokenDataset

VOCAB, EOT, T = 1000, 999, 16


def _tokens(lo: int, hi: int, n: int, seed: int) -> np.ndarray:
    tokens = np.random.default_rng(seed).integers(lo, hi, size=n).astype(np.uint32)
    tokens[49::50] = EOT  # documents of 50 tokens
    return tokens


@pytest.fixture(scope="module")
def sources():
    a, b = _tokens(0, 500, 40_000, 1), _tokens(500, 998, 9_000, 2)
    lengths = [np.full(len(t) // 50, 50) for t in (a, b)]
    return (
        a,
        b,
        [TokenDataset.from_tokens(t, n, eot_id=EOT, vocab_size=VOCAB) for t, n in zip((a, b), lengths, strict=False)],
    )


def _source_of(row: np.ndarray) -> int:
    text = row[row != EOT]
    assert (text < 500).all() or (text >= 500).all(), "a row mixes two sources"
    return int(text[0] >= 500)


def test_token_shares_hold_in_every_window_of_1000_rows(sources):
    """0.7 / 0.3 over 20,000 rows: every run of 1,000 consecutive rows has 700 ± 1 from A; each
    row is the source's own tokens at the offset `locate` gives."""
    a, b, data = sources
    mix = Mixture([(data[0], 0.7), (data[1], 0.3)], max_epochs=100)
    assert mix.names == ["<memory>#1", "<memory>#2"]
    stream = mix.random_batches(50, T, seed=4)
    rows, raw = [], (a, b)
    for _ in range(400):
        batch = next(stream)
        src, local = mix.locate(batch.offsets)
        for r in range(50):
            x = batch.x[r].numpy()
            rows.append(_source_of(x))
            assert rows[-1] == src[r]
            o = int(local[r])
            assert x.tolist() == raw[src[r]][o : o + T].tolist()
            assert batch.y[r].tolist() == raw[src[r]][o + 1 : o + T + 1].tolist()
    from_a = np.concatenate([[0], np.cumsum(np.array(rows) == 0)])
    window = from_a[1000:] - from_a[:-1000]
    assert window.min() >= 699 and window.max() <= 701
    report = mix.stream_report(stream)
    assert [r["rows"] for r in report] == [int(from_a[-1]), len(rows) - int(from_a[-1])]
    assert report[1]["epochs"] == pytest.approx(report[1]["rows"] * T / len(b))


def test_three_sources_stay_within_two_rows_of_target(sources):
    _, _, data = sources
    third = TokenDataset.synthetic(20_000, vocab_size=VOCAB, doc_len=50, seed=3)
    mix = Mixture([(data[0], 5), (data[1], 3), (third, 2)])  # weights are normalised
    assert mix.weights == pytest.approx([0.5, 0.3, 0.2])
    stream = mix.window_batches(64, T, stride=T, seed=1)
    src = np.concatenate([mix.locate(next(stream).offsets)[0] for _ in range(200)])
    for s, w in enumerate(mix.weights):
        c = np.concatenate([[0], np.cumsum(src == s)])
        window = c[1000:] - c[:-1000]
        assert abs(window - w * 1000).max() <= 2, s


def test_same_seed_same_stream_and_exact_resume(sources):
    _, _, data = sources
    mix = Mixture([(data[0], 0.7), (data[1], 0.3)])
    one = mix.random_batches(8, T, seed=9, shift="random")
    two = Mixture([(data[0], 0.7), (data[1], 0.3)]).random_batches(8, T, seed=9, shift="random")
    for _ in range(5):
        p, q = next(one), next(two)
        assert torch.equal(p.x, q.x) and p.shift == q.shift
    state = one.state_dict()
    expected = [next(one) for _ in range(3)]
    resumed = Mixture([(data[0], 0.7), (data[1], 0.3)]).random_batches(8, T, seed=9, shift="random")
    resumed.load_state_dict(state)
    assert all(torch.equal(next(resumed).y, e.y) for e in expected)
    other = Mixture([(data[0], 0.6), (data[1], 0.4)]).random_batches(8, T, seed=9, shift="random")
    with pytest.raises(ArgumentError, match="mixture"):
        other.load_state_dict(state)
    assert not torch.equal(next(mix.random_batches(8, T, seed=10)).x, next(mix.random_batches(8, T, seed=9)).x)


def test_ranks_split_the_global_batch_and_workers_change_nothing(sources):
    _, _, data = sources
    mix = Mixture([(data[0], 0.7), (data[1], 0.3)])
    whole = mix.random_batches(8, T, seed=2, world_size=1, rank=0)
    ranks = [mix.random_batches(4, T, seed=2, world_size=2, rank=r) for r in range(2)]
    for _ in range(4):
        full = next(whole).x
        assert torch.equal(torch.cat([next(ranks[0]).x, next(ranks[1]).x]), full)
    plain = mix.random_batches(4, T, seed=6)
    loader = torch.utils.data.DataLoader(mix.random_batches(4, T, seed=6), batch_size=None, num_workers=2)
    for batch, _ in zip(loader, range(6), strict=False):
        assert torch.equal(batch.x, next(plain).x)


def test_windows_visit_every_window_of_a_source_once_per_source_epoch(sources):
    a, b, data = sources
    mix = Mixture([(data[0], 0.5), (data[1], 0.5)])
    stream = mix.window_batches(10, T, stride=20, seed=3)
    n_b = (len(b) - (T + 1)) // 20 + 1
    seen = []
    while len(seen) < 2 * n_b:
        src, local = mix.locate(next(stream).offsets)
        seen.extend(local[src == 1].tolist())
    first, second = seen[:n_b], seen[n_b : 2 * n_b]
    assert sorted(first) == sorted(second) == list(range(0, 20 * n_b, 20))
    assert first != second  # reshuffled for the source's second epoch
    report = mix.stream_report(stream)
    assert report[1]["epochs"] == pytest.approx(report[1]["rows"] / n_b) and report[1]["epochs"] >= 2


def test_report_warns_past_max_epochs(sources):
    _, _, data = sources
    mix = Mixture([(data[0], 0.5), (data[1], 0.5)], max_epochs=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        small = mix.report(steps=10, global_batch_size=8, seq_len=T)
    assert [r["rows"] for r in small] == [40, 40] and small[0]["tokens"] == 40 * T
    with pytest.warns(UserWarning, match="max_epochs=1"):
        big = mix.report(steps=2_000, global_batch_size=8, seq_len=T)
    assert big[1]["epochs"] == pytest.approx(8_000 * T / 9_000)


def test_sources_must_share_the_tokenizer(sources):
    _, _, data = sources
    other = TokenDataset.synthetic(5_000, vocab_size=VOCAB + 1, doc_len=50)
    with pytest.raises(ConfigError, match=r"different vocabularies: <memory> with a vocabulary of 1,000 ids \(in "
                                          r"memory\), <synthetic> with a vocabulary of 1,001 ids"):  # fmt: skip
        Mixture([(data[0], 1), (other, 1)])
    same_size = TokenDataset.synthetic(5_000, vocab_size=VOCAB, doc_len=50)  # its EOT is 999 too: no difference
    Mixture([(data[0], 1), (same_size, 1)])
    other_eot = TokenDataset.from_tokens(np.full(100, 5, dtype=np.uint32), eot_id=998, vocab_size=VOCAB, name="e")
    with pytest.raises(ConfigError, match=r"sources <memory> and e share a vocabulary but differ in the end-of-text "
                                          r"id \(999 vs 998\); prepare every source with the same tokenizer and "
                                          r"--separator"):  # fmt: skip
        Mixture([(data[0], 1), (other_eot, 1)])
    for bad in (0, -1, float("nan"), "0.5", True):
        with pytest.raises(ArgumentError, match="weight"):
            Mixture([(data[0], 1), (data[1], bad)])
    with pytest.raises(ArgumentError, match="at least one source"):
        Mixture({})
    with pytest.raises(ArgumentError, match="take no doc_aligned"):
        Mixture([(data[0], 1), (data[1], 1)]).random_batches(4, T, doc_aligned=True)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mix")
    for name, seed, backend in (("web", 1, "auto"), ("code", 2, "auto"), ("plain", 3, "tiktoken")):
        prepare(PrepareConfig(inputs=[str(jsonl(tmp / f"{name}.jsonl", make_texts(300, seed=seed)))],
                              out=str(tmp / name), workers=1, val_fraction=0.0, tokens_per_shard=3000,
                              tokenizer_backend=backend))  # fmt: skip
    return tmp


def test_a_toml_file_names_prepared_datasets(prepared):
    (prepared / "mix.toml").write_text('max_epochs = 100\n[[source]]\npath = "web"\nweight = 0.75\n'
                                       '[[source]]\npath = "code"\nweight = 0.25\n')  # fmt: skip
    mix = Mixture.from_file(prepared / "mix.toml")
    assert mix.weights == [0.75, 0.25] and mix.max_epochs == 100
    raw = [np.concatenate([np.fromfile(f, dtype="<u4") for f in sorted((prepared / n / "train").glob("*.bin"))])
           for n in ("web", "code")]  # fmt: skip
    assert all(len(list((prepared / n / "train").glob("*.bin"))) > 3 for n in ("web", "code"))
    edges = [np.cumsum([f.stat().st_size // 4 for f in sorted((prepared / n / "train").glob("*.bin"))])
             for n in ("web", "code")]  # fmt: skip
    stream, crossing = mix.random_batches(8, 200, seed=1, cu_seqlens=True), 0
    for _ in range(40):  # rows inside one shard come from one gather, rows across shards are read
        batch = next(stream)
        src, local = mix.locate(batch.offsets)
        for r in range(8):
            o = int(local[r])
            assert batch.x[r].tolist() == raw[src[r]][o : o + 200].tolist()
            crossing += bool(
                np.searchsorted(edges[src[r]], o, side="right") != np.searchsorted(edges[src[r]], o + 199, side="right")
            )
    assert crossing > 0  # both paths ran: rows inside one shard (one gather) and across shards (read)
    (prepared / "bad.toml").write_text("[[source]]\nweight = 1\n")
    with pytest.raises(InputError, match="bad.toml: source 1 needs a path"):
        Mixture.from_file(prepared / "bad.toml")
    (prepared / "broken.toml").write_text("[[source\n")
    with pytest.raises(InputError, match="broken.toml: cannot read"):
        Mixture.from_file(prepared / "broken.toml")


def test_packed_mixture_rows_are_the_sources_packs(sources):
    """Each row is its source's pack (input_ids, labels, position_ids as the source's own
    PackedDataset gives them), each source's packs are all used once per source epoch, the
    shares hold per 1,000 rows, and a resumed stream continues exactly."""
    _, _, data = sources
    mix = Mixture([(data[0], 0.7), (data[1], 0.3)], max_epochs=100)
    stream = mix.packed_batches(10, 120, seed=3)
    own = [d.packed(120, seed=3) for d in data]
    seen: list[list[int]] = [[], []]
    src_rows = []
    for _ in range(150):
        batch = next(stream)
        src_rows.extend(batch["sources"].tolist())
        assert batch["cu_seqlens"][-1] == 10 * 120
        for r, (s, p) in enumerate(zip(batch["sources"].tolist(), batch["packs"].tolist(), strict=True)):
            seen[s].append(p)
            ref = own[s].pack(p)
            for key in ("input_ids", "labels", "position_ids"):
                assert torch.equal(batch[key][r], ref[key]), key
    n_b = len(own[1])
    assert sorted(seen[1][:n_b]) == list(range(n_b)) and sorted(seen[1][n_b : 2 * n_b]) == list(range(n_b))
    c = np.concatenate([[0], np.cumsum(np.array(src_rows) == 0)])
    assert abs((c[1000:] - c[:-1000]) - 700).max() <= 1
    report = mix.stream_report(stream)
    assert report[1]["rows"] == len(seen[1]) and report[1]["epochs"] == pytest.approx(len(seen[1]) / n_b)
    state = stream.state_dict()
    expected = next(stream)
    again = mix.packed_batches(10, 120, seed=3)
    again.load_state_dict(state)
    assert torch.equal(next(again)["labels"], expected["labels"])
    with pytest.raises(ArgumentError, match="mixture"):
        Mixture([(data[0], 0.5), (data[1], 0.5)]).packed_batches(10, 120, seed=3).load_state_dict(state)
    free = next(mix.packed_batches(10, 120, seed=3, padding_free=True))
    assert free["input_ids"].shape == (1, int(expected_lengths(mix, 3).sum()))


def expected_lengths(mix, seed):
    """Real tokens of the first batch's rows, from each source's own plan."""
    batch = next(mix.packed_batches(10, 120, seed=seed))
    own = [d.packed(120, seed=seed) for d in mix.datasets]
    return np.array([own[s].pack(p)["length"] for s, p in zip(batch["sources"], batch["packs"], strict=True)])


def test_the_example_script_trains_on_a_mixture_file_and_logs_the_shares(prepared):
    (prepared / "two.toml").write_text('[[source]]\npath = "web"\nweight = 0.8\n[[source]]\npath = "code"\n'
                                       "weight = 0.2\n")  # fmt: skip
    script = Path(__file__).resolve().parents[1] / "scripts" / "train_tiny_gpt.py"
    args = ["--mixture", str(prepared / "two.toml"), "--steps", "20", "--log-every", "10", "--batch-size", "5"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, str(script), *args, "--seq-len", "16"], capture_output=True, text=True,
                         timeout=300, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr
    last = [line for line in run.stdout.splitlines() if line.startswith("step")][-1]
    assert last.startswith("step    19") and "web=0.800/0.800" in last and "code=0.200/0.200" in last, last


def test_prepared_sources_resume_by_content_not_by_spelling(prepared):
    """The same datasets named by other paths resume the run; the encoder backend is not part of
    the tokenizer identity (it never changes the tokens)."""
    mix = Mixture({str(prepared / "web"): 0.5, str(prepared / "plain"): 0.5})
    stream = mix.random_batches(4, 32, seed=2)
    next(stream)
    state = stream.state_dict()
    expected = next(stream)
    other = Mixture({str(prepared / "code" / ".." / "web") + "/": 0.5, prepared / "plain": 0.5})
    again = other.random_batches(4, 32, seed=2)
    again.load_state_dict(state)
    assert torch.equal(next(again).x, expected.x)
    swapped = Mixture({str(prepared / "code"): 0.5, str(prepared / "plain"): 0.5}).random_batches(4, 32, seed=2)
    with pytest.raises(ArgumentError, match="mixture"):
        swapped.load_state_dict(state)


def test_an_unaligned_in_memory_source_reads_right(sources):
    a, b, data = sources
    raw = np.zeros(len(b) * 4 + 2, dtype=np.uint8)
    raw[2:] = b.view(np.uint8)
    odd = TokenDataset.from_tokens(np.frombuffer(raw.data, dtype=np.uint32, offset=2), eot_id=EOT, vocab_size=VOCAB)
    mix = Mixture([(data[0], 0.5), (odd, 0.5)])
    batch = next(mix.random_batches(16, T, seed=1))
    src, local = mix.locate(batch.offsets)
    for r in range(16):
        assert batch.x[r].tolist() == (a, b)[src[r]][local[r] : local[r] + T].tolist()


def test_a_tiny_weight_gets_its_share(sources):
    _, _, data = sources
    mix = Mixture([(data[0], 1 - 1e-7), (data[1], 1e-7)], max_epochs=1e9)
    rows = mix.report(steps=1_000_000, global_batch_size=512, seq_len=T)[1]["rows"]
    assert abs(rows - 512e6 * 1e-7) <= 1


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda d: Mixture(None), "not a mapping"),
        (lambda d: Mixture("data/web"), "not a mapping"),
        (lambda d: Mixture([d[0], d[1]]), "not a \\(source, weight\\) pair"),
        (lambda d: Mixture([(d[0], 10**400), (d[1], 1)]), "finite number above 0"),
        (lambda d: Mixture([(d[0], 1), (d[1], 1)], max_epochs=float("nan")), "max_epochs=nan"),
        (lambda d: Mixture([(d[0], 1), (d[1], 1)]).report(10, 4, 20_000, stride=8), "lower seq_len"),
        (lambda d: Mixture([(d[0], 1), (d[1], 1)]).report(10, 4, T, per_epoch=[3]), "per_epoch"),
        (lambda d: Mixture([(d[0], 1), (d[1], 1)]).packed_batches(4, 64, foo=1), "takes no foo"),
        (lambda d: Mixture([(d[0], 1), (d[1], 1)]).locate(np.array([-1])), "not addresses"),
    ],
)
def test_misuse_is_one_line(sources, make, match):
    with pytest.raises(ArgumentError, match=match):
        make(sources[2])


def test_numpy_numbers_are_weights(sources):
    mix = Mixture([(sources[2][0], np.int64(3)), (sources[2][1], np.float32(1))], max_epochs=np.int64(4))
    assert mix.weights == pytest.approx([0.75, 0.25]) and mix.max_epochs == 4


def test_a_toml_file_with_a_typo_is_refused(prepared):
    (prepared / "typo.toml").write_text('[[source]]\npath = "web"\nwieght = 1\n')
    with pytest.raises(InputError, match="unknown key 'source.wieght'"):
        Mixture.from_file(prepared / "typo.toml")
