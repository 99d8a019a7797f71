"""A byte-level BPE tokenizer.json as a ranks table: the form tiktoken's vocabularies come in
(each token's bytes in base64 and its rank), which splintr loads with its rank loader
(`splintr.Tokenizer.from_bytes`, as it loads GPT-2's) in a third of the time and a quarter of
the memory of its tokenizer.json reader (Llama 3: 0.08 s and 17 MB against 0.23 s and 76 MB).

Only files whose encoding a ranks table can express qualify (`ranks_form`): a BPE model that
emits a piece found whole in the vocabulary without merging it (`ignore_merges`, as tiktoken
does: Llama 3), with no dropout, no subword prefix or suffix and no byte fallback, no normalizer, a byte-level
pre-tokenizer whose split pattern is explicit (Llama 3: a Split regex then ByteLevel without its
own regex; GPT-2 style: ByteLevel with its regex), no ordinary added tokens (special ones are
left out as `hf_fast.splintr_copy` leaves them: lmshard encodes their text as text), merges in
the order of the ranks of the tokens they make (merging by merge order is merging by rank), and
every way of cutting a token into two tokens of the vocabulary listed as a merge: a ranks table
merges any adjacent pair whose bytes make a token, `tokenizers` only the listed ones. This is
what converting a tiktoken vocabulary to a tokenizer.json writes (Llama 3's: every cut listed).
Whatever qualifies is still admitted only through the exactness gate (hf_fast.py), id for id
against `tokenizers`; a file that fails it there is read by splintr's tokenizer.json reader.

Memory model: the ranks table (about a fifth of the file) while it is built and loaded.
"""

from __future__ import annotations

import base64
import json
from typing import Any

# The split pattern of `tokenizers`' ByteLevel pre-tokenizer when it uses its own regex (GPT-2's).
BYTE_LEVEL_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def _byte_decoder() -> dict[str, int]:
    """GPT-2's map of printable characters back to the bytes they stand for."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(kept), 0
    for b in range(256):
        if b not in kept:
            kept.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(kept, chars, strict=True)}


def _pattern(pre: Any) -> str | None:
    """The split pattern of a byte-level pre-tokenizer, or None for any other."""
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "ByteLevel":
        plain = pre.get("use_regex", True) is True and not pre.get("add_prefix_space")
        return BYTE_LEVEL_PATTERN if plain else None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not isinstance(steps, list) or len(steps) != 2 or not all(isinstance(s, dict) for s in steps):
        return None
    split, level = steps
    regex = split.get("pattern", {}).get("Regex") if isinstance(split.get("pattern"), dict) else None
    if split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert") or \
            not isinstance(regex, str):  # fmt: skip
        return None
    if level.get("type") != "ByteLevel" or level.get("use_regex") is not False or level.get("add_prefix_space"):
        return None
    return regex


def ranks_form(parsed: dict[str, Any]) -> tuple[str, bytes] | None:
    """(split pattern, ranks table) of a tokenizer.json that qualifies (module docstring), else None."""
    model = parsed.get("model")
    if not isinstance(model, dict) or model.get("type") != "BPE" or parsed.get("normalizer") is not None:
        return None
    if model.get("ignore_merges") is not True or model.get("dropout") or model.get("continuing_subword_prefix") or \
            model.get("end_of_word_suffix") or model.get("byte_fallback"):  # fmt: skip
        return None
    added = parsed.get("added_tokens") or []
    if any(not (isinstance(t, dict) and t.get("special")) for t in added):
        return None
    pattern = _pattern(parsed.get("pre_tokenizer"))
    vocab = model.get("vocab")
    if pattern is None or not isinstance(vocab, dict):
        return None
    merges = _merge_pairs(model.get("merges"))
    if merges is None or not _merges_follow_ranks(merges, vocab) or not _every_cut_listed(set(merges), vocab):
        return None
    decoder = _byte_decoder()
    lines = []
    for token, rank in vocab.items():
        if not isinstance(rank, int) or not all(ch in decoder for ch in token):
            return None
        lines.append(base64.b64encode(bytes(decoder[ch] for ch in token)) + b" %d\n" % rank)
    return pattern, b"".join(lines)


def _merge_pairs(merges: Any) -> list[tuple[str, str]] | None:
    """The merges as (left, right) pairs ("a b" strings or [a, b] lists), None if malformed."""
    if not isinstance(merges, list):
        return None
    pairs = []
    for merge in merges:
        pair = merge.split(" ", 1) if isinstance(merge, str) else merge
        if not isinstance(pair, list | tuple) or len(pair) != 2 or not all(isinstance(p, str) for p in pair):
            return None
        pairs.append((pair[0], pair[1]))
    return pairs


def _merges_follow_ranks(merges: list[tuple[str, str]], vocab: dict[str, Any]) -> bool:
    """Each merge makes a token of a rank no lower than the merge before it makes (several
    merges may make one token: Llama 3's make 128k tokens with 280k merges)."""
    last = -1
    for left, right in merges:
        rank = vocab.get(left + right)
        if not isinstance(rank, int) or rank < last:
            return False
        last = rank
    return True


def _every_cut_listed(merges: set[tuple[str, str]], vocab: dict[str, Any]) -> bool:
    """Every cut of every token into two tokens of the vocabulary is a listed merge."""
    for token in vocab:
        for k in range(1, len(token)):
            left, right = token[:k], token[k:]
            if left in vocab and right in vocab and (left, right) not in merges:
                return False
    return True


def encode_form(form: tuple[str, bytes] | None) -> bytes:
    """The form as one payload for hf_cache (b"" for a file that does not qualify)."""
    return b"" if form is None else json.dumps(form[0]).encode() + b"\n" + form[1]


def decode_form(payload: bytes) -> tuple[str, bytes] | None:
    if not payload:
        return None
    head, _, ranks = payload.partition(b"\n")
    return json.loads(head), ranks
