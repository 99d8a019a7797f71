"""What a user relies on when a run is cut short, on the staged path (local_exec.py: the path
of every input of 16 MiB or more): the dataset an `--append` or an `--overwrite` would replace
stays whole while it is killed, a second writer of the same --out is refused, a read error or a
full disk in the write stage is one line that keeps the work, a --resume refuses a changed option
or input, and a kill then --resume gives the bytes of one uninterrupted process with
`--near-dedup`, a zstd encoding and per-document attributes too.

The references are written by one reading process (pipeline.py: these inputs are small), so each
comparison is across the two paths. The runs started as processes take the stages in the pool
with small units (64 KiB) whatever their size; a kill lands at a stop point (stops.py), never
where the machine's speed puts it."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from proctree import finish, group_members, start_prepare, wait_gone, wait_stopped
from test_prepare import jsonl, make_texts
from test_stages import _files

from lmshard.errors import ConfigError, LmshardError
from lmshard.prepare import PrepareConfig, prepare

STAGED = {"LMSHARD_UNIT_BYTES": str(64 << 10), "LMSHARD_POOL_BYTES": "0",
          "LMSHARD_ONE_UNIT_BYTES": "0"}  # fmt: skip
OPTS = {"workers": 2, "tokenizer_backend": "tiktoken", "tokens_per_shard": 20_000, "val_fraction": 0.05}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two inputs of ~0.6 MB (about ten units each), sharing documents."""
    src = tmp_path_factory.mktemp("safety")
    texts = make_texts(1800, seed=11)
    return jsonl(src / "a.jsonl", texts[:1000] + texts[:50]), jsonl(src / "b.jsonl", texts[950:])


def _args(inputs, out, *extra):
    return [*map(str, inputs), "--out", str(out), "--workers", "2", "--tokenizer-backend", "tiktoken",
            "--tokens-per-shard", "20000", "--val-fraction", "0.05", *extra]  # fmt: skip


def _one(inputs, out, **kw):
    """The dataset as one reading process writes it (these inputs are below the stages' size)."""
    return prepare(PrepareConfig(inputs=[str(p) for p in inputs], out=str(out), **OPTS | kw))


def _staged(args, stop=None):
    """`lmshard prepare ARGS` on the stages, in a process group of its own; `stop`: LMSHARD_STOP_AT."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in STAGED.items():
            mp.setenv(name, value)
        mp.delenv("LMSHARD_STOP_AT", raising=False)
        if stop is not None:
            mp.setenv("LMSHARD_STOP_AT", stop)
        return start_prepare(args)


def _held(args, stop):
    """A staged run stopped at `stop` (by one of its workers, or its main process)."""
    proc = _staged(args, stop)
    if wait_stopped(proc) is None:
        code, err = finish(proc, 60)
        pytest.fail(f"the run ended (exit {code}) before LMSHARD_STOP_AT={stop}: {err}")
    return proc


def _signal_group(proc, sig):
    """`sig` to every process of the run's group, which goes on from its stop point; waits for it."""
    members = group_members(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
        os.killpg(proc.pid, signal.SIGCONT)
    code, err = finish(proc, 120)
    assert wait_gone(members, timeout=60.0) == []  # (the timeout only guards a hang)
    return code, err


def _beside(out):
    return sorted(n for n in os.listdir(out.parent) if n != out.name and not n.endswith(".lmshard-lock"))


def _cli(*args):
    """`lmshard ARGS` in this process: its exit code and its output as one line."""
    from typer.testing import CliRunner

    from lmshard.cli import app

    done = CliRunner().invoke(app, [*map(str, args)])
    return done.exit_code, " ".join(done.output.split())


def _appending(tmp_path, corpus):
    """A dataset of input a at `base` and at `out` (to append b to), and `one`: b appended to it
    by one process."""
    a, b = corpus
    base, one, out = tmp_path / "base", tmp_path / "one", tmp_path / "run" / "ds"
    _one([a], base)
    shutil.copytree(base, one)
    _one([b], one, append=True)
    shutil.copytree(base, out)
    return base, one, out


def _one_line_error(err):
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("lmshard prepare:")]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("stop", ["part=2", "piece=1"], ids=["write", "seal"])
def test_a_killed_append_leaves_the_dataset_whole_and_resume_equals_one_process(tmp_path, corpus, stop):
    """kill -9 of a staged `--append` while it writes or seals the new shards: the dataset it
    extends is byte-for-byte as before, a plain `--append` again is refused with one line naming
    --resume, and `--append --resume` ends with the bytes one process's --append writes."""
    _, b = corpus
    base, one, out = _appending(tmp_path, corpus)
    args = _args([b], out, "--append")
    proc = _held(args, stop)
    code, _ = _signal_group(proc, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert _files(out) == _files(base), "the dataset an --append extends changed before the swap"
    code, err = finish(_staged(args), 120)
    assert code == 1 and "--append --resume" in _one_line_error(err), err
    assert _files(out) == _files(base)
    code, err = finish(_staged([*args, "--resume"]), 300)
    assert code == 0, err
    assert _files(out) == _files(one)
    assert _beside(out) == [], "the run's work or build was left beside the dataset"


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_an_interrupted_overwrite_leaves_the_old_dataset_whole(tmp_path, corpus, how):
    """An `--overwrite` on the stages stopped midway through writing the new shards (kill -9, or
    Ctrl-C to the group): the old dataset is untouched; the next `--overwrite` discards what the
    stopped one left and swaps in one process's bytes, leaving nothing beside."""
    a, b = corpus
    one, out = tmp_path / "one", tmp_path / "run" / "ds"
    _one([a, b], one)
    _one([b], out)
    before = _files(out)
    args = _args([a, b], out, "--overwrite")
    proc = _held(args, "part=3")
    partial = out.parent / f".{out.name}.lmshard-partial"
    assert any(partial.glob("train/shard_*")), "no new shard was being written"
    code, err = _signal_group(proc, how)
    assert code == (-signal.SIGKILL if how == signal.SIGKILL else 130), err
    assert _files(out) == before, "the old dataset changed before the swap"
    code, err = finish(_staged(args), 300)
    assert code == 0, err
    assert _files(out) == _files(one) and _beside(out) == []


def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(tmp_path, corpus):
    """While a staged run writes --out (held, with its workers), another prepare of the same --out
    (plain, --resume or --overwrite) is refused naming the writer's pid and changes nothing; once
    the writer is killed (its lock file left), --resume takes the lock over and finishes."""
    one, out = tmp_path / "one", tmp_path / "run" / "ds"
    _one(corpus, one)
    args = _args(corpus, out)
    first = _held(args, "unit=3")
    os.killpg(first.pid, signal.SIGSTOP)  # (its main process and workers: none goes on)
    work = out.parent / f".{out.name}.lmshard-work"
    seen = sorted(p.as_posix() for p in work.rglob("*"))
    for extra in ([], ["--resume"], ["--overwrite"]):
        code, err = finish(_staged([*args, *extra]), 60)
        line = _one_line_error(err)
        assert code == 1 and "another prepare is writing it" in line and f"pid {first.pid}" in line, err
    assert first.poll() is None and sorted(p.as_posix() for p in work.rglob("*")) == seen
    _signal_group(first, signal.SIGKILL)
    assert (out.parent / f".{out.name}.lmshard-lock").exists(), "a kill -9 leaves the lock file behind"
    code, err = finish(_staged([*args, "--resume"]), 300)
    assert code == 0, err
    assert _files(out) == _files(one)


@pytest.fixture
def stages_here(monkeypatch):
    """A plain prepare of these inputs on its stages, every item in this process (so a fault
    patched here reaches it); 64 KiB units."""
    from lmshard.prepare.execution import plainplan, units

    monkeypatch.setattr(units, "UNIT_BYTES", 64 << 10)
    monkeypatch.setattr(plainplan, "plain_plan", lambda config, sources: (1, 64 << 10))


def test_a_read_error_names_the_input_and_its_line_and_keeps_the_work(tmp_path, monkeypatch, corpus, stages_here):
    """A disk that fails under an input while the tokenize stage reads a unit of it: one line
    naming the input, the unit's first line (where the block that failed starts) and --resume
    (the work kept); once the disk is back, --resume ends with one process's bytes."""
    from faults import failing_reads

    from lmshard.prepare.execution.run import Run

    a, _ = corpus
    one, out = tmp_path / "one", tmp_path / "run" / "ds"
    _one([a], one)
    unit = 3 << 16  # (unit 3 starts on the first line at or after 192 KiB)
    real = Run.do
    with monkeypatch.context() as m:

        def do(r, stage, i, *x, **k):
            if stage == "tokenize" and i == 3:  # (the plan read the input whole: the disk fails from here on)
                failing_reads(m, "a.jsonl", after=unit + 20_000)
            return real(r, stage, i, *x, **k)

        m.setattr(Run, "do", do)
        with pytest.raises(LmshardError) as e:
            _one([a], out)
    message = str(e.value)
    assert "\n" not in message and "after 216,608 bytes (Input/output error)" in message, message
    assert "run the same command with --resume" in message, message
    number = int(message.split(f"{a}:")[1].split(":")[0])
    data = a.read_bytes()
    first = sum(len(line) for line in data.splitlines(keepends=True)[: number - 1])  # (where that line starts)
    assert unit <= first < unit + 4096 and data[first - 1 : first] == b"\n", (message, first)
    assert any((out.parent / f".{out.name}.lmshard-work" / "tokenize").glob("unit_*.done")), "the work was not kept"
    _one([a], out, resume=True)
    assert _files(out) == _files(one)


def test_a_full_disk_in_the_write_stage_is_one_line_and_resume_finishes(tmp_path, monkeypatch, corpus, stages_here):
    """The device fills up while the write stage copies the units' tokens into the shards: one
    line naming the fault and --resume; once space is back, --resume ends with one process's
    bytes, nothing left beside."""
    from lmshard.prepare.execution import owners

    one, out = tmp_path / "one", tmp_path / "run" / "ds"
    _one(corpus, one)
    calls = {"n": 0}
    real = owners._pwrite

    def fill(fd, data, at):
        calls["n"] += 1
        if calls["n"] > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, at)

    with monkeypatch.context() as m:
        m.setattr(owners, "_pwrite", fill)
        m.setattr(owners, "_copy", lambda src, dst, at, to, n: fill(dst, os.pread(src, n, at), to))
        with pytest.raises(LmshardError) as e:
            _one(corpus, out)
    message = str(e.value)
    assert "no space left on the device" in message and "--resume" in message and "\n" not in message, message
    assert calls["n"] > 3 and not out.exists()
    _one(corpus, out, resume=True)
    assert _files(out) == _files(one) and _beside(out) == []


def test_a_resume_refuses_a_changed_option_or_input_in_one_line(tmp_path, monkeypatch, corpus, stages_here):
    """A staged run stopped in its select stage (Ctrl-C), then --resume with another option or
    with an input changed since: refused in one line naming what changed, the work kept; the same
    command then goes on to one process's bytes."""
    from lmshard.prepare.execution.run import Run

    a, b = corpus
    one, out = tmp_path / "one", tmp_path / "run" / "ds"
    b2 = tmp_path / "in" / "b.jsonl"
    b2.parent.mkdir()
    shutil.copy(b, b2)
    _one([a, b2], one)
    real = Run.do
    with monkeypatch.context() as m:
        m.setattr(Run, "do", lambda r, stage, *x, **k: (_ for _ in ()).throw(KeyboardInterrupt()) if stage == "select"
                  else real(r, stage, *x, **k))  # fmt: skip
        with pytest.raises(KeyboardInterrupt, match="the work done so far is kept in"):
            _one([a, b2], out)
    work = out.parent / f".{out.name}.lmshard-work"
    assert (work / "done" / "dedup.json").exists()
    with pytest.raises(ConfigError, match="seed") as e:
        _one([a, b2], out, resume=True, seed=7)
    assert "\n" not in str(e.value)
    data, st = b2.read_bytes(), b2.stat()
    b2.write_bytes(data.replace(b"a", b"e", 1))
    with pytest.raises(ConfigError, match=f"input {b2} changed since the run started") as e:
        _one([a, b2], out, resume=True)
    assert "\n" not in str(e.value)
    b2.write_bytes(data)  # put back as it was, its modification time too
    os.utime(b2, ns=(st.st_atime_ns, st.st_mtime_ns))
    _one([a, b2], out, resume=True)
    assert _files(out) == _files(one)


ZSTD_ATTRIBUTES = ["--shard-encoding", "zstd", "--attribute", "length", "--attribute", "gopher_quality"]


@pytest.mark.parametrize("extra", [["--near-dedup"], ZSTD_ATTRIBUTES], ids=["near", "zstd-attributes"])
def test_a_kill_then_resume_gives_one_process_bytes_with_near_dedup_zstd_and_attributes(tmp_path, corpus, extra):
    """kill -9 while the write stage copies the new shards (near-duplicates found, zstd frames
    being encoded, attribute columns written), then --resume: one process's bytes."""
    one, out = tmp_path / "one", tmp_path / "run" / "ds"
    code, err = finish(start_prepare(_args(corpus, one, "--workers", "1", *extra)), 300)
    assert code == 0, err
    args = _args(corpus, out, *extra)
    code, _ = _signal_group(_held(args, "part=2"), signal.SIGKILL)
    assert code == -signal.SIGKILL and not out.exists()
    code, err = finish(_staged([*args, "--resume"]), 300)
    assert code == 0, err
    assert _files(out) == _files(one) and _beside(out) == []


def test_user_files_in_a_dataset_survive_an_overwrite_and_an_append_on_the_stages(tmp_path, monkeypatch, corpus,
                                                                                 stages_here):  # fmt: skip
    """Files a user put in the dataset (a card, notes, files in its split and dedup folders) are
    carried over by a staged --overwrite and a staged --append: lmshard deletes only what it wrote."""
    from lmshard.prepare.execution import local_exec

    a, b = corpus
    out = tmp_path / "ds"
    _one([a], out)
    runs, real = [], local_exec.run
    monkeypatch.setattr(local_exec, "run", lambda *x, **k: runs.append(x[0].append) or real(*x, **k))
    mine = {"README.md": "my card", "notes/n.txt": "mine", "train/NOTES.txt": "about train",
            "dedup/mine/x": "kept", "val/.hidden": "h"}  # fmt: skip
    for rel, text in mine.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    _one([a, b], out, overwrite=True)
    _one([b], out, append=True, allow_empty=True)
    assert runs == [False, True], runs  # (both on the stages)
    assert {rel: (out / rel).read_text() for rel in mine} == mine


@pytest.mark.parametrize("then", ["put back", "left out"])
def test_an_input_gone_mid_run_on_the_stages_says_how_to_go_on_either_way(tmp_path, monkeypatch, corpus, stages_here,
                                                                          then):  # fmt: skip
    """An input moved away after the plan was made, before the tokenize stage reads it: one line
    naming it and both ways on (the work kept); put back, --resume finishes; left out, --resume
    is refused naming it and --overwrite starts again. Each ends with one process's bytes."""
    from lmshard.prepare.execution.run import Run

    inputs = tmp_path / "in"
    inputs.mkdir()
    _, b = (Path(shutil.copy(p, inputs / p.name)) for p in corpus)
    moved = tmp_path / "b.moved"
    out = tmp_path / "run" / "ds"
    real = Run.do

    def do(r, stage, i, *x, **k):
        if stage == "tokenize" and b.exists():
            b.rename(moved)
        return real(r, stage, i, *x, **k)

    with monkeypatch.context() as m:
        m.setattr(Run, "do", do)
        with pytest.raises(LmshardError) as e:
            _one([inputs], out)
    message = str(e.value)
    assert message.startswith(f"{b}: this input is gone (No such file or directory)") and "\n" not in message, message
    assert "put it back and run the same command with --resume" in message and "--overwrite" in message, message
    assert "kept in" in message and _work(out).exists(), message
    if then == "put back":
        moved.rename(b)
        _one([inputs], out, resume=True)
    else:
        with pytest.raises(ConfigError, match=f"cannot resume: input {b} was read by the run and is not an input now"):
            _one([inputs], out, resume=True)
        _one([inputs], out, overwrite=True)
    _one([inputs], tmp_path / "one")  # (the inputs as they are now: b back, or left out)
    assert _files(out) == _files(tmp_path / "one") and not _work(out).exists()


def _work(out):
    return out.parent / f".{out.name}.lmshard-work"


def test_status_says_how_an_unplanned_or_local_run_goes_on(tmp_path, monkeypatch, corpus, stages_here):
    """`lmshard status` of: a directory with nothing of a run (one line, exit 1); a run's work
    folder passed for its dataset (names the dataset); a staged local run stopped midway (its
    command with --resume, then the tasks left); its build with the work folder deleted."""
    from lmshard.prepare.execution.run import Run

    def status(path):
        return _cli("status", path)

    code, said = status(tmp_path / "none")
    assert code == 1 and f"{tmp_path / 'none'}: no dataset, build or plan of a prepare run is there" in said, said
    code, said = status(corpus[0])
    assert code == 1 and f"{corpus[0]}: a file, not a dataset directory" in said, said
    staged = tmp_path / "staged"
    real = Run.do
    with monkeypatch.context() as m:
        m.setattr(Run, "do", lambda r, stage, *x, **k: (_ for _ in ()).throw(KeyboardInterrupt()) if stage == "select"
                  else real(r, stage, *x, **k))  # fmt: skip
        with pytest.raises(KeyboardInterrupt):
            _one(corpus, staged)
    code, said = status(staged)
    assert code == 0 and said.startswith(f"a local run: `lmshard prepare ... --out {staged} --resume`"), said
    assert "run: lmshard run-task --stage select" in said, said
    code, said = status(_work(staged))
    assert code == 1 and f"is a run's work folder; pass its dataset's directory: lmshard status {staged}" in said, said
    _one(corpus, tmp_path / "full")
    code, said = status(tmp_path / "full" / "train")
    assert code == 1 and f"a folder inside the dataset {tmp_path / 'full'}; pass that" in said, said
    shutil.rmtree(_work(staged))  # a planned run's work folder deleted by hand: its build is said alike
    code, said = status(staged)
    assert code == 0 and said.startswith("interrupted: a prepare run left its build in") and \
        "with no plan beside it (its work folder deleted, or left by an earlier lmshard)" in said, said  # fmt: skip


def test_a_task_of_a_complete_run_has_nothing_to_do_and_a_finish_removes_leftovers(tmp_path, corpus):
    """A job run again once the dataset is complete (a retried array task, a finish a scheduler
    restarts) exits 0 saying there is nothing to do; a finish also removes what a finish stopped
    midway left of the work folder. `--task` with the finish stage, which runs once, is refused;
    so is `--executor` without `--num-tasks`, which would have run the whole prepare here."""
    out = tmp_path / "run" / "ds"
    code, said = _cli("prepare", *corpus, "--out", out, "--num-tasks", "2", "--tokenizer-backend", "tiktoken", "-q")
    assert code == 0 and (out / "dataset_metadata.json").exists(), said
    before = _files(out)
    assert _cli("run-task", "--stage", "tokenize", "--task", "1", out) == (
        0, "tokenize task 1: the dataset is complete; nothing to do")
    _work(out).mkdir()
    (_work(out) / "layout.json").write_text("{}")  # (a finish killed while removing the work folder)
    assert _cli("run-task", "--stage", "finish", out) == (
        0, "finish: the dataset is complete; nothing to do; what was left of its work folder is removed")
    assert not _work(out).exists() and _files(out) == before
    code, said = _cli("run-task", "--stage", "finish", "--task", "1", out)
    assert code == 1 and said == "error: --stage finish runs once, for the whole run: leave --task out", said
    code, said = _cli("prepare", *corpus, "--out", tmp_path / "elsewhere", "--executor", "none")
    assert code == 1 and "--executor none runs a plan of tasks: pass --num-tasks N" in said, said
    assert not (tmp_path / "elsewhere").exists()


def test_a_planned_stdin_run_killed_while_saving_its_copy_says_to_start_again(tmp_path, corpus):
    """kill -9 of a planned run while it saves stdin (held open here, so it is mid-copy): nothing
    can be resumed (stdin cannot be read again), so `status` and a run into the same --out say to
    run again with --overwrite (not --resume, which cannot re-read stdin), and that works."""
    import subprocess
    import sys

    from proctree import LMSHARD

    a, _ = corpus
    out = tmp_path / "run" / "ds"
    args = ["-", "--out", str(out), "--num-tasks", "2", "--executor", "none", "--tokenizer-backend", "tiktoken"]
    proc = subprocess.Popen([*LMSHARD, "prepare", *args], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(a.read_bytes()[:100_000])
    proc.stdin.flush()
    spool = _work(out) / "spool"
    while not (spool.is_dir() and list(spool.glob(".input_000000.*.tmp"))) and proc.poll() is None:
        time.sleep(0.01)  # (until the copy has begun: stdin stays open, so it waits)
    _signal_group(proc, signal.SIGKILL)
    lmshard = [sys.executable, "-m", "lmshard"]
    said = subprocess.run([*lmshard, "status", str(out)], text=True, capture_output=True)
    assert said.returncode == 0 and "a run that read stdin or a pipe left nothing to go on from" in said.stdout and \
        "again with --overwrite" in said.stdout, said.stdout + said.stderr  # fmt: skip
    again = subprocess.run([*lmshard, "prepare", *args], input=a.read_bytes(), capture_output=True)
    assert again.returncode == 1 and b"read stdin or a pipe, which cannot be read again" in again.stderr and \
        b"pass --overwrite to discard it and run again" in again.stderr, again.stderr  # fmt: skip
    done = subprocess.run([*lmshard, "prepare", *args, "--overwrite"], input=a.read_bytes(), capture_output=True)
    assert done.returncode == 0 and (_work(out) / "plan.json").exists(), done.stderr


@pytest.mark.parametrize("killed", [False, True], ids=["at-once", "killed"])
def test_two_copies_of_one_task_both_succeed_and_leave_no_temporary_file(tmp_path, corpus, killed):
    """A task run twice at once (a requeued array job while the first still runs, a user's
    second `run-task`): the first copy held midway through its unit's file while the second
    writes the whole unit, then let go on. The second writes a file of its own (the first holds
    this host's name for it) and both rename theirs into place: one name shared had the second
    truncate the file the first was writing, and the first's rename failed. Or the first killed
    there (kill -9: a node lost, the out-of-memory killer): the task run again writes over what it
    left (a name of each writer's own would have left it beside until the finish, a unit's size
    per kill). Either way no temporary file is left and the run ends with one process's bytes."""
    import subprocess
    import sys

    a, _ = corpus
    out, one = tmp_path / "run" / "ds", tmp_path / "one"
    _one([a], one, workers=1)
    lmshard = [sys.executable, "-m", "lmshard"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LMSHARD_BLOCK_BYTES": str(64 << 10)}  # (items of 64 KiB)
    opts = ["--tokenizer-backend", "tiktoken", "--tokens-per-shard", "20000", "--val-fraction", "0.05"]
    plan = subprocess.run([*lmshard, "prepare", str(a), "--out", str(out), "--num-tasks", "1", "--unit-size", "4M",
                           "--executor", "none", *opts], env=env, capture_output=True, text=True)  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    task = [*lmshard, "run-task", "--stage", "tokenize", "--task", "0", str(out)]
    held = {**env, "LMSHARD_STOP_AT": "worker-item=3"}
    first = subprocess.Popen([*task, "--workers", "2"], env=held, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)  # fmt: skip
    assert wait_stopped(first) is not None, finish(first, 60)
    tokenized = _work(out) / "tokenize"
    assert list(tokenized.glob(".unit_000000.*.tmp")), "the first copy is not midway through its unit"
    if killed:
        code, _ = _signal_group(first, signal.SIGKILL)
        assert code == -signal.SIGKILL
    second = subprocess.run([*task, "--workers", "1"], env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    if not killed:
        os.killpg(first.pid, signal.SIGCONT)
        code, err = finish(first, 120)
        assert code == 0, err
    assert sorted(p.name for p in tokenized.iterdir()) == ["unit_000000.bin", "unit_000000.done"]
    for stage in ("dedup", "select", "write", "finish"):
        which = ["--task", "0"] if stage != "finish" else []
        done = subprocess.run([*lmshard, "run-task", "--stage", stage, *which, str(out)], env=env, capture_output=True,
                              text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert _files(out) == _files(one)


def test_a_planned_append_whose_build_was_deleted_refuses_its_tasks_and_starts_over(tmp_path, corpus):
    """An interrupted planned --append is refused with the advice to delete its build and its work
    folder to discard it. A user who deletes the build only (the advice before named it alone) is
    told by `status` and by any `run-task` (not just the write stage's, after every stage before
    it ran for nothing) that no build is claimed; the same prepare command then starts over and
    ends with one process's --append, its finish saying what it added (and no tokens/s: the time
    from its claim held the gaps between the tasks run by hand)."""
    from lmshard.format import load_metadata

    _, b = corpus
    base, one, out = _appending(tmp_path, corpus)
    plan = ["prepare", *_args([b], out, "--append", "--num-tasks", "2", "--executor", "none"), "-q"]
    assert _cli(*plan)[0] == 0
    code, said = _cli(*plan)
    partial = out.parent / ".ds.lmshard-partial"
    assert code == 1 and f"delete {partial} and {_work(out)} to discard it" in said, said
    shutil.rmtree(partial)
    missing = f"no build is claimed for this plan ({partial} is missing)"
    code, said = _cli("status", out)
    assert code == 0 and said.startswith("unclaimed:") and missing in said and "run-task" not in said, said
    code, said = _cli("run-task", "--stage", "tokenize", "--task", "0", out)
    assert code == 1 and missing in said and "run the same `lmshard prepare` command again to start over" in said
    assert not (_work(out) / "tokenize").exists(), "a task ran on a plan with no build"
    assert _cli(*plan)[0] == 0
    for stage in ("tokenize", "dedup", "select", "write"):
        for task in (0, 1):
            assert _cli("run-task", "--stage", stage, "--task", task, out)[0] == 0
    code, said = _cli("run-task", "--stage", "finish", out)
    added = load_metadata(one).total_docs - load_metadata(base).total_docs  # (what one process's --append added)
    assert code == 0 and f"appended: this run added {added:,} docs" in said, said  # (as that --append says)
    assert "no rate: its tasks ran apart" in said and load_metadata(out).run.tokens_per_s is None  # (idle gaps)
    assert _files(out) == _files(one) and _beside(out) == []


@pytest.mark.parametrize("linked", [False, True], ids=["dir", "symlink"])
def test_a_run_planned_for_other_machines_is_waiting_not_interrupted(tmp_path, corpus, linked):
    """A second prepare into the --out of a run planned with `--executor none` (its tasks not run
    yet) is refused saying the plan waits for its tasks (not that a run was interrupted), naming
    `status`, --resume and --overwrite; --resume then runs its tasks here, with one process's bytes.
    Through a symbolic link as --out too (the build is beside its target, the work folder beside it)."""
    one, out = tmp_path / "one", tmp_path / "run" / "ds"
    _one(corpus, one)
    if linked:
        (tmp_path / "real").mkdir()
        out.parent.mkdir()
        out.symlink_to(tmp_path / "real")
    assert _cli("prepare", *_args(corpus, out, "--num-tasks", "2", "--executor", "none"), "-q")[0] == 0
    code, said = _cli("prepare", *_args(corpus, out), "-q")
    assert code == 1 and "a run planned for --executor none" in said and "is waiting for its tasks" in said, said
    assert f"`lmshard status {out}` lists those left; pass --resume to go on with it" in said, said
    assert "or pass --overwrite to discard it" in said and "interrupted" not in said, said
    code, said = _cli("prepare", *_args(corpus, out, "--resume"), "-q")
    assert code == 0, said
    assert _files(out) == _files(one) and _beside(out) == []


def test_a_planned_append_whose_build_was_deleted_after_its_write_is_not_taken_for_done(tmp_path, corpus):
    """The build of a planned --append deleted once its write stage is done: the dataset at --out
    (there from the start) does not make the finish take the run for one stopped after its swap.
    `status` and the finish say no build is claimed; the dataset is left as it was, and the work
    too. A finish stopped after a real swap (killed there) is still finished by the next one."""
    _, b = corpus
    base, _, out = _appending(tmp_path, corpus)
    plan = ["prepare", *_args([b], out, "--append", "--num-tasks", "1", "--executor", "none"), "-q"]
    assert _cli(*plan)[0] == 0
    for stage in ("tokenize", "dedup", "select", "write"):
        assert _cli("run-task", "--stage", stage, "--task", 0, out)[0] == 0
    shutil.rmtree(out.parent / ".ds.lmshard-partial")
    code, said = _cli("status", out)
    assert code == 0 and said.startswith("unclaimed:"), said
    code, said = _cli("run-task", "--stage", "finish", out)
    assert code == 1 and "no build is claimed for this plan" in said, said
    assert _files(out) == _files(base) and (_work(out) / "plan.json").exists()


def test_ctrl_c_while_a_finished_run_removes_its_work_folder_loses_nothing(tmp_path, monkeypatch, corpus,
                                                                           stages_here):  # fmt: skip
    """Ctrl-C (KeyboardInterrupt, as Python's handler raises it) while the finish removes the work
    folder, the dataset already swapped in: the run returns its dataset (not "interrupted: work
    kept"), `status` says it is complete, and the same prepare with --resume removes what is left."""
    from lmshard.format import load_metadata
    from lmshard.prepare.execution import finish as finish_module

    one, out = tmp_path / "one", tmp_path / "run" / "ds"
    _one(corpus, one)

    def ctrl_c(work, last=()):
        if (work / "done").is_dir():
            shutil.rmtree(work / "done")  # (part of it removed, then the interrupt)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(finish_module, "remove_work", ctrl_c)
        meta = _one(corpus, out)
    assert meta.total_tokens == load_metadata(one).total_tokens and _files(out) == _files(one)
    assert _work(out).is_dir() and (_work(out) / "plan.json").exists()  # (left: the interrupt came first)
    code, said = _cli("status", out)
    assert code == 0 and said.startswith("done: the dataset is complete"), said
    _one(corpus, out, resume=True)
    assert not _work(out).exists() and _files(out) == _files(one)


def test_a_task_run_by_hand_elsewhere_reads_and_writes_where_the_run_was_planned(tmp_path, corpus, monkeypatch):
    """A plan made with a relative --out and input: `run-task` from another directory, given the
    output's path from there, works where the planner meant (as a Slurm array's --chdir does),
    leaves nothing where it was started, and the dataset is the plain run's; once the planning
    directory is gone (moved), a task is refused in one line naming it."""
    where, elsewhere = tmp_path / "planned", tmp_path / "elsewhere"
    where.mkdir()
    elsewhere.mkdir()
    shutil.copy(corpus[0], where / "a.jsonl")
    monkeypatch.chdir(where)
    assert _cli("prepare", *_args(["a.jsonl"], "rp", "--num-tasks", "2", "--executor", "none"), "-q")[0] == 0
    _one(["a.jsonl"], where / "one")
    for stage in ("tokenize", "dedup", "select", "write", "finish"):
        for task in (0, 1) if stage != "finish" else (None,):
            monkeypatch.chdir(elsewhere)  # (a task moves this process to the planning directory)
            code, said = _cli("run-task", "--stage", stage, *(("--task", task) if task is not None else ()),
                              "../planned/rp")  # fmt: skip
            assert code == 0 and "error" not in said, said
    assert not list(elsewhere.iterdir())
    assert _files(where / "rp") == _files(where / "one")
    monkeypatch.chdir(where)
    assert _cli("prepare", *_args(["a.jsonl"], "again", "--num-tasks", "2", "--executor", "none"), "-q")[0] == 0
    where.rename(tmp_path / "moved")
    monkeypatch.chdir(elsewhere)
    code, said = _cli("run-task", "--stage", "tokenize", "--task", 0, "../moved/again")
    assert code == 1 and f"the run was planned in {where}, which this machine does not have, and its --out again " \
        "is relative to it" in said, said  # fmt: skip
    assert not list(elsewhere.iterdir())


def test_an_input_changed_after_the_plan_names_the_way_to_plan_again_and_it_works(tmp_path, corpus):
    """A task finds its input changed since the plan: the refusal says to restore it or to run the
    same prepare with --overwrite, which discards the plan and its build and plans again (deleting
    the work folder alone would leave the build, and the next prepare would ask for --resume); an
    --append's names the two folders to delete, as --overwrite would replace the dataset."""
    src = tmp_path / "a.jsonl"
    shutil.copy(corpus[0], src)
    out = tmp_path / "o"
    plan = ["prepare", *_args([src], out, "--num-tasks", "2", "--executor", "none"), "-q"]
    assert _cli(*plan)[0] == 0
    with open(src, "a") as f:
        f.write('{"text": "one more document"}\n')
    code, said = _cli("run-task", "--stage", "tokenize", "--task", 0, out)
    assert code == 1 and "changed after the run was planned" in said, said
    assert said.endswith("or run the same prepare with --overwrite to discard this run and plan again"), said
    assert _cli(*plan, "--overwrite")[0] == 0
    for stage in ("tokenize", "dedup", "select", "write", "finish"):
        for task in (0, 1) if stage != "finish" else (None,):
            assert _cli("run-task", "--stage", stage, *(("--task", task) if task is not None else ()), out)[0] == 0
    _one([src], tmp_path / "one")
    assert _files(out) == _files(tmp_path / "one")
    base, b = tmp_path / "base", tmp_path / "b.jsonl"
    shutil.copy(corpus[1], b)
    _one([corpus[0]], base)
    assert _cli("prepare", *_args([b], base, "--append", "--num-tasks", "2", "--executor", "none"), "-q")[0] == 0
    with open(b, "a") as f:
        f.write('{"text": "one more document"}\n')
    code, said = _cli("run-task", "--stage", "tokenize", "--task", 0, base)
    assert code == 1 and said.endswith(f"or delete {tmp_path / '.base.lmshard-partial'} and "
                                       f"{tmp_path / '.base.lmshard-work'} to discard this --append run and plan "
                                       "again"), said  # fmt: skip
