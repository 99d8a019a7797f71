"""The tokenizer a dataset was made with, loaded from what the dataset itself records: a tiktoken
vocabulary by name only (never a file its metadata names), a Hugging Face one from the dataset's
copy of its tokenizer.json (else from where it was loaded, as `untrusted`), a SentencePiece one
from its copy; each checked against the sha256 the metadata records. `inspect` decodes with it,
and `TokenDataset.decode` (loaded on its first call, never when the loader is imported).

Memory model: one vocabulary (1-20 MB; a tokenizer.json up to MAX_TOKENIZER_BYTES).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ..errors import LmshardError
from ..format import (
    MAX_TOKENIZER_BYTES,
    TOKENIZER_FILE,
    VOCAB_COPIES,
    VOCAB_COPY,
    DatasetMeta,
    dataset_file_size,
    read_small,
)


def tokenizer_for(meta: DatasetMeta | None, why: list[str] | None = None) -> Any:
    """The dataset's own tokenizer: a tiktoken vocabulary by name only (never a file the metadata
    names), a Hugging Face one from the dataset's copy of its tokenizer.json (else from where it
    was loaded, as `untrusted`), a SentencePiece one from its copy. None when it is not available
    or differs from the one the dataset was made with; `why` then receives the reason and the fix."""
    if meta is None:
        return None
    from ..tokenizers import TOKENIZER_NAMES, load_tokenizer

    info = meta.tokenizer
    if info.hugging_face:
        # The metadata may be someone else's: names in it are loaded `untrusted` (a regular file of
        # a tokenizer's size, alone; a hub name from the local cache only, never downloaded).
        specs, backend = [info.name], "tokenizers"
        with contextlib.suppress(LmshardError):  # the copy, when it is a regular file inside the dataset
            if dataset_file_size(meta.root, VOCAB_COPY) <= MAX_TOKENIZER_BYTES:
                specs.insert(0, str(meta.root / VOCAB_COPY))
        fix = f"put the tokenizer.json with that sha256 back in {meta.root / VOCAB_COPY}"
    elif info.vocab_format == "sentencepiece":  # its copy, when it is a regular file inside the dataset
        specs, backend, copy = [], "sentencepiece", VOCAB_COPIES["sentencepiece"]
        with contextlib.suppress(LmshardError):
            if dataset_file_size(meta.root, copy) <= MAX_TOKENIZER_BYTES:
                specs.append(str(meta.root / copy))
        fix = f"put the SentencePiece model with that sha256 back in {meta.root / copy}"
    elif info.name in TOKENIZER_NAMES:
        specs, backend = [info.name], "tiktoken"
        fix = f"run `lmshard tokenizer fetch {info.name}`"
    else:  # a SentencePiece model, a qwen:/llama3: or PATH.json vocabulary: its path is not ours to read
        # (prepare records an OpenAI .tiktoken file by the name its sha256 matched)
        if why is not None:
            why.append(f"token ids are shown undecoded: the dataset keeps no copy of its vocabulary file "
                       f"({info.name}), and inspect never reads a path a dataset's metadata names")  # fmt: skip
        return None
    other = None  # the sha256 of a vocabulary of that name found here, when it is not the recorded one
    for spec in specs:
        try:
            tok = load_tokenizer(spec, backend, separator=_recorded_separator(meta), untrusted=True)
        except LmshardError:
            continue
        if tok.vocab_sha256 == info.ranks_sha256:
            return tok
        other = other or tok.vocab_sha256
    if why is not None and other is not None and backend == "tiktoken":  # (fetching it again cannot help)
        why.append(f"token ids are shown undecoded: the {info.name} vocabulary here has sha256 {other[:12]}…, not "
                   f"the {info.ranks_sha256[:12]}… the metadata records (made with another vocabulary of that "
                   "name, or the metadata was edited)")  # fmt: skip
    elif why is not None:
        why.append(f"token ids are shown undecoded: the {info.name} vocabulary (sha256 {info.ranks_sha256[:12]}…) "
                   f"is not available here; {fix}")  # fmt: skip
    return None


def _recorded_separator(meta: DatasetMeta) -> str | None:
    """The separator's text as tokenizer_state.json records it (a Hugging Face vocabulary may
    have none of its own that lmshard recognises)."""
    if not meta.tokenizer.hugging_face:
        return None
    data = bytearray()
    try:
        read_small(meta.root, TOKENIZER_FILE, data.extend)
        state = json.loads(data.decode("utf-8"))
        token = state.get("eot_token") if isinstance(state, dict) else None
    except (LmshardError, OSError, ValueError, RecursionError):
        return None
    return token if isinstance(token, str) else None
