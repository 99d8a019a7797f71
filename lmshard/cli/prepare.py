"""`lmshard prepare`: its options, grouped in help panels, and what it prints while it runs.

Where the output goes:
- stderr on a terminal: a progress bar, redrawn in place;
- stderr not a terminal (nohup, Slurm, CI, `2> log`): plain lines with no terminal control
  codes: a start line (inputs, output, key options), a progress line every `--log-interval`
  seconds (input read, documents, tokens, tokens/s, ETA) and a done line with the counts;
- stdout: the summary table, or with `--json` the summary as one JSON object (for scripts);
- `--quiet`: errors and warnings only (with `--json`, the JSON still goes to stdout).

Other tools' spellings are accepted on the command line (`token_normalize_func` in commands.py):
underscores for dashes in every long option (`--tokens_per_shard`), `--num-proc` (Hugging Face
datasets) for `--workers`, `--json-keys` (Megatron-LM) for `--text-field`, `--max-samples` for
`--max-docs`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from importlib import import_module
from typing import Any, TypeVar

import typer
from typer.core import TyperCommand

from . import spellings
from .runlog import RunLog
from .scale import planned_prepare

T = TypeVar("T")
_COMMAND = False  # this process is the `lmshard` command (as_command), not a caller of its functions


def as_command() -> None:
    """Mark this process as the `lmshard` command: it ends when the command does."""
    global _COMMAND
    _COMMAND = True
# The exceptions of the click that typer runs on: its own copy (typer 0.28), else the click package.
_click_errors: Any = import_module(TyperCommand.__mro__[1].__module__.rpartition(".")[0] + ".exceptions")

# Option names from other tools, by the name lmshard gives the same option (spellings.py).
OPTION_ALIASES = spellings.ALIASES
EPILOG = (
    "Other tools' spellings: underscores for dashes (--tokens_per_shard); --input FILE for INPUTS; --num-proc "
    "for --workers; --json-keys for --text-field; --append-eod is the default; the rest are answered with the "
    "lmshard equivalent. Full reference: docs/cli.md."
)


def normalize_token(token: str) -> str:
    """click's token_normalize_func: an option name as lmshard spells it (see the module doc)."""
    return spellings.canonical(token)


class ForeignSpellings(TyperCommand):
    """`prepare`'s command class: input options read as arguments, no-op flags dropped with a
    note, and another tool's option answered with the lmshard equivalent where click would
    guess at a similar-looking option (spellings.py)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        args, notes = spellings.rewrite(args)
        if not ctx.resilient_parsing and not {"-q", "--quiet"} & set(args):  # (resilient: shell completion)
            for note in notes:
                print(f"note: {note}", file=sys.stderr, flush=True)
        try:
            return super().parse_args(ctx, list(args))  # a copy: click's parser consumes its list
        except _click_errors.NoSuchOption as e:
            advice = spellings.advice(e.option_name, args)
            if advice is None:
                raise
            raise _click_errors.UsageError(advice, ctx=ctx) from None


INPUTS, HF, CLEAN, TOKENIZER = "Inputs", "Hugging Face inputs", "Cleaning and dedup", "Tokenizer"
OUTPUT, EXECUTION, LOGGING = "Output and split", "Execution", "Logging"


def _opt(panel: str, metavar: str | None, help: str, *names: str) -> Any:
    return typer.Option(None, *names, help=help, metavar=metavar, show_default=False, rich_help_panel=panel)


def _flag(panel: str, help: str, *names: str) -> Any:
    return typer.Option(None, *names, help=help, show_default=False, rich_help_panel=panel)


def prepare(
    inputs: list[str] | None = typer.Argument(
        None, metavar="INPUTS...", help="Files, directories or globs; - for stdin.", show_default=False
    ),
    config: str | None = _opt(INPUTS, "FILE", "YAML or TOML file of these options; flags win.", "--config"),
    demo: bool | None = _flag(INPUTS, "Use the embedded demo corpus (Python's own sources and docs).", "--demo"),
    exclude: list[str] | None = _opt(INPUTS, "GLOB", "Leave out input paths matching this (repeatable).", "--exclude"),
    include_hidden: bool | None = _flag(
        INPUTS, "Also read hidden files and directories (.git, .venv) of input directories.", "--include-hidden"
    ),  # fmt: skip
    format: str | None = _opt(INPUTS, "FORMAT", "Force a format: text, jsonl, json, csv, parquet, arrow.", "--format"),
    text_field: str | None = _opt(
        INPUTS, "FIELD", "JSON/CSV/parquet field holding the text. Default: text.", "--text-field"
    ),  # fmt: skip
    text_mode: str | None = _opt(
        INPUTS,
        "MODE",
        "Documents of .txt/.md files: auto (a file up to --max-chars, "
        "else its paragraphs), file, line, paragraph. Default: auto.",
        "--text-mode",
    ),  # fmt: skip
    hf: str | None = _opt(HF, "ID|DIR", "Dataset: hub id, save_to_disk dir, or dir of parquet/jsonl files.", "--hf"),
    preset: str | None = _opt(
        HF, "NAME", "A named dataset (lmshard datasets): sets --hf, --hf-config, --text-field.", "--preset"
    ),  # fmt: skip
    hf_config: str | None = _opt(HF, "NAME", "Configuration (subset) of the --hf dataset.", "--hf-config"),
    split: str | None = _opt(HF, "SPLIT", "Split of the --hf dataset to read. Default: train.", "--split"),
    streaming: bool | None = _flag(HF, "Stream --hf (the default for hub ids and data files).", "--streaming"),
    no_streaming: bool | None = _flag(HF, "Download --hf to the datasets cache, read by rows.", "--no-streaming"),
    revision: str | None = _opt(HF, "REV", "Hub revision of --hf: branch, tag or commit.", "--revision"),
    hf_task: int | None = _opt(HF, "I", "This task's part of the --hf stream (from 0), of --hf-tasks.", "--hf-task"),
    hf_tasks: int | None = _opt(HF, "N", "Split the --hf stream into N disjoint parts. Default: 1.", "--hf-tasks"),
    normalize: str | None = _opt(CLEAN, "FORM", "Unicode normalisation: nfc (canonical: the Kelvin sign becomes K), "
                                 "nfkc (also compatibility forms: superscript 2 becomes 2), none. Default: nfc.",
                                 "--normalize"),
    no_normalize: bool | None = _flag(
        CLEAN, "Keep text byte-exact (code): no normalisation or cleaning.", "--no-normalize"
    ),  # fmt: skip
    min_chars: int | None = _opt(CLEAN, "N", "Drop documents shorter than N characters. Default: 1.", "--min-chars"),
    max_chars: int | None = _opt(CLEAN, "N", "Longer documents are dropped or truncated. Default: 10000000.",
                                 "--max-chars"),
    filter: list[str] | None = _opt(CLEAN, "NAME", "Drop (or edit) documents by a filter, counted by reason: "
                                    "gopher_quality, gopher_repetition, fineweb_quality, c4, language=en[,de][:0.5] "
                                    "or module:function (repeatable; docs/quality.md).", "--filter"),
    attribute: list[str] | None = _opt(CLEAN, "NAME", "Keep scores per document beside the shards instead of "
                                       "dropping by them, for TokenDataset(where=...): length, gopher_quality, "
                                       "gopher_repetition, fineweb_quality, language or module:function[=a,b] "
                                       "(repeatable; docs/quality.md).", "--attribute"),
    overlong: str | None = _opt(CLEAN, "WHAT", "drop or truncate documents over --max-chars. Default: drop.",
                                "--overlong"),  # fmt: skip
    dedup: str | None = _opt(CLEAN, "MODE", "document (exact, xxh3-64 of the cleaned text) or none. Default: "
                             "document.", "--dedup"),  # fmt: skip
    no_dedup: bool | None = _flag(CLEAN, "Same as --dedup none.", "--no-dedup"),
    near_dedup: bool | None = _flag(CLEAN, "Also drop near-duplicates (MinHash LSH; the first of each cluster is "
                                    "kept); reads the input twice (docs/quality.md).", "--near-dedup"),  # fmt: skip
    minhash: str | None = _opt(CLEAN, "N:BxR:T", "--near-dedup's word N-grams, B bands of R rows and agreement "
                               "threshold T. Default: 5:22x5:0.7.", "--minhash"),  # fmt: skip
    dedup_lines: bool | None = _flag(CLEAN, "Also drop non-blank lines seen before (boilerplate); reads the input "
                                     "twice.", "--dedup-lines"),  # fmt: skip
    decontaminate: list[str] | None = _opt(CLEAN, "FILE", "Drop documents that share a 13-word n-gram (or hold a whole "
                                           "item of 8+ words) with a benchmark: JSONL, parquet or text, NAME=FILE "
                                           "to name it (repeatable; docs/quality.md).", "--decontaminate"),
    decontaminate_n: int | None = _opt(CLEAN, "N", "Words in a --decontaminate n-gram. Default: 13.",
                                       "--decontaminate-n"),
    decontaminate_lines: bool | None = _flag(CLEAN, "--decontaminate removes the matching lines, not the document.",
                                             "--decontaminate-lines"),  # fmt: skip
    on_error: str | None = _opt(CLEAN, "WHAT", "A bad record: fail (stop) or skip (count it and go on). Default: "
                                "fail.", "--on-error"),  # fmt: skip
    decode_errors: str | None = _opt(CLEAN, "HOW", "Bytes that are not UTF-8 in text, JSON lines and whole files: "
                                     "strict (the record is a decode_error) or replace (U+FFFD, the record kept and "
                                     "counted). Default: strict.", "--decode-errors"),  # fmt: skip
    tokenizer: str | None = _opt(
        TOKENIZER,
        "NAME",
        "gpt2, r50k_base, p50k_base, cl100k_base, o200k_base, a .tiktoken "
        "file, a tokenizer.json, a save_pretrained directory, a cached hub name "
        "(org/name), a SentencePiece .model file, or qwen:PATH / llama3:PATH for those families' tiktoken "
        "files. Default: gpt2.",
        "--tokenizer",
    ),  # fmt: skip
    tokenizer_backend: str | None = _opt(
        TOKENIZER,
        "NAME",
        "auto (splintr when installed and exact, else tiktoken or tokenizers), tiktoken, splintr, tokenizers, "
        "sentencepiece. Default: auto.",
        "--tokenizer-backend",
    ),  # fmt: skip
    separator: str | None = _opt(
        TOKENIZER,
        "TOKEN",
        "Special token after each document (before it with --eot-position before). "
        "Default: the vocabulary's end of text.",
        "--separator",
    ),  # fmt: skip
    bos: str | None = _opt(
        TOKENIZER,
        "WHEN",
        "BOS token before each document: auto (when the tokenizer adds one), yes, no. Default: auto.",
        "--bos",
    ),  # fmt: skip
    eot_position: str | None = _opt(
        TOKENIZER, "WHERE", "The separator after or before each document. Default: after.", "--eot-position"
    ),  # fmt: skip
    out: str | None = _opt(OUTPUT, "DIR", "Output dataset directory, or a URL: s3://, gs://, az:// "
                           "(docs/remote.md).", "--out", "-o"),
    val_fraction: float | None = _opt(
        OUTPUT, "FRACTION", "Fraction of documents in the val split. Default: 0.01.", "--val-fraction"
    ),  # fmt: skip
    val_by: str | None = _opt(OUTPUT, "input|FIELD", "A val part of each domain, of --val-tokens each, instead of "
                              "--val-fraction: each input file, or each value of a record field (a.b: nested), "
                              "kept as a category attribute (docs/quality.md).", "--val-by"),
    val_tokens: int | None = _opt(OUTPUT, "N", "With --val-by: the tokens of each domain's val part (at most half "
                                  "of the domain's).", "--val-tokens"),
    seed: int | None = _opt(OUTPUT, "SEED", "Seed of the train/val split. Default: 1337.", "--seed"),
    tokens_per_shard: int | None = _opt(OUTPUT, "N", "Tokens per shard. Default: 100,000,000; --append: the "
                                        "dataset's.", "--tokens-per-shard"),
    shard_encoding: str | None = _opt(OUTPUT, "ENC", "How shards store tokens: uint32, uint16, packed, zstd (docs/"
                                      "format.md). Default: uint32; --append: the dataset's.", "--shard-encoding"),
    max_docs: int | None = _opt(OUTPUT, "N", "Stop after N kept documents (the counts are of what was read up to the "
                                "N-th).", "--max-docs"),
    overwrite: bool | None = _flag(
        OUTPUT, "Replace the dataset in --out; the old one stays readable until the new one is complete.", "--overwrite"
    ),  # fmt: skip
    resume: bool | None = _flag(OUTPUT, "Continue an interrupted run of the same command (or start it).", "--resume"),
    append: bool | None = _flag(
        OUTPUT, "Add these inputs' documents to the dataset in --out, deduplicated against it.", "--append"
    ),  # fmt: skip
    allow_empty: bool | None = _flag(OUTPUT, "Succeed even when no document is kept.", "--allow-empty"),
    workers: int | None = _opt(
        EXECUTION, "N", "Worker processes (0: one per core). Default: one per core this job may use.", "--workers"
    ),  # fmt: skip
    num_tasks: int | None = _opt(
        EXECUTION, "N", "Plan the run as N tasks (scale-out: docs/scaling.md).", "--num-tasks"
    ),  # fmt: skip
    unit_size: str | None = _opt(EXECUTION, "SIZE", "With --num-tasks: input per unit of work (64K, 8M, 1G). "
                                 "Default: sized to the tasks, at most 64M.", "--unit-size"),  # fmt: skip
    executor: str | None = _opt(
        EXECUTION,
        "NAME",
        "With --num-tasks: local (run here), none (print the commands), slurm, ray. Default: local.",
        "--executor",
    ),  # fmt: skip
    sbatch_args: str | None = _opt(
        EXECUTION, "ARGS", "--executor slurm: added to every sbatch (partition, time...).", "--sbatch-args"
    ),  # fmt: skip
    max_jobs: int | None = _opt(
        EXECUTION,
        "N",
        "--executor slurm: the most jobs queued at once (every array task counts; at least 5). "
        "Default: half the cluster's MaxJobCount.",
        "--max-jobs",
    ),
    ray_address: str | None = _opt(
        EXECUTION,
        "ADDR",
        "--executor ray: the cluster to join (auto, host:port). Default: a local one.",
        "--ray-address",
    ),  # fmt: skip
    log_interval: float | None = _opt(
        LOGGING,
        "SECONDS",
        "Seconds between progress lines when stderr is not a terminal (0: after every work item). Default: 10.",
        "--log-interval",
    ),  # fmt: skip
    quiet: bool | None = _flag(LOGGING, "Print only errors and warnings.", "--quiet", "-q"),
    json_: bool | None = _flag(LOGGING, "Print the summary as one JSON object on stdout.", "--json"),
) -> None:
    """Tokenize text into a sharded dataset (train/val, document index, metadata)."""
    flags = dict(locals())  # every option by its name, None where not given
    flags["json"] = flags.pop("json_")
    from ..errors import ConfigError
    from ..prepare import prepare as run_prepare
    from ..prepare.configfile import resolve_config
    from ..prepare.values import parse_size

    flags["unit_size"] = parse_size("--unit-size", unit_size) if unit_size is not None else None
    cfg = resolve_config(file=flags.pop("config"), flags=flags)
    if cfg.num_tasks is None and cfg.executor != "local":  # (else the whole prepare would run here, unasked)
        raise ConfigError(f"--executor {cfg.executor} runs a plan of tasks: pass --num-tasks N (without it, prepare "
                          "runs here)")  # fmt: skip
    if workers == 0 and not cfg.quiet:  # documented, but 0 means "in this process" to a torch DataLoader
        print(f"note: --workers 0 means one worker process per core this job may use: {cfg.n_workers()} here",
              file=sys.stderr)  # fmt: skip
    quiet_library(cfg.quiet)
    log = RunLog(cfg)
    log.start()
    n_tasks = cfg.num_tasks
    if n_tasks is not None and cfg.executor == "local":  # runs here: progress as the units are tokenized
        meta = log.follow(lambda callback: planned_prepare(cfg, n_tasks, cfg.executor, callback))
    elif n_tasks is not None:
        meta = planned_prepare(cfg, n_tasks, cfg.executor)
    else:
        meta = log.follow(lambda callback: run_prepare(cfg, callback))
    if meta is not None:
        for sig in (signal.SIGINT, signal.SIGTERM) if _COMMAND else ():  # the dataset is in place: a stop now
            signal.signal(sig, signal.SIG_IGN)  # would only cut the summary or the exit short (a traceback, 130)
        try:
            log.done(meta)
        except KeyboardInterrupt:  # (Ctrl-C while the summary prints: the dataset is in place, nothing is lost)
            from ..remote.urls import redact

            print(f"interrupted: {redact(cfg.out)} was complete already; check it with: lmshard inspect "
                  f"{redact(cfg.out)}", file=sys.stderr)  # fmt: skip
    elif cfg.json:  # planned here, run elsewhere: what was planned, and where to follow it
        from ..prepare.execution import stages

        info = stages.status(cfg.out)
        print(json.dumps({"out": cfg.out, "executor": cfg.executor, "n_tasks": n_tasks, "units": info["units"],
                          "merged": info["merged"], "follow": f"lmshard status {cfg.out}"}), flush=True)  # fmt: skip


def quiet_library(quiet: bool | None) -> None:
    """`datasets` (a --hf input) speaks on stderr for itself: its notes (offline, "Using the latest
    cached version...") are not the run's, and its progress bars are control codes in a log and
    noise under --quiet. Set for this process and its workers, unless the user set them."""
    os.environ.setdefault("DATASETS_VERBOSITY", "error")
    if quiet or not sys.stderr.isatty():
        for name in ("HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS"):
            os.environ.setdefault(name, "1")
