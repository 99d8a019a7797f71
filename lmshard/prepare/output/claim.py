"""How a run uses `--out`: the one decision table for a new build, a resumed one, an append,
an overwrite, or a refusal with the fix; and the fingerprint a resumed run must share with the
interrupted one (`difference` names, in the user's words, the first way two differ).

| --out holds          | pending build | no flag  | --resume                | --overwrite      | --append          |
|----------------------|---------------|----------|-------------------------|------------------|-------------------|
| nothing / empty dir  | no            | build    | build                   | build            | refused           |
| a dataset            | no            | refused  | done if the same run    | build, swap      | build on it, swap |
| anything             | yes           | refused  | resume (same run only)  | discard, build   | (as its column)   |
| other files only     | no            | refused  | refused                 | refused          | refused           |

Memory model: the fingerprint (one small entry per input file).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import __version__
from ...errors import ConfigError, LmshardError, warn
from ...format import FORMAT_VERSION, METADATA_FILE, DatasetMeta, atomic_write_json, load_metadata
from ...tokenizers import Tokenizer, load_tokenizer
from ..config import PrepareConfig
from ..documents import sources as sources_mod
from ..documents.hfread import resume_mark
from ..documents.reading import read_error
from ..documents.sources import Source
from .leftrun import left_unfinished
from .staging import RUN_FILE, RUN_VERSION, OutputPaths, inside, kind_of_output, read_run


@dataclass
class Claim:
    """How this run uses --out: a fresh build, or the resumption of one (its checkpoint), on top
    of `previous` (--append); or `complete` when --resume finds the run already done."""

    fingerprint: dict[str, Any]
    started_at: float
    checkpoint: dict[str, Any] | None = None
    previous: DatasetMeta | None = None
    resumed: bool = False
    complete: DatasetMeta | None = None
    commit_pending: bool = False  # the build finished (metadata written) but was not swapped in yet


def claim_output(config: PrepareConfig, paths: OutputPaths, sources: list[Source], tokenizer: Tokenizer,
                 spooled: bool = False) -> Claim:  # fmt: skip
    """Decide what this run does with --out and any interrupted build, or refuse with the fix.
    `spooled`: a planned run whose plan holds its stdin or pipes as they were read (its spool),
    which a --resume reads again instead of them."""
    out = paths.out
    kind, foreign = kind_of_output(out)
    if kind == "file":
        raise ConfigError(f"{out}: exists and is not a directory; choose another --out")
    if kind != "missing" and inside(out):
        raise ConfigError(f"{out}: is the current directory (or holds it), and a finished run swaps it whole; "
                          "run prepare from outside it")  # fmt: skip
    if kind != "missing" and os.path.ismount(out):
        raise ConfigError(f"{out}: is a mount point; a dataset is built beside --out and renamed into place, "
                          "which cannot cross filesystems: use a directory inside it")  # fmt: skip
    appending = config.append and kind == "dataset"
    if config.append and (config.max_docs is not None or (appending and _capped(out))):
        raise ConfigError(f"{out}: --append cannot extend a run limited by --max-docs (its stream has no "
                          "well-defined continuation); prepare the whole input without --max-docs")  # fmt: skip
    # (found once, after the refusals that need none: a downloaded Hugging Face split's identity downloads it)
    fingerprint = functools.cache(lambda: _fingerprint(config, sources, tokenizer,
                                                       out / METADATA_FILE if appending else None))  # fmt: skip
    run = read_run(paths.staging)
    if run is not None:
        if config.resume:
            if not spooled and (stream := next((s for s in sources if s.stream), None)):
                name = "stdin" if stream.path == "-" else f"the pipe {stream.path}"
                raise ConfigError(f"--resume cannot re-read {name}; save the input to a file and run again")
            diff = difference(run.get("fingerprint", {}), fingerprint())
            if diff:
                raise ConfigError(f"{out}: cannot resume: {diff}; pass the same options and inputs, "
                                  "or --overwrite to discard the interrupted run and start again")  # fmt: skip
            previous = _appendable(out, config, tokenizer) if appending else None
            built = (paths.staging / METADATA_FILE).exists()
            return Claim(fingerprint(), run.get("started", time.time()), run.get("checkpoint"), previous,
                         resumed=True, commit_pending=built)  # fmt: skip
        was_append = bool(run.get("fingerprint", {}).get("appending_to"))
        if not config.overwrite or was_append:
            raise left_unfinished(run, Path(config.out), paths.staging, was_append)  # (--out as given: its work folder)
        shutil.rmtree(paths.staging)
    if kind == "foreign":
        listed = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
        raise ConfigError(f"{out}: not empty and not an lmshard dataset ({listed}); choose an empty or new --out")
    previous = None
    if kind == "dataset":
        if config.resume and _already_done(out, config, sources):
            return Claim(fingerprint(), time.time(), complete=load_metadata(out))
        if config.resume and not (config.append or config.overwrite):
            raise ConfigError(f"{out}: cannot resume: the dataset there is built already, {_made_with(out, config)}; "
                              "pass the options and inputs it was made with to find it complete, --overwrite to "
                              "replace it, or --append to add to it")  # fmt: skip
        if appending:
            previous = _appendable(out, config, tokenizer)
        elif not config.overwrite:
            raise ConfigError(f"{out}: holds a dataset; pass --overwrite to replace it (it stays readable until "
                              "the new one is complete), --append to add to it, or choose another --out")  # fmt: skip
    elif kind == "unfinished" and not config.overwrite:
        raise ConfigError(
            f"{out}: holds an unfinished prepare run; pass --overwrite to replace it, or choose another --out"
        )
    elif config.append:
        raise ConfigError(f"{out}: no dataset to append to; run without --append to create it")
    return Claim(fingerprint(), time.time(), previous=previous)


def _fingerprint(config: PrepareConfig, sources: list[Source], tokenizer: Tokenizer,
                 appending_to: Path | None) -> dict[str, Any]:  # fmt: skip
    """What a resumed run must share with the interrupted one: the options that shape the output,
    each input's identity (path, size, modification time; for an object at a URL, its redacted
    URL, size and the ETag or modification time its listing gave; for a Hugging Face dataset,
    `hfread.resume_mark`), the vocabulary, and the
    dataset being appended to. JSON-shaped, so it compares equal after a round trip through the
    run record."""

    def identity(src: Source) -> list[Any]:
        if src.fmt == "hf":  # its data files (a stream's names; a saved dataset's save)
            return [src.path, src.fmt, src.size, resume_mark(config.hf_spec())]
        if src.stream:
            return [src.path, src.fmt, src.size, 0]
        if src.url:  # found by a listing when the run started: no request here
            return [src.path, src.fmt, src.size, src.version]
        try:
            st = os.stat(src.path)
        except OSError as e:  # gone or unreadable since it was found: the input's error, not --out's
            raise read_error(src.path, e) from None
        return [src.path, src.fmt, st.st_size, st.st_mtime_ns]

    appended = hashlib.sha256(appending_to.read_bytes()).hexdigest() if appending_to else None
    # The work-item plan must be the same one: a resumed run skips the units (of work items) its markers count.
    planning = {
        "lmshard": __version__,
        "block_bytes": sources_mod.BLOCK_BYTES,
        "files_per_item": sources_mod.FILES_PER_ITEM,
        "records_per_item": sources_mod.RECORDS_PER_ITEM,
    }
    # The separator and BOS as resolved: a tokenizer's config files can change them under the same sha.
    specials = {"eot_id": tokenizer.eot_id, "bos_id": bos_written(config, tokenizer)}
    fp = {"format": FORMAT_VERSION, "config": config.recorded(), "sources": [identity(s) for s in sources],
          "tokenizer": tokenizer.vocab_sha256, "specials": specials, "appending_to": appended,
          "planning": planning}  # fmt: skip
    return dict(json.loads(json.dumps(fp)))


def _shown(value: Any) -> str:
    """An option's value as a user would say it: on, off, not given, or the value."""
    if value is None:
        return "not given"
    return ("on" if value else "off") if isinstance(value, bool) else repr(value)


def difference(started: dict[str, Any], now: dict[str, Any]) -> str | None:
    """The first way two run fingerprints differ, in the user's words; None when they match."""
    if bool(started.get("appending_to")) != bool(now.get("appending_to")):
        return "the interrupted run was " + ("an --append; pass --append" if started.get("appending_to") else
                                             "not an --append; leave --append out")  # fmt: skip
    for key in sorted(set(started.get("config", {})) | set(now.get("config", {}))):
        a, b = started.get("config", {}).get(key), now.get("config", {}).get(key)
        if a != b:
            if key == "inputs":  # the arguments have no flag
                return f"the inputs were {a!r} when the run started and are {b!r} now"
            flag = {"filter_sources": "filter", "attribute_sources": "attribute"}.get(key)
            if flag and started.get("config", {}).get(f"{flag}s") != now["config"].get(f"{flag}s"):
                continue  # (the filters themselves differ: named next, as --filter)
            if flag:
                name = next(n for n in sorted(set(a or {}) | set(b or {})) if (a or {}).get(n) != (b or {}).get(n))
                where = ((b or {}).get(name) or (a or {}).get(name) or [name])[0] or name
                return (f"the {flag} plugin {where} (--{flag} {name}) changed since the run started (its source, or "
                        "a Python file of its directory that it imports); put it back as it was")  # fmt: skip
            if key == "decontaminate_sources" and a and b and set(a) == set(b):
                name = next(n for n in sorted(a) if a[n] != b[n])
                return (f"the benchmark {b[name][0]} (--decontaminate) changed since the run started; put it back "
                        "as it was")  # fmt: skip
            return f"--{key.replace('_', '-')} was {_shown(a)} when the run started and is {_shown(b)} now"
    a_src = {s[0]: s for s in started.get("sources", [])}
    b_src = {s[0]: s for s in now.get("sources", [])}
    for path in a_src.keys() - b_src.keys():
        return f"input {path} was read by the run and is not an input now"
    for path in b_src.keys() - a_src.keys():
        return f"input {path} was not an input when the run started"
    for path, was in a_src.items():
        found = b_src[path]
        if was[1] == "hf" and "" in (was[3], found[3]):  # data files one side could not name (hfread.resume_mark)
            was, found = was[:3], found[:3]
        if was != found:
            if was[1] == "hf":
                return (f"input {path} changed since the run started (its data files: a new revision, files added, "
                        "removed or renamed, or the dataset saved again)")
            what = "size or ETag" if "://" in str(path) else "size or modification time"
            return f"input {path} changed since the run started ({what})"
    if [s[0] for s in started.get("sources", [])] != [s[0] for s in now.get("sources", [])]:
        return "the inputs are in a different order than when the run started"
    for key in ("tokenizer", "appending_to", "format", "planning"):
        if started.get(key) != now.get(key):
            what = {"tokenizer": "the tokenizer's vocabulary", "appending_to": "the dataset being appended to",
                    "format": "the lmshard version's output format",
                    "planning": "lmshard's version or its work-item sizes"}[key]  # fmt: skip
            return f"{what} changed since the run started"
    return None


def _capped(out: Path) -> bool:
    try:
        return load_metadata(out).config.get("max_docs") is not None
    except LmshardError:
        return False


def _comparable(config: PrepareConfig) -> dict[str, Any]:
    """This run's recorded options that a finished dataset's must equal: all but its inputs, and
    but the shard encoding of an --append that keeps the dataset's (recorded as None)."""
    ours = config.recorded()
    return {k: v for k, v in ours.items() if k != "inputs" and not (k == "shard_encoding" and v is None)}


def _made_with(out: Path, config: PrepareConfig) -> str:
    """How the dataset in `out` was made unlike this run: its first differing option, else its inputs."""
    try:
        theirs = dict(load_metadata(out).config)
    except LmshardError:
        return "but its metadata cannot be read"
    for key, value in _comparable(config).items():
        if theirs.get(key, value) != value:
            return f"with --{key.replace('_', '-')} {theirs[key]!r} (this run: {value!r})"
    return "from other inputs (or inputs that changed since)"


def _already_done(out: Path, config: PrepareConfig, sources: list[Source]) -> bool:
    """--resume after the run finished: the dataset's recorded options match this run's and its
    inputs end with this run's (by path and size)."""
    try:
        meta = load_metadata(out)
    except LmshardError:
        return False
    ours, theirs = _comparable(config), dict(meta.config)
    if ours != {k: theirs.get(k, v) if k == "shard_encoding" else theirs.get(k) for k, v in ours.items()}:
        return False
    done = [(s.path, s.bytes) for s in meta.sources]
    now = [(s.path, s.size) for s in sources]
    return bool(now) and done[len(done) - len(now) :] == now if config.append else done == now


# Options a dataset and the documents appended to it must share: how text is cleaned,
# deduplicated, split and separated.
_APPEND_MUST_MATCH = ("normalize", "byte_exact", "min_chars", "max_chars", "overlong", "dedup", "dedup_lines",
                      "val_fraction", "seed", "eot_position", "separator", "bos")  # fmt: skip


def bos_written(config: PrepareConfig, tokenizer: Tokenizer) -> int | None:
    """The BOS id written before each document, or None (--bos auto: when the tokenizer's own
    configuration adds one, as Llama's and Mistral's do)."""
    if config.bos == "yes" or (config.bos == "auto" and tokenizer.adds_bos):
        return tokenizer.bos_id
    return None


def _appendable(out: Path, config: PrepareConfig, tokenizer: Tokenizer) -> DatasetMeta:
    """The dataset in --out, once checked that this run's documents can join it."""
    meta = load_metadata(out)
    tok = meta.tokenizer
    # The vocabulary's sha256 pins it, however its path or name was spelled (./tok.json, /abs/tok.json).
    if tok.ranks_sha256 != tokenizer.vocab_sha256 or tok.n_vocab != tokenizer.n_vocab:
        raise ConfigError(f"{out}: --append: the dataset was tokenized with {tok.name!r} and this run uses "
                          f"{tokenizer.name!r}; pass --tokenizer {tok.name}")  # fmt: skip
    eot, bos = tokenizer.eot_id, bos_written(config, tokenizer)
    if (tok.eot_id, tok.bos_id) != (eot, bos):
        raise ConfigError(f"{out}: --append: the dataset separates documents with EOT {tok.eot_id} and BOS "
                          f"{tok.bos_id} and this run would write EOT {eot} and BOS {bos} (the tokenizer's "
                          "configuration changed?); pass --separator/--bos to match")  # fmt: skip
    ours = config.recorded()
    if meta.config.get("val_by"):  # (an --append with --val-by is refused by the config)
        raise ConfigError(f"{out}: --append: the dataset holds out --val-tokens of each input (--val-by "
                          f"{meta.config['val_by']}), which an --append cannot extend; prepare it again with the new "
                          "inputs")  # fmt: skip
    for key in _APPEND_MUST_MATCH:
        if key in meta.config and meta.config[key] != ours[key]:
            flag = "--no-normalize" if key == "byte_exact" else f"--{key.replace('_', '-')}"
            then, now = meta.config[key], ours[key]
            said = (f"{'with' if then else 'without'} {flag} and this run {'without' if then else 'with'} it"
                    if isinstance(then, bool) else f"with {flag} {then!r} and this run has {now!r}")  # fmt: skip
            raise ConfigError(f"{out}: --append: the dataset was prepared {said}; pass the dataset's value so old and "
                              "new documents are treated alike")  # fmt: skip
    _same_filters(out, meta.config, ours)
    config.encoding(tokenizer.n_vocab, meta)  # the dataset's own encoding, or a one-line refusal
    kept = [(f.name, f.dtype, f.labels) for f in meta.attributes]
    if kept != [(f.name, f.dtype, f.labels) for f in config.attribute_fields()]:
        given = " ".join(f"--attribute {b}" for b in dict.fromkeys(f.by for f in meta.attributes)) or "no --attribute"
        raise ConfigError(f"{out}: --append: the dataset keeps the attributes of {given} and this run would keep "
                          f"{' '.join(config.attributes) or 'none'}; pass the same so every document has the same "
                          "columns")  # fmt: skip
    then, now = meta.config.get("attribute_sources") or {}, ours.get("attribute_sources") or {}
    if changed := [name for name in now if then.get(name) != now[name]]:  # a scorer's code: the old scores' meaning
        raise ConfigError(f"{out}: --append: the scorer {now[changed[0]][0] or changed[0]} (--attribute "
                          f"{changed[0]}) changed since the dataset was prepared, so old and new documents would be "
                          "scored differently; put it back as it was, or prepare the dataset again")  # fmt: skip
    dedup = meta.dedup
    if config.dedup == "document" and (dedup is None or not any(f.kind == "doc" for f in dedup.files)):
        raise ConfigError(f"{out}: --append: the dataset keeps no dedup keys (prepared by an older lmshard), "
                          "so new documents cannot be deduplicated against it; prepare it again")  # fmt: skip
    near = (dedup.near or {}).get("minhash") if dedup else None
    if config.near_dedup and near is None:
        raise ConfigError(f"{out}: --append --near-dedup: the dataset keeps no MinHash signatures (it was prepared "
                          "without --near-dedup); prepare it again with --near-dedup")  # fmt: skip
    if near is not None and (not config.near_dedup or near != config.minhash_config().to_json()):
        raise ConfigError(f"{out}: --append: the dataset was prepared with --near-dedup --minhash {_spec(near)}; pass "
                          "the same so new documents are checked against it")  # fmt: skip
    return meta


def _same_filters(out: Path, then: dict[str, Any], now: dict[str, Any]) -> None:
    """--append: the dataset's documents went through the same --filter and --decontaminate, in
    the same order, as this run's will (a dataset recorded before either had none), and their
    code and benchmarks are as they were."""
    def given(config: dict[str, Any]) -> str:
        flags = [f"--filter {f}" for f in config.get("filters") or ()]
        flags += [f"--decontaminate {b}" for b in config.get("decontaminate") or ()]
        if config.get("decontaminate"):
            flags += [f"--decontaminate-n {config.get('decontaminate_n')}"]
            flags += ["--decontaminate-lines"] if config.get("decontaminate_lines") else []
        return " ".join(flags) or "no --filter or --decontaminate"

    if given(then) != given(now):
        raise ConfigError(f"{out}: --append: the dataset's documents were filtered with {given(then)} and this run's "
                          f"would be with {given(now)}; pass the same so old and new documents are treated alike")
    for key, what in (("filter_sources", "--filter {name}"), ("decontaminate_sources", "a --decontaminate file")):
        old, new = then.get(key) or {}, now.get(key) or {}
        if changed := [name for name in new if name in old and old[name] != new[name]]:
            name = changed[0]
            raise ConfigError(f"{out}: --append: {new[name][0] or name} ({what.format(name=name)}) changed since "
                              "the dataset was prepared, so old and new documents would be filtered differently; "
                              "put it back as it was, or prepare the dataset again")  # fmt: skip


def _spec(minhash: dict[str, Any]) -> str:
    return f"{minhash.get('n_grams')}:{minhash.get('bands')}x{minhash.get('rows')}:{minhash.get('threshold')}"


def write_run(staging: Path, claim: Claim, checkpoint: dict[str, Any] | None) -> None:
    record = {"version": RUN_VERSION, "fingerprint": claim.fingerprint, "started": claim.started_at,
              "pid": os.getpid(), "host": platform.node(), "checkpoint": checkpoint}  # fmt: skip
    atomic_write_json(staging / RUN_FILE, record)


def run_tokenizer(config: PrepareConfig) -> Tokenizer:
    """The run's tokenizer (the accelerated backend only once it passed the exactness gate),
    checked against --separator and --bos."""
    # This process encodes the first items itself (all of a small input): with as many threads
    # as workers where the backend has a thread pool; they idle once the workers take over.
    tokenizer = load_tokenizer(config.tokenizer, config.tokenizer_backend, separator=config.separator, warn=warn,
                               threads=config.n_workers())  # fmt: skip
    if config.bos == "yes" and tokenizer.bos_id is None:
        raise ConfigError(f"--bos yes: the {tokenizer.name} vocabulary has no BOS token; pass --bos no")
    return tokenizer
