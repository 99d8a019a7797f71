"""A dataset held in memory (`TokenDataset.from_tokens`): its arguments checked and made a store.

Memory model: one uint32 copy of the tokens (none if they are contiguous uint32 already) and an
offset per document (8 bytes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ArgumentError
from . import checks
from .store import TokenStore


def in_memory(tokens: Any, doc_lengths: Any, eot_id: Any, vocab_size: Any) -> tuple[Any, int, int]:
    """(store, eot_id, vocab_size) of `TokenDataset.from_tokens`'s arguments, checked: the
    tokens as one contiguous uint32 copy (none if they are one already) and their index."""
    vocab_size = checks.integer("vocab_size", vocab_size, low=1, high=2**32)
    eot_id = checks.integer("eot_id", eot_id, low=0, high=vocab_size - 1,
                            fix=f"pass an eot_id below vocab_size={vocab_size}")  # fmt: skip
    tokens = checks.ids("tokens", tokens, one=True)
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab_size:
        raise ArgumentError(f"tokens holds {lo if lo < 0 else hi}; pass token ids in [0, vocab_size) = "
                            f"[0, {vocab_size})")  # fmt: skip
    tokens = np.ascontiguousarray(tokens, dtype=np.uint32)
    lengths = np.array([len(tokens)]) if doc_lengths is None else checks.ids("doc_lengths", doc_lengths)
    if int(lengths.sum()) != len(tokens) or (lengths <= 0).any():
        raise ArgumentError(f"doc_lengths must be positive and sum to the {len(tokens)} tokens (they sum to "
                            f"{int(lengths.sum())}); pass one length per document, EOTs included")  # fmt: skip
    index = np.concatenate([[0], np.cumsum(lengths.astype(np.int64))])
    return TokenStore.from_arrays(tokens, index), eot_id, vocab_size
