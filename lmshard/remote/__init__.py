"""Object stores and web servers: URLs (`urls`), retries (`retry`) and objects under a prefix
(`objects`). fsspec and its filesystem packages are imported only when a URL is used.

See docs/remote.md for the user's view: inputs from URLs, `prepare --out s3://...`, and the
loader on remote datasets.
"""

from .objects import Remote
from .retry import RemoteError, Retry
from .urls import is_url, join, redact

__all__ = ["Remote", "RemoteError", "Retry", "is_url", "join", "redact"]
