"""Where a Hugging Face tokenizer's files are: a tokenizer.json, a `save_pretrained` directory, or
a hub name (`org/name`, optionally `org/name@revision`) found in the local Hugging Face cache.

Hub names are looked up in the cache first, with huggingface_hub's own cache lookup, in the
directory huggingface_hub uses: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
`$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`, read when a tokenizer is
loaded (not when huggingface_hub was imported). The network is tried only when the name is not
cached and `HF_HUB_OFFLINE` is unset, and then only for the three small tokenizer files
(`TOKENIZER_FILES`), with bounded timeouts.

Memory model: nothing beyond a few paths; the files are read by the backend (an untrusted one
through `read_untrusted`: at most MAX_TOKENIZER_BYTES).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import TokenizerError
from ..format import MAX_TOKENIZER_BYTES

TOKENIZER_JSON = "tokenizer.json"
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
TOKENIZER_FILES = (TOKENIZER_JSON, *CONFIG_FILES)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_CONNECT_TIMEOUT_S = 5  # the reachability probe
_ETAG_TIMEOUT_S = 10  # one metadata request; huggingface_hub bounds each read of a download too
_TRUE = ("1", "on", "yes", "true")


@dataclass(frozen=True)
class Source:
    """The files of one tokenizer and where they came from."""

    kind: str  # "file", "directory" or "hub"
    tokenizer_json: Path
    configs: dict[str, Path] = field(default_factory=dict)  # the CONFIG_FILES present beside it
    repo_id: str | None = None
    revision: str | None = None  # as asked ("main" when not given)
    commit: str | None = None  # the snapshot the cache resolved it to

    def describe(self) -> dict[str, str | None]:
        if self.kind != "hub":
            return {"kind": self.kind}
        return {"kind": "hub", "repo_id": self.repo_id, "revision": self.revision, "commit": self.commit}


def hub_cache() -> Path:
    """The Hugging Face hub cache directory, by huggingface_hub's precedence of variables."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as set now, by huggingface_hub's reading of it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in _TRUE


def resolve(spec: str, *, untrusted: bool = False) -> Source:
    """The files for a `--tokenizer` value, or a one-line TokenizerError naming the fix.

    `untrusted`: the name comes from a dataset's metadata (`lmshard inspect` of someone else's
    dataset), so only a regular file of at most MAX_TOKENIZER_BYTES is read, alone (no config
    files beside it, no directory), and a hub name only from the local cache, never downloaded."""
    path = Path(spec).expanduser()
    if untrusted:
        return _untrusted(spec, path)
    if path.is_file():
        return Source("file", path, _configs(path.parent) if path.name == TOKENIZER_JSON else {})
    if path.is_dir():
        if not (path / TOKENIZER_JSON).is_file():
            raise TokenizerError(f"{spec}: directory holds no {TOKENIZER_JSON}; pass the directory written by "
                                 "save_pretrained (a 'fast' tokenizer) or the path of a tokenizer.json")  # fmt: skip
        return Source("directory", path / TOKENIZER_JSON, _configs(path))
    repo_id, revision = _hub_name(spec)
    return _from_hub(spec, repo_id, revision)


def _hub_name(spec: str) -> tuple[str, str]:
    """(repo id, revision) of a hub name; a TokenizerError for what can only be a missing path (a
    .json name, a leading . / or ~, more than one slash). `word/word` stays a hub name: the
    not-in-cache message also says to pass a path."""
    repo_id, _, revision = spec.partition("@")
    if spec.endswith(".json") or not _REPO_ID.match(repo_id):
        raise TokenizerError(f"{spec}: no such file or directory (and not a hub name such as org/name)")
    return repo_id, revision or "main"


def _untrusted(spec: str, path: Path) -> Source:
    try:
        info = path.stat()
    except (OSError, ValueError):
        info = None
    if info is not None:
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_TOKENIZER_BYTES:
            raise _refused(spec)
        return Source("file", path, {})
    repo_id, revision = _hub_name(spec)
    found = _cached(repo_id, revision, hub_cache())
    if found is None:
        raise TokenizerError(_not_cached(spec, repo_id, revision, hub_cache(), "inspect never downloads"))
    return replace(found, configs={})


def _refused(spec: str | Path) -> TokenizerError:
    return TokenizerError(f"{spec}: not read: a dataset may name only a regular file of at most "
                          f"{MAX_TOKENIZER_BYTES >> 20} MiB as its tokenizer")  # fmt: skip


def read_untrusted(path: Path) -> bytes:
    """The bytes of the tokenizer file `resolve(..., untrusted=True)` chose, held to its checks
    again on the file opened and the bytes read: the dataset's owner may have swapped in a FIFO
    (opened without waiting for a writer, then refused) or a larger file since. OSError when it
    cannot be opened."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_TOKENIZER_BYTES:
            raise _refused(path)
        data = f.read(info.st_size + 1)  # one byte more tells a file that grew since fstat
    if len(data) > info.st_size:
        raise _refused(path)
    return data


def _configs(directory: Path) -> dict[str, Path]:
    return {name: directory / name for name in CONFIG_FILES if (directory / name).is_file()}


def _from_hub(spec: str, repo_id: str, revision: str) -> Source:
    cache = hub_cache()
    found = _cached(repo_id, revision, cache)
    if found is not None:
        return found
    if offline():
        raise TokenizerError(_not_cached(spec, repo_id, revision, cache, "HF_HUB_OFFLINE is set"))
    unreachable = _unreachable()
    if unreachable:
        raise TokenizerError(_not_cached(spec, repo_id, revision, cache, f"and {unreachable}"))
    return _download(spec, repo_id, revision, cache)


def _unreachable() -> str | None:
    """Why the hub cannot be reached, found with one bounded TCP connect. huggingface_hub retries a
    failed request five times with backoff (about 25 s); an air-gapped machine should hear at once."""
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "", endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        return f"the hub ({host}) is unreachable: {e.strerror or type(e).__name__}"
    return None


def _cached(repo_id: str, revision: str, cache: Path) -> Source | None:
    """The cached snapshot's files, looked up as huggingface_hub does (refs → snapshot), no network."""
    from huggingface_hub import try_to_load_from_cache

    hit = try_to_load_from_cache(repo_id, TOKENIZER_JSON, cache_dir=cache, revision=revision)
    if not isinstance(hit, str):  # None, or the marker of a file known not to exist upstream
        return None
    path = Path(hit)
    return Source("hub", path, _configs(path.parent), repo_id, revision, commit=path.parent.name)


def _not_cached(spec: str, repo_id: str, revision: str, cache: Path, why: str) -> str:
    rev = f" --revision {revision}" if revision != "main" else ""
    return (f"{spec}: tokenizer not in the local Hugging Face cache {cache} ({why}); on a connected machine run "
            f"`hf download {repo_id} {' '.join(TOKENIZER_FILES)}{rev}` and copy its cache "
            f"(~/.cache/huggingface/hub) here, pointing HF_HOME or HF_HUB_CACHE at it, "
            f"or pass the path of a tokenizer.json")  # fmt: skip


def _download(spec: str, repo_id: str, revision: str, cache: Path) -> Source:
    """Fetch only the tokenizer files (tokenizer.json required, the configs when they exist)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    def fetch(name: str) -> Path:
        return Path(hf_hub_download(repo_id, name, revision=revision, cache_dir=cache, etag_timeout=_ETAG_TIMEOUT_S))

    try:
        main = fetch(TOKENIZER_JSON)
        for name in CONFIG_FILES:
            with contextlib.suppress(RemoteEntryNotFoundError):  # optional: many repos ship tokenizer.json alone
                fetch(name)
    except (OSError, ValueError) as e:  # hub errors are OSErrors; a bad revision name is a ValueError
        raise TokenizerError(_download_failed(spec, repo_id, revision, cache, e)) from None
    return Source("hub", main, _configs(main.parent), repo_id, revision, commit=main.parent.name)


def _download_failed(spec: str, repo_id: str, revision: str, cache: Path, error: Exception) -> str:
    from huggingface_hub.errors import (
        GatedRepoError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    login = "log in (`hf auth login` or HF_TOKEN), or pass the path of a tokenizer.json"
    if isinstance(error, GatedRepoError):  # before its base class, RepositoryNotFoundError
        return f"{spec}: a gated repository; accept its terms at https://huggingface.co/{repo_id}, then {login}"
    if isinstance(error, RepositoryNotFoundError):
        return f"{spec}: no such repository on the hub, or a private one; check the name, or {login}"
    if isinstance(error, RevisionNotFoundError):
        return f"{spec}: the hub has no revision {revision!r} of {repo_id}"
    if isinstance(error, RemoteEntryNotFoundError):
        return (f"{spec}: the repository has no {TOKENIZER_JSON} (a slow-only tokenizer); convert it with "
                "transformers' AutoTokenizer.from_pretrained(...).save_pretrained(DIR) and pass DIR")  # fmt: skip
    return _not_cached(spec, repo_id, revision, cache, f"and the download failed: {type(error).__name__}")
