"""tiktoken-format vocabularies that are not OpenAI's: a ranks file (one base64 token, a space and
its rank per line) and the split pattern and special tokens that go with it, which the file
itself does not hold. `--tokenizer` names one in either of two ways:

- `FAMILY:PATH`, for a family lmshard knows (`FAMILIES`):

  - `qwen:PATH`: Qwen's `qwen.tiktoken` (Qwen-1, 151,643 ranks). Special tokens from id
    len(ranks) on: `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, then `<|extra_0|>` …
    `<|extra_204|>`. Separator `<|endoftext|>`, no BOS. Qwen's own tokenizer puts text in
    Unicode NFC before encoding (and the tokenizer.json of Qwen2 and later has an NFC
    normalizer), so lmshard does too: both backends encode `unicodedata.normalize("NFC", text)`,
    and the exactness gate compares them on that normalized text.
  - `llama3:PATH`: Meta's Llama 3 `tokenizer.model` (128,000 ranks). 256 special tokens from id
    len(ranks) on, named as Llama 3.1 and 3.2 name them: `<|begin_of_text|>`, `<|end_of_text|>`,
    `<|reserved_special_token_0|>`, `<|reserved_special_token_1|>`, `<|finetune_right_pad_id|>`,
    `<|reserved_special_token_2|>`, `<|start_header_id|>`, `<|end_header_id|>`, `<|eom_id|>`,
    `<|eot_id|>`, `<|python_tag|>`, then `<|reserved_special_token_3|>` … `_247|>`. Separator
    `<|end_of_text|>`; BOS `<|begin_of_text|>`, written before each document with `--bos auto`,
    as the Hugging Face Llama 3 tokenizer adds it to every text.

- `PATH`, with the definition in `PATH.json` beside it (`my.tiktoken` and `my.tiktoken.json`):

      {"pattern": "'s|'t| ?\\\\p{L}+| ?\\\\p{N}+| ?[^\\\\s\\\\p{L}\\\\p{N}]+|\\\\s+(?!\\\\S)|\\\\s+",
       "special_tokens": {"<|endoftext|>": 1000},
       "separator": "<|endoftext|>",
       "bos": null,
       "nfc": false}

  `pattern` is the split regex as tiktoken takes it (`pat_str`); `special_tokens` maps each
  special token's text to its id, which must not be a rank of the file. Optional: `separator`,
  the special token written between documents (default `<|endoftext|>` when defined, or the only
  special token); `bos`, a special token written before each document with `--bos auto`;
  `nfc`, true to encode text in Unicode NFC.

The vocabulary's name is the `--tokenizer` value as given, its sha256 that of the ranks file
followed by its pattern, special tokens and normalization (so that `--append` refuses a changed
definition), its size the highest id of ranks and special tokens plus one. `--separator` may name any of its
special tokens. Backends: `tiktoken` (the reference) and `splintr`, which is exact only when the
pattern is one of its own constants (both families' are: `QWEN2_PATTERN`, `LLAMA3_PATTERN`) and
is admitted by the gate as for OpenAI's vocabularies.

Memory model: the ranks file's bytes (2-3 MB) and one int per rank while it is checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import TokenizerError
from .base import Tokenizer


@dataclass(frozen=True)
class Family:
    """What a known family's ranks file does not say: how text is split, which special tokens
    follow the ranks (from id len(ranks) on, in this order), and which of them separate
    documents and begin them."""

    pattern: str
    specials: tuple[str, ...]
    separator: str
    n_ranks: int  # how many ranks the family's file holds: another file is refused
    bos: str | None = None
    nfc: bool = False


_LLAMA3_NAMED = ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                 "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                 "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>")  # fmt: skip
FAMILIES = {
    # splintr's QWEN2_PATTERN: Qwen's PAT_STR (tokenization_qwen.py), one digit per piece
    "qwen": Family(
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
        r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *(f"<|extra_{i}|>" for i in range(205))),
        separator="<|endoftext|>",
        n_ranks=151_643,
        nfc=True,
    ),
    # splintr's LLAMA3_PATTERN: Meta's pat_str (llama/tokenizer.py), up to three digits per piece
    "llama3": Family(
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
        r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
        (*_LLAMA3_NAMED, *(f"<|reserved_special_token_{i}|>" for i in range(3, 248))),
        separator="<|end_of_text|>",
        n_ranks=128_000,
        bos="<|begin_of_text|>",
    ),
}
_FAMILY_SPEC = re.compile(r"([A-Za-z][A-Za-z0-9_]*):(.+)", re.DOTALL)


@dataclass(frozen=True)
class RanksVocabulary:
    """One non-OpenAI tiktoken vocabulary, checked: its ranks file's bytes and what goes with them."""

    spec: str  # the --tokenizer value as given: the vocabulary's name
    kind: str  # the family ("qwen", "llama3"), or "definition" (PATH.json)
    file: Path
    data: bytes = field(repr=False)  # the ranks file as read and hashed
    sha256: str
    pattern: str
    special_tokens: dict[str, int]
    separator: str
    bos: str | None
    nfc: bool
    n_vocab: int  # the highest id of ranks and special tokens, plus one

    def eot(self, separator: str | None) -> tuple[str, int]:
        """(text, id) of the document separator: `separator` when given, else the definition's."""
        token = separator or self.separator
        if token not in self.special_tokens:
            shown = ", ".join(list(self.special_tokens)[:6]) + (", …" if len(self.special_tokens) > 6 else "")
            raise TokenizerError(f"{self.spec}: --separator {token!r} is not a special token of this vocabulary; "
                                 f"use one of {shown}")  # fmt: skip
        return token, self.special_tokens[token]

    def gate_record(self) -> dict[str, str]:
        """What the exactness gate's remembered pass depends on beyond the ranks' sha256."""
        specials = json.dumps(self.special_tokens, sort_keys=True).encode()
        return {"pattern": self.pattern, "special_tokens_sha256": hashlib.sha256(specials).hexdigest(),
                "nfc": str(self.nfc)}  # fmt: skip


def describe(tok: Tokenizer, vocab: RanksVocabulary, separator: str | None) -> None:
    """Set the identity every backend of `vocab` shares: name, hash, size, separator and BOS."""
    tok.name, tok.vocab_sha256, tok.n_vocab = vocab.spec, vocab.sha256, vocab.n_vocab
    tok.eot_token, tok.eot_id = vocab.eot(separator)
    if vocab.bos is not None:
        tok.bos_token, tok.bos_id, tok.adds_bos = vocab.bos, vocab.special_tokens[vocab.bos], True


def nfc(texts: Sequence[str]) -> list[str]:
    return [unicodedata.normalize("NFC", t) for t in texts]


def sidecar(path: Path) -> Path:
    """Where the definition of the ranks file `path` lives: `PATH.json`."""
    return path.with_name(path.name + ".json")


def split_spec(spec: str) -> tuple[str, str] | None:
    """(family, path) of a `FAMILY:PATH` value, else None (an existing path is a path)."""
    found = _FAMILY_SPEC.fullmatch(spec)
    if found is None or os.path.exists(spec):
        return None
    return found[1], found[2]


def is_ranks_spec(spec: str) -> bool:
    """Whether `spec` names a vocabulary of this module: `FAMILY:PATH`, or a file with `PATH.json` beside it."""
    path = Path(spec)
    return split_spec(spec) is not None or (not spec.endswith(".json") and path.is_file() and sidecar(path).is_file())


def load(spec: str) -> RanksVocabulary | None:
    """The vocabulary `spec` names (see the module docstring), checked; None when `spec` is not
    one of this module's (`is_ranks_spec`). Raises `TokenizerError` naming the file and the fix."""
    if not is_ranks_spec(spec):
        return None
    parts = split_spec(spec)
    path = Path(parts[1] if parts else spec)
    if parts and parts[0] not in FAMILIES:
        raise TokenizerError(f"{spec}: unknown tokenizer family {parts[0]!r}; use one of "
                             f"{', '.join(f'{f}:PATH' for f in FAMILIES)}, or define the vocabulary in "
                             f"{sidecar(path)} and pass {path}")  # fmt: skip
    if not path.is_file():
        raise TokenizerError(f"{path}: no such vocabulary file")
    definition = sidecar(path) if parts is None else None
    return _load(spec, parts[0] if parts else None, path, _stat(path), definition, _stat(definition))


def _stat(path: Path | None) -> tuple[int, ...] | None:
    if path is None:
        return None
    s = path.stat()
    return s.st_ino, s.st_size, s.st_mtime_ns


@lru_cache(maxsize=4)  # a load runs the gate's candidate and reference: the file is read and checked once
def _load(spec: str, family: str | None, path: Path, _key: Any, definition: Path | None, _dkey: Any
          ) -> RanksVocabulary:  # fmt: skip
    data = path.read_bytes()
    ranks = _ranks(path, data)
    if family is not None:
        fam = FAMILIES[family]
        if len(ranks) != fam.n_ranks:
            others = [f"{name}:" for name, f in FAMILIES.items() if f.n_ranks == len(ranks)]
            hint = f"it is a {others[0]}PATH file" if others else "define it in a PATH.json instead"
            raise TokenizerError(f"{path}: {len(ranks):,} ranks, where the {family} family's file has "
                                 f"{fam.n_ranks:,}; {hint}")  # fmt: skip
        specials = {text: len(ranks) + i for i, text in enumerate(fam.specials)}
        pattern, separator, bos, normalize = fam.pattern, fam.separator, fam.bos, fam.nfc
    else:
        assert definition is not None  # is_ranks_spec found it
        pattern, specials, separator, bos, normalize = _definition(definition)
    clash = next((t for t, i in specials.items() if i in ranks), None)
    if clash is not None:
        where = definition or f"the {family} family"
        raise TokenizerError(f"{path}: special token {clash} has id {specials[clash]} (from {where}), also a rank "
                             f"of the file (its ranks go up to {max(ranks)}); is it a {family or 'tiktoken'} "
                             "vocabulary?")  # fmt: skip
    # The vocabulary's hash covers what decides its tokens beyond the ranks, so that --append
    # (and every check of the hash) refuses a changed pattern, special tokens or normalization.
    digest = hashlib.sha256(data)
    digest.update(json.dumps({"pattern": pattern, "special_tokens": specials, "nfc": normalize},
                             sort_keys=True).encode())  # fmt: skip
    return RanksVocabulary(spec=spec, kind=family or "definition", file=path, data=data,
                           sha256=digest.hexdigest(), pattern=pattern, special_tokens=specials,
                           separator=separator, bos=bos, nfc=normalize,
                           n_vocab=max(max(ranks, default=-1), *specials.values()) + 1)  # fmt: skip


def _ranks(path: Path, data: bytes) -> set[int]:
    """The ranks of a tiktoken ranks file, checked to be one per line and distinct."""
    ranks: set[int] = set()
    for number, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) in ranks:
            raise TokenizerError(f"{path}: line {number} is not '<base64 token> <rank>' with a rank of its own; "
                                 "pass a tiktoken ranks file (.tiktoken, or Llama 3's tokenizer.model)")  # fmt: skip
        ranks.add(int(parts[1]))
    if not ranks:
        raise TokenizerError(f"{path}: no ranks in the file; pass a tiktoken ranks file")
    return ranks


def _definition(file: Path) -> tuple[str, dict[str, int], str, str | None, bool]:
    """(pattern, special tokens, separator, bos, nfc) from a PATH.json definition."""
    fix = ('write {"pattern": "<split regex>", "special_tokens": {"<|endoftext|>": ID}} and optionally '
           '"separator", "bos", "nfc"')  # fmt: skip
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise TokenizerError(f"{file}: not a readable JSON definition ({e}); {fix}") from None
    specials = raw.get("special_tokens") if isinstance(raw, dict) else None
    if not (isinstance(raw, dict) and isinstance(raw.get("pattern"), str) and isinstance(specials, dict) and specials
            and all(isinstance(t, str) and type(i) is int and i >= 0 for t, i in specials.items())):  # fmt: skip
        raise TokenizerError(f"{file}: needs a string \"pattern\" and \"special_tokens\" mapping each text to an id "
                             f"(at least one); {fix}")  # fmt: skip
    default = "<|endoftext|>" if "<|endoftext|>" in specials or len(specials) > 1 else next(iter(specials))
    separator, bos, normalize = raw.get("separator") or default, raw.get("bos"), raw.get("nfc", False)
    for key, token in (("separator", separator), ("bos", bos)):
        if token is not None and token not in specials:
            raise TokenizerError(f"{file}: {key} {token!r} is not one of its special_tokens; add it there or "
                                 f"name one of {', '.join(list(specials)[:6])}")  # fmt: skip
    if not isinstance(normalize, bool):
        raise TokenizerError(f'{file}: "nfc" is {normalize!r}; make it true or false')
    return raw["pattern"], dict(specials), separator, bos, normalize
