"""The per-item work that runs in worker processes: parse → clean → filter → key → tokenize.

A worker returns one `ItemResult` per work item: all surviving documents' tokens as one flat
uint32 array with their lengths and dedup keys, plus counts by source and drop reason. It keeps
no state between items except the tokenizer, so items can run in any process, in any order,
and the writer alone decides what to keep (dedup, split) in item order.

Memory model: one item's text (≈1 MiB, or one row group) and its tokens (≈4 bytes per token),
then released; nothing accumulates across items.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from ...errors import InputError
from ...quality.filters import FilterFailed, run_filters
from ...quality.minhash import MinHashConfig, signature
from ...tokenizers import Tokenizer
from .clean import CleanConfig, clean_text, drop_detail, fix_surrogates, length_filter
from .columnar import parse_arrow, parse_parquet
from .files import Source
from .records import Record, example, parse_jsonl, parse_text_lines, read_whole_file, settle
from .sources import SPLIT_INTO_PARAGRAPHS, WorkItem, by_paragraph

if TYPE_CHECKING:
    from ...quality.scores import Scorer


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Everything a worker needs; pickled once per worker at start."""

    sources: Sequence[Source]  # (a planned task's: read from the plan as it uses them, plantables.py)
    clean: CleanConfig
    tokenizer: str
    tokenizer_backend: str = "auto"  # the backend the main process chose (and gated): workers use the same
    separator: str | None = None
    text_field: str = "text"
    text_mode: str = "auto"
    on_error: str = "fail"
    decode_errors: str = "strict"  # replace: bytes that are not UTF-8 read as U+FFFD (records.py)
    minhash: MinHashConfig | None = None  # --near-dedup: each kept document's signature too
    hf: Any = None  # a planned run's Hugging Face dataset (hf.HFSpec), opened by the process reading its units
    attributes: tuple[str, ...] = ()  # --attribute: each kept document's scores (quality/scores.py)


DECODE_REPLACED = "decode_replaced"  # a per-source count of records read with U+FFFD for bytes not UTF-8 (not a drop)
DROP_CHARS = "chars:"  # a per-source count of the characters of the documents dropped, by reason (not a drop)
LINE_DROP = "line:"  # a per-source count of lines a filter's edit removed, by its reason (not a document drop)


@dataclass
class ItemResult:
    """What one work item produced. Documents are in input order."""

    seq: tuple[int, int]
    tokens: np.ndarray  # all documents back to back, no separators: uint16 for vocabularies that fit, else uint32
    lengths: np.ndarray  # int64 tokens per document
    keys: np.ndarray  # uint64 xxh3-64 of each cleaned document's UTF-8 bytes
    doc_sources: np.ndarray  # int32 source index per document
    counts: dict[int, Counter[str]] = field(default_factory=dict)  # source → {records, drops…}
    examples: dict[str, str] = field(default_factory=dict)  # drop reason → one example message
    chars: int = 0
    nbytes: int = 0
    signatures: np.ndarray | None = None  # --near-dedup: [documents, n_hashes] uint32 MinHash signatures
    numbers: np.ndarray | None = None  # int64: each document's record number (line or row) in its file
    attrs: np.ndarray | None = None  # --attribute: each document's record (format/attributes.py's row_dtype)
    domains: list[str] | None = None  # --val-by FIELD: each document's domain, the value of that field


def run_item(item: WorkItem, config: WorkerConfig, tokenizer: Tokenizer | None, sign: bool | None = None,
             stop_after: int | None = None) -> ItemResult:  # fmt: skip
    """The item's kept documents: tokens (none without a tokenizer), keys and, when `sign` (by
    default: when the config has a MinHash configuration), signatures. `stop_after`: read no
    record after the one that gives that many documents (--max-docs: the counts of a prefix)."""
    counts: dict[int, Counter[str]] = {}
    examples: dict[str, str] = {}
    texts: list[str] = []
    keys: list[int] = []
    sources: list[int] = []
    numbers: list[int] = []
    domain_field = getattr(config.text_field, "domain", None)  # --val-by FIELD (records.RecordFields)
    domains: list[str] = []
    if item.split_file:
        counts.setdefault(item.source, Counter())[SPLIT_INTO_PARAGRAPHS] += 1
    lines = _LineFilter(item.line_keep) if item.line_keep is not None else None
    for src_index, record in _records(item, config):
        c = counts.setdefault(src_index, Counter())
        c["records"] += 1
        if record.repaired:  # --decode-errors replace: kept with U+FFFD for its bad bytes
            c[DECODE_REPLACED] += 1
        text, reason = record.text, record.problem
        size = 0  # the characters of the document a drop removes (none for a record never read as one)
        if text is not None:
            cleaned = _clean(text, config.clean)
            size = len(cleaned)
            if lines is not None:
                cleaned, removed = lines.apply(cleaned)
                c["lines_removed"] += removed
            text, reason = length_filter(cleaned, config.clean)
            if reason is not None:
                record = record._replace(problem=reason, detail=drop_detail(reason, len(cleaned), config.clean))
            elif config.clean.filters and text is not None:  # the filters' edits are what is keyed and tokenized
                try:
                    text, reason, by, removed_lines = run_filters(config.clean.filters, text)
                except FilterFailed as e:  # the plugin's fault, named at the record it failed on
                    raise InputError(f"{config.sources[src_index].path}:{record.number}: {e}") from None
                if reason is not None:
                    record = record._replace(problem=reason, detail=_dropped_by(by))
                for why, (n, first) in (removed_lines or {}).items():  # lines a kept document's filters removed
                    c[LINE_DROP + why] += n
                    examples.setdefault(LINE_DROP + why, f"{config.sources[src_index].path}:{record.number}: "
                                                         f"{first[:80]!r}")  # fmt: skip
        if reason is not None:
            c[reason] += 1
            if size:
                c[DROP_CHARS + reason] += size
            examples.setdefault(reason, example(config.sources[src_index], record))
            continue
        assert text is not None
        keys.append(xxhash.xxh3_64_intdigest(text.encode("utf-8")))
        texts.append(text)
        sources.append(src_index)
        numbers.append(record.number)
        if domain_field is not None:
            if record.domain is None:  # (plain text, or a file read as one document: no fields)
                raise InputError(f"{config.sources[src_index].path}: --val-by {domain_field}: its records have no "
                                 "fields; --val-by FIELD reads JSON, CSV, parquet, arrow or Hugging Face records "
                                 "(use --val-by input for a val part of each file)")  # fmt: skip
            domains.append(record.domain)
        if stop_after is not None and len(keys) >= stop_after:
            break
    signatures = None
    if config.minhash is not None and (sign if sign is not None else True):
        signatures = np.zeros((len(texts), config.minhash.n_hashes), dtype=np.uint32)
        for d, text in enumerate(texts):
            signatures[d] = signature(text, config.minhash)
    attrs = None
    if config.attributes and tokenizer is not None:  # (not in --near-dedup's signing pass)
        from ...quality.scores import ScoreFailed  # (a run without --attribute imports no scorer)

        scores, rows = scorer(config.attributes), []
        for d, text in enumerate(texts):
            try:
                rows.append(scores.row(text))
            except ScoreFailed as e:  # the plugin's fault, named at the record it failed on
                raise InputError(f"{config.sources[sources[d]].path}:{numbers[d]}: {e}") from None
        attrs = np.array(rows, dtype=scores.dtype)
    if tokenizer is None:
        tokens, lengths = np.zeros(0, np.uint16), np.zeros(len(texts), np.int64)
    else:
        tokens, lengths = tokenizer.encode_batch(texts)
    # Half the bytes to send back when every id fits (the shards are uint32 all the same); the
    # max is checked too, so a backend misreporting n_vocab costs speed, never tokens.
    if tokenizer is not None and tokenizer.n_vocab <= 1 << 16 and (len(tokens) == 0 or int(tokens.max()) < 1 << 16):
        tokens = tokens.astype(np.uint16)
    return ItemResult(
        seq=(item.source, item.seq),
        tokens=tokens,
        lengths=lengths,
        keys=np.array(keys, dtype=np.uint64),
        doc_sources=np.array(sources, dtype=np.int32),
        counts=counts,
        examples=examples,
        chars=sum(map(len, texts)),
        nbytes=item.nbytes,
        signatures=signatures,
        numbers=np.array(numbers, dtype=np.int64),
        attrs=attrs,
        domains=domains if domain_field is not None else None,
    )


_scorers: dict[tuple[str, ...], Scorer] = {}


def scorer(specs: tuple[str, ...]) -> Scorer:
    """This process's scorer of `specs` (plugins imported once)."""
    from ...quality.scores import Scorer

    if specs not in _scorers:
        _scorers[specs] = Scorer(specs)
    return _scorers[specs]


def _clean(text: str, clean: CleanConfig) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = fix_surrogates(text)  # lone surrogates from JSON escapes cannot be UTF-8
    return clean_text(text, clean)


def _content_lines(text: str) -> Iterator[tuple[int, str]]:
    """(position, line) of the lines that count for line dedup: all but blank ones."""
    for k, line in enumerate(text.split("\n")):
        if line.strip():
            yield k, line


class _LineFilter:
    """Drops the lines that pass 1 found earlier in the input, consuming its keep-mask in order."""

    def __init__(self, packed: tuple[bytes, int]) -> None:
        bits, n = packed
        self.keep = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), count=n).astype(bool).tolist()
        self.pos = 0

    def apply(self, text: str) -> tuple[str, int]:
        """`text` without its lines met before, and how many; "" when none of its lines is left
        (the blank lines between them are no document: dropped as empty)."""
        parts = text.split("\n")
        drop, content = set(), 0
        for k, _ in _content_lines(text):
            if not self.keep[self.pos]:
                drop.add(k)
            self.pos += 1
            content += 1
        if not drop:
            return text, 0
        if len(drop) == content:
            return "", len(drop)
        return "\n".join(p for k, p in enumerate(parts) if k not in drop), len(drop)


def hash_lines(item: WorkItem, config: WorkerConfig) -> np.ndarray:
    """Pass 1 of line dedup: xxh3-64 of every non-blank cleaned line of the item, in order."""
    hashes: list[int] = []
    for _, record in _records(item, config):
        if record.text is not None:
            text = _clean(record.text, config.clean)
            hashes.extend(xxhash.xxh3_64_intdigest(line.encode("utf-8")) for _, line in _content_lines(text))
    return np.array(hashes, dtype=np.uint64)


def clean_document(record: Record, clean: CleanConfig) -> tuple[str | None, str | None]:
    """(the cleaned text, None) of a settled record, or (None, why it is dropped): what a
    prepare worker does to each record before dedup (`lmshard.stream` shares it)."""
    if record.text is None:
        return None, record.problem
    text, reason = length_filter(_clean(record.text, clean), clean)
    if reason is None and clean.filters and text is not None:
        try:
            text, reason, _, _ = run_filters(clean.filters, text)
        except FilterFailed as e:
            raise InputError(f"record {record.number}: {e}") from None
    return (None, reason) if reason is not None else (text, None)


def records_of(item: WorkItem, config: WorkerConfig) -> Iterator[tuple[int, Record]]:
    return _records(item, config)


def parsed_records(item: WorkItem, config: WorkerConfig) -> Iterator[tuple[int, Record]]:
    """(source index, record) for every record of the item as parsed, before --on-error settles a
    bad one (a bad record has no text)."""
    return _parsed(item, config)


def _records(item: WorkItem, config: WorkerConfig) -> Iterator[tuple[int, Record]]:
    """(source index, settled record) for every record of the item, in input order."""
    for s, record in _parsed(item, config):
        yield s, settle(config.sources[s], record, config.on_error)


def _parsed(item: WorkItem, config: WorkerConfig) -> Iterator[tuple[int, Record]]:
    src = config.sources[item.source]
    if item.kind == "files":
        limit = 4 * config.clean.max_chars
        for s in item.payload:
            yield s, read_whole_file(config.sources[s], limit, truncate=config.clean.overlong == "truncate",
                                     replace=config.decode_errors == "replace")  # fmt: skip
        return
    if item.kind == "records":
        records: Iterator[Record] = iter(item.payload)
    elif item.kind == "parquet":
        records = parse_parquet(src, item.locator, config.text_field)
    elif item.kind == "arrow":
        records = parse_arrow(src, item.locator, config.text_field)
    elif src.fmt == "text":
        records = parse_text_lines(item.payload, item.first_line, by_paragraph(config.text_mode),
                                   config.decode_errors == "replace")  # fmt: skip
    else:
        records = parse_jsonl(item.payload, item.first_line, config.text_field, config.decode_errors == "replace")
    for record in records:
        yield item.source, record


def _dropped_by(name: str | None) -> str:
    """What dropped a document, as the user asked for it: --filter NAME, or --decontaminate FILES."""
    if name and name.startswith("decontaminate="):
        return f"dropped by --decontaminate {name.split(':', 2)[2].replace('|', ' ')}"
    return f"dropped by --filter {name}"
