"""How a process gets a planned run's plan, inputs and tokenizer (`plan_run`: the plan made on
the first call, validated on later ones), and what a plan can take (`check_scale_out`): files,
stdin and pipes (saved to the work folder first, `spool_streams`), a saved or downloaded
Hugging Face split (cut into rows) or a stream (cut into its data files), and the dataset an
--append extends
(`previous_of`).

A task (a plan exists, nothing loaded) reads the plan's head and nothing that grows with the
plan: its inputs are the plan's rows, each checked when the task first reads it
(plantables.py).

Memory model: the plan's head and a few rows of its tables; the planner, every input's
Source and unit (about 300 bytes per unit); a stream is copied in 8 MiB blocks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ...errors import ConfigError, LmshardError, warn
from ...format import atomic_file, load_metadata
from ...tokenizers import Tokenizer
from ..config import PrepareConfig
from ..documents.files import open_raw
from ..documents.hfread import forget, mapped, mapped_mark, stream_mark
from ..documents.records import record_fields
from ..documents.sources import Source, Sources, discover
from ..documents.worker import WorkerConfig
from ..domains import check_sources
from ..output.claim import _fingerprint, run_tokenizer
from . import volatile
from .plantables import PlanSources
from .taskplan import PLAN_FILE, ensure_plan, load_plan, make_plan, plan_difference, start_again, work_dir
from .units import cut_units, unit_size_for


def plan_run(config: PrepareConfig, n_tasks: int, unit_bytes: int | None = None, loaded: Any = None,
             adopt: bool = False, tokenizer: Tokenizer | None = None,
             ) -> tuple[dict[str, Any], Any, Tokenizer]:  # fmt: skip
    """The run's plan (created on the first call, validated on later ones), its sources and
    tokenizer. `unit_bytes`: the plan's unit size; None: --unit-size, else sized to the tasks.
    `loaded`: the sources and tokenizer, when the caller has them. `adopt`: an existing plan's
    task count and unit size are taken (a plain prepare, whose tasks are only a unit size).
    `tokenizer`: a task's, loaded already (a worker forked before the plan was made).

    A task (a plan exists, nothing loaded) reads the plan's head and nothing that grows with
    the plan: its sources are the plan's, each checked when the task first reads it
    (plantables.py), so no task walks the inputs or stats those of other tasks."""
    check_scale_out(config)
    work = work_dir(config.out)
    task = loaded is None and (work / PLAN_FILE).exists()
    if task:
        tokenizer = tokenizer or run_tokenizer(config)
        fingerprint = {k: v for k, v in _fingerprint(config, [], tokenizer, None).items() if k != "sources"}
    else:
        sources, tokenizer = loaded or load_run(config)
        fingerprint = _fingerprint(config, sources, tokenizer, None)
    if (work / PLAN_FILE).exists():  # a later task: validate the plan, without cutting the inputs again
        plan = load_plan(work)
        if task:
            sources = PlanSources(plan["sources"])
        elif any(s.stream or s.fmt == "hf" for s in sources):  # stdin or a pipe: read from where the planner
            planned = PlanSources(plan["sources"])  # saved it; a Hugging Face stream: with the data files planned
            sources = [planned[i] if s.stream or s.fmt == "hf" else s for i, s in enumerate(sources)]
        if adopt:
            n_tasks, unit_bytes = int(plan["n_tasks"]), int(plan["unit_bytes"])
        # no size asked: the plan's (sized from the inputs as they were; a changed input is the fingerprint's to name)
        unit_bytes = unit_bytes or config.unit_size or int(plan["unit_bytes"])
        why = plan_difference(plan, {"n_tasks": n_tasks, "unit_bytes": unit_bytes, "fingerprint": fingerprint})
        if why is not None:
            raise ConfigError(f"{work / PLAN_FILE} was made for another run: {why}; run with the plan's options, or "
                              f"{start_again(work)}")  # fmt: skip
        return plan, sources, tokenizer
    sources = spool_streams(work, sources)
    unit_bytes = unit_bytes or unit_size_for(sources, n_tasks, config.unit_size)
    hf = config.hf_spec() if config.hf else None
    if hf is not None:  # the data files a stream's tasks must find, or the downloaded copy (hfread.py's marks)
        mark = mapped_mark(hf) if mapped(hf) else stream_mark(hf)
        sources = [replace(s, version=mark) if s.fmt == "hf" else s for s in sources]
    units = cut_units(sources, config.text_mode, config.max_chars, unit_bytes, hf, n_tasks)
    wanted = make_plan(fingerprint, sources, units, n_tasks, unit_bytes, hf, config.n_workers())
    wanted["prepare"] = asdict(config)
    wanted["cwd"] = os.getcwd()  # what relative inputs and --out mean (a task run by hand elsewhere moves there)
    if config.append:
        wanted["previous"] = previous_of(config.out)
    return ensure_plan(work, wanted), sources, tokenizer


def spool_streams(work: Path, sources: Sequence[Source]) -> list[Source]:
    """Stdin and pipes saved, in full, to files of the work folder (`spool/input_I`), so that the
    plan cuts them into units like files and any task on any machine reads its own; each keeps
    its name ('-') for every message, record and total. The planner reads each stream once, in
    8 MiB blocks. A local run leaves the copy unsynced, as its other work files (an fsync of
    44 MB cost 0.1 s, a tenth of the run)."""
    out = []
    for i, src in enumerate(sources):
        if not src.stream:
            out.append(src)
            continue
        path = work / "spool" / f"input_{i:06d}"
        path.parent.mkdir(parents=True, exist_ok=True)  # (the work folder too: planned before it is made)
        raw = open_raw(src)
        try:  # (synced by volatile.sync: not in a local run, whose boot is recorded first, volatile.py)
            with atomic_file(path, volatile.sync) as f:
                while block := raw.read(8 << 20):
                    f.write(block)
        finally:
            raw.close()
        st = path.stat()
        out.append(replace(src, stream=False, size=st.st_size, inode=st.st_ino, spool=str(path)))
    return out


def check_scale_out(config: PrepareConfig) -> None:
    """Refuse, before anything is claimed, what a planned run cannot do: --hf-tasks (part I of N,
    a dataset of its own) with --num-tasks (one dataset of the whole, planned in N tasks)."""
    if config.hf and config.hf_tasks > 1 and config.num_tasks is not None:
        raise ConfigError(f"--hf {config.hf}: --hf-tasks makes part I of N a dataset of its own, and --num-tasks "
                          "plans one dataset of the whole (a stream by its shards, a saved or downloaded split by "
                          "its rows): pass one or the other")  # fmt: skip


def previous_of(out: str) -> dict[str, Any]:
    """What a plan records of the dataset an --append extends: per stream, the number its next
    file takes, its document key files and its signature files (paths in the dataset, with their
    rows), which the dedup stage reads."""
    meta = load_metadata(out)
    files = meta.dedup.files if meta.dedup else ()
    return {"first": {"train": len(meta.split_shards("train")), "val": len(meta.split_shards("val")),
                      "keys": sum(f.kind == "doc" for f in files), "near": sum(f.kind == "near" for f in files),
                      "lines": sum(f.kind == "line" for f in files)},
            "key_files": [f.path for f in files if f.kind == "doc"],
            "line_files": [f.path for f in files if f.kind == "line"],
            "near_files": [[f.path, f.n_keys] for f in files if f.kind == "near"]}  # fmt: skip


def load_run(config: PrepareConfig) -> tuple[Any, Tokenizer]:
    """The run's inputs (as prepare discovers them, a Hugging Face dataset last) and tokenizer,
    the one walk of the inputs of every run, in one process or planned: its hint about skipped
    files that look like text is said here. A Hugging Face dataset this process opened for an
    earlier run is opened again (a data file may have changed since: hfread.forget). A --resume
    of a run that saved a stream takes it from its plan (`saved_streams`), never opened again."""
    forget()
    rows = saved_streams(config)
    if rows is not None:
        sources = finish_sources(config, rows)
    else:
        sources = discover(config.inputs, config.format, config.exclude, include_hidden=config.include_hidden,
                           own=config.out)  # fmt: skip
        if config.hf:
            sources.append(Source(f"hf:{config.hf}", "hf", None, 0))
    if sources.hint:
        warn(sources.hint)
    check_sources(config, sources)  # (--val-by FIELD: inputs with fields)
    return sources, run_tokenizer(config)


def saved_streams(config: PrepareConfig) -> list[list[Any]] | None:
    """With --resume, the plan's rows of every input where the plan saved a stream (stdin, a
    pipe: `spool_streams`): a process substitution's `/dev/fd/N` is not there in the shell that
    resumes, nor a FIFO's writer. None without such a plan (its refusals are the claim's)."""
    if not config.resume or not (work_dir(config.out) / PLAN_FILE).exists():
        return None
    try:
        rows = list(PlanSources(load_plan(work_dir(config.out))["sources"]).table)
    except (LmshardError, OSError, ValueError, KeyError, TypeError):
        return None
    return rows if any(row[9] for row in rows) else None


def finish_sources(config: PrepareConfig, rows: list[list[Any]]) -> Sources:
    """The inputs as `prepare` finds them, for the metadata (the finish, once), but a stream the
    planner saved (stdin, a pipe) taken from the plan's rows (`rows`: every input's), never
    looked for again: a pipe (`<(...)`, a FIFO) is gone by then, or on another machine."""
    streams = {i: Source(row[0], row[1], row[2], 0, stream=True) for i, row in enumerate(rows) if row[9]}
    shown = {src.path for src in streams.values()}
    files = [spec for spec in config.inputs if spec not in shown and str(Path(spec)) not in shown]
    found = discover(files, config.format, config.exclude, include_hidden=config.include_hidden,
                     own=config.out) if files else Sources()  # fmt: skip
    for i in sorted(streams):
        found.insert(i, streams[i])
    if config.hf:
        found.append(Source(f"hf:{config.hf}", "hf", None, 0))
    return found


def worker_config(config: PrepareConfig, sources: Sequence[Source], tokenizer: Tokenizer) -> WorkerConfig:
    kept = sources if isinstance(sources, PlanSources) else tuple(sources)  # (a task's: read as it uses them)
    fields = record_fields(config.text_field, config.val_by)  # (and --val-by FIELD's domain: records.py)
    return WorkerConfig(sources=kept, clean=config.clean_config(), tokenizer=config.tokenizer,
                        tokenizer_backend=tokenizer.backend, separator=config.separator,
                        text_field=fields, text_mode=config.text_mode, on_error=config.on_error,
                        decode_errors=config.decode_errors,
                        minhash=config.minhash_config() if config.near_dedup else None,
                        hf=replace(config.hf_spec(), text_field=fields) if config.hf else None,
                        attributes=tuple(config.attributes))  # fmt: skip


__all__ = ["check_scale_out", "finish_sources", "load_run", "plan_run", "previous_of", "spool_streams",
           "worker_config"]
