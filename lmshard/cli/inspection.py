"""`lmshard inspect`: verify, audit and compare datasets, and show what a loader would see of
them (its packing, overlaps, decoded documents). `register` adds the command to the `app`
commands.py builds, wrapped in its `user_errors`."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from ..errors import EXIT_CORRUPT, EXIT_OK, ConfigError
from . import render

out, err = render.out, render.err


def register(app: typer.Typer, user_errors: Callable[[], Callable[[Any], Any]]) -> None:
    """Add `inspect` to `app`."""
    app.command()(user_errors()(inspect))


def inspect(
    dataset: str = typer.Argument(..., metavar="DATASET", help="A dataset written by `lmshard prepare`: a directory "
                                  "or a URL (s3://bucket/prefix...)."),  # fmt: skip
    quick: bool = typer.Option(False, "--quick", help="Structure only: sizes and document indexes, no token data."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    sample: int = typer.Option(0, "--sample", metavar="N", help="Decode N random documents (seeded)."),
    seed: int = typer.Option(0, "--seed", metavar="SEED", help="Seed for --sample."),
    doc: str | None = typer.Option(
        None, "--doc", metavar="SHARD:I", help="Decode one document: SHARD:I, e.g. train/shard_000000:5."
    ),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        metavar="FILE.png",
        help="Write the document-length histogram as an image (needs the plot extra: lmshard\\[plot]).",
    ),
    top: int = typer.Option(10, "--top", metavar="N", help="How many of the most frequent tokens to show."),
    packing: int | None = typer.Option(
        None,
        "--packing",
        metavar="SEQ_LEN",
        help="Instead: plan document packing into rows of SEQ_LEN and report "
        "fill per strategy (from the document index; no token is read).",
    ),
    strategy: list[str] = typer.Option(
        [],
        "--strategy",
        metavar="NAME",
        help="With --packing: bfd, first_fit, window_N, greedy or stream_N (packed as read, "
        "N documents at a time; repeatable; default: all, with stream_10000).",
    ),
    split: str = typer.Option("train", "--split", metavar="SPLIT", help="With --packing or --attribute: the split."),
    world_size: int = typer.Option(1, "--world-size", metavar="N", help="With --packing: ranks, for steps per rank."),
    batch_size: int = typer.Option(1, "--batch-size", metavar="N", help="With --packing: rows per rank per step."),
    overlap: str | None = typer.Option(None, "--overlap", metavar="DATASET|splits", help="Instead: documents shared, "
                                       "exactly or nearly (MinHash), between this dataset and DATASET, or between "
                                       "its own train and val splits (docs/quality.md)."),  # fmt: skip
    diff: str | None = typer.Option(None, "--diff", metavar="DATASET", help="Instead: the documents DATASET adds, "
                                    "removes and keeps against this one (another version of it)."),  # fmt: skip
    decontaminate: list[str] = typer.Option([], "--decontaminate", metavar="FILE", help="Instead: the documents "
                                            "that share an n-gram with these benchmarks, per split, as prepare "
                                            "--decontaminate would remove them (repeatable)."),  # fmt: skip
    attribute: list[str] = typer.Option([], "--attribute", metavar="NAME", help="Instead: the distribution of "
                                        "these attributes (prepare --attribute; all: every one) over --split, "
                                        "to choose a where= threshold (repeatable)."),  # fmt: skip
) -> None:
    """Verify a dataset against its metadata and show what is in it.

    Exit codes: 0 verified, 1 an error (no such directory, not a dataset, a bad option value),
    2 a malformed command line, 3 the dataset is corrupt."""
    from ..remote import is_url, redact

    if sample < 0:
        raise ConfigError(f"--sample {sample}: pass the number of documents to decode, 0 or more")
    if is_url(dataset):
        from ..remote.dataset import open_remote

        open_remote(dataset)  # not a dataset, or unreachable: an error (exit 1), as for a missing directory
    if is_url(dataset) and (packing is not None or sample or doc):
        raise ConfigError(f"{redact(dataset)}: --packing, --sample and --doc read a local dataset; run "
                          "`lmshard inspect URL` to verify it, and these on a local copy")  # fmt: skip
    if packing is not None:
        raise typer.Exit(_packing(Path(dataset), packing, strategy, split, world_size, batch_size, as_json))
    if overlap is not None:
        raise typer.Exit(_overlap(dataset, None if overlap == "splits" else overlap, as_json))
    if diff is not None:
        from .audit import diff_datasets

        raise typer.Exit(diff_datasets(dataset, diff, as_json))
    if attribute:
        from .audit import attribute_distributions

        raise typer.Exit(attribute_distributions(dataset, attribute, split, as_json))
    if decontaminate:
        from .audit import decontamination

        raise typer.Exit(decontamination(Path(dataset), decontaminate, as_json))
    raise typer.Exit(_inspect(dataset if is_url(dataset) else Path(dataset), quick, as_json, sample, seed, doc, plot,
                              top))  # fmt: skip


def _packing(dataset: Path, seq_len: int, strategies: list[str], split: str, world_size: int, batch_size: int,
             as_json: bool) -> int:  # fmt: skip
    from .. import packing as plans
    from ..inspect import audit
    from ..packing.io import dataset_lengths

    for flag, value, fix in (("--packing", seq_len, "the row length in tokens, 1 or more (e.g. --packing 2048)"),
                             ("--world-size", world_size, "the number of ranks, 1 or more"),
                             ("--batch-size", batch_size, "the rows per rank per step, 1 or more")):  # fmt: skip
        if value < 1:
            raise ConfigError(f"{flag} {value}: pass {fix}")
    audit.require_dataset(dataset)
    lengths = dataset_lengths(dataset, split)
    from ..format import load_metadata
    from ..packing import stream as streampack

    chosen = tuple(strategies) or (*plans.ALL_STRATEGIES, f"stream_{streampack.DEFAULT_BUFFER}")
    planned = tuple(s for s in chosen if streampack.parse(s) is None)
    rows = plans.compare(lengths, seq_len, planned, world_size=world_size, batch_size=batch_size) if planned else []
    counts = [s.n_docs for s in load_metadata(dataset).split_shards(split)]
    for name in chosen:  # packed as read, a window at a time (strategy="stream"): simulated with its windows
        if (buffer := streampack.parse(name)) is not None:
            rows.append(streampack.metrics(lengths, counts, seq_len, buffer, world_size=world_size,
                                           batch_size=batch_size))  # fmt: skip
    if as_json:
        out.print_json(data={"dataset": str(dataset), "split": split, "seq_len": seq_len, "strategies": rows})
        return EXIT_OK
    render.packing(rows, f"{dataset} [{split}], seq_len {seq_len}")
    return EXIT_OK


def _overlap(first: str, second: str | None, as_json: bool) -> int:
    from ..inspect import audit, overlap

    for path in (first, second):
        if path is not None:
            audit.require_dataset(Path(path))
    a, b = overlap.sides(first, second)
    decoders = []
    for meta in (a[0], b[0]):
        why: list[str] = []
        decoder = audit.decoder_for(meta, why)
        if decoder is None:
            raise ConfigError(f"{meta.root}: --overlap compares texts, and {why[0] if why else 'cannot decode it'}")
        decoders.append(decoder)
    result = overlap.overlap(a, b, (decoders[0], decoders[1]))
    if as_json:
        out.print_json(data=result.to_json())
        return EXIT_OK
    out.print(f"{escape(result.first)}: {result.scanned:,} documents against {escape(result.second)}: "
              f"{result.indexed:,}", highlight=False, soft_wrap=True)  # fmt: skip
    out.print(f"exact overlap: {result.exact:,}; near overlap (estimated Jaccard >= {result.threshold}): "
              f"{result.near:,}", highlight=False)  # fmt: skip
    for e in result.examples:
        out.print(f"  {e['kind']} {e['similarity']:.2f}: {escape(e['first'])} ~ {escape(e['second'])}: "
                  f"{escape(e['text'])}", highlight=False, soft_wrap=True)  # fmt: skip
    return EXIT_OK


def _inspect(dataset: Path | str, quick: bool, as_json: bool, sample: int, seed: int, doc: str | None,
             plot: Path | None, top: int) -> int:  # fmt: skip
    from ..inspect import audit
    from ..inspect.verify import report_json
    if isinstance(dataset, Path):
        audit.require_dataset(dataset)
    report = _verify_with_progress(dataset, quick, quiet=as_json)
    why: list[str] = []
    decoder = audit.decoder_for(report.meta, why)
    if why and (sample or doc or top) and not as_json:
        err.print(f"note: {escape(why[0])}", highlight=False, soft_wrap=True)
    top_tokens = audit.top_tokens(report, top, decoder)
    samples = audit.sample_documents(report.meta, sample, seed, decoder) if report.meta else []
    if doc and report.meta:
        samples.insert(0, audit.one_document(report.meta, doc, decoder))
    if plot is not None:
        audit.plot_lengths(report, plot)
    if as_json:
        payload = report_json(report, top_tokens)
        payload["samples"] = [{"where": w, "n_tokens": n, "text": t} for w, n, t in samples]
        out.print_json(data=payload)
    elif doc and report.meta:  # what was asked for: the document, not the report
        render.documents(report, samples[0], samples[1:])
    else:
        render.report(report, top_tokens, samples)
    return EXIT_OK if report.ok else EXIT_CORRUPT


def _verify_with_progress(dataset: Path | str, quick: bool, quiet: bool) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from ..inspect.remote import verify as verify_dataset
    if not quiet and not sys.stderr.isatty():  # a log: plain lines, no bar (see prepare.py)
        return _verify_logged(dataset, quick)
    with Progress(TextColumn("[bold]verify"), BarColumn(), TextColumn("{task.completed}/{task.total} shards"),
                  TimeRemainingColumn(), console=err, transient=True, disable=quiet) as bar:  # fmt: skip
        task = bar.add_task("verify", total=None)

        def tick(shard: Any) -> None:
            bar.update(task, advance=1)

        report = verify_dataset(dataset, quick=quick, on_start=lambda n: bar.update(task, total=n), on_shard=tick)
    return report


def _verify_logged(dataset: Path | str, quick: bool, interval: float = 10.0) -> Any:
    """Verification with a line on stderr at the start and every `interval` seconds."""
    from ..inspect.remote import verify as verify_dataset
    state = {"n": 0, "done": 0, "last": time.perf_counter()}

    def start(n: int) -> None:
        state["n"] = n
        print(f"inspect: verifying {render.plural(n, 'shard')} of {dataset}", file=sys.stderr, flush=True)

    def tick(shard: Any) -> None:
        state["done"] += 1
        if time.perf_counter() - state["last"] >= interval:
            state["last"] = time.perf_counter()
            print(f"verify: {state['done']:,} of {state['n']:,} shards", file=sys.stderr, flush=True)

    return verify_dataset(dataset, quick=quick, on_start=start, on_shard=tick)
