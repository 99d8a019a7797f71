"""Text cleaning and length filters: one document in, one cleaned document (or a drop reason) out.

Steps, in order, each skipped cheaply when the text does not need it:
  1. lone surrogates (only JSON escapes can produce them) become U+FFFD;
  2. newlines: CRLF and lone CR become LF;
  3. control characters are removed: C0 except TAB and LF, DEL, and C1 (U+0080-U+009F),
     plus a leading byte-order mark;
  4. Unicode normalisation: NFC by default, NFKC on request, or none. NFC keeps meaning, not
     code points: it composes combining sequences, orders combining marks, and replaces
     singletons (U+212A KELVIN SIGN → "K", U+2126 OHM SIGN → U+03A9); NFKC also folds
     compatibility characters ("10³" → "103", "ﬁ" → "fi").
`byte_exact=True` (CLI `--no-normalize`) skips 2-4 so code keeps every byte. Length filters
count characters of the cleaned text; overlong documents are dropped or truncated.

Memory model: one document at a time; each step makes at most one copy of it.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

NORMALIZE_FORMS = ("nfc", "nfkc", "none")
OVERLONG_POLICIES = ("drop", "truncate")

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# The same characters found in UTF-8 bytes, about five times faster than searching the str:
# C0 and DEL are themselves as bytes, and C1 (U+0080-U+009F) is C2 80-C2 9F.
_C0_DEL_BYTES = bytes(c for c in range(0x20) if c not in (0x09, 0x0A)) + b"\x7f"
_C1_BYTES = re.compile(rb"\xc2[\x80-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogate(text: str) -> bool:
    """Whether `text` holds a surrogate code point: a byte that was not UTF-8, read with
    errors='surrogateescape', or a lone surrogate's JSON escape (neither is valid Unicode text)."""
    return not text.isascii() and _SURROGATE.search(text) is not None


@dataclass(frozen=True, kw_only=True)
class CleanConfig:
    normalize: str = "nfc"
    byte_exact: bool = False
    min_chars: int = 1
    max_chars: int = 10_000_000
    overlong: str = "drop"
    filters: tuple[str, ...] = ()  # --filter: run on each kept document, in order (quality/filters.py)

    def __post_init__(self) -> None:
        from ...errors import ConfigError

        if self.normalize not in NORMALIZE_FORMS:
            raise ConfigError(f"--normalize must be one of {', '.join(NORMALIZE_FORMS)}")
        if self.overlong not in OVERLONG_POLICIES:
            raise ConfigError(f"--overlong must be one of {', '.join(OVERLONG_POLICIES)}")
        if self.min_chars < 0 or self.max_chars < 1 or self.min_chars > self.max_chars:
            raise ConfigError("need 0 <= --min-chars <= --max-chars and --max-chars >= 1")


def fix_surrogates(text: str) -> str:
    """Replace lone surrogates, which cannot be encoded as UTF-8, with U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def clean_text(text: str, config: CleanConfig) -> str:
    """Apply the cleaning steps of the module docstring to one document."""
    if config.byte_exact:
        return text
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if text.startswith("\ufeff"):
        text = text[1:]
    if _has_control(text):
        text = _CONTROL.sub("", text)
    form = config.normalize.upper()
    if form != "NONE" and not unicodedata.is_normalized(form, text):  # type: ignore[arg-type]
        text = unicodedata.normalize(form, text)  # type: ignore[arg-type]
    return text


def _has_control(text: str) -> bool:
    """Whether `text` holds a character `_CONTROL` removes ."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data.translate(None, _C0_DEL_BYTES)) != len(data):
        return True
    return b"\xc2" in data and _C1_BYTES.search(data) is not None


def drop_detail(reason: str, n_chars: int, config: CleanConfig) -> str:
    """Why `length_filter` dropped a cleaned document of `n_chars` characters, for the drop examples."""
    if reason == "too_long":
        return f"{n_chars:,} characters, over --max-chars {config.max_chars:,}"
    if reason == "too_short":
        return f"{n_chars:,} characters, under --min-chars {config.min_chars:,}"
    return "no text left after cleaning"


def length_filter(text: str, config: CleanConfig) -> tuple[str | None, str | None]:
    """Return (text, None) to keep, possibly truncated, or (None, reason) to drop."""
    n = len(text)
    if n == 0:
        return None, "empty"
    if n < config.min_chars:
        return None, "too_short"
    if n > config.max_chars:
        if config.overlong == "drop":
            return None, "too_long"
        return text[: config.max_chars], None
    return text, None
