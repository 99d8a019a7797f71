"""`prepare --num-tasks N --executor slurm`: the planned run submitted as Slurm job arrays.

Three batch scripts are written into the work directory (`slurm/tokenize.sbatch`,
`slurm/dedup.sbatch`, `slurm/merge.sbatch`); each runs `python -m lmshard run-task` with the interpreter running
this command, so the cluster's nodes must see this Python environment and the output's
filesystem (as with any Slurm job). The tokenize stage is one array per at most
`MaxArraySize - 1` tasks (the cluster's limit, from `scontrol show config`; a task id past it is
passed as an offset); the dedup stage's arrays depend on all of those, and the merge on the
dedup arrays, with `afterok` and `--kill-on-invalid-dep=yes`: if a task fails the later stages
are cancelled, never left pending forever. `--sbatch-args` is added to every `sbatch` call
(partition, time, memory, account...).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError, LmshardError
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


def write_scripts(out: str) -> tuple[Path, Path, Path]:
    """The three batch scripts (tokenize, dedup, merge), written (again) into WORK/slurm/."""
    d = work_dir(out) / "slurm"
    d.mkdir(parents=True, exist_ok=True)
    python, target = shlex.quote(sys.executable), shlex.quote(os.path.abspath(out))
    cwd = os.getcwd()  # relative inputs and --out mean what they meant where the run was submitted
    scripts = []
    task = '--task "$((SLURM_ARRAY_TASK_ID + ${LMSHARD_TASK_OFFSET:-0}))"'
    for stage, extra in (("tokenize", task), ("dedup", task), ("merge", "")):
        log = d / (f"{stage}_%A_%a.log" if extra else f"{stage}_%j.log")
        text = (f"#!/bin/bash\n#SBATCH --job-name=lmshard-{stage}\n#SBATCH --output={log}\n#SBATCH --chdir={cwd}\n"
                f"exec {python} -m lmshard run-task --stage {stage} {extra} {target}\n")  # fmt: skip
        path = d / f"{stage}.sbatch"
        path.write_text(text)
        scripts.append(path)
    return scripts[0], scripts[1], scripts[2]


def resubmit_commands(scripts: dict[str, Path], n_tasks: int, array_max: int) -> list[str]:
    """What re-runs a failed tokenize task I, then every dedup bucket, then the merge: the array
    index of a job is 0-based and limited by MaxArraySize, so the task number travels as
    LMSHARD_TASK_OFFSET, as in `submit`."""
    chunk = max(1, array_max - 1)
    dedup = [f"sbatch --array=0-{min(chunk, n_tasks - first) - 1} --export=ALL,LMSHARD_TASK_OFFSET={first} "
             f"{scripts['dedup']}" for first in range(0, n_tasks, chunk)]  # fmt: skip
    return [f"sbatch --array=0 --export=ALL,LMSHARD_TASK_OFFSET=I {scripts['tokenize']}", *dedup,
            f"sbatch {scripts['merge']}"]  # fmt: skip


def submit(out: str, n_tasks: int, sbatch_args: str | None) -> dict[str, Any]:
    """Submit the tokenize arrays and the merge; returns their job ids and the scripts."""
    tokenize, dedup, merge = write_scripts(out)
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

    tokenize_jobs = arrays(tokenize, [])
    dedup_jobs = arrays(dedup, tokenize_jobs)
    merge_job = _sbatch([f"--dependency=afterok:{':'.join(dedup_jobs)}", "--kill-on-invalid-dep=yes", *extra], merge)
    scripts = {"tokenize": tokenize, "dedup": dedup, "merge": merge}
    return {"tokenize": tokenize_jobs, "dedup": dedup_jobs, "merge": merge_job, "scripts": scripts,
            "resubmit": resubmit_commands(scripts, n_tasks, chunk + 1)}  # fmt: skip
