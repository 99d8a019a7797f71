"""Rows of one length at any offset of a mapped split, gathered by one fancy index over a row
view that spans the maps of all its shards (`_Span`); used by `store.TokenStore` and by
mixtures (`mixing.py`), whose view spans the maps of all their sources.

Memory model: per row length, a view (no copy) and three int64 per shard.
"""

from __future__ import annotations

import numpy as np

from ..format import TOKEN_DTYPE


class _Span:
    """Rows of one length at any offset of a mapped split, as one [positions, length] view that
    spans the maps of all its shards, so that a batch's rows are gathered by one fancy index
    whatever shards they are in: one C loop, where a slice copy per row costs ~1 us of Python
    each (32 rows of 1,025 tokens: ~50 vs ~25 us on the benchmark machine).

    The maps sit at page-aligned addresses the kernel chose, in any order and with gaps between
    them; the view starts at the lowest one, so shard k's token j is at position `pos[k] + j`.
    The view also covers the gaps, so it may only be indexed at a row that lies entirely inside
    one shard: `locate` marks the rows that cross a shard boundary, and the caller reads them
    another way. The span holds every shard's array, and a map with an exported buffer is never
    unmapped (`_Open.close`), so no position can dangle while the view exists."""

    _CROSSING = -(1 << 62)  # added to a crossing row's offset: its position is negative

    def __init__(self, arrays: list[np.ndarray], starts: np.ndarray, length: int) -> None:
        size = arrays[0].dtype.itemsize
        addresses = np.array([a.__array_interface__["data"][0] for a in arrays], dtype=np.int64)
        low = int(addresses.argmin())
        pos = (addresses - addresses[low]) // size  # each shard's first token, in tokens from the lowest map
        extent = int((pos + np.diff(starts)).max())
        self.arrays = arrays
        self.view = np.lib.stride_tricks.as_strided(
            arrays[low], shape=(max(extent - length + 1, 0), length), strides=(size, size), writeable=False
        )
        self.single = len(arrays) == 1
        self.last = int(starts[-1]) - length  # (one shard) the last offset whose row fits
        # Offsets in [starts[k], ends[k]) start a row inside shard k, those in [ends[k], starts[k+1])
        # one that crosses into the next. One search over these edges finds both the shard and
        # whether the row crosses; the table turns the search's answer into what to add to the
        # offset: the shard's position minus its start, or _CROSSING.
        ends = np.maximum(starts[:-1], starts[1:] - length + 1)
        self.edges = np.stack([starts[:-1], ends], axis=1).reshape(-1)
        self.add = np.full(len(self.edges) + 1, self._CROSSING, dtype=np.int64)
        self.add[1::2] = pos - starts[:-1]

    def locate(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(view positions of the rows, mask of the rows that cross a shard boundary, or None
        when none does). A crossing row's position is negative and must not be indexed."""
        if self.single:  # no lookup: the split's offsets are the positions
            return offsets, (offsets > self.last) if int(offsets.max()) > self.last else None
        at = offsets + self.add.take(self.edges.searchsorted(offsets, side="right"))
        return at, (at < 0) if int(at.min()) < 0 else None


def widened(rows: np.ndarray) -> np.ndarray:
    """Rows gathered from a map, as uint32: uint16 rows widened (one more copy, of half the bytes)."""
    return rows if rows.dtype == TOKEN_DTYPE else rows.astype(TOKEN_DTYPE)
