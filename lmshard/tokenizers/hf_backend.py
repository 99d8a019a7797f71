"""The `tokenizers` backend: Hugging Face tokenizer.json vocabularies (Llama 3, Qwen, Mistral,
GPT-NeoX…) encoded by the Rust `tokenizers` library, ordinary text only.

Which files: `hf_resolve` (a tokenizer.json, a save_pretrained directory, or a hub name from the
local cache). Which special tokens, in this order:

- the separator written between documents (`eot_id`): the `separator` argument; else the
  `eos_token` of special_tokens_map.json / tokenizer_config.json, except that a chat end-of-turn
  marker (`<|im_end|>`, `<|eot_id|>`, …) gives way to the vocabulary's document end-of-text token
  when it has one (Qwen2.5 base configs name `<|im_end|>`, but its pretraining documents are
  separated by `<|endoftext|>`); else the first of `EOS_CANDIDATES` in the vocabulary. It must be
  a special token, so no document can produce its id;
- `bos_id`: `bos_token` of the configs, else the special token the post-processor puts before
  each text, else the first of `BOS_CANDIDATES`; None when there is none (Qwen, GPT-NeoX use
  their end-of-text token);
- `adds_bos`: the tokenizer's own setup adds a BOS to each text, by tokenizer_config's
  `add_bos_token` when it says, else by the post-processor (Llama 3's TemplateProcessing).

Accelerated: `accelerate(encoder)` hands encoding to splintr's loader of the same file
(`hf_fast`, which admits it only through the exactness gate); everything else (special tokens,
identity, decoding) stays here, and `reference()` is the same tokenizer through `tokenizers`.

Threads: `tokenizers` encodes a batch on a Rayon thread pool shared by the whole process, sized
by RAYON_NUM_THREADS when first used and switched by TOKENIZERS_PARALLELISM at every call. lmshard
runs one tokenizer per worker process, so `threads=1` (the default) switches the pool off and
never starts it; `threads=0` (all cores) or N > 1 suit a single worker. Both variables are set
around each encode call only, so the caller's process keeps its own settings.

Memory model: the file's bytes (kept for the dataset's copy, so it is the file that was
hashed). Its parsed JSON (a few times the file) and the Rust vocabulary (about the file's size)
only once something needs them: the first load of a file (its facts are then remembered,
hf_cache.py), the gate, a decode, a text routed to `tokenizers`. When accelerated, splintr's
tables (17 MB for Llama 3 in the ranks form, hf_ranks.py; about 76 MB read from its
tokenizer.json). During `encode_batch` through `tokenizers`, one batch's Encoding objects and
Python id lists (about 40 bytes a token) and the uint32 result (4 bytes a token).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TokenizerError, missing_dependency
from ..format import TOKEN_DTYPE
from . import hf_cache
from .base import Tokenizer, flatten, utf8_safe
from .hf_cache import newer_code_points
from .hf_resolve import Source, read_untrusted, resolve

# Document end-of-text tokens of well-known families: GPT-2/NeoX/Qwen/StarCoder, Llama 3,
# Llama 2/Mistral/T5-style SentencePiece, Gemma, DeepSeek.
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<｜end▁of▁sentence｜>")
BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<｜begin▁of▁sentence｜>")
# End-of-turn markers of chat templates (ChatML, Llama 3 Instruct, Gemma, Phi-3): a chat model's
# configured EOS, but not what separates pretraining documents.
CHAT_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>")


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `values` set, and the caller's own values back afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _token_text(value: Any) -> str | None:
    """A special token as the configs write it: a string, or {"content": ..., ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_configs(configs: Mapping[str, Path]) -> dict[str, Any]:
    """tokenizer_config.json overlaid with special_tokens_map.json, as transformers merges them."""
    merged: dict[str, Any] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if name not in configs:
            continue
        try:
            data = json.loads(configs[name].read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as e:  # ValueError: bad UTF-8 or JSON
            raise TokenizerError(f"{configs[name]}: not a readable JSON file ({str(e)[:200] or type(e).__name__}); "
                                 "fix or delete it") from None  # fmt: skip
        if not isinstance(data, dict):
            raise TokenizerError(f"{configs[name]}: expected a JSON object; fix or delete it")
        merged.update({k: v for k, v in data.items() if v is not None or k not in merged})
    return merged


def _template_bos(node: Any) -> str | None:
    """The special token a post-processor puts before the text of a single sequence, if any."""
    if not isinstance(node, dict):
        return None
    kind = node.get("type")
    if kind == "Sequence":
        found = (_template_bos(p) for p in node.get("processors") or [])
        return next((t for t in found if t is not None), None)
    if kind in ("BertProcessing", "RobertaProcessing"):
        cls = node.get("cls")
        return cls[0] if isinstance(cls, list) and cls and isinstance(cls[0], str) else None
    if kind != "TemplateProcessing":
        return None
    for piece in node.get("single") or []:
        if not isinstance(piece, dict) or "Sequence" in piece:
            return None  # the text comes first: nothing is put before it
        special = piece.get("SpecialToken")
        if isinstance(special, dict) and isinstance(special.get("id"), str):
            return str(special["id"])
    return None


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


class HFTokenizer(Tokenizer):
    """A Hugging Face tokenizer.json through the `tokenizers` library.

    >>> tok = HFTokenizer("meta-llama/Meta-Llama-3-8B")     # doctest: +SKIP  (from the local cache)
    >>> tok.eot_token, tok.bos_token, tok.adds_bos
    ('<|end_of_text|>', '<|begin_of_text|>', True)
    >>> tokens, lengths = tok.encode_batch(["Hello world", "Bye"])
    """

    def __init__(self, spec: str, *, separator: str | None = None, threads: int = 1, untrusted: bool = False) -> None:
        """`untrusted`: see `hf_resolve.resolve` (a name read from a dataset's metadata)."""
        try:
            import tokenizers
        except ImportError:
            raise missing_dependency("tokenizers", "tokenizers", f"the tokenizer {spec}") from None
        if threads < 0:
            raise TokenizerError(f"threads must be 0 (all cores) or more, not {threads}")
        self.name, self.backend, self.spec = spec, "tokenizers", spec
        self.vocab_format = "tokenizer.json"
        self._fast_load: Callable[[], Any] | None = None  # loads splintr's encoder of this file (`accelerate`)
        self._fast: Any = None  # that encoder, loaded at this process's first encode
        self._fast_version: str | None = None
        self.splintr_form: str | None = None  # set by `accelerate`
        self.source: Source = resolve(spec, untrusted=untrusted)
        self.vocab_file = self.source.tokenizer_json
        self.vocab_bytes = self._read(self.vocab_file, untrusted)
        self.vocab_sha256 = hashlib.sha256(self.vocab_bytes).hexdigest()
        # The parsed file and the `tokenizers` object, each made when first needed (a text
        # routed to `tokenizers`, a decode, the gate): a dict shared with `reference()`'s copy.
        self._lazy: dict[str, Any] = {}
        self._version = tokenizers.__version__
        self._threads = threads
        self._set_threads(threads)
        # Known from an earlier load of this file (hf_cache.py), or computed now (the file checked)
        known = hf_cache.facts((self.vocab_sha256, self._version, hf_cache.source_sha256(__file__)), self._facts)
        self._specials: dict[str, int] = dict(known["specials"])
        self.n_vocab, self._template, self._model_type = known["n_vocab"], known["template"], known["model"]
        self._choose_specials(_read_configs(self.source.configs), separator)

    def _facts(self) -> dict[str, Any]:
        """What the rest of this class needs of the vocabulary, read from the file itself."""
        parsed, tok = self._json, self._tok
        model = parsed.get("model")
        return {"specials": {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special},
                "n_vocab": max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1,
                "template": _template_bos(parsed.get("post_processor")),
                "model": model.get("type") if isinstance(model, dict) else None}  # fmt: skip

    @property
    def _json(self) -> dict[str, Any]:
        """The file's JSON, parsed and checked when first asked for."""
        if "json" not in self._lazy:
            assert self.vocab_file is not None and self.vocab_bytes is not None
            self._lazy["json"] = self._parse(self.vocab_file, self.vocab_bytes)
        return self._lazy["json"]

    @property
    def _tok(self) -> Any:
        """The `tokenizers` object of the file, built when first asked for."""
        if "tok" not in self._lazy:
            import tokenizers

            path, data = self.vocab_file, self.vocab_bytes
            assert path is not None and data is not None
            try:
                tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as e:  # serde's message as a bare Exception, or a Rust panic (PanicException)
                self._parse(path, data)  # not JSON, or no model: that error is the clearer one
                raise TokenizerError(f"{self.vocab_file}: not a tokenizer.json this tokenizers version can load "
                                     f"({str(e).splitlines()[0][:200]})") from None  # fmt: skip
            # Text such as "<|endoftext|>" inside a document is ordinary text, never the special
            # id; truncation or padding saved in the file (fine-tune exports) would cut or pad.
            tok.encode_special_tokens = True
            tok.no_truncation()
            tok.no_padding()
            self._lazy["tok"] = tok
        return self._lazy["tok"]

    def release(self) -> None:
        """Drop the parsed file (before forking workers: they need splintr's copy only)."""
        self._lazy.pop("json", None)

    @staticmethod
    def _read(path: Path, untrusted: bool) -> bytes:
        try:
            return read_untrusted(path) if untrusted else path.read_bytes()
        except OSError as e:
            raise TokenizerError(f"{path}: cannot read ({e.strerror or e})") from None

    @staticmethod
    def _parse(path: Path, data: bytes) -> dict[str, Any]:
        try:
            parsed = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON, an int of 4,300+ digits, deep nesting
            why = str(e)[:200] or type(e).__name__
            raise TokenizerError(f"{path}: not a JSON tokenizer file ({why}); pass a tokenizer.json "
                                 "written by the tokenizers library or save_pretrained") from None  # fmt: skip
        if not isinstance(parsed, dict) or "model" not in parsed:
            raise TokenizerError(f"{path}: not a tokenizer.json (no \"model\" section); pass a tokenizer.json "
                                 "written by the tokenizers library or save_pretrained")  # fmt: skip
        return parsed

    def accelerate(self, load: Callable[[], Any], version: str, form: str = "json") -> None:
        """Encode with the splintr encoder `load()` returns (its reader of this file, admitted by
        the gate) from now on. It is loaded at this process's first encode, not here: splintr's
        reader starts a thread pool, and a process that runs threads cannot fork its workers
        (`pool.start_method`), which then load the vocabulary again."""
        self._fast_load, self._fast, self._fast_version, self.backend = load, None, version, "splintr"
        self.splintr_form = form  # how splintr reads the file: its ranks table or its tokenizer.json
        self.route(())  # the table built now, so that forked workers inherit it

    def load_for_forks(self) -> None:
        """splintr's encoder loaded now (its loader starts no thread; `early_pool` checks), for
        forked workers to share, as a tiktoken vocabulary's is (`Tokenizer.load_for_forks`)."""
        if self._fast_load is not None and self._fast is None:
            self._fast = self._fast_load()

    def reference(self) -> HFTokenizer:
        """This tokenizer encoding through `tokenizers`: the gate's reference, sharing the vocabulary."""
        ref = copy.copy(self)
        ref._fast_load, ref._fast, ref._fast_version, ref.backend = None, None, None, "tokenizers"
        ref.splintr_form = None
        return ref

    def use_threads(self, threads: int) -> None:
        self._threads = threads
        self._set_threads(threads)

    def _set_threads(self, threads: int) -> None:
        """The environment `tokenizers` reads, set around each encode call only (the caller's
        own values come back after it): TOKENIZERS_PARALLELISM at every call, RAYON_NUM_THREADS
        when its pool starts, which threads=1 never does."""
        self._env = {"TOKENIZERS_PARALLELISM": "false" if threads == 1 else "true"}
        if threads > 1 and "RAYON_NUM_THREADS" not in os.environ:
            self._env["RAYON_NUM_THREADS"] = str(threads)

    def _choose_specials(self, config: dict[str, Any], separator: str | None) -> None:
        eot, self.eot_source = self._choose_eot(config, separator)
        self.eot_token, self.eot_id = eot, self._specials[eot]
        eos = _token_text(config.get("eos_token"))  # what trainers that load this config (Megatron) end documents with
        self.config_eos_token = eos if eos in self._specials else None
        template = self._template
        if "bos_token" in config:  # the config decides, null included (Qwen has no BOS)
            bos = _token_text(config["bos_token"])
        elif template is not None:
            bos = template
        else:
            bos = next((t for t in BOS_CANDIDATES if t in self._specials), None)
        bos = bos if bos in self._specials else None
        self.bos_token = bos
        self.bos_id = self._specials[bos] if bos is not None else None
        flag = config.get("add_bos_token")
        adds = flag if isinstance(flag, bool) else template is not None and template == bos
        self.adds_bos = bool(adds and bos is not None)

    def _choose_eot(self, config: dict[str, Any], separator: str | None) -> tuple[str, str]:
        if separator is not None:
            self._check_special(separator, "separator")
            return separator, "separator"
        eos = _token_text(config.get("eos_token"))
        doc_end = next((t for t in EOS_CANDIDATES if t in self._specials), None)
        if eos in CHAT_END_TOKENS and doc_end is not None:
            return doc_end, f"document end-of-text (the configured eos_token {eos} marks a chat turn)"
        if eos is not None and eos in self._specials:
            return eos, "eos_token"
        if doc_end is not None:
            return doc_end, "well-known end-of-text token"
        known = f"configured eos_token {eos!r} is not one of its special tokens" if eos else "no eos_token"
        raise TokenizerError(f"{self.name}: cannot tell which token separates documents ({known}); pass "
                             f"--separator TOKEN, one of: {self._special_list()}")  # fmt: skip

    def _check_special(self, token: str, what: str) -> None:
        if token in self._specials:
            return
        if self._tok.token_to_id(token) is not None:
            raise TokenizerError(f"{self.name}: {what} {token!r} is an ordinary token (documents produce it too); "
                                 f"pass a special token, one of: {self._special_list()}")  # fmt: skip
        raise TokenizerError(f"{self.name}: {what} {token!r} is not in the vocabulary; "
                             f"pass a special token, one of: {self._special_list()}")  # fmt: skip

    def _special_list(self, limit: int = 12) -> str:
        names = sorted(self._specials, key=self._specials.__getitem__)
        shown = ", ".join(names[:limit]) or "(none: this vocabulary has no special tokens)"
        return shown + (f" … ({len(names)} in all)" if len(names) > limit else "")

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        if self._fast_load is not None:
            return self._encode_fast(texts)
        return self._encode_reference(texts)

    def route(self, code_points: Sequence[int]) -> None:
        """Texts holding any of `code_points` (where the gate found splintr and `tokenizers`
        disagree) are encoded by `tokenizers`, as are those holding a code point unassigned in
        this Python's Unicode tables."""
        table = newer_code_points()
        if len(code_points):
            table = table.copy()
            table[np.asarray(code_points, dtype=np.int64)] = True
        self._route = table
        self._route_ascii = bool(table[:128].any())  # else an ASCII text is never routed

    def _routed(self, text: str) -> bool:
        if not text:  # some pre-tokenizers (Metaspace, prepend "first") give splintr one token for ""
            return True
        if text.isascii() and not self._route_ascii:
            return False
        return bool(self._route[_code_points(text)].any())

    def _encode_fast(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """splintr's ids, except for the texts `route` sends to `tokenizers`: where the two
        libraries' Unicode tables differ (normalization, letter and punctuation classes). Web
        text rarely holds such a code point, so a batch is nearly always one splintr call."""
        from .splintr_backend import load_pooled, splintr_encode

        threads = self._threads or os.cpu_count() or 1
        if self._fast is None:
            assert self._fast_load is not None
            self._fast = load_pooled(self._fast_load, threads)
        routed = [i for i, t in enumerate(texts) if self._routed(t)]
        if not routed:
            return splintr_encode(self._fast, texts, threads)
        if len(routed) == len(texts):
            return self._encode_reference(texts)
        plain = sorted(set(range(len(texts))) - set(routed))
        fast_tokens, fast_lengths = splintr_encode(self._fast, [texts[i] for i in plain], threads)
        ref_tokens, ref_lengths = self._encode_reference([texts[i] for i in routed])
        pieces: list[np.ndarray] = [np.empty(0, TOKEN_DTYPE)] * len(texts)
        for order, tokens, lengths in ((plain, fast_tokens, fast_lengths), (routed, ref_tokens, ref_lengths)):
            for i, piece in zip(order, np.split(tokens, np.cumsum(lengths)[:-1]), strict=True):
                pieces[i] = piece
        lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        return np.concatenate(pieces).astype(TOKEN_DTYPE, copy=False), lengths

    def _encode_reference(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        try:
            return self._encode(texts)
        except TypeError:  # text UTF-8 cannot hold (a lone surrogate): repaired as tiktoken repairs it
            return self._encode([utf8_safe(t) for t in texts])

    def _encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        # encode_batch_fast skips the character offsets (same ids, about a third faster measured
        # on linux-docs). e.ids builds a new list at each access: read it once per text.
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        with _environment(self._env):
            encodings = encode(list(texts), add_special_tokens=False)
        return flatten([e.ids for e in encodings])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))

    def piece(self, token: int) -> str | None:
        """The vocabulary's own spelling of one token (byte-level "Ġ…", "<0xF0>")."""
        return self._tok.id_to_token(token)

    def identity(self) -> dict[str, Any]:
        return {
            **self.special_identity(),
            "eot_source": self.eot_source,
            "config_eos_token": self.config_eos_token,
            "model": self._model_type,
            "special_tokens": dict(sorted(self._specials.items(), key=lambda kv: kv[1])),
            "source": self.source.describe(),
            "tokenizers_version": self._version,
            **({"splintr_version": self._fast_version, "splintr_form": self.splintr_form}
               if self._fast_load is not None else {}),
        }
