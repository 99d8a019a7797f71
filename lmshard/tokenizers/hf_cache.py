"""What loading a Hugging Face tokenizer.json computes, remembered per file so that the next run
starts without computing it: the vocabulary's facts (its special tokens, size, the token its
post-processor puts first, its model type), its ranks form for splintr (hf_ranks.py) and the
table of code points this Python's Unicode tables leave unassigned (`newer_code_points`).

With them a run's process tree neither parses the file's JSON nor builds the `tokenizers`
object unless a text needs it (one the gate routes to `tokenizers`, a decode): prepare's
workers load only splintr's tables, from the remembered ranks.

Entries live with the gate's passes, in `$LMSHARD_CACHE_DIR/gate/hf` (default
`~/.cache/lmshard/gate/hf`), named by the sha256
of everything they depend on: the file's sha256, the `tokenizers` version and the sha256 of the
source that computes them. A missing, unreadable or damaged entry is computed again; a cache
that cannot be written costs the next run the time, never a different result.

Memory model: one entry at a time (the facts: a few KB; the ranks: about a fifth of the file;
the table: 139 KB packed).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..format import atomic_write_bytes
from . import gate


def _entry(kind: str, *parts: str) -> Path:
    key = hashlib.sha256("\0".join((kind, *parts)).encode()).hexdigest()
    return gate.gate_dir() / "hf" / f"{kind}-{key[:32]}"


@functools.cache
def source_sha256(path: str | os.PathLike[str]) -> str:
    """A source file's sha256, read once per process (what an entry's key names of its code)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _remembered(kind: str, parts: tuple[str, ...], compute: Callable[[], bytes],
                usable: Callable[[bytes], bool] = lambda body: True) -> bytes:  # fmt: skip
    """The entry's bytes (stored after their own sha256 line) when whole and `usable`, else
    `compute()`d and stored, whole or not at all (a cache that cannot be written is left be)."""
    path = _entry(kind, *parts)
    try:
        head, _, body = path.read_bytes().partition(b"\n")
        if head == hashlib.sha256(body).hexdigest().encode() and usable(body):
            return body
    except OSError:
        pass
    body = compute()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    return body


def _json_object(body: bytes) -> bool:
    try:
        return isinstance(json.loads(body), dict)
    except ValueError:
        return False


def facts(parts: tuple[str, ...], compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The vocabulary's facts under `parts` (file sha256, tokenizers version, code sha256),
    remembered, or `compute()`d and remembered."""
    body = _remembered("facts", parts, lambda: json.dumps(compute(), ensure_ascii=False, sort_keys=True).encode(),
                       _json_object)  # fmt: skip
    return dict(json.loads(body))


def payload(parts: tuple[str, ...], compute: Callable[[], bytes]) -> bytes:
    """Bytes under `parts` (what they are, the file's sha256, the sha256 of the code that makes
    them), remembered, or `compute()`d and remembered."""
    return _remembered("bytes", parts, compute)


def bool_table(parts: tuple[str, ...], size: int, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """A bool array of `size` under `parts`, remembered packed, or `compute()`d and remembered."""
    body = _remembered("table", parts, lambda: np.packbits(compute()).tobytes(),
                       lambda body: len(body) == (size + 7) // 8)  # fmt: skip
    return np.unpackbits(np.frombuffer(body, dtype=np.uint8), count=size).astype(bool)


@functools.cache
def newer_code_points() -> np.ndarray:
    """A bool per code point: unassigned in this Python's Unicode tables (`unicodedata`), so
    possibly assigned, composed or classed differently by a library with newer ones (private
    use planes excluded). Planes 4-13 hold no character in any Unicode version yet: all of them
    count as unassigned without asking. About 0.1 s to compute, remembered per Unicode version
    (hf_cache.py); 1.1 MB."""
    parts = (unicodedata.unidata_version, source_sha256(__file__))
    return bool_table(parts, 0x110000, _unassigned)


def _unassigned() -> np.ndarray:
    table = np.zeros(0x110000, dtype=bool)
    table[0x40000:0xE0000] = True
    # Surrogates: splintr is given the repaired text (a pair written as two code points becomes
    # the character it spells), which this table would not see; `tokenizers` repairs it itself.
    table[0xD800:0xE000] = True
    for c in (*range(0x40000), *range(0xE0000, 0xF0000)):
        if unicodedata.category(chr(c)) == "Cn":
            table[c] = True
    return table
