"""When a stage of a planned run is complete, known from one file: a tree of task markers that the
tasks themselves fold into the stage's summary.

Each task that has done every item of its share of a stage writes its marker,
`WORK/done/STAGE/0_GGGGGG/TTTTTT.json`, holding its summary (what the stages after need from
it: for the select stage, its units' stream totals and their accounting, layout.py). Markers
are grouped FAN_IN at a time in task order, a folder per group (G: the task's number over
FAN_IN). A task that has written its marker lists its group's folder (one request, not a stat
per sibling); if every marker is there, it reads them, writes the group's marker one level up
(`1_...`), the children's summaries joined in task order, removes the children (the group's
marker holds them: no stage leaves a mark per task to the finish), and looks at that group in
turn. A task's share is done when its marker or that of a group above it is there. The single
marker at the top is the stage's summary, `WORK/done/STAGE.json`: its existence says the stage
is complete, and the next stage's tasks read that one file instead of every item's marker.

Two tasks that finish together each write their own marker before they look, so the later of
the two writes sees both (a file created is seen by every later stat) and goes up; both may,
and then they write the same bytes (one that finds a child gone finds the group's marker the
other wrote before removing it, and goes on from that). A task killed between its
marker and its group's leaves the group unwritten until a task of the group is run again (one
whose group was folded goes on from the group's marker) or `complete`
finds the stage done from its items (a run finished by another path, such as the local pool,
which writes the summary at once).

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

from ...format import in_folder
from . import volatile

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
        children = [_marker(work, stage, n_tasks, level, c) for c in range(group * FAN_IN,
                                                                           min(sizes[level], (group + 1) * FAN_IN))]
        if len(children) > 1 and _marked(children[0].parent) < len(children):
            above = _highest(work, stage, n_tasks, level + 1, i // FAN_IN)  # folded already, its marks removed?
            if above is None:
                return False  # a sibling still runs: the last of the group to finish goes up
            level, i = above  # go on from the highest mark that covers this task
            continue
        try:
            joined = join([json.loads(c.read_text()) for c in children])
        except FileNotFoundError:  # another task folded this group and removed its marks meanwhile
            above = _highest(work, stage, n_tasks, level + 1, i // FAN_IN)
            if above is None:
                return False  # (it folded to the top: the stage is complete)
            level, i = above
            continue
        _write(_marker(work, stage, n_tasks, level + 1, group), joined)
        for c in children:  # folded: the group's mark holds them (the finish is left no mark per task)
            c.unlink(missing_ok=True)
        level, i = level + 1, group
    return True


def _highest(work: Path, stage: str, n_tasks: int, level: int, i: int) -> tuple[int, int] | None:
    """The highest existing mark, below the stage's summary, of the groups above mark `i` of
    `level` (inclusive), as (level, index); None when there is none."""
    top = len(widths(n_tasks)) - 1
    found = None
    while level < top:
        if _marker(work, stage, n_tasks, level, i).exists():
            found = (level, i)
        level, i = level + 1, i // FAN_IN
    return found


def _write(path: Path, summary: dict[str, Any]) -> None:
    """A marker, its folder made when missing."""
    in_folder(lambda: volatile.write_json(path, summary), path.parent)


def forget(work: Path, stage: str, n_tasks: int, task: int) -> None:
    """Remove task `task`'s marker of a complete stage (if a fold left it): the summary says it
    all now."""
    if is_complete(work, stage) and len(widths(n_tasks)) > 1:
        _marker(work, stage, n_tasks, 0, task).unlink(missing_ok=True)


def marks(work: Path, stage: str, n_tasks: int) -> list[tuple[range, dict[str, Any] | None]]:
    """The stage's marks in task order, each with the tasks it covers: a task's own, or the
    mark of a folded group (whose tasks' marks were removed); (range(t, t + 1), None) for a task
    with no mark. For a stage complete by its items whose summary was never folded."""
    sizes = widths(n_tasks)
    out: list[tuple[range, dict[str, Any] | None]] = []
    t = 0
    while t < n_tasks:
        for level in range(len(sizes) - 2, -1, -1):  # the highest mark that starts at task t
            span = FAN_IN**level
            if t % span:
                continue
            try:
                mark = json.loads(_marker(work, stage, n_tasks, level, t // span).read_text())
            except FileNotFoundError:
                continue
            out.append((range(t, min(n_tasks, t + span)), mark))
            t += span
            break
        else:
            out.append((range(t, t + 1), None))
            t += 1
    return out


def is_complete(work: Path, stage: str) -> bool:
    return summary_path(work, stage).exists()


def read_summary(work: Path, stage: str) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads(summary_path(work, stage).read_text())
    return summary


def task_finished(work: Path, stage: str, n_tasks: int, task: int) -> bool:
    """Whether task `task` wrote its marker (or a group above it, or the whole stage is
    complete), looked at from the task's own up: a fold that completes the top and removes the
    level below meanwhile is seen either way."""
    return task_marked(work, stage, n_tasks, task) or is_complete(work, stage)


def task_marked(work: Path, stage: str, n_tasks: int, task: int) -> bool:
    """Whether task `task`'s marker is there, or that of a group it was folded into (a stat per
    level, from the task's own up; not the stage's summary)."""
    levels = len(widths(n_tasks)) - 1
    return any(_marker(work, stage, n_tasks, level, task // FAN_IN**level).exists() for level in range(levels))


def write_summary(work: Path, stage: str, summary: dict[str, Any]) -> None:
    """The stage's summary, written by a caller that knows every item is done."""
    _write(summary_path(work, stage), summary)


def count_join(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of stages whose tasks report only how many items they hold."""
    return {"items": sum(int(p.get("items", 0)) for p in parts)}


def running(pid: int) -> bool:
    """Whether process `pid` runs on this host (a killed process not yet reaped does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False  # gone (or no /proc: then nothing tells it apart, and the claim is taken over)
    except IndexError:
        return True
    return state not in ("Z", "X")
