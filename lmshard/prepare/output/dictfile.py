"""The zstd dictionary of a dataset being prepared (format/dictionary.py): trained once, when
the build is claimed (before its staging directory exists: a stop meanwhile leaves nothing), from
a sample of the inputs, and kept in the build's staging directory (`DICT_FILE`) for every writer
of the run (each task of the plan, in this process or elsewhere: they all write into the staging
directory) and for a `--resume`; the metadata stores it, and the swap removes the file.
`--append` keeps the dataset's own encoding and dictionary (or none).

The sample is read from the inputs as found, in input order, so every executor, task count
and worker count trains the same dictionary: up to `SAMPLE_POINTS` evenly spaced input files
(not stdin, pipes or Hugging Face streams, which are read once), and in each file evenly spaced
points of its first `SPAN_BYTES` (at most `MAX_ITEMS` of the planner's work items), where
`POINT_BYTES` characters of records, from the start of the work item the point falls in, are
cleaned and filtered as the run does it (dropped records are left out) and tokenized. A record
the run would refuse is skipped here: the run names it. The work items are the planner's, so
`LMSHARD_BLOCK_BYTES` (a testing knob, in the fingerprint) moves the points.

Memory model: one work item of the planner at a time (≈1 MiB, or 2,048 parsed records), and the
sample: at most `SAMPLE_POINTS × POINT_BYTES` characters (2 MiB) and their tokens.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np

from ...errors import InputError, LmshardError
from ...format import DatasetMeta, atomic_write_bytes
from ...format.dictionary import train
from ...format.encoding import Encoding
from ...tokenizers import Tokenizer
from ..config import PrepareConfig
from ..documents.sources import Source, plan
from ..documents.worker import WorkerConfig, clean_document, parsed_records
from .staging import DICT_FILE

SAMPLE_POINTS = 16
POINT_BYTES = 128 << 10
SPAN_BYTES = 32 << 20
MAX_ITEMS = 32


def run_encoding(config: PrepareConfig, n_vocab: int, previous: DatasetMeta | None, staging: Path) -> Encoding:
    """The encoding this build's shards are written in: `config.encoding`, with the build's
    dictionary when it is a new zstd dataset."""
    encoding = config.encoding(n_vocab, previous)
    if previous is not None or not encoding.compressed:
        return encoding
    try:
        data = (staging / DICT_FILE).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{staging}: the build's zstd dictionary ({DICT_FILE}) is missing; start again with "
                         "--overwrite") from None  # fmt: skip
    return encoding.with_dictionary(data or None)


def trained(config: PrepareConfig, sources: list[Source], tokenizer: Tokenizer, wcfg: WorkerConfig) -> bytes | None:
    """A new zstd build's dictionary (b"": a sample too small for one), trained before the build
    exists, so that a stop while it trains leaves nothing behind; None for another encoding."""
    encoding = config.encoding(tokenizer.n_vocab)
    if not encoding.compressed:
        return None
    return train(sample_tokens(config, sources, tokenizer, wcfg), encoding) or b""


def keep(staging: Path, data: bytes | None) -> None:
    """Keep a new build's dictionary (`trained`) in its staging directory, before its run record."""
    if data is not None:
        atomic_write_bytes(staging / DICT_FILE, data)


def sample_tokens(config: PrepareConfig, sources: list[Source], tokenizer: Tokenizer, wcfg: WorkerConfig) -> np.ndarray:
    """The tokens of the sample described in the module docstring, in input order."""
    files = [i for i, s in enumerate(sources) if not s.stream and s.fmt != "hf"]
    n = min(SAMPLE_POINTS, len(files))
    texts: list[str] = []
    for i in [files[j * len(files) // n] for j in range(n)]:
        texts += _point_texts(config, sources[i], wcfg, SAMPLE_POINTS // n)
    if not texts:
        return np.zeros(0, np.uint32)
    tokens, _ = tokenizer.encode_batch(texts)
    return np.asarray(tokens, np.uint32)


def _point_texts(config: PrepareConfig, src: Source, wcfg: WorkerConfig, points: int) -> list[str]:
    """The cleaned texts at `points` evenly spaced points of the first SPAN_BYTES of `src`
    (POINT_BYTES characters each, from the start of the work item a point falls in), reading at
    most MAX_ITEMS of its work items (formats parsed in the planning process give items without
    sizes)."""
    one = replace(wcfg, sources=(src,))
    span = min(src.size, SPAN_BYTES)
    targets = [k * span // points for k in range(points)]
    texts: list[str] = []
    offset = 0
    items = plan([src], config.text_mode, config.text_field, config.on_error, max_chars=config.max_chars)
    for item in itertools.islice(items, MAX_ITEMS):
        end = offset + max(item.nbytes, 1)
        here = sum(1 for t in targets if t < end)
        if here:
            texts += _first_texts(item, one, here * POINT_BYTES)
            targets = targets[here:]
        if not targets:
            break
        offset = end
    return texts


def _first_texts(item: object, wcfg: WorkerConfig, budget: int) -> list[str]:
    """The cleaned texts of the item's first records, up to `budget` characters in all."""
    texts, size = [], 0
    for _, record in parsed_records(item, wcfg):  # type: ignore[arg-type]
        try:
            text, _ = clean_document(record, wcfg.clean)
        except LmshardError:  # (a filter that fails: the run names the record)
            continue
        if text:
            texts.append(text[: budget - size])
            size += len(texts[-1])
            if size >= budget:
                break
    return texts
