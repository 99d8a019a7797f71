"""Where a prepare run's item results come from: this process, a pool of worker processes, or
this process first and the pool once it is up.

A worker's start (a fresh interpreter, imports, the vocabulary) costs about half a second of a
core, more than a few MB of text takes to tokenize, so the pool is started only when the work
left would take this process longer than that: the first items are always done here, the rate
they ran at estimates the rest, and the pool starts once the estimate exceeds
`POOL_START_SECONDS` (at once for inputs of unknown size: a Hugging Face stream). Until every
worker is ready this process goes on doing items itself; from then on the pool does them all.
Results come out in plan order either way, so the output bytes never depend on who did an item.

Memory model: at most `2 × workers + 2` items in flight in the pool (each ≈1 MiB of text and
its tokens), one item when done here; with --dedup-lines, the line-key set of `_line_masks`.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import IO, Any, TypeVar

import numpy as np

from ...tokenizers import Tokenizer
from ..config import PrepareConfig
from ..documents.dedup import KeySet
from ..documents.sources import Source, WorkItem, plan
from ..documents.worker import (
    ItemResult,
    WorkerConfig,
    hash_lines,
    identity_of,
    init_worker,
    process_item,
    process_lines,
    process_signatures,
    run_item,
    share_with_forks,
)
from ..output.build import Build
from ..output.rowfiles import RowFiles
from .nearpass import attach, first_pass
from .pool import OrderedPool

T = TypeVar("T")
# What starting the pool costs, in seconds of this process's own work it must save to pay off
# (0: start it at once, as tests of the pool do).
POOL_START_SECONDS = float(os.environ.get("LMSHARD_POOL_START_SECONDS", "0.5"))
# Inputs from this size on (bytes on disk) fork their workers at the start where they can:
# a forked worker costs a few ms and a vocabulary load, so even a few MB repay it.
EARLY_POOL_BYTES = 2 << 20


class Feeder:
    """Runs functions over work items in order, here or in the pool (started when worth it)."""

    def __init__(self, n: int, wcfg: WorkerConfig, stack: contextlib.ExitStack, bytes_total: int | None,
                 early: OrderedPool[WorkItem, Any] | None = None) -> None:  # fmt: skip
        """`early`: workers forked at the start of the run (`early_pool`), used from now on."""
        self.n, self.wcfg, self.stack = n, wcfg, stack
        self.bytes_total = bytes_total  # None: unknown (a stream among the inputs)
        self.pool: OrderedPool[WorkItem, Any] | None = early
        if early is not None:
            early.initialize(init_worker, wcfg)
        self.bytes_here = 0
        self.seconds_here = 0.0
        self.parallel = False  # the pool is ready and does every item from now on

    def _start_pool(self) -> None:
        if self.pool is None and self.n > 1:
            self.pool = self.stack.enter_context(OrderedPool(self.n, init_worker, self.wcfg))

    def _worth_a_pool(self, bytes_seen: int) -> bool:
        if self.bytes_total is None:
            return True
        if self.bytes_here == 0:  # items that do not say their size (CSV and JSON arrays, parsed here)
            return self.seconds_here > POOL_START_SECONDS
        if self.seconds_here <= 0:
            return False
        left = max(0, self.bytes_total - bytes_seen)
        return left / (self.bytes_here / self.seconds_here) > POOL_START_SECONDS

    def map(self, remote: Callable[[WorkItem], T], local: Callable[[WorkItem], T],
            items: Iterator[WorkItem], bytes_before: int = 0) -> Iterator[T]:  # fmt: skip
        """fn(item) for every item, in order. `bytes_before`: input bytes of skipped items."""
        seen = bytes_before
        self.bytes_here = 0  # the rate of this pass alone (line dedup's first pass only hashes)
        self.seconds_here = 0.0
        if self.n > 1 and (self.bytes_total is None or POOL_START_SECONDS <= 0):
            self._start_pool()
        for item in items:
            if self.pool is not None and (self.parallel or self.pool.ready()):
                self.parallel = True
                yield from self.pool.imap(remote, itertools.chain([item], items), window=2 * self.n + 2)
                return
            t0 = time.perf_counter()
            result = local(item)
            self.seconds_here += time.perf_counter() - t0
            self.bytes_here += item.nbytes
            seen += item.nbytes
            yield result
            if self.pool is None and self.n > 1 and self._worth_a_pool(seen):
                self._start_pool()


def input_bytes(sources: list[Source]) -> int | None:
    """Bytes on disk of all inputs; None when a stream (Hugging Face, stdin) is among them."""
    if any(s.fmt == "hf" or s.stream for s in sources):
        return None
    return sum(s.size for s in sources)


def early_pool(n: int, sources: list[Source], tokenizer: Tokenizer) -> OrderedPool[WorkItem, Any] | None:
    """`n` workers forked now, for an input big enough to need them, where forking is safe
    (`pool.start_method`): call it before this process encodes anything or starts a thread. They
    inherit `tokenizer` already loaded (shared copy-on-write: no second load, no second copy
    of its tables), get their configuration later (`Feeder`) and are ready at once, where
    spawned ones would first spend ~0.4 s of a core importing and loading."""
    total = input_bytes(sources)
    if n < 2 or (total is not None and total < EARLY_POOL_BYTES and POOL_START_SECONDS > 0):
        return None
    from .itempool import start_sharing  # (here: a small run imports none of the stages' machinery)

    if start_sharing(tokenizer) != "fork":
        return None
    share_with_forks(tokenizer)
    try:
        return OrderedPool(n, start="fork")
    finally:
        share_with_forks(None)


class Recount:
    """--max-docs: the work items in flight (each result's item is the first), so that the item
    where the N-th document falls is read again up to it (`prefix`) and counted only that far.
    Memory: the items in flight (at most 2 × workers + 2 of about 1 MiB)."""

    def __init__(self) -> None:
        self.items: collections.deque[WorkItem] = collections.deque()
        self.wcfg: WorkerConfig | None = None

    def recorded(self, items: Iterator[WorkItem]) -> Iterator[WorkItem]:
        for item in items:
            self.items.append(item)
            yield item

    def prefix(self, docs: int) -> ItemResult:
        """The current item read up to its `docs`-th document: its counts, examples and
        characters that far (no tokens)."""
        assert self.wcfg is not None
        return run_item(self.items[0], self.wcfg, None, sign=False, stop_after=docs)


def item_results(config: PrepareConfig, sources: list[Source], tokenizer: Tokenizer, build: Build,
                 early: OrderedPool[WorkItem, Any] | None = None,
                 recount: Recount | None = None) -> Iterator[ItemResult]:  # fmt: skip
    """Item results in plan order from the first item the build has not done. With
    --dedup-lines, a first pass over all items finds repeated lines (see `_line_masks`); a
    resumed run repeats it (it writes nothing but masks). `early`: see `early_pool`; `recount`:
    told each item and the worker configuration (--max-docs)."""
    wcfg = WorkerConfig(
        sources=tuple(sources),
        clean=config.clean_config(),
        tokenizer=config.tokenizer,
        tokenizer_backend=tokenizer.backend,
        separator=config.separator,
        text_field=config.text_field,
        text_mode=config.text_mode,
        on_error=config.on_error,
        decode_errors=config.decode_errors,
        expect=identity_of(tokenizer),
        minhash=config.minhash_config() if config.near_dedup else None,
        attributes=tuple(config.attributes),
    )

    def items(skip: int = 0) -> Iterator[WorkItem]:
        every = plan(sources, config.text_mode, config.text_field, config.on_error, config.hf_spec(),
                     max_chars=config.max_chars)  # fmt: skip
        return itertools.islice(every, skip, None)

    with contextlib.ExitStack() as stack:
        # OrderedPool, not multiprocessing's pools: a worker killed at any moment (OOM killer,
        # segfault) is a one-line error within seconds instead of a hang; see pool.py.
        feeder = Feeder(config.n_workers(), wcfg, stack, input_bytes(sources), early)
        stream = items(build.items_done)
        masked: tuple[IO[bytes], list[tuple[int, int]]] | None = None  # --dedup-lines: every item's line marks
        if config.dedup_lines:
            masks = stack.enter_context(tempfile.TemporaryFile())
            hashes = feeder.map(process_lines, lambda it: hash_lines(it, wcfg), items())
            index = _line_masks(hashes, masks, build.line_set(), build.line_files())
            stream = _with_masks(stream, masks, index[build.items_done :])
            masked = (masks, index)
        if recount is not None:
            recount.wcfg = wcfg
            stream = recount.recorded(stream)
        results = feeder.map(process_item, lambda it: run_item(it, wcfg, tokenizer, sign=False), stream,
                             build.bytes_done)  # fmt: skip
        if wcfg.minhash is not None:  # a first pass signs every document, then the clusters are found
            every = items() if masked is None else _with_masks(items(), *masked)
            signed = feeder.map(process_signatures, lambda it: run_item(it, wcfg, None, sign=True), every)
            near = first_pass(signed, build, wcfg.minhash)
            results = attach(results, near, build.items_done, build, sources, tokenizer)
        yield from results
        if feeder.pool is not None:
            feeder.pool.close()


def _line_masks(hashes: Iterator[np.ndarray], out: IO[bytes], seen: KeySet,
                keys: RowFiles) -> list[tuple[int, int]]:  # fmt: skip
    """Pass 1 of line dedup: in input order, mark each non-blank line kept if its text was not
    seen before (in this run or the dataset appended to); store the marks as packed bits in
    `out` and the new lines' keys in `keys`. Returns (byte offset, lines) per item. Memory: the
    set of unique lines (≈16 bytes each), 16 bytes per item."""
    index = []
    for h in hashes:
        fresh = seen.add_new(h)
        bits = np.packbits(fresh).tobytes()
        index.append((out.tell(), len(h)))
        out.write(bits)
        keys.add(h[fresh])
    keys.sync()
    return index


def _with_masks(items: Iterator[WorkItem], masks: IO[bytes], index: list[tuple[int, int]]) -> Iterator[WorkItem]:
    """Pass 2: the same items again (the plan is deterministic), each with its keep-bits."""
    for item, (offset, count) in zip(items, index, strict=True):
        masks.seek(offset)
        yield replace(item, line_keep=(masks.read((count + 7) // 8), count))
