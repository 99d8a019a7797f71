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


def _levels(n: int, fan_in: int) -> int:
    levels = 0
    while n > 1:
        n = -(-n // fan_in)
        levels += 1
    return levels


def test_a_task_run_again_writes_the_same_summary(tmp_path, monkeypatch):
    """Two tasks that both see their group complete (a task run twice, or two finishing together)
    write the same bytes."""
    monkeypatch.setattr(barrier, "FAN_IN", 2)
    for task in range(4):
        task_done(tmp_path, "dedup", 4, task, {"tasks": [task]}, _join)
    first = (tmp_path / "done" / "dedup.json").read_bytes()
    assert task_done(tmp_path, "dedup", 4, 0, {"tasks": [0]}, _join)
    assert (tmp_path / "done" / "dedup.json").read_bytes() == first
    assert json.loads(first) == {"tasks": [0, 1, 2, 3]}


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
