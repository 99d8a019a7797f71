"""Parsing primitives of the metadata schema: a field of a JSON object, type-checked, with the
one-line reason when it is not what the schema says. `schema` turns `_Invalid` into FormatError.

Memory model: none beyond the parsed JSON value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .layout import shard_paths


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


def _sums(raw: dict[str, Any]) -> dict[str, Any]:
    """The optional per-block checksum fields: all three or none."""
    if "sums_path" not in raw:
        return {}
    block_tokens = _count(raw, "block_tokens")
    if not 1 <= block_tokens <= 1 << 30:
        raise _Invalid(f"'block_tokens' {block_tokens} is not a block size (1 .. 2**30 tokens)")
    return {"sums_path": _inside(raw, "sums_path"), "block_tokens": block_tokens,
            "sums_xxh3_64": _get(raw, "sums_xxh3_64", str)}  # fmt: skip


def _inside(raw: dict[str, Any], key: str) -> str:
    """A relative path that stays inside the dataset directory."""
    rel = _get(raw, key, str)
    p = Path(rel)
    if not rel or p.is_absolute() or ".." in p.parts:
        raise _Invalid(f"path {rel!r} escapes the dataset directory")
    return str(rel)


def _check_names(shard: Any) -> None:  # a ShardInfo (schema.py imports this module)
    """The paths must be the ones the writer gives shard N of the split (`shard_paths`): a
    metadata file cannot point a reader at any other file of the directory."""
    digits = shard.path.removeprefix(f"{shard.split}/shard_").removesuffix(".bin")
    number = int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 12 else -1
    if number < 0 or shard_paths(shard.split, number) != (shard.path, shard.index_path):
        raise _Invalid(f"paths {shard.path!r}, {shard.index_path!r} are not {shard.split}/shard_NNNNNN.bin and .idx")
    if shard.sums_path and shard.sums_path != shard.path.removesuffix(".bin") + ".sums":
        raise _Invalid(f"sums path {shard.sums_path!r} is not {shard.split}/shard_NNNNNN.sums")
    if shard.blocks_path and shard.blocks_path != shard.path.removesuffix(".bin") + ".blocks":
        raise _Invalid(f"blocks path {shard.blocks_path!r} is not {shard.split}/shard_NNNNNN.blocks")
    if shard.src_path and shard.src_path != shard.path.removesuffix(".bin") + ".src":
        raise _Invalid(f"provenance path {shard.src_path!r} is not {shard.split}/shard_NNNNNN.src")
    if shard.attr_path and shard.attr_path != shard.path.removesuffix(".bin") + ".attr":
        raise _Invalid(f"attribute path {shard.attr_path!r} is not {shard.split}/shard_NNNNNN.attr")


def _line_drops(raw: dict[str, Any]) -> dict[str, Any]:
    """`line_drops`: reason → {"lines": a count, "example": "file:record: 'the first line'"}."""
    value = _get(raw, "line_drops", dict, {})
    for reason, entry in value.items():
        if not isinstance(entry, dict):
            raise _Invalid(f"'line_drops.{reason}' is not an object")
        _count(entry, "lines")
        _get(entry, "example", str, "")
    return dict(value)


MAX_HASHES = 1024  # MinHash functions a signature may have (bands × rows), and words per shingle at most 64


def _near(raw: Any) -> dict[str, Any] | None:
    """`dedup.near` (--near-dedup): `minhash` {n_grams, bands, rows, threshold, seed}, `removed`,
    `examples`; the layout is held to what a reader can use."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _Invalid("'dedup.near' is not an object")
    minhash = _get(raw, "minhash", dict)
    n_grams, bands, rows = (_count(minhash, k) for k in ("n_grams", "bands", "rows"))
    if not (1 <= n_grams <= 64 and bands >= 1 and rows >= 1 and bands * rows <= MAX_HASHES):
        raise _Invalid(f"'dedup.near.minhash' {n_grams}-grams, {bands} bands × {rows} rows is not a MinHash layout "
                       f"(1 to 64 words, at most {MAX_HASHES} hashes)")  # fmt: skip
    threshold = minhash.get("threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 < threshold <= 1:
        raise _Invalid(f"'dedup.near.minhash.threshold' {threshold!r} is not a fraction in (0, 1]")
    _get(minhash, "seed", int)
    _count(raw, "removed", 0)
    _get(raw, "examples", list, [])
    return raw
