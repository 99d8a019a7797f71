"""What `lmshard inspect` computes beyond verification: decoded top tokens, sampled documents,
the document-length histogram and its optional plot. Rendering stays in cli/.

Memory model: as `verify` (one token block at a time), plus the N sampled documents.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..errors import ConfigError, FormatError, missing_dependency
from ..format import (
    IN_PROGRESS_FILE,
    METADATA_FILE,
    DatasetMeta,
    find_shard,
    read_document,
)
from .verify import Report

Decoder = Callable[[list[int]], str]


def require_dataset(path: Path) -> None:
    """A usage error (exit 1) unless `path` is at least meant to be a dataset: one line naming
    what is there instead (a file, an unfinished build, nothing) and what to run."""
    name, suffix = path.name, ".lmshard-partial"
    if name.startswith(".") and name.endswith(suffix) and path.is_dir():  # a build beside its --out
        dataset = path.parent / name[1 : -len(suffix)]
        raise ConfigError(f"{path} is the unfinished build of {dataset}: the `lmshard prepare ... --out {dataset}` "
                          f"that made it finishes it with --resume (`lmshard status {dataset}` says how it goes on); "
                          "inspect the dataset then")  # fmt: skip
    if path.is_file():
        raise ConfigError(f"{path}: a file, not a dataset directory; `lmshard prepare {path} --out DIR` makes one")
    if not path.is_dir():
        build = path.parent / f".{name}{suffix}"
        if build.is_dir():
            raise ConfigError(f"{path}: not there yet: a prepare run left its build in {build}; the same "
                              f"`lmshard prepare ... --out {path}` with --resume finishes it (`lmshard status "
                              f"{path}` says how it goes on)")  # fmt: skip
        raise ConfigError(f"{path}: no such directory")
    if not (path / METADATA_FILE).exists() and not (path / IN_PROGRESS_FILE).exists():
        if (export := _export_record(path)) is not None:
            raise ConfigError(f"{path}: {export}")
        raise ConfigError(f"{path}: no {METADATA_FILE}; not an lmshard dataset (create one with `lmshard prepare`)")


def _export_record(path: Path) -> str | None:
    """What an export directory is (its `lmshard_export.json`, read when small) and how to read it
    back, or None when `path` holds none."""
    from ..interop.output import PROVENANCE_FILE

    record = path / PROVENANCE_FILE
    try:
        if record.stat().st_size > 1 << 20:
            return None
        data = json.loads(record.read_text())
        fmt, name, source = str(data["format"]), str(data["tokenizer"]["name"]), str(data.get("source", "?"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    from ..remote.urls import redact

    what = f"an export for {fmt} of the dataset {redact(source)}, not an lmshard dataset"
    if fmt in ("nanogpt", "llmc", "modded-nanogpt", "megatron"):
        src = f"{path}/PREFIX" if fmt == "megatron" else str(path)
        return f"{what}; `lmshard import {src} --from {fmt} --tokenizer {name} --out DIR` reads it back into one"
    return f"{what}; inspect that dataset"


def decoder_for(meta: DatasetMeta | None, why: list[str] | None = None) -> Decoder | None:
    """Decoding with the dataset's own vocabulary (`tokenizer_for`); None when it is not available
    (ids are shown instead), `why` then receiving the reason and the fix."""
    from ..tokenizers.of_dataset import tokenizer_for

    tok = tokenizer_for(meta, why)
    return tok.decode if tok is not None else None


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
    return f"{name}:{index}", len(tokens), _text(_own(meta, tokens), decode)


def _own(meta: DatasetMeta, tokens: np.ndarray) -> np.ndarray:
    """A document's own tokens: its separators (the EOT after or before it, the BOS before its
    text) left out, so that `--doc` gives the text that was prepared."""
    eot, bos = meta.tokenizer.eot_id, meta.tokenizer.bos_id
    if meta.eot_position == "after" and len(tokens) and tokens[-1] == eot:
        tokens = tokens[:-1]
    elif meta.eot_position != "after" and len(tokens) and tokens[0] == eot:
        tokens = tokens[1:]
    return tokens[1:] if bos is not None and len(tokens) and tokens[0] == bos else tokens


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
