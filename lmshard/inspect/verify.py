"""Check a prepared dataset against its metadata, and gather its statistics in the same pass.

Used by `lmshard inspect` and by tests. The metadata and structural checks it shares with the
runtime loader live in `lmshard.format` (schema.py and files.py), so both refuse the same
datasets: the metadata validates (totals included); per shard, its files lie inside the dataset
with the sizes the metadata means (the token file's in its encoding, the index (n_docs + 1) × 8
bytes), and the index starts at 0, increases strictly and ends at n_tokens. Here, unless
`quick`, in any shard encoding (chunks.py reads the blocks): the xxh3-64 checksums of the token
file, of each of its blocks' stored bytes and of the index match, a zstd shard's block offsets
match theirs and every frame decodes, and on the decoded tokens every id is below n_vocab and
an EOT token sits at every document boundary on the side the metadata records.

Memory model: one chunk of BLOCK_TOKENS tokens (64 MiB decoded, and its stored bytes) at a time,
one shard's index, a token histogram of n_vocab int64 counters (none above MAX_COUNTED_VOCAB
ids), and document lengths (uint32, sampled down to at most MAX_LENGTHS values for statistics),
and tokenizer_state.json (a few KB; refused above MAX_TOKENIZER_BYTES, as the tokenizer.json
copy, which is hashed in 1 MiB blocks), one shard's provenance file and attribute file (twice:
its bytes and its records). `quick` reads no token data at all: sizes and indexes only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ..errors import FormatError
from ..format import (
    INDEX_DTYPE,
    SPLITS,
    SRC_DTYPE,
    TOKENIZER_FILE,
    VOCAB_COPIES,
    DatasetMeta,
    ShardInfo,
    check_index,
    check_shard_files,
    dataset_file_size,
    file_xxh3,
    load_metadata,
    read_small,
)
from ..format.attributes import row_dtype, spans, to_rows
from .chunks import block_size, open_tokens, read_sums, stored_chunks

BLOCK_TOKENS = 16 << 20
MAX_LENGTHS = 16_000_000
MAX_COUNTED_VOCAB = 1 << 24  # ids: a histogram of 128 MiB; a larger n_vocab gets no top-token counts
FIX_SHARD = "re-run `lmshard prepare` with --overwrite to rebuild the dataset"
_SHARD_FILE = re.compile(r"shard_(\d{6,12})\.bin")  # (layout.shard_paths)


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
    _unlisted_shards(meta, report)
    return report


def _unlisted_shards(meta: DatasetMeta, report: Report) -> None:
    """A split's shard files past those its metadata lists: entries dropped from the metadata (its
    counts made to match), whose documents a reader would silently leave out. One listing of
    each split's folder."""
    for split in SPLITS:
        listed = len(meta.split_shards(split))
        try:
            names = os.listdir(meta.root / split)
        except OSError:
            continue
        extra = sorted(n for n in names if (m := _SHARD_FILE.fullmatch(n)) and int(m.group(1)) >= listed)
        if extra:
            report.problems.append(Problem(f"{meta.root / split / extra[0]}", f"a shard file the metadata does not "
                                           f"list ({len(extra)} such file{'s' if len(extra) > 1 else ''} in "
                                           f"{split}/, which lists {listed} shards): its documents are not read"))


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
    """The dedup key files `--append` reads: inside the dataset, n_keys × 8 bytes (signature
    files: n_keys × n_hashes × 4), and (unless quick) their checksums. A bad one does not harm
    training, but would make an append keep duplicates or drop new documents."""
    for f in meta.dedup.files if meta.dedup else ():
        try:
            size = dataset_file_size(meta.root, f.path)
        except FormatError as e:
            report.problems.append(Problem(f.path, str(e), fix=""))
            continue
        width = 8 if f.kind != "near" else 4 * near_hashes(meta)
        if size != f.n_keys * width:
            report.problems.append(Problem(f.path, f"{size} bytes, but 'n_keys' {f.n_keys} means {f.n_keys * width}"))
        elif not quick and (digest := file_xxh3(meta.root / f.path)) != f.xxh3_64:
            report.problems.append(Problem(f.path, f"checksum {digest} != {f.xxh3_64} in metadata"))


def near_hashes(meta: DatasetMeta) -> int:
    """The values per MinHash signature of a --near-dedup dataset's signature files."""
    minhash = (meta.dedup.near or {}).get("minhash", {}) if meta.dedup else {}
    return int(minhash.get("bands", 0)) * int(minhash.get("rows", 0))


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
    """Checksums (token file, its blocks, index) and the checks on decoded tokens of one shard,
    a chunk of whole blocks at a time (chunks.py)."""
    problems = report.problems
    idx_hash = xxhash.xxh3_64_hexdigest(offsets.astype(INDEX_DTYPE).tobytes())
    if idx_hash != shard.index_xxh3_64:
        problems.append(Problem(shard.path, f"index checksum {idx_hash} != {shard.index_xxh3_64} in metadata"))
    try:
        sums = read_sums(meta, shard)
    except FormatError as e:
        problems.append(Problem(shard.sums_path, str(e), fix=""))
        sums = None
    try:
        tokens = open_tokens(meta, shard)
    except FormatError as e:  # damaged block offsets: no frame can be found
        problems.append(Problem(shard.blocks_path or shard.path, str(e), fix=""))
        return
    scan, h, damaged, undecodable = _Scan(meta, offsets, report.token_counts), xxhash.xxh3_64(), [], []
    try:
        for chunk in stored_chunks(tokens, sums, block_size(meta, shard), BLOCK_TOKENS):
            h.update(chunk.data)
            damaged += chunk.damaged
            undecodable += [k for k in chunk.undecodable if k not in chunk.damaged]
            for start, decoded in chunk.runs:
                scan.check(start, decoded)
    finally:
        tokens.close()
    if h.hexdigest() != shard.xxh3_64 and not damaged:  # damaged blocks: named below, more precisely
        problems.append(Problem(shard.path, f"checksum {h.hexdigest()} != {shard.xxh3_64} in metadata (corrupt data)"))
    size = block_size(meta, shard)
    if damaged:
        problems.append(Problem(shard.path, f"{_blocks(damaged, size, shard.n_tokens)} of {size:,} tokens: does not "
                                            f"match its checksum in {shard.sums_path} (corrupt data)"))  # fmt: skip
    if undecodable:
        problems.append(Problem(shard.path, f"{_blocks(undecodable, size, shard.n_tokens)} of {size:,} tokens: does "
                                            f"not decode as {meta.encoding.describe()} (corrupt data)"))  # fmt: skip
    problems += [Problem(shard.path, what) for what in scan.findings()]
    if shard.src_path:
        _check_provenance(meta, shard, problems)
    if shard.attr_path:
        _check_attributes(meta, shard, problems)


def _check_provenance(meta: DatasetMeta, shard: ShardInfo, problems: list[Problem]) -> None:
    """The shard's provenance file: its checksum, and every document's source an input of the
    metadata's `sources` (12 bytes a document: read whole)."""
    data = meta.abspath(shard.src_path).read_bytes()
    digest = xxhash.xxh3_64_hexdigest(data)
    if digest != shard.src_xxh3_64:
        problems.append(Problem(shard.src_path, f"checksum {digest} != {shard.src_xxh3_64} in metadata (corrupt "
                                                "data)"))  # fmt: skip
        return
    src = np.frombuffer(data, dtype=SRC_DTYPE)
    if len(src) and int(src["source"].max()) >= len(meta.sources):
        problems.append(Problem(shard.src_path, f"a document's source {int(src['source'].max())} is not one of the "
                                                f"{len(meta.sources)} sources in the metadata"))  # fmt: skip


def _check_attributes(meta: DatasetMeta, shard: ShardInfo, problems: list[Problem]) -> None:
    """The shard's attribute file: its checksum and each column's, and every category an index of
    its labels (a record a document: read whole)."""
    data = meta.abspath(shard.attr_path).read_bytes()
    digest = xxhash.xxh3_64_hexdigest(data)
    at = spans(meta.attributes, shard.n_docs)
    sums = [xxhash.xxh3_64_hexdigest(data[a : a + n]) for a, n in at.values()]
    if digest != shard.attr_xxh3_64 or sums != list(shard.attr_column_xxh3_64):
        problems.append(Problem(shard.attr_path, f"checksum {digest} != {shard.attr_xxh3_64} in metadata, or a "
                                                 "column's differs from its 'attr_column_xxh3_64' (corrupt data)"))
        return
    rows = to_rows(data, row_dtype(meta.attributes), shard.n_docs)
    for f in meta.attributes:
        if f.dtype == "category" and len(rows) and int(rows[f.name].max()) >= len(f.labels):
            problems.append(Problem(shard.attr_path, f"a document's {f.name} {int(rows[f.name].max())} is not one of "
                                                     f"the {len(f.labels)} labels in the metadata"))  # fmt: skip


def _blocks(ks: list[int], size: int, n_tokens: int) -> str:
    """'block 3 (tokens 49,152..65,535), 7 (...) and 2 more': the first five blocks named."""
    listed = ", ".join(f"{k} (tokens {k * size:,}..{min((k + 1) * size, n_tokens) - 1:,})" for k in ks[:5])
    return f"block {listed}" + (f" and {len(ks) - 5} more" if len(ks) > 5 else "")


class _Scan:
    """The checks on decoded tokens, fed runs of them in shard order: ids below n_vocab (and
    their histogram), the EOT at every document boundary, the BOS at every document start."""

    def __init__(self, meta: DatasetMeta, offsets: np.ndarray, counts: np.ndarray | None) -> None:
        self.eot, self.n_vocab, self.bos, self.counts = (meta.tokenizer.eot_id, meta.tokenizer.n_vocab,
                                                         meta.tokenizer.bos_id, counts)  # fmt: skip
        self.boundaries = offsets[1:] - 1 if meta.eot_position == "after" else offsets[:-1]
        # A written BOS sits right before the text: at the document's start, or after its leading EOT.
        starts = offsets[:-1] if meta.eot_position == "after" else offsets[:-1] + 1
        self.starts = starts[starts < offsets[1:]] if self.bos is not None else starts[:0]
        self.bad_ids = self.bad_eot = self.bad_bos = 0

    def check(self, start: int, block: np.ndarray) -> None:
        """Tokens [start, start + len(block)) of the shard."""
        if int(block.max()) >= self.n_vocab:
            self.bad_ids += int((block >= self.n_vocab).sum())
        elif self.counts is not None:
            self.counts += np.bincount(block, minlength=self.n_vocab)
        lo, hi = np.searchsorted(self.boundaries, [start, start + len(block)])
        self.bad_eot += int((block[self.boundaries[lo:hi] - start] != self.eot).sum())
        lo, hi = np.searchsorted(self.starts, [start, start + len(block)])
        self.bad_bos += int((block[self.starts[lo:hi] - start] != self.bos).sum())

    def findings(self) -> list[str]:
        found = [f"{self.bad_ids} token ids >= n_vocab {self.n_vocab}"] if self.bad_ids else []
        found += [f"{self.bad_eot} document boundaries without the EOT token {self.eot}"] if self.bad_eot else []
        return found + ([f"{self.bad_bos} document starts without the BOS token {self.bos}"] if self.bad_bos else [])


def report_json(report: Report, top: list[tuple[int, int, str]] | None = None) -> dict[str, Any]:
    """The machine-readable form of a report (`lmshard inspect --json`)."""
    meta = report.meta
    out: dict[str, Any] = {"dataset": str(report.root), "ok": report.ok, "quick": report.quick,
                           "problems": [str(p) for p in report.problems]}  # fmt: skip
    if meta is None:
        return out
    out["tokenizer"] = meta.tokenizer.to_json()
    out["dtype"], out["byte_order"], out["eot_position"] = meta.encoding.dtype, "little", meta.eot_position
    out["encoding"] = meta.encoding.to_json() | {"bytes_per_token": bytes_per_token(meta)}
    out["n_tokens"], out["n_docs"] = meta.n_tokens(), meta.n_docs()
    out["splits"] = {
        split: {"n_tokens": meta.n_tokens(split), "n_docs": meta.n_docs(split),
                "n_shards": len(meta.split_shards(split)), "doc_length_tokens": report.length_stats(split)}
        for split in meta.splits
    }  # fmt: skip
    out["doc_length_tokens"] = report.length_stats()
    out["drops"] = meta.drops
    out["records_read"] = meta.records_read
    out["history"] = [dict(e) for e in meta.run.lineage]  # what made it, oldest first (the metadata's run.lineage)
    if top is not None:
        out["top_tokens"] = [{"id": i, "count": c, "text": t} for i, c, t in top]
    return out


def bytes_per_token(meta: DatasetMeta) -> float | None:
    """What the shards' token files take per token (4.0 for uint32; None for an empty dataset)."""
    n_tokens = meta.n_tokens()
    return round(sum(s.bin_bytes for s in meta.shards) / n_tokens, 3) if n_tokens else None


def encoding_summary(meta: DatasetMeta) -> str:
    """The summary's line on storage: "zstd (level 3, ...), 1.21 bytes per token"."""
    per = bytes_per_token(meta)
    return meta.encoding.describe() + (f", {per:g} bytes per token" if per is not None else "")
