"""Parsing primitives of the metadata schema: a field of a JSON object, type-checked, with the
one-line reason when it is not what the schema says. `schema` turns `_Invalid` into FormatError.

Memory model: none beyond the parsed JSON value.
"""

from __future__ import annotations

from typing import Any


class _Invalid(Exception):
    """A field that fails validation; `load_metadata` turns it into one FormatError line."""


def _get(raw: dict[str, Any], key: str, kind: type, default: Any = ...) -> Any:
    """raw[key], which must be a `kind`; `default` when absent or null (required without one)."""
    value = raw.get(key)
    if value is None:
        if default is ...:
            raise _Invalid(f"'{key}' is missing")
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Invalid(f"'{key}' is {type(value).__name__}, not {kind.__name__}")
    return value


def _count(raw: dict[str, Any], key: str, default: Any = ...) -> Any:
    """A non-negative int (or `default`, which may be None, when the key is absent or null)."""
    value = _get(raw, key, int, default)
    if isinstance(value, int) and value < 0:
        raise _Invalid(f"'{key}' is negative ({value})")
    return value


def _counts(raw: dict[str, Any], key: str) -> dict[str, int]:
    """A mapping of reason → count (drops), every count a non-negative int."""
    value = _get(raw, key, dict, {})
    for reason in value:
        _count(value, reason)
    return {str(k): int(v) for k, v in value.items()}
