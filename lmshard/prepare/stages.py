"""Scale-out stages over a persisted plan (see taskplan.py): `tokenize_task` runs one task's
units through the same workers as a local prepare and writes each unit's item results to the
work directory with a completion marker; `merge` replays every unit's results, in plan order,
through the same dedup / split / shard writer / metadata as a local prepare, so the dataset is
byte-identical to the one a single machine writes (the run record's timings aside).

Files per unit in `WORK/tokenize/`: `unit_NNNNNN.tokens` (uint32 of every document, back to
back), `.lengths` (int64), `.keys` (uint64), `.sources` (int32), and `.json` (per item: document
and token counts, per-source counts, drop examples, characters, bytes). Each is written under a
temporary name and renamed; `unit_NNNNNN.done` is written last, so a unit is complete exactly
when its marker exists, and a killed task is re-run by running it again (done units are skipped).

`dedup_task` resolves the duplicates of one hash bucket from the units' keys; the executors
(local_exec.py, slurm.py, ray_exec.py) and `lmshard run-task` run these functions.
--dedup-lines, --append and Hugging Face inputs are refused.

Memory model: a task holds one work item's result at a time (≈1 MiB of text and its tokens),
plus the plan; the merge holds one unit's per-item table and one item's arrays, plus what a
local prepare holds (the dedup key set).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..errors import ConfigError, InputError, LmshardError
from ..format import METADATA_FILE, atomic_write_json
from ..tokenizers import Tokenizer
from .build import Build, sigterm_stops
from .claim import _fingerprint
from .config import PrepareConfig
from .pipeline import _tokenizer, prepare
from .sources import Source, discover
from .stops import stop_point
from .taskplan import (
    PLAN_FILE,
    Unit,
    cut_units,
    ensure_plan,
    load_plan,
    make_plan,
    plan_difference,
    unit_items,
    unit_size_for,
    work_dir,
)
from .worker import ItemResult, WorkerConfig, identity_of, run_item

_ARRAYS = (("tokens", np.uint32), ("lengths", np.int64), ("keys", np.uint64), ("sources", np.int32))


def plan_run(
    config: PrepareConfig, n_tasks: int, unit_bytes: int | None = None
) -> tuple[dict[str, Any], list[Source], Tokenizer]:
    """The run's plan (created on the first call, validated on later ones), its sources and
    tokenizer. `unit_bytes`: the plan's unit size; None: --unit-size, else sized to the tasks."""
    if config.dedup_lines or config.hf or "-" in config.inputs or config.append:
        raise ConfigError("a scale-out run takes files only, without --dedup-lines or --append; run those on one "
                          "machine")  # fmt: skip
    sources = discover(config.inputs, config.format, config.exclude, include_hidden=config.include_hidden)
    tokenizer = _tokenizer(config)
    fingerprint = _fingerprint(config, sources, tokenizer, None)
    work = work_dir(config.out)
    if (work / PLAN_FILE).exists():  # a later task: validate the plan, without cutting the inputs again
        plan = load_plan(work)
        # no size asked: the plan's (sized from the inputs as they were; a changed input is the fingerprint's to name)
        unit_bytes = unit_bytes or config.unit_size or int(plan["unit_bytes"])
        why = plan_difference(plan, {"n_tasks": n_tasks, "unit_bytes": unit_bytes, "fingerprint": fingerprint})
        if why is not None:
            raise ConfigError(f"{work / PLAN_FILE} was made for another run: {why}; run with the plan's options, or "
                              f"delete {work} to plan again")  # fmt: skip
        return plan, sources, tokenizer
    unit_bytes = unit_bytes or unit_size_for(sources, n_tasks, config.unit_size)
    units = cut_units(sources, config.text_mode, config.max_chars, unit_bytes)
    wanted = make_plan(fingerprint, sources, units, n_tasks, unit_bytes) | {"prepare": asdict(config)}
    return ensure_plan(work, wanted), sources, tokenizer


def config_of(out: str | os.PathLike[str]) -> tuple[PrepareConfig, int, int]:
    """The configuration, task count and unit size a plan was made with, from the output path
    alone (what `lmshard run-task` and `lmshard status` are given)."""
    plan = load_plan(work_dir(out))
    stored = plan.get("prepare")
    if not isinstance(stored, dict):
        raise InputError(f"{work_dir(out)}: the plan records no prepare options; plan again with this lmshard")
    return PrepareConfig(**stored), int(plan["n_tasks"]), int(plan["unit_bytes"])


def status(out: str | os.PathLike[str]) -> dict[str, Any]:
    """Per task: units done of units; which tasks are incomplete; whether the dataset is merged."""
    work = work_dir(out)
    plan = load_plan(work)
    done = (
        {int(p.name[5:11]) for p in (work / "tokenize").glob("unit_*.done")} if (work / "tokenize").exists() else set()
    )
    tasks = [
        {"task": t, "units": b - a, "done": sum(u in done for u in range(a, b)), "state": _task_state(work, t)}
        for t, (a, b) in enumerate(plan["tasks"])
    ]
    dedup = [b for b in range(plan["n_tasks"]) if not (work / "dedup" / f"bucket_{b:06d}.done").exists()]
    return {"tasks": tasks, "incomplete": [t["task"] for t in tasks if t["done"] < t["units"]],
            "dedup_missing": dedup, "dedup": plan["prepare"].get("dedup") == "document",
            "merged": (Path(out) / METADATA_FILE).exists(), "units": len(plan["units"])}  # fmt: skip


def worker_config(config: PrepareConfig, sources: list[Source], tokenizer: Tokenizer) -> WorkerConfig:
    return WorkerConfig(sources=tuple(sources), clean=config.clean_config(), tokenizer=config.tokenizer,
                        tokenizer_backend=tokenizer.backend, separator=config.separator,
                        text_field=config.text_field, text_mode=config.text_mode, on_error=config.on_error,
                        expect=identity_of(tokenizer))  # fmt: skip


def _task_state(work: Path, task: int) -> str | None:
    """What a tokenize task's state file says: "failed: ERROR", "running on HOST (pid P)", "died
    on HOST (pid P gone)" when that pid no longer runs on this host, or None (never started, or
    finished)."""
    try:
        state = json.loads((work / "tasks" / f"tokenize_{task:06d}.json").read_text())
    except (OSError, ValueError):
        return None
    where = f"{state.get('host')} (pid {state.get('pid')}"
    if state.get("state") == "failed":
        return f"failed on {where}): {state.get('error')}"
    if state.get("state") == "stopped":  # scancel, a time limit, Ctrl-C: nothing wrong with the task itself
        return f"stopped on {where}) by {state.get('signal')}"
    if state.get("host") == socket.gethostname() and not _alive(int(state.get("pid", 0))):
        return f"died on {where} gone: killed?)"
    return f"running on {where})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


class TaskStopped(LmshardError):
    """A task stopped by a signal; `signum` gives its exit status (128 + signum)."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = signum

    def __reduce__(self) -> tuple[Any, ...]:  # crosses process boundaries with its signal
        return (TaskStopped, (str(self), self.signum))


def tokenize_task(config: PrepareConfig, n_tasks: int, task: int, unit_bytes: int | None = None) -> int:
    """Tokenize task `task`'s units (skipping those already done); returns how many it did.
    While it runs, `WORK/tasks/tokenize_NNNNNN.json` records its host, pid and start; a task
    that raises records the error there (what `status` shows), one that finishes removes it."""
    plan, sources, tokenizer = plan_run(config, n_tasks, unit_bytes)
    if not 0 <= task < plan["n_tasks"]:
        raise ConfigError(f"task {task} is not in [0, {plan['n_tasks']}); tasks are numbered from 0")
    wcfg = worker_config(config, sources, tokenizer)
    first, end = plan["tasks"][task]
    state = work_dir(config.out) / "tasks" / f"tokenize_{task:06d}.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(state, {"state": "running", "host": socket.gethostname(), "pid": os.getpid(),
                              "started": time.time()})  # fmt: skip
    done = 0
    try:
        with sigterm_stops():
            for u in range(first, end):
                done += tokenize_unit(config, plan, sources, tokenizer, wcfg, u)
    except KeyboardInterrupt as e:  # SIGTERM (scancel, a time limit) or Ctrl-C: recorded as stopped, not running
        name = signal.Signals(getattr(e, "signum", signal.SIGINT)).name
        atomic_write_json(state, {"state": "stopped", "host": socket.gethostname(), "pid": os.getpid(),
                                  "signal": name})  # fmt: skip
        finished = sum((work_dir(config.out) / "tokenize" / f"unit_{u:06d}.done").exists() for u in range(first, end))
        raise TaskStopped(f"task {task} stopped by {name} with {finished} of {end - first} units done; they are "
                          "kept: run the same command again to finish it",
                          getattr(e, "signum", signal.SIGINT)) from None  # fmt: skip
    except BaseException as e:
        atomic_write_json(state, {"state": "failed", "host": socket.gethostname(), "pid": os.getpid(),
                                  "error": f"{type(e).__name__}: {e}"[:500]})  # fmt: skip
        raise
    state.unlink(missing_ok=True)
    return done


def tokenize_unit(config: PrepareConfig, plan: dict[str, Any], sources: list[Source], tokenizer: Tokenizer,
                  wcfg: WorkerConfig, u: int) -> bool:  # fmt: skip
    """Tokenize unit `u` unless its marker exists; True when it ran."""
    out = work_dir(config.out) / "tokenize"
    if (out / f"unit_{u:06d}.done").exists():
        return False
    out.mkdir(parents=True, exist_ok=True)
    unit = load_unit(plan, u)
    items = unit_items(unit.source, sources[unit.source], unit, config.text_mode, config.text_field, config.max_chars)
    _write_unit(out, u, (run_item(item, wcfg, tokenizer) for item in items))
    stop_point("unit", u)
    return True


def load_unit(plan: dict[str, Any], u: int) -> Unit:
    return Unit(*plan["units"][u])


def _write_unit(out: Path, u: int, results: Iterator[ItemResult]) -> None:
    stem = f"unit_{u:06d}"
    files: dict[str, IO[bytes]] = {name: open(out / f".{stem}.{name}.tmp", "wb") for name, _ in _ARRAYS}  # noqa: SIM115
    table = []
    try:
        for r in results:
            arrays = {"tokens": r.tokens, "lengths": r.lengths, "keys": r.keys, "sources": r.doc_sources}
            for name, dtype in _ARRAYS:
                files[name].write(np.ascontiguousarray(arrays[name], dtype=np.dtype(dtype).newbyteorder("<")).tobytes())
            table.append({"docs": len(r.lengths), "tokens": int(r.lengths.sum()), "chars": r.chars,
                          "nbytes": r.nbytes, "seq": list(r.seq), "examples": r.examples,
                          "counts": {str(k): dict(v) for k, v in r.counts.items()}})  # fmt: skip
        for f in files.values():
            f.flush()
            os.fsync(f.fileno())
    finally:
        for f in files.values():
            f.close()
    for name, _ in _ARRAYS:
        os.replace(out / f".{stem}.{name}.tmp", out / f"{stem}.{name}")
    atomic_write_json(out / f"{stem}.json", table)
    atomic_write_json(out / f"{stem}.done", {"items": len(table)})


def missing_units(config: PrepareConfig) -> list[int]:
    """Units of the plan whose marker is absent."""
    work = work_dir(config.out)
    plan = load_plan(work)
    return [u for u in range(len(plan["units"])) if not (work / "tokenize" / f"unit_{u:06d}.done").exists()]


def merge(config: PrepareConfig, n_tasks: int, unit_bytes: int | None = None,
          ready: Callable[[int], None] | None = None, dedup_stage: bool = True,
          on_progress: Callable[[Any], None] | None = None, resume: bool | None = None) -> Any:  # fmt: skip
    """Write the dataset from every unit's results, in plan order (refused while any is missing).
    `ready(u)`: called before unit u is read, to wait until it is done (the local executor merges
    while the units are tokenized). `dedup_stage=False`: deduplicate here, in memory, as one
    machine does, whether or not the dedup stage ran. `resume`: go on with this run's interrupted
    build, or find the finished dataset complete (`run-task`, which has no --resume: the run
    fingerprint still refuses another run's build); None: as the config's --resume says."""
    plan, _, _ = plan_run(config, n_tasks, unit_bytes)
    missing = missing_units(config) if ready is None else []
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        tasks = sorted({t for u in missing for t, (a, b) in enumerate(plan["tasks"]) if a <= u < b})
        raise InputError(f"{len(missing)} of {len(plan['units'])} units are not tokenized yet (units {shown}); run "
                         f"the tokenize stage of task{'s' if len(tasks) > 1 else ''} "
                         f"{', '.join(map(str, tasks))} first")  # fmt: skip
    work = work_dir(config.out) / "tokenize"
    dups = _duplicates(work.parent, n_tasks) if config.dedup == "document" and dedup_stage else None

    def results(_config: Any, _sources: Any, _tokenizer: Any, build: Build, *_: Any) -> Iterator[ItemResult]:
        at, skip = 0, build.items_done  # a resumed merge: its checkpoint's items are in the build already
        for u in range(len(plan["units"])):
            if ready is not None:
                ready(u)
            for r in _read_unit(work, u):
                if dups is not None:
                    lo, hi = np.searchsorted(dups, [at, at + len(r.keys)])
                    r.duplicate = np.zeros(len(r.keys), dtype=bool)
                    r.duplicate[dups[lo:hi] - at] = True
                at += len(r.keys)
                if skip:
                    skip -= 1
                    continue
                yield r

    resume = config.resume if resume is None else resume
    return prepare(replace(config, workers=1, resume=resume), on_progress, results=results)


def _read_unit(work: Path, u: int) -> Iterator[ItemResult]:
    stem = f"unit_{u:06d}"
    table = json.loads((work / f"{stem}.json").read_text())
    maps = {name: np.memmap(work / f"{stem}.{name}", dtype=np.dtype(dt).newbyteorder("<"), mode="r")
            if os.path.getsize(work / f"{stem}.{name}") else np.zeros(0, dt) for name, dt in _ARRAYS}  # fmt: skip
    at_doc = at_tok = 0
    for row in table:
        d, t = row["docs"], row["tokens"]
        yield ItemResult(
            seq=tuple(row["seq"]),  # type: ignore[arg-type]
            tokens=np.array(maps["tokens"][at_tok : at_tok + t], dtype=np.uint32),
            lengths=np.array(maps["lengths"][at_doc : at_doc + d], dtype=np.int64),
            keys=np.array(maps["keys"][at_doc : at_doc + d], dtype=np.uint64),
            doc_sources=np.array(maps["sources"][at_doc : at_doc + d], dtype=np.int32),
            counts={int(k): Counter(v) for k, v in row["counts"].items()},
            examples=row["examples"],
            chars=row["chars"],
            nbytes=row["nbytes"],
        )
        at_doc, at_tok = at_doc + d, at_tok + t


def dedup_task(config: PrepareConfig, n_tasks: int, bucket: int, unit_bytes: int | None = None) -> bool:
    """Dedup stage, bucket `bucket` of n_tasks: of the documents whose key falls in the bucket
    (key mod n_tasks), every one whose key appeared earlier in plan order is a duplicate (the
    first copy survives, as on one machine). Writes their ordinals (the document's position
    among all units' documents), sorted, to `dedup/bucket_NNNNNN.u64`, then a marker. Memory:
    16 bytes per document of the bucket. Returns False when already done."""
    plan, _, _ = plan_run(config, n_tasks, unit_bytes)
    if config.dedup != "document":
        return False  # nothing to decide: the merge keeps every document
    if not 0 <= bucket < n_tasks:
        raise ConfigError(f"task {bucket} is not in [0, {n_tasks}); tasks are numbered from 0")
    work = work_dir(config.out)
    out = work / "dedup"
    marker = out / f"bucket_{bucket:06d}.done"
    if marker.exists():
        return False
    missing = missing_units(config)
    if missing:
        raise InputError(f"the dedup stage needs every unit tokenized; {len(missing)} are not (first: unit "
                         f"{missing[0]}); run the tokenize stage first")  # fmt: skip
    keys, ordinals, base = [], [], 0
    for u in range(len(plan["units"])):
        path = work / "tokenize" / f"unit_{u:06d}.keys"
        k = np.fromfile(path, dtype="<u8")
        mine = np.flatnonzero(k % np.uint64(n_tasks) == np.uint64(bucket))
        keys.append(k[mine])
        ordinals.append(mine.astype(np.int64) + base)
        base += len(k)
    k, o = np.concatenate(keys), np.concatenate(ordinals)  # in plan order
    _, first = np.unique(k, return_index=True)  # the first index of each key: its surviving copy
    dup = np.ones(len(k), dtype=bool)
    dup[first] = False
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".bucket_{bucket:06d}.u64.tmp"
    with open(tmp, "wb") as f:
        f.write(np.sort(o[dup]).astype("<u8").tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out / f"bucket_{bucket:06d}.u64")
    atomic_write_json(marker, {"duplicates": int(dup.sum())})
    return True


def _duplicates(work: Path, n_tasks: int) -> np.ndarray | None:
    """Every bucket's duplicate ordinals, sorted; None when the dedup stage has not run at all
    (the merge then dedups in memory, as one machine does). A partial stage is refused."""
    done = [(work / "dedup" / f"bucket_{b:06d}.done").exists() for b in range(n_tasks)]
    if not any(done):
        return None
    if not all(done):
        missing = [b for b, d in enumerate(done) if not d]
        raise InputError(f"the dedup stage is not complete (buckets {', '.join(map(str, missing[:5]))} missing); "
                         "run its tasks first")  # fmt: skip
    parts = [np.fromfile(work / "dedup" / f"bucket_{b:06d}.u64", dtype="<u8") for b in range(n_tasks)]
    return np.sort(np.concatenate(parts)).astype(np.int64)
