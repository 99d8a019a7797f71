"""Constant-memory packing of a prepared split (`TokenDataset.packed(seq_len, strategy="stream",
buffer=N)`): no plan of the whole split, only of the buffer at hand.

The split's documents are cut into blocks of BLOCK_DOCS consecutive documents (a block never
crosses a shard). Each epoch the blocks are put in an order drawn from (seed, epoch); rank r of w
takes blocks r, r+w, r+2w… of that order, and reads them in windows of ⌈buffer / BLOCK_DOCS⌉
blocks: about `buffer` documents from as many random places of the split. Each window is packed
on its own by best-fit decreasing (`packing.plan`, "bfd"), and its packs are handed out in an
order drawn from (seed, epoch, rank, window). A window's last packs are the least full, so the
fill falls short of a whole-split bfd plan by about one pack per window: measured in
docs/performance.md, and `inspect --packing` reports it beside bfd's (`stream_N`).

Memory model: the block order, 8 bytes per block of BLOCK_DOCS documents (1 MB per 128 M
documents), and one window: its documents' starts and lengths and its plan (about 40 bytes per
document of the window). Nothing per document of the split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import packing
from ..errors import ArgumentError

BLOCK_DOCS = 1024
DEFAULT_BUFFER = 10_000
_ORDER_SALT, _PACK_SALT = 0x5B10C, 0x5BAC


def parse(strategy: object) -> int | None:
    """N of "stream_N" (or DEFAULT_BUFFER for "stream"); None for any other strategy."""
    if strategy == "stream":
        return DEFAULT_BUFFER
    if isinstance(strategy, str) and strategy.startswith("stream_") and strategy[7:].isdigit() and int(strategy[7:]):
        return int(strategy[7:])
    return None


@dataclass
class Layout:
    """The blocks of a split from its shards' document counts: block b is documents
    [lo, hi) of shard `shard`."""

    doc_counts: np.ndarray  # int64 per shard

    def __post_init__(self) -> None:
        self.doc_counts = np.asarray(self.doc_counts, dtype=np.int64)
        self.first = np.concatenate([[0], np.cumsum(-(-self.doc_counts // BLOCK_DOCS))]).astype(np.int64)

    @property
    def n_blocks(self) -> int:
        return int(self.first[-1])

    def block(self, b: int) -> tuple[int, int, int]:
        k = int(np.searchsorted(self.first, b, side="right")) - 1
        lo = (b - int(self.first[k])) * BLOCK_DOCS
        return k, lo, min(lo + BLOCK_DOCS, int(self.doc_counts[k]))

    def order(self, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
        if not shuffle:
            return np.arange(self.n_blocks, dtype=np.int64)
        return np.random.default_rng([seed, epoch, _ORDER_SALT]).permutation(self.n_blocks)

    def window_blocks(self, order: np.ndarray, rank: int, world: int, buffer: int, w: int) -> np.ndarray:
        """Blocks of window `w` of rank `rank` (empty past the end of its part)."""
        per = max(1, math.ceil(buffer / BLOCK_DOCS))
        return order[rank::world][w * per : (w + 1) * per]


def plan_window(lengths: np.ndarray, seq_len: int, overlong: str, strategy: str = "bfd") -> packing.PackPlan | None:
    """The plan of one window's documents (bfd, or `strategy`); None when the overlong policy
    left nothing to pack."""
    try:
        return packing.plan(lengths, seq_len, strategy, overlong)
    except ArgumentError:
        if len(lengths) and packing.make_items(lengths, seq_len, overlong).length.size == 0:
            return None
        raise


def pack_order(n: int, seed: int, epoch: int, rank: int, w: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch, rank, w, _PACK_SALT]).permutation(n)


def metrics(lengths: np.ndarray, doc_counts: Any, seq_len: int, buffer: int, overlong: str = "split",
            seed: int = 0, world_size: int = 1, batch_size: int = 1) -> dict[str, Any]:  # fmt: skip
    """What one epoch of stream packing of a split gives (all ranks together), in the form of
    `PackPlan.metrics`, for `inspect --packing`: the same windows and plans the loader makes."""
    layout = Layout(doc_counts)
    starts = np.concatenate([[0], np.cumsum(layout.doc_counts)])
    order = layout.order(seed, 0)
    packs = tokens = n_items = 0
    max_items = 0
    counts = {"split_docs": 0, "split_pieces": 0, "truncated_docs": 0, "truncated_tokens": 0, "dropped_docs": 0,
              "dropped_tokens": 0}  # fmt: skip
    for rank in range(world_size):
        w = 0
        while len(blocks := layout.window_blocks(order, rank, world_size, buffer, w)):
            w += 1
            parts = []
            for b in blocks.tolist():
                k, lo, hi = layout.block(b)
                parts.append(lengths[starts[k] + lo : starts[k] + hi])
            plan = plan_window(np.concatenate(parts), seq_len, overlong)
            if plan is None:
                counts["dropped_docs"] += int(sum(len(p) for p in parts))
                counts["dropped_tokens"] += int(sum(int(p.sum()) for p in parts))
                continue
            packs += plan.n_packs
            tokens += int(plan.length.sum())
            n_items += len(plan.length)
            max_items = max(max_items, int(np.diff(plan.ptr).max()))
            it = plan.items
            for key, value in (("split_docs", it.split_docs), ("split_pieces", it.split_pieces),
                               ("truncated_docs", it.truncated_docs), ("truncated_tokens", it.truncated_tokens),
                               ("dropped_docs", it.dropped_docs), ("dropped_tokens", it.dropped_tokens)):  # fmt: skip
                counts[key] += value
    lower = math.ceil(tokens / seq_len) if tokens else 0
    g = world_size * batch_size
    return {
        "strategy": f"stream_{buffer}", "seq_len": seq_len, "packs": packs, "lower_bound": lower,
        "gap_to_lower_bound": (packs - lower) / lower if lower else 0.0, "capacity": packs * seq_len,
        "tokens": tokens, "fill": tokens / (packs * seq_len) if packs else 0.0, "documents": len(lengths),
        "items": n_items, "items_per_pack_mean": n_items / packs if packs else 0.0, "items_per_pack_max": max_items,
        "overlong": overlong, "split_documents": counts["split_docs"], "split_pieces": counts["split_pieces"],
        "truncated_documents": counts["truncated_docs"], "truncated_tokens": counts["truncated_tokens"],
        "dropped_documents": counts["dropped_docs"], "dropped_tokens": counts["dropped_tokens"],
        "world_size": world_size, "batch_size": batch_size, "steps_per_rank": packs // g, "packs_left_over": packs % g,
    }  # fmt: skip
