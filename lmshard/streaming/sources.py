"""The inputs of `lmshard.stream` as an ordered list of shards, each an ordered stream of
documents read, settled (--on-error), cleaned and length-filtered exactly as `prepare` reads them.

A shard is the unit a stream gives out whole: one input file (local or at a URL), one data file
of a Hugging Face streaming dataset (`IterableDataset.n_shards`), or a run of ROWS_PER_SHARD rows
of a `save_to_disk` dataset. Shards in order, records in order, are the order `prepare` reads, so
one consumer reading every shard sees prepare's documents.

Memory model: one work item of a file (≈1 MiB of text, `sources.BLOCK_BYTES`), or one record
batch of a Hugging Face stream, at a time; a saved dataset is memory-mapped arrow.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, InputError
from ..prepare.config import PrepareConfig
from ..prepare.documents.files import Source
from ..prepare.documents.hf import PRESETS, HFSpec, _looks_like_path, example_records, open_stream
from ..prepare.documents.records import Record, settle, typed_text
from ..prepare.documents.sources import discover, plan
from ..prepare.documents.worker import WorkerConfig, clean_document, records_of

ROWS_PER_SHARD = 1 << 16  # rows of a save_to_disk dataset per shard (it has no files to give out)


@dataclass
class Shard:
    """One shard: `documents(skip, every, phase)` yields, for each of its records from number
    `skip` on, its record number (prepare's: a line or a row) and the cleaned text, or None for
    a record dropped (counted in `counts`); records whose number ≢ phase (mod every) are read but
    not cleaned and yield None."""

    name: str
    config: PrepareConfig
    source: Source | None = None  # a file
    data: Any = None  # a Hugging Face dataset (streaming: one data file of it; map-style: rows lo:hi)
    lo: int = 0
    hi: int = 0

    def documents(self, counts: Counter[str], skip: int = 0, every: int = 1,
                  phase: int = 0) -> Iterator[tuple[int, str | None]]:  # fmt: skip
        """(the record's number as prepare numbers it: a line or a row, its cleaned text or None)."""
        clean = self.config.clean_config()
        number = -1
        for record in self._records(skip):
            number += 1
            if (skip + number) % every != phase:
                yield record.number, None
                continue
            counts["records"] += 1
            text, reason = clean_document(record, clean)
            if reason is not None:
                counts[reason] += 1
            yield record.number, text

    def _records(self, skip: int) -> Iterator[Record]:
        if self.source is not None:
            src, c = self.source, self.config
            worker = WorkerConfig(sources=(src,), clean=c.clean_config(), tokenizer=c.tokenizer,
                                  text_field=c.text_field, text_mode=c.text_mode, on_error=c.on_error,
                                  decode_errors=c.decode_errors)  # fmt: skip
            n = 0
            for item in plan([src], c.text_mode, c.text_field, c.on_error, max_chars=c.max_chars):
                for _, record in records_of(item, worker):
                    n += 1
                    if n > skip:
                        yield record
            return
        spec = self.config.hf_spec()
        where = Source(f"hf:{spec.dataset}", "hf", None, 0)
        for record in self._rows(skip, spec.text_field):
            yield settle(where, record, self.config.on_error)

    def _rows(self, skip: int, field: str) -> Iterator[Record]:
        if self.hi:  # map-style rows lo:hi, read in slices
            at = self.lo + skip
            while at < self.hi:
                rows = self.data[at : min(self.hi, at + 1024)]
                for k, value in enumerate(rows.get(field, [])):
                    yield typed_text(at + k + 1, value, field)
                at += 1024
            return
        # `.iter(batch_size)`, not `iter(data)`: in a DataLoader worker the latter keeps only the
        # worker's share of the shard's files, and this shard is already the reader's own.
        rows = (dict(zip(batch, row, strict=True)) for batch in self.data.iter(batch_size=256)
                for row in zip(*batch.values(), strict=True))  # fmt: skip
        for number, record in enumerate(example_records(rows, field, self.name), 1):
            if number > skip:
                yield record


def resolve(inputs: list[str], hf: str | None, values: dict[str, Any]) -> PrepareConfig:
    """The prepare options of a stream: a preset or hub id named as the one input becomes `hf`,
    with the preset's configuration, text field and tokenizer (explicit values win)."""
    if hf is None and len(inputs) == 1 and _hub_like(inputs[0]):
        hf, inputs = inputs[0], []
    if hf is not None and hf in PRESETS:
        p = PRESETS[hf]
        hf = p.hub_id
        values = {"hf_config": p.config, "text_field": p.text_field, "tokenizer": p.tokenizer,
                  **{k: v for k, v in values.items() if v is not None}}  # fmt: skip
    values = {k: v for k, v in values.items() if v is not None}
    try:
        return PrepareConfig(out="stream", inputs=list(inputs), hf=hf, dedup="none", workers=1, **values)
    except TypeError as e:
        word = str(e).rsplit(" ", 1)[-1]
        raise ConfigError(f"lmshard.stream: no option {word}; it takes prepare's options (text_field, min_chars, "
                          "normalize, bos, on_error, …) besides its own") from None


def _hub_like(spec: str) -> bool:
    """A preset name, or NAME / OWNER/NAME that names nothing on disk: a hub id."""
    import glob
    import os

    if spec in PRESETS or (os.path.isdir(spec) and any(os.path.exists(os.path.join(spec, n))
                                                       for n in ("dataset_dict.json", "state.json"))):  # fmt: skip
        return True  # (a save_to_disk directory is read with `datasets`)
    if _looks_like_path(spec) or os.path.exists(spec) or glob.has_magic(spec) or "://" in spec or spec == "-":
        return False
    if spec.endswith("/") or os.path.isdir(spec.split("/")[0]):  # "data/nope" where ./data exists: a path
        return False
    return HFSpec(dataset=spec).kind() == "hub"


def shards_of(config: PrepareConfig) -> list[Shard]:
    """The shards of a stream's inputs, in prepare's order."""
    if config.reads_stdin():
        raise InputError("lmshard.stream cannot read stdin: every epoch and every resume reads the input again; "
                         "save it to a file and pass the file")  # fmt: skip
    sources = discover(config.inputs, config.format, config.exclude, include_hidden=config.include_hidden)
    out = [Shard(s.path, config, source=s) for s in sources]
    if spec := config.hf_spec():
        data = open_stream(spec)
        if hasattr(data, "n_shards"):  # streaming: one shard per data file
            n = max(1, data.n_shards)
            parts = [data.shard(num_shards=n, index=i, contiguous=True) for i in range(n)] if n > 1 else [data]
            out += [Shard(f"hf:{spec.dataset}#{i}", config, data=d) for i, d in enumerate(parts)]
        else:  # a memory-mapped save_to_disk dataset: runs of rows
            rows = len(data)
            out += [Shard(f"hf:{spec.dataset}[{a}:{min(rows, a + ROWS_PER_SHARD)}]", config, data=data, lo=a,
                          hi=min(rows, a + ROWS_PER_SHARD)) for a in range(0, rows, ROWS_PER_SHARD)]  # fmt: skip
    if not out:
        raise InputError("lmshard.stream: the inputs hold no records; name files, directories, a dataset or a preset")
    return out
