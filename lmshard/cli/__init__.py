"""The `lmshard` command line, the edge of the package: the only room that imports typer and rich,
and the one place that turns an `LmshardError` into a one-line message and an exit code.

commands (the app, its error handling and the small commands), prepare (prepare's options and
logs), inspection (inspect), audit (trace), scale (run-task, status), interop (export, import,
convert), spellings (other tools' option names), render (what the commands print)."""

from .commands import app, main

__all__ = ["app", "main"]
