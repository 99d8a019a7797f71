"""What a build counts and how it stops: the totals that end up in the metadata (`Totals`, and
`account`, one work item's counts added), the progress the run log shows (`Progress`), the
refusal of a run that kept nothing (`check_not_empty`), and the stop signals (`sigterm_stops`:
SIGTERM ends a run as Ctrl-C does; `StopOnSignal`: the first asks a loop to stop at its next
item, as the worker pool of retokenize and score does).

Memory model: the totals (one small counter per input file).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InputError
from ...format import DatasetMeta, ShardInfo
from ..config import PrepareConfig
from ..documents.sources import GREW, SPLIT_INTO_PARAGRAPHS
from ..documents.worker import DECODE_REPLACED, DROP_CHARS, LINE_DROP
from ..stops import STOP_SIGNALS

if TYPE_CHECKING:
    from ..documents.worker import ItemResult

# per-source counts that are not drops, and the prefixes of those kept by reason
NOT_DROPS = ("records", "lines_removed", SPLIT_INTO_PARAGRAPHS, GREW, DECODE_REPLACED)
NOT_REASONS = (LINE_DROP, DROP_CHARS)
# A build's document keys go to files of this many keys (128 MiB) each, so that scale-out runs
# write them in parallel, each file by one task (docs/format.md).
KEYS_PER_FILE = int(os.environ.get("LMSHARD_KEYS_PER_FILE", 1 << 24))


@dataclass
class Totals:
    """Counts that end up in the metadata."""

    records: int = 0
    docs_kept: int = 0
    tokens: int = 0
    chars: int = 0
    duplicates: int = 0
    drops: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    per_source: dict[int, Counter[str]] = field(default_factory=dict)
    dedup_bytes: int = 0
    lines_removed: int = 0
    near_examples: list[dict[str, Any]] = field(default_factory=list)  # --near-dedup: removed with survivor
    near_snippets: dict[str, Any] = field(default_factory=dict)  # their texts, kept until the metadata is written
    line_drops: Counter[str] = field(default_factory=Counter)  # lines the filters' edits removed, by reason
    drop_chars: Counter[str] = field(default_factory=Counter)  # characters of the documents dropped, by reason

    def to_json(self) -> dict[str, Any]:
        return {"records": self.records, "docs_kept": self.docs_kept, "tokens": self.tokens, "chars": self.chars,
                "duplicates": self.duplicates, "drops": dict(self.drops), "examples": self.examples,
                "per_source": {str(k): dict(v) for k, v in self.per_source.items()},
                "lines_removed": self.lines_removed, "near_examples": self.near_examples,
                "near_snippets": self.near_snippets, "line_drops": dict(self.line_drops),
                "drop_chars": dict(self.drop_chars)}  # fmt: skip

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> Totals:
        return cls(records=raw["records"], docs_kept=raw["docs_kept"], tokens=raw["tokens"], chars=raw["chars"],
                   duplicates=raw["duplicates"], drops=Counter(raw["drops"]), examples=dict(raw["examples"]),
                   per_source={int(k): Counter(v) for k, v in raw["per_source"].items()},
                   lines_removed=raw["lines_removed"], near_examples=list(raw.get("near_examples", [])),
                   near_snippets=dict(raw.get("near_snippets", {})), line_drops=Counter(raw.get("line_drops", {})),
                   drop_chars=Counter(raw.get("drop_chars", {})))  # fmt: skip

    @classmethod
    def of_dataset(cls, meta: DatasetMeta) -> Totals:
        """The totals a run over the dataset's own inputs ended with (the base of --append)."""
        drops = Counter({k: v for k, v in meta.drops.items() if k != "duplicate"})
        examples = dict(meta.drop_examples) | {LINE_DROP + k: v["example"] for k, v in meta.line_drops.items()}
        return cls(records=meta.records_read, docs_kept=meta.total_docs, tokens=meta.total_tokens,
                   chars=meta.run.input_chars if meta.run else 0, duplicates=meta.drops.get("duplicate", 0),
                   drops=drops, examples=examples, lines_removed=meta.dedup.lines_removed if meta.dedup else 0,
                   line_drops=Counter({k: v["lines"] for k, v in meta.line_drops.items()}),
                   drop_chars=Counter(meta.drop_chars))  # fmt: skip


@dataclass
class Progress:
    """Running totals passed to the progress callback after each work item."""

    bytes_done: int = 0
    bytes_total: int = 0
    docs: int = 0
    tokens: int = 0
    chars: int = 0
    bytes_at_start: int = 0  # what a resumed run had done before this process started: rates leave it out
    tokens_at_start: int = 0
    note: str | None = None  # what --resume kept, in the first call only
    complete: bool = False  # --resume found the dataset complete: nothing was done


def check_not_empty(config: PrepareConfig, totals: Totals, base: Totals, shards: list[ShardInfo]) -> None:
    """A run that keeps no document (or no training document) fails, saying why, unless
    --allow-empty. `base` is the appended-to dataset's totals."""
    if config.allow_empty:
        return
    new_docs = totals.docs_kept - base.docs_kept
    if new_docs == 0:
        if totals.records == base.records:
            why = "the inputs hold no records"
        else:
            causes = totals.drops - base.drops
            causes["duplicate"] = totals.duplicates - base.duplicates
            top = sorted(((n, k) for k, n in causes.items() if n > 0), reverse=True)
            why = "every record was dropped: " + ", ".join(f"{k} {n:,}" for n, k in top)
            if any(k == "too_long" for _, k in top):
                why += f" (--max-chars is {config.max_chars:,}; raise it, or pass --overlong truncate)"
        what = "no new document was appended" if base.docs_kept else "no document was kept"
        raise InputError(f"{what}: {why}; nothing was written (pass --allow-empty to accept an empty result)")
    train_docs = sum(s.n_docs for s in shards if s.split == "train")
    if train_docs == 0:
        raise InputError(f"all {new_docs:,} kept documents went to the val split (--val-fraction "
                         f"{config.val_fraction}); lower --val-fraction, add input, or pass --allow-empty")  # fmt: skip


class Stopped(KeyboardInterrupt):
    """A stop signal that ends the run where it is: a second one during the build, or SIGTERM
    outside it. `signum` says which (the exit status is 128 + signum, as shells report it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopOnSignal:
    """While active (in the main thread), the first Ctrl-C or SIGTERM only sets `signum`, so the
    run can stop at the next work item with a checkpoint; a second one stops it at once."""

    def __init__(self) -> None:
        self.signum = 0
        self._old: dict[int, Any] = {}

    @property
    def asked(self) -> bool:
        return self.signum != 0

    def __enter__(self) -> StopOnSignal:
        # Not where a signal is ignored: a job started in the background (or under a scheduler
        # that ignores it) must keep ignoring the terminal's Ctrl-C, as it did before.
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum:
            raise Stopped(signum)
        self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)
        self._old = {}


@contextlib.contextmanager
def sigterm_stops() -> Iterator[None]:
    """SIGTERM raises `Stopped` wherever the run is, as Ctrl-C raises KeyboardInterrupt, so it
    ends the same way (in the main thread, where SIGTERM has its default action only: an
    ignored one stays ignored, a caller's own handler stays in charge)."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)


def account(totals: Totals, result: ItemResult, keep: np.ndarray, dupes: np.ndarray, specials: int,
            near: np.ndarray | None = None) -> None:  # fmt: skip
    """Add one work item's counts to `totals`: `keep` its kept documents, `dupes` its duplicates,
    `near` its near-duplicates (--near-dedup; counted as the drop `near_duplicate`)."""
    if near is not None and near.any():
        totals.drops["near_duplicate"] += int(near.sum())
        ids, n = np.unique(result.doc_sources[near], return_counts=True)
        for src, count in zip(ids.tolist(), n.tolist(), strict=True):
            totals.per_source.setdefault(src, Counter())["near_duplicate"] += count
    kept_lengths = result.lengths[keep]
    totals.docs_kept += int(keep.sum())
    totals.tokens += int(kept_lengths.sum()) + specials * len(kept_lengths)  # + the EOT (and BOS) of each
    totals.chars += result.chars
    totals.duplicates += int(dupes.sum())
    for src, counts in result.counts.items():
        totals.per_source.setdefault(src, Counter()).update(counts)
        totals.records += counts.get("records", 0)
        totals.drops.update({k: v for k, v in counts.items() if k not in NOT_DROPS and not k.startswith(NOT_REASONS)})
        totals.line_drops.update({k[len(LINE_DROP) :]: v for k, v in counts.items() if k.startswith(LINE_DROP)})
        totals.drop_chars.update({k[len(DROP_CHARS) :]: v for k, v in counts.items() if k.startswith(DROP_CHARS)})
        totals.lines_removed += counts.get("lines_removed", 0)
    for name, mask in (("kept", keep), ("duplicate", dupes)):
        ids, n = np.unique(result.doc_sources[mask], return_counts=True)
        for src, count in zip(ids.tolist(), n.tolist(), strict=True):
            totals.per_source.setdefault(src, Counter())[name] += count
    for reason, example in result.examples.items():
        totals.examples.setdefault(reason, example)
