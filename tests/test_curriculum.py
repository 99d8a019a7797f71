"""Curricula: mixture weights that change with the token position. Source A's tokens lie in
[0, 500) and source B's in [500, 998), so each row's source is read off its own tokens, and
the shares are compared with the schedule's integral worked out here by hand."""

from __future__ import annotations

import numpy as np
import pytest

from lmshard.errors import ArgumentError
from lmshard.runtime import Mixture, TokenDataset

EOT, T = 999, 8


def _source(lo: int, hi: int, n: int, seed: int) -> TokenDataset:
    tokens = np.random.default_rng(seed).integers(lo, hi, size=n).astype(np.uint32)
    tokens[49::50] = EOT
    return TokenDataset.from_tokens(tokens, np.full(n // 50, 50), eot_id=EOT, vocab_size=1000)


@pytest.fixture(scope="module")
def pair():
    return _source(0, 500, 50_000, 1), _source(500, 998, 50_000, 2)


CURRICULUM = [(0, [0.9, 0.1]), (1_000_000, [0.3, 0.7])]


def _sources_of(batch) -> list[int]:
    """0 or 1 per row, from the row's tokens (EOT aside, a row holds one source's ids only)."""
    out = []
    for row in batch.x.numpy():
        real = row[row != EOT]
        assert len(real) and ((real < 500).all() or (real >= 500).all())
        out.append(int(real[0] >= 500))
    return out


def test_a_curriculum_is_within_one_row_of_its_integral_in_every_window(pair):
    """(0.9, 0.1) → (0.3, 0.7) over 10^6 tokens (125,000 rows of 8), drawn for 160,000 rows: in
    every window of 1,000 rows, source A's rows are within one row of the integral of its weight."""
    mix = Mixture(list(pair), curriculum=CURRICULUM, max_epochs=100)
    stream = mix.random_batches(128, T, seed=3)
    rows = np.array([s for _ in range(1250) for s in _sources_of(next(stream))])
    tokens_mid = (np.arange(len(rows)) + 0.5) * T  # each row's middle token: its average weight (linear)
    weight_a = 0.9 + (0.3 - 0.9) * np.minimum(tokens_mid / 1_000_000, 1.0)
    target = np.concatenate([[0.0], np.cumsum(weight_a)])
    got = np.concatenate([[0], np.cumsum(rows == 0)])
    window = 1000
    error = (got[window:] - got[:-window]) - (target[window:] - target[:-window])
    # within one row, plus what a 64-row segment's one set of weights leaves of a linear ramp (0.0025 rows here)
    assert np.abs(error).max() <= 1.003
    assert abs(got[-1] - target[-1]) <= 1  # and the whole run
    assert mix.stream_report(stream)[0]["rows"] == got[-1]


def test_a_resumed_curriculum_is_the_uninterrupted_run_at_any_batch_and_world_size(pair):
    mix = Mixture(list(pair), curriculum=CURRICULUM, ramp="step")
    whole = mix.random_batches(32, T, seed=5)
    expected = [o for _ in range(40) for o in next(whole).offsets.tolist()]
    got, state = [], None
    for steps, (batch, world) in zip((7, 11, 9), ((32, 1), (16, 2), (64, 4)), strict=True):
        ranks = [mix.random_batches(batch // world, T, seed=5, rank=r, world_size=world) for r in range(world)]
        for s in ranks:
            if state is not None:
                s.load_state_dict(state)
        for _ in range(steps):
            got += [o for s in ranks for o in next(s).offsets.tolist()]
        state = ranks[0].state_dict()
    assert got == expected[: len(got)] and len(got) == 7 * 32 + 11 * 16 + 9 * 64


def test_step_knots_hold_their_weights(pair):
    mix = Mixture(list(pair), curriculum=[(0, [1, 0]), (8_000, [0.25, 0.75]), (16_000, {"<memory>#2": 1})],
                  ramp="step")  # fmt: skip
    stream = mix.window_batches(100, T, seed=1)
    rows = np.array([s for _ in range(30) for s in _sources_of(next(stream))])  # 3,000 rows: knots at rows 1,000, 2,000
    assert (rows[:1000] == 0).all() and (rows[2000:] == 1).all()
    assert abs(int((rows[1000:2000] == 1).sum()) - 750) <= 1


def test_a_changed_curriculum_or_a_fixed_mixture_state_is_refused(pair):
    mix = Mixture(list(pair), curriculum=CURRICULUM)
    state = mix.random_batches(8, T, seed=1).state_dict()
    other = Mixture(list(pair), curriculum=[(0, [0.9, 0.1]), (2_000_000, [0.3, 0.7])])
    with pytest.raises(ArgumentError, match="cannot resume: saved curriculum="):
        other.random_batches(8, T, seed=1).load_state_dict(state)
    fixed = Mixture({pair[0]: 0.5, pair[1]: 0.5})
    with pytest.raises(ArgumentError, match="cannot resume: saved (mixture|curriculum)="):
        fixed.random_batches(8, T, seed=1).load_state_dict(state)


@pytest.mark.parametrize(("build", "words"), [
    (lambda p: Mixture(list(p), curriculum=[(5, [1, 1])]), "the first knot is at 0"),
    (lambda p: Mixture(list(p), curriculum=[(0, [1, 1]), (0, [1, 2])]), "each next one later"),
    (lambda p: Mixture(list(p), curriculum=[(0, [1, 1, 1])]), "one weight per source (2)"),
    (lambda p: Mixture(list(p), curriculum=[(0, [1, -1])]), "at least 0, not all 0"),
    (lambda p: Mixture(list(p), curriculum=[(0, [0, 0])]), "at least 0, not all 0"),
    (lambda p: Mixture(list(p), curriculum=[(0, {"web": 1})]), "names 'web', not a source"),
    (lambda p: Mixture({p[0]: 1, p[1]: 1}, curriculum=[(0, [1, 1])]), "pass the sources as a list"),
    (lambda p: Mixture(list(p), curriculum=[(0, [1, 1])], ramp="cosine"), "ramp='cosine'"),
    (lambda p: Mixture(list(p), curriculum=[]), "has no knot"),
    (lambda p: Mixture(list(p), curriculum=[(0, [1, 1])]).random_batches(schedule=[(0, 8, 8), (4, 8, 16)]),
     "rows of one seq_len"),
])  # fmt: skip
def test_curriculum_mistakes_are_one_line(pair, build, words):
    with pytest.raises(ArgumentError) as caught:
        build(pair)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_three_sources_are_within_one_row_per_tree_level(pair):
    third = _source(0, 500, 30_000, 7)  # (its rows are told apart by their offsets, not their tokens)
    mix = Mixture([*pair, third], curriculum=[(0, [0.5, 0.3, 0.2]), (200_000, [0.1, 0.1, 0.8]), (400_000, [0, 1, 0])],
                  max_epochs=100)  # fmt: skip
    stream = mix.random_batches(100, T, seed=2)
    source = np.concatenate([mix.locate(next(stream).offsets)[0] for _ in range(600)])
    tokens_mid = (np.arange(len(source)) + 0.5) * T
    knots, weights = np.array([0, 200_000, 400_000]), np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0, 1, 0]])
    for s in range(3):
        target = np.concatenate([[0.0], np.cumsum(np.interp(tokens_mid, knots, weights[:, s]))])
        got = np.concatenate([[0], np.cumsum(source == s)])
        error = (got[1000:] - got[:-1000]) - (target[1000:] - target[:-1000])
        assert np.abs(error).max() <= 2.01  # two levels of the tree: one row each
    assert (source[50_000:] == 1).all()  # past the last knot (row 50,000): only the second source


def test_a_packed_mixture_follows_the_curriculum(pair):
    """Packs of 64 tokens: a step knot at 64,000 tokens is row 1,000; rows before it come from
    source A only, rows from it on from B only (the row's source is read off its tokens)."""
    mix = Mixture(list(pair), curriculum=[(0, [1, 0]), (64_000, [0, 1])], ramp="step", max_epochs=1e9)
    stream = mix.packed_batches(100, 64, seed=1)
    sources = np.concatenate([next(stream)["sources"] for _ in range(20)])
    tokens = [int(b) for b in sources]
    assert tokens[:1000] == [0] * 1000 and tokens[1000:] == [1] * 1000


def test_one_knot_knots_on_the_grid_and_tiny_weights(pair):
    """A curriculum of one knot, knots on exact multiples of 64 rows, and a weight of 1e-7 (drawn at
    its size: no row in 10^6)."""
    from lmshard.runtime.curriculum import Curriculum, CurriculumTree

    assert next(Mixture(list(pair), curriculum=[(0, [0.9, 0.1])]).random_batches(8, T)).x.shape == (8, T)
    on_grid = CurriculumTree(Curriculum([(0, [0.9, 0.1]), (T * 640, [0.5, 0.5])], 2, ramp="step"), T, 0)
    source, _ = on_grid.assign(np.arange(2000))
    assert abs(int((source[:640] == 1).sum()) - 64) <= 1 and abs(int((source[640:] == 1).sum()) - 680) <= 1
    tiny = CurriculumTree(Curriculum([(0, [1 - 1e-7, 1e-7])], 2), T, 0)
    assert tiny.counts(1_000_000)[1] <= 1


def test_a_curriculum_resumed_at_another_seq_len_is_refused(pair):
    mix = Mixture(list(pair), curriculum=CURRICULUM)
    run = mix.random_batches(8, 32, seed=1)
    for _ in range(10):
        next(run)
    with pytest.raises(ArgumentError, match="rows of one seq_len"):
        mix.random_batches(8, 64, seed=1).load_state_dict(run.state_dict())
