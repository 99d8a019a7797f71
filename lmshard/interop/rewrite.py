"""A dataset rewritten by planned tasks (`lmshard retokenize --num-tasks N`, retoktasks.py;
`lmshard score --num-tasks N`, scoretasks.py): the plan's files, and what every such run's
tasks share.

**The plan** is made once (by the command that plans the run) in the work folder beside `--out`
(`.NAME.lmshard-work`, as a planned prepare's): tables of JSON lines with their byte offsets
(`write_table`; a task reads only its own rows, `read_rows`: two reads), among them `units` (a
row per source shard: its split, the split's documents before it, its entry) and `keys` (the
source's key files); the source's metadata without its shards, key files and inputs
(`source.json`: what every task needs of it); and last `rewrite.json`, the head: what kind of
run, its options, the task count, the lmshard version (a task of another refuses: its bytes
could differ), and the source metadata's inode, size and time, which every task holds the source
to (one stat). Planned again with the same options, a run goes on from
what is done; with others, every task refuses in one line naming what changed.

**The tasks** (`Planned.run`): task t of a stage has items [t·n/N, (t+1)·n/N) of the stage's n;
an item writes under temporary names and its marker last, so a task killed anywhere is finished
by running it again. A task folds its summary into the stage's (prepare's barrier.py); the next
stage's tasks check that one file. A task then removes what its mark makes redundant (`tidy`:
its items' markers; a retokenize's write task, the encoded units only its shards read), so the
finish is left a few files per task, not per shard. Temporary files have names of their own
(two tasks may write the same work file at once: the same bytes). The finish (once) removes the
build's temporary files (a killed writer's), writes the metadata into `build/`, swaps it into
`--out` (an old one renamed aside first, removed last) and removes the work folder but for the
Slurm jobs' logs, the source's head and then the head last. A finish run again after the swap
(the build gone, the dataset in place: `swapped`) only finishes that removal.

Memory model: a task holds the head, the source's head and the rows it reads; see each run's
module for its items.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from .. import __version__
from ..errors import ConfigError, InputError
from ..format import METADATA_FILE, DatasetMeta, ShardInfo, atomic_write_bytes, atomic_write_json, parse_metadata
from ..format.attributes import row_dtype
from ..prepare.execution.barrier import is_complete, read_summary, task_done, task_finished
from ..prepare.execution.stages import _task_state
from ..prepare.execution.taskplan import remove_work as remove_run_work
from ..prepare.execution.taskplan import work_dir
from .output import _check_out, _swap_in

HEAD_FILE = "rewrite.json"
SOURCE_FILE = "source.json"  # the source's metadata without its shards, key files and inputs
VERSION = 1


def planned(out: str | os.PathLike[str]) -> str | None:
    """The kind of the planned rewrite in `out`'s work folder (retokenize, score), or None."""
    try:
        return str(json.loads((work_dir(os.path.realpath(out)) / HEAD_FILE).read_text())["kind"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def swapped(out: str | os.PathLike[str]) -> bool:
    """Whether the rewrite planned for `out` is in place already: its head is there, its build is
    not, and `out` holds a dataset (a finish stopped after the swap; its work folder is left)."""
    work = work_dir(os.path.realpath(out))
    return (work / HEAD_FILE).is_file() and not (work / "build").is_dir() and (Path(out) / METADATA_FILE).is_file()


def remove_work(work: Path) -> None:
    """A finished rewrite's work folder removed (prepare's `remove_work`: the Slurm jobs' logs
    stay), the source's head and then the plan's head last, so a removal stopped midway is
    finished by running the finish (or the command) again."""
    remove_run_work(work, (SOURCE_FILE, HEAD_FILE))


def claim(work: Path, head: dict[str, Any], meta: DatasetMeta, units: list[tuple[str, int, ShardInfo]],
          target: Path, overwrite: bool) -> bool:  # fmt: skip
    """Write the plan (module docstring) for `head` unless the same plan is there: True when it
    was there already (the run goes on). `units`: (split, documents of the split before it,
    shard) per source shard the run rewrites."""
    if (work / "plan.json").exists():
        raise ConfigError(f"{work}: holds a planned prepare of {target}; finish it (lmshard status {target}) or "
                          "choose another --out")  # fmt: skip
    head = {"version": VERSION, "lmshard": __version__, "dataset": os.path.realpath(meta.root),
            "source": stamp(meta.root), "units": len(units), "keys": len(meta.dedup.files) if meta.dedup else 0,
            } | head  # fmt: skip
    if swapped(target):  # an earlier run, complete but for its work folder
        remove_work(work)
    if (work / HEAD_FILE).is_file():
        _same(head, json.loads((work / HEAD_FILE).read_text()), work)
        return True
    _check_out(target, bool(head.get("overwrite")), [meta.root], "--overwrite")
    (work / "build").mkdir(parents=True, exist_ok=True)
    (work / "slurm" / "arrays.json").unlink(missing_ok=True)  # (an earlier run's submission: not this one's)
    write_table(work / "units", [{"split": split, "first": first, "shard": shard.to_json()}
                                 for split, first, shard in units])  # fmt: skip
    write_table(work / "keys", [k.to_json() for k in meta.dedup.files] if meta.dedup else [])
    source = meta.to_json() | {"splits": {}, "n_tokens": 0, "n_docs": 0, "sources": []}  # (what every task needs)
    if meta.dedup:
        source["dedup"] = source["dedup"] | {"files": []}
    atomic_write_json(work / SOURCE_FILE, source)
    atomic_write_json(work / HEAD_FILE, head)  # last: the plan is complete
    return False


def _same(head: dict[str, Any], found: dict[str, Any], work: Path) -> None:
    """Refuse, naming what changed, a plan that differs from the one in `work`."""
    again = f"run the first command again to finish it, or remove {work} to start over"
    what = {"kind": "command", "lmshard": "lmshard version", "dataset": "source dataset",
            "source": "source's metadata (changed since)", "vocabulary": "new vocabulary (its file, or its "
            "separators)", "n_tasks": "--num-tasks", "overwrite": "--overwrite"}  # fmt: skip
    for key, value in head.items():
        if key == "options":
            for option, given in value.items():
                if found.get("options", {}).get(option) != given:
                    raise ConfigError(f"{work}: a {found.get('kind')} was planned there with --"
                                      f"{option.replace('_', '-')} {found['options'].get(option)} (now {given}); "
                                      f"{again}")  # fmt: skip
        elif found.get(key) != value and key in what:
            raise ConfigError(f"{work}: a {found.get('kind')} was planned there with another {what[key]}; {again}")


def read_head(out: str | os.PathLike[str], kind: str) -> tuple[Path, dict[str, Any], DatasetMeta]:
    """The work folder, head and source head (its metadata without its shards) of the `kind` run
    planned for `out`, held to the source it was made from."""
    work = work_dir(os.path.realpath(out))
    try:
        head = json.loads((work / HEAD_FILE).read_text())
    except FileNotFoundError:
        raise InputError(f"{out}: no {kind} is planned there (its work folder {work} has no {HEAD_FILE})") from None
    if head.get("version") != VERSION or head.get("kind") != kind or head.get("lmshard") != __version__:
        raise InputError(f"{work}: holds a {head.get('kind')} planned by lmshard {head.get('lmshard')} (this is "
                         f"{__version__}), whose tasks could write other bytes; run it with that version, or remove "
                         "the folder and plan again")  # fmt: skip
    if stamp(Path(head["dataset"])) != head["source"]:
        raise ConfigError(f"{head['dataset']}: the source dataset changed since the {kind} was planned; remove {work} "
                          "and plan again")  # fmt: skip
    return work, head, parse_metadata(Path(head["dataset"]), json.loads((work / SOURCE_FILE).read_text()))


def stamp(root: Path) -> list[int]:
    """What changes when the source's metadata is written again: its inode, size and time."""
    info = os.stat(root / METADATA_FILE)
    return [info.st_ino, info.st_size, info.st_mtime_ns]


def write_table(base: Path, rows: list[dict[str, Any]]) -> None:
    """Rows as JSON lines in `base`.jsonl, and their byte offsets (uint64, one more than the rows)
    in `base`.off, so a task reads only its own rows (`read_rows`)."""
    lines = [json.dumps(row, separators=(",", ":")).encode() + b"\n" for row in rows]
    offsets = np.zeros(len(lines) + 1, dtype="<u8")
    np.cumsum([len(line) for line in lines], out=offsets[1:])
    atomic_write_bytes(base.with_suffix(".jsonl"), b"".join(lines))
    atomic_write_bytes(base.with_suffix(".off"), offsets.tobytes())


def read_rows(base: Path, rows: range) -> list[Any]:
    """Rows `rows` of a table `write_table` wrote: two reads, of their offsets and their lines."""
    if not rows:
        return []
    offsets = np.fromfile(base.with_suffix(".off"), dtype="<u8", count=len(rows) + 1, offset=rows.start * 8)
    with open(base.with_suffix(".jsonl"), "rb") as f:
        f.seek(int(offsets[0]))
        data = f.read(int(offsets[-1] - offsets[0]))
    return [json.loads(line) for line in data.splitlines()]


def join_rows(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """A stage's summary: its tasks' rows, in task order."""
    return {"rows": [row for part in parts for row in part["rows"]]}


@dataclasses.dataclass
class Planned:
    """What every task of a planned rewrite works from; a run's class adds its stages (a method
    per stage, returning the task's summary {"rows": [...]}), `after`, `totals` and `metadata`."""

    STAGES: ClassVar[tuple[str, ...]]  # the stages, the finish last
    MARKERS: ClassVar[dict[str, str]]  # per stage: an item's marker, with {:06d} for its number
    work: Path
    head: dict[str, Any]
    meta: DatasetMeta  # the source's head (no shards: a task reads its rows of the units)

    @property
    def n_tasks(self) -> int:
        return int(self.head["n_tasks"])

    @property
    def n_units(self) -> int:
        return int(self.head["units"])

    def share(self, n_items: int, task: int) -> range:
        """Task `task`'s items of `n_items`: a contiguous range, as even as can be."""
        return range(task * n_items // self.n_tasks, (task + 1) * n_items // self.n_tasks)

    def units(self, rows: range) -> list[tuple[str, int, ShardInfo]]:
        """Units `rows`: (split, the split's documents before it, the source shard), from the table."""
        width = row_dtype(self.meta.attributes).itemsize if self.meta.attributes else 0
        return [(row["split"], row["first"], dataclasses.replace(ShardInfo.parse(row["split"], row["shard"]),
                                                                 attr_width=width))
                for row in read_rows(self.work / "units", rows)]  # fmt: skip

    def keys(self, task: int) -> list[dict[str, Any]]:
        """Task `task`'s share of the source's key files (their entries)."""
        return read_rows(self.work / "keys", self.share(int(self.head["keys"]), task))

    def out(self) -> Path:
        return self.work.parent / self.work.name.removeprefix(".").removesuffix(".lmshard-work")

    def run(self, stage: str, task: int, record: bool = True) -> int:
        """Task `task` of `stage` (its items with a marker skipped); how many items it did.
        `record`: its state kept for `status` while it runs (`_recorded`; not for the local pool's
        tasks, which its own process stops and reports)."""
        if stage not in self.STAGES:
            raise ConfigError(f"--stage {stage}: a {self.head['kind']}'s stages are {', '.join(self.STAGES)}")
        if not 0 <= task < self.n_tasks:
            raise ConfigError(f"task {task} is not in [0, {self.n_tasks}); tasks are numbered from 0")
        index = self.STAGES.index(stage)
        before = self.STAGES[index - 1] if index else None
        if stage == "finish" and swapped(self.out()):  # swapped in by a finish stopped after
            remove_work(self.work)
            return 0
        if before is not None and not is_complete(self.work, before):
            raise ConfigError(f"--stage {stage}: the {before} stage is not complete; run every {before} task first "
                              f"(lmshard status {self.out()})")  # fmt: skip
        if stage == "finish":
            return self.finish(read_summary(self.work, before)["rows"] if before else [])
        if task_finished(self.work, stage, self.n_tasks, task):  # (a task run again: its marker folded, or folded now)
            if not is_complete(self.work, stage) and task_done(self.work, stage, self.n_tasks, task, None, join_rows):
                self.after(stage)
            self.tidy(stage, task)
            (self.work / "tasks" / f"{stage}_{task:06d}.json").unlink(missing_ok=True)  # (a state left by a stop)
            return 0
        return self._recorded(stage, task) if record else self._share(stage, task)

    def _share(self, stage: str, task: int) -> int:
        """Task `task`'s items of `stage`, then its mark (folded into the stage's summary: the task
        that completes it does `after`) and its tidying; how many items it did."""
        (self.work / stage).mkdir(exist_ok=True)
        summary = getattr(self, stage)(task)
        if task_done(self.work, stage, self.n_tasks, task, summary, join_rows):
            self.after(stage)
        self.tidy(stage, task)
        return len(summary["rows"])

    def _recorded(self, stage: str, task: int) -> int:
        """Task `task`'s share of `stage`, its state recorded for `status` as a planned prepare's
        task records it (stages.recorded)."""
        from ..prepare.execution.stages import recorded

        def stopped(name: str) -> str:
            return f"{stage} task {task} stopped by {name}; what it finished is kept: run it again to finish it"

        with recorded(self.work, stage, task, stopped):
            return self._share(stage, task)

    def tidy(self, stage: str, task: int) -> None:
        """What task `task`'s mark of `stage` makes redundant, removed by the task: its items'
        markers (the mark holds their rows), so the finish is left a few files per task."""
        total = self.totals()[stage]
        for i in self.share(total or 0, task):
            (self.work / stage / self.MARKERS[stage].format(i)).unlink(missing_ok=True)

    def after(self, stage: str) -> None:
        """What the task that completes `stage` does once (nothing, unless a run says otherwise)."""

    def totals(self) -> dict[str, int | None]:
        """Per stage, its items (None while not known)."""
        return {stage: self.n_units for stage in self.STAGES[:-1]}

    def metadata(self, build: Path, rows: list[Any]) -> int:
        """Write the new dataset's metadata (and what else the finish writes) into `build`, from
        the last stage's summary `rows`; the number of shards."""
        raise NotImplementedError

    def finish(self, rows: list[Any]) -> int:
        build = self.work / "build"
        for stray in build.rglob("*.tmp"):  # a killed item's temporary files (named by its pid): not the dataset's
            stray.unlink()
        if not (build / METADATA_FILE).is_file():
            self.metadata(build, rows)
        _check_out(self.out(), bool(self.head.get("overwrite")), [self.meta.root], "--overwrite")
        _swap_in(build, self.out())
        remove_work(self.work)
        return len(rows)

    def status(self) -> dict[str, Any]:
        """Per stage: its items done of its items, per task too (a finished task's from its mark;
        another's from a listing of the stage's folder; all from the summary once complete)."""
        stages: dict[str, Any] = {}
        for stage, total in self.totals().items():
            if total is None:
                stages[stage] = {"total": None, "done": 0, "tasks": []}
                continue
            complete = is_complete(self.work, stage)
            names = set() if complete or not (self.work / stage).is_dir() else set(os.listdir(self.work / stage))
            tasks = []
            for task in range(self.n_tasks):
                items = self.share(total, task)
                finished = complete or task_finished(self.work, stage, self.n_tasks, task)
                done = len(items) if finished else sum(self.MARKERS[stage].format(i) in names for i in items)
                tasks.append({"task": task, "items": len(items), "done": done,
                              "state": None if finished else _task_state(self.work, stage, task)})  # fmt: skip
            stages[stage] = {"total": total, "done": sum(x["done"] for x in tasks), "tasks": tasks}
        return {"stages": stages}
