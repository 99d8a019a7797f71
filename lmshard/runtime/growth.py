"""Continuing a run on a grown dataset: `stream.load_state_dict(state, grown="continue")`.

`prepare --append` keeps a split's old shards, unchanged and first, and adds new ones after
them, so the data a state was saved on is a *prefix* of the grown split: its first k shards
(checked: the saved `data_id` is the digest of those shards' checksums, and their tokens). A
stream continued on the grown split draws:

- **windows, packed and padded batches**: the epoch the state was saved in finishes over the old
  data exactly as the uninterrupted run would have; from the next epoch boundary on, every epoch
  covers the whole grown split once, its order drawn from (seed, epoch) as before, epochs
  numbered on;
- **random batches** have no epochs: the rows from the resumed step on are drawn over the grown
  split;
- **mixtures**: each grown source likewise, at its own epochs (windows and packs) or from the
  resumed step (random rows); the other sources are untouched.

Every step before the growth keeps its batch, so `trace` and the exposure of those steps do not
change. The state records each growth (`"grown"`: the data position where it took effect and
what the stream read before it), so a later resume, at any world size, draws the same batches.

Memory model: a few integers per growth; an era over old data keeps its own offsets object (or
its own pack plan for packed streams: 16 bytes per document, as any plan).
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentError
from . import checks
from .sampling import Offsets

CHOICES = (None, "refuse", "continue")


def choice(grown: object) -> bool:
    """True for grown="continue"; False for None/"refuse"; an error for anything else."""
    if grown not in CHOICES:
        raise ArgumentError(f"grown={checks.show(grown)}: pass grown='continue' to continue a state saved before "
                            "the dataset grew (an --append), or leave it unset to refuse")  # fmt: skip
    return grown == "continue"


@dataclass(frozen=True)
class Prefix:
    """The part of a split that a state's data was: its first `shards` shards."""

    shards: int
    n_tokens: int
    n_docs: int


def prefix(data: Any, saved_id: str) -> Prefix | None:
    """The leading shards of `data`'s split (a TokenDataset) that hold exactly the data
    `saved_id` named, or None when no prefix does (a rebuild, another dataset)."""
    meta = getattr(data, "meta", None)
    if meta is None:
        return None
    words = str(saved_id).rsplit(":", 2)
    if len(words) != 3 or words[1] != data.split or not words[2].isdigit():
        return None
    digest, n_tokens = words[0], int(words[2])
    shards = meta.split_shards(data.split)
    tokens = docs = 0
    parts: list[str] = []
    for k, shard in enumerate(shards):
        if tokens == n_tokens:
            if hashlib.sha256(",".join(parts).encode()).hexdigest()[:16] == digest:
                return Prefix(k, tokens, docs)
            return None
        tokens, docs = tokens + shard.n_tokens, docs + shard.n_docs
        parts.append(f"{shard.xxh3_64}/{shard.index_xxh3_64}")
        if tokens > n_tokens:
            return None
    return None  # the whole split: not grown (same data), or fewer tokens than saved


def old_part(data: Any, saved_id: str, grown: bool) -> Prefix:
    """The prefix `saved_id` was, refused unless the caller asked for grown="continue" and the
    split did grow from it; one line naming what changed and the fix."""
    if getattr(data, "_carved", "") and saved_id != data.data_id:  # a load-time split (runtime/subset.py)
        if "?" in checks.data_split(data.data_id) + checks.data_split(saved_id):  # a where= selection
            raise ArgumentError(f"cannot resume: the state was saved on {checks.describe_data(saved_id)}, and this "
                                f"stream reads {checks.describe_data(data.data_id)}; a run on a where= selection "
                                "continues only on the selection it was saved on: open the dataset with the same "
                                "where= (and attributes), or start a new run")  # fmt: skip
        raise ArgumentError(f"cannot resume: the state was saved on {checks.describe_data(saved_id)}, and this "
                            f"load-time split is of {checks.describe_data(data.data_id)}; a run on a load-time "
                            "split continues only on the data it was saved on (an --append adds documents to both "
                            "sides): start a new run, or prepare the data with --val-fraction")  # fmt: skip
    found = prefix(data, saved_id)
    if found is not None and grown:
        return found
    prepared = getattr(data, "meta", None) is not None
    if found is None and saved_id == data.data_id:  # a growth the state records is this whole split
        raise ArgumentError(f"cannot resume: the state's run went on from {checks.describe_data(saved_id)} onto "
                            "more data, and this stream reads only that; resume on the dataset the state was "
                            "saved on")  # fmt: skip
    if grown and not prepared:
        raise ArgumentError(f"cannot resume: the state was saved on {checks.describe_data(saved_id)}, and this "
                            f"in-memory dataset is {checks.describe_data(data.data_id)}; grown='continue' "
                            "continues a prepared dataset that --append grew, so start from step 0")  # fmt: skip
    checks.same_data(saved_id, data.data_id, (found is not None) if prepared else None)
    raise ArgumentError(f"cannot resume on {checks.describe_data(data.data_id)}: {checks.STATE_FIX}")


def saved_eras(state: dict[str, Any]) -> list[tuple[int, Any]]:
    """The state's growths: [(data position, what the stream read before it)], oldest first."""
    saved = state.get("grown") or []
    if not isinstance(saved, list) or not all(isinstance(g, list | tuple) and len(g) == 2 for g in saved):
        raise ArgumentError(f"state['grown']={checks.show(saved)} is not a list of [position, data]; "
                            f"{checks.STATE_FIX}")  # fmt: skip
    out = [(checks.integer("a growth's position", g[0], low=0, fix=checks.STATE_FIX), g[1]) for g in saved]
    if [p for p, _ in out] != sorted(p for p, _ in out):
        raise ArgumentError(f"state['grown'] positions are not in order; {checks.STATE_FIX}")
    return out


def epoch_end(position: int, start: int, per_epoch: int) -> int:
    """The first position at or after `position` that begins an epoch of an era that starts at
    `start` with `per_epoch` positions an epoch."""
    return start + -(-(position - start) // per_epoch) * per_epoch


@dataclass(frozen=True)
class Era:
    """Positions from `start` on (until the next era) draw over one state of the data: epoch
    `epoch` begins at `start`, `per_epoch` positions each (None: no epochs)."""

    start: int
    epoch: int
    per_epoch: int | None

    def local(self, position: Any) -> Any:
        """The position an era's own sampler draws `position` as (epoch numbering continued); an
        int, or an array of them."""
        if self.per_epoch is None:
            return position
        return position - self.start + self.epoch * self.per_epoch

    def next_epoch(self, boundary: int) -> int:
        """The epoch number an era starting at `boundary` (an epoch end of this one) begins with."""
        return self.epoch if self.per_epoch is None else self.epoch + (boundary - self.start) // self.per_epoch


def era_of(starts: list[int], position: int) -> int:
    """The index of the era (by its start) that `position` falls in."""
    return max(0, bisect.bisect_right(starts, position) - 1)


def epoch_start(eras: list[Era], epoch: int) -> int | None:
    """The first position of `epoch` in the era that holds it; None where no era has epochs."""
    for era in reversed(eras):
        if era.per_epoch is not None and epoch >= era.epoch:
            return era.start + (epoch - era.epoch) * era.per_epoch
    return None


def eras_for(data: Any, state: dict[str, Any], position: int, grown: bool, make: Any,
             per_epoch: Any) -> tuple[list[Era], list[Any], list[list[Any]]]:  # fmt: skip
    """The eras of a stream over `data` (a TokenDataset) resumed from `state` at data position
    `position`: (eras, each era's sampler, what the state records of them). `make(part)` builds
    the stream's sampler over a Prefix (None: the whole split as it is); `per_epoch(sampler)` is
    its positions per epoch, or None (no epochs). The state's own data, when the split grew from
    it, becomes an era that ends at its next epoch boundary (random: at `position`) if `grown`,
    and is refused otherwise; a state on other data is refused in one line."""
    saved, mine = state.get("data"), data.data_id
    eras: list[Era] = []
    samplers: list[Any] = []
    record: list[list[Any]] = []
    if saved is None:  # saved before states recorded their data: not checked
        base = make(None)
        return [Era(0, 0, per_epoch(base))], [base], []
    start = epoch = 0

    def add(sampler: Any, at: int | None, was: Any) -> None:
        """An era from `start` until `at` (None: its next epoch boundary after `position`)."""
        nonlocal start, epoch
        era = Era(start, epoch, per_epoch(sampler))
        if at is None:
            at = max(start, position if era.per_epoch is None else epoch_end(position, start, era.per_epoch))
        eras.append(era)
        samplers.append(sampler)
        record.append([at, was])
        start, epoch = at, era.next_epoch(at)

    for at, was in saved_eras(state):
        add(make(old_part(data, was, True)), at, was)
    if saved != mine:
        add(make(old_part(data, saved, grown)), None, saved)
    base = make(None)
    eras.append(Era(start, epoch, per_epoch(base)))
    samplers.append(base)
    return eras, samplers, record


def mixture_eras(mix: Any, tree: Any, state: dict[str, Any], position: int, keep_going: bool, rows_before: Any,
                 make: Any) -> tuple[list[list[tuple[Era, Any]]], list[list[Any]]]:  # fmt: skip
    """The eras of each source of a mixture stream resumed from `state` at data position
    `position`, in the source's own rows (m: the row's index among the source's rows, from the
    mixture's `tree`): (per source, [(era, its sampler)], empty for a source that never grew;
    what the state records). `make(source, part)` gives (sampler, rows per epoch or None) over
    a Prefix of the source (None: all of it). A source's era ends at the resumed row (no epochs)
    or at its next epoch boundary. The weights must be the saved ones; a new growth needs
    `keep_going`. `rows_before(position)`: the run's rows before a position."""
    saved, mine = state.get("mixture"), mix.fingerprint()
    eras: list[list[tuple[Era, Any]]] = [[] for _ in mix.datasets]
    if saved is None:
        return eras, []
    ends = [*saved_eras(state), *([(position, saved)] if saved != mine else [])]
    for _, was in ends:
        if not isinstance(was, list) or len(was) != len(mine) or [w for _, w in was] != [w for _, w in mine]:
            raise ArgumentError(f"cannot resume: saved mixture={checks.show(was)}, this stream has mixture="
                                f"{mine!r}; build the mixture with the saved sources and weights")  # fmt: skip
    for s, data in enumerate(mix.datasets):
        ids = [was[s][0] for _, was in ends] + [mine[s][0]]
        start = epoch = 0
        for k, (at, _) in enumerate(ends):
            if ids[k] == ids[k + 1]:
                continue
            try:
                part = old_part(data, ids[k], keep_going or k < len(ends) - 1 or saved == mine)
            except ArgumentError as e:
                raise ArgumentError(f"mixture source {mix.names[s]}: {e}") from None
            sampler, n = make(s, part)
            era = Era(start, epoch, n)
            m = tree.counts(rows_before(at))[s]  # the source's rows before the growth took effect
            end = max(start, m if n is None else epoch_end(m, start, n))
            eras[s].append((era, sampler))
            start, epoch = end, era.next_epoch(end)
        if eras[s]:
            sampler, n = make(s, None)
            eras[s].append((Era(start, epoch, n), sampler))
    return eras, [[at, was] for at, was in ends]


def split_by_era(eras: list[tuple[Era, Any]], m: Any) -> list[tuple[Any, Era, Any]]:
    """Rows `m` of one source (an int64 array) by era: [(where in m, era, sampler)]."""
    which = np.searchsorted([e.start for e, _ in eras], m, side="right") - 1
    return [(np.flatnonzero(which == i), eras[i][0], eras[i][1]) for i in np.unique(which).tolist()]


class GrownOffsets(Offsets):
    """Offsets over a split that grew while a run went on: each era (runtime/growth.py) draws
    with the sampler of the data it covered, at its own step numbering (epochs numbered on)."""

    def __init__(self, eras: list[Any], samplers: list[Offsets]) -> None:
        self.eras, self.samplers = eras, samplers
        self.starts = [e.start for e in eras]
        last = samplers[-1]
        self.shift, self.steps_per_epoch = last.shift, last.steps_per_epoch
        self.order, self.by_len, self.n_rows, self.seq_len = last.order, last.by_len, last.n_rows, last.seq_len

    def fingerprint(self) -> dict[str, Any]:
        return self.samplers[-1].fingerprint()

    def rows(self, step: int, count: int) -> tuple[np.ndarray, int]:
        i = era_of(self.starts, step)
        return self.samplers[i].rows(self.eras[i].local(step), count)

    def rows_at(self, step: int, first: int, count: int, run: int | None = None) -> tuple[np.ndarray, int]:
        i = era_of(self.starts, step)  # (row order: random rows, whose eras have no epochs)
        if i + 1 < len(self.starts):
            run = min(run or self.starts[i + 1] - step, self.starts[i + 1] - step)
        return self.samplers[i].rows_at(step, first, count, run)

    def epoch_of(self, step: int) -> int | None:
        era = self.eras[era_of(self.starts, step)]
        return None if era.per_epoch is None else era.epoch + (step - era.start) // era.per_epoch

    def epoch_start(self, epoch: int) -> int:
        found = epoch_start(self.eras, epoch)
        return super().epoch_start(epoch) if found is None else found
