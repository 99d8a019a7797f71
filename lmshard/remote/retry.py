"""Retries of remote requests: transient errors are tried again after an exponential backoff with
full jitter, up to a budget; then one line names the URL, the attempts and the fix.

Transient: timeouts, refused or dropped connections, HTTP 5xx, 429 and the stores' throttling
codes (SlowDown, Throttling, RequestTimeout). Anything else (a missing object, a refused
credential, a bad request) fails at once, with its own fix.

The policy holds its clock: `Retry(sleep=..., random=..., clock=...)` lets a test drive the
waits without waiting. Each attempt is also bounded by the client's own timeouts (for S3:
connect 5 s, read 20 s), so a store that stops answering is given up on in about
attempts × 25 s plus the waits. `LMSHARD_REMOTE_ATTEMPTS` (default 6) sets the budget for a whole run.

Memory model: nothing beyond the call's own result.
"""

from __future__ import annotations

import os
import random as _random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ..errors import LmshardError
from .urls import OPTIONS_VARIABLE, redact

T = TypeVar("T")
ATTEMPTS_VARIABLE = "LMSHARD_REMOTE_ATTEMPTS"
MISSING_FIX = "check the URL"

_TRANSIENT_NAMES = {
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ClientConnectionError", "ClientConnectorError", "ClientOSError", "ServerDisconnectedError",
    "ClientPayloadError", "ServerTimeoutError", "IncompleteReadError", "ResponseStreamingError",
    "ProxyConnectionError", "HTTPClientError", "ClientConnectorDNSError",
}  # fmt: skip
_TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
                    "InternalError", "ServiceUnavailable", "TooManyRequests", "RequestLimitExceeded"}  # fmt: skip


# The store's client refused the call itself (a bad option, bucket name or endpoint): no retry helps.
_CONFIG_NAMES = {"ParamValidationError", "InvalidS3AddressingStyleError", "InvalidEndpointConfigurationError",
                 "InvalidRegionError", "InvalidConfigError", "InvalidURL"}  # fmt: skip


class RemoteError(LmshardError):
    """A remote request that failed for good (after retries where it was transient)."""


class RemoteMissing(RemoteError):
    """The object is not there (HTTP 404, no such key)."""


def chain(e: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    at: BaseException | None = e
    while at is not None and at not in seen and len(seen) < 8:
        seen.append(at)
        at = at.__cause__ or at.__context__
    return seen


def _status(e: BaseException) -> tuple[int | None, str]:
    """(HTTP status, error code) of a botocore ClientError or an aiohttp response error."""
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
        return response.get("ResponseMetadata", {}).get("HTTPStatusCode"), code
    status = getattr(e, "status", None)
    return (status if isinstance(status, int) else None), ""


def transient(e: BaseException) -> bool:
    """Whether another attempt may succeed: see the module docstring."""
    for err in chain(e):  # (an HTTP client's "not found" may wrap a refused connection: the cause decides)
        status, code = _status(err)
        if status is not None or code:
            return code in _TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429))
        if isinstance(err, TimeoutError | ConnectionError) or type(err).__name__ in _TRANSIENT_NAMES:
            return True
    return False


def no_bucket(e: BaseException) -> bool:
    """Whether the store said the URL's bucket does not exist (S3's NoSuchBucket, GCS's and
    Azure's own words for it)."""
    for err in chain(e):
        if _status(err)[1] in ("NoSuchBucket", "ContainerNotFound"):
            return True
        text = str(err)
        if "NoSuchBucket" in text or "specified bucket does not exist" in text or "ContainerNotFound" in text:
            return True
    return False


def bucket_of(url: str) -> str:
    """The bucket (container) of an object store URL: its host part."""
    return url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[2]


def unreached(e: BaseException) -> bool:
    """Whether a FileNotFoundError stands for a server that was not reached (its cause is a
    connection, TLS or name error), not for an object the server said is missing."""
    return transient(e) or any(_connector(err) for err in chain(e))


def _connector(err: BaseException) -> bool:
    return type(err).__name__.startswith("ClientConnector")  # aiohttp: no connection (refused, TLS, DNS)


def describe(e: BaseException) -> str:
    """The most specific one-line cause in the chain, credentials taken out."""
    for err in chain(e):
        status, code = _status(err)
        if status is not None or code:
            return redact(f"HTTP {status} {code if code != str(status) else ''}".strip())
        if isinstance(err, TimeoutError | ConnectionError) or type(err).__name__ in _TRANSIENT_NAMES or _connector(err):
            e = err  # the connection's own error, not what a client made of it
            break
    # The first line only: later ones may quote what was passed (a bucket "name" holding a key) unredacted.
    text = str(e).splitlines()[0].rstrip(": ") if str(e).strip() else type(e).__name__
    return redact(f"{type(e).__name__}: {text}"[:300])


def fix_for(e: BaseException) -> str:
    errors = chain(e)
    statuses = [_status(err)[0] for err in errors]
    names = {type(err).__name__ for err in errors}
    if names & {"NoCredentialsError", "PartialCredentialsError"} or {401, 403} & set(statuses) or any(
        isinstance(err, PermissionError) for err in errors
    ):
        return "check the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the store's own)"
    if any(_connector(err) and ("SSL" in type(err).__name__ or "Certificate" in type(err).__name__) for err in errors):
        return "the TLS handshake failed: check the URL's scheme (http:// or https://) and the server's certificate"
    if not unreached(e) and (404 in statuses or any(isinstance(err, FileNotFoundError) for err in errors)):
        return MISSING_FIX
    if any(isinstance(err, TypeError) for err in errors) or names & _CONFIG_NAMES:  # refused before any request
        return f"check the URL and the filesystem options ({OPTIONS_VARIABLE}, or storage_options=)"
    return f"check that the endpoint is reachable, then retry (more attempts: {ATTEMPTS_VARIABLE})"


@dataclass
class Retry:
    """Exponential backoff with full jitter: before attempt n+1 wait uniform(0, min(cap, base·2^n))."""

    attempts: int = field(default_factory=lambda: _env_attempts())
    base: float = 0.5
    cap: float = 20.0
    sleep: Callable[[float], None] = time.sleep
    random: Callable[[], float] = _random.random
    clock: Callable[[], float] = time.monotonic

    def call(self, url: str, what: str, fn: Callable[[], T]) -> T:
        """`fn()`, retried while it fails transiently; RemoteError (one line) after the budget."""
        started = self.clock()
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except LmshardError:
                raise  # already one line with its fix
            except Exception as e:
                if no_bucket(e):
                    raise RemoteMissing(f"{redact(url)}: {what} failed: the bucket {bucket_of(url)} does not exist "
                                        f"({describe(e)}); check the bucket's name in the URL, or create "
                                        "it") from None  # fmt: skip
                if not transient(e):
                    fix = fix_for(e)
                    kind = RemoteMissing if fix == MISSING_FIX else RemoteError
                    raise kind(f"{redact(url)}: {what} failed ({describe(e)}); {fix}") from None
                if attempt == self.attempts:
                    spent = self.clock() - started
                    tries = f"{attempt} attempt{'s' if attempt != 1 else ''}"
                    raise RemoteError(f"{redact(url)}: {what} failed after {tries} over {spent:.1f} s "
                                      f"({describe(e)}); {fix_for(e)}") from None  # fmt: skip
                self.sleep(self.random() * min(self.cap, self.base * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")


def _env_attempts() -> int:
    raw = os.environ.get(ATTEMPTS_VARIABLE, "6")
    try:
        return max(1, int(raw))
    except ValueError:
        raise LmshardError(f"{ATTEMPTS_VARIABLE}={raw!r}: not a whole number; set it to the attempts per "
                           "request") from None  # fmt: skip


def call(url: str, what: str, fn: Callable[[], T], policy: Retry | None = None) -> T:
    return (policy or Retry()).call(url, what, fn)
