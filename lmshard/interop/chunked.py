"""`lmshard export --to litdata | mds | olmo`: the formats of streaming loaders, a folder per split.

- **litdata** (Lightning's `litdata`, litgpt's pretraining data): `OUT/train/` and `OUT/val/`,
  each `index.json` and `chunk-0-N.bin`, written by litdata's own `BinaryWriter` with its
  `TokensLoader`: one item per document (a tensor of its tokens, as litgpt's prepare scripts
  write them), chunks of about `--tokens-per-shard` tokens. Read with
  `StreamingDataset(OUT/train, item_loader=TokensLoader(block_size=T + 1))`.
- **mds** (MosaicML `streaming`, llm-foundry's `StreamingTextDataset`): `OUT/train/` and
  `OUT/val/`, each `index.json` (version 2) and `shard.NNNNN.mds`: one sample per document, or
  with `--concat-tokens N` samples of exactly N tokens of the concatenated documents (what
  llm-foundry trains on: its text dataset cuts each sample at `max_seq_len`), one column
  `tokens` of encoding `ndarray:uint16` (vocabularies up to 65,536 ids) or `ndarray:int32`,
  shards of at most `--tokens-per-shard` tokens' bytes (and under 4 GiB, the format's uint32
  offsets), each with its xxh64 in the index (`validate_hash="xxh64"`).
- **olmo** (OLMo-core's numpy datasets, dolma's tokenizer output): `OUT/train/part-NNNNN.npy`
  and `.csv.gz` beside each: the tokens as a raw array (no `.npy` header: OLMo-core memmaps
  it), uint16 or uint32, the EOS after each document; the metadata file a row
  `start,end,id,src,loc` per document (token offsets, end exclusive), which OLMo-core's
  `get_document_indices` reads.

Every document keeps its tokens as the dataset holds them (a BOS stays; olmo moves the
separator after the text, as dolma writes it). Files are whole documents each.

Memory model: one block of the source (`source.BLOCK_TOKENS` tokens) and its converted copy;
litdata's writer holds up to one chunk of serialized documents before it writes the chunk; an
MDS shard's offsets (4 bytes a document) until the shard closes.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import xxhash

from ..errors import ConfigError
from .layouts import UINT16_IDS
from .output import TokenFile
from .source import Block, Job, blocks

MDS_MAX_BYTES = (1 << 32) - 1  # a shard's offsets are uint32
LITDATA_MAX_BYTES = (1 << 31) - 1  # a chunk's item offsets are uint32: chunks kept under 2 GiB
MDS_TOKENS = "tokens"  # the column llm-foundry's StreamingTextDataset reads


def token_dtype(n_vocab: int) -> np.dtype:
    """uint16 where the vocabulary fits, else int32 (torch and MDS have no usable uint32)."""
    return np.dtype("<u2") if n_vocab <= UINT16_IDS else np.dtype("<i4")


def _documents(job: Job, split: str, side: str) -> Iterator[np.ndarray]:
    """The split's documents in order, each an array of its tokens (a view into its block)."""
    dtype = token_dtype(job.meta.tokenizer.n_vocab)
    block: Block
    for block in blocks(job.meta, split, side):
        tokens, ends = block.tokens.astype(dtype), np.cumsum(block.lengths)
        for a, b in zip((ends - block.lengths).tolist(), ends.tolist(), strict=True):
            yield tokens[a:b]


def _entry(path: str, split: str, job: Job) -> dict[str, Any]:
    return {"path": path, "split": split, "n_tokens": job.meta.n_tokens(split), "n_docs": job.meta.n_docs(split)}


def litdata_files(job: Job) -> list[dict[str, Any]]:
    """Per split, a litdata dataset written by litdata's own writer (TokensLoader chunks)."""
    try:
        import torch
        from litdata.streaming.item_loader import TokensLoader
        from litdata.streaming.writer import BinaryWriter
        from litdata.utilities.env import _DistributedEnv
    except ImportError:
        raise ConfigError("--to litdata writes with litdata's own writer: pip install litdata") from None
    itemsize = token_dtype(job.meta.tokenizer.n_vocab).itemsize
    chunk_bytes = min(job.tokens_per_shard * itemsize, LITDATA_MAX_BYTES)
    files = []
    for split in job.splits:
        folder = job.root / split
        writer = BinaryWriter(str(folder), chunk_bytes=chunk_bytes, item_loader=TokensLoader())
        # One writer, whatever the environment says: litdata takes its rank and world size from
        # torch.distributed or WORLD_SIZE / GLOBAL_RANK (set under torchrun), and its merge would
        # wait for the index files of writers that do not exist.
        writer._distributed_env, writer._rank = _DistributedEnv(1, 0, 1), 0
        for index, doc in enumerate(_documents(job, split, job.meta.eot_position)):
            writer.add_item(index, torch.from_numpy(doc.copy()))  # (its own memory: the block is reused)
        writer.done()
        writer._merge_no_wait()
        files.append(_entry(split, split, job))
    return files


def mds_files(job: Job) -> list[dict[str, Any]]:
    """Per split, an MDS dataset: `index.json` and shards of one `tokens` ndarray per document."""
    dtype = token_dtype(job.meta.tokenizer.n_vocab)
    encoding = f"ndarray:{dtype.name}"
    limit = min(job.tokens_per_shard * dtype.itemsize, MDS_MAX_BYTES)
    files = []
    for split in job.splits:
        (job.root / split).mkdir()
        shards = _MdsShards(job.root / split, encoding, limit)
        entry = _entry(split, split, job)
        if job.concat_tokens:
            entry |= _concatenated(job, split, shards)
        else:
            for doc in _documents(job, split, job.meta.eot_position):
                shards.add(doc)
        shards.finish()
        index = {"shards": shards.index, "version": 2}
        out = TokenFile(job.root / split / "index.json")
        out.write(json.dumps(index, sort_keys=True).encode())
        out.close()
        files.append(entry)
    return files


def _concatenated(job: Job, split: str, shards: _MdsShards) -> dict[str, Any]:
    """Samples of exactly `concat_tokens` tokens cut from the split's documents in order (their
    separators included), as llm-foundry's `--concat_tokens` writes them; the tail shorter than a
    sample is left out, and counted."""
    n, dtype = job.concat_tokens or 0, token_dtype(job.meta.tokenizer.n_vocab)
    carry, samples = np.zeros(0, dtype), 0
    for block in blocks(job.meta, split, job.meta.eot_position):
        tokens = np.concatenate([carry, block.tokens.astype(dtype)])
        whole = len(tokens) // n * n
        for start in range(0, whole, n):
            shards.add(tokens[start : start + n])
        samples, carry = samples + whole // n, tokens[whole:]
    if not samples:
        raise ConfigError(f"--concat-tokens {n:,}: the {split} split has {len(carry):,} tokens, less than one sample")
    return {"samples": samples, "concat_tokens": n, "tail_left_out": len(carry)}


class _MdsShards:
    """MDS shards of one split, as streaming's MDSWriter lays them out: uint32 sample count,
    uint32 offsets of the samples (count + 1, from the file's start), the shard's config as JSON,
    then the samples. A sample here is its one variable-size column: a uint32 size, then the
    ndarray (a byte of ndim << 2 | shape dtype, the shape in that dtype, the values)."""

    def __init__(self, folder: Any, encoding: str, limit: int) -> None:
        self.folder, self.limit = folder, limit
        self.config = {"column_encodings": [encoding], "column_names": [MDS_TOKENS], "column_sizes": [None],
                       "compression": None, "format": "mds", "hashes": ["xxh64"], "size_limit": limit,
                       "version": 2}  # fmt: skip
        self.header = json.dumps(self.config, sort_keys=True).encode()
        self.index: list[dict[str, Any]] = []
        self._samples: list[bytes] = []
        self._bytes = 0

    def add(self, doc: np.ndarray) -> None:
        n = len(doc)
        shape = np.array([n], dtype="<u1" if n < 1 << 8 else "<u2" if n < 1 << 16 else "<u4")
        code = {1: 0, 2: 1, 4: 2}[shape.itemsize]
        body = bytes([1 << 2 | code]) + shape.tobytes() + doc.tobytes()
        sample = np.uint32(len(body)).tobytes() + body
        if self._samples and self._size(len(self._samples) + 1, self._bytes + len(sample)) > self.limit:
            self.finish()
        if self._size(1, len(sample)) > MDS_MAX_BYTES:
            raise ConfigError(f"a document of {n:,} tokens does not fit an MDS shard (offsets are uint32)")
        self._samples.append(sample)
        self._bytes += len(sample)

    def _size(self, samples: int, body: int) -> int:
        return 4 * (samples + 2) + len(self.header) + body

    def finish(self) -> None:
        """Write the open shard and add its entry to the index."""
        if not self._samples:
            return
        n = len(self._samples)
        start = 4 * (n + 2) + len(self.header)
        offsets = start + np.concatenate([[0], np.cumsum([len(s) for s in self._samples])])
        name = f"shard.{len(self.index):05d}.mds"
        raw = io.BytesIO()
        raw.write(np.uint32(n).tobytes() + offsets.astype("<u4").tobytes() + self.header)
        for sample in self._samples:
            raw.write(sample)
        data = raw.getvalue()
        out = TokenFile(self.folder / name)
        out.write(data)
        out.close()
        self.index.append({**self.config, "raw_data": {"basename": name, "bytes": len(data),
                                                       "hashes": {"xxh64": xxhash.xxh64_hexdigest(data)}},
                           "samples": n, "zip_data": None})  # fmt: skip
        self._samples, self._bytes = [], 0


def olmo_files(job: Job) -> list[dict[str, Any]]:
    """Per split, raw token arrays with the EOS after each document and dolma's metadata files."""
    files = []
    for split in job.splits:
        (job.root / split).mkdir()
        parts = _OlmoParts(job, split)
        for block in blocks(job.meta, split, "after"):
            parts.add(block)
        parts.finish()
        files.append(_entry(split, split, job))
    return files


class _OlmoParts:
    """A split's `part-NNNNN.npy` files of whole documents: a file closes before a document that
    would take it past --tokens-per-shard (a longer document gets a file of its own), and its
    metadata rows are written beside it (in memory until then: ~40 bytes a document)."""

    def __init__(self, job: Job, split: str) -> None:
        self.job, self.split = job, split
        self.dtype = np.dtype("<u2") if job.meta.tokenizer.n_vocab <= UINT16_IDS else np.dtype("<u4")
        self.source = os.path.basename(os.path.realpath(job.meta.root))
        self.part = self.n_tokens = self.doc = 0
        self.rows: list[str] = []
        self.out: TokenFile | None = None

    def add(self, block: Block) -> None:
        tokens, lengths = block.tokens, block.lengths
        if self.job.eod_id is not None:  # (--eod-id: written at each document end in place of the separator)
            tokens = tokens.copy()
            tokens[np.cumsum(lengths) - 1] = self.job.eod_id
        while len(lengths):
            ends = np.cumsum(lengths)
            fit = int(np.searchsorted(ends, self.job.tokens_per_shard - self.n_tokens, side="right"))
            if fit == 0 and self.n_tokens:
                self.finish()
                continue
            fit, path = max(fit, 1), self.job.root / self.split / f"part-{self.part:05d}.npy"
            cut = int(ends[fit - 1])
            self.out = self.out or TokenFile(path)
            self.out.write(tokens[:cut].astype(self.dtype))
            for a, b in zip((self.n_tokens + ends[:fit] - lengths[:fit]).tolist(),
                            (self.n_tokens + ends[:fit]).tolist(), strict=True):  # fmt: skip
                self.rows.append(f"{a},{b},{self.split}-{self.doc},{self.source},{self.doc}\n")
                self.doc += 1
            self.n_tokens += cut
            tokens, lengths = tokens[cut:], lengths[fit:]

    def finish(self) -> None:
        """Close the open part and write its metadata (gzip without a time stamp: the same
        dataset gives the same bytes)."""
        if self.out is None:
            return
        self.out.close()
        name = f"{self.split}/part-{self.part:05d}"
        meta = TokenFile(self.job.root / f"{name}.csv.gz")
        meta.write(gzip.compress("".join(self.rows).encode(), mtime=0))
        meta.close()
        self.part, self.n_tokens, self.rows, self.out = self.part + 1, 0, [], None
