"""The exactness gate: the accelerated backend encodes only after it has produced tiktoken's
token ids, id for id, on a built-in sample of hard text.

The sample (`sample()`) is generated here, deterministically, rather than read from a data
file: long runs of one character, digit runs, random words, base64, emoji, CJK, Arabic,
Devanagari, every code point of U+0000-07FF and every third one up to U+2FFF, code points new in
Unicode 17 (splintr's regex engine and tiktoken's disagree on those), all Unicode whitespace,
U+FFFD, lone surrogates, special-token text, contractions in every case, and very long words:
22 texts, about 190 KB of UTF-8, checked in about 50 ms of CPU.

`accelerated(spec, ...)` is what `load_tokenizer` calls for backend "auto" or "splintr". A pass
is remembered on disk, in `gate_dir()`, under a key of everything that could change the answer
(splintr's and tiktoken's versions, the vocabulary's sha256, the sample's sha256, the backend's
source, the CPU), so a run pays for the reference tiktoken load only once per installation.

Memory model: the sample (about 0.2 MB of text) and its tokens; the reference tokenizer while
the gate runs (released when it passes).
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import platform
import random
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TokenizerError
from ..format import TOKEN_DTYPE, atomic_write_json
from . import families
from .base import Tokenizer
from .vocab import cache_home, resolve

FAST_EXTRA = "--tokenizer-backend splintr needs the fast extra: pip install 'lmshard[fast]'"

# Code points new in Unicode 17, which tiktoken's (older) tables leave unassigned: "\u088f's"
# splits as "\u088f'" + "s" for tiktoken, "\u088f" + "'s" for a splitter with Unicode 17 tables.
# Found by encoding every code point both ways (26 ranges, 4,657 code points).
_UNICODE_17 = (
    (0x088F, 0x088F), (0x0C5C, 0x0C5C), (0x0CDC, 0x0CDC), (0xA7CE, 0xA7CF), (0xA7D2, 0xA7D2),
    (0xA7D4, 0xA7D4), (0xA7F1, 0xA7F1), (0x10940, 0x10959), (0x10EC5, 0x10EC7), (0x11DB0, 0x11DDB),
    (0x11DE0, 0x11DE9), (0x16EA0, 0x16EB8), (0x16EBB, 0x16ED3), (0x16FF2, 0x16FF6), (0x187F8, 0x187FF),
    (0x18D09, 0x18D1E), (0x18D80, 0x18DF2), (0x1E6C0, 0x1E6DE), (0x1E6E0, 0x1E6E2), (0x1E6E4, 0x1E6E5),
    (0x1E6E7, 0x1E6ED), (0x1E6F0, 0x1E6F4), (0x1E6FE, 0x1E6FF), (0x2B73A, 0x2B73F), (0x2CEA2, 0x2CEAD),
    (0x323B0, 0x33479),
)  # fmt: skip
# Unicode White_Space, the separators Python's str.isspace adds (U+001C-001F), and look-alikes
# that are not whitespace (zero-width space, Mongolian vowel separator, word joiner, BOM).
_SPACES = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
          "\u2028\u2029\u202f\u205f\u3000\x1c\x1d\x1e\x1f\u200b\u180e\u2060\ufeff"  # fmt: skip
_SPECIALS = ("<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>",
             "<|im_start|>", "<|endoftext", "endoftext|>", "<|endoftext|><|endoftext|>", "<|startoftext|>")  # fmt: skip
_CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'VE", "'Re", "'D", "\u2019s", "''s")
_SCRIPTS = (
    "日本語のテキストと漢字、中文文本，한국어 텍스트。",
    "النص العربي مع التشكيل: كَتَبَ الطَّالِبُ ١٢٣ درسًا.",
    "हिन्दी पाठ में संयुक्ताक्षर: क्षत्रिय, ज्ञान, श्री ४५६।",
    "ภาษาไทยไม่มีช่องว่าง Ελληνικά με τόνους Кириллица Ёё ﬁ ﬀ Å Å é é",
)
_EMOJI = "😀👍🏽👨‍👩‍👧‍👦🇫🇷🏳️‍🌈❤️‍🔥🧑🏿‍💻 ✌︎ 1️⃣ 🫠"


def _words(rng: random.Random, n: int) -> str:
    letters = rng.choices("abcdefghijklmnopqrstuvwxyz", k=6 * n)
    cuts = sorted(rng.sample(range(1, 6 * n), n - 1))
    return " ".join("".join(letters[i:j]) for i, j in zip([0, *cuts], [*cuts, 6 * n], strict=True))


def _mixed(rng: random.Random, alphabet: Sequence[str], n: int) -> str:
    return "".join(rng.choices(alphabet, k=n))


def _runs() -> list[tuple[str, str]]:
    return [
        ("20k 'a'", "a" * 20_000),
        ("20k spaces", " " * 20_000),
        ("5k newlines", "\n" * 5_000),
        ("'\\n\\n  \\t' x 2k", "\n\n  \t" * 2_000),
        ("digit runs", "1" * 3_000 + " " + "1234567890" * 300 + " 3.14159 1,234,567 0x1F 2024-06-07"),
        ("long words", "supercalifragilistic" * 300 + " x" + "é" * 3_000 + " " + "ab" * 2_000 + "!" * 2_000),
        ("runs ending in spaces", "word   \n\n   text\t \t  \n" * 50 + "end   "),
    ]


def _alphabets(rng: random.Random) -> list[tuple[str, str]]:
    blob = base64.b64encode(rng.randbytes(6_000)).decode()
    return [
        ("random words", _words(rng, 2_000)),
        ("base64", blob + "\n" + base64.urlsafe_b64encode(rng.randbytes(600)).decode()),
        ("scripts", "\n".join(_SCRIPTS) * 20),
        ("emoji", (_EMOJI + " ") * 30),
        ("U+FFFD", "\ufffd" * 50 + " a\ufffdb \ufffd's \ufffd\ufffd1"),
        ("mixed scripts", _mixed(rng, list("".join(_SCRIPTS) + _EMOJI + "aA1 .,'\n"), 3_000)),
    ]


def _edges(rng: random.Random) -> list[tuple[str, str]]:
    punct = "!.,;:?-()[]{}\"'`/\\|@#$%^&*_+=<>~"
    spaced = "".join(f"x{s}{p} {s}{s}{p}" for s in _SPACES for p in punct[:8]) + "".join(f"a{s}" for s in _SPACES)
    return [
        ("special-token text", " ".join(f"{s} a{s}b" for s in _SPECIALS) + "<|endoftext|>"),
        ("lone surrogates", "a\ud800b \udfff \ud83d\ude00 x\udc80\udcff y\ud83d 's\udbff"),
        ("contractions", " ".join(f"it{c} {c} I{c.upper()}x{c}" for c in _CONTRACTIONS) + " don't I'M y'all"),
        ("whitespace before punctuation", spaced),
        ("whitespace mix", _mixed(rng, list(_SPACES + "ab1.'"), 4_000)),
        ("code", "def f(x):\n\tif x  >= 10:\n        return {'a': [1, 2]}  # done\r\n" * 40),
    ]


def code_point_texts() -> list[tuple[str, str]]:
    # Each code point before a contraction and a digit; every one of U+0000-07FF (where the
    # cased and combining letters of most alphabets live), every third one up to U+2FFF, and
    # both ends plus every 16th of each Unicode 17 range: 9 ms of tiktoken, not 50 for all.
    def text(points: Sequence[int]) -> str:
        return "".join(f"{chr(c)}'s {chr(c)}1" for c in points if not 0xD800 <= c <= 0xDFFF)

    new = sorted({c for start, end in _UNICODE_17 for c in (*range(start, end, 16), end)})
    return [("U+0000-07FF", text(range(0x800))), ("U+0800-2FFF, every third", text(range(0x800, 0x3000, 3))),
            ("letters new in Unicode 17", text(new))]  # fmt: skip


@lru_cache(maxsize=1)
def sample() -> tuple[tuple[str, str], ...]:
    """The gate's (label, text) pairs: a function of this file and a seeded generator only."""
    rng = random.Random(20240607)
    return tuple(_runs() + _alphabets(rng) + _edges(rng) + code_point_texts())


def sample_sha256() -> str:
    digest = hashlib.sha256()
    for label, text in sample():
        digest.update(f"{label}\0{len(text)}\0".encode() + text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# The check


def _expected(reference: Tokenizer, text: str) -> np.ndarray:
    # The tiktoken backend encodes text UTF-8 cannot hold as tiktoken's encode_ordinary does
    # (each lone surrogate as U+FFFD); tests/test_fast_backend.py holds both to encode_ordinary.
    return reference.encode_batch([text])[0]


def _show(tokenizer: Tokenizer, ids: np.ndarray, k: int) -> str:
    if k >= len(ids):
        return "(end)"
    try:
        text = tokenizer.decode([int(ids[k])])
        piece = getattr(tokenizer, "piece", None)
        if "\ufffd" in text and piece is not None:  # part of a character: the vocabulary's own spelling says more
            return f"{int(ids[k])} {text!r} (token {piece(int(ids[k]))!r})"
        return f"{int(ids[k])} {text!r}"
    except Exception:  # a candidate's id may not decode at all
        return str(int(ids[k]))


def _difference(label: str, text: str, got: np.ndarray, want: np.ndarray, candidate: Tokenizer,
                reference: Tokenizer) -> str:  # fmt: skip
    n = min(len(got), len(want))
    differ = np.flatnonzero(got[:n] != want[:n])
    k = int(differ[0]) if len(differ) else n  # else one is a prefix of the other
    return (f"sample {label!r} ({len(text):,} chars): token {k} is {_show(candidate, got, k)} from "
            f"{candidate.backend}, {_show(reference, want, k)} from {reference.backend} "
            f"({len(got):,} vs {len(want):,} tokens)")  # fmt: skip


def _malformed(backend: str, tokens: np.ndarray, lengths: np.ndarray, n_texts: int) -> str | None:
    if tokens.dtype == TOKEN_DTYPE and lengths.dtype == np.int64 and lengths.shape == (n_texts,) \
            and int(lengths.sum()) == len(tokens):  # fmt: skip
        return None
    return (f"{backend} returned {len(tokens)} {tokens.dtype} tokens with {lengths.dtype} lengths "
            f"{lengths.shape} summing to {int(lengths.sum())} for {n_texts} texts")  # fmt: skip


def _other_field(candidate: Tokenizer, reference: Tokenizer) -> str | None:
    for field in ("n_vocab", "eot_id", "eot_token", "vocab_sha256"):
        mine, theirs = getattr(candidate, field), getattr(reference, field)
        if mine != theirs:
            return f"{field} is {mine!r} for {candidate.backend}, {theirs!r} for {reference.backend}"
    return None


def check_exact(candidate: Tokenizer, reference: Tokenizer, texts: Sequence[str],
                labels: Sequence[str] | None = None) -> str | None:  # fmt: skip
    """None when `candidate.encode_batch(texts)` (one batch) gives exactly the reference's ids
    for every text and the same n_vocab, EOT and vocabulary hash; else one line naming the first
    text that differs (by `labels`, default its index) and its first differing token. An
    exception from the candidate counts as a difference."""
    names = list(labels) if labels is not None else [f"#{i}" for i in range(len(texts))]
    try:
        tokens, lengths = candidate.encode_batch(texts)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # a Rust panic (PanicException) is not an Exception
        return f"{candidate.backend} raised {type(e).__name__} on the sample: {e}"
    if (problem := _malformed(candidate.backend, tokens, lengths, len(texts))) is not None:
        return problem
    ends = np.cumsum(lengths)
    for i, text in enumerate(texts):
        got, want = tokens[ends[i] - lengths[i] : ends[i]], _expected(reference, text)
        if not np.array_equal(got, want):
            return _difference(names[i], text, got, want, candidate, reference)
    return _other_field(candidate, reference)


def check_sample(candidate: Tokenizer, reference: Tokenizer) -> str | None:
    """`check_exact` on the built-in sample."""
    labels, texts = zip(*sample(), strict=True)
    return check_exact(candidate, reference, texts, labels)


# ---------------------------------------------------------------------------------------------
# Admission, remembered


def gate_dir() -> Path:
    """Where passed gates are remembered: `$LMSHARD_CACHE_DIR/gate`, default
    `~/.cache/lmshard/gate` (whatever `$TIKTOKEN_CACHE_DIR` says about vocabularies)."""
    return cache_home() / "gate"


def _cpu() -> str:
    """The machine and, on Linux, a hash of its CPU feature flags: splintr picks SIMD and JIT code
    paths per CPU, and a home directory (so this cache) may be shared by different nodes."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return f"{platform.machine()} {hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def pass_record(candidate: Tokenizer, libraries: tuple[str, ...], support: tuple[Path, ...]) -> dict[str, str]:
    """Everything a pass depends on; a change to any of it runs the gate again: the candidate's
    class and source, the versions of `libraries` (the candidate's and the reference's), the
    vocabulary, the sources in `support`, this file (which generates the sample), Python and the CPU."""
    import importlib

    source = Path(inspect.getfile(type(candidate)))
    record = {
        "backend": f"{type(candidate).__module__}.{type(candidate).__qualname__}",
        "backend_source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "cpu": _cpu(),
        "vocab_sha256": candidate.vocab_sha256,
        # The sample is a function of this file and Python's seeded generator: hashing them is
        # 50 ms cheaper per run than generating the sample to hash it.
        "gate_source_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "support_source_sha256": _sources_sha256(support),
        "python": platform.python_version(),
    }
    for name in libraries:
        record[f"{name}_version"] = getattr(importlib.import_module(name), "__version__", "unknown")
    return record


def _pass_record(candidate: Tokenizer) -> dict[str, str]:
    return pass_record(candidate, ("splintr", "tiktoken"), SUPPORT_SOURCES)


# Modules whose code decides what the gate compares: the tiktoken reference, the shared surrogate
# repair and interface, the verified vocabulary reader and the other families' definitions.
SUPPORT_SOURCES = tuple(Path(__file__).with_name(n)
                        for n in ("base.py", "tiktoken_backend.py", "vocab.py", "families.py"))  # fmt: skip


def _sources_sha256(paths: tuple[Path, ...]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        data = path.read_bytes()
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def _record_file(record: dict[str, str]) -> Path:
    key = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    return gate_dir() / f"{key[:32]}.json"


def recall(record: dict[str, str]) -> dict[str, Any] | None:
    """The pass remembered under `record` (the record and what was stored with it), or None."""
    try:
        stored = json.loads(_record_file(record).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stored, dict) or {k: stored.get(k) for k in record} != record:
        return None
    return stored


def remember(record: dict[str, str], **stored: Any) -> None:
    """Remember a pass under `record`, with `stored` (JSON) beside it for `recall`."""
    try:
        gate_dir().mkdir(parents=True, exist_ok=True)
        atomic_write_json(_record_file(record), {**stored, **record})
    except OSError:
        pass  # a read-only cache only costs the next run another check


def admit(candidate: Tokenizer, record: dict[str, str], reference: Callable[[], Tokenizer],
          texts: Callable[[Tokenizer], Sequence[tuple[str, str]]]) -> str | None:  # fmt: skip
    """None when `candidate` passed the gate before under `record`, or passes it now against
    `reference()` on `texts(reference)` (label, text) pairs, which is then remembered; else why not."""
    if recall(record) is not None:
        return None
    ref = reference()
    labels, values = zip(*texts(ref), strict=True)
    problem = check_exact(candidate, ref, values, labels)
    if problem is None:
        remember(record)
    return problem


def _candidate_problem(spec: str, threads: int, separator: str | None) -> tuple[Tokenizer | None, str | None]:
    """(the splintr tokenizer, None) when it loads and passes the gate, else (None, why not). A
    vocabulary of `families` is also checked on the text of each of its own special tokens, and
    its pass is keyed by its pattern, special tokens, normalization and the pattern splintr got."""
    from .splintr_backend import SPLINTR_PATTERNS, SplintrTokenizer, splintr_constant
    from .tiktoken_backend import TiktokenTokenizer

    ranked = families.load(spec)  # a missing, unknown or malformed vocabulary is the user's to fix
    if ranked is None and (base := resolve(spec)[1].base) not in SPLINTR_PATTERNS:
        return None, f"splintr has no exact pattern for {base}"
    if ranked is not None and splintr_constant(ranked.pattern) is None:
        return None, "splintr has no exact pattern for this split pattern (it is none of splintr's own)"
    try:
        candidate = SplintrTokenizer(spec, threads=threads, separator=separator)
        record = _pass_record(candidate)
    except TokenizerError:
        raise  # the vocabulary file failed its sha256: no backend can use it
    except Exception as e:  # any failure of the accelerated path falls back, never crashes
        return None, f"splintr could not load {spec}: {type(e).__name__}: {e}"
    texts = sample()
    if ranked is not None:
        record.update(ranked.gate_record(), splintr_pattern=str(getattr(candidate, "splintr_pattern", "")))
        texts += (("this vocabulary's special-token text", " ".join(f"{t} a{t}b" for t in ranked.special_tokens)),)
    problem = admit(candidate, record, lambda: TiktokenTokenizer(spec, separator=separator), lambda _: texts)
    return (candidate, None) if problem is None else (None, problem)


def accelerated(spec: str, *, required: bool, warn: Callable[[str], None] | None = None,
                gated: bool = False, threads: int = 1, separator: str | None = None) -> Tokenizer:  # fmt: skip
    """The splintr backend for the tiktoken vocabulary `spec` when it is installed and exact on
    the sample, else tiktoken (`required=False`: silently when splintr is not installed, through
    `warn` when it is not exact) or a TokenizerError (`required=True`). `gated=True` trusts a
    gate this run already passed (prepare's workers); `threads` sizes splintr's thread pool;
    `separator` names a special token of a `families` vocabulary to separate documents."""
    from .tiktoken_backend import TiktokenTokenizer

    try:
        import splintr  # noqa: F401
    except ImportError:
        if required:
            raise TokenizerError(FAST_EXTRA) from None
        return TiktokenTokenizer(spec, separator=separator)
    if gated:
        from .splintr_backend import SplintrTokenizer

        return SplintrTokenizer(spec, threads=threads, separator=separator)
    candidate, problem = _candidate_problem(spec, threads, separator)
    if candidate is not None:
        return candidate
    if required:
        raise TokenizerError(f"--tokenizer-backend splintr is not exact for {spec} here ({problem}); "
                             "use --tokenizer-backend tiktoken or auto")  # fmt: skip
    if warn is not None:
        warn(f"{spec}: the splintr backend is not exact here, falling back to tiktoken: {problem}")
    return TiktokenTokenizer(spec, separator=separator)
