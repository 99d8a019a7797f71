"""Bit-packed tokens: every width from 1 to 32 bits round-trips, and any range decodes on its own
to the same ids (the truth: the ids themselves, and a bit-by-bit packing written here)."""

from __future__ import annotations

import numpy as np
import pytest

from lmshard.format import bitpack


def _reference(tokens: np.ndarray, bits: int) -> bytes:
    """Bit i·bits + j of the stream is bit j of token i, least significant first: one bit at a time."""
    out = bytearray(bitpack.packed_nbytes(len(tokens), bits))
    for i, t in enumerate(tokens.tolist()):
        for j in range(bits):
            if t >> j & 1:
                p = i * bits + j
                out[p // 8] |= 1 << (p % 8)
    return bytes(out)


@pytest.mark.parametrize("bits", [1, 3, 7, 8, 9, 15, 16, 17, 18, 24, 31, 32])
def test_every_width_round_trips_and_any_range_decodes_alone(bits):
    rng = np.random.default_rng(bits)
    tokens = rng.integers(0, 1 << bits, size=1000, dtype=np.uint64).astype(np.uint32)
    packed = bitpack.pack(tokens, bits)
    assert bytes(packed) == _reference(tokens, bits)
    assert np.array_equal(bitpack.unpack(packed, bits, 0, len(tokens)), tokens)
    for _ in range(50):
        a = int(rng.integers(0, 1000))
        n = int(rng.integers(0, 1000 - a + 1))
        assert np.array_equal(bitpack.unpack(bytes(packed), bits, a, n), tokens[a : a + n]), (a, n)


def test_chunks_meet_on_byte_edges(monkeypatch):
    monkeypatch.setattr(bitpack, "CHUNK", 24)
    tokens = np.arange(100, dtype=np.uint32) * 1237 % 131072
    assert bytes(bitpack.pack(tokens, 17)) == _reference(tokens, 17)


def test_widths_and_refusals():
    assert [bitpack.bits_for(n) for n in (2, 50257, 65536, 65537, 128256, 1 << 32)] == [1, 16, 16, 17, 17, 32]
    assert bitpack.packed_nbytes(10, 17) == 22
    with pytest.raises(ValueError, match="does not fit in 16 bits"):
        bitpack.pack(np.array([65536], dtype=np.uint32), 16)
