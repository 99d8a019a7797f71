"""The scale-out plan: a prepare run's inputs cut into units (units.py) and dealt to N tasks,
persisted beside the output so that every task of every engine (Slurm array, Ray, any "task i
of N" scheduler) works from the same plan. The plan also fixes the number of dedup buckets
(`bucket_count`), from the input's size alone, and the dedup stage's items, groups of
consecutive buckets (`group_count`), from the buckets, the input's size and the processes that
share them.

**Tasks.** Units are dealt to N tasks as contiguous runs balanced by bytes (a task ends at the
first unit boundary past its share of the total), so each task reads neighbouring data. A task
may be empty when there are fewer units than tasks.

**Persistence.** `ensure_plan` writes `plan.json` into the work directory once (a temporary file
hard-linked into place, so two tasks starting together cannot both create it) and validates it
on every later call: another configuration, input set, vocabulary or task count is refused,
naming the difference. `remove_work` removes a finished run's work folder.

Memory model: one entry per unit (a few dozen bytes).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ...errors import ConfigError, InputError
from ...format import atomic_write_json
from ...remote.urls import has_credentials
from ..documents.files import Source
from ..documents.hfread import source_bytes
from ..output.claim import difference
from . import volatile
from .plantables import (
    PLAN_FILE,
    SOURCES,
    TASKS,
    UNITS,
    SourceTable,
    TaskTable,
    UnitTable,
    identity,
    source_row,
    start_again,
    write_tables,
)
from .units import UNIT_BYTES, Unit

SWAPPED_FILE = "swapped"  # a planned run's finish: created (empty) before the swap, removed last (`swapped`)
PLAN_VERSION = 8  # 3: per-task key files (keyfiles.py); 4: dedup items are groups of buckets; 5: a stream's copy;
# 6: line stages (--dedup-lines), a unit's kept lines in its data file; 7: its records' numbers; 8: units of
# several small files
def work_dir(out: str | os.PathLike[str]) -> Path:
    """Where a scale-out run keeps its plan, the tasks' outputs and markers: `.NAME.lmshard-work`
    beside the output, as the build's `.NAME.lmshard-partial`, so `NAME` only ever holds a
    complete dataset."""
    out = Path(out)
    return out.parent / f".{out.name}.lmshard-work"


MIN_BUCKETS, MAX_BUCKETS = 32, 4096  # dedup buckets (buckets.py)
BYTES_PER_BUCKET = 256 << 20


def bucket_count(total_bytes: int) -> int:
    """Buckets for a run over `total_bytes` of input: a power of two, one per 256 MiB, 32 to 4096."""
    want = max(1, -(-total_bytes // BYTES_PER_BUCKET))
    return min(MAX_BUCKETS, max(MIN_BUCKETS, 1 << (want - 1).bit_length()))


PAIRS = 1 << 24  # dedup groups x tasks, at most: the files the dedup stage opens, and the select stage


def group_count(n_buckets: int, n_tasks: int, total_bytes: int | None = None, processes: int | None = None) -> int:
    """The dedup stage's items: a power of two, as many as the processes that can share them
    (`processes`: the tasks times each task's workers) or one per BYTES_PER_BUCKET of input,
    whichever is more, at most `n_buckets`; and at most PAIRS / `n_tasks`. So a group holds the
    keys of at most BYTES_PER_BUCKET of input below those caps, a run in one process resolves a
    small input in one group (one read of its key file), and a run of many processes gets a group
    for each. Without the input's size and processes: every bucket a group (as at scale)."""
    want = n_buckets if total_bytes is None or processes is None else \
        max(1, processes, -(-total_bytes // BYTES_PER_BUCKET))
    groups = min(n_buckets, 1 << (want - 1).bit_length())
    while groups > 1 and groups * n_tasks > PAIRS:
        groups //= 2
    return groups


def assign(units: list[Unit], n_tasks: int) -> list[tuple[int, int]]:
    """Each task's units as a contiguous range [first, end) of the plan, balanced by bytes: a
    task takes units until it passes its share of the total, always at least one while every
    later task can still have one (with fewer units than tasks, the first tasks stay empty)."""
    if n_tasks < 1:
        raise ConfigError(f"--num-tasks {n_tasks}: pass at least 1")
    total = sum(u.nbytes for u in units) or 1
    ranges, first, done = [], 0, 0
    for t in range(n_tasks):
        last = t == n_tasks - 1
        share = total * (t + 1) / n_tasks
        limit = len(units) if last else max(first, len(units) - (n_tasks - t - 1))  # a unit for each later task
        end = first
        while end < limit and (last or end == first or done + units[end].nbytes / 2 <= share):
            done += units[end].nbytes
            end += 1
        ranges.append((first, end))
        first = end
    return ranges


def make_plan(fingerprint: dict[str, Any], sources: list[Source], units: list[Unit], n_tasks: int,
              unit_bytes: int = UNIT_BYTES, hf: Any = None, workers: int = 1) -> dict[str, Any]:  # fmt: skip
    """The plan in memory: the run's fingerprint (see claim.py), the sources (with the identity
    the fingerprint gave each: its modification time or version), units and tasks; the dedup
    buckets sized to the inputs' bytes (`hf`: a Hugging Face source's HFSpec, whose are guessed),
    and their groups to the bytes and the processes (`workers` per task)."""
    total = sum(s.size for s in sources) + (source_bytes(hf) if hf is not None else 0)
    buckets = bucket_count(total)
    return {"version": PLAN_VERSION, "n_tasks": n_tasks, "unit_bytes": unit_bytes, "fingerprint": fingerprint,
            "buckets": buckets, "groups": group_count(buckets, n_tasks, total, n_tasks * workers),
            "sources": [source_row(s, ident) for s, ident in zip(sources, fingerprint["sources"], strict=True)],
            "units": [[u.source, u.kind, u.start, u.end, u.nbytes] for u in units],
            "tasks": [list(r) for r in assign(units, n_tasks)]}  # fmt: skip


def _head(plan: dict[str, Any]) -> dict[str, Any]:
    """What plan.json holds: the plan but its tables, and the fingerprint but its inputs."""
    head = {k: v for k, v in plan.items() if k not in ("units", "tasks", "sources")}
    head["fingerprint"] = {k: v for k, v in plan["fingerprint"].items() if k != "sources"}
    head |= {"n_units": len(plan["units"]), "n_sources": len(plan["sources"])}
    return head


def ensure_plan(work: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """The plan in `work`: created from `plan` if absent, else the existing one, refused if it
    was made for another configuration or task count."""
    path = work / PLAN_FILE
    if not path.exists():
        work.mkdir(parents=True, exist_ok=True)
        tmp = work / f".{PLAN_FILE}.{os.getpid()}.tmp"
        # The tasks read their inputs from the plan, so a URL's credentials must stay in it: then
        # only its owner may read it (it goes with the work folder once the dataset is complete).
        inputs = [str(i) for i in plan.get("prepare", {}).get("inputs", [])] + [str(s[5]) for s in plan["sources"]]
        private = any(has_credentials(i) for i in inputs)
        write_tables(work, plan["units"], plan["tasks"], plan["sources"], private)  # (before the head: its marker)
        atomic_write_json(tmp, _head(plan), private=private, sync=volatile.sync)
        try:
            os.link(tmp, path)  # fails if another task created it first: then validate theirs
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    existing = load_plan(work)
    why = plan_difference(existing, plan)
    if why is not None:
        raise ConfigError(f"{path} was made for another run: {why}; run with the plan's options, or "
                          f"{start_again(work)}")  # fmt: skip
    return existing


def load_plan(work: Path) -> dict[str, Any]:
    """The plan's head with its tables as sequences read a row at a time (plantables.py)."""
    path = work / PLAN_FILE
    try:
        plan = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no plan; run `lmshard prepare ... --num-tasks N` first") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable plan ({e}); {start_again(work)}") from None
    if not isinstance(plan, dict) or plan.get("version") != PLAN_VERSION:
        raise InputError(f"{path}: plan version {plan.get('version') if isinstance(plan, dict) else None!r} is not "
                         f"{PLAN_VERSION} (made by another lmshard); {start_again(work)}")  # fmt: skip
    plan["units"] = UnitTable(work / UNITS, plan["n_units"])
    plan["tasks"] = TaskTable(work / TASKS, plan["n_tasks"])
    plan["sources"] = SourceTable(work / SOURCES, plan["n_sources"])
    return plan


def plan_difference(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """What differs between a stored plan and a run's (`new["fingerprint"]` without "sources":
    a task's, which checks the inputs it reads as it reads them)."""
    if old.get("n_tasks") != new["n_tasks"]:
        return f"--num-tasks was {old.get('n_tasks')} and is {new['n_tasks']} now"
    if old.get("unit_bytes") != new["unit_bytes"]:
        return f"the unit size was {old.get('unit_bytes')} bytes and is {new['unit_bytes']} now"
    stored = dict(old.get("fingerprint", {}))
    if "sources" in new["fingerprint"]:  # the planner's: every input, as the plan recorded it
        stored["sources"] = [identity(r) for r in old["sources"]]
    return difference(stored, new["fingerprint"])


def units_of(plan: dict[str, Any], task: int) -> list[Unit]:
    """Task `task`'s units."""
    n = plan["n_tasks"]
    if not 0 <= task < n:
        raise ConfigError(f"task {task} is not in [0, {n}); the plan has {n} tasks (numbered from 0)")
    first, end = plan["tasks"][task]
    return [Unit(*u) for u in plan["units"][first:end]]


def describe(plan: dict[str, Any]) -> dict[str, Any]:
    """Sizes for a status line: units, tasks, bytes per task (min/max)."""
    per_task = [sum(u[4] for u in plan["units"][a:b]) for a, b in plan["tasks"]]
    return {"units": len(plan["units"]), "tasks": plan["n_tasks"], "bytes": sum(per_task),
            "task_bytes_min": min(per_task), "task_bytes_max": max(per_task)}  # fmt: skip


def swapped(work: Path, staging: Path) -> bool:
    """Whether the run planned in `work` has its dataset swapped in: its finish left its mark
    (`SWAPPED_FILE`, written before the swap, removed last with the work folder) and its build is
    gone. A dataset at --out alone proves nothing: an --append's or --overwrite's is there from
    the start, and its build may have been deleted to discard the run."""
    return (work / SWAPPED_FILE).exists() and not staging.exists()


def remove_work(work: Path, last: tuple[str, ...] = ()) -> None:
    """Remove a finished run's work folder, but for the Slurm jobs' logs (`slurm/`), which stay
    for the user to read (delete them with the folder when done); the files `last` after the
    rest, in that order (what a removal stopped midway needs to be run again)."""
    for entry in work.iterdir() if work.is_dir() else ():
        if entry.name == "slurm" or entry.name in last:
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    for name in last:
        (work / name).unlink(missing_ok=True)
    if work.is_dir() and not any(work.iterdir()):
        work.rmdir()
