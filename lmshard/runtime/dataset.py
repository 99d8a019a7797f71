"""`TokenDataset`: one split of a prepared dataset, and the ways to draw batches from it.

    from lmshard import TokenDataset
    train = TokenDataset("data/mycorpus", split="train")
    batches = train.random_batches(batch_size=16, seq_len=1024, seed=1337, device="cuda")
    x, y = next(batches)                      # int64 [16, 1024] on the GPU

Memory model: see `store.py` (no token data kept between reads), `remote/store.py` for a
dataset at a URL (a bounded pool of blocks) and `batches.py` (a ring of host buffers).
`from_text` and `synthetic` hold their tokens in memory: they are for small data.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import ArgumentError, InputError, LmshardError
from ..format import SPLITS, DatasetMeta
from ..packing.io import CACHE_DIR
from ..remote.urls import is_url, redact
from . import checks
from .batches import BatchStream, resolve_rank
from .memory import in_memory
from .resident import Resident, place
from .sampling import DocStarts, ShiftSpec, count_windows
from .schedule import parse_order
from .schedule import resolve as resolve_schedule
from .store import DEFAULT_RSS_LIMIT, TokenStore, open_store
from .subset import restrict
from .windows import WindowDataset, random_offsets, stride_or_default, window_offsets

if TYPE_CHECKING:
    from .remote.store import RemoteStore

SPLIT_ALIASES = {"validation": "val", "valid": "val", "dev": "val"}  # what other tools call the held-out split
_RSS_FIX = "pass rss_limit=None to map a split of any size, or a size in bytes (0: always read)"


class TokenDataset:
    """A split of a prepared dataset, in a directory or at a URL (s3://, gs://, az://, hf://,
    https://). Opening validates the metadata and every shard's file sizes (an error names the
    shard); shard files are opened lazily, at most `max_open_shards` at a time. Splits of at
    most `rss_limit` bytes (default 1 GiB; None: any size) are memory-mapped, so the process's
    RSS may grow by up to their size; larger splits are read with `preadv`, which keeps RSS flat
    (see store.py).

    At a URL (see remote/store.py and docs/remote.md): tokens are fetched in 64 KiB checksum
    blocks, each checked, through an in-memory pool of `pool_limit` bytes (default 256 MiB per
    process); streams fetch the blocks of their next `prefetch_steps` steps (default 8) on a
    background thread. `cache_dir` with `cache_limit` (bytes) keeps checked blocks on local disk
    for later epochs. `storage_options` go to the fsspec filesystem; `retry` (a
    `lmshard.remote.Retry`) sets the backoff and attempts of every request.

    `device`: its streams' default device. With `resident=True` (or "auto": when it fits) the
    split is uploaded there once, in its stored width, and batches are gathered on the device,
    the same batches as the host path's (runtime/resident.py); `resident_budget` is the fraction
    of the device's free memory it may take. `val_fraction`, `split_seed`: a load-time split
    (runtime/subset.py); `where`: only the documents whose attributes pass (runtime/where.py)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        split: str = "train",
        *,
        max_open_shards: int = 64,
        rss_limit: int | None = DEFAULT_RSS_LIMIT,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        pool_limit: int | None = None,
        prefetch_steps: int | None = None,
        storage_options: dict[str, Any] | None = None,
        retry: Any = None,
        val_fraction: float | None = None,
        split_seed: int = 0,
        where: str | None = None,
        device: str | torch.device | None = None,
        resident: bool | str = False,
        resident_budget: float = 0.5,
    ) -> None:
        if not isinstance(path, str | os.PathLike):
            raise ArgumentError(f"path={checks.show(path)} is not a path; pass the dataset directory as a str or Path")
        split = SPLIT_ALIASES.get(split, split) if isinstance(split, str) else split
        if not isinstance(split, str) or split not in SPLITS:
            raise ArgumentError(f"split={checks.show(split)} is not a split lmshard writes; pass split='train' or "
                                "split='val' (also accepted: 'validation', 'valid', 'dev' for 'val')")  # fmt: skip
        max_open_shards = checks.positive("max_open_shards", max_open_shards)
        if rss_limit is not None:  # a float such as 1.5e9 gets the plain fix: the int it stands for
            rss_limit = checks.nonnegative("rss_limit", rss_limit, fix=_RSS_FIX if checks.is_int(rss_limit) else "")
        remote = {"cache_dir": cache_dir, "cache_limit": cache_limit, "pool_limit": pool_limit,
                  "prefetch_steps": prefetch_steps, "storage_options": storage_options, "retry": retry}  # fmt: skip
        self.meta: DatasetMeta | None
        self.store: TokenStore | RemoteStore  # (or a load-time split's SubsetStore over one)
        self.plan_dir: Path | None  # where packing plans are cached (packing/io.py: cached_plan)
        self.split = split
        opened = split if val_fraction is None else "train"  # a load-time split carves the train split
        if is_url(path):
            from .remote.store import open_remote_store

            self.meta, self.store, self.plan_dir = open_remote_store(str(path), opened, max_open_shards, **remote)
            self.path: Path | str = redact(str(path))
        else:
            if "://" in str(path):  # a URL of a scheme lmshard does not read: not a local directory named 'ftp:'
                raise ArgumentError(f"{redact(str(path))}: not a URL scheme lmshard reads; use s3://, gs://, az://, "
                                    "hf:// or https://, or a local directory")  # fmt: skip
            given = sorted(k for k, v in remote.items() if v is not None)
            if given:
                raise ArgumentError(f"{given[0]}= applies to datasets at a URL (s3://, gs://, https://...); drop it "
                                    f"for the local dataset {path}")  # fmt: skip
            self.meta, self.store = open_store(path, opened, max_open_shards, rss_limit)
            self.path, self.plan_dir = Path(path), Path(path) / CACHE_DIR
        self.store, self._carved = restrict(self.meta, self.store, split, val_fraction, split_seed, where,
                                            f"the dataset {self.path}")  # (a subset: its data_id says how)
        self.eot_id = self.meta.tokenizer.eot_id
        self.bos_id = self.meta.tokenizer.bos_id  # before each document, or None when none was written
        self.vocab_size = self.meta.tokenizer.n_vocab
        self.resident: Resident | None = place(self.store, device, resident, resident_budget, self._where)
        self.device = device if self.resident is None else self.resident.device  # its streams' default device

    @classmethod
    def _from_store(cls, store: TokenStore, eot_id: int, vocab_size: int, name: str) -> TokenDataset:
        self = cls.__new__(cls)
        self.meta, self.store, self.path, self.split = None, store, Path(name), "memory"
        self.plan_dir = None  # in memory: plans are not cached
        self.eot_id, self.vocab_size, self.bos_id = eot_id, vocab_size, None
        self.device, self.resident = None, None
        return self

    def make_resident(self, device: str | torch.device, resident: bool | str = True,
                      resident_budget: float = 0.5) -> TokenDataset:  # fmt: skip
        """Upload the split to `device` as `TokenDataset(..., device=, resident=, resident_budget=)`
        does, for a dataset built in memory (`from_tokens`, `synthetic`); returns the dataset."""
        self.resident = place(self.store, device, resident, resident_budget, self._where)
        self.device = device if self.resident is None else self.resident.device
        return self

    @classmethod
    def from_tokens(cls, tokens: np.ndarray, doc_lengths: np.ndarray | None = None, *, eot_id: int,
                    vocab_size: int, name: str = "<memory>") -> TokenDataset:  # fmt: skip
        """A dataset held in memory, from token ids of any tokenizer: `doc_lengths` gives the
        tokens of each document (separators included) in order; None makes it one document.
        Memory: one uint32 copy of `tokens` (none if it is already contiguous uint32)."""
        store, eot_id, vocab_size = in_memory(tokens, doc_lengths, eot_id, vocab_size)
        return cls._from_store(store, eot_id, vocab_size, str(name))

    @classmethod
    def from_text(cls, path: str | os.PathLike[str], tokenizer: Any) -> TokenDataset:
        """Tokenize one small UTF-8 text file in memory (one document, EOT after it), with any
        tokenizer that has `encode_batch`, `eot_id` and `n_vocab`, such as
        `lmshard.tokenizers.load_tokenizer("gpt2")`. The runtime imports no tokenizer itself."""
        if isinstance(tokenizer, str):
            raise ArgumentError(f"from_text needs a tokenizer object, not tokenizer={tokenizer!r}; pass "
                                f"lmshard.tokenizers.load_tokenizer({tokenizer!r})")  # fmt: skip
        missing = [a for a in ("encode_batch", "eot_id", "n_vocab") if not hasattr(tokenizer, a)]
        if missing:
            raise ArgumentError(f"tokenizer={checks.show(tokenizer)} has no {', '.join(missing)}; pass one from "
                                "lmshard.tokenizers.load_tokenizer(name)")  # fmt: skip
        if not isinstance(path, str | os.PathLike) or not Path(path).is_file():
            raise ArgumentError(f"path={checks.show(path)} is not a file; pass the path of a UTF-8 text file")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{path}: not UTF-8 at byte {e.start}; convert the file to UTF-8") from None
        tokens, _ = tokenizer.encode_batch([text])
        tokens = np.append(tokens, np.uint32(tokenizer.eot_id))
        return cls.from_tokens(tokens, eot_id=tokenizer.eot_id, vocab_size=tokenizer.n_vocab, name=str(path))

    @classmethod
    def synthetic(
        cls, n_tokens: int = 1_000_000, vocab_size: int = 50257, doc_len: int = 512, seed: int = 0
    ) -> TokenDataset:
        """Random tokens in documents of `doc_len` (EOT = vocab_size - 1 closes each): for smoke
        tests. Memory: the tokens (4 bytes each) and one offset per document (8 bytes)."""
        n_tokens, doc_len = checks.positive("n_tokens", n_tokens), checks.positive("doc_len", doc_len)
        vocab_size = checks.integer("vocab_size", vocab_size, low=2, high=2**32,
                                    fix="pass vocab_size=2 or more (the last id is the EOT)")  # fmt: skip
        seed = checks.seed(seed)
        rng = np.random.default_rng(seed)
        tokens = rng.integers(0, vocab_size - 1, size=n_tokens, dtype=np.uint32)
        ends = np.arange(doc_len, n_tokens + 1, doc_len)
        tokens[ends - 1] = vocab_size - 1
        index = np.unique(np.concatenate([[0], ends, [n_tokens]]))
        return cls._from_store(TokenStore.from_arrays(tokens, index), vocab_size - 1, vocab_size, "<synthetic>")

    @property
    def _where(self) -> str:
        """The split as messages name it."""
        return f"split {self.split!r} of {self.path}" if self.meta is not None else f"in-memory dataset {self.path}"

    def __repr__(self) -> str:
        where = getattr(self, "_carved", "").partition("?")[2]  # (a where= selection: its condition)
        shown = f", where={where!r}" if where else ""
        return f"TokenDataset({str(self.path)!r}, split={self.split!r}{shown}, tokens={self.n_tokens:,}, " \
               f"docs={self.n_docs:,})"  # fmt: skip

    @property
    def n_tokens(self) -> int:
        return self.store.n_tokens

    @property
    def data_id(self) -> str:
        """What a loader state records of the data it draws from: a digest of the split's shard
        checksums, the split and its tokens (an in-memory dataset: its name and size). Any change
        to the split's tokens (an --append, a rebuild, another dataset) changes it; the path, which
        may be spelled another way, does not enter it."""
        if self.meta is None:
            return f"{self.path}:{self.n_tokens}"
        carved = getattr(self, "_carved", "")  # a load-time split (@), a where= (?): runtime/subset.py
        sums = ",".join(f"{s.xxh3_64}/{s.index_xxh3_64}" + (f"/{s.attr_xxh3_64}" if "?" in carved else "")
                        for s in self.meta.split_shards("train" if carved.startswith("@") else self.split))
        return f"{hashlib.sha256(sums.encode()).hexdigest()[:16]}:{self.split}{carved}:{self.n_tokens}"

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the dataset was made with (`encode`, `decode`, `eot_id`, `n_vocab`): a
        tiktoken vocabulary by name, else the dataset's own copy of its vocabulary file, checked
        against the sha256 its metadata records; loaded once. LmshardError naming the fix when it
        is not available here (not installed; an in-memory dataset has none)."""
        found = getattr(self, "_tokenizer", None)
        if found is None:
            from ..tokenizers.of_dataset import tokenizer_for

            why: list[str] = []
            found = tokenizer_for(self.meta, why)
            if found is None:
                what = why[0].removeprefix("token ids are shown undecoded: ") if why else "it is held in memory"
                raise LmshardError(f"{self._where}: no tokenizer to decode with: {what}")
            self._tokenizer = found
        return found

    def decode(self, ids: Any) -> Any:
        """The text of token ids with the dataset's tokenizer: one sequence (a list, array or
        tensor) gives a str, a batch ([B, T], such as a batch's `x`) a list of B strs. Separators
        decode as their tokens' text (`<|endoftext|>`)."""
        array = np.asarray(ids.cpu() if hasattr(ids, "cpu") else ids)
        if array.ndim not in (1, 2) or array.dtype.kind not in "iu":
            raise ArgumentError(f"decode takes token ids as one sequence or a batch [B, T], not an array of shape "
                                f"{array.shape} and dtype {array.dtype}")  # fmt: skip
        decode = self.tokenizer.decode
        if array.ndim == 1:
            return decode(array.astype(np.int64).tolist())
        return [decode(row.astype(np.int64).tolist()) for row in array]

    @property
    def n_docs(self) -> int:
        return self.store.n_docs

    def tokens(self, start: int, length: int) -> np.ndarray:
        """`length` tokens of the split's concatenated stream from `start` (uint32)."""
        n = self.n_tokens
        start = checks.integer("start", start, low=0, high=n, fix=f"pass a start in [0, {n})")
        length = checks.integer("length", length, low=0, high=n - start,
                                fix=f"pass a length that ends inside [0, {n})")  # fmt: skip
        out = np.empty(length, dtype=np.uint32)
        self.store.read_into(start, out)
        return out

    def random_batches(
        self,
        batch_size: int | None = None,
        seq_len: int | None = None,
        *,
        seed: int = 0,
        shift: int | str = 1,
        rank: int | None = None,
        world_size: int | None = None,
        device: str | torch.device | None = None,
        doc_aligned: bool = False,
        cu_seqlens: bool = False,
        grouped: bool = False,
        prefetch: bool = True,
        schedule: Any = None,
        order: str | None = None,
    ) -> BatchStream:
        """An endless stream of batches at random offsets (see `BatchStream`).

        shift: labels `shift` tokens ahead (1: next token), or "random": a proper divisor of
        seq_len drawn per batch, shared by its rows, returned as `batch.shift`; `grouped`
        reshapes x and y to [batch, seq_len // shift, shift]. doc_aligned: every row starts at a
        document start. cu_seqlens: add document boundaries for varlen attention. prefetch: on
        CUDA, start the next batch's host-to-device copy before returning the current one.
        schedule: [(step, global_batch_size, seq_len), ...] instead of batch_size and seq_len
        (runtime/schedule.py). order: "rows" (the default: row g of the run is drawn from
        (seed, g), so every batch size reads the same rows) or "steps" (as lmshard 0.2 drew)."""
        world = resolve_rank(rank, world_size)[1]
        plan = resolve_schedule(schedule, batch_size, seq_len, world)
        order_, given = parse_order(order, "rows")
        doc_aligned = checks.flag("doc_aligned", doc_aligned)
        starts = DocStarts(self.store.doc_counts, self.store.doc_start) if doc_aligned else None
        make = functools.partial(random_offsets, self, shift, seed, starts)
        return BatchStream(self.store, make(plan.phases[0].seq_len, order_), schedule=plan, make=make,
                           order_given=given, rank=rank, world_size=world_size, device=self._device(device),
                           resident=self.resident, seed=seed, kind="random", cu_seqlens=cu_seqlens,
                           grouped=grouped, prefetch=prefetch, data=self.data_id, dataset=self)  # fmt: skip

    def window_batches(
        self,
        batch_size: int | None = None,
        seq_len: int | None = None,
        *,
        stride: int | None = None,
        shift: int | str = 1,
        seed: int = 0,
        shuffle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        device: str | torch.device | None = None,
        cu_seqlens: bool = False,
        grouped: bool = False,
        prefetch: bool = True,
        schedule: Any = None,
        order: str | None = None,
    ) -> BatchStream:
        """Sliding windows (start i·stride of the concatenated split) in batches, epoch after
        epoch; `stream.set_epoch(e)` jumps to epoch e, whose order is reshuffled from (seed, e).
        order="steps" (the default without a schedule): every epoch is whole steps, the same on
        every rank (a last partial global batch is dropped). order="rows" (the default with a
        schedule): the run's row g is window g mod n of epoch g // n, so no window is dropped and
        every batch size reads the same windows in the same order; an epoch may end inside a
        step. A schedule's seq_len phases each draw the windows of their length (stride: the
        given one, else the length), whose epochs go on where that length's last phase stopped.
        shift and grouped as in `random_batches`: with shift="random" each step draws a proper
        divisor of seq_len, and windows are counted with the largest one."""
        rank_, world = resolve_rank(rank, world_size)
        plan = resolve_schedule(schedule, batch_size, seq_len, world)
        order_, given = parse_order(order, "rows" if schedule is not None else "steps")
        first = plan.phases[0]
        make = functools.partial(window_offsets, self, plan, world, stride, shift, seed, shuffle)
        several = stride is None and len(plan.seq_lens) > 1  # each length at its own stride
        kind = "windows/auto" if several else f"windows/{stride_or_default(stride, first.seq_len)}"
        return BatchStream(self.store, make(first.seq_len, order_), schedule=plan, make=make, order_given=given,
                           rank=rank_, world_size=world, device=self._device(device), seed=seed, kind=kind,
                           resident=self.resident, cu_seqlens=cu_seqlens, grouped=grouped, prefetch=prefetch,
                           data=self.data_id, dataset=self)  # fmt: skip

    def windows(self, seq_len: int, stride: int | None = None, shift: int | str = 1,
                grouped: bool = False) -> WindowDataset:  # fmt: skip
        """Map-style dataset of sliding windows: item i starts at i·stride of the split. With
        shift="random", batch it with `ds.batch_sampler(batch_size, ...)` (see windows.py)."""
        return WindowDataset(self, seq_len, stride, shift, grouped)

    def packed(self, seq_len: int, **options: Any) -> Any:
        """Whole documents packed into rows of `seq_len` tokens, planned from the document index
        (see `lmshard.runtime.packed.PackedDataset` for the strategies and options), or, with
        strategy="stream" and `buffer=N`, as the split is read, in constant memory
        (`lmshard.runtime.streampacked.StreamPacked`)."""
        if options.get("strategy") == "stream":
            from .streampacked import StreamPacked

            return StreamPacked(self, seq_len, **{k: v for k, v in options.items() if k != "strategy"})
        if "buffer" in options:
            raise ArgumentError("buffer= is the window of strategy='stream'; pass strategy='stream' with it")
        from .packed import PackedDataset

        return PackedDataset(self, seq_len, **options)

    def padded_batches(self, batch_size: int, max_len: int, **options: Any) -> Any:
        """Whole documents in padded batches, grouped by length by default (see
        `lmshard.runtime.padded.PaddedStream` for the options)."""
        from .padded import PaddedStream

        return PaddedStream(self, batch_size, max_len, **options)

    def _device(self, device: str | torch.device | None) -> str | torch.device | None:
        """A stream's device: the given one, else the dataset's (its resident copy's)."""
        return self.device if device is None else device

    def val_streams(self, tokens: int, seq_len: int, *, batch_size: int = 8, by: str | None = "input",
                    device: str | torch.device | None = None) -> dict[str, Any]:  # fmt: skip
        """One fixed evaluation stream per domain of this val split (by its inputs, a category
        attribute, or None: the split as one), `tokens` tokens each at most (runtime/valstreams.py)."""
        if self.split != "val":
            raise ArgumentError(f"val_streams reads a val split; open it with TokenDataset({str(self.path)!r}, "
                                "split='val')")  # fmt: skip
        from .valstreams import streams

        return streams(self, tokens, seq_len, batch_size, by, self._device(device))

    def attribute(self, name: str) -> np.ndarray:
        """Attribute `name` (prepare --attribute) of each of this split's documents, in order (of
        a where= or load-time selection, its documents); a category's values index its labels
        in `meta.attributes`. Memory: the column (4 bytes a document; 2 for a category)."""
        from .where import attribute_values

        return attribute_values(self, name)

    def _check_windows(self, seq_len: int, stride: int, spec: ShiftSpec) -> int:
        """How many windows the split holds: at least one, or an error naming the sizes."""
        checks.fits(self._where, self.n_tokens, seq_len, spec.max)
        return count_windows(self.n_tokens, seq_len, stride, spec.max)

