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
    """With 4,000 tasks in groups of 8 (5 levels), the task that completes the first group of
    groups looks at no more than 8 marks on each level: counted by the marks it stats."""
    seen: list[str] = []
    real = barrier.Path.exists

    def counting(path):
        seen.append(str(path))
        return real(path)

    n = 4_000
    monkeypatch.setattr(barrier, "FAN_IN", 8)
    monkeypatch.setattr(barrier.Path, "exists", counting)
    for task in range(8 * 8 - 1):  # all but the last of the first 8 groups of level 0
        task_done(tmp_path, "tokenize", n, task, {"items": 1}, barrier.count_join)
    seen.clear()
    task_done(tmp_path, "tokenize", n, 8 * 8 - 1, {"items": 1}, barrier.count_join)
    assert len(widths(n)) == 5 and 8 < len(seen) <= 8 * 4  # it went up one level, reading one group per level
    assert (tmp_path / "done" / "tokenize" / "2_000000.json").exists()
