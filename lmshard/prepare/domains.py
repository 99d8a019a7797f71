"""What `prepare --val-by` names as a domain (execution/valby.py holds out a val part of each):
`input`, each input file, or any other name, a record field (records.py reads its value into
`Record.domain`). A field's values are kept per document as a category attribute; this module
checks the options, names that attribute and keys its labels.

Memory model: none beyond its arguments.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Sequence, Sized
from typing import Any

import numpy as np
import xxhash

from ..errors import ConfigError, InputError
from ..format.attributes import MAX_LABELS, AttrField, is_name


def field_of(val_by: str | None) -> str | None:
    """The record field --val-by names (None: by input, or no --val-by)."""
    return None if val_by in (None, "input") else val_by


def attribute_name(field: str) -> str:
    """The category attribute that keeps a field's domains: the field's last part, made an
    identifier (`meta.pile_set_name` → `pile_set_name`; other characters become `_`:
    `source-name` → `source_name`; `_` before a leading digit, after a Python keyword (`class_`)
    and after `input`, which `val_streams(by="input")` reads as the input files; `domain` for
    an empty name)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", field.split(".")[-1])[:63] or "domain"
    if name == "input":  # (val_streams(by="input") means each input file)
        return "input_"
    return name if is_name(name) else f"_{name}" if not keyword.iskeyword(name) else f"{name}_"


def domain_attr(val_by: str | None, labels: Sequence[str]) -> AttrField | None:
    """The category column of --val-by FIELD's domains (None: no field)."""
    field = field_of(val_by)
    return None if field is None else AttrField(attribute_name(field), "category", f"--val-by {field}", tuple(labels))


def check_options(config: Any) -> None:
    """What --val-by and --val-tokens refuse (PrepareConfig's check), in one line."""
    if config.val_by is None:
        if config.val_tokens:
            raise ConfigError(f"--val-tokens {config.val_tokens} without --val-by; pass --val-by input (or a "
                              "record field) too")  # fmt: skip
        return
    if not config.val_by.strip():
        raise ConfigError("--val-by takes input (a val part of each input file) or a record field's name")
    if config.val_tokens < 1:
        raise ConfigError(f"--val-by {config.val_by} needs --val-tokens N, the tokens of each domain's val part "
                          "(e.g. 1000000)")  # fmt: skip
    if config.val_fraction or config.append or config.max_docs is not None:
        raise ConfigError(f"--val-by {config.val_by} holds out --val-tokens of each domain: pass --val-fraction 0, "
                          "and no --append or --max-docs")  # fmt: skip
    field = field_of(config.val_by)
    if field is not None and config.attributes:
        from ..quality.scores import schema

        name = attribute_name(field)
        if any(f.name == name for f in schema(config.attributes)):
            raise ConfigError(f"--val-by {field} keeps each document's domain as the attribute {name!r}, which an "
                              "--attribute makes too; name that scorer's columns otherwise "
                              "(module:function=a,b)")  # fmt: skip


def label_keys(labels: Sequence[str]) -> np.ndarray:
    """Each label's key (the xxh3-64 of its UTF-8 bytes): a document's domain as a unit stores it."""
    return np.array([xxhash.xxh3_64_intdigest(x.encode("utf-8", "surrogatepass")) for x in labels], dtype="<u8")


def check_labels(labels: Sized, field: str | None, where: str) -> None:
    """A field's distinct values, at most a category's 65,536."""
    if field is not None and len(labels) > MAX_LABELS:
        raise InputError(f"--val-by {field}: more than {MAX_LABELS:,} distinct values in {where}; --val-by names a "
                         "field of few values (a source's or a domain's name), not one of each record's "
                         "own")  # fmt: skip


def check_sources(config: Any, sources: Sequence[Any]) -> None:
    """Inputs that --val-by FIELD cannot read a field of (plain text), refused in one line
    before anything is claimed or planned."""
    field = field_of(config.val_by)
    text = next((s for s in sources if s.fmt == "text"), None) if field is not None else None
    if text is not None:
        raise ConfigError(f"{text.path}: --val-by {field}: plain text has no fields; --val-by FIELD reads JSON, "
                          "CSV, parquet, arrow or Hugging Face records (use --val-by input for a val part of each "
                          "file)")  # fmt: skip
