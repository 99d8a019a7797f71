"""scripts/train_tiny_gpt.py as real data-parallel training: two CPU processes under torchrun (gloo
over loopback) must end with bitwise-equal weights while drawing different rows, and a single
process must continue their checkpoint."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_prepare import jsonl, make_texts

from lmshard import TokenDataset
from lmshard.prepare import PrepareConfig, prepare

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "scripts" / "train_tiny_gpt.py")
B, T, SEED = 2, 16, 7  # rows per rank, tokens per row: small, so a step takes well under a second on 2 cores


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    prepare(PrepareConfig(inputs=[str(jsonl(tmp / "a.jsonl", make_texts(300, seed=5)))], out=str(tmp / "ds"),
                          workers=1, val_fraction=0.05))  # fmt: skip
    return tmp / "ds"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    """Runs cmd in a session of its own, so a hung run is killed with all its workers."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} still running after {timeout} s\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def global_rows(data: Path, step: int) -> np.ndarray:
    """Row offsets of the global batch (B rows × 2 ranks) at `step`, as one process draws them."""
    stream = TokenDataset(data, split="train").random_batches(2 * B, T, seed=SEED, rank=0, world_size=1)
    return stream.cpu_batch(step).offsets


def test_two_ranks_train_one_model_on_different_rows_and_one_process_resumes(data, tmp_path):
    steps = ["--seq-len", str(T), "--seed", str(SEED), "--device", "cpu", "--log-every", "100"]
    ddp = launch([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                  "--master-port", str(free_port()), SCRIPT, str(data), *steps, "--batch-size", str(B), "--steps", "3",
                  "--save", str(tmp_path / "ckpt.pt"), "--report", str(tmp_path / "ddp.json")])  # fmt: skip
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    assert "rank=0/2" in ddp.stdout and "(2 processes, gloo)" in ddp.stdout and "rank=1/2" not in ddp.stdout
    ranks = [json.loads((tmp_path / f"ddp-rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    # gradients synced: the same weights bit for bit, and not the weights they started from
    assert ranks[0]["final_sha256"] == ranks[1]["final_sha256"] != ranks[0]["initial_sha256"]
    assert ranks[0]["initial_sha256"] == ranks[1]["initial_sha256"]
    for step in range(3):
        mine = [np.array(r["batches"][step]["offsets"]) for r in ranks]
        assert [r["batches"][step]["step"] for r in ranks] == [step, step]
        assert len(mine[0]) == len(mine[1]) == B and not set(mine[0]) & set(mine[1])
        # each rank took its own half of the step's global batch
        assert np.array_equal(np.concatenate(mine), global_rows(data, step))

    # one process with the same global batch continues the run from rank 0's checkpoint
    one = launch([sys.executable, SCRIPT, str(data), *steps, "--batch-size", str(2 * B), "--steps", "5",
                  "--progress-every", "0", "--resume", str(tmp_path / "ckpt.pt"),
                  "--report", str(tmp_path / "one.json")])  # fmt: skip
    assert one.returncode == 0, one.stdout + one.stderr
    assert "step     3  loss" in one.stdout  # a progress line (every step with --progress-every 0)
    report = json.loads((tmp_path / "one-rank0.json").read_text())
    assert report["world_size"] == 1 and report["initial_sha256"] == ranks[0]["final_sha256"]
    assert report["final_sha256"] != report["initial_sha256"]
    assert [b["step"] for b in report["batches"]] == [3, 4]
    for b in report["batches"]:
        assert np.array_equal(b["offsets"], global_rows(data, b["step"]))


def test_a_stopped_and_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(data, tmp_path):
    """3 steps + --save, then --resume up to --steps 6 (the total: 3 more), gives bitwise the
    weights of 6 uninterrupted steps (data position, optimizer state and LR schedule all resume)."""
    common = [sys.executable, SCRIPT, str(data), "--batch-size", str(B), "--seq-len", str(T), "--seed", str(SEED),
              "--device", "cpu", "--lr-horizon", "6", "--log-every", "100", "--progress-every", "100"]  # fmt: skip
    runs = [
        [*common, "--steps", "6", "--report", str(tmp_path / "full.json")],
        [*common, "--steps", "3", "--save", str(tmp_path / "half.pt")],
        [*common, "--steps", "6", "--resume", str(tmp_path / "half.pt"), "--report", str(tmp_path / "res.json")],
    ]
    for cmd in runs:
        done = launch(cmd)
        assert done.returncode == 0, done.stderr[-2000:]
    full, resumed = (json.loads((tmp_path / f"{n}-rank0.json").read_text()) for n in ("full", "res"))
    assert [b["step"] for b in resumed["batches"]] == [3, 4, 5]
    assert resumed["batches"] == full["batches"][3:]
    assert resumed["final_sha256"] == full["final_sha256"] != full["initial_sha256"]
