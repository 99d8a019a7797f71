"""Small tokenizer.json vocabularies of the shape of real model families, trained here on local
text (the repository's own docs and the gate's sample), for tests of the Hugging Face backends.

A shape is what an encoder has to reproduce besides the merges: the normalizer, the
pre-tokenizer (and its regex), the model's flags (`ignore_merges`, `byte_fallback`), the special
tokens and the ordinary added tokens matched in text, and the post-processor. Each builder copies
those from the family's published tokenizer.json; only the vocabulary and merges are small
(`VOCAB_SIZE` tokens learned by `tokenizers`' own trainers, about 0.1-0.3 s each).

- llama3: Split(Llama 3 regex, digits in threes) + ByteLevel, `ignore_merges`, a template putting
  <|begin_of_text|> before each text, the specials above the vocabulary;
- qwen2: NFC, Split(Qwen2 regex, one digit a token) + ByteLevel, specials above the vocabulary,
  ordinary added tokens <tool_call>, <|fim_prefix|>… (Qwen2.5);
- deepseek: three Split regexes in sequence (digits, CJK, words/punctuation) + ByteLevel,
  specials at ids 0 and 1 (DeepSeek V3), ordinary added tokens <｜User｜>, <think>… (V3/R1);
- neox: NFC + ByteLevel with GPT-2's own regex (GPT-NeoX-20B, OLMo), <|endoftext|> and
  <|padding|> at ids 0 and 1, runs of spaces as ordinary added tokens;
- llama2: Metaspace (prepend "▁" to the first piece, no split) + BPE with byte fallback
  (<0x00>…<0xFF>), <unk>/<s>/</s> at ids 0-2 (Llama 2, Mistral v0.1 as transformers saves them);
- llama2_legacy: the same model behind the hub file's normalizer, Prepend("▁") + Replace(" ", "▁");
- gemma: Replace(" ", "▁") normalizer, no pre-tokenizer, byte fallback, <pad>/<eos>/<bos>/<unk>
  at ids 0-3, turn markers, whitespace runs and HTML tags as ordinary added tokens;

and families of other shapes:

- starcoder: Digits(one a piece) + ByteLevel with GPT-2's regex (StarCoder, SantaCoder);
- falcon: Punctuation(contiguous) + ByteLevel with GPT-2's regex + Digits + Split(three digits);
- bloom: Split(BLOOM's regex) + ByteLevel, <unk>/<s>/</s>/<pad> at ids 0-3;
- clip: NFC, whitespace folded, lowercase; Split(CLIP's regex, the rest removed) + ByteLevel;
  BPE with the end-of-word suffix "</w>";
- bert: WordPiece ("##" continuations) behind BertNormalizer (lowercase, accents stripped,
  CJK characters spaced) and BertPreTokenizer; [PAD]/[UNK]/[CLS]/[SEP]/[MASK], no end-of-text
  token of lmshard's list (SEPARATOR names the one to pass).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Iterator
from functools import lru_cache
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from lmshard.tokenizers.base import utf8_safe
from lmshard.tokenizers.gate import sample

REPO = Path(__file__).resolve().parents[1]
VOCAB_SIZE = 3000

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
BLOOM_REGEX = " ?[^(\\s|[.,!?…。，、।۔،])]+"
CLIP_REGEX = r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"
DEEPSEEK_REGEXES = (
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)

# (special tokens, ordinary added tokens) of each family, as its tokenizer.json lists them.
SPECIALS = {
    "llama3": (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|reserved_special_token_1|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
                "<|eot_id|>", "<|python_tag|>"], []),
    "qwen2": (["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|vision_pad|>"],
              ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
               "<|file_sep|>"]),
    "deepseek": (["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜fim▁hole｜>"],
                 ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"]),
    "neox": (["<|endoftext|>", "<|padding|>"], ["  ", "    ", "        ", "\t\t"]),
    "llama2": (["<unk>", "<s>", "</s>"], []),
    "llama2_legacy": (["<unk>", "<s>", "</s>"], []),
    "gemma": (["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
              ["\n\n", "▁▁", "<table>", "</table>"]),
    "starcoder": (["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<filename>",
                   "<gh_stars>"], []),
    "falcon": ([">>TITLE<<", ">>ABSTRACT<<", ">>INTRODUCTION<<", "<|endoftext|>"], []),
    "bloom": (["<unk>", "<s>", "</s>", "<pad>"], []),
    "clip": (["<|startoftext|>", "<|endoftext|>"], []),
    "bert": (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], []),
}  # fmt: skip
SEPARATOR = {"bert": "[SEP]"}  # where the vocabulary has no end-of-text token lmshard knows
BOS = {"llama3": "<|begin_of_text|>", "deepseek": "<｜begin▁of▁sentence｜>", "llama2": "<s>", "llama2_legacy": "<s>",
       "gemma": "<bos>"}  # fmt: skip


@lru_cache(maxsize=1)
def training_texts() -> tuple[str, ...]:
    """The repository's docs and README, a paragraph a text, and the first 2,000 characters of
    each text of the gate's sample (lone surrogates repaired): English prose, code, tables, and
    every script the sample holds. The sample's long single words are cut because the trainer's
    time grows with word length (0.5 s a vocabulary with them whole, 0.1 s cut)."""
    return tuple(_paragraphs()) + tuple(utf8_safe(text[:2000]) for _, text in sample())


def _paragraphs() -> list[str]:
    texts: list[str] = []
    for path in sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]:
        texts += [p for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    return texts


def local_documents() -> list[str]:
    """Distinct paragraphs of the repository's docs (a few hundred), NFC, for end-to-end runs."""
    return list(dict.fromkeys(unicodedata.normalize("NFC", t) for t in _paragraphs()))


def _split(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)


def _train(tok: Tokenizer, trainer: trainers.BpeTrainer) -> None:
    tok.train_from_iterator(iter(training_texts()), trainer)


def _specials(tokens: list[str]) -> list[AddedToken]:
    return [AddedToken(t, special=True, normalized=False) for t in tokens]


def _with_bos(tok: Tokenizer, bos: str, *, byte_level: bool) -> None:
    """The family's post-processor: a template putting BOS before each text (after ByteLevel's
    offset trimming for Llama 3)."""
    template = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                             special_tokens=[(bos, tok.token_to_id(bos))])  # fmt: skip
    tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), template]) if byte_level \
        else template  # fmt: skip


def byte_level(kind: str) -> Tokenizer:
    """A byte-level BPE of the family `kind` (llama3, qwen2, deepseek, neox)."""
    specials, plain = SPECIALS[kind]
    tok = Tokenizer(models.BPE(ignore_merges=kind == "llama3"))
    bytes_only = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)
    if kind == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([_split(LLAMA3_REGEX), bytes_only])
    elif kind == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([_split(QWEN2_REGEX), bytes_only])
    elif kind == "deepseek":
        tok.pre_tokenizer = pre_tokenizers.Sequence([*map(_split, DEEPSEEK_REGEXES), bytes_only])
    else:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    first = kind in ("deepseek", "neox")  # their specials have the lowest ids, the others' the highest
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=specials if first else [], show_progress=False)  # fmt: skip
    _train(tok, trainer)
    if not first:
        tok.add_special_tokens(_specials(specials))
    tok.add_tokens([AddedToken(t, special=False, normalized=kind == "neox") for t in plain])
    if kind in BOS:
        _with_bos(tok, BOS[kind], byte_level=True)
    return tok


def sentencepiece(kind: str) -> Tokenizer:
    """A SentencePiece-converted BPE with byte fallback (llama2, llama2_legacy, gemma): the 256
    <0xNN> byte tokens are ordinary vocabulary entries, the specials have the lowest ids."""
    specials, plain = SPECIALS[kind]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    if kind == "llama2":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:
        replace = normalizers.Replace(" ", "▁")
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), replace]) if kind == "llama2_legacy" \
            else replace  # fmt: skip
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    # Letters beyond the 400 most frequent are left to byte fallback (SentencePiece's character
    # coverage): the gate's sample holds every code point of U+0000-07FF and more.
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials[:4] + byte_tokens,
                                  limit_alphabet=400, show_progress=False)  # fmt: skip
    _train(tok, trainer)
    # The trainer registers its special tokens as added tokens; in a converted SentencePiece
    # file the byte tokens are plain vocabulary entries, reached only through byte fallback.
    data = json.loads(tok.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] not in byte_tokens]
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens(_specials(specials[4:]))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    _with_bos(tok, BOS[kind], byte_level=False)
    return tok


def _gpt2_bytes() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)


def other_byte_level(kind: str) -> Tokenizer:
    """A byte-level BPE of the family `kind` (starcoder, falcon, bloom, clip), specials first."""
    clip = {"end_of_word_suffix": "</w>", "unk_token": "<|endoftext|>"} if kind == "clip" else {}
    tok = Tokenizer(models.BPE(**clip))
    bytes_only = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)
    if kind == "starcoder":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2_bytes()])
    elif kind == "falcon":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Punctuation("contiguous"), _gpt2_bytes(),
                                                     pre_tokenizers.Digits(individual_digits=False),
                                                     _split("[0-9][0-9][0-9]")])  # fmt: skip
    elif kind == "bloom":
        tok.pre_tokenizer = pre_tokenizers.Sequence([_split(BLOOM_REGEX), bytes_only])
    else:
        tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                               normalizers.Lowercase()])  # fmt: skip
        keep = pre_tokenizers.Split(Regex(CLIP_REGEX), behavior="removed", invert=True)
        tok.pre_tokenizer = pre_tokenizers.Sequence([keep, bytes_only])
    tok.decoder = decoders.ByteLevel()
    suffix = {"end_of_word_suffix": "</w>"} if kind == "clip" else {}
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=SPECIALS[kind][0], show_progress=False, **suffix)  # fmt: skip
    _train(tok, trainer)
    return tok


def bert() -> Tokenizer:
    """BERT (uncased): WordPiece behind BertNormalizer and BertPreTokenizer."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=True,
                                                lowercase=True)  # fmt: skip
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(iter(training_texts()), trainers.WordPieceTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS["bert"][0], show_progress=False))  # fmt: skip
    return tok


BUILDERS: dict[str, Callable[[], Tokenizer]] = {
    **{kind: (lambda k=kind: byte_level(k)) for kind in ("llama3", "qwen2", "deepseek", "neox")},
    **{kind: (lambda k=kind: sentencepiece(k)) for kind in ("llama2", "llama2_legacy", "gemma")},
    **{kind: (lambda k=kind: other_byte_level(k)) for kind in ("starcoder", "falcon", "bloom", "clip")},
    "bert": bert,
}
SHAPES = tuple(BUILDERS)


def build(kind: str, directory: Path) -> Path:
    """The shape `kind` trained and saved as directory/tokenizer.json."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    BUILDERS[kind]().save(str(path))
    return path


def added_tokens(kind: str) -> Iterator[str]:
    """Every special and ordinary added token of the shape `kind`."""
    specials, plain = SPECIALS[kind]
    yield from specials
    yield from plain
