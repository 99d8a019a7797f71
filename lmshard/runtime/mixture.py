"""Weighted mixtures of datasets: the same batch streams as one `TokenDataset`, drawn from
several at token proportions.

    mix = Mixture({"data/web": 0.7, "data/code": 0.3}, split="train")
    batches = mix.random_batches(batch_size=16, seq_len=1024, seed=1337)

**Which source a row comes from.** Every row carries seq_len tokens, so token shares are row
shares. Global row g (= step × global batch + row) goes to a source by the closed form of
`mixing.RowTree`: with two sources every window of k rows is within one row of its target
(within one row per tree level for more), and a stream resumes from its step alone.

**Where in the source.** Row g is also the m-th row of its source (m = its count of earlier
rows, the same closed form). Random batches draw row m's offset from (seed, source, m); windows
take window m mod n of a per-source permutation reshuffled each time the source's n windows are
used up, so every source has its own epochs, reported by `report()`.

Memory model: the sources' stores (see store.py) and one global batch of offsets; no state
grows with the step.
"""

from __future__ import annotations

import functools
import numbers
import os
import tomllib
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import ArgumentError, InputError, LmshardError
from ..remote.urls import is_url
from . import checks
from .batches import BatchStream, resolve_rank
from .curriculum import Curriculum, CurriculumTree
from .dataset import TokenDataset
from .mixing import MixedStore, RowTree, integer_weights, same_tokenization
from .mixoffsets import MixtureOffsets
from .resident import place
from .sampling import ShiftSpec, count_windows
from .schedule import Schedule, parse_order
from .schedule import resolve as resolve_schedule
from .windows import stride_or_default

if TYPE_CHECKING:
    from .mixpacked import MixturePackedStream

class Mixture:
    """Several datasets drawn at token weights (normalised to sum to 1). `sources` maps a
    dataset path (or an open `TokenDataset`) to its weight; every source must share one
    tokenizer identity. `max_epochs`: `report()` warns when a run would repeat a source more.

    `curriculum=[(tokens, weights), ...]` (runtime/curriculum.py): weights that change with the
    run's token position, ramping linearly between knots (`ramp="step"`: held until the next);
    `sources` is then a list of paths or datasets, and a knot's weights a list in their order
    or a dict by path. Random and window batches draw it, at one seq_len.

    `device`, `resident`, `resident_budget`: as `TokenDataset`'s; a resident mixture holds one
    copy of all its sources on the device (open the sources themselves without resident=)."""

    def __init__(self, sources: Mapping[Any, float] | Iterable[Any], split: str = "train",
                 max_epochs: float = 4.0, curriculum: Any = None, ramp: str = "linear", *,
                 device: str | torch.device | None = None, resident: bool | str = False,
                 resident_budget: float = 0.5) -> None:  # fmt: skip
        if curriculum is not None:
            if isinstance(sources, Mapping | str | os.PathLike):
                raise ArgumentError("with a curriculum, pass the sources as a list of paths or datasets: the "
                                    "curriculum's knots give their weights")  # fmt: skip
            sources = [(s, 1.0) for s in sources]
        pairs = _pairs(sources)
        if not pairs:
            raise ArgumentError("a mixture needs at least one source; pass {path: weight, ...}")
        self.datasets = [s if isinstance(s, TokenDataset) else TokenDataset(s, split) for s, _ in pairs]
        self._given = [None if isinstance(s, TokenDataset) else s for s, _ in pairs]  # (a path as given: val_streams)
        names = [_name(s) for s, _ in pairs]
        self.names = [f"{n}#{i + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]  # for reports
        raw = [_weight(name, w) for name, (_, w) in zip(self.names, pairs, strict=True)]
        top = max(raw)  # scaled first: a sum of weights near the float maximum would overflow
        total = sum(w / top for w in raw)
        self.weights = [w / top / total for w in raw]
        self.int_weights = integer_weights(self.weights)
        self.max_epochs = _positive("max_epochs", max_epochs, "pass e.g. max_epochs=4")
        same_tokenization(self.names, self.datasets)
        self._fingerprint = [[d.data_id, w] for d, w in zip(self.datasets, self.weights, strict=True)]
        self.curriculum: Curriculum | None = None
        if curriculum is not None:
            self.curriculum = Curriculum(curriculum, len(self.datasets), ramp, self.names)
            self.weights = self.curriculum.knots[0][1]  # (as shown and reported: the weights at token 0)
            self.int_weights = integer_weights(self.weights)
        self._fingerprint = [[d.data_id, w] for d, w in zip(self.datasets, self.weights, strict=True)]
        self.store = MixedStore(self.datasets)
        self.resident = place(self.store, device, resident, resident_budget, "this mixture")  # every source's
        self.device = device if self.resident is None else self.resident.device  # its streams' default device
        first = self.datasets[0]
        self.eot_id, self.bos_id, self.vocab_size = first.eot_id, first.bos_id, first.vocab_size

    def fingerprint(self) -> list[list[Any]]:
        """What a resume state records of the mixture: each source by content (its metadata's
        sha256, split and size; not the path, which may be spelled another way) and weight."""
        return self._fingerprint

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **placed: Any) -> Mixture:
        """A mixture from a TOML file: optional `split` and `max_epochs`, and one `[[source]]`
        table per source with `path` (relative to the file, or a URL) and `weight`; or, with
        `curriculum` (and `ramp`), tables of `path` only. `placed`: device, resident and
        resident_budget, as the constructor takes them."""
        unknown = sorted(set(placed) - {"device", "resident", "resident_budget"})
        if unknown:
            raise ArgumentError(f"from_file takes no {unknown[0]}=; it takes device=, resident= and resident_budget=")
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise InputError(
                f"{path}: cannot read the mixture ({e}); write TOML with [[source]] path/weight tables"
            ) from None
        entries = raw.get("source")
        if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
            raise InputError(f'{path}: no [[source]] tables; add one per dataset: path = "data/web", weight = 0.7')
        knots = "curriculum" in raw  # then the sources have no weight: the knots give them
        unknown = sorted(set(raw) - {"split", "max_epochs", "source", "curriculum", "ramp"})
        unknown += sorted(f"source.{k}" for e in entries for k in set(e) - ({"path", "where"} if knots else
                                                                            {"path", "weight", "where"}))  # fmt: skip
        if unknown:
            raise InputError(f"{path}: unknown key {unknown[0]!r}; a mixture file has split, max_epochs and [[source]] "
                             "tables of path, weight and where (or of path, with curriculum and ramp)")  # fmt: skip
        pairs = []
        for i, entry in enumerate(entries):
            if not isinstance(entry.get("path"), str) or ("weight" not in entry and not knots):
                raise InputError(f"{path}: source {i + 1} needs a path (a string) and a weight")
            at: Any = entry["path"] if is_url(entry["path"]) else path.parent / entry["path"]
            if "where" in entry:  # (a source's documents whose attributes pass: runtime/where.py)
                try:
                    at = TokenDataset(at, raw.get("split", "train"), where=entry["where"])
                except ArgumentError as e:
                    raise InputError(f"{path}: source {i + 1}: {e}") from None
            pairs.append((at, entry.get("weight")))
        options = {"split": raw.get("split", "train"), "max_epochs": raw.get("max_epochs", 4.0), **placed}
        if knots:
            try:
                return cls([p for p, _ in pairs], curriculum=raw["curriculum"], ramp=raw.get("ramp", "linear"),
                           **options)  # fmt: skip
            except ArgumentError as e:
                raise InputError(f"{path}: {e}") from None
        return cls(pairs, **options)

    @classmethod
    def by_attribute(cls, path: str | os.PathLike[str], attribute: str, *, edges: Any = None, weights: Any = None,
                     weight: Any = None, bins: int = 16, split: str = "train", max_epochs: float = 4.0,
                     **options: Any) -> Mixture:  # fmt: skip
        """One dataset's documents mixed by one attribute (runtime/attrmix.py): buckets cut at
        `edges` drawn at `weights` (one more than edges), or soft sampling: documents drawn in
        proportion to `weight(value)` × their tokens, resolved over `bins` buckets. `where=`:
        within the documents that pass it. Other `options` go to each bucket's TokenDataset
        (storage_options=, cache_dir=...)."""
        from .attrmix import bucket_sources, check_options, soft_sources

        check_options(options)
        if (weight is None) == (edges is None) or (edges is None) != (weights is None):
            raise ArgumentError("by_attribute takes edges= with weights= (buckets), or weight= (soft sampling)")
        pairs = (bucket_sources(path, attribute, edges, weights, split, options) if weight is None else
                 soft_sources(path, attribute, weight, bins, split, options))  # fmt: skip
        return cls(pairs, split=split, max_epochs=max_epochs)

    def val_streams(self, tokens: int, seq_len: int, *, batch_size: int = 8, by: str | None = None,
                    device: str | torch.device | None = None) -> dict[str, Any]:  # fmt: skip
        """One fixed evaluation stream per source, from its val split (as the source is chosen: a
        where= source's documents that pass); with `by` ("input" or a category attribute) one per
        domain of each, named "source/domain" (runtime/valstreams.py). A source given as an open
        TokenDataset of another split is read again from its path with the default options (pass
        its val split, opened as it needs, to evaluate it otherwise); a source without val
        documents is left out, with a warning."""
        out: dict[str, Any] = {}
        for name, data, given in zip(self.names, self.datasets, self._given, strict=True):
            try:
                val = TokenDataset(given, "val") if given is not None else _val_of(data)
                found = val.val_streams(tokens, seq_len, batch_size=batch_size, by=by,
                                        device=self.device if device is None else device)  # fmt: skip
            except LmshardError as e:
                warnings.warn(f"mixture source {name}: no val stream ({e})", stacklevel=2)
                continue
            out |= {name if by is None else f"{name}/{domain}": stream for domain, stream in found.items()}
        if not out:
            raise ArgumentError("no source of the mixture has a val stream (see the warnings); prepare with "
                                "--val-fraction, or open the val splits yourself")  # fmt: skip
        return out

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}: {w:.4g}" for n, w in zip(self.names, self.weights, strict=True))
        return f"Mixture({{{shown}}})"

    def random_batches(self, batch_size: int | None = None, seq_len: int | None = None, *, seed: int = 0,
                       shift: int | str = 1, **options: Any) -> BatchStream:  # fmt: skip
        """As `TokenDataset.random_batches` (rank, world_size, device, cu_seqlens, grouped,
        prefetch, schedule), each row from the source the mixture assigns it to. A mixture
        draws in row order: row g of the run comes from (seed, g) at any batch size."""
        return self._stream(batch_size, seq_len, seed, shift, False, None, options)

    _OPTIONS = ("rank", "world_size", "device", "cu_seqlens", "grouped", "prefetch", "schedule", "order")

    def window_batches(self, batch_size: int | None = None, seq_len: int | None = None, *, stride: int | None = None,
                       seed: int = 0, shift: int | str = 1, **options: Any) -> BatchStream:  # fmt: skip
        """Sliding windows of each source, each visited once per epoch of that source, in an
        order reshuffled per source epoch; options as `random_batches`. Under a schedule each
        seq_len draws its own windows (stride: the given one, else the length), whose source
        epochs go on where that length's last phase stopped."""
        return self._stream(batch_size, seq_len, seed, shift, True, stride, options)

    def _stream(self, batch_size: int | None, seq_len: int | None, seed: int, shift: int | str, windows: bool,
                stride: int | None, options: dict[str, Any]) -> BatchStream:  # fmt: skip
        unknown = sorted(set(options) - set(self._OPTIONS))
        if unknown:
            raise ArgumentError(f"a mixture's batches take no {', '.join(unknown)}; the options are seed, shift, "
                                f"{', '.join(self._OPTIONS)} (and stride for windows)")  # fmt: skip
        schedule, order = options.pop("schedule", None), options.pop("order", None)
        parse_order(order, "rows")  # either order draws the same rows for a mixture
        plan = resolve_schedule(schedule, batch_size, seq_len, resolve_rank(options.get("rank"),
                                                                             options.get("world_size"))[1])  # fmt: skip
        if self.curriculum is not None and len(plan.seq_lens) > 1:
            raise ArgumentError("a curriculum's token positions are rows of one seq_len; schedule the batch size "
                                "only, at one seq_len")  # fmt: skip
        make = functools.partial(_mixture_offsets, self, shift, checks.seed(seed), windows, stride,
                                 plan.phases[0].seq_len)  # fmt: skip
        offsets = make(plan.phases[0].seq_len, "rows")
        several = stride is None and len(plan.seq_lens) > 1  # each length at its own stride
        kind = "mixture/random" if not windows else "mixture/windows/" + ("auto" if several else str(offsets.stride))
        options["device"] = self.device if options.get("device") is None else options["device"]
        return BatchStream(self.store, offsets, schedule=plan, make=make, seed=seed, kind=kind,
                           resident=self.resident, **options)  # fmt: skip

    def packed_batches(self, batch_size: int | None = None, seq_len: int | None = None, *, seed: int = 0,
                       rank: int | None = None, world_size: int | None = None, device: str | torch.device | None = None,
                       padding_free: bool = False, schedule: Any = None, order: str | None = None,
                       **pack_options: Any) -> MixturePackedStream:  # fmt: skip
        """Batches of whole-document packs (`TokenDataset.packed` options: strategy, overlong,
        pad_id, mask_boundary_labels, shuffle), each row a pack of the source the mixture assigns
        it to; weights count rows of seq_len tokens (padding included). Each source's packs are
        reshuffled each time they are used up; `batch["sources"]` names each row's source.
        `schedule`: global batch sizes by step, at one seq_len (the packs')."""
        unknown = sorted(set(pack_options) - {"strategy", "overlong", "pad_id", "mask_boundary_labels", "shuffle"})
        if unknown:
            raise ArgumentError(f"packed_batches takes no {', '.join(unknown)}; its pack options are strategy, "
                                "overlong, pad_id, mask_boundary_labels and shuffle")  # fmt: skip
        parse_order(order, "rows")  # either order draws the same rows for a mixture
        if seq_len is None and schedule is not None:
            lengths = Schedule(schedule).seq_lens
            seq_len = lengths[0] if len(lengths) == 1 else None
        if seq_len is None:
            raise ArgumentError("packed_batches needs seq_len (the packs' length), or a schedule of one seq_len")
        packs = [d.packed(seq_len, seed=seed, **pack_options) for d in self.datasets]
        from .mixpacked import MixturePackedStream

        return MixturePackedStream(self, packs, batch_size, rank=rank, world_size=world_size, device=device,
                                   padding_free=padding_free, schedule=schedule)  # fmt: skip

    def locate(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source index, offset in that source's split) of each of a batch's `offsets`."""
        offsets = np.asarray(offsets)
        if offsets.size and (
            offsets.dtype.kind not in "iu" or offsets.min() < 0 or offsets.max() >= self.store.n_tokens
        ):
            raise ArgumentError(f"offsets={checks.show(offsets)} are not addresses in [0, {self.store.n_tokens}); "
                                "pass a mixture batch's `offsets`")  # fmt: skip
        return self.store.locate(offsets)

    def report(self, steps: int, global_batch_size: int, seq_len: int, stride: int | None = None,
               seed: int = 0, shift: int = 1, per_epoch: list[int] | None = None) -> list[dict[str, Any]]:  # fmt: skip
        """Per source, after `steps` steps of `global_batch_size` rows: target and planned token
        share, rows, tokens, and epochs consumed (tokens / split tokens for random batches,
        windows / windows per epoch with a stride, windows counted with the largest `shift`; packs /
        packs per epoch with `per_epoch`, the sources' pack counts). Warns
        for each source the run would repeat more than `max_epochs` times."""
        steps, gbs = checks.nonnegative("steps", steps), checks.positive("global_batch_size", global_batch_size)
        seq_len = checks.positive("seq_len", seq_len)
        tree = RowTree(self.int_weights, checks.seed(seed)) if self.curriculum is None else \
            CurriculumTree(self.curriculum, seq_len, checks.seed(seed))  # fmt: skip
        rows = tree.counts(steps * gbs)
        out = []
        if per_epoch is not None and (not isinstance(per_epoch, list | tuple) or len(per_epoch) != len(rows)
                                      or not all(checks.is_int(n) and n >= 1 for n in per_epoch)):  # fmt: skip
            raise ArgumentError(f"per_epoch={checks.show(per_epoch)} must list one count of at least 1 per source")
        if stride is not None:
            for name, data in zip(self.names, self.datasets, strict=True):
                checks.fits(f"source {name}", data.n_tokens, seq_len, shift)
        for i, (name, w, data, r) in enumerate(zip(self.names, self.weights, self.datasets, rows, strict=True)):
            if per_epoch is not None:  # packs
                epochs = r / per_epoch[i]
            elif stride is None:
                epochs = r * seq_len / max(data.n_tokens, 1)
            else:
                epochs = r / count_windows(data.n_tokens, seq_len, stride, shift)
            out.append({"source": name, "target": w, "share": r / max(steps * gbs, 1), "rows": r,
                        "tokens": r * seq_len, "epochs": epochs})  # fmt: skip
            if epochs > self.max_epochs:
                warnings.warn(f"mixture source {name}: {steps:,} steps use it {epochs:.2f} times (max_epochs="
                              f"{self.max_epochs:g}); lower its weight or add data", stacklevel=2)  # fmt: skip
        return out

    def stream_report(self, stream: BatchStream | MixturePackedStream) -> list[dict[str, Any]]:
        """`report` for the steps `stream` has handed out, with its batch size, seq_len and stride."""
        offsets = getattr(stream, "offsets", None)
        mine = getattr(offsets, "mix", None) is self or getattr(stream, "mix", None) is self
        if not mine:
            raise ArgumentError(f"stream={checks.show(stream)} is not a stream of this mixture")
        from .mixpacked import MixturePackedStream

        if isinstance(stream, MixturePackedStream):
            return self.report(stream.step, stream.global_batch_size, stream.seq_len, seed=stream.seed,
                               per_epoch=[len(p) for p in stream.sources])  # fmt: skip
        assert isinstance(offsets, MixtureOffsets)
        return self.report(stream.step, stream.global_batch_size, stream.seq_len, offsets.stride, offsets.seed,
                           offsets.shift.max)  # fmt: skip


def _mixture_offsets(mix: Mixture, shift: int | str, seed: int, windows: bool, stride: int | None, first: int, T: int,
                     order: str) -> MixtureOffsets:  # fmt: skip
    """A mixture stream's offsets for rows of T tokens: random rows, or windows (stride: the given one, else T)."""
    if mix.curriculum is not None and first != T:
        raise ArgumentError(f"a curriculum's token positions are rows of one seq_len ({first}); this stream cannot "
                            f"go on with rows of {T}")  # fmt: skip
    spec = ShiftSpec.parse(shift, T)
    step = stride_or_default(stride, T) if windows else None
    for name, data in zip(mix.names, mix.datasets, strict=True):
        checks.fits(f"source {name}", data.n_tokens, T, spec.max)
    return MixtureOffsets(mix, T, spec, seed, step)


def _val_of(data: Any) -> Any:
    """The val split of the dataset `data` (a TokenDataset) reads, opened as it is (a load-time
    split's val side, a where= selection of it)."""
    if data.split == "val":
        return data
    tag, options = getattr(data, "_carved", ""), {}
    if "?" in tag:
        tag, options["where"] = tag.split("?", 1)
    if tag.startswith("@"):
        fraction, _, seed = tag[1:].partition("/")
        options |= {"val_fraction": float(fraction), "split_seed": int(seed or 0)}
    return TokenDataset(data.path, "val", **options)


def _name(source: Any) -> str:
    if isinstance(source, TokenDataset):
        return str(source.path) + getattr(source, "_carved", "")  # (a load-time subset: how it was chosen)
    if not isinstance(source, str | os.PathLike):
        raise ArgumentError(f"source {checks.show(source)} is neither a dataset path nor a TokenDataset")
    return str(source)


def _pairs(sources: object) -> list[tuple[Any, Any]]:
    """{source: weight} or [(source, weight), ...] as pairs; anything else is refused."""
    fix = 'pass {"data/web": 0.7, "data/code": 0.3} or [(path, weight), ...]'
    if isinstance(sources, Mapping):
        return list(sources.items())
    if isinstance(sources, str | os.PathLike) or not isinstance(sources, Iterable):
        raise ArgumentError(f"sources={checks.show(sources)} is not a mapping of sources to weights; {fix}")
    pairs = list(sources)
    if not all(isinstance(p, tuple | list) and len(p) == 2 for p in pairs):
        raise ArgumentError(f"sources={checks.show(pairs)} holds an entry that is not a (source, weight) pair; {fix}")
    return [(a, b) for a, b in pairs]


def _positive(what: str, value: object, fix: str) -> float:
    """A finite number above 0 (numpy numbers too), as a float."""
    try:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)
        number = float(value) if ok else float("nan")  # type: ignore[arg-type]
    except OverflowError:
        number = float("inf")
    if not (np.isfinite(number) and number > 0):
        raise ArgumentError(f"{what}={checks.show(value)} must be a finite number above 0; {fix}")
    return number


def _weight(name: str, weight: object) -> float:
    return _positive(f"source {name}: weight", weight, "drop the source instead of giving it weight 0")
