"""`lmshard retokenize --num-tasks N`: a retokenize as N tasks of two stages and a finish, on any
engine (the local pool, Slurm arrays, Ray, or `lmshard run-task` under any "task i of N"
scheduler), writing the bytes a one-process retokenize writes.

**Plan** (`plan`, once): the source and the vocabulary checked as a one-process run checks them,
`--out` claimed, and the plan written (rewrite.py: the units are the source's shards that hold
documents, in order, train's then val's; the head records the options and the new vocabulary's
sha256, which every task holds its vocabulary to). Task t has units [t·U/N, (t+1)·U/N).

1. **encode** (per task: its units): each source shard held to its checksums and decoded,
   every document's text held to its stored tokens, encoded with the new vocabulary (in a pool
   of the task's own with `--workers`), its tokens with separators written to
   `encode/unit_U.tokens` and its lengths to `unit_U.lengths`, then `unit_U.json` (docs, tokens:
   the unit's marker) last. The tasks fold their units' rows into the stage's summary
   (prepare's barrier.py), and the task that completes it lays out the shards: per split, each
   closes before a document that would take it past --tokens-per-shard (ShardWriter's rule), found
   from the units' totals, opening only the units a boundary falls in. `layout.i64` holds a row
   per new shard (split, number, first unit and document, last unit and end document).
2. **write** (per task: its share of the new shards, and of the source's key files, copied and
   checked): each shard written whole by one task from the units' files, with the source's
   provenance and attribute records, into `build/`; its entry (`write/piece_P.json`) last.
3. **finish** (once): the metadata from the write stage's summary (the entries), then `build/`
   swapped into `--out` (an old one renamed aside first, removed last) and the work folder removed.

Every item writes under a temporary name and its marker last, so a task killed anywhere is
finished by running it again; a task checks that the stage before it is complete from one file
(rewrite.py's `Planned.run`).

Cost per task, whatever the plan's size (scripts/bench_retokenize_tasks.py counts it): the
plan's head and the source's head, its own rows of the tables; an encode task reads its shards
and writes 4 bytes per new token and 8 per document; a write task reads the layout rows of its
shards, the encoded tokens, lengths and records they hold, and writes the shards; then removes
its items' markers and the encoded units only its shards read (`tidy`). Once-steps: the plan
(the source's metadata, a row per source shard), the layout (the stage's summary, 3 integers per
source shard, and the lengths of the shards a boundary falls in), and the finish (the source's
metadata, the write summary, an entry per new shard; what is left of the work folder: a few
files per task).

Memory model, per task: an encode task holds one shard's index and up to 2 × workers blocks
(the one-process run's); a write task one unit's lengths, tokens read as they are written (one
part at a time) and one source shard's provenance and attribute records; the task that lays out
the shards, the units' rows (2 integers each) and one unit's lengths.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, InputError
from ..format import (
    SPLITS,
    TOKEN_DTYPE,
    ShardInfo,
    atomic_write_bytes,
    atomic_write_json,
    check_shard_files,
    load_metadata,
)
from ..prepare.execution.barrier import read_summary
from ..prepare.execution.taskplan import work_dir
from ..prepare.stops import stop_point
from .convert import copy_checked
from .retokenize import Setup, attribute_records, encoder, numbered_blocks, per_doc_records, setup, write_metadata
from .rewrite import Planned, claim, read_head

LAYOUT_FILE = "layout.i64"  # a row per new shard: split, number, first unit, its first doc, last unit, end doc
ROW_BYTES = 6 * 8
OPTIONS = ("tokenizer", "tokenizer_backend", "shard_encoding", "tokens_per_shard", "separator", "bos")


def plan(dataset: str | os.PathLike[str], out: str | os.PathLike[str], n_tasks: int, *, overwrite: bool = False,
         **options: Any) -> None:  # fmt: skip
    """Check the source and the vocabulary, claim `out` and write the plan (module docstring);
    the same plan again goes on from what is done. `options`: OPTIONS, as retokenize_dataset takes."""
    if n_tasks < 1:
        raise ConfigError(f"--num-tasks {n_tasks}: pass 1 or more")
    given: dict[str, Any] = {k: options[k] for k in OPTIONS[1:] if options.get(k) is not None}
    s = setup(dataset, options["tokenizer"], out, workers=1, **given)
    tokenizer = options["tokenizer"]  # a file or folder by its absolute path: a task may start elsewhere
    resolved = {"tokenizer": os.path.abspath(tokenizer) if os.path.exists(tokenizer) else tokenizer,
                **{k: getattr(s.config, k) for k in OPTIONS[1:]}}  # fmt: skip
    target = Path(os.path.realpath(out))
    head = {"kind": "retokenize", "n_tasks": n_tasks, "overwrite": overwrite, "vocabulary": _vocabulary(s),
            "options": resolved}  # fmt: skip
    claim(work_dir(target), head, s.meta, s.units(), target, overwrite)


def _vocabulary(s: Setup) -> list[Any]:
    """What pins the new vocabulary's bytes: its file's sha256, and its separators as resolved (a
    tokenizer's configuration can change them under the same file)."""
    return [s.new.vocab_sha256, s.new.eot_id, s.bos]


@dataclasses.dataclass
class Tasks(Planned):
    """A planned retokenize: what every task works from."""

    STAGES: ClassVar[tuple[str, ...]] = ("encode", "write", "finish")
    MARKERS: ClassVar[dict[str, str]] = {"encode": "unit_{:06d}.json", "write": "piece_{:06d}.json"}
    s: Setup  # the source and the new vocabulary

    @classmethod
    def of(cls, out: str | os.PathLike[str], workers: int = 1) -> Tasks:
        """The plan in `out`'s work folder, held to the source and the vocabulary it was made with
        (`workers`: processes that encode a task's blocks)."""
        work, head, meta = read_head(out, "retokenize")
        options = {k: v for k, v in head["options"].items() if v is not None and k != "tokenizer"}
        s = setup(head["dataset"], head["options"]["tokenizer"], os.path.realpath(out), workers=workers, meta=meta,
                  **options)  # fmt: skip
        if _vocabulary(s) != head["vocabulary"]:
            raise ConfigError(f"{head['options']['tokenizer']}: the vocabulary (its file, or its end-of-text or BOS "
                              f"token) changed since the retokenize was planned; restore it, or remove {work} and "
                              "plan again")  # fmt: skip
        return cls(work, head, meta, s)

    def unit(self, u: int) -> ShardInfo:
        return self.units(range(u, u + 1))[0][2]

    def after(self, stage: str) -> None:
        """After the encode stage, the layout (once, by the task that completes it)."""
        if stage == "encode":
            self.lay_out()

    def tidy(self, stage: str, task: int) -> None:
        """As every rewrite's (its items' markers), and after the write stage the encoded units
        only this task's shards read (a unit read by a neighbour's shard too is left to the finish)."""
        super().tidy(stage, task)
        if stage != "write":
            return
        n_pieces = self.n_pieces()
        mine = self.share(n_pieces, task)
        if not mine:
            return
        lo, hi = max(0, mine.start - 1), min(n_pieces, mine.stop + 1)  # with a neighbour's shard each side
        rows = self.pieces(range(lo, hi))
        first, last = int(rows[mine.start - lo][2]), int(rows[mine.stop - 1 - lo][4])
        if lo < mine.start and int(rows[0][4]) == first:
            first += 1  # (the shard before ends in it)
        if hi > mine.stop and int(rows[-1][2]) == last:
            last -= 1  # (the shard after starts in it)
        for u in range(first, last + 1):
            for suffix in ("tokens", "lengths"):
                (self.work / "encode" / f"unit_{u:06d}.{suffix}").unlink(missing_ok=True)

    def totals(self) -> dict[str, int | None]:
        return {"encode": self.n_units, "write": self.n_pieces() if (self.work / LAYOUT_FILE).exists() else None}

    def n_pieces(self) -> int:
        """The new shards, from the layout's size."""
        return (self.work / LAYOUT_FILE).stat().st_size // ROW_BYTES

    def pieces(self, rows: range) -> np.ndarray:
        """Rows `rows` of the layout (6 integers each), read alone."""
        return np.fromfile(self.work / LAYOUT_FILE, dtype="<i8", count=6 * len(rows),
                           offset=rows.start * ROW_BYTES).reshape(-1, 6)  # fmt: skip

    # -- encode --------------------------------------------------------------------------------

    def encode(self, task: int) -> dict[str, Any]:
        mine = self.share(self.n_units, task)
        rows = []
        folder = self.work / "encode"
        todo = any(not (folder / f"unit_{u:06d}.json").exists() for u in mine)  # (else no pool is started)
        with encoder(self.s, self.s.config.n_workers() if todo else 1) as encoded:
            for u, (split, first, shard) in zip(mine, self.units(mine), strict=True):
                marker = folder / f"unit_{u:06d}.json"
                if not marker.exists():
                    row = _encode_unit(self.s, shard, folder / f"unit_{u:06d}",
                                       encoded(numbered_blocks(self.meta, shard, split, first)))  # fmt: skip
                    atomic_write_json(marker, row)
                    stop_point("unit", u)
                rows.append([SPLITS.index(split), *json.loads(marker.read_text()).values()])
        return {"rows": rows}

    def lay_out(self) -> None:
        """The new shards' rows (module docstring), written once the encode stage is complete."""
        rows = read_summary(self.work, "encode")["rows"]  # per unit: split, documents, tokens
        capacity = self.s.config.tokens_per_shard
        pieces: list[list[int]] = []
        for code in range(len(SPLITS)):
            mine = [u for u, row in enumerate(rows) if row[0] == code]
            number, start, filled = 0, None, 0  # the open shard's number, first (unit, doc), tokens
            for u in mine:
                _, docs, tokens = rows[u]
                if start is None:
                    start = (u, 0)
                if filled + tokens <= capacity:  # the rest of the unit fits in the open shard
                    filled += tokens
                    continue
                ends = np.cumsum(np.fromfile(self.work / "encode" / f"unit_{u:06d}.lengths", dtype=np.int64))
                d = 0
                while d < docs:
                    before = int(ends[d - 1]) if d else 0  # (the unit's tokens before document d)
                    fit = int(np.searchsorted(ends[d:], before + capacity - filled, side="right"))
                    if fit == 0 and filled == 0:
                        fit = 1  # a document longer than a shard gets a shard of its own
                    if fit == 0 or d + fit < docs:  # the shard closes before document d + fit
                        d += fit
                        pieces.append([code, number, *start, u, d])
                        number, start, filled = number + 1, (u, d), 0
                    else:
                        filled += int(ends[-1]) - before
                        d = docs
            if start is not None:
                pieces.append([code, number, *start, mine[-1], rows[mine[-1]][1]])
        atomic_write_bytes(self.work / LAYOUT_FILE, np.asarray(pieces, dtype="<i8").reshape(-1, 6).tobytes())

    # -- write ---------------------------------------------------------------------------------

    def write(self, task: int) -> dict[str, Any]:
        if not (self.work / LAYOUT_FILE).exists():  # the task that completed the encode stage stopped before it
            try:
                self.lay_out()
            except FileNotFoundError:  # a unit tidied away: another task laid it out and wrote its shards meanwhile
                if not (self.work / LAYOUT_FILE).exists():
                    raise
        mine = self.share(self.n_pieces(), task)
        table = self.pieces(mine)
        folder = self.work / "write"
        for key in self.keys(task):
            copy_checked(self.meta, key["path"], self.work / "build", key["xxh3_64"])  # (of the text: any vocabulary)
        entries = []
        records = _Records(self)
        for p, row in zip(mine, table, strict=True):
            marker = folder / f"piece_{p:06d}.json"
            if not marker.exists():
                atomic_write_json(marker, self._write_piece(row, records).to_json())
                stop_point("piece", p)
            entries.append([SPLITS[int(row[0])], json.loads(marker.read_text())])
        return {"rows": entries}

    def _write_piece(self, row: np.ndarray, records: _Records) -> ShardInfo:
        code, number, u0, d0, u1, d1 = (int(x) for x in row)
        writer = self.s.writer(self.work / "build", SPLITS[code], number)
        for u in range(u0, u1 + 1):
            if u == u1 and d1 == 0:
                continue  # (the shard closed before the unit's first document)
            base = self.work / "encode" / f"unit_{u:06d}"
            lengths = np.fromfile(f"{base}.lengths", dtype=np.int64)
            lo, hi = d0 if u == u0 else 0, d1 if u == u1 else len(lengths)
            starts = np.concatenate([[0], np.cumsum(lengths)])
            tokens = np.fromfile(f"{base}.tokens", dtype=TOKEN_DTYPE, count=int(starts[hi] - starts[lo]),
                                 offset=int(starts[lo]) * TOKEN_DTYPE.itemsize)  # fmt: skip
            src, attrs = records.of(u)
            writer.add(tokens, lengths[lo:hi], src[lo:hi], None if attrs is None else attrs[lo:hi])
        shards = writer.close()
        if len(shards) != 1:
            raise InputError(f"{self.work}: shard {number} of {SPLITS[code]} came out as {len(shards)} shards, not as "
                             "laid out; remove the work folder and plan again")  # fmt: skip
        return shards[0]

    # -- finish --------------------------------------------------------------------------------

    def metadata(self, build: Path, rows: list[Any]) -> int:
        """The vocabulary, tokenizer state and metadata, from the source's whole metadata (its
        counts, keys and inputs) and the write stage's entries."""
        shards = tuple(ShardInfo.parse(split, entry) for split, entry in rows)
        write_metadata(dataclasses.replace(self.s, meta=load_metadata(self.head["dataset"])), build, shards)
        return len(shards)


class _Records:
    """The provenance and attribute records of the source shard last asked for (a write task's
    parts come unit after unit)."""

    def __init__(self, tasks: Tasks) -> None:
        self.tasks, self.unit = tasks, -1
        self.held: tuple[np.ndarray, np.ndarray | None] = (np.zeros(0), None)

    def of(self, u: int) -> tuple[np.ndarray, np.ndarray | None]:
        from ..format.provenance import SRC_DTYPE

        if u != self.unit:
            meta, shard = self.tasks.meta, self.tasks.unit(u)
            src = per_doc_records(meta, shard, shard.src_path, shard.src_xxh3_64, SRC_DTYPE)
            self.unit, self.held = u, (src, None if not meta.attributes else attribute_records(meta, shard))
        return self.held


def _encode_unit(s: Setup, shard: ShardInfo, base: Path, encoded: Any) -> dict[str, int]:
    """A source shard's documents encoded into `base`.tokens and `base`.lengths; its row."""
    from .retokenize import _check_source

    check_shard_files(s.meta.root, shard)
    _check_source(s.meta, shard)
    lengths, tmp = [], f"{base}.tokens.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        for tokens, lens in encoded:
            f.write(np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE).tobytes())
            lengths.append(lens)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, f"{base}.tokens")
    joined = np.concatenate(lengths).astype(np.int64) if lengths else np.zeros(0, np.int64)
    atomic_write_bytes(Path(f"{base}.lengths"), joined.tobytes())
    if len(joined) != shard.n_docs:
        raise InputError(f"{s.meta.abspath(shard.path)}: {len(joined)} documents read, {shard.n_docs} in the metadata")
    return {"docs": len(joined), "tokens": int(joined.sum())}
