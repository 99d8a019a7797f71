"""`PackedBatch`: a batch of packed (or padded) rows, read as a pair and as a mapping.

Memory model: the batch's tensors, held as given.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .hfconvention import hf_fields


class PackedBatch:
    """A batch of packed (or padded) rows: `x, y = batch` (input_ids, labels), and read as a
    mapping: `batch["input_ids"]`, `keys()`, `items()`, `in`, `model(**batch)`. Not a dict, so a
    DataLoader hands it over as it is (its default conversion would iterate it as a mapping)."""

    def __init__(self, fields: dict[str, Any], step: int = 0) -> None:
        self._fields, self.step = fields, step

    def __iter__(self) -> Iterator[Any]:
        return iter((self._fields["input_ids"], self._fields["labels"]))

    def __getitem__(self, key: str | int) -> Any:
        if isinstance(key, str):
            return self._fields[key]
        return (self.x, self.y)[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._fields[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self._fields

    def keys(self) -> list[str]:
        return list(self._fields)

    def items(self) -> list[tuple[str, Any]]:
        return list(self._fields.items())

    def hf(self, varlen: bool = False, mask: bool = False) -> dict[str, Any]:
        """The batch in Hugging Face transformers' convention, for `model(**batch.hf())`:
        `labels` are the input ids with -100 at each document's first token and at padding (the
        model shifts them), not lmshard's next tokens (hfconvention.py)."""
        f = self._fields
        return hf_fields(f["input_ids"], f["labels"], 1, f.get("position_ids"), f.get("cu_seqlens"),
                         f.get("max_seqlen"), varlen, mask, f.get("attention_mask"))  # fmt: skip

    def __repr__(self) -> str:
        shapes = {k: tuple(v.shape) if hasattr(v, "shape") else v for k, v in self._fields.items()}
        return f"PackedBatch(step={self.step}, {shapes})"

    @property
    def x(self) -> torch.Tensor:
        return self._fields["input_ids"]  # type: ignore[no-any-return]

    @property
    def y(self) -> torch.Tensor:
        return self._fields["labels"]  # type: ignore[no-any-return]
