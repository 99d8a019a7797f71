"""Scale-out on a real Slurm cluster started here (tests/engines.py): `prepare --executor
slurm` submits job arrays whose output is byte-identical to a one-machine prepare, exact and
near-duplicates (`--near-dedup`, planted near-copies across files) removed alike, also on a
cluster that holds fewer jobs than the run has tasks (MaxJobCount). Run by
`make test-engines` (which installs Slurm's Debian packages when it can); skipped where Slurm's
binaries are missing."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
from engines import slurm_available, slurm_cluster
from test_near import _clustered
from test_prepare import jsonl
from test_stages import _corpus, _files

pytestmark = [
    pytest.mark.engines,
    pytest.mark.skipif(
        not slurm_available() and not os.environ.get("LMSHARD_REQUIRE_ENGINES"),
        reason="Slurm is not installed: run `make test-engines`",
    ),  # fmt: skip
]


def _near_corpus(tmp_path):
    """The stages' corpus, and clusters of near-copies spread over two more files."""
    src = _corpus(tmp_path)
    docs = _clustered(17, n=150)
    jsonl(src / "e.jsonl", docs[::2])
    jsonl(src / "f.jsonl", docs[1::2])
    return src


def _near_removed(root):
    return json.loads((root / "dataset_metadata.json").read_text())["drops"].get("near_duplicate", 0)


def _drained(env, work):
    """Wait (up to 240 s) until the cluster's queue is empty; the run's Slurm logs, joined."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and subprocess.run(["squeue", "-h"], capture_output=True, text=True,
                                                          env=env).stdout.strip():  # fmt: skip
        time.sleep(0.5)
    return "".join(p.read_text() for p in (work / "slurm").glob("*.log"))


def test_slurm_arrays_give_the_one_machine_bytes(tmp_path):
    """(zstd: the login node trains the dictionary, every write task on the cluster compresses with it)"""
    src = _near_corpus(tmp_path)
    common = [str(src), "--workers", "1", "--on-error", "skip", "--near-dedup", "--shard-encoding", "zstd"]
    lmshard = [sys.executable, "-m", "lmshard"]
    with slurm_cluster() as env:

        def run(*args):
            return subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)

        assert run("prepare", *common, "--out", "local").returncode == 0
        submitted = run("prepare", *common, "--out", "dist", "--num-tasks", "5", "--executor", "slurm",
                        "--sbatch-args", "--time=10")  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        assert "submitted 5 tasks of each stage: tokenize (job" in submitted.stdout, submitted.stdout
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (tmp_path / "dist" / "dataset_metadata.json").exists():
            time.sleep(0.5)
        logs = "".join(p.read_text() for p in (tmp_path / ".dist.lmshard-work" / "slurm").glob("*.log"))
        assert (tmp_path / "dist" / "dataset_metadata.json").exists(), logs[-3000:]
        deadline = time.monotonic() + 60  # the finish job writes its summary after the swap
        while time.monotonic() < deadline and subprocess.run(["squeue", "-h"], capture_output=True, text=True,
                                                              env=env).stdout.strip():  # fmt: skip
            time.sleep(0.2)
        slurm = tmp_path / ".dist.lmshard-work" / "slurm"  # all that is left of the work folder: the jobs' logs
        assert sorted(p.name for p in (tmp_path / ".dist.lmshard-work").iterdir()) == ["slurm"]
        for stage in ("tokenize", "dedup", "select", "write"):
            assert len(list(slurm.glob(f"{stage}_*.log"))) == 5, stage
        assert len(list(slurm.glob("finish_*.log"))) == 1
        assert "done: the dataset is complete" in run("status", "dist").stdout
        finished = " ".join(next(slurm.glob("finish_*.log")).read_text().split())
        assert "no rate: its tasks ran apart" in finished, finished  # (its time from the claim held the queue)
    assert json.loads((tmp_path / "dist" / "dataset_metadata.json").read_text())["run"]["tokens_per_s"] is None
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")
    assert _near_removed(tmp_path / "dist") > 20
    assert json.loads((tmp_path / "dist" / "dataset_metadata.json").read_text())["encoding"]["dictionary"]["bytes"]


def test_slurm_near_duplicate_clusters_over_parts_give_the_one_machine_bytes(tmp_path):
    """--near-dedup whose edges exceed what one task clusters (a part of one edge here, so 7
    parts for the 7 tasks): the select array's 7 tasks find the clusters together on the cluster."""
    src = _near_corpus(tmp_path)
    common = [str(src), "--workers", "1", "--on-error", "skip", "--near-dedup"]
    lmshard = [sys.executable, "-m", "lmshard"]
    with slurm_cluster() as env:
        env = env | {"LMSHARD_NEAR_EDGES_PER_PART": "1"}  # (sbatch passes the environment on to the jobs)

        def run(*args):
            return subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)

        assert run("prepare", *common, "--out", "local").returncode == 0
        submitted = run("prepare", *common, "--out", "dist", "--num-tasks", "7", "--executor", "slurm")
        assert submitted.returncode == 0, submitted.stderr
        logs = _drained(env, tmp_path / ".dist.lmshard-work")
        assert "done: the dataset is complete" in run("status", "dist").stdout, logs[-3000:]
    said = "the near-duplicate clusters found over 7 parts with the other select tasks"
    assert " ".join(logs.split()).count(said) == 7, logs[-3000:]  # (every select task's last line)
    assert _near_removed(tmp_path / "dist") > 20
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")


@pytest.mark.parametrize(("job_count", "max_jobs", "k"), [(8, [], 1), (10, ["--max-jobs", "9"], 2)])
def test_slurm_run_of_more_tasks_than_the_cluster_holds_jobs_gives_the_one_machine_bytes(tmp_path, job_count,
                                                                                         max_jobs, k):  # fmt: skip
    """12 tasks, which as one array task each would be 49 jobs, on a cluster of MaxJobCount=8
    (slurmctld then holds 7 jobs: K = 1, read from `scontrol show config`, 5 jobs) or of 10 with
    --max-jobs 9 (K = 2, 9 jobs): each stage is one array of K array tasks, array task i running
    plan tasks i, i + K, ... in turn, and the dataset is the one-machine bytes."""
    src = _corpus(tmp_path)
    common = [str(src), "--workers", "1", "--on-error", "skip", "--tokens-per-shard", "20000"]
    lmshard = [sys.executable, "-m", "lmshard"]
    with slurm_cluster(MaxJobCount=job_count) as env:

        def run(*args):
            return subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)

        assert run("prepare", *common, "--out", "local").returncode == 0
        submitted = run("prepare", *common, "--out", "dist", "--num-tasks", "12", "--executor", "slurm", *max_jobs)
        assert submitted.returncode == 0, submitted.stderr
        text = " ".join(submitted.stdout.split())
        assert f"12 tasks of each stage in arrays of {k} (array task i runs tasks i, i + {k}, ... in turn)" in text
        assert f"{4 * k + 1} jobs in all" in text, text
        jobs = dict(re.findall(r"(tokenize|dedup|select|write|finish) \(job (\d+)\)", text))
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and subprocess.run(["squeue", "-h"], capture_output=True, text=True,
                                                              env=env).stdout.strip():  # fmt: skip
            time.sleep(0.5)
        logs = {p.name: p.read_text() for p in (tmp_path / ".dist.lmshard-work" / "slurm").glob("*.log")}
        assert (tmp_path / "dist" / "dataset_metadata.json").exists(), "".join(logs.values())[-3000:]
        known = subprocess.run(["scontrol", "-o", "show", "job"], capture_output=True, text=True, env=env).stdout
        assert len(known.splitlines()) == 4 * k + 1, known  # every job of the run, ended (MinJobAge keeps them)
        assert set(re.findall(r"JobState=(\S+)", known)) == {"COMPLETED"}, known
        stages = ("tokenize", "dedup", "select", "write")
        for stage in stages:
            for i in range(k):
                log = logs[f"{stage}_{jobs[stage]}_{i}.log"]
                assert [int(t) for t in re.findall(rf"{stage} task (\d+): ", log)] == list(range(i, 12, k)), log
        assert len(logs) == 4 * k + 1, sorted(logs)
        assert "done: the dataset is complete" in run("status", "dist").stdout
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")


def test_ray_tasks_give_the_one_machine_bytes(tmp_path):
    """A local Ray cluster started here (in this process, stopped by ray.shutdown); the CLI in a
    subprocess joins it by address, runs 5 tasks of each stage there with retries, and finishes."""
    ray = pytest.importorskip("ray") if not os.environ.get("LMSHARD_REQUIRE_ENGINES") else __import__("ray")
    src = _near_corpus(tmp_path)
    common = [str(src), "--workers", "1", "--on-error", "skip", "--near-dedup"]
    lmshard = [sys.executable, "-m", "lmshard"]
    local = subprocess.run([*lmshard, "prepare", *common, "--out", "local"], cwd=tmp_path, capture_output=True)
    assert local.returncode == 0
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    temp = tempfile.mkdtemp(prefix="lmray-")  # Ray's socket paths must stay under 108 bytes
    info = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
    try:
        args = ["--num-tasks", "5", "--executor", "ray", "--ray-address", info.address_info["gcs_address"]]
        run = subprocess.run([*lmshard, "prepare", *common, "--out", "dist", *args], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")
    assert _near_removed(tmp_path / "dist") > 20
    # (its driver ran the stages back to back: a rate from its claim, not the null of tasks run apart)
    assert json.loads((tmp_path / "dist" / "dataset_metadata.json").read_text())["run"]["tokens_per_s"] > 0
    assert "tokens/s" in run.stdout and "no rate" not in run.stdout + run.stderr, run.stdout


def test_slurm_append_gives_the_local_append_bytes(tmp_path):
    """`prepare --append --near-dedup --num-tasks 3 --executor slurm` onto a dataset equals a
    local --append of the same inputs onto the same dataset, byte for byte (the dataset's keys
    and signatures shared out to the tokenize tasks, its files linked in, the new ones numbered
    after them)."""
    from test_near import _copy
    from test_prepare import make_texts

    texts = make_texts(1200, seed=5)
    old = _clustered(23, n=60)
    jsonl(tmp_path / "first.jsonl", texts[:500] + old)
    src = _corpus(tmp_path)
    rng = random.Random(2)
    jsonl(src / "e.jsonl", texts[450:700] + [" ".join(_copy(rng, d.split(), 0.8, 0.95)[0]) for d in old[:30]])
    common = ["--workers", "1", "--on-error", "skip", "--tokens-per-shard", "20000", "--val-fraction", "0.1",
              "--near-dedup"]  # fmt: skip
    lmshard = [sys.executable, "-m", "lmshard"]
    with slurm_cluster() as env:

        def run(*args):
            return subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)

        assert run("prepare", "first.jsonl", "--out", "local", *common).returncode == 0
        shutil.copytree(tmp_path / "local", tmp_path / "dist", copy_function=os.link)
        assert run("prepare", str(src), "--out", "local", "--append", *common).returncode == 0
        submitted = run("prepare", str(src), "--out", "dist", "--append", *common, "--num-tasks", "3", "--executor",
                        "slurm")  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        logs = _drained(env, tmp_path / ".dist.lmshard-work")
        assert "done: the dataset is complete" in run("status", "dist").stdout, logs[-3000:]
    meta = json.loads((tmp_path / "dist" / "dataset_metadata.json").read_text())
    assert meta["drops"]["duplicate"] >= 80 + 50 and len(meta["config"]["inputs"]) == 2
    assert meta["drops"]["near_duplicate"] >= 20  # (copies of the dataset's documents among them)
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")


def test_slurm_run_of_a_piped_input_gives_the_one_machine_bytes(tmp_path):
    """`... | prepare - --num-tasks 3 --executor slurm`: the planner saves stdin in the work
    folder, the array tasks read their units of that copy, and the dataset equals a one-machine
    prepare of the same pipe."""
    src = _corpus(tmp_path)
    data = b"".join(p.read_bytes() for p in sorted(src.glob("*.jsonl")))
    common = ["-", "--workers", "1", "--on-error", "skip", "--tokens-per-shard", "20000", "--val-fraction", "0.1"]
    lmshard = [sys.executable, "-m", "lmshard"]
    with slurm_cluster() as env:

        def run(*args, stdin=b""):
            return subprocess.run([*lmshard, *args], input=stdin, capture_output=True, timeout=300, cwd=tmp_path,
                                  env=env | {"LMSHARD_UNIT_BYTES": str(1 << 16)})  # fmt: skip

        assert run("prepare", *common, "--out", "local", stdin=data).returncode == 0
        submitted = run("prepare", *common, "--out", "dist", "--num-tasks", "3", "--executor", "slurm", stdin=data)
        assert submitted.returncode == 0, submitted.stderr
        logs = _drained(env, tmp_path / ".dist.lmshard-work")
        assert b"done: the dataset is complete" in run("status", "dist").stdout, logs[-3000:]
    assert json.loads((tmp_path / "dist" / "dataset_metadata.json").read_text())["sources"][0]["path"] == "-"
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")


@pytest.mark.parametrize("kind", ["saved", "stream", "downloaded"])
def test_slurm_run_of_a_hugging_face_dataset_gives_the_one_machine_bytes(tmp_path, kind):
    """`prepare --hf DIR --num-tasks 3 --executor slurm`: each array task reads its units of rows
    from the saved arrow files, or its shards of a stream (a directory of 4 data files), or with
    --no-streaming its rows of the copy `datasets` made in its cache (this machine's), and the
    dataset equals a one-machine prepare of it."""
    import datasets
    from test_prepare import make_texts

    texts = make_texts(900, seed=6)
    column = texts[:700] + texts[:60] + texts[700:]
    if kind == "saved":
        datasets.Dataset.from_dict({"text": column}).save_to_disk(str(tmp_path / kind))
    else:
        (tmp_path / "stream" / "data").mkdir(parents=True)
        for k in range(4):
            datasets.Dataset.from_dict({"text": column[k * 240 : (k + 1) * 240]}).to_parquet(
                str(tmp_path / "stream" / "data" / f"train-{k:05d}-of-00004.parquet"))
    common = ["--hf", kind, "--workers", "1", "--tokens-per-shard", "20000", "--val-fraction", "0.1"]
    if kind == "downloaded":
        (tmp_path / "stream").rename(tmp_path / kind)
        common.append("--no-streaming")
    lmshard = [sys.executable, "-m", "lmshard"]
    with slurm_cluster() as env:

        def run(*args):
            offline = {"HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache")}
            return subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                                  env=env | offline)  # fmt: skip

        assert run("prepare", *common, "--out", "local").returncode == 0
        submitted = run("prepare", *common, "--out", "dist", "--num-tasks", "3", "--executor", "slurm")
        assert submitted.returncode == 0, submitted.stderr
        logs = _drained(env, tmp_path / ".dist.lmshard-work")
        assert "done: the dataset is complete" in run("status", "dist").stdout, logs[-3000:]
    assert json.loads((tmp_path / "dist" / "dataset_metadata.json").read_text())["drops"]["duplicate"] == 60
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")


def test_slurm_dedup_lines_and_its_append_give_the_local_bytes(tmp_path):
    """`prepare --dedup-lines --num-tasks 3 --executor slurm` (six arrays: the lines and linedup
    stages first) equals a one-machine prepare, and an --append of more inputs onto it equals a
    local --append, byte for byte (the dataset's line keys shared out to the lines tasks)."""
    from test_stages import _boilerplate_corpus

    first = _boilerplate_corpus(tmp_path / "first", seed=3, n=400)
    second = _boilerplate_corpus(tmp_path / "second", seed=4, n=600)
    common = ["--workers", "1", "--on-error", "skip", "--tokens-per-shard", "20000", "--val-fraction", "0.1",
              "--dedup-lines"]  # fmt: skip
    lmshard = [sys.executable, "-m", "lmshard"]
    with slurm_cluster() as env:

        def run(*args):
            return subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                                  env=env | {"LMSHARD_UNIT_BYTES": str(1 << 16)})  # fmt: skip

        for extra in ([], ["--append"]):
            src = first if not extra else second
            assert run("prepare", str(src), "--out", "local", *common, *extra).returncode == 0
            submitted = run("prepare", str(src), "--out", "dist", *common, *extra, "--num-tasks", "3", "--executor",
                            "slurm")  # fmt: skip
            assert submitted.returncode == 0, submitted.stderr
            jobs = dict(re.findall(r"(lines|linedup|tokenize|dedup|select|write|finish) \(job (\d+)\)",
                                   submitted.stdout))  # fmt: skip
            said = list(jobs)
            assert said == ["lines", "linedup", "tokenize", "dedup", "select", "write", "finish"], submitted.stdout
            logs = _drained(env, tmp_path / ".dist.lmshard-work")
            assert "done: the dataset is complete" in run("status", "dist").stdout, logs[-3000:]
            assert _files(tmp_path / "local") == _files(tmp_path / "dist")
    meta = json.loads((tmp_path / "dist" / "dataset_metadata.json").read_text())
    assert meta["dedup"]["lines_removed"] > 300 and len(meta["config"]["inputs"]) == 2


def test_slurm_max_docs_gives_the_one_machine_bytes(tmp_path):
    """`prepare --max-docs N --num-tasks 3 --executor slurm`: every unit tokenized and selected
    by the arrays, the cut after the N-th kept document made by the last select task, and the
    dataset (with its counts of what was read up to that document) equal to a one-machine run."""
    src = _corpus(tmp_path)
    common = [str(src), "--workers", "1", "--on-error", "skip", "--tokens-per-shard", "20000", "--val-fraction", "0.1",
              "--max-docs", "1234"]  # fmt: skip
    lmshard = [sys.executable, "-m", "lmshard"]
    with slurm_cluster() as env:

        def run(*args):
            return subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                                  env=env | {"LMSHARD_UNIT_BYTES": str(1 << 16)})  # fmt: skip

        assert run("prepare", *common, "--out", "local").returncode == 0
        submitted = run("prepare", *common, "--out", "dist", "--num-tasks", "3", "--executor", "slurm")
        assert submitted.returncode == 0, submitted.stderr
        logs = _drained(env, tmp_path / ".dist.lmshard-work")
        assert "done: the dataset is complete" in run("status", "dist").stdout, logs[-3000:]
    assert json.loads((tmp_path / "dist" / "dataset_metadata.json").read_text())["n_docs"] == 1234
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")
