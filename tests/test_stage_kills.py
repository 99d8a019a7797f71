"""kill -9 of a staged prepare (local_exec.py: tokenize → dedup → select → layout → write the
parts of each shard and key file → seal each → finish) at a point in each stage, then
`--resume`: the dataset is byte-identical to the one an uninterrupted one-machine run writes
(the metadata's "run" record aside), and nothing is left beside it (no `.NAME.lmshard-work`,
`.NAME.lmshard-partial`, lock or trash). A plain re-run after the kill is refused with one line
naming --resume.

The kill lands at a stop point (lmshard/prepare/stops.py), so where it lands never depends on
the machine's speed: a worker stops itself right after an item's marker (`unit=K`, `bucket=K`,
`select=K`, `part=K`, `piece=K`; the other worker may be midway through an item of its own,
whose partial files a resumed run must redo), or the main process stops itself during the swap
(`swap:N`); then the whole process group is killed, as the out-of-memory killer or a node
failure would. K is a seeded random choice within the stage's range (from the plan and layout
of the same run), named in every assertion message: LMSHARD_KILL_SEED=N picks other points."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from proctree import finish, group_members, start_prepare, wait_gone, wait_stopped
from test_prepare import jsonl, make_texts
from test_stages import _files

SEED = int(os.environ.get("LMSHARD_KILL_SEED", "20240611"))
STOPS = {"tokenize": "unit", "dedup": "bucket", "select": "select", "write": "part", "seal": "piece"}  # stage: point


@pytest.fixture(scope="module", autouse=True)
def staged_env():
    """Small units (64 KiB: the corpus is cut into dozens), and the staged path for a plain
    prepare with several workers, in the pool, however small its input."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LMSHARD_UNIT_BYTES", str(64 << 10))
        mp.setenv("LMSHARD_POOL_BYTES", "0")
        mp.setenv("LMSHARD_ONE_UNIT_BYTES", "0")  # (units sized to the workers, not one for every worker)
        mp.delenv("LMSHARD_STOP_AT", raising=False)
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two JSONL files sharing documents (duplicates within and across files, units and buckets),
    a text file cut by paragraphs, and bad records (skipped: drops with examples)."""
    src = tmp_path_factory.mktemp("kills") / "in"
    texts = make_texts(12_000, seed=7)
    jsonl(src / "a.jsonl", texts[:7000] + texts[:300])
    jsonl(src / "b.jsonl", texts[100:400] + texts[7000:])
    paragraphs = [f"paragraph {i}: " + " ".join(texts[i].split()[:40]) for i in range(3000)]
    (src / "c.txt").write_text("\n\n".join(paragraphs + paragraphs[:50]) + "\n")
    (src / "d.jsonl").write_text('{"text": "fine"}\n{"oops": 1}\n{"text": ""}\nnot json\n')
    return src


def _args(corpus, out, *extra):
    return [str(corpus), "--out", str(out), "--workers", "2", "--tokenizer-backend", "tiktoken",
            "--tokens-per-shard", "50000", "--val-fraction", "0.05", "--text-mode", "paragraph",
            "--on-error", "skip", *extra]  # fmt: skip


def _start(args, stop=None):
    """`lmshard prepare ARGS` in a process group of its own; `stop`: its LMSHARD_STOP_AT."""
    with pytest.MonkeyPatch.context() as mp:
        if stop is not None:
            mp.setenv("LMSHARD_STOP_AT", stop)
        return start_prepare(args)


def _work(out):
    return out.parent / f".{out.name}.lmshard-work"


def _partial(out):
    return out.parent / f".{out.name}.lmshard-partial"


@pytest.fixture(scope="module")
def one_machine(corpus, tmp_path_factory):
    """The dataset's files as one worker writes them, uninterrupted (every stage in one process)."""
    out = tmp_path_factory.mktemp("reference") / "one"
    code, err = finish(_start(_args(corpus, out, "--workers", "1")), 300)
    assert code == 0, err
    return _files(out)


@pytest.fixture(scope="module")
def shape(corpus, tmp_path_factory):
    """How many items each stage of the staged run has (units, dedup buckets, parts of shards and
    key files, pieces: the shards and key files): read from a run of it held at its swap, when
    the plan and the layout are both written."""
    out = tmp_path_factory.mktemp("shape") / "o"
    proc = _start(_args(corpus, out), "swap:1")
    try:
        assert wait_stopped(proc) == proc.pid, "the run ended before its swap"
        plan = json.loads((_work(out) / "plan.json").read_text())
        layout = json.loads((_work(out) / "layout.json").read_text())
    finally:
        _kill(proc)
    counts = {"tokenize": plan["n_units"], "dedup": plan["groups"], "select": plan["n_units"],
              "write": layout["parts"], "seal": layout["pieces"]}  # fmt: skip
    assert counts["tokenize"] >= 30 and counts["dedup"] >= 2 and counts["seal"] >= 10, counts  # really cut up
    return counts


def _kill(proc):
    """SIGKILL to every process of the run's group (the main process and its workers)."""
    members = group_members(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert wait_gone(members, timeout=60.0) == []  # (the timeout only guards a hang)


def _pick(request, n):
    """A point in [0, n), random but the same on every run of this test (with the same seed)."""
    return random.Random(f"{SEED}:{request.node.name}").randrange(n)


def _held_and_killed(args, stop, where):
    """Start the run with a stop point, see it stopped there, kill its whole group."""
    proc = _start(args, stop)
    held = wait_stopped(proc)
    if held is None:
        code, err = finish(proc, 60)
        pytest.fail(f"{where}: the run ended (exit {code}) before its stop point: {err}")
    _kill(proc)
    return held, proc.pid


def _out_of(args):
    return Path(args[args.index("--out") + 1])


def _listing(root):
    """Every path under `root` (but the writer lock, which a run takes and drops)."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if not p.name.endswith(".lmshard-lock"))


def _refused(args, where):
    """A plain re-run (no --resume) is refused with one line naming --resume, and changes nothing."""
    before = _listing(_out_of(args).parent)
    code, err = finish(_start(args), 120)
    assert code != 0, f"{where}: a plain re-run was not refused: {err}"
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("lmshard prepare:")]
    assert len(lines) == 1 and lines[0].startswith("error:") and "--resume" in lines[0], f"{where}: {err}"
    assert "Traceback" not in err, f"{where}: {err}"
    after = _listing(_out_of(args).parent)
    assert after == before, f"{where}: the refused run changed the kept work"


def _resume_and_compare(args, one_machine, where, cleanup=True):
    out = _out_of(args)
    code, err = finish(_start([*args, "--resume"]), 300)
    assert code == 0, f"{where}: --resume failed: {err}"
    got = _files(out)
    assert sorted(got) == sorted(one_machine), where
    assert [name for name in got if got[name] != one_machine[name]] == [], where
    assert not _partial(out).exists(), f"{where}: {_partial(out).name} left after success"
    if cleanup:
        assert not _work(out).exists(), f"{where}: {_work(out).name} left after success"
        assert sorted(os.listdir(out.parent)) == [out.name], f"{where}: left beside the dataset"


@pytest.mark.parametrize("stage", list(STOPS))
def test_a_kill_in_a_stage_then_resume_gives_the_one_machine_bytes(tmp_path, corpus, one_machine, shape, request,
                                                                   stage):  # fmt: skip
    out = tmp_path / "run" / "o"
    stop = f"{STOPS[stage]}={_pick(request, shape[stage])}"
    where = f"killed at LMSHARD_STOP_AT={stop} ({stage} stage; LMSHARD_KILL_SEED={SEED})"
    args = _args(corpus, out)
    held, main = _held_and_killed(args, stop, where)
    assert held != main, f"{where}: held in the main process, not a worker"
    work = _work(out)
    tokenized = len(list((work / "tokenize").glob("unit_*.done")))
    # the kill fell in the stage named: every earlier stage complete, no later one begun
    if stage == "tokenize":
        assert tokenized >= 1 and not (work / "dedup").exists(), where
    else:
        assert tokenized == shape["tokenize"], where
    if stage == "dedup":
        assert not (work / "select").exists(), where
    if stage in ("select", "write", "seal"):
        assert len(list((work / "dedup").glob("group_*.done"))) == shape["dedup"], where
    if stage == "select":
        assert not (work / "layout.json").exists() and not (work / "write").exists(), where
    if stage in ("write", "seal"):
        assert len(list((work / "select").glob("unit_*.json"))) == shape["select"], where
        assert (work / "layout.json").exists(), where
    if stage == "write":
        assert any((work / "write").glob("part_*.done")) and not any((work / "write").glob("piece_*")), where
    if stage == "seal":
        assert len(list((work / "write").glob("part_*.done"))) == shape["write"], where
        assert any((work / "write").glob("piece_*.json")), where
    assert not out.exists() and _partial(out).exists(), where
    _refused(args, where)
    _resume_and_compare(args, one_machine, where)


def test_kills_in_two_runs_then_resume_gives_the_one_machine_bytes(tmp_path, corpus, one_machine, shape, request):
    """`--num-tasks 3` (the local executor named): killed while tokenizing, its resumption
    killed while writing the shards' parts, then resumed again."""
    out = tmp_path / "run" / "o"
    rng = random.Random(f"{SEED}:{request.node.name}")
    first, second = f"unit={rng.randrange(shape['tokenize'])}", f"part={rng.randrange(shape['write'])}"
    where = f"killed at LMSHARD_STOP_AT={first}, then {second} (LMSHARD_KILL_SEED={SEED})"
    args = _args(corpus, out, "--num-tasks", "3")
    _held_and_killed(args, first, where)
    _held_and_killed([*args, "--resume"], second, where)
    _refused(args, where)
    _resume_and_compare(args, one_machine, where)


@pytest.mark.parametrize("replacing", [False, True], ids=["new", "overwrite"])
def test_a_kill_at_the_swap_then_resume_gives_the_one_machine_bytes(tmp_path, corpus, one_machine, request,
                                                                    replacing):  # fmt: skip
    """Killed by the main process during the swap (a new --out: after its rename; --overwrite of
    another dataset: after the exchange or after the old one went to the trash; swap steps 1-2
    exist with and without the atomic exchange). --resume finds the dataset complete; a plain
    re-run sees a dataset at --out."""
    out = tmp_path / "run" / "o"
    stop = f"swap:{1 + _pick(request, 2) if replacing else 1}"
    where = f"killed at LMSHARD_STOP_AT={stop} (LMSHARD_KILL_SEED={SEED})"
    extra = []
    if replacing:
        old = out.parent.parent / "old"
        jsonl(old / "x.jsonl", make_texts(300, seed=99))
        code, err = finish(_start([str(old), "--out", str(out), "--workers", "1", "--tokens-per-shard", "5000",
                                   "--tokenizer-backend", "tiktoken"]), 120)  # fmt: skip
        assert code == 0, err
        extra = ["--overwrite"]
    args = _args(corpus, out, *extra)
    held, main = _held_and_killed(args, stop, where)
    assert held == main, f"{where}: the swap is the main process's"
    # (the work folder is left by --resume here: test_resume_after_a_kill_at_the_swap_removes_the_work_folder)
    _resume_and_compare(args, one_machine, where, cleanup=False)
    assert sorted(n for n in os.listdir(out.parent) if n != _work(out).name) == [out.name], where


def test_resume_after_a_kill_at_the_swap_removes_the_work_folder(tmp_path, corpus):
    out = tmp_path / "run" / "o"
    args = _args(corpus, out)
    _held_and_killed(args, "swap:1", "killed at LMSHARD_STOP_AT=swap:1")
    code, err = finish(_start([*args, "--resume"]), 300)
    assert code == 0, err
    assert (out / "dataset_metadata.json").exists()
    assert not _work(out).exists()


@pytest.mark.parametrize("stop", ["lines", "linebucket", "unit"])
def test_a_kill_in_a_line_stage_then_resume_gives_the_one_machine_bytes(tmp_path, request, stop):
    """--dedup-lines staged (the lines and linedup stages before tokenize): kill -9 after a
    unit's lines are hashed, a group of line buckets resolved, or a unit tokenized with its
    lines removed, then --resume: one process's bytes."""
    from test_stages import _boilerplate_corpus

    src = _boilerplate_corpus(tmp_path, n=1500)
    args = [str(src), "--workers", "2", "--tokens-per-shard", "20000", "--val-fraction", "0.1", "--dedup-lines",
            "--on-error", "skip"]  # fmt: skip
    one = tmp_path / "one" / "o"
    code, err = finish(_start([*args, "--out", str(one), "--workers", "1"]), 300)
    assert code == 0, err
    out = tmp_path / "run" / "o"
    shape = {"lines": 6, "linebucket": 8, "unit": 6}  # (at least this many units and groups: the corpus is ~400 KiB)
    point = f"{stop}={_pick(request, shape[stop])}"
    where = f"killed at LMSHARD_STOP_AT={point} (LMSHARD_KILL_SEED={SEED})"
    held, main = _held_and_killed([*args, "--out", str(out)], point, where)
    assert held != main, f"{where}: held in the main process, not a worker"
    work = _work(out)
    hashed = len(list((work / "lines").glob("unit_*.bin")))
    assert hashed >= 1 and (stop == "unit") == (work / "tokenize").exists(), where  # (in the stage named)
    _resume_and_compare([*args, "--out", str(out)], _files(one), where)


def test_work_left_unsynced_before_a_restart_is_discarded_and_the_run_starts_over(tmp_path, corpus, one_machine):
    """A local run writes its work files without syncing them and records the boot it ran in
    (volatile.py). Killed in its select stage (SIGKILL: nothing made durable), then looked at as if
    the machine had restarted since (the boot recorded made another one), with a unit file cut
    short as a crash could leave it: `status` says the work cannot be trusted, `run-task` refuses
    it in one line, and `--resume` discards the work and the build, says so, never reads the cut
    file, and ends with the one-machine bytes."""
    out = tmp_path / "run" / "o"
    where = "killed at LMSHARD_STOP_AT=select=0, the boot it recorded made another"
    args = _args(corpus, out)
    _held_and_killed(args, "select=0", where)
    mark = _work(out) / "volatile.json"
    recorded = json.loads(mark.read_text())
    assert recorded["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    mark.write_text(json.dumps(recorded | {"boot_id": "an earlier boot"}))
    unit = _work(out) / "tokenize" / "unit_000000.bin"
    unit.write_bytes(unit.read_bytes()[:100])
    lmshard = [sys.executable, "-m", "lmshard"]
    shown = subprocess.run([*lmshard, "status", str(out)], text=True, capture_output=True)
    assert shown.returncode == 0 and "stale: a local run left its work unsynced before this machine restarted" in \
        shown.stdout and "run-task" not in shown.stdout, shown.stdout + shown.stderr  # fmt: skip
    task = subprocess.run([*lmshard, "run-task", "--stage", "select", "--task", "0", str(out)], text=True,
                          capture_output=True)  # fmt: skip
    assert task.returncode != 0 and "cannot be trusted" in task.stderr and "Traceback" not in task.stderr, task.stderr
    code, err = finish(_start([*args, "--resume"]), 300)
    assert code == 0, err
    assert "a local run left it unsynced before this machine restarted; it is discarded and the run starts over" in err
    got = _files(out)
    assert sorted(got) == sorted(one_machine) and [n for n in got if got[n] != one_machine[n]] == [], where
    assert not _work(out).exists() and not _partial(out).exists()


def test_a_claim_for_other_machines_makes_a_local_runs_work_durable(tmp_path, corpus, one_machine):
    """A local run killed outright leaves its work unsynced (its mark kept); resumed as a plan
    whose tasks run elsewhere (`--executor none`), the claim syncs the work and drops the mark,
    so `run-task` on any machine may go on with it, and the run ends with the one-machine bytes."""
    out = tmp_path / "run" / "o"
    args = _args(corpus, out)
    _held_and_killed(args, "select=0", "killed at LMSHARD_STOP_AT=select=0")
    mark = _work(out) / "volatile.json"
    assert mark.exists()
    n_tasks = json.loads((_work(out) / "plan.json").read_text())["n_tasks"]
    code, err = finish(_start([*args, "--num-tasks", str(n_tasks), "--executor", "none", "--resume"]), 120)
    assert code == 0, err
    assert not mark.exists() and "discarded" not in err
    lmshard = [sys.executable, "-m", "lmshard"]
    for stage in ("select", "write"):
        for task in range(n_tasks):
            done = subprocess.run([*lmshard, "run-task", "--stage", stage, "--task", str(task), str(out)], text=True,
                                  capture_output=True)  # fmt: skip
            assert done.returncode == 0, done.stderr
    done = subprocess.run([*lmshard, "run-task", "--stage", "finish", str(out)], text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
    got = _files(out)
    assert sorted(got) == sorted(one_machine) and [n for n in got if got[n] != one_machine[n]] == []
