"""The local executor: every stage of a planned run (stages.py) in this process or a pool of
worker processes on this machine. It runs every plain `prepare` (plainplan.py sizes its units)
and `prepare --num-tasks N` without `--executor`: the same stages, the same files and the same
bytes as on a cluster.

This process claims `--out` (planclaim.begin) and holds the writer lock for the whole run; then it
only schedules. Each stage's items (the units to tokenize, each task's keys to gather, the
dedup groups of buckets, the units to select, the parts of shards and key files to write, then
the shards and key files to seal) go to `--workers` processes, in plan order, and the next
stage starts once every item of this one is done. The layout (a walk over the units' totals)
and the metadata (finish) are the only other work done here: neither reads a document. A unit
larger than half again a worker's share (one large compressed file, which no plan cuts) is
read here, its work items tokenized by every worker (itempool.units_in_pool). A killed run
leaves its items' markers, so `--resume` skips what was done; Ctrl-C or SIGTERM stop the
workers at once (an item cut short has no marker and is redone).

Below POOL_BYTES of input (files, whose size is known) and with one worker every item runs in
this process; so do the items after tokenizing of a plan of one unit (every worker tokenized it).
With --max-docs the tokenize stage goes in plan order, `--workers` units at a time, and stops
once the units from the first on hold N kept documents (maxdocs.EarlyStop): the unit that holds
the N-th stops after its work item, those in progress after it are given up, and the units left
are never read, and have no file in any stage (`Run.unread`). A unit larger than half again a
worker's share is read here once every unit before it is done, and its items spread.

Memory model: each worker holds what its stage's item holds (unitfiles.py, buckets.py,
layout.py, owners.py: at most one work item's tokens, or one unit's per-document arrays); this
process holds the plan, the layout and one future per item of the current stage (with
--max-docs, the keys of the kept documents counted so far: ≈16 bytes each); while it reads a
unit spread over the workers, at most 2 × workers + 2 work items and their results (≈1 MiB of
text and its tokens each) and the unit's per-document arrays (≈20 bytes a document).
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ...errors import ConfigError, InputError
from ...format import load_metadata
from ...remote.retry import RemoteError
from ..config import PrepareConfig
from ..documents.reading import InputGone, InputReadError, nothing_kept, work_kept
from ..documents.sources import WorkItem
from ..documents.worker import ItemResult, run_item
from ..output.build import Progress, sigterm_stops
from ..output.staging import Interrupted, OutputPaths, WriterLock, commit, os_error
from . import plainplan, volatile
from .barrier import is_complete
from .finish import finish
from .itempool import early_pool, in_pool, in_pool_until, item_pool, large_units, spread, started, units_in_pool
from .maxdocs import EarlyStop
from .plainplan import small_plan
from .planclaim import begin
from .run import Run
from .runplan import check_scale_out, load_run
from .taskplan import PLAN_FILE, remove_work, work_dir
from .unitfiles import skip_unit, unit_marker


def run(config: PrepareConfig, n_tasks: int, unit_bytes: int | None = None,
        on_progress: Callable[[Any], None] | None = None, loaded: Any = None, adopt: bool = False,
        started: float | None = None) -> Any:  # fmt: skip
    """Claim --out, run every stage here, swap the dataset in; returns its metadata. `loaded`:
    the sources and tokenizer when the caller has them; `adopt`: a resumed plain prepare goes on
    with the plan it made (sized to the --workers it had), whatever --workers is now; `started`:
    when the command started (its time and rate in the metadata are this attempt's)."""
    started = time.time() if started is None else started
    paths = OutputPaths.of(config.out)
    check_scale_out(config)  # before --out is claimed: a refused run leaves nothing behind
    with sigterm_stops(), WriterLock(paths), contextlib.ExitStack() as stack:
        sources, tokenizer = loaded or load_run(config)
        early = None  # a Hugging Face dataset: opened by the claim and the plan, which start threads; fork first
        if config.n_workers() > 1 and any(s.fmt == "hf" for s in sources):
            make = functools.partial(Run.of, config, n_tasks, unit_bytes, adopt=True, tokenizer=tokenizer)
            early = stack.enter_context(early_pool(config.n_workers(), tokenizer, make))
        claim = begin(config, paths, sources, tokenizer, work_dir(config.out))
        if claim.complete is not None:  # (killed after its swap: only the work folder was left)
            remove_work(work_dir(config.out))
            if on_progress is not None and config.resume:
                on_progress(Progress(note=f"resuming: {paths.out} is already complete; nothing to do", complete=True))
            return claim.complete
        if claim.commit_pending:
            commit(paths)
            remove_work(work_dir(config.out))
            return load_metadata(paths.out)
        kept = f"the work done so far is kept in {work_dir(config.out)}"
        try:  # (the plan and a stream's saved copy unsynced, as the work files: the boot recorded first)
            with volatile.local_run(work_dir(config.out)):
                r = _planned(config, n_tasks, unit_bytes, (sources, tokenizer), adopt)
        except (InputReadError, RemoteError) as e:  # (an input gone since the claim: the claim is kept)
            raise work_kept(e, kept, isinstance(e, InputGone)) from None
        try:
            with volatile.local_run(r.work):  # every task runs here: work files unsynced (volatile.py)
                progress = _stages(r, on_progress, claim.resumed, early)
            totals = r.totals()  # (the rate counts the tokens of the units tokenized now: a resumed run's own)
            attempt = (started, max(0, totals.tokens - progress.own_tokens()))
            # (the inputs as found, not as read: stdin keeps its name and size 0)
            return finish(config, paths, r.work, r.layout(), totals, sources, r.tokenizer, r.previous_meta(), attempt)
        except KeyboardInterrupt as e:
            if getattr(e, "complete", None):  # (the dataset was in place when it came: finish.py)
                raise
            raise Interrupted(kept, getattr(e, "signum", 2)) from None
        except MemoryError:  # this process ran out of memory, not the input's fault: keep the work
            raise work_kept("out of memory (lower --workers, or free memory)", kept, False) from None
        except (InputReadError, RemoteError) as e:  # the machine or the store failed, not the input: keep the work
            raise work_kept(e, kept, isinstance(e, InputGone)) from None
        except OSError as e:  # a full disk, a failing device (in a worker or here): keep the work
            raise work_kept(os_error(e, paths.out, resumable=True), kept, False) from None
        except (InputError, ConfigError):  # the input or an option is at fault: nothing worth resuming
            shutil.rmtree(paths.staging, ignore_errors=True)
            shutil.rmtree(r.work, ignore_errors=True)
            raise


def claim(config: PrepareConfig, n_tasks: int) -> tuple[Any, dict[str, Any]]:
    """For a run whose tasks run elsewhere (Slurm, Ray, any scheduler): claim --out (under the
    writer lock, released after) and make the plan. Returns the claim and the plan."""
    paths = OutputPaths.of(config.out)
    check_scale_out(config)
    with WriterLock(paths):
        sources, tokenizer = load_run(config)
        claimed = begin(config, paths, sources, tokenizer, work_dir(config.out))
        volatile.settle(work_dir(config.out))  # a local run's work, made durable for the tasks of other machines
        if claimed.commit_pending:  # killed after the metadata, before the swap: only the swap is left
            commit(paths)
            claimed.complete = load_metadata(paths.out)
        if claimed.complete is not None:
            remove_work(work_dir(config.out))
            return claimed, {}
        return claimed, _planned(config, n_tasks, None, (sources, tokenizer)).plan


def _planned(config: PrepareConfig, n_tasks: int, unit_bytes: int | None, loaded: Any, adopt: bool = False) -> Run:
    """The run, planned once its streams are saved (runplan.spool_streams). Stdin or a pipe is
    read once: one that fails or is stopped before the plan is made leaves nothing (the claim and
    the work folder removed), and no --resume is offered, as in one process. Neither does an input
    found at fault before the plan (a Hugging Face id that cannot be opened): the next run starts
    afresh, as after any input error."""
    try:
        return Run.of(config, n_tasks, unit_bytes, loaded=loaded, adopt=adopt)
    except BaseException as e:
        stream, paths = next((s for s in loaded[0] if s.stream), None), OutputPaths.of(config.out)
        at_fault = isinstance(e, InputError) and not isinstance(e, InputReadError)  # (not the machine's)
        if (stream is None and not at_fault) or (work_dir(config.out) / PLAN_FILE).exists():
            raise
        shutil.rmtree(paths.staging, ignore_errors=True)
        shutil.rmtree(work_dir(config.out), ignore_errors=True)
        if stream is None:
            raise
        if isinstance(e, KeyboardInterrupt):
            raise Interrupted("", getattr(e, "signum", 2)) from None
        if isinstance(e, OSError | InputReadError):
            raise nothing_kept(os_error(e, paths.out) if isinstance(e, OSError) else e, stream.path) from None
        raise


def _stages(r: Run, on_progress: Callable[[Any], None] | None, resumed: bool = False, pool: Any = None) -> _Progress:
    """Every stage's items not done yet, in this process or a pool (`pool`: forked already)."""
    c = r.config
    # --max-docs: the units after those that hold N kept documents are not read (while any is left to
    # tokenize: once the stage is complete, the write stage removes the units' files as it copies them)
    early = None
    if c.max_docs is not None and not c.near_dedup and (left := r.missing("tokenize")):
        early = EarlyStop(r.work, c.max_docs, r.dedup, set(range(r.n_units)) - set(left))
        early.mark()  # (a resumed run may count its N from the units done before: those after are never read)
    todo = {stage: r.missing(stage) for stage in r.stages[:3]}
    workers = min(r.config.n_workers(), max(len(t) for t in todo.values()) or 1)
    if any(large_units(r, todo.get(s, []), r.config.n_workers(), True) for s in ("lines", "tokenize")):
        workers = r.config.n_workers()  # (its work items go to every worker)
    if small_plan(r.plan["units"]):
        workers = 1
    # One small unit, which every worker tokenized: its later stages' few items cost less here than a round trip each
    later_here = r.n_units == 1 and small_plan(r.plan["units"], plainplan.ONE_UNIT_BYTES)
    progress = _Progress(r, on_progress, resumed)

    def done(stage: str, i: int, counted: Any = None) -> None:
        progress.done(stage, i)
        if stage == "tokenize" and early is not None:
            early.done(i, counted)
            early.mark()  # (once N are counted, the units in progress in the pool are given up)

    if workers <= 1:
        for stage in _order(r):
            items = list(_todo(r, stage))
            here = _counted(r, progress.step) if stage == "tokenize" and on_progress is not None else None
            for k, i in enumerate(items):
                if stage == "tokenize" and early is not None and early.enough:
                    _skip(r, items[k:], progress)
                    break
                stop = early.stop_for(i, here=True) if stage == "tokenize" and early is not None else None
                ran = r.do(stage, i, stop, here)
                done(stage, i, stop if ran else None)
            _summarize(r, stage)
        return progress
    with item_pool(r, workers, pool) as pool:
        for stage in _order(r):
            if stage == "tokenize" and early is not None:
                _skip(r, _until_enough(r, pool, workers, early, progress.step, done), progress)
            elif stage in ("lines", "tokenize"):
                step = progress.step if stage == "tokenize" else None
                units_in_pool(pool, r, stage, list(_todo(r, stage)), workers, progress.done, step, True)
            elif later_here:
                for i in _todo(r, stage):
                    r.do(stage, i)
                    progress.done(stage, i)
            else:
                in_pool(pool, stage, list(_todo(r, stage)), workers, progress.done)
            _summarize(r, stage)
    return progress


def _counted(r: Run, step: Callable[[Any], None]) -> Callable[[Iterator[WorkItem]], Iterator[ItemResult]]:
    """A unit's work items tokenized in this process, each counted as it is done (`step`: its
    counts until the unit is done, then the unit's own), so that a run of units as large as
    UNIT_BYTES in this process shows progress as one reading process does, item by item."""

    def tokenized(items: Iterator[WorkItem]) -> Iterator[ItemResult]:
        for item in items:
            result = run_item(item, r.wcfg, r.tokenizer)
            step(result)
            yield result

    return tokenized


def _until_enough(r: Run, pool: Any, workers: int, early: EarlyStop, step: Callable[[Any], None],
                  done: Callable[..., None]) -> list[int]:  # fmt: skip
    """--max-docs in the pool: the tokenize stage's units until those from the first on hold N
    kept documents (itempool.in_pool_until); returns the units left. A unit larger than half
    again a worker's share (a compressed file) is read here once every unit before it is done,
    its work items tokenized by every worker (`spread`), and stops after the item that holds the
    N-th kept document, as one reading process does."""
    units = list(_todo(r, "tokenize"))
    large = large_units(r, units, workers, True)
    if large:
        started(pool, workers, "tokenize")  # (forked before this process reads)

    def here(u: int) -> None:
        stop = early.stop_for(u, here=True)
        ran = r.do("tokenize", u, stop, spread(pool, workers, "tokenize", step))
        done("tokenize", u, stop if ran else None)

    return in_pool_until(pool, "tokenize", units, workers, done, lambda: early.enough, early.stop_for, here, set(large))


def _skip(r: Run, units: list[int], progress: _Progress) -> None:
    """--max-docs: the units left once the units before hold N kept documents, never read
    (maxdocs.EarlyStop): no stage writes a file for them (`Run.unread`), but with --dedup-lines,
    where they are written as units of no documents that keep their lines' keys."""
    for u in units:
        if r.config.dedup_lines:
            skip_unit(r.config, r.tokenizer, r.wcfg, u, r.line_masks)
        progress.done("tokenize", u, read=r.config.dedup_lines)


def _summarize(r: Run, stage: str) -> None:
    """Once a stage's items are done here, its summary (barrier.py), as its tasks would fold it:
    a resumed run, or a task run after it, then knows the stage complete from one file."""
    done = {"linekeys": "lines", "linedup": "linedup", "keys": "tokenize", "dedup": "dedup", "select": "select",
            "write": "write"}.get(stage)  # fmt: skip
    if done is not None:
        r.summary(done)


def _order(r: Run) -> tuple[str, ...]:
    """The stages' items in order: after a task's units are hashed (--dedup-lines) or tokenized its keys are
    gathered (keyfiles.py), after the parts are written each piece is sealed."""
    steps = [s for stage in r.stages[:-1] for s in ((stage, "linekeys") if stage == "lines" else
                                                     (stage, "keys") if stage == "tokenize" else (stage,))]
    return (*steps, "seal")


def _todo(r: Run, stage: str) -> Iterable[int]:
    if stage == "select":
        r.clusters()  # --near-dedup: found here, once, from the dedup stage's edges
    if stage == "write":
        r.layout()  # laid out here, once: a walk over the units' totals
    return r.missing(stage)


class _Progress:
    """Progress for the run log: input bytes, documents and tokens of the tokenized units (with
    --dedup-lines the input is read twice: its bytes count once as each unit's lines are hashed,
    once as it is tokenized)."""

    def __init__(self, r: Run, callback: Callable[[Any], None] | None, resumed: bool = False) -> None:
        self.r, self.callback = r, callback
        self.partial = [0, 0, 0, 0]  # bytes, documents, tokens, characters of the unit being spread
        passes = 2 if r.config.dedup_lines else 1
        self.p = Progress(bytes_total=passes * sum(u[4] for u in r.plan["units"]))
        left = set(r.missing("tokenize"))
        hashed = set(range(r.n_units)) - set(r.missing("lines")) if r.config.dedup_lines else set()
        unread = r.unread
        for u in range(r.n_units):
            if u not in left:
                self._add(u, u < unread)
            if u in hashed:
                self.p.bytes_done += r.plan["units"][u][4]
        self.p.bytes_at_start, self.p.tokens_at_start = self.p.bytes_done, self.p.tokens
        if resumed and callback is not None:  # what the interrupted run left, said before any progress
            done = r.n_units - len(left)
            complete = [s for s in r.stages[:-1] if s != "tokenize" and is_complete(r.work, s)]
            stages = f"; the {', '.join(complete)} stage{'s' if len(complete) > 1 else ''} complete" if complete else ""
            self.p.note = (f"resuming: {done:,} of {r.n_units:,} units tokenized ({self.p.docs:,} documents, "
                           f"{self.p.tokens:,} tokens) kept from the interrupted run{stages}")  # fmt: skip
            callback(self.p)
            self.p.note = None

    def own_tokens(self) -> int:
        """The tokens of the units tokenized by this run (not found done), their separators included."""
        return self.p.tokens - self.p.tokens_at_start

    def step(self, result: Any) -> None:
        """A work item of a unit spread over the workers (itempool.units_in_pool): counted
        now, and replaced by the unit's own counts once it is done."""
        counts = (result.nbytes, len(result.lengths), int(result.lengths.sum()), result.chars)
        self.partial = [a + b for a, b in zip(self.partial, counts, strict=True)]
        self._count(*counts)
        if self.callback:
            self.callback(self.p)

    def _count(self, nbytes: int, docs: int, tokens: int, chars: int) -> None:
        """Counted with each document's separators (EOT, and BOS), as a dataset and one reading
        process count tokens: the progress, the resume note and the rate agree."""
        self.p.bytes_done += nbytes
        self.p.docs += docs
        self.p.tokens += tokens + self.r.specials * docs
        self.p.chars += chars

    def _add(self, u: int, read: bool = True) -> None:
        """Unit u tokenized, or never read (--max-docs: no marker to read)."""
        self._count(*(-n for n in self.partial))  # (a spread unit's items, counted as they came)
        self.partial = [0, 0, 0, 0]
        try:
            done = unit_marker(self.r.work / "tokenize", u) if read else {}
        except (OSError, ValueError):
            done = {}
        self._count(self.r.plan["units"][u][4], done.get("docs", 0), done.get("tokens", 0), done.get("chars", 0))

    def done(self, stage: str, i: int, read: bool = True) -> None:
        if stage in ("lines", "tokenize"):
            if stage == "lines":
                self.p.bytes_done += self.r.plan["units"][i][4]
            else:
                self._add(i, read)
            if self.callback:
                self.callback(self.p)


