"""The embedded demo corpus: the Python standard library's own sources, present wherever
Python is (about 30 MB of real code, docstrings and comments; ~1,800 files), so `make demo`
and `lmshard prepare --demo` need no download. Third-party packages are excluded.
"""

from __future__ import annotations

import sysconfig
from typing import Any


def DEMO_DEFAULTS() -> dict[str, Any]:  # noqa: N802 (reads like the constant it stands for)
    """Prepare options for the demo; explicit flags still win over these."""
    return {
        "inputs": [sysconfig.get_paths()["stdlib"]],
        "exclude": ["*/site-packages/*", "*/dist-packages/*", "*.json", "*.csv"],  # test fixtures, not prose
        "format": None,
        "out": "data/demo",
        "val_fraction": 0.02,
        "tokens_per_shard": 2_000_000,
        "on_error": "skip",  # the test suite ships deliberately mis-encoded files: count them
    }
