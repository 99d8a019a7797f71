"""Recovery of a scale-out prepare on a real Slurm cluster (tests/engines.py), done as a user does
it: a task of the submitted arrays fails, is cancelled or is killed; the later stages are
cancelled by Slurm (`--kill-on-invalid-dep=yes`); `lmshard status` names the task and its state
and, once none of the run's jobs is queued or running, prints the sbatch lines chained with
afterok, which are pasted at once into bash (or the same `prepare` is run again with --resume);
the dataset is then byte-identical to a one-machine prepare of the same input.

Tasks stop themselves at an exact unit or part (LMSHARD_STOP_AT, lmshard/prepare/stops.py), so
each fault lands at the same place on any machine; every wait is a poll of Slurm or of the task's
state file with a deadline that is only a timeout. Run by `make test-engines`."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engines import slurm_available, slurm_cluster
from test_stages import _corpus, _files

from lmshard.prepare.execution.layout import STREAMS
from lmshard.prepare.execution.layoutfiles import Layout
from lmshard.prepare.execution.taskplan import load_plan

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(
        not slurm_available() and not os.environ.get("LMSHARD_REQUIRE_ENGINES"),
        reason="Slurm is not installed: run `make test-engines`",
    ),  # fmt: skip
]

LMSHARD = [sys.executable, "-m", "lmshard"]
# Units of 64 KiB: 12 units in 3 tasks, task 0 = units 0-3 (a.jsonl), task 1 = units 4-8 (a.jsonl,
# then b.jsonl from unit 6), task 2 = units 9-11 (the end of b.jsonl, c.txt, d.jsonl). Shards of
# 20,000 tokens: 36 parts of shards and key files for the write stage, task 0 writing parts 0-6.
COMMON = ["in", "--workers", "1", "--on-error", "skip", "--tokens-per-shard", "20000"]
SUBMIT = ["--num-tasks", "3", "--executor", "slurm", "--sbatch-args", "--time=10"]
UNIT_BYTES = {"LMSHARD_UNIT_BYTES": str(64 << 10)}
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def _until(what: str, check: Callable[[], Any], timeout: float = 180.0) -> Any:
    """Poll `check` until it returns something true; the deadline is a timeout, never a condition."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One Slurm cluster for the module, the corpus and its one-machine prepare (the bytes every
    recovered run must give)."""
    root = tmp_path_factory.mktemp("recovery")
    _corpus(root)
    with slurm_cluster() as env:
        env = {k: v for k, v in env.items() if k not in ("LMSHARD_STOP_AT", "LMSHARD_UNIT_BYTES")}
        local = subprocess.run([*LMSHARD, "prepare", *COMMON, "--out", "local"], cwd=root, env=env,
                               capture_output=True, text=True, timeout=300)  # fmt: skip
        assert local.returncode == 0, local.stderr
        yield root, env, _files(root / "local")


@pytest.fixture
def slurm(cluster):
    """The module's cluster; after each test every job left is cancelled (which also wakes a
    task still stopped by its stop point: scancel sends SIGCONT and SIGTERM) and waited for."""
    yield cluster
    env = cluster[1]
    subprocess.run(["scancel", "--user", getpass.getuser()], env=env, capture_output=True, timeout=60)
    _until("the queue to empty", lambda: not _sh(env, "squeue", "-h").strip(), 60)


def _sh(env: dict[str, str], *args: str, cwd: Path | None = None) -> str:
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=120).stdout


def _lmshard(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LMSHARD, *args], capture_output=True, text=True, timeout=300, cwd=root, env=env)


def _records(env: dict[str, str], *job: str) -> list[dict[str, str]]:
    """`scontrol show job [JOB]` as one dict of fields per record (every job Slurm still knows)."""
    shown = _sh(env, "scontrol", "-o", "show", "job", *job)
    return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in shown.splitlines()]


def _jobs(env: dict[str, str], job: str) -> dict[str, dict[str, str]]:
    """Every record of `job` (an array's elements by task id, "" for a plain job, "0-2" for
    elements not started yet) with its JobState, Reason, ExitCode, TimeLimit."""
    return {fields.get("ArrayTaskId", ""): fields for fields in _records(env, job)}


def _run_id(root: Path, out: str) -> str:
    """The run's name in its jobs' names, `lmshard-STAGE-ID`: 8 hex digits of the output's path."""
    return hashlib.sha1(str((root / out).resolve()).encode()).hexdigest()[:8]


def _queued(env: dict[str, str], rid: str) -> list[str]:
    """The ids squeue lists for this run's jobs (queued or running)."""
    rows = [line.split() for line in _sh(env, "squeue", "-h", "-o", "%i %j").splitlines()]
    return [row[0] for row in rows if len(row) == 2 and row[1].endswith(f"-{rid}")]


def _ended(env: dict[str, str], *jobs: str) -> bool:
    return all(rec["JobState"] in ENDED for job in jobs for rec in _jobs(env, job).values())


def _again(root: Path, env: dict[str, str], out: str) -> str:
    """The planned run's own prepare command run again without --resume: refused (exit 1) in one
    line, which it returns."""
    done = subprocess.run([*LMSHARD, "prepare", *COMMON, "--out", out, *SUBMIT], cwd=root, capture_output=True,
                          text=True, timeout=300, env=env | UNIT_BYTES)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    return " ".join(done.stderr.split())


def _submit(root: Path, env: dict[str, str], out: str, stop_at: str) -> dict[str, str]:
    """`prepare --executor slurm` with LMSHARD_STOP_AT=stop_at in the environment the arrays
    inherit (sbatch exports it); returns each stage's job id, each job named after the run. It
    says that status prints the lines that re-run what is missing, and what they are for task I."""
    done = subprocess.run([*LMSHARD, "prepare", *COMMON, "--out", out, *SUBMIT], cwd=root, capture_output=True,
                          text=True, timeout=300, env=env | UNIT_BYTES | {"LMSHARD_STOP_AT": stop_at})  # fmt: skip
    assert done.returncode == 0, done.stderr
    jobs = dict(re.findall(r"(tokenize|dedup|select|write|finish) \(job (\d+)\)", done.stdout))
    text, slurm_dir, after = " ".join(done.stdout.split()), f".{out}.lmshard-work/slurm", "--kill-on-invalid-dep=yes"
    assert (f"`lmshard status {out}` prints what re-runs the missing tasks; for task I it is: j1=$(sbatch --parsable "
            f"--array=I {slurm_dir}/tokenize.sbatch I); j2=$(sbatch --parsable --dependency=afterok:$j1 {after} "
            f"--array=0-2 {slurm_dir}/dedup.sbatch);") in text, text  # fmt: skip
    assert text.endswith(f"; sbatch --dependency=afterok:$j4 {after} {slurm_dir}/finish.sbatch"), text
    for stage, job in jobs.items():
        assert {r["JobName"] for r in _records(env, job)} == {f"lmshard-{stage}-{_run_id(root, out)}"}, stage
    return jobs


def _stopped(work: Path, stage: str, task: int) -> int:
    """The pid of `stage` task `task` once it has stopped itself (state T), read from the state
    file the task writes as it starts."""

    def check() -> int | None:
        try:
            pid = int(json.loads((work / "tasks" / f"{stage}_{task:06d}.json").read_text())["pid"])
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, KeyError):
            return None
        return pid if stat[0] == "T" and b"run-task" in cmdline and str(work.parent).encode() in cmdline else None

    return _until(f"{stage} task {task} to stop at its stop point", check)


HEADER = "on Slurm, these lines (each job waits for the ones before it) re-run exactly what is missing:\n"


def _status(root: Path, env: dict[str, str], out: str) -> tuple[str, list[str]]:
    """`lmshard status OUT`: its text and the shell lines it prints under HEADER."""
    done = _lmshard(root, env, "status", out)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    lines = text.split(HEADER)[1:]
    return text, [line.strip() for line in "".join(lines).splitlines() if line.strip()]


def _run_lines(root: Path, env: dict[str, str], out: str, lines: list[str]) -> list[str]:
    """The printed lines pasted at once into bash (as one script, where status ran); then wait
    until squeue lists none of the run's jobs. Each line submitted one job, named after the run,
    and every element of every job completed. Returns the job ids, in the lines' order."""
    rid = _run_id(root, out)
    known = {rec["JobId"] for rec in _records(env)}
    done = subprocess.run(["bash", "-euc", "\n".join(lines)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0 and not done.stderr, done.stderr
    _until("the run's jobs to leave the queue", lambda: not _queued(env, rid))
    new = [rec for rec in _records(env) if rec["JobId"] not in known]
    assert all(rec["JobName"].endswith(f"-{rid}") for rec in new), new
    logs = "".join(p.read_text() for p in sorted(root.glob(".*.lmshard-work/slurm/*.log")))[-3000:]
    assert {rec["JobState"] for rec in new} == {"COMPLETED"}, f"{new}\n{logs}"
    ids = sorted({rec.get("ArrayJobId", rec["JobId"]) for rec in new}, key=int)
    assert len(ids) == len(lines), (ids, lines)
    return ids


def _still_queued(root: Path, env: dict[str, str], out: str, jobs: dict[str, str], running: str) -> None:
    """While a job of the run is queued or running, status names them (`running` among them, and
    every later stage's job) instead of printing lines that would run the same tasks twice."""
    text, lines = _status(root, env, out)
    said = re.search(r"on Slurm: (\d+) jobs of this run are still queued or running \(([^)]*)\); run "
                     r"`lmshard status` again once they have ended", text)  # fmt: skip
    assert said and not lines and "sbatch" not in text, text
    ids = said[2].split(", ")
    assert int(said[1]) == len(ids) and running in ids, text
    assert {i.split("_")[0] for i in ids} >= {jobs[s] for s in ("dedup", "select", "write", "finish")}, text


def _logs(work: Path) -> set[str]:
    return {p.name for p in (work / "slurm").glob("*.log")}


def _later_stages_cancelled(env: dict[str, str], jobs: dict[str, str]) -> None:
    """Slurm cancelled every later stage (kill-on-invalid-dep): none left pending forever."""
    _until("the submitted jobs to end", lambda: _ended(env, *jobs.values()))
    for stage in ("dedup", "select", "write", "finish"):
        for rec in _jobs(env, jobs[stage]).values():
            assert (rec["JobState"], rec["Reason"]) == ("CANCELLED", "DependencyNeverSatisfied"), (stage, rec)


def test_failed_tokenize_task_is_rerun_alone_by_the_status_lines(slurm):
    """Task 1's input vanishes under it (a filesystem gone from the node) after it tokenized 2 of
    its 5 units: it fails, Slurm cancels the later stages, status shows it failed with the error
    and prints the lines; with the input back they re-run task 1 alone (its 3 missing units), then
    every later stage and the finish: the one-machine bytes."""
    root, env, local = slurm
    out, work = "dist_failed", root / ".dist_failed.lmshard-work"
    jobs = _submit(root, env, out, "unit=5")
    tok = jobs["tokenize"]
    pid = _stopped(work, "tokenize", 1)
    _still_queued(root, env, out, jobs, f"{tok}_1")
    # tasks 0 and 2 (task 2 reads the end of b.jsonl) are done before b.jsonl goes
    _until("tokenize tasks 0 and 2 to complete",
           lambda: {k: r["JobState"] for k, r in _jobs(env, tok).items() if k in ("0", "2")}
           == {"0": "COMPLETED", "2": "COMPLETED"})  # fmt: skip
    away = root / "b.jsonl.away"
    os.rename(root / "in" / "b.jsonl", away)
    try:
        os.kill(pid, signal.SIGCONT)
        _until("tokenize task 1 to end", lambda: _jobs(env, tok).get("1", {}).get("JobState") in ENDED)
    finally:
        os.rename(away, root / "in" / "b.jsonl")  # a rename keeps the mtime the plan fingerprinted
    assert (_jobs(env, tok)["1"]["JobState"], _jobs(env, tok)["1"]["ExitCode"]) == ("FAILED", "1:0")
    _later_stages_cancelled(env, jobs)

    text, lines = _status(root, env, out)
    assert "tokenize: 2 of 3 tasks complete (9 of 12 units)" in text, text
    assert re.search(r"task 1: 2 of 5 \(failed on \S+ \(pid \d+\): InputGone: in/b\.jsonl", text), text
    assert "put it back and run this task again (a whole run: the same prepare with --resume)" in text, text
    log = (work / "slurm" / f"tokenize_{tok}_1.log").read_text()
    assert "put it back and run this task again (a whole run: the same prepare with --resume)" in log, log
    assert "running" not in text, text
    slurm_dir, after = ".dist_failed.lmshard-work/slurm", "--kill-on-invalid-dep=yes"
    assert lines == [f"j1=$(sbatch --parsable --array=1 {slurm_dir}/tokenize.sbatch 1)",
                     *(f"j{k}=$(sbatch --parsable --dependency=afterok:$j{k - 1} {after} --array=0-2 "
                       f"{slurm_dir}/{s}.sbatch)" for k, s in ((2, "dedup"), (3, "select"), (4, "write"))),
                     f"sbatch --dependency=afterok:$j4 {after} {slurm_dir}/finish.sbatch"], text  # fmt: skip

    before = _logs(work)
    ids = _run_lines(root, env, out, lines)
    new = sorted(_logs(work) - before)
    assert [n for n in new if n.startswith("tokenize_")] == [f"tokenize_{ids[0]}_1.log"], new  # one task re-ran
    rerun = (work / "slurm" / f"tokenize_{ids[0]}_1.log").read_text()
    assert "tokenize task 1: 3 units tokenized" in rerun, rerun  # the 2 units done before were kept
    assert sorted(new) == sorted([f"tokenize_{ids[0]}_1.log", f"finish_{ids[4]}.log",
                                  *(f"{s}_{ids[k]}_{t}.log" for k, s in ((1, "dedup"), (2, "select"), (3, "write"))
                                    for t in range(3))]), new  # fmt: skip
    assert {r["TimeLimit"] for i in ids for r in _records(env, i)} == {"00:10:00"}  # --sbatch-args in the scripts
    assert "done: the dataset is complete" in _status(root, env, out)[0]
    assert _files(root / out) == local


def test_scancelled_task_is_recorded_stopped_and_prepare_resume_finishes(slurm):
    """`scancel` of a tokenize task (as a time limit would stop it: SIGTERM) is recorded as stopped
    by SIGTERM, not running; the job exits 143 and the later stages are cancelled. Running the
    same `prepare` again with --resume resubmits every stage and gives the one-machine bytes."""
    root, env, local = slurm
    out, work = "dist_stopped", root / ".dist_stopped.lmshard-work"
    jobs = _submit(root, env, out, "unit=5!")  # woken by scancel's SIGCONT, it waits for the SIGTERM
    tok = jobs["tokenize"]
    pid = _stopped(work, "tokenize", 1)
    text, _ = _status(root, env, out)
    assert f"task 1: 2 of 5 (running on {os.uname().nodename} (pid {pid}))" in text, text
    _still_queued(root, env, out, jobs, f"{tok}_1")
    said = _again(root, env, out)  # the same prepare without --resume, while the run's jobs are queued
    assert "is waiting for its tasks" in said and "--resume" in said, said
    subprocess.run(["scancel", f"{tok}_1"], env=env, check=True, timeout=60)
    _later_stages_cancelled(env, jobs)
    _until("squeue to list none of the run's jobs", lambda: not _queued(env, _run_id(root, out)), 60)
    said = _again(root, env, out)  # and once none is left
    assert "has no job that squeue here lists as queued or running" in said and "waiting" not in said, said
    assert "--resume" in said, said
    task1 = _jobs(env, tok)["1"]
    assert (task1["JobState"], task1["ExitCode"]) == ("CANCELLED", "143:0"), task1
    log = (work / "slurm" / f"tokenize_{tok}_1.log").read_text()
    assert "stopped: tokenize task 1 stopped by SIGTERM with 2 of 5 done" in log, log

    text, lines = _status(root, env, out)
    assert f"task 1: 2 of 5 (stopped on {os.uname().nodename} (pid {pid}) by SIGTERM)" in text, text
    assert "running" not in text and "died" not in text, text
    first = f"--array=1 {work.name}/slurm/tokenize.sbatch 1"
    assert lines[0] == f"j1=$(sbatch --parsable {first})", lines
    assert len(lines) == 5 and lines[-1].startswith("sbatch --dependency=afterok:$j4 "), lines

    again = subprocess.run([*LMSHARD, "prepare", *COMMON, "--out", out, *SUBMIT, "--resume"], cwd=root,
                           capture_output=True, text=True, timeout=300, env=env | UNIT_BYTES)  # fmt: skip
    assert again.returncode == 0, again.stderr
    resumed = dict(re.findall(r"(tokenize|dedup|select|write|finish) \(job (\d+)\)", again.stdout))
    _until("the resubmitted jobs to end", lambda: _ended(env, *resumed.values()))
    states = {rec["JobState"] for job in resumed.values() for rec in _jobs(env, job).values()}
    assert states == {"COMPLETED"}, states
    assert "done: the dataset is complete" in _status(root, env, out)[0]
    assert _files(root / out) == local


def test_killed_write_task_is_rerun_alone_then_the_finish(slurm):
    """A write task SIGKILLed (the OOM killer, a lost node) partway through its parts: its job fails,
    the finish is cancelled, status shows the task died and prints only that write task and the
    finish; running them gives the one-machine bytes, no earlier stage run again."""
    root, env, local = slurm
    out, work = "dist_write", root / ".dist_write.lmshard-work"
    jobs = _submit(root, env, out, "part=2")
    pid = _stopped(work, "write", 0)
    os.kill(pid, signal.SIGKILL)
    _until("the submitted jobs to end", lambda: _ended(env, *jobs.values()))
    write = _jobs(env, jobs["write"])
    assert {k: r["JobState"] for k, r in write.items()} == {"0": "FAILED", "1": "COMPLETED", "2": "COMPLETED"}, write
    finish = _jobs(env, jobs["finish"])[""]
    assert (finish["JobState"], finish["Reason"]) == ("CANCELLED", "DependencyNeverSatisfied"), finish
    assert not (root / out).exists()

    text, lines = _status(root, env, out)
    groups = load_plan(work)["groups"]  # (4: the plan's 3 tasks of 1 worker, taskplan.group_count)
    done = (("tokenize", "12 of 12 units"), ("dedup", f"{groups} of {groups} groups of buckets"),
            ("select", "12 of 12 units"))  # fmt: skip
    for stage, what in done:
        assert f"{stage}: 3 of 3 tasks complete ({what})" in text, text
    layout = Layout(work, load_plan(work)["tasks"], STREAMS)  # task 0 writes the parts of its own units
    mine, total = layout["tasks"][0], len(layout["parts"])
    done = sum((work / "write" / f"part_{p:06d}.done").exists() for p in mine)
    assert 0 < done < len(mine), (done, len(mine))
    assert f"write: 2 of 3 tasks complete ({total - len(mine) + done} of {total} parts of shards)" in text, text
    assert f"task 0: {done} of {len(mine)} (died on {os.uname().nodename} (pid {pid} gone: killed?))" in text, text
    slurm_dir = ".dist_write.lmshard-work/slurm"
    after = "--dependency=afterok:$j1 --kill-on-invalid-dep=yes"
    assert lines == [f"j1=$(sbatch --parsable --array=0 {slurm_dir}/write.sbatch 0)",
                     f"sbatch {after} {slurm_dir}/finish.sbatch"], text  # fmt: skip

    before = _logs(work)
    ids = _run_lines(root, env, out, lines)
    assert sorted(_logs(work) - before) == sorted([f"write_{ids[0]}_0.log", f"finish_{ids[1]}.log"])
    assert {r["TimeLimit"] for i in ids for r in _records(env, i)} == {"00:10:00"}
    rerun = (work / "slurm" / f"write_{ids[0]}_0.log").read_text()
    assert f"write task 0: {len(mine) - done} parts of shards and key files written" in rerun, rerun
    assert sorted(p.name for p in work.iterdir()) == ["slurm"]  # the finish left only the jobs' logs
    assert "done: the dataset is complete" in _status(root, env, out)[0]
    assert _files(root / out) == local
