"""Token storage for the runtime: one split of a dataset as a single concatenated token stream.

Two ways to read, chosen when the split is opened:

- *mapped* (the split's `.bin` files together hold at most `rss_limit` bytes, default 1 GiB, or
  `rss_limit=None`): shards are memory-mapped and a batch's rows are gathered from the maps by
  one fancy index over a row view that spans the maps of all shards (`_Span`), however many
  shards the rows are in; only a row that crosses a shard boundary is copied on its own. Touched
  pages of a file mapping count in the process's RSS (they are page cache: shared and
  reclaimable), so RSS can grow to the split's size, and no further.
- *read* (larger splits): each row is read with `preadv` straight into the destination (the
  stream's reused scratch buffer, or a pinned host buffer). Nothing is mapped, so RSS stays flat however much is read;
  the data still comes from the kernel's page cache. This is the fix for the RSS growth of a
  persistent np.memmap (nanoGPT#287, which re-creates its memmap every batch instead), without
  the page fault per row that re-mapping costs (~7 us per row on the benchmark machine, against
  ~1.7 us for a `preadv`). Releasing maps with MADV_DONTNEED was tried first: the re-faults
  made batches 6× slower (docs/performance.md).

Shard encodings (format/encoding.py): uint16 shards are mapped or read the same way, and their
rows widened to uint32 as they are gathered. Packed and zstd shards are decoded
(format/tokenfile.py): their stored bytes are mapped when they fit in `rss_limit` (else read),
and a batch's rows of one shard are decoded together, each zstd block they touch once.

Shard files are opened lazily, at most `max_open` at a time (least recently used are closed).
Before any is opened, `from_dataset` holds every shard of the split to its metadata
(`format.check_shard_files`: inside the dataset, the recorded sizes), and a shard's document
index is checked (`format.check_index`) when it is first loaded, so a tampered dataset is a
`FormatError` naming the file, never a huge map or an out-of-range read.

Memory model: per shard one cumulative offset (8 bytes); per *open* shard a file descriptor or a
map, and a memory-mapped view of its `.idx` (opened on first use, pages loaded on demand); in
mapped mode, per row length a view over the maps and three int64 per shard; no token data is
kept between reads (a packed or zstd shard: the last 64 decoded blocks of an open shard, for
reads in order, and a batch's decoded blocks while it is built). The in-memory store (small text
files, synthetic data) holds its tokens.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..errors import FormatError
from ..format import (
    INDEX_DTYPE,
    TOKEN_DTYPE,
    UINT32,
    DatasetMeta,
    Encoding,
    ShardInfo,
    check_index,
    check_shard_files,
    load_metadata,
)
from ..format.tokenfile import TokenFile
from .reads import SplitReads
from .span import _Span, widened

DEFAULT_RSS_LIMIT = 1 << 30


class _Open:
    """An open shard: a descriptor (read mode), a map (mapped mode) or a decoder (packed, zstd),
    and its index on demand."""

    def __init__(self, root: Path, shard: ShardInfo, mapped: bool, identity: tuple[FileId, FileId] | None = None,
                 encoding: Encoding = UINT32) -> None:  # fmt: skip
        path = root / shard.path
        self.index_path, self.n_tokens = root / shard.index_path, shard.n_tokens
        self.identity = identity
        self.file: TokenFile | None = None  # the decoder of a packed or zstd shard
        self.fd = os.open(path, os.O_RDONLY)
        if identity is not None and _file_id(os.fstat(self.fd)) != identity[0]:
            os.close(self.fd)
            raise _replaced(path)
        self.map: mmap.mmap | None = None
        self.tokens: np.ndarray | None = None  # a view of `map` in the file's dtype
        self._index: np.ndarray | None = None
        try:
            if encoding.mappable is None:
                self.file = TokenFile(root, shard, encoding, mapped=mapped, fd=self.fd)  # its stored bytes mapped
            elif mapped:
                self.map = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)
                self.tokens = np.frombuffer(self.map, dtype=encoding.mappable)
        except BaseException:
            os.close(self.fd)
            raise

    @property
    def index(self) -> np.ndarray:
        """Document start offsets within the shard, plus its end; checked when first loaded."""
        if self._index is None:
            index = np.memmap(self.index_path, dtype=INDEX_DTYPE, mode="r")
            if self.identity is not None and _file_id(os.stat(self.index_path)) != self.identity[1]:
                raise _replaced(self.index_path)
            check_index(self.index_path, index, self.n_tokens)
            self._index = index
        return self._index

    def close(self) -> None:
        self.tokens = self._index = None
        if self.file is not None:
            self.file.close()
        if self.map is not None:
            with contextlib.suppress(BufferError):  # a caller still holds a view: let GC unmap it
                self.map.close()
        os.close(self.fd)


FileId = tuple[int, int]  # (st_dev, st_ino): which file a path named when the dataset was opened


def _file_id(info: os.stat_result) -> FileId:
    return info.st_dev, info.st_ino


def _replaced(path: Path) -> FormatError:
    return FormatError(f"{path}: replaced since this dataset was opened (an `lmshard prepare --overwrite` swapped "
                       "in a new dataset?); open the dataset again to read the new one")  # fmt: skip


class TokenStore(SplitReads):
    """The tokens of one split, addressed by global offset across its shards in order."""

    def __init__(
        self,
        shards: list[ShardInfo],
        root: Path,
        max_open: int = 64,
        arrays: list[tuple[np.ndarray, np.ndarray]] | None = None,
        rss_limit: int | None = DEFAULT_RSS_LIMIT,
        encoding: Encoding = UINT32,
    ) -> None:
        self.root = root
        self.encoding = encoding
        self.dtype = encoding.mappable  # None: packed (but 8/16/32 bits) or zstd, decoded (format/tokenfile.py)
        self.shards = shards
        self.sizes = np.array([s.n_tokens for s in shards], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.doc_counts = np.array([s.n_docs for s in shards], dtype=np.int64)
        self.n_tokens = int(self.starts[-1])
        self.n_docs = int(self.doc_counts.sum())
        self.max_open = max(1, max_open)
        self._arrays = arrays  # in-memory shards: (tokens, index) pairs
        self._open: OrderedDict[int, _Open] = OrderedDict()
        self.rss_limit = rss_limit
        total = sum(s.bin_bytes for s in shards)
        fits = rss_limit is None or total <= rss_limit
        self.mapped = arrays is not None or (self.dtype is not None and fits)
        self._map_stored = fits  # packed, zstd: their stored bytes mapped (decoded tokens never are)
        self._spans: dict[int, _Span] = {}  # row length -> row view over all maps (mapped mode)
        self._ids: list[tuple[FileId, FileId]] | None = None  # set by from_dataset
        self.source_names: list[str] | None = None  # the dataset's inputs (from_dataset): trace names them

    @classmethod
    def from_dataset(
        cls, meta: DatasetMeta, split: str, max_open: int = 64, rss_limit: int | None = DEFAULT_RSS_LIMIT
    ) -> TokenStore:
        for shard in meta.split_shards(split):  # empty ones too: their files must match as well
            check_shard_files(meta.root, shard)
        shards = [s for s in meta.split_shards(split) if s.n_tokens]
        store = cls(shards, meta.root, max_open, rss_limit=rss_limit, encoding=meta.encoding)
        # Shards open lazily (at most max_open at a time): remember which files the paths name
        # now, so a shard opened after an --overwrite swap is refused, not read as the old one.
        store._ids = [(_file_id(os.stat(meta.root / s.path)), _file_id(os.stat(meta.root / s.index_path)))
                      for s in shards]  # fmt: skip
        store.source_names = [s.path for s in meta.sources]  # (what trace names a document's input by)
        return store

    @classmethod
    def from_arrays(cls, tokens: np.ndarray, index: np.ndarray) -> TokenStore:
        tokens = np.ascontiguousarray(tokens, dtype=TOKEN_DTYPE)
        index = np.asarray(index, dtype=INDEX_DTYPE)
        info = ShardInfo(split="memory", path="<memory>", index_path="<memory>", n_tokens=len(tokens),
                         n_docs=len(index) - 1, xxh3_64="", index_xxh3_64="")  # fmt: skip
        return cls([info], Path("."), arrays=[(tokens, index)])

    def close(self) -> None:
        self._spans = {}  # first: the views must not outlive the maps they point into
        while self._open:
            self._open.popitem()[1].close()

    def __del__(self) -> None:
        # No module globals here (`contextlib` may be gone at interpreter shutdown), and
        # `close` fails on a store whose __init__ raised before setting its attributes.
        try:  # noqa: SIM105 (contextlib.suppress is a module global)
            self.close()
        except Exception:
            pass

    def __getstate__(self) -> dict[str, object]:
        """Pickled without its open files and maps (DataLoader workers started by spawn or
        forkserver): the copy opens its own on first read."""
        state = self.__dict__.copy()
        state["_open"], state["_spans"] = OrderedDict(), {}
        state.pop("_trace_src", None)  # (trace's maps of the provenance files)
        return state

    @property
    def open_files(self) -> int:
        return len(self._open)

    def _get(self, k: int) -> _Open:
        entry = self._open.get(k)
        if entry is not None:
            self._open.move_to_end(k)
            return entry
        shard = self.shards[k]
        ids = self._ids[k] if self._ids is not None else None
        entry = _Open(self.root, shard, self.mapped or self._map_stored, ids, self.encoding)
        self._open[k] = entry
        if len(self._open) > self.max_open:
            self._open.popitem(last=False)[1].close()
        return entry

    def _tokens(self, k: int) -> np.ndarray:
        """Shard k's tokens as an array (mapped mode and in-memory stores only)."""
        if self._arrays is not None:
            return self._arrays[k][0]
        tokens = self._get(k).tokens
        assert tokens is not None
        return tokens

    def _pread(self, k: int, local: int, out: np.ndarray) -> None:
        """Read mode: fill `out` from shard k at token `local` with one preadv (uint32), a preadv
        and a widening copy (uint16), or the blocks the range touches decoded (packed, zstd)."""
        entry = self._get(k)
        if entry.file is not None:
            entry.file.read_into(local, out)
            return
        if self.dtype != TOKEN_DTYPE:
            narrow = np.empty(len(out), dtype=self.dtype)
            self._pread_narrow(entry, k, local, narrow)
            out[:] = narrow
            return
        want = out.nbytes
        got = os.preadv(entry.fd, [out.data], local * TOKEN_DTYPE.itemsize)
        if got != want:
            raise FormatError(f"{self.root / self.shards[k].path}: read {got} of {want} bytes at token {local}; "
                              "the shard changed after it was opened: run `lmshard inspect`")  # fmt: skip

    def _pread_narrow(self, entry: _Open, k: int, local: int, narrow: np.ndarray) -> None:
        """Read mode, uint16: fill `narrow` (uint16) from shard k at token `local` with one preadv."""
        if os.preadv(entry.fd, [narrow.data], local * narrow.itemsize) != narrow.nbytes:
            raise FormatError(f"{self.root / self.shards[k].path}: short read at token {local}; the shard changed "
                              "after it was opened: run `lmshard inspect`")  # fmt: skip

    def read_into(self, offset: int, out: np.ndarray) -> None:
        """Fill `out` (uint32, contiguous) with the tokens at [offset, offset + len(out)),
        crossing shard boundaries as needed."""
        done, n = 0, len(out)
        k = self.shard_of(offset)
        while done < n:
            local = offset + done - int(self.starts[k])
            take = min(n - done, int(self.sizes[k]) - local)
            if self.mapped:
                out[done : done + take] = self._tokens(k)[local : local + take]
            else:
                self._pread(k, local, out[done : done + take])
            done += take
            k += 1

    def gather(self, offsets: np.ndarray, length: int, scratch: np.ndarray | None = None,
               key: object = None) -> np.ndarray:  # fmt: skip
        """[rows, length] uint32: row r holds the tokens at [offsets[r], + length). A new array
        when the rows can be gathered from the maps in one go; otherwise read into `scratch` (a
        flat uint32 buffer the caller reuses: memory written once stays mapped, where a new array
        of this size would take a page fault per 4 KB written) or a new array. `key` (the
        announced step the rows are: see lookahead.py) matters to remote stores only."""
        span = self._span(length)
        if span is not None:
            at, cross = span.locate(offsets)
            if cross is None:
                return widened(span.view[at])  # one C loop over the rows, straight into a new array
        n = len(offsets) * length
        if scratch is not None and len(scratch) >= n:
            out = scratch[:n].reshape(len(offsets), length)
        else:
            out = np.empty((len(offsets), length), dtype=TOKEN_DTYPE)
        self.read_rows(offsets, out)
        return out

    def read_rows(self, offsets: np.ndarray, out: np.ndarray, key: object = None) -> None:
        """Fill each row of `out` ([rows, length] uint32, e.g. a pinned buffer) from the matching
        offset. Mapped: one gather over the span of all maps for the rows inside one shard, and
        `read_into` for the rare row that crosses a shard boundary. Read mode (or a mapped split
        of more shards than `max_open`): one `preadv` (or slice copy) per row."""
        span = self._span(out.shape[1])
        if span is None:
            self._read_each(offsets, out)
            return
        at, cross = span.locate(offsets)
        if cross is None:
            out[...] = span.view[at]  # (uint16: gathered, then widened into `out`)
            return
        inside = ~cross
        out[inside] = span.view[at[inside]]
        for r in np.flatnonzero(cross).tolist():
            self.read_into(int(offsets[r]), out[r])

    def _read_each(self, offsets: np.ndarray, out: np.ndarray) -> None:
        """Row by row: a `preadv` straight into `out` (read mode) or a slice copy from the row's
        map, and `read_into` for the rows that cross a shard boundary."""
        length = out.shape[1]
        found = np.searchsorted(self.starts, offsets, side="right") - 1
        local = (offsets - self.starts[found]).tolist()
        inside = (offsets - self.starts[found] + length <= self.sizes[found]).tolist()
        shards = found.tolist()
        crossing = [r for r, whole in enumerate(inside) if not whole]
        if self.dtype is None:  # packed, zstd: the rows of each shard decoded at once
            local_arr, inside_arr = np.asarray(local, dtype=np.int64), np.asarray(inside)
            for k in set(shards):
                mine = np.flatnonzero((found == k) & inside_arr)
                if len(mine):  # (else its rows all cross into the next shard: read below)
                    file = self._get(k).file
                    assert file is not None
                    out[mine] = file.read_rows(local_arr[mine], length)
        elif not self.mapped:
            # Descriptors are taken once per batch, unless its rows are in more shards than may be
            # open at once: then opening a later shard would close an earlier one, whose number
            # the new file may reuse, and rows would silently come from the wrong shard.
            distinct = set(shards)
            fds = {k: self._get(k).fd for k in distinct} if len(distinct) <= self.max_open else None
            # uint16: the rows land in a narrow buffer, widened into `out` by one copy at the end
            rows = out if self.dtype == TOKEN_DTYPE else np.empty(out.shape, dtype=self.dtype)
            size = rows.itemsize
            nbytes = length * size
            for r, k in enumerate(shards):
                if not inside[r]:
                    continue
                fd = fds[k] if fds is not None else self._get(k).fd
                if os.preadv(fd, [rows[r]], local[r] * size) != nbytes:
                    self._pread(k, local[r], out[r])  # a short read: retry once, raising if it is short again
                    rows[r] = out[r]
            if rows is not out:
                out[...] = rows
        else:
            arrays = {k: self._tokens(k) for k in set(shards)}  # an array keeps its map even if its shard is closed
            for r, k in enumerate(shards):
                if inside[r]:
                    out[r] = arrays[k][local[r] : local[r] + length]
        for r in crossing:  # last: they may open shards and close others, whose descriptors are held above
            self.read_into(int(offsets[r]), out[r])

    def _span(self, length: int) -> _Span | None:
        """The row view over all maps for rows of `length` (one per row length: a few at most,
        with random shifts). None in read mode, and when the split has more shards than may be
        open at once: the span needs every shard mapped for as long as it exists."""
        span = self._spans.get(length)
        if span is None:
            if not self.mapped or len(self.shards) > self.max_open:
                return None
            arrays = [self._tokens(k) for k in range(len(self.shards))]
            span = self._spans[length] = _Span(arrays, self.starts, length)
        return span

    def index(self, k: int) -> np.ndarray:
        return self._arrays[k][1] if self._arrays is not None else self._get(k).index


def open_store(
    path: str | os.PathLike[str], split: str, max_open: int = 64, rss_limit: int | None = DEFAULT_RSS_LIMIT
) -> tuple[DatasetMeta, TokenStore]:
    meta = load_metadata(path)
    if split not in meta.splits:
        raise FormatError(f"{path}: no split {split!r} (splits: {', '.join(meta.splits)})")
    store = TokenStore.from_dataset(meta, split, max_open, rss_limit)
    if store.n_tokens == 0:
        raise FormatError(f"{path}: split {split!r} holds no tokens; {meta.empty_split_why(split)}")
    return meta, store
