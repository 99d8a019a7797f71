"""`prepare --num-tasks N --executor slurm`: the planned run submitted as Slurm job arrays.

One batch script per stage is written into the work directory (`slurm/tokenize.sbatch`,
`dedup`, `select`, `write` and `finish`); each runs `python -m lmshard run-task` with the
interpreter running this command, so the cluster's nodes must see this Python environment and
the output's filesystem (as with any Slurm job).

A run queues a bounded number of jobs whatever N is (every array task counts as one job toward
the cluster's MaxJobCount and a user's MaxSubmitJobs): each of the four stages (six with
--dedup-lines) is one array of K array tasks, and array task I runs plan tasks I, I + K, I + 2K
... below N one after the other, so the run holds 4K + 1 jobs at most (6K + 1), the arrays and
the finish. K is N, but at most what keeps that within half the cluster's MaxJobCount
(`scontrol show config`; the other half leaves room for the user's other jobs, and for a
resubmission while this run's ended jobs are still counted, for MinJobAge), or within
`--max-jobs`, never past MaxJobCount - 1 jobs nor MaxArraySize - 1 array tasks; at least 1 (5
jobs). K and the stages are kept in `slurm/arrays.json` for `lmshard status`.

Each later stage's array depends on the stage before, and the finish on the write array, with
`afterok` and `--kill-on-invalid-dep=yes`: a failing plan task fails its array task, and the
later stages are cancelled, never left pending forever. `--sbatch-args` is added to every
`sbatch` call (partition, time, memory, account...) and written into each script as #SBATCH
lines, so the resubmit commands that `prepare` and `status` print carry them too. Those commands
pass the missing plan tasks to the script as arguments (`tokenize.sbatch 3 7-9`): array task I
then runs only those of its tasks, and only the array tasks that have one are submitted.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ...errors import ConfigError, LmshardError
from ..slurmjobs import run_id
from .taskplan import work_dir

DEFAULT_MAX_JOBS = 10_000  # Slurm's default MaxJobCount
DEFAULT_MAX_ARRAY = 1001  # Slurm's default MaxArraySize
ARRAY_STAGES = ("tokenize", "dedup", "select", "write")  # one array each; then the finish
LINE_STAGES = ("lines", "linedup")  # with --dedup-lines, two arrays before them


def array_stages(dedup_lines: bool) -> tuple[str, ...]:
    """A run's stages that are arrays, in order."""
    return (*LINE_STAGES, *ARRAY_STAGES) if dedup_lines else ARRAY_STAGES

# The body of a stage's script. A failing plan task ends the loop with its exit status (so the
# array task fails and `afterok` cancels the later stages). SIGTERM (scancel, the time limit)
# reaches the running task too; bash runs its trap once that task has stopped, and exits 143
# (128 + SIGTERM) as the task does.
LOOP = """\
# Array task I runs plan tasks I, I + {k}, I + {k2} ... below {n}, one after the other; given plan
# tasks as arguments (T or FIRST-LAST), only those of them.
trap 'exit 143' TERM
for ((task = SLURM_ARRAY_TASK_ID; task < {n}; task += {k})); do
    if (($#)); then
        keep=0
        for range in "$@"; do ((task >= ${{range%-*}} && task <= ${{range#*-}})) && keep=1; done
        ((keep)) || continue
    fi
    {run} --task "$task" {target} || exit
done
"""


def _sbatch(args: list[str], script: Path) -> str:
    try:
        done = subprocess.run(["sbatch", "--parsable", *args, str(script)], capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        raise ConfigError("--executor slurm: sbatch is not on PATH; run on a Slurm login node") from None
    except subprocess.TimeoutExpired:  # sbatch retries for minutes while the cluster holds too many jobs
        raise LmshardError(f"sbatch {script.name}: the cluster did not accept the job within 300 s (too many "
                           "jobs queued? pass a smaller --max-jobs)") from None  # fmt: skip
    if done.returncode != 0:
        raise LmshardError(f"sbatch {script.name} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]


def cluster_limits() -> tuple[int, int]:
    """(MaxJobCount, MaxArraySize) from `scontrol show config`; Slurm's defaults for what it does not say."""
    found = shutil.which("scontrol")
    shown = subprocess.run([found, "show", "config"], capture_output=True, text=True, timeout=60).stdout \
        if found else ""  # fmt: skip
    limits = {"MaxJobCount": DEFAULT_MAX_JOBS, "MaxArraySize": DEFAULT_MAX_ARRAY}
    for line in shown.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in limits and value.split() and value.split()[0].isdigit():
            limits[key.strip()] = int(value.split()[0])
    return limits["MaxJobCount"], limits["MaxArraySize"]


def array_tasks(n_tasks: int, max_jobs: int | None = None, arrays: int = len(ARRAY_STAGES)) -> int:
    """K, the array tasks of each stage: N, or fewer so that the run's `arrays` × K + 1 jobs stay within
    `max_jobs` (by default half the cluster's MaxJobCount) and MaxJobCount - 1 (the most slurmctld
    holds), and K within MaxArraySize - 1 (the highest array index); at least 1."""
    job_count, array_size = cluster_limits()
    budget = min(job_count // 2 if max_jobs is None else max_jobs, job_count - 1)
    return max(1, min(n_tasks, array_size - 1, (budget - 1) // arrays))


def directives(sbatch_args: str | None) -> str:
    """`--sbatch-args` as #SBATCH lines, one per option with its value, so that a script
    resubmitted by hand runs with them too."""
    lines: list[list[str]] = []
    for token in shlex.split(sbatch_args or ""):
        if token.startswith("-") or not lines:
            lines.append([token])
        else:
            lines[-1].append(token)
    return "".join(f"#SBATCH {shlex.join(line)}\n" for line in lines)


def write_scripts(out: str, n_tasks: int, k: int, sbatch_args: str | None = None,
                  arrays: tuple[str, ...] = ARRAY_STAGES) -> dict[str, Path]:  # fmt: skip
    """The batch scripts, one per stage (`arrays`, then the finish), written (again) into
    WORK/slurm/, and K and the stages in arrays.json."""
    d = work_dir(out) / "slurm"
    d.mkdir(parents=True, exist_ok=True)
    python, target = shlex.quote(sys.executable), shlex.quote(os.path.abspath(out))
    cwd = os.getcwd()  # relative inputs and --out mean what they meant where the run was submitted
    scripts = {}
    for stage in (*arrays, "finish"):
        run = f"{python} -m lmshard run-task --stage {stage}"
        looped = stage in arrays
        log = d / (f"{stage}_%A_%a.log" if looped else f"{stage}_%j.log")
        body = LOOP.format(k=k, k2=2 * k, n=n_tasks, run=run, target=target) if looped else f"exec {run} {target}\n"
        text = (f"#!/bin/bash\n#SBATCH --job-name=lmshard-{stage}-{run_id(out)}\n#SBATCH --output={log}\n"
                f"#SBATCH --chdir={cwd}\n{directives(sbatch_args)}{body}")  # fmt: skip
        path = d / f"{stage}.sbatch"
        path.write_text(text)
        scripts[stage] = path
    (d / "arrays.json").write_text(json.dumps({"tasks": n_tasks, "array_tasks": k, "stages": list(arrays)}) + "\n")
    return scripts


def submitted(folder: Path) -> tuple[dict[str, Path], int] | None:
    """The scripts of a run submitted to Slurm and its K (from WORK/slurm/); None for another run."""
    try:
        found = json.loads((folder / "arrays.json").read_text())
        k, arrays = int(found["array_tasks"]), tuple(found.get("stages", ARRAY_STAGES))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {stage: folder / f"{stage}.sbatch" for stage in (*arrays, "finish")}, k


def _ranges(numbers: list[int] | set[int], sep: str) -> str:
    """Sorted numbers with each run of consecutive ones as FIRST-LAST: [1, 2, 3, 7] -> "1-3{sep}7"."""
    runs: list[list[int]] = []
    for x in sorted(numbers):
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return sep.join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def resubmit_commands(scripts: dict[str, Path], n_tasks: int, k: int, stage: str = "tokenize",
                      tasks: list[int] | None = None) -> list[str]:  # fmt: skip
    """Shell lines that re-run the missing plan tasks `tasks` of `stage` (task I when None), then
    every task of each later stage, then the finish, within the run's 4K + 1 (6K + 1) jobs: plan task T is
    run by array task T mod K, given the tasks as the script's arguments. Each job depends
    (afterok) on the one before, as `submit` chains them, so the lines can be pasted at once."""
    lines: list[str] = []
    after = ""
    arrays = [s for s in scripts if s != "finish"]  # (in order: the run's array stages)
    stages = arrays[arrays.index(stage) :] if stage in arrays else ()
    for s in stages:
        if s != stage:
            option, only = f"--array=0-{k - 1}", ""
        elif tasks is None:  # a template: the user puts a task number for I
            option, only = f"--array={'I' if k >= n_tasks else f'$((I % {k}))'}", " I"
        else:
            option, only = f"--array={_ranges({t % k for t in tasks}, ',')}", f" {_ranges(tasks, ' ')}"
        lines.append(f"j{len(lines) + 1}=$(sbatch --parsable {after}{option} {scripts[s]}{only})")
        after = _after([f"j{len(lines)}"])
    return [*lines, f"sbatch {after}{scripts['finish']}"]


def _after(jobs: list[str]) -> str:
    return f"--dependency=afterok:{':'.join('$' + j for j in jobs)} --kill-on-invalid-dep=yes " if jobs else ""


def submit(out: str, n_tasks: int, sbatch_args: str | None, max_jobs: int | None = None,
           arrays: tuple[str, ...] = ARRAY_STAGES) -> dict[str, Any]:  # fmt: skip
    """Submit each stage's array of K array tasks and the finish, each after the one before;
    returns their job ids, K, the scripts and the resubmit commands for a failed tokenize task.
    Where sbatch refuses a job, the jobs this call queued are cancelled: none is left waiting
    for a stage that was never submitted."""
    k = array_tasks(n_tasks, max_jobs, len(arrays))
    scripts = write_scripts(out, n_tasks, k, sbatch_args, arrays)
    extra = shlex.split(sbatch_args or "")
    jobs: dict[str, Any] = {}
    after: list[str] = []
    try:
        for stage in (*arrays, "finish"):
            deps = [f"--dependency=afterok:{after[0]}", "--kill-on-invalid-dep=yes"] if after else []
            array = [f"--array=0-{k - 1}"] if stage in arrays else []
            jobs[stage] = _sbatch([*array, *deps, *extra], scripts[stage])
            after = [jobs[stage]]
    except LmshardError:
        if jobs and shutil.which("scancel"):
            subprocess.run(["scancel", *jobs.values()], capture_output=True, timeout=60)
        raise
    return jobs | {"array_tasks": k, "scripts": scripts,
                   "resubmit": resubmit_commands(scripts, n_tasks, k, arrays[0])}  # fmt: skip
