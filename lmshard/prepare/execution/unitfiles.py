"""The tokenize stage's results on disk: a unit's documents as arrays, written by the task that
tokenizes it, read by the stages after.

Two files per unit in `WORK/tokenize/`. `unit_NNNNNN.bin`: a header (the magic `LMSUNIT3` and
the byte offset of each section, then the end, as little-endian uint64), then the sections:
`tokens` (uint32 of every document with its separators, EOT and BOS as the dataset holds them,
back to back: a shard's writer copies runs of them as they are), `lengths` (int64, without the
separators), `keys` (uint64), `sources` (int32); with --near-dedup, `sigs` (each document's
MinHash signature, n_hashes uint32); with --dedup-lines, `lines` (the keys of the unit's lines
met first here, in order: linestage.py); `numbers` (int64: each document's record number, its
line or row, counted from the unit's start for a byte range: linenumbers.py makes it absolute);
with --attribute, `attrs` (each document's attribute record, format/attributes.py); with
--val-by FIELD, `domains` (each document's domain, the xxh3-64 of its label: valby.py).
The task that tokenized the units then gathers their keys,
partitioned by dedup bucket, into one file of its own (keyfiles.py). The data file is written
under a temporary name, fsynced (but on the local executor: volatile.py) and renamed; then
`unit_NNNNNN.done` (JSON: per item its document and token counts, per-source counts, drop
examples, characters and bytes; the unit's totals; for a byte range, where the next range's line
numbers begin), so a unit is complete exactly when its marker exists, and a killed task is
finished by running it again (done units are skipped). Two files and two fsyncs per unit (none on
the local executor).

Memory model: one work item's result at a time (≈1 MiB of text and its tokens; a unit spread
over a pool's workers: what `spread` holds in flight, itempool.py) and the unit's per-document
arrays (20 bytes per document; with --near-dedup 4 × n_hashes more) until they are written after
its tokens.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ...errors import InputError, LmshardError
from ...format import atomic_file
from ...quality.minhash import MinHashConfig
from ...tokenizers import Tokenizer
from ..config import PrepareConfig
from ..documents.hfread import shard_records
from ..documents.records import record_fields
from ..documents.sources import Source, WorkItem
from ..documents.worker import ItemResult, WorkerConfig, run_item
from ..domains import check_labels, field_of, label_keys
from ..output.claim import bos_written
from ..output.writer import with_separators
from ..stops import stop_point
from . import volatile
from .linenumbers import RELATIVE, known_first_line, tag
from .plantables import pread_all
from .taskplan import work_dir
from .units import Unit, count_newlines, unit_items

LineMasks = tuple[list[tuple[bytes, int]], np.ndarray]  # per item its lines' keep-bits and count; the kept keys

SECTIONS = ("tokens", "lengths", "keys", "sources", "sigs", "lines", "numbers", "attrs", "domains")
DTYPES = {"tokens": "<u4", "lengths": "<i8", "keys": "<u8", "sources": "<i4", "sigs": "<u4", "lines": "<u8",
          "numbers": "<i8", "attrs": "u1", "domains": "<u8"}  # fmt: skip
_MAGIC = b"LMSUNIT7"
_HEADER = 8 + 8 * (len(SECTIONS) + 1)  # the magic, then where each section starts, then the end


class Abandoned(Exception):
    """A unit given up between two of its work items (`stop.abandoned()`): nothing of it written."""


def tokenize_unit(config: PrepareConfig, plan: dict[str, Any], sources: list[Source], tokenizer: Tokenizer,
                  wcfg: WorkerConfig, u: int, line_masks: Callable[[int], LineMasks] | None = None,
                  stop: Any = None, spread: Callable[[Iterator[WorkItem]], Iterator[ItemResult]] | None = None,
                  ) -> bool:  # fmt: skip
    """Tokenize unit `u` unless its marker exists; True when it ran. `line_masks(u)`
    (--dedup-lines): per work item of the unit its lines' keep-bits, and the keys of the lines
    it keeps (linestage.py). `stop` (--max-docs on one machine, maxdocs.UnitStop): the unit
    ends after the work item where `stop.enough(keys)` says so (its marker says `stopped`), and
    is given up (Abandoned) before any item once `stop.abandoned()`. `spread`: how the unit's
    work items, read here, are tokenized, their results in order (itempool.spread: by every
    worker of a pool; local_exec: here, each counted for the progress as it is done); else each
    is tokenized here as it is read. A stop acts on the
    results in order: the items read ahead after the one it ends at count for nothing (their
    errors are not raised), as in one reading process."""
    unit = open_unit(config, plan, sources, tokenizer, wcfg, u, line_masks, stop)
    if unit is None:
        return False
    items = unit.items()
    unit.write(spread(items) if spread is not None else (run_item(item, wcfg, tokenizer) for item in items))
    return True


def open_unit(config: PrepareConfig, plan: dict[str, Any], sources: list[Source], tokenizer: Tokenizer,
              wcfg: WorkerConfig, u: int, line_masks: Callable[[int], LineMasks] | None = None,
              stop: Any = None) -> UnitRead | None:  # fmt: skip
    """Unit `u` opened to be tokenized (`tokenize_unit`), or None when its marker exists."""
    out = work_dir(config.out) / "tokenize"
    if (out / f"unit_{u:06d}.done").exists():
        return None
    return UnitRead(config, plan, sources, tokenizer, wcfg, u, out, line_masks, stop)


class UnitRead:
    """A unit being tokenized: its work items as they are read (`items`), each one's newlines
    (a shard's records) counted as its result is taken; `write(results)`, the results in order,
    writes its data file and then its marker. Where its first line is not known when it is
    opened (the unit before it not done), its records are numbered from its own start
    (linenumbers.py)."""

    def __init__(self, config: PrepareConfig, plan: dict[str, Any], sources: list[Source], tokenizer: Tokenizer,
                 wcfg: WorkerConfig, u: int, out: Path, line_masks: Callable[[int], LineMasks] | None,
                 stop: Any) -> None:  # fmt: skip
        self.config, self.plan, self.sources, self.tokenizer, self.wcfg = config, plan, sources, tokenizer, wcfg
        self.u, self.out, self.stop = u, out, stop
        masks: Any = line_masks(u) if line_masks is not None else (None, None)
        self.masks, self.fresh = masks
        unit = load_unit(plan, u)
        self.relative = unit.kind in RELATIVE
        self.base = known_first_line(out, plan, u) if self.relative else 1
        self.unit = replace(unit, first_line=self.base or 1)  # not known yet: numbered from the unit's start
        self.lines: dict[str, int] = {"lines": 0}  # newlines of a range (counted in its blocks), records of a shard
        self.pending: deque[int] = deque()  # the newlines (records) of each item read, counted as its result is taken

    def _work_items(self, unit: Unit) -> Iterator[WorkItem]:
        c = self.config
        items = unit_items(self.sources, unit, c.text_mode, record_fields(c.text_field, c.val_by), c.max_chars,
                           self.wcfg.hf)  # fmt: skip
        if self.masks is None:
            return items
        return (replace(item, line_keep=keep) for item, keep in zip(items, self.masks, strict=True))  # (the same)

    def items(self) -> Iterator[WorkItem]:
        unit = self.unit
        for item in self._work_items(unit):
            if self.stop is not None and self.stop.abandoned():
                raise Abandoned(self.u)
            ranged = item.kind == "lines" and unit.kind == "range"
            self.pending.append(item.payload.count(b"\n") if ranged else len(item.payload) if unit.kind == "shard"
                                else 0)  # fmt: skip
            yield item

    def _results(self, tokenized: Iterator[ItemResult]) -> Iterator[ItemResult]:
        base, stop, lines = self.base, self.stop, self.lines
        for r in tokenized:
            lines["lines"] += self.pending.popleft()
            yield r if base is not None else replace(r, examples=tag(r.examples, self.u))
            stop_point("item")  # (its result written to the unit's file; the unit has no marker yet)
            if stop is not None and stop.enough(r.keys):  # (the rest of the unit is after the N-th kept document)
                lines["stopped"] = 1
                return
        if self.relative and base is not None:  # where the next range's lines (or shard's records) begin
            lines["next_line"] = base + lines["lines"]

    def write(self, tokenized: Iterator[ItemResult]) -> None:
        c, out, u, base, unit = self.config, self.out, self.u, self.base, self.unit
        separators = (self.tokenizer.eot_id, c.eot_position, bos_written(c, self.tokenizer))
        try:
            _write_unit(out, u, self._results(tokenized), self.lines, separators, self.wcfg.minhash, self.fresh,
                        (base or 1) - 1, field_of(c.val_by))  # fmt: skip
        except BaseException as e:
            if isinstance(e, InputError) and base is None:  # stopping: named at its absolute line, as one process does
                line = first_line(out, self.plan, self.sources[unit.source], u, self.wcfg.hf)
                for item in self._work_items(replace(unit, first_line=line)):
                    run_item(item, self.wcfg, self.tokenizer)  # (its lines removed as before: the same record fails)
            raise
        stop_point("unit", u)


def skip_unit(config: PrepareConfig, tokenizer: Tokenizer, wcfg: WorkerConfig, u: int,
              line_masks: Callable[[int], LineMasks]) -> None:  # fmt: skip
    """Unit u's results as a unit of no documents that keeps the keys of the lines met first in
    it, written without reading it: a --max-docs --dedup-lines run on one machine that has its N
    documents in the units before (maxdocs.EarlyStop; the dataset's line key files hold every
    line hashed). Without --dedup-lines such a unit has no files (`Run.unread`)."""
    out = work_dir(config.out) / "tokenize"
    fresh = line_masks(u)[1]
    separators = (tokenizer.eot_id, config.eot_position, bos_written(config, tokenizer))
    _write_unit(out, u, iter(()), {"lines": 0, "skipped": 1}, separators, wcfg.minhash, fresh)


def first_line(tokenized: Path, plan: dict[str, Any], src: Source, u: int, hf: Any = None) -> int:
    """The number of range unit u's first line in its file (of shard unit u's first record in
    its stream): counted on from the nearest earlier unit of the same source already tokenized
    (its marker records where the next one begins), else from the source's start. Only for a unit
    that stops the run (linenumbers.py): a run that goes on never reads outside its units."""
    units = plan["units"]
    start = units[u][2]

    def count(a: int, b: int) -> int:  # newlines in bytes [a, b), or records in shards [a, b)
        if units[u][1] == "shard":
            return sum(1 for s in range(a, b) for _ in shard_records(hf, s, units[u][3]))
        return count_newlines(src, a, b)

    for v in range(u - 1, -1, -1):
        if units[v][0] != units[u][0] or units[v][1] != units[u][1]:
            break
        try:
            line = int(json.loads((tokenized / f"unit_{v:06d}.done").read_text())["next_line"])
        except (OSError, ValueError, KeyError):
            continue
        return line + count(units[v][3] if units[u][1] == "range" else units[v][2] + 1, start)
    return 1 + count(0, start)


def load_unit(plan: dict[str, Any], u: int) -> Unit:
    return Unit(*plan["units"][u])


def _write_unit(out: Path, u: int, results: Iterator[ItemResult], lines: dict[str, int],
                separators: tuple[int, str, int | None], minhash: MinHashConfig | None = None,
                line_keys: np.ndarray | None = None, lines_before: int = 0,
                field: str | None = None) -> None:  # fmt: skip
    """`lines_before`: what the unit's record numbers start after (its records are numbered from
    its own start in the `numbers` section); `field`: --val-by FIELD's (its documents' domains)."""
    # (a unit given up or failed leaves no file; a copy of the task running at once writes a file of its own)
    with atomic_file(out / f"unit_{u:06d}.bin", volatile.sync) as f:
        table, labels = _unit_data(f, u, results, separators, minhash, line_keys, lines_before, field)
    totals = {name: sum(row[name] for row in table) for name in ("docs", "tokens", "chars")}
    domains = {"labels": sorted(labels)} if labels is not None else {}
    volatile.write_json(out / f"unit_{u:06d}.done", {"items": len(table), **totals, **lines, **domains, "table": table})


def _unit_data(f: BinaryIO, u: int, results: Iterator[ItemResult], separators: tuple[int, str, int | None],
               minhash: MinHashConfig | None, line_keys: np.ndarray | None, lines_before: int,
               field: str | None) -> tuple[list[dict[str, Any]], set[str] | None]:  # fmt: skip
    """Unit u's data file written to `f`: its item table, and its domains (None without
    --val-by FIELD's)."""
    table: list[dict[str, Any]] = []
    small: dict[str, list[np.ndarray]] = {"lengths": [], "keys": [], "sources": [], "sigs": [], "numbers": [],
                                          "attrs": [], "domains": []}  # fmt: skip
    labels: set[str] = set()  # --val-by FIELD: the unit's domains
    f.write(bytes(_HEADER))
    for r in results:  # tokens stream to the file; 20 bytes per document are kept for the sections after
        tokens, _ = with_separators(r.tokens, r.lengths, np.ones(len(r.lengths), bool), *separators)
        f.write(np.ascontiguousarray(tokens, dtype="<u4").data.cast("B"))
        for name, array in (("lengths", r.lengths), ("keys", r.keys), ("sources", r.doc_sources)):
            small[name].append(np.asarray(array, dtype=DTYPES[name]))
        if minhash is not None:
            assert r.signatures is not None
            small["sigs"].append(r.signatures)
        if r.numbers is not None:
            small["numbers"].append(r.numbers - lines_before)
        if r.attrs is not None:
            small["attrs"].append(np.frombuffer(np.ascontiguousarray(r.attrs).tobytes(), np.uint8))
        if r.domains is not None:
            small["domains"].append(label_keys(r.domains))
            labels.update(r.domains)
            check_labels(labels, field, f"unit {u}")
        table.append({"docs": len(r.lengths), "tokens": int(r.lengths.sum()), "chars": r.chars,
                      "nbytes": r.nbytes, "seq": list(r.seq), "examples": r.examples,
                      "counts": {str(k): dict(v) for k, v in r.counts.items()}})  # fmt: skip
    starts = [_HEADER]
    arrays = {name: np.concatenate(parts) if parts else np.zeros(0, DTYPES[name]) for name, parts in small.items()}
    for name in SECTIONS[1:4]:
        starts.append(f.tell())
        f.write(arrays[name].data.cast("B"))
    starts.append(f.tell())
    if minhash is not None:
        sigs = arrays["sigs"].reshape(-1, minhash.n_hashes)
        f.write(np.ascontiguousarray(sigs, dtype="<u4").tobytes())
    starts.append(f.tell())
    if line_keys is not None:
        f.write(np.ascontiguousarray(line_keys, dtype="<u8").tobytes())
    starts.append(f.tell())
    f.write(arrays["numbers"].data.cast("B"))
    starts.append(f.tell())
    f.write(arrays["attrs"].data.cast("B"))
    starts.append(f.tell())
    f.write(arrays["domains"].data.cast("B"))
    starts.append(f.tell())
    f.seek(0)
    f.write(_MAGIC + np.array(starts, dtype="<u8").tobytes())
    return table, labels if small["domains"] else None


def sections(tokenized: Path, u: int) -> dict[str, tuple[int, int]]:
    """Where each section of unit u's data file is: {name: (byte offset, bytes)}."""
    fd = os.open(tokenized / f"unit_{u:06d}.bin", os.O_RDONLY)
    try:
        return sections_of(fd, tokenized / f"unit_{u:06d}.bin")
    finally:
        os.close(fd)


def sections_of(fd: int, path: Path) -> dict[str, tuple[int, int]]:
    """`sections` of the unit data file open as `fd` (named `path` in an error)."""
    head = os.pread(fd, _HEADER, 0)
    if head[:8] != _MAGIC:
        raise LmshardError(f"{path}: not a unit data file of this lmshard version (the run was started by another); "
                          "finish it with the version that started it, or start again with --overwrite")  # fmt: skip
    at = np.frombuffer(head[8:], dtype="<u8", count=len(SECTIONS) + 1).astype(int).tolist()
    return {name: (at[i], at[i + 1] - at[i]) for i, name in enumerate(SECTIONS)}


def section_of(fd: int, where: dict[str, tuple[int, int]], name: str) -> np.ndarray:
    """Section `name` of the unit data file open as `fd`, whose sections are `where`."""
    offset, nbytes = where[name]
    return np.frombuffer(pread_all(fd, nbytes, offset), dtype=np.dtype(DTYPES[name])).copy()


def read_section(tokenized: Path, u: int, name: str) -> np.ndarray:
    """One of unit u's per-document arrays (lengths, keys, sources), read whole: one open."""
    return read_sections(tokenized, u, (name,))[name]


def read_sections(tokenized: Path, u: int, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Sections `names` of unit u's data file, read whole from one open."""
    path = tokenized / f"unit_{u:06d}.bin"
    fd = os.open(path, os.O_RDONLY)
    try:
        where = sections_of(fd, path)
        return {name: section_of(fd, where, name) for name in names}
    finally:
        os.close(fd)


def unit_marker(tokenized: Path, u: int) -> dict[str, Any]:
    """Unit u's marker: its item table, totals and (a byte range) where the next range's lines begin."""
    data: dict[str, Any] = json.loads((tokenized / f"unit_{u:06d}.done").read_text())
    return data
