"""torchtitan trains from an lmshard dataset: a train spec, `llama3_lmshard`, that is torchtitan's
Llama 3 with its data loader drawing lmshard's shuffled windows (docs/loader.md, "torchtitan").

    torchrun --nproc_per_node 8 -m torchtitan.train --job.config_file llama3_8b.toml \\
        --experimental.custom_import torchtitan_lmshard --model.name llama3_lmshard \\
        --training.dataset_path data/fineweb        # a dataset written by `lmshard prepare`

(with this file on PYTHONPATH). Each data-parallel rank draws its own rows of every global
batch from the same closed-form order, so no rank reads another's; `training.local_batch_size`
and `training.seq_len` set the batch, `debug.seed` the order. torchtitan checkpoints the loader
with the model (`checkpoint.enable`): the state is lmshard's few integers per rank, and a resumed
run draws exactly the batches an uninterrupted one would. The dataset's own vocabulary must be
the model's (`--model.hf_assets_path` names the tokenizer torchtitan loads; the ids are already
tokens here). `training.dataloader` options are not used: the loader runs in the training
process (a draw costs microseconds). torchtitan's validation (`validation.enable`) still reads
its own Hugging Face validation set; evaluate on the dataset's val split with lmshard instead.

Memory model: one batch at a time beyond the dataset's memory map (lmshard's loader).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.models import llama3
from torchtitan.protocols.train_spec import register_train_spec

from lmshard import TokenDataset

NAME = "llama3_lmshard"


class LmshardBatches(IterableDataset, Stateful):  # type: ignore[misc]
    """This data-parallel rank's batches of `TokenDataset(path).window_batches(...)` as torchtitan
    takes them: `({"input": x}, labels)`, a whole local batch [B, T] an item (labels are the next
    tokens, as torchtitan's loss expects: it does not shift them)."""

    def __init__(self, path: str, batch_size: int, seq_len: int, dp_rank: int, dp_world_size: int,
                 seed: int = 0) -> None:  # fmt: skip
        self.batches = TokenDataset(path).window_batches(batch_size, seq_len, seed=seed, rank=dp_rank,
                                                         world_size=dp_world_size)  # fmt: skip

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        for batch in self.batches:
            yield {"input": batch.x}, batch.y

    def state_dict(self) -> dict[str, Any]:
        return {"lmshard": self.batches.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.batches.load_state_dict(state_dict["lmshard"])


def build_lmshard_dataloader(dp_world_size: int, dp_rank: int, tokenizer: Any, job_config: Any,
                             infinite: bool = True) -> ParallelAwareDataloader:  # fmt: skip
    """torchtitan's `build_dataloader_fn`: the dataset at `training.dataset_path`, batches of
    `training.local_batch_size` × `training.seq_len`, in the order of `debug.seed` (0 unset)."""
    training = job_config.training
    if not training.dataset_path:
        raise ValueError("--training.dataset_path: the lmshard dataset to train on (a directory or URL)")
    data = LmshardBatches(training.dataset_path, training.local_batch_size, training.seq_len, dp_rank,
                          dp_world_size, seed=job_config.debug.seed or 0)  # fmt: skip
    return ParallelAwareDataloader(data, dp_rank=dp_rank, dp_world_size=dp_world_size, batch_size=None)


with contextlib.suppress(ValueError):  # (this file imported again under another name: registered already)
    register_train_spec(NAME, dataclasses.replace(llama3.get_train_spec(),
                                                  build_dataloader_fn=build_lmshard_dataloader))  # fmt: skip
