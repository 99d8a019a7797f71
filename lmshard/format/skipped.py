"""What the metadata records about the files an input directory held that were not read
(`skipped_inputs`): the walk's counts by reason and the skipped suffixes whose files looked like
text, for the summary (with the fix they call for, `text_hint`) and for anyone auditing what a
dataset was made from. Reporting only, so parsing is lenient: metadata from before the field
existed, or an odd value, reads as nothing skipped; a negative count is refused like any other.

Memory model: one small mapping of suffix → files.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

from .fields import _count, _counts, _get

NO_SUFFIX = "(none)"  # how unknown_type names the files whose name has no suffix (Makefile, LICENSE)


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
    text_like: list[str] = field(default_factory=list)  # the unknown_type suffixes whose files look like text

    def __bool__(self) -> bool:
        return any(self.to_json().values())

    def __add__(self, other: SkippedInputs) -> SkippedInputs:
        """Both walks' counts (several input directories; a dataset and what --append added)."""
        summed = {name: getattr(self, name) + getattr(other, name) for name in _COUNTS}
        suffixes = Counter(self.unknown_type) + Counter(other.unknown_type)
        text_like = list(dict.fromkeys(self.text_like + other.text_like))
        return SkippedInputs(unknown_type=dict(sorted(suffixes.items(), key=lambda kv: (-kv[1], kv[0]))),
                             text_like=text_like, **summed)  # fmt: skip

    def text_hint(self, files_read: int) -> str | None:
        """The fix when the skipped files that look like text are at least as many as the files
        read (a folder of text whose names lmshard does not know): --format text, with --exclude
        for the skipped suffixes that do not look like text. None otherwise."""
        text = [suffix for suffix in self.unknown_type if suffix in self.text_like]  # most first
        if not text or sum(self.unknown_type[suffix] for suffix in text) < files_read:
            return None
        names = ["suffix-less" if suffix == NO_SUFFIX else suffix for suffix in text]
        more = len(names) - 3
        shown = ", ".join(names[:3]) + " files" + (f" (and those of {more:,} more suffix{'es' if more > 1 else ''})"
                                                   if more > 0 else "")  # fmt: skip
        others = [suffix for suffix in self.unknown_type if suffix not in text and suffix != NO_SUFFIX]
        exclude = "".join(f" --exclude '*{suffix}'" for suffix in others)  # every one: the advice can be pasted
        return (f"the skipped {shown} look like text: pass --format text{exclude} to read them (it "
                "reads every file as text)")  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def parse(cls, raw: Any) -> SkippedInputs:
        if not isinstance(raw, dict):
            return cls()
        counts = {name: _count(raw, name, 0) for name in _COUNTS}
        text_like = [suffix for suffix in _get(raw, "text_like", list, []) if isinstance(suffix, str)]
        return cls(unknown_type=_counts(raw, "unknown_type"), text_like=text_like, **counts)


_COUNTS = ("hidden_files", "hidden_dirs", "lmshard", "excluded", "unreadable_dirs")  # the fields that are counts
