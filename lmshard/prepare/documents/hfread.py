"""Reading a Hugging Face dataset (hf.py's HFSpec): whole, in one process (`hf_records`); by
rows of a mapped split (`row_records`: a `save_to_disk` directory, or the copy `datasets`
downloads and caches with --no-streaming), and by shards of a stream (`shard_records`: a hub
id, a directory of data files), the units of a planned run; and what a plan or a resume records
of them to find the same data again (`stream_mark`, `mapped_mark`, `resume_mark`).

Memory model: a stream reads one record batch at a time; a mapped split is memory-mapped arrow
(opened once per process); nothing holds the dataset.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...errors import ConfigError, InputError, LmshardError
from .hf import HFSpec, example_records, open_stream
from .records import Record


def hf_records(spec: HFSpec) -> Iterator[Record]:
    """Every example of this task's part of the stream, numbered from 1. A stream of several
    shards (data files) is read shard after shard, as a planned run reads them: a compressed
    data file that `datasets` finds damaged midway ends its shard with one bad record, and the
    next shard goes on."""
    data = open_stream(spec) if spec.streaming is False else _stream(spec)
    n = data.n_shards if spec.tasks == 1 and hasattr(data, "n_shards") else 1
    if n <= 1:
        yield from example_records(iter(data), spec.text_field, _where(spec, 0, 1))
        return
    number = 0
    for s in range(n):
        shard = data.shard(num_shards=n, index=s, contiguous=True)
        for record in example_records(iter(shard), spec.text_field, _where(spec, s, n), number):
            number = record.number
            yield record


def _where(spec: HFSpec, index: int, n_shards: int) -> str:
    """Shard `index` of a stream's `n_shards`, as a message names it."""
    if n_shards == 1:
        return f"a data file of --hf {spec.dataset}"
    return f"data file {index + 1:,} of {n_shards:,} of --hf {spec.dataset}"


_OPENED: dict[tuple[HFSpec, int], Any] = {}  # the mapped splits of this process's run (and per save)


def forget() -> None:
    """Drop the splits and streams this process opened: a new run (its walk of the inputs,
    runplan.load_run) opens them again, so a data file changed since an earlier run of this
    process is seen; a task opens each once, as it starts."""
    _OPENED.clear()
    _STREAMS.clear()


def mapped(spec: HFSpec) -> bool:
    """Whether the split is read where it lies, by rows (memory-mapped arrow): a `save_to_disk`
    directory, whatever --streaming says, or a hub id or directory of data files with
    --no-streaming, which `datasets` downloads (or converts) into its cache first, as a
    `load_dataset(..., streaming=False)` does; else it is streamed, by shards."""
    return spec.kind() == "saved" or spec.streaming is False


def mapped_split(spec: HFSpec) -> Any:
    """The split as a `datasets.Dataset` (memory-mapped arrow: rows are read where they lie),
    checked as `open_stream` checks it; opened once per process, again when a saved directory
    was saved anew. With --no-streaming the first open downloads it into the cache of
    `datasets` (HF_HOME), later ones (every worker, every task) read that copy."""
    if not mapped(spec):
        raise ConfigError(f"--hf {spec.dataset}: read by rows only when saved (save_to_disk) or downloaded "
                          "(--no-streaming); a stream is read by its shards")  # fmt: skip
    key = (spec, _saved_at(spec))
    if key not in _OPENED:  # (a whole split and its --hf-tasks part both stay open: forget() bounds them)
        _OPENED[key] = open_stream(replace(spec, streaming=False))
    return _OPENED[key]


def _saved_at(spec: HFSpec) -> int:
    """When a `save_to_disk` directory was saved (its state files' latest modification, in ns);
    0 for any other split."""
    if spec.kind() != "saved":
        return 0
    marks = [Path(spec.dataset) / name for name in ("dataset_dict.json", "state.json")]
    return max((m.stat().st_mtime_ns for m in marks if m.exists()), default=0)


def mapped_rows(spec: HFSpec) -> int:
    """How many rows the mapped split holds."""
    return len(mapped_split(spec))


def mapped_mark(spec: HFSpec) -> str:
    """Which copy a downloaded split (--no-streaming) is: the fingerprint `datasets` gives the
    split it loads from its cache, which another revision, another data file or another --split
    changes; "" for a saved directory (its save's time is `resume_mark`'s)."""
    return "" if spec.kind() == "saved" else str(mapped_split(spec)._fingerprint)


def row_records(spec: HFSpec, start: int, end: int, mark: str = "") -> Iterator[Record]:
    """Records start + 1 .. end of a mapped split (its rows [start, end)), numbered as
    `hf_records` numbers them: a planned task reads its own rows. `mark`: the downloaded copy
    the run was planned with (`mapped_mark`); another one is refused in one line."""
    data = mapped_split(spec)
    if mark and str(data._fingerprint) != mark:  # (a saved split's mark is "": its save is the run's identity)
        raise InputError(f"--hf {spec.dataset}: the copy `datasets` loads now is not the one the run was planned "
                         "with (another revision downloaded, or its data files changed); delete the run's work "
                         "folder and plan again (or pin its --revision)")  # fmt: skip
    if end > len(data):
        raise InputError(f"--hf {spec.dataset}: holds {len(data):,} rows, fewer than when the run was planned (rows "
                         f"{start:,}-{end:,} are gone); it was saved again: delete the run's work folder and plan "
                         "again")  # fmt: skip
    rows = data.select(range(start, end))
    yield from example_records(iter(rows), spec.text_field, _where(spec, 0, 1), start)


_STREAMS: dict[HFSpec, Any] = {}  # a stream, opened once per process (its data files resolved once)


def _stream(spec: HFSpec) -> Any:
    spec = replace(spec, streaming=True)  # (its records are those of `open_stream`, whatever --streaming says)
    if spec not in _STREAMS:
        _STREAMS.clear()
        _STREAMS[spec] = open_stream(spec)
    return _STREAMS[spec]


def stream_shards(spec: HFSpec) -> int:
    """How many shards (data files) the stream of a hub id or a directory of data files has,
    for a planned run's units; one with --hf-tasks: part I of N, which `datasets` splits by shards
    or by examples, is read as one (`shard_records`)."""
    return 1 if spec.tasks > 1 else int(_stream(spec).n_shards)


def source_bytes(spec: HFSpec) -> int:
    """About how many bytes a Hugging Face source holds, for a plan's dedup buckets (its records'
    sizes are not known before they are read): the files of a local or saved directory (not in
    hidden folders: a clone's .git, a cache); a hub dataset's downloaded copy's arrow files
    (--no-streaming); a streamed one's size as its card states it, else 1 GiB per data file."""
    if spec.kind() == "hub" and mapped(spec):
        return int(mapped_split(spec).data.nbytes)  # (its arrow tables, mapped or in memory)
    if spec.kind() != "hub":
        root = Path(spec.dataset)
        return sum(p.stat().st_size for p in root.rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))  # fmt: skip
    info = getattr(_stream(spec), "info", None)
    stated = getattr(info, "dataset_size", None) or getattr(info, "download_size", None)
    return int(stated) if stated else stream_shards(spec) << 30


def stream_mark(spec: HFSpec) -> str:
    """Which data files the stream reads, as a digest of their names: a hub dataset's name the
    commit `datasets` resolved them at (`hf://datasets/ID@SHA/...`), so a revision pushed
    after a planned run's planning changes it, as does a data file added, removed or renamed in a
    directory (its names taken relative to it; one rewritten in place under its own name does not).
    "" where `datasets` does not list them as names (its releases before 5 hold parquet's as lazy
    iterables): no check then."""
    kwargs = getattr(getattr(_stream(spec), "_ex_iterable", None), "kwargs", None) or {}
    lists = (kwargs.get(k) for k in ("files", "base_files"))  # (parquet's; json, csv and text's)
    files = next((f for f in lists if isinstance(f, list) and f and all(isinstance(n, str) for n in f)), None)
    if files is None:
        return ""
    root = "" if spec.kind() == "hub" else os.path.abspath(spec.dataset) + os.sep
    names = [n[len(root) :] if root and n.startswith(root) else n for n in files]
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


def resume_mark(spec: HFSpec) -> str:
    """What a resumed run must find as the interrupted one found it: a saved dataset's save
    (the modification time of its state files, as `mapped_split` keys it), the downloaded copy
    of the whole split (`mapped_mark`), or the data files of the whole stream (`stream_mark`),
    whatever part --hf-tasks reads."""
    if spec.kind() == "saved":
        return str(_saved_at(spec))
    if mapped(spec):
        return mapped_mark(replace(spec, task=0, tasks=1))
    try:
        return stream_mark(replace(spec, task=0, tasks=1))  # (the stream hf_records reads: opened once)
    except LmshardError:  # not to be opened as a stream here (offline)
        return ""  # nothing to compare: no check, as where `datasets` lists no names


def shard_records(spec: HFSpec, index: int, n_shards: int, start: int = 0, mark: str | None = None) -> Iterator[Record]:
    """The records of shard `index` of the stream's `n_shards` (as planned), numbered from
    `start` + 1; a stream that has another number of shards now, or other data files than the
    planned ones (`mark`: their `stream_mark`), is refused in one line."""
    data = _stream(spec)
    if spec.tasks > 1:  # part I of N (--hf-tasks): one unit, read whole as one process reads it (`hf_records`)
        yield from example_records(iter(data), spec.text_field, _where(spec, 0, 1), start)
        return
    if data.n_shards != n_shards:
        raise InputError(f"--hf {spec.dataset}: has {data.n_shards:,} data files, not the {n_shards:,} of when "
                         "the run was planned; delete the run's work folder and plan again (or pin its --revision)")
    if mark and stream_mark(spec) not in ("", mark):
        raise InputError(f"--hf {spec.dataset}: its data files are not the ones the run was planned with (a new "
                         "revision, or files renamed); delete the run's work folder and plan again (or pin its "
                         "--revision)")  # fmt: skip
    shard = data.shard(num_shards=n_shards, index=index, contiguous=True)
    yield from example_records(iter(shard), spec.text_field, _where(spec, index, n_shards), start)


__all__ = ["hf_records", "mapped", "mapped_mark", "mapped_rows", "mapped_split", "resume_mark", "row_records",
           "shard_records", "source_bytes", "stream_mark", "stream_shards"]
