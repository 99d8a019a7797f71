"""How an input is written on the command line: a path, glob or URL, or `FORMAT:INPUT` (an
input with a format of its own, `text:man/`), which `discover` reads in that format whatever
--format says for the others.

Memory model: nothing.
"""

from __future__ import annotations

import os

FORMAT_PREFIXES = ("text", "jsonl", "json", "csv", "parquet", "arrow")  # `FORMAT:INPUT`, as --format takes them


def with_format(spec: str) -> tuple[str | None, str]:
    """An input with a format of its own, `text:docs/man` or `jsonl:s3://b/x/`: (that format, the
    input); any other input: (None, it). A path that exists as written is a path."""
    fmt, sep, rest = spec.partition(":")
    if sep and fmt in FORMAT_PREFIXES and rest and not os.path.exists(spec):
        return fmt, rest
    return None, spec
