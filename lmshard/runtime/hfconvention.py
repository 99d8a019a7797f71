"""Batches in Hugging Face transformers' convention (`Batch.hf()`, `PackedBatch.hf()`).

lmshard's `labels` (`y`) are already the next tokens: `y[t]` is what position t predicts. A
transformers `*ForCausalLM` shifts `labels` itself (its loss is CE(logits[:, :-1], labels[:, 1:])),
so given lmshard's `labels` it would train on the token after next, silently. `hf_fields` gives
the other convention: `labels` are the input ids, with -100 wherever lmshard's next-token target
is -100 (document boundaries of packed rows, padding) moved one place on, so that the model's
own shift lands each prediction on the token lmshard's `y` holds. The loss is lmshard's next-token
cross-entropy over positions 0 .. T-2 (the convention has no target for the last position).

Packed rows keep their `position_ids`, and with `varlen=True` the document boundaries go in
transformers' names for its flash-attention kernels (`cu_seq_lens_q`, `cu_seq_lens_k`,
`max_length_q`, `max_length_k`). Other attention implementations (eager, sdpa) attend across the
documents of a row unless given a mask: `mask=True` adds `attention_mask`, a 4D boolean
[rows, 1, T, T] that lets each token see the earlier tokens of its own document only (T² bytes
a row: 16 MiB at T = 4096; a padding-free batch is one row of all its tokens, N² bytes for N
tokens, 2 GiB at 8 × 4096 rows: use `varlen=True` with a flash-attention model there). Padded
batches pass their 2D `attention_mask` on (with `mask=True`, the 4D mask of one document a row).

`hf_collator` is a `data_collator` for transformers' `Trainer` over `ds.windows(T)` (whose items
are named tuples, which transformers' default collator cannot read): the windows stacked, in
this convention.

Memory model: one int64 copy of the input ids for the labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ArgumentError


def hf_fields(x: torch.Tensor, y: torch.Tensor, shift: int = 1, position_ids: torch.Tensor | None = None,
              cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None, varlen: bool = False,
              mask: bool = False, padding: torch.Tensor | None = None) -> dict[str, Any]:  # fmt: skip
    """The batch's fields in transformers' convention (see the module docstring). `padding`:
    a padded batch's [rows, T] attention mask (1 for tokens, 0 for padding), passed on as it is,
    or with `mask` made the 4D mask of one document per row."""
    if shift != 1 or x.dim() != 2:
        raise ArgumentError(f"hf(): transformers' labels predict the next token only; this batch has shift={shift} "
                            f"and input_ids of shape {tuple(x.shape)} (make its stream with shift=1, ungrouped)")
    labels = torch.full_like(x, -100)
    labels[:, 1:] = torch.where(y[:, :-1] != -100, x[:, 1:], torch.full_like(x[:, 1:], -100))
    out: dict[str, Any] = {"input_ids": x, "labels": labels}
    if position_ids is not None:
        out["position_ids"] = position_ids
    if varlen:
        if cu_seqlens is None or max_seqlen is None:
            raise ArgumentError("hf(varlen=True): this batch has no document boundaries; ask its stream for them "
                                "(cu_seqlens=True, or a packed stream)")  # fmt: skip
        cu = cu_seqlens.to(torch.int32)
        out |= {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max_seqlen, "max_length_k": max_seqlen}
    if padding is not None and not mask:
        out["attention_mask"] = padding
    if mask:  # (padding: the row's tokens are one document, its padding another that no token sees)
        doc = padding.to(torch.int64) if padding is not None else _documents(x, position_ids, cu_seqlens)
        same = doc[:, :, None] == doc[:, None, :]
        same &= torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).tril()
        out["attention_mask"] = same[:, None]
    return out


def _documents(x: torch.Tensor, position_ids: torch.Tensor | None, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """Each token's document number in its row: from the position ids (a document starts where
    they restart at 0), else from the boundaries over the flattened batch."""
    if position_ids is not None:
        return torch.cumsum((position_ids == 0).to(torch.int64), dim=1)
    if cu_seqlens is None:
        raise ArgumentError("hf(mask=True): this batch has no document boundaries; ask its stream for them "
                            "(cu_seqlens=True, or a packed stream)")  # fmt: skip
    flat = torch.arange(x.numel(), device=x.device)
    return torch.searchsorted(cu_seqlens.to(x.device, torch.int64), flat, right=True).view(x.shape)


def hf_collator(items: Sequence[Any]) -> dict[str, Any]:
    """`data_collator=lmshard.hf_collator` for transformers' `Trainer(train_dataset=ds.windows(T))`:
    the windows' input ids stacked, with their labels in transformers' convention (the input
    ids: the model shifts them)."""
    if not items:
        raise ArgumentError("hf_collator: no items to collate")
    x = torch.stack([torch.as_tensor(item[0]) for item in items]).to(torch.int64)
    y = torch.stack([torch.as_tensor(item[1]) for item in items]).to(torch.int64)
    kept = y[:, :-1] != -100
    if x.dim() != 2 or not torch.equal(y[:, :-1][kept], x[:, 1:][kept]):
        raise ArgumentError("hf_collator: the items' targets are not their next tokens (a windows(T, shift=k) with "
                            "k != 1, or grouped windows?); transformers' models predict the next token: make the "
                            "windows with shift=1")  # fmt: skip
    return hf_fields(x, y)
