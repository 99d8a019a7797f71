"""`lmshard run-task` and `lmshard status`, and `prepare --num-tasks`: the command-line edge of
the scale-out stages (`lmshard.prepare.execution.stages`).

A scale-out run is planned by `lmshard prepare ... --num-tasks N`: with `--executor local` (the
default) it then runs every stage here; with `--executor none` it claims the output, writes the
plan and prints the commands that any "task i of N" scheduler runs: `lmshard run-task --stage
STAGE --task I OUT` for each stage and task, then `lmshard run-task --stage finish OUT` once.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from ..errors import ConfigError
from . import render

# as lmshard.prepare.execution.stages.STAGES; the first two with --dedup-lines only
STAGES = ("lines", "linedup", "tokenize", "dedup", "select", "write", "finish")
_WHAT = {"lines": "units", "linedup": "groups of buckets", "tokenize": "units", "dedup": "groups of buckets",
         "select": "units", "write": "parts of shards"}  # fmt: skip


def register(app: typer.Typer, user_errors: Callable[[], Callable[[Any], Any]]) -> None:
    """Add `run-task` and `status` to `app`."""
    app.command("run-task")(user_errors()(run_task))
    app.command("status")(user_errors()(status))


def planned_prepare(cfg: Any, n_tasks: int, executor: str, on_progress: Callable[[Any], None] | None = None) -> Any:
    """`prepare --num-tasks N [--executor ...]`: the metadata of the dataset where this process
    wrote it (local, ray), else None (the tasks run elsewhere). An --out URL is built in a local
    work directory by the local or Ray tasks and published when they finish (publish.py)."""
    from ..prepare.execution import local_exec
    from ..remote import redact
    from ..remote.urls import output_url

    if output_url(cfg.out):
        if executor not in ("local", "ray"):
            raise ConfigError(f"--out {redact(cfg.out)} with --executor {executor}: the tasks of other machines "
                              "share a directory, not a URL; use --executor local or ray, or write to a shared "
                              "directory")  # fmt: skip
        from ..prepare.output.publish import prepare_remote

        return prepare_remote(cfg, on_progress, lambda local, callback: planned_prepare(local, n_tasks, executor,
                                                                                        callback))  # fmt: skip

    if executor == "local":
        return local_exec.run(cfg, n_tasks, None, on_progress)
    claim, plan = local_exec.claim(cfg, n_tasks)
    if claim.complete is not None:
        return claim.complete
    show = render.err if cfg.json else render.out  # with --json, stdout holds only the JSON summary
    out = shlex.quote(cfg.out)
    if executor == "ray":
        from ..prepare.execution import ray_exec

        return ray_exec.run(cfg, n_tasks, plan["unit_bytes"], cfg.ray_address)
    if executor == "slurm":
        from ..prepare.execution import slurm

        stages = slurm.array_stages(cfg.dedup_lines)
        jobs = slurm.submit(cfg.out, n_tasks, cfg.sbatch_args, cfg.max_jobs, stages)
        arrays = ", ".join(f"{stage} (job {jobs[stage]})" for stage in stages)
        k = jobs["array_tasks"]
        each = f" in arrays of {k} (array task i runs tasks i, i + {k}, ... in turn)" if k < n_tasks else ""
        show.print(f"submitted {n_tasks} tasks of each stage{each}: {arrays}, and the finish (job {jobs['finish']}): "
                   f"{len(stages) * k + 1} jobs in all; follow with: lmshard status {out}", markup=False,
                   soft_wrap=True)  # fmt: skip
        again = "; ".join(jobs["resubmit"])
        show.print(f"if {stages[0]} task I fails (the later stages are then cancelled), `lmshard status {out}` "
                   f"prints what re-runs the missing tasks; for task I it is: {again}", markup=False,
                   soft_wrap=True)  # fmt: skip
        return None
    units, tasks = render.plural(len(plan["units"]), "unit"), render.plural(n_tasks, "task")
    show.print(f"planned {units} in {tasks}; run each stage's tasks, one stage after the other, then the finish:",
               markup=False, soft_wrap=True)  # fmt: skip
    for stage in (STAGES if cfg.dedup_lines else STAGES[2:])[:-1]:
        show.print(f"  lmshard run-task --stage {stage} --task I {out}    # I = 0 .. {n_tasks - 1}", markup=False,
                   soft_wrap=True)  # fmt: skip
    show.print(f"  lmshard run-task --stage finish {out}", markup=False, soft_wrap=True)
    return None


def run_task(
    out: Path = typer.Argument(..., metavar="DIR", help="The output dataset directory the run was planned for."),
    stage: str = typer.Option(
        ...,
        "--stage",
        metavar="STAGE",
        help="tokenize (a task's units), dedup (its groups of hash buckets), select (its units), write (its "
        "shards), each after every task of the stage before; finish (once, last). With --dedup-lines, lines (a "
        "task's units' lines hashed) and linedup (its groups of buckets) come first. A planned retokenize: encode "
        "(a task's source shards), write (its new shards), finish; a planned score: score (a task's source "
        "shards), finish.",
    ),
    task: int | None = typer.Option(None, "--task", metavar="I", help="The task to run (0-based; all but finish)."),
    workers: int | None = typer.Option(
        None,
        "--workers",
        metavar="N",
        help="Processes for the task's items (default: the plan's --workers, else the CPUs granted to this task: "
        "SLURM_CPUS_PER_TASK, else its CPU affinity). A task of a 64-core node runs its items 64 at a time; a "
        "planned retokenize's or score's task takes its shards one at a time, each in blocks over N processes.",
    ),
) -> None:
    """Run one stage of one task of a planned scale-out prepare, retokenize or score (`--num-tasks`)."""
    from ..prepare.execution import nearparts, stages
    from ..prepare.execution.taskplan import work_dir
    from ..remote.urls import local_only

    local_only(out, "run-task")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers {workers}: pass 1 or more")
    from ..interop import rewrite, rewriteengines

    if rewrite.planned(out):  # a planned retokenize or score (`--num-tasks`)
        if stage == "finish" and rewrite.swapped(out):  # complete; a finish stopped while removing its work folder
            rewrite.remove_work(rewrite.work_dir(os.path.realpath(out)))
            render.err.print("finish: the dataset was complete; what was left of its work folder is removed",
                             markup=False, soft_wrap=True)  # fmt: skip
            return
        if stage != "finish" and task is None:
            raise ConfigError(f"--stage {stage} needs --task I")
        try:
            done = rewriteengines.tasks_for(out, workers or 0).run(stage, task or 0)
        except stages.TaskStopped as e:  # scancel or a time limit: exit as a signal's death reads (128 + signum)
            render.err.print(f"stopped: {e}", markup=False, soft_wrap=True)
            raise typer.Exit(128 + e.signum) from None
        said = {"encode": "source shards encoded", "write": "shards written", "score": "source shards scored",
                "finish": "shards in the dataset"}  # fmt: skip
        render.err.print(f"{stage} task {task or 0}: {done} {said.get(stage, 'items')}", markup=False, soft_wrap=True)
        return
    if stage not in STAGES:
        raise ConfigError(f"--stage {stage}: pass one of {', '.join(STAGES)}")
    if stage == "finish" and task not in (None, 0):
        raise ConfigError("--stage finish runs once, for the whole run: leave --task out")
    out = stages.planned_here(out)  # (relative inputs and --out: from where the run was planned)
    if _complete(out, stage, task):
        return
    cfg, n_tasks, unit_bytes = stages.config_of(out)
    if stage != "finish":  # (the finish of a run stopped after its swap has no build left: it removes the rest)
        stages.check_claimed(out)
    if workers is not None:
        cfg = dataclasses.replace(cfg, workers=workers)
    if stage != "finish" and task is None:
        raise ConfigError(f"--stage {stage} needs --task I, I in 0 .. {n_tasks - 1}")
    from ..prepare.output.staging import OutputPaths
    from . import runlog

    # an --append's finish says what it added, as its prepare would (not a finish stopped after the swap: no build)
    before = runlog.dataset_counts(cfg.out) if stage == "finish" and cfg.append and \
        OutputPaths.of(cfg.out).staging.exists() else None  # fmt: skip
    try:
        done = stages.run_task(cfg, n_tasks, stage, task or 0, unit_bytes)
    except stages.TaskStopped as e:  # scancel or a time limit: exit as a signal's death reads (128 + signum)
        render.err.print(f"stopped: {e}", markup=False, soft_wrap=True)
        raise typer.Exit(128 + e.signum) from None
    if stage == "finish":
        from ..format import load_metadata

        meta = load_metadata(cfg.out)
        if before is not None:
            runlog.appended_line(runlog.added_by(meta, before))
        render.summary(meta, cfg.out)
        return
    one, many = {"lines": ("unit's lines hashed", "units' lines hashed"),
                 "linedup": ("group of line buckets deduplicated", "groups of line buckets deduplicated"),
                 "tokenize": ("unit tokenized", "units tokenized"),
                 "dedup": ("group of buckets deduplicated", "groups of buckets deduplicated"),
                 "select": ("unit selected", "units selected"),
                 "write": ("part of a shard or key file written", "parts of shards and key files written")}[stage]
    what = one if done == 1 else many
    if stage == "select" and (parts := nearparts.parts_of(work_dir(cfg.out))) > 1:
        what += f", the near-duplicate clusters found over {parts} parts with the other select tasks"
    if done == 0 and (total := stages.task_items(cfg, n_tasks, stage, task or 0, unit_bytes)):
        noun = "parts" if stage == "write" else "groups" if stage in ("dedup", "linedup") else "units"
        its = f"its {total:,} {noun} were" if total > 1 else f"its one {noun[:-1]} was"
        render.err.print(f"{stage} task {task}: nothing to do, {its} done before", markup=False, soft_wrap=True)
        return
    render.err.print(f"{stage} task {task}: {done} {what}", markup=False, soft_wrap=True)


def status(
    out: Path = typer.Argument(..., metavar="DIR", help="The output dataset directory of a planned run."),
) -> None:
    """Progress of a planned scale-out prepare or retokenize: each stage's tasks done, and what to run next."""
    from ..prepare.execution import stages
    from ..remote.urls import local_only

    local_only(out, "status")
    from ..interop import rewrite, rewriteengines

    if rewrite.swapped(out):  # complete; a finish stopped while removing its work folder
        quoted = shlex.quote(str(out))
        render.out.print(f"done: the dataset is complete (`lmshard run-task --stage finish {quoted}` removes what is "
                         "left of its work folder)", markup=False, soft_wrap=True)  # fmt: skip
        return
    if rewrite.planned(out):
        _rewrite_status(out, rewriteengines.progress(out))
        return
    _unplanned(out)
    info = stages.status(out)
    quoted = shlex.quote(str(out))
    if info["merged"]:
        render.out.print(f"done: the dataset is complete; check it with: lmshard inspect {quoted}", markup=False,
                         soft_wrap=True)  # fmt: skip
        return
    if info.get("stale"):  # (volatile.py)
        render.out.print(f"stale: a local run left its work unsynced {info['stale']}; its files cannot be trusted: "
                         f"`lmshard prepare ... --out {quoted} --resume` discards them and starts over", markup=False,
                         soft_wrap=True)  # fmt: skip
        return
    if info.get("unclaimed"):
        render.out.print(f"unclaimed: {info['unclaimed']}", markup=False, soft_wrap=True)
        return
    if info["local"]:  # (a plain prepare, or --num-tasks run here: its own command goes on with every stage)
        render.out.print(f"a local run: `lmshard prepare ... --out {quoted} --resume` (its command, with --resume) "
                         "goes on with every stage; or run the tasks left as below", markup=False, soft_wrap=True)
    waiting, first_left = False, None
    n_tasks = len(info["stages"]["tokenize"]["tasks"])
    for stage, row in info["stages"].items():
        if stage == "dedup" and not info["dedup"]:
            continue
        what = _WHAT[stage]
        if not waiting and row.get("ready"):  # the select stage is done, but no task laid the shards out yet
            render.out.print(f"write: not started (its first task lays the shards out); run: lmshard run-task --stage "
                             f"write --task I {quoted}    # I = 0 .. {n_tasks - 1}", markup=False, soft_wrap=True)
            waiting, first_left = True, first_left or ("write", list(range(n_tasks)))
            continue
        if waiting or row["total"] is None:
            render.out.print(f"{stage}: waits for the stages above", markup=False, soft_wrap=True)
            waiting = True
            continue
        left = [t for t in row["tasks"] if t["done"] < t["items"] or t.get("pending")]
        render.out.print(f"{stage}: {len(row['tasks']) - len(left)} of {len(row['tasks'])} tasks complete "
                         f"({row['done']} of {row['total']} {what})", markup=False,
                         soft_wrap=True)  # fmt: skip
        if stage == "select" and (near := info.get("rounds")):  # found by the select tasks together (nearparts.py)
            at = "found" if near["done"] else f"being found; last phase done: {near['phase'] or 'none'}"
            render.out.print(f"  near-duplicate clusters over {near['parts']} parts: {at}", markup=False,
                             soft_wrap=True)  # fmt: skip
        for t in left:
            state = f" ({t['state']})" if t["state"] else ""
            state += "; its units are done, its key file is not" if t.get("pending") else ""
            render.out.print(f"  task {t['task']}: {t['done']} of {t['items']}{state}; run: lmshard run-task --stage "
                             f"{stage} --task {t['task']} {quoted}", markup=False, soft_wrap=True)  # fmt: skip
        waiting = bool(left)
        first_left = first_left or ((stage, [t["task"] for t in left]) if left else None)
    if waiting:
        render.out.print("finish: waits for the stages above", markup=False, soft_wrap=True)
    else:
        render.out.print(f"finish: not run; run: lmshard run-task --stage finish {quoted}", markup=False,
                         soft_wrap=True)  # fmt: skip
    _slurm_advice(out, info, first_left)


def _rewrite_status(out: Path, info: dict[str, Any]) -> None:
    """A planned retokenize's or score's progress: each stage's tasks complete, and what runs what is missing."""
    quoted = shlex.quote(str(out))
    waiting, first_left = False, None
    for stage, row in info["stages"].items():
        if waiting or row["total"] is None:
            render.out.print(f"{stage}: waits for the stage above", markup=False, soft_wrap=True)
            waiting = True
            continue
        left = [t for t in row["tasks"] if t["done"] < t["items"]]
        render.out.print(f"{stage}: {len(row['tasks']) - len(left)} of {len(row['tasks'])} tasks complete "
                         f"({row['done']} of {row['total']} {'shards' if stage == 'write' else 'source shards'})",
                         markup=False, soft_wrap=True)  # fmt: skip
        for t in left:
            state = f" ({t['state']})" if t.get("state") else ""
            render.out.print(f"  task {t['task']}: {t['done']} of {t['items']}{state}; run: lmshard run-task --stage "
                             f"{stage} --task {t['task']} {quoted}", markup=False, soft_wrap=True)  # fmt: skip
        waiting = bool(left)
        first_left = first_left or ((stage, [t["task"] for t in left]) if left else None)
    render.out.print("finish: waits for the stages above" if waiting else f"finish: not run; run: lmshard run-task "
                     f"--stage finish {quoted}", markup=False, soft_wrap=True)  # fmt: skip
    _slurm_advice(out, info, first_left)


def _slurm_advice(out: Path, info: dict[str, Any], first_left: tuple[str, list[int]] | None) -> None:
    """For a run submitted to Slurm: the sbatch commands that re-run exactly the missing tasks
    of the earliest incomplete stage, then every later stage and the finish."""
    from ..prepare.execution import slurm
    from ..prepare.execution.taskplan import work_dir
    from ..prepare.slurmjobs import live_jobs

    found = slurm.submitted(work_dir(out) / "slurm")
    if found is None:
        return
    scripts, k = found
    stage, tasks = first_left or ("finish", [])
    n_tasks = len(next(iter(info["stages"].values()))["tasks"])
    lines = slurm.resubmit_commands(scripts, n_tasks, k, stage, tasks)
    live = live_jobs(str(out))
    if live:
        render.out.print(f"on Slurm: {len(live)} jobs of this run are still queued or running ({', '.join(live[:8])}"
                         f"{' ...' if len(live) > 8 else ''}); run `lmshard status` again once they have ended",
                         markup=False, soft_wrap=True)  # fmt: skip
        return
    render.out.print("on Slurm, these lines (each job waits for the ones before it) re-run exactly what is missing:",
                     markup=False, soft_wrap=True)  # fmt: skip
    for line in lines:
        render.out.print(f"  {line}", markup=False, soft_wrap=True)


def _unplanned(out: Path) -> None:
    """`status` of a directory with no plan beside it: a run's work or build folder passed for
    its dataset, a build with no plan (its own --resume goes on with it), or
    nothing of a prepare run at all, each said in one line."""
    from ..format import METADATA_FILE
    from ..prepare.execution.taskplan import PLAN_FILE, work_dir
    from ..prepare.output.leftrun import read_once
    from ..prepare.output.staging import OutputPaths, read_run

    if (work_dir(out) / PLAN_FILE).exists() or (out / METADATA_FILE).exists():
        return
    for suffix in (".lmshard-work", ".lmshard-partial"):
        if out.name.startswith(".") and out.name.endswith(suffix):
            dataset = out.parent / out.name[1 : -len(suffix)]
            raise ConfigError(f"{out} is a run's {suffix[9:]} folder; pass its dataset's directory: lmshard status "
                              f"{shlex.quote(str(dataset))}")  # fmt: skip
    staging = OutputPaths.of(str(out)).staging
    if (run := read_run(staging)) is not None:
        quoted = shlex.quote(str(out))
        once = f"a run that read stdin or a pipe left nothing to go on from in {staging}: run its command again with "
        said = once + "--overwrite" if read_once(run, out) else (
            f"a prepare run left its build in {staging}, with no plan beside it (its work folder deleted, or left "
            f"by an earlier lmshard); `lmshard prepare ... --out {quoted} --resume` (its command, with --resume) "
            "plans its work again and finishes it")  # fmt: skip
        render.out.print(f"interrupted: {said}", markup=False, soft_wrap=True)
        raise typer.Exit(0)
    if out.is_file() or out.name.endswith(".lmshard-lock"):
        raise ConfigError(f"{out}: a file, not a dataset directory; pass the --out of a prepare run")
    inside = next((p for p in out.resolve().parents if (p / METADATA_FILE).exists()), None)
    if inside is not None:
        raise ConfigError(f"{out}: a folder inside the dataset {inside}; pass that: lmshard status "
                          f"{shlex.quote(str(inside))}")  # fmt: skip
    raise ConfigError(f"{out}: no dataset, build or plan of a prepare run is there; `lmshard prepare INPUTS --out "
                      f"{shlex.quote(str(out))}` makes one")  # fmt: skip


def _complete(out: Path, stage: str, task: int | None) -> bool:
    """A task of a run whose dataset is complete (its plan gone with the work folder): a job run
    again, a retried finish, has nothing to do, and says so (exit 0); a finish removes what a
    finish stopped midway left of the work folder."""
    from ..format import METADATA_FILE
    from ..prepare.execution.taskplan import PLAN_FILE, SWAPPED_FILE, remove_work, swapped, work_dir
    from ..prepare.output.staging import OutputPaths

    work = work_dir(out)
    if (work / PLAN_FILE).exists() and (stage == "finish" or not swapped(work, OutputPaths.of(str(out)).staging)):
        return False  # (a finish stopped after its swap: finished by the finish, which removes its record first)
    if not (out / METADATA_FILE).exists():
        return False
    left = stage == "finish" and work.is_dir() and any(e.name != "slurm" for e in work.iterdir())  # (logs stay)
    if left:
        remove_work(work, (PLAN_FILE, SWAPPED_FILE))
    which = "finish" if stage == "finish" else f"{stage} task {task}"
    render.err.print(f"{which}: the dataset is complete; nothing to do" + ("; what was left of its work folder is "
                     "removed" if left else ""), markup=False, soft_wrap=True)  # fmt: skip
    return True
