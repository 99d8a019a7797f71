"""The Slurm executor's arithmetic, without a cluster: each stage is one array of K array tasks,
array task I runs plan tasks I, I + K, ... below N (every task exactly once), K keeps the run's
4K + 1 jobs within the cluster's limits, and the resubmit lines run exactly the missing tasks
within the same bound. The batch scripts themselves run here under bash, with a stand-in for
the Python that would run each task (it records the task, and fails the one it is told to)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from lmshard.errors import ConfigError, LmshardError
from lmshard.prepare import PrepareConfig
from lmshard.prepare.execution import slurm
from lmshard.prepare.execution.slurm import ARRAY_STAGES, resubmit_commands, write_scripts

# Called as `PYTHON -m lmshard run-task --stage STAGE --task T OUT`: T is the 7th argument.
STUB = """#!/bin/sh
echo "$7" >> "$RAN"
if [ "$7" = "$FAIL_AT" ]; then exit 3; fi
"""


def _scripts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n_tasks: int, k: int) -> dict[str, Path]:
    stub = tmp_path / "bin" / "python"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text(STUB)
    stub.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(stub))
    return write_scripts(str(tmp_path / "out"), n_tasks, k)


def _run(script: Path, array_task: int, *args: str, fail_at: int | None = None) -> tuple[int, list[int]]:
    """The script run as array task `array_task`: its exit status and the plan tasks it ran, in order."""
    ran = script.parent / "ran.txt"
    ran.unlink(missing_ok=True)
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(array_task), "RAN": str(ran), "FAIL_AT": str(fail_at)}
    done = subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, [int(t) for t in (ran.read_text().split() if ran.exists() else [])]


def _indices(spec: str) -> list[int]:
    """An --array spec ("0-2,5") as its array indices."""
    out: list[int] = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


def _sbatch(line: str) -> tuple[list[int], str, list[str]]:
    """One printed line as (its array indices, its script's stage, the script's arguments)."""
    words = shlex.split(line.split("$(", 1)[1].rstrip(")") if "$(" in line else line)
    at = next(i for i, w in enumerate(words) if w.endswith(".sbatch"))
    arrays = [w.split("=", 1)[1] for w in words[:at] if w.startswith("--array=")]
    return (_indices(arrays[0]) if arrays else []), Path(words[at]).stem, words[at + 1 :]


@pytest.mark.parametrize(("n_tasks", "k"), [(1, 1), (5, 5), (7, 3), (12, 1), (10, 4)])
def test_array_task_i_runs_plan_tasks_i_i_plus_k_and_so_on_each_exactly_once(tmp_path, monkeypatch, n_tasks, k):
    scripts = _scripts(tmp_path, monkeypatch, n_tasks, k)
    for stage in ARRAY_STAGES:
        ran = {i: _run(scripts[stage], i) for i in range(k)}
        assert ran == {i: (0, list(range(i, n_tasks, k))) for i in range(k)}, stage
        assert sorted(t for _, tasks in ran.values() for t in tasks) == list(range(n_tasks))
    arrays = json.loads((tmp_path / ".out.lmshard-work" / "slurm" / "arrays.json").read_text())
    assert arrays == {"tasks": n_tasks, "array_tasks": k, "stages": ["tokenize", "dedup", "select", "write"]}


def test_a_failing_plan_task_fails_its_array_task_and_none_after_it_runs(tmp_path, monkeypatch):
    """So `afterok` cancels the later stages, as when an array task ran one plan task."""
    scripts = _scripts(tmp_path, monkeypatch, 10, 3)
    assert _run(scripts["dedup"], 1, fail_at=4) == (3, [1, 4])
    assert _run(scripts["dedup"], 2, fail_at=4) == (0, [2, 5, 8])


@pytest.mark.parametrize("missing", [[4], [0, 1, 2, 9], [2, 5, 8], list(range(10)), [1, 2, 3, 7], [9]])
def test_the_resubmit_lines_run_exactly_the_missing_tasks_within_the_runs_jobs(tmp_path, monkeypatch, missing):
    n_tasks, k = 10, 3
    scripts = _scripts(tmp_path, monkeypatch, n_tasks, k)
    lines = resubmit_commands(scripts, n_tasks, k, "select", missing)
    parsed = [_sbatch(line) for line in lines]
    assert [stage for _, stage, _ in parsed] == ["select", "write", "finish"]
    indices, _, args = parsed[0]
    ran = []
    for i in indices:
        code, tasks = _run(scripts["select"], i, *args)
        assert code == 0 and tasks, (i, args)  # each array task submitted has a missing task to run
        ran += tasks
    assert sorted(ran) == missing  # each missing task once, no other
    assert parsed[1] == (list(range(k)), "write", [])  # every task of each later stage
    assert sum(max(1, len(i)) for i, _, _ in parsed) <= len(ARRAY_STAGES) * k + 1


def test_the_resubmit_lines_read_as_documented(tmp_path, monkeypatch):
    scripts = {s: Path(f"/w/slurm/{s}.sbatch") for s in (*ARRAY_STAGES, "finish")}
    after = "--dependency=afterok:$j{} --kill-on-invalid-dep=yes"
    assert resubmit_commands(scripts, 5, 5, "write", [1, 3]) == [
        "j1=$(sbatch --parsable --array=1,3 /w/slurm/write.sbatch 1 3)",
        f"sbatch {after.format(1)} /w/slurm/finish.sbatch",
    ]
    assert resubmit_commands(scripts, 12, 4, "write", [2, 3, 4, 5, 11]) == [
        "j1=$(sbatch --parsable --array=0-3 /w/slurm/write.sbatch 2-5 11)",
        f"sbatch {after.format(1)} /w/slurm/finish.sbatch",
    ]
    assert resubmit_commands(scripts, 3, 3) == [  # the template `prepare` prints: the user puts in a task for I
        "j1=$(sbatch --parsable --array=I /w/slurm/tokenize.sbatch I)",
        *(f"j{j}=$(sbatch --parsable {after.format(j - 1)} --array=0-2 /w/slurm/{s}.sbatch)"
          for j, s in ((2, "dedup"), (3, "select"), (4, "write"))),
        f"sbatch {after.format(4)} /w/slurm/finish.sbatch",
    ]  # fmt: skip
    template = resubmit_commands(scripts, 12, 4)[0]  # plan task I is array task I mod K's
    assert template == "j1=$(sbatch --parsable --array=$((I % 4)) /w/slurm/tokenize.sbatch I)"
    assert resubmit_commands(scripts, 12, 4, "finish", []) == ["sbatch /w/slurm/finish.sbatch"]


@pytest.mark.parametrize(
    ("limits", "n_tasks", "max_jobs", "k"),
    [
        ((10_000, 1001), 64_000, None, 1000),  # MaxArraySize caps K: 4,001 jobs
        ((10_000, 100_001), 64_000, None, 1249),  # half of MaxJobCount caps K: 4,997 jobs of 5,000
        ((10_000, 1001), 64, None, 64),  # a run within the limits: one plan task per array task
        ((8, 1001), 12, None, 1),  # 5 jobs, the fewest a run queues (MaxJobCount 8 holds 7)
        ((10_000, 1001), 64_000, 500, 124),  # --max-jobs for a per-user MaxSubmitJobs: 497 jobs
        ((10, 1001), 12, 9, 2),  # --max-jobs past half of MaxJobCount: 9 jobs
        ((10, 1001), 12, 50, 2),  # never past MaxJobCount - 1 (9 jobs)
    ],
)  # fmt: skip
def test_k_keeps_the_runs_jobs_within_the_clusters_limits(monkeypatch, limits, n_tasks, max_jobs, k):
    monkeypatch.setattr(slurm, "cluster_limits", lambda: limits)
    assert slurm.array_tasks(n_tasks, max_jobs) == k


def test_the_limits_are_read_from_scontrol_show_config(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    shown = ["Configuration data as of now", "MaxArraySize            = 5", "MaxJobCount             = 8",
             "MaxJobId                = 67043328", "MinJobAge               = 300 sec"]  # fmt: skip
    fake.write_text(f"#!/bin/sh\nprintf '%s\\n' {' '.join(shlex.quote(line) for line in shown)}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert slurm.cluster_limits() == (8, 5)
    fake.unlink()  # no scontrol: Slurm's defaults
    assert slurm.cluster_limits() == (10_000, 1001)


def test_a_refused_sbatch_leaves_none_of_the_runs_jobs_queued(tmp_path, monkeypatch):
    """A per-user limit refuses the second stage: the first stage's array is cancelled, not left
    to run with nothing after it, and the error is sbatch's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", 'case "$*" in *tokenize.sbatch) echo 101;; *) echo "sbatch: error: Job violates '
                                  'accounting/QOS policy (job submit limit)" >&2; exit 1;; esac'),
                       ("scancel", f'echo "$@" >> {tmp_path}/cancelled'), ("scontrol", "true")):  # fmt: skip
        (bin_dir / name).write_text(f"#!/bin/sh\n{text}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with pytest.raises(LmshardError, match="sbatch dedup.sbatch failed: .*job submit limit"):
        slurm.submit(str(tmp_path / "out"), 3, None)
    assert (tmp_path / "cancelled").read_text() == "101\n"


def test_max_jobs_below_one_job_per_stage_is_refused():
    with pytest.raises(ConfigError, match="--max-jobs 4: pass at least 5"):
        PrepareConfig(inputs=["x"], out="y", max_jobs=4)


def test_a_dedup_lines_run_has_six_arrays_and_its_resubmit_lines_start_at_the_lines_stage(tmp_path, monkeypatch):
    """With --dedup-lines the lines and linedup arrays come first: 6K + 1 jobs within the budget,
    scripts for each, the stages recorded for `status`, and a failed lines task's resubmit lines
    run every later stage after it."""
    from lmshard.prepare.execution.slurm import array_stages, submitted

    arrays = array_stages(True)
    assert arrays == ("lines", "linedup", *ARRAY_STAGES)
    monkeypatch.setattr(slurm, "cluster_limits", lambda: (100, 1001))
    assert slurm.array_tasks(64, None, len(arrays)) == (50 - 1) // 6  # half of MaxJobCount, over six arrays
    scripts = write_scripts(str(tmp_path / "out"), 10, 3, None, arrays)
    assert list(scripts) == [*arrays, "finish"]
    found = submitted(tmp_path / ".out.lmshard-work" / "slurm")
    assert found is not None and list(found[0]) == list(scripts) and found[1] == 3
    parsed = [_sbatch(line) for line in resubmit_commands(found[0], 10, 3, "lines", [4])]
    assert [stage for _, stage, _ in parsed] == [*arrays, "finish"]
    assert parsed[0][0] == [1] and parsed[0][2] == ["4"]  # plan task 4 runs as array task 4 mod 3
    assert sum(max(1, len(i)) for i, _, _ in parsed) <= len(arrays) * 3 + 1
