"""Hugging Face datasets as prepare inputs: hub ids (streamed, or downloaded with
--no-streaming), `save_to_disk` directories, and local directories of parquet/jsonl files the
`datasets` library can read; named presets.

Records are batched into work items like CSV rows, so the same cleaning, dedup, tokenization
and shard writing apply. A stream can be split across N
tasks (`--hf-tasks N --hf-task I`) with `datasets.distributed.split_dataset_by_node`, which
falls back to example-level splitting when the stream has fewer shards than tasks (a
one-file dataset), where `IterableDataset.shard()` fails (datatrove#308). `trust_remote_code`
is never passed.

How a dataset is read (whole, by rows, by shards) is hfread.py's.

Memory model: streaming reads one record batch at a time; `save_to_disk` datasets are
memory-mapped arrow. Nothing holds the dataset.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ...errors import ConfigError, InputError, missing_dependency
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


def _offline() -> str | None:
    """The variable that puts `datasets` offline (it then reads a hub id from its cache), if set."""
    return next((v for v in _OFFLINE if os.environ.get(v, "0").lower() in ("1", "true", "yes", "on")), None)


_OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def _hub_reachable(timeout: float = 5.0) -> str | None:
    """None if the hub answers a TCP connect, else why not (so an offline run fails fast
    instead of waiting on the library's retries)."""
    if (variable := _offline()) is not None:
        return f"{variable} is set"
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return None
    except OSError as e:
        return f"{host} unreachable ({e.strerror or e})"


def _offline_error(spec: HFSpec, why: str) -> InputError:
    if spec.streaming is False:  # (offline it would have read the cached copy: only unreachable comes here)
        cached = "; to read the copy `datasets` cached, set HF_HUB_OFFLINE=1"
    else:
        cached = "; with --no-streaming, the copy `datasets` cached is read" if _offline() else ""
    return InputError(
        f"--hf {spec.dataset}: cannot reach the Hugging Face hub ({why}){cached}; on a connected machine save it "
        "with `datasets` (save_to_disk) or download its parquet files, then pass that directory to --hf"
    )


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


def _cached_copy(ds_lib: Any, spec: HFSpec, why: str) -> Any:
    """Offline (HF_HUB_OFFLINE), a hub id's split with --no-streaming: the copy `datasets` cached
    when it downloaded it (offline, `datasets` reads the copy downloaded last), which a
    --revision must name by its commit (or the commit's start): the copy's folder is named after
    the commit it was downloaded at, and a branch or tag cannot be resolved without the hub."""
    try:
        data = ds_lib.load_dataset(spec.dataset, spec.config, split=spec.split, streaming=False)
    except Exception as e:  # (none cached, several configurations, another split: the library raises many types)
        what = _first_line(e)
        fix = ("pass --hf-config to name one" if "multiple" in what and "configurations" in what else
               "download it once on a connected machine (prepare --no-streaming, or datasets.load_dataset) into "
               "the same HF_HOME")  # fmt: skip
        raise InputError(f"--hf {spec.dataset}: offline ({why}), cannot load the copy `datasets` cached ({what}); "
                         f"{fix}") from None  # fmt: skip
    pinned = None if spec.revision is None else spec.revision.lower()
    commit = Path(data.cache_files[0]["filename"]).parent.name if data.cache_files else "an unknown commit"
    if pinned is not None and not (re.fullmatch(r"[0-9a-f]{7,40}", pinned) and commit.startswith(pinned)):
        hexed = re.fullmatch(r"[0-9a-f]+", pinned)
        why_not = ("a branch or tag cannot be resolved offline" if not hexed else
                   "a commit is named by 7 or more of its hex digits" if len(pinned) < 7 else "another commit")
        raise InputError(f"--hf {spec.dataset}: offline ({why}), `datasets` reads the copy it downloaded last, of "
                         f"commit {commit}, which --revision {spec.revision} does not name ({why_not}); pass "
                         f"--revision {commit} to read it, or download that revision where the hub is "
                         "reachable")  # fmt: skip
    return data


def open_stream(spec: HFSpec) -> Any:
    """The dataset split as an iterable of dicts, already restricted to this task's part."""
    ds_lib = _datasets()
    kind = spec.kind()
    if kind == "hub":
        try:
            data = _load(ds_lib, spec, spec.streaming is not False)
        except InputError:
            raise
        except Exception as e:  # offline, unknown id, gated: the library raises many types
            why = _hub_reachable(timeout=2.0)
            raise (
                _offline_error(spec, why) if why else InputError(f"--hf {spec.dataset}: {_first_line(e)}")
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
                f"--hf {spec.dataset}: not a dataset directory `datasets` can read ({_first_line(e)})"
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
        if streaming or _offline() is None:  # (a stream needs the hub; unreachable, fail fast but say how to go on)
            raise _offline_error(spec, why)
        return _cached_copy(ds_lib, spec, why)
    return ds_lib.load_dataset(spec.dataset, spec.config, split=spec.split, streaming=streaming, revision=spec.revision)


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
