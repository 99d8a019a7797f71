"""When a stage of a planned run is complete, known from one file: a tree of task markers that
the tasks themselves fold into the stage's summary.

Each task that has done every item of its share of a stage writes its marker,
`WORK/done/STAGE/0_GGGGGG/TTTTTT.json`, holding its summary (what the stages after need from it:
for the select stage, its units' stream totals and their accounting, layout.py). Markers are
grouped FAN_IN at a time in task order, a folder per group (G: the task's number over FAN_IN).
A task that has written its marker lists its group's folder (one request, not a stat per
sibling); if every marker is there, it reads them and writes the group's marker one level up
(`1_...`), the children's summaries joined in task order, and looks at that group in turn. The single marker
at the top is the stage's summary, `WORK/done/STAGE.json`: its existence says the stage is
complete, and the next stage's tasks read that one file instead of every item's marker.

Two tasks that finish together each write their own marker before they look, so the later of
the two writes sees both (a file created is seen by every later stat) and goes up; both may,
and then they write the same bytes. A task killed between its marker and its group's leaves
the group unwritten until that task is run again or `complete` finds the stage done from its
items (a run finished by another path, such as the local pool, which writes the summary at
once).

Cost per task: a listing per level, and ceil(log_FAN_IN(tasks)) levels (3 for 64,000 tasks);
the task that completes a group also reads its FAN_IN markers: once per group, so about one
read per task in all, whatever the number of units or tasks.

Memory model: one group's summaries at a time (a select summary holds 6 integers per unit of
the group, so the top one holds 6 per unit of the run: a few MB for 10^5 units).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...format import atomic_write_json

FAN_IN = 64  # markers per group: a task reads at most this many per level
Join = Callable[[list[dict[str, Any]]], dict[str, Any]]


def widths(n_tasks: int) -> list[int]:
    """Markers per level, from the tasks' up to the single top one."""
    levels = [max(1, n_tasks)]
    while levels[-1] > 1:
        levels.append(-(-levels[-1] // FAN_IN))
    return levels


def summary_path(work: Path, stage: str) -> Path:
    return work / "done" / f"{stage}.json"


def _marker(work: Path, stage: str, n_tasks: int, level: int, i: int) -> Path:
    if level == len(widths(n_tasks)) - 1:
        return summary_path(work, stage)
    return work / "done" / stage / f"{level}_{i // FAN_IN:06d}" / f"{i:06d}.json"


def _marked(folder: Path) -> int:
    """How many markers a group's folder holds (not the temporary files of their writes)."""
    try:
        with os.scandir(folder) as entries:
            return sum(1 for e in entries if not e.name.startswith("."))
    except FileNotFoundError:
        return 0


def task_done(work: Path, stage: str, n_tasks: int, task: int, summary: dict[str, Any] | None, join: Join) -> bool:
    """Record that task `task` did its share of `stage`, and fold complete groups upwards (see
    the module docstring). True when this call wrote the stage's summary. `summary` None: the
    task's marker is written already (a task run again goes on folding)."""
    sizes = widths(n_tasks)
    if summary is not None:
        _write(_marker(work, stage, n_tasks, 0, task), summary)
    level, i = 0, task
    while level < len(sizes) - 1:
        group = i // FAN_IN
        children = range(group * FAN_IN, min(sizes[level], (group + 1) * FAN_IN))
        if len(children) > 1 and _marked(_marker(work, stage, n_tasks, level, i).parent) < len(children):
            return False  # a sibling still runs: the last of the group to finish goes up
        joined = join([json.loads(_marker(work, stage, n_tasks, level, c).read_text()) for c in children])
        level, i = level + 1, group
        _write(_marker(work, stage, n_tasks, level, i), joined)
    return True


def _write(path: Path, summary: dict[str, Any]) -> None:
    """A marker, its folder made when missing (tried first: a request spared where it exists)."""
    try:
        atomic_write_json(path, summary)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, summary)


def forget(work: Path, stage: str, n_tasks: int, task: int) -> None:
    """Remove task `task`'s marker of a complete stage: the summary says it all now."""
    if is_complete(work, stage) and len(widths(n_tasks)) > 1:
        _marker(work, stage, n_tasks, 0, task).unlink(missing_ok=True)


def task_mark(work: Path, stage: str, n_tasks: int, task: int) -> dict[str, Any] | None:
    """Task `task`'s mark of `stage` (its summary), or None when it has not marked its share."""
    try:
        mark: dict[str, Any] = json.loads(_marker(work, stage, n_tasks, 0, task).read_text())
    except FileNotFoundError:
        return None
    return mark


def is_complete(work: Path, stage: str) -> bool:
    return summary_path(work, stage).exists()


def read_summary(work: Path, stage: str) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads(summary_path(work, stage).read_text())
    return summary


def task_finished(work: Path, stage: str, n_tasks: int, task: int) -> bool:
    """Whether task `task` wrote its marker (or the whole stage is complete)."""
    return is_complete(work, stage) or task_marked(work, stage, n_tasks, task)


def task_marked(work: Path, stage: str, n_tasks: int, task: int) -> bool:
    """Whether task `task`'s marker is there (a stat; not the stage's summary)."""
    return _marker(work, stage, n_tasks, 0, task).exists()


def write_summary(work: Path, stage: str, summary: dict[str, Any]) -> None:
    """The stage's summary, written by a caller that knows every item is done."""
    _write(summary_path(work, stage), summary)


def count_join(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of stages whose tasks report only how many items they hold."""
    return {"items": sum(int(p.get("items", 0)) for p in parts)}
