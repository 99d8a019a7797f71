"""The torchtitan recipe (scripts/torchtitan_lmshard.py, docs/loader.md) against the real
torchtitan: its ParallelAwareDataloader serves each data-parallel rank exactly lmshard's window
batches, resumes from its own state_dict at the next batch, and torchtitan's Llama 3 (debug
configuration, on CPU) trains on them with torchtitan's loss equal to next-token cross-entropy
computed by hand: the labels are the next tokens, as torchtitan expects (it does not shift)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import write

from lmshard import TokenDataset
from lmshard.prepare import PrepareConfig, prepare

pytest.importorskip("torchtitan")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
recipe = importlib.import_module("torchtitan_lmshard")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("titan")
    texts = [f"document {i}: " + " ".join(["river", "stone", "light"][i % 3] for _ in range(i % 40 + 5))
             for i in range(400)]  # fmt: skip
    src = write(tmp / "docs.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp / "ds"), workers=1, val_fraction=0.0, quiet=True))
    return tmp / "ds"


def _config(path: Path, batch: int, seq_len: int, seed: int):
    from torchtitan.config.job_config import JobConfig

    config = JobConfig()
    config.training.dataset_path, config.training.local_batch_size, config.training.seq_len = str(path), batch, seq_len
    config.debug.seed = seed
    return config


def test_each_rank_gets_lmshards_window_batches_and_resumes_exactly(dataset):
    from torchtitan.protocols.train_spec import get_train_spec

    build = get_train_spec("llama3_lmshard").build_dataloader_fn  # registered by the recipe's import
    assert build is recipe.build_lmshard_dataloader
    for rank in (0, 1):
        loader = build(dp_world_size=2, dp_rank=rank, tokenizer=None, job_config=_config(dataset, 3, 32, 7))
        want = TokenDataset(dataset).window_batches(3, 32, seed=7, rank=rank, world_size=2)
        got = [item for item, _ in zip(loader, range(6), strict=False)]  # not copied: each its own tensors
        for (inputs, labels), batch in zip(got, want, strict=False):
            assert torch.equal(inputs["input"], batch.x) and torch.equal(labels, batch.y)
        assert set(loader.state_dict()) == {f"dp_rank_{rank}", "world_size"}
    loader = build(dp_world_size=2, dp_rank=1, tokenizer=None, job_config=_config(dataset, 3, 32, 7))
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    after = [next(it) for _ in range(3)]
    resumed = build(dp_world_size=2, dp_rank=1, tokenizer=None, job_config=_config(dataset, 3, 32, 7))
    resumed.load_state_dict(state)
    again = [item for item, _ in zip(resumed, range(3), strict=False)]
    for (a, la), (b, lb) in zip(after, again, strict=True):
        assert torch.equal(a["input"], b["input"]) and torch.equal(la, lb)


def test_torchtitans_llama3_trains_on_the_batches_with_its_own_loss(dataset):
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.models.llama3 import Transformer, llama3_args

    args = llama3_args["debugmodel"]
    args.max_seq_len, args.vocab_size = 32, TokenDataset(dataset).vocab_size
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    loader = recipe.build_lmshard_dataloader(1, 0, None, _config(dataset, 2, 32, 0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for (inputs, labels), _ in zip(loader, range(5), strict=False):
        logits = model(inputs["input"])
        loss = cross_entropy_loss(logits, labels)
        by_hand = -logits.float().log_softmax(-1).gather(-1, labels[..., None]).sum()  # summed, as torchtitan's
        assert torch.isclose(loss, by_hand, rtol=1e-5)
        assert torch.equal(labels[:, :-1], inputs["input"][:, 1:])  # the next tokens, unshifted by torchtitan
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert all(torch.isfinite(torch.tensor(losses)))
