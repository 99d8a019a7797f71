"""The training-time loader. Imports only lmshard's format layer, numpy and torch: a training
node needs neither typer, rich, tiktoken nor datasets (a subprocess test checks it). A dataset
at a URL is read through lmshard.remote, which loads fsspec and the store's package then."""

from .batches import Batch, BatchStream
from .dataset import TokenDataset
from .mixture import Mixture
from .packed import PackedDataset, PackedStream, collate_packed
from .padded import PaddedStream
from .windows import WindowBatchSampler, WindowDataset, WindowItem

__all__ = [
    "Batch",
    "BatchStream",
    "Mixture",
    "PackedDataset",
    "PackedStream",
    "PaddedStream",
    "TokenDataset",
    "WindowBatchSampler",
    "WindowDataset",
    "WindowItem",
    "collate_packed",
]
