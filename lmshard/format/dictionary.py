"""zstd dictionaries for a dataset's frames (format version 3): trained from a sample of its
tokens, the same bytes for the same sample on any machine.

A frame of a few thousand tokens is too short for zstd to learn a vocabulary's statistics from,
so each one is compressed with a dictionary trained once per dataset: the frames of a sample
cut as the shards' frames are cut (`encoding.block_tokens` tokens of `encoding.width` bytes),
trained by zstd's COVER algorithm with fixed parameters in one thread (deterministic: no
parameter search, no race). The dictionary is `DICT_BYTES`, or smaller for a small sample
(at least `SAMPLE_RATIO` sample bytes per dictionary byte); a sample too small for one gives
none, and the frames are compressed without.

Memory model: the sample's frames (at most a few MiB) and the dictionary.
"""

from __future__ import annotations

import numpy as np

from .encoding import Encoding, _zstd

DICT_BYTES = 64 << 10  # measured: 64 KiB is within 0.5% of 112 KiB on the corpus, and half the metadata
SAMPLE_RATIO = 16  # sample bytes per dictionary byte: a smaller sample trains a smaller dictionary
MIN_DICT_BYTES = 4 << 10  # below this (a sample under 64 KiB), no dictionary
SAMPLE_TOKENS = 1 << 19  # a sample's tokens (1 MiB of frames for GPT-2: 16 sample bytes per dictionary byte)
SPREAD_POINTS = 16  # a sample of a token stream: this many runs at evenly spaced offsets


def train(tokens: np.ndarray, encoding: Encoding) -> bytes | None:
    """The dictionary for `encoding`'s frames trained on `tokens` (cut into frames as a shard
    is), or None when the sample is too small for one."""
    every = encoding.block_tokens
    frames = [encoding.narrow(tokens[i : i + every]) for i in range(0, len(tokens), every)]
    size = min(DICT_BYTES, sum(map(len, frames)) // SAMPLE_RATIO // 1024 * 1024)
    if size < MIN_DICT_BYTES or len(frames) < 8:
        return None
    zstandard = _zstd()
    try:
        trained = zstandard.train_dictionary(size, frames, k=256, d=8, level=encoding.level, threads=1)
    except zstandard.ZstdError:  # (a sample COVER finds nothing to keep in: all alike, say)
        return None
    return bytes(trained.as_bytes())


def spread(total: int, points: int = SPREAD_POINTS, tokens: int = SAMPLE_TOKENS) -> list[tuple[int, int]]:
    """(offset, count) of `points` runs of `tokens // points` tokens at evenly spaced offsets
    of a stream of `total` tokens (the whole stream when it is short)."""
    each = tokens // points
    if total <= tokens:
        return [(0, total)] if total else []
    return [(j * (total - each) // (points - 1), each) for j in range(points)]
