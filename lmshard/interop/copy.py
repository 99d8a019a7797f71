"""`lmshard cp SRC DST`: a dataset copied between local directories and object stores, with the
commit protocol of `prepare --out URL` on the way up and checked files on the way down.

- **To a URL** (`publish.Publisher`): the source's files are linked (or copied) into the
  publisher's local mirror, each held to the checksum its metadata records, then uploaded, data
  first, with the metadata written last as the commit. A reader of DST sees the old dataset or
  the new one, never a mix; a copy that fails or is killed leaves DST as it was. The same copy
  run again goes on from the files it sent (each held to its checksum); another copy or prepare
  there removes what it uploaded, as after an interrupted prepare.
- **From a URL** (`inspect.remote.download`): every file is fetched and held to its checksum,
  into a directory beside DST that replaces it only when complete (`output.staged_output`).
- **Local to local**: the same staged directory, each file held to its checksum.
- URL to URL downloads into the upload's local mirror (one local copy), then uploads it.

An existing DST is refused unless `force`.

Memory model: one file's copy or transfer at a time (streamed), and the dataset's metadata.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import xxhash

from ..errors import ConfigError, FormatError
from ..format import METADATA_FILE, DatasetMeta, dataset_files, file_checksums, file_xxh3, load_metadata
from ..remote.urls import is_url, redact
from .output import staged_output


def copy_dataset(src: str, dst: str, *, force: bool = False) -> DatasetMeta:
    """Copy the dataset at `src` to `dst` (local directories or URLs; see the module docstring)."""
    if src.rstrip("/") == dst.rstrip("/"):
        raise ConfigError(f"{redact(dst)}: the source and the destination are the same")
    if is_url(src):
        if is_url(dst):  # fetched straight into the upload's local mirror: one local copy
            from ..remote.dataset import open_remote

            return _upload(dst, force, _identity(open_remote(src)[0]), lambda mirror: _download(src, mirror))
        with staged_output(dst, force, []) as staging:
            _download(src, staging)
        return load_metadata(dst)
    if is_url(dst):
        meta = load_metadata(src)
        return _upload(dst, force, _identity(meta), lambda mirror: _place(meta, Path(src), mirror, link=True))
    meta = load_metadata(src)
    with staged_output(dst, force, [Path(src)]) as staging:
        _place(meta, Path(src), staging, link=False)
    return load_metadata(dst)


def _download(url: str, dest: Path) -> DatasetMeta:
    from ..inspect.remote import download

    dest.mkdir(parents=True, exist_ok=True)
    return download(url, dest)


def copy_left(url: str, source: str) -> bool:
    """Whether an interrupted copy of `source` to `url`, from this machine, left uploads to go on
    from (a copy run again resumes: only the files not yet sent with these bytes are sent)."""
    from ..prepare.output.journal import JOURNAL, Journal, work_root

    stale = Journal.load(work_root(url.rstrip("/")) / JOURNAL)
    return bool(source) and stale is not None and stale.state.get("source") == source


def _identity(meta: DatasetMeta) -> str:
    """The source dataset's identity (its metadata's digest): a copy of the same dataset to the
    same URL, interrupted and run again, goes on from the files it sent."""
    return xxhash.xxh3_64_hexdigest(json.dumps(meta.to_json(), sort_keys=True).encode())


def _upload(url: str, force: bool, source: str, fill: Callable[[Path], object]) -> DatasetMeta:
    """Publish to `url` the dataset that `fill` puts in the publisher's local mirror; resume an
    interrupted copy of the same `source` there (each file held to its checksum, so a file is
    sent again unless the journal has it with the same bytes)."""
    from ..prepare.output.publish import Publisher

    publisher = Publisher(url, overwrite=force, resume=copy_left(url, source), hint="pass --force to replace it",
                          resumable=False, source=source)  # fmt: skip
    publisher.claim()
    try:
        if publisher.mirror.exists():
            shutil.rmtree(publisher.mirror)
        fill(publisher.mirror)
        placed = load_metadata(publisher.mirror)
    except BaseException:  # (nothing uploaded yet: the prefix is left as it was, unlocked)
        publisher.abandon()
        raise
    publisher.publish(placed)
    return placed


def _place(meta: DatasetMeta, src: Path, dest: Path, link: bool) -> None:
    """Every file of the dataset in `dest` (hard links where `link` and possible, else copies),
    each held to the checksum its metadata records; the metadata last."""
    sums = file_checksums(meta)
    for rel in dataset_files(meta):
        if rel == METADATA_FILE:
            continue
        source, target = src / rel, dest / rel
        if not source.is_file():  # (every file the metadata names, checksummed or not: the vocabulary too)
            raise FormatError(f"{source}: missing; the dataset is not whole (run `lmshard inspect {src}`)")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            if not link:
                raise OSError
            os.link(source, target)
        except OSError:  # (another filesystem, or a copy asked for)
            shutil.copyfile(source, target)
        if rel in sums and file_xxh3(target) != sums[rel]:
            raise FormatError(f"{source}: its checksum differs from the metadata's (damaged); run "
                              f"`lmshard inspect {src}`")  # fmt: skip
    shutil.copyfile(src / METADATA_FILE, dest / METADATA_FILE)
