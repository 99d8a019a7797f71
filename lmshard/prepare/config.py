"""The options of a prepare run: `PrepareConfig`, a keyword-only dataclass whose every field is
checked at construction (its type, its choices, the combinations that cannot work), and what
the run derives from them (workers, encoding, clean and MinHash settings). configfile.py
resolves one from flags, a config file, a preset and the demo defaults.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError
from ..format import ENCODINGS, EOT_POSITIONS, DatasetMeta, Encoding
from ..quality.minhash import MinHashConfig
from ..remote.urls import is_url, output_url, redact, scheme_of
from .documents.clean import CleanConfig
from .documents.inputspec import with_format
from .values import checked, choice

# .txt/.md: auto (a document per file up to --max-chars bytes, else per paragraph), file, line, paragraph
TEXT_MODES = ("auto", "file", "line", "paragraph")
ON_ERROR = ("fail", "skip")  # what a bad record does: stop the run, or count and skip it
DECODE_ERRORS = ("strict", "replace")  # bytes that are not UTF-8: a decode_error record, or U+FFFD in the text
DEDUP_MODES = ("document", "none")
# Options that change how a run treats --out or the machine, never the output bytes.
# (The tokenizer backend is one: every backend writes the same tokens, or it is not used.)
TRANSIENT_OPTIONS = ("out", "workers", "overwrite", "resume", "append", "allow_empty", "tokenizer_backend",
                     "num_tasks", "unit_size", "executor", "sbatch_args", "max_jobs", "ray_address",
                     "log_interval", "quiet", "json")  # fmt: skip
EXECUTORS = ("local", "none", "slurm", "ray")  # scale-out executors (prepare/execution/stages.py)
MIN_UNIT_BYTES = 64 << 10  # the smallest unit a plan cuts (units.py reads a window of this size at each cut)
BOS_MODES = ("auto", "yes", "no")  # a BOS token before each document: as the tokenizer does, always, never
INPUT_FORMATS = ("text", "jsonl", "json", "csv", "parquet", "arrow")  # what --format can force


@dataclass(kw_only=True)
class PrepareConfig:
    """Every option of a prepare run; the CLI flags mirror these names in kebab-case."""

    out: str
    inputs: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)  # globs of input paths to leave out
    filters: list[str] = field(default_factory=list)  # --filter: document filters, in order (quality/filters.py)
    attributes: list[str] = field(default_factory=list)  # --attribute: scores kept per document (quality/scores.py)
    decontaminate: list[str] = field(default_factory=list)  # benchmark files, PATH or NAME=PATH (quality/decon.py)
    decontaminate_n: int = 13  # words in a matching n-gram
    decontaminate_lines: bool = False  # remove the matching lines, not the document
    include_hidden: bool = False  # a directory walk also reads hidden files and directories (.git, .venv)
    tokenizer: str = "gpt2"
    tokenizer_backend: str = "auto"  # auto, tiktoken, splintr (tiktoken vocabularies) or tokenizers
    separator: str | None = None  # the special token after each document (default: the vocabulary's end of text)
    bos: str = "auto"  # a BOS token before each document: auto (when the tokenizer adds one itself), yes, no
    format: str | None = None  # force one input format instead of detecting it by suffix
    text_field: str = "text"
    text_mode: str = "auto"  # .txt/.md: per file up to --max-chars bytes, else per paragraph; or file, line, paragraph
    normalize: str = "nfc"
    byte_exact: bool = False
    min_chars: int = 1
    max_chars: int = 10_000_000
    overlong: str = "drop"
    dedup: str = "document"
    dedup_lines: bool = False  # also drop non-blank lines seen earlier in the input (two passes)
    near_dedup: bool = False  # also drop near-duplicates (MinHash, quality/near.py)
    minhash: str = "5:22x5:0.7"  # --near-dedup's shingles:bands x rows:threshold (quality/minhash.py)
    val_fraction: float = 0.01
    val_by: str | None = None  # "input" or a record field: a val part of each domain of val_tokens (execution/valby.py)
    val_tokens: int = 0
    seed: int = 1337
    tokens_per_shard: int = 100_000_000
    shard_encoding: str | None = None  # format/encoding.py; None: uint32, or with --append the dataset's
    eot_position: str = "after"
    max_docs: int | None = None
    on_error: str = "fail"
    decode_errors: str = "strict"  # text, JSON lines, whole files: bytes that are not UTF-8 (records.py)
    workers: int = 0  # 0: one per core this process may use (available_cpus)
    overwrite: bool = False  # replace a complete dataset in --out (swapped in only when the new one is complete)
    resume: bool = False  # continue an interrupted run of the same configuration
    append: bool = False  # add the inputs' documents to the dataset in --out
    allow_empty: bool = False  # a run that keeps no document succeeds instead of failing
    hf: str | None = None  # a Hugging Face hub id, save_to_disk directory or local data directory
    hf_config: str | None = None
    hf_split: str = "train"
    streaming: bool | None = None  # None: stream hub ids and local data files
    revision: str | None = None
    hf_task: int = 0  # this task's part of the stream, of hf_tasks parts
    hf_tasks: int = 1
    num_tasks: int | None = None  # scale-out: plan the run as this many tasks (stages.py); None: one fused run
    unit_size: int | None = None  # scale-out: bytes of input per unit; None: sized to the task count (units.py)
    executor: str = "local"  # with num_tasks: local (run every stage here), none (print the commands), slurm
    sbatch_args: str | None = None  # --executor slurm: added to every sbatch call (partition, time, mem, account)
    max_jobs: int | None = None  # --executor slurm: the most jobs the run queues at once; None: half MaxJobCount
    ray_address: str | None = None  # --executor ray: the cluster to join (auto, or host:port); None: a local one
    log_interval: float = 10.0  # seconds between progress lines when stderr is not a terminal
    quiet: bool = False  # print only errors and warnings
    json: bool = False  # print the summary as one JSON object on stdout

    def __post_init__(self) -> None:
        self._check_types()
        output_url(self.out)  # a URL of a scheme datasets cannot be written to: refused, not made a directory
        choice("--text-mode", self.text_mode, TEXT_MODES)
        choice("--executor", self.executor, EXECUTORS)
        if not self.log_interval >= 0:  # 0: a line after every work item
            raise ConfigError(f"--log-interval {self.log_interval}: pass a number of seconds, 0 or more")
        if self.num_tasks is not None and self.num_tasks < 1:
            raise ConfigError(f"--num-tasks {self.num_tasks}: pass at least 1")
        if self.max_jobs is not None and self.max_jobs < 5:
            raise ConfigError(f"--max-jobs {self.max_jobs}: pass at least 5 (an array task for each of the 4 stages, "
                              "and the finish)")  # fmt: skip
        if self.unit_size is not None and self.unit_size < MIN_UNIT_BYTES:
            raise ConfigError(f"--unit-size {self.unit_size}: pass at least {MIN_UNIT_BYTES:,} bytes (64K)")
        choice("--dedup", self.dedup, DEDUP_MODES)
        choice("--eot-position", self.eot_position, EOT_POSITIONS)
        if self.shard_encoding is not None:
            choice("--shard-encoding", self.shard_encoding, ENCODINGS)
        choice("--bos", self.bos, BOS_MODES)
        from ..tokenizers import BACKENDS

        choice("--tokenizer-backend", self.tokenizer_backend, BACKENDS)
        choice("--on-error", self.on_error, ON_ERROR)
        choice("--decode-errors", self.decode_errors, DECODE_ERRORS)
        if self.format is not None:
            choice("--format", self.format, INPUT_FORMATS)
        if not self.inputs and not self.hf:
            raise ConfigError("no inputs: name files, directories or globs (or - for stdin), or pass --hf")
        for spec in self.inputs:
            _check_input(with_format(spec)[1])
        self._check_hf_tasks()
        if self.hf:
            self.hf_spec().kind()  # a path that names no directory fails now, not after --out is claimed
        self.minhash_config()  # a malformed --minhash fails now, before --out is claimed
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError("--val-fraction must be in [0, 1)")
        self._check_val_by()
        if self.tokens_per_shard < 1:
            raise ConfigError("--tokens-per-shard must be at least 1")
        if self.max_docs is not None and self.max_docs < 1:
            raise ConfigError("--max-docs must be at least 1")
        if self.append and self.overwrite:
            raise ConfigError("--append adds to the dataset in --out and --overwrite replaces it; pass one of them")
        if self.decontaminate_lines and not self.decontaminate:
            raise ConfigError("--decontaminate-lines removes the lines that match a --decontaminate benchmark, and "
                              "none is given; pass --decontaminate FILE, or drop --decontaminate-lines")  # fmt: skip
        if self.workers < 0:
            raise ConfigError("--workers must be 0 (all cores) or more")
        self.clean_config()  # validates the cleaning fields
        from ..quality.filters import absolute, resolve

        self.filters = [absolute(name) for name in self.filters]  # a task started elsewhere imports the same file
        self.decontaminate = [_absolute_benchmark(spec) for spec in self.decontaminate]
        self.attributes = [absolute(name) for name in self.attributes]
        if self.attributes:  # a scorer that cannot be found fails here, not in a worker
            from ..quality.scores import Scorer

            Scorer(self.attributes)
        for name in self.clean_config().filters:  # a filter that cannot be found fails here, not in a worker; the
            resolve(name)  # benchmarks' index is built here once, before the workers fork

    def _check_types(self) -> None:
        """Every field has its annotated type (as `resolve_config` makes sure for flags and
        files), so a library caller's `max_chars="10"` fails here, not deep in a worker."""
        for name, expected in _field_types().items():
            value = getattr(self, name)
            setattr(self, name, checked(name, value, expected, "PrepareConfig field", parse_strings=False))

    def _check_hf_tasks(self) -> None:
        from .documents.hf import check_task_split

        check_task_split(self.hf_task, self.hf_tasks)
        if not self.hf and (self.hf_task, self.hf_tasks) != (0, 1):
            raise ConfigError("--hf-task/--hf-tasks split only the --hf stream, and there is no --hf; drop them "
                              "(to split files between tasks, pass each task its own inputs)")  # fmt: skip

    def minhash_config(self) -> MinHashConfig:
        """--minhash N:BxR:T as a MinHashConfig (word N-grams, B bands of R rows, threshold T)."""
        try:
            grams, bands, rows, threshold = re.fullmatch(r"(\d+):(\d+)[xX](\d+):([0-9.]+)", self.minhash).groups()  # type: ignore[union-attr]
            return MinHashConfig(n_grams=int(grams), bands=int(bands), rows=int(rows), threshold=float(threshold))
        except (ValueError, AttributeError) as e:
            why = str(e) if "pass" in str(e) else "write it as SHINGLE_WORDS:BANDSxROWS:THRESHOLD"
            raise ConfigError(f"--minhash {self.minhash!r}: {why} (the default is 5:22x5:0.7)") from None

    def clean_config(self) -> CleanConfig:
        return CleanConfig(
            normalize=self.normalize,
            byte_exact=self.byte_exact,
            min_chars=self.min_chars,
            max_chars=self.max_chars,
            overlong=self.overlong,
            filters=tuple(self.filters) + ((self.decon_filter(),) if self.decontaminate else ()),
        )

    def attribute_fields(self, labels: Sequence[str] = ("",)) -> tuple[Any, ...]:
        """--attribute's columns (format/attributes.py's AttrField), in order, then --val-by
        FIELD's (its `labels`: the domains found); () without either."""
        own: tuple[Any, ...] = ()
        if self.attributes:  # (a run without --attribute imports no scorer)
            from ..quality.scores import schema

            own = tuple(schema(self.attributes))
        if self.val_by in (None, "input"):
            return own
        from .domains import domain_attr

        return (*own, domain_attr(self.val_by, labels))

    def attr_columns(self) -> list[int]:
        """The bytes of a value of each --attribute column, in order ([]: none)."""
        from ..format.attributes import row_dtype

        dtype = row_dtype(self.attribute_fields())
        return [dtype.fields[name][0].itemsize for name in dtype.names or ()]  # type: ignore[index]

    def decon_filter(self) -> str:
        """--decontaminate as the last filter (quality/filters.py: decontaminate=N:MODE:FILES)."""
        mode = "lines" if self.decontaminate_lines else "documents"
        return f"decontaminate={self.decontaminate_n}:{mode}:{'|'.join(self.decontaminate)}"

    def hf_spec(self) -> Any:
        if not self.hf:
            return None
        from .documents.hf import HFSpec

        return HFSpec(dataset=self.hf, config=self.hf_config, split=self.hf_split,
                      text_field=self.text_field, streaming=self.streaming, revision=self.revision,
                      task=self.hf_task, tasks=self.hf_tasks)  # fmt: skip

    def encoding(self, n_vocab: int, previous: DatasetMeta | None = None) -> Encoding:
        """The shard encoding of this run's shards: --shard-encoding (default uint32), or the
        dataset's own with --append (a different one asked for is refused)."""
        if previous is not None:
            if self.shard_encoding not in (None, previous.encoding.name):
                raise ConfigError(f"--shard-encoding {self.shard_encoding}: --append keeps the dataset's encoding, "
                                  f"{previous.encoding.name}; drop the option, or `lmshard convert` the dataset "
                                  "first")  # fmt: skip
            return previous.encoding
        return Encoding.choose(self.shard_encoding or "uint32", n_vocab)

    def n_workers(self) -> int:
        return self.workers or available_cpus()

    def _check_val_by(self) -> None:
        if self.val_by is not None or self.val_tokens:
            from .domains import check_options

            check_options(self)

    def reads_stdin(self) -> bool:
        """Whether an input is stdin: `-`, or `FORMAT:-`."""
        return any(with_format(spec)[1] == "-" for spec in self.inputs)

    def recorded(self) -> dict[str, Any]:
        """The config as stored in metadata: what determines the output bytes (not where it
        was written, the number of workers or how the run treated --out; those go to the "run"
        record). After --append, `inputs` lists the dataset's inputs followed by the new ones."""
        d = asdict(self)
        for transient in TRANSIENT_OPTIONS:
            d.pop(transient)
        d["inputs"] = [_recorded_input(spec) for spec in self.inputs]  # credentials never recorded
        d["shard_encoding"] = self.shard_encoding or (None if self.append else "uint32")  # None: the dataset's
        if self.val_by is None:  # (recorded only when used)
            del d["val_by"], d["val_tokens"]
        from ..quality.filters import plugin_sources

        if plugins := plugin_sources(self.filters):  # a plugin's code determines the bytes too
            d["filter_sources"] = plugins
        if plugins := plugin_sources([name.partition("=")[0] for name in self.attributes]):
            d["attribute_sources"] = plugins
        if self.decontaminate:  # and so do the benchmarks' bytes
            from ..quality.decon import benchmark_sources

            d["decontaminate_sources"] = benchmark_sources(self.decontaminate)
        return d


def _absolute_benchmark(spec: str) -> str:
    """A --decontaminate PATH or NAME=PATH with its path made absolute (every task reads the same file)."""
    name, sep, path = spec.partition("=")
    if sep and re.fullmatch(r"[A-Za-z0-9_]+", name):
        return f"{name}={os.path.abspath(path)}"
    return os.path.abspath(spec)


def _recorded_input(spec: str) -> str:
    """An input as the metadata records it: a URL's credentials taken out (`FORMAT:URL` too)."""
    fmt, bare = with_format(spec)
    if not is_url(bare):
        return spec
    return f"{fmt}:{redact(bare)}" if fmt else redact(bare)


def _check_input(spec: str) -> None:
    """An input that looks like a URL must be one lmshard reads (remote/urls.py's schemes)."""
    name = scheme_of(spec)
    if name is None or is_url(spec):
        return
    if name == "file":
        raise ConfigError(f"{spec}: name a local file by its path, without file://")
    raise ConfigError(f"{redact(spec)}: lmshard reads s3://, gs://, az://, hf:// and https:// URLs, not "
                      f"{spec.split(':', 1)[0]}://; copy the files to one of those or to local disk")  # fmt: skip


# CLI options whose name is not a PrepareConfig field: option → (field, value transform).
ALIASES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "split": ("hf_split", lambda v: v),
    "no_normalize": ("byte_exact", lambda v: v),
    "no_dedup": ("dedup", lambda v: "none" if v else "document"),
    "no_streaming": ("streaming", lambda v: not v),
    "filter": ("filters", lambda v: v),
    "attribute": ("attributes", lambda v: v),
}
# Options that steer resolution itself rather than naming a field.
META_OPTIONS: dict[str, Any] = {"preset": str | None, "demo": bool}


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(PrepareConfig)


def available_cpus() -> int:
    """The cores this process may use: what the scheduler granted (`SLURM_CPUS_PER_TASK`), else its
    CPU affinity (taskset, a cgroup cpuset, a container), else the machine's count. A task given
    4 cores of a 128-core node starts 4 workers, not 128."""
    granted = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if granted.isdigit() and int(granted) > 0:
        return int(granted)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API (macOS)
        return os.cpu_count() or 1
