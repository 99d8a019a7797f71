"""`lmshard inspect URL`, and local copies of remote datasets for `export`.

Verification runs the same checks as on a local dataset (verify.py), one shard at a time: the
dataset's small files (metadata, tokenizer state, vocabulary copy, dedup keys) and one shard's
files (token file, document index, block sums and, in zstd, block offsets) are fetched into a
temporary directory, checked in the dataset's encoding (each block held to its sum and decoded,
a damaged one named by shard and block), and deleted before the next shard. Every other file
stands there as a sparse placeholder of the size the store lists for it, so the size checks
compare the objects' real sizes. `--quick` fetches the document indexes (and block offsets,
8 bytes per block) only: no token data.

Memory model: as verify.py; on disk, the small files and one shard at a time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path

from ..errors import FormatError
from ..format import (
    METADATA_FILE,
    REGENERATE_HINT,
    DatasetMeta,
    ShardInfo,
    dataset_files,
    file_checksums,
    file_xxh3,
    load_metadata,
)
from ..remote import Remote, RemoteError, is_url, redact
from ..remote.dataset import open_remote
from .verify import Problem, Report, start_report, verify_dataset, verify_shard


def _fetch(remote: Remote, rel: str, dest: Path, size: int | None = None) -> None:
    """Download `rel` (of `size` bytes, where the listing gave it) to `dest` in 64 MiB ranges."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    size = remote.size(rel) if size is None else size
    with open(dest, "wb") as f:
        for at in range(0, size, 64 << 20):
            f.write(remote.read_range(rel, at, min(size, at + (64 << 20))))


def _placeholder(dest: Path, size: int) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as f:
        f.truncate(size)


def _sizes(remote: Remote, meta: DatasetMeta) -> dict[str, int]:
    sizes = {}
    for rel in dataset_files(meta):
        with contextlib.suppress(RemoteError):  # a missing file: the checks name it
            sizes[rel] = remote.size(rel)
    return sizes


def _small_files(meta: DatasetMeta) -> list[str]:
    shard_files = {f for s in meta.shards for f in s.files()}
    return [f for f in dataset_files(meta) if f not in shard_files]


def local_view(url: str, root: Path) -> tuple[DatasetMeta, Remote, dict[str, int]]:
    """Fill `root` with the dataset's small files and placeholders of the rest; return (its
    metadata there, the dataset's objects, {relative path: size} of its objects)."""
    meta, remote = open_remote(url)
    listing = remote.listing() or _sizes(remote, meta)  # a web server lists nothing: one HEAD per file
    for rel in _small_files(meta):
        if rel in listing:
            _fetch(remote, rel, root / rel, listing[rel])
    for shard in meta.shards:
        for rel in shard.files():
            if rel in listing:
                _placeholder(root / rel, listing[rel])
    return load_metadata(root), remote, listing


def verify_remote(url: str, quick: bool = False, on_shard: Callable[[ShardInfo], None] | None = None,
                  on_start: Callable[[int], None] | None = None) -> Report:  # fmt: skip
    """`verify_dataset` for a dataset at a URL: the same checks and report. The report's
    `meta.root` is a temporary directory with the dataset's small files (what decoding needs),
    removed with the report; its shards there are placeholders."""
    report = Report(root=redact(url), quick=quick)
    root = Path(tempfile.mkdtemp(prefix="lmshard-remote-"))
    weakref.finalize(report, shutil.rmtree, root, True)
    shown = redact(url)
    try:
        meta, remote, listing = local_view(url, root)
        shown = redact(remote.url)  # a replaced dataset's current generation
        if on_start:
            on_start(len(meta.shards))
        start_report(meta, report)
        for shard in meta.shards:
            small = (shard.index_path, shard.blocks_path)  # what --quick reads: never the tokens or their sums
            fetched = [r for r in shard.files() if r in listing and (not quick or r in small)]
            for rel in fetched:
                _fetch(remote, rel, root / rel, listing[rel])
            verify_shard(meta, shard, report)
            for rel in fetched:
                _placeholder(root / rel, listing[rel])  # the disk holds one shard at a time
            if on_shard:
                on_shard(shard)
    except FormatError as e:
        report.problems.append(Problem(redact(url), str(e), fix=""))
    _name_objects(report, root, shown)
    return report


def _name_objects(report: Report, root: Path, url: str) -> None:
    """Problems name the objects at the URL, not their copies in the temporary directory."""
    def named(text: str) -> str:
        return text.replace(f"{root}{os.sep}", f"{url}/").replace(str(root), url)

    report.problems[:] = [dataclasses.replace(p, where=named(p.where), what=named(p.what)) for p in report.problems]


def verify(root: str | Path, quick: bool = False, on_shard: Callable[[ShardInfo], None] | None = None,
           on_start: Callable[[int], None] | None = None) -> Report:  # fmt: skip
    """`verify_dataset` of a directory, `verify_remote` of a URL."""
    if is_url(str(root)):
        return verify_remote(str(root), quick, on_shard, on_start)
    return verify_dataset(root, quick, on_shard, on_start)


def download(url: str, dest: Path) -> DatasetMeta:
    """A local copy of the dataset at `url` in `dest` (export reads it), each file held to the
    checksum its metadata records."""
    meta, remote = open_remote(url)
    sums, sizes = file_checksums(meta), remote.listing() or _sizes(remote, meta)
    for rel in dataset_files(meta):
        if rel == METADATA_FILE:
            continue
        if rel not in sizes and rel not in sums:  # (a checksummed one is named by the fetch that fails)
            raise FormatError(f"{redact(remote.url_of(rel))}: missing; the dataset is not whole (run "
                              f"`lmshard inspect {redact(url)}`)")  # fmt: skip
        _fetch(remote, rel, dest / rel, sizes.get(rel))
        if rel in sums and file_xxh3(dest / rel) != sums[rel]:
            raise FormatError(f"{redact(remote.url_of(rel))}: its checksum differs from the metadata's (damaged); "
                              f"run `lmshard inspect {redact(url)}`; {REGENERATE_HINT}")  # fmt: skip
    _fetch(remote, METADATA_FILE, dest / METADATA_FILE)  # last, as a complete local dataset has it
    return load_metadata(dest)
