"""`Edit`: what a document filter returns to keep a document with a changed text (lines
removed, markers stripped) instead of the text it was given. It lives apart from `filters.py`
so that the built-in rule sets can return it without importing the filter registry.

Memory model: one document's edited text.
"""

from __future__ import annotations


class Edit(str):
    """Keep the document, with this text instead of the one the filter was given.

    >>> from lmshard.quality.filters import Edit
    >>> def no_shouting(text):
    ...     return Edit("\\n".join(line for line in text.split("\\n") if not line.isupper()))

    The next filters, deduplication and the tokenizer see the edited text; an empty one (or
    only whitespace) drops the document, counted under the filter's name + `_empty`.
    `removed` optionally says what the edit took out, by reason: {reason: (lines, first one)};
    prepare counts those lines in the metadata's `line_drops` with the first as an example.
    """

    removed: dict[str, tuple[int, str]]

    def __new__(cls, text: str, removed: dict[str, tuple[int, str]] | None = None) -> Edit:
        edit = super().__new__(cls, text)
        edit.removed = dict(removed or {})
        return edit
