"""`lmshard retokenize|score --num-tasks N` on real engines started here (tests/engines.py): Slurm
job arrays on a cluster that holds fewer jobs than the run has tasks, and a local Ray cluster
joined by address, each writing the bytes of a one-process run. Run by `make test-engines`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from engines import slurm_available, slurm_cluster
from test_hf_tokenizer import big  # noqa: F401  (module fixture: the big vocabulary)
from test_retokenize_tasks import _files, source  # noqa: F401  (module fixture: a GPT-2 dataset of many shards)

from lmshard.interop.retokenize import retokenize_dataset
from lmshard.interop.score import score_dataset

pytestmark = [pytest.mark.engines]
LMSHARD = [sys.executable, "-m", "lmshard"]


def _args(source, big, out):  # noqa: F811
    return ["retokenize", str(source), "--tokenizer", str(big["file"]), "--out", out, "--tokens-per-shard", "5000",
            "--num-tasks", "5", "--workers", "1"]  # fmt: skip


SLURM = pytest.mark.skipif(not slurm_available() and not os.environ.get("LMSHARD_REQUIRE_ENGINES"),
                           reason="Slurm is not installed: run `make test-engines`")  # fmt: skip


def _finished(env, tmp_path, out, complete=True):
    """Wait (up to 240 s) for the cluster's queue to empty; the run's Slurm logs, joined; whether
    the dataset is there is `complete`."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and subprocess.run(["squeue", "-h"], capture_output=True, text=True,
                                                          env=env).stdout.strip():  # fmt: skip
        time.sleep(0.5)
    logs = "".join(p.read_text() for p in (tmp_path / f".{out}.lmshard-work" / "slurm").glob("*.log"))
    assert (tmp_path / out / "dataset_metadata.json").exists() == complete, logs[-3000:]
    return logs


@SLURM
def test_slurm_arrays_within_the_cluster_s_job_limit_give_the_one_process_bytes(tmp_path, source, big):  # noqa: F811
    """5 tasks on a cluster of MaxJobCount=8: one array task per stage runs all five in turn
    (3 jobs: the two arrays and the finish)."""
    retokenize_dataset(source, str(big["file"]), tmp_path / "one", tokens_per_shard=5_000, workers=1)
    with slurm_cluster(MaxJobCount=8) as env:
        done = subprocess.run([*LMSHARD, *_args(source, big, "dist"), "--executor", "slurm"], capture_output=True,
                              text=True, timeout=300, cwd=tmp_path, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "submitted 5 tasks of each stage: encode (job" in done.stdout, done.stdout
        logs = _finished(env, tmp_path, "dist")
        known = subprocess.run(["scontrol", "-o", "show", "job"], capture_output=True, text=True, env=env).stdout
        assert len(known.splitlines()) == 3, known  # the two arrays of one array task each, and the finish
        assert all(f"{stage} task {t}: " in logs for stage in ("encode", "write") for t in range(5)), logs
        assert sorted(p.name for p in (tmp_path / ".dist.lmshard-work").iterdir()) == ["slurm"]  # (its logs only)
        shown = subprocess.run([*LMSHARD, "status", "dist"], capture_output=True, text=True, cwd=tmp_path, env=env)
        assert "done: the dataset is complete" in shown.stdout, shown.stdout + shown.stderr
    assert _files(tmp_path / "dist") == _files(tmp_path / "one")


@SLURM
def test_slurm_score_gives_the_one_process_bytes(tmp_path, source):  # noqa: F811
    score_dataset(source, ["fineweb_quality"], tmp_path / "one", workers=1)
    with slurm_cluster() as env:
        done = subprocess.run([*LMSHARD, "score", str(source), "--attribute", "fineweb_quality", "--out", "dist",
                               "--num-tasks", "3", "--workers", "1", "--executor", "slurm"], capture_output=True,
                              text=True, timeout=300, cwd=tmp_path, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "submitted 3 tasks of each stage: score (job" in done.stdout, done.stdout
        logs = _finished(env, tmp_path, "dist")
        assert all(f"score task {t}: " in logs for t in range(3)), logs
    assert _files(tmp_path / "dist") == _files(tmp_path / "one")


def test_ray_tasks_give_the_one_process_bytes(tmp_path, source, big):  # noqa: F811
    ray = pytest.importorskip("ray") if not os.environ.get("LMSHARD_REQUIRE_ENGINES") else __import__("ray")
    retokenize_dataset(source, str(big["file"]), tmp_path / "one", tokens_per_shard=5_000, workers=1)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp = tempfile.mkdtemp(prefix="lmray-")  # Ray's socket paths must stay under 108 bytes
    info = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
    try:
        done = subprocess.run([*LMSHARD, *_args(source, big, "dist"), "--executor", "ray", "--ray-address",
                               info.address_info["gcs_address"]], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert "in 5 tasks" in done.stdout, done.stdout
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    assert _files(tmp_path / "dist") == _files(tmp_path / "one")


@SLURM
def test_a_failed_slurm_score_task_is_shown_and_rerun_alone_by_the_status_lines(tmp_path, source):  # noqa: F811
    """A plugin scorer that fails on one document while FAIL_SCORE is set (sbatch exports it): that
    task fails and Slurm cancels the finish; `status` names the task, its host, pid and error, and
    prints the sbatch lines that re-run it and the finish, which (without FAIL_SCORE) give the
    one-process bytes. The plugin's code is the same both times, as the plan requires."""
    from test_prepare import make_texts

    marker = " ".join(make_texts(900, seed=43)[0].split()[2:8])  # (words of the source's first document)
    plugin = tmp_path / "flaky.py"
    plugin.write_text(f"import os\n\ndef f(text):\n    if os.environ.get('FAIL_SCORE') and {marker!r} in text:\n"
                      "        raise ValueError('planted failure')\n    return len(text)\n")  # fmt: skip
    score_dataset(source, [f"{plugin}:f"], tmp_path / "one", workers=1)
    with slurm_cluster() as env:
        done = subprocess.run([*LMSHARD, "score", str(source), "--attribute", f"{plugin}:f", "--out", "dist",
                               "--num-tasks", "3", "--workers", "1", "--executor", "slurm"], capture_output=True,
                              text=True, timeout=300, cwd=tmp_path, env=env | {"FAIL_SCORE": "1"})  # fmt: skip
        assert done.returncode == 0, done.stderr
        _finished(env, tmp_path, "dist", complete=False)
        shown = subprocess.run([*LMSHARD, "status", "dist"], capture_output=True, text=True, cwd=tmp_path, env=env)
        text = " ".join(shown.stdout.split())
        assert "score: 2 of 3 tasks complete" in text, text
        assert re.search(r"task \d: \d+ of \d+ \(failed on \S+ \(pid \d+\): ConfigError: (train|val) document \d+: "
                         r"[^;]*planted failure", text), text
        lines = [line.strip() for line in shown.stdout.splitlines() if line.strip().startswith(("j1=", "sbatch "))]
        assert len(lines) == 2 and "--array=" in lines[0] and "finish.sbatch" in lines[1], shown.stdout
        rerun = subprocess.run(["bash", "-euc", "\n".join(lines)], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=120)  # fmt: skip
        assert rerun.returncode == 0, rerun.stderr
        _finished(env, tmp_path, "dist")
    assert _files(tmp_path / "dist") == _files(tmp_path / "one")
