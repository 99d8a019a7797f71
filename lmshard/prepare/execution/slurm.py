"""`prepare --num-tasks N --executor slurm`: the planned run submitted as Slurm job arrays.

One batch script per stage is written into the work directory (`slurm/tokenize.sbatch`,
`dedup`, `select`, `write` and `finish`); each runs `python -m lmshard run-task` with the interpreter running
this command, so the cluster's nodes must see this Python environment and the output's
filesystem (as with any Slurm job). The tokenize stage is one array per at most
`MaxArraySize - 1` tasks (the cluster's limit, from `scontrol show config`; a task id past it is
passed as an offset); each later stage's arrays depend on all of the stage before, and the
finish on the write arrays, with `afterok` and `--kill-on-invalid-dep=yes`: if a task fails the later stages
are cancelled, never left pending forever. `--sbatch-args` is added to every `sbatch` call
(partition, time, memory, account...) and written into each script as #SBATCH lines, so the
resubmit commands that `prepare` and `status` print carry them too.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ...errors import ConfigError, LmshardError
from .taskplan import work_dir

DEFAULT_MAX_ARRAY = 1001  # Slurm's default MaxArraySize


def _sbatch(args: list[str], script: Path) -> str:
    try:
        done = subprocess.run(["sbatch", "--parsable", *args, str(script)], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ConfigError("--executor slurm: sbatch is not on PATH; run on a Slurm login node") from None
    if done.returncode != 0:
        raise LmshardError(f"sbatch {script.name} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]


def max_array_size() -> int:
    found = shutil.which("scontrol")
    if found is None:
        return DEFAULT_MAX_ARRAY
    shown = subprocess.run([found, "show", "config"], capture_output=True, text=True, timeout=60).stdout
    for line in shown.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "MaxArraySize":
            try:
                return int(value.strip())
            except ValueError:
                break
    return DEFAULT_MAX_ARRAY


ARRAY_STAGES = ("tokenize", "dedup", "select", "write")  # one array task per planned task; then the finish


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


def write_scripts(out: str, sbatch_args: str | None = None) -> dict[str, Path]:
    """The batch scripts, one per stage, written (again) into WORK/slurm/."""
    d = work_dir(out) / "slurm"
    d.mkdir(parents=True, exist_ok=True)
    python, target = shlex.quote(sys.executable), shlex.quote(os.path.abspath(out))
    cwd = os.getcwd()  # relative inputs and --out mean what they meant where the run was submitted
    scripts = {}
    task = '--task "$((SLURM_ARRAY_TASK_ID + ${LMSHARD_TASK_OFFSET:-0}))"'
    for stage in (*ARRAY_STAGES, "finish"):
        extra = task if stage in ARRAY_STAGES else ""
        log = d / (f"{stage}_%A_%a.log" if extra else f"{stage}_%j.log")
        text = (f"#!/bin/bash\n#SBATCH --job-name=lmshard-{stage}-{run_id(out)}\n#SBATCH --output={log}\n"
                f"#SBATCH --chdir={cwd}\n"
                f"{directives(sbatch_args)}"
                f"exec {python} -m lmshard run-task --stage {stage} {extra} {target}\n")  # fmt: skip
        path = d / f"{stage}.sbatch"
        path.write_text(text)
        scripts[stage] = path
    return scripts


def _arrays(n_tasks: int, chunk: int, only: list[str] | None = None) -> list[str]:
    """The `--array=... --export=...` options of one stage's jobs: every task in arrays of at most
    `chunk`, or only the tasks `only` (a task below `chunk` keeps its own array index, so its log
    is named after it; one past it travels as LMSHARD_TASK_OFFSET)."""
    if only is None:
        return [f"--array=0-{min(chunk, n_tasks - first) - 1} --export=ALL,LMSHARD_TASK_OFFSET={first}"
                for first in range(0, n_tasks, chunk)]  # fmt: skip
    low = [t for t in only if not t.isdigit() or int(t) < chunk] if n_tasks <= chunk or only != ["I"] else []
    high = [t for t in only if t not in low]
    return ([f"--array={','.join(low)} --export=ALL,LMSHARD_TASK_OFFSET=0"] if low else []) + [
        f"--array=0 --export=ALL,LMSHARD_TASK_OFFSET={t}" for t in high]


def resubmit_commands(scripts: dict[str, Path], n_tasks: int, array_max: int, stage: str = "tokenize",
                      tasks: list[int] | None = None) -> list[str]:  # fmt: skip
    """Shell lines that re-run the failed tasks of `stage` (task I when `tasks` is None), then every
    task of each later stage, then the finish: each job depends (afterok) on the jobs before it,
    as `submit` chains them, so the lines can be pasted at once. A task whose work is done finds
    its markers and exits at once."""
    chunk = max(1, array_max - 1)
    lines: list[str] = []
    after: list[str] = []
    stages = ARRAY_STAGES[ARRAY_STAGES.index(stage) :] if stage in ARRAY_STAGES else ()
    for s in stages:
        options = _arrays(n_tasks, chunk, [str(t) for t in (tasks if tasks is not None else ["I"])]) \
            if s == stage else _arrays(n_tasks, chunk)  # fmt: skip
        mine = []
        for option in options:
            mine.append(f"j{len(lines) + 1}")
            deps = _after(after)
            lines.append(f"{mine[-1]}=$(sbatch --parsable {deps}{option} {scripts[s]})")
        after = mine
    return [*lines, f"sbatch {_after(after)}{scripts['finish']}"]


def _after(jobs: list[str]) -> str:
    return f"--dependency=afterok:{':'.join('$' + j for j in jobs)} --kill-on-invalid-dep=yes " if jobs else ""


def run_id(out: str) -> str:
    """A short name for the run in its jobs' names (`lmshard-STAGE-ID`), from the output's path."""
    return hashlib.sha1(os.path.realpath(out).encode()).hexdigest()[:8]


def live_jobs(out: str) -> list[str]:
    """This run's jobs still queued or running (ids), from squeue; [] where squeue is missing."""
    found = shutil.which("squeue")
    if found is None:
        return []
    shown = subprocess.run([found, "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=60).stdout
    tail = f"-{run_id(out)}"
    return [line.split()[0] for line in shown.splitlines() if line.split()[-1:] and line.split()[-1].endswith(tail)]


def submit(out: str, n_tasks: int, sbatch_args: str | None) -> dict[str, Any]:
    """Submit every stage's arrays and the finish, each stage after the one before; returns
    their job ids, the scripts and the resubmit commands for a failed tokenize task."""
    scripts = write_scripts(out, sbatch_args)
    extra = shlex.split(sbatch_args or "")
    chunk = max(1, max_array_size() - 1)

    def arrays(script: Path, after: list[str]) -> list[str]:
        jobs = []
        for first in range(0, n_tasks, chunk):
            count = min(chunk, n_tasks - first)
            deps = [f"--dependency=afterok:{':'.join(after)}", "--kill-on-invalid-dep=yes"] if after else []
            export = f"--export=ALL,LMSHARD_TASK_OFFSET={first}"
            jobs.append(_sbatch([f"--array=0-{count - 1}", export, *deps, *extra], script))
        return jobs

    jobs: dict[str, Any] = {}
    after: list[str] = []
    for stage in ARRAY_STAGES:
        jobs[stage] = after = arrays(scripts[stage], after)
    jobs["finish"] = _sbatch([f"--dependency=afterok:{':'.join(after)}", "--kill-on-invalid-dep=yes", *extra],
                             scripts["finish"])  # fmt: skip
    return jobs | {"scripts": scripts, "resubmit": resubmit_commands(scripts, n_tasks, chunk + 1)}
