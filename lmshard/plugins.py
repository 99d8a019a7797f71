"""A user's function named as `module:function` or `path/to/file.py:function`: what `prepare
--filter` and a loader's `augment` hook take. One import per process and name.

Memory model: the imported modules (Python's own cache).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import ConfigError


def import_callable(name: str, what: str) -> Callable[..., Any]:
    """The function `name` names; ConfigError, one line starting with `what` (the option and
    value, for example "--filter mine:keep"), when it cannot be imported or is not callable."""
    module_name, _, attr = name.rpartition(":")
    if not module_name or not attr:
        raise ConfigError(f"{what}: name a function as module:function or path/to/file.py:function")
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
        raise ConfigError(f"{what}: cannot import {module_name} ({type(e).__name__}: {e})") from None
    found = getattr(module, attr, None)
    if not callable(found):
        raise ConfigError(f"{what}: {module_name} has no function {attr!r}")
    return found  # type: ignore[no-any-return]
