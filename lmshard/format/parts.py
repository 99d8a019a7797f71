"""The parts of `dataset_metadata.json` beside its shards, as typed values (schema.py holds the
whole): the tokenizer that made the tokens, a split's totals, each input source, the dedup key
files and what deduplication did. Each parses its JSON strictly where a reader depends on it and
leniently where it is only reported, as schema.py says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .fields import _count, _counts, _get, _Invalid, _near
from .layout import shard_paths
from .shard import ShardInfo

VOCAB_FORMATS = ("tiktoken", "tokenizer.json", "sentencepiece")


@dataclass(frozen=True, kw_only=True)
class TokenizerInfo:
    """The tokenizer's identity: enough to refuse a dataset made with another vocabulary, and
    the special tokens around each document: `eot_id` after (or before) it, and `bos_id` before
    it when one is written (null: none)."""

    name: str
    backend: str = "tiktoken"
    n_vocab: int
    eot_id: int
    bos_id: int | None = None
    ranks_sha256: str  # sha256 of the vocabulary file (tiktoken ranks or tokenizer.json)
    # The vocabulary's file format: "tiktoken" (ranks), "tokenizer.json" (Hugging Face, whose
    # copy the dataset keeps) or "sentencepiece" (a SentencePiece .model file). Metadata written
    # before the field existed: "tokenizer.json" exactly when the backend was "tokenizers", the
    # only one that read such files then.
    vocab_format: str = "tiktoken"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "backend": self.backend, "n_vocab": self.n_vocab, "eot_id": self.eot_id,
                "bos_id": self.bos_id, "ranks_sha256": self.ranks_sha256,
                "vocab_format": self.vocab_format}  # fmt: skip

    @property
    def hugging_face(self) -> bool:
        """The vocabulary is a tokenizer.json (whichever backend encoded it)."""
        return self.vocab_format == "tokenizer.json"

    @classmethod
    def parse(cls, raw: Any) -> TokenizerInfo:
        if not isinstance(raw, dict):
            raise _Invalid("'tokenizer' is not an object")
        try:
            backend = _get(raw, "backend", str, "tiktoken")
            vocab_format = _get(raw, "vocab_format", str, "tokenizer.json" if backend == "tokenizers" else "tiktoken")
            if vocab_format not in VOCAB_FORMATS:
                raise _Invalid(f"'vocab_format' {vocab_format!r} is not one of {', '.join(VOCAB_FORMATS)}")
            info = cls(name=_get(raw, "name", str), backend=backend, n_vocab=_count(raw, "n_vocab"),
                       eot_id=_count(raw, "eot_id"), bos_id=_count(raw, "bos_id", None),
                       ranks_sha256=_get(raw, "ranks_sha256", str), vocab_format=vocab_format)  # fmt: skip
            if not 1 <= info.n_vocab <= 1 << 32:
                raise _Invalid(f"'n_vocab' {info.n_vocab} is outside [1, 2**32] (ids are uint32)")
            for key in ("eot_id", "bos_id"):
                value = getattr(info, key)
                if value is not None and value >= info.n_vocab:
                    raise _Invalid(f"'{key}' {value} is not below n_vocab {info.n_vocab}")
            return info
        except _Invalid as e:
            raise _Invalid(f"tokenizer entry: {e}") from None


@dataclass(frozen=True, kw_only=True)
class SplitInfo:
    """A split: its recorded totals and its shards in order."""

    n_tokens: int
    n_docs: int
    shards: tuple[ShardInfo, ...] = ()

    @classmethod
    def of(cls, shards: tuple[ShardInfo, ...]) -> SplitInfo:
        return cls(n_tokens=sum(s.n_tokens for s in shards), n_docs=sum(s.n_docs for s in shards), shards=shards)

    def to_json(self) -> dict[str, Any]:
        return {"n_tokens": self.n_tokens, "n_docs": self.n_docs, "shards": [s.to_json() for s in self.shards]}

    @classmethod
    def parse(cls, name: str, raw: Any) -> SplitInfo:
        if not isinstance(raw, dict) or not isinstance(raw.get("shards", []), list):
            raise _Invalid(f"split '{name}' is not an object with a list of shards")
        split = cls.of(tuple(ShardInfo.parse(name, s) for s in raw.get("shards", [])))
        for i, shard in enumerate(split.shards):  # the stream's order is the shards' numbers: no entry moved or gone
            if shard.path != shard_paths(name, i)[0]:
                raise _Invalid(f"split {name}: shard entry {i} is {shard.path!r}, not {shard_paths(name, i)[0]!r} "
                               "(a split's shards are listed in order, numbered from 0)")  # fmt: skip
        _check_total(raw, split, f"split {name}: ", "sum of its shards")
        return split


def _check_total(raw: dict[str, Any], summed: Any, where: str, what: str) -> None:
    """A recorded n_tokens/n_docs (absent: nothing to contradict) must equal `summed`'s, the sum
    over shards: a reader sizes its arrays from the shards, and a total is only reported."""
    for key in ("n_tokens", "n_docs"):
        recorded, total = _count(raw, key, None), getattr(summed, key)
        if recorded is not None and recorded != total:
            raise _Invalid(f"{where}{key} {recorded} != {what} {total}")


@dataclass(frozen=True, kw_only=True)
class SourceInfo:
    """One input file (or Hugging Face stream) and what became of its records."""

    path: str
    format: str
    bytes: int  # on disk, compressed; 0 for stdin and streams
    hf: dict[str, Any] | None = None  # how a Hugging Face stream was opened and split
    records: int = 0
    kept: int = 0
    lines_removed: int = 0  # by --dedup-lines
    split_into_paragraphs: int = 0  # 1: a text file over --max-chars bytes, split (--text-mode auto)
    grew: int = 0  # 1: the file grew while the run read it; read up to `bytes` (its last line only if whole)
    decode_replaced: int = 0  # records read with U+FFFD for bytes that were not UTF-8 (--decode-errors replace)
    dropped: dict[str, int] = field(default_factory=dict)  # reason → records

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "format": self.format, "bytes": self.bytes}
        if self.hf is not None:
            out["hf"] = self.hf
        out["records"], out["kept"] = self.records, self.kept
        notes = {"lines_removed": self.lines_removed, "split_into_paragraphs": self.split_into_paragraphs,
                 "grew": self.grew, "decode_replaced": self.decode_replaced}  # fmt: skip
        out.update({k: v for k, v in notes.items() if v})
        if self.dropped:
            out["dropped"] = self.dropped
        return out

    @classmethod
    def parse(cls, raw: Any) -> SourceInfo:
        if not isinstance(raw, dict):
            raise _Invalid("a source entry is not an object")
        return cls(path=_get(raw, "path", str, ""), format=_get(raw, "format", str, ""),
                   bytes=_count(raw, "bytes", 0), hf=_get(raw, "hf", dict, None), records=_count(raw, "records", 0),
                   kept=_count(raw, "kept", 0), lines_removed=_count(raw, "lines_removed", 0),
                   split_into_paragraphs=_count(raw, "split_into_paragraphs", 0), grew=_count(raw, "grew", 0),
                   decode_replaced=_count(raw, "decode_replaced", 0), dropped=_counts(raw, "dropped"))  # fmt: skip


_KEY_FILE = re.compile(r"dedup/(doc|line)_keys_[0-9]{6}\.u64|dedup/near_sigs_[0-9]{6}\.u32")


@dataclass(frozen=True, kw_only=True)
class KeyFile:
    """A file of dedup keys kept with the dataset so `--append` can deduplicate against it:
    little-endian uint64 xxh3-64 keys, one per kept document ("doc") or unique line ("line"), or
    ("near", --near-dedup) one MinHash signature per kept document: `n_keys` rows of the
    configuration's n_hashes little-endian uint32 values."""

    path: str  # relative to the dataset root: dedup/doc_keys_NNNNNN.u64 or dedup/line_keys_NNNNNN.u64
    n_keys: int
    xxh3_64: str

    @property
    def kind(self) -> str:
        name = self.path.removeprefix("dedup/")
        return "line" if name.startswith("line_") else "near" if name.startswith("near_") else "doc"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "n_keys": self.n_keys, "xxh3_64": self.xxh3_64}

    @classmethod
    def parse(cls, raw: Any) -> KeyFile:
        if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
            raise _Invalid("a dedup key file entry is not an object with a path")
        if not _KEY_FILE.fullmatch(raw["path"]):
            raise _Invalid(f"dedup key file path {raw['path']!r} is not dedup/(doc|line)_keys_NNNNNN.u64 or "
                           "dedup/near_sigs_NNNNNN.u32")  # fmt: skip
        return cls(path=raw["path"], n_keys=_count(raw, "n_keys", 0), xxh3_64=_get(raw, "xxh3_64", str, ""))


@dataclass(frozen=True, kw_only=True)
class DedupInfo:
    mode: str  # "document" or "none"
    key: str  # what was hashed
    duplicates_removed: int
    lines: bool  # --dedup-lines
    lines_removed: int
    files: tuple[KeyFile, ...] = ()  # the keys `--append` needs (absent in datasets from before --append)
    near: dict[str, Any] | None = None  # --near-dedup: {"minhash": its configuration, "removed", "examples"}

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "key": self.key, "duplicates_removed": self.duplicates_removed,
                "lines": self.lines, "lines_removed": self.lines_removed,
                "files": [f.to_json() for f in self.files]} | ({"near": self.near} if self.near else {})  # fmt: skip

    @classmethod
    def parse(cls, raw: Any) -> DedupInfo | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise _Invalid("'dedup' is not an object")
        return cls(mode=_get(raw, "mode", str, "document"), key=_get(raw, "key", str, ""),
                   duplicates_removed=_count(raw, "duplicates_removed", 0), lines=_get(raw, "lines", bool, False),
                   lines_removed=_count(raw, "lines_removed", 0),
                   files=tuple(KeyFile.parse(f) for f in _get(raw, "files", list, [])),
                   near=_near(raw.get("near")))  # fmt: skip
