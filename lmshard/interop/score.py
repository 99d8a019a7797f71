"""`lmshard score`: new attributes for a dataset's documents (a new classifier's score, a
statistic forgotten at prepare time), without preparing it again.

Every document is decoded with the dataset's own tokenizer, held to its stored tokens (encoded
back, it must give them: retokenize.py's check, so only byte-level vocabularies qualify), and
scored by the `--attribute` scorers (quality/scores.py) on that text: the text prepare kept, so
the columns are what `prepare --attribute` would have written. The new columns follow the
dataset's own (names must not repeat one); every other file is the source's, hard-linked where
the filesystem allows (else copied), and the metadata records the columns, the scorers (with
their plugins' code hashes, as prepare does) and a `score` step in the dataset's history.

The result is built beside `--out` and replaces it only when complete (`output.staged_output`);
`--out` may not be the source itself (nothing of the source is touched).

Documents are decoded and scored by `workers` processes (default: the CPUs available), a block
of about BLOCK_TOKENS tokens at a time, handed back in order, so the result does not depend on
their number.

Memory model: at most 2 × workers blocks in flight (their tokens and texts), each worker's
tokenizer and scorers, and one shard's attribute records (old and new) while its file is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..errors import ConfigError
from ..format import METADATA_FILE, DatasetMeta, RunInfo, ShardInfo, SplitInfo, atomic_write_json, load_metadata
from ..format.attributes import attr_path, row_dtype
from ..format.files import dataset_files
from .output import staged_output
from .retokenize import attribute_records, checked_texts, decoder, numbered_blocks
from .source import open_source


@dataclasses.dataclass(frozen=True)
class ScoreResult:
    meta: DatasetMeta  # the new dataset's (root: --out)
    added: tuple[str, ...]  # the new columns


def score_dataset(dataset: str | os.PathLike[str], attributes: list[str], out: str | os.PathLike[str], *,
                  overwrite: bool = False, workers: int | None = None) -> ScoreResult:  # fmt: skip
    """Write `dataset` with the attributes `attributes` added to `out` (module docstring).

        score_dataset("data/web", ["fineweb_quality", "classifier.py:edu=edu_score"], "data/web_scored")
    """
    from ..prepare.output.build import sigterm_stops

    meta, specs, scorer = checked(dataset, attributes, out)
    n = workers or len(os.sched_getaffinity(0))
    with contextlib.ExitStack() as stack:
        stack.enter_context(sigterm_stops())  # (SIGTERM as Ctrl-C: the staging directory is removed)
        staging = stack.enter_context(staged_output(out, overwrite, [meta.root], flag="--overwrite"))
        scored = stack.enter_context(scoring(meta, specs, scorer, n))
        splits = {}
        for split, info in meta.splits.items():
            shards, first = [], 0
            for shard in info.shards:
                shards.append(score_shard(meta, scorer, staging, split, first, shard, scored))
                first += shard.n_docs
            splits[split] = SplitInfo.of(tuple(shards))
        for rel in dataset_files(meta):  # every other file as it is
            if rel != METADATA_FILE and not rel.endswith(".attr"):
                link_file(meta.root / rel, staging / rel)
        result = write_metadata(meta, (attributes, specs), scorer, staging, splits, os.path.realpath(out), n)
    added = tuple(f.name for f in scorer.fields)
    return ScoreResult(dataclasses.replace(result, root=Path(os.path.realpath(out))), added)


def checked(dataset: str | os.PathLike[str], attributes: list[str],
            out: str | os.PathLike[str]) -> tuple[DatasetMeta, list[str], Any]:  # fmt: skip
    """The source (every shard's files held to their sizes, its vocabulary one that gives back
    its text), the scorers' specs (plugins by absolute path) and the Scorer; ConfigError for a
    column the source has, or `out` being the source."""
    from ..quality.filters import absolute
    from ..quality.scores import Scorer

    if not attributes:
        raise ConfigError("score needs at least one --attribute NAME (docs/quality.md)")
    specs = [absolute(name) for name in attributes]  # (a plugin imported by path in every worker)
    scorer = Scorer(specs)
    meta, _ = open_source(dataset, "all")
    if os.path.realpath(out) == os.path.realpath(meta.root):
        raise ConfigError(f"{out}: is the dataset being scored; pass another --out (it replaces nothing of the source)")
    clash = [f.name for f in scorer.fields if f.name in {g.name for g in meta.attributes}]
    if clash:
        raise ConfigError(f"{dataset} has an attribute {clash[0]!r} already; score only new columns (a plugin's "
                          "columns can be named: module:function=a,b)")  # fmt: skip
    decoder(dataset, meta, "prepare the dataset again with these --attribute")
    return meta, specs, scorer


@contextlib.contextmanager
def scoring(meta: DatasetMeta, specs: list[str], scorer: Any, n: int) -> Iterator[Callable[[Iterator[Any]],
                                                                                         Iterator[np.ndarray]]]:
    """A function from numbered blocks to their documents' new attribute records, in order:
    scored by `n` worker processes (a block each at a time), or here when n is 1."""
    from ..prepare.execution.pool import OrderedPool, start_method
    from ..tokenizers.of_dataset import tokenizer_for

    if n <= 1:
        _here.update(old=tokenizer_for(meta), scorer=scorer, specials=1 if meta.tokenizer.bos_id is None else 2)
        yield lambda blocks: map(_score, blocks)
        return
    head = dataclasses.replace(meta, splits={}, sources=())  # (what a worker needs: not the shards)
    pool: OrderedPool[Any, Any] = OrderedPool(n, _start, (head, specs), start=start_method())
    with pool:
        yield lambda blocks: pool.imap(_score, blocks, 2 * n)


def score_shard(meta: DatasetMeta, scorer: Any, staging: Path, split: str, first: int, shard: ShardInfo,
                scored: Callable[[Iterator[Any]], Iterator[np.ndarray]]) -> ShardInfo:  # fmt: skip
    """A shard's attribute file with the new columns after its own, written under `staging`: its entry."""
    rows = np.zeros(shard.n_docs, dtype=row_dtype((*meta.attributes, *scorer.fields)))
    if meta.attributes and shard.n_docs:
        kept = attribute_records(meta, shard)
        for f in meta.attributes:
            rows[f.name] = kept[f.name]
    done = 0
    for new in scored(numbered_blocks(meta, shard, split, first)) if shard.n_docs else ():
        for f in scorer.fields:
            rows[f.name][done : done + len(new)] = new[f.name]
        done += len(new)
    return _write_columns(staging, shard, rows)


def write_metadata(meta: DatasetMeta, given: tuple[list[str], list[str]], scorer: Any, staging: Path,
                   splits: dict[str, SplitInfo], out: str, workers: int) -> DatasetMeta:  # fmt: skip
    """The new dataset's metadata (last: its presence means complete), parsed back as any reader
    will. `given`: the scorers as given (the step in its history names them so) and their specs."""
    attributes, specs = given
    from ..quality.filters import plugin_sources

    config = {**(meta.config or {}), "attributes": [*(meta.config or {}).get("attributes", []), *specs]}
    # (the source's scorers as they were when it was made: their hashes are not taken again)
    if plugins := {**plugin_sources([name.partition("=")[0] for name in specs]),
                   **(meta.config or {}).get("attribute_sources", {})}:  # fmt: skip
        config["attribute_sources"] = plugins
    step = RunInfo.step("score", time.time(), meta.total_docs, meta.total_tokens, __version__,
                        attributes=list(attributes), source=os.path.realpath(meta.root))  # fmt: skip
    run = dataclasses.replace(meta.run, lineage=(*RunInfo.history(meta), step), out=out, workers=workers,
                              tokens_per_s=None, elapsed_s=0.0)  # fmt: skip
    result = dataclasses.replace(meta, root=staging, splits=splits, attributes=(*meta.attributes, *scorer.fields),
                                 config=config, run=run, lmshard_version=__version__)  # fmt: skip
    atomic_write_json(staging / METADATA_FILE, result.to_json())
    load_metadata(staging)
    return result


def _write_columns(staging: Path, shard: ShardInfo, rows: np.ndarray) -> ShardInfo:
    """Shard `shard`'s attribute file of `rows` under `staging` (format/attributes.py): its entry."""
    from ..prepare.output.writer import write_attributes

    rel = attr_path(shard.path)
    (staging / rel).parent.mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(shard, attr_path=rel, **write_attributes(staging / rel, rows))


def link_file(src: Path, dst: Path) -> None:
    """`dst` (in a build of lmshard's own) as a hard link to `src`, or a copy; one a stopped run
    left there is replaced."""
    from ..prepare.output.staging import link_or_copy

    dst.unlink(missing_ok=True)
    link_or_copy(src, dst)  # (its folder made where missing)


_here: dict[str, Any] = {}  # the tokenizer and scorers of the process that scores (`_start`)


def _start(arg: tuple[DatasetMeta, list[str]]) -> None:
    """A worker: the dataset's tokenizer (one thread: the workers are the parallelism) and the scorers."""
    from ..quality.scores import Scorer
    from ..tokenizers.of_dataset import tokenizer_for

    meta, specs = arg
    old = tokenizer_for(meta)
    assert old is not None  # (the main process loaded it before starting the workers)
    old.use_threads(1)
    _here.update(old=old, scorer=Scorer(specs), specials=1 if meta.tokenizer.bos_id is None else 2)


def _score(work: tuple[str, int, Any]) -> np.ndarray:
    """A block of documents' new attribute records (each document's text held to its tokens first)."""
    from ..quality.scores import ScoreFailed

    split, first, block = work
    texts = checked_texts(split, first, block, _here["old"], _here["specials"], "prepare the dataset")
    scorer, rows = _here["scorer"], []
    for d, text in enumerate(texts):
        try:
            rows.append(scorer.row(text))
        except ScoreFailed as e:  # the plugin's fault, named at the document it failed on
            raise ConfigError(f"{split} document {first + d + 1}: {e}") from None
    return np.array(rows, dtype=scorer.dtype)
