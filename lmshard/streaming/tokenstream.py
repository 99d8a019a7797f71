"""`lmshard.stream(...)`: train straight from text, tokenized on the fly, with no prepare step.

    stream = lmshard.stream("data/web/*.jsonl.zst", tokenizer="gpt2", shuffle_buffer=10_000)
    for x, y in stream.windows(batch_size=8, seq_len=1024, num_workers=4):
        ...

A `TokenStream` reads hub ids, presets, `save_to_disk` datasets and local (or URL) files through
prepare's readers, cleaning and tokenizers: with the shuffle off, its documents are the ones
`prepare --no-dedup` writes, joined by the same separators. Its batch calls (`windows`,
`packed`) return a `StreamBatches`: an iterable of batches for one rank whose readers (the
rank's DataLoader workers, `num_workers`, or the process itself) each read their own part of the
source (docs.py) and tokenize it, and whose `state_dict()` is each reader's position.

Every rank takes the same number of steps. By default a stream has no end (each reader starts
its next epoch when its part runs out), so the training loop decides how many steps to take.
With `epochs=N` it ends, and the ranks agree where: at a declared `steps_per_epoch`, or, without
one, at the shortest rank's count (one all-reduce of a flag per step over the default process
group of torch.distributed).

Memory model: per reader, one window of documents (docs.py) and the rows of one batch; the
DataLoader's prefetch (2 batches per worker); a history of 16 positions for `state_dict(in_hand=)`.
"""

from __future__ import annotations

import collections
import functools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError, LmshardError
from ..packing import parse_strategy
from ..prepare.output.claim import bos_written
from ..prepare.output.writer import with_separators
from ..runtime import checks
from ..runtime.batches import Batch, resolve_rank
from ..runtime.packed import PackedBatch
from ..runtime.sampling import ShiftSpec
from ..tokenizers import is_hf_spec, load_tokenizer
from ..tokenizers.splintr_backend import pool_lost
from .docs import Documents
from .shapes import packed_batches, window_batches
from .sources import resolve, shards_of

HISTORY = 16
_START = [0, 0, 0, 0, 0, 0, 0]  # a reader's position before anything is read: DocPos, offset or pack, batch
_WARN_AFTER, _WARN_SHARE = 50, 0.25  # steps measured, and the share of the time spent waiting, before a warning


class TokenStream:
    """Documents of text inputs, tokenized as they are read. `inputs`: files, directories, globs
    or URLs (prepare's inputs), a hub id or preset name, or a `save_to_disk` directory; `hf`: a
    hub id or a directory to read through the `datasets` library. `tokenizer`: the preset's, else
    gpt2. `shuffle_buffer`: documents shuffled together (0: read in order); the shards' order is
    shuffled too, per epoch, when the buffer is on. `epochs`: None (no end) or a count.
    `split`/`val_fraction`: prepare's train/val split of the documents (by a hash of the text
    and `split_seed`, prepare's --seed). Other keywords are prepare's options (`text_field`,
    `min_chars`, `normalize`, `bos`, `on_error`…)."""

    def __init__(self, inputs: str | list[str] | None = None, *, hf: str | None = None, tokenizer: str | None = None,
                 seed: int = 0, shuffle_buffer: int = 0, epochs: int | None = None, split: str = "train",
                 val_fraction: float = 0.0, split_seed: int = 1337, **options: Any) -> None:  # fmt: skip
        listed = [inputs] if isinstance(inputs, str) else list(inputs or [])
        self.config = resolve(listed, hf, {"tokenizer": tokenizer, "val_fraction": val_fraction, "seed": split_seed,
                                           **options})  # fmt: skip
        self.seed = checks.seed(seed)
        self.shuffle_buffer = checks.nonnegative("shuffle_buffer", shuffle_buffer)
        self.epochs = None if epochs is None else checks.positive("epochs", epochs)
        if split not in ("train", "val"):
            raise ArgumentError(f"split={checks.show(split)} is not a split; pass 'train' or 'val'")
        self.split = split
        self.shards = shards_of(self.config)
        tok = _load_here(self.config.tokenizer, self.config.tokenizer_backend, self.config.separator)
        self.vocab_size, self.eot_id, self.bos_id = tok.n_vocab, tok.eot_id, bos_written(self.config, tok)
        self._tokenizer: Any = None  # loaded where it encodes: in the reader's process (a forked worker)
        self.encode_seconds, self.encoded_tokens = 0.0, 0

    def __getstate__(self) -> dict[str, Any]:  # a spawned DataLoader worker loads its own
        return {**self.__dict__, "_tokenizer": None, "shards": None}

    def __repr__(self) -> str:
        c = self.config
        what = c.hf or ", ".join(c.inputs[:3]) + (" …" if len(c.inputs) > 3 else "")
        return f"TokenStream({what}, tokenizer={c.tokenizer!r}, shards={len(self.shards or [])}, split={self.split!r})"

    @property
    def n_shards(self) -> int:
        return len(self.shards or shards_of(self.config))

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        tok = self._tokenizer
        if tok is None or (tok.backend == "splintr" and pool_lost()):  # a worker forked after the pool started
            c = self.config
            if pool_lost():  # splintr's pool started in the process this one was forked from
                self._tokenizer = _load_here(c.tokenizer, c.tokenizer_backend, c.separator)
            else:
                self._tokenizer = load_tokenizer(c.tokenizer, c.tokenizer_backend, separator=c.separator)
        started = time.perf_counter()
        tokens, lengths = self._tokenizer.encode_batch(texts)
        out = with_separators(tokens, lengths, np.ones(len(lengths), bool), self.eot_id, self.config.eot_position,
                              self.bos_id)  # fmt: skip
        self.encode_seconds += time.perf_counter() - started
        self.encoded_tokens += len(out[0])
        return out

    def documents(self, *, reader: int = 0, readers: int = 1, epochs: int | None | str = "stream") -> Documents:
        """Reader `reader` of `readers`'s documents: iterate `documents()()` for (position, tokens)."""
        if self.shards is None:
            self.shards = shards_of(self.config)
        return Documents(self.shards, reader, readers, encode=self._encode, seed=self.seed,
                         shuffle_buffer=self.shuffle_buffer, shuffle_shards=self.shuffle_buffer > 1,
                         epochs=self.epochs if epochs == "stream" else epochs,  # type: ignore[arg-type]
                         val_fraction=self.config.val_fraction, split=self.split,
                         split_seed=self.config.seed)  # fmt: skip

    def use_threads(self, n: int) -> None:
        if self._tokenizer is not None:
            self._tokenizer.use_threads(n)

    def windows(self, batch_size: int, seq_len: int, *, stride: int | None = None, shift: int | str = 1,
                **loader: Any) -> StreamBatches:  # fmt: skip
        """Contiguous windows of the token stream: rows of seq_len tokens, each `stride` (default
        seq_len) after the last, labels `shift` ahead (an int, or 'random')."""
        seq_len = checks.positive("seq_len", seq_len)
        stride = seq_len if stride is None else checks.integer("stride", stride, low=1, high=seq_len)
        spec = ShiftSpec.parse(shift, seq_len)
        opts = {"seq_len": seq_len, "stride": stride, "shift": shift}
        make = functools.partial(window_batches, batch_size=batch_size, seq_len=seq_len, stride=stride, shift=spec,
                                 seed=self.seed)  # fmt: skip
        return StreamBatches(self, "windows", opts, make, batch_size, **loader)

    def packed(self, batch_size: int, seq_len: int, *, strategy: str = "bfd", buffer: int = 1000,
               overlong: str = "split", pad_id: int | None = None, mask_boundary_labels: bool = True,
               shuffle: bool = True, **loader: Any) -> StreamBatches:  # fmt: skip
        """Packed rows from an online packer: `strategy` ('bfd': best fit within each buffer of
        `buffer` documents; 'greedy': next fit, in order) over the documents as they come,
        overlong ones split, truncated or dropped. Batches as `TokenDataset.packed(...).batches`
        gives them (input_ids, labels, position_ids, cu_seqlens, max_seqlen)."""
        seq_len, buffer = checks.positive("seq_len", seq_len), checks.positive("buffer", buffer)
        if parse_strategy(strategy)[0] not in ("bfd", "greedy"):
            raise ArgumentError(f"strategy={checks.show(strategy)}: a stream packs with 'bfd' (best fit in each "
                                "buffer of documents) or 'greedy'")  # fmt: skip
        pad = self.eot_id if pad_id is None else checks.integer("pad_id", pad_id, low=0, high=self.vocab_size - 1)
        mask, shuf = checks.flag("mask_boundary_labels", mask_boundary_labels), checks.flag("shuffle", shuffle)
        opts = {"seq_len": seq_len, "strategy": strategy, "buffer": buffer, "overlong": overlong, "pad_id": pad,
                "mask_boundary_labels": mask, "shuffle": shuf}  # fmt: skip
        make = functools.partial(packed_batches, batch_size=batch_size, seq_len=seq_len, strategy=strategy,
                                 buffer=buffer, overlong=overlong, pad_id=pad, mask_boundary_labels=mask,
                                 shuffle=shuf, seed=self.seed)  # fmt: skip
        return StreamBatches(self, "packed", opts, make, batch_size, **loader)


def _load_here(spec: str, backend: str, separator: str | None) -> Any:
    """The tokenizer for its identity (size, separator, BOS), loaded without starting a thread
    pool in this process: splintr's Rayon pool does not survive the fork of a DataLoader worker,
    which then loads its own (`TokenStream._encode`). Every backend gives the same ids."""
    if backend in ("auto", "splintr"):
        try:
            return load_tokenizer(spec, "tokenizers" if is_hf_spec(spec) else "tiktoken", separator=separator)
        except LmshardError:
            pass
    return load_tokenizer(spec, backend, separator=separator)


def stream(inputs: str | list[str] | None = None, **options: Any) -> TokenStream:
    """A `TokenStream` of `inputs` (see TokenStream for the options)."""
    return TokenStream(inputs, **options)


def _same(item: Any) -> Any:  # the DataLoader's collate: the readers make whole batches
    return item


class _Readers(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """What each DataLoader worker runs: reader (worker + first) % workers of the rank, from its position."""

    def __init__(self, owner: StreamBatches) -> None:
        self.owner = owner

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        w = 0 if info is None else info.id
        self.owner.stream.use_threads(1)
        return self.owner.reader((w + self.owner.first) % self.owner.workers)


class StreamBatches(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """The batches of one rank of a `TokenStream`: `x, y = batch` / `batch["input_ids"]`,
    `state_dict(in_hand=0)` / `load_state_dict` for exact resume, `metrics()` for what the
    stream did and whether training waited on it."""

    def __init__(self, stream: TokenStream, shape: str, options: dict[str, Any], make: Callable[..., Iterator[Any]],
                 batch_size: int, *, rank: int | None = None, world_size: int | None = None, num_workers: int = 0,
                 device: str | torch.device = "cpu", steps_per_epoch: int | None = None,
                 mp_context: str | None = None, clock: Callable[[], float] = time.perf_counter) -> None:  # fmt: skip
        self.stream, self.shape, self.options, self._make = stream, shape, options, make
        self.batch_size = checks.positive("batch_size", batch_size)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.num_workers = checks.nonnegative("num_workers", num_workers)
        self.workers = max(1, self.num_workers)
        self.device = checks.device(device)
        self.mp_context = mp_context  # the DataLoader's: None, its default (fork on Linux)
        self.steps_per_epoch = None if steps_per_epoch is None else checks.positive("steps_per_epoch", steps_per_epoch)
        self.step, self.first, self.positions = 0, 0, [list(_START) for _ in range(self.workers)]
        self._history: collections.deque[tuple[int, list[list[int]], int]] = collections.deque(maxlen=HISTORY)
        self._history.append((0, [list(p) for p in self.positions], 0))
        self._clock, self._finished = clock, False
        self._items: Any = None  # the batches being served: a reader's generator, or the DataLoader's iterator
        self._wait = self._busy = 0.0
        self._since: float | None = None
        self._warned = False
        self._counts: dict[int, Counter[str]] = {}
        self._packed = Counter[str]()
        self._encode = [0.0, 0]

    def __getstate__(self) -> dict[str, Any]:  # what a DataLoader worker needs: no iterator, no clock
        return {**self.__dict__, "_items": None, "_clock": None}

    def __repr__(self) -> str:
        return (f"StreamBatches({self.stream!r}, shape={self.shape!r}, batch_size={self.batch_size}, "
                f"rank={self.rank}/{self.world_size}, num_workers={self.num_workers}, step={self.step})")  # fmt: skip

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    @property
    def seq_len(self) -> int:
        return int(self.options["seq_len"])

    @property
    def seed(self) -> int:
        return self.stream.seed

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    def reader(self, local: int) -> Iterator[dict[str, Any]]:
        """The batches of this rank's reader `local` from its position (run in its process)."""
        readers = self.world_size * self.workers
        epochs = None if self.steps_per_epoch is not None else self.stream.epochs
        docs = self.stream.documents(reader=self.rank * self.workers + local, readers=readers, epochs=epochs)
        seconds, tokens = self.stream.encode_seconds, self.stream.encoded_tokens
        for item in self._make(docs, list(self.positions[local])):
            item["reader"], item["records"] = local, dict(docs.counts)
            item["encode"] = (self.stream.encode_seconds - seconds, self.stream.encoded_tokens - tokens)
            seconds, tokens = self.stream.encode_seconds, self.stream.encoded_tokens
            yield item

    def _agree(self) -> bool:
        return self.world_size > 1 and self.stream.epochs is not None and self.steps_per_epoch is None

    def __iter__(self) -> StreamBatches:
        if self._agree() and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise ArgumentError(f"a stream of {self.stream.epochs} epoch(s) on {self.world_size} ranks must end at "
                                "the same step on every rank: initialise torch.distributed first (the ranks then "
                                "stop at the shortest rank's count), pass steps_per_epoch=N, or pass epochs=None "
                                "and stop the loop yourself")  # fmt: skip
        if self.num_workers == 0:
            self._items = self.reader(0)
        else:
            loader = torch.utils.data.DataLoader(_Readers(self), batch_size=None, num_workers=self.num_workers,
                                                 collate_fn=_same, pin_memory=self.device.type == "cuda",
                                                 multiprocessing_context=self.mp_context)  # fmt: skip
            self._items = iter(loader)
        self._since = None
        return self

    def close(self) -> None:
        """Stop the DataLoader workers now (a loop that breaks early leaves them waiting for the
        garbage collector); the next iteration starts new ones from the positions reached."""
        items, self._items = self._items, None
        if hasattr(items, "_shutdown_workers"):
            items._shutdown_workers()

    def __enter__(self) -> StreamBatches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __next__(self) -> Batch | PackedBatch:
        if self._items is None:
            iter(self)
        limit = self.steps_per_epoch * self.stream.epochs if self.steps_per_epoch and self.stream.epochs else None
        if self._finished or (limit is not None and self.step >= limit):
            raise StopIteration
        now = self._clock()
        if self._since is not None:
            self._busy += now - self._since
        item = next(self._items, None)  # type: ignore[call-overload]
        self._since = self._clock()
        self._wait += self._since - now
        if self._agree():
            flag = torch.tensor([0 if item is None else 1], device=_flag_device())
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
            if int(flag.item()) == 0:
                item = None
        if item is None:
            self._finished = True
            raise StopIteration
        return self._deliver(item)

    def _deliver(self, item: dict[str, Any]) -> Batch | PackedBatch:
        r = int(item["reader"])
        self.positions[r] = [int(v) for v in item["state"]]
        self.first = (r + 1) % self.workers
        self._counts[r] = Counter(item["records"])
        self._encode[0] += item["encode"][0]
        self._encode[1] += item["encode"][1]
        step = self.step
        self.step += 1
        self._history.append((self.step, [list(p) for p in self.positions], self.first))
        self._check_pace()
        dev, fast = self.device, self.device.type == "cuda"
        if self.shape == "windows":
            rows = torch.as_tensor(item["rows"])
            shift, T = int(item["shift"]), self.options["seq_len"]
            rows = rows.to(dev, non_blocking=fast)
            offsets = np.full(self.batch_size, -1, dtype=np.int64)
            return Batch(rows[:, :T], rows[:, shift : shift + T], step, shift, offsets)
        self._packed["rows"] += self.batch_size
        self._packed["real_tokens"] += int(item["real_tokens"])
        self._packed.update(item["counts"])
        fields: dict[str, Any] = {k: torch.as_tensor(item[k]).to(dev, non_blocking=fast)
                  for k in ("input_ids", "labels", "position_ids", "cu_seqlens")}  # fmt: skip
        fields["max_seqlen"] = int(item["max_seqlen"])
        return PackedBatch(fields, step)

    def _check_pace(self) -> None:
        """Warn once when training spends more than a quarter of its time waiting for batches."""
        total = self._wait + self._busy
        if self._warned or self.step < _WARN_AFTER or not total or self._wait / total < _WARN_SHARE:
            return
        self._warned = True
        from ..errors import warn

        rate = self.metrics()["tokens_per_second_per_reader"]
        warn(f"training waited for batches {self._wait / total:.0%} of the time over {self.step} steps: the stream "
             f"is the bottleneck (tokenizing at {rate:,.0f} tokens/s per reader); pass num_workers="
             f"{max(2, 2 * self.workers)}, or prepare the data once with `lmshard prepare`")  # fmt: skip

    def metrics(self) -> dict[str, Any]:
        """Steps served, the share of the time spent waiting for a batch, tokenizing speed per
        reader, the records read and dropped (by reason), and for packed rows the fill."""
        total = self._wait + self._busy
        out: dict[str, Any] = {
            "steps": self.step,
            "waiting_share": self._wait / total if total else 0.0,
            "tokens_per_second_per_reader": self._encode[1] / self._encode[0] if self._encode[0] else 0.0,
            "records": dict(sum(self._counts.values(), Counter())),
        }
        if self.shape == "packed":
            rows = self._packed["rows"]
            out["fill"] = self._packed["real_tokens"] / (rows * self.options["seq_len"]) if rows else 0.0
            out.update({k: v for k, v in self._packed.items() if k not in ("rows", "real_tokens")})
            out["packs"] = rows
        return out

    def state_dict(self, in_hand: int = 0) -> dict[str, Any]:
        """Each reader's position after the last batch handed out, less `in_hand` batches drawn
        but not trained on (at most 16)."""
        in_hand = checks.nonnegative("in_hand", in_hand)
        want = self.step - in_hand
        found = next((h for h in self._history if h[0] == want), None)
        if found is None:
            most = min(self.step, HISTORY - 1)
            raise ArgumentError(f"in_hand={in_hand}: the stream keeps the positions of its last {HISTORY} steps "
                                f"(it is at step {self.step}); pass in_hand at most {most}")  # fmt: skip
        step, positions, first = found
        return {"kind": "lmshard.stream", "shape": self.shape, "step": step, "rank": self.rank,
                "world_size": self.world_size, "num_workers": self.num_workers, "readers": positions,
                "first": first, "options": self._fingerprint()}  # fmt: skip

    def _fingerprint(self) -> dict[str, Any]:
        s = self.stream
        return {**{k: v for k, v in self.options.items()}, "batch_size": self.batch_size, "seed": s.seed,
                "shuffle_buffer": s.shuffle_buffer, "epochs": s.epochs, "split": s.split,
                "steps_per_epoch": self.steps_per_epoch, "tokenizer": s.config.tokenizer,
                "inputs": list(s.config.inputs), "hf": s.config.hf}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict()`: the same rank, world size and num_workers (each reader
        owns its records by them), and the same stream options."""
        if not isinstance(state, dict) or state.get("kind") != "lmshard.stream" or state.get("shape") != self.shape:
            raise ArgumentError(f"not the state of a {self.shape} stream of lmshard.stream; pass what this kind of "
                                "stream's state_dict() returned")  # fmt: skip
        for key in ("world_size", "num_workers", "rank"):
            if state[key] != getattr(self, key):
                raise ArgumentError(
                    f"the state was saved with {key}={state[key]} and this stream has {getattr(self, key)}: each "
                    "reader (rank × DataLoader worker) owns its own records, so a stream resumes only with the same "
                    f"world size, rank and num_workers; pass {key}={state[key]}")  # fmt: skip
        mine = self._fingerprint()
        for key, value in state["options"].items():
            if mine.get(key) != value:
                raise ArgumentError(f"the state was saved with {key}={value!r} and this stream has "
                                    f"{key}={mine.get(key)!r}; resume with the options it was saved with")  # fmt: skip
        self.step, self.first = checks.state_int(state, "step", 0), checks.state_int(state, "first", 0)
        self.positions = [[int(v) for v in p] for p in state["readers"]]
        self._history.clear()
        self._history.append((self.step, [list(p) for p in self.positions], self.first))
        self._items, self._finished = None, False


def _flag_device() -> torch.device:
    backend = torch.distributed.get_backend()
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
