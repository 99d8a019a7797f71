"""Scale-out stages: the same corpus prepared on one machine and as N tasks (tokenize each
task's units, then merge) gives byte-identical shards and metadata, timings aside."""

from __future__ import annotations

import json
import shutil

import pytest
from test_prepare import jsonl, make_texts

from lmshard.errors import ConfigError, InputError
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.stages import merge, missing_units, plan_run, tokenize_task
from lmshard.prepare.taskplan import _WINDOW, load_plan, work_dir


def _corpus(tmp):
    texts = make_texts(1500, seed=21)
    repeats = texts[:40]  # duplicates straddling files, units and tasks
    jsonl(tmp / "in" / "a.jsonl", texts[:900] + repeats)
    jsonl(tmp / "in" / "b.jsonl", repeats + texts[900:])
    (tmp / "in" / "c.txt").write_text("\n\n".join(texts[:30] + [f"para {i} " * 40 for i in range(600)]) + "\n")
    (tmp / "in" / "d.jsonl").write_text('{"text": "fine"}\n{"oops": 1}\n{"text": ""}\nnot json\n')
    return tmp / "in"


def _files(root):
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "dataset_metadata.json":
                meta = json.loads(data)
                meta.pop("run")
                data = json.dumps(meta, sort_keys=True).encode()
            out[p.relative_to(root).as_posix()] = data
    return out


@pytest.mark.parametrize("n_tasks", [1, 3, 7])
def test_tasks_then_merge_equal_one_machine(tmp_path, n_tasks):
    src = _corpus(tmp_path)
    opts = dict(inputs=[str(src)], workers=1, val_fraction=0.1, tokens_per_shard=20_000, on_error="skip")
    prepare(PrepareConfig(out=str(tmp_path / "local"), **opts))
    config = PrepareConfig(out=str(tmp_path / "scaled"), **opts)
    for task in reversed(range(n_tasks)):  # any order
        tokenize_task(config, n_tasks, task, unit_bytes=_WINDOW)
    plan = load_plan(work_dir(config.out))
    assert len(plan["units"]) > 5  # the large files really were cut
    merge(config, n_tasks, unit_bytes=_WINDOW)
    meta = json.loads((tmp_path / "local" / "dataset_metadata.json").read_text())
    assert meta["drops"]["duplicate"] >= 40 and meta["drop_examples"] and meta["splits"]["val"]["shards"]
    local, scaled = _files(tmp_path / "local"), _files(tmp_path / "scaled")
    assert local.keys() == scaled.keys() and len(local) > 4
    for name in local:
        assert local[name] == scaled[name], name


def test_a_missing_unit_blocks_the_merge_and_its_task_reruns(tmp_path):
    src = _corpus(tmp_path)
    config = PrepareConfig(out=str(tmp_path / "scaled"), inputs=[str(src)], workers=1, on_error="skip")
    for task in range(3):
        tokenize_task(config, 3, task, unit_bytes=_WINDOW)
    tok = work_dir(config.out) / "tokenize"
    (tok / "unit_000002.done").unlink()  # as if its task was killed before finishing the unit
    assert missing_units(config) == [2]
    with pytest.raises(
        InputError, match="1 of .* units are not tokenized yet \\(units 2\\); run the tokenize stage of task"
    ):
        merge(config, 3, unit_bytes=_WINDOW)
    task = next(t for t, (a, b) in enumerate(load_plan(work_dir(config.out))["tasks"]) if a <= 2 < b)
    assert tokenize_task(config, 3, task, unit_bytes=_WINDOW) == 1  # only the missing unit is redone
    merge(config, 3, unit_bytes=_WINDOW)
    assert (tmp_path / "scaled" / "dataset_metadata.json").exists()
    with pytest.raises(ConfigError, match="--num-tasks was 3 and is 4 now"):
        tokenize_task(config, 4, 0, unit_bytes=_WINDOW)
    shutil.rmtree(work_dir(config.out))


def test_the_command_line_plans_runs_tasks_reports_status_and_merges(tmp_path):
    """`prepare --num-tasks 7 --executor none`, `run-task` per task in any order, `status` naming
    the task still missing, the dedup buckets, `run-task --stage merge`: the same bytes as a local
    prepare; so does `--num-tasks 3` with the local executor and --workers 2."""
    import os
    import subprocess
    import sys

    src = _corpus(tmp_path)
    lmshard = [sys.executable, "-m", "lmshard"]
    env = os.environ | {"LMSHARD_UNIT_BYTES": str(_WINDOW)}  # units of 64 KiB: the files are cut

    def run(*args):
        return subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)

    common = [str(src), "--workers", "1", "--on-error", "skip"]
    assert run("prepare", *common, "--out", "local").returncode == 0
    planned = run("prepare", *common, "--out", "dist", "--num-tasks", "7", "--executor", "none")
    assert planned.returncode == 0 and "lmshard run-task --stage tokenize --task I dist" in planned.stdout
    plan = load_plan(work_dir(tmp_path / "dist"))
    assert all(b > a for a, b in plan["tasks"]), plan["tasks"]  # no task is empty
    for task in range(6, 0, -1):
        assert run("run-task", "--stage", "tokenize", "--task", str(task), "dist").returncode == 0
    waiting = run("status", "dist")
    assert "6 of 7 tasks complete" in waiting.stdout and "--task 0 dist" in waiting.stdout, waiting.stdout
    early = run("run-task", "--stage", "merge", "dist")
    assert early.returncode != 0 and "task 0 first" in early.stderr and "Traceback" not in early.stderr
    assert run("run-task", "--stage", "tokenize", "--task", "0", "dist").returncode == 0
    assert "buckets 0, 1, 2, 3, 4, 5, 6; run: lmshard run-task --stage dedup" in run("status", "dist").stdout
    for bucket in (3, 0, 6, 1, 5, 2, 4):
        assert run("run-task", "--stage", "dedup", "--task", str(bucket), "dist").returncode == 0
    assert "dedup: 7 of 7 buckets complete" in run("status", "dist").stdout
    assert run("run-task", "--stage", "merge", "dist").returncode == 0
    assert "merge: done" in run("status", "dist").stdout
    local, dist = _files(tmp_path / "local"), _files(tmp_path / "dist")
    assert local == dist
    here = run("prepare", str(src), "--on-error", "skip", "--workers", "2", "--out", "here", "--num-tasks", "3")
    assert here.returncode == 0, here.stderr
    assert _files(tmp_path / "here") == local
    wrong = run("run-task", "--stage", "tokenize", "--task", "9", "dist")
    assert wrong.returncode != 0 and "task 9 is not in [0, 7)" in wrong.stderr


@pytest.mark.parametrize("n_tasks", [1, 4])
def test_the_dedup_stage_by_hash_bucket_gives_the_same_bytes(tmp_path, n_tasks):
    """Duplicates resolved per bucket (key mod N, one task each), then merged without an
    in-memory key set: still the one-machine bytes; a partial dedup stage is refused."""
    from lmshard.prepare.stages import dedup_task

    src = _corpus(tmp_path)
    opts = dict(inputs=[str(src)], workers=1, val_fraction=0.1, on_error="skip")
    prepare(PrepareConfig(out=str(tmp_path / "local"), **opts))
    config = PrepareConfig(out=str(tmp_path / "scaled"), **opts)
    for task in range(n_tasks):
        tokenize_task(config, n_tasks, task, unit_bytes=_WINDOW)
    assert dedup_task(config, n_tasks, 0, unit_bytes=_WINDOW) is True
    assert dedup_task(config, n_tasks, 0, unit_bytes=_WINDOW) is False  # done: skipped
    if n_tasks > 1:
        with pytest.raises(InputError, match="dedup stage is not complete \\(buckets 1"):
            merge(config, n_tasks, unit_bytes=_WINDOW)
    for bucket in range(1, n_tasks):
        dedup_task(config, n_tasks, bucket, unit_bytes=_WINDOW)
    dups = sum(json.loads(p.read_text())["duplicates"] for p in (work_dir(config.out) / "dedup").glob("*.done"))
    assert dups == json.loads((tmp_path / "local" / "dataset_metadata.json").read_text())["drops"]["duplicate"] > 40
    merge(config, n_tasks, unit_bytes=_WINDOW)
    assert _files(tmp_path / "local") == _files(tmp_path / "scaled")


@pytest.mark.parametrize("workers", [1, 2])
def test_the_local_executor_merges_as_units_finish_and_resumes(tmp_path, workers):
    """The local executor (units tokenized --workers at a time while this process merges them,
    dedup in memory) gives the one-machine bytes, also when some units were done before (by
    run-task, or by a run that was killed): those are not tokenized again."""
    from lmshard.prepare import local_exec

    src = _corpus(tmp_path)
    opts = dict(inputs=[str(src)], val_fraction=0.1, tokens_per_shard=20_000, on_error="skip")
    prepare(PrepareConfig(out=str(tmp_path / "local"), workers=1, **opts))
    config = PrepareConfig(out=str(tmp_path / "scaled"), workers=workers, **opts)
    tokenize_task(config, 3, 1, unit_bytes=_WINDOW)  # task 1 done beforehand
    tok = work_dir(config.out) / "tokenize"
    before = {p.name: p.stat().st_mtime_ns for p in tok.glob("unit_*.done")}
    assert before and missing_units(config)
    local_exec.run(config, 3, unit_bytes=_WINDOW)
    assert {p.name: p.stat().st_mtime_ns for p in tok.glob("unit_*.done") if p.name in before} == before
    assert not missing_units(config) and not (work_dir(config.out) / "dedup").exists()
    assert _files(tmp_path / "local") == _files(tmp_path / "scaled")


def test_a_task_killed_midway_is_named_by_status_and_its_rerun_completes(tmp_path):
    """A real SIGKILL of a `run-task` process part-way through its units: `status` names the
    task (died, with the units it finished), re-running only that task finishes the rest, and
    the merged dataset equals one machine's."""
    import os
    import signal
    import subprocess
    import sys

    from proctree import wait_stopped

    src = tmp_path / "in"
    jsonl(src / "big.jsonl", make_texts(12_000, seed=5))  # ~100 units of 64 KiB
    lmshard = [sys.executable, "-m", "lmshard"]
    env = os.environ | {"LMSHARD_UNIT_BYTES": str(_WINDOW)}

    def run(*args):
        return subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)

    common = [str(src), "--workers", "1"]
    assert run("prepare", *common, "--out", "local").returncode == 0
    assert run("prepare", *common, "--out", "dist", "--num-tasks", "2", "--executor", "none").returncode == 0
    plan = load_plan(work_dir(tmp_path / "dist"))
    first, end = plan["tasks"][0]
    assert end - first > 20
    tok = work_dir(tmp_path / "dist") / "tokenize"
    proc = subprocess.Popen([*lmshard, "run-task", "--stage", "tokenize", "--task", "0", "dist"], cwd=tmp_path,
                            env=env | {"LMSHARD_STOP_AT": "unit:7"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # it stops itself after 7 units
    assert wait_stopped(proc) == proc.pid
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = len(list(tok.glob("unit_*.done")))
    assert finished == 7 < end - first  # killed midway
    assert run("run-task", "--stage", "tokenize", "--task", "1", "dist").returncode == 0
    shown = run("status", "dist").stdout
    assert f"task 0: {finished} of {end - first} units (died on " in shown, shown
    assert "run: lmshard run-task --stage tokenize --task 0 dist" in shown and "task 1:" not in shown
    redo = run("run-task", "--stage", "tokenize", "--task", "0", "dist")
    assert redo.returncode == 0 and f"task 0: {end - first - finished} units tokenized" in redo.stderr, redo.stderr
    assert "1 of 2" not in run("status", "dist").stdout
    assert run("run-task", "--stage", "merge", "dist").returncode == 0
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")


def test_the_printed_slurm_resubmit_commands_cover_every_bucket():
    """The dedup stage is an array over every bucket (a bare `sbatch dedup.sbatch` ran bucket 0
    only), within MaxArraySize, with the task number passed as the scripts read it."""
    from pathlib import Path

    from lmshard.prepare.slurm import resubmit_commands

    scripts = {s: Path(f"/w/slurm/{s}.sbatch") for s in ("tokenize", "dedup", "merge")}
    assert resubmit_commands(scripts, 5, 3) == [
        "sbatch --array=0 --export=ALL,LMSHARD_TASK_OFFSET=I /w/slurm/tokenize.sbatch",
        "sbatch --array=0-1 --export=ALL,LMSHARD_TASK_OFFSET=0 /w/slurm/dedup.sbatch",
        "sbatch --array=0-1 --export=ALL,LMSHARD_TASK_OFFSET=2 /w/slurm/dedup.sbatch",
        "sbatch --array=0-0 --export=ALL,LMSHARD_TASK_OFFSET=4 /w/slurm/dedup.sbatch",
        "sbatch /w/slurm/merge.sbatch",
    ]
    tasks = set()
    for line in resubmit_commands(scripts, 7, 1001)[1:-1]:  # each bucket once: offset + array index
        first = int(line.split("OFFSET=")[1].split()[0])
        last = int(line.split("--array=0-")[1].split()[0])
        tasks |= {first + i for i in range(last + 1)}
    assert tasks == set(range(7))


def test_a_task_stopped_by_sigterm_is_recorded_as_stopped_and_its_rerun_completes(tmp_path):
    """scancel or a time limit sends SIGTERM: the task records itself as stopped (not left
    "running" for `status` on another host), exits 143 with one line, and its re-run finishes."""
    import os
    import signal
    import subprocess
    import sys

    from proctree import finish, signal_stopped, wait_stopped

    src = tmp_path / "in"
    jsonl(src / "big.jsonl", make_texts(6_000, seed=6))
    lmshard = [sys.executable, "-m", "lmshard"]
    env = os.environ | {"LMSHARD_UNIT_BYTES": str(_WINDOW)}

    def run(*args):
        return subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)

    assert run("prepare", str(src), "--workers", "1", "--out", "local").returncode == 0
    assert run("prepare", str(src), "--workers", "1", "--out", "dist", "--num-tasks", "1",
               "--executor", "none").returncode == 0  # fmt: skip
    proc = subprocess.Popen([*lmshard, "run-task", "--stage", "tokenize", "--task", "0", "dist"], cwd=tmp_path,
                            env=env | {"LMSHARD_STOP_AT": "unit:3"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    assert wait_stopped(proc) == proc.pid
    signal_stopped(proc.pid, signal.SIGTERM)
    code, err = finish(proc, 120)
    assert code == 143 and "Traceback" not in err, err
    assert "task 0 stopped by SIGTERM with 3 of" in err and "run the same command again" in err, err
    state = json.loads((work_dir(tmp_path / "dist") / "tasks" / "tokenize_000000.json").read_text())
    assert state["state"] == "stopped" and state["signal"] == "SIGTERM" and state["pid"] == proc.pid
    assert f"(pid {proc.pid}) by SIGTERM" in run("status", "dist").stdout
    assert run("run-task", "--stage", "tokenize", "--task", "0", "dist").returncode == 0
    assert run("run-task", "--stage", "dedup", "--task", "0", "dist").returncode == 0
    assert run("run-task", "--stage", "merge", "dist").returncode == 0
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")


def test_units_are_sized_to_the_task_count_and_unit_size_is_an_option(tmp_path, monkeypatch):
    """8 tasks over a few MB each get units (64 MiB units would give one task everything); an
    explicit --unit-size is the plan's; the output is one machine's bytes either way."""
    import subprocess
    import sys

    import lmshard.prepare.taskplan as taskplan

    monkeypatch.setattr(taskplan, "UNIT_BYTES", 64 << 20)  # the default, whatever LMSHARD_UNIT_BYTES says
    src = jsonl(tmp_path / "in" / "a.jsonl", make_texts(12_000, seed=9))
    size = src.stat().st_size
    plan, _, _ = plan_run(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "p8"), workers=1), 8)
    assert plan["unit_bytes"] == -(-size // 32) and len(plan["units"]) >= 8
    assert all(end > first for first, end in plan["tasks"])  # no task without work
    plan, _, _ = plan_run(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "u"), workers=1, unit_size=128 << 10), 2)
    assert plan["unit_bytes"] == 128 << 10 and len(plan["units"]) == -(-size // (128 << 10))
    lmshard = [sys.executable, "-m", "lmshard", "prepare", str(src), "--workers", "1"]
    env = {k: v for k, v in __import__("os").environ.items() if k != "LMSHARD_UNIT_BYTES"}
    for args in (["--out", str(tmp_path / "one")], ["--out", str(tmp_path / "eight"), "--num-tasks", "8"],
                 ["--out", str(tmp_path / "sized"), "--num-tasks", "2", "--unit-size", "256K"]):  # fmt: skip
        done = subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr
    assert load_plan(work_dir(tmp_path / "sized"))["unit_bytes"] == 256 << 10
    assert _files(tmp_path / "one") == _files(tmp_path / "eight") == _files(tmp_path / "sized")
    for bad, words in (("12x", "pass a size in bytes"), ("16K", "pass at least 65,536 bytes")):
        done = subprocess.run([*lmshard, "--out", str(tmp_path / "bad"), "--num-tasks", "2", "--unit-size", bad],
                              capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
        assert done.returncode == 1 and words in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_an_input_changed_after_planning_is_named_not_the_unit_size(tmp_path):
    """The unit size was sized from the inputs when the plan was made: a later task keeps the
    plan's, so the refusal names what changed (the input), not a recomputed unit size."""
    src = jsonl(tmp_path / "in" / "a.jsonl", make_texts(3_000, seed=2))
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "o"), workers=1)
    plan_run(config, 4)
    with open(src, "a") as f:
        f.write('{"text": "one more document"}\n')
    with pytest.raises(ConfigError) as e:
        plan_run(config, 4)
    assert "unit size" not in str(e.value) and "a.jsonl" in str(e.value), str(e.value)


def test_a_merge_stopped_by_sigterm_goes_on_when_its_command_is_run_again(tmp_path):
    """`run-task --stage merge` has no --resume: stopped by SIGTERM midway (a checkpoint after
    each item), it exits 143 naming its own command line, and that command, run again, goes
    on with the interrupted build and writes one machine's bytes; a third run finds it done."""
    import os
    import signal
    import subprocess
    import sys

    from proctree import finish, signal_stopped, wait_stopped

    src = tmp_path / "in"
    jsonl(src / "big.jsonl", make_texts(6_000, seed=7))
    lmshard = [sys.executable, "-m", "lmshard"]
    # small work items (the item cut is in the run fingerprint: the same for every step)
    env = os.environ | {"LMSHARD_UNIT_BYTES": str(_WINDOW), "LMSHARD_BLOCK_BYTES": "65536",
                        "LMSHARD_CHECKPOINT_SECONDS": "0"}  # fmt: skip

    def run(*args):
        return subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)

    assert run("prepare", str(src), "--workers", "1", "--out", "local").returncode == 0
    assert run("prepare", str(src), "--workers", "1", "--out", "dist", "--num-tasks", "2",
               "--executor", "none").returncode == 0  # fmt: skip
    for stage in ("tokenize", "dedup"):
        for task in ("0", "1"):
            assert run("run-task", "--stage", stage, "--task", task, "dist").returncode == 0
    proc = subprocess.Popen([*lmshard, "run-task", "dist", "--stage", "merge"], cwd=tmp_path,
                            env=env | {"LMSHARD_STOP_AT": "item:3"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    assert wait_stopped(proc) == proc.pid
    signal_stopped(proc.pid, signal.SIGTERM)
    code, err = finish(proc, 120)
    assert code == 143 and "terminated (SIGTERM)" in err and "Traceback" not in err, err
    assert "continue with:\nlmshard run-task dist --stage merge\n" in err and "--resume" not in err, err
    assert (tmp_path / ".dist.lmshard-partial").is_dir() and not (tmp_path / "dist").exists()
    again = run("run-task", "dist", "--stage", "merge")
    assert again.returncode == 0, again.stderr
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")
    meta = (tmp_path / "dist" / "dataset_metadata.json").read_bytes()
    assert run("run-task", "dist", "--stage", "merge").returncode == 0  # complete: left as it is (its run record too)
    assert (tmp_path / "dist" / "dataset_metadata.json").read_bytes() == meta
