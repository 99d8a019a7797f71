"""Keyed integers: pure functions of (seed, counter) with no state to carry, and a keyed
bijection of [0, n) for shuffles that hold no permutation.

Memory model: none beyond the arrays they return (and a cache of a few hundred seeds' keys).
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import ArgumentError
from . import checks


def step_rng(seed: int, step: int, salt: int = 0) -> np.random.Generator:
    """An independent generator for every (seed, step): no state to carry between steps."""
    return np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, step, salt])


_GOLDEN = 0x9E3779B97F4A7C15
_M64 = (1 << 64) - 1


def _splitmix(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def counter_block(seed: int, first_step: int, steps: int, count: int, high: np.ndarray | int) -> np.ndarray:
    """[steps, count] integers: row j is `count` integers in [0, high[j]) for step first_step + j,
    a pure function of (seed, step): splitmix64 over a counter. Drawing many steps in one call
    spreads numpy's fixed per-call cost (~10 us) over them. The modulo bias is below high / 2**64."""
    if int(np.min(high)) < 1:  # a modulo by 0 would give zeros (and a warning), not an error
        raise ArgumentError(f"high={checks.show(high)} must be at least 1 everywhere; pass high >= 1")
    with np.errstate(over="ignore"):
        z = np.uint64(seed * _GOLDEN & _M64) + np.arange(first_step, first_step + steps, dtype=np.uint64)
        base = _splitmix(z)  # one independent stream per step
        counter = np.arange(1, count + 1, dtype=np.uint64) * np.uint64(_GOLDEN) + base[:, None]
    high = np.asarray(high, dtype=np.uint64).reshape(-1, 1)
    return (_splitmix(counter) % high).astype(np.int64)


@functools.lru_cache(maxsize=256)
def _seed_base(seed: int) -> int:
    with np.errstate(over="ignore"):
        return int(_splitmix(np.asarray([seed * _GOLDEN & _M64], dtype=np.uint64))[0])


def keyed_ints(seed: int, ids: np.ndarray, high: np.ndarray | int) -> np.ndarray:
    """An integer in [0, high) for each id: a pure function of (seed, id), like `counter_block`
    but for arbitrary ids (a mixture's rows of one source are not consecutive)."""
    if int(np.min(high)) < 1:
        raise ArgumentError(f"high={checks.show(high)} must be at least 1 everywhere; pass high >= 1")
    with np.errstate(over="ignore"):
        z = np.asarray(ids, dtype=np.uint64) * np.uint64(_GOLDEN) + np.uint64(_seed_base(seed))
    return (_splitmix(z) % np.asarray(high, dtype=np.uint64)).astype(np.int64)


def counter_ints(seed: int, step: int, count: int, high: int) -> np.ndarray:
    """`count` integers in [0, high) for one step: row 0 of `counter_block`."""
    return counter_block(seed, step, 1, count, high)[0]


def _round(x: np.ndarray, key: int, mask: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (x ^ np.uint64(key)) * np.uint64(0x9E3779B97F4A7C15)
        z ^= z >> np.uint64(29)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        return (z ^ (z >> np.uint64(32))) & np.uint64(mask)


@functools.lru_cache(maxsize=64)
def _round_keys(key: int, rounds: int) -> tuple[int, ...]:
    return tuple(int(k) for k in step_rng(key, rounds, 1).integers(0, 2**63, size=rounds))


def feistel_permute(ids: np.ndarray, n: int, key: int, rounds: int = 4) -> np.ndarray:
    """A keyed bijection of [0, n): a balanced Feistel network on the next even power of two,
    with cycle walking to stay below n. `ids` must lie in [0, n): any other id would walk forever
    or land on an id already taken."""
    n, rounds = checks.positive("n", n), checks.positive("rounds", rounds)
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= n):
        raise ArgumentError(f"ids span [{int(ids.min())}, {int(ids.max())}], outside [0, n) = [0, {n}); "
                            "pass ids in [0, n)")  # fmt: skip
    half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
    mask = (1 << half) - 1
    keys = _round_keys(key, rounds)
    x = ids.astype(np.uint64)
    pending = np.ones(len(x), dtype=bool)
    while pending.any():
        v = x[pending]
        left, right = v >> np.uint64(half), v & np.uint64(mask)
        for k in keys:
            left, right = right, left ^ _round(right, k, mask)
        v = (left << np.uint64(half)) | right
        x[pending] = v
        pending[pending] = v >= np.uint64(n)
    return x.astype(np.int64)
