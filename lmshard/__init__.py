"""lmshard: raw text to sharded token data for LLM pretraining, and a loader for it.

    from lmshard import TokenDataset
    train = TokenDataset("data/mycorpus", split="train")

`TokenDataset` (and torch with it) is imported on first use, so `import lmshard` stays light
for the command line and for data-preparation nodes without torch.
"""

from __future__ import annotations

from typing import Any

from .errors import LmshardError

__version__ = "0.1.0"
__all__ = ["LmshardError", "Mixture", "TokenDataset", "__version__", "hf_collator", "load_config", "load_metadata",
           "stream", "verify_dataset"]


def __getattr__(name: str) -> Any:
    if name == "TokenDataset":
        from .runtime import TokenDataset

        return TokenDataset
    if name == "Mixture":
        from .runtime import Mixture

        return Mixture
    if name == "hf_collator":
        from .runtime.hfconvention import hf_collator

        return hf_collator
    if name == "load_config":
        from .loadconfig import load_config

        return load_config
    if name == "stream":
        from .streaming import stream

        return stream
    if name == "load_metadata":  # lazily too: the command line sets up the process before numpy loads
        from .format import load_metadata

        return load_metadata
    if name == "verify_dataset":
        from .inspect import verify_dataset

        return verify_dataset
    raise AttributeError(f"module 'lmshard' has no attribute {name!r}")
