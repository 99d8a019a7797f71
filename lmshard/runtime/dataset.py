"""`TokenDataset`: one split of a prepared dataset, and the ways to draw batches from it.

    from lmshard import TokenDataset
    train = TokenDataset("data/mycorpus", split="train")
    batches = train.random_batches(batch_size=16, seq_len=1024, seed=1337, device="cuda")
    x, y = next(batches)                      # int64 [16, 1024] on the GPU

Memory model: see `store.py` (no token data kept between reads) and `batches.py` (a ring of
host buffers). `from_text` and `synthetic` hold their tokens in memory: they are for small data.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from ..format import DatasetMeta
from .batches import BatchStream, resolve_rank
from .sampling import DocStarts, RandomOffsets, ShiftSpec, WindowOffsets, count_windows
from .store import DEFAULT_RSS_LIMIT, TokenStore, open_store


class TokenDataset:
    """A split of a prepared dataset. Opening validates the metadata and every shard's file
    sizes (an error names the shard); shard files are opened lazily, at most `max_open_shards`
    at a time. Splits of at most `rss_limit` bytes (default 1 GiB; None: any size) are
    memory-mapped, so the process's RSS may grow by up to their size; larger splits are read
    with `preadv`, which keeps RSS flat (see store.py)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        split: str = "train",
        *,
        max_open_shards: int = 64,
        rss_limit: int | None = DEFAULT_RSS_LIMIT,
    ) -> None:
        self.meta: DatasetMeta | None
        self.meta, self.store = open_store(path, split, max_open_shards, rss_limit)
        self.path, self.split = Path(path), split
        self.eot_id = self.meta.tokenizer.eot_id
        self.vocab_size = self.meta.tokenizer.n_vocab

    @classmethod
    def _from_store(cls, store: TokenStore, eot_id: int, vocab_size: int, name: str) -> TokenDataset:
        self = cls.__new__(cls)
        self.meta, self.store, self.path, self.split = None, store, Path(name), "memory"
        self.eot_id, self.vocab_size = eot_id, vocab_size
        return self

    @classmethod
    def from_tokens(cls, tokens: np.ndarray, doc_lengths: np.ndarray | None = None, *, eot_id: int,
                    vocab_size: int, name: str = "<memory>") -> TokenDataset:  # fmt: skip
        """A dataset held in memory, from token ids of any tokenizer: `doc_lengths` gives the
        tokens of each document (separators included) in order; None makes it one document."""
        tokens = np.ascontiguousarray(tokens, dtype=np.uint32)
        lengths = np.array([len(tokens)] if doc_lengths is None else doc_lengths, dtype=np.int64)
        if int(lengths.sum()) != len(tokens) or (lengths <= 0).any():
            raise ConfigError(f"doc_lengths must be positive and sum to the {len(tokens)} tokens")
        index = np.concatenate([[0], np.cumsum(lengths)])
        return cls._from_store(TokenStore.from_arrays(tokens, index), eot_id, vocab_size, name)

    @classmethod
    def from_text(cls, path: str | os.PathLike[str], tokenizer: Any) -> TokenDataset:
        """Tokenize one small UTF-8 text file in memory (one document, EOT after it), with any
        tokenizer that has `encode_batch`, `eot_id` and `n_vocab`, such as
        `lmshard.tokenizers.load_tokenizer("gpt2")`. The runtime imports no tokenizer itself."""
        if isinstance(tokenizer, str):
            raise ConfigError(f"from_text needs a tokenizer object: TokenDataset.from_text(path, "
                              f"lmshard.tokenizers.load_tokenizer({tokenizer!r}))")  # fmt: skip
        tokens, _ = tokenizer.encode_batch([Path(path).read_text(encoding="utf-8")])
        tokens = np.append(tokens, np.uint32(tokenizer.eot_id))
        return cls.from_tokens(tokens, eot_id=tokenizer.eot_id, vocab_size=tokenizer.n_vocab, name=str(path))

    @classmethod
    def synthetic(
        cls, n_tokens: int = 1_000_000, vocab_size: int = 50257, doc_len: int = 512, seed: int = 0
    ) -> TokenDataset:
        """Random tokens in documents of `doc_len` (EOT = vocab_size - 1 closes each): for smoke tests."""
        rng = np.random.default_rng(seed)
        tokens = rng.integers(0, vocab_size - 1, size=n_tokens, dtype=np.uint32)
        ends = np.arange(doc_len, n_tokens + 1, doc_len)
        tokens[ends - 1] = vocab_size - 1
        index = np.unique(np.concatenate([[0], ends, [n_tokens]]))
        return cls._from_store(TokenStore.from_arrays(tokens, index), vocab_size - 1, vocab_size, "<synthetic>")

    def __repr__(self) -> str:
        return f"TokenDataset({str(self.path)!r}, split={self.split!r}, tokens={self.n_tokens:,}, docs={self.n_docs:,})"

    @property
    def n_tokens(self) -> int:
        return self.store.n_tokens

    @property
    def n_docs(self) -> int:
        return self.store.n_docs

    def tokens(self, start: int, length: int) -> np.ndarray:
        """`length` tokens of the split's concatenated stream from `start` (uint32)."""
        if start < 0 or length < 0 or start + length > self.n_tokens:
            raise ConfigError(f"tokens [{start}, {start + length}) are outside [0, {self.n_tokens})")
        out = np.empty(length, dtype=np.uint32)
        self.store.read_into(start, out)
        return out

    def random_batches(
        self,
        batch_size: int,
        seq_len: int,
        *,
        seed: int = 0,
        shift: int | str = 1,
        rank: int | None = None,
        world_size: int | None = None,
        device: str | torch.device = "cpu",
        doc_aligned: bool = False,
        cu_seqlens: bool = False,
        grouped: bool = False,
        prefetch: bool = True,
    ) -> BatchStream:
        """An endless stream of batches at random offsets (see `BatchStream`).

        shift: labels `shift` tokens ahead (1: next token), or "random": a proper divisor of
        seq_len drawn per batch, shared by its rows, returned as `batch.shift`; `grouped`
        reshapes x and y to [batch, seq_len // shift, shift]. doc_aligned: every row starts at a
        document start. cu_seqlens: add document boundaries for varlen attention. prefetch: on
        CUDA, start the next batch's host-to-device copy before returning the current one."""
        spec = ShiftSpec.parse(shift, seq_len)
        if grouped and any(seq_len % s for s in spec.choices):
            raise ConfigError(f"grouped=True reshapes rows to [seq_len // shift, shift]: shift {spec.describe()} "
                              f"must divide seq_len {seq_len}")  # fmt: skip
        starts = DocStarts(self.store.doc_counts, self.store.doc_start) if doc_aligned else None
        offsets = RandomOffsets(self.n_tokens, seq_len, spec, seed, starts)
        return BatchStream(self.store, offsets, batch_size=batch_size, seq_len=seq_len, rank=rank,
                           world_size=world_size, device=device, seed=seed, kind="random",
                           cu_seqlens=cu_seqlens, grouped=grouped, prefetch=prefetch)  # fmt: skip

    def window_batches(
        self,
        batch_size: int,
        seq_len: int,
        *,
        stride: int | None = None,
        shift: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        device: str | torch.device = "cpu",
        cu_seqlens: bool = False,
        prefetch: bool = True,
    ) -> BatchStream:
        """Sliding windows (start i·stride of the concatenated split) in batches, epoch after
        epoch; `stream.set_epoch(e)` jumps to epoch e, whose order is reshuffled from (seed, e).
        Every rank gets the same number of steps per epoch (a last partial global batch is dropped)."""
        stride = stride or seq_len
        rank_, world = resolve_rank(rank, world_size)
        spec = ShiftSpec.parse(shift, seq_len)
        offsets = WindowOffsets(self.n_tokens, seq_len, stride, spec, batch_size * world, seed, shuffle)
        return BatchStream(self.store, offsets, batch_size=batch_size, seq_len=seq_len, rank=rank_,
                           world_size=world, device=device, seed=seed, kind=f"windows/{stride}",
                           cu_seqlens=cu_seqlens, prefetch=prefetch)  # fmt: skip

    def windows(self, seq_len: int, stride: int | None = None, shift: int = 1) -> WindowDataset:
        """Map-style dataset of sliding windows: item i starts at i·stride of the split."""
        return WindowDataset(self, seq_len, stride or seq_len, shift)


class WindowDataset(torch.utils.data.Dataset):
    """Window i = tokens [i·stride, i·stride + seq_len) of the split as x, and the same shifted by
    `shift` as y; int64 tensors. Works with DataLoader and DistributedSampler."""

    def __init__(self, data: TokenDataset, seq_len: int, stride: int, shift: int = 1) -> None:
        if stride < 1 or seq_len < 1 or shift < 1:
            raise ConfigError("seq_len, stride and shift must be at least 1")
        self.data, self.seq_len, self.stride, self.shift = data, seq_len, stride, shift
        self.n = count_windows(data.n_tokens, seq_len, stride, shift)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        row = self.data.tokens(i * self.stride, self.seq_len + self.shift).view(np.int32)
        t = torch.from_numpy(row)
        return t[: self.seq_len].long(), t[self.shift :].long()
