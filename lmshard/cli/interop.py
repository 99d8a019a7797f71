"""`lmshard export`, `import`, `convert`, `retokenize`, `score` and `cp`: the command-line edge
of `lmshard.interop`.

Kept out of commands.py (which is near its size limit) but part of the command line: `register`
adds the commands to the `app` commands.py builds, wrapped in its `user_errors`, so a library
error is still one line on stderr and exit code 1.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from . import render


def register(app: typer.Typer, user_errors: Callable[[], Callable[[Any], Any]]) -> None:
    """Add `export`, `import`, `convert`, `retokenize`, `score` and `cp` to `app`."""
    app.command("export")(user_errors()(export))
    app.command("import")(user_errors()(import_))
    app.command("convert")(user_errors()(convert))
    app.command("cp")(user_errors()(cp))
    app.command("retokenize")(user_errors()(retokenize))
    app.command("score")(user_errors()(score))


def cp(
    src: str = typer.Argument(..., metavar="SRC", help="A dataset: a directory or a URL (s3://, gs://, az://...)."),
    dst: str = typer.Argument(..., metavar="DST", help="Where the copy goes: a directory or a URL."),
    force: bool = typer.Option(False, "--force", help="Replace a dataset already at DST (whole, or not at all)."),
) -> None:
    """Copy a dataset between local directories and object stores, every file checked.

    Uploads commit as `prepare --out URL` does (data first, the metadata last): a reader of DST
    sees the old dataset or the new one, never a mix."""
    from ..interop.copy import copy_dataset
    from ..remote.urls import redact

    meta = copy_dataset(src, dst, force=force)
    render.out.print(f"copied {meta.total_docs:,} documents, {meta.total_tokens:,} tokens ({len(meta.shards)} shards) "
                     f"to {escape(redact(dst))}", highlight=False, soft_wrap=True)  # fmt: skip


def export(
    dataset: str = typer.Argument(..., metavar="DATASET", help="A dataset written by `lmshard prepare`: a directory "
                                  "or a URL."),  # fmt: skip
    to: str = typer.Option(..., "--to", metavar="FORMAT", help="nanogpt, llmc, modded-nanogpt, megatron, hf, "
                           "litdata, mds or olmo."),  # fmt: skip
    out: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="Output directory (must not exist or be empty)."),
    split: str = typer.Option(
        "all", "--split", metavar="SPLIT", help="train, val or all (every split that has documents)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --out once the new export is complete."),
    tokens_per_shard: int = typer.Option(
        100_000_000, "--tokens-per-shard", metavar="N", help="llmc, modded-nanogpt, olmo: tokens per file (whole "
        "documents); litdata, mds: per chunk or shard."
    ),
    name: str | None = typer.Option(
        None,
        "--name",
        metavar="STEM",
        help="File-name stem (llmc, modded-nanogpt) or prefix (megatron) (default: the dataset's directory "
        "name; fineweb for modded-nanogpt).",
        show_default=False,
    ),
    concat_tokens: int | None = typer.Option(
        None,
        "--concat-tokens",
        metavar="N",
        help="mds: samples of N tokens of the concatenated documents (llm-foundry's --concat_tokens; its text "
        "dataset cuts each sample at max_seq_len). Default: a sample per document.",
        show_default=False,
    ),
    eod_id: int | None = typer.Option(
        None,
        "--eod-id",
        metavar="ID",
        help="megatron, olmo: the end-of-document id of the trainer's tokenizer, written at each document end "
        "(default: the dataset's separator).",
        show_default=False,
    ),
) -> None:
    """Write a dataset in the format another trainer reads (docs/interop.md)."""
    from ..interop import export_dataset
    from .prepare import quiet_library

    quiet_library(False)  # (hf, mds: `datasets`' notes and progress bars are not the export's, in a log)
    result = export_dataset(dataset, to, out, split=split, force=force, tokens_per_shard=tokens_per_shard, name=name,
                            eod_id=eod_id, concat_tokens=concat_tokens)  # fmt: skip
    n_tokens = sum(f["n_tokens"] for f in result.files)
    n_docs = sum(f["n_docs"] for f in result.files)
    render.out.print(
        f"exported {n_docs:,} documents, {n_tokens:,} tokens ({result.token_dtype}, EOT {result.eot_position} "
        f"each document) as {result.format} to {escape(str(result.out))}:",
        highlight=False,
        soft_wrap=True,
    )
    for f in result.files:
        line = f"  {escape(f['path'])}  {f['split']}  {f['n_tokens']:,} tokens"
        if "samples" in f:  # (--concat-tokens)
            line += f": {f['samples']:,} samples of {f['concat_tokens']:,}, a tail of {f['tail_left_out']:,} left out"
        render.out.print(line, highlight=False, soft_wrap=True)  # a long file name: the terminal wraps, not rich
    if result.format == "nanogpt" and split == "all" and not any(f["split"] == "val" for f in result.files):
        render.err.print("note: the dataset has no val split, so there is no val.bin, which nanoGPT's train.py "
                         "evaluates on; prepare it with --val-fraction above 0 for one", markup=False,
                         soft_wrap=True)  # fmt: skip
    if result.format in ("llmc", "modded-nanogpt"):  # their loaders assert B×T+1 tokens in every file
        smallest = min(f["n_tokens"] for f in result.files)
        render.out.print(f"the smallest file holds {smallest:,} tokens: train and evaluate with B×T of at most "
                         f"{smallest - 1:,}", highlight=False, soft_wrap=True)  # fmt: skip


def import_(
    src: Path = typer.Argument(
        ..., metavar="SRC", help="nanogpt: a directory of train.bin (and val.bin); llmc, modded-nanogpt: a directory "
        "of NAME_train_NNNNNN.bin (and NAME_val_...) shards; megatron: a prefix."
    ),
    from_: str = typer.Option(..., "--from", metavar="FORMAT", help="nanogpt, llmc, modded-nanogpt or megatron."),
    out: str = typer.Option(
        ..., "--out", "-o", metavar="DIR", help="Output dataset directory or URL (must not exist or be empty)."
    ),
    tokenizer: str = typer.Option(
        ..., "--tokenizer", metavar="NAME", help="The vocabulary the tokens come from (as for prepare)."
    ),
    eot_id: int | None = typer.Option(
        None,
        "--eot-id",
        metavar="ID",
        help="The separator id in SRC (default: the tokenizer's end of text).",
        show_default=False,
    ),
    val: Path | None = typer.Option(
        None, "--val", metavar="PREFIX", help="megatron: the val split's .bin/.idx prefix.", show_default=False
    ),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --out once the new dataset is complete."),
    tokens_per_shard: int = typer.Option(
        100_000_000, "--tokens-per-shard", metavar="N", help="Target tokens per shard."
    ),
    shard_encoding: str = typer.Option(
        "uint32", "--shard-encoding", metavar="ENC", help="How shards store tokens: uint32, uint16, packed, zstd "
        "(docs/format.md)."
    ),
) -> None:
    """Turn a nanoGPT or Megatron-LM dataset into an lmshard dataset (then `lmshard inspect` it)."""
    from ..interop import import_dataset

    meta = import_dataset(src, from_, out, tokenizer=tokenizer, eot_id=eot_id, val=val, force=force,
                          tokens_per_shard=tokens_per_shard, shard_encoding=shard_encoding)  # fmt: skip
    empty = meta.drops.get("empty", 0)
    skipped = f", skipped {empty:,} empty document{'s' if empty != 1 else ''}" if empty else ""
    render.out.print(
        f"imported {meta.total_docs:,} documents, {meta.total_tokens:,} tokens "
        f"(train {meta.n_docs('train'):,}, val {meta.n_docs('val'):,} documents){skipped} into {escape(str(out))}; "
        f"check it with `lmshard inspect {escape(str(out))}`",
        highlight=False,
        soft_wrap=True,
    )


# The source and destination of convert and retokenize.
_DATASET = typer.Argument(..., metavar="DATASET", help="A dataset directory written by lmshard.")
_OUT = typer.Option(..., "--out", "-o", metavar="DIR", help="Output dataset directory (must not exist or be empty).")


def convert(
    dataset: str = _DATASET,
    to: str = typer.Option(..., "--to", metavar="ENC", help="The new shard encoding: uint32, uint16, packed or zstd "
                           "(docs/format.md)."),  # fmt: skip
    out: str = _OUT,
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out once the new dataset is "
                                   "complete and verified."),  # fmt: skip
    dictionary: bool = typer.Option(True, "--dictionary/--no-dictionary", help="zstd: compress every frame with a "
                                    "dictionary trained from the train split (the default; smaller), or without one "
                                    "(as lmshard wrote zstd before format version 3)."),  # fmt: skip
) -> None:
    """Rewrite a dataset's shards in another encoding, checked token for token against the source.

    Everything but the token files is copied unchanged."""
    from ..inspect.verify import bytes_per_token
    from ..interop.convert import convert_dataset

    if not dictionary and to != "zstd":
        from ..errors import ConfigError

        raise ConfigError(f"--no-dictionary: only zstd shards have a dictionary, and --to {to} writes none; drop it")
    result = convert_dataset(dataset, to, out, overwrite=overwrite, dictionary=dictionary)
    meta, source = result.meta, result.source
    before, after = bytes_per_token(source) or 0, bytes_per_token(meta) or 0
    render.out.print(
        f"converted {render.plural(len(meta.shards), 'shard')} ({meta.total_tokens:,} tokens) from "
        f"{escape(source.encoding.describe())} to {escape(meta.encoding.describe())}, {before:g} → {after:g} bytes "
        f"per token, into {escape(str(meta.root))}; every shard verified against the source",
        highlight=False,
        soft_wrap=True,
    )


# Scale-out, for retokenize and score (interop/rewriteengines.py).
_NUM_TASKS = typer.Option(None, "--num-tasks", metavar="N", help="Plan it as N tasks (a source shard is a task's "
                          "unit of work), the same bytes (docs/scaling.md).")  # fmt: skip
_EXECUTOR = typer.Option("local", "--executor", metavar="NAME", help="With --num-tasks: local (run here), none (print "
                         "the commands), slurm, ray.")  # fmt: skip
_SBATCH_ARGS = typer.Option(None, "--sbatch-args", metavar="ARGS", help="--executor slurm: added to every sbatch "
                            "(partition, time...).")  # fmt: skip
_MAX_JOBS = typer.Option(None, "--max-jobs", metavar="N", help="--executor slurm: the most jobs queued at once \\[half "
                         "the cluster's MaxJobCount].")  # fmt: skip
_RAY_ADDRESS = typer.Option(None, "--ray-address", metavar="ADDR", help="--executor ray: the cluster to join (auto, "
                            "host:port) \\[a local one].")  # fmt: skip


def _say(line: str) -> None:
    render.out.print(line, markup=False, soft_wrap=True)


def retokenize(
    dataset: str = _DATASET,
    tokenizer: str = typer.Option(..., "--tokenizer", metavar="NAME", help="The new vocabulary, as for prepare: a "
                                  "tiktoken name, a tokenizer.json, a hub name (docs/tokenizers.md)."),  # fmt: skip
    out: str = _OUT,
    shard_encoding: str | None = typer.Option(None, "--shard-encoding", metavar="ENC", help="uint32, uint16, packed "
                                              "or zstd \\[the dataset's own]."),  # fmt: skip
    tokens_per_shard: int | None = typer.Option(None, "--tokens-per-shard", metavar="N", help="\\[the dataset's]"),
    tokenizer_backend: str = typer.Option("auto", "--tokenizer-backend", metavar="NAME", help="As for prepare."),
    workers: int | None = typer.Option(None, "--workers", metavar="N", help="Processes that decode and encode \\[the "
                                       "CPUs available]; the same bytes for any number."),  # fmt: skip
    separator: str | None = typer.Option(None, "--separator", metavar="TOKEN", help="The new vocabulary's document "
                                         "separator, as for prepare \\[its end-of-text token]."),  # fmt: skip
    bos: str | None = typer.Option(None, "--bos", metavar="auto|yes|no", help="A BOS before each document, as for "
                                   "prepare \\[the dataset's setting]."),  # fmt: skip
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out once the new dataset is "
                                   "complete."),  # fmt: skip
    num_tasks: int | None = _NUM_TASKS,
    executor: str = _EXECUTOR,
    sbatch_args: str | None = _SBATCH_ARGS,
    max_jobs: int | None = _MAX_JOBS,
    ray_address: str | None = _RAY_ADDRESS,
) -> None:
    """Encode a dataset's documents with another tokenizer, as a fresh prepare would.

    The same documents in the same order and splits, with their provenance and dedup keys;
    byte-level vocabularies only (docs/cli.md)."""
    from ..interop.retokenize import retokenize_dataset

    if num_tasks is not None:
        from ..interop import retoktasks, rewriteengines

        out = rewriteengines.check(out, executor, max_jobs, 2)
        retoktasks.plan(dataset, out, num_tasks, overwrite=overwrite, tokenizer=tokenizer,
                        tokenizer_backend=tokenizer_backend, shard_encoding=shard_encoding,
                        tokens_per_shard=tokens_per_shard, separator=separator, bos=bos)  # fmt: skip
        done = rewriteengines.run(out, executor, workers=workers, sbatch_args=sbatch_args, max_jobs=max_jobs,
                                  ray_address=ray_address, say=_say)  # fmt: skip
        if done is not None:
            render.out.print(f"retokenized {done.total_docs:,} documents to {escape(done.tokenizer.name)} "
                             f"({done.total_tokens:,} tokens, {render.plural(len(done.shards), 'shard')}) in "
                             f"{render.plural(num_tasks, 'task')} into {escape(str(out))}", highlight=False,
                             soft_wrap=True)  # fmt: skip
        return
    result = retokenize_dataset(dataset, tokenizer, out, tokenizer_backend=tokenizer_backend,
                                shard_encoding=shard_encoding, tokens_per_shard=tokens_per_shard,
                                overwrite=overwrite, workers=workers, separator=separator, bos=bos)  # fmt: skip
    meta, source = result.meta, result.source
    render.out.print(
        f"retokenized {meta.total_docs:,} documents from {escape(source.tokenizer.name)} ({source.total_tokens:,} "
        f"tokens) to {escape(meta.tokenizer.name)} ({meta.total_tokens:,} tokens, "
        f"{render.plural(len(meta.shards), 'shard')}) into {escape(str(meta.root))}",
        highlight=False,
        soft_wrap=True,
    )


def score(
    dataset: str = _DATASET,
    attribute: list[str] = typer.Option(..., "--attribute", metavar="NAME", help="A scorer, as for prepare "
                                        "--attribute: length, gopher_quality, gopher_repetition, fineweb_quality, "
                                        "language or module:function[=a,b] (repeatable)."),  # fmt: skip
    out: str = _OUT,
    workers: int | None = typer.Option(None, "--workers", metavar="N", help="Processes that decode and score \\[the "
                                       "CPUs available]; the same bytes for any number."),  # fmt: skip
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out once the new dataset is "
                                   "complete."),  # fmt: skip
    num_tasks: int | None = _NUM_TASKS,
    executor: str = _EXECUTOR,
    sbatch_args: str | None = _SBATCH_ARGS,
    max_jobs: int | None = _MAX_JOBS,
    ray_address: str | None = _RAY_ADDRESS,
) -> None:
    """Add attributes to a dataset's documents without preparing it again (docs/quality.md).

    Scored as prepare --attribute would (byte-level vocabularies); the other files are the source's."""
    from ..interop.score import score_dataset

    if num_tasks is not None:
        from ..interop import rewriteengines, scoretasks

        out = rewriteengines.check(out, executor, max_jobs, 1)
        scoretasks.plan(dataset, attribute, out, num_tasks, overwrite=overwrite)
        done = rewriteengines.run(out, executor, workers=workers, sbatch_args=sbatch_args, max_jobs=max_jobs,
                                  ray_address=ray_address, say=_say)  # fmt: skip
        if done is not None:
            render.out.print(f"scored {done.total_docs:,} documents in {render.plural(num_tasks, 'task')} into "
                             f"{escape(str(out))}", highlight=False, soft_wrap=True)  # fmt: skip
        return
    result = score_dataset(dataset, attribute, out, overwrite=overwrite, workers=workers)
    render.out.print(f"scored {result.meta.total_docs:,} documents into {escape(str(result.meta.root))}: "
                     f"{render.plural(len(result.added), 'new column')} ({escape(', '.join(result.added))})",
                     highlight=False, soft_wrap=True)  # fmt: skip
