"""The CLI: exit codes, messages, config files, and the real console script in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import read_docs, write
from typer.testing import CliRunner

from lmshard import __version__
from lmshard.cli import app

runner = CliRunner()


def test_version_and_help():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output
    result = runner.invoke(app, ["prepare", "-h"])
    assert result.exit_code == 0 and "--val-fraction" in result.output


def test_config_file_supplies_fields_and_flags_win(tmp_path):
    write(tmp_path / "a.jsonl", "".join(json.dumps({"body": f"doc {i}"}) + "\n" for i in range(30)))
    write(
        tmp_path / "prepare.yaml",
        f"inputs: [{tmp_path / 'a.jsonl'}]\ntext-field: body\nval-fraction: 0.5\nmax_docs: 10\n",
    )
    result = runner.invoke(app, ["prepare", "--config", str(tmp_path / "prepare.yaml"),
                                 "--out", str(tmp_path / "o"), "--max-docs", "12", "--workers", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "o" / "dataset_metadata.json").read_text())
    assert meta["n_docs"] == 12 and meta["config"]["val_fraction"] == 0.5
    write(tmp_path / "p.toml", 'inputs = ["x"]\nbogus = 1\n')
    result = runner.invoke(app, ["prepare", "--config", str(tmp_path / "p.toml"), "--out", "z"])
    assert result.exit_code == 1 and "unknown option(s) bogus" in result.output


def test_bad_option_value_is_one_line(tmp_path):
    write(tmp_path / "a.txt", "x")
    result = runner.invoke(
        app, ["prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "o"), "--on-error", "maybe"]
    )
    assert result.exit_code == 1 and "--on-error must be one of fail, skip" in result.output


def test_console_script_end_to_end_with_stdin(tmp_path, reference):
    """The installed `lmshard` command, run as a user would, reading JSON lines from stdin."""
    lines = "".join(json.dumps({"text": f"stdin document {i} ünïcode"}) + "\n" for i in range(50))
    exe = Path(sys.executable).with_name("lmshard")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([str(exe), "prepare", "-", "--out", str(tmp_path / "o"), "--val-fraction", "0"],
                          input=lines, capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    docs = read_docs(tmp_path / "o", "train")
    assert [d.tolist() for d in docs] == [
        reference.encode_ordinary(f"stdin document {i} ünïcode") + [50256] for i in range(50)
    ]
    again = subprocess.run([str(exe), "prepare", "-", "--out", str(tmp_path / "o")], input=lines,
                           capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert "holds a dataset; pass --overwrite" in again.stderr
