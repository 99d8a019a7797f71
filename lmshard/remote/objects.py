"""Objects under one URL prefix (a remote dataset, or the folder of a remote input), read and
written through fsspec with `retry.Retry` around every request.

Paths given to `Remote`'s methods are relative to its prefix and '/'-separated, like a
dataset's own relative paths. `read_ranges` sends its ranges concurrently (fsspec's
`cat_ranges`), which is how the remote loader fetches the blocks of the next steps in one round.

Memory model: only the bytes asked for (whole small objects, or the requested ranges).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .retry import RemoteError, Retry, unreached
from .urls import filesystem, join, redact


def ranges_ignored(url: str, got: int, asked: int) -> RemoteError:
    return RemoteError(f"{redact(url)}: the server ignores byte ranges (it sent {got:,} bytes for a range of "
                       f"{asked:,}); serve the dataset from an object store, or a web server that answers Range "
                       "requests")  # fmt: skip


class Remote:
    """The objects under `url` (a prefix: 's3://bucket/datasets/fineweb')."""

    def __init__(self, url: str, options: dict[str, Any] | None = None, retry: Retry | None = None) -> None:
        self.url = url.rstrip("/")
        self.fs, self.path = filesystem(self.url, options)
        self.path = self.path.rstrip("/")
        self.retry = retry or Retry()
        self.options = options

    def __repr__(self) -> str:
        return f"Remote({redact(self.url)!r})"

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers: each process builds its own filesystem
        return {"url": self.url, "options": self.options, "retry": self.retry}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["options"], state["retry"])  # type: ignore[misc]

    def full(self, rel: str) -> str:
        """The filesystem path of `rel`."""
        return self.path + "/" + rel if rel else self.path

    def url_of(self, rel: str) -> str:
        return join(self.url, rel)

    def _call(self, rel: str, what: str, fn: Any) -> Any:
        return self.retry.call(self.url_of(rel), what, fn)

    def read(self, rel: str, limit: int | None = None) -> bytes:
        """A whole object; RemoteError when it holds more than `limit` bytes."""
        if limit is not None and self.size(rel) > limit:
            raise RemoteError(f"{redact(self.url_of(rel))}: more than {limit:,} bytes, larger than any lmshard file "
                              "of this kind; check the URL")  # fmt: skip
        return bytes(self._call(rel, "GET", lambda: self.fs.cat_file(self.full(rel))))

    def read_range(self, rel: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object."""
        def get() -> bytes:
            data = bytes(self.fs.cat_file(self.full(rel), start=start, end=end))
            if len(data) > end - start:
                raise ranges_ignored(self.url_of(rel), len(data), end - start)
            return data

        return bytes(self._call(rel, f"GET bytes {start}-{end - 1}", get))

    def read_ranges(self, rels: Sequence[str], starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
        """Several ranges at once, sent concurrently; each must come back whole. An attempt after
        a failure asks again only for the ranges that did not come back."""
        if not rels:
            return []
        paths = [self.full(r) for r in rels]
        got: dict[int, bytes] = {}

        def fetch() -> list[bytes]:
            todo = [i for i in range(len(rels)) if i not in got]
            data = self.fs.cat_ranges([paths[i] for i in todo], [starts[i] for i in todo], [ends[i] for i in todo],
                                      on_error="return")  # fmt: skip
            failed: BaseException | None = None
            for i, d in zip(todo, data, strict=True):
                a, b = starts[i], ends[i]
                if isinstance(d, BaseException):
                    failed = failed or d
                elif len(d) > b - a:
                    raise ranges_ignored(self.url_of(rels[i]), len(d), b - a)
                elif len(d) != b - a:
                    failed = failed or ConnectionError(f"short read: {len(d)} of {b - a} bytes")
                else:
                    got[i] = bytes(d)
            if failed is not None:
                raise failed
            return [got[i] for i in range(len(rels))]

        others = len(set(rels)) - 1  # the error names the first object, and counts the others
        what = f"GET {len(rels)} range" + ("s" if len(rels) != 1 else "") + (
            f" (with {others} other objects)" if others else "")
        return self._call(rels[0], what, fetch)  # type: ignore[no-any-return]

    def size(self, rel: str) -> int:
        return int(self._call(rel, "HEAD", lambda: self.fs.size(self.full(rel))))

    def exists(self, rel: str) -> bool:
        def probe() -> bool:
            try:
                self.fs.info(self.full(rel))
                return True
            except FileNotFoundError as e:
                if unreached(e):  # an HTTP client's "not found" for a server it never reached
                    raise
                return False

        return bool(self._call(rel, "HEAD", probe))

    def bucket_missing(self) -> bool:
        """Whether the URL's bucket does not exist (s3://, gs://, az:// only; False when that
        cannot be told)."""
        if self.url.split("://", 1)[0] not in ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"):
            return False
        try:
            return not self.fs.exists(self.path.split("/", 1)[0])
        except Exception:  # (no permission to look: not a verdict)
            return False

    def listing(self, rel: str = "") -> dict[str, int]:
        """{relative path: size} of every object under `rel` (recursively)."""
        base = self.full(rel).rstrip("/")

        def walk() -> dict[str, int]:
            try:
                found = self.fs.find(base, detail=True)
            except FileNotFoundError:
                return {}
            return {p[len(self.path) + 1 :]: int(info.get("size") or 0) for p, info in found.items()
                    if info.get("type") != "directory" and p.startswith(self.path + "/")}  # fmt: skip

        self.fs.invalidate_cache()
        return dict(self._call(rel, "LIST", walk))

    def put(self, rel: str, data: bytes) -> None:
        self._call(rel, "PUT", lambda: self.fs.pipe_file(self.full(rel), data))

    def put_file(self, rel: str, local: Path) -> None:
        self._call(rel, "PUT", lambda: self.fs.put_file(str(local), self.full(rel)))

    def create(self, rel: str, data: bytes) -> bool:
        """Write `rel` only if no object has that name (a conditional put, If-None-Match: * on
        S3): True if written, False if one was there already."""
        def put() -> bool:
            try:
                self.fs.pipe_file(self.full(rel), data, mode="create")
            except FileExistsError:
                return False
            return True

        return bool(self._call(rel, "conditional PUT", put))

    def delete(self, rels: Sequence[str]) -> None:
        """Remove objects; ones already gone are not an error."""
        for rel in rels:
            def remove(rel: str = rel) -> None:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(self.full(rel))

            self._call(rel, "DELETE", remove)
