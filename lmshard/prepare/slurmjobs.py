"""A planned run's Slurm jobs as the queue knows them: the run's name in its jobs' names
(`lmshard-STAGE-ID`, `run_id`) and those still queued or running (`live_jobs`, from squeue).
Read by the Slurm executor (execution/slurm.py), by `lmshard status`, and by the refusal of a
second prepare into the --out of a run planned for Slurm (output/leftrun.py), which says whether
the run is waiting for its jobs or has none left.

Memory model: squeue's listing of the user's view of the queue (a line per job), read once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess


def run_id(out: str) -> str:
    """A short name for the run in its jobs' names (`lmshard-STAGE-ID`), from the output's path."""
    return hashlib.sha1(os.path.realpath(out).encode()).hexdigest()[:8]


def live_jobs(out: str) -> list[str] | None:
    """This run's jobs still queued or running (ids), from squeue; None where squeue is not
    here or does not answer (not a machine of the cluster, its controller down): not known."""
    found = shutil.which("squeue")
    if found is None:
        return None
    try:
        done = subprocess.run([found, "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    tail = f"-{run_id(out)}"
    rows = [line.split() for line in done.stdout.splitlines()]
    return [row[0] for row in rows if len(row) == 2 and row[1].endswith(tail)]


__all__ = ["live_jobs", "run_id"]
