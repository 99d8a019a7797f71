"""The plan of a planned retokenize (`lmshard retokenize --num-tasks N`, retoktasks.py): made
once by `plan`, read by every task through `load`.

`plan` checks the source and the new vocabulary as a one-process run does, claims `--out`
(refused when it is not empty, without --overwrite), and writes into the work folder beside
`--out` (`.NAME.lmshard-work`, as a planned prepare's) two tables of JSON lines with their byte
offsets (`write_table`), `units` (a row per source shard that holds documents, in order: train's,
then val's) and `keys` (the source's key files), the source's metadata without its shards, key
files and inputs (`source.json`), and last `retokenize.json`: the options, the task count, the
source metadata's inode, size and time and the new vocabulary's sha256. A task reads the head,
`source.json` and its own rows of the tables (`read_rows`: two reads). Planned again with the
same options, a run goes on from what is done; with others, or after the source's metadata or
the vocabulary file changed, every task refuses in one line naming what changed.

Memory model: the planning process holds the source's metadata and the tables' rows; a task,
the head, the source's head and the rows it reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError
from ..format import METADATA_FILE, atomic_write_json, parse_metadata
from ..prepare.execution.taskplan import work_dir
from .output import _check_out
from .retokenize import Setup, setup

PLAN_FILE = "retokenize.json"
SOURCE_FILE = "source.json"  # the source's metadata without its shards, key files and inputs
OPTIONS = ("tokenizer", "tokenizer_backend", "shard_encoding", "tokens_per_shard", "separator", "bos")
VERSION = 1


def planned(out: str | os.PathLike[str]) -> bool:
    """Whether `out`'s work folder holds a planned retokenize."""
    return (work_dir(out) / PLAN_FILE).is_file()


def plan(dataset: str | os.PathLike[str], out: str | os.PathLike[str], n_tasks: int, *, overwrite: bool = False,
         **options: Any) -> None:  # fmt: skip
    """Check the source and the vocabulary, claim `out` and write the plan (module docstring);
    the same plan again goes on from what is done. `options`: OPTIONS, as retokenize_dataset takes."""
    if n_tasks < 1:
        raise ConfigError(f"--num-tasks {n_tasks}: pass 1 or more")
    given: dict[str, Any] = {k: options[k] for k in OPTIONS[1:] if options.get(k) is not None}
    s = setup(dataset, options["tokenizer"], out, workers=1, **given)
    target = Path(os.path.realpath(out))
    work = work_dir(target)
    if (work / "plan.json").exists():
        raise ConfigError(f"{work}: holds a planned prepare of {target}; finish it (lmshard status {target}) or "
                          "choose another --out")  # fmt: skip
    resolved = {"tokenizer": options["tokenizer"], **{k: getattr(s.config, k) for k in OPTIONS[1:]}}
    units, keys = s.units(), s.meta.dedup.files if s.meta.dedup else ()
    head = {"version": VERSION, "dataset": os.path.realpath(s.meta.root), "n_tasks": n_tasks, "overwrite": overwrite,
            "source": _stamp(s.meta.root), "vocabulary": s.new.vocab_sha256, "options": resolved,
            "units": len(units), "keys": len(keys)}  # fmt: skip
    if (work / PLAN_FILE).is_file():
        _same(head, json.loads((work / PLAN_FILE).read_text()), work)
        return
    _check_out(target, overwrite, [s.meta.root], "--overwrite")
    (work / "build").mkdir(parents=True, exist_ok=True)
    write_table(work / "units", [{"split": split, "first": first, "shard": shard.to_json()}
                                 for split, first, shard in units])  # fmt: skip
    write_table(work / "keys", [k.to_json() for k in keys])
    source = s.meta.to_json() | {"splits": {}, "n_tokens": 0, "n_docs": 0, "sources": []}  # (what every task needs)
    if s.meta.dedup:
        source["dedup"] = source["dedup"] | {"files": []}
    atomic_write_json(work / SOURCE_FILE, source)
    atomic_write_json(work / PLAN_FILE, head)  # last: the plan is complete


def _stamp(root: Path) -> list[int]:
    """What changes when the source's metadata is written again: its inode, size and time."""
    info = os.stat(root / METADATA_FILE)
    return [info.st_ino, info.st_size, info.st_mtime_ns]


def write_table(base: Path, rows: list[dict[str, Any]]) -> None:
    """Rows as JSON lines in `base`.jsonl, and their byte offsets (uint64, one more than the rows)
    in `base`.off, so a task reads only its own rows (`read_rows`)."""
    lines = [json.dumps(row, separators=(",", ":")).encode() + b"\n" for row in rows]
    offsets = np.zeros(len(lines) + 1, dtype="<u8")
    np.cumsum([len(line) for line in lines], out=offsets[1:])
    atomic_bytes(base.with_suffix(".jsonl"), b"".join(lines))
    atomic_bytes(base.with_suffix(".off"), offsets.tobytes())


def read_rows(base: Path, rows: range) -> list[Any]:
    """Rows `rows` of a table `write_table` wrote: two reads, of their offsets and their lines."""
    if not rows:
        return []
    offsets = np.fromfile(base.with_suffix(".off"), dtype="<u8", count=len(rows) + 1, offset=rows.start * 8)
    with open(base.with_suffix(".jsonl"), "rb") as f:
        f.seek(int(offsets[0]))
        data = f.read(int(offsets[-1] - offsets[0]))
    return [json.loads(line) for line in data.splitlines()]


def _same(head: dict[str, Any], found: dict[str, Any], work: Path) -> None:
    """Refuse, naming what changed, a plan that differs from the one in `work`."""
    again = f"run the first command again to finish it, or remove {work} to start over"
    for key, what in (("dataset", "the source dataset"), ("source", "the source's metadata (changed since)"),
                      ("vocabulary", "the new vocabulary's file"), ("n_tasks", "--num-tasks")):  # fmt: skip
        if found.get(key) != head[key]:
            raise ConfigError(f"{work}: a retokenize was planned there with another {what}; {again}")
    for key, value in head["options"].items():
        if found.get("options", {}).get(key) != value:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{work}: a retokenize was planned there with {flag} {found['options'].get(key)} "
                              f"(now {value}); {again}")  # fmt: skip


def load(out: str | os.PathLike[str], workers: int = 1) -> tuple[Path, dict[str, Any], Setup]:
    """The work folder, plan and Setup of the retokenize planned for `out`, held to the source
    and the vocabulary it was made with; the source's metadata without its shards (a task reads
    its own rows of the tables)."""
    work = work_dir(os.path.realpath(out))
    try:
        head = json.loads((work / PLAN_FILE).read_text())
    except FileNotFoundError:
        raise InputError(f"{out}: no retokenize is planned there (its work folder {work} has no "
                         f"{PLAN_FILE})") from None  # fmt: skip
    if head.get("version") != VERSION:
        raise InputError(f"{work}: planned by another lmshard version; remove it and plan again")
    if _stamp(Path(head["dataset"])) != head["source"]:
        raise ConfigError(f"{head['dataset']}: the source dataset changed since the retokenize was planned; "
                          f"remove {work} and plan again")  # fmt: skip
    options = {k: v for k, v in head["options"].items() if v is not None and k != "tokenizer"}
    meta = parse_metadata(Path(head["dataset"]), json.loads((work / SOURCE_FILE).read_text()))
    s = setup(head["dataset"], head["options"]["tokenizer"], os.path.realpath(out), workers=workers, meta=meta,
              **options)  # fmt: skip
    if s.new.vocab_sha256 != head["vocabulary"]:
        raise ConfigError(f"{head['options']['tokenizer']}: the vocabulary file changed since the retokenize was "
                          f"planned; restore it, or remove {work} and plan again")  # fmt: skip
    return work, head, s


def atomic_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
