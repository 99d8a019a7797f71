"""`StreamBatches`: the batches of one rank of a `TokenStream` (tokenstream.py), served by its
readers: the rank's DataLoader workers, or this process. Tracks each reader's position for
`state_dict`, agrees with the other ranks where a finite stream ends, and says when training
waits on it.

Memory model: the DataLoader's prefetch (PREFETCH batches per worker: enough that one slow
batch of a worker does not leave the others idle) and a history of 16 positions
for `state_dict(in_hand=)`; each reader's own is in shapes.py and docs.py.
"""

from __future__ import annotations

import collections
import functools
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import xxhash

from .. import errors
from ..errors import ArgumentError, InputError, LmshardError
from ..runtime import checks
from ..runtime.augment import Augmented
from ..runtime.batches import Batch, resolve_rank
from ..runtime.packed import PackedBatch
from ..runtime.schedule import Schedule
from ..runtime.trace import DocPiece
from .gather import gather_states
from .shapes import reader_sizes
from .sources import shards_of

HISTORY = 16
PREFETCH = 8  # batches each DataLoader worker may have ready (2, torch's default, left workers idle 25% of the time)
# The prepare options that decide which documents a stream reads and their tokens: a resume refuses any change.
_DOCUMENT_OPTIONS = ("hf_config", "hf_split", "revision", "exclude", "include_hidden", "format", "text_field",
                     "text_mode", "normalize", "byte_exact", "min_chars", "max_chars", "overlong", "separator", "bos",
                     "eot_position", "val_fraction", "seed", "on_error")
_RENAMED = {"seed": "split_seed", "overlong": "max_chars_overlong"}  # prepare's names that a stream's own shadow
_START = [0, 0, 0, 0, 0, 0, 0]  # a reader's position before anything is read: DocPos, offset or pack, batch
_WARN_AFTER, _WARN_SHARE = 50, 0.25  # steps measured, and the share of the time spent waiting, before a warning


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
        try:
            yield from self.owner.reader((w + self.owner.first) % self.owner.workers)
        except LmshardError as e:  # to the main process as it is: one line, not a worker's traceback
            yield {"error": type(e).__name__, "message": str(e)}


class StreamBatches(Augmented, torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """The batches of one rank of a `TokenStream`: `x, y = batch` / `batch["input_ids"]`,
    `state_dict(in_hand=0)` / `load_state_dict` for exact resume, `metrics()` for what the
    stream did and whether training waited on it."""

    def __init__(self, stream: Any, shape: str, options: dict[str, Any], make: Callable[..., Iterator[Any]],
                 batch_size: int | None, *, rank: int | None = None, world_size: int | None = None,
                 num_workers: int = 0, device: str | torch.device = "cpu", steps_per_epoch: int | None = None,
                 mp_context: str | None = None, clock: Callable[[], float] = time.perf_counter,
                 schedule: Schedule | None = None) -> None:  # fmt: skip
        self.stream, self.shape, self.options, self._make = stream, shape, options, make
        self.rank, self.world_size = resolve_rank(rank, world_size)
        # a schedule's global batch sizes and seq_lens by step (runtime/schedule.py); None: one shape
        self.schedule = schedule
        self._rows = None if schedule is not None else checks.positive("batch_size", batch_size)
        if schedule is not None:
            schedule.per_rank(self.world_size)
        self.num_workers = checks.nonnegative("num_workers", num_workers)
        self.workers = max(1, self.num_workers)
        self.device = checks.device(device)
        self.mp_context = mp_context  # the DataLoader's: None, its default (fork on Linux)
        self.steps_per_epoch = None if steps_per_epoch is None else checks.positive("steps_per_epoch", steps_per_epoch)
        self.step, self.first, self.positions = 0, 0, [list(_START) for _ in range(self.workers)]
        self._history: collections.deque[tuple[int, list[list[int]], int]] = collections.deque(maxlen=HISTORY)
        self._history.append((0, [list(p) for p in self.positions], 0))
        self._traces: collections.deque[tuple[int, Any]] = collections.deque(maxlen=HISTORY)  # (step, its pieces)
        self._clock, self._finished = clock, False
        self._items: Any = None  # the batches being served: a reader's generator, or the DataLoader's iterator
        self._wait = self._busy = 0.0
        self._since: float | None = None
        self._warned = False
        self._counts: dict[int, Counter[str]] = {}
        self._packed = Counter[str]()
        self._encode = [0.0, 0]

    def __getstate__(self) -> dict[str, Any]:  # what a DataLoader worker needs: no iterator, no clock
        return {**Augmented.__getstate__(self), "_items": None, "_clock": None}

    def __repr__(self) -> str:
        return (f"StreamBatches({self.stream!r}, shape={self.shape!r}, batch_size={self.batch_size}, "
                f"rank={self.rank}/{self.world_size}, num_workers={self.num_workers}, step={self.step})")  # fmt: skip

    @property
    def batch_size(self) -> int:
        """Rows per step on this rank, at the next step."""
        if self.schedule is None:
            assert self._rows is not None
            return self._rows
        return self.schedule.phase(self.step).global_batch // self.world_size

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    @property
    def seq_len(self) -> int:
        """Tokens per row, at the next step."""
        return int(self.options["seq_len"]) if self.schedule is None else self.schedule.phase(self.step).seq_len

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
        sizes = None if self.schedule is None else functools.partial(reader_sizes, self.schedule, self.workers, local,
                                                                      self.world_size)  # fmt: skip
        for item in self._make(docs, list(self.positions[local]), **({"sizes": sizes} if sizes else {})):
            item["reader"], item["records"] = local, dict(docs.counts)
            item["encode"] = (self.stream.encode_seconds - seconds, self.stream.encoded_tokens - tokens)
            seconds, tokens = self.stream.encode_seconds, self.stream.encoded_tokens
            yield item

    def _agree(self) -> bool:
        return self.world_size > 1 and self.stream.epochs is not None and self.steps_per_epoch is None

    def __iter__(self) -> StreamBatches:
        self.close()  # a loop started again goes on from the positions handed out, in new workers
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
                                                 multiprocessing_context=self.mp_context,
                                                 prefetch_factor=PREFETCH)  # fmt: skip
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
            if self.step == 0:
                raise InputError(f"lmshard.stream: the stream ended before its first batch: this rank's readers hold "
                                 f"fewer than batch_size={self.batch_size} rows of seq_len={self.seq_len} tokens; "
                                 "pass a smaller batch_size or seq_len, more epochs, or more data")  # fmt: skip
            raise StopIteration
        if "error" in item:  # a reader's error, raised in a DataLoader worker
            self.close()
            raise getattr(errors, item["error"], LmshardError)(item["message"])
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
        self._traces.append((step, item.get("trace")))
        self._check_pace()
        dev, fast = self.device, self.device.type == "cuda"
        if self.shape == "windows":
            rows = torch.as_tensor(item["rows"])
            shift = int(item["shift"])
            T = rows.shape[1] - shift  # (the step's seq_len)
            rows = rows.to(dev, non_blocking=fast)
            offsets = np.full(len(rows), -1, dtype=np.int64)
            # x and y contiguous, as a prepared dataset's are: a model may flatten them with view(-1) (nanoGPT's loss)
            batch = Batch(rows[:, :T].contiguous(), rows[:, shift : shift + T].contiguous(), step, shift, offsets)
            return self._augmented(batch, step)
        self._packed["rows"] += len(item["input_ids"])
        self._packed["real_tokens"] += int(item["real_tokens"])
        self._packed.update(item["counts"])
        fields: dict[str, Any] = {k: torch.as_tensor(item[k]).to(dev, non_blocking=fast)
                  for k in ("input_ids", "labels", "position_ids", "cu_seqlens")}  # fmt: skip
        fields["max_seqlen"] = int(item["max_seqlen"])
        return self._augmented(PackedBatch(fields, step), step)

    def _check_pace(self) -> None:
        """Warn once when training spends more than a quarter of its time waiting for batches."""
        total = self._wait + self._busy
        if self._warned or self.step < _WARN_AFTER or not total or self._wait / total < _WARN_SHARE:
            return
        self._warned = True
        from ..errors import warn

        rate = self.metrics()["tokens_per_second_per_reader"]
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        more = f"pass num_workers={min(2 * self.workers, cores - 1)}, or " if cores - 1 > self.num_workers else ""
        warn(f"training waited for batches {self._wait / total:.0%} of the time over {self.step} steps: the stream "
             f"is the bottleneck (tokenizing at {rate:,.0f} tokens/s per reader); {more}prepare the data once with "
             "`lmshard prepare`")  # fmt: skip

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

    def exposure(self, steps: int | None = None) -> Any:
        raise ArgumentError("exposure() needs every step's batch in closed form, which a text stream does not "
                            "have; prepare the data (lmshard prepare) to count it")  # fmt: skip

    def skip(self, start: int, stop: int, mode: str = "data") -> Any:
        raise ArgumentError("skip() needs every step's batch in closed form, which a text stream does not have; "
                            "prepare the data (lmshard prepare), or draw and drop the batches in the loop")  # fmt: skip

    def trace(self, step: int | None = None) -> list[list[DocPiece]]:
        """The documents of each row of a batch this stream handed out (default: the last one; any
        of the last 16), as a prepared dataset's streams trace theirs: each piece's `input` (the
        file, or the Hugging Face shard) and `record` there (prepare's line or row number), the
        tokens of the document it holds (`start`, `end` of `length`) and where they sit in the row
        (`at`). A text stream's batches come from reading, not from a closed form of the step, so
        only batches it has handed out are traced."""
        kept = {s: pieces for s, pieces in self._traces}
        step = self.step - 1 if step is None else checks.nonnegative("step", step)
        if step not in kept or kept[step] is None:
            held = f"steps {min(kept)} .. {max(kept)}" if kept else "no step yet"
            raise ArgumentError(f"step {step}: a text stream traces the batches it handed out, of its last "
                                f"{HISTORY} steps ({held}); call trace() right after the batch you want to know "
                                "about")  # fmt: skip
        shards = self.stream.shards if self.stream.shards is not None else shards_of(self.stream.config)
        names = [s.name for s in shards]
        return [[DocPiece(doc=-1, shard="", index=-1, start=int(a), end=int(b), at=int(at), length=int(n), offset=-1,
                          input=names[int(shard)], record=int(record)) for shard, record, a, b, at, n in row]
                for row in kept[step]]  # fmt: skip

    def state_dict(self, in_hand: int = 0, gather: bool = False, group: Any = None) -> dict[str, Any]:
        """Each reader's position after the last batch handed out, less `in_hand` batches drawn
        but not trained on (at most 16). This rank's readers only, unless `gather`: then every
        process of `group` (default: all of torch.distributed's) must call it at the same step,
        and each gets every stream rank's state, which rank 0 can save alone; `load_state_dict`
        takes either form. Processes that share a stream rank (tensor or pipeline parallel peers
        of one data-parallel rank) give one state; a state that cannot be made on one process
        is raised on every process, so none waits on the others."""
        if not gather:
            return self._own_state(in_hand)
        try:
            own: dict[str, Any] = self._own_state(in_hand)
        except Exception as e:  # (any failure: gathered, so that no process waits for this one)
            own = {"kind": "lmshard.stream.error", "rank": self.rank, "error": str(e) or type(e).__name__}
        return gather_states(own, self.world_size, group)

    def _own_state(self, in_hand: int) -> dict[str, Any]:
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
        names = "\n".join(shard.name for shard in s.shards or [])
        inputs = [i if "://" in i or not os.path.exists(os.path.dirname(i) or ".") else os.path.abspath(i)
                  for i in s.config.inputs]  # fmt: skip
        return {**{k: v for k, v in self.options.items()}, "batch_size": self._rows, "seed": s.seed,
                "shuffle_buffer": s.shuffle_buffer, "epochs": s.epochs, "split": s.split,
                "steps_per_epoch": self.steps_per_epoch, "tokenizer": s.config.tokenizer, "inputs": inputs,
                "hf": s.config.hf, "shards": f"{len(s.shards or [])} ({xxhash.xxh3_64_hexdigest(names.encode())})",
                **{_RENAMED.get(k, k): getattr(s.config, k) for k in _DOCUMENT_OPTIONS},
                "augment": self._hook_name}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict()`: the same rank, world size and num_workers (each reader
        owns its records by them), and the same stream options."""
        try:
            self._load(state)
        except LmshardError:
            raise
        except (KeyError, TypeError, ValueError, IndexError):
            raise ArgumentError("the state is not whole (a key or value is missing or of the wrong type); pass "
                                "what this stream's state_dict() returned") from None

    def _load(self, state: dict[str, Any]) -> None:
        if isinstance(state, dict) and state.get("kind") == "lmshard.stream.ranks":  # state_dict(gather=True)'s
            if state["world_size"] != self.world_size:
                raise ArgumentError(f"the state was saved by {state['world_size']} ranks and this stream has "
                                    f"world_size={self.world_size}: each reader owns its own records, so a stream "
                                    "resumes only with the same world size")  # fmt: skip
            mine: Any = next((s for s in state["ranks"] if s["rank"] == self.rank), None)
            state = mine  # (None: refused below, as not a state)
        if not isinstance(state, dict) or state.get("kind") != "lmshard.stream" or state.get("shape") != self.shape:
            raise ArgumentError(f"not the state of a {self.shape} stream of lmshard.stream; pass what this kind of "
                                "stream's state_dict() returned")  # fmt: skip
        if state["world_size"] == self.world_size and state["rank"] != self.rank:
            raise ArgumentError(
                f"the state was saved on rank {state['rank']} and this stream is rank {self.rank}: each rank owns its "
                "own records, so each rank loads its own state: save state_dict(gather=True) on rank 0 (every rank "
                "calls it; it holds every rank's), or one state_dict() per rank; a state of rank "
                f"{state['rank']} would make this rank read that rank's records")  # fmt: skip
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
        positions = [[int(v) for v in p] for p in state["readers"]]
        if len(positions) != self.workers or any(len(p) != len(_START) or min(p) < 0 for p in positions):
            raise ValueError("readers")
        self.close()
        self.positions = positions
        self._history.clear()
        self._traces.clear()
        self._history.append((self.step, [list(p) for p in self.positions], self.first))
        self._items, self._finished = None, False


def _flag_device() -> torch.device:
    backend = torch.distributed.get_backend()
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
