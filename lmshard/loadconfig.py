"""One loader configuration file: the data, the sample shape and the seed of a training run,
read by `lmshard.load_config(path)`, which returns the stream a training loop draws from.

    seed = 1337
    split = "train"                 # optional: "train" (default) or "val"
    # val_fraction = 0.01           # optional: a load-time split of a dataset prepared without val
    # split_seed = 0                #   (runtime/subset.py); split = "val" reads the held-out side
    # where = "fineweb_short_lines < 0.5"  # optional: only documents whose attributes pass (runtime/where.py)
    dataset = "data/web"            # one prepared dataset (a path relative to this file, or a URL)
    augment = "mine:mask_some"      # optional: a hook that transforms each batch (runtime/augment.py)

    # or a mixture, instead of `dataset`: [[source]] tables of path and weight (max_epochs optional)
    # [[source]]
    # path = "data/web"
    # weight = 0.7
    # where = "words > 100"         # optional, per source (a bucket of a dataset by its attributes)
    # or [[source]] tables of path only, and a curriculum (runtime/curriculum.py): weights by token position
    # curriculum = [[0, [0.9, 0.1]], [2e9, [0.3, 0.7]]]
    # ramp = "linear"               # or "step"

    [sample]
    shape = "random"                # random | windows | packed | padded
    batch_size = 8                  # rows per rank per step
    seq_len = 1024                  # padded: the longest row (max_len)
    # or, for random, windows and packed: a schedule of global batch sizes and seq_lens
    # (runtime/schedule.py) instead of batch_size (and seq_len, except packed):
    # schedule = [[0, 64, 1024], [2000, 256, 1024], [8000, 512, 2048]]   # [step, global batch, seq_len]
    # order = "rows"                # row order (the default for random and for a schedule) or "steps"
    # random: shift, doc_aligned, cu_seqlens, grouped; windows: stride, shuffle, shift, cu_seqlens,
    # grouped; packed: padding_free; padded: group_by_length, overlong, pad_to_max, pad_id

    [packing]                       # shape = "packed": how documents are packed into rows
    strategy = "bfd"                # bfd | greedy | ... | stream (with buffer = N: constant memory)
    overlong = "split"
    shuffle = true

    # or, instead of `dataset`/[[source]]: text tokenized as it trains (`lmshard.stream`)
    # [stream]
    # inputs = ["web/*.jsonl.zst"]  # files, directories, globs, URLs; or a hub id / preset name
    # tokenizer = "gpt2"
    # shuffle_buffer = 10000
    # num_workers = 4               # DataLoader workers that read and tokenize
    # (shape windows or packed; [packing] strategy bfd | greedy, buffer, overlong, shuffle)

Every key is an argument of the loader's own calls (`TokenDataset.random_batches`,
`window_batches`, `packed(...).batches`, `padded_batches`, `Mixture.*_batches`), so the file and
the Python API say the same thing, and the stream is the one those calls return: the same
batches, the same `state_dict()`. What belongs to the process, not to the data (rank, world size,
device), is passed to `load_config`. Unknown keys and values the calls refuse are one line naming
the file and the key.

Memory model: the stream's (see the call it makes); the file is read once.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from .errors import ArgumentError, ConfigError, FormatError, InputError
from .remote.urls import is_url
from .runtime.dataset import TokenDataset
from .runtime.mixture import Mixture

SHAPES = ("random", "windows", "packed", "padded")
_TOP = ("seed", "split", "dataset", "source", "stream", "max_epochs", "sample", "packing", "augment", "curriculum",
        "ramp", "val_fraction", "split_seed", "where")
# The keys of [sample] each shape takes, besides shape and batch_size (and seq_len).
_SAMPLE = {
    "random": ("seq_len", "shift", "doc_aligned", "cu_seqlens", "grouped", "prefetch", "schedule", "order"),
    "windows": ("seq_len", "stride", "shuffle", "shift", "cu_seqlens", "grouped", "prefetch", "schedule", "order"),
    "packed": ("seq_len", "padding_free", "schedule", "order"),
    "padded": ("seq_len", "group_by_length", "mega", "overlong", "pad_to_max", "pad_id"),
}
_PACKING = ("strategy", "overlong", "multiple", "pad_id", "mask_boundary_labels", "shuffle", "buffer")
# [stream]: lmshard.stream's options, and the loader's that belong to the data (DataLoader workers, the epoch's end).
_STREAM = ("inputs", "hf", "hf_config", "hf_split", "tokenizer", "shuffle_buffer", "epochs", "val_fraction",
           "split_seed", "text_field", "text_mode", "format", "min_chars", "max_chars", "normalize", "byte_exact",
           "bos", "on_error", "num_workers", "steps_per_epoch")
_STREAM_SAMPLE = {"windows": ("seq_len", "stride", "shift", "schedule"), "packed": ("seq_len", "schedule")}
_STREAM_PACKING = ("strategy", "buffer", "overlong", "pad_id", "mask_boundary_labels", "shuffle")
_MIXTURE_PACKING = ("strategy", "overlong", "pad_id", "mask_boundary_labels", "shuffle")


def load_config(path: str | os.PathLike[str], *, rank: int | None = None, world_size: int | None = None,
                device: Any = "cpu", resident: bool | str = False) -> Any:  # fmt: skip
    """The stream a loader configuration file describes (see the module docstring), for this
    rank of `world_size` (torchrun's RANK and WORLD_SIZE when None) on `device`; `resident`
    (True or "auto") uploads the dataset or mixture there (runtime/resident.py)."""
    return open_config(path, rank=rank, world_size=world_size, device=device, resident=resident)[1]


def open_config(path: str | os.PathLike[str], *, rank: int | None = None, world_size: int | None = None,
                device: Any = "cpu", resident: bool | str = False) -> tuple[Any, Any]:  # fmt: skip
    """(the TokenDataset or Mixture the file names, its stream): `load_config` with the data too,
    for a loop that needs its vocabulary size or its val split."""
    path = Path(path)
    raw = _read(path)
    _known(path, "", raw, _TOP)
    sample = _table(path, raw, "sample")
    shape = sample.get("shape", "random")
    if shape not in SHAPES:
        raise InputError(f"{path}: [sample] shape = {shape!r}; use one of {', '.join(SHAPES)}")
    packing = _table(path, raw, "packing")
    if packing and shape != "packed":
        raise InputError(f'{path}: [packing] applies to shape = "packed", not {shape!r}; remove it or change the '
                         "shape")  # fmt: skip
    if "stream" in raw:
        if resident is not False:
            raise ArgumentError(f"resident={resident!r}: {path} reads a [stream] of text, tokenized as it trains, "
                                "which has no split to upload; drop resident=, or prepare the data first")  # fmt: skip
        return _hooked(path, raw, _streamed(path, raw, shape, sample, packing, rank, world_size, device))
    _known(path, "sample.", sample, ("shape", "batch_size", *_SAMPLE[shape]))
    data = _data(path, raw, {"device": device, "resident": resident} if resident is not False else {})
    _known(path, "packing.", packing, _PACKING if isinstance(data, TokenDataset) else _MIXTURE_PACKING)
    scheduled = "schedule" in sample  # its phases give the batch sizes (and seq_lens, but packs keep the plan's)
    needed = ("seq_len",) if shape == "packed" else ()
    for key in needed if scheduled else ("batch_size", "seq_len"):
        if key not in sample:
            raise InputError(f"{path}: [sample] needs {key} (rows per rank per step, tokens per row)")
    for key in ("batch_size", *(() if needed else ("seq_len",))) if scheduled else ():
        if key in sample:
            raise InputError(f"{path}: [sample] has a schedule and {key}; the schedule's phases give the "
                             f"(global) batch sizes and seq_lens, so remove {key}")  # fmt: skip
    options = {k: v for k, v in sample.items() if k not in ("shape", "batch_size", "seq_len")}
    process = {"rank": rank, "world_size": world_size, "device": device}
    try:
        stream = _stream(data, shape, raw.get("seed", 0), sample.get("batch_size"), sample.get("seq_len"), options,
                         packing, process)  # fmt: skip
    except (ArgumentError, TypeError) as e:
        raise InputError(f"{path}: {e}") from None
    return _hooked(path, raw, (data, stream))


def _hooked(path: Path, raw: dict[str, Any], pair: tuple[Any, Any]) -> tuple[Any, Any]:
    """(data, stream) with the file's `augment = "module:function"` hook (runtime/augment.py)."""
    name = raw.get("augment")
    if name is None:
        return pair
    if not isinstance(name, str):
        raise InputError(f'{path}: augment = {name!r}; name the hook as augment = "module:function"')
    module, _, function = name.rpartition(":")
    if module.endswith(".py") and not Path(module).is_absolute():  # a file beside the configuration file
        name = f"{path.parent / module}:{function}"
    try:
        return pair[0], pair[1].augment(name, what=f"{path}: augment = {raw['augment']!r}")
    except ArgumentError as e:
        raise InputError(str(e)) from None


def _streamed(path: Path, raw: dict[str, Any], shape: str, sample: dict[str, Any], packing: dict[str, Any],
              rank: int | None, world_size: int | None, device: Any) -> tuple[Any, Any]:  # fmt: skip
    """A [stream] table: (the TokenStream, its windows or packed batches)."""
    from .streaming import TokenStream

    if "dataset" in raw or "source" in raw:
        raise InputError(f"{path}: name the data once: [stream] reads text as it trains, dataset/[[source]] "
                         "read prepared datasets; a mixture of streams is not offered (prepare the sources "
                         "instead)")  # fmt: skip
    if shape not in _STREAM_SAMPLE:
        raise InputError(f'{path}: [sample] shape = {shape!r}: a [stream] gives shape = "windows" or "packed"')
    _known(path, "sample.", sample, ("shape", "batch_size", *_STREAM_SAMPLE[shape]))
    _known(path, "packing.", packing, _STREAM_PACKING)
    opts = _table(path, raw, "stream")
    _known(path, "stream.", opts, _STREAM)
    loader = {k: opts.pop(k) for k in ("num_workers", "steps_per_epoch") if k in opts}
    inputs = opts.pop("inputs", None)
    if isinstance(inputs, str):
        inputs = [inputs]
    if inputs is not None and (not isinstance(inputs, list) or not all(isinstance(i, str) and i for i in inputs)):
        raise InputError(f'{path}: [stream] inputs must be a path or a list of them (inputs = ["web/*.jsonl"])')
    if inputs is None and "hf" not in opts:
        raise InputError(f'{path}: [stream] needs inputs = [...] (files, directories, a hub id or a preset) or hf')
    for key in ("batch_size", "seq_len") if "schedule" not in sample else ():
        if key not in sample:
            raise InputError(f"{path}: [sample] needs {key} (rows per rank per step, tokens per row)")
    try:
        data = TokenStream([_near(path, i) for i in inputs or []], seed=raw.get("seed", 0),
                           split=raw.get("split", "train"), **opts)  # fmt: skip
        rest = {k: v for k, v in sample.items() if k not in ("shape", "batch_size", "seq_len")}
        call = data.windows if shape == "windows" else data.packed
        return data, call(sample.get("batch_size"), sample.get("seq_len"), **rest, **packing, **loader, rank=rank,
                          world_size=world_size, device=device)  # fmt: skip
    except (ArgumentError, ConfigError, TypeError) as e:
        raise InputError(f"{path}: {e}") from None


def _near(path: Path, value: str) -> str:
    """An input named relative to the configuration file (a hub id or preset stays as it is)."""
    import glob

    if is_url(value) or Path(value).is_absolute():
        return value
    from .prepare.documents.hf import _looks_like_path

    near = path.parent / value
    if near.exists() or glob.has_magic(value) or _looks_like_path(value):
        return str(near)  # a path relative to the file (one that names nothing is named so in its error)
    return value  # NAME or OWNER/NAME naming nothing beside the file: a hub id or preset


def _stream(data: Any, shape: str, seed: Any, batch_size: Any, seq_len: Any, options: dict[str, Any],
            packing: dict[str, Any], process: dict[str, Any]) -> Any:  # fmt: skip
    if shape == "random":
        return data.random_batches(batch_size, seq_len, seed=seed, **options, **process)
    if shape == "windows":
        return data.window_batches(batch_size, seq_len, seed=seed, **options, **process)
    if shape == "packed" and isinstance(data, TokenDataset):
        return data.packed(seq_len, seed=seed, **packing).batches(batch_size, **options, **process)
    if shape == "packed":  # a mixture packs each source
        return data.packed_batches(batch_size, seq_len, seed=seed, **options, **packing, **process)
    if not isinstance(data, TokenDataset):
        raise ArgumentError('shape = "padded" reads one dataset; a mixture offers random, windows and packed')
    return data.padded_batches(batch_size, seq_len, seed=seed, **options, **process)


def _data(path: Path, raw: dict[str, Any], placed: dict[str, Any]) -> Any:
    """The TokenDataset (`dataset = PATH`) or Mixture (`[[source]]` tables) the file names."""
    split = raw.get("split", "train")
    if ("dataset" in raw) == ("source" in raw):
        raise InputError(f'{path}: name the data once: dataset = "PATH" for one dataset, or [[source]] tables of path '
                         "and weight for a mixture")  # fmt: skip
    if "max_epochs" in raw and "source" in raw:
        max_epochs = raw["max_epochs"]
    elif "max_epochs" in raw:
        raise InputError(f"{path}: max_epochs applies to a mixture ([[source]] tables); remove it")
    else:
        max_epochs = 4.0
    curriculum = {k: raw[k] for k in ("curriculum", "ramp") if k in raw}
    if curriculum and "source" not in raw:
        raise InputError(f"{path}: {next(iter(curriculum))} applies to a mixture ([[source]] tables); remove it")
    try:
        carve = {k: raw[k] for k in ("val_fraction", "split_seed", "where") if k in raw}  # a subset (runtime/subset.py)
        if carve and "dataset" not in raw:
            raise InputError(f"{path}: {next(iter(carve))} splits one dataset (dataset = PATH); remove it")
        if "dataset" in raw:
            return TokenDataset(_where(path, raw["dataset"], "dataset"), split=split, **carve, **placed)
        entries = raw["source"]
        if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
            raise InputError(f'{path}: [[source]] tables, one per dataset: path = "data/web", weight = 0.7')
        pairs = []
        for i, entry in enumerate(entries):
            _known(path, f"source[{i + 1}].", entry, ("path", "where") if "curriculum" in curriculum else
                   ("path", "weight", "where"))  # fmt: skip
            if "weight" not in entry and "curriculum" not in curriculum:
                raise InputError(f"{path}: source {i + 1} needs a weight")
            at: Any = _where(path, entry.get("path"), f"source {i + 1}'s path")
            if "where" in entry:  # (a source's documents whose attributes pass)
                at = TokenDataset(at, split=split, where=entry["where"])
            pairs.append((at, entry.get("weight")))
        if "curriculum" in curriculum:  # the knots give the weights
            return Mixture([p for p, _ in pairs], split=split, max_epochs=max_epochs, **curriculum, **placed)
        return Mixture(pairs, split=split, max_epochs=max_epochs, **curriculum, **placed)
    except (ArgumentError, FormatError) as e:  # a dataset that is not there, or not whole
        raise InputError(f"{path}: {e}") from None


def _where(path: Path, value: Any, what: str) -> str:
    """A dataset's location: a URL as it is, a path relative to the configuration file."""
    if not isinstance(value, str) or not value:
        raise InputError(f"{path}: {what} must be a path or a URL (a string)")
    return value if is_url(value) else str(path.parent / value)


def _read(path: Path) -> dict[str, Any]:
    """The file as a table: TOML, or YAML for a .yaml / .yml file (the same keys and tables)."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix.lower() in (".yaml", ".yml"):
            loaded = yaml.safe_load(text)
            if not isinstance(loaded, dict):
                raise InputError(f"{path}: a loader configuration is a mapping of keys (seed, dataset, sample…)")
            return loaded
        return tomllib.loads(text)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except yaml.YAMLError as e:
        raise InputError(f"{path}: cannot read the loader configuration ({str(e).splitlines()[0]}); write YAML "
                         'or TOML (see docs/loader.md, "One configuration file")') from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise InputError(f"{path}: cannot read the loader configuration ({e}); write TOML (see docs/loader.md, "
                         '"One configuration file")') from None


def _table(path: Path, raw: dict[str, Any], name: str) -> dict[str, Any]:
    table = raw.get(name, {})
    if not isinstance(table, dict):
        raise InputError(f"{path}: {name} must be a table ([{name}])")
    return dict(table)


def _known(path: Path, prefix: str, table: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        where = f"[{prefix.rstrip('.')}]" if prefix else "the top level"
        raise InputError(f"{path}: unknown key {unknown[0]!r} in {where}; it takes {', '.join(allowed)}")
