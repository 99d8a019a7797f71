"""scripts/train_tiny_gpt.py takes its data from exactly one of --input_file (one text file,
tokenized in memory, its last 10% of tokens held out for val), --dataset_dir (a prepared dataset,
also accepted as the first argument) or --mixture; and its log keeps to --log-every."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from test_prepare import make_texts
from test_train_ddp import launch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_tiny_gpt.py"
ONE_OF = "error: pass exactly one of --input_file FILE, --dataset_dir DIR, --mixture FILE or --data CONFIG"


@pytest.fixture(scope="module")
def trainer():
    spec = importlib.util.spec_from_file_location("train_tiny_gpt", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_input_file_trains_on_its_first_90_percent_evaluates_on_the_rest_and_resumes(tmp_path, reference):
    text = "\n\n".join(make_texts(300, seed=3))
    (tmp_path / "input.txt").write_text(text, encoding="utf-8")
    n = len(reference.encode_ordinary(text)) + 1  # and the EOT after the file's one document
    n_train = n - n // 10
    T = 16
    common = [sys.executable, str(SCRIPT), "--input_file", str(tmp_path / "input.txt"), "--batch-size", "2",
              "--seq-len", str(T), "--device", "cpu", "--log-every", "2", "--lr-horizon", "5"]  # fmt: skip
    first = launch([*common, "--steps", "3", "--save", str(tmp_path / "ckpt.pt")])
    assert first.returncode == 0, first.stderr[-2000:]
    assert f"tokens={n_train:,}, docs=1)" in first.stdout, first.stdout
    steps = [line for line in first.stdout.splitlines() if line.startswith("step")]
    assert [line.split()[1] for line in steps] == ["0", "2"] and all("  val " in line for line in steps), steps

    resume = ["--resume", str(tmp_path / "ckpt.pt"), "--report", str(tmp_path / "r.json")]
    again = launch([*common, "--steps", "5", *resume])  # the total: 2 more steps
    assert again.returncode == 0, again.stderr[-2000:]
    drawn = json.loads((tmp_path / "r-rank0.json").read_text())["batches"]
    assert [b["step"] for b in drawn] == [3, 4]  # the data position came back with the model
    # every row (T tokens and the label after them) lies in the training part: val is held out
    assert all(0 <= o <= n_train - T - 1 for b in drawn for o in b["offsets"]), drawn


@pytest.mark.parametrize(
    "argv, got",
    [
        ([], "got none"),
        (["--input_file", "a.txt", "--dataset_dir", "data/x"], "got --input_file and --dataset_dir"),
        (["data/x", "--mixture", "mix.toml"], "got DATASET_DIR and --mixture"),
        (["--input-file", "a.txt", "data/x"], "got --input_file and DATASET_DIR"),
        (["--data", "loader.toml", "--mixture", "mix.toml"], "got --mixture and --data"),
    ],
)
def test_exactly_one_source_of_data(trainer, capsys, argv, got):
    with pytest.raises(SystemExit) as stop:
        trainer.parse_args(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and ONE_OF in err and f"({got})" in err, err


@pytest.mark.parametrize("argv", [["data/x"], ["--dataset_dir", "data/x"], ["--dataset-dir", "data/x"]])
def test_a_dataset_directory_by_flag_or_as_the_first_argument(trainer, argv):
    args = trainer.parse_args(argv)
    assert args.dataset_dir == "data/x" and args.input_file is None and args.mixture is None


def test_the_script_answers_a_wrong_command_line_or_file_with_one_line(tmp_path):
    none = launch([sys.executable, str(SCRIPT), "--steps", "1"])
    assert none.returncode == 2 and none.stderr == f"train_tiny_gpt.py: {ONE_OF} (got none)\n", none.stderr
    missing = launch([sys.executable, str(SCRIPT), "--input_file", str(tmp_path / "nope.txt")])
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1, missing.stderr
    assert missing.stderr.startswith("train_tiny_gpt.py: error: ") and "is not a file" in missing.stderr


def logged_steps(trainer, capsys, argv: list[str], seconds_per_step: float, steps: int = 120) -> list[int]:
    """The steps that print a line in a run of `steps` steps at the given pace (a simulated clock)."""
    args = trainer.parse_args(argv)
    now = [0.0]
    log = trainer.Log(trainer.Ranks(), 0, lambda step: 512 * step, args.log_every, args.progress_every, None,
                      clock=lambda: now[0])  # fmt: skip
    for step in range(steps):
        now[0] += seconds_per_step
        log.after(step, step == steps - 1, torch.tensor(4.0), model=None, val=None)
    return [int(line.split()[1]) for line in capsys.readouterr().out.splitlines()]


def test_the_log_gives_the_time_left_from_this_runs_pace(trainer, capsys):
    """A driven clock: 2 s a step, 30 steps to go at step 9 of a run that ends at 40 (a resumed
    run's earlier steps took no time of this one's): ETA 0:01:00."""
    now = [0.0]
    log = trainer.Log(trainer.Ranks(), 0, lambda step: 512 * step, 10, 600.0, None, clock=lambda: now[0], end=40)
    for step in range(10):
        now[0] += 2.0
        log.after(step, step == 9, torch.tensor(4.0), model=None, val=None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("step     9") and lines[-1].endswith("256 tok/s  ETA 0:01:00"), lines


def test_the_log_keeps_to_log_every_at_the_pace_of_the_demo(trainer, capsys, monkeypatch):
    """The demo asks for a line every 20 steps; on a slow CPU (2 s a step) that is what it gets.
    A run too slow for that (10 s a step) still shows a short line about once a minute."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    demo = ["--dataset_dir", "data/demo", "--steps", "120", "--log-every", "20"]
    assert logged_steps(trainer, capsys, demo, 2.0) == [0, 20, 40, 60, 80, 100, 119]
    slow = logged_steps(trainer, capsys, demo, 10.0)
    gaps = [b - a for a, b in zip(slow, slow[1:], strict=False)]
    assert {0, 20, 40, 60, 80, 100, 119} < set(slow) and max(gaps) <= 6, slow
    every = logged_steps(trainer, capsys, [*demo, "--progress-every", "0"], 2.0, steps=5)
    assert every == [0, 1, 2, 3, 4]


def test_a_loader_configuration_file_sets_the_data_and_the_rows(tmp_path):
    """--data CONFIG: the file's dataset, windows of its seq_len in batches of its batch_size with
    its seed: the offsets each step drew are the stream's own (the truth: the same stream opened
    here); a packed shape is one line saying what the script trains on."""
    from lmshard import TokenDataset
    from lmshard.prepare import PrepareConfig, prepare

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in make_texts(200, seed=5)), encoding="utf-8")
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "ds"), val_fraction=0.1))
    conf = tmp_path / "loader.toml"
    conf.write_text('seed = 11\ndataset = "ds"\n[sample]\nshape = "windows"\nbatch_size = 3\nseq_len = 24\n')
    run = launch([sys.executable, str(SCRIPT), "--data", str(conf), "--steps", "3", "--device", "cpu",
                  "--report", str(tmp_path / "r.json")])  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "BatchStream(windows/24, batch_size=3, seq_len=24" in run.stdout, run.stdout
    drawn = json.loads((tmp_path / "r-rank0.json").read_text())["batches"]
    truth = TokenDataset(tmp_path / "ds").window_batches(3, 24, seed=11)
    assert [b["offsets"] for b in drawn] == [next(truth).offsets.tolist() for _ in range(3)]
    conf.write_text(conf.read_text().replace('"windows"', '"packed"'))
    packed = launch([sys.executable, str(SCRIPT), "--data", str(conf), "--steps", "1", "--device", "cpu"])
    assert packed.returncode == 1 and packed.stderr.count("\n") == 1, packed.stderr
    assert "trains on random or windows samples" in packed.stderr


def test_a_schedule_file_ramps_the_batch_and_the_rows_and_resumes_on_it(trainer, tmp_path, capsys, monkeypatch):
    """--schedule FILE: each step draws its phase's rows (the truth: the scheduled stream opened
    here), and a run saved mid-phase and resumed draws the uninterrupted run's rows."""
    from lmshard import TokenDataset
    from lmshard.errors import LmshardError
    from lmshard.prepare import PrepareConfig, prepare

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in make_texts(200, seed=5)), encoding="utf-8")
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "ds"), val_fraction=0.1, quiet=True))
    plan = [[0, 2, 16], [3, 4, 16], [5, 4, 32]]
    (tmp_path / "s.toml").write_text(f"schedule = {plan}\n")
    common = [str(tmp_path / "ds"), "--schedule", str(tmp_path / "s.toml"), "--device", "cpu", "--log-every", "2"]
    first = trainer.train(trainer.parse_args([*common, "--steps", "4", "--save", str(tmp_path / "ck.pt"),
                                              "--report", "r"]), trainer.Ranks(), torch.device("cpu"))  # fmt: skip
    again = trainer.train(trainer.parse_args([*common, "--steps", "7", "--resume", str(tmp_path / "ck.pt"),
                                              "--report", "r"]), trainer.Ranks(), torch.device("cpu"))  # fmt: skip
    drawn = [b["offsets"] for b in first["batches"] + again["batches"]]
    truth = TokenDataset(tmp_path / "ds").random_batches(schedule=plan, seed=1337)
    assert drawn == [next(truth).offsets.tolist() for _ in range(7)]
    assert [len(d) for d in drawn] == [2, 2, 2, 4, 4, 4, 4]
    assert "schedule [[0, 2, 16], [3, 4, 16], [5, 4, 32]]" in capsys.readouterr().out
    (tmp_path / "bad.toml").write_text("schedule = [[3, 2, 16]]\n")
    with pytest.raises(LmshardError, match="starts at step 3"):
        trainer.read_schedule(str(tmp_path / "bad.toml"))


def test_resident_training_draws_the_host_runs_batches(trainer, tmp_path, monkeypatch):
    """--resident on: the train split on the device (here the CPU); the run draws the rows of a
    run without it, and ends with the same weights (the same batches through the same model)."""
    from lmshard.prepare import PrepareConfig, prepare

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in make_texts(200, seed=5)), encoding="utf-8")
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "ds"), val_fraction=0.1, shard_encoding="uint16",
                          quiet=True))  # fmt: skip
    runs = {}
    for mode in ("off", "on"):
        args = trainer.parse_args([str(tmp_path / "ds"), "--steps", "3", "--device", "cpu", "--log-every", "100",
                                   "--resident", mode, "--report", "r"])  # fmt: skip
        runs[mode] = trainer.train(args, trainer.Ranks(), torch.device("cpu"))
    assert [b["offsets"] for b in runs["on"]["batches"]] == [b["offsets"] for b in runs["off"]["batches"]]
    assert runs["on"]["final_sha256"] == runs["off"]["final_sha256"]  # the same weights at the end


def test_a_dataset_without_a_val_split_is_said_not_trained_on_silently(trainer, tmp_path, capsys):
    """`--dataset_dir` of a dataset whose val split is empty (one text file read whole: one
    document, none to val) trains without a val loss and says so once, naming the fix; one with a
    val split says nothing of it."""
    from lmshard.prepare import PrepareConfig, prepare

    text = tmp_path / "input.txt"
    text.write_text("\n\n".join(f"Paragraph {i}: " + "the river runs to the sea. " * 12 for i in range(300)))
    for name, mode in (("whole", "auto"), ("paragraphs", "paragraph")):
        prepare(PrepareConfig(inputs=[str(text)], out=str(tmp_path / name), text_mode=mode, val_fraction=0.1,
                              workers=1, allow_empty=True))  # fmt: skip
        capsys.readouterr()
        args = trainer.parse_args([str(tmp_path / name), "--steps", "1", "--device", "cpu", "--seq-len", "32"])
        *_, val = trainer.open_data(args, trainer.Ranks(), torch.device("cpu"))
        out = capsys.readouterr().out
        if name == "whole":
            assert val is None and f"note: {tmp_path / name} has no val split longer than a row (0 tokens, rows of " \
                "32)" in out, out
            assert "--text-mode paragraph" in out
        else:
            assert val is not None and "note:" not in out, out
