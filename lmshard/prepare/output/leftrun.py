"""What an unfinished run left beside --out says to the next run that finds it (its refusal,
`left_unfinished`) and to `lmshard status` (`read_once`): interrupted, and resumed with --resume;
read from stdin or a pipe, so nothing can be resumed; or planned for tasks that run elsewhere and
waiting for them (on Slurm, while squeue lists a job of the run; with none left, it says so).

Memory model: a run record and a plan's head (small JSON files); squeue's listing, on Slurm.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ..slurmjobs import live_jobs


def left_unfinished(run: dict[str, Any], out: Path, staging: Path, was_append: bool) -> ConfigError:
    """The refusal of a run into `out` that finds an unfinished one's build (its run record
    `run`) and was not told to go on with it: what it is, and the two ways on. An --append's
    build is discarded by deleting it (--overwrite would replace the dataset), with a planned
    run's work folder."""
    when = _when(run.get("started"))
    how = "--append --resume" if was_append else "--resume"
    work = _work_of(out)
    drop = (f"delete {staging}" + (f" and {work}" if work.exists() else "")) if was_append else "pass --overwrite"
    if read_once(run, out):
        return ConfigError(f"{out}: an interrupted prepare run (started {when}) read stdin or a pipe, which cannot be "
                           f"read again, and left nothing to go on from in {staging}; {drop} to discard it and run "
                           "again")  # fmt: skip
    if (executor := _planned_elsewhere(out)) is not None:  # not interrupted: waiting for its tasks
        status = f"lmshard status {shlex.quote(str(out))}"
        if executor == "slurm" and live_jobs(str(out)) == []:  # (squeue answered: none of the run's jobs is left)
            return ConfigError(f"{out}: a run planned for --executor slurm (started {when}) has no job that squeue "
                               "here lists as queued or running (cancelled, failed, ended with tasks left, or on "
                               f"another cluster); `{status}` lists the tasks left and the sbatch lines that run them; "
                               f"pass {how} to go on with it (without --executor: its tasks run here), or {drop} to "
                               "discard it")  # fmt: skip
        return ConfigError(f"{out}: a run planned for --executor {executor} (started {when}) is waiting for its "
                           f"tasks; `{status}` lists those left; pass {how} to go on with it (without --executor: its "
                           f"tasks run here), or {drop} to discard it")  # fmt: skip
    return ConfigError(f"{out}: an interrupted prepare run (started {when}) left its work in {staging}; pass {how} to "
                       f"continue it, or {drop} to discard it")  # fmt: skip


def read_once(run: dict[str, Any], out: str | os.PathLike[str]) -> bool:
    """Whether an interrupted run (its run record) read stdin or a pipe and left no plan beside
    `out` (in `.NAME.lmshard-work`): nothing of it can be resumed (a planned run reads the copy it
    saved only once planned)."""
    streamed = any(s[1] != "hf" and s[3] == 0 and s[2] == 0 for s in run.get("fingerprint", {}).get("sources", []))
    return streamed and not (_work_of(out) / "plan.json").exists()


def _planned_elsewhere(out: str | os.PathLike[str]) -> str | None:
    """The executor a plan beside `out` was made for, when its tasks run apart from the command
    that planned it (none, slurm: `prepare --num-tasks N --executor E`); None for no plan, or a
    plan whose command runs its tasks (local, ray: a plan left by one was interrupted)."""
    try:
        executor = json.loads((_work_of(out) / "plan.json").read_text())["prepare"].get("executor")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return executor if executor in ("none", "slurm") else None


def _work_of(out: str | os.PathLike[str]) -> Path:
    """A planned run's work folder (execution/taskplan.work_dir)."""
    return Path(out).parent / f".{Path(out).name}.lmshard-work"


def _when(t: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if isinstance(t, int | float) else "at an unknown time"


__all__ = ["left_unfinished", "read_once"]
