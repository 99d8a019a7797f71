"""Tokens stored in ⌈log2 n_vocab⌉ bits each, read back at any position without decoding what
lies before it: token i occupies bits [i·b, (i+1)·b) of the byte stream, least significant bit
first (17 bits per token for Llama 3's 128,256 ids, against 32 for uint32).

Because every token takes the same number of bits, a range of tokens is found by arithmetic,
with no index: `unpack(data, bits, start, count)` reads only the bytes that range covers.

Memory model: `pack` works in chunks of CHUNK tokens (about 32 bytes of scratch per token of a
chunk); `unpack` about 32 bytes of scratch per token it returns.
"""

from __future__ import annotations

import numpy as np

CHUNK = 1 << 20  # tokens packed at a time; a multiple of 8, so each chunk starts on a byte


def bits_for(n_vocab: int) -> int:
    """Bits per token for ids 0 .. n_vocab - 1 (at least 1)."""
    return max(1, int(n_vocab - 1).bit_length())


def packed_nbytes(n_tokens: int, bits: int) -> int:
    return (n_tokens * bits + 7) // 8


def pack(tokens: np.ndarray, bits: int) -> np.ndarray:
    """`tokens` (each < 2**bits) as packed bytes (uint8), `packed_nbytes(len(tokens), bits)` of them."""
    if not 1 <= bits <= 32:
        raise ValueError(f"bits={bits}: pass 1 to 32")
    tokens = np.ascontiguousarray(tokens, dtype="<u4")
    if len(tokens) and bits < 32 and int(tokens.max()) >> bits:
        raise ValueError(f"a token id of {int(tokens.max())} does not fit in {bits} bits")
    out = np.empty(packed_nbytes(len(tokens), bits), dtype=np.uint8)
    for a in range(0, len(tokens), CHUNK):  # CHUNK·bits is a multiple of 8: chunks meet on byte edges
        part = tokens[a : a + CHUNK]
        planes = np.unpackbits(part.view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")[:, :bits]
        packed = np.packbits(planes.reshape(-1), bitorder="little")
        out[a * bits // 8 : a * bits // 8 + len(packed)] = packed
    return out


def unpack(data: np.ndarray | bytes | memoryview, bits: int, start: int, count: int) -> np.ndarray:
    """Tokens start .. start + count - 1 (uint32) of a packed stream, reading only their bytes."""
    return unpack_bits(data, bits, start * bits, count)


def unpack_bits(data: np.ndarray | bytes | memoryview, bits: int, first: int, count: int) -> np.ndarray:
    """`count` tokens (uint32) of `bits` bits each, the first starting at bit `first` of `data`."""
    if count <= 0:
        return np.zeros(0, dtype=np.uint32)
    last = first + count * bits  # bit range
    raw = np.frombuffer(data, dtype=np.uint8)[first // 8 : (last + 7) // 8]
    stream = np.unpackbits(raw, bitorder="little")[first % 8 : first % 8 + count * bits]
    planes = np.zeros((count, 32), dtype=np.uint8)
    planes[:, :bits] = stream.reshape(count, bits)
    return np.packbits(planes, axis=1, bitorder="little").view("<u4").reshape(count).astype(np.uint32)
