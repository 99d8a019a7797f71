"""URLs of object stores and web servers, and the fsspec filesystem that reads each.

`s3://`, `gs://` (`gcs://`), `az://` (`abfs://`, `abfss://`), `hf://` and `http(s)://` are URLs;
anything else is a local path (`hf:NAME`, one colon and no slashes, stays a Hugging Face dataset
name). Each scheme is read by its fsspec package, an optional extra: a missing one is one line
naming the extra to install.

Credentials come from where each package looks already (for S3: the AWS_* variables,
~/.aws/credentials, instance roles; `AWS_ENDPOINT_URL` for an S3-compatible server), and
`LMSHARD_STORAGE_OPTIONS` (JSON) passes options through to the filesystem. They never appear in
what lmshard prints or records: `redact` takes user names, passwords and signed query strings out
of every URL it shows.

Memory model: one cached filesystem object per scheme and options (fsspec's own cache).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ..errors import ConfigError, missing_dependency

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# scheme -> (fsspec protocol, package that provides it, lmshard extra)
SCHEMES = {
    "s3": ("s3", "s3fs", "s3"), "s3a": ("s3", "s3fs", "s3"),
    "gs": ("gs", "gcsfs", "gcs"), "gcs": ("gs", "gcsfs", "gcs"),
    "az": ("az", "adlfs", "azure"), "abfs": ("abfs", "adlfs", "azure"), "abfss": ("abfs", "adlfs", "azure"),
    "hf": ("hf", "huggingface_hub", "hf"),
    "http": ("http", "aiohttp", "http"), "https": ("https", "aiohttp", "http"),
}  # fmt: skip
OPTIONS_VARIABLE = "LMSHARD_STORAGE_OPTIONS"


def scheme_of(text: str) -> str | None:
    """The scheme of anything written `scheme://...` (lower case), lmshard's or not; else None."""
    m = _SCHEME.match(text)
    return m.group(1).lower() if m else None


def is_url(text: object) -> bool:
    """True for a URL of a scheme lmshard reads remotely (see SCHEMES)."""
    return isinstance(text, str) and scheme_of(text) in SCHEMES


WRITABLE = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")  # schemes a dataset can be written to
_LOOKS_LIKE_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")  # s3://b, and s3:/b (a URL that went through Path)


def local_only(text: str | os.PathLike[str], what: str) -> None:
    """ConfigError when `text`, where `what` needs a local path, is (or was) a URL."""
    if _LOOKS_LIKE_URL.match(str(text)):
        raise ConfigError(f"{what} {redact(str(text))}: takes a local path, not a URL")


def output_url(text: str) -> bool:
    """Whether an output names a URL (True) or a local directory (False); ConfigError for a URL of
    a scheme datasets cannot be written to, rather than a local directory named 'ftp:'."""
    if not _LOOKS_LIKE_URL.match(text):
        return False
    if is_url(text) and scheme(text) in WRITABLE:
        return True
    raise ConfigError(f"--out {redact(text)}: datasets are written to a directory or to "
                      f"{', '.join(s + '://' for s in ('s3', 'gs', 'az'))} URLs")  # fmt: skip


def scheme(url: str) -> str:
    m = _SCHEME.match(url)
    if m is None:
        raise ConfigError(f"{redact(url)}: not a URL")
    return m.group(1).lower()


def join(url: str, rel: str) -> str:
    """`rel` (a dataset-relative path, '/'-separated) under `url`."""
    return url.rstrip("/") + "/" + rel.lstrip("/") if rel else url.rstrip("/")


# A URL's user and password, wherever the URL stands in the text (after a quote, a bracket, "input="): up to
# the last "@" before the first "/", so a password that holds "@" or "'" is masked whole.
_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*)://([^/\s\"<>]*)@")
_SECRET_QUERY = re.compile(r"([?&](?:X-Amz-[A-Za-z-]+|X-Goog-[A-Za-z-]+|sig|signature|se|sp|sv|token|access_token|"
                           r"key)=)[^&\s\"<>]*", re.IGNORECASE)  # fmt: skip
# Where NAME@ names, and does not authenticate: Azure's container@account (abfss://data@acct.dfs.core.windows.net/x)
# and a Hub repository's revision (hf://gpt2@main/config.json).
_NAME_AT = ("az", "abfs", "abfss", "hf")


def _mask_userinfo(m: re.Match[str]) -> str:
    scheme_, userinfo = m.group(1), m.group(2)
    if scheme_.lower() in _NAME_AT and ":" not in userinfo:
        return m.group(0)
    return f"{scheme_}://***@"


def redact(text: str) -> str:
    """`text` with credentials taken out of any URL in it: user and password, and signed query
    parameters (S3 presigned X-Amz-*, GCS signed X-Goog-*, Azure SAS sig/se/sp, tokens)."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub(_mask_userinfo, text))


def has_credentials(text: str) -> bool:
    """Whether `text` holds a URL's user, password or signed query parameters (see redact)."""
    return redact(text) != text


def storage_options(url: str, given: dict[str, Any] | None = None) -> dict[str, Any]:
    """Options for the URL's filesystem: `given` (the Python API's `storage_options=`), else
    LMSHARD_STORAGE_OPTIONS (a JSON object, or an object of objects keyed by scheme)."""
    if given is not None:
        return dict(given)
    raw = os.environ.get(OPTIONS_VARIABLE)
    if not raw:
        return {}
    try:
        options = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"{OPTIONS_VARIABLE}: not JSON ({e}); set it to a JSON object of filesystem "
                          "options") from None  # fmt: skip
    if not isinstance(options, dict):
        raise ConfigError(f"{OPTIONS_VARIABLE}: not a JSON object; set it to a JSON object of filesystem options")
    name = scheme(url)
    if name in options and isinstance(options[name], dict):
        return dict(options[name])
    return {k: v for k, v in options.items() if k not in SCHEMES}


def filesystem(url: str, options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """(fsspec filesystem, the URL's path within it) for a remote URL.

    The filesystem makes one attempt per request: `retry.call` owns retries (backoff, jitter, a
    budget and one line at the end), so a dead endpoint is not retried by three layers at once."""
    name = scheme(url)
    protocol, package, extra = SCHEMES[name]
    if name in ("s3", "s3a", "gs", "gcs") and _USERINFO.match(url):
        raise ConfigError(f"{redact(url)}: a {name}:// URL takes no user or password; give the store's credentials "
                          f"where its package looks for them (for S3: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                          f"AWS_PROFILE) or in {OPTIONS_VARIABLE}")  # fmt: skip
    try:
        import fsspec
    except ImportError:
        raise missing_dependency("fsspec", extra, f"{redact(url)}: {name}://") from None
    kwargs = _merged(_single_attempt(protocol), storage_options(url, options))
    try:
        fs = fsspec.filesystem(protocol, **kwargs)
    except ImportError:
        raise missing_dependency(package, extra, f"{redact(url)}: {name}://") from None
    if protocol == "s3":
        fs.retries = 1  # s3fs's own retry loop (class attribute, 5 by default)
    path = fs._strip_protocol(url) if protocol not in ("http", "https") else url
    return fs, path


def _single_attempt(protocol: str) -> dict[str, Any]:
    """lmshard's defaults for a scheme: one attempt per request, and enough connections for the
    loader's concurrent ranged reads (botocore's default pool holds 10)."""
    if protocol == "s3":
        return {"config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}, "connect_timeout": 5,
                                  "read_timeout": 20, "max_pool_connections": 64}}  # fmt: skip
    return {}


def _merged(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`given` over `defaults`, nested dicts (config_kwargs, client_kwargs) merged key by key."""
    out = dict(defaults)
    for key, value in given.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
