"""The one exception family lmshard raises for problems a user can fix, and the exit codes.

The CLI turns any `LmshardError` (and any `OSError`) into a single line on stderr and
EXIT_ERROR; `inspect` exits EXIT_CORRUPT for a dataset that fails verification; anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1  # a failed run: bad input, a bad option value, a missing file or vocabulary
EXIT_USAGE = 2  # a malformed command line (unknown option, missing argument), as click reports it
EXIT_CORRUPT = 3  # `lmshard inspect`: the dataset fails verification
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it
EXIT_TERMINATED = 143  # SIGTERM (128 + 15), a scheduler's stop (Slurm's scancel, a time limit)


def warn(message: str) -> None:
    """A problem that does not stop the run (a fallback taken): one line on stderr."""
    import sys

    print(f"lmshard: warning: {message}", file=sys.stderr, flush=True)


class LmshardError(Exception):
    """A problem with the user's input, configuration or environment; the message says the fix."""


class InputError(LmshardError):
    """A source file or record cannot be read as asked (bad UTF-8, bad JSON, missing field)."""


class ConfigError(LmshardError):
    """An invalid option or combination of options."""


class ArgumentError(LmshardError, ValueError):
    """An invalid argument to the Python API (a ValueError too, so `except ValueError` catches it)."""


class TokenizerError(LmshardError):
    """A vocabulary that is missing, unknown, or fails its checksum."""


class FormatError(LmshardError):
    """A dataset directory that is not a complete, valid lmshard dataset."""


class MissingDependency(LmshardError):
    """An optional package is needed for this input or feature."""


def missing_dependency(package: str, extra: str, why: str) -> MissingDependency:
    # A factory rather than a custom __init__: exceptions cross process boundaries by pickling,
    # which re-calls __init__ with the message alone.
    return MissingDependency(f"{why} needs the '{package}' package: pip install 'lmshard[{extra}]'")
