"""`PackedBatch`: a batch of packed (or padded) rows, read as a pair and as a mapping; and
`collate_packed`, which makes one from a PackedDataset's samples.

Memory model: the batch's tensors, held as given.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError
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


def collate_packed(samples: Sequence[Mapping[str, Any]], padding_free: bool = False) -> dict[str, Any]:
    """Samples of a PackedDataset as one batch: input_ids/labels/position_ids [B, seq_len] and
    the segments of the batch flattened into one cu_seqlens (int32) with its max_seqlen.
    padding_free: only each sample's real tokens, concatenated into one [1, total] row (the
    shape of Hugging Face's DataCollatorWithFlattening), its segments in cu_seqlens."""
    if not samples:
        raise ArgumentError("collate_packed got no samples; pass at least one")
    cus, at = [torch.zeros(1, dtype=torch.int32)], 0
    keys = ("input_ids", "labels", "position_ids")
    if padding_free:
        parts: dict[str, list[torch.Tensor]] = {k: [] for k in keys}
        for s in samples:
            n = int(s["length"])
            for k in keys:
                parts[k].append(s[k][:n])
            cu = s["cu_seqlens"]
            cu = cu[cu <= n] if int(cu[-1]) != n else cu
            cus.append(cu[1:] + at)
            at += n
        out: dict[str, Any] = {k: torch.cat(v).unsqueeze(0) for k, v in parts.items()}
    else:
        out = {k: torch.stack([s[k] for s in samples]) for k in keys}
        for s in samples:
            cus.append(s["cu_seqlens"][1:] + at)
            at += len(s["input_ids"])
    cu_all = torch.cat(cus)
    out["cu_seqlens"] = cu_all
    out["max_seqlen"] = int((cu_all[1:] - cu_all[:-1]).max())
    return out


def row_segments(lengths: np.ndarray, counts: np.ndarray, real: np.ndarray, T: int) -> list[np.ndarray]:
    """Each row's segment boundaries (int32): 0 and its items' running lengths (`counts` items
    a row, in row order), then T when padding fills the row's end (`real` tokens < T)."""
    out = []
    for mine, used in zip(np.split(np.asarray(lengths), np.cumsum(counts)[:-1]), np.asarray(real).tolist(),
                          strict=True):  # fmt: skip
        cuts = np.concatenate([[0], np.cumsum(mine)])
        out.append((np.append(cuts, T) if used < T else cuts).astype(np.int32))
    return out
