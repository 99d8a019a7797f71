"""Document filters as counted pipeline steps (`prepare --filter NAME`, repeatable): each runs
in the workers on every cleaned document that passed the length filters, in the order given,
and the first that drops a document names the reason, counted in the metadata's `drops` with an
example, like every other drop.

A filter is a Python callable taking the document's text and returning:
- None or True: keep it;
- `Edit(text)`: keep it with that text instead (lines removed, say); the next filters, the dedup
  key and the tokenizer see the edited text, and an empty one (or only whitespace) drops the
  document, counted under the filter's own name + `_empty`;
- a reason, a string of letters, digits and `_` (`"too_many_links"`): drop it, counted under
  that reason;
- False: drop it, counted under the filter's own name.

NAME is a built-in filter (`BUILTIN`), a built-in taking arguments as `NAME=ARGS`
(`WITH_ARGS`: `language=en,de:0.65`), or `module:function`, a function importable in the workers
(a module on the Python path, or a file `path/to/module.py:function`, whose path is made
absolute when the run is configured, so that a task started elsewhere imports the same file). A
filter must be a pure function of the text, so that a run's output does not depend on its
workers or tasks.

**A plugin's code is part of the input** (`plugin_sources`): the path and sha256 of its source
are in the run's fingerprint, its plan and its metadata (`config.filter_sources`), so a resumed
run, an appended task or a planned task whose plugin changed is refused, naming the file. The
hash covers the plugin's file and the Python files of its directory that it imports (and those
they import); a module of an installed package is hashed alone, and what a plugin imports from
elsewhere (installed packages, data files it reads) is not covered: pin those by version. A
plugin that raises, or returns what a filter cannot, stops the run with one line naming the
filter, the record and the exception (`FilterFailed`).

Memory model: the filters themselves (the language model: about 110 MB per process that uses
it); nothing per document beyond its text and one edited copy.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ConfigError
from ..plugins import import_callable
from .edit import Edit

__all__ = ["BUILTIN", "WITH_ARGS", "Edit", "FilterFailed", "Verdict", "absolute", "plugin_sources", "resolve",
           "run_filters"]

# Each built-in as `module:function` of this package, imported when a run first uses it: a run
# without --filter imports none of them (their imports and tables cost every prepare's start).
BUILTIN: dict[str, str] = {"gopher_quality": "gopher:gopher_quality",
                           "gopher_repetition": "repetition:gopher_repetition",
                           "fineweb_quality": "repetition:fineweb_quality", "c4": "c4:c4_quality"}  # fmt: skip
# NAME=ARGS: each takes the name as given (for its messages) and the text after "=", and returns the filter.
WITH_ARGS: dict[str, str] = {"language": "language:language_filter", "decontaminate": "decon:from_filter"}
_REASON = re.compile(r"[A-Za-z0-9_]{1,64}")
_loaded: dict[str, Callable[[str], Any]] = {}  # per process: each filter imported once


class FilterFailed(Exception):
    """A filter raised, or returned what a filter cannot: the run names the record (worker.py)."""


def absolute(name: str) -> str:
    """`path/to/rules.py:fn` with its path made absolute (relative to this directory); any other
    filter name as it is."""
    module, sep, attr = name.rpartition(":")
    if sep and module.endswith(".py") and not os.path.isabs(module) and name.partition("=")[0] not in WITH_ARGS:
        return f"{os.path.abspath(module)}:{attr}"
    return name


def plugin_sources(names: Sequence[str]) -> dict[str, list[str]]:
    """Per `module:function` filter: [its source file, the sha256 of that file and the Python
    files beside it] (see the module docstring); built-ins have none."""
    out = {}
    for name in names:
        if name in BUILTIN or name.partition("=")[0] in WITH_ARGS or ":" not in name:
            continue
        path = _source_file(name.rpartition(":")[0])
        if path is None:
            out[name] = ["", ""]
            continue
        digest = hashlib.sha256()
        beside = [] if _installed(path) else _imported_beside(path)
        for p in [path, *beside]:
            try:
                data = p.read_bytes()
            except OSError:
                continue
            digest.update(f"{p.name}\0{len(data)}\0".encode() + data)
        out[name] = [str(path), digest.hexdigest()]
    return out


def _source_file(module: str) -> Path | None:
    if module.endswith(".py"):
        return Path(module).resolve() if Path(module).is_file() else None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    return Path(origin).resolve() if origin and Path(origin).is_file() else None


def _imported_beside(path: Path) -> list[Path]:
    """The Python files of the plugin's own directory that it imports (`import helper`, `from
    helper import x`, `from . import x`), and those they import in turn, sorted: what can change
    its answers besides its own file. A file that cannot be parsed counts as importing nothing."""
    import ast

    root, found, todo = path.parent, set(), [path]
    while todo:
        try:
            tree = ast.parse(todo.pop().read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                names |= {node.module.split(".")[0]} if node.module else {alias.name for alias in node.names}
        for name in names:
            for candidate in (root / f"{name}.py", root / name / "__init__.py"):
                if candidate.is_file() and candidate != path and candidate not in found:
                    found.add(candidate)
                    todo.append(candidate)
    return sorted(found)


def _installed(path: Path) -> bool:
    """A file of an installed package or of the standard library (its siblings are not the plugin's)."""
    import sysconfig

    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    return any(path.is_relative_to(Path(r).resolve()) for r in roots if r)


def resolve(name: str) -> Callable[[str], Any]:
    """The filter `name` (see the module docstring); ConfigError, one line, when it is neither a
    built-in nor an importable callable."""
    found = _loaded.get(name)
    if found is not None:
        return found
    if name in BUILTIN:
        found = _builtin(BUILTIN[name])
    elif name.partition("=")[0] in WITH_ARGS:
        found = _builtin(WITH_ARGS[name.partition("=")[0]])(name, name.partition("=")[2])
    elif ":" in name:
        found = import_callable(name, f"--filter {name}")
    else:
        builtins = ", ".join([*BUILTIN, *(f"{n}=..." for n in WITH_ARGS)])
        base = name.partition("=")[0]
        if base in BUILTIN:  # a built-in given arguments it does not take
            raise ConfigError(f"--filter {name}: {base} takes no arguments; pass --filter {base}")
        import difflib

        close = difflib.get_close_matches(base, [*BUILTIN, *WITH_ARGS], n=1, cutoff=0.5) or [
            n for n in [*BUILTIN, *WITH_ARGS] if base and (n.startswith(base) or base.startswith(n))][:1]  # fmt: skip
        guess = f"; did you mean {close[0]}{'=...' if close[0] in WITH_ARGS else ''}?" if close else ""
        raise ConfigError(f"--filter {name}: not a built-in filter ({builtins}) nor module:function{guess}")
    _loaded[name] = found
    return found


def _builtin(spec: str) -> Any:
    """A built-in filter (or the maker of one) from its `module:function` in this package."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), attr)


class Verdict(NamedTuple):
    """What the filters made of a document: its text to keep (edited by them, if they did), or
    None with the reason it is dropped and the filter that dropped it."""

    text: str | None
    reason: str | None = None
    by: str | None = None
    removed: dict[str, tuple[int, str]] | None = None  # what the edits of a kept document took out, by reason


def run_filters(names: tuple[str, ...], text: str) -> Verdict:
    """Run the filters `names` in order on `text`, each on the text the previous ones left: the
    first that drops it names the reason."""
    removed: dict[str, tuple[int, str]] = {}
    for name in names:
        try:
            verdict = resolve(name)(text)
        except Exception as e:  # the user's code: whatever it raises (a wrong signature: TypeError)
            raise FilterFailed(f"--filter {name} raised {type(e).__name__}: {_short(str(e))}") from None
        if verdict is None or verdict is True:
            continue
        if isinstance(verdict, Edit):
            try:
                edits = [(str(reason), int(n), str(first)) for reason, (n, first) in getattr(verdict, "removed",
                                                                                             {}).items()]  # fmt: skip
                edited = str(verdict)
            except Exception as e:  # an Edit made by hand with a malformed `removed`
                raise FilterFailed(f"--filter {name} returned a malformed Edit ({type(e).__name__}: "
                                   f"{_short(str(e))}); its `removed` is {{reason: (lines, first line)}}") from None
            for reason, n, first in edits:
                before, first = removed.get(reason, (0, first))  # the first line a filter removed for it
                removed[reason] = (before + n, first)
            text = edited  # a plain str: what is hashed and tokenized
            if not text.strip():
                return Verdict(None, _own_reason(name, 58) + "_empty", name)
            continue
        if verdict is False:
            return Verdict(None, _own_reason(name, 64), name)
        if isinstance(verdict, str) and _REASON.fullmatch(verdict):
            return Verdict(None, verdict, name)
        shown = repr(verdict) if len(repr(verdict)) <= 60 else repr(verdict)[:57] + "..."
        raise FilterFailed(f"--filter {name} returned {shown}; return None to keep a document, Edit(text) to keep it "
                           "with a new text, or a reason of letters, digits and _ (such as 'too_many_links') to drop "
                           "it")  # fmt: skip
    return Verdict(text, removed=removed or None)


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _own_reason(name: str, limit: int) -> str:
    """The reason a filter's own verdicts are counted under: its name (`c4`, `loud` for `rules.py:loud`)."""
    base = name.partition("=")[0] if name.partition("=")[0] in WITH_ARGS else name.rpartition(":")[2]
    return re.sub(r"[^A-Za-z0-9_]", "_", base)[:limit] or "filter"
