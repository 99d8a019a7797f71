"""The tokenize stage's results on disk: a unit's documents as arrays, written by the task that
tokenizes it, read by the stages after.

Files per unit in `WORK/tokenize/`: `unit_NNNNNN.tokens` (uint32 of every document with its
separators, EOT and BOS as the dataset holds them, back to back: a shard's writer copies runs of
them as they are), `.lengths` (int64), `.keys` (uint64), `.sources` (int32), `.bkeys` (the keys partitioned
by dedup bucket, buckets.py) and `.json` (per item: document and token counts, per-source
counts, drop examples, characters, bytes). Each is written under a temporary name and renamed;
`unit_NNNNNN.done` is written last (with the unit's totals, and for a byte range where the next
range's line numbers begin), so a unit is complete exactly when its marker exists, and a killed
task is finished by running it again (done units are skipped).

Memory model: one work item's result at a time (≈1 MiB of text and its tokens) and the unit's
keys (8 bytes per document) for the partition.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..format import atomic_write_bytes, atomic_write_json
from ..tokenizers import Tokenizer
from .buckets import partition
from .claim import bos_written
from .config import PrepareConfig
from .sources import Source
from .stops import stop_point
from .taskplan import Unit, count_newlines, load_plan, unit_items, work_dir
from .worker import ItemResult, WorkerConfig, run_item
from .writer import with_separators

_ARRAYS = (("tokens", np.uint32), ("lengths", np.int64), ("keys", np.uint64), ("sources", np.int32))


def tokenize_unit(config: PrepareConfig, plan: dict[str, Any], sources: list[Source], tokenizer: Tokenizer,
                  wcfg: WorkerConfig, u: int) -> bool:  # fmt: skip
    """Tokenize unit `u` unless its marker exists; True when it ran."""
    out = work_dir(config.out) / "tokenize"
    if (out / f"unit_{u:06d}.done").exists():
        return False
    out.mkdir(parents=True, exist_ok=True)
    unit = load_unit(plan, u)
    lines: dict[str, int] = {}
    if unit.kind == "range":  # its line numbers (for messages), and where the next unit's begin
        src = sources[unit.source]
        unit = replace(unit, first_line=first_line(out, plan, src, u))
        lines = {"next_line": unit.first_line + count_newlines(src, unit.start, unit.end)}
    items = unit_items(unit.source, sources[unit.source], unit, config.text_mode, config.text_field, config.max_chars)
    separators = (tokenizer.eot_id, config.eot_position, bos_written(config, tokenizer))
    _write_unit(out, u, (run_item(item, wcfg, tokenizer) for item in items), plan["buckets"], lines, separators)
    stop_point("unit", u)
    return True


def first_line(tokenized: Path, plan: dict[str, Any], src: Source, u: int) -> int:
    """The number of range unit u's first line in its file: counted on from the nearest earlier
    range of the same file already tokenized (its marker records where the next one begins),
    else from the file's start. A task counts at most the bytes before its unit in one file."""
    units = plan["units"]
    start = units[u][2]
    for v in range(u - 1, -1, -1):
        if units[v][0] != units[u][0] or units[v][1] != "range":
            break
        try:
            line = int(json.loads((tokenized / f"unit_{v:06d}.done").read_text())["next_line"])
        except (OSError, ValueError, KeyError):
            continue
        return line + count_newlines(src, units[v][3], start)
    return 1 + count_newlines(src, 0, start)


def load_unit(plan: dict[str, Any], u: int) -> Unit:
    return Unit(*plan["units"][u])


def _write_unit(out: Path, u: int, results: Iterator[ItemResult], n_buckets: int, lines: dict[str, int],
                separators: tuple[int, str, int | None]) -> None:  # fmt: skip
    stem = f"unit_{u:06d}"
    files: dict[str, IO[bytes]] = {name: open(out / f".{stem}.{name}.tmp", "wb") for name, _ in _ARRAYS}  # noqa: SIM115
    table, keys = [], []
    try:
        for r in results:
            keys.append(r.keys)
            tokens, _ = with_separators(r.tokens, r.lengths, np.ones(len(r.lengths), bool), *separators)
            arrays = {"tokens": tokens, "lengths": r.lengths, "keys": r.keys, "sources": r.doc_sources}
            for name, dtype in _ARRAYS:
                files[name].write(np.ascontiguousarray(arrays[name], dtype=np.dtype(dtype).newbyteorder("<")).tobytes())
            table.append({"docs": len(r.lengths), "tokens": int(r.lengths.sum()), "chars": r.chars,
                          "nbytes": r.nbytes, "seq": list(r.seq), "examples": r.examples,
                          "counts": {str(k): dict(v) for k, v in r.counts.items()}})  # fmt: skip
        for f in files.values():
            f.flush()
            os.fsync(f.fileno())
    finally:
        for f in files.values():
            f.close()
    for name, _ in _ARRAYS:
        os.replace(out / f".{stem}.{name}.tmp", out / f"{stem}.{name}")
    atomic_write_bytes(out / f"{stem}.bkeys", partition(np.concatenate(keys) if keys else np.zeros(0, np.uint64),
                                                        n_buckets))  # fmt: skip
    atomic_write_json(out / f"{stem}.json", table)
    totals = {name: sum(row[name] for row in table) for name in ("docs", "tokens", "chars")}  # type: ignore[misc]
    atomic_write_json(out / f"{stem}.done", {"items": len(table), **totals, **lines})


def missing_units(config: PrepareConfig) -> list[int]:
    """Units of the plan whose marker is absent."""
    work = work_dir(config.out)
    plan = load_plan(work)
    return [u for u in range(len(plan["units"])) if not (work / "tokenize" / f"unit_{u:06d}.done").exists()]


