"""`lmshard import`: a nanoGPT `train.bin`/`val.bin` pair, a directory of llm.c or
modded-nanogpt shards (`NAME_train_NNNNNN.bin`, `NAME_val_NNNNNN.bin`), or a Megatron-LM
`PREFIX.bin/.idx` turned into a complete lmshard dataset, so `lmshard inspect` can audit it and
lmshard's loader can train on it.

Documents are recovered from the separators (nanoGPT: a document ends after each EOT id; llm.c
and modded-nanogpt: each starts with it, and a document may run on into the next shard, as
llm.c's fineweb.py cuts them, so the dataset keeps `eot_position` "before") or
from Megatron's document index (each document must end with the EOD id, as `--append-eod`
writes it; an empty document, which Megatron's preprocess_data.py writes for an empty text, is
skipped and counted as dropped "empty"). The shards are written by prepare's own `ShardWriter`, the metadata is the same
`DatasetMeta` prepare writes, last, and the directory replaces `--out` only when complete.
Every document's provenance (`.src`, format/provenance.py) names its input (the split's file; for
llm.c, the shard it starts in) and its number there, from 1.

The input files are read by foreign.py, a block of whole documents at a time.

Memory model: foreign.py's (one block of input tokens and its uint32 copy, a document cut by a
block's end, Megatron's sequence offsets) and the shard writer's buffers.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import ConfigError, InputError
from ..format import (
    METADATA_FILE,
    SPLITS,
    TOKENIZER_FILE,
    DatasetMeta,
    DedupInfo,
    RunInfo,
    ShardInfo,
    SourceInfo,
    SplitInfo,
    TokenizerInfo,
    atomic_write_json,
    write_vocab_copy,
)
from ..format.encoding import Encoding
from ..format.provenance import records
from ..prepare.output.writer import ShardWriter
from ..remote.urls import local_only, output_url
from ..tokenizers import Tokenizer, is_hf_spec, load_tokenizer
from .foreign import LlmcBlocks, llmc_header, megatron_blocks, megatron_files, nanogpt_blocks
from .layouts import LLMC_HEADER_BYTES
from .output import staged_output
from .source import Block

IMPORT_FORMATS = ("nanogpt", "llmc", "modded-nanogpt", "megatron")
LLMC_FORMATS = ("llmc", "modded-nanogpt")  # shards of a 1 KiB header and tokens, the EOT id before each document
TOKENS_PER_SHARD = 100_000_000  # prepare's default


def import_dataset(src: str | os.PathLike[str], fmt: str, out: str | os.PathLike[str], *, tokenizer: str,
                   eot_id: int | None = None, val: str | os.PathLike[str] | None = None, force: bool = False,
                   tokens_per_shard: int = TOKENS_PER_SHARD,
                   shard_encoding: str = "uint32") -> DatasetMeta:  # fmt: skip
    """Import `src` into a new lmshard dataset at `out` and return its metadata.

        import_dataset("nanoGPT/data/owt", "nanogpt", "data/owt", tokenizer="gpt2")

    nanogpt: `src` is a directory holding train.bin and optionally val.bin. megatron: `src` is
    the prefix of the train split's .bin/.idx, `val` that of the val split (optional).
    `eot_id`: the separator id in the input (default: the tokenizer's end of text).
    `shard_encoding`: how the shards store tokens (uint32, uint16, packed, zstd: docs/format.md).
    `out` may be a URL: the dataset is built in a local work directory and published as
    `prepare` does."""
    local_only(src, "import SRC")
    if output_url(str(out)):
        from ..prepare.output.publish import Publisher

        publisher = Publisher(str(out), overwrite=force, hint="pass --force to replace it", resumable=False)
        publisher.claim()
        try:
            meta = import_dataset(src, fmt, publisher.mirror, tokenizer=tokenizer, eot_id=eot_id, val=val,
                                  tokens_per_shard=tokens_per_shard, shard_encoding=shard_encoding)  # fmt: skip
        except BaseException:  # (nothing uploaded yet: the prefix is left as it was, unlocked)
            publisher.abandon()
            raise
        publisher.publish(meta)
        return meta
    started = time.time()
    if fmt not in IMPORT_FORMATS:
        raise ConfigError(f"--from {fmt!r}: use one of {', '.join(IMPORT_FORMATS)}")
    if tokens_per_shard < 1:
        raise ConfigError(f"--tokens-per-shard {tokens_per_shard}: must be at least 1")
    inputs = _inputs(Path(src), fmt, Path(val) if val is not None else None)
    tok = load_tokenizer(tokenizer, "tokenizers" if is_hf_spec(tokenizer) else "tiktoken")
    eot = _default_separator(fmt, inputs, tok) if eot_id is None else eot_id
    if not 0 <= eot < tok.n_vocab:
        raise ConfigError(f"--eot-id {eot}: not an id of the {tok.name} vocabulary (0 .. {tok.n_vocab - 1})")
    encoding = Encoding.choose(shard_encoding, tok.n_vocab)
    with staged_output(out, force, [p for files in inputs.values() for p in files]) as staging:
        shards: list[ShardInfo] = []
        empty: dict[str, int] = {}  # split -> empty documents skipped
        partial: dict[str, int] = {}  # split -> the tail of a document begun in the shard before it, left out
        before = fmt in LLMC_FORMATS  # the EOT id starts each document
        kept: dict[int, int] = {}  # documents kept per input (metadata source)
        for split, files in inputs.items():
            reader: Iterable[Block]
            if fmt == "nanogpt":
                reader = nanogpt_blocks(files[0], eot)
            elif before:
                reader = LlmcBlocks(files, eot, fmt, split)
            else:
                reader = megatron_blocks(files[0], files[1])
            writer = ShardWriter(staging, split, tokens_per_shard, encoding=encoding, provenance=True)
            source = [at for at, (of, _) in enumerate(_source_files(fmt, inputs)) if of == split][0]
            written, empty[split] = _write_split(writer, iter(reader), files[0], (tok.n_vocab, eot), before, source,
                                                 kept)  # fmt: skip
            shards += written
            partial[split] = reader.partial if isinstance(reader, LlmcBlocks) else 0
        if not any(s.n_docs for s in shards if s.split == "train"):
            raise InputError(f"{src}: no documents to import into the train split (each document "
                             f"{'starts' if before else 'ends'} with the id {eot}; pass --eot-id if the files use "
                             "another)")  # fmt: skip
        meta = _metadata(Path(out), tok, eot, fmt, inputs, shards, (empty, partial, kept),
                         (tokens_per_shard, encoding), started, "before" if before else "after")  # fmt: skip
        state = tok.identity()
        state["eot_id"] = eot  # the separator the files use: inspect holds the two files to each other
        write_vocab_copy(staging, tok.vocab_format, tok.vocab_bytes)
        atomic_write_json(staging / TOKENIZER_FILE, state)
        atomic_write_json(staging / METADATA_FILE, meta.to_json())  # last: its presence means complete
    return meta


def _inputs(src: Path, fmt: str, val: Path | None) -> dict[str, list[Path]]:
    """split -> the input files of that split (nanoGPT: [bin]; Megatron: [bin, idx])."""
    if fmt in LLMC_FORMATS:
        if val is not None:
            raise ConfigError(f"--val is for --from megatron; a {fmt} directory holds its own val shards")
        found = {split: sorted({*src.glob(f"*_{split}_*.bin"), *src.glob(f"*_{split}.bin")}) for split in SPLITS
                 } if src.is_dir() else {}  # (llm.c's starter sets: tiny_shakespeare_train.bin)  # fmt: skip
        if not found.get("train"):
            raise InputError(f"{src}: not a {fmt} data directory (no NAME_train_NNNNNN.bin or NAME_train.bin in it)")
        return {split: files for split, files in found.items() if files}
    if fmt == "nanogpt":
        if val is not None:
            raise ConfigError("--val is for --from megatron; a nanoGPT directory holds its own val.bin")
        if not src.is_dir() or not (src / "train.bin").is_file():
            raise InputError(f"{src}: not a nanoGPT data directory (no train.bin in it)")
        return {split: [src / f"{split}.bin"] for split in SPLITS if (src / f"{split}.bin").is_file()}
    found = {"train": megatron_files(src)}
    if val is not None:
        found["val"] = megatron_files(val)
    return found


def _source_files(fmt: str, inputs: dict[str, list[Path]]) -> list[tuple[str, Path]]:
    """The inputs the metadata lists as sources, in order, with their splits: each llm.c shard
    (a document's is the shard it starts in), else each split's file."""
    return [(split, p) for split, files in inputs.items() for p in (files if fmt in LLMC_FORMATS else files[:1])]


def _default_separator(fmt: str, inputs: dict[str, list[Path]], tok: Tokenizer) -> int:
    """The separator id the input files use when --eot-id is not given. nanoGPT and Megatron:
    the vocabulary's end of text. llm.c shards: the id their first shard (val first) begins with,
    where that is the vocabulary's end of text or BOS (llm.c's Llama 3 fineweb.py starts each
    document with <|begin_of_text|>; lmshard's export, with the end of text); else the end of
    text, or the BOS in uint32 (Llama 3) shards."""
    if fmt not in LLMC_FORMATS:
        return int(tok.eot_id)
    first = (inputs.get("val") or inputs["train"])[0]
    dtype, n_tokens = llmc_header(first, fmt)
    if n_tokens:
        token = int(np.fromfile(first, dtype=dtype, count=1, offset=LLMC_HEADER_BYTES)[0])
        if token in (tok.eot_id, tok.bos_id):
            return token
    return int(tok.bos_id) if dtype.itemsize == 4 and tok.bos_id is not None else int(tok.eot_id)


def _write_split(writer: ShardWriter, reader: Iterator[Block], path: Path, vocab: tuple[int, int],
                 before: bool = False, source: int = 0,
                 kept_by: dict[int, int] | None = None) -> tuple[list[ShardInfo], int]:  # fmt: skip
    """Documents of one split through prepare's ShardWriter (in the dataset's encoding), held
    to the vocabulary (n_vocab, eot): every id below n_vocab, the EOT id at the end of every
    document (`before`: at its start). Empty documents (no tokens, not even the EOT id) are
    skipped; returns the shards and how many were skipped. Each document's provenance names its
    input (`source`, the split's first in the metadata's sources, plus the block's file index)
    and its number there, from 1, skipped ones counted; `kept_by` counts those kept per source."""
    (n_vocab, eot), empty, read = vocab, 0, 0
    try:
        for block in reader:
            if block.origin is None:  # one input file: documents numbered as read
                sources, numbers = np.full(len(block.lengths), source), read + 1 + np.arange(len(block.lengths))
            else:
                sources, numbers = source + block.origin[0], block.origin[1]
            read += len(block.lengths)
            if not (kept := block.lengths > 0).all():
                empty += int((~kept).sum())
                block, sources, numbers = Block(block.tokens, block.lengths[kept]), sources[kept], numbers[kept]
            if not len(block.lengths):
                continue
            if (top := int(block.tokens.max())) >= n_vocab:
                raise InputError(f"{path}: token id {top} is outside the tokenizer's vocabulary ({n_vocab:,} ids); "
                                 "pass the --tokenizer the data was made with")  # fmt: skip
            ends = np.cumsum(block.lengths)
            at = ends - block.lengths if before else ends - 1
            if before and (missing := int((block.tokens[at] != eot).sum())) != 0:
                raise InputError(f"{path}: {missing} documents do not start with the EOT id {eot} (pass the "
                                 "separator the data uses with --eot-id)")  # fmt: skip
            if not before and (missing := int((block.tokens[at] != eot).sum())) != 0:
                raise InputError(f"{path}: {missing} documents do not end with the EOT id {eot} (Megatron: prepare "
                                 "with --append-eod; or pass the separator the data uses with --eot-id)")  # fmt: skip
            writer.add(block.tokens, block.lengths, records(sources, numbers))
            if kept_by is not None:
                for at, n in zip(*np.unique(sources, return_counts=True), strict=True):
                    kept_by[int(at)] = kept_by.get(int(at), 0) + int(n)
        return writer.close(), empty
    except BaseException:
        writer.abort()
        raise


def _metadata(out: Path, tok: Tokenizer, eot: int, fmt: str, inputs: dict[str, list[Path]], shards: list[ShardInfo],
              left_out: tuple[dict[str, int], dict[str, int], dict[int, int]], layout: tuple[int, Encoding],
              started: float, eot_position: str = "after") -> DatasetMeta:  # fmt: skip
    """`left_out`: per split, the empty documents skipped and the partial one (llm.c) left out;
    and the documents kept per source."""
    tokens_per_shard, encoding = layout
    empty, partial, kept = left_out

    def dropped(split: str) -> dict[str, int]:
        return {k: v for k, v in (("empty", empty.get(split, 0)), ("partial_document", partial.get(split, 0))) if v}

    splits = {split: SplitInfo.of(tuple(s for s in shards if s.split == split)) for split in SPLITS}
    sources = []
    for at, (split, path) in enumerate(_source_files(fmt, inputs)):
        first = inputs[split][0] == path  # a split's dropped documents are its first input's
        size = path.stat().st_size if fmt in LLMC_FORMATS else sum(p.stat().st_size for p in inputs[split])
        lost = dropped(split) if first else {}
        sources.append(SourceInfo(path=str(path), format=fmt, bytes=size, records=kept.get(at, 0) + sum(lost.values()),
                                  kept=kept.get(at, 0), dropped=lost))  # fmt: skip
    drops = {k: v for k, v in (("empty", sum(empty.values())), ("partial_document", sum(partial.values()))) if v}
    elapsed = time.time() - started
    n_tokens = sum(s.n_tokens for s in shards)
    return DatasetMeta(
        root=out, lmshard_version=__version__, eot_position=eot_position, encoding=encoding,
        tokenizer=TokenizerInfo(name=tok.name, backend=tok.backend, n_vocab=tok.n_vocab, eot_id=eot, bos_id=None,
                                ranks_sha256=tok.vocab_sha256, vocab_format=tok.vocab_format),
        splits=splits, total_tokens=n_tokens, total_docs=sum(s.n_docs for s in shards),
        records_read=sum(s.n_docs for s in shards) + sum(drops.values()), drops=drops,
        dedup=DedupInfo(mode="none", key="", duplicates_removed=0, lines=False, lines_removed=0),
        sources=tuple(sources),
        config={"imported_from": fmt, "inputs": {split: [str(p) for p in files] for split, files in inputs.items()},
                "tokenizer": tok.name, "tokens_per_shard": tokens_per_shard, "eot_position": eot_position},
        run=RunInfo(out=str(out), started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                    elapsed_s=round(elapsed, 3), tokens_per_s=round(n_tokens / elapsed, 1) if elapsed > 0 else None,
                    python=platform.python_version(), host=platform.node(),
                    lineage=(RunInfo.step("import", started, sum(s.n_docs for s in shards), n_tokens, __version__,
                                          **{"from": fmt}),)),
    )  # fmt: skip
