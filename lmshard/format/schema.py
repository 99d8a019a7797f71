"""`dataset_metadata.json` as typed values: built by prepare, parsed and validated for every reader.

No code outside this package reads metadata by key: prepare builds a `DatasetMeta` and writes
`to_json()`; inspect, the runtime and the CLI call `load_metadata(root)` and use attributes. The
JSON's key order is fixed here, so the bytes a run writes do not depend on who builds the value.

Parsing is strict where a reader's correctness depends on a field (format, version, dtype, byte
order, tokenizer, separator side, splits and shards: counts are non-negative ints, a shard's
paths are the writer's names for it, recorded totals are the sums over shards) and lenient,
with defaults, for what is only reported (drops, sources, the run record), so metadata written
by an older lmshard still opens. It touches no file: `files.py` reads the metadata and holds the
shards on disk to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import FormatError
from .attributes import AttrField, parse_schema, row_dtype
from .encoding import UINT32, Encoding
from .fields import _count, _counts, _get, _Invalid, _line_drops
from .layout import (
    EOT_POSITIONS,
    FORMAT_NAME,
    FORMAT_VERSION,
    METADATA_FILE,
    REGENERATE_HINT,
    SPLITS,
)
from .parts import DedupInfo, SourceInfo, SplitInfo, TokenizerInfo, _check_total
from .runinfo import RunInfo
from .shard import ShardInfo
from .skipped import SkippedInputs

BYTE_ORDER = "little"


@dataclass(frozen=True, kw_only=True)
class DatasetMeta:
    """A dataset's metadata. `shards` lists the train then the val shards, in order."""

    root: Path
    tokenizer: TokenizerInfo
    eot_position: str
    splits: dict[str, SplitInfo]
    total_tokens: int  # the sum over shards: parsing refuses a recorded total that differs
    total_docs: int
    lmshard_version: str = ""
    records_read: int = 0
    drops: dict[str, int] = field(default_factory=dict)  # reason → documents dropped
    drop_examples: dict[str, str] = field(default_factory=dict)  # reason → "file:line: what"
    line_drops: dict[str, Any] = field(default_factory=dict)  # lines filters removed: reason → {lines, example}
    drop_chars: dict[str, int] = field(default_factory=dict)  # characters of the documents dropped, by reason
    dedup: DedupInfo | None = None
    sources: tuple[SourceInfo, ...] = ()
    skipped_inputs: SkippedInputs = field(default_factory=SkippedInputs)  # what the input walk left out
    config: dict[str, Any] = field(default_factory=dict)  # the options that determine the bytes
    run: RunInfo = field(default_factory=RunInfo)
    encoding: Encoding = UINT32  # how the token files store tokens (encoding.py; uint32: format version 1)
    attributes: tuple[AttrField, ...] = ()  # --attribute: each document's record, in every shard's .attr

    @property
    def shards(self) -> tuple[ShardInfo, ...]:
        return tuple(s for split in SPLITS if split in self.splits for s in self.splits[split].shards)

    def split_shards(self, split: str) -> tuple[ShardInfo, ...]:
        return self.splits[split].shards if split in self.splits else ()

    def n_tokens(self, split: str | None = None) -> int:
        return sum(s.n_tokens for s in self.shards if split in (None, s.split))

    def empty_split_why(self, split: str) -> str:
        """Why a split holds nothing and what to do: for val, how --val-fraction met the documents kept."""
        fraction = self.config.get("val_fraction")
        if split == "val" and isinstance(fraction, int | float) and self.total_docs:
            if not fraction:
                return "it was prepared with --val-fraction 0 (no validation split); prepare with --val-fraction 0.01"
            # each document goes to val with probability f (its key and --seed): none of n does with (1 - f)^n;
            # advised: a fraction that makes that under 1%, more than now, rounded up to two significant figures
            need = max(1 - 0.01 ** (1 / self.total_docs), 1.5 * fraction)
            need = math.ceil(need / 10 ** (e := math.floor(math.log10(need)) - 1)) * 10**e
            fix = (f"prepare again with --val-fraction {need:g} or more (an empty val split is then under 1% likely)"
                   if need <= 0.5 else "too few documents for a val split by fraction: prepare more data")  # fmt: skip
            return (f"--val-fraction {fraction} of its {self.total_docs:,} documents sent none to val (about "
                    f"{fraction * self.total_docs:.2f} expected); {fix}, or another --seed")
        return "prepare more data or use another split"

    def n_docs(self, split: str | None = None) -> int:
        return sum(s.n_docs for s in self.shards if split in (None, s.split))

    def abspath(self, relative: str) -> Path:
        return self.root / relative

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT_NAME, "format_version": self.encoding.version, "lmshard_version": self.lmshard_version,
            "dtype": self.encoding.dtype, "byte_order": BYTE_ORDER,
        }  # fmt: skip
        if self.encoding.version > 1:
            out["encoding"] = self.encoding.to_json()
        out |= {"eot_position": self.eot_position, "tokenizer": self.tokenizer.to_json(),
                "n_tokens": self.total_tokens, "n_docs": self.total_docs,
                "splits": {name: split.to_json() for name, split in self.splits.items()},
                "records_read": self.records_read, "drops": self.drops,
                "drop_examples": self.drop_examples}  # fmt: skip
        if self.line_drops:
            out["line_drops"] = self.line_drops
        if self.drop_chars:
            out["drop_chars"] = self.drop_chars
        if self.dedup is not None:
            out["dedup"] = self.dedup.to_json()
        if self.attributes:
            out["attributes"] = [f.to_json() for f in self.attributes]
        out["sources"] = [s.to_json() for s in self.sources]
        out["skipped_inputs"] = self.skipped_inputs.to_json()
        out["config"], out["run"] = self.config, self.run.to_json()
        return out

    @classmethod
    def parse(cls, root: Path, raw: dict[str, Any]) -> DatasetMeta:
        """Validate a metadata mapping (see the module docstring for what is strict)."""
        version = _get(raw, "format_version", int)
        if version not in range(1, FORMAT_VERSION + 1):
            raise _Invalid(f"format version {version!r}, this lmshard reads 1 to {FORMAT_VERSION}")
        tokenizer = TokenizerInfo.parse(raw.get("tokenizer"))
        encoding = Encoding.parse(raw.get("encoding"), tokenizer.n_vocab) if version > 1 else UINT32
        if encoding.version != version:
            raise _Invalid(f"format version {version} with encoding {encoding.name!r} (uint32 is version 1, zstd "
                           "with a dictionary 3)")  # fmt: skip
        if raw.get("dtype") != encoding.dtype or raw.get("byte_order") != BYTE_ORDER:
            raise _Invalid(f"dtype {raw.get('dtype')!r}/{raw.get('byte_order')!r} is not "
                           f"{encoding.dtype}/{BYTE_ORDER}")  # fmt: skip
        if raw.get("eot_position") not in EOT_POSITIONS:
            raise _Invalid(f"eot_position {raw.get('eot_position')!r} is not one of {EOT_POSITIONS}")
        splits = raw.get("splits")
        if not isinstance(splits, dict):
            raise _Invalid("'splits' is missing")
        if unknown := set(splits) - set(SPLITS):
            raise _Invalid(f"unknown split(s) {', '.join(map(repr, sorted(unknown)))}; splits are {', '.join(SPLITS)}")
        sources = _get(raw, "sources", list, [])
        parsed = {str(name): SplitInfo.parse(str(name), entry) for name, entry in splits.items()}
        every = SplitInfo.of(tuple(s for split in parsed.values() for s in split.shards))
        _check_total(raw, every, "", "sum of shards")
        if len({s.path for s in every.shards}) < len(every.shards):
            raise _Invalid("a shard is listed twice")
        for shard in every.shards:
            _check_encoded(shard, encoding)
        attributes = parse_schema(raw.get("attributes"))
        parsed = {name: _with_attributes(split, attributes) for name, split in parsed.items()}
        return cls(
            root=root, tokenizer=tokenizer, eot_position=raw["eot_position"], encoding=encoding,
            splits=parsed, total_tokens=every.n_tokens, total_docs=every.n_docs,
            lmshard_version=_get(raw, "lmshard_version", str, ""), records_read=_count(raw, "records_read", 0),
            drops=_counts(raw, "drops"), drop_examples=_get(raw, "drop_examples", dict, {}),
            line_drops=_line_drops(raw),
            drop_chars=_counts(raw, "drop_chars"),
            dedup=DedupInfo.parse(raw.get("dedup")), sources=tuple(SourceInfo.parse(s) for s in sources),
            skipped_inputs=SkippedInputs.parse(raw.get("skipped_inputs")),
            config=_get(raw, "config", dict, {}), run=RunInfo.parse(raw.get("run")), attributes=attributes,
        )  # fmt: skip


def _with_attributes(split: SplitInfo, attributes: tuple[AttrField, ...]) -> SplitInfo:
    """The split's shards held to the attribute schema (every shard has its file exactly when
    there is one), each given its record's width."""
    width = row_dtype(attributes).itemsize if attributes else 0
    for shard in split.shards:
        if bool(shard.attr_path) != bool(attributes):
            has = "has" if shard.attr_path else "has no"
            raise _Invalid(f"shard entry {shard.path!r} {has} 'attr_path' but the dataset "
                           f"{'keeps' if attributes else 'keeps no'} attributes")  # fmt: skip
        if shard.attr_path and len(shard.attr_column_xxh3_64) != len(attributes):
            raise _Invalid(f"shard entry {shard.path!r} has {len(shard.attr_column_xxh3_64)} column checksums for "
                           f"{len(attributes)} attributes")  # fmt: skip
    if not width:
        return split
    return replace(split, shards=tuple(replace(s, attr_width=width) for s in split.shards))


def _check_encoded(shard: ShardInfo, encoding: Encoding) -> None:
    """A version 2 shard records its token file's size (the fixed-width encodings' must be what
    its tokens take), block sums of the encoding's blocks, and for zstd its block offsets."""
    where = f"shard entry {shard.path!r}: "
    if encoding.version == 1:
        if shard.n_bytes >= 0 or shard.blocks_path:
            raise _Invalid(f"{where}'n_bytes'/'blocks_path' belong to format version 2")
        return
    if shard.n_bytes < 0:
        raise _Invalid(f"{where}'n_bytes' is missing")
    if not shard.sums_path:
        raise _Invalid(f"{where}'sums_path' is missing (a version 2 shard keeps its block sums)")
    if not encoding.compressed and shard.n_bytes != encoding.n_bytes(shard.n_tokens):
        raise _Invalid(f"{where}'n_bytes' {shard.n_bytes} is not what {shard.n_tokens} tokens take in "
                       f"{encoding.describe()} ({encoding.n_bytes(shard.n_tokens)})")  # fmt: skip
    if encoding.compressed and not shard.blocks_path:
        raise _Invalid(f"{where}'blocks_path' is missing (a {encoding.name} shard needs its block offsets)")
    if shard.block_tokens and shard.block_tokens != encoding.block_tokens:
        raise _Invalid(f"{where}'block_tokens' {shard.block_tokens} is not the encoding's {encoding.block_tokens}")


def parse_metadata(root: Path, raw: Any) -> DatasetMeta:
    """Validate the parsed JSON of `root`'s metadata; FormatError naming the field and the fix.
    Checks the metadata alone: `files.load_metadata` reads it, `files.check_shard_files` holds
    it against the files on disk."""
    try:
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            raise _Invalid("not lmshard metadata")
        return DatasetMeta.parse(root, raw)
    except _Invalid as e:
        raise FormatError(f"{root / METADATA_FILE}: {e}; {REGENERATE_HINT}") from None
