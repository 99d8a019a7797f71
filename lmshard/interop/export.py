"""`lmshard export`: an lmshard dataset written in the format another trainer reads (nanoGPT,
llm.c, modded-nanogpt, Megatron-LM, Hugging Face `datasets`; the layouts are in `layouts.py`; the
streaming loaders' folder formats, litdata, MosaicML MDS and OLMo-core's, in `chunked.py`).

The source is read, never written: checked cheaply (`source.open_source`), then streamed shard by
shard in blocks of whole documents, each block converted (separator side, dtype) and appended to
the output files. Every file is written under a temporary name, fsynced and renamed, inside a
directory that replaces `--out` only when the export is complete (`output.staged_output`).

Memory model: one block of the source (`source.BLOCK_TOKENS` tokens) and its converted copy;
Megatron's index sections are written in place as the blocks pass, never gathered; `datasets`
writes its arrow files from a generator, a batch of rows at a time.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..errors import ConfigError
from ..format import TOKENIZER_FILE, DatasetMeta
from ..remote.urls import is_url, local_only, redact
from . import chunked
from .layouts import (
    FORMATS,
    LLMC_MAX_TOKENS,
    LLMC_TOKENS_PER_SHARD,
    LLMC_V1,
    LLMC_V7,
    MEGATRON_HEADER,
    MEGATRON_MAGIC,
    MEGATRON_VERSION,
    UINT16_IDS,
    llmc_header,
    megatron_dtype,
)
from .output import PROVENANCE_FILE, TokenFile, staged_output
from .source import Block, Job, blocks, open_source

INT32_MAX = (1 << 31) - 1
GPT2_EOT = 50256  # the id modded-nanogpt's train_gpt.py looks for at document starts


@dataclass
class ExportResult:
    """What an export wrote: the output directory, and per file its split and counts."""

    out: Path
    format: str
    token_dtype: str
    eot_position: str
    files: list[dict[str, Any]] = field(default_factory=list)


def export_dataset(dataset: str | os.PathLike[str], to: str, out: str | os.PathLike[str], *, split: str = "all",
                   force: bool = False, tokens_per_shard: int = LLMC_TOKENS_PER_SHARD,
                   name: str | None = None, eod_id: int | None = None, source: str = "",
                   concat_tokens: int | None = None) -> ExportResult:  # fmt: skip
    """Write `split` (train, val or all) of the dataset at `dataset` to `out` in format `to`.

        export_dataset("data/mycorpus", "nanogpt", "nanoGPT/data/mycorpus")

    `tokens_per_shard` sizes llm.c and modded-nanogpt files; `name` is their file-name (and
    Megatron's prefix) stem: by default the dataset directory's name (`fineweb` for
    modded-nanogpt, whose train_gpt.py globs `fineweb_train_*.bin`). `eod_id` (megatron): the
    end-of-document id the trainer's tokenizer uses, written at each document end in place of
    the dataset's separator where the two differ (olmo too). `concat_tokens` (mds): samples of
    that many tokens of the concatenated documents, as llm-foundry trains on. A dataset at a URL
    is fetched to a temporary directory first (each file held to its checksum), and exported
    from there."""
    local_only(out, "export --out")
    if is_url(str(dataset)):
        from ..inspect.remote import download

        url = str(dataset)
        with tempfile.TemporaryDirectory(prefix="lmshard-export-") as tmp:
            local = Path(tmp) / url.rstrip("/").rsplit("/", 1)[-1]
            download(url, local)
            return export_dataset(local, to, out, split=split, force=force, tokens_per_shard=tokens_per_shard,
                                  name=name, eod_id=eod_id, source=redact(url),
                                  concat_tokens=concat_tokens)  # fmt: skip
    if to not in FORMATS:
        raise ConfigError(f"--to {to!r}: use one of {', '.join(FORMATS)}")
    if not 0 < tokens_per_shard <= LLMC_MAX_TOKENS:
        raise ConfigError(f"--tokens-per-shard {tokens_per_shard}: use 1 .. {LLMC_MAX_TOKENS:,} (an int32 count)")
    if concat_tokens is not None and (to != "mds" or concat_tokens < 1):
        raise ConfigError(f"--concat-tokens {concat_tokens}: a sample length (1 or more) for --to mds")
    meta, splits = open_source(dataset, split)
    if not splits:
        raise ConfigError(f"{dataset}: the dataset holds no documents; nothing to export")
    dtype, eot_position, write = _plan(to, meta)
    if eod_id is not None and to not in ("megatron", "olmo"):
        raise ConfigError(f"--eod-id is for --to megatron and olmo; {to} finds documents by the separator the dataset "
                          "has")  # fmt: skip
    eod_id = _megatron_eod(meta, eod_id) if to == "megatron" else _olmo_eod(meta, eod_id) if to == "olmo" else None
    stem = name or ("fineweb" if to == "modded-nanogpt" else meta.root.resolve().name)
    result = ExportResult(Path(os.path.realpath(out)), to, dtype, eot_position)
    with staged_output(out, force, [meta.root], _trainer_files(to, stem)) as staging:
        job = Job(meta=meta, splits=splits, root=staging, name=stem, tokens_per_shard=tokens_per_shard, eod_id=eod_id,
                  source=source, concat_tokens=concat_tokens)  # fmt: skip
        result.files = write(job)
        _write_provenance(job, result)
    return result


Writer = Callable[[Job], list[dict[str, Any]]]


def _plan(to: str, meta: DatasetMeta) -> tuple[str, str, Writer]:
    """(token dtype, separator side, writer) for format `to`; ConfigError when the format
    cannot hold the dataset's vocabulary."""
    n_vocab = meta.tokenizer.n_vocab
    if to in ("nanogpt", "modded-nanogpt") and n_vocab > UINT16_IDS:
        raise ConfigError(f"--to {to} stores uint16 tokens (ids up to 65,535), but the {meta.tokenizer.name} "
                          f"vocabulary has {n_vocab:,} ids; use --to llmc (uint32) or megatron (int32)")  # fmt: skip
    if to == "nanogpt":
        return "uint16", "after", _nanogpt
    if to == "modded-nanogpt":
        if meta.tokenizer.eot_id != GPT2_EOT:
            sep = meta.tokenizer.eot_id
            raise ConfigError(f"--to modded-nanogpt: its train_gpt.py finds documents by the id {GPT2_EOT} (GPT-2's "
                              f"<|endoftext|>), but this dataset separates them with {sep}; prepare with the "
                              "gpt2 vocabulary and its default separator, or use --to llmc")  # fmt: skip
        return "uint16", "before", lambda job: _llmc_files(job, LLMC_V1)
    if to == "llmc":
        version = LLMC_V1 if n_vocab <= UINT16_IDS else LLMC_V7
        return version[2].name, "before", lambda job: _llmc_files(job, version)
    if to == "hf":
        return "int32", meta.eot_position, _hf
    if to in ("litdata", "mds"):
        dtype = chunked.token_dtype(n_vocab)
        return dtype.name, meta.eot_position, \
            (chunked.litdata_files if to == "litdata" else chunked.mds_files)  # fmt: skip
    if to == "olmo":
        return ("uint16" if n_vocab <= UINT16_IDS else "uint32"), "after", chunked.olmo_files
    if n_vocab > INT32_MAX + 1:
        raise ConfigError(f"--to megatron stores int32 tokens, but the vocabulary has {n_vocab:,} ids")
    return megatron_dtype(n_vocab)[1].name, "after", _megatron


def _entry(path: str, split: str, n_tokens: int, n_docs: int) -> dict[str, Any]:
    return {"path": path, "split": split, "n_tokens": n_tokens, "n_docs": n_docs}


def _nanogpt(job: Job) -> list[dict[str, Any]]:
    """`train.bin` / `val.bin`: uint16 tokens, EOT after each document, no header."""
    files = []
    for split in job.splits:
        out = TokenFile(job.root / f"{split}.bin")
        n_tokens = n_docs = 0
        for block in blocks(job.meta, split, "after"):
            out.write(block.tokens.astype("<u2"))
            n_tokens, n_docs = n_tokens + len(block.tokens), n_docs + len(block.lengths)
        out.close()
        files.append(_entry(f"{split}.bin", split, n_tokens, n_docs))
    return files


class _LlmcShards:
    """llm.c shard files of one token stream: NAME_SPLIT_NNNNNN.bin, numbered by one counter
    over the splits (val first, as llm.c's fineweb.py does). A shard holds whole documents (it
    closes before a document that would take it past `capacity`), so each one starts with an
    EOT token: the document starts modded-nanogpt aligns its batches on."""

    def __init__(self, job: Job, version: tuple[int, int, np.dtype]) -> None:
        self.job, (self.magic, self.version, self.dtype) = job, version
        self.number = 0
        self.files: list[dict[str, Any]] = []
        self._out: TokenFile | None = None
        self._split, self._tokens, self._docs = "", 0, 0
        self._total = self._done = self._end = 0

    def start(self, split: str) -> None:
        """Size this split's files evenly: as few as --tokens-per-shard allows (ceil(total / N)),
        each cut at the last document end before its share of the split, so no file is a short
        tail (llm.c's loader needs B·T+1 tokens in every file). A file can pass N by less than
        one document; after a document longer than a share, the rest is shared out again."""
        self._total = self.job.meta.n_tokens(split)
        self._done = 0
        self._end = self._share()

    def _share(self) -> int:
        """Where the next file ends, in tokens of the split: an equal share of what is left."""
        left = self._total - self._done
        files = max(1, -(-left // self.job.tokens_per_shard))
        return self._done + left // files if files > 1 else self._total

    def add(self, split: str, block: Block) -> None:
        tokens, lengths = block.tokens, block.lengths
        self._split = split
        while len(lengths):
            ends = np.cumsum(lengths)
            fit = int(np.searchsorted(ends, self._end - self._done, side="right"))
            if fit == 0 and self._tokens == 0:
                fit = 1  # a document that passes its file's share gets a file of its own
                if lengths[0] > LLMC_MAX_TOKENS:
                    raise ConfigError(f"a document of {int(lengths[0]):,} tokens does not fit an llm.c file "
                                      f"(at most {LLMC_MAX_TOKENS:,} tokens)")  # fmt: skip
            if fit == 0:
                self.finish()
                continue
            cut = int(ends[fit - 1])
            if self._out is None:
                path = self.job.root / f"{self.job.name}_{split}_{self.number:06d}.bin"
                self._out = TokenFile(path, llmc_header(self.magic, self.version, 0))
            self._out.write(tokens[:cut].astype(self.dtype))
            self._tokens, self._docs, self._done = self._tokens + cut, self._docs + fit, self._done + cut
            tokens, lengths = tokens[cut:], lengths[fit:]
            if len(lengths):
                self.finish()

    def finish(self) -> None:
        """Close the open shard, its header now holding its token count."""
        if self._out is None:
            return
        path = self._out.close(llmc_header(self.magic, self.version, self._tokens))
        self.files.append(_entry(path.name, self._split, self._tokens, self._docs))
        self._out, self._tokens, self._docs = None, 0, 0
        self.number += 1
        self._end = self._share()


def _llmc_files(job: Job, version: tuple[int, int, np.dtype]) -> list[dict[str, Any]]:
    """llm.c / modded-nanogpt shards: 256-int32 header, then the tokens, EOT before each document."""
    shards = _LlmcShards(job, version)
    for split in sorted(job.splits, key=lambda s: s != "val"):  # val first: shard 000000, as llm.c numbers them
        shards.start(split)
        for block in blocks(job.meta, split, "before"):
            shards.add(split, block)
        shards.finish()
    return shards.files


def _megatron(job: Job) -> list[dict[str, Any]]:
    """Per split, Megatron's NAME_SPLIT_text_document.bin/.idx: one sequence per document,
    the EOD token after its text (`--append-eod`)."""
    code, dtype = megatron_dtype(job.meta.tokenizer.n_vocab)
    files = []
    for split in job.splits:
        prefix = f"{job.name}_{split}_text_document"
        n = job.meta.n_docs(split)
        tokens_out = TokenFile(job.root / f"{prefix}.bin")
        index = TokenFile(job.root / f"{prefix}.idx", MEGATRON_HEADER.pack(MEGATRON_MAGIC, MEGATRON_VERSION, code,
                                                                           n, n + 1))  # fmt: skip
        lengths_at = MEGATRON_HEADER.size  # n int32 lengths, then n int64 byte pointers, then n + 1 int64
        pointers_at, documents_at = lengths_at + 4 * n, lengths_at + 12 * n
        done = n_tokens = 0
        for block in blocks(job.meta, split, "after"):
            if int(block.lengths.max()) > INT32_MAX:
                raise ConfigError(f"a document of {int(block.lengths.max()):,} tokens is longer than Megatron's "
                                  "int32 sequence length")  # fmt: skip
            starts = n_tokens + np.cumsum(block.lengths) - block.lengths  # in tokens
            index.write_at(lengths_at + 4 * done, block.lengths.astype("<i4"))
            index.write_at(pointers_at + 8 * done, (starts * dtype.itemsize).astype("<i8"))
            tokens = block.tokens.astype(dtype)
            if job.eod_id is not None:
                tokens[np.cumsum(block.lengths) - 1] = job.eod_id  # each document's last token: its separator
            tokens_out.write(tokens)
            done, n_tokens = done + len(block.lengths), n_tokens + len(block.tokens)
        assert done == n, (done, n)  # the metadata's count, checked against the shards' indexes
        step = 1 << 20  # document indices 0 .. n (document i is sequence i), 8 MiB at a time
        for lo in range(0, n + 1, step):
            index.write_at(documents_at + 8 * lo, np.arange(lo, min(lo + step, n + 1), dtype="<i8"))
        tokens_out.close()
        index.close()
        files.append(_entry(f"{prefix}.bin", split, n_tokens, n))
    return files


def _hf(job: Job) -> list[dict[str, Any]]:
    """A `datasets` DatasetDict on disk (save_to_disk): a row of `input_ids` per document."""
    try:
        import datasets
    except ImportError:
        raise ConfigError("--to hf writes with the `datasets` library: pip install 'lmshard[hf]'") from None
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    cache = job.root / ".cache"  # (datasets builds the arrow files here first: never in the user's cache)

    def rows(split: str) -> Any:
        for block in blocks(job.meta, split, job.meta.eot_position):
            ends = np.cumsum(block.lengths)
            for a, b in zip(ends - block.lengths, ends, strict=True):
                yield {"input_ids": block.tokens[a:b].astype(np.int32)}

    names = {"train": "train", "val": "validation"}
    parts = {names[s]: datasets.Dataset.from_generator(rows, features=features, gen_kwargs={"split": s},
                                                       cache_dir=str(cache)) for s in job.splits}  # fmt: skip
    datasets.DatasetDict(parts).save_to_disk(str(job.root))  # (load_from_disk(OUT) reads it)
    for part in parts.values():
        part.cleanup_cache_files()
    import shutil

    shutil.rmtree(cache, ignore_errors=True)
    return [{"path": names[s], "split": s, "n_docs": job.meta.n_docs(s), "n_tokens": job.meta.n_tokens(s)}
            for s in job.splits]  # fmt: skip


def _trainer_files(to: str, stem: str) -> re.Pattern[str]:
    """The names the target trainer reads from the output directory (its loader's glob)."""
    stem = re.escape(stem)
    return re.compile({"nanogpt": r"(train|val)\.bin|meta\.pkl",  # train.py reads meta.pkl's vocab_size
                       "megatron": rf"{stem}_(train|val)_text_document\.(bin|idx)",
                       "hf": r"dataset_dict\.json|(train|validation)/(state\.json|dataset_info\.json|data-.*\.arrow)",
                       "litdata": r"(train|val)/(index\.json|chunk-.*\.bin)",
                       "mds": r"(train|val)/(index\.json|shard\.\d{5}\.mds(\.zstd)?)",
                       "olmo": r"(train|val)/part-\d{5}\.(npy|csv\.gz)"}.get(to,
                      rf"{stem}_(train|val)_\d{{6}}\.bin"))  # fmt: skip


def _megatron_eod(meta: DatasetMeta, eod_id: int | None) -> int | None:
    """The id to write at document ends for Megatron, or None to keep the separator. Megatron's
    Hugging Face tokenizer ends documents with the configured eos_token (Qwen's <|im_end|>, where
    lmshard separates documents with <|endoftext|>): its end-of-document masking and position
    resets would never see the dataset's boundaries, so a difference is refused unless
    `eod_id` says which id to write."""
    sep = meta.tokenizer.eot_id
    if eod_id is not None:
        return _given_eod(meta, eod_id)
    state, eos, eos_id = _special(meta, "config_eos_token")
    if isinstance(eos_id, int) and eos_id != sep:
        raise ConfigError(f"--to megatron: this dataset ends each document with {sep} ({state.get('eot_token')}), but "
                          f"Megatron's tokenizer for {meta.tokenizer.name} ends documents with its eos_token {eos} "
                          f"({eos_id}), so its end-of-document masking would never see a boundary; pass --eod-id "
                          f"{eos_id} to write {eos} at each document end, or --eod-id {sep} to keep {sep}")  # fmt: skip
    return None


def _given_eod(meta: DatasetMeta, eod_id: int) -> int | None:
    """--eod-id, held to the vocabulary: the id to write, or None when it is the separator."""
    if not 0 <= eod_id < meta.tokenizer.n_vocab:
        raise ConfigError(f"--eod-id {eod_id}: not an id of the {meta.tokenizer.name} vocabulary "
                          f"(0 .. {meta.tokenizer.n_vocab - 1})")  # fmt: skip
    return None if eod_id == meta.tokenizer.eot_id else eod_id


def _special(meta: DatasetMeta, key: str) -> tuple[dict[str, Any], Any, Any]:
    """(the dataset's tokenizer state, the token its `key` names, that token's id); empty where
    the state cannot be read."""
    try:
        state = json.loads((meta.root / TOKENIZER_FILE).read_text(encoding="utf-8"))
        token = state.get(key)
        return state, token, state.get("special_tokens", {}).get(token) if token else None
    except (OSError, ValueError, AttributeError):
        return {}, None, None


def _olmo_eod(meta: DatasetMeta, eod_id: int | None) -> int | None:
    """The id to write at document ends for OLMo-core, or None to keep the separator. OLMo-core
    finds documents by the EOS after each (its tokenizer's eos_token_id): a dataset separated by
    another id (llm.c's Llama 3 shards, imported: <|begin_of_text|> before each document) would
    read as one document per file, so it is refused unless `eod_id` says which id to write."""
    sep = meta.tokenizer.eot_id
    if eod_id is not None:
        return _given_eod(meta, eod_id)
    _, name, own = _special(meta, "eot_token")
    if isinstance(own, int) and own != sep:
        raise ConfigError(f"--to olmo: OLMo-core finds documents by the EOS after each, but this dataset separates "
                          f"them with {sep}, not the vocabulary's end of text {name} ({own}); pass --eod-id {own} to "
                          f"write {name} at each document end, or --eod-id {sep} to keep {sep}")  # fmt: skip
    return None


def _write_provenance(job: Job, result: ExportResult) -> None:
    """lmshard_export.json: where the files came from and what they hold (no trainer reads it)."""
    header = {"nanogpt": None, "megatron": "MMIDIDX .idx, version 1", "hf": "datasets save_to_disk (arrow)",
              "litdata": "litdata index.json and chunks (TokensLoader)", "mds": "MDS index.json version 2",
              "olmo": "none (raw arrays) and dolma .csv.gz metadata"}.get(result.format, "llm.c 256 x int32")
    source = job.source or str(job.meta.root.resolve())
    record = {"format": result.format, "source": source, "lmshard_version": __version__,
              "tokenizer": job.meta.tokenizer.to_json(), "token_dtype": result.token_dtype,
              "eot_position": result.eot_position, "header": header, "files": result.files,
              "eod_id": job.eod_id if job.eod_id is not None else job.meta.tokenizer.eot_id,
              "written": sorted(str(p.relative_to(job.root)) for p in job.root.rglob("*") if p.is_file())}  # fmt: skip
    out = TokenFile(job.root / PROVENANCE_FILE)
    out.write((json.dumps(record, indent=2) + "\n").encode())
    out.close()
