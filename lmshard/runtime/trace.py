"""Which documents a batch holds: `stream.trace(step)` on random, window, packed and padded
streams, in closed form (the step's reads, mapped onto the split's document index; no batch is
drawn and no token read).

A batch row reads spans of the split's token stream (a random or window row: one span of
seq_len + shift tokens; a packed row: its items one after another; a padded row: one document,
cut at max_len). Each span is cut at document boundaries into `DocPiece`s: the document's number
in the split (stream order, the order `prepare` wrote them), the shard file and its number there,
the piece's tokens within the document and where the piece sits in the row. `decode` gives the
text of a piece with the dataset's tokenizer. `exposure` counts, per document, the rows of the
steps before a given one that held it; `stream_of_state` rebuilds a stream from its state.

Memory model: trace: the pieces of one step's rows, and one shard's document index at a time
(the store's own, memory-mapped); exposure: three int64 per document of the split.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..format import SRC_DTYPE
from . import checks


@dataclass(frozen=True)
class DocPiece:
    """Part of a document in a batch row."""

    doc: int  # the document's number in the split (stream order)
    shard: str  # the shard file that holds it, relative to the dataset
    index: int  # its number within that shard
    start: int  # the piece is tokens [start, end) of the document (separators included)
    end: int
    at: int  # where the piece begins in the row's read (x is the read's first seq_len tokens)
    length: int  # the document's tokens in all
    offset: int = 0  # the piece's first token in the split's stream (`TokenDataset.tokens(offset, n)`)
    source: int = 0  # a mixture's source (its position in the mixture); 0 for one dataset
    input: str = ""  # the input the document came from, as the metadata's sources name it ("": not kept)
    record: int = -1  # its record there: a line, a row (format/provenance.py); -1: not kept

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Audited:
    """`trace(step)` and `exposure(steps)` of a stream (mixed into BatchStream and the packed and
    padded streams), from its `trace_reads(position)` (this rank's rows) and
    `global_reads(position)` (every rank's), over its `store`; steps are the run's step numbers
    (skips.py)."""

    step: int
    store: Any
    kind: str

    def trace_reads(self, position: int) -> tuple[np.ndarray, Any, np.ndarray | None]:
        raise NotImplementedError

    def global_reads(self, position: int) -> tuple[np.ndarray, Any]:
        raise ArgumentError(f"exposure() of {self.kind} streams is not available; trace() each step instead")

    def _position(self, step: int) -> int:
        raise NotImplementedError

    def skipped(self, step: int) -> tuple[int, int] | None:
        return None

    def trace(self, step: int | None = None) -> list[list[DocPiece]]:
        """The documents of this rank's rows at `step` (default: the last batch handed out), as
        `DocPiece`s, row by row: closed form, nothing is drawn or read."""
        if step is None and self.step == 0:
            raise ArgumentError("trace(): no batch handed out yet; pass the step to trace")
        if step is not None and (gone := self.skipped(checks.nonnegative("step", step))) is not None:
            raise ArgumentError(f"step {step} was skipped (steps {gone[0]} .. {gone[1] - 1}, mode='steps'): no "
                                f"batch was handed out as it; the batch after step {gone[0] - 1} is step "
                                f"{gone[1]}'s")  # fmt: skip
        position = self.step - 1 if step is None else self._position(checks.nonnegative("step", step))
        return rows(self.store, *self.trace_reads(position))

    def exposure(self, steps: int | None = None) -> Any:
        """How many rows of steps [0, steps) each document of the split appeared in, all ranks
        together (default: the steps handed out so far), as int64 per document in stream order (a
        mixture of random or window rows: one array per source). Closed form: nothing is drawn or
        read."""
        n = self.step if steps is None else self._position(checks.nonnegative("steps", steps))
        return exposure(self.store, self.global_reads, n)


def pieces(store: Any, start: int, length: int, at: int = 0) -> list[DocPiece]:
    """The documents of tokens [start, start + length) of the split, in order, as pieces (a
    mixture's store: of the source the address is in; a row never crosses a source)."""
    if hasattr(store, "locate"):
        source, local = store.locate(np.array([start]))
        found = pieces(store.stores[int(source[0])], int(local[0]), length, at)
        return [DocPiece(**{**p.to_json(), "source": int(source[0])}) for p in found]
    if hasattr(store, "spans") and hasattr(store, "base"):  # a load-time split: its pieces of the split
        found, at_ = [], at
        for base_start, n in store.spans(int(start), int(length)):
            found += pieces(store.base, base_start, n, at_)
            at_ += n
        return found
    out: list[DocPiece] = []
    docs_before = _docs_before(store)
    pos, end = int(start), int(start) + int(length)
    k = store.shard_of(pos)
    while pos < end:
        base = int(store.starts[k])
        idx = store.index(k)
        i = int(np.searchsorted(idx, pos - base, side="right")) - 1
        if i >= len(idx) - 1:  # the shard's end: the next shard's first document
            k += 1
            continue
        lo, hi = base + int(idx[i]), base + int(idx[i + 1])
        stop = min(end, hi)
        where = _provenance(store, k)
        origin = {} if where is None else {"input": store.source_names[int(where[i]["source"])],
                                           "record": int(where[i]["record"])}  # fmt: skip
        out.append(DocPiece(doc=int(docs_before[k]) + i, shard=store.shards[k].path, index=i, start=pos - lo,
                            end=stop - lo, at=at + pos - int(start), length=hi - lo, offset=pos, **origin))  # fmt: skip
        pos = stop
    return out


def rows(store: Any, starts: np.ndarray, lengths: np.ndarray | int, counts: np.ndarray | None = None,
         ) -> list[list[DocPiece]]:  # fmt: skip
    """Each row's pieces: a row reads `counts[r]` spans one after another (one each when None)."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.broadcast_to(np.asarray(lengths, dtype=np.int64), starts.shape)
    counts = np.ones(len(starts), dtype=np.int64) if counts is None else np.asarray(counts, dtype=np.int64)
    out, item = [], 0
    for n in counts.tolist():
        row: list[DocPiece] = []
        at = 0
        for s, n_tokens in zip(starts[item : item + n].tolist(), lengths[item : item + n].tolist(), strict=True):
            row += pieces(store, s, n_tokens, at)
            at += n_tokens
        out.append(row)
        item += n
    return out


def _provenance(store: Any, k: int) -> np.ndarray | None:
    """Shard k's provenance records (memory-mapped, kept on the store), or None where the dataset
    keeps none (written before it was kept, in memory, or read from a URL)."""
    cache = store.__dict__.setdefault("_trace_src", {})
    if k not in cache:
        shard, root = store.shards[k], getattr(store, "root", None)
        names = getattr(store, "source_names", None)
        path = root / shard.src_path if shard.src_path and root is not None and names else None
        cache[k] = np.memmap(path, dtype=SRC_DTYPE, mode="r") if path is not None and path.is_file() and \
            shard.n_docs else None  # fmt: skip
    return cache[k]


def _docs_before(store: Any) -> np.ndarray:
    """Documents of the split before each shard (cached on the store)."""
    found = getattr(store, "_trace_docs_before", None)
    if found is None:
        counts = [len(store.index(k)) - 1 for k in range(len(store.shards))]
        found = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        store._trace_docs_before = found
    return found


def stream_of_state(data: Any, state: dict[str, Any]) -> Any:
    """The stream a `state_dict()` was saved from, over `data` (a TokenDataset), as one rank
    holding the whole global batch (rank r's rows are rows r·B .. (r+1)·B - 1 of it), for
    random, window, packed and padded states: what `lmshard trace` reads a state with. The
    state's own checks apply (loaded onto the stream: other data is refused, the split grown
    since is continued on, runtime/growth.py)."""
    from ..errors import ArgumentError

    if not isinstance(state, dict) or "kind" not in state:
        raise ArgumentError("not a loader state: pass what a stream's state_dict() returned (a dict with 'kind')")
    kind, g = str(state["kind"]), state.get("global_batch_size")
    if kind == "lmshard.stream" or "ranks" in state:
        raise ArgumentError("this is the state of a text stream (lmshard.stream): its batches come from reading, not "
                            "from a closed form of the step, so it is traced in the training loop, batches.trace() "
                            "right after a batch; prepare the data to trace any step from a state")  # fmt: skip
    if kind.startswith("mixture/"):
        raise ArgumentError(f"this is the state of a mixture ({kind}): trace it in Python, on the stream the run "
                            "built (Mixture(...).window_batches(...) etc.): stream.load_state_dict(state), then "
                            "stream.trace(step)")  # fmt: skip
    if not isinstance(g, int) or g < 1:
        raise ArgumentError(f"the {kind} state has no global_batch_size; pass what a stream's state_dict() returned")
    # the run's shape: its schedule, else one batch shape; and the order it drew in
    shape = {"schedule": state["schedule"]} if "schedule" in state else {"batch_size": g, "seq_len": state["seq_len"]}
    order = {"order": state.get("order", "steps"), "rank": 0, "world_size": 1}
    if kind == "random":
        stream = data.random_batches(**shape, seed=state["seed"], shift=state.get("shift", 1),
                                     doc_aligned=state.get("doc_aligned", False), **order)  # fmt: skip
    elif kind.startswith("windows/"):
        stride = kind.split("/", 1)[1]
        stream = data.window_batches(**shape, stride=None if stride == "auto" else int(stride), seed=state["seed"],
                                     shift=state.get("shift", 1), shuffle=state.get("shuffle", True),
                                     **order)  # fmt: skip
    elif kind == "packed":
        packed_shape = {"schedule": state["schedule"]} if "schedule" in state else {"batch_size": g}
        stream = data.packed(state["seq_len"], strategy=state["strategy"], overlong=state["overlong"],
                             seed=state["seed"], shuffle=state.get("shuffle", True),
                             multiple=state.get("multiple", 1)).batches(**packed_shape, **order)  # fmt: skip
    elif kind == "padded":
        stream = data.padded_batches(g, state["max_len"], seed=state["seed"], group_by_length=state["group_by_length"],
                                     mega=state["mega"], overlong=state["overlong"], rank=0, world_size=1)  # fmt: skip
    else:
        raise ArgumentError(f"trace reads random, window, packed and padded states; this one is {kind!r}")
    # grown="continue": a state saved before an --append traces on the grown split too (its past
    # steps keep their batches; the steps after it are those a continued run draws)
    state = {k: v for k, v in state.items() if k != "augment"}  # a hook changes tokens, not which documents
    try:
        stream.load_state_dict({**state, "world_size": 1} if "world_size" in state else state, grown="continue")
    except ArgumentError as e:
        raise ArgumentError(str(e).replace("cannot resume:", "cannot trace the state:", 1)) from None
    return stream


def exposure(store: Any, reads: Any, steps: int) -> np.ndarray | list[np.ndarray]:
    """How many rows of global steps [0, steps) each document of the split appears in (any of its
    tokens in a row's read), as int64 per document in stream order; `reads(step)` gives the step's
    (starts, lengths) over the whole global batch. A mixture's store gives one array per source.
    One pass over the steps' row offsets: no token is read. Memory: three int64 per document."""
    stores = list(store.stores) if hasattr(store, "locate") else [store]
    starts_of = [_doc_starts(s) for s in stores]
    diffs = [np.zeros(len(s) + 1, dtype=np.int64) for s in starts_of]
    for step in range(int(steps)):
        begin, length = reads(step)
        begin = np.asarray(begin, dtype=np.int64)
        end = begin + np.broadcast_to(np.asarray(length, dtype=np.int64), begin.shape) - 1  # last token read
        source = np.zeros(len(begin), dtype=np.int64)
        if hasattr(store, "locate"):  # (a mixture: addresses within each source; a row never crosses one)
            source, local = store.locate(begin)
            begin, end = local, end - store.bases[source]
        for s in np.unique(source).tolist():
            mine = source == s
            first = np.searchsorted(starts_of[s], begin[mine], side="right") - 1
            last = np.searchsorted(starts_of[s], end[mine], side="right") - 1
            np.add.at(diffs[s], first, 1)
            np.add.at(diffs[s], last + 1, -1)
    out = [np.cumsum(d)[:-1] for d in diffs]
    return out if hasattr(store, "locate") else out[0]


def _doc_starts(store: Any) -> np.ndarray:
    """Every document's first token in the split's stream (int64, stream order)."""
    parts = [int(store.starts[k]) + np.asarray(store.index(k)[:-1], dtype=np.int64) for k in range(len(store.shards))]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
