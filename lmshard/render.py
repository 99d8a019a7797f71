"""What the command line prints: rich tables for a prepare run's summary and an inspect report.
`cli.py` owns the commands and exit codes; this module only renders values it is given.

Memory model: the report's small summaries (histogram buckets, top tokens, sample texts).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .inspect import audit

out = Console()
err = Console(stderr=True)
_SAMPLE_CHARS = 1500  # characters of each sampled document shown in the terminal


def plural(n: int, word: str) -> str:
    """ "1 shard", "2 shards" (counts with thousands separators)."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def summary(meta: Any, where: str) -> None:
    """The table `prepare` prints at the end, and a line per drop reason naming its files."""
    table = Table(title=f"lmshard dataset → {where}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    tok = meta.tokenizer
    bos = f", BOS {tok.bos_id}" if tok.bos_id is not None else ""
    table.add_row("tokenizer", f"{tok.name} (n_vocab {tok.n_vocab:,}, EOT {tok.eot_id}{bos}; {tok.backend})")
    table.add_row("records read", f"{meta.records_read:,}")
    for split, s in meta.splits.items():
        table.add_row(
            split, f"{plural(s.n_docs, 'doc')}  {plural(s.n_tokens, 'token')}  {plural(len(s.shards), 'shard')}"
        )
    drops = {k: v for k, v in meta.drops.items() if v}
    table.add_row("dropped", ", ".join(f"{k} {v:,}" for k, v in drops.items()) or "none")
    if meta.skipped_inputs:
        table.add_row("skipped", ", ".join(skipped_parts(meta.skipped_inputs)))
    run = meta.run
    table.add_row(
        "time", f"{run.elapsed_s:.1f} s, {run.tokens_per_s or 0:,.0f} tokens/s, {plural(run.workers, 'worker')}"
    )
    out.print(table)
    for reason, n in drops.items():
        files = _by_file(meta.sources, functools.partial(lambda src, r: int(src.dropped.get(r, 0)), r=reason))
        out.print(f"  {reason} {n:,}: {escape(files)}", highlight=False, soft_wrap=True)
    split = sum(src.split_into_paragraphs for src in meta.sources)
    if split:
        files = escape(_by_file(meta.sources, lambda src: src.split_into_paragraphs, counts=False))
        line = f"  split into paragraphs (over --max-chars bytes) {split:,}: {files}"
        out.print(line, highlight=False, soft_wrap=True)
    for reason, example in meta.drop_examples.items():
        out.print(f"  first {reason}: {escape(example)}", highlight=False, soft_wrap=True)


def skipped_parts(skipped: Any, top: int = 3) -> list[str]:
    """What the input walk left out: ["17,867 .1.gz", "3 .png (unknown type)", "2 hidden dirs"]."""
    ranked = list(skipped.unknown_type.items())  # most first, as recorded
    parts = [f"{n:,} {suffix}" for suffix, n in ranked[:top]]
    if rest := sum(n for _, n in ranked[top:]):
        parts.append(f"{rest:,} other")
    if parts:
        parts[-1] += " (unknown type)"
    for n, one, many in ((skipped.hidden_dirs, "hidden dir", "hidden dirs"),
                         (skipped.hidden_files, "hidden file", "hidden files"),
                         (skipped.lmshard, "lmshard output", "lmshard outputs"),
                         (skipped.excluded, "by --exclude", "by --exclude"),
                         (skipped.unreadable_dirs, "unreadable dir", "unreadable dirs")):  # fmt: skip
        if n:
            parts.append(f"{n:,} {one if n == 1 else many}")
    return parts


def _by_file(sources: Any, count: Callable[[Any], int], top: int = 3, counts: bool = True) -> str:
    """The files with the highest `count`, most first: "data/big.txt (2), data/x.txt (1)"."""
    ranked = sorted((-count(src), src.path) for src in sources if count(src))
    shown = ", ".join(f"{path} ({-n:,})" if counts else path for n, path in ranked[:top])
    more = len(ranked) - top
    return shown + (f" and {more:,} more file{'s' * (more > 1)}" if more > 0 else "")


def report(report: Any, top_tokens: list[tuple[int, int, str]], samples: list[tuple[str, int, str]]) -> None:
    """What `inspect` prints: the dataset table, length histogram, top tokens, samples, verdict."""
    meta = report.meta
    if meta is not None:
        table = Table(title=f"lmshard dataset {report.root}", show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column()
        tok = meta.tokenizer
        side = f"({meta.eot_position} each doc)"
        bos = f"  BOS {tok.bos_id} (before each doc)" if tok.bos_id is not None else ""
        table.add_row("tokenizer", f"{tok.name}  n_vocab {tok.n_vocab:,}  EOT {tok.eot_id} {side}{bos}")
        table.add_row("dtype", "uint32, little-endian")
        for split in meta.splits:
            table.add_row(
                split,
                f"{plural(meta.n_docs(split), 'doc')}  {plural(meta.n_tokens(split), 'token')}  "
                f"{plural(len(meta.split_shards(split)), 'shard')}",
            )
        stats = report.length_stats()
        if stats:
            table.add_row("doc length", "  ".join(f"{k} {v:,.6g}" for k, v in stats.items()) + " tokens")
        table.add_row("prepare drops", ", ".join(f"{k} {v:,}" for k, v in meta.drops.items() if v) or "none")
        table.add_row("records read", f"{meta.records_read:,}")
        out.print(table)
        hist = audit.length_histogram(report)
        if hist:
            out.print("[bold]document lengths[/] (tokens, log2 buckets)")
            width = max(c for _, c in hist)
            for label, count in hist:
                out.print(
                    f"  {label:>15} {'█' * max(1, round(40 * count / width)) if count else '':<40} {count:,}",
                    highlight=False,
                )
        if top_tokens:
            out.print(
                "[bold]most frequent tokens[/]: " + "  ".join(f"{t!r}×{c:,}" for _, c, t in top_tokens), highlight=False
            )
    for where, n, text in samples:
        out.rule(f"{where} ({n} tokens)")
        shown = (
            text
            if len(text) <= _SAMPLE_CHARS
            else text[:_SAMPLE_CHARS]
            + f"\n… ({len(text) - _SAMPLE_CHARS:,} more characters; --json has the whole text)"
        )
        out.print(shown, highlight=False, markup=False)
    if report.ok:
        what = "structure" if report.quick else "checksums, token ids, structure"
        out.print(f"[green]OK[/]: {report.shards_checked} shards verified ({what})")
    else:
        for problem in report.problems:
            err.print(f"[bold red]problem:[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
        err.print(f"[bold red]CORRUPT[/]: {len(report.problems)} problem(s)")


def packing(rows: list[dict[str, Any]], title: str) -> None:
    """`inspect --packing`: one row per strategy (documents split / truncated / dropped)."""
    table = Table(
        title=f"packing {escape(title)}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        caption="bound: ⌈tokens / seq_len⌉ packs; cut: documents split/truncated/dropped",
    )
    for name in ("strategy", "packs", "bound", "gap", "fill", "docs/pack", "cut", "steps"):
        table.add_column(name, justify="left" if name == "strategy" else "right", no_wrap=True)
    for r in rows:
        cut = f"{r['split_documents']:,}/{r['truncated_documents']:,}/{r['dropped_documents']:,}"
        gap, fill = f"{r['gap_to_lower_bound']:.2%}", f"{r['fill']:.2%}"
        table.add_row(r["strategy"], f"{r['packs']:,}", f"{r['lower_bound']:,}", gap, fill,
                      f"{r['items_per_pack_mean']:.1f}", cut, f"{r['steps_per_rank']:,}")  # fmt: skip
    out.print(table)
