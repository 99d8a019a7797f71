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

import functools
import os
import time
from typing import Any

import numpy as np

from ..errors import ArgumentError, LmshardError
from ..packing import OVERLONG
from ..prepare.output.claim import bos_written
from ..prepare.output.writer import with_separators
from ..runtime import checks
from ..runtime.sampling import ShiftSpec
from ..runtime.schedule import Schedule
from ..tokenizers import is_hf_spec, load_tokenizer
from ..tokenizers.splintr_backend import pool_lost
from .batches import StreamBatches
from .docs import Documents
from .shapes import packed_batches, window_batches
from .sources import resolve, shards_of


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
        listed = [str(inputs)] if isinstance(inputs, str | os.PathLike) else [str(i) for i in inputs or []]
        self.config = resolve(listed, hf, {"tokenizer": tokenizer, "val_fraction": val_fraction, "seed": split_seed,
                                           **options})  # fmt: skip
        self.seed = checks.seed(seed)
        self.shuffle_buffer = checks.nonnegative("shuffle_buffer", shuffle_buffer)
        self.epochs = None if epochs is None else checks.positive("epochs", epochs)
        if split not in ("train", "val"):
            raise ArgumentError(f"split={checks.show(split)} is not a split; pass 'train' or 'val'")
        self.split = split
        if split == "val" and not val_fraction:
            raise ArgumentError("split='val' holds no document without val_fraction > 0; pass the val_fraction "
                                "the held-out documents were chosen with (prepare's default is 0.01)")  # fmt: skip
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

    def windows(self, batch_size: int | None = None, seq_len: int | None = None, *, stride: int | None = None,
                shift: int | str = 1, schedule: Any = None, **loader: Any) -> StreamBatches:  # fmt: skip
        """Contiguous windows of the token stream: rows of seq_len tokens, each `stride` (default
        seq_len) after the last, labels `shift` ahead (an int, or 'random'). `schedule`: global
        batch sizes and seq_lens by step (runtime/schedule.py) instead of batch_size and seq_len:
        each reader's windows go on, one after another, whatever the step's shape."""
        plan, batch_size, seq_len = _shape(schedule, batch_size, seq_len, several_lengths=True)
        if stride is not None:
            stride = checks.integer("stride", stride, low=1, high=min(plan.seq_lens) if plan else seq_len)
        elif plan is None:
            stride = seq_len
        spec = ShiftSpec.parse(shift, seq_len)
        opts = {"seq_len": seq_len, "stride": stride, "shift": shift, **({"schedule": plan.record()} if plan else {})}
        make = functools.partial(window_batches, batch_size=batch_size, seq_len=seq_len, stride=stride, shift=spec,
                                 seed=self.seed, shift_arg=shift)  # fmt: skip
        return _batches(self, "windows", opts, make, batch_size, loader, plan)

    def packed(self, batch_size: int | None = None, seq_len: int | None = None, *, strategy: str = "bfd",
               buffer: int = 1000, overlong: str = "split", pad_id: int | None = None,
               mask_boundary_labels: bool = True, shuffle: bool = True, schedule: Any = None,
               **loader: Any) -> StreamBatches:  # fmt: skip
        """Packed rows from an online packer: `strategy` ('bfd': best fit within each buffer of
        `buffer` documents; 'greedy': next fit, in order) over the documents as they come,
        overlong ones split, truncated or dropped. Batches as `TokenDataset.packed(...).batches`
        gives them (input_ids, labels, position_ids, cu_seqlens, max_seqlen). `schedule`: global
        batch sizes by step, at one seq_len (pass seq_len too, or a schedule of one length)."""
        plan, batch_size, seq_len = _shape(schedule, batch_size, seq_len, several_lengths=False)
        seq_len, buffer = checks.positive("seq_len", seq_len), checks.positive("buffer", buffer)
        if strategy not in ("bfd", "greedy"):
            raise ArgumentError(f"strategy={checks.show(strategy)}: a stream packs with 'bfd' (best fit in each "
                                "buffer of documents) or 'greedy'")  # fmt: skip
        if overlong not in OVERLONG:
            raise ArgumentError(f"overlong={checks.show(overlong)} is not a policy; pass 'split' (the default), "
                                "'truncate' or 'drop'")  # fmt: skip
        pad = self.eot_id if pad_id is None else checks.integer("pad_id", pad_id, low=0, high=self.vocab_size - 1)
        mask, shuf = checks.flag("mask_boundary_labels", mask_boundary_labels), checks.flag("shuffle", shuffle)
        opts = {"seq_len": seq_len, "strategy": strategy, "buffer": buffer, "overlong": overlong, "pad_id": pad,
                "mask_boundary_labels": mask, "shuffle": shuf, **({"schedule": plan.record()} if plan else {})}
        make = functools.partial(packed_batches, batch_size=batch_size, seq_len=seq_len, strategy=strategy,
                                 buffer=buffer, overlong=overlong, pad_id=pad, mask_boundary_labels=mask,
                                 shuffle=shuf, seed=self.seed)  # fmt: skip
        return _batches(self, "packed", opts, make, batch_size, loader, plan)


_LOADER = ("rank", "world_size", "num_workers", "device", "steps_per_epoch", "mp_context", "clock")


def _batches(stream: TokenStream, shape: str, opts: dict[str, Any], make: Any, batch_size: int | None,
             loader: dict[str, Any], plan: Schedule | None) -> StreamBatches:  # fmt: skip
    if unknown := sorted(set(loader) - set(_LOADER)):
        mine = ", ".join(opts)
        raise ArgumentError(f"{shape}() takes no option {unknown[0]!r}; it takes {mine} and the loader's "
                            f"{', '.join(_LOADER[:5])}")  # fmt: skip
    return StreamBatches(stream, shape, opts, make, batch_size, schedule=plan, **loader)


def _shape(schedule: Any, batch_size: Any, seq_len: Any, several_lengths: bool) -> tuple[Schedule | None, Any, Any]:
    """(the schedule or None, batch_size, seq_len): a schedule in place of batch_size (and of
    seq_len, which a packed stream may give too, equal to the schedule's one length)."""
    if schedule is None:
        if batch_size is None or seq_len is None:
            missing = "batch_size" if batch_size is None else "seq_len"
            raise ArgumentError(f"{missing}=None: pass batch_size and seq_len, each an int, or schedule=[(step, "
                                "global_batch_size, seq_len), ...]")  # fmt: skip
        return None, checks.positive("batch_size", batch_size), seq_len
    plan = schedule if isinstance(schedule, Schedule) else Schedule(schedule)
    if batch_size is not None or (seq_len is not None and several_lengths):
        raise ArgumentError("pass batch_size and seq_len, or a schedule (whose batch sizes are global), not both")
    if not several_lengths and plan.seq_lens != [seq_len if seq_len is not None else plan.seq_lens[0]]:
        raise ArgumentError(f"schedule seq_lens {plan.seq_lens}: a stream's packs have one seq_len; schedule the "
                            "batch size only")  # fmt: skip
    return plan, None, plan.phases[0].seq_len


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


