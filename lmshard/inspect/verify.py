"""Check a prepared dataset against its metadata, and gather its statistics in the same pass.

Used by `lmshard inspect` and by tests. The metadata and structural checks it shares with the
runtime loader live in `lmshard.format` (schema.py and files.py), so both refuse the same
datasets: the metadata validates (totals included); per shard, both files lie inside the
dataset with sizes n_tokens × 4 and (n_docs + 1) × 8 bytes, and the index starts at 0, increases
strictly and ends at n_tokens. Here, unless `quick`: the xxh3-64 checksums of both files match,
every token id is below n_vocab, and an EOT token sits at every document boundary on the side
the metadata records.

Memory model: one block of BLOCK_TOKENS tokens (64 MiB) at a time, one shard's index, a token
histogram of n_vocab int64 counters (none above MAX_COUNTED_VOCAB ids), and document lengths
(uint32, sampled down to at most MAX_LENGTHS values for statistics), and tokenizer_state.json (a
few KB; refused above MAX_TOKENIZER_BYTES, as the tokenizer.json copy, which is hashed in 1 MiB
blocks). `quick` reads no token data at all: sizes and indexes only.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ..errors import FormatError
from ..format import (
    INDEX_DTYPE,
    MAX_TOKENIZER_BYTES,
    REGENERATE_HINT,
    TOKEN_DTYPE,
    TOKENIZER_FILE,
    VOCAB_COPIES,
    DatasetMeta,
    ShardInfo,
    check_index,
    check_shard_files,
    dataset_file_size,
    file_xxh3,
    load_metadata,
)

BLOCK_TOKENS = 16 << 20
MAX_LENGTHS = 16_000_000
MAX_COUNTED_VOCAB = 1 << 24  # ids: a histogram of 128 MiB; a larger n_vocab gets no top-token counts
FIX_SHARD = "re-run `lmshard prepare` with --overwrite to rebuild the dataset"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a dataset: where, what, and how to fix it (empty when `what` is a
    FormatError's message, which says the fix itself)."""

    where: str
    what: str
    fix: str = FIX_SHARD

    def __str__(self) -> str:
        return f"{self.where}: {self.what}" + (f"; {self.fix}" if self.fix else "")


@dataclass
class Report:
    """The result of `verify_dataset`: problems (empty when the dataset is sound) and stats."""

    root: Path | str  # a directory, or a URL
    meta: DatasetMeta | None = None
    problems: list[Problem] = field(default_factory=list)
    quick: bool = False
    token_counts: np.ndarray | None = None  # occurrences of each token id (full check only)
    lengths: dict[str, list[np.ndarray]] = field(default_factory=dict)  # split → doc lengths
    shards_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def doc_lengths(self, split: str | None = None) -> np.ndarray:
        parts = [a for s, arrs in self.lengths.items() if split in (None, s) for a in arrs]
        return np.concatenate(parts) if parts else np.zeros(0, np.uint32)

    def length_stats(self, split: str | None = None) -> dict[str, float]:
        lengths = self.doc_lengths(split)
        if not len(lengths):
            return {}
        return {
            "min": int(lengths.min()),
            "mean": round(float(lengths.mean()), 2),
            "median": float(np.median(lengths)),
            "p99": float(np.percentile(lengths, 99)),
            "max": int(lengths.max()),
        }


def verify_dataset(
    root: str | Path,
    quick: bool = False,
    on_shard: Callable[[ShardInfo], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> Report:
    """Verify every shard of the dataset at `root`; see the module docstring for the checks.
    `on_start(n_shards)` and `on_shard(shard)` report progress. (A URL: remote.py's `verify`.)"""
    report = Report(root=Path(root), quick=quick)
    try:
        meta = load_metadata(root)
    except FormatError as e:
        report.problems.append(Problem(str(root), str(e), fix=""))
        return report
    if on_start:
        on_start(len(meta.shards))
    start_report(meta, report)
    for shard in meta.shards:
        verify_shard(meta, shard, report)
        if on_shard:
            on_shard(shard)
    return report


def start_report(meta: DatasetMeta, report: Report) -> None:
    """The checks before the shards: the tokenizer's files, the dedup keys, the token histogram."""
    report.meta = meta
    _check_tokenizer_state(meta, report)
    _check_key_files(meta, report, report.quick)
    if not report.quick and meta.tokenizer.n_vocab <= MAX_COUNTED_VOCAB:
        report.token_counts = np.zeros(meta.tokenizer.n_vocab, dtype=np.int64)


def verify_shard(meta: DatasetMeta, shard: ShardInfo, report: Report) -> None:
    """One shard's structure (and, unless quick, content) into `report`."""
    offsets = check_shard_structure(meta, shard, report.problems)
    if offsets is not None:
        sample_every = max(1, -(-meta.n_docs() // MAX_LENGTHS))
        lengths = np.diff(offsets)[::sample_every].astype(np.uint32)
        report.lengths.setdefault(shard.split, []).append(lengths)
        if not report.quick:
            _check_shard_content(meta, shard, offsets, report)
    report.shards_checked += 1


def _check_key_files(meta: DatasetMeta, report: Report, quick: bool) -> None:
    """The dedup key files `--append` reads: inside the dataset, n_keys × 8 bytes, and (unless
    quick) their checksums. A bad one does not harm training, but would make an append keep
    duplicates or drop new documents."""
    for f in meta.dedup.files if meta.dedup else ():
        try:
            size = dataset_file_size(meta.root, f.path)
        except FormatError as e:
            report.problems.append(Problem(f.path, str(e), fix=""))
            continue
        if size != f.n_keys * 8:
            report.problems.append(Problem(f.path, f"{size} bytes, but 'n_keys' {f.n_keys} means {f.n_keys * 8}"))
        elif not quick and (digest := file_xxh3(meta.root / f.path)) != f.xxh3_64:
            report.problems.append(Problem(f.path, f"checksum {digest} != {f.xxh3_64} in metadata"))


def read_small(root: Path, rel: str, sink: Callable[[bytes], object]) -> None:
    """Feed `sink` the bytes of the dataset's small file `rel` (tokenizer_state.json, the
    tokenizer.json copy) in 1 MiB blocks. FormatError unless it is a regular file inside the
    dataset of at most MAX_TOKENIZER_BYTES, held to that again on the file opened and the bytes
    read: someone else's dataset may swap in a FIFO or a larger file after the first check."""
    path = root / rel
    dataset_file_size(root, rel)  # inside the dataset (symlinks resolved), a regular file
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens without waiting
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FormatError(f"{path}: not a regular file; {REGENERATE_HINT}")
        if info.st_size > MAX_TOKENIZER_BYTES:
            raise _too_large(path, f"{info.st_size:,} bytes")
        read = 0  # bytes: the file may still grow while it is read
        while block := f.read(1 << 20):
            read += len(block)
            if read > MAX_TOKENIZER_BYTES:
                raise _too_large(path, f"more than {read - len(block):,} bytes")
            sink(block)


def _too_large(path: Path, size: str) -> FormatError:
    return FormatError(f"{path}: {size}, more than any tokenizer file ({MAX_TOKENIZER_BYTES >> 20} MiB); "
                       f"not read; {REGENERATE_HINT}")  # fmt: skip


def _check_tokenizer_state(meta: DatasetMeta, report: Report) -> None:
    data = bytearray()
    try:
        read_small(meta.root, TOKENIZER_FILE, data.extend)
        state = json.loads(data.decode("utf-8"))
    except FormatError as e:
        report.problems.append(Problem(TOKENIZER_FILE, str(e), fix=""))
        return
    except (OSError, ValueError, RecursionError) as e:
        report.problems.append(Problem(TOKENIZER_FILE, f"unreadable ({e})"))
        return
    if not isinstance(state, dict):
        report.problems.append(Problem(TOKENIZER_FILE, "not a JSON object"))
        return
    for key in ("name", "n_vocab", "eot_id", "ranks_sha256"):
        if state.get(key) != getattr(meta.tokenizer, key):
            report.problems.append(Problem(TOKENIZER_FILE, f"'{key}' disagrees with the metadata"))
    copy = VOCAB_COPIES.get(meta.tokenizer.vocab_format)
    if copy is not None:
        _check_vocab_copy(meta, report, copy)


def _check_vocab_copy(meta: DatasetMeta, report: Report, copy: str) -> None:
    """The vocabulary file kept in the dataset (a Hugging Face tokenizer.json, a SentencePiece
    model): it must be the file the dataset was tokenized with (`ranks_sha256`), or decoding it
    would mislead."""
    sha256 = hashlib.sha256()
    try:
        read_small(meta.root, copy, sha256.update)  # in blocks, never the whole file at once
        digest = sha256.hexdigest()
    except FormatError as e:
        report.problems.append(Problem(copy, str(e), fix=""))
        return
    except OSError as e:
        report.problems.append(Problem(copy, f"unreadable ({e.strerror})"))
        return
    if digest != meta.tokenizer.ranks_sha256:
        report.problems.append(Problem(copy, f"sha256 {digest[:16]}… is not the tokenizer's "
                                                   f"{meta.tokenizer.ranks_sha256[:16]}… in the metadata"))  # fmt: skip


def check_shard_structure(meta: DatasetMeta, shard: ShardInfo, problems: list[Problem]) -> np.ndarray | None:
    """Sizes and document index of one shard, without reading tokens. Returns the offsets, or
    None after recording a problem."""
    try:
        check_shard_files(meta.root, shard)
        path = meta.abspath(shard.index_path)
        offsets = np.fromfile(path, dtype=INDEX_DTYPE)  # as many bytes as the metadata says: checked above
        check_index(path, offsets, shard.n_tokens)
    except FormatError as e:
        problems.append(Problem(shard.path, str(e), fix=""))
        return None
    return offsets


def _check_shard_content(meta: DatasetMeta, shard: ShardInfo, offsets: np.ndarray, report: Report) -> None:
    problems = report.problems
    idx_hash = xxhash.xxh3_64_hexdigest(offsets.astype(INDEX_DTYPE).tobytes())
    if idx_hash != shard.index_xxh3_64:
        problems.append(Problem(shard.path, f"index checksum {idx_hash} != {shard.index_xxh3_64} in metadata"))
    eot, n_vocab, bos = meta.tokenizer.eot_id, meta.tokenizer.n_vocab, meta.tokenizer.bos_id
    boundaries = offsets[1:] - 1 if meta.eot_position == "after" else offsets[:-1]
    # A written BOS sits right before the text: at the document's start, or after its leading EOT.
    starts = offsets[:-1] if meta.eot_position == "after" else offsets[:-1] + 1
    starts = starts[starts < offsets[1:]] if bos is not None else starts[:0]
    tokens = (
        np.memmap(meta.abspath(shard.path), dtype=TOKEN_DTYPE, mode="r") if shard.n_tokens else np.zeros(0, TOKEN_DTYPE)
    )
    h = xxhash.xxh3_64()
    bad_eot = bad_bos = bad_ids = 0
    sums, small, damaged = _block_sums(meta, shard, problems), shard.block_tokens or BLOCK_TOKENS, []
    step = max(1, BLOCK_TOKENS // small) * small  # whole checksum blocks per read
    for start in range(0, shard.n_tokens, step):
        block = np.asarray(tokens[start : start + step])
        raw = np.ascontiguousarray(block).data.cast("B")
        h.update(raw)
        if sums is not None:
            damaged += [(start + at) // small for at in range(0, len(block), small)
                        if xxhash.xxh3_64_intdigest(raw[at * 4 : (at + small) * 4]) != int(sums[(start + at) // small])]
        if int(block.max()) >= n_vocab:
            bad_ids += int((block >= n_vocab).sum())
        elif report.token_counts is not None:
            report.token_counts += np.bincount(block, minlength=n_vocab)
        lo, hi = np.searchsorted(boundaries, [start, start + len(block)])
        bad_eot += int((block[boundaries[lo:hi] - start] != eot).sum())
        lo, hi = np.searchsorted(starts, [start, start + len(block)])
        bad_bos += int((block[starts[lo:hi] - start] != bos).sum())
    del tokens
    if h.hexdigest() != shard.xxh3_64 and not damaged:  # damaged blocks: named below, more precisely
        problems.append(Problem(shard.path, f"checksum {h.hexdigest()} != {shard.xxh3_64} in metadata (corrupt data)"))
    if damaged:
        listed = ", ".join(f"{k} (tokens {k * small:,}..{min((k + 1) * small, shard.n_tokens) - 1:,})"
                           for k in damaged[:5])  # fmt: skip
        more = f" and {len(damaged) - 5} more" if len(damaged) > 5 else ""
        problems.append(Problem(shard.path, f"block {listed}{more} of {small:,} tokens: does not match its checksum "
                                            f"in {shard.sums_path} (corrupt data)"))  # fmt: skip
    if bad_ids:
        problems.append(Problem(shard.path, f"{bad_ids} token ids >= n_vocab {n_vocab}"))
    if bad_eot:
        problems.append(Problem(shard.path, f"{bad_eot} document boundaries without the EOT token {eot}"))
    if bad_bos:
        problems.append(Problem(shard.path, f"{bad_bos} document starts without the BOS token {bos}"))


def _block_sums(meta: DatasetMeta, shard: ShardInfo, problems: list[Problem]) -> np.ndarray | None:
    """The shard's per-block sums (size checked by `check_shard_files`), held to their own
    checksum; None where the dataset keeps none, or after recording a damaged sums file."""
    if not shard.sums_path:
        return None
    raw = meta.abspath(shard.sums_path).read_bytes()
    if xxhash.xxh3_64_hexdigest(raw) != shard.sums_xxh3_64:
        problems.append(Problem(shard.sums_path, f"checksum {xxhash.xxh3_64_hexdigest(raw)} != {shard.sums_xxh3_64} "
                                                 "in metadata (corrupt block sums)"))  # fmt: skip
        return None
    return np.frombuffer(raw, dtype="<u8")


def report_json(report: Report, top: list[tuple[int, int, str]] | None = None) -> dict[str, Any]:
    """The machine-readable form of a report (`lmshard inspect --json`)."""
    meta = report.meta
    out: dict[str, Any] = {"dataset": str(report.root), "ok": report.ok, "quick": report.quick,
                           "problems": [str(p) for p in report.problems]}  # fmt: skip
    if meta is None:
        return out
    out["tokenizer"] = meta.tokenizer.to_json()
    out["dtype"], out["byte_order"], out["eot_position"] = "uint32", "little", meta.eot_position
    out["n_tokens"], out["n_docs"] = meta.n_tokens(), meta.n_docs()
    out["splits"] = {
        split: {"n_tokens": meta.n_tokens(split), "n_docs": meta.n_docs(split),
                "n_shards": len(meta.split_shards(split)), "doc_length_tokens": report.length_stats(split)}
        for split in meta.splits
    }  # fmt: skip
    out["doc_length_tokens"] = report.length_stats()
    out["drops"] = meta.drops
    out["records_read"] = meta.records_read
    if top is not None:
        out["top_tokens"] = [{"id": i, "count": c, "text": t} for i, c, t in top]
    return out
