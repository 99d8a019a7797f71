"""Shard writing: whole documents appended to `.bin` files, with their `.idx` offsets.

Each shard is written under a temporary name, fsynced, and renamed into place only when it is
complete, with its xxh3-64 and its per-block sums (`format/blocks.py`, written beside it as
`shard_N.sums`) computed on the way out; `dataset_metadata.json` is written last
(see `format/layout.py`). A shard holds whole documents: one closes before a document that
would take it past `tokens_per_shard`, and a single document longer than that gets a shard of
its own, so every shard's document index is self-contained.

Memory model: one incoming batch; tokens and offsets go straight to the files. With attributes,
64 Ki of a shard's records when it finishes (its columns are written).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, BinaryIO

import numpy as np
import xxhash

from ...errors import LmshardError
from ...format import (
    BLOCK_TOKENS,
    INDEX_DTYPE,
    SRC_DTYPE,
    TOKEN_DTYPE,
    BlockHasher,
    ShardInfo,
    shard_paths,
    src_path,
    sums_path,
)
from ...format.attributes import attr_path
from ...format.blocks import file_xxh3, write_sums
from ...format.encoding import UINT32, Encoding
from ...format.sealing import StreamEncoder, shard_entry


def with_separators(
    tokens: np.ndarray, lengths: np.ndarray, keep: np.ndarray, eot: int, position: str, bos: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Select the documents where `keep` is True from a flat token array and add one EOT token
    to each, after or before it, and a BOS token right before its text when `bos` is given.
    Returns (tokens, lengths) of the selected documents, separators included."""
    if keep.all():
        chosen, lens = tokens, lengths
    else:
        chosen, lens = tokens[np.repeat(keep, lengths)], lengths[keep]
    specials = 1 if bos is None else 2
    out_lens = lens + specials
    starts = np.cumsum(out_lens) - out_lens  # of each document in the output
    out = np.empty(int(out_lens.sum()), TOKEN_DTYPE)
    text = np.ones(len(out), bool)  # where the documents' own tokens go
    # The specials' places in each document: [BOS] text EOT, or EOT [BOS] text.
    if position == "after":
        places = [(starts + out_lens - 1, eot)] + ([(starts, bos)] if bos is not None else [])
    else:
        places = [(starts, eot)] + ([(starts + 1, bos)] if bos is not None else [])
    for at, value in places:
        out[at] = value
        text[at] = False
    out[text] = chosen
    return out, out_lens


class ShardWriter:
    """Appends documents of one split to numbered shards under `root/split/`.

    The open shard's tokens and offsets stream to `shard_N.bin.tmp` / `shard_N.idx.tmp`; `sync`
    makes them durable and returns the writer's state, and a writer built with that state
    (`resume`) truncates the files back to it and carries on, so a resumed run writes the same
    bytes as one that was never stopped. `first` shards may already exist (`--append`). A shard
    of another encoding than uint32 is streamed as uint32 all the same (what a resume cuts back)
    and encoded block by block as it is written (format/sealing.py's StreamEncoder)."""

    def __init__(self, root: Path, split: str, tokens_per_shard: int, first: tuple[ShardInfo, ...] = (),
                 encoding: Encoding = UINT32, provenance: bool = False,
                 attributes: np.dtype | None = None, number: int = 0) -> None:  # fmt: skip
        self.root, self.split, self.capacity, self.encoding = root, split, tokens_per_shard, encoding
        self.number = number  # the first shard's number after `first` (a planned retokenize's write task: its own)
        self.provenance = provenance  # each shard's .src: its documents' sources and records (add's `src`)
        self.attributes = attributes  # each shard's .attr: its documents' attribute records (add's `attrs`)
        self._docs = [_PerDoc("src", src_path, SRC_DTYPE)] if provenance else []
        if attributes is not None:
            self._docs.append(_Columns("attr", attr_path, attributes))
        self.shards: list[ShardInfo] = list(first)
        self.first = first  # the appended-to dataset's shards (not this build's)
        self._bin: BinaryIO | None = None
        self._idx: BinaryIO | None = None
        self._hash = xxhash.xxh3_64()
        self._idx_hash = xxhash.xxh3_64()
        self._blocks = BlockHasher()
        self._encoder: StreamEncoder | None = None  # the open shard's, in an encoding other than uint32
        self._n_tokens = 0
        self._n_docs = 0

    def add(self, tokens: np.ndarray, lengths: np.ndarray, src: np.ndarray | None = None,
            attrs: np.ndarray | None = None) -> None:  # fmt: skip
        """Append documents given as one flat token array (separators included) and lengths, and
        with `provenance` their provenance records (format/provenance.py's SRC_DTYPE), with
        `attributes` their attribute records."""
        if self.provenance != (src is not None) or (self.attributes is not None) != (attrs is not None):
            raise LmshardError("ShardWriter.add: provenance and attribute records are given exactly when the writer "
                               "keeps them")  # fmt: skip
        while len(lengths):
            ends = np.cumsum(lengths)
            fit = int(np.searchsorted(ends, self.capacity - self._n_tokens, side="right"))
            if fit == 0 and self._n_tokens == 0:
                fit = 1  # a document longer than a shard gets a shard of its own
            if fit == 0:
                self._finish()
                continue
            cut = int(ends[fit - 1])
            self._write(tokens[:cut], ends[:fit], None if src is None else src[:fit],
                        None if attrs is None else attrs[:fit])  # fmt: skip
            tokens, lengths = tokens[cut:], lengths[fit:]
            src, attrs = None if src is None else src[fit:], None if attrs is None else attrs[fit:]
            if len(lengths):
                self._finish()

    def close(self) -> list[ShardInfo]:
        if self._bin is not None:
            self._finish()
        return self.shards

    def abort(self) -> None:
        """Close the open shard's files without finishing it (they stay for a resume). Never
        raises: it runs while an error (a full disk, an I/O error) is being reported, and the
        output it leaves is discarded with its build."""
        for f in (self._bin, self._idx, *(d.file for d in self._docs)):
            if f is not None:
                close_quietly(f)
        self._bin = self._idx = None
        for d in self._docs:
            d.file = None
        if self._encoder is not None:
            self._encoder.close()
            self._encoder = None

    def _next(self) -> int:
        """The number of the shard open or about to open."""
        return self.number + len(self.shards)

    def _paths(self, index: int) -> tuple[Path, Path]:
        bin_rel, idx_rel = shard_paths(self.split, index)
        return self.root / bin_rel, self.root / idx_rel

    def _new_encoder(self, bin_path: Path) -> StreamEncoder | None:
        """The open shard's encoder (None for uint32, hashed as written)."""
        if self.encoding.version > 1:
            self._encoder = StreamEncoder(bin_path, self.encoding)
        return self._encoder

    def _write(self, tokens: np.ndarray, ends: np.ndarray, src: np.ndarray | None = None,
               attrs: np.ndarray | None = None) -> None:  # fmt: skip
        if self._bin is None:
            self._open()
        for d in self._docs:
            d.write(src if d.name == "src" else attrs)
        assert self._bin is not None and self._idx is not None
        data = np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE)
        raw = data.data.cast("B")  # the array's own bytes: no copy
        self._bin.write(raw)
        if self._encoder is not None:  # (it hashes what it encodes)
            self._encoder.update(raw)
        else:
            self._hash.update(raw)
            self._blocks.update(raw)
        offsets = (ends + self._n_tokens).astype(INDEX_DTYPE).tobytes()
        self._idx.write(offsets)
        self._idx_hash.update(offsets)
        self._n_tokens += len(data)
        self._n_docs += len(ends)

    def _open(self) -> None:
        bin_path, idx_path = self._paths(self._next())
        bin_path.parent.mkdir(parents=True, exist_ok=True)
        self._bin = open(f"{bin_path}.tmp", "wb")  # noqa: SIM115 (closed in _finish/abort)
        self._idx = open(f"{idx_path}.tmp", "wb")  # noqa: SIM115
        self._hash, self._idx_hash, self._blocks = xxhash.xxh3_64(), xxhash.xxh3_64(), BlockHasher()
        for d in self._docs:
            d.open(self.root / d.rel(shard_paths(self.split, self._next())[0]))
        self._new_encoder(bin_path)
        self._n_tokens = self._n_docs = 0
        start = np.zeros(1, dtype=INDEX_DTYPE).tobytes()
        self._idx.write(start)
        self._idx_hash.update(start)

    def _finish(self) -> None:
        assert self._bin is not None and self._idx is not None
        bin_path, idx_path = self._paths(self._next())
        for f in (self._bin, self._idx, *(d.file for d in self._docs)):
            if f is not None:
                f.flush()
                os.fsync(f.fileno())
                f.close()
        self._bin = self._idx = None
        bin_rel, idx_rel = shard_paths(self.split, self._next())
        files: dict[str, Any] = {}
        for d in self._docs:  # in place before the token file, which a resume and an upload key on
            d.file, rel = None, d.rel(bin_rel)
            files |= {f"{d.name}_path": rel, **d.seal(self.root / rel, self._n_docs)}
        if self._encoder is not None:
            os.replace(f"{idx_path}.tmp", idx_path)
            sealed, self._encoder = self._encoder.seal(bin_rel, Path(f"{bin_path}.tmp")), None
            entry = shard_entry(self.split, bin_rel, idx_rel, self._n_tokens, self._n_docs, self._idx_hash.hexdigest(),
                                self.encoding, sealed)  # fmt: skip
            self.shards.append(replace(entry, **files))
            self._n_tokens = self._n_docs = 0
            return
        sums = self._blocks.finish()
        write_sums(self.root / sums_path(bin_rel), sums)
        os.replace(f"{idx_path}.tmp", idx_path)
        os.replace(f"{bin_path}.tmp", bin_path)
        self.shards.append(
            ShardInfo(
                **files,
                split=self.split,
                path=bin_rel,
                index_path=idx_rel,
                n_tokens=self._n_tokens,
                n_docs=self._n_docs,
                xxh3_64=self._hash.hexdigest(),
                index_xxh3_64=self._idx_hash.hexdigest(),
                sums_path=sums_path(bin_rel),
                block_tokens=BLOCK_TOKENS,
                sums_xxh3_64=xxhash.xxh3_64_hexdigest(sums),
            )
        )
        self._n_tokens = self._n_docs = 0


_PIECE = 1 << 16  # attribute records read at a time when a shard's columns are written


def write_attributes(final: Path, rows: np.ndarray) -> dict[str, Any]:
    """A shard's attribute file of `rows` (its documents' records, in order) at `final`, written
    as the writer writes one: its entry's attr_ fields."""
    with open(f"{final}.tmp", "wb") as f:
        f.write(np.ascontiguousarray(rows).tobytes())
    return _Columns("attr", attr_path, rows.dtype).seal(final, len(rows))


class _PerDoc:
    """A shard's file of fixed-width records, one per document (`.src`, `.attr`), and its xxh3-64."""

    def __init__(self, name: str, rel: Any, dtype: np.dtype) -> None:
        self.name, self.rel, self.dtype = name, rel, dtype
        self.file: BinaryIO | None = None
        self.hash = xxhash.xxh3_64()

    def open(self, path: Path) -> None:
        self.file, self.hash = open(f"{path}.tmp", "wb"), xxhash.xxh3_64()  # noqa: SIM115 (closed by the writer)

    def write(self, rows: np.ndarray | None) -> None:
        assert self.file is not None and rows is not None
        data = np.ascontiguousarray(rows, dtype=self.dtype).tobytes()
        self.file.write(data)
        self.hash.update(data)

    def seal(self, final: Path, n_docs: int) -> dict[str, Any]:
        """Put the finished file (closed and durable) in place; its entry's checksum fields."""
        os.replace(f"{final}.tmp", final)
        return {f"{self.name}_xxh3_64": self.hash.hexdigest()}


class _Columns(_PerDoc):
    """A shard's attribute file (format/attributes.py): records stream to `.attr.tmp` as documents
    come, as `.src`'s do (what a resume cuts back); the finished shard's records are read once,
    64 Ki at a time, each piece of each column written at its place and hashed, then the file
    hashed whole."""

    def write(self, rows: np.ndarray | None) -> None:
        assert self.file is not None and rows is not None  # (not hashed: the seal hashes the columns)
        self.file.write(np.ascontiguousarray(rows, dtype=self.dtype).tobytes())

    def seal(self, final: Path, n_docs: int) -> dict[str, Any]:
        rows, out = Path(f"{final}.tmp"), Path(f"{final}.{os.getpid()}.tmp")
        names = self.dtype.names or ()
        widths = [self.dtype.fields[name][0].itemsize for name in names]  # type: ignore[index]
        starts = [n_docs * sum(widths[:c]) for c in range(len(names))]
        columns = [xxhash.xxh3_64() for _ in names]
        with open(rows, "rb") as src, open(out, "wb") as dst:
            for first in range(0, n_docs, _PIECE):
                data = np.fromfile(src, dtype=self.dtype, count=min(_PIECE, n_docs - first))
                for c, name in enumerate(names):
                    values = np.ascontiguousarray(data[name]).tobytes()
                    dst.seek(starts[c] + first * widths[c])
                    dst.write(values)
                    columns[c].update(values)
            dst.flush()
            os.fsync(dst.fileno())
        whole = file_xxh3(out)
        os.replace(out, final)
        rows.unlink()
        return {"attr_xxh3_64": whole, "attr_column_xxh3_64": tuple(c.hexdigest() for c in columns),
                "attr_width": self.dtype.itemsize}  # fmt: skip

def close_quietly(f: IO[bytes]) -> None:
    """Close `f` on an error path: a failing flush of its buffer (ENOSPC, EDQUOT, EIO) is
    dropped, and the descriptor is closed all the same (Python closes it after a failed flush)."""
    with contextlib.suppress(OSError):
        f.close()
