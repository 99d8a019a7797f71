"""Other tools' spellings of `lmshard prepare` options, and what each means here.

The tools: Megatron-LM's `tools/preprocess_data.py`, Hugging Face datasets and the transformers
example scripts, datatrove, and llm.c/nanoGPT-style data scripts. Each spelling is one of:

- `ALIASES`: the same option under another name. The command line accepts it as lmshard's own
  (click's token normalization, cli/prepare.py), so it gives the same dataset.
- `INPUT_OPTIONS`: a name for the input paths, which lmshard takes as arguments:
  `--input data.jsonl` is read as `data.jsonl` (`rewrite`).
- `NO_OPS`: a flag that asks for what lmshard does anyway (`--append-eod`): dropped, with a note.
- `NOTED`: another tool's option that means what an lmshard option means for the values it is
  given here (`--tokens_per_chunk N`, `--tokenization gpt2`, `--dtype uint16`): read as that
  option, with a note saying so (`rewrite`); any other value gets `ADVICE`.
- `ADVICE`: no lmshard option means exactly the same; the command line refuses it with a
  one-line message giving the lmshard equivalent (`advice`), instead of click's guess at a
  similar-looking option (`--append-eod` is not `--append`).

Underscores are dashes everywhere (`--input_files` is `--input-files`). Pure functions over the
argument list; the command line (cli/prepare.py) calls them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

# Another tool's option name -> lmshard's option of exactly the same meaning.
ALIASES = {
    "num-proc": "workers",  # Hugging Face datasets (num_proc)
    "preprocessing-num-workers": "workers",  # transformers run_clm.py
    "num-workers": "workers",
    "num-processes": "workers",
    "processes": "workers",
    "json-keys": "text-field",  # Megatron-LM (one key: lmshard reads one text field)
    "text-key": "text-field",  # datatrove readers (text_key)
    "text-column": "text-field",
    "text-column-name": "text-field",
    "max-samples": "max-docs",
    "dataset-name": "hf",  # transformers run_clm.py: a hub dataset id
    "dataset-config-name": "hf-config",
    "out-dir": "out",
    "output-dir": "out",
    "output-folder": "out",  # datatrove writers (output_folder)
    "outdir": "out",
    "tasks": "num-tasks",  # datatrove executors (tasks)
    "eos-token": "separator",  # datatrove DocumentTokenizer (eos_token): the token after each document
}
# Names for the input paths (Megatron-LM --input: a file or a glob; datatrove data_folder).
INPUT_OPTIONS = ("input", "inputs", "input-file", "input-files", "input-dir", "data-folder")
_EOT = "lmshard appends the end-of-text token after every document by default; the flag can go"
NO_OPS = {"append-eod": _EOT, "append-eos": _EOT, "add-eos": _EOT}
TOKENIZER_OPTIONS = ("tokenizer-type", "tokenizer-model", "tokenizer-name-or-path", "tokenizer-name", "tokenizer-path",
                     "tokenization", "vocab-file", "vocab", "merge-file")  # fmt: skip
_FORMATS = ("text", "jsonl", "json", "csv", "parquet", "arrow")  # as --format takes them (prepare/config.py)


def _takes_tokenizer(value: str | None) -> bool:
    """Whether --tokenizer takes `value` as it is (a vocabulary's name, file, directory or hub name)."""
    from ..tokenizers.vocab import TOKENIZER_NAMES  # here: the command line's start stays light

    return bool(value) and (value in TOKENIZER_NAMES or str(value).endswith((".json", ".tiktoken", ".model"))
                            or "/" in str(value) or Path(str(value)).exists())  # fmt: skip


# Another tool's option -> (lmshard's option, which of its values mean exactly that, the note said).
NOTED: dict[str, tuple[str, Callable[[str], bool], str]] = {
    "tokenization": ("tokenizer", _takes_tokenizer, "the vocabulary"),  # a seed's prepare command
    "tokens-per-chunk": ("tokens-per-shard", str.isdigit, "shards of about that many tokens (documents whole)"),
    "output-path": ("out", bool, "the dataset directory (shards, document index, metadata)"),
    "dtype": ("shard-encoding", lambda v: v in ("uint16", "uint32"), "how the shards store token ids"),
    "dataset-type": ("format", lambda v: v in _FORMATS, "the input files' format"),
}
_VOCABULARY = ("gpt2, r50k_base, p50k_base, cl100k_base, o200k_base, a .tiktoken file (qwen:PATH, llama3:PATH "
               "for those families), a tokenizer.json, a save_pretrained directory, a cached hub name (org/name) "
               "or a SentencePiece .model file")  # fmt: skip
_SEQ_LEN = ("lmshard stores whole documents and the sequence length is chosen when loading "
            "(random_batches(batch_size, seq_len)); `lmshard inspect DIR --packing N` plans rows of N "
            "tokens")  # fmt: skip


def canonical(name: str) -> str:
    """An option name as lmshard spells it, with or without its dashes (`--num_proc` ->
    `--workers`): dashes for underscores, aliases resolved."""
    name = name.replace("_", "-")
    dashes = "--" if name.startswith("--") else ""
    bare = name.removeprefix(dashes)
    return dashes + ALIASES.get(bare, bare)


def _option(token: str) -> tuple[str | None, str | None]:
    """(the option's canonical name without dashes, its `=value`) for a long option token,
    else (None, None)."""
    if not token.startswith("--") or token == "--":
        return None, None
    name, eq, value = token.partition("=")
    return canonical(name)[2:], (value if eq else None)


def rewrite(args: list[str]) -> tuple[list[str], list[str]]:
    """The arguments with input options turned into arguments (`--input X` -> `X`) and no-op
    flags dropped, and a note for each dropped flag."""
    out: list[str] = []
    notes: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":  # everything after it is an argument
            out += args[i:]
            break
        name, value = _option(token)
        noted = NOTED.get(name or "")
        given = value if value is not None else (args[i + 1] if i + 1 < len(args) else None)
        if noted is not None and given is not None and noted[1](given):
            out += [f"--{noted[0]}", given]
            notes.append(f"--{name} {given} read as --{noted[0]} {given}: {noted[2]}")
            i += 1 + (value is None)
            continue
        if name in INPUT_OPTIONS and (value is not None or i + 1 < len(args)):
            out.append(value if value is not None else args[i + 1])
            i += value is None  # the next token was its value
        elif name in NO_OPS and value is None:
            notes.append(f"--{name}: {NO_OPS[name]}")
        else:
            out.append(token)  # (`--input` with nothing after it stays: `advice` answers it)
        i += 1
    return out, notes


def value_of(args: list[str], name: str) -> str | None:
    """The value given to option `name` (without dashes) in `args`, or None."""
    for i, token in enumerate(args):
        if token == "--":
            break
        option, value = _option(token)
        if option == name:
            if value is not None:
                return value
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                return args[i + 1]
    return None


def advice(option: str, args: list[str]) -> str | None:
    """One line giving the lmshard equivalent of another tool's option `option` (as click names
    it: `--output-prefix`), given the whole argument list; None when it is not a known spelling."""
    name = option.removeprefix("--")
    if name in INPUT_OPTIONS:  # given without a path
        return f"{option}: pass the input paths as arguments: lmshard prepare PATH... --out DIR"
    if name in NO_OPS:  # given a value
        return f"{option}: {NO_OPS[name]}"
    if name in TOKENIZER_OPTIONS:
        return f"{option}: {_tokenizer(args)}"
    rule = ADVICE.get(name)
    if rule is None:
        return None
    return f"{option}: {rule(value_of(args, name)) if callable(rule) else rule}"


def _tokenizer(args: list[str]) -> str:
    """The one --tokenizer value that stands for Megatron-style tokenizer options, where the
    arguments say which (a type, a model, a vocabulary file)."""

    kind = (value_of(args, "tokenizer-type") or "").lower()
    names = ("tokenizer-model", "tokenizer-name-or-path", "tokenizer-name", "tokenizer-path", "tokenization")
    model = next(filter(None, (value_of(args, n) for n in names)), "")
    files = " ".join(filter(None, (value_of(args, n) for n in ("vocab-file", "vocab", "merge-file"))))
    one = "lmshard names the vocabulary with --tokenizer alone"
    if kind == "gpt2bpetokenizer" or (not kind and "gpt2" in files.lower()) or model in ("gpt2", "gpt-2"):
        return f"{one}; use --tokenizer gpt2"
    if not model and ("sentencepiece" in kind or kind.startswith("llama")):
        return (f"{one}; use --tokenizer with the model's SentencePiece .model file, its tokenizer.json, its "
                "save_pretrained directory or its hub name (org/name)")  # fmt: skip
    if model and _takes_tokenizer(model):  # a value --tokenizer takes as it is
        return f"{one}; use --tokenizer {model}"
    return f"{one}: {_VOCABULARY}"


def _output(value: str | None) -> str:
    return f"lmshard writes a dataset directory (shards, document index, metadata); use --out {value or 'DIR'}"


def _data_name(value: str | None) -> str:
    from ..prepare.documents.hf import PRESETS  # here: the command line's start stays light

    if value in PRESETS:
        return f"use --preset {value} (`lmshard datasets` lists the named datasets)"
    return ("pass files or directories as arguments, --hf ID for a Hugging Face dataset, or --preset NAME for a "
            "named one (`lmshard datasets`); --out DIR says where the dataset goes")  # fmt: skip


def _fraction(value: str | None) -> str:
    try:
        number = float(value or "")
    except ValueError:
        number = -1.0
    given = f"{number:g}" if 0 < number < 1 else "FRACTION"
    return f"use --val-fraction {given} (the fraction of documents in the val split, in [0, 1))"


def _percent(value: str | None) -> str:
    try:
        fraction = f"{float(value or '') / 100:g}"
    except ValueError:
        fraction = "FRACTION"
    return f"lmshard takes a fraction, not a percentage; use --val-fraction {fraction}"


def _shard_tokens(value: str | None) -> str:
    return (f"use --tokens-per-shard {value or 'N'} for shards of about that many tokens (documents are kept "
            f"whole); a sequence length is chosen when loading")  # fmt: skip


# Another tool's option with no lmshard option of the same meaning -> its equivalent: fixed text,
# or made from the value given ({value}, or a placeholder when none was).
ADVICE: dict[str, str | Callable[[str | None], str]] = {
    # Megatron-LM tools/preprocess_data.py (its tokenizer options: `_tokenizer`)
    "output-prefix": _output,
    "split-sentences": "lmshard keeps documents whole; --text-mode line or paragraph makes each line or paragraph "
    "of a text file a document",
    "keep-newlines": "lmshard keeps a document's newlines (CRLF becomes LF; --no-normalize keeps every byte); drop "
    "the flag",
    "lang": "lmshard splits no sentences, so it needs no language; drop the option",
    "partitions": "lmshard splits the input by itself; drop the option (--workers N sets the processes, --num-tasks "
    "N plans the run as N tasks)",
    "keep-sequential-samples": "lmshard keeps documents in input order (within each split); drop the flag",
    "dataset-impl": "lmshard writes one format; for Megatron-LM's .bin/.idx, run `lmshard export DIR --to megatron "
    "--out DIR2` after prepare",
    "vocab-size": "lmshard reads the vocabulary size from the tokenizer; drop the option",
    "seq-length": _SEQ_LEN,
    "seq-len": _SEQ_LEN,
    "context-length": _SEQ_LEN,
    "max-length": _SEQ_LEN,
    # Hugging Face datasets and transformers' example scripts
    "validation-split-percentage": _percent,
    "block-size": _SEQ_LEN,
    "max-seq-length": _SEQ_LEN,
    "test-size": _fraction,
    "val-split": _fraction,
    "validation-split": _fraction,
    "split-ratio": _fraction,
    "dataset": _data_name,
    "trust-remote-code": "lmshard runs no dataset's code; save the dataset with `datasets` (save_to_disk) where the "
    "code may run, then pass that directory to --hf",
    "shuffle": "lmshard keeps documents in input order; the loader samples at random (random_batches), and --seed "
    "sets the train/val split",
    "num-shards": "lmshard sizes shards by tokens; use --tokens-per-shard N",
    "dtype": lambda value: ("lmshard stores token ids as --shard-encoding uint32 (the default), uint16, packed or "
                            f"zstd, not {value or 'that'}; pass one of those"),  # fmt: skip
    "dataset-type": lambda value: (f"lmshard detects each input's format by its name; --format {'|'.join(_FORMATS)} "
                                   "forces one, and --hf ID reads a Hugging Face dataset"),  # fmt: skip
    "max-train-samples": lambda value: f"use --max-docs {value or 'N'} (kept documents, both splits)",
    # datatrove
    "logging-dir": "lmshard keeps a run's state beside --out (.NAME.lmshard-work); drop the option",
    "max-tokens-per-file": _shard_tokens,
    "limit": lambda value: f"use --max-docs {value or 'N'} (kept documents)",
    "glob-pattern": lambda value: f"pass the glob as an input: lmshard prepare '{value or 'GLOB'}' --out DIR",
    # llm.c / nanoGPT-style data scripts
    "output-path": _output,
    "output": _output,
    "shard-size": _shard_tokens,
    "tokens-per-chunk": _shard_tokens,
    "data-name": _data_name,
}
