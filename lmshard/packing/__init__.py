"""Packing: documents into fixed-length rows, planned from document lengths alone. planner (the
plans: strategies, overlong policies, the multiple), io (a split's lengths from its document
indexes, the plan cache), stream (constant-memory packing of a split in windows). Imports only
what the runtime may (format, errors, numpy), so the loader and `inspect --packing` share it.

The planner's names are the package's face, as they were when it was one module."""

from .planner import (
    ALL_STRATEGIES,
    DEFAULT_WINDOW,
    OVERLONG,
    STRATEGIES,
    Items,
    PackPlan,
    compare,
    make_items,
    parse_strategy,
    plan,
)

__all__ = [
    "ALL_STRATEGIES",
    "DEFAULT_WINDOW",
    "OVERLONG",
    "STRATEGIES",
    "Items",
    "PackPlan",
    "compare",
    "make_items",
    "parse_strategy",
    "plan",
]
