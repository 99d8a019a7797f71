"""The stages of a planned run and the tasks that run them, on any engine: the local pool
(local_exec.py), Slurm arrays (slurm.py), Ray (ray_exec.py), or `lmshard run-task` under any
"task i of N" scheduler. Every stage's items are idempotent: each writes its results under
temporary names and a marker last, so a task killed anywhere is finished by running it again.

0. With --dedup-lines, first **lines** (per task: its units' lines hashed) and **linedup**
   (per group of buckets: the lines met before), linestage.py.
1. **tokenize** (per task: its units, unitfiles.py): the same cleaning, hashing and tokenizing
   code as a local run; a unit's documents as arrays, its keys partitioned by dedup bucket.
2. **dedup** (per task: a share of the plan's groups of buckets, buckets.py): the documents whose key
   appeared earlier in plan order.
3. **select** (per task: its units, layout.py): each document's fate (duplicate, train, val)
   and the unit's totals; the last select task to finish lays out every shard and key file.
4. **write** (per task: the parts of the layout that read its units, owners.py): each shard's
   and key file's documents from one unit copied into place; each shard and key file sealed once.
5. **finish** (once, finish.py): the metadata from the units' totals and the pieces' entries,
   the swap into `--out`, the work folder removed.

`Run` (run.py) is what every stage works from; `run_task` runs one task of one stage, recording
its state (running, stopped by a signal, failed) for `status`. A task that has done its share
marks it, and the tasks fold their marks into one summary per stage (barrier.py): a task checks
that the stages before it are complete by reading their summaries (a stat each), never every
item's marker; the task that completes the dedup stage finds the near-duplicate clusters (or,
for edges too many for one task, the select tasks find them together: nearparts.py), the
one that completes the select stage lays out the shards, and the select summary carries the
units' totals to the layout and the metadata. A task with several CPUs runs its items in a pool
of its own (itempool.py). `status` reads the summaries, the finished tasks' marks, and item
markers only of the tasks not finished. A Hugging Face stream is a unit per data file
(units.py; --max-docs: maxdocs.py); an
--append's dataset keys (and signatures, and line keys) are shared out to the tasks, and its
files are numbered after the dataset's.

Memory model: a task holds the plan's head and a few rows of its tables (plantables.py) and
what its stage's items hold (see each stage's module); the task that lays out the shards holds
the select summary (6 integers per unit); status holds one entry per task and stage.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError, InputError, LmshardError
from ...format import METADATA_FILE, atomic_write_json
from ...remote.urls import is_url
from ..config import PrepareConfig
from ..documents.reading import InputGone
from ..output.build import sigterm_stops
from ..output.staging import OutputPaths, read_run
from . import volatile
from .barrier import is_complete, running, task_done, task_finished
from .itempool import large_units, run_items
from .layout import LAYOUT_FILE
from .nearparts import rounds
from .planclaim import unclaimed
from .run import JOINS, STAGES, Run, run_stages
from .runplan import check_scale_out, load_run, plan_run, worker_config
from .taskplan import (
    PLAN_FILE,
    load_plan,
    swapped,
    work_dir,
)


def config_of(out: str | os.PathLike[str]) -> tuple[PrepareConfig, int, int]:
    """The configuration, task count and unit size a plan was made with, from the output path
    alone (what `lmshard run-task` and `lmshard status` are given)."""
    plan = load_plan(work_dir(out))
    stored = plan.get("prepare")
    if not isinstance(stored, dict):
        raise InputError(f"{work_dir(out)}: the plan records no prepare options; plan again with this lmshard")
    return PrepareConfig(**stored), int(plan["n_tasks"]), int(plan["unit_bytes"])


def planned_here(out: str | os.PathLike[str]) -> Path:
    """A task run by hand (`run-task`) from any directory: this process moves to the directory the
    run was planned in, where its relative inputs and --out mean what they meant (as a Slurm
    array's --chdir and a Ray task do); returns `out` as a path that holds from there. Refused in
    one line where that directory is not on this machine and the plan has relative paths, or
    where `out` is not the output the plan was made for (moved since)."""
    given = Path(os.path.abspath(out))
    try:
        plan = load_plan(work_dir(given))
    except InputError:
        return given  # no plan (or not a readable one): config_of says so
    cwd, config = plan.get("cwd"), plan.get("prepare") or {}
    if not cwd or cwd == os.getcwd():
        return given
    if not os.path.isdir(cwd):
        paths = [("--out", config.get("out", "")), *(("input", p) for p in config.get("inputs", []))]
        relative = [f"{what} {p}" for what, p in paths if p != "-" and not is_url(p) and not os.path.isabs(p)]
        if relative:
            raise ConfigError(f"{out}: the run was planned in {cwd}, which this machine does not have, and its "
                              f"{relative[0]} is relative to it; run the task where that directory is, or plan again "
                              "with absolute paths")  # fmt: skip
        return given
    os.chdir(cwd)
    planned = os.path.realpath(config.get("out", ""))
    if planned != os.path.realpath(given):
        raise ConfigError(f"{out}: its plan was made for --out {config.get('out')} (from {cwd}), which is "
                          f"{planned}; run the task on that directory, or plan again")  # fmt: skip
    return given


def check_claimed(out: str | os.PathLike[str]) -> None:
    """Refuse a task of a plan whose build is gone: `run-task` of a plan that `prepare` made and
    claimed, its build folder deleted since (as an interrupted --append's refusal says to discard
    it), which would otherwise run every stage up to the write (the first to need the build). One
    read of the build's run record, found from `out` as given (the plan may record a relative one)."""
    if (why := _unclaimed(out)) is not None:
        raise InputError(why)


def status(out: str | os.PathLike[str]) -> dict[str, Any]:
    """Per stage: items done of items, and per task its share and state; whether the dataset is
    complete. A complete stage is known from its summary (barrier.py), a finished task from its
    marker; only the items of unfinished tasks are looked at one by one."""
    work = work_dir(out)
    if (not (work / PLAN_FILE).exists() and (Path(out) / METADATA_FILE).exists()) or \
            swapped(work, OutputPaths.of(str(out)).staging):  # fmt: skip
        return {"merged": True, "stages": {}}  # complete: the work folder goes once the dataset is in place
    plan = load_plan(work)
    config = PrepareConfig(**plan["prepare"])
    run = Run(config, plan, [], None, work, None)  # type: ignore[arg-type]
    stages: dict[str, Any] = {}
    n_tasks = plan["n_tasks"]
    for stage in run.stages[:-1]:
        if stage == "write" and not (work / LAYOUT_FILE).exists():
            # not laid out yet: every write task can start once the select stage is done (the first lays it out)
            ready = not any(row["done"] < row["total"] or any(t.get("pending") for t in row["tasks"])
                            for row in stages.values())  # fmt: skip
            stages[stage] = {"total": None, "done": 0, "tasks": [], "ready": ready}
            continue
        complete = is_complete(work, stage)
        tasks: list[dict[str, Any]] = []
        for t in range(n_tasks):
            items = run.items(stage, t)
            if complete or task_finished(work, stage, n_tasks, t):
                tasks.append({"task": t, "items": len(items), "done": len(items), "state": None})
                continue
            entry = {"task": t, "items": len(items), "done": len(items) - len(run.missing(stage, items)),
                     "state": _task_state(work, stage, t)}  # fmt: skip
            gather = {"lines": "linekeys", "tokenize": "keys" if run.bucketed else None}.get(stage)
            if gather is not None and entry["done"] == len(items) and run.missing(gather, [t]):
                entry["pending"] = True  # its items are done, its key file is not: the task is not
            tasks.append(entry)
        stages[stage] = {"total": sum(t["items"] for t in tasks), "done": sum(t["done"] for t in tasks),
                         "tasks": tasks}  # fmt: skip
    return {"stages": stages, "units": len(plan["units"]), "buckets": plan["buckets"] if run.bucketed else 0,
            "groups": plan["groups"] if run.bucketed else 0, "dedup": run.bucketed, "merged": False,
            "stale": volatile.stale(work), "rounds": rounds(work) if config.near_dedup else None,
            "unclaimed": _unclaimed(out),
            "local": config.num_tasks is None or config.executor == "local"}  # fmt: skip


def _unclaimed(out: str | os.PathLike[str]) -> str | None:
    """Why the plan's tasks cannot run (`check_claimed`); None while its build is there."""
    paths = OutputPaths.of(str(out))
    return None if read_run(paths.staging) is not None else unclaimed(out, paths, work_dir(out))


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
    if state.get("host") == socket.gethostname() and not running(int(state.get("pid", 0))):
        return f"died on {where} gone: killed?)"
    return f"running on {where})"


class TaskStopped(LmshardError):
    """A task stopped by a signal; `signum` gives its exit status (128 + signum)."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = signum

    def __reduce__(self) -> tuple[Any, ...]:  # crosses process boundaries with its signal
        return (TaskStopped, (str(self), self.signum))


def run_task(config: PrepareConfig, n_tasks: int, stage: str, task: int, unit_bytes: int | None = None) -> int:
    """Run task `task` of `stage` (skipping items already done); returns how many it did. While it
    runs, `WORK/tasks/STAGE_NNNNNN.json` records its host, pid and start; a task that raises
    records the error there (what `status` shows), one that finishes removes it."""
    why = volatile.stale(work_dir(config.out))
    if why is not None:
        raise ConfigError(f"{work_dir(config.out)}: a local run left it unsynced {why}, so its files cannot be "
                          "trusted; run `lmshard prepare ... --resume`, which discards it and starts over")  # fmt: skip
    run = Run.of(config, n_tasks, unit_bytes)
    if not 0 <= task < run.plan["n_tasks"]:
        raise ConfigError(f"task {task} is not in [0, {run.plan['n_tasks']}); tasks are numbered from 0")
    if stage not in run.stages:
        raise ConfigError(f"--stage {stage}: this run's stages are {', '.join(run.stages)}")
    run.ready(stage)
    items = run.items(stage, task)
    def stopped(name: str) -> str:
        finished = len(items) - len(run.missing(stage, items))
        kept = f"{finished} of {len(items)} done, which are kept" if finished else f"none of its {len(items)} done"
        return f"{stage} task {task} stopped by {name} with {kept}: run the same command again to finish it"

    with recorded(run.work, stage, task, stopped):
        return _share(run, stage, task, items)


def task_items(config: PrepareConfig, n_tasks: int, stage: str, task: int, unit_bytes: int | None = None) -> int:
    """How many items task `task` of `stage` has (done or not): what `run-task` says it ran them of."""
    return len(Run.of(config, n_tasks, unit_bytes).items(stage, task))


@contextlib.contextmanager
def recorded(work: Path, stage: str, task: int, stopped: Callable[[str], str]) -> Iterator[None]:
    """Task `task` of `stage` run in the block, its state in `WORK/tasks/STAGE_NNNNNN.json` for
    `status`: its host, pid and start while it runs; stopped by a signal (SIGTERM: scancel, a time
    limit; Ctrl-C), raised as TaskStopped with the message `stopped(signal name)` gives; failed,
    with the error; removed once the block is done. Any task of a planned run: a prepare's
    (`run_task`), a retokenize's or a score's (interop/rewrite.py)."""
    state = work / "tasks" / f"{stage}_{task:06d}.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    who = {"host": socket.gethostname(), "pid": os.getpid()}
    atomic_write_json(state, {"state": "running", **who, "started": time.time()})
    try:
        with sigterm_stops():
            yield
    except KeyboardInterrupt as e:  # recorded as stopped, not running: nothing wrong with the task itself
        signum = getattr(e, "signum", signal.SIGINT)
        name = signal.Signals(signum).name
        if complete := getattr(e, "complete", None):  # (the finish's, its dataset in place and the folder gone)
            raise TaskStopped(f"{stage} task stopped by {name}: {complete} was complete already", signum) from None
        atomic_write_json(state, {"state": "stopped", **who, "signal": name})
        raise TaskStopped(stopped(name), signum) from None
    except BaseException as e:
        if isinstance(e, InputGone):  # a task goes on from its markers when run again (a prepare: with --resume)
            e = InputGone(str(e).replace("run the same command with --resume", "run this task again (a whole "
                                         "run: the same prepare with --resume)"))  # fmt: skip
        atomic_write_json(state, {"state": "failed", **who, "error": f"{type(e).__name__}: {e}"[:500]})
        raise e from None
    state.unlink(missing_ok=True)


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
    if stage in ("lines", "tokenize") and large_units(run, list(items), run.config.n_workers()):  # (items spread)
        workers = run.config.n_workers()
    if workers > 1 and stage != "finish":  # a task with many cores: its items in a pool of its own
        todo = run.missing(stage, items)
        if stage == "select" and todo:  # once here, before the workers fork: they inherit both
            run.clusters(task)
            if run.dedup:
                run.duplicates(todo[0])
        run_items(run, stage, todo, workers)
        done = len(todo)
    else:
        done = sum(run.do(stage, i) for i in items)
    if stage == "lines" and (run._has_units(task) or task < run.previous_line_tasks):
        run.do("linekeys", task)
    if stage == "tokenize" and (run._has_units(task) or run.has_previous(task)):
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


__all__ = ["STAGES", "Run", "TaskStopped", "check_scale_out", "config_of", "load_run", "plan_run", "planned_here",
           "run_stages", "run_task", "status", "worker_config"]
