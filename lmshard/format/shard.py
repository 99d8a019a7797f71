"""One shard's entry in the metadata, as a typed value: its files, their sizes and checksums.

Memory model: a few hundred bytes per shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .fields import _check_names, _count, _get, _inside, _Invalid, _sums
from .layout import INDEX_DTYPE, TOKEN_DTYPE
from .provenance import SRC_DTYPE


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """One shard as the metadata describes it. Paths are relative to the dataset root."""

    split: str
    path: str  # the token file: n_tokens tokens in the dataset's encoding (uint32: 4 bytes each), no header
    index_path: str  # the document index: n_docs + 1 little-endian uint64 offsets, 0 .. n_tokens
    n_tokens: int
    n_docs: int
    xxh3_64: str  # of the token file's bytes
    index_xxh3_64: str  # of the index file's bytes
    # Per-block checksums (blocks.py): the sums file, its block size and its own xxh3-64; empty in
    # datasets written without them, which readers read on without.
    sums_path: str = ""
    block_tokens: int = 0
    sums_xxh3_64: str = ""
    # Format version 2 (encoding.py): the token file's size in bytes, and for a compressed
    # encoding the file of its blocks' byte offsets and that file's xxh3-64.
    n_bytes: int = -1
    blocks_path: str = ""
    blocks_xxh3_64: str = ""
    # Provenance (provenance.py): each document's source and record, 12 bytes a document; empty
    # in datasets written before it was kept.
    src_path: str = ""
    src_xxh3_64: str = ""
    # Attributes (attributes.py): each document's record of the metadata's `attributes`, in a
    # dataset prepared with --attribute. `attr_width` (bytes a record) is the schema's, set when
    # the metadata is parsed, not stored with the shard.
    attr_path: str = ""
    attr_xxh3_64: str = ""
    attr_column_xxh3_64: tuple[str, ...] = ()  # each column's, in schema order (a column read alone)
    attr_width: int = field(default=0, compare=False)

    @property
    def n_blocks(self) -> int:
        return -(-self.n_tokens // self.block_tokens) if self.block_tokens else 0

    @property
    def sums_bytes(self) -> int:
        """The size the sums file must have (8 bytes per block)."""
        return self.n_blocks * 8

    @property
    def blocks_bytes(self) -> int:
        """The size the block offsets file must have (8 bytes per block, and the end)."""
        return (self.n_blocks + 1) * 8 if self.blocks_path else 0

    @property
    def src_bytes(self) -> int:
        """The size the provenance file must have (12 bytes per document)."""
        return self.n_docs * SRC_DTYPE.itemsize if self.src_path else 0

    @property
    def attr_bytes(self) -> int:
        """The size the attribute file must have (a record per document)."""
        return self.n_docs * self.attr_width if self.attr_path else 0

    def files(self) -> tuple[str, ...]:
        """The shard's files, relative to the dataset root: tokens, index, and sums, block
        offsets, provenance and attributes where kept."""
        extra = (self.sums_path, self.blocks_path, self.src_path, self.attr_path)
        return (self.path, self.index_path) + tuple(p for p in extra if p)

    @property
    def bin_bytes(self) -> int:
        """The size the token file must have."""
        return self.n_bytes if self.n_bytes >= 0 else self.n_tokens * TOKEN_DTYPE.itemsize

    @property
    def idx_bytes(self) -> int:
        """The size the index file must have."""
        return (self.n_docs + 1) * INDEX_DTYPE.itemsize

    def to_json(self) -> dict[str, Any]:
        out = {"path": self.path, "index_path": self.index_path, "n_tokens": self.n_tokens, "n_docs": self.n_docs,
               "xxh3_64": self.xxh3_64, "index_xxh3_64": self.index_xxh3_64}  # fmt: skip
        if self.sums_path:
            out |= {"sums_path": self.sums_path, "block_tokens": self.block_tokens, "sums_xxh3_64": self.sums_xxh3_64}
        if self.n_bytes >= 0:
            out["n_bytes"] = self.n_bytes
        if self.blocks_path:
            out |= {"blocks_path": self.blocks_path, "blocks_xxh3_64": self.blocks_xxh3_64}
        if self.src_path:
            out |= {"src_path": self.src_path, "src_xxh3_64": self.src_xxh3_64}
        if self.attr_path:
            out |= {"attr_path": self.attr_path, "attr_xxh3_64": self.attr_xxh3_64,
                    "attr_column_xxh3_64": list(self.attr_column_xxh3_64)}  # fmt: skip
        return out

    @classmethod
    def parse(cls, split: str, raw: Any) -> ShardInfo:
        if not isinstance(raw, dict):
            raise _Invalid(f"a shard entry of split '{split}' is not an object")
        try:
            n_bytes = _count(raw, "n_bytes", None)
            extra: dict[str, Any] = {"n_bytes": -1 if n_bytes is None else n_bytes}
            if "blocks_path" in raw:
                extra |= {"blocks_path": _inside(raw, "blocks_path"),
                          "blocks_xxh3_64": _get(raw, "blocks_xxh3_64", str)}
            if "src_path" in raw:
                extra |= {"src_path": _inside(raw, "src_path"), "src_xxh3_64": _get(raw, "src_xxh3_64", str)}
            if "attr_path" in raw:
                columns = _get(raw, "attr_column_xxh3_64", list)
                if not all(isinstance(c, str) for c in columns):
                    raise _Invalid("'attr_column_xxh3_64' is not a list of checksums")
                extra |= {"attr_path": _inside(raw, "attr_path"), "attr_xxh3_64": _get(raw, "attr_xxh3_64", str),
                          "attr_column_xxh3_64": tuple(columns)}  # fmt: skip
            shard = cls(split=split, path=_inside(raw, "path"), index_path=_inside(raw, "index_path"),
                        n_tokens=_count(raw, "n_tokens"), n_docs=_count(raw, "n_docs"),
                        xxh3_64=_get(raw, "xxh3_64", str), index_xxh3_64=_get(raw, "index_xxh3_64", str),
                        **_sums(raw), **extra)  # fmt: skip
            _check_names(shard)
            # Every document holds at least its separator, so a shard has no more documents than
            # tokens, and none only when it has no tokens.
            if shard.n_docs > shard.n_tokens or (shard.n_tokens and not shard.n_docs):
                raise _Invalid(f"'n_docs' {shard.n_docs} is impossible with 'n_tokens' {shard.n_tokens}")
            return shard
        except _Invalid as e:
            raise _Invalid(f"shard entry {raw.get('path')!r}: {e}") from None
