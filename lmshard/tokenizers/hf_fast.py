"""The accelerated encoder of Hugging Face tokenizer.json vocabularies: splintr's own loader of
the given file (`splintr.from_json_bytes`: its vocabulary, merges, normalizer, pre-tokenizer
split patterns, added tokens and flags such as `ignore_merges` and `byte_fallback`), admitted
only through the exactness gate against the `tokenizers` library, id for id. Nothing is picked
by name: splintr's bundled vocabularies are never used.

What splintr is given differs from the file in what lmshard never asks of a tokenizer: the
added tokens marked special are left out (lmshard encodes their text as ordinary text, as the
tokenizers backend does with `encode_special_tokens`; ordinary added tokens stay, and are
matched in the text as `tokenizers` matches them), and so are the post-processor, truncation
and padding (lmshard adds no template and cuts nothing).

The gate for a tokenizer.json has two parts, both against `tokenizers`, id for id:

1. Probes (`differing_points`): every code point this Python's Unicode tables assign (every 64th
   in the large blocks of one kind of letter), each in a text of its own, before a contraction
   and a digit, doubled, and between combining marks of four canonical classes. The two
   libraries' Unicode tables are of different versions: where they disagree (NFC's canonical
   order and compositions, NFKC, letter and punctuation classes) a probe differs. Those code
   points (none for Llama 3, DeepSeek, Mistral or Gemma; 98 for Qwen's NFC) are remembered with
   the pass, and any text holding one is encoded by `tokenizers`, as is any text holding a code
   point Python's tables leave unassigned (`hf_cache.newer_code_points`), and the empty text.
   More than `MAX_ROUTED` of them and the gate fails. An ASCII code point is never routed: both
   libraries classify ASCII alike, so a probe that differs there differs by the vocabulary (a
   merge or a rank changed in splintr's copy); its probe joins the sample, which then fails,
   rather than every text holding that letter going to `tokenizers`.
2. The sample (`hf_sample`), with that routing in place: `gate.sample()` (the tiktoken gate's
   hard text) less its code point texts, the empty text, and, built from the vocabulary itself,
   every added and special token's text (alone, between letters and doubled), letters of blocks
   Unicode 15 and 16 added, and every token of the vocabulary, decoded, as words of a text, and
   again each run on into a letter: a merge that differs between the two encoders is met at the
   token it builds, also where whole pieces are looked up before any merge (`ignore_merges`).

About 1.5 MB of text for a 128k vocabulary, checked once per installation (1.5-7 s) and
remembered as the tiktoken gate is (`gate.remember`, `gate.recall`).

Memory model: the gate's sample and its tokens while the gate runs (a few MB); after it, the
tokenizer as `hf_backend` says (both libraries' tables for the vocabulary).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TokenizerError
from . import hf_cache
from .base import Tokenizer
from .gate import FAST_EXTRA, check_exact, code_point_texts, pass_record, recall, remember, sample
from .hf_backend import HFTokenizer
from .hf_ranks import decode_form, encode_form, ranks_form

# Blocks whose letters Unicode 15 and 16 added (Kawi, Nag Mundari, Cyrillic Extended-D, Arabic
# Extended-C, Devanagari Extended-A, Kaktovik numerals, CJK Extension H; Garay, Todhri,
# Tulu-Tigalari, Sunuwar, Kirat Rai, Gurung Khema, Ol Onal, Myanmar Extended-C, Symbols for
# Legacy Computing Supplement): the pre-tokenizer's regex engine and `tokenizers`' may know
# different Unicode versions, as tiktoken's and splintr's do (gate._UNICODE_17).
_NEWER_BLOCKS = (
    (0x11F00, 0x11F5F), (0x1E4D0, 0x1E4FF), (0x1E030, 0x1E08F), (0x10EC0, 0x10EFF), (0x11B00, 0x11B5F),
    (0x1D2C0, 0x1D2DF), (0x31350, 0x323AF), (0x10D40, 0x10D8F), (0x105C0, 0x105FF), (0x11380, 0x113FF),
    (0x11BC0, 0x11BFF), (0x16D40, 0x16D7F), (0x16100, 0x1613F), (0x1E5D0, 0x1E5FF), (0x116D0, 0x116FF),
    (0x1CC00, 0x1CEBF),
)  # fmt: skip
_VOCAB_WORDS = 4096  # tokens per text of the vocabulary sample


def splintr_copy(parsed: dict[str, Any]) -> bytes:
    """The tokenizer.json splintr loads: the file less its special added tokens, post-processor,
    truncation and padding (see the module docstring)."""
    data = dict(parsed)
    added = parsed.get("added_tokens") or []
    data["added_tokens"] = [t for t in added if not (isinstance(t, dict) and t.get("special"))]
    data["post_processor"] = data["truncation"] = data["padding"] = None
    return json.dumps(data, ensure_ascii=False).encode("utf-8")


# Blocks of one kind of letter, where every 64th code point is probed: CJK ideographs and their
# extensions, Hangul syllables, Yi, Tangut.
_UNIFORM = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xA000, 0xA48C), (0xAC00, 0xD7A3), (0x17000, 0x187F7),
            (0x18800, 0x18CD5), (0x20000, 0x3134F))  # fmt: skip
# More code points than this on which splintr differs, and the gate fails instead of routing them.
MAX_ROUTED = 2000


@lru_cache(maxsize=1)
def probe_points() -> tuple[int, ...]:
    """Every code point this Python's tables assign (private use and surrogates aside), every
    64th in `_UNIFORM`: about 33,000."""
    uniform = np.zeros(0x110000, dtype=bool)
    for start, end in _UNIFORM:
        uniform[start : end + 1] = True
    points = []
    for c in (*range(0x40000), *range(0xE0000, 0xF0000)):
        if unicodedata.category(chr(c)) not in ("Cn", "Co", "Cs") and (not uniform[c] or c % 64 == 0):
            points.append(c)
    return tuple(points)


def _probe(c: int) -> str:
    # before a contraction and a digit, doubled, and between combining marks of classes 1
    # (U+0334), 220 (U+0316), 230 (U+0301) and 240 (U+0345): a canonical combining class that
    # differs between the two libraries' tables puts the marks in another order
    ch = chr(c)
    return f"{ch}'s a{ch}\u0334\u0301{ch} a\u0345{ch}\u0316 {ch}1 "


def differing_points(fast: HFTokenizer, reference: HFTokenizer) -> list[int]:
    """The code points of `probe_points` whose probe text splintr (`fast`, not yet routing any)
    encodes otherwise than `tokenizers`: where their Unicode tables differ (on ASCII, which they
    classify alike, where the vocabulary does: `_admit` routes none of those)."""
    points = probe_points()
    texts = [_probe(c) for c in points]
    got, got_lengths = fast.encode_batch(texts)
    want, want_lengths = reference.encode_batch(texts)
    got_ends, want_ends = np.cumsum(got_lengths), np.cumsum(want_lengths)
    return [c for i, c in enumerate(points)
            if not np.array_equal(got[got_ends[i] - got_lengths[i] : got_ends[i]],
                                  want[want_ends[i] - want_lengths[i] : want_ends[i]])]  # fmt: skip


def _newer_blocks() -> str:
    """Letters of blocks Unicode 15 and 16 added, which texts are routed to `tokenizers` for."""
    return "".join(_probe(c) for start, end in _NEWER_BLOCKS for c in range(start, end + 1, 5))


def hf_sample(reference: Tokenizer) -> list[tuple[str, str]]:
    """The gate's (label, text) pairs for a tokenizer.json (see the module docstring)."""
    assert isinstance(reference, HFTokenizer)
    tok = reference._tok
    added = [t.content for t in tok.get_added_tokens_decoder().values()]
    # The tiktoken sample less its code point texts, which the probes (`differing_points`) cover
    # one code point per text; the empty text, which some pre-tokenizers turn into a token.
    own = {label for label, _ in code_point_texts()}
    texts = [*((label, text) for label, text in sample() if label not in own), ("the empty text", ""),
             ("added and special tokens", " ".join(f"a{t}b {t} {t}{t}\n" for t in added)),
             ("blocks added in Unicode 15 and 16", _newer_blocks())]  # fmt: skip
    ids = sorted(set(tok.get_vocab(with_added_tokens=False).values()))
    words = tok.decode_batch([[i] for i in ids], skip_special_tokens=False)
    for k in range(0, len(words), _VOCAB_WORDS):
        part = words[k : k + _VOCAB_WORDS]
        label = f"vocabulary tokens {k:,}-{min(k + _VOCAB_WORDS, len(words)) - 1:,}"
        texts.append((label, " ".join(part)))
        # each run on into a letter: a piece the vocabulary does not hold whole, so that its
        # merges are what encodes it even where whole pieces are looked up first (ignore_merges)
        texts.append((label + ", each run on into a letter", " ".join(w + "q" for w in part)))
    return texts


# Modules whose code decides what the gate compares: the reference, the surrogate repair and
# interface, the shared splintr encode call, and this file (the copy and the sample).
SUPPORT_SOURCES = tuple(Path(__file__).with_name(n) for n in ("base.py", "hf_backend.py", "hf_resolve.py",
                                                               "splintr_backend.py", "hf_fast.py", "hf_ranks.py",
                                                               "hf_cache.py"))  # fmt: skip


def _loader(tok: HFTokenizer, form: str) -> Callable[[], Any]:
    """What loads splintr's encoder of the tokenizer's file (see `HFTokenizer.accelerate`): from
    its ranks table (`form` "ranks": hf_ranks.py, remembered per file by hf_cache.py) or its
    tokenizer.json copy ("json", made once in this process, before its workers fork)."""

    def load() -> Any:
        import splintr

        if form == "ranks":
            found = _ranks(tok)
            assert found is not None
            return splintr.Tokenizer.from_bytes(found[1], found[0], {})
        return splintr.from_json_bytes(_json_copy(tok))

    return load


def _code() -> tuple[str, ...]:
    return tuple(hf_cache.source_sha256(Path(__file__).with_name(n)) for n in ("hf_fast.py", "hf_ranks.py"))


def _json_copy(tok: HFTokenizer) -> bytes:
    """splintr's copy of the file (`splintr_copy`): remembered per file, made once per process."""
    if "splintr_json" not in tok._lazy:
        tok._lazy["splintr_json"] = hf_cache.payload(("json", tok.vocab_sha256, *_code()),
                                                     lambda: splintr_copy(tok._json))  # fmt: skip
    return tok._lazy["splintr_json"]


def _ranks(tok: HFTokenizer) -> tuple[str, bytes] | None:
    """The file's ranks form, when it has one (hf_ranks.py); remembered either way."""
    if "ranks" not in tok._lazy:
        tok._lazy["ranks"] = decode_form(hf_cache.payload(("ranks", tok.vocab_sha256, *_code()),
                                                          lambda: encode_form(ranks_form(tok._json))))  # fmt: skip
    return tok._lazy["ranks"]


def _admit(fast: HFTokenizer, tok: HFTokenizer, record: dict[str, str], **stored: Any) -> str | None:
    """The gate (see the module docstring): None when `fast`, routing the code points where it
    differs, gives `tok`'s ids on the whole sample; the pass is then remembered with them."""
    try:
        differ = differing_points(fast, tok)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # splintr could not read the file, or panicked
        return f"splintr raised {type(e).__name__} on the sample: {str(e)[:200]}"
    if len(differ) > MAX_ROUTED:
        return (f"splintr differs from tokenizers on {len(differ):,} of the {len(probe_points()):,} code points "
                f"tried, U+{differ[0]:04X} first")  # fmt: skip
    routed = [c for c in differ if c >= 0x80]  # (an ASCII probe that differs is checked, not routed: see above)
    fast.route(routed)
    probes = [(f"the probe of U+{c:04X}", _probe(c)) for c in differ if c < 0x80]
    labels, texts = zip(*hf_sample(tok), *probes, strict=True)
    problem = check_exact(fast, tok, texts, labels)
    if problem is None:
        remember(record, routed=routed, **stored)
    return problem


def _ready(fast: HFTokenizer, tok: HFTokenizer, form: str) -> HFTokenizer:
    """`fast`, with what splintr loads made (so forked workers inherit it, not the JSON) and
    the parsed file dropped: a forked worker inherits nothing it does not use."""
    if form == "json":
        _json_copy(tok)
    tok.release()
    return fast


def accelerated_hf(spec: str, *, backend: str, warn: Callable[[str], None] | None = None, gated: bool = False,
                   threads: int = 1, separator: str | None = None, untrusted: bool = False,
                   form_of_run: str | None = None) -> Tokenizer:  # fmt: skip
    """The tokenizer.json `spec` encoded by splintr when it is installed and exact on the gate's
    sample (`backend` "auto" or "splintr"), else by `tokenizers`: for "auto" silently when splintr
    is not installed, through `warn` (naming the first differing token) when it is not exact;
    "splintr" raises instead. `gated=True` trusts a gate this run passed (prepare's workers), in
    the form `form_of_run` ("ranks" or "json") that gate admitted when the caller knows it."""
    tok = HFTokenizer(spec, separator=separator, threads=threads, untrusted=untrusted)
    if backend == "tokenizers":
        return tok
    try:
        import splintr
    except ImportError:
        if backend == "splintr":
            raise TokenizerError(FAST_EXTRA) from None
        return tok
    fast, version = tok.reference(), getattr(splintr, "__version__", "unknown")
    forms: tuple[str, ...] = ("ranks", "json") if _ranks(tok) is not None else ("json",)  # the faster first
    records, stored = {}, {}
    for form in forms:
        fast.accelerate(_loader(tok, form), version, form)
        records[form] = {**pass_record(fast, ("splintr", "tokenizers"), SUPPORT_SOURCES), "splintr_form": form}
        if form == "ranks":  # (what splintr loads, itself: a pass holds for this table only)
            records[form]["ranks_sha256"] = hashlib.sha256(encode_form(_ranks(tok))).hexdigest()
        stored[form] = recall(records[form])
    if stored.get("ranks") is None and (stored["json"] or {}).get("ranks_failed"):
        forms = ("json",)  # the ranks failed the gate where the file's copy passed it: not tried again
    if gated and form_of_run in forms:
        forms = tuple(f for f in forms if f == form_of_run)  # the form the run's own gate admitted
    for form in forms:
        found = stored[form]
        if found is not None:  # passed before: with the code points it routes to tokenizers
            fast.accelerate(_loader(tok, form), version, form)
            fast.route(found.get("routed") or ())
            return _ready(fast, tok, form)
    if gated:  # admitted in this run, but not remembered (a read-only cache; a worker of another form is refused)
        fast.accelerate(_loader(tok, forms[0]), version, forms[0])
        fast.route(differing_points(fast, tok))
        return _ready(fast, tok, forms[0])
    failed: dict[str, str] = {}  # (a failure alone is never remembered: only beside the pass of another form)
    for form in forms:
        fast.accelerate(_loader(tok, form), version, form)
        problem = _admit(fast, tok, records[form], **({"ranks_failed": failed["ranks"]} if failed else {}))
        if problem is None:
            return _ready(fast, tok, form)
        failed[form] = problem
    if backend == "splintr":
        raise TokenizerError(f"--tokenizer-backend splintr is not exact for {spec} here ({problem}); "
                             "use --tokenizer-backend tokenizers or auto")  # fmt: skip
    if warn is not None:
        warn(f"{spec}: the splintr backend is not exact for this tokenizer, falling back to tokenizers: {problem}")
    return tok
