"""Which objects a URL input names: the object itself, a glob's matches (`s3://bucket/data/*.jsonl.gz`,
`**` included), or every object under a prefix, walked as a local directory is (`walk.py`'s rules:
hidden entries, lmshard's own datasets and work entries, and files of unknown type are left out and
counted, `--exclude` matches the URL). Each becomes a `Source` with its size and ETag (or
modification time) from the listing, so planning needs no request per object.

Every listing goes through the retry policy; a URL that names nothing is one line with the fix.
An `https://` server lists nothing: name its files one by one.

Memory model: the listing of one input (a few hundred bytes per object; the run needs its paths).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any
from urllib.parse import urlsplit

from ...errors import InputError
from ...format import IN_PROGRESS_FILE, METADATA_FILE, TOKENIZER_FILE
from ...remote.retry import Retry, unreached
from ...remote.urls import filesystem, redact, scheme
from .files import Source, kind_of
from .walk import Rules, Walk, describe, skipped_fix

_MAGIC = re.compile(r"[*?\[]")
# Where a listing's entry keeps what identifies this version of the object, by filesystem:
# S3's, Azure's and a web server's ETag, GCS's generation and md5, the Hub's blob id, a web
# server's Content-MD5 or Digest, else a modification time.
_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "blob_id", "Content-MD5", "Digest", "LastModified",
                 "last_modified", "Last-Modified", "mtime", "updated")  # fmt: skip
Listing = dict[str, dict[str, Any]]  # path or URL → its listing entry (size, ETag, ...)


def find_url(spec: str, rules: Rules) -> tuple[Walk, Listing]:
    """The objects `spec` names, as a walk of their URLs (sorted), and each one's listing entry."""
    fs, path = filesystem(spec)
    retry = Retry()
    fs.invalidate_cache()  # a listing made earlier in this process may be stale
    if _MAGIC.search(_path_part(spec)):
        entries = retry.call(spec, "LIST", lambda: fs.glob(path, detail=True))
        files = {p: e for p, e in dict(entries).items() if e.get("type") != "directory"}
        urls = {_url_of(spec, path, fs, p): e for p, e in files.items() if _visible(p, path, rules)}
        return Walk(rules).take(sorted(urls)), urls
    info = retry.call(spec, "HEAD", lambda: _info(fs, path))
    if info is not None and info.get("type") != "directory":
        return Walk(rules).take([spec]), {spec: info}
    if scheme(spec) in ("http", "https"):
        return Walk(rules), {}
    listed = retry.call(spec, "LIST", lambda: _find(fs, path))
    return _walk(spec, path, fs, listed, rules)


def _info(fs: Any, path: str) -> dict[str, Any] | None:
    try:
        return dict(fs.info(path))
    except FileNotFoundError as e:
        if unreached(e):  # an HTTP client's "not found" for a server never reached: retried or named, not "missing"
            raise
        return None


def _find(fs: Any, path: str) -> Listing:
    try:
        return dict(fs.find(path, detail=True))
    except FileNotFoundError as e:
        if unreached(e):
            raise
        return {}


def _path_part(url: str) -> str:
    """The part of a URL that names the object (an https URL's query may hold '?' or '[')."""
    parts = urlsplit(url)
    return parts.netloc + parts.path if scheme(url) in ("http", "https") else url


def _url_of(spec: str, path: str, fs: Any, found: str) -> str:
    """The URL of an object a listing of `spec` (whose filesystem path is `path`) found, spelt
    as the input was (its scheme, any credentials of an https URL)."""
    spec, path = spec.rstrip("/"), path.rstrip("/")
    if spec.endswith(path):
        return spec[: len(spec) - len(path)] + found
    return str(fs.unstrip_protocol(found))


def _visible(found: str, pattern: str, rules: Rules) -> bool:
    """Whether a glob's match is taken as `glob.glob` takes it: `*` matches no hidden name (one
    starting with ".") unless --include-hidden, or unless the pattern spells the dot itself."""
    if rules.include_hidden:
        return True
    root = pattern[: _MAGIC.search(pattern).start()].rpartition("/")[0]  # type: ignore[union-attr]
    if any(part.startswith(".") for part in pattern[len(root) :].split("/")):
        return True
    return not any(part.startswith(".") for part in found[len(root) :].split("/"))


def _walk(spec: str, path: str, fs: Any, listed: Listing, rules: Rules) -> tuple[Walk, Listing]:
    """The objects under a prefix as `walk.walk` takes a directory's files: hidden and lmshard
    "directories" are not entered (each counted once), nor datasets and builds."""
    found = Walk(rules)
    root = path.rstrip("/")
    files = {p[len(root) + 1 :]: e for p, e in listed.items() if e.get("type") != "directory" and
             p.startswith(root + "/")}  # fmt: skip
    children: dict[str, set[str]] = {}
    for rel in files:
        folder, _, name = rel.rpartition("/")
        children.setdefault(folder, set()).add(name)
    datasets = {d for d, names in children.items()
                if IN_PROGRESS_FILE in names or {METADATA_FILE, TOKENIZER_FILE} <= names}  # fmt: skip
    entered: dict[str, bool] = {}  # folder → whether the walk goes in (decided, and counted, once)
    infos: Listing = {}
    for rel in sorted(files):
        parts = rel.split("/")
        if not all(_enters(found, entered, datasets, parts[:depth]) for depth in range(len(parts))):
            continue
        url = _url_of(spec, path, fs, f"{root}/{rel}")
        found.consider_named(url, parts[-1])
        infos[url] = files[rel]
    found.taken.sort()
    return found, infos


def _enters(found: Walk, entered: dict[str, bool], datasets: set[str], parts: list[str]) -> bool:
    """Whether the walk goes into the folder `parts` (relative to the prefix): not a hidden or
    lmshard entry, not a dataset or build (each counted when first met)."""
    folder = "/".join(parts)
    if folder not in entered:
        enters = found.enters(parts[-1]) if parts else True
        if enters and folder in datasets:
            found.lmshard += 1
            enters = False
        entered[folder] = enters
    return entered[folder]


def url_source(url: str, info: dict[str, Any], fmt_override: str | None) -> Source:
    """The source of an object at `url`, from its listing entry: format and compression by its
    name, its size and version."""
    shown = redact(url)
    fmt, compression = kind_of(shown, posixpath.basename(urlsplit(url).path), fmt_override)
    size = info.get("size")
    if size is None:
        raise InputError(f"{shown}: the server does not say how large it is (no Content-Length), so it cannot be read "
                         "in ranges; serve it with its size, or copy it to local disk")  # fmt: skip
    version = next((str(info[k]) for k in _VERSION_KEYS if info.get(k) is not None), "")
    return Source(shown, fmt, compression, int(size), url=url, version=version)


def nothing_at_url(spec: str, found: Walk) -> InputError:
    """The error for a URL input that names no object to read: what was skipped and the fix."""
    shown = redact(spec)
    skipped = found.skipped()
    if skipped:
        return InputError(f"{shown}: nothing to read: skipped {describe(skipped)}; {skipped_fix(skipped)}")
    if _MAGIC.search(_path_part(spec)):
        return InputError(f"{shown}: no object matches this glob; check the URL and the pattern")
    if scheme(spec) in ("http", "https"):
        return InputError(f"{shown}: no such file on the server (an https server lists no directories: name each "
                          "file, or copy them to an object store); check the URL")  # fmt: skip
    bucket = _missing_bucket(spec)
    if bucket is not None:
        return InputError(f"{shown}: the bucket {bucket!r} does not exist (or these credentials cannot see it); check "
                          "the URL and the credentials")  # fmt: skip
    return InputError(f"{shown}: no such object, and no objects under it as a prefix; check the URL")


def _missing_bucket(spec: str) -> str | None:
    """The bucket (container) of an object-store URL when the store says it does not exist; None
    when it does, for schemes without buckets, and when the store cannot tell."""
    if scheme(spec) in ("http", "https", "hf"):
        return None
    try:
        fs, path = filesystem(spec)
        bucket = path.split("/", 1)[0]
        fs.info(bucket)  # (not exists(): it answers False for a refused credential or a dead endpoint too)
    except FileNotFoundError:
        return bucket
    except Exception:  # noqa: BLE001 (an error while explaining an error: keep the first one)
        return None
    return None
