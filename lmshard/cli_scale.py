"""`lmshard run-task` and `lmshard status`, and `prepare --num-tasks`: the command-line edge of
the scale-out stages (`lmshard.prepare.stages`).

A scale-out run is planned by `lmshard prepare ... --num-tasks N`: with `--executor local` (the
default) it then runs every task here and merges; with `--executor none` it only writes the
plan and prints the commands that any "task i of N" scheduler runs: `lmshard run-task --stage
tokenize --task I OUT` for each task, then `lmshard run-task --stage merge OUT` once.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from . import render
from .errors import ConfigError

STAGES = ("tokenize", "dedup", "merge")


def register(app: typer.Typer, user_errors: Callable[[], Callable[[Any], Any]]) -> None:
    """Add `run-task` and `status` to `app`."""
    app.command("run-task")(user_errors()(run_task))
    app.command("status")(user_errors()(status))


def planned_prepare(cfg: Any, n_tasks: int, executor: str, on_progress: Callable[[Any], None] | None = None) -> Any:
    """`prepare --num-tasks N [--executor ...]`: the metadata of the dataset where this process
    wrote it (local, ray), else None (the tasks run elsewhere)."""
    from .prepare import stages

    plan, _, _ = stages.plan_run(cfg, n_tasks)
    show = render.err if cfg.json else render.out  # with --json, stdout holds only the JSON summary
    out = shlex.quote(cfg.out)
    if executor == "ray":
        from .prepare import ray_exec

        return ray_exec.run(cfg, n_tasks, plan["unit_bytes"], cfg.ray_address)
    if executor == "slurm":
        from .prepare import slurm

        jobs = slurm.submit(cfg.out, n_tasks, cfg.sbatch_args)
        show.print(f"submitted {n_tasks} tokenize tasks (job {', '.join(jobs['tokenize'])}), {n_tasks} dedup "
                         f"tasks (job {', '.join(jobs['dedup'])}) and the merge (job {jobs['merge']}); follow with: "
                         f"lmshard status {out}", markup=False, soft_wrap=True)  # fmt: skip
        again = "; ".join(jobs["resubmit"])
        show.print(f"if tokenize task I fails (the later stages are then cancelled), resubmit in order once "
                   f"each is done: {again}", markup=False, soft_wrap=True)  # fmt: skip
        return None
    if executor == "none":
        units, tasks = render.plural(len(plan["units"]), "unit"), render.plural(n_tasks, "task")
        show.print(f"planned {units} in {tasks}; run each stage's tasks, then the merge:", markup=False,
                         soft_wrap=True)  # fmt: skip
        for stage in ("tokenize", "dedup"):
            line = f"  lmshard run-task --stage {stage} --task I {out}"
            after = ", after every tokenize task is done" if stage == "dedup" else ""
            show.print(f"{line}    # I = 0 .. {n_tasks - 1}{after}", markup=False, soft_wrap=True)
        show.print(f"  lmshard run-task --stage merge {out}", markup=False, soft_wrap=True)
        return None
    from .prepare import local_exec

    return local_exec.run(cfg, n_tasks, plan["unit_bytes"], on_progress)


def run_task(
    out: Path = typer.Argument(..., metavar="DIR", help="The output dataset directory the run was planned for."),
    stage: str = typer.Option(
        ...,
        "--stage",
        metavar="STAGE",
        help="tokenize (a task's units), dedup (a hash bucket, after every tokenize) or merge (once).",
    ),
    task: int | None = typer.Option(None, "--task", metavar="I", help="The task to run (0-based; tokenize and dedup)."),
) -> None:
    """Run one stage of one task of a planned scale-out prepare (see `prepare --num-tasks`)."""
    from .prepare import stages

    cfg, n_tasks, unit_bytes = stages.config_of(out)
    if stage in ("tokenize", "dedup") and task is None:
        raise ConfigError(f"--stage {stage} needs --task I, I in 0 .. {n_tasks - 1}")
    if stage == "tokenize":
        assert task is not None
        try:
            done = stages.tokenize_task(cfg, n_tasks, task, unit_bytes)
        except stages.TaskStopped as e:  # scancel or a time limit: exit as a signal's death reads (128 + signum)
            render.err.print(f"stopped: {e}", markup=False, soft_wrap=True)
            raise typer.Exit(128 + e.signum) from None
        render.err.print(f"task {task}: {done} unit{'s' if done != 1 else ''} tokenized", markup=False, soft_wrap=True)
    elif stage == "dedup":
        assert task is not None
        ran = stages.dedup_task(cfg, n_tasks, task, unit_bytes)
        render.err.print(f"dedup bucket {task}: {'done' if ran else 'nothing to do'}", markup=False, soft_wrap=True)
    elif stage == "merge":
        # no --resume here: run again after a stop (scancel, a time limit), it goes on with its build
        render.summary(stages.merge(cfg, n_tasks, unit_bytes, resume=True), cfg.out)
    else:
        raise ConfigError(f"--stage {stage}: pass one of {', '.join(STAGES)}")


def status(
    out: Path = typer.Argument(..., metavar="DIR", help="The output dataset directory of a planned run."),
) -> None:
    """Progress of a planned scale-out prepare: tasks done, tasks incomplete, and what to run next."""
    from .prepare import stages

    info = stages.status(out)
    tasks = info["tasks"]
    done = sum(not t["units"] or t["done"] == t["units"] for t in tasks)
    render.out.print(
        f"tokenize: {done} of {len(tasks)} tasks complete ({render.plural(info['units'], 'unit')})",
        markup=False,
        soft_wrap=True,
    )
    quoted = shlex.quote(str(out))
    if info["merged"]:  # every stage's work is in the dataset, whichever stages ran as their own tasks
        _done(quoted, info)
        return
    for t in info["incomplete"]:
        row = tasks[t]
        state = f" ({row['state']})" if row["state"] else ""
        render.out.print(f"  task {t}: {row['done']} of {row['units']} units{state}; run: lmshard run-task --stage "
                         f"tokenize --task {t} {quoted}", markup=False, soft_wrap=True)  # fmt: skip
    if info["dedup"]:
        missing = info["dedup_missing"]
        render.out.print(
            f"dedup: {len(tasks) - len(missing)} of {len(tasks)} buckets complete", markup=False, soft_wrap=True
        )
        if missing and not info["incomplete"]:
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            render.out.print(
                f"  buckets {shown}; run: lmshard run-task --stage dedup --task I {quoted}",
                markup=False,
                soft_wrap=True,
            )
    if not info["incomplete"] and not (info["dedup"] and info["dedup_missing"]):
        render.out.print(f"merge: not run; run: lmshard run-task --stage merge {quoted}", markup=False, soft_wrap=True)
    else:
        render.out.print("merge: waits for the tasks above", markup=False, soft_wrap=True)


def _done(quoted: str, info: dict[str, Any]) -> None:
    """A merged run: done, whatever the dedup buckets say: the local executor deduplicates in the
    merge, so its buckets never run as tasks."""
    if info["dedup"]:
        n, missing = len(info["tasks"]), info["dedup_missing"]
        buckets = f"{n} of {n} buckets complete" if not missing else "done in the merge"
        render.out.print(f"dedup: {buckets}", markup=False, soft_wrap=True)
    render.out.print("merge: done", markup=False, soft_wrap=True)
    render.out.print(f"done: the dataset is complete; check it with: lmshard inspect {quoted}", markup=False,
                     soft_wrap=True)  # fmt: skip
