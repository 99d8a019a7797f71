"""The zstd dictionary of a dataset being prepared (format/dictionary.py): trained once, when
the build is claimed, from a sample of the inputs, and kept in the build's staging directory
(`DICT_FILE`) for every writer of the run (the one process, or each task of a planned run: they
all write into the staging directory) and for a `--resume`; the metadata stores it, and the
file goes before the dataset is swapped in. `--append` keeps the dataset's own encoding and
dictionary (or none).

The sample is read from the inputs as found, in input order, so every executor, task count
and worker count trains the same dictionary: up to `SAMPLE_POINTS` evenly spaced input files
(not stdin, pipes or Hugging Face streams, which are read once), and in each file evenly spaced
points of its first `SPAN_BYTES`, where the records of `POINT_BYTES` of input are cleaned and
filtered as the run does it (dropped records are left out) and tokenized. A record the run
would refuse is skipped here: the run names it.

Memory model: one work item of the planner at a time (≈1 MiB), and the sample's tokens (about
`SAMPLE_POINTS × POINT_BYTES / 4` tokens).
"""

from __future__ import annotations

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

DICT_FILE = ".zstd_dictionary"  # in the staging directory while the build runs (empty: none was trained)
SAMPLE_POINTS = 16
POINT_BYTES = 128 << 10
SPAN_BYTES = 32 << 20


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


def make(config: PrepareConfig, staging: Path, sources: list[Source], tokenizer: Tokenizer, wcfg: WorkerConfig) -> None:
    """Train a new zstd build's dictionary and keep it in `staging` (nothing for another encoding)."""
    encoding = config.encoding(tokenizer.n_vocab)
    if encoding.compressed:
        atomic_write_bytes(staging / DICT_FILE, train(sample_tokens(config, sources, tokenizer, wcfg), encoding) or b"")


def sample_tokens(config: PrepareConfig, sources: list[Source], tokenizer: Tokenizer, wcfg: WorkerConfig) -> np.ndarray:
    """The tokens of the sample described in the module docstring, in input order."""
    files = [i for i, s in enumerate(sources) if not s.stream and s.fmt != "hf"]
    chosen = sorted({files[j * len(files) // SAMPLE_POINTS] for j in range(min(SAMPLE_POINTS, len(files)))})
    texts: list[str] = []
    for i in chosen:
        texts += _point_texts(config, sources[i], wcfg, max(1, SAMPLE_POINTS // len(chosen)))
    if not texts:
        return np.zeros(0, np.uint32)
    tokens, _ = tokenizer.encode_batch(texts)
    return np.asarray(tokens, np.uint32)


def _point_texts(config: PrepareConfig, src: Source, wcfg: WorkerConfig, points: int) -> list[str]:
    """The cleaned texts at `points` evenly spaced points of the first SPAN_BYTES of `src`."""
    one = replace(wcfg, sources=(src,))
    span = min(src.size, SPAN_BYTES)
    targets = [k * span // points for k in range(points)]
    texts: list[str] = []
    offset = 0
    for item in plan([src], config.text_mode, config.text_field, config.on_error, max_chars=config.max_chars):
        end = offset + max(item.nbytes, 1)
        if targets and targets[0] < end:
            texts += _first_texts(item, one)
            targets = [t for t in targets if t >= end]
        if not targets:
            break
        offset = end
    return texts


def _first_texts(item: object, wcfg: WorkerConfig) -> list[str]:
    """The cleaned texts of the item's first records, up to POINT_BYTES characters."""
    texts, size = [], 0
    for _, record in parsed_records(item, wcfg):  # type: ignore[arg-type]
        try:
            text, _ = clean_document(record, wcfg.clean)
        except LmshardError:  # (a filter that fails: the run names the record)
            continue
        if text:
            texts.append(text)
            size += len(text)
            if size >= POINT_BYTES:
                break
    return texts
