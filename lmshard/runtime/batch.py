"""One batch, and what a batch stream reads rows through.

Memory model: a batch holds its tensors and its rows' offsets; nothing else.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from .hfconvention import hf_fields


class RowStore(Protocol):
    """What a batch stream reads rows through: a `TokenStore`, or a mixture's `MixedStore`."""

    n_tokens: int

    def gather(self, offsets: np.ndarray, length: int, scratch: np.ndarray | None = None,
               key: Any = None) -> np.ndarray: ...  # fmt: skip

    def read_rows(self, offsets: np.ndarray, out: np.ndarray, key: Any = None) -> None: ...

    def doc_starts_in(self, lo: int, hi: int) -> np.ndarray: ...

    def announce(self, key: Any, parts: list[tuple[np.ndarray, np.ndarray | int]]) -> None: ...

    def release(self, key: Any) -> None: ...

    def release_owner(self, owner: int) -> None: ...


@dataclass
class Batch:
    """One batch. Unpacks as `x, y = batch` (and `batch[0]`, `batch[1]`); the rest are
    attributes. It also reads as a mapping, for loops written for Hugging Face-style batches:
    `batch["input_ids"]` (x), `batch["labels"]` (y), `"cu_seqlens" in batch`, `keys()`,
    `items()`, `model(**batch)`; every attribute reads by its name too (`batch["shift"]`), though
    only the model's inputs are keys. Iterating gives x and y, not the keys, so it is not a
    `collections.abc.Mapping`.

    x, y: int64 [batch, seq_len] (or [batch, seq_len // shift, shift] when grouped); y[i] is
    the token `shift` positions after x[i]. offsets: each row's start in the split's token
    stream. cu_seqlens / max_seqlen: document boundaries of x flattened over the batch (int32,
    flash-attention varlen style), when requested; position_ids where a stream provides them."""

    x: torch.Tensor
    y: torch.Tensor
    step: int
    shift: int
    offsets: np.ndarray
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int | None = None
    position_ids: torch.Tensor | None = None

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter((self.x, self.y))

    def __len__(self) -> int:
        return 2

    def keys(self) -> list[str]:
        """The mapping's keys: input_ids, labels, and those of cu_seqlens, max_seqlen and
        position_ids that are set."""
        extra = [k for k in ("position_ids", "cu_seqlens", "max_seqlen") if getattr(self, k) is not None]
        return ["input_ids", "labels", *extra]

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self[k]) for k in self.keys()]

    def hf(self, varlen: bool = False, mask: bool = False) -> dict[str, Any]:
        """The batch in Hugging Face transformers' convention, for `model(**batch.hf())`:
        `labels` are the input ids (the model shifts them), not `y` (hfconvention.py)."""
        return hf_fields(self.x, self.y, self.shift, self.position_ids, self.cu_seqlens, self.max_seqlen, varlen,
                         mask)  # fmt: skip

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, int) and not isinstance(key, bool):
            return (self.x, self.y)[key]
        if key == "input_ids":
            return self.x
        if key == "labels":
            return self.y
        if isinstance(key, str) and (key in self.keys() or key in _FIELDS and getattr(self, key) is not None):
            return getattr(self, key)  # (batch["shift"] reads as batch.shift; an unset cu_seqlens is not there)
        raise KeyError(f"{key!r}: a batch reads as {', '.join(self.keys())} (its keys) and as its attributes "
                       f"{', '.join(_FIELDS)}")  # fmt: skip


_FIELDS = ("x", "y", "step", "shift", "offsets", "cu_seqlens", "max_seqlen", "position_ids")
