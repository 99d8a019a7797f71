"""What `lmshard prepare` prints while it runs and when it ends: progress lines every
--log-interval seconds of its clock (or a progress bar on a terminal), the closing line and the
JSON summary.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from . import render
from .render import plural

T = TypeVar("T")


class RunLog:
    """What a prepare run prints (see the module doc); `follow` runs the job with its progress."""

    def __init__(self, cfg: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        self.cfg = cfg
        self.plain = not sys.stderr.isatty()
        self.clock = clock  # seconds; a test drives its own
        self.started = clock()
        self.found_complete = False  # --resume found the dataset complete: nothing was done
        self.before: tuple[int, int, int] | None = None  # --append: the dataset's documents, tokens, shards before

    def _line(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def start(self) -> None:
        c = self.cfg
        if c.append:  # what the dataset held before, so the summary can say what this run added
            self.before = dataset_counts(c.out)
        if self.cfg.quiet or not self.plain:
            return
        from ..remote.urls import redact  # a URL's password or signature is never printed

        inputs = [redact(i) for i in c.inputs[:3]] + ([f"(+{len(c.inputs) - 3} more)"] if len(c.inputs) > 3 else [])
        source = " ".join(inputs) or f"hf:{c.hf}"
        tasks = f", {c.num_tasks} tasks ({c.executor})" if c.num_tasks else ""
        tasks += f", dedup {c.dedup}" + (" + lines" if c.dedup_lines else "") + \
            (f" + near {c.minhash}" if c.near_dedup else "")  # fmt: skip
        if c.filters:  # (a plugin by its file's name: the path is in the metadata)
            tasks += f", filter {' '.join(f.rpartition('/')[2] for f in c.filters)}"
        self._line(f"lmshard prepare: {source} -> {c.out}; tokenizer {c.tokenizer}, {plural(c.n_workers(), 'worker')}"
                   f"{tasks}, " + (f"val-by {c.val_by} ({c.val_tokens:,} tokens each)" if c.val_by else
                                   f"val-fraction {c.val_fraction}") + ", tokens-per-shard "
                   f"{c.tokens_per_shard:,}" + (f", shard encoding {c.shard_encoding}" if c.shard_encoding else ""))

    def follow(self, job: Callable[[Callable[[Any], None]], T]) -> T:
        def noted(show: Callable[[Any], None]) -> Callable[[Any], None]:
            def update(p: Any) -> None:
                self.found_complete |= bool(getattr(p, "complete", False))
                show(p)

            return update

        if self.cfg.quiet:
            return job(noted(lambda p: None))
        if self.plain:
            return job(noted(self._plain_progress()))
        return _progress_bar(lambda callback: job(noted(callback)))

    def _plain_progress(self) -> Callable[[Any], None]:
        last = [self.started]

        def update(p: Any) -> None:
            now = self.clock()
            if p.note:  # what a resumed run kept: said at once, before any progress
                self._line(p.note)
                return
            if now - last[0] < self.cfg.log_interval:
                return
            last[0] = now
            self._line(progress_line(p, now - self.started))

        return update

    def done(self, meta: Any) -> None:
        added = added_by(meta, self.before) if self.before is not None and not self.found_complete else None
        if self.cfg.json:
            data = summary_json(meta, self.cfg.out)
            data |= {"already_complete": True} if self.found_complete else {}
            data |= {"appended": added} if added is not None else {}
            print(json.dumps(data), flush=True)
            return
        if self.cfg.quiet:
            return
        if self.found_complete:
            render.out.print(f"{self.cfg.out}: already complete, nothing was done: {plural(meta.total_docs, 'doc')}, "
                             f"{meta.total_tokens:,} tokens in {plural(len(meta.shards), 'shard')} (its run started "
                             f"{meta.run.started_at}); check it with: lmshard inspect {self.cfg.out}", markup=False,
                             soft_wrap=True)  # fmt: skip
            return
        if added is not None:
            appended_line(added)
        render.summary(meta, self.cfg.out)
        if self.plain and not self.cfg.quiet and not _same_file(sys.stdout, sys.stderr):
            self._line(done_line(meta, self.cfg.out))


def dataset_counts(out: str) -> tuple[int, int, int] | None:
    """The documents, tokens and shards of the dataset in `out` (None: none there, or at a URL),
    for the line that says what an --append added."""
    from ..format import load_metadata
    from ..remote.urls import output_url

    try:
        meta = None if output_url(out) else load_metadata(out)
    except Exception:  # no dataset yet, or not one: prepare says so
        return None
    return (meta.total_docs, meta.total_tokens, len(meta.shards)) if meta is not None else None


def added_by(meta: Any, before: tuple[int, int, int]) -> dict[str, int]:
    return {"docs": meta.total_docs - before[0], "tokens": meta.total_tokens - before[1],
            "shards": len(meta.shards) - before[2]}  # fmt: skip


def appended_line(added: dict[str, int]) -> None:
    """What an --append added (`added_by`), before the summary of the whole dataset."""
    render.out.print(f"appended: this run added {plural(added['docs'], 'doc')}, {added['tokens']:,} tokens, "
                     f"{plural(added['shards'], 'shard')}; the totals below are the whole dataset's", markup=False,
                     soft_wrap=True)  # fmt: skip


def progress_line(p: Any, elapsed: float) -> str:
    """One plain progress line: input read (of the total where known), documents, tokens,
    tokens/s and the time left."""
    elapsed = max(elapsed, 1e-9)
    rate = (p.tokens - p.tokens_at_start) / elapsed  # this process's work: a resumed run's earlier work took no time
    read = f"{p.bytes_done / 1e6:,.1f} MB"
    eta = ""
    if p.bytes_total:
        frac = min(p.bytes_done / p.bytes_total, 1.0)
        read += f" of {p.bytes_total / 1e6:,.1f} MB ({100 * frac:.1f}%)"
        speed = (p.bytes_done - p.bytes_at_start) / elapsed  # input bytes per second
        if speed > 0:
            eta = f", ETA {_clock(max(p.bytes_total - p.bytes_done, 0) / speed)}"
    return (f"prepare: {read} read, {plural(p.docs, 'doc')}, {p.tokens:,} tokens, {rate / 1e6:.2f} M tokens/s, "
            f"{_clock(elapsed)} elapsed{eta}")  # fmt: skip


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def summary_json(meta: Any, where: str) -> dict[str, Any]:
    """The summary as plain data: the same counts as the metadata."""
    tok = meta.tokenizer
    splits = {
        name: {"docs": s.n_docs, "tokens": s.n_tokens, "shards": len(s.shards)} for name, s in meta.splits.items()
    }
    run = meta.run
    return {"out": where, "records_read": meta.records_read, "n_docs": sum(s["docs"] for s in splits.values()),
            "n_tokens": sum(s["tokens"] for s in splits.values()), "splits": splits,
            "drops": {k: v for k, v in meta.drops.items() if v}, "lines_removed": _lines_removed(meta),
            "skipped_inputs": meta.skipped_inputs.to_json(),
            "tokenizer": {"name": tok.name, "n_vocab": tok.n_vocab, "eot_id": tok.eot_id, "bos_id": tok.bos_id,
                          "backend": tok.backend},
            "encoding": meta.encoding.name, "bytes_on_disk": render.bytes_on_disk(meta),
            "elapsed_s": run.elapsed_s, "tokens_per_s": run.tokens_per_s, "workers": run.workers}  # fmt: skip


def _lines_removed(meta: Any) -> dict[str, Any]:
    """Lines taken out of kept documents: by --dedup-lines (`dedup_lines`: each line met before)
    and by each --filter reason (`filters`); {} when none was."""
    found: dict[str, Any] = {}
    if meta.dedup is not None and meta.dedup.lines_removed:
        found["dedup_lines"] = meta.dedup.lines_removed
    if meta.line_drops:
        found["filters"] = {reason: entry["lines"] for reason, entry in meta.line_drops.items()}
    return found


def done_line(meta: Any, where: str) -> str:
    data = summary_json(meta, where)
    splits = "; ".join(f"{name} {plural(s['docs'], 'doc')}, {s['tokens']:,} tokens, {plural(s['shards'], 'shard')}"
                       for name, s in data["splits"].items())  # fmt: skip
    drops = ", ".join(f"{k} {v:,}" for k, v in data["drops"].items()) or "none"
    if lines := render.lines_removed(meta):
        drops += f"; lines removed {', '.join(lines)}"
    if meta.skipped_inputs:
        drops += f"; skipped {', '.join(render.skipped_parts(meta.skipped_inputs))}"
    rate = data["tokens_per_s"]  # (this attempt's: a resume whose tokens were all made before has none)
    speed = f"{rate:,.0f} tokens/s" if rate else "no rate: its tasks ran apart" if rate is None else \
        "no tokens made by this run (all were before it)"  # fmt: skip
    return f"done: {where}: {splits}; dropped {drops}; {data['elapsed_s']:.1f} s, {speed}"


def _same_file(a: Any, b: Any) -> bool:
    """Whether two streams write to the same file (2>&1, one Slurm log): then the summary table
    on stdout is already in the log."""
    try:
        return os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (OSError, ValueError, AttributeError):
        return False


def _progress_bar(job: Callable[[Callable[[Any], None]], T]) -> T:
    columns = (
        TextColumn("[bold]prepare"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TextColumn("{task.fields[docs]:>10,} docs  {task.fields[mb]:>8.1f} MB in"),
        TextColumn("{task.fields[tps]:>6.2f} M tok/s"),
        TimeRemainingColumn(),
    )
    start = time.perf_counter()
    shown = [start]
    # No refresh thread (rich's auto_refresh): prepare forks its workers, which is only safe
    # while this process runs one thread. The bar is redrawn from the progress callback instead.
    with Progress(*columns, console=render.err, transient=False, auto_refresh=False) as bar:
        task = bar.add_task("prepare", total=None, docs=0, mb=0.0, tps=0.0)

        def update(p: Any) -> None:
            if p.note:  # what a resumed run kept, above the bar; the bar starts from there with no speed samples
                bar.console.print(p.note, markup=False, highlight=False)
                bar.reset(task, total=p.bytes_total or None, completed=p.bytes_done, docs=p.docs,
                          mb=p.bytes_done / 1e6, tps=0.0)  # fmt: skip
                return
            now = time.perf_counter()
            rate = (p.tokens - p.tokens_at_start) / max(now - start, 1e-9) / 1e6
            total = p.bytes_total or None
            bar.update(task, total=total, completed=min(p.bytes_done, total or p.bytes_done),
                       docs=p.docs, mb=p.bytes_done / 1e6, tps=rate)  # fmt: skip
            if now - shown[0] >= 0.1:
                shown[0] = now
                bar.refresh()

        meta = job(update)
        bar.update(task, total=1, completed=1)
    return meta
