"""What one reader of a stream makes of its documents: rows of a batch, each batch with the
reader's position after it (a few integers), so a loader can resume exactly.

- `windows`: contiguous windows of the token stream (documents joined with their separators,
  as prepare writes them): row i starts `stride` tokens after row i-1 and holds seq_len + shift
  tokens (x and its labels `shift` ahead); the shift is fixed or drawn per batch from a
  generator keyed by (seed, the reader's batch number).
- `packed`: documents packed into rows of seq_len by the planner of `lmshard/packing/planner.py`
  (`bfd` or `greedy`, overlong split, truncated or dropped) over windows of `buffer` documents,
  the packs of a window shuffled by a generator keyed by (seed, the window's first document).

A position is the first document still needed (`docs.DocPos`), plus the token offset into it
(windows) or the packs of the window already handed out (packed), plus the batch number.

Memory model: windows: the documents that overlap the current row; packed: one buffer of
documents and their tokens; plus the `docs.Documents` window beneath.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..errors import InputError
from ..packing import stream as streampack
from ..runtime.keyed import step_rng
from ..runtime.packed import build_rows
from ..runtime.sampling import ShiftSpec
from ..runtime.schedule import Schedule
from .docs import DocPos, Documents, Origin

Sizes = Callable[[int], tuple[int, int]]  # a reader's batch number -> (rows, seq_len), under a schedule
Piece = tuple[int, int, int, int, int, int]  # a row's piece of a document: shard, record, start, end, at, length

_SHIFT_SALT, _PACK_SALT = 0x5417, 0x9AC5


def window_batches(docs: Documents, state: list[int], batch_size: int, seq_len: int, stride: int | None,
                   shift: ShiftSpec, seed: int, sizes: Sizes | None = None,
                   shift_arg: int | str = 1) -> Iterator[dict[str, Any]]:  # fmt: skip
    """Batches of [batch_size, seq_len + shift] rows from `state` = [*DocPos, offset, batch].
    `sizes(batch)`: (rows, seq_len) of the reader's batch number `batch` under a schedule, each
    length's shift parsed from `shift_arg` and its rows `stride` apart (None: its length)."""
    pos, offset, n = DocPos.of(state[:5]), state[5], state[6]
    held: list[tuple[DocPos, np.ndarray, Origin]] = []  # the documents the next row starts in, and after
    have = 0  # tokens held from `offset` on
    source = docs(pos)
    specs = {seq_len: shift}
    while True:
        count, T = (batch_size, seq_len) if sizes is None else sizes(n)
        spec = specs[T] if T in specs else specs.setdefault(T, ShiftSpec.parse(shift_arg, T))
        step = stride or T
        width = T + spec.draw(step_rng(seed, n, _SHIFT_SALT))
        rows = np.empty((count, width), dtype=np.int64)
        pieces: list[list[Piece]] = []
        for b in range(count):
            while have < width:
                nxt = next(source, None)
                if nxt is None:
                    return  # the last, partial batch is left out
                held.append(nxt)
                have += len(nxt[1]) - (offset if len(held) == 1 else 0)
            rows[b], row = _take(held, offset, width)
            pieces.append(row)
            offset += step
            have -= step
            while len(held[0][1]) <= offset:
                offset -= len(held[0][1])
                held.pop(0)
        n += 1
        yield {"rows": rows, "shift": width - T, "state": [*held[0][0].ints(), offset, n], "trace": pieces}


def _take(held: list[tuple[DocPos, np.ndarray, Origin]], offset: int, width: int) -> tuple[np.ndarray, list[Piece]]:
    """The row of `width` tokens from `offset` into the held documents, and its pieces."""
    parts, pieces, need = [], [], width
    for k, (_, tokens, origin) in enumerate(held):
        first = offset if k == 0 else 0
        parts.append(tokens[first : first + need])
        pieces.append((*origin, first, first + len(parts[-1]), width - need, len(tokens)))
        need -= len(parts[-1])
        if need == 0:
            break
    return np.concatenate(parts), pieces


def packed_batches(docs: Documents, state: list[int], batch_size: int, seq_len: int, *, strategy: str, buffer: int,
                   overlong: str, pad_id: int, mask_boundary_labels: bool, shuffle: bool, seed: int,
                   sizes: Sizes | None = None) -> Iterator[dict[str, Any]]:  # fmt: skip
    """Batches of packed rows from `state` = [*DocPos of the window's first document, packs handed
    out of that window, batch]. Each batch carries its rows' fields and what the packer did."""
    pos, skip, n = DocPos.of(state[:5]), state[5], state[6]
    source = docs(pos)
    counts: dict[str, int] = {}
    rows: list[list[np.ndarray]] = []  # the items of each row of the batch being filled
    pieces: list[list[Piece]] = []  # and where each came from
    ahead: tuple[DocPos, np.ndarray, Origin] | None = None  # the first document of the next epoch
    packed_in = pos.window.epoch  # the last epoch a window of which packed anything
    packed = unpackable = False
    while True:
        window = [ahead] if ahead is not None else []
        ahead = None
        for doc in source:  # up to `buffer` documents, never across the end of an epoch
            if window and doc[0].window.epoch != window[0][0].window.epoch:
                ahead = doc
                break
            window.append(doc)
            if len(window) == buffer:
                break
        if not window:
            if unpackable and not packed:  # a finite stream whose every window was dropped
                raise InputError(_unpackable(seq_len, overlong))
            return
        first = window[0][0]
        lengths = np.array([len(t) for _, t, _ in window], dtype=np.int64)
        flat = np.concatenate([t for _, t, _ in window])
        ends = np.cumsum(lengths)
        plan = streampack.plan_window(lengths, seq_len, overlong, strategy)
        if plan is None:  # every document of the window dropped as overlong
            counts["dropped_documents"] = counts.get("dropped_documents", 0) + len(window) * (skip == 0)
            skip, unpackable = 0, True
            if first.window.epoch > packed_in + 1:  # a whole epoch of the reader's part, and nothing packed
                raise InputError(_unpackable(seq_len, overlong))
            continue
        packed_in, packed = max(packed_in, first.window.epoch), True
        if skip == 0:
            it = plan.items
            for key, value in (("split_documents", it.split_docs), ("dropped_documents", it.dropped_docs),
                               ("truncated_documents", it.truncated_docs)):  # fmt: skip
                counts[key] = counts.get(key, 0) + value
        order = np.arange(plan.n_packs)
        if shuffle:
            order = np.random.default_rng([seed, *first.ints(), _PACK_SALT]).permutation(plan.n_packs)
        for p in range(skip, plan.n_packs):
            starts, lens = plan.pack_items(int(order[p]))
            rows.append([flat[s : s + m] for s, m in zip(starts.tolist(), lens.tolist(), strict=True)])
            owner = np.searchsorted(ends, starts, side="right").tolist()  # each item's document in the window
            at = (np.cumsum(lens) - lens).tolist()
            pieces.append([(*window[d][2], s - int(ends[d] - lengths[d]), s - int(ends[d] - lengths[d]) + m, a,
                            int(lengths[d])) for d, s, m, a in zip(owner, starts.tolist(), lens.tolist(), at,
                                                                 strict=True)])  # fmt: skip
            if len(rows) == (batch_size if sizes is None else sizes(n)[0]):
                n += 1
                state_after = [*first.ints(), p + 1, n] if p + 1 < plan.n_packs else [*_after(window), 0, n]
                yield {**_fields(rows, seq_len, pad_id, mask_boundary_labels), "state": state_after, "counts": counts,
                       "trace": pieces}  # fmt: skip
                rows, counts, pieces = [], {}, []
        skip = 0


def _unpackable(seq_len: int, overlong: str) -> str:
    return (f"lmshard.stream: no document of this reader's part can be packed into rows of {seq_len} tokens with "
            f"overlong={overlong!r}; pass overlong='split' (or 'truncate'), or a larger seq_len")


def _after(window: list[tuple[DocPos, np.ndarray, Origin]]) -> list[int]:
    """The position of the document after the window's last (the next window's first)."""
    last = window[-1][0]
    return [*last.window.ints(), last.k + 1]


def _fields(rows: list[list[np.ndarray]], seq_len: int, pad_id: int, mask: bool) -> dict[str, Any]:
    items = [t for row in rows for t in row]
    lengths = np.array([len(t) for t in items], dtype=np.int64)
    flat = np.concatenate(items)
    starts = np.cumsum(lengths) - lengths
    counts = np.array([len(row) for row in rows], dtype=np.int64)

    def read_spans(s: np.ndarray, m: np.ndarray, out: np.ndarray, at: np.ndarray) -> None:
        for a, b, c in zip(s.tolist(), m.tolist(), at.tolist(), strict=True):
            out[c : c + b] = flat[a : a + b]

    built = build_rows(starts, lengths, counts, seq_len, pad_id, mask, read_spans)
    cus = [np.zeros(1, np.int32)] + [seg[1:] + r * seq_len for r, seg in enumerate(built["segments"])]
    cu = np.concatenate(cus).astype(np.int32)
    return {"input_ids": built["input_ids"], "labels": built["labels"], "position_ids": built["position_ids"],
            "cu_seqlens": cu, "max_seqlen": int(np.diff(cu).max()), "real_tokens": int(lengths.sum())}  # fmt: skip


def reader_sizes(schedule: Schedule, workers: int, reader: int, world_size: int, n: int) -> tuple[int, int]:
    """(rows, seq_len) of a reader's batch number n: reader r of a rank's W serves its steps
    r, r + W, r + 2W, ... (the DataLoader takes its workers in turn), so its batch n is step n·W + r."""
    phase = schedule.phase(n * workers + reader)
    return phase.global_batch // world_size, phase.seq_len
