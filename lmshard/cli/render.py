"""What the command line prints: rich tables for a prepare run's summary and an inspect report.
`commands.py` owns the commands and exit codes; this module only renders values it is given.

Memory model: the report's small summaries (histogram buckets, top tokens, sample texts).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

# No emoji codes: a path or a --tokenizer value such as "foo:x:y" is printed as written.
out = Console(emoji=False)
err = Console(stderr=True, emoji=False)
_SAMPLE_CHARS = 1500  # characters of each sampled document shown in the terminal
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?!\n)")  # control characters but tab and line ends


def plural(n: int, word: str) -> str:
    """ "1 shard", "2 shards" (counts with thousands separators)."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


class Items:
    """Values joined by `sep` and broken onto a new line between values only, never inside one:
    rich alone breaks at any space, which at 80 columns put "max" and its number on two lines.
    Works as a table cell (it wraps to the column's width) or on its own line."""

    def __init__(self, items: Sequence[str | Text], sep: str = "  ") -> None:
        self.items = [Text(i) if isinstance(i, str) else i for i in items]
        self.sep = sep

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widths = [item.cell_len for item in self.items] or [0]
        return Measurement(max(widths), sum(widths) + len(self.sep) * (len(widths) - 1))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        text, used = Text(), 0  # used: cells on the current line
        for item in self.items:
            if used and used + len(self.sep) + item.cell_len <= options.max_width:
                text.append(self.sep)
                used += len(self.sep)
            elif used:
                text.append("\n")
                used = 0
            text.append(item)
            used += item.cell_len
        yield text


def listed(parts: Sequence[str]) -> Items:
    """parts as "a 1, b 2, c 3", broken only after a comma."""
    return Items([f"{p}," for p in parts[:-1]] + list(parts[-1:]), sep=" ")


def bytes_on_disk(meta: Any) -> int:
    """The bytes of the dataset's shards: token files, indexes, checksums, block offsets."""
    from ..format import shard_file_sizes

    return sum(size for s in meta.shards for _, _, _, size in shard_file_sizes(s))


def _bytes(n: int) -> str:
    """1.2 GB, 340.5 MB, 12.0 KB, 512 bytes (powers of 1000, as `du --si` and object stores count)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return plural(n, "byte")


def _number(v: float) -> str:
    """3,606,220 (never 3.60622e+06), 12.5, 0.333."""
    if float(v).is_integer() or abs(v) >= 100:
        return f"{round(v):,}"
    return f"{v:.3g}"


def summary(meta: Any, where: str) -> None:
    """The table `prepare` prints at the end, and a line per drop reason naming its files."""
    table = Table(title=f"lmshard dataset → {escape(str(where))}", show_header=False, title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column(justify="right")
    tok = meta.tokenizer
    ids = [f"n_vocab {tok.n_vocab:,}", f"EOT {tok.eot_id}"] + ([f"BOS {tok.bos_id}"] if tok.bos_id is not None else [])
    ids = [f"{i}," for i in ids[:-1]] + [f"{ids[-1]};"]  # "gpt2 (n_vocab 50,257, EOT 50256; tiktoken)"
    # A long vocabulary path shows as its file's name, so the ids and the backend stay in view (the metadata has it).
    name = tok.name if len(tok.name) <= 40 or "/" not in tok.name else ".../" + tok.name.rstrip("/").rsplit("/", 1)[-1]
    table.add_row("tokenizer", Items([name, f"({ids[0]}", *ids[1:], f"{tok.backend})"], sep=" "))
    table.add_row("records read", f"{meta.records_read:,}")
    for split, s in meta.splits.items():
        counts = plural(s.n_docs, "doc"), plural(s.n_tokens, "token"), plural(len(s.shards), "shard")
        table.add_row(split, Items(counts))
    from ..inspect.verify import encoding_summary

    table.add_row("encoding", escape(f"{encoding_summary(meta)}, {_bytes(bytes_on_disk(meta))} on disk"))
    if meta.attributes:
        table.add_row("attributes", attributes_row(meta))
    drops = {k: v for k, v in meta.drops.items() if v}
    table.add_row("dropped", listed([f"{k} {v:,}" for k, v in drops.items()]) if drops else "none")
    if meta.skipped_inputs:
        table.add_row("skipped", listed(skipped_parts(meta.skipped_inputs)))
    run = meta.run
    rate = f"{run.tokens_per_s:,.0f} tokens/s" if run.tokens_per_s is not None else "no rate: its tasks ran apart"
    table.add_row("time", listed([f"{run.elapsed_s:.1f} s", rate, plural(run.workers, "worker")]))
    out.print(table)
    read = meta.run.input_chars + sum(meta.drop_chars.values())  # the characters of every document read
    for reason, n in drops.items():
        files = _by_file(meta.sources, functools.partial(lambda src, r: int(src.dropped.get(r, 0)), r=reason))
        share = f" ({100 * meta.drop_chars[reason] / read:.1f}% of the characters)" if meta.drop_chars.get(reason) \
            and read else ""  # fmt: skip
        out.print(f"  {reason} {n:,}{share}: {escape(files)}", highlight=False, soft_wrap=True)
    split = sum(src.split_into_paragraphs for src in meta.sources)
    if split:
        files = escape(_by_file(meta.sources, lambda src: src.split_into_paragraphs, counts=False))
        line = f"  split into paragraphs (over --max-chars bytes) {split:,}: {files}"
        out.print(line, highlight=False, soft_wrap=True)
    if repaired := sum(src.decode_replaced for src in meta.sources):
        files = escape(_by_file(meta.sources, lambda src: src.decode_replaced))
        out.print(f"  read with U+FFFD for bytes not UTF-8 (--decode-errors replace) {repaired:,}: {files}",
                  highlight=False, soft_wrap=True)  # fmt: skip
    if grew := sum(src.grew for src in meta.sources):
        files = escape(_by_file(meta.sources, lambda src: src.grew, counts=False))
        line = f"  grew while read (read up to their size at the start) {grew:,}: {files}"
        out.print(line, highlight=False, soft_wrap=True)
    if meta.dedup is not None and meta.dedup.lines_removed:
        files = escape(_by_file(meta.sources, lambda src: src.lines_removed))
        out.print(f"  lines removed by --dedup-lines (each line met before) {meta.dedup.lines_removed:,}: {files}",
                  highlight=False, soft_wrap=True)  # fmt: skip
    if meta.line_drops:
        lines = ", ".join(f"{reason} {entry['lines']:,}" for reason, entry in meta.line_drops.items())
        out.print(f"  lines removed by --filter: {escape(lines)}", highlight=False, soft_wrap=True)
    for reason, example in meta.drop_examples.items():
        out.print(f"  first {reason}: {escape(example)}", highlight=False, soft_wrap=True)
    for reason, entry in meta.line_drops.items():
        out.print(f"  first line {reason}: {escape(entry['example'])}", highlight=False, soft_wrap=True)
    if hint := meta.skipped_inputs.text_hint(files_read=len(meta.sources)):
        out.print(f"  hint: {escape(hint)}", highlight=False, soft_wrap=True)


def lines_removed(meta: Any) -> list[str]:
    """The lines taken out of kept documents, by what took them: ["--dedup-lines 4,719",
    "c4_end_mark 25,536"] (--dedup-lines, then each --filter reason); [] when none was."""
    found = [f"--dedup-lines {meta.dedup.lines_removed:,}"] if meta.dedup and meta.dedup.lines_removed else []
    return found + [f"{reason} {entry['lines']:,}" for reason, entry in meta.line_drops.items()]


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
        table = Table(title=f"lmshard dataset {escape(str(report.root))}", show_header=False, title_justify="left")
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        tok = meta.tokenizer
        bos = [f"BOS {tok.bos_id} (before each doc)"] if tok.bos_id is not None else []
        eot = f"EOT {tok.eot_id} ({meta.eot_position} each doc)"
        table.add_row("tokenizer", Items([tok.name, f"n_vocab {tok.n_vocab:,}", eot, *bos]))
        from ..inspect.verify import encoding_summary

        table.add_row("encoding", escape(encoding_summary(meta)))
        if meta.attributes:
            table.add_row("attributes", attributes_row(meta))
        for split in meta.splits:
            counts = [meta.n_docs(split), meta.n_tokens(split), len(meta.split_shards(split))]
            table.add_row(split, Items([plural(n, w) for n, w in zip(counts, ("doc", "token", "shard"), strict=True)]))
        stats = [f"{k} {_number(v)}" for k, v in report.length_stats().items()]
        damaged = {p.where for p in report.problems}  # (a shard missing or damaged: its figures are not all there)
        whole = sum(map(len, report.lengths.values())) == len(meta.shards) and \
            not any(s.path in w for s in meta.shards for w in damaged)  # fmt: skip
        partial = "" if whole else " (of the shards read)"
        if stats:
            table.add_row(f"doc length{partial}", Items([*stats[:-1], f"{stats[-1]} tokens"]))
        drops = [f"{k} {v:,}" for k, v in meta.drops.items() if v]
        table.add_row("prepare drops", listed(drops) if drops else "none")
        if lines := lines_removed(meta):
            table.add_row("lines removed", listed(lines))
        table.add_row("records read", f"{meta.records_read:,}")
        if meta.run.lineage:  # what made it: prepare, append, convert, import, oldest first
            table.add_row("history", Items([f"{e.get('op')} {str(e.get('at', ''))[:10]} ({_number(e.get('docs', 0))} "
                                            "docs)" for e in meta.run.lineage]))  # fmt: skip
        out.print(table)
        from ..inspect import audit

        hist = audit.length_histogram(report)
        if hist:
            out.print(f"[bold]document lengths[/] (tokens, log2 buckets{partial.replace(' (', ', ').rstrip(')')})")
            _bars([(label, count, f"{count:,}") for label, count in hist])
        if top_tokens:
            title = Text(f"most frequent tokens{partial}:", style="bold")
            out.print(Items([title, *(f"{t!r}×{c:,}" for _, c, t in top_tokens)]))
    _samples(samples)
    if report.ok:
        what = "structure" if report.quick else "checksums, token ids, structure"
        out.print(f"[green]OK[/]: {plural(report.shards_checked, 'shard')} verified ({what})")
    else:
        _problems(report)


def _bars(rows: Sequence[tuple[str, int, str]]) -> None:
    """A text histogram: per row its label, a bar as long as its count is against the largest,
    and what to print after it."""
    most = max(c for _, c, _ in rows) or 1
    label_w = max(15, *(len(label) for label, _, _ in rows))
    # bars of up to 40 cells, fewer where the widest label and count would not fit beside them
    bar_w = max(10, min(40, out.width - label_w - max(len(s) for _, _, s in rows) - 4))
    for label, count, shown in rows:
        bar = "█" * max(1, round(bar_w * count / most)) if count else ""
        out.print(f"  {label:>{label_w}} {bar:<{bar_w}} {shown}", highlight=False, soft_wrap=True, markup=False)


def attributes(found: list[dict[str, Any]], title: str) -> None:
    """`inspect --attribute`: per attribute a line of its statistics and its histogram."""
    out.print(f"[bold]attributes of {escape(title)}[/] (documents; % of the split's tokens; ≥: % in the documents "
              "at or above the bucket)")  # fmt: skip
    for a in found:
        head = f"[bold]{a['name']}[/] ({a['dtype']}, {escape(_made_by(a['by']))}): {a['docs']:,} docs"
        if a["dtype"] == "category":
            out.print(head, highlight=False)
            shown = a["labels"][:10]
            rest = a["labels"][10:]
            rows = [(x["label"] or "''", x["docs"], f"{x['docs']:,}  {100 * x['token_share']:.1f}%") for x in shown]
            if rest:
                rows.append((f"{len(rest)} others", sum(x["docs"] for x in rest),
                             f"{sum(x['docs'] for x in rest):,}  {100 * sum(x['token_share'] for x in rest):.1f}%"))
            _bars(rows)
            continue
        odd = ", ".join(f"{a[k]:,} {name}" for k, name in (("nan", "NaN"), ("inf", "infinite")) if a[k])
        if a["min"] is None:
            out.print(f"{head}, none a finite number ({odd})", highlight=False)
            continue
        out.print(f"{head}{', ' + odd if odd else ''}, min {_value(a['min'])}  mean {_value(a['mean'])}  max "
                  f"{_value(a['max'])}", highlight=False)  # fmt: skip
        whole = a["dtype"] == "uint32"  # (counts: buckets of whole numbers, a .. b)
        _bars([(_bucket(b["from"], b["to"], whole), b["docs"], f"{b['docs']:,}  {100 * b['token_share']:.1f}%  "
                f"≥ {100 * b['at_or_above']:.1f}%") for b in a.get("histogram", [])])  # fmt: skip


def attributes_row(meta: Any) -> str:
    """The dataset's attributes in a table row: how many columns, and the options that made them
    (`--attribute NAME`, or `--val-by FIELD` for its domains)."""
    made = ", ".join(dict.fromkeys(_made_by(f.by) for f in meta.attributes))
    return escape(f"{plural(len(meta.attributes), 'column')} by {made} (inspect --attribute NAME)")


def _made_by(by: str) -> str:
    """The option that made an attribute: `--attribute NAME`, or `--val-by FIELD` as recorded."""
    return by if by.startswith("--") else f"--attribute {by}"


def _value(x: float) -> str:
    """A statistic as a person reads it: 213,600 (not 2.136e+05), 0.4375, 3.2e-07."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:.4g}"


def _bucket(a: float, b: float, whole: bool) -> str:
    if whole:
        return _value(a) if b - a <= 1 else f"{_value(a)} – {_value(b - 1)}"
    return f"{_value(a)} – {_value(b)}"


def documents(report: Any, doc: tuple[str, int, str], samples: list[tuple[str, int, str]]) -> None:
    """`inspect --doc`: the document's whole text alone on stdout, without its separators (its
    name and length go to stderr), then any --sample documents; the report only when the dataset
    is corrupt."""
    where, n, text = doc
    err.print(f"{where} ({plural(n, 'token')})", highlight=False, soft_wrap=True)
    if out.is_terminal:  # the dataset may be someone else's: a terminal would act on its control codes
        text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
        text = text if text.endswith("\n") else text + "\n"  # (the prompt on a line of its own)
    out.file.write(text)  # as decoded: no wrapping, markup or emoji; in a file, the document's text exactly
    out.file.flush()
    _samples(samples)
    if not report.ok:
        _problems(report)


def _samples(samples: list[tuple[str, int, str]]) -> None:
    for where, n, text in samples:
        out.rule(f"{where} ({n} tokens)")
        shown = (
            text
            if len(text) <= _SAMPLE_CHARS
            else text[:_SAMPLE_CHARS]
            + f"\n… ({len(text) - _SAMPLE_CHARS:,} more characters; --json has the whole text)"
        )
        out.print(shown, highlight=False, markup=False, emoji=False)


def _problems(report: Any) -> None:
    for problem in report.problems:
        err.print(f"[bold red]problem:[/] {escape(str(problem))}", highlight=False, soft_wrap=True)
    err.print(f"[bold red]CORRUPT[/]: {len(report.problems)} problem(s)")


def packing(rows: list[dict[str, Any]], title: str) -> None:
    """`inspect --packing`: one row per strategy. The lower bound and the documents cut depend on
    the lengths, seq_len and overlong policy alone, which every strategy shares (packing.compare):
    they are said once above the table, which leaves it narrow enough for 80 columns."""
    first = rows[0]
    cut = [f"{first[f'{what}_documents']:,} {what}" for what in ("split", "truncated", "dropped")]
    out.print(f"[bold]packing[/] {escape(title)}", highlight=False, soft_wrap=True)
    out.print(f"lower bound {first['lower_bound']:,} packs (⌈tokens / seq_len⌉)", highlight=False, soft_wrap=True)
    out.print(Items(["documents over seq_len:", *listed(cut).items], sep=" "))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("strategy", "packs", "gap", "fill", "docs/pack", "steps/rank"):
        table.add_column(name, justify="left" if name == "strategy" else "right", no_wrap=True)
    for r in rows:
        table.add_row(r["strategy"], f"{r['packs']:,}", f"{r['gap_to_lower_bound']:.2%}", f"{r['fill']:.2%}",
                      f"{r['items_per_pack_mean']:.1f}", f"{r['steps_per_rank']:,}")  # fmt: skip
    out.print(table)
