"""--near-dedup whose edges are too many for one task: the clusters found over parts by the
select stage's tasks together (prepare/execution/nearparts.py), held to a one-process run's
bytes: tasks one after another, at once in separate processes, after a claimant died, and for
an --append; the edges per part made tiny here so that a small corpus needs several parts (7
at least: fewer would hold more than one task)."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys

import pytest
from test_near import _clustered, _copy, _meta_without_run, _tree
from test_prepare import jsonl

from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.execution import local_exec, nearparts
from lmshard.prepare.execution.stages import STAGES, run_task
from lmshard.prepare.execution.taskplan import work_dir

OPTS = dict(near_dedup=True, workers=1, val_fraction=0.1, tokens_per_shard=3_000)
TASKS = dict(executor="none", unit_size=65536)  # (planned for tasks that run anywhere)


@pytest.fixture
def tiny_parts(monkeypatch):
    """A part holds 8 edges (spawned processes read it from the environment), and one task at
    most 48."""
    monkeypatch.setattr(nearparts, "EDGES_PER_PART", 8)
    monkeypatch.setenv("LMSHARD_NEAR_EDGES_PER_PART", "8")


def _stages(config, n_tasks, select=None, order=reversed):
    """Every stage's tasks here, in `order`; `select(config)` runs the select stage instead.
    Returns the parts the clusters were found over."""
    local_exec.claim(config, n_tasks)
    parts = None
    for stage in STAGES[:-1]:
        if stage == "select" and select is not None:
            select(config)
        else:
            for task in order(range(n_tasks)):
                run_task(config, n_tasks, stage, task, 65536)
        if stage == "select":
            parts = json.loads((work_dir(config.out) / "dedup" / nearparts.PARTS_FILE).read_text())["parts"]
    run_task(config, n_tasks, "finish", 0, 65536)
    return parts


def _same(a, b):
    assert _tree(a) == _tree(b)
    assert _meta_without_run(a) == _meta_without_run(b)


@pytest.mark.parametrize("n_tasks", [7, 9])
def test_parts_found_by_tasks_one_after_another_equal_one_process(tmp_path, tiny_parts, n_tasks):
    src = str(jsonl(tmp_path / "docs.jsonl", _clustered(11)))
    one = prepare(PrepareConfig(inputs=[src], out=str(tmp_path / "one"), **OPTS))
    config = PrepareConfig(inputs=[src], out=str(tmp_path / "tasks"), **TASKS, **OPTS)
    assert _stages(config, n_tasks) == n_tasks  # (more than 8 edges a task)
    assert one.drops["near_duplicate"] > 40 and one.dedup.near["examples"]
    _same(tmp_path / "tasks", tmp_path / "one")


def test_parts_found_by_select_tasks_at_once_in_processes_equal_one_process(tmp_path, tiny_parts):
    """Seven select tasks started together as `lmshard run-task` processes: they claim the
    rounds' items, wait for each other, and the dataset equals one process's."""
    src = str(jsonl(tmp_path / "docs.jsonl", _clustered(12)))
    prepare(PrepareConfig(inputs=[src], out=str(tmp_path / "one"), **OPTS))
    config = PrepareConfig(inputs=[src], out=str(tmp_path / "tasks"), **TASKS, **OPTS)

    def together(config):
        procs = [subprocess.Popen([sys.executable, "-m", "lmshard", "run-task", "--stage", "select", "--task", str(t),
                                   config.out], stderr=subprocess.PIPE, text=True)
                 for t in range(7)]  # fmt: skip
        errors = [p.communicate(timeout=300)[1] for p in procs]
        assert [p.returncode for p in procs] == [0] * 7, errors
        assert all("clusters found over 7 parts" in " ".join(e.split()) for e in errors), errors

    assert _stages(config, 7, together) == 7
    _same(tmp_path / "tasks", tmp_path / "one")


@pytest.mark.parametrize("claimant", ["dead here", "another host"])
def test_an_item_claimed_by_a_dead_or_silent_task_is_taken_over(tmp_path, tiny_parts, monkeypatch, claimant):
    """A scatter item claimed by a process that died on this host is taken over at once; one
    claimed on another host, once the claim is STALE_SECONDS old (0 here)."""
    src = str(jsonl(tmp_path / "docs.jsonl", _clustered(11)))
    prepare(PrepareConfig(inputs=[src], out=str(tmp_path / "one"), **OPTS))
    config = PrepareConfig(inputs=[src], out=str(tmp_path / "tasks"), **TASKS, **OPTS)
    if claimant == "dead here":
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        holder = f"{socket.gethostname()} {int(gone.stdout)}"
    else:
        holder = "elsewhere.example 4242"
        monkeypatch.setattr(nearparts, "STALE_SECONDS", 0.0)
    parts_dir = work_dir(config.out) / "dedup" / nearparts.PARTS

    def select(config):
        assert (parts_dir / "plan.json").exists()  # (made by the dedup stage's last task)
        claim = nearparts.scatter_marker(parts_dir, 1).with_suffix(".done.claim")
        claim.write_text(holder + "\n")
        for task in range(7):
            run_task(config, 7, "select", task, 65536)

    assert _stages(config, 7, select) == 7
    _same(tmp_path / "tasks", tmp_path / "one")


def test_a_planned_append_over_parts_equals_one_process(tmp_path, tiny_parts):
    """The appended-to dataset's documents are numbered first and never removed, over parts too."""
    rng = random.Random(7)
    old = _clustered(3, n=60)
    new = [" ".join(_copy(rng, d.split(), 0.8, 0.95)[0]) for d in old[:40]] + _clustered(4, n=60)
    rng.shuffle(new)
    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "old.jsonl", old))], out=str(tmp_path / "local"), **OPTS))
    shutil.copytree(tmp_path / "local", tmp_path / "tasks", copy_function=os.link)
    src = str(jsonl(tmp_path / "new.jsonl", new))
    local = prepare(PrepareConfig(inputs=[src], out=str(tmp_path / "local"), append=True, **OPTS))
    config = PrepareConfig(inputs=[src], out=str(tmp_path / "tasks"), append=True, **TASKS, **OPTS)
    assert _stages(config, 7) == 7
    assert local.drops["near_duplicate"] > 40
    _same(tmp_path / "tasks", tmp_path / "local")


def test_a_run_on_one_machine_finds_them_in_one_task(tmp_path, tiny_parts, monkeypatch):
    """`prepare --num-tasks 8 --workers 2` (the local executor), as a plain prepare: its tasks
    share one machine's memory, so however many edges, one task finds the clusters."""
    from lmshard.prepare.execution import nearstage

    decided = []
    monkeypatch.setattr(nearstage, "decide", lambda *a: decided.append(nearparts.decide(*a)) or decided[-1])
    src = str(jsonl(tmp_path / "docs.jsonl", _clustered(11)))
    prepare(PrepareConfig(inputs=[src], out=str(tmp_path / "one"), **OPTS))
    prepare(PrepareConfig(inputs=[src], out=str(tmp_path / "pool"), **(OPTS | {"workers": 2}), num_tasks=8,
                          unit_size=65536))  # fmt: skip
    assert decided == [1, 1]  # (the plain run's, and the planned one's)
    _same(tmp_path / "pool", tmp_path / "one")


def test_a_select_task_killed_in_the_rounds_is_taken_over_and_the_run_ends_as_one_process(tmp_path, tiny_parts):
    """`run-task --stage select` SIGKILLed while it holds a claimed item of the rounds (its 4th):
    the other tasks take the item over, and the same task run again finishes its units."""
    from proctree import wait_stopped

    src = str(jsonl(tmp_path / "docs.jsonl", _clustered(13)))
    prepare(PrepareConfig(inputs=[src], out=str(tmp_path / "one"), **OPTS))
    config = PrepareConfig(inputs=[src], out=str(tmp_path / "tasks"), **TASKS, **OPTS)

    def killed_then_rest(config):
        proc = subprocess.Popen([sys.executable, "-m", "lmshard", "run-task", "--stage", "select", "--task", "0",
                                 config.out], env=os.environ | {"LMSHARD_STOP_AT": "round:4"},
                                stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        held = wait_stopped(proc)
        assert held == proc.pid, proc.communicate()[1]
        os.kill(proc.pid, 9)
        proc.wait()
        claims = list((work_dir(config.out) / "dedup" / nearparts.PARTS).glob("*.claim"))
        assert claims and not (work_dir(config.out) / "dedup" / "near.json").exists()
        shown = subprocess.run([sys.executable, "-m", "lmshard", "status", config.out], capture_output=True, text=True)
        assert "near-duplicate clusters over 7 parts: being found; last phase done: " in shown.stdout, shown.stdout
        for task in (6, 5, 4, 3, 2, 1, 0):
            run_task(config, 7, "select", task, 65536)

    assert _stages(config, 7, killed_then_rest) == 7
    _same(tmp_path / "tasks", tmp_path / "one")


def test_the_part_count_follows_the_edges(tmp_path, monkeypatch):
    """One task up to ONE_TASK parts' worth of edges; beyond, a part per EDGES_PER_PART edges,
    at most the tasks and the fan-in, unless that leaves ONE_TASK parts or fewer (each would hold
    more than one task); decided once (a second call reads it back)."""
    import numpy as np

    monkeypatch.setattr(nearparts, "EDGES_PER_PART", 10)

    def parts(edges, n_tasks, groups=4):
        dedup = tmp_path / f"d{edges}_{n_tasks}"
        dedup.mkdir()
        for g in range(groups):
            share = edges * (g + 1) // groups - edges * g // groups
            np.zeros(2 * share, dtype="<u8").tofile(dedup / f"group_{g:06d}.near")
        first = nearparts.decide(dedup, groups, n_tasks, 8)
        assert nearparts.decide(dedup, groups, n_tasks, 8) == first
        assert (dedup / nearparts.PARTS / "plan.json").exists() == (first > 1)
        return first

    assert [parts(60, 16), parts(61, 16), parts(200, 16), parts(200, 6), parts(200, 7), parts(10_000, 1_000)] == [
        1, 7, 16, 1, 7, 64]


def test_a_task_that_comes_late_passes_the_phases_done_without_redoing_them(tmp_path, tiny_parts, monkeypatch):
    """A select task that arrives when the rounds are over but the summary is not written (it
    went here): it redoes no scatter and no superstep (their markers stay when their messages
    go), only the summary, which comes out the same."""
    from lmshard.prepare.execution.run import Run
    from lmshard.quality import clusterparts

    src = str(jsonl(tmp_path / "docs.jsonl", _clustered(11)))
    prepare(PrepareConfig(inputs=[src], out=str(tmp_path / "one"), **OPTS))
    config = PrepareConfig(inputs=[src], out=str(tmp_path / "tasks"), **TASKS, **OPTS)

    def late(config):
        for task in range(7):
            run_task(config, 7, "select", task, 65536)
        summary = work_dir(config.out) / "dedup" / "near.json"
        written = summary.read_bytes()
        summary.unlink()

        def redone(*args):
            raise AssertionError("a phase done was redone")

        with monkeypatch.context() as m:
            m.setattr(clusterparts, "scatter", redone)
            m.setattr(clusterparts, "superstep", redone)
            m.setattr(nearparts, "STALE_SECONDS", 0.0)  # (it joins the rounds at once: nothing moves)
            Run.of(config, 7, 65536).clusters(helper=9)
        assert summary.read_bytes() == written

    assert _stages(config, 7, late) == 7
    _same(tmp_path / "tasks", tmp_path / "one")


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_tasks_of_an_executor_on_one_machine_find_them_in_one_task(tmp_path, tiny_parts, executor):
    """Tasks planned for the local executor, or for a Ray instance the run starts on this machine
    (no --ray-address), share its memory: one task finds the clusters, whatever the edges."""
    src = str(jsonl(tmp_path / "docs.jsonl", _clustered(11)))
    prepare(PrepareConfig(inputs=[src], out=str(tmp_path / "one"), **OPTS))
    config = PrepareConfig(inputs=[src], out=str(tmp_path / "tasks"), executor=executor, unit_size=65536, **OPTS)
    assert _stages(config, 7) == 1
    _same(tmp_path / "tasks", tmp_path / "one")
