"""One consumer's documents of a stream, as token arrays, from a position of a few integers.

Consumers are the (rank, DataLoader worker) pairs, `consumers` = world × workers of them. When
the source has at least that many shards, consumer c reads shards c, c+C, c+2C… of the epoch's
shard order, whole; otherwise every consumer reads every shard and keeps records c, c+C, c+2C…
of the source (records it does not keep are parsed, never cleaned or tokenized). Either way the
consumers' records are disjoint and together are the source.

Documents are read in windows of `window` documents, tokenized together and, with a shuffle
buffer, permuted by a generator keyed by (seed, the window's start position): so a position is
the window's start (epoch, shard ordinal, record in the shard, records dealt) and how many of
its documents were handed out, and resuming re-reads one window, never more.

Memory model: one window: its documents' text and tokens (the shuffle buffer, or 256 documents
without one), plus one work item of the shard being read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import xxhash

from ..errors import InputError
from ..prepare.documents.dedup import uniform_from_keys
from .sources import Shard

CHUNK = 256  # documents tokenized together when there is no shuffle buffer
_SALT = 0x5E1F
Origin = tuple[int, int]  # a document's shard (its index in the stream's shards) and record number there


@dataclass(frozen=True)
class Cursor:
    """Where a consumer's reading stands: the next record is record `record` of the consumer's
    `shard`-th shard in epoch `epoch`; `dealt` records of the source came before it (round-robin
    dealing only)."""

    epoch: int = 0
    shard: int = 0
    record: int = 0
    dealt: int = 0

    def ints(self) -> list[int]:
        return [self.epoch, self.shard, self.record, self.dealt]


@dataclass(frozen=True)
class DocPos:
    """A document's place: the start of its window and its index in the window's (shuffled) order."""

    window: Cursor
    k: int = 0

    def ints(self) -> list[int]:
        return [*self.window.ints(), self.k]

    @classmethod
    def of(cls, ints: list[int]) -> DocPos:
        return cls(Cursor(*ints[:4]), ints[4])


class Documents:
    """The documents of consumer `consumer` of `consumers`, epoch after epoch (`epochs` None:
    without end). `encode(texts)` gives (flat tokens, lengths) with the separators prepare writes;
    `split` keeps the documents prepare's train/val split (val_fraction, split_seed) puts there."""

    def __init__(self, shards: list[Shard], consumer: int, consumers: int, *, encode: Callable[[list[str]], tuple],
                 seed: int = 0, shuffle_buffer: int = 0, shuffle_shards: bool = False, epochs: int | None = None,
                 val_fraction: float = 0.0, split: str = "train", split_seed: int = 1337) -> None:  # fmt: skip
        self.shards, self.consumer, self.consumers = shards, consumer, consumers
        self.encode, self.seed, self.epochs = encode, seed, epochs
        self.window = shuffle_buffer if shuffle_buffer > 1 else CHUNK
        self.shuffle = shuffle_buffer > 1
        self.shuffle_shards = shuffle_shards
        self.val_fraction, self.split, self.split_seed = val_fraction, split, split_seed
        self.whole = len(shards) >= consumers
        self.counts: Counter[str] = Counter()

    def mine(self, epoch: int) -> list[int]:
        """The shard ids this consumer reads in `epoch`, in reading order."""
        n = len(self.shards)
        order = np.arange(n)
        if self.shuffle_shards:
            order = np.random.default_rng([self.seed, epoch, _SALT + 1]).permutation(n)
        return [int(i) for i in (order[self.consumer :: self.consumers] if self.whole else order)]

    def __call__(self, start: DocPos = DocPos(Cursor())) -> Iterator[tuple[DocPos, np.ndarray, Origin]]:
        """(position, tokens, origin) of every document from `start` on."""
        at, skip = start.window, start.k
        empty = 0  # whole epochs in a row without a document of this reader's
        seen, whole = False, at == Cursor(at.epoch) and skip == 0  # (an epoch resumed part way is not counted)
        records = self._records(at)
        while self.epochs is None or at.epoch < self.epochs:
            texts, origins, end = self._read(at, records)
            if texts:
                seen = True
                tokens, lengths = self.encode(texts)
                bounds = np.concatenate([[0], np.cumsum(lengths)])
                order = np.arange(len(texts))
                if self.shuffle:
                    order = np.random.default_rng([self.seed, *at.ints(), _SALT]).permutation(len(texts))
                for k in range(skip, len(texts)):
                    d = int(order[k])
                    yield DocPos(at, k), tokens[bounds[d] : bounds[d + 1]], origins[d]
            skip = 0
            if end.epoch != at.epoch:
                empty = 0 if seen else empty + 1 if whole else empty
                # An endless reader with nothing to read would loop for ever. With the shard order
                # shuffled per epoch, a reader may draw only empty shards for a while: give it as
                # many epochs as a few full turns of the readers before calling the part empty.
                if self.epochs is None and empty >= (10 * self.consumers if self.shuffle_shards else 1):
                    raise InputError(self._nothing(at.epoch))
                seen, whole = False, True
            at = end

    def _nothing(self, epoch: int) -> str:
        if self.consumers == 1:  # one reader read everything: there is nothing to share out
            return ("lmshard.stream: the source gave no document: every record was empty or dropped after cleaning "
                    "(and the filters and the split); check the text field, the filters and the split, or the "
                    "source's contents")  # fmt: skip
        how = "whole shards" if self.whole else "records dealt round-robin"
        return (f"lmshard.stream: reader {self.consumer} of {self.consumers} (ranks × DataLoader workers, {how}) got "
                f"no document up to epoch {epoch}; the source has too few documents (after cleaning and the split) "
                "for this many readers: use fewer DataLoader workers or ranks, or more data")  # fmt: skip

    def _records(self, at: Cursor) -> Iterator[tuple[str | None, Cursor, Origin]]:
        """Every record of this reader's part from `at` on, through the ends of epochs: its
        cleaned text (None: dropped, or another reader's), the position after it and where it
        came from. One shard is opened at a time and read once, however many windows it fills."""
        epoch, shard, record, dealt = at.epoch, at.shard, at.record, at.dealt
        while self.epochs is None or epoch < self.epochs:
            mine = self.mine(epoch)
            while shard < len(mine):
                phase = (self.consumer - dealt + record) % self.consumers  # whose the shard's first record is
                every, phase = (1, 0) if self.whole else (self.consumers, phase)
                for number, text in self.shards[mine[shard]].documents(self.counts, record, every, phase):
                    record += 1
                    dealt += 1
                    yield text, Cursor(epoch, shard, record, dealt), (mine[shard], number)
                shard, record = shard + 1, 0
            yield None, Cursor(epoch + 1), (-1, -1)  # the end of the epoch
            epoch, shard, record, dealt = epoch + 1, 0, 0, 0

    def _read(self, at: Cursor, records: Iterator[tuple[str | None, Cursor, Origin]]) -> tuple[list[str],
                                                                                                list[Origin], Cursor]:
        """The texts of the next window (never past the end of an epoch) from `records`, which
        stand at `at`, where each came from, and where the window ends; at an epoch's end, the
        start of the next."""
        texts: list[str] = []
        origins: list[Origin] = []
        for text, after, origin in records:
            if after.epoch != at.epoch:
                return texts, origins, after
            if text is not None and self._in_split(text):
                texts.append(text)
                origins.append(origin)
                if len(texts) == self.window:
                    return texts, origins, after
        return texts, origins, Cursor(at.epoch + 1)

    def _in_split(self, text: str) -> bool:
        if not self.val_fraction:
            return self.split == "train"
        key = np.array([xxhash.xxh3_64_intdigest(text.encode("utf-8"))], dtype=np.uint64)
        is_val = bool(uniform_from_keys(key, self.split_seed)[0] < self.val_fraction)
        return is_val == (self.split == "val")
