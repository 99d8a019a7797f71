"""What `lmshard inspect` computes beyond verification: decoded top tokens, sampled documents,
the document-length histogram and its optional plot. Rendering stays in cli/.

Memory model: as `verify` (one token block at a time), plus the N sampled documents.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, FormatError, LmshardError, missing_dependency
from ..format import (
    IN_PROGRESS_FILE,
    MAX_TOKENIZER_BYTES,
    METADATA_FILE,
    TOKENIZER_FILE,
    VOCAB_COPIES,
    VOCAB_COPY,
    DatasetMeta,
    dataset_file_size,
    find_shard,
    read_document,
)
from .verify import Report, read_small

Decoder = Callable[[list[int]], str]


def require_dataset(path: Path) -> None:
    """A usage error (exit 1) unless `path` is at least meant to be a dataset."""
    if not path.is_dir():
        raise ConfigError(f"{path}: no such directory")
    if not (path / METADATA_FILE).exists() and not (path / IN_PROGRESS_FILE).exists():
        raise ConfigError(f"{path}: no {METADATA_FILE}; not an lmshard dataset (create one with `lmshard prepare`)")


def decoder_for(meta: DatasetMeta | None, why: list[str] | None = None) -> Decoder | None:
    """Decoding with the dataset's own vocabulary (`tokenizer_for`); None when it is not available
    (ids are shown instead), `why` then receiving the reason and the fix."""
    tok = tokenizer_for(meta, why)
    return tok.decode if tok is not None else None


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
    for spec in specs:
        try:
            tok = load_tokenizer(spec, backend, separator=_recorded_separator(meta), untrusted=True)
        except LmshardError:
            continue
        if tok.vocab_sha256 == info.ranks_sha256:
            return tok
    if why is not None:
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


def top_tokens(report: Report, n: int, decode: Decoder | None) -> list[tuple[int, int, str]]:
    counts = report.token_counts
    if counts is None or n <= 0 or not counts.any():
        return []
    ids = np.argsort(counts)[::-1][:n]
    return [(int(i), int(counts[i]), decode([int(i)]) if decode else f"<{i}>") for i in ids if counts[i]]


def _text(tokens: np.ndarray, decode: Decoder | None) -> str:
    return decode(tokens.tolist()) if decode else " ".join(map(str, tokens.tolist()))


def sample_documents(meta: DatasetMeta, n: int, seed: int, decode: Decoder | None) -> list[tuple[str, int, str]]:
    """N documents drawn uniformly from all shards (seeded), decoded. A document of a shard
    whose files fail their checks is left out: verification reports that shard."""
    total = meta.n_docs()
    if n <= 0 or total == 0:
        return []
    picks = np.sort(np.random.default_rng(seed).choice(total, size=min(n, total), replace=False))
    starts = np.cumsum([0] + [s.n_docs for s in meta.shards])
    out = []
    for g in picks.tolist():
        k = int(np.searchsorted(starts, g, side="right")) - 1
        shard = meta.shards[k]
        try:
            tokens = read_document(meta, shard, g - int(starts[k]))
        except FormatError:
            continue
        out.append((f"{shard.path[:-4]}:{g - int(starts[k])}", len(tokens), _text(tokens, decode)))
    return out


def one_document(meta: DatasetMeta, spec: str, decode: Decoder | None) -> tuple[str, int, str]:
    name, sep, index = spec.rpartition(":")
    if not sep or not index.isdigit():
        raise ConfigError(f"--doc {spec!r}: expected SHARD:I, e.g. train/shard_000000:5")
    shard = find_shard(meta, name)
    tokens = read_document(meta, shard, int(index))
    return f"{name}:{index}", len(tokens), _text(tokens, decode)


def length_histogram(report: Report) -> list[tuple[str, int]]:
    """Document lengths in powers-of-two buckets: [(label, count)], empty buckets inside kept."""
    lengths = report.doc_lengths()
    if not len(lengths):
        return []
    buckets = np.floor(np.log2(np.maximum(lengths, 1))).astype(int)
    counts = np.bincount(buckets)
    lo = int(buckets.min())
    return [(f"{1 << b:,}-{(1 << (b + 1)) - 1:,}", int(counts[b])) for b in range(lo, len(counts))]


def plot_lengths(report: Report, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise missing_dependency("matplotlib", "plot", "--plot") from None
    lengths = report.doc_lengths()
    fig, ax = plt.subplots(figsize=(8, 4))
    if len(lengths):
        bins = np.logspace(0, np.log10(max(2, int(lengths.max()))), 50)
        ax.hist(lengths, bins=bins.tolist())
        ax.set_xscale("log")
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel("documents")
    ax.set_title(f"{report.root}: {len(lengths):,} documents")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
