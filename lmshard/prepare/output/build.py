"""The state of a dataset being built, and its checkpoints.

A `Build` holds everything `_run` changes as work items stream through: the two splits' shard
writers, the exact-dedup key set, the totals that end up in the metadata, and how many items are
done. `checkpoint()` makes the files durable and returns that state as JSON; `Build.start`
rebuilds it from a checkpoint (the writers cut their files back, the key set is re-read from the
keys written so far), so the resumed run goes on exactly where the checkpoint was taken and
writes the same bytes an uninterrupted run would.

The keys of every kept document are appended to `dedup/doc_keys_NNNNNN.u64` in the build (rowfiles.py; and
with --dedup-lines, the unique lines' keys to `dedup/line_keys_NNNNNN.u64`); they stay with the
dataset so `--append` can deduplicate new documents against it (docs/format.md).

Memory model: the key set (≈16 bytes per unique document), rebuilt on resume by reading the key
files in 8 MiB pieces (rowfiles.py); the totals (one small counter per input file); the writers'
open files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InputError
from ...format import SPLITS, DatasetMeta, KeyFile, ShardInfo
from ...format.attributes import row_dtype
from ..config import PrepareConfig
from ..documents.dedup import KeySet
from ..documents.sources import GREW, SPLIT_INTO_PARAGRAPHS
from ..documents.worker import DECODE_REPLACED, DROP_CHARS, LINE_DROP
from ..stops import STOP_SIGNALS
from .dictfile import run_encoding
from .rowfiles import KEY_DTYPE, SIG_DTYPE, RowFiles, read_rows
from .writer import ShardWriter

if TYPE_CHECKING:
    from ..documents.worker import ItemResult

# per-source counts that are not drops, and the prefixes of those kept by reason
NOT_DROPS = ("records", "lines_removed", SPLIT_INTO_PARAGRAPHS, GREW, DECODE_REPLACED)
NOT_REASONS = (LINE_DROP, DROP_CHARS)
# A build's document keys go to files of this many keys (128 MiB) each, so that scale-out runs
# write them in parallel, each file by one task (docs/format.md).
KEYS_PER_FILE = int(os.environ.get("LMSHARD_KEYS_PER_FILE", 1 << 24))
CHECKPOINT_SECONDS = float(os.environ.get("LMSHARD_CHECKPOINT_SECONDS", "10"))  # 0: after every work item


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
    note: str | None = None  # what --resume kept (Build.resume_note), in the first call only
    complete: bool = False  # --resume found the dataset complete: nothing was done


@dataclass
class Build:
    root: Path  # the staging directory
    writers: dict[str, ShardWriter]
    seen: KeySet
    totals: Totals
    base: Totals  # the appended-to dataset's totals (all zero for a new dataset)
    previous_keys: tuple[KeyFile, ...]
    items_done: int = 0
    bytes_done: int = 0
    lines: RowFiles | None = None  # --dedup-lines: the keys of the unique lines this build found
    source_base: int = 0  # the appended-to dataset's sources: this run's are numbered after them
    note: str | None = None  # what a resumed build kept, said once as it starts (resume_note)
    keys: RowFiles | None = None  # --dedup document: the kept documents' keys
    near: RowFiles | None = None  # --near-dedup: the kept documents' signatures

    @classmethod
    def start(cls, config: PrepareConfig, root: Path, previous: DatasetMeta | None,
              checkpoint: dict[str, Any] | None, n_vocab: int) -> Build:  # fmt: skip
        """A new build on top of `previous` (or nothing), or the one `checkpoint` recorded."""
        first = {s: previous.split_shards(s) if previous else () for s in SPLITS}
        encoding = run_encoding(config, n_vocab, previous, root)
        fields = config.attribute_fields()
        writers = {s: ShardWriter(root, s, config.tokens_per_shard, first[s], encoding, provenance=True,
                                  attributes=row_dtype(fields) if fields else None) for s in SPLITS}  # fmt: skip
        base = Totals.of_dataset(previous) if previous else Totals()
        previous_keys = previous.dedup.files if previous and previous.dedup else ()
        build = cls(root, writers, KeySet(), Totals.parse(base.to_json()), base, previous_keys,
                    source_base=len(previous.sources) if previous else 0)  # fmt: skip
        if checkpoint is not None:
            for split, state in checkpoint["writers"].items():
                writers[split].resume(state)
            build.totals = Totals.parse(checkpoint["totals"])
            build.items_done, build.bytes_done = checkpoint["items_done"], checkpoint["bytes_done"]
            build.seen = KeySet(checkpoint["seen_slots"])  # the same table size as when it was taken
        if config.near_dedup:
            rows = checkpoint.get("near_rows", 0) if checkpoint else 0
            n_hashes = config.minhash_config().n_hashes
            build.near = RowFiles(root, "near_sigs", SIG_DTYPE, n_hashes, KEYS_PER_FILE, previous_keys, rows)
        if config.dedup == "document":
            n_keys = checkpoint["n_keys"] if checkpoint else 0
            build.keys = RowFiles(root, "doc_keys", KEY_DTYPE, 1, KEYS_PER_FILE, previous_keys, n_keys)
            for keys in build.keys.stored():
                build.seen.add_new(keys)
        return build

    def resume_note(self, checkpoint: dict[str, Any] | None) -> str:
        """What `--resume` goes on from: the checkpoint's documents and shards, or nothing."""
        if checkpoint is None:
            return "resuming: no checkpoint yet: starting over"
        shards = sum(len(st["shards"]) + (st["n_docs"] > 0) for st in checkpoint["writers"].values())
        shards -= sum(len(w.first) for w in self.writers.values())  # an --append's dataset is not this run's work
        own = self.totals.docs_kept - self.base.docs_kept
        when = checkpoint.get("saved_at")
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if when else "its last save"
        return (f"resuming: {own:,} documents ({self.totals.tokens - self.base.tokens:,} tokens), "
                f"{shards:,} shards kept from the checkpoint of {at}")  # fmt: skip

    def line_files(self) -> RowFiles:
        """This build's files of unique lines' keys (--dedup-lines, KEYS_PER_FILE each, in the
        order the lines were first met), numbered after those of the dataset it extends; begun
        anew (line dedup's first pass is repeated by a resumed run)."""
        self.lines = RowFiles(self.root, "line_keys", KEY_DTYPE, 1, KEYS_PER_FILE, self.previous_keys, 0)
        return self.lines

    def line_set(self) -> KeySet:
        """The line-dedup set seeded with the appended-to dataset's lines."""
        seen = KeySet()
        for keys in read_rows(self.root, tuple(f for f in self.previous_keys if f.kind == "line"), KEY_DTYPE):
            seen.add_new(keys)
        return seen

    def checkpoint(self) -> dict[str, Any]:
        """Make everything written durable; the state `start` resumes from."""
        for rows in (self.keys, self.near):
            if rows is not None:
                rows.sync()
        return {"near_rows": self.near.rows if self.near else 0,
                "items_done": self.items_done, "bytes_done": self.bytes_done,
                "writers": {s: w.sync() for s, w in self.writers.items()}, "totals": self.totals.to_json(),
                "seen_slots": self.seen.nbytes // 8, "n_keys": self.keys.rows if self.keys else 0,
                "saved_at": time.time()}  # fmt: skip

    def close_keys(self) -> tuple[KeyFile, ...]:
        """The key files the dataset lists: the appended-to dataset's and this build's."""
        files = [f for f in self.previous_keys if f.kind != "near"]
        if self.keys is not None:
            files += self.keys.close()[len(self.keys.previous) :]
        if self.lines is not None:
            files += self.lines.close()[len(self.lines.previous) :]
        return tuple(files) + (self.near.close() if self.near is not None else ())

    def abort(self) -> None:
        """Close every writer and the key files after an error, raising nothing over it."""
        for w in self.writers.values():
            w.abort()
        for rows in (self.keys, self.near, self.lines):
            if rows is not None:
                rows.abort()


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
