"""Nothing lost: --resume after a kill ends byte-identical, --overwrite keeps the old dataset
whole until the new one is complete, one writer per --out, --append equals one run over both
input sets, and a run that keeps nothing fails. The independent truth is a run that was never
interrupted (compared file by file, metadata apart from its "run" record) and numpy reading the
raw shards.

The inputs here (4.4 MB) make a plan of one unit, read by this process (`item:N` stops it after
its Nth work item, `piece:N` after its Nth sealed shard or key file); kills in every stage of
larger plans are in test_stage_kills.py, test_stage_safety.py and test_local_exec.py."""

from __future__ import annotations

import filecmp
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import read_docs
from proctree import LMSHARD, finish, kill_group, signal_stopped, start_prepare, wait_gone, wait_stopped, workers_of

from lmshard.errors import ConfigError, InputError, LmshardError
from lmshard.format import METADATA_FILE, load_metadata
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.execution.taskplan import work_dir
from lmshard.prepare.output import staging as staging_mod
from lmshard.prepare.output.build import StopOnSignal, Stopped
from lmshard.prepare.output.staging import OutputPaths, read_run, recover

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
SHARD = 20_000  # tokens per shard: the corpora below make dozens of shards


def corpus(path: Path, n: int, seed: int, dupes_of: list[str] | None = None) -> list[str]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 300))) for _ in range(n)]
    texts += dupes_of or []
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return texts


def run(out: Path, inputs: list[Path], **kw) -> dict:
    kw.setdefault("workers", 1)
    kw.setdefault("tokens_per_shard", SHARD)
    return prepare(PrepareConfig(inputs=[str(p) for p in inputs], out=str(out), **kw)).to_json()


def stop_in_stages(monkeypatch, stage: str, error: BaseException, n: int = 1) -> None:
    """Make the Nth item of `stage` (tokenize, dedup, select, write, seal) raise `error` (a Ctrl-C,
    a full disk) instead of running; `monkeypatch.undo()` restores it."""
    from lmshard.prepare.execution.run import Run

    real_do, calls = Run.do, {"n": 0}

    def do(self, name, i, *a, **kw):
        if name == stage:
            calls["n"] += 1
            if calls["n"] == n:
                raise error
        return real_do(self, name, i, *a, **kw)

    monkeypatch.setattr(Run, "do", do)


def files_of(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def assert_identical(a: Path, b: Path) -> None:
    """Every file byte-equal; the metadata equal apart from its run record's timings and host."""
    assert files_of(a) == files_of(b)
    for name in files_of(a):
        if name == METADATA_FILE:
            ma, mb = (json.loads((d / name).read_text()) for d in (a, b))
            ra, rb = ma.pop("run"), mb.pop("run")
            assert ma == mb
            assert (ra["input_chars"], ra["dedup_table_bytes"]) == (rb["input_chars"], rb["dedup_table_bytes"])
        else:
            assert filecmp.cmp(a / name, b / name, shallow=False), name


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.lmshard"))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    return [root / "a.jsonl", root / "b.jsonl"], [corpus(root / "a.jsonl", 2500, 1), corpus(root / "b.jsonl", 2500, 2)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, inputs):
    """The uninterrupted run every interrupted one must equal."""
    out = tmp_path_factory.mktemp("ref") / "ds"
    run(out, inputs[0])
    assert len(list((out / "train").glob("*.bin"))) > 20
    return out


# --- resume -------------------------------------------------------------------------------------


def cli(out: Path, inputs: list[Path], *extra: str) -> list[str]:
    return [*map(str, inputs), "--out", str(out), "--tokens-per-shard", str(SHARD), "--workers", "2", *extra]


def shards_in(directory: Path) -> int:
    return len(list(directory.glob("train/shard_*.bin"))) + len(list(directory.glob("train/shard_*.tmp")))


@pytest.fixture
def process_items(monkeypatch):
    """64 KiB work items in the runs started as processes (each input is ~34 of them), so a stop
    point (LMSHARD_STOP_AT) can hold a run at any item. The output does not depend on it."""
    monkeypatch.setenv("LMSHARD_BLOCK_BYTES", str(1 << 16))


def stop_at(monkeypatch, point: str) -> None:
    monkeypatch.setenv("LMSHARD_STOP_AT", point)


def held(proc: subprocess.Popen[str]) -> None:
    """Wait until the run stopped itself at its stop point."""
    assert wait_stopped(proc) is not None, "the run ended before its stop point"


@pytest.mark.parametrize("at_item", [0, 1, 5, 20])
def test_sigkill_then_resume_is_byte_identical(tmp_path, monkeypatch, process_items, inputs, reference, at_item):
    """kill -9 of the whole process group at once (0: wherever start-up has got to), or held
    after its Nth work item; --resume finishes it byte-identical to the uninterrupted run, and
    leaves nothing beside --out."""
    out = tmp_path / "ds"
    staging = OutputPaths.of(str(out)).staging
    if at_item:
        stop_at(monkeypatch, f"item:{at_item}")
    proc = start_prepare(cli(out, inputs[0]))
    if at_item:
        held(proc)
        assert read_run(staging) is not None and not (work_dir(out) / "tokenize" / "unit_000000.done").exists()
        monkeypatch.delenv("LMSHARD_STOP_AT")
    kill_group(proc.pid)
    proc.communicate()
    assert not out.exists(), "a killed run must not leave a dataset that looks complete"
    if read_run(staging) is not None:  # (killed before the run record existed: nothing to resume)
        code, err = finish(start_prepare(cli(out, inputs[0])), 60)
        assert code == 1 and "pass --resume to continue it" in err and "Traceback" not in err
    code, err = finish(start_prepare(cli(out, inputs[0], "--resume")), 120)
    assert code == 0, err
    assert_identical(reference, out)
    assert leftovers(out) == []


def test_killed_twice_then_resumed(tmp_path, monkeypatch, process_items, inputs, reference):
    """A resumed run that is itself killed resumes again from the work it kept."""
    out = tmp_path / "ds"
    staging = OutputPaths.of(str(out)).staging
    for args, at in ((cli(out, inputs[0]), "item:4"), (cli(out, inputs[0], "--resume"), "piece:1")):
        stop_at(monkeypatch, at)
        proc = start_prepare(args)
        held(proc)
        kill_group(proc.pid)
        proc.communicate()
        assert read_run(staging) is not None
    monkeypatch.delenv("LMSHARD_STOP_AT")
    code, err = finish(start_prepare(cli(out, inputs[0], "--resume")), 120)
    assert code == 0, err
    assert_identical(reference, out)


def test_a_sums_file_cut_short_by_a_kill_is_not_left_in_the_dataset(tmp_path, monkeypatch, process_items, inputs,
                                                                    reference):  # fmt: skip
    """A kill between a shard's sums written to NAME.sums.PID.tmp and its rename leaves that file:
    the resumed run clears it, whichever shard it belongs to."""
    out = tmp_path / "ds"
    staging = OutputPaths.of(str(out)).staging
    stop_at(monkeypatch, "item:4")
    proc = start_prepare(cli(out, inputs[0]))
    held(proc)
    kill_group(proc.pid)
    proc.communicate()
    (staging / "train").mkdir(exist_ok=True)
    for n in range(6):
        (staging / "train" / f"shard_{n:06d}.sums.424242.tmp").write_bytes(b"cut short")
    monkeypatch.delenv("LMSHARD_STOP_AT")
    code, err = finish(start_prepare(cli(out, inputs[0], "--resume")), 120)
    assert code == 0, err
    assert_identical(reference, out)


def test_ctrl_c_saves_and_prints_the_resume_command(tmp_path, monkeypatch, process_items, inputs, reference):
    out = tmp_path / ("a_dataset_with_a_long_name_" * 3 + "ds")  # (its path longer than a terminal's 80 columns)
    staging = OutputPaths.of(str(out)).staging
    stop_at(monkeypatch, "item:5")
    proc = start_prepare(cli(out, inputs[0]))
    held(proc)
    monkeypatch.delenv("LMSHARD_STOP_AT")
    signal_stopped(proc.pid, signal.SIGINT)  # the terminal sends it to the whole foreground group
    code, err = finish(proc, 60)
    assert code == 130 and "Traceback" not in err, err
    said = next(line for line in err.splitlines() if line.startswith("interrupted: "))
    assert f"kept in {work_dir(out)}; continue with:" in said, err  # (one line, whatever its length: a log is copied)
    command = err.strip().splitlines()[-1]
    assert command.startswith("lmshard prepare ") and command.endswith("--resume")
    assert read_run(staging) is not None and (work_dir(out) / "plan.json").exists(), "the work done is kept"
    code, err = finish(start_prepare(command.split()[2:]), 120)
    assert code == 0, err
    assert_identical(reference, out)


def test_sigterm_to_the_whole_group_stops_as_ctrl_c_does(tmp_path, monkeypatch, process_items, inputs, reference):
    """Slurm's scancel and its time limit send SIGTERM to every process of the job: the run saves
    a checkpoint at the next work item, prints the resume command and exits 143 (128 + 15); the
    workers end quietly with it, and --resume ends byte-identical."""
    out = tmp_path / "ds"
    staging = OutputPaths.of(str(out)).staging
    stop_at(monkeypatch, "item:5")
    proc = start_prepare(cli(out, inputs[0]))
    held(proc)
    workers = workers_of(proc.pid)
    assert len(workers) == 2
    monkeypatch.delenv("LMSHARD_STOP_AT")
    signal_stopped(proc.pid, signal.SIGTERM)  # to the whole process group, workers included
    code, err = finish(proc, 60)
    assert code == 143 and "Traceback" not in err and "worker process" not in err, err
    assert "terminated (SIGTERM): the work done so far is kept in" in err, err
    command = err.strip().splitlines()[-1]
    assert command.startswith("lmshard prepare ") and command.endswith("--resume")
    assert wait_gone(workers, 30) == []
    assert read_run(staging) is not None and (work_dir(out) / "plan.json").exists(), "the work done is kept"
    code, err = finish(start_prepare(command.split()[2:]), 120)
    assert code == 0, err
    assert_identical(reference, out)


def test_ctrl_c_during_the_swap_says_the_dataset_is_complete_and_leaves_nothing(tmp_path, monkeypatch, process_items,
                                                                               inputs, reference):  # fmt: skip
    """Ctrl-C as the finished build is renamed into place (held there): the swap and the work
    folder's removal finish first, then the run stops saying the dataset is complete (not that
    its work is kept for a --resume that has nothing to do), nothing left beside it."""
    out = tmp_path / "ds"
    stop_at(monkeypatch, "swap:1")
    proc = start_prepare(cli(out, inputs[0]))
    held(proc)
    monkeypatch.delenv("LMSHARD_STOP_AT")
    signal_stopped(proc.pid, signal.SIGINT)
    code, err = finish(proc, 60)
    assert code == 130 and "Traceback" not in err and "--resume" not in err, err
    assert f"interrupted: {out} was complete already; check it with: lmshard inspect {out}" in " ".join(err.split())
    assert leftovers(out) == []
    assert_identical(reference, out)


def test_out_of_memory_in_this_process_keeps_the_work_in_one_line(tmp_path, monkeypatch, inputs, reference):
    """A MemoryError while this process tokenizes (a small run's units are its own): one line that
    says so and names --resume, the work kept; the resumed run ends with the uninterrupted bytes."""
    out = tmp_path / "ds"
    stop_in_stages(monkeypatch, "tokenize", MemoryError())
    with pytest.raises(LmshardError, match=r"^out of memory \(lower --workers, or free memory\); the work done so far "
                                           r"is kept in .*: run the same command with --resume") as e:
        run(out, inputs[0])
    assert "\n" not in str(e.value) and work_dir(out).is_dir()
    monkeypatch.undo()
    run(out, inputs[0], resume=True)
    assert_identical(reference, out)


def test_a_second_stop_signal_stops_at_once():
    """The first SIGTERM (or Ctrl-C) asks the build to stop at its next work item; a second one
    stops it where it is, saying which signal (for the exit status), as a second Ctrl-C does."""
    before = signal.getsignal(signal.SIGTERM)
    with StopOnSignal() as stop, pytest.raises(Stopped) as raised:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before os.kill returns
        assert stop.asked and stop.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGTERM)
    assert raised.value.signum == signal.SIGTERM and isinstance(raised.value, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_build_an_earlier_version_read_in_one_process_starts_over_on_resume(tmp_path, monkeypatch, inputs,
                                                                            reference):  # fmt: skip
    """A build an earlier lmshard read in one process (its run record holds a checkpoint, no plan
    beside it): `--resume` starts it over on the stages and ends with the uninterrupted bytes."""
    out = tmp_path / "ds"
    stop_in_stages(monkeypatch, "write", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        run(out, inputs[0])
    monkeypatch.undo()
    staging = OutputPaths.of(str(out)).staging
    shutil.rmtree(work_dir(out))
    record = json.loads((staging / "_PREPARE_IN_PROGRESS").read_text())
    record["checkpoint"] = {"items_done": 3, "bytes_done": 1 << 16}
    (staging / "_PREPARE_IN_PROGRESS").write_text(json.dumps(record))
    run(out, inputs[0], resume=True, workers=2)
    assert not work_dir(out).exists()
    assert_identical(reference, out)


def test_resume_with_nothing_pending_starts_and_after_the_end_does_nothing(tmp_path, inputs, reference):
    out = tmp_path / "ds"
    first = run(out, inputs[0], resume=True)
    assert_identical(reference, out)
    stamp = (out / METADATA_FILE).stat().st_mtime_ns
    again = run(out, inputs[0], resume=True)
    assert again == first and (out / METADATA_FILE).stat().st_mtime_ns == stamp


def test_an_input_error_discards_the_build(tmp_path, inputs):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken\n')
    with pytest.raises(InputError, match="bad.jsonl"):
        run(tmp_path / "ds", [*inputs[0], bad])
    assert not (tmp_path / "ds").exists() and leftovers(tmp_path / "ds") == []


# --- overwrite ----------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, bytes]:
    return {name: (root / name).read_bytes() for name in files_of(root)}


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_interrupted_overwrite_leaves_the_old_dataset_whole(tmp_path, monkeypatch, process_items, inputs, reference,
                                                             how):  # fmt: skip
    out = tmp_path / "ds"
    small = tmp_path / "small.jsonl"
    corpus(small, 300, 5)
    run(out, [small])
    before = snapshot(out)
    staging = OutputPaths.of(str(out)).staging
    stop_at(monkeypatch, "piece:2")  # (two shards or key files sealed in the build)
    proc = start_prepare(cli(out, inputs[0], "--overwrite"))
    held(proc)
    monkeypatch.delenv("LMSHARD_STOP_AT")
    assert shards_in(staging) >= 1 and snapshot(out) == before, "the old dataset changed while the new one was built"
    signal_stopped(proc.pid, getattr(signal, how))
    code, err = finish(proc, 60)
    assert code in (-9, 130) and "Traceback" not in err
    assert snapshot(out) == before
    code, err = finish(subprocess.Popen([*LMSHARD, "inspect", str(out)], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True), 60)  # fmt: skip
    assert code == 0, err
    # the next --overwrite run discards the leftovers and swaps the new dataset in
    run(out, inputs[0], overwrite=True)
    assert_identical(reference, out)
    assert leftovers(out) == []


def test_a_reader_of_the_replaced_dataset_never_reads_the_new_one_silently(tmp_path, inputs):
    """A training job that opened the old dataset before an --overwrite swap either keeps
    reading the old tokens (files it had open) or gets an error saying the dataset was replaced;
    it never reads the new dataset's tokens as if they were the old ones."""
    from lmshard import TokenDataset

    out = tmp_path / "ds"
    small = tmp_path / "small.jsonl"
    corpus(small, 300, 5)
    run(out, [small], val_fraction=0.0)
    old = np.concatenate(read_docs(out, "train"))
    reading = TokenDataset(out, split="train")
    assert np.array_equal(reading.tokens(0, 50), old[:50])  # its shard is open from here on
    opened = TokenDataset(out, split="train")  # metadata read, no shard opened yet
    run(out, inputs[0], overwrite=True)
    assert np.array_equal(reading.tokens(0, 50), old[:50])
    with pytest.raises(LmshardError, match="replaced since this dataset was opened"):
        opened.tokens(0, 50)


def test_a_swap_cut_between_its_two_renames_is_finished_by_the_next_run(tmp_path, inputs):
    """Where RENAME_EXCHANGE is unavailable the swap is two renames; a kill between them leaves
    --out missing, the old dataset retired and the new build complete: the next run finishes it."""
    out = tmp_path / "ds"
    paths = OutputPaths.of(str(out))
    run(out, inputs[0][:1])
    old = snapshot(out)
    run(out, inputs[0], overwrite=True)
    new = snapshot(out)
    # rebuild the cut state by hand: new build (with its run record) in staging, old one retired
    os.rename(out, paths.staging)
    (paths.staging / "_PREPARE_IN_PROGRESS").write_text(json.dumps({"version": 1}))
    paths.retired.mkdir()
    for name, data in old.items():
        (paths.retired / name).parent.mkdir(parents=True, exist_ok=True)
        (paths.retired / name).write_bytes(data)
    recover(paths)
    assert snapshot(out) == new and leftovers(out) == []
    # cut before the new build was complete: the old dataset comes back
    os.rename(out, paths.retired)
    paths.staging.mkdir()
    (paths.staging / "_PREPARE_IN_PROGRESS").write_text(json.dumps({"version": 1}))
    recover(paths)
    assert snapshot(out) == new and paths.staging.exists()


def test_overwrite_without_exchange_uses_two_renames(tmp_path, monkeypatch, inputs, reference):
    monkeypatch.setattr(staging_mod, "_exchange", lambda a, b: False)
    out = tmp_path / "ds"
    run(out, inputs[0][:1])
    run(out, inputs[0], overwrite=True)
    assert_identical(reference, out)
    assert leftovers(out) == []


# `lmshard prepare` with the atomic exchange unavailable (as on filesystems without renameat2):
# the swap is two renames
WITHOUT_EXCHANGE = ("import sys; import lmshard.prepare.output.staging as s; s._exchange = lambda a, b: False; "
                    "from lmshard.__main__ import main; main()")  # fmt: skip


def _start_without_exchange(args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", WITHOUT_EXCHANGE, "prepare", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)  # fmt: skip


@pytest.mark.parametrize(("exchange", "at"), [(True, 1), (True, 2), (False, 1), (False, 2), (False, 3)])
def test_kill_9_at_the_final_swap_then_the_next_run_finishes_it(tmp_path, monkeypatch, inputs, reference, exchange,
                                                                 at):  # fmt: skip
    """kill -9 of an --overwrite run at each step of its swap (stops.py: `swap`): the old dataset
    or the new one is whole at every moment, and the same command with --resume finishes the
    swap, leaving the new dataset byte-identical and nothing beside it."""
    out = tmp_path / "ds"
    paths = OutputPaths.of(str(out))
    small = tmp_path / "small.jsonl"
    corpus(small, 300, 5)
    run(out, [small])
    old = snapshot(out)
    stop_at(monkeypatch, f"swap:{at}")
    args = cli(out, inputs[0], "--overwrite")
    proc = start_prepare(args) if exchange else _start_without_exchange(args)
    held(proc)
    monkeypatch.delenv("LMSHARD_STOP_AT")
    kill_group(proc.pid)
    proc.communicate()
    if out.exists():  # the new dataset in place (its run record is left for the next run to remove)
        assert (out / METADATA_FILE).exists() and snapshot(out) != old
        old_at = paths.staging if exchange and at == 1 else paths.retired if not exchange and at == 2 else None
    else:  # cut between the two renames: the new build complete, the old dataset retired
        assert (paths.staging / METADATA_FILE).exists()
        old_at = paths.retired
    if old_at is not None:
        assert snapshot(old_at) == old, "the old dataset is whole until the new one has taken its place"
    code, err = finish(start_prepare([*args, "--resume"]), 120)
    assert code == 0 and "Traceback" not in err, err
    assert_identical(reference, out)
    assert leftovers(out) == []


def test_user_files_beside_a_dataset_survive_overwrite_and_append(tmp_path, inputs):
    out = tmp_path / "ds"
    run(out, inputs[0][:1])
    mine = {"README.md": "my card", "notes/n.txt": "mine", "train/NOTES.txt": "about train",
            "dedup/mine/x": "kept", "val/.hidden": "h"}  # fmt: skip
    for rel, text in mine.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    run(out, inputs[0], overwrite=True)
    run(out, inputs[0][1:], append=True, allow_empty=True)
    assert {rel: (out / rel).read_text() for rel in mine} == mine


def test_a_foreign_directory_is_refused_even_with_overwrite(tmp_path, inputs):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    for kw in ({}, {"overwrite": True}):
        with pytest.raises(ConfigError, match=r"not an lmshard dataset \(thesis.tex\)"):
            run(out, inputs[0], **kw)
    assert (out / "thesis.tex").read_text() == "precious"


# --- one writer ---------------------------------------------------------------------------------


def test_a_second_writer_is_refused_and_a_dead_writers_lock_is_taken_over(tmp_path, monkeypatch, process_items, inputs,
                                                                           reference):  # fmt: skip
    out = tmp_path / "ds"
    staging = OutputPaths.of(str(out)).staging
    stop_at(monkeypatch, "item:2")  # hold the first writer mid-run, however fast the machine
    first = start_prepare(cli(out, inputs[0]))
    held(first)
    monkeypatch.delenv("LMSHARD_STOP_AT")
    os.killpg(first.pid, signal.SIGSTOP)  # its workers too
    workers = workers_of(first.pid)
    for extra in ([], ["--resume"], ["--overwrite"]):
        code, err = finish(start_prepare(cli(out, inputs[0], *extra)), 60)
        assert code == 1 and "another prepare is writing it" in err and f"pid {first.pid}" in err, err
    assert first.poll() is None and staging.exists(), "the refused writers did not disturb the first"
    kill_group(first.pid)
    first.communicate()
    assert wait_gone(workers, 10) == []
    assert OutputPaths.of(str(out)).lock.exists(), "a kill -9 leaves the lock file behind"
    code, err = finish(start_prepare(cli(out, inputs[0], "--resume")), 120)
    assert code == 0, err
    assert_identical(reference, out)
    assert leftovers(out) == []


# --- append -------------------------------------------------------------------------------------


def split_stream(root: Path, split: str) -> tuple[np.ndarray, list[int]]:
    """A split's token stream and its documents' lengths, read with numpy."""
    docs = read_docs(root, split)
    return (np.concatenate(docs) if docs else np.zeros(0, np.uint32)), [len(d) for d in docs]


@pytest.mark.parametrize("dedup_lines", [False, True])
def test_append_equals_one_run_over_both(tmp_path, inputs, dedup_lines):
    a, b = inputs[0]
    extra = tmp_path / "c.jsonl"
    corpus(extra, 400, 7, dupes_of=inputs[1][0][:50])  # 50 documents the dataset already holds
    one = tmp_path / "one"
    run(one, [a, b, extra], dedup_lines=dedup_lines)
    out = tmp_path / "ds"
    run(out, [a, b], dedup_lines=dedup_lines)
    before = {name: ((out / name).read_bytes(), (out / name).stat().st_ino) for name in files_of(out)
              if name.startswith(("train/", "val/"))}  # fmt: skip
    meta = run(out, [extra], dedup_lines=dedup_lines, append=True)
    for name, (data, inode) in before.items():
        assert (out / name).read_bytes() == data and (out / name).stat().st_ino == inode, name
    for split in ("train", "val"):
        got, want = split_stream(out, split), split_stream(one, split)
        assert np.array_equal(got[0], want[0]) and got[1] == want[1], split
    whole = json.loads((one / METADATA_FILE).read_text())
    assert meta["n_docs"] == whole["n_docs"] and meta["drops"] == whole["drops"]
    if not dedup_lines:  # (with line dedup the known documents empty out first: dropped as empty)
        assert meta["drops"]["duplicate"] >= 50
    assert meta["config"]["inputs"] == [str(a), str(b), str(extra)]
    assert [s["path"] for s in meta["sources"]] == [str(a), str(b), str(extra)]
    from lmshard import verify_dataset

    assert verify_dataset(out).ok


def test_append_of_known_documents_only_adds_nothing_and_says_so(tmp_path, inputs):
    out = tmp_path / "ds"
    run(out, inputs[0])
    before = snapshot(out)
    with pytest.raises(InputError, match="no new document was appended: every record was dropped: duplicate 5,000"):
        run(out, inputs[0], append=True)
    assert snapshot(out) == before and leftovers(out) == []


@pytest.mark.parametrize(
    "option, words",
    [
        ({"normalize": "nfkc"}, "--normalize 'nfc'"),
        ({"byte_exact": True}, "prepared without --no-normalize and this run with it"),
        ({"filters": ["gopher_repetition"]}, "filtered with no --filter or --decontaminate and this run's would be "
                                             "with --filter gopher_repetition"),
        ({"seed": 7}, "--seed 1337"),
        ({"dedup": "none"}, "--dedup 'document'"),
        ({"eot_position": "before"}, "--eot-position 'after'"),
    ],
)
def test_append_refuses_different_cleaning(tmp_path, inputs, option, words):
    out = tmp_path / "ds"
    run(out, inputs[0][:1])
    before = snapshot(out)
    with pytest.raises(ConfigError, match="--append") as e:
        run(out, inputs[0][1:], append=True, **option)
    assert words in str(e.value)
    assert snapshot(out) == before


def test_append_refuses_other_filters_or_a_filters_changed_code(tmp_path, inputs):
    """The documents of a dataset and those appended to it go through the same --filter, in the
    same order, with the same plugin code: a dataset filtered is refused an --append without its
    filter or with another order, and one whose plugin file was edited since."""
    rules = tmp_path / "rules.py"
    rules.write_text("def keep(text):\n    return None\n")
    out, both = tmp_path / "ds", ["gopher_repetition", f"{rules}:keep"]
    run(out, inputs[0][:1], filters=both)
    before = snapshot(out)
    for filters, words in (([], "this run's would be with no --filter or --decontaminate"),
                           (both[::-1], f"this run's would be with --filter {rules}:keep --filter gopher_repetition")):
        with pytest.raises(ConfigError, match="--append") as e:
            run(out, inputs[0][1:], append=True, filters=filters)
        assert f"filtered with --filter gopher_repetition --filter {rules}:keep and" in str(e.value), e.value
        assert words in str(e.value), e.value
    rules.write_text("def keep(text):\n    return 'other'\n")
    with pytest.raises(ConfigError, match=f"--append: {rules} \\(--filter {rules}:keep\\) changed since"):
        run(out, inputs[0][1:], append=True, filters=both)
    assert snapshot(out) == before
    rules.write_text("def keep(text):\n    return None\n")
    run(out, inputs[0][1:], append=True, filters=both)
    assert load_metadata(out).config["filters"] == both


def test_append_refuses_other_decontamination_or_a_changed_benchmark(tmp_path, inputs):
    """--decontaminate is filtering too: an --append that removes lines where the dataset removed
    documents is refused naming the switch as it is typed, and so is one whose benchmark file
    changed since (named by its path)."""
    bench = tmp_path / "bench.txt"
    bench.write_text("one two three four five six seven eight nine ten eleven twelve thirteen fourteen\n")
    out = tmp_path / "ds"
    run(out, inputs[0][:1], decontaminate=[str(bench)])
    with pytest.raises(ConfigError, match="--append") as e:
        run(out, inputs[0][1:], append=True, decontaminate=[str(bench)], decontaminate_lines=True)
    said = str(e.value)
    assert f"--decontaminate {bench} --decontaminate-n 13 and this run's would be with --decontaminate {bench} " \
        "--decontaminate-n 13 --decontaminate-lines;" in said and "False" not in said, said
    bench.write_text("fifteen sixteen seventeen eighteen nineteen twenty twentyone twentytwo twentythree\n")
    with pytest.raises(ConfigError, match=f"--append: {bench} \\(a --decontaminate file\\) changed since"):
        run(out, inputs[0][1:], append=True, decontaminate=[str(bench)])


def test_append_takes_the_same_vocabulary_under_another_name(tmp_path, inputs):
    """The vocabulary's sha256 pins it: a copy of the GPT-2 ranks as a .tiktoken file is the
    same tokenizer as `gpt2` (a different vocabulary is refused: test_hf_prepare)."""
    from lmshard.tokenizers.vocab import VOCABULARIES, cache_file

    out = tmp_path / "ds"
    first = run(out, inputs[0][:1])
    other = tmp_path / "other.tiktoken"
    other.write_bytes(cache_file(VOCABULARIES["r50k_base"]).read_bytes())
    meta = run(out, inputs[0][1:], append=True, tokenizer=str(other))
    assert meta["n_docs"] > first["n_docs"]
    assert meta["tokenizer"]["ranks_sha256"] == first["tokenizer"]["ranks_sha256"]


def test_append_refuses_max_docs(tmp_path, inputs):
    out = tmp_path / "ds"
    run(out, inputs[0][:1], max_docs=100)
    for kw in ({}, {"max_docs": 5000}):
        with pytest.raises(ConfigError, match="--append cannot extend a run limited by --max-docs"):
            run(out, inputs[0][1:], append=True, **kw)


def test_a_pending_append_names_how_to_continue_or_discard_it(tmp_path, monkeypatch, inputs):
    out = tmp_path / "ds"
    run(out, inputs[0][:1])
    stop_in_stages(monkeypatch, "write", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        run(out, inputs[0][1:], append=True)
    monkeypatch.undo()
    for kw in ({}, {"overwrite": True}):
        with pytest.raises(ConfigError, match="pass --append --resume to continue it, or delete"):
            run(out, inputs[0][1:], **kw)
    with pytest.raises(ConfigError, match="the interrupted run was an --append; pass --append"):
        run(out, inputs[0][1:], resume=True)


def test_append_needs_a_dataset(tmp_path, inputs):
    with pytest.raises(ConfigError, match="no dataset to append to; run without --append"):
        run(tmp_path / "nothing", inputs[0], append=True)
    with pytest.raises(ConfigError, match="pass one of them"):
        run(tmp_path / "nothing", inputs[0], append=True, overwrite=True)


def test_killed_append_is_resumed(tmp_path, monkeypatch, inputs):
    a, b = inputs[0]
    one, out = tmp_path / "one", tmp_path / "ds"
    run(one, [a, b])
    run(out, [a])
    before = snapshot(out)
    stop_in_stages(monkeypatch, "seal", KeyboardInterrupt(), 2)
    with pytest.raises(KeyboardInterrupt):
        run(out, [b], append=True)
    assert snapshot(out) == before
    monkeypatch.undo()
    run(out, [b], append=True, resume=True)
    for split in ("train", "val"):
        got, want = split_stream(out, split), split_stream(one, split)
        assert np.array_equal(got[0], want[0]) and got[1] == want[1]


# --- empty results ------------------------------------------------------------------------------


def test_a_run_that_keeps_nothing_fails_unless_allowed(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(InputError, match="no document was kept: the inputs hold no records"):
        run(tmp_path / "ds", [empty])
    assert not (tmp_path / "ds").exists()
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"text": "x" * 500}) + "\n")
    with pytest.raises(InputError, match=r"too_long 1 \(--max-chars is 100; raise it"):
        run(tmp_path / "ds", [long], max_chars=100)
    meta = run(tmp_path / "ds", [empty], allow_empty=True)
    assert meta["n_docs"] == 0


def test_all_documents_in_val_is_an_error(tmp_path):
    one = tmp_path / "one.jsonl"
    corpus(one, 3, 3)
    with pytest.raises(InputError, match="went to the val split"):
        run(tmp_path / "ds", [one], val_fraction=0.999)


def test_the_current_directory_as_out_is_refused_and_an_empty_out_is_filled(tmp_path, monkeypatch, inputs, reference):
    """`cd ds && lmshard prepare ... --out .` would leave the shell in a deleted directory once
    the build is renamed into place: refused. An empty --out elsewhere is replaced by the build."""
    out = tmp_path / "ds"
    out.mkdir()
    monkeypatch.chdir(out)
    for kw in ({}, {"overwrite": True}):
        with pytest.raises(ConfigError, match="is the current directory"):
            run(Path("."), inputs[0], **kw)
    monkeypatch.chdir(tmp_path)
    run(out, inputs[0])
    assert_identical(reference, out)
    assert leftovers(out) == []


def test_a_kill_while_the_build_replaces_an_empty_out_is_resumed(tmp_path, monkeypatch, inputs, reference):
    """Killed between removing the empty --out and renaming the finished build there: --resume
    only has the rename left to do."""
    out = tmp_path / "ds"
    out.mkdir()
    real_rename = os.rename

    def rename(a, b):
        if Path(b) == out:
            raise KeyboardInterrupt
        return real_rename(a, b)

    monkeypatch.setattr(staging_mod.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        run(out, inputs[0])
    monkeypatch.setattr(staging_mod.os, "rename", real_rename)
    assert not out.exists() and leftovers(out) == [".ds.lmshard-partial", ".ds.lmshard-work"]
    with pytest.raises(ConfigError, match="pass --resume to continue it"):
        run(out, inputs[0])
    run(out, inputs[0], resume=True)
    assert_identical(reference, out)


def test_a_kill_after_user_files_were_carried_is_resumed(tmp_path, monkeypatch, inputs, reference):
    out = tmp_path / "ds"
    run(out, inputs[0][:1])
    (out / "README.md").write_text("my card")
    monkeypatch.setattr(staging_mod, "_exchange", lambda a, b: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run(out, inputs[0], overwrite=True)
    monkeypatch.undo()
    run(out, inputs[0], overwrite=True, resume=True)
    assert (out / "README.md").read_text() == "my card"
    (out / "README.md").unlink()
    assert_identical(reference, out)


def test_stray_temporary_files_of_a_cut_checkpoint_are_not_shipped(tmp_path, monkeypatch, inputs, reference):
    out = tmp_path / "ds"
    stop_in_stages(monkeypatch, "seal", KeyboardInterrupt(), 2)
    with pytest.raises(KeyboardInterrupt):
        run(out, inputs[0])
    monkeypatch.undo()
    staging = OutputPaths.of(str(out)).staging
    (staging / "._PREPARE_IN_PROGRESS.k3j2.tmp").write_text("{")  # as a kill inside atomic_write leaves
    (staging / "train" / "shard_000000.bin.4242.tmp").write_bytes(b"cut short")
    run(out, inputs[0], resume=True)
    assert_identical(reference, out)


def test_resume_refuses_a_different_work_item_plan(tmp_path, monkeypatch, inputs):
    """A unit's results are of its work items: resuming with other item sizes (another lmshard
    version) would mix two cuts of the input."""
    import lmshard.prepare.documents.sources as sources

    out = tmp_path / "ds"
    monkeypatch.setattr(sources, "BLOCK_BYTES", 1 << 12)
    stop_in_stages(monkeypatch, "write", KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        run(out, inputs[0])
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="lmshard's version or its work-item sizes changed"):
        run(out, inputs[0], resume=True)


def test_leftover_trash_and_a_retired_dataset_are_cleaned(tmp_path, inputs):
    out = tmp_path / "ds"
    run(out, inputs[0][:1])
    paths = OutputPaths.of(str(out))
    trash = out.parent / ".ds.lmshard-trash-1-2"
    (trash / "train").mkdir(parents=True)
    (trash / "train" / "shard_000000.bin").write_bytes(b"old")
    paths.retired.mkdir()
    (paths.retired / "dataset_metadata.json").write_text("{}")
    run(out, inputs[0], overwrite=True)
    assert leftovers(out) == []


def test_an_out_that_is_a_broken_symlink_is_one_line(tmp_path, inputs):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(ConfigError, match="symbolic link that leads nowhere"):
        run(loop, inputs[0])


def test_a_worker_os_error_keeps_the_build():
    from lmshard.prepare.execution.pool import _portable

    e = _portable(FileNotFoundError(2, "No such file or directory", "gone.parquet"))
    assert type(e) is FileNotFoundError and e.filename == "gone.parquet"


@pytest.mark.parametrize("tamper, words", [("truncate", "bytes, but 'n_keys'"), ("flip", "checksum")])
def test_inspect_checks_the_dedup_key_files(tmp_path, inputs, tamper, words):
    from lmshard import verify_dataset

    out = tmp_path / "ds"
    run(out, inputs[0][:1])
    assert verify_dataset(out).ok
    path = out / "dedup" / "doc_keys_000000.u64"
    data = bytearray(path.read_bytes())
    assert len(data) == 8 * 2500
    if tamper == "truncate":
        data = data[:-8]
    else:
        data[100] ^= 1
    path.write_bytes(bytes(data))
    report = verify_dataset(out)
    assert not report.ok and any(words in str(p) and "doc_keys_000000" in str(p) for p in report.problems)
    assert verify_dataset(out, quick=True).ok == (tamper == "flip")


def test_a_run_that_ignores_sigint_keeps_ignoring_it(tmp_path, monkeypatch, process_items, inputs, reference):
    """A job started in the background (SIGINT ignored, as a shell does) is not stopped by the
    terminal's Ctrl-C: prepare does not install its handler over an ignored SIGINT."""
    out = tmp_path / "ds"
    stop_at(monkeypatch, "item:3")
    proc = subprocess.Popen([*LMSHARD, "prepare", *cli(out, inputs[0])], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
    held(proc)
    signal_stopped(proc.pid, signal.SIGINT)
    code, err = finish(proc, 120)
    assert code == 0, err
    assert_identical(reference, out)


@pytest.mark.parametrize(
    "where, words",
    [
        ("file/ds", "a part of this --out path is a file, not a directory"),
        ("file/deeper/ds", "a part of this --out path is a file, not a directory"),
        ("file", "exists and is not a directory; choose another --out"),
        ("/proc/lmshard-ds", "cannot create the lock file beside --out"),
    ],
)
def test_an_unusable_out_is_one_line(tmp_path, inputs, where, words):
    (tmp_path / "file").write_text("not a directory")
    code, err = finish(start_prepare([str(inputs[0][0]), "--out", str(tmp_path / where)]), 60)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and "Traceback" not in err and len(lines) == 1 and words in lines[0], err
    assert (tmp_path / "file").read_text() == "not a directory"


def test_resume_of_a_finished_dataset_made_otherwise_names_the_difference(tmp_path, inputs):
    out = tmp_path / "ds"
    done = run(out, inputs[0], val_fraction=0.01)
    assert run(out, inputs[0], val_fraction=0.01, resume=True) == done  # the same run: complete, nothing to do
    with pytest.raises(ConfigError, match=r"cannot resume: the dataset there is built already, with --val-fraction "
                                          r"0\.01 \(this run: 0\.2\); .*--overwrite to replace it"):  # fmt: skip
        run(out, inputs[0], val_fraction=0.2, resume=True)
    with pytest.raises(ConfigError, match="cannot resume: the dataset there is built already, from other inputs"):
        run(out, inputs[0][:1], val_fraction=0.01, resume=True)
