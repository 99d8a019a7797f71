"""MinHash signatures and LSH bands against exact Jaccard similarity, computed here from the
documents' word 5-gram sets with Python sets, on planted near-duplicates of known similarity."""

from __future__ import annotations

import random

import numpy as np
import pytest

from lmshard.quality.minhash import MinHashConfig, band_keys, normalize, shingles, signature

WORDS = sorted({"".join(random.Random(i).choices("abcdefghijklmnopqrstuvwxyz", k=7)) for i in range(50_000)})
# (lowercase letters: normalize leaves them as they are; repeats in a document are rare)


def _jaccard(a: list[str], b: list[str], n: int = 5) -> float:
    sa = {tuple(a[i : i + n]) for i in range(len(a) - n + 1)}
    sb = {tuple(b[i : i + n]) for i in range(len(b) - n + 1)}
    return len(sa & sb) / len(sa | sb)


def _pairs(count: int, lo: float, hi: float, seed: int) -> list[tuple[str, str, float]]:
    """Pairs of 200-word documents whose exact 5-gram Jaccard similarity lies in [lo, hi]: the
    copy has a share of its words replaced at random places (drawn until the pair lands in range)."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        base = rng.sample(WORDS, 200)
        copy = list(base)
        share = rng.uniform(0.0, 0.25)
        for i in rng.sample(range(200), int(share * 200)):
            copy[i] = rng.choice(WORDS)
        j = _jaccard(base, copy)
        if lo <= j <= hi:
            out.append((" ".join(base), " ".join(copy), j))
    return out


def _collide(a: str, b: str, config: MinHashConfig) -> bool:
    keys = band_keys(np.stack([signature(a, config), signature(b, config)]), config)
    return bool((keys[0] == keys[1]).any())


def test_signature_agreement_estimates_jaccard():
    config = MinHashConfig()
    errors = []
    for a, b, j in _pairs(150, 0.0, 1.0, seed=1):
        agree = float((signature(a, config) == signature(b, config)).mean())
        errors.append(agree - j)
    errors_arr = np.array(errors)
    # unbiased, with the spread of a mean of 110 coin flips (sd <= 0.048)
    assert abs(errors_arr.mean()) < 0.015 and errors_arr.std() < 0.06


@pytest.mark.parametrize(("lo", "hi"), [(0.8, 1.0), (0.0, 0.5), (0.6, 0.7)])
def test_band_collisions_follow_the_s_curve(lo, hi):
    """Observed candidate rate within 4 standard deviations of the S-curve's prediction (the
    check of candidates that makes them near-duplicates: test_near.py)."""
    config = MinHashConfig()
    pairs = _pairs(600, lo, hi, seed=int(lo * 10) + 2)
    hits = np.array([_collide(a, b, config) for a, b, _ in pairs])
    expected = np.array([config.collision_probability(j) for _, _, j in pairs])
    sd = np.sqrt((expected * (1 - expected)).sum())
    assert abs(hits.sum() - expected.sum()) <= 4 * sd + 1, (hits.sum(), expected.sum())
    if lo >= 0.8:
        assert hits.mean() >= 0.99


def test_normalize_and_shingles():
    assert normalize("Héllo,  WORLD!\n It's 2024_") == "hello world it s 0000"
    assert np.array_equal(shingles("A b c d e f", 5), shingles("a, b; c d E  F!", 5))
    assert len(shingles("a b c d e f", 5)) == 2 and len(shingles("a b", 5)) == 1 and len(shingles("  ", 5)) == 0
    assert not np.array_equal(shingles("a b c d e", 5), shingles("e d c b a", 5))  # word order counts
    empty = signature("")
    assert empty.dtype == np.uint32 and (empty == np.iinfo(np.uint32).max).all()
    with pytest.raises(ValueError):
        MinHashConfig(bands=0)
