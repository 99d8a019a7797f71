"""The stages of a planned run and the tasks that run them, on any engine: the local pool
(local_exec.py), Slurm arrays (slurm.py), Ray (ray_exec.py), or `lmshard run-task` under any
"task i of N" scheduler. Every stage's items are idempotent: each writes its results under
temporary names and a marker last, so a task killed anywhere is finished by running it again.

1. **tokenize** (per task: its units, unitfiles.py): the same cleaning, hashing and tokenizing
   code as a local run; a unit's documents as arrays, its keys partitioned by dedup bucket.
2. **dedup** (per task: a share of the plan's buckets, buckets.py): the documents whose key
   appeared earlier in plan order.
3. **select** (per task: its units, layout.py): each document's fate (duplicate, train, val)
   and the unit's totals; the last select task to finish lays out every shard and key file.
4. **write** (per task: a share of the layout's pieces, owners.py): each shard and key file
   written start to end by its one owner.
5. **finish** (once, owners.py): the metadata from the units' totals and the pieces' entries,
   the swap into `--out`, the work folder removed.

`Run` is what every stage works from (the plan, inputs, tokenizer); `run_task` runs one task of
one stage, recording its state (running, stopped by a signal, failed) for `status`. A task that
has done its share marks it, and the tasks fold their marks into one summary per stage
(barrier.py): a task checks that the stages before it are complete by reading their summaries (a
stat each), never every item's marker; the task that completes the dedup stage finds the
near-duplicate clusters, the one that completes the select stage lays out the shards, and the
select summary carries the units' totals to the layout and the metadata. `status` reads the
summaries, the finished tasks' marks, and item markers only of the tasks not finished.
--dedup-lines, --append, --max-docs, stdin and Hugging Face inputs are refused.

Memory model: a task holds the plan (about 320 bytes per unit) and what its stage's items hold
(see each stage's module); the task that lays out the shards holds the select summary (6
integers per unit); status holds one entry per task and stage.
"""

from __future__ import annotations

import bisect
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ...errors import ConfigError, InputError, LmshardError
from ...format import METADATA_FILE, atomic_write_json
from ...tokenizers import Tokenizer
from ..config import PrepareConfig
from ..documents.reading import InputGone
from ..documents.sources import Source, discover
from ..documents.worker import WorkerConfig, identity_of
from ..output.build import Totals, sigterm_stops
from ..output.claim import _fingerprint, bos_written, run_tokenizer
from ..output.staging import OutputPaths, WriterLock, read_run, recover
from .barrier import count_join, is_complete, read_summary, task_done, task_finished, write_summary
from .buckets import buckets_of, resolve, task_duplicates, unit_part
from .keyfiles import task_keys_path, write_task_keys
from .layout import LAYOUT_FILE, ensure_layout, select_join, select_summary, select_unit
from .linenumbers import absolute
from .nearstage import ensure_clusters
from .owners import finish, remove_work, seal_piece, write_part
from .taskplan import (
    PLAN_FILE,
    cut_units,
    ensure_plan,
    load_plan,
    make_plan,
    plan_difference,
    unit_size_for,
    work_dir,
)
from .unitfiles import tokenize_unit


def plan_run(config: PrepareConfig, n_tasks: int, unit_bytes: int | None = None, loaded: Any = None,
             adopt: bool = False) -> tuple[dict[str, Any], Any, Tokenizer]:  # fmt: skip
    """The run's plan (created on the first call, validated on later ones), its sources and
    tokenizer. `unit_bytes`: the plan's unit size; None: --unit-size, else sized to the tasks.
    `loaded`: the sources and tokenizer, when the caller has them. `adopt`: an existing plan's
    task count and unit size are taken (a plain prepare, whose tasks are only a unit size)."""
    check_scale_out(config)
    sources, tokenizer = loaded or load_run(config)
    fingerprint = _fingerprint(config, sources, tokenizer, None)
    work = work_dir(config.out)
    if (work / PLAN_FILE).exists():  # a later task: validate the plan, without cutting the inputs again
        plan = load_plan(work)
        if adopt:
            n_tasks, unit_bytes = int(plan["n_tasks"]), int(plan["unit_bytes"])
        # no size asked: the plan's (sized from the inputs as they were; a changed input is the fingerprint's to name)
        unit_bytes = unit_bytes or config.unit_size or int(plan["unit_bytes"])
        why = plan_difference(plan, {"n_tasks": n_tasks, "unit_bytes": unit_bytes, "fingerprint": fingerprint})
        if why is not None:
            raise ConfigError(f"{work / PLAN_FILE} was made for another run: {why}; run with the plan's options, or "
                              f"delete {work} to plan again")  # fmt: skip
        return plan, sources, tokenizer
    unit_bytes = unit_bytes or unit_size_for(sources, n_tasks, config.unit_size)
    units = cut_units(sources, config.text_mode, config.max_chars, unit_bytes)
    wanted = make_plan(fingerprint, sources, units, n_tasks, unit_bytes) | {"prepare": asdict(config)}
    return ensure_plan(work, wanted), sources, tokenizer


def check_scale_out(config: PrepareConfig) -> None:
    """Refuse, before anything is claimed, what a planned run cannot do."""
    if config.dedup_lines or config.hf or "-" in config.inputs or config.append or config.max_docs is not None:
        raise ConfigError("a scale-out run takes files only, without --dedup-lines, --append or --max-docs; run "
                          "those on one machine")  # fmt: skip


def load_run(config: PrepareConfig) -> tuple[Any, Tokenizer]:
    """The run's inputs (as prepare discovers them) and tokenizer."""
    sources = discover(config.inputs, config.format, config.exclude, include_hidden=config.include_hidden)
    return sources, run_tokenizer(config)


def config_of(out: str | os.PathLike[str]) -> tuple[PrepareConfig, int, int]:
    """The configuration, task count and unit size a plan was made with, from the output path
    alone (what `lmshard run-task` and `lmshard status` are given)."""
    plan = load_plan(work_dir(out))
    stored = plan.get("prepare")
    if not isinstance(stored, dict):
        raise InputError(f"{work_dir(out)}: the plan records no prepare options; plan again with this lmshard")
    return PrepareConfig(**stored), int(plan["n_tasks"]), int(plan["unit_bytes"])


def status(out: str | os.PathLike[str]) -> dict[str, Any]:
    """Per stage: items done of items, and per task its share and state; whether the dataset is
    complete. A complete stage is known from its summary (barrier.py), a finished task from its
    marker; only the items of unfinished tasks are looked at one by one."""
    work = work_dir(out)
    if not (work / PLAN_FILE).exists() and (Path(out) / METADATA_FILE).exists():
        return {"merged": True, "stages": {}}  # complete: the work folder goes once the dataset is in place
    plan = load_plan(work)
    config = PrepareConfig(**plan["prepare"])
    run = Run(config, plan, [], None, work, None)  # type: ignore[arg-type]
    stages: dict[str, Any] = {}
    n_tasks = plan["n_tasks"]
    for stage in STAGES[:-1]:
        if stage == "write" and not (work / LAYOUT_FILE).exists():
            stages[stage] = {"total": None, "done": 0, "tasks": []}
            continue
        complete = is_complete(work, stage)
        tasks: list[dict[str, Any]] = []
        for t in range(n_tasks):
            items = run.items(stage, t)
            if complete or task_finished(work, stage, n_tasks, t):
                tasks.append({"task": t, "items": len(items), "done": len(items), "state": None})
                continue
            tasks.append({"task": t, "items": len(items), "done": len(items) - len(run.missing(stage, items)),
                          "state": _task_state(work, stage, t)})  # fmt: skip
        stages[stage] = {"total": sum(t["items"] for t in tasks), "done": sum(t["done"] for t in tasks),
                         "tasks": tasks}  # fmt: skip
    return {"stages": stages, "units": len(plan["units"]), "buckets": plan["buckets"] if run.bucketed else 0,
            "dedup": run.bucketed, "merged": False}  # fmt: skip


def worker_config(config: PrepareConfig, sources: list[Source], tokenizer: Tokenizer) -> WorkerConfig:
    return WorkerConfig(sources=tuple(sources), clean=config.clean_config(), tokenizer=config.tokenizer,
                        tokenizer_backend=tokenizer.backend, separator=config.separator,
                        text_field=config.text_field, text_mode=config.text_mode, on_error=config.on_error,
                        expect=identity_of(tokenizer),
                        minhash=config.minhash_config() if config.near_dedup else None)  # fmt: skip


def _task_state(work: Path, stage: str, task: int) -> str | None:
    """What a task's state file says: "failed: ERROR", "running on HOST (pid P)", "died
    on HOST (pid P gone)" when that pid no longer runs on this host, or None (never started, or
    finished)."""
    try:
        state = json.loads((work / "tasks" / f"{stage}_{task:06d}.json").read_text())
    except (OSError, ValueError):
        return None
    where = f"{state.get('host')} (pid {state.get('pid')}"
    if state.get("state") == "failed":
        return f"failed on {where}): {state.get('error')}"
    if state.get("state") == "stopped":  # scancel, a time limit, Ctrl-C: nothing wrong with the task itself
        return f"stopped on {where}) by {state.get('signal')}"
    if state.get("host") == socket.gethostname() and not _alive(int(state.get("pid", 0))):
        return f"died on {where} gone: killed?)"
    return f"running on {where})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


class TaskStopped(LmshardError):
    """A task stopped by a signal; `signum` gives its exit status (128 + signum)."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = signum

    def __reduce__(self) -> tuple[Any, ...]:  # crosses process boundaries with its signal
        return (TaskStopped, (str(self), self.signum))


STAGES = ("tokenize", "dedup", "select", "write", "finish")
# Where each item's marker is: (folder in the work directory, name); "seal": a sealed piece.
_MARKERS = {"tokenize": ("tokenize", "unit_{:06d}.done"), "dedup": ("dedup", "bucket_{:06d}.done"),
            "select": ("select", "unit_{:06d}.json"), "write": ("write", "part_{:06d}.done"),
            "seal": ("write", "piece_{:06d}.json")}  # fmt: skip
JOINS = {"tokenize": count_join, "dedup": count_join, "select": select_join, "write": count_join}


@dataclass
class Run:
    """What every stage of a planned run works from: the plan, its inputs, the tokenizer."""

    config: PrepareConfig
    plan: dict[str, Any]
    sources: Any
    tokenizer: Tokenizer
    work: Path
    wcfg: WorkerConfig
    _layout: dict[str, Any] | None = None
    _dups: tuple[int, Any] | None = None  # (task, its documents' duplicates): read once per select task

    @classmethod
    def of(cls, config: PrepareConfig, n_tasks: int, unit_bytes: int | None = None, loaded: Any = None,
           adopt: bool = False) -> Run:  # fmt: skip
        plan, sources, tokenizer = plan_run(config, n_tasks, unit_bytes, loaded, adopt)
        return cls(config, plan, sources, tokenizer, work_dir(config.out), worker_config(config, sources, tokenizer))

    @property
    def bos(self) -> int | None:
        return bos_written(self.config, self.tokenizer)

    @property
    def specials(self) -> int:
        """Separator tokens each document gets: EOT, and BOS where it is written."""
        return 1 if self.bos is None else 2

    @property
    def n_units(self) -> int:
        return len(self.plan["units"])

    def layout(self) -> dict[str, Any]:
        """The layout (made once the select stage is complete), read once per process."""
        if self._layout is None:
            if (self.work / LAYOUT_FILE).exists():
                self._layout = json.loads((self.work / LAYOUT_FILE).read_text())
            else:
                rows = lambda: self.summary("select")["streams"]  # noqa: E731
                self._layout = ensure_layout(self.work, self.plan["tasks"], rows, self.config.tokens_per_shard,
                                             self.specials, self.dedup, self.near_hashes)  # fmt: skip
        return self._layout

    def items(self, stage: str, task: int) -> Sequence[int]:
        """Task `task`'s share of a stage: its units, its buckets, the parts of shards and key
        files from its units (finish: task 0)."""
        if stage in ("tokenize", "select"):
            return range(*self.plan["tasks"][task])
        if stage == "dedup":
            return buckets_of(self.plan["buckets"], self.plan["n_tasks"], task) if self.bucketed else range(0)
        if stage == "write":  # parts of shards and key files: those of its units
            return self.layout()["tasks"][task]
        return range(1 if task == 0 else 0)

    @property
    def dedup(self) -> bool:
        return self.config.dedup == "document"

    @property
    def near_hashes(self) -> int:
        """Values per MinHash signature with --near-dedup, else 0."""
        return self.config.minhash_config().n_hashes if self.config.near_dedup else 0

    @property
    def bucketed(self) -> bool:
        """Whether the run has a dedup stage: exact or near deduplication."""
        return self.dedup or self.config.near_dedup

    def clusters(self) -> None:
        """--near-dedup: the clusters of the dedup stage's edges, found once (nearstage.py)."""
        if self.config.near_dedup:
            ensure_clusters(self.work, self.plan["buckets"], self.near_hashes, self.tokenizer, self.sources,
                            self.specials, self.duplicates if self.dedup else None)  # fmt: skip

    def task_of(self, u: int) -> int:
        """The plan task that holds unit u."""
        return int(bisect.bisect_right([first for first, _ in self.plan["tasks"]], u) - 1)

    def duplicates(self, u: int) -> Any:
        """The numbers of unit u's documents that repeat an earlier one: from its task's slice of
        every bucket's duplicates, read once per task (buckets.py)."""
        task = self.task_of(u)
        if self._dups is None or self._dups[0] != task:
            found = task_duplicates(self.work / "dedup", self.plan["n_tasks"], self.plan["buckets"], task)
            self._dups = (task, found)
        return unit_part(self._dups[1], u)

    def missing(self, stage: str, items: Sequence[int] | None = None) -> list[int]:
        """The items of `stage` (tokenize, dedup, select, write, seal, finish) not done yet, of
        `items` (default: all; none once the stage is complete; for the write stage, [-1] until
        the layout exists). An item is done when its marker is there, or the mark of the task that
        holds it (a task that did its share may remove its items' markers): a stat each."""
        if stage == "write" and not (self.work / LAYOUT_FILE).exists():
            return [-1]
        if items is None and stage in JOINS and is_complete(self.work, stage):
            return []
        if stage == "keys":  # the tasks that tokenized units and have not gathered their keys
            tasks = range(self.plan["n_tasks"] if self.bucketed else 0) if items is None else items
            return [t for t in tasks if self._has_units(t) and not task_keys_path(self.work, t).exists()]
        if stage == "finish":  # its one item is done once the dataset is in place
            return [] if (Path(self.config.out) / METADATA_FILE).exists() else list(items or range(1))
        if items is None:
            n = {"tokenize": self.n_units, "select": self.n_units,
                 "dedup": self.plan["buckets"] if self.bucketed else 0}.get(stage)  # fmt: skip
            if n is None:
                n = len(self.layout()["parts" if stage == "write" else "pieces"])
            items = range(n)
        folder, name = _MARKERS[stage]
        owner = self._owner(stage)
        finished: dict[int, bool] = {}

        def done(i: int) -> bool:
            if (self.work / folder / name.format(i)).exists():
                return True
            if owner is None:
                return False
            t = owner(i)
            if t not in finished:
                finished[t] = task_finished(self.work, stage, self.plan["n_tasks"], t)
            return finished[t]

        return [i for i in items if not done(i)]

    def _owner(self, stage: str) -> Callable[[int], int] | None:
        """Which task holds an item of `stage` (None: sealing, which no task owns)."""
        if stage in ("tokenize", "select"):
            return self.task_of
        if stage == "dedup":
            n, tasks = self.plan["buckets"], self.plan["n_tasks"]
            starts = [buckets_of(n, tasks, t).start for t in range(tasks)]
            return lambda b: bisect.bisect_right(starts, b) - 1  # (an empty share starts where the next one does)
        if stage == "write":
            tasks = {p: t for t, parts in enumerate(self.layout()["tasks"]) for p in parts}
            return tasks.__getitem__
        return None

    def after(self, stage: str) -> None:
        """What the task that completes a stage does once: the near-duplicate clusters after the
        dedup stage, the layout of the shards after the select stage."""
        if stage == "dedup":
            self.clusters()
        if stage == "select":
            self.layout()

    def tidy(self, stage: str, task: int) -> None:
        """Remove what task `task`'s mark of `stage` makes redundant, so the work folder shrinks
        in every task instead of one process removing it file by file at the end: after the
        select stage, the task's key file and its units' tokenize and select markers (the stage
        summaries hold what they said); after the write stage, its parts' markers."""
        w = self.work
        if stage == "select":
            task_keys_path(w, task).unlink(missing_ok=True)
            for u in self.items("select", task):
                (w / "tokenize" / f"unit_{u:06d}.done").unlink(missing_ok=True)
                (w / "select" / f"unit_{u:06d}.json").unlink(missing_ok=True)
        if stage == "write":
            for p in self.items("write", task):
                (w / "write" / f"part_{p:06d}.done").unlink(missing_ok=True)
            for u in range(*self.plan["tasks"][task]):  # (a unit that kept nothing has no part to release it)
                (w / "tokenize" / f"unit_{u:06d}.bin").unlink(missing_ok=True)
                (w / "select" / f"unit_{u:06d}.split").unlink(missing_ok=True)

    def _has_units(self, task: int) -> bool:
        first, end = self.plan["tasks"][task]
        return bool(end > first)

    def task_summary(self, stage: str, task: int) -> dict[str, Any]:
        """What task `task` reports of its share of `stage` (barrier.py): the select stage's
        stream totals and accounting of its units; elsewhere how many items it held."""
        if stage == "select":
            return select_summary(self.work, range(*self.plan["tasks"][task]))
        return {"items": len(self.items(stage, task))}

    def summary(self, stage: str, needed_by: str | None = None) -> dict[str, Any]:
        """The stage's summary: read from its one file (barrier.py), or, when every item is
        done but no task folded the markers (a run the local pool finished, a task killed after
        its items), made from the items' markers and written. Refuses an incomplete stage,
        naming it (`needed_by`: the stage that waits for it)."""
        if is_complete(self.work, stage):
            return read_summary(self.work, stage)
        missing = self.missing(stage)
        if not missing and stage == "tokenize" and self.missing("keys"):
            missing, stage = self.missing("keys"), "keys"
        if missing:
            what = {"tokenize": "units", "keys": "tasks' key files", "dedup": "buckets", "select": "units",
                    "write": "parts of shards"}[stage]  # fmt: skip
            stage = "tokenize" if stage == "keys" else stage
            raise InputError(f"the {needed_by or 'next'} stage needs the {stage} stage complete; {len(missing)} "
                             f"{what} are not done (first: {missing[0]}); run `lmshard run-task --stage {stage}` "
                             "for its tasks first")  # fmt: skip
        made = select_summary(self.work, range(self.n_units)) if stage == "select" else {"items": -1}
        write_summary(self.work, stage, made)
        return made

    def totals(self) -> Totals:
        """The run's totals for the metadata, added up in plan order by the select stage."""
        summary = self.summary("select")
        totals = Totals.parse(summary["totals"])
        totals.examples = absolute(totals.examples, self.plan, self.sources, [row[5] for row in summary["streams"]])
        return totals

    def do(self, stage: str, i: int) -> bool:
        """Item i of `stage` (a unit, a bucket, a part of a piece; "seal": a piece), skipped when
        its marker exists."""
        c = self.config
        if stage == "tokenize":
            return tokenize_unit(c, self.plan, self.sources, self.tokenizer, self.wcfg, i)
        if stage == "keys":  # task i's keys, partitioned by bucket, once its units are tokenized
            first, end = self.plan["tasks"][i]
            return self.bucketed and write_task_keys(self.work, range(first, end), i, self.plan["buckets"],
                                                     self.wcfg.minhash)  # fmt: skip
        if stage == "dedup":
            return resolve(self.work, self.plan["tasks"], self.plan["buckets"], i, self.dedup,
                           self.wcfg.minhash) >= 0  # fmt: skip
        if stage == "select":
            self.clusters()
            return select_unit(self.work, i, self.duplicates if self.dedup else None, c.seed, c.val_fraction,
                               self.specials, c.near_dedup)  # fmt: skip
        if stage == "write":
            staging = OutputPaths.of(c.out).staging
            return write_part(self.work, staging, self.layout(), i, self.specials)
        if stage == "seal":
            return seal_piece(self.work, OutputPaths.of(c.out).staging, self.layout(), i,
                              c.encoding(self.tokenizer.n_vocab))  # fmt: skip
        paths = OutputPaths.of(c.out)
        with WriterLock(paths):
            recover(paths)
            if read_run(paths.staging) is None and (paths.out / METADATA_FILE).exists():
                remove_work(self.work)  # stopped after its swap: only the work folder was left
                return True
            finish(c, paths, self.work, self.layout(), self.totals(), self.sources, self.tokenizer)
        return True

    def ready(self, stage: str) -> None:
        """Refuse a stage whose inputs are incomplete, naming the stage to run first."""
        for prior in STAGES[: STAGES.index(stage)]:  # the earliest incomplete stage is the one to run
            self.summary(prior, stage)  # one stat each, once its tasks have folded their markers
        paths = OutputPaths.of(self.config.out)
        swapped = stage == "finish" and (paths.out / METADATA_FILE).exists() and not paths.staging.exists()
        if stage in ("write", "finish") and read_run(paths.staging) is None and not swapped:
            raise InputError(f"{self.config.out}: no build was claimed for this plan; run the `lmshard prepare ... "
                             "--num-tasks N` command again (with --resume) to claim it")  # fmt: skip


def run_task(config: PrepareConfig, n_tasks: int, stage: str, task: int, unit_bytes: int | None = None) -> int:
    """Run task `task` of `stage` (skipping items already done); returns how many it did. While it
    runs, `WORK/tasks/STAGE_NNNNNN.json` records its host, pid and start; a task that raises
    records the error there (what `status` shows), one that finishes removes it."""
    run = Run.of(config, n_tasks, unit_bytes)
    if not 0 <= task < run.plan["n_tasks"]:
        raise ConfigError(f"task {task} is not in [0, {run.plan['n_tasks']}); tasks are numbered from 0")
    run.ready(stage)
    items = run.items(stage, task)
    state = run.work / "tasks" / f"{stage}_{task:06d}.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(state, {"state": "running", "host": socket.gethostname(), "pid": os.getpid(),
                              "started": time.time()})  # fmt: skip
    done = 0
    try:
        with sigterm_stops():
            done = _share(run, stage, task, items)
    except KeyboardInterrupt as e:  # SIGTERM (scancel, a time limit) or Ctrl-C: recorded as stopped, not running
        name = signal.Signals(getattr(e, "signum", signal.SIGINT)).name
        atomic_write_json(state, {"state": "stopped", "host": socket.gethostname(), "pid": os.getpid(),
                                  "signal": name})  # fmt: skip
        finished = len(items) - len(run.missing(stage, items))
        raise TaskStopped(f"{stage} task {task} stopped by {name} with {finished} of {len(items)} done; they are "
                          "kept: run the same command again to finish it",
                          getattr(e, "signum", signal.SIGINT)) from None  # fmt: skip
    except BaseException as e:
        if isinstance(e, InputGone):  # a task goes on from its markers when run again (a prepare: with --resume)
            e = InputGone(str(e).replace("run the same command with --resume", "run this task again (a whole "
                                         "run: the same prepare with --resume)"))  # fmt: skip
        atomic_write_json(state, {"state": "failed", "host": socket.gethostname(), "pid": os.getpid(),
                                  "error": f"{type(e).__name__}: {e}"[:500]})  # fmt: skip
        raise e from None
    state.unlink(missing_ok=True)
    return done


def _share(run: Run, stage: str, task: int, items: Sequence[int]) -> int:
    """Task `task`'s share of `stage`: its items (those with a marker skipped), then its key file
    (tokenize) or the seals of the pieces it completed (write); then its mark, folded into the
    stage's summary (barrier.py; the task that completes the stage does `Run.after`), and the
    markers it makes redundant removed. A task marked done before only folds."""
    n_tasks = run.plan["n_tasks"]
    if stage != "finish" and task_finished(run.work, stage, n_tasks, task):
        if not is_complete(run.work, stage) and task_done(run.work, stage, n_tasks, task, None, JOINS[stage]):
            run.after(stage)
        return 0
    workers = min(run.config.n_workers(), len(items))
    if workers > 1 and stage != "finish":  # a task with many cores: its items in a pool of its own
        from .local_exec import run_items

        todo = run.missing(stage, items)
        run_items(run, stage, todo, workers)
        done = len(todo)
    else:
        done = sum(run.do(stage, i) for i in items)
    if stage == "tokenize" and run._has_units(task):
        run.do("keys", task)
    if stage == "write":  # the pieces whose parts are all written now: the last writer seals each
        for k in sorted({run.layout()["parts"][p][0] for p in items}):
            run.do("seal", k)
    if stage == "finish":
        return done
    if task_done(run.work, stage, n_tasks, task, run.task_summary(stage, task), JOINS[stage]):
        run.after(stage)
    run.tidy(stage, task)
    return done


def tokenize_task(config: PrepareConfig, n_tasks: int, task: int, unit_bytes: int | None = None) -> int:
    return run_task(config, n_tasks, "tokenize", task, unit_bytes)
