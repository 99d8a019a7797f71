"""The stage barrier (prepare/execution/barrier.py): the stage's summary appears exactly when the
last of its tasks finishes, in whatever order they finish, joined in task order; each task reads
at most a group's markers per level."""

from __future__ import annotations

import json
import random

import pytest

import lmshard.prepare.execution.barrier as barrier
from lmshard.prepare.execution.barrier import is_complete, read_summary, task_done, task_finished, widths


def _join(parts):
    return {"tasks": [t for p in parts for t in p["tasks"]]}


@pytest.mark.parametrize(("n_tasks", "fan_in"), [(1, 64), (2, 2), (7, 2), (9, 3), (64, 4), (65, 8)])
def test_summary_is_written_by_the_last_task_whatever_the_order(tmp_path, monkeypatch, n_tasks, fan_in):
    monkeypatch.setattr(barrier, "FAN_IN", fan_in)
    order = list(range(n_tasks))
    random.Random(n_tasks * 31 + fan_in).shuffle(order)
    for k, task in enumerate(order):
        assert not is_complete(tmp_path, "select")
        top = task_done(tmp_path, "select", n_tasks, task, {"tasks": [task]}, _join)
        assert top == (k == n_tasks - 1)  # only the last to finish completes the tree
        assert task_finished(tmp_path, "select", n_tasks, task)
    assert read_summary(tmp_path, "select") == {"tasks": list(range(n_tasks))}  # task order, not finishing order
    assert len(widths(n_tasks)) - 1 == _levels(n_tasks, fan_in)
    left = [p for p in (tmp_path / "done").rglob("*") if p.is_file()]
    assert [p.name for p in left] == ["select.json"]  # each fold removed the marks it joined: none per task
    assert all(task_finished(tmp_path, "select", n_tasks, t) for t in range(n_tasks))


def test_a_task_whose_group_was_folded_is_finished_and_goes_on_from_the_groups_mark(tmp_path, monkeypatch):
    """9 tasks in groups of 3: tasks 0-2 folded into group 0 (their marks removed); the task
    that would fold the top was killed before it (its mark written, the top not). A task of a
    folded group counts as finished; `marks` gives the group's mark for its tasks; run again,
    task 1 goes on from its group's mark and completes the stage."""
    monkeypatch.setattr(barrier, "FAN_IN", 3)
    for task in range(8):
        task_done(tmp_path, "dedup", 9, task, {"tasks": [task]}, _join)
    barrier._write(barrier._marker(tmp_path, "dedup", 9, 0, 8), {"tasks": [8]})  # marked, then killed
    assert not (tmp_path / "done" / "dedup" / "0_000000" / "000001.json").exists()
    assert all(task_finished(tmp_path, "dedup", 9, t) for t in range(9)) and not is_complete(tmp_path, "dedup")
    got = barrier.marks(tmp_path, "dedup", 9)
    assert [(list(r), m) for r, m in got] == [([0, 1, 2], {"tasks": [0, 1, 2]}), ([3, 4, 5], {"tasks": [3, 4, 5]}),
                                              ([6], {"tasks": [6]}), ([7], {"tasks": [7]}), ([8], {"tasks": [8]})]
    assert not task_done(tmp_path, "dedup", 9, 1, None, _join)  # run again: up from its group's mark, to wait there
    assert not is_complete(tmp_path, "dedup")
    assert task_done(tmp_path, "dedup", 9, 8, None, _join)  # run again: folds group 2, then the top
    assert read_summary(tmp_path, "dedup") == {"tasks": list(range(9))}


def _levels(n: int, fan_in: int) -> int:
    levels = 0
    while n > 1:
        n = -(-n // fan_in)
        levels += 1
    return levels


def test_two_tasks_that_finish_together_fold_once(tmp_path, monkeypatch):
    """Tasks 0 and 1 of a group both marked before either looked (they finished together): the
    first to look folds the group (and the stage), the second finds the group folded and
    returns; the summary is the same as in any order, and no mark per task is left."""
    monkeypatch.setattr(barrier, "FAN_IN", 2)
    for task in (2, 3):
        task_done(tmp_path, "dedup", 4, task, {"tasks": [task]}, _join)
    for task in (0, 1):
        barrier._write(barrier._marker(tmp_path, "dedup", 4, 0, task), {"tasks": [task]})
    assert task_done(tmp_path, "dedup", 4, 1, None, _join)
    assert not task_done(tmp_path, "dedup", 4, 0, None, _join)
    assert json.loads((tmp_path / "done" / "dedup.json").read_text()) == {"tasks": [0, 1, 2, 3]}
    assert [p.name for p in (tmp_path / "done").rglob("*.json")] == ["dedup.json"]


def test_a_task_reads_at_most_a_group_per_level(tmp_path, monkeypatch):
    """With 4,000 tasks in groups of 8 (5 levels), a task lists one folder per level it looks at
    (never a stat per sibling) and reads marks only of the groups it completes: counted."""
    listed: list[str] = []
    read: list[str] = []
    real_scandir, real_read = barrier.os.scandir, barrier.Path.read_text

    def scandir(path):
        listed.append(str(path))
        return real_scandir(path)

    def read_text(path, *a, **k):
        read.append(str(path))
        return real_read(path, *a, **k)

    n = 4_000
    monkeypatch.setattr(barrier, "FAN_IN", 8)
    monkeypatch.setattr(barrier.os, "scandir", scandir)
    monkeypatch.setattr(barrier.Path, "read_text", read_text)
    for task in range(8 * 8 - 1):  # all but the last of the first 8 groups of level 0
        task_done(tmp_path, "tokenize", n, task, {"items": 1}, barrier.count_join)
    listed.clear(), read.clear()
    task_done(tmp_path, "tokenize", n, 8 * 8 - 2, None, barrier.count_join)  # a task run again: its group waits
    assert (len(listed), len(read)) == (1, 0)
    listed.clear(), read.clear()
    task_done(tmp_path, "tokenize", n, 8 * 8 - 1, {"items": 1}, barrier.count_join)
    assert len(widths(n)) == 5 and len(listed) == 3 and len(read) == 8 * 2  # up two levels, then a group waits
    assert (tmp_path / "done" / "tokenize" / "2_000000" / "000000.json").exists()


def test_a_task_killed_between_two_levels_of_its_fold_finishes_it_when_run_again(tmp_path, monkeypatch):
    """8 tasks in groups of 2 (3 levels): the last task folds its group and the next level, then
    is killed before the top (the marks below removed). Run again, it goes on from the highest
    mark that covers it and completes the stage."""
    monkeypatch.setattr(barrier, "FAN_IN", 2)
    for task in range(7):
        task_done(tmp_path, "s", 8, task, {"tasks": [task]}, _join)
    joins = []

    def killed_third(parts):
        joins.append(1)
        if len(joins) == 3:
            raise KeyboardInterrupt  # killed before the fold into the top
        return _join(parts)

    with pytest.raises(KeyboardInterrupt):
        task_done(tmp_path, "s", 8, 7, {"tasks": [7]}, killed_third)
    assert task_finished(tmp_path, "s", 8, 7) and not is_complete(tmp_path, "s")
    assert task_done(tmp_path, "s", 8, 7, None, _join)
    assert read_summary(tmp_path, "s") == {"tasks": list(range(8))}


def test_a_task_that_finds_its_group_folded_while_it_reads_does_not_fail(tmp_path, monkeypatch):
    """Task 0 listed its full group, then another task folded the group and the level above
    (removing the marks) before task 0 read them: task 0 returns, without an error."""
    monkeypatch.setattr(barrier, "FAN_IN", 2)
    for task in range(4):
        task_done(tmp_path, "s", 4, task, {"tasks": [task]}, _join)
    monkeypatch.setattr(barrier, "_marked", lambda folder: 2)  # the listing it saw before the marks went
    assert not task_done(tmp_path, "s", 4, 0, None, _join)
    assert read_summary(tmp_path, "s") == {"tasks": [0, 1, 2, 3]}
