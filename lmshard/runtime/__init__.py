"""The training-time loader. Imports only lmshard's format layer, numpy and torch: a training
node needs neither typer, rich, tiktoken nor datasets (a subprocess test checks it)."""

from .batches import Batch, BatchStream
from .dataset import TokenDataset, WindowDataset

__all__ = ["Batch", "BatchStream", "TokenDataset", "WindowDataset"]
