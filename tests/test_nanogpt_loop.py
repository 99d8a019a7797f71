"""Exact resume in a loop shaped like nanoGPT's train.py (docs/nanogpt.md), run in real processes.

The loop draws the next batch inside the gradient-accumulation loop, before the step it belongs
to is trained, so one batch is always in hand when it checkpoints; it evaluates every few
iterations from streams of its own. A new process that resumes from a checkpoint written
mid-run must train on exactly the batches the uninterrupted run trained on after that point.
The naive state (`state_dict()`, nothing in hand) and eval drawing from the training stream
(what nanoGPT's shared `get_batch` amounts to) are run too, and shown to break it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_prepare import jsonl, make_texts

from lmshard.prepare import PrepareConfig, prepare

# The loop, as a script: each process prints the batches it trained on, one record per micro
# step: [iter, micro_step, row offsets, sha1 of x]. Every eval writes a checkpoint file of its
# own, holding both states (1 and 0 batches in hand), so one run serves the exact and the naive
# resume. `stop` ends a run early, as a crash two iterations after its checkpoint would (the
# resumed run redoes them). A checkpoint file does not depend on what its run does afterwards,
# so the eval-sharing and two-rank runs resume from files their uninterrupted runs wrote (one
# process fewer each: a torch import per process is most of the test's time).
LOOP = r"""
import hashlib, json, os, sys
from lmshard import TokenDataset

cfg = json.loads(sys.argv[1])
B, T, ITERS, ACC, EVAL_INTERVAL, EVAL_ITERS = 4, 32, 16, 3, 5, 2
master = int(os.environ.get("RANK", "0")) == 0
data = {split: TokenDataset(cfg["root"], split=split) for split in ("train", "val")}
train = data["train"].random_batches(B, T, seed=1337)  # rank and world size from RANK / WORLD_SIZE

def eval_stream(split):
    if cfg["eval"] == "shared":  # nanoGPT's get_batch: eval draws from the training stream
        return train
    return data[split].random_batches(B, T, seed=0, rank=0, world_size=1)

it = 0
if cfg["load"]:
    with open(cfg["load"]) as f:
        ckpt = json.load(f)
    it = ckpt["iter"]
    train.load_state_dict(ckpt[cfg["state"]])
trained = []
batch = next(train)  # the very first batch
while it < cfg["stop"]:
    if it % EVAL_INTERVAL == 0 and master:
        for split in ("train", "val"):
            batches = eval_stream(split)
            for _ in range(EVAL_ITERS):
                next(batches)
        if it > 0:
            ckpt = {"iter": it, "in_hand_1": train.state_dict(in_hand=1), "in_hand_0": train.state_dict()}
            with open(f"{cfg['save']}-{it}.json", "w") as f:
                json.dump(ckpt, f)
    for micro in range(ACC):
        x, y = batch
        trained.append([it, micro, batch.offsets.tolist(), hashlib.sha1(x.numpy().tobytes()).hexdigest()])
        batch = next(train)  # pre-drawn while the model would run forward on x
    it += 1
print(json.dumps(trained))
"""

ITERS, CKPT_AT, ACC = 16, 10, 3  # ITERS and ACC as in LOOP; CKPT_AT: an eval (and checkpoint) iteration


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nanogpt")
    prepare(PrepareConfig(inputs=[str(jsonl(tmp / "a.jsonl", make_texts(400, seed=5)))], out=str(tmp / "ds"),
                          workers=1, val_fraction=0.1))  # fmt: skip
    (tmp / "loop.py").write_text(LOOP)
    return tmp


def run_all(root, jobs: dict[str, tuple[dict, dict]]) -> dict[str, list]:
    """Run the loop once per named (config, environment) job, all at once; each job's records."""
    procs = {}
    for name, (cfg, env) in jobs.items():
        full_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        full_env.update(env, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
        cfg = {"root": str(root / "ds"), "eval": "own", "stop": ITERS, "load": None, "save": str(root / name), **cfg}
        cmd = [sys.executable, str(root / "loop.py"), json.dumps(cfg)]
        procs[name] = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    for name, p in procs.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"{name}: {err}"
        results[name] = json.loads(out)
    return results


@pytest.fixture(scope="module")
def runs(root):
    """All runs of this module, in two rounds of processes side by side; the second resumes from
    checkpoints the first wrote."""
    ranks = [{"RANK": str(r), "WORLD_SIZE": "2"} for r in (0, 1)]
    first = run_all(root, {
        "full": ({}, {}),
        "stopped": ({"stop": CKPT_AT + 2}, {}),  # stopped two iterations after its checkpoint at CKPT_AT
        "shared": ({"eval": "shared"}, {}),
        "rank0": ({}, ranks[0]),
        "rank1": ({}, ranks[1]),
    })  # fmt: skip
    ckpt = {name: str(root / f"{name}-{CKPT_AT}.json") for name in ("stopped", "shared", "rank0")}
    resumed = run_all(root, {
        "exact": ({"load": ckpt["stopped"], "state": "in_hand_1"}, {}),
        "naive": ({"load": ckpt["stopped"], "state": "in_hand_0"}, {}),
        "shared_resumed": ({"load": ckpt["shared"], "state": "in_hand_1", "eval": "shared"}, {}),
        # only rank 0 checkpoints, as nanoGPT's master process: both ranks resume from its file
        "rank0_resumed": ({"load": ckpt["rank0"], "state": "in_hand_1"}, ranks[0]),
        "rank1_resumed": ({"load": ckpt["rank0"], "state": "in_hand_1"}, ranks[1]),
    })  # fmt: skip
    return first | resumed


def rows(records: list) -> list:
    """The batches alone (offsets and hash of x), without the iteration labels."""
    return [r[2:] for r in records]


def test_resume_with_one_batch_in_hand_matches_an_uninterrupted_run(runs):
    full, exact, naive = runs["full"], runs["exact"], runs["naive"]
    assert len(full) == ITERS * ACC and len({tuple(r[2]) for r in full}) == len(full)  # distinct batches
    before, after = full[: CKPT_AT * ACC], full[CKPT_AT * ACC :]  # split at the checkpoint
    assert runs["stopped"][: CKPT_AT * ACC] == before and exact[0][:2] == [CKPT_AT, 0]
    assert before + exact == full
    # state_dict() without in_hand: the batch drawn for iteration CKPT_AT is skipped, every later one shifts
    assert before + naive != full and rows(naive)[:-1] == rows(after)[1:]


def test_eval_from_the_training_stream_breaks_resume(runs):
    # the checkpoint is written after the eval has drawn from the stream, and the resumed run
    # evaluates at CKPT_AT again: its training batches are not those of the uninterrupted run
    after, resumed = runs["shared"][CKPT_AT * ACC :], runs["shared_resumed"]
    assert len(resumed) == len(after) and rows(resumed) != rows(after)


def test_two_ranks_resume_from_the_master_checkpoint(runs):
    """As under torchrun: RANK / WORLD_SIZE per process, only rank 0 evaluates and checkpoints."""
    for r in (0, 1):
        full, resumed = runs[f"rank{r}"], runs[f"rank{r}_resumed"]
        assert resumed[0][:2] == [CKPT_AT, 0] and full[: CKPT_AT * ACC] + resumed == full
    # the ranks trained on different rows at every micro step
    assert all(set(a[2]).isdisjoint(b[2]) for a, b in zip(runs["rank0"], runs["rank1"], strict=True))
