"""Line numbers in a planned run without reading outside a task's units.

A byte range of a large file (a unit, units.py) starts at a line whose number depends on
every newline before it. Tasks start together, so the ranges before a task's own are usually not
tokenized yet; counting those newlines would make the last task of a file cut in m read about
all of it (m/2 times the input over the run). Instead a range is numbered from what is known:

- the file's first range starts at line 1; a range whose previous range is already tokenized
  starts where that one's marker says the next begins (one small read);
- any other range is numbered **relative** to its own start while it is tokenized. Its marker
  records the newlines it holds (counted in the blocks it reads anyway), and each drop example
  it gives carries a tag naming the unit. The select stage's summary carries every unit's
  newline count to the finish, which turns the examples that reach the metadata (one per drop
  reason) into the absolute `file:line` a one-process run writes.
- an error that stops the run is named at its absolute line: the failing range counts the
  newlines before it then (reading outside its units only on the way to a failure), and is
  read again with that first line, so the message is the one a one-process run gives.

A Hugging Face stream's shard (a unit of a stream, units.py) is numbered the same way, its
records standing for lines: the first shard's first record is 1, another's is known from the
previous shard's marker or else counted from its own start, and its marker records how many
records it held.

Memory model: nothing beyond the per-unit newline counts of the select summary (one integer per
unit).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..documents.sources import Source

_TAG = "\x00"  # starts an example numbered relative to its unit's start: TAG unit TAG message
RELATIVE = ("range", "shard")  # the kinds of unit numbered from their own start until the finish


def known_first_line(tokenized: Path, plan: dict[str, Any], u: int) -> int | None:
    """The number of range unit u's first line (shard unit u's first record) when it is known
    without reading the file: 1 for the file's first range (the stream's first shard), else from
    the previous unit's marker when that unit is done; None when it is not known yet."""
    units = plan["units"]
    if units[u][2] == 0:
        return 1
    v = u - 1
    if v < 0 or units[v][0] != units[u][0] or units[v][1] != units[u][1]:
        return None
    try:
        return int(json.loads((tokenized / f"unit_{v:06d}.done").read_text())["next_line"])
    except (OSError, ValueError, KeyError):
        return None


def tag(examples: dict[str, str], u: int) -> dict[str, str]:
    """Unit u's examples, marked as numbered from its start."""
    return {reason: f"{_TAG}{u}{_TAG}{text}" for reason, text in examples.items()}


def absolute(examples: dict[str, str], plan: dict[str, Any], sources: list[Source],
             newlines: list[int]) -> dict[str, str]:  # fmt: skip
    """The examples with every tagged line number made absolute: a range unit's first line is 1
    plus the newlines of the ranges of its file before it (`newlines`: per unit, as the select
    summary holds them)."""
    out = {}
    for reason, text in examples.items():
        if text.startswith(_TAG):
            unit, _, text = text[1:].partition(_TAG)
            text = _renumbered(text, sources[plan["units"][int(unit)][0]].path, _first_line(plan, int(unit), newlines))
        out[reason] = text
    return out


def record_number(plan: dict[str, Any], u: int, number: int, newlines: list[int]) -> int:
    """The number in its file of unit u's record `number` (counted from the unit's start for a
    byte range or a stream's shard; a whole file's or a row group's are the file's already)."""
    if plan["units"][u][1] not in RELATIVE:
        return number
    return _first_line(plan, u, newlines) + number - 1


def _first_line(plan: dict[str, Any], u: int, newlines: list[int]) -> int:
    units, line = plan["units"], 1
    v = u - 1
    while v >= 0 and units[v][0] == units[u][0]:
        line += newlines[v]
        v -= 1
    return line


def _renumbered(text: str, path: str, first: int) -> str:
    """`path:N: ...` (N counted from 1 at the unit's start) with N made absolute, in the prefix
    and wherever the detail names the same line ("line N is not valid UTF-8")."""
    head = f"{path}:"
    number, colon, rest = text[len(head) :].partition(":")
    if not text.startswith(head) or not colon or not number.isdigit():
        return text  # (no line number in it)
    line = first + int(number) - 1
    detail = re.sub(rf"\bline {number}\b", f"line {line}", rest)
    return f"{head}{line}:{detail}"
