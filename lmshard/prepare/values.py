"""Option values as the types prepare's options take: a choice among names, a field's annotated
type (`checked`: a number written as "1e8" in a config file, a list of strings or one string),
a size with a unit (`parse_size`); each refusal one line naming the option and what it takes.

Memory model: none beyond the value checked.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable
from typing import Any

from ..errors import ConfigError


def choice(flag: str, value: str, allowed: Iterable[str]) -> None:
    """`value` is one of `allowed`, or a one-line ConfigError naming the option and the choices."""
    if value not in allowed:
        raise ConfigError(f"{flag} must be one of {', '.join(allowed)} (got {value!r})")


def checked(key: str, value: Any, expected: Any, where: str, parse_strings: bool = True) -> Any:
    """`value` as the type a field expects, or a one-line ConfigError. A number may be written
    as a string ("1e8", "100_000_000", as config files do) only when `parse_strings`."""
    args = typing.get_args(expected)
    if type(None) in args:
        if value is None:
            return None
        expected = next(a for a in args if a is not type(None))
    if typing.get_origin(expected) is list:
        items = [value] if isinstance(value, str) else value
        if isinstance(items, list) and all(isinstance(v, str) for v in items):
            return list(items)
        return bad_value(key, value, "a list of strings (or one string)", where)
    if expected is bool:
        return value if isinstance(value, bool) else bad_value(key, value, "true or false", where)
    if not parse_strings and isinstance(value, str) and expected in (int, float):
        return bad_value(key, value, "a whole number" if expected is int else "a number", where)
    if expected is int:
        number = number_of(value)
        if isinstance(number, int) or (isinstance(number, float) and number.is_integer()):
            return int(number)
        return bad_value(key, value, "a whole number", where)
    if expected is float:
        number = number_of(value)
        try:
            return float(number) if number is not None else bad_value(key, value, "a number", where)
        except OverflowError:
            return bad_value(key, value, "a number", where)
    if expected is str:
        return value if isinstance(value, str) else bad_value(key, value, "a string", where)
    raise AssertionError(f"no check for the type of {key}: {expected}")


def number_of(value: Any) -> int | float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else int(value, 10)
        except (ValueError, OverflowError):
            return None
    return None


def bad_value(key: str, value: Any, expected: str, where: str) -> Any:
    raise ConfigError(f"{where} {key!r} must be {expected} (got {value!r})")


def parse_size(option: str, text: str) -> int:
    """Bytes from `65536`, `64K`, `8M`, `1G` (powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    number, unit = text.strip().upper().rstrip("IB") or "0", ""
    if number[-1:] in "KMG":
        number, unit = number[:-1], number[-1]
    if not number.isdigit():
        raise ConfigError(f"{option} {text}: pass a size in bytes, or with K, M or G (64K, 8M, 1G)")
    return int(number) * units[unit]
