"""How a shard's token file stores its tokens: the shard encoding, chosen at prepare time
(`--shard-encoding`) and recorded in the metadata's `encoding` object (format version 2).

- `uint32`: 4 bytes per token, little-endian, no header (format version 1, the default).
- `uint16`: 2 bytes per token; only for vocabularies of at most 65,536 ids.
- `packed`: ⌈log2 n_vocab⌉ bits per token (`bitpack.py`), one stream of bits: token i is at
  bits [i·b, (i+1)·b), so any range is found by arithmetic.
- `zstd`: blocks of `block_tokens` tokens, each stored as `width`-byte little-endian integers
  (the narrowest that holds every id: 2 bytes up to 65,536 ids, 3 up to 2^24) and compressed
  as one zstd frame with its own checksum, independently of every other block. The `.blocks`
  file beside the shard holds the byte offset of each frame, so a row decodes only the frames
  it touches. A dataset may carry one zstd dictionary (format version 3), trained at prepare
  time from a sample of its tokens (`prepare/output/dictfile.py`) and stored in the metadata
  (base64, with its sha256): every frame is compressed with it, which makes small frames nearly
  as small as a whole shard compressed at once (docs/performance.md, "shard encodings").

Every encoding is cut into blocks of `block_tokens` tokens for its checksums (`.sums`: the
xxh3-64 of each block's stored bytes), so a damaged byte is named by shard and block. Block b
spans bytes [b·block_tokens·bytes_per_token, ...) in the fixed-width encodings (uint32, uint16,
packed: a block of 16,384 tokens at b bits is 2,048·b bytes) and [offsets[b], offsets[b+1]) in
zstd.

Memory model: `encode`/`decode` hold one block (its tokens and its stored bytes).
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import ConfigError, FormatError, missing_dependency
from .bitpack import bits_for, pack, packed_nbytes, unpack
from .blocks import BLOCK_TOKENS
from .fields import _count, _get, _Invalid

NAMES = ("uint32", "uint16", "packed", "zstd")
# Chosen by measurement with a dictionary (docs/performance.md, "shard encodings"): 3,072-token
# frames at level 6 are 0.72 bytes per GPT-2 token on the benchmark corpus, and a random
# 32 x 1024 batch decodes about 43 of them in well under a millisecond; 4,096 tokens save 1%
# more and decode a quarter more bytes per row. (Datasets before dictionaries: 1,024 at level 3.)
ZSTD_BLOCK_TOKENS = 3072
ZSTD_LEVEL = 6
OFFSETS_DTYPE = np.dtype("<u8")  # the .blocks file: n_blocks + 1 byte offsets


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:
        raise missing_dependency("zstandard", "zstd", "the zstd shard encoding") from None
    return zstandard


@dataclass(frozen=True)
class Encoding:
    """A shard encoding and its parameters (see the module docstring)."""

    name: str = "uint32"
    block_tokens: int = BLOCK_TOKENS
    bits: int = 32  # packed: bits per token
    width: int = 4  # zstd: bytes per token inside a frame
    level: int = 0  # zstd: the compression level the writer used (reading does not need it)
    dictionary: bytes | None = field(default=None, repr=False)  # zstd: every frame's dictionary (format 3)

    @classmethod
    def choose(cls, name: str, n_vocab: int, flag: str = "--shard-encoding") -> Encoding:
        """The encoding `name` for a vocabulary of `n_vocab` ids; ConfigError (one line) for an
        unknown name or a uint16 that cannot hold the vocabulary."""
        if name == "uint32":
            return cls()
        if name == "uint16":
            if n_vocab > 1 << 16:
                raise ConfigError(f"{flag} uint16 holds ids up to 65,535, but this vocabulary has "
                                  f"{n_vocab:,} ids: use packed ({bits_for(n_vocab)} bits per token), zstd or "
                                  "uint32")  # fmt: skip
            return cls("uint16", bits=16)
        if name == "packed":
            return cls("packed", bits=bits_for(n_vocab))
        if name == "zstd":
            _zstd()
            width = 2 if n_vocab <= 1 << 16 else 3 if n_vocab <= 1 << 24 else 4
            return cls("zstd", block_tokens=ZSTD_BLOCK_TOKENS, bits=8 * width, width=width, level=ZSTD_LEVEL)
        raise ConfigError(f"{flag} {name!r}: choose one of {', '.join(NAMES)}")

    @property
    def version(self) -> int:
        """The format version a dataset of this encoding is: 1 for uint32 (unchanged), 3 for zstd
        with a dictionary (a reader that knows no dictionaries refuses it), else 2."""
        return 1 if self.name == "uint32" else 3 if self.dictionary is not None else 2

    def with_dictionary(self, data: bytes | None) -> Encoding:
        """This zstd encoding with `data` as its frames' dictionary (None: without one)."""
        assert self.name == "zstd"
        return replace(self, dictionary=data)

    @property
    def dtype(self) -> str:
        """The metadata's `dtype`: the integer type tokens decode to."""
        return "uint16" if self.name == "uint16" else "uint32"

    @property
    def mappable(self) -> np.dtype | None:
        """The numpy dtype to memory-map the token file with, or None when it must be decoded (a
        packed file of 8, 16 or 32 bits per token is laid out as plain little-endian integers)."""
        if self.name == "packed" and self.bits in (8, 16, 32):
            return np.dtype(f"<u{self.bits // 8}")
        return _MAPPABLE.get(self.name)

    @property
    def compressed(self) -> bool:
        """Blocks of varying size, located through the `.blocks` file."""
        return self.name == "zstd"

    def describe(self) -> str:
        if self.name == "packed":
            return f"packed ({self.bits} bits per token)"
        if self.name == "zstd":
            with_dict = f", a {len(self.dictionary) >> 10:,} KiB dictionary" if self.dictionary is not None else ""
            return f"zstd (level {self.level}, {self.block_tokens:,}-token blocks of {self.width}-byte ids{with_dict})"
        return self.name

    def n_bytes(self, n_tokens: int) -> int:
        """The stored size of `n_tokens` tokens (fixed-width encodings only)."""
        assert not self.compressed
        return packed_nbytes(n_tokens, self.bits)

    def block_span(self, block: int, n_tokens: int, offsets: np.ndarray | None = None) -> tuple[int, int]:
        """(first byte, end byte) of block `block` of a shard of `n_tokens` tokens."""
        if offsets is not None:
            return int(offsets[block]), int(offsets[block + 1])
        first = block * self.block_tokens
        return self.n_bytes(first), self.n_bytes(min(first + self.block_tokens, n_tokens))

    def encode(self, tokens: np.ndarray, compressor: Any = None) -> bytes:
        """One block's (or, fixed-width, any whole-block run's) tokens as stored bytes.
        ValueError naming the id when one does not fit the encoding."""
        tokens = np.ascontiguousarray(tokens, dtype="<u4")
        if self.name == "uint32":
            return tokens.tobytes()
        if self.bits < 32 and len(tokens) and int(tokens.max()) >> self.bits:
            raise ValueError(f"token id {int(tokens.max()):,} does not fit the {self.describe()} encoding")
        if self.name == "uint16":
            return tokens.astype("<u2").tobytes()
        if self.name == "packed":
            return pack(tokens, self.bits).tobytes()
        return bytes((compressor or self.compressor()).compress(self.narrow(tokens)))

    def narrow(self, tokens: np.ndarray) -> bytes:
        """zstd: a block's ids as the `width`-byte little-endian integers a frame holds."""
        return np.ascontiguousarray(np.asarray(tokens, "<u4").view(np.uint8).reshape(-1, 4)[:, : self.width]).tobytes()

    def compressor(self) -> Any:
        return _zstd().ZstdCompressor(level=self.level, write_checksum=True, write_content_size=True,
                                      dict_data=_dictionary(self.dictionary))  # fmt: skip

    def decompressor(self) -> Any:
        return _zstd().ZstdDecompressor(dict_data=_dictionary(self.dictionary))

    def decode(self, data: bytes | memoryview | np.ndarray, n_tokens: int, where: str | Callable[[], str] = "",
               decompressor: Any = None) -> np.ndarray:  # fmt: skip
        """uint32 tokens of `data`, one block's stored bytes (or a fixed-width run from a block
        start). FormatError naming `where` (a string, or a function that makes it: called only
        on an error) when a compressed block does not decode."""
        if self.name in ("uint32", "uint16"):
            return np.frombuffer(data, dtype=self.mappable, count=n_tokens).astype(np.uint32)
        if self.name == "packed":
            return unpack(data, self.bits, 0, n_tokens)
        d, zstandard, size = decompressor or self.decompressor(), _zstd(), n_tokens * self.width
        raw, problem = b"", ""
        try:  # a frame's header names its content size, allocated before a byte is decoded: held to the block's
            claimed = zstandard.frame_content_size(data)
            if claimed not in (-1, size):
                problem = f"claims {claimed:,} bytes of content, not {size:,}"
            else:
                raw = d.decompress(data, max_output_size=size)
                problem = "" if len(raw) == size else f"decodes to {len(raw) // self.width:,} tokens"
        except (zstandard.ZstdError, MemoryError) as e:
            problem = f"does not decode ({e or type(e).__name__})"
        if problem:
            raise FormatError(f"{where() if callable(where) else where}: {problem}: the data is damaged; run "
                              "`lmshard inspect` on the dataset, and fetch or regenerate it")  # fmt: skip
        return widen(np.frombuffer(raw, dtype=np.uint8), self.width)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "block_tokens": self.block_tokens}
        if self.name == "packed":
            out["bits"] = self.bits
        if self.name == "zstd":
            out |= {"width": self.width, "level": self.level}
            if self.dictionary is not None:
                data = self.dictionary
                out["dictionary"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                     "base64": base64.b64encode(data).decode("ascii")}  # fmt: skip
        return out

    @classmethod
    def parse(cls, raw: Any, n_vocab: int) -> Encoding:
        if not isinstance(raw, dict):
            raise _Invalid("'encoding' is not an object")
        name = _get(raw, "name", str)
        block_tokens = _count(raw, "block_tokens")
        if name not in NAMES:
            raise _Invalid(f"encoding {name!r} is not one of {', '.join(NAMES)} (a newer lmshard wrote it?)")
        if not 8 <= block_tokens <= 1 << 30 or block_tokens % 8:
            raise _Invalid(f"encoding 'block_tokens' {block_tokens} is not a multiple of 8 in 8 .. 2**30")
        if name == "zstd" and block_tokens > 1 << 16:  # a reader keeps decoded blocks: they stay small
            raise _Invalid(f"encoding 'block_tokens' {block_tokens} is more than a zstd block holds (65,536)")
        bits, width = {"uint32": (32, 4), "uint16": (16, 2)}.get(name, (0, 0))
        if name == "packed":
            bits = _count(raw, "bits")
            if not bits_for(n_vocab) <= bits <= 32:
                raise _Invalid(f"encoding 'bits' {bits} cannot hold {n_vocab:,} ids")
            width = 4
        if name == "zstd":
            width = _count(raw, "width")
            if width not in (2, 3, 4) or n_vocab > 1 << (8 * width):
                raise _Invalid(f"encoding 'width' {width} cannot hold {n_vocab:,} ids")
            bits = 8 * width
        if name == "uint16" and n_vocab > 1 << 16:
            raise _Invalid(f"encoding uint16 cannot hold {n_vocab:,} ids")
        dictionary = _parse_dictionary(raw["dictionary"]) if name == "zstd" and "dictionary" in raw else None
        return cls(name, block_tokens=block_tokens, bits=bits, width=width, level=_get(raw, "level", int, 0),
                   dictionary=dictionary)  # fmt: skip


def _parse_dictionary(raw: Any) -> bytes:
    """A zstd dictionary's bytes from the metadata, held to its size and sha256."""
    if not isinstance(raw, dict):
        raise _Invalid("encoding 'dictionary' is not an object")
    try:
        data = base64.b64decode(_get(raw, "base64", str), validate=True)
    except ValueError:
        raise _Invalid("encoding 'dictionary' is not base64") from None
    if len(data) != _count(raw, "bytes") or hashlib.sha256(data).hexdigest() != _get(raw, "sha256", str):
        raise _Invalid("encoding 'dictionary' does not match its size and sha256: the metadata is damaged")
    return data


@functools.lru_cache(maxsize=8)
def _dictionary(data: bytes | None) -> Any:
    """The zstd dictionary object of `data` (parsed once per process), or None."""
    return None if data is None else _zstd().ZstdCompressionDict(data)


UINT32 = Encoding()
_MAPPABLE: dict[str, np.dtype] = {"uint32": np.dtype("<u4"), "uint16": np.dtype("<u2")}


def widen(raw: np.ndarray, width: int) -> np.ndarray:
    """uint32 tokens from little-endian integers of `width` bytes (a flat uint8 array)."""
    if width == 4:
        return raw.view("<u4").astype(np.uint32)
    if width == 2:
        return raw.view("<u2").astype(np.uint32)
    if width == 3:  # each id read as the 4 bytes from its first (one spare byte at the end), the 4th masked off
        padded = np.empty(len(raw) + 1, dtype=np.uint8)
        padded[:-1], padded[-1] = raw, 0
        words = np.ndarray((len(raw) // 3,), dtype="<u4", buffer=padded, strides=(3,))
        return (words & np.uint32(0xFFFFFF)).astype(np.uint32, copy=False)
    out = np.zeros((len(raw) // width, 4), dtype=np.uint8)
    out[:, :width] = raw.reshape(-1, width)
    return out.view("<u4").reshape(-1).astype(np.uint32, copy=False)


def blocks_path(bin_rel: str) -> str:
    """The block offsets file of a compressed token file (train/shard_000000.bin → .blocks)."""
    return bin_rel.removesuffix(".bin") + ".blocks"
