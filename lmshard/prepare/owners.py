"""The last two stages of a planned run: each shard and key file written by its one owner, then
the metadata; and the claim of `--out` that comes before them all.

**Claim** (`begin`, where the run is started: `prepare` itself, before any task). The same
decision table as a local run (claim.py), under the writer lock: a new build gets its staging
directory `.NAME.lmshard-partial` and run record at once, an interrupted one is resumed only with
--resume (its work folder kept), and --overwrite discards both. The tasks then write into the
staging directory, and nothing appears at `--out` until `finish` swaps it in whole.

**Write** (one per piece of `layout.json`, dealt to the write tasks). The owner of a shard
reads its documents from the units it spans (the tokens of the kept documents of its split, the
lengths), adds the separators (EOT, and BOS with --bos) exactly as a local run does, and writes
the shard's `.bin` and `.idx` start to end, hashing as it goes, under temporary names renamed
into place when complete; the owner of a key file does the same with the kept documents' keys.
Its marker `write/piece_N.json` (the shard's or key file's entry for the metadata) comes last,
so a killed owner is re-run by running its task again.

**Finish** (once). Adds up the units' totals and the pieces' entries into
`dataset_metadata.json` with the same code as a local run, swaps the build in (staging.commit)
and removes the work folder. It reads no document: its work grows with units and shards only.

Memory model: an owner holds one unit's lengths and split (9 bytes per document) and at most
CHUNK_TOKENS (1 Mi) of its tokens at a time, with their copy and separators (≈13 MB), or one
longer document; finish holds the units' totals (one small dict each) and the pieces' entries.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ..errors import InputError
from ..format import (
    INDEX_DTYPE,
    METADATA_FILE,
    SPLITS,
    TOKEN_DTYPE,
    TOKENIZER_FILE,
    VOCAB_COPY,
    DatasetMeta,
    KeyFile,
    ShardInfo,
    atomic_write_bytes,
    atomic_write_json,
    shard_paths,
)
from ..tokenizers import Tokenizer
from .build import Totals, check_not_empty
from .claim import Claim, claim_output, write_run
from .config import PrepareConfig
from .sources import Source, note_growth
from .staging import RUN_FILE, OutputPaths, commit, read_run, recover
from .stops import stop_point
from .writer import with_separators


def begin(config: PrepareConfig, paths: OutputPaths, sources: list[Source], tokenizer: Tokenizer,
          work: Path) -> Claim:  # fmt: skip
    """Claim --out for a planned run (under the caller's writer lock): see the module docstring."""
    recover(paths)
    claim = claim_output(config, paths, sources, tokenizer)
    if claim.complete is not None or claim.commit_pending:
        return claim
    if claim.resumed and claim.checkpoint is not None:  # a local run's build, resumed by a planned one
        shutil.rmtree(paths.staging)
        claim = Claim(claim.fingerprint, claim.started_at)
    if not claim.resumed:
        if work.exists():  # an earlier run's work, discarded with its build (--overwrite) or never claimed
            shutil.rmtree(work)
        paths.staging.mkdir()
        write_run(paths.staging, claim, None)
    return claim


def _unit_split(work: Path, u: int) -> np.ndarray:
    return np.fromfile(work / "select" / f"unit_{u:06d}.split", dtype=np.int8)


def _taken(work: Path, piece: list[Any]) -> Any:
    """(unit, chosen documents' positions in the unit) for each unit the piece spans."""
    stream, _, u0, i0, u1, i1 = piece[:6]
    for u in range(u0, u1 + 1):
        split = _unit_split(work, u)
        mine = np.flatnonzero(split >= 0 if stream == "keys" else split == SPLITS.index(stream))
        chosen = mine[(i0 if u == u0 else 0) : (i1 if u == u1 else len(mine))]
        if len(chosen):
            yield u, chosen


def write_piece(work: Path, staging: Path, layout: dict[str, Any], k: int, eot: int, eot_position: str,
                bos: int | None) -> bool:  # fmt: skip
    """Write piece k of the layout unless its marker exists; True when it ran."""
    marker = work / "write" / f"piece_{k:06d}.json"
    if marker.exists():
        return False
    piece = layout["pieces"][k]
    stream, number = piece[0], piece[1]
    tokenized = work / "tokenize"
    if stream == "keys":
        rel = f"dedup/doc_keys_{number:06d}.u64"
        digest, n = xxhash.xxh3_64(), 0
        (staging / "dedup").mkdir(parents=True, exist_ok=True)
        with open(staging / f"{rel}.tmp", "wb") as f:
            for u, chosen in _taken(work, piece):
                data = np.fromfile(tokenized / f"unit_{u:06d}.keys", dtype="<u8")[chosen].tobytes()
                f.write(data)
                digest.update(data)
                n += len(chosen)
            _durable(f)
        os.replace(staging / f"{rel}.tmp", staging / rel)
        entry: dict[str, Any] = KeyFile(path=rel, n_keys=n, xxh3_64=digest.hexdigest()).to_json()
    else:
        entry = _write_shard(work, staging, piece, eot, eot_position, bos).to_json()
    (work / "write").mkdir(exist_ok=True)
    atomic_write_json(marker, entry)
    stop_point("piece", k)
    return True


def _write_shard(work: Path, staging: Path, piece: list[Any], eot: int, eot_position: str,
                 bos: int | None) -> ShardInfo:  # fmt: skip
    stream, number = piece[0], piece[1]
    bin_rel, idx_rel = shard_paths(stream, number)
    (staging / stream).mkdir(parents=True, exist_ok=True)
    hashes = xxhash.xxh3_64(), xxhash.xxh3_64()
    n_tokens = n_docs = 0
    with open(staging / f"{bin_rel}.tmp", "wb") as b, open(staging / f"{idx_rel}.tmp", "wb") as x:
        start = np.zeros(1, INDEX_DTYPE).tobytes()
        x.write(start)
        hashes[1].update(start)
        for u, chosen, lengths, ends in _chunks(work, piece):
            d0, d1 = int(chosen[0]), int(chosen[-1]) + 1
            t0, t1 = int(ends[d0] - lengths[d0]), int(ends[d1 - 1])
            tokens = _tokens(work / "tokenize" / f"unit_{u:06d}.tokens", t0, t1)
            keep = np.zeros(d1 - d0, dtype=bool)
            keep[chosen - d0] = True
            out, out_lens = with_separators(tokens, lengths[d0:d1], keep, eot, eot_position, bos)
            raw = np.ascontiguousarray(out, dtype=TOKEN_DTYPE).data.cast("B")  # the array's own bytes
            offsets = (np.cumsum(out_lens) + n_tokens).astype(INDEX_DTYPE).data.cast("B")
            for f, h, data in ((b, hashes[0], raw), (x, hashes[1], offsets)):
                f.write(data)
                h.update(data)
            n_tokens += len(out)
            n_docs += len(out_lens)
        _durable(b)
        _durable(x)
    os.replace(staging / f"{idx_rel}.tmp", staging / idx_rel)
    os.replace(staging / f"{bin_rel}.tmp", staging / bin_rel)
    return ShardInfo(split=stream, path=bin_rel, index_path=idx_rel, n_tokens=n_tokens, n_docs=n_docs,
                     xxh3_64=hashes[0].hexdigest(), index_xxh3_64=hashes[1].hexdigest())  # fmt: skip


CHUNK_TOKENS = 1 << 20  # a shard is written this many tokens at a time: buffers a process reuses


def _chunks(work: Path, piece: list[Any]) -> Any:
    """(unit, chosen documents, the unit's lengths, their running ends) for runs of the piece's
    documents spanning at most CHUNK_TOKENS tokens each (or one longer document): arrays of a
    few MB, which the allocator reuses, rather than fresh pages the kernel must zero each time."""
    for u, chosen in _taken(work, piece):
        lengths = np.fromfile(work / "tokenize" / f"unit_{u:06d}.lengths", dtype="<i8")
        ends = np.cumsum(lengths)
        chosen_ends = ends[chosen]
        i = 0
        while i < len(chosen):
            base = ends[chosen[i]] - lengths[chosen[i]]
            j = max(i + 1, int(np.searchsorted(chosen_ends, base + CHUNK_TOKENS, side="right")))
            yield u, chosen[i:j], lengths, ends
            i = j


def _tokens(path: Path, start: int, end: int) -> np.ndarray:
    """Tokens [start, end) of a unit's token file, read straight into one array."""
    return np.fromfile(path, dtype="<u4", count=max(0, end - start), offset=start * 4)


def _durable(f: Any) -> None:
    f.flush()
    os.fsync(f.fileno())


def missing_pieces(work: Path, layout: dict[str, Any]) -> list[int]:
    return [k for k in range(len(layout["pieces"])) if not (work / "write" / f"piece_{k:06d}.json").exists()]


def merged_totals(work: Path, n_units: int) -> Totals:
    """The units' totals added up in plan order (the first example of each drop reason wins)."""
    totals = Totals()
    for u in range(n_units):
        part = Totals.parse(json.loads((work / "select" / f"unit_{u:06d}.json").read_text())["totals"])
        for name in ("records", "docs_kept", "tokens", "chars", "duplicates", "lines_removed"):
            setattr(totals, name, getattr(totals, name) + getattr(part, name))
        totals.drops.update(part.drops)
        for src, counts in part.per_source.items():
            totals.per_source.setdefault(src, type(counts)()).update(counts)
        for reason, example in part.examples.items():
            totals.examples.setdefault(reason, example)
    totals.examples = dict(sorted(totals.examples.items()))
    return totals


def finish(config: PrepareConfig, paths: OutputPaths, work: Path, layout: dict[str, Any], n_units: int,
           sources: list[Source], tokenizer: Tokenizer) -> DatasetMeta:  # fmt: skip
    """The metadata from the units' totals and the pieces' entries, then the swap (under the
    caller's writer lock); the work folder is removed once the dataset is in place."""
    from .metadata import dataset_metadata

    missing = missing_pieces(work, layout)
    if missing:
        tasks = sorted({t for k in missing for t, (a, b) in enumerate(layout["tasks"]) if a <= k < b})
        raise InputError(f"{len(missing)} of {len(layout['pieces'])} shards and key files are not written yet; run "
                         f"the write stage of task{'s' if len(tasks) > 1 else ''} {', '.join(map(str, tasks))} "
                         "first")  # fmt: skip
    run = read_run(paths.staging)
    if run is None:
        raise InputError(f"{paths.staging}: no run record; the build was not claimed by this run: start it again "
                         "with --overwrite")  # fmt: skip
    claim = Claim(run["fingerprint"], run.get("started", time.time()))
    totals = merged_totals(work, n_units)
    note_growth(sources, totals.per_source)
    entries = [json.loads((work / "write" / f"piece_{k:06d}.json").read_text()) for k in range(len(layout["pieces"]))]
    shards = [ShardInfo.parse(p[0], e) for p, e in zip(layout["pieces"], entries, strict=True) if p[0] != "keys"]
    keys = tuple(KeyFile.parse(e) for p, e in zip(layout["pieces"], entries, strict=True) if p[0] == "keys")
    check_not_empty(config, totals, Totals(), shards)
    if config.dedup != "document":
        keys = ()
    meta = dataset_metadata(config, sources, tokenizer, shards, totals, claim, keys, claim.started_at)  # type: ignore[arg-type]
    if tokenizer.vocab_bytes is not None:
        atomic_write_bytes(paths.staging / VOCAB_COPY, tokenizer.vocab_bytes)
    atomic_write_json(paths.staging / TOKENIZER_FILE, tokenizer.identity())
    atomic_write_json(paths.staging / METADATA_FILE, meta.to_json())
    commit(paths)
    shutil.rmtree(work, ignore_errors=True)
    return meta


__all__ = ["RUN_FILE", "begin", "finish", "missing_pieces", "write_piece"]
