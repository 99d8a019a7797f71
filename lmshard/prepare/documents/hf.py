"""Hugging Face datasets as prepare inputs: hub ids (streamed), `save_to_disk` directories, and
local directories of parquet/jsonl files the `datasets` library can stream; named presets.

Records are read in the planning process and batched into work items like CSV rows, so the
same cleaning, dedup, tokenization and shard writing apply. A stream can be split across N
tasks (`--hf-tasks N --hf-task I`) with `datasets.distributed.split_dataset_by_node`, which
falls back to example-level splitting when the stream has fewer shards than tasks (a
one-file dataset), where `IterableDataset.shard()` fails (datatrove#308). `trust_remote_code`
is never passed.

A planned run (`--num-tasks`) reads a saved split by its rows (`row_records`), and a stream (a
hub id, a directory of data files) by its shards, one unit each (`stream_shards`,
`shard_records`): the stream's data files, whose records in shard order are the stream's.

Memory model: streaming reads one record batch at a time; `save_to_disk` datasets are
memory-mapped arrow. Nothing holds the dataset.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ...errors import ConfigError, InputError, LmshardError, missing_dependency
from .decompress import DECOMPRESSION_ERRORS, damage_kind
from .records import Record, bad, typed_text, with_domain


@dataclass(frozen=True)
class Preset:
    """A named dataset for `prepare --preset NAME`: the hub id, configuration and text field it
    reads, and the tokenizer it suggests."""

    name: str
    hub_id: str
    config: str | None
    text_field: str
    tokenizer: str
    description: str


PRESETS = {
    p.name: p
    for p in (
        Preset("fineweb", "HuggingFaceFW/fineweb", "sample-10BT", "text", "gpt2",
               "FineWeb 10B-token sample of filtered CommonCrawl web text (~28GB parquet)"),
        Preset("fineweb-edu", "HuggingFaceFW/fineweb-edu", "sample-10BT", "text", "gpt2",
               "FineWeb-Edu 10B-token sample: educational web pages (~27GB parquet)"),
        Preset("pile", "monology/pile-uncopyrighted", None, "text", "gpt2",
               "The Pile without its copyrighted subsets (~300B tokens, ~800GB)"),
        Preset("tiny_shakespeare", "karpathy/tiny_shakespeare", None, "text", "gpt2",
               "Tiny Shakespeare: 1MB of plays as one document per split (char-RNN classic)"),
        Preset("shakespeare", "karpathy/tiny_shakespeare", None, "text", "gpt2",
               "Alias of tiny_shakespeare, as nanoGPT names it"),
    )
}  # fmt: skip


def presets() -> list[Preset]:
    """The named datasets `prepare --preset NAME` (and `lmshard datasets`) knows, in order.

        >>> [p.name for p in presets()][:2]
        ['fineweb', 'fineweb-edu']
    """
    return list(PRESETS.values())


@dataclass(frozen=True, kw_only=True)
class HFSpec:
    """Which Hugging Face dataset to read, and which slice of its stream this task takes."""

    dataset: str
    config: str | None = None
    split: str = "train"
    text_field: str = "text"
    streaming: bool | None = None  # None: stream hub ids and local files; map saved datasets
    revision: str | None = None
    task: int = 0
    tasks: int = 1

    def __post_init__(self) -> None:
        check_task_split(self.task, self.tasks)

    def kind(self) -> str:
        """ "saved" (a save_to_disk directory), "local" (a directory of data files) or "hub"; an
        argument that can only be a path but names no directory is an error, not a hub id."""
        path = Path(self.dataset)
        if path.is_dir():
            saved = any((path / name).exists() for name in ("dataset_dict.json", "state.json"))
            return "saved" if saved else "local"
        if path.exists():
            raise InputError(
                f"--hf {self.dataset}: a file, not a directory; pass it as an input (lmshard prepare "
                f"{self.dataset} --out DIR), or pass its directory to --hf"
            )
        if _looks_like_path(self.dataset):
            raise InputError(f"--hf {self.dataset}: no such directory; check the path (a hub id is NAME or OWNER/NAME)")
        if self.dataset in PRESETS:
            p = PRESETS[self.dataset]
            raise ConfigError(f"--hf {self.dataset}: a preset name, not a hub id; pass --preset {p.name} (it reads "
                              f"{p.hub_id}{f' [{p.config}]' if p.config else ''})")  # fmt: skip
        return "hub"

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "kind": self.kind()}


def check_task_split(task: int, tasks: int) -> None:
    """--hf-tasks N --hf-task I: N >= 1 parts, and I names one of them."""
    if tasks < 1:
        raise ConfigError(f"--hf-tasks must be at least 1 (got {tasks})")
    if not 0 <= task < tasks:
        raise ConfigError(f"--hf-task must be in [0, {tasks}) for --hf-tasks {tasks} (got {task}); tasks count from 0")


# Endings of data files, not of hub ids: "--hf data/train.parquet" names a path.
_DATA_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".json", ".csv", ".txt", ".gz", ".zst", ".bz2", ".xz")


def _looks_like_path(dataset: str) -> bool:
    """A hub id is NAME or OWNER/NAME; this is not one: a relative, absolute or home path, more
    than one slash, a Windows separator, or a data-file suffix."""
    seps = {os.sep, os.altsep} - {None, "/"}
    return (
        dataset.startswith((".", "/", "~"))
        or dataset.count("/") > 1
        or any(sep in dataset for sep in seps if sep)
        or dataset.lower().endswith(_DATA_SUFFIXES)
    )


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise missing_dependency("datasets", "hf", "--hf") from None
    return datasets


def _hub_reachable(timeout: float = 5.0) -> str | None:
    """None if the hub answers a TCP connect, else why not (so an offline run fails fast
    instead of waiting on the library's retries)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return None
    except OSError as e:
        return f"{host} unreachable ({e.strerror or e})"


def _offline_error(spec: HFSpec, why: str) -> InputError:
    return InputError(
        f"--hf {spec.dataset}: cannot reach the Hugging Face hub ({why}); on a connected machine save it "
        "with `datasets` (save_to_disk) or download its parquet files, then pass that directory to --hf"
    )


def open_stream(spec: HFSpec) -> Any:
    """The dataset split as an iterable of dicts, already restricted to this task's part."""
    ds_lib = _datasets()
    kind = spec.kind()
    if kind == "hub":
        try:
            data = _load(ds_lib, spec, spec.streaming is not False)
        except Exception as e:  # offline, unknown id, gated: the library raises many types
            why = _hub_reachable(timeout=2.0)
            raise (
                _offline_error(spec, why) if why else InputError(f"--hf {spec.dataset}: {str(e).splitlines()[0]}")
            ) from None
    elif kind == "saved":
        data = _saved_split(ds_lib.load_from_disk(spec.dataset), ds_lib, spec)
        if spec.streaming:
            data = data.to_iterable_dataset()
    else:
        try:
            data = _load(ds_lib, spec, spec.streaming is not False)
        except DECOMPRESSION_ERRORS as e:
            what = damage_kind(e, "compressed")[1]
            raise InputError(f"--hf {spec.dataset}: {what} in a data file; re-download or re-create it") from None
        except Exception as e:
            raise InputError(
                f"--hf {spec.dataset}: not a dataset directory `datasets` can read ({str(e).splitlines()[0]})"
            ) from None
    if spec.text_field not in (data.column_names or [spec.text_field]):
        fields = ", ".join(data.column_names)
        raise InputError(f"--hf {spec.dataset}: no field '{spec.text_field}' (fields: {fields}); pass --text-field")
    if spec.tasks > 1:
        from datasets.distributed import split_dataset_by_node

        data = split_dataset_by_node(data, rank=spec.task, world_size=spec.tasks)
    return data


def _saved_split(data: Any, ds_lib: Any, spec: HFSpec) -> Any:
    """The split --split names of a `save_to_disk` dataset. A DatasetDict has named splits; a
    single Dataset holds one, whose name `load_dataset` recorded (a slice such as
    `train[:10%]` answers to `train`) or none (`Dataset.from_dict`: it answers to the
    default, train). Any other --split is refused: it would be read as this split anyway and
    recorded in the metadata as the one asked for."""
    if isinstance(data, ds_lib.DatasetDict):
        if spec.split not in data:
            raise InputError(f"--hf {spec.dataset}: no split {spec.split!r} (splits: {', '.join(data)})")
        return data[spec.split]
    own = None if data.split is None else str(data.split)
    if spec.split in (own, (own or "train").split("[")[0]):
        return data
    has = f"its one split is {own!r}; pass --split {own.split('[')[0]}" if own else (
        "it holds one unnamed split, read as train; drop --split")  # fmt: skip
    raise InputError(f"--hf {spec.dataset}: a single saved dataset, no split {spec.split!r} ({has})")


def _load(ds_lib: Any, spec: HFSpec, streaming: bool) -> Any:
    if spec.kind() == "hub" and (why := _hub_reachable()) is not None:
        raise _offline_error(spec, why)
    return ds_lib.load_dataset(spec.dataset, spec.config, split=spec.split, streaming=streaming, revision=spec.revision)


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


_OPENED: dict[tuple[HFSpec, int], Any] = {}  # a saved split, memory-mapped once per process (and per save)


def saved_split(spec: HFSpec) -> Any:
    """The split of a `save_to_disk` dataset as a `datasets.Dataset` (memory-mapped arrow: rows
    are read where they lie, whatever --streaming says), checked as `open_stream` checks it;
    opened once per process, again when the directory was saved anew."""
    if spec.kind() != "saved":
        raise ConfigError(f"--hf {spec.dataset}: a planned run (--num-tasks) reads a saved dataset (save_to_disk) "
                          "only; save it first, or run without --num-tasks")  # fmt: skip
    marks = [Path(spec.dataset) / name for name in ("dataset_dict.json", "state.json")]
    key = (spec, max((m.stat().st_mtime_ns for m in marks if m.exists()), default=0))
    if key not in _OPENED:
        _OPENED.clear()
        _OPENED[key] = open_stream(replace(spec, streaming=False))
    return _OPENED[key]


def saved_rows(spec: HFSpec) -> int:
    """How many rows the saved split holds."""
    return len(saved_split(spec))


def row_records(spec: HFSpec, start: int, end: int) -> Iterator[Record]:
    """Records start + 1 .. end of a saved split (its rows [start, end)), numbered as
    `hf_records` numbers them: a planned task reads its own rows."""
    data = saved_split(spec)
    if end > len(data):
        raise InputError(f"--hf {spec.dataset}: holds {len(data):,} rows, fewer than when the run was planned (rows "
                         f"{start:,}-{end:,} are gone); it was saved again: delete the run's work folder and plan "
                         "again")  # fmt: skip
    rows = data.select(range(start, end))
    yield from example_records(iter(rows), spec.text_field, _where(spec, 0, 1), start)


_STREAMS: dict[HFSpec, Any] = {}  # a stream, opened once per process (its data files resolved once)


def _stream(spec: HFSpec) -> Any:
    spec = replace(spec, streaming=True)  # (a planned run streams whatever --streaming says: the same records)
    if spec not in _STREAMS:
        _STREAMS.clear()
        _STREAMS[spec] = open_stream(spec)
    return _STREAMS[spec]


def stream_shards(spec: HFSpec) -> int:
    """How many shards (data files) the stream of a hub id or a directory of data files has,
    for a planned run's units."""
    if spec.tasks > 1:
        raise ConfigError(f"--hf {spec.dataset}: --hf-tasks splits a stream into separate datasets; a planned run "
                          "(--num-tasks) splits it by its shards into one dataset: pass one or the other")  # fmt: skip
    return int(_stream(spec).n_shards)


def source_bytes(spec: HFSpec) -> int:
    """About how many bytes a Hugging Face source holds, for a plan's dedup buckets (its records'
    sizes are not known before they are read): the files of a local or saved directory (not in
    hidden folders: a clone's .git, a cache); a hub dataset's size as its card states it, else
    1 GiB per data file."""
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
    """What a resumed run in one process must find as the interrupted one found it: a saved
    dataset's save (the modification time of its state files, as `saved_split` keys it), or the
    data files of the whole stream (`stream_mark`, whatever part --hf-tasks reads)."""
    if spec.kind() == "saved":
        marks = [Path(spec.dataset) / name for name in ("dataset_dict.json", "state.json")]
        return str(max((m.stat().st_mtime_ns for m in marks if m.exists()), default=0))
    try:
        return stream_mark(replace(spec, task=0, tasks=1))  # (the stream hf_records reads: opened once)
    except LmshardError:  # not to be opened as a stream here (--streaming false, offline, from the cache)
        return ""  # nothing to compare: no check, as where `datasets` lists no names


def shard_records(spec: HFSpec, index: int, n_shards: int, start: int = 0, mark: str | None = None) -> Iterator[Record]:
    """The records of shard `index` of the stream's `n_shards` (as planned), numbered from
    `start` + 1; a stream that has another number of shards now, or other data files than the
    planned ones (`mark`: their `stream_mark`), is refused in one line."""
    data = _stream(spec)
    if data.n_shards != n_shards:
        raise InputError(f"--hf {spec.dataset}: has {data.n_shards:,} data files, not the {n_shards:,} of when "
                         "the run was planned; delete the run's work folder and plan again (or pin its --revision)")
    if mark and stream_mark(spec) not in ("", mark):
        raise InputError(f"--hf {spec.dataset}: its data files are not the ones the run was planned with (a new "
                         "revision, or files renamed); delete the run's work folder and plan again (or pin its "
                         "--revision)")  # fmt: skip
    shard = data.shard(num_shards=n_shards, index=index, contiguous=True)
    yield from example_records(iter(shard), spec.text_field, _where(spec, index, n_shards), start)


def example_records(examples: Iterator[dict[str, Any]], field: str, where: str, start: int = 0) -> Iterator[Record]:
    """Records (numbered from `start` + 1) of a `datasets` stream of examples; a compressed data
    file found damaged mid-stream ends it with one bad record naming `where` and how many of
    these examples came before."""
    number = start
    while True:
        try:
            example = next(examples, None)
        except DECOMPRESSION_ERRORS as e:
            problem, what = damage_kind(e, "compressed")
            yield bad(number + 1, problem, f"{what} in {where} after {number - start:,} records")
            return
        if example is None:
            return
        number += 1
        if field in example:  # a null or a number is `wrong_type`, as in files
            yield with_domain(typed_text(number, example[field], field), example, field)
        else:
            yield bad(number, "missing_field", f"no field '{field}' (fields: {', '.join(list(example)[:8])})")


def apply_preset(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """Fill --hf, --hf-config, --text-field and --tokenizer from a preset (explicit values win)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; `lmshard datasets` lists: {', '.join(PRESETS)}")
    p = PRESETS[name]
    merged = {"hf": p.hub_id, "hf_config": p.config, "text_field": p.text_field, "tokenizer": p.tokenizer}
    merged.update({k: v for k, v in values.items() if v is not None})
    return merged
