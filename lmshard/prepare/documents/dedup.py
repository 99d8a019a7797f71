"""Exact deduplication: a numpy open-addressing hash set of 64-bit document keys.

Why 64 bits (xxh3-64): by the birthday bound, n keys collide about n²/2⁶⁵ times: 0.03 expected
false duplicates at 10⁹ documents, 2.7 at 10¹⁰. A collision drops one unique document and is
counted like any duplicate; xxh3-128 would double memory for a risk that only appears at 10¹⁰
documents, past what one prepare run holds. Key 0 is the empty-slot marker, so a key of 0 is
stored as 1 (one more collision in 2⁶⁴).

Memory model: one uint64 per slot, power-of-two capacity, grown ×2 once 75% full: 10.7 to 21.3
bytes per unique key, 16 on average, plus a transient copy during growth. The surviving copy
of a duplicate is always the first one offered, so the result does not depend on timing.
"""

from __future__ import annotations

import numpy as np

_MAX_LOAD = 0.75
_M64 = (1 << 64) - 1


class KeySet:
    """A set of uint64 keys with a vectorised `add_new` that reports first occurrences."""

    def __init__(self, capacity: int = 1 << 16) -> None:
        self._table = np.zeros(1 << max(4, (capacity - 1).bit_length()), dtype=np.uint64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        return int(self._table.nbytes)

    def add_new(self, keys: np.ndarray) -> np.ndarray:
        """Insert `keys` in order; return a bool mask, True where a key was not seen before
        (neither earlier in this call nor in any earlier call)."""
        keys = np.where(keys == 0, np.uint64(1), keys.astype(np.uint64, copy=False))
        first = np.zeros(len(keys), dtype=bool)
        if len(keys) == 0:
            return first
        uniq, first_pos = np.unique(keys, return_index=True)  # first occurrence within the call
        self._reserve(self._size + len(uniq))
        inserted = self._insert_unique(uniq)
        first[first_pos[inserted]] = True
        return first

    def _reserve(self, n: int) -> None:
        if n <= _MAX_LOAD * len(self._table):
            return
        capacity = len(self._table)
        while n > _MAX_LOAD * capacity:
            capacity *= 2
        old = self._table[self._table != 0]
        self._table = np.zeros(capacity, dtype=np.uint64)
        self._size = 0
        self._insert_unique(old)

    def _insert_unique(self, keys: np.ndarray) -> np.ndarray:
        """Linear probing, all keys in lock-step; keys are distinct. Returns the 'was new' mask."""
        mask = np.uint64(len(self._table) - 1)
        slot = _mix(keys) & mask
        new = np.zeros(len(keys), dtype=bool)
        pending = np.arange(len(keys))
        table = self._table
        while len(pending):
            k, s = keys[pending], slot[pending]
            current = table[s]
            found = current == k
            empty = current == 0
            # Claim empty slots; where several keys claim one slot, the last write wins and the
            # others see a foreign key on read-back and probe on.
            table[s[empty]] = k[empty]
            won = empty & (table[s] == k)
            new[pending[won]] = True
            done = found | won
            pending = pending[~done]
            slot[pending] = (slot[pending] + np.uint64(1)) & mask
        self._size += int(new.sum())
        return new


def _mix(keys: np.ndarray) -> np.ndarray:
    """A cheap bijective scramble (splitmix64 finaliser) so probe positions use all key bits."""
    with np.errstate(over="ignore"):
        z = keys ^ (keys >> np.uint64(30))
        z = z * np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z = z * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform_from_keys(keys: np.ndarray, seed: int) -> np.ndarray:
    """Map document keys to floats in [0, 1), reproducibly for a given seed (used for the
    train/val split: identical documents always land in the same split). Any Python int is a
    seed: it is taken modulo 2**64, as the runtime's seeds are (a negative one overflowed uint64)."""
    mixed = _mix(keys.astype(np.uint64) ^ _mix(np.array([seed & _M64], dtype=np.uint64))[0])
    return (mixed >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
