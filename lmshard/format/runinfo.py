"""A dataset's run record (`run` in its metadata): where, when and how fast the run that wrote
it went, and the lineage of operations that made the dataset. Not part of what determines the
output bytes: identity checks leave it out.

Memory model: a few hundred bytes, and one entry per operation in the lineage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """Where, when and how fast a run went: not part of what determines the output bytes."""

    workers: int = 0
    out: str = ""
    started_at: str = ""  # UTC, ISO 8601
    elapsed_s: float = 0.0
    tokens_per_s: float | None = None
    input_chars: int = 0
    dedup_table_bytes: int = 0
    python: str = ""
    host: str = ""
    # What made the dataset, oldest first: {"op": prepare | append | convert | import, "at": UTC time,
    # "docs", "tokens": the dataset's after it, "lmshard": the version}; empty in datasets before it.
    lineage: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "lineage"}
        return out | ({"lineage": [dict(e) for e in self.lineage]} if self.lineage else {})

    @staticmethod
    def step(op: str, when: float, docs: int, tokens: int, version: str, **extra: Any) -> dict[str, Any]:
        """One lineage entry: the operation, its UTC time (`when`: seconds since the epoch), the
        dataset's documents and tokens after it, the lmshard version, and what else it records."""
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
        return {"op": op, "at": at, "docs": docs, "tokens": tokens, "lmshard": version, **extra}

    @staticmethod
    def history(previous: Any) -> tuple[dict[str, Any], ...]:
        """The lineage a dataset made from `previous` (a DatasetMeta, or None) continues: its own,
        or for a dataset written before lineage was kept, one entry from its run record."""
        if previous is None:
            return ()
        if previous.run.lineage:
            return tuple(previous.run.lineage)
        return ({"op": "prepare", "at": previous.run.started_at, "docs": previous.total_docs,
                 "tokens": previous.total_tokens, "lmshard": previous.lmshard_version},)  # fmt: skip

    @classmethod
    def parse(cls, raw: Any) -> RunInfo:
        if not isinstance(raw, dict):
            return cls()  # reporting only: an odd run record never makes a dataset unreadable
        kinds = {"workers": int, "out": str, "started_at": str, "elapsed_s": (int, float),
                 "tokens_per_s": (int, float), "input_chars": int, "dedup_table_bytes": int, "python": str,
                 "host": str}  # fmt: skip
        found = cls(**{k: v for k, v in raw.items() if k in kinds and isinstance(v, kinds[k])})  # type: ignore[arg-type]
        lineage = raw.get("lineage")
        if isinstance(lineage, list) and all(isinstance(e, dict) for e in lineage):
            found = replace(found, lineage=tuple(lineage))
        return found
