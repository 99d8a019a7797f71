"""A dataset under a URL prefix: its metadata, and where its current generation lives.

A dataset written to an object store by `prepare --out URL` has the local layout under the
prefix (docs/format.md). A replaced one (`--overwrite`, or an `--append` that had to rewrite
a file) lives whole under a generation prefix `URL/g-<id>/`, and `URL/dataset_metadata.json`
is then a redirect, the commit point of the replacement:

    {"format": "lmshard", "redirect": "g-20261124T201500-5f3a9c"}

A reader follows one redirect, and reads every other file of the dataset under the prefix it
names. The objects of a generation never change after its metadata is written.

Memory model: the metadata (a few hundred bytes per shard) and the small files asked for.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ..errors import FormatError
from ..format import METADATA_FILE, REGENERATE_HINT, DatasetMeta, parse_metadata
from ..format.files import MAX_METADATA_BYTES
from .objects import Remote
from .retry import RemoteError, Retry, bucket_of
from .urls import redact

GENERATION = re.compile(r"g-[A-Za-z0-9-]{1,64}")


def generation_of(raw: Any) -> str | None:
    """The generation a redirect names; None for ordinary metadata."""
    if isinstance(raw, dict) and set(raw) == {"format", "redirect"} and raw.get("format") == "lmshard":
        target = raw["redirect"]
        if isinstance(target, str) and GENERATION.fullmatch(target):
            return target
        raise FormatError(f"redirect {target!r} is not a generation prefix (g-...)")
    return None


def read_json(remote: Remote, rel: str, limit: int = MAX_METADATA_BYTES) -> Any:
    """A JSON object of the dataset; FormatError naming its URL when it is missing or not JSON."""
    try:
        data = remote.read(rel, limit)
    except RemoteError as e:
        if "check the URL" in str(e) and not remote.exists(rel):
            if remote.bucket_missing():
                raise FormatError(f"{redact(remote.url)}: the bucket {bucket_of(remote.url)} does not exist; check "
                                  "the bucket's name in the URL") from None  # fmt: skip
            raise FormatError(f"{redact(remote.url_of(rel))}: missing; not an lmshard dataset, or not finished "
                              "(create one with `lmshard prepare --out URL`)") from None  # fmt: skip
        raise
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise FormatError(f"{redact(remote.url_of(rel))}: unreadable ({e}); {REGENERATE_HINT}") from None


def open_remote(url: str, options: dict[str, Any] | None = None,
                retry: Retry | None = None) -> tuple[DatasetMeta, Remote]:  # fmt: skip
    """(metadata, the objects of the dataset's current generation) of the dataset at `url`."""
    remote = Remote(url, options, retry)
    raw = read_json(remote, METADATA_FILE)
    try:
        generation = generation_of(raw)
    except FormatError as e:
        raise FormatError(f"{redact(remote.url_of(METADATA_FILE))}: {e}; {REGENERATE_HINT}") from None
    if generation is not None:
        remote = Remote(remote.url_of(generation), options, retry)
        raw = read_json(remote, METADATA_FILE)
        if isinstance(raw, dict) and "redirect" in raw:
            raise FormatError(f"{redact(remote.url_of(METADATA_FILE))}: a redirect to a redirect; {REGENERATE_HINT}")
    try:
        meta = parse_metadata(Path("."), raw)
    except FormatError as e:
        raise FormatError(f"{redact(remote.url)}/{e}") from None
    return meta, remote
