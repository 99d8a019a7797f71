"""What the metadata records about the files an input directory held that were not read
(`skipped_inputs`): the walk's counts by reason, for the summary and for anyone auditing what a
dataset was made from. Reporting only, so parsing is lenient: metadata from before the field
existed, or an odd value, reads as nothing skipped; a negative count is refused like any other.

Memory model: one small mapping of suffix → files.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

from .fields import _count, _counts


@dataclass(frozen=True, kw_only=True)
class SkippedInputs:
    """What the walk of the input directories left out, by reason. A hidden directory, and an
    lmshard dataset or work directory, counts once: the walk does not enter it."""

    unknown_type: dict[str, int] = field(default_factory=dict)  # type suffix (".png", ".1.gz") → files, most first
    hidden_files: int = 0
    hidden_dirs: int = 0
    lmshard: int = 0  # lmshard's own datasets, builds and work entries (.NAME.lmshard-partial/, ...)
    excluded: int = 0  # files matching --exclude
    unreadable_dirs: int = 0  # directories the walk could not list (permissions)

    def __bool__(self) -> bool:
        return any(self.to_json().values())

    def __add__(self, other: SkippedInputs) -> SkippedInputs:
        """Both walks' counts (several input directories; a dataset and what --append added)."""
        summed = {k: v + getattr(other, k) for k, v in self.to_json().items() if k != "unknown_type"}
        suffixes = Counter(self.unknown_type) + Counter(other.unknown_type)
        return SkippedInputs(unknown_type=dict(sorted(suffixes.items(), key=lambda kv: (-kv[1], kv[0]))), **summed)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def parse(cls, raw: Any) -> SkippedInputs:
        if not isinstance(raw, dict):
            return cls()
        counts = {f.name: _count(raw, f.name, 0) for f in fields(cls) if f.name != "unknown_type"}
        return cls(unknown_type=_counts(raw, "unknown_type"), **counts)
