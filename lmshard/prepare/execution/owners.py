"""The write stage of a planned run: each shard and key file written by its owners and sealed
once (the claim of `--out` before every stage: planclaim.py; the finish: finish.py).

**Write** (one per part of `layout.json`, dealt to the write tasks). A part is a shard's (or
key file's) documents from one unit: the unit's tokens already carry the separators (EOT, and
BOS with --bos) exactly as a local run writes them, so its writer copies each run of
consecutive kept documents from the unit's token file into the shard's temporary `.bin.tmp`
at the part's place (the layout knows the tokens and documents before it), writes their
offsets into `.idx.tmp`, then its marker `write/part_N.done`. Many tasks write one
large shard at once. **Seal**: once every part of a piece is written, the piece is cut to its
size, made durable, hashed start to end (xxh3-64 cannot be combined from pieces, so the one
sequential pass is a read at memory or filesystem speed, not a rewrite) and renamed into place;
its marker `write/piece_N.json` is the shard's or key file's entry for the metadata. A write
task seals the pieces whose last part it finished; the finish seals any left by a killed task.

Memory model: a part's writer holds one unit's lengths and split (9 bytes per document), its
documents' offsets and with --attribute the unit's attribute records; tokens are copied file to
file (copy_file_range, else 8 MiB at a time); a seal holds one 8 MiB block.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ...errors import InputError
from ...format import (
    BLOCK_TOKENS,
    INDEX_DTYPE,
    SPLITS,
    SRC_DTYPE,
    TOKEN_DTYPE,
    BlockHasher,
    KeyFile,
    ShardInfo,
    in_folder,
    shard_paths,
    src_path,
    sums_path,
)
from ...format.attributes import attr_path
from ...format.blocks import write_sums
from ...format.encoding import UINT32, Encoding
from ...format.provenance import records
from ...format.sealing import seal_encoded, shard_entry
from ..stops import stop_point
from . import valby, volatile
from .barrier import is_complete, running, summary_path, task_finished, task_marked
from .layoutfiles import Layout
from .unitfiles import section_of, sections_of

# A local run whose shards hold fewer bytes than this syncs each shard's files once, at its seal,
# not at each part as well (`parts_synced`): far below any machine's writeback threshold.
SYNCED_PARTS_BYTES = 256 << 20


def piece_files(piece: list[Any], attrs: bool = False) -> list[str]:
    """The files of a piece, relative to the dataset: a shard's .bin, .idx and .src (and with
    `attrs` its .attr), or a key file."""
    if piece[0] == "keys":
        return [f"dedup/doc_keys_{piece[1]:06d}.u64"]
    if piece[0] == "near":
        return [f"dedup/near_sigs_{piece[1]:06d}.u32"]
    if piece[0] == "lines":
        return [f"dedup/line_keys_{piece[1]:06d}.u64"]
    bin_rel, idx_rel = shard_paths(piece[0], piece[1])
    return [bin_rel, idx_rel, src_path(bin_rel)] + ([attr_path(bin_rel)] if attrs else [])


def write_part(work: Path, staging: Path, layout: Layout, p: int, specials: int) -> bool:
    """Write part p of the layout into its piece's files at its place, unless its marker exists;
    True when it ran."""
    marker = work / "write" / f"part_{p:06d}.done"
    if marker.exists():
        return False
    k, u, i0, i1, tokens_before, docs_before, _ = layout["parts"][p]
    if (work / "write" / f"piece_{k:06d}.json").exists():  # its piece is sealed already
        return False
    piece = layout["pieces"][k]
    stream = piece[0]
    split = valby.unit_split(work, u, layout.get("val_by") if stream in SPLITS else None)  # (--val-by's val marked)
    if stream == "lines":  # the unit's lines met first: all of them are written, in order
        chosen = np.arange(i0, i1)
    else:
        chosen = np.flatnonzero(split >= 0 if stream in ("keys", "near") else split == SPLITS.index(stream))[i0:i1]
    columns = layout["attr_columns"]
    files = [staging / f"{rel}.tmp" for rel in piece_files(piece, bool(columns))]
    fds = [in_folder(partial(os.open, f, os.O_WRONLY | os.O_CREAT, 0o666), f.parent)
           for f in files]  # not truncated: others write too
    data = work / "tokenize" / f"unit_{u:06d}.bin"
    src = os.open(data, os.O_RDONLY)  # (one open of the unit's data file per part)
    try:
        where = sections_of(src, data)
        if stream in ("keys", "lines"):
            keys = section_of(src, where, stream)[chosen]
            _pwrite(fds[0], keys.data.cast("B"), tokens_before * 8)
        elif stream == "near":  # rows of n_hashes uint32
            h = layout["near_hashes"]
            sigs = np.ascontiguousarray(section_of(src, where, "sigs").reshape(-1, h)[chosen])
            _pwrite(fds[0], sigs.data.cast("B"), tokens_before * h * 4)
        else:  # the unit's tokens carry their separators: runs of consecutive documents are copied as they are
            sizes = section_of(src, where, "lengths") + specials
            base = where["tokens"][0]
            starts = np.cumsum(sizes) - sizes
            mine = sizes[chosen]
            offsets = (np.cumsum(mine) + tokens_before).astype(INDEX_DTYPE)
            _pwrite(fds[1], offsets.data.cast("B"), (docs_before + 1) * 8)  # (entry 0 is the seal's)
            src_records = records(section_of(src, where, "sources")[chosen] + layout["source_base"],
                                  section_of(src, where, "numbers")[chosen] + int(layout["records"][u]))
            _pwrite(fds[2], memoryview(src_records.tobytes()), docs_before * SRC_DTYPE.itemsize)
            if columns:  # each document's attribute values, into each column of the file (format/attributes.py)
                rows, at = valby.attr_rows(partial(section_of, src, where), chosen, columns, layout.get("val_by")), 0
                for w in columns:
                    _pwrite(fds[3], memoryview(np.ascontiguousarray(rows[:, at : at + w]).tobytes()),
                            piece[3] * at + docs_before * w)  # fmt: skip
                    at += w
            breaks = np.flatnonzero(np.diff(chosen) != 1) + 1
            at = tokens_before
            for run in np.split(np.arange(len(chosen)), breaks) if len(chosen) else ():
                n = int(mine[run].sum())
                _copy(src, fds[0], base + int(starts[chosen[run[0]]]) * 4, at * 4, n * 4)
                at += n
        synced = parts_synced(layout)
        if synced:  # (else the seal's sync makes them durable, and the unit's data waits for it: `parts_synced`)
            for fd in fds:
                os.fsync(fd)
    finally:
        os.close(src)
        for fd in fds:
            os.close(fd)
    in_folder(lambda: volatile.write_json(marker, {"piece": k}), marker.parent)
    if synced:
        _release(work, layout, u)
    stop_point("part", p)
    return True


def parts_synced(layout: Layout) -> bool:
    """Whether a part is synced before its marker, and its unit's data deleted once every part
    that reads it is written. So it is wherever tasks of other machines read the work, and in a
    local run whose shards hold SYNCED_PARTS_BYTES or more: there the unit's data goes as the
    write stage goes, and the part's sync keeps the shards' dirty pages few, so the kernel's
    writeback does not flush unit files the run deletes soon after (4.0 bytes a token to the
    storage; 4.5-6.6 without, on 1.11 GB). A smaller local run leaves its parts to the seal's
    one sync of each file (a sync of each part's files cost about 6% of a 12 MB run): each
    unit's data is then deleted once every piece its parts are in is sealed, and a seal whose
    sync fails removes its parts' markers (`_unwrite`), so that a resumed run writes them again
    from it. Decided from the layout's head, the same in every process of the run."""
    tokens = layout.get("tokens")  # (the layout's head: every process of the run reads the same)
    return not volatile.active() or tokens is None or tokens * 4 >= SYNCED_PARTS_BYTES


def _copy(src: int, dst: int, at: int, to: int, n: int) -> None:
    """Copy n bytes of file `src` at `at` into file `dst` at `to`: in the kernel where it can
    (copy_file_range: no pass through this process, a reflink on filesystems that share blocks),
    else through an 8 MiB buffer."""
    while n > 0:
        try:
            done = os.copy_file_range(src, dst, n, at, to)
        except (AttributeError, OSError):  # not Linux, or not between these files: read and write
            done = len(chunk := os.pread(src, min(n, 8 << 20), at))
            _pwrite(dst, memoryview(chunk), to)
        if done == 0:
            raise OSError(f"unexpected end of a unit's token file ({n} bytes short)")
        at, to, n = at + done, to + done, n - done


def _unwrite(work: Path, layout: Layout, parts: range) -> None:
    """After a seal's failed sync: the markers of its parts whose unit's data is still here
    removed (and the write stage's summary), so that a resumed run writes them again. A unit's
    data is deleted only once its parts are durable (synced on their own, or sealed), so a
    part whose unit is gone needs nothing; one whose unit is here may not have been synced
    (`parts_synced`), whatever this process's mode: a run may change executors midway."""
    summary_path(work, "write").unlink(missing_ok=True)
    for p in parts:
        if (work / "tokenize" / f"unit_{layout['parts'][p][1]:06d}.bin").exists():
            (work / "write" / f"part_{p:06d}.done").unlink(missing_ok=True)


def _release(work: Path, layout: Layout, u: int, sealed: bool = False) -> None:
    """Delete unit u's data once every part that reads it is written (whoever writes the last
    one sees every marker: each part writes its own before it looks), so the work folder shrinks
    as the write stage goes and the finish removes only markers; with `sealed`, once every piece
    those parts are in is sealed (`parts_synced`: whoever seals the last sees every marker)."""
    readers = layout["readers"][u] if u < len(layout["readers"]) else []
    done = [f"piece_{layout['parts'][p][0]:06d}.json" if sealed else f"part_{p:06d}.done" for p in readers]
    if all((work / "write" / name).exists() for name in done):
        (work / "tokenize" / f"unit_{u:06d}.bin").unlink(missing_ok=True)
        (work / "select" / f"unit_{u:06d}.split").unlink(missing_ok=True)


def _pwrite(fd: int, data: memoryview, at: int) -> None:
    while len(data):
        n = os.pwrite(fd, data, at)
        data, at = data[n:], at + n


def seal_piece(work: Path, staging: Path, layout: Layout, k: int, encoding: Encoding = UINT32,
               take_over: bool = False) -> bool:  # fmt: skip
    """Once every part of piece k is written: cut its files to their size, make them durable,
    hash them start to end (a shard of another encoding than uint32: encode it, format/sealing.py),
    rename them into place and write the piece's marker (its entry for the metadata). False when
    already sealed, a part is missing, or another task claimed the seal.

    Two write tasks that finish a piece's last parts together both see it complete: the first
    to create `write/piece_K.sealing` seals it, the other leaves it. A sealer killed midway
    leaves its claim; the finish (`take_over`, once every write task has ended) seals the piece."""
    marker = work / "write" / f"piece_{k:06d}.json"
    if marker.exists():
        return False
    piece = layout["pieces"][k]
    first, end = piece[4]
    if not parts_written(work, layout, range(first, end)):
        return False
    claim = work / "write" / f"piece_{k:06d}.sealing"
    claim.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        if not take_over:
            return False  # another task seals it (or was killed doing so: the finish takes it over)
        _check_dead(claim, k)
    else:
        with os.fdopen(fd, "w") as f:
            f.write(f"{socket.gethostname()} {os.getpid()}\n")
    stream, number, n_tokens, n_docs = piece[:4]
    columns = layout["attr_columns"]
    attrs = sum(columns)
    rels = piece_files(piece, bool(attrs))
    keyish = stream in ("keys", "near", "lines")
    width = 8 if stream in ("keys", "lines") else 4 * layout.get("near_hashes", 0)
    sizes = [n_tokens * width] if keyish else [n_tokens * TOKEN_DTYPE.itemsize, (n_docs + 1) * 8,
                                                n_docs * SRC_DTYPE.itemsize, n_docs * attrs][: len(rels)]  # fmt: skip
    encoded = not keyish and encoding.version > 1
    try:
        digests, sums = _seal_files(staging, rels, sizes, encoded)
    except OSError:  # a sync that failed: the bytes of parts not synced on their own may be lost with it
        _unwrite(work, layout, range(first, end))
        claim.unlink(missing_ok=True)
        raise
    for rel in reversed(rels):  # the index before the tokens, as a local run renames them
        if (staging / f"{rel}.tmp").exists() and not (encoded and rel.endswith(".bin")):
            os.replace(staging / f"{rel}.tmp", staging / rel)
    per_doc: dict[str, Any] = {}
    if attrs and not keyish:  # (and each column's checksum, for a reader of one column)
        per_doc = {"attr_path": rels[3], "attr_xxh3_64": digests[3], "attr_width": attrs,
                   "attr_column_xxh3_64": _column_sums(staging / rels[3], columns, n_docs)}  # fmt: skip
    if keyish:
        entry: dict[str, Any] = KeyFile(path=rels[0], n_keys=n_tokens, xxh3_64=digests[0]).to_json()
    elif encoded:
        sealed = seal_encoded(staging / f"{rels[0]}.tmp", staging / rels[0], rels[0], encoding, n_tokens)
        entry = replace(shard_entry(stream, rels[0], rels[1], n_tokens, n_docs, digests[1], encoding, sealed),
                        src_path=rels[2], src_xxh3_64=digests[2], **per_doc).to_json()  # fmt: skip
    else:
        entry = ShardInfo(split=stream, path=rels[0], index_path=rels[1], n_tokens=n_tokens, n_docs=n_docs,
                          xxh3_64=digests[0], index_xxh3_64=digests[1], sums_path=sums_path(rels[0]),
                          block_tokens=BLOCK_TOKENS, sums_xxh3_64=xxhash.xxh3_64_hexdigest(sums), src_path=rels[2],
                          src_xxh3_64=digests[2], **per_doc).to_json()  # fmt: skip
    volatile.write_json(marker, entry)
    claim.unlink(missing_ok=True)
    if not parts_synced(layout):  # (else each unit's data went once its parts were written)
        for u in sorted({layout["parts"][p][1] for p in range(first, end)}):
            _release(work, layout, u, sealed=True)
    stop_point("piece", k)
    return True


def _seal_files(staging: Path, rels: list[str], sizes: list[int], encoded: bool) -> tuple[list[str], bytes]:
    """A piece's files cut to their sizes, made durable and hashed start to end (a shard's
    block sums written beside it): their digests, and the tokens' block sums. An encoded
    shard's uint32 file is only cut and synced (sealed from it after)."""
    digests, sums = [], b""
    for rel, size in zip(rels, sizes, strict=True):
        tmp = staging / f"{rel}.tmp"
        if encoded and rel.endswith(".bin"):  # sealed below, from its uint32 file cut to size
            if tmp.exists():
                with open(tmp, "r+b") as f:
                    f.truncate(size)
                    _durable(f)
            digests.append("")
            continue
        if not tmp.exists() and (staging / rel).exists():  # sealed by another task a moment ago
            tmp = staging / rel
        tmp.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "r+b" if tmp.exists() else "w+b") as f:
            f.truncate(size)
            if rel.endswith(".idx"):
                f.write(np.zeros(1, INDEX_DTYPE).tobytes())  # the index's first entry: 0
            _durable(f)
            f.seek(0)
            digest, blocks = xxhash.xxh3_64(), BlockHasher()
            while block := f.read(8 << 20):
                digest.update(block)
                if rel.endswith(".bin"):
                    blocks.update(block)
            digests.append(digest.hexdigest())
            if rel.endswith(".bin"):
                sums = blocks.finish()
                write_sums(staging / sums_path(rel), sums)
    return digests, sums


def _column_sums(path: Path, columns: list[int], n_docs: int) -> tuple[str, ...]:
    """The xxh3-64 of each column of a sealed attribute file (`columns`: a value's bytes in each)."""
    out = []
    with open(path, "rb") as f:
        for w in columns:  # (the file is the columns back to back: read in order, 8 MiB at a time)
            digest, left = xxhash.xxh3_64(), n_docs * w
            while left:
                block = f.read(min(left, 8 << 20))
                if not block:
                    raise OSError(f"{path}: shorter than its {n_docs} documents' attributes")
                digest.update(block)
                left -= len(block)
            out.append(digest.hexdigest())
    return tuple(out)


def _check_dead(claim: Path, k: int) -> None:
    """Refuse to take over piece k's seal while the process that claimed it still runs here."""
    try:
        host, pid = claim.read_text().split()
    except (OSError, ValueError):
        return
    if host == socket.gethostname() and int(pid) != os.getpid() and running(int(pid)):
        raise InputError(f"piece {k} of the dataset is being sealed by pid {pid} on this host; let its write task end, "
                         "then run the finish again")  # fmt: skip


def _durable(f: Any) -> None:
    f.flush()
    os.fsync(f.fileno())


def missing_parts(work: Path, layout: Layout) -> list[int]:
    n = len(layout["tasks"])
    return [p for p in range(len(layout["parts"])) if not (work / "write" / f"part_{p:06d}.done").exists()
            and not task_finished(work, "write", n, layout.task_of_part(p))]  # fmt: skip


def parts_written(work: Path, layout: Layout, parts: range) -> bool:
    """Whether every one of `parts` is written: its write task's mark (a task that did its share
    removes its parts' markers, barrier.py), looked at once per task, else each part's marker.
    So a large piece (a val shard's parts come from many tasks) costs a stat or two per task
    that wrote it, not per part."""
    if is_complete(work, "write"):
        return True
    by_task: dict[int, list[int]] = {}
    for p in parts:
        by_task.setdefault(layout.task_of_part(p), []).append(p)
    n = len(layout["tasks"])
    return all(task_marked(work, "write", n, t) or all((work / "write" / f"part_{p:06d}.done").exists() for p in ps)
               for t, ps in by_task.items())  # fmt: skip


def write_join(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The write stage's summary of tasks (or groups of them: barrier.py): how many parts they
    held, and the entries of the pieces they sealed (the metadata's, by piece number), so the
    finish reads one file, not one per shard."""
    pieces: dict[str, Any] = {}
    for part in parts:
        pieces.update(part.get("pieces", {}))
    return {"items": sum(int(p.get("items", 0)) for p in parts), "pieces": pieces}


def sealed_entries(work: Path, layout: Layout, parts: Sequence[int]) -> dict[str, Any]:
    """The entries of the sealed pieces that `parts` belong to (a write task's mark)."""
    out: dict[str, Any] = {}
    for k in sorted({layout["parts"][p][0] for p in parts}):
        try:
            out[str(k)] = json.loads((work / "write" / f"piece_{k:06d}.json").read_text())
        except FileNotFoundError:  # sealed by another task (its mark has it), or by the finish
            continue
    return out


__all__ = ["missing_parts", "parts_written", "seal_piece", "sealed_entries", "write_join",
           "write_part"]
