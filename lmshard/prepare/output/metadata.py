"""A finished build's `dataset_metadata.json` entry, from its totals, shards and key files: one
function for every way a dataset is built (a local run, the finish of a planned one).

Memory model: the totals and the shards' and key files' entries.
"""

from __future__ import annotations

import platform
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from ... import __version__
from ...errors import warn
from ...format import SPLITS, DatasetMeta, DedupInfo, KeyFile, RunInfo, ShardInfo, SourceInfo, SplitInfo, TokenizerInfo
from ...tokenizers import Tokenizer
from ..config import PrepareConfig
from ..documents.sources import GREW, SPLIT_INTO_PARAGRAPHS, Source, Sources
from ..documents.worker import DECODE_REPLACED, LINE_DROP
from .build import NOT_DROPS, NOT_REASONS, Totals
from .claim import Claim, bos_written
from .dictfile import run_encoding
from .staging import OutputPaths


def warn_empty_val(meta: DatasetMeta) -> None:
    """A warning when --val-fraction or --val-by asked for a validation split and it came out
    empty (few documents kept, domains of one document each): a trainer would run without a
    validation loss and not say why."""
    fraction, by = meta.config.get("val_fraction"), meta.config.get("val_by")
    if fraction and meta.total_docs and not meta.n_docs("val"):
        warn(f"the val split is empty: {meta.empty_split_why('val')}")
    elif by and meta.total_docs and not meta.n_docs("val"):  # (--val-by: a domain keeps half its tokens in train)
        why = ("every domain keeps at least half its tokens in train, and in each the first document drawn holds more "
               "than half; give the domains more documents, or use --val-fraction")  # fmt: skip
        if by == "input" and all(src.kept <= 1 for src in meta.sources):  # (a field's domains are not counted here)
            why = ("no input file has more than one document, and a domain keeps at least half its tokens in train; "
                   "give each input several documents (--text-mode paragraph splits a text file into its "
                   "paragraphs), or use --val-fraction")  # fmt: skip
        warn(f"the val split is empty: --val-by {by}: {why}")


def dataset_metadata(config: PrepareConfig, sources: Sources, tokenizer: Tokenizer, shards: list[ShardInfo],
              totals: Totals, claim: Claim, keys: tuple[KeyFile, ...], started: float,
              tokens_before: int = 0) -> DatasetMeta:  # fmt: skip
    """The dataset's metadata. After --append it describes the whole dataset: the recorded
    inputs and sources are the old ones followed by this run's, so the recorded configuration
    reproduces the same token stream in one run. `tokens_before`: the tokens this process did not
    make (the appended-to dataset's, a resumed checkpoint's), left out of its tokens/s."""
    elapsed = time.time() - started
    width = sum(config.attr_columns())  # (a shard entry read back from a marker knows no record width)
    shards = [replace(s, attr_width=width) if s.attr_path else s for s in shards]
    n_tokens = sum(s.n_tokens for s in shards)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(claim.started_at))
    drops = dict(sorted(totals.drops.items()))
    drops["duplicate"] = totals.duplicates
    hf = config.hf_spec()
    recorded = config.recorded()
    previous = claim.previous
    if previous is not None:
        recorded["inputs"] = [*previous.config.get("inputs", []), *recorded["inputs"]]
    encoding = run_encoding(config, tokenizer.n_vocab, previous, OutputPaths.of(config.out).staging)
    recorded["shard_encoding"] = encoding.name  # (after --append: the dataset's, which the run kept)
    new_sources = tuple(source_info(s, totals.per_source.get(i, Counter()), hf) for i, s in enumerate(sources))
    return DatasetMeta(
        root=Path(config.out),
        lmshard_version=__version__,
        eot_position=config.eot_position,
        tokenizer=TokenizerInfo(
            name=tokenizer.name,
            backend=tokenizer.backend,
            n_vocab=tokenizer.n_vocab,
            eot_id=tokenizer.eot_id,
            bos_id=bos_written(config, tokenizer),
            ranks_sha256=tokenizer.vocab_sha256,
            vocab_format=tokenizer.vocab_format,
        ),  # fmt: skip
        total_tokens=n_tokens,
        total_docs=sum(s.n_docs for s in shards),
        splits={split: SplitInfo.of(tuple(s for s in shards if s.split == split)) for split in SPLITS},
        records_read=totals.records,
        drops=drops,
        drop_examples={k: v for k, v in totals.examples.items() if not k.startswith(LINE_DROP)},
        line_drops={k: {"lines": n, "example": totals.examples.get(LINE_DROP + k, "")}
                    for k, n in sorted(totals.line_drops.items())},  # fmt: skip
        drop_chars={k: n for k, n in sorted(totals.drop_chars.items()) if n},
        dedup=DedupInfo(
            mode=config.dedup,
            key="xxh3_64 of the cleaned UTF-8 text",
            duplicates_removed=totals.duplicates,
            lines=config.dedup_lines,
            lines_removed=totals.lines_removed,
            files=keys,
            near={"minhash": config.minhash_config().to_json(), "removed": totals.drops.get("near_duplicate", 0),
                  "examples": totals.near_examples} if config.near_dedup else None,
        ),  # fmt: skip
        sources=(*(previous.sources if previous else ()), *new_sources),
        skipped_inputs=previous.skipped_inputs + sources.skipped if previous else sources.skipped,
        config=recorded,
        encoding=encoding,
        attributes=config.attribute_fields(),
        run=RunInfo(
            workers=config.n_workers(),
            out=config.out,
            started_at=started_at,
            elapsed_s=round(elapsed, 3),
            tokens_per_s=round((totals.tokens - tokens_before) / elapsed, 1) if elapsed > 0 else None,
            input_chars=totals.chars,
            dedup_table_bytes=totals.dedup_bytes,
            python=platform.python_version(),
            host=platform.node(),
            lineage=(*RunInfo.history(previous), RunInfo.step("append" if previous else "prepare", claim.started_at,
                                                              sum(s.n_docs for s in shards), n_tokens, __version__,
                                                              inputs=len(new_sources))),
        ),
    )


def source_info(src: Source, counts: Counter[str], hf: Any = None) -> SourceInfo:

    return SourceInfo(
        path=src.path,
        format=src.fmt,
        bytes=src.size,
        hf=hf.describe() if src.fmt == "hf" else None,  # how the stream was split: resume and scale-out reuse it
        records=counts.get("records", 0),
        kept=counts.get("kept", 0),
        lines_removed=counts.get("lines_removed", 0),
        split_into_paragraphs=counts.get(SPLIT_INTO_PARAGRAPHS, 0),
        grew=counts.get(GREW, 0),
        decode_replaced=counts.get(DECODE_REPLACED, 0),
        dropped={k: v for k, v in sorted(counts.items()) if k not in (*NOT_DROPS, "kept") and v
                 and not k.startswith(NOT_REASONS)},  # fmt: skip
    )
