"""Document filters as counted pipeline steps (`prepare --filter NAME`, repeatable): each runs
in the workers on every cleaned document that passed the length filters, in the order given,
and the first that drops a document names the reason, counted in the metadata's `drops` with an
example, like every other drop.

A filter is a Python callable taking the document's text and returning:
- None or True: keep it;
- a reason, a string of letters, digits and `_` (`"too_many_links"`): drop it, counted under
  that reason;
- False: drop it, counted under the filter's own name.

NAME is a built-in filter (`BUILTIN`) or `module:function`, a function importable in the
workers (a module on the Python path, or a file `path/to/module.py:function`). A filter must be
a pure function of the text, so that a run's output does not depend on its workers or tasks.

Memory model: the filters themselves; nothing per document beyond its text.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError
from .gopher import gopher_quality
from .repetition import fineweb_quality, gopher_repetition

BUILTIN: dict[str, Callable[[str], Any]] = {"gopher_quality": gopher_quality, "gopher_repetition": gopher_repetition,
                                            "fineweb_quality": fineweb_quality}  # fmt: skip
_REASON = re.compile(r"[A-Za-z0-9_]{1,64}")
_loaded: dict[str, Callable[[str], Any]] = {}  # per process: each filter imported once


def resolve(name: str) -> Callable[[str], Any]:
    """The filter `name` (see the module docstring); ConfigError, one line, when it is neither a
    built-in nor an importable callable."""
    found = _loaded.get(name)
    if found is not None:
        return found
    if name in BUILTIN:
        found = BUILTIN[name]
    elif ":" in name:
        module_name, _, attr = name.rpartition(":")
        try:
            if module_name.endswith(".py"):
                spec = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
                if spec is None or spec.loader is None or not Path(module_name).is_file():
                    raise ImportError(f"no file {module_name}")
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            else:
                module = importlib.import_module(module_name)
        except Exception as e:  # the user's module: any error it raises while importing
            raise ConfigError(f"--filter {name}: cannot import {module_name} ({type(e).__name__}: {e})") from None
        found = getattr(module, attr, None)
        if not callable(found):
            raise ConfigError(f"--filter {name}: {module_name} has no function {attr!r}")
    else:
        raise ConfigError(f"--filter {name}: not a built-in filter ({', '.join(BUILTIN)}) nor module:function")
    _loaded[name] = found
    return found


def run_filters(names: tuple[str, ...], text: str) -> tuple[str, str] | None:
    """(reason, filter) of the first filter in `names` that drops `text`, or None to keep it."""
    for name in names:
        verdict = resolve(name)(text)
        if verdict is None or verdict is True:
            continue
        if verdict is False:
            return re.sub(r"[^A-Za-z0-9_]", "_", name.rpartition(":")[2])[:64] or "filter", name
        if isinstance(verdict, str) and _REASON.fullmatch(verdict):
            return verdict, name
        raise InputError(f"--filter {name}: returned {verdict!r}; return None to keep a document, or a reason "
                         "of letters, digits and _ (such as 'too_many_links') to drop it")  # fmt: skip
    return None
