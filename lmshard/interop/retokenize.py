"""`lmshard retokenize`: a dataset's documents in another vocabulary, without preparing it again.

Every document of every split is decoded with the dataset's own tokenizer and encoded with the
new one, in the same order and the same split, with its provenance record, and written with the
new vocabulary's separators (its EOT on the dataset's side, and a BOS where `--bos` (recorded)
asks for one: auto, when the new tokenizer's configuration adds one). What does not depend on
the vocabulary is kept: the dedup key files (hashes of the cleaned text) and signatures are copied
byte for byte, so `--append`, `inspect --overlap` and resumable loaders work on the result as on
a fresh prepare; the counts of what was read and dropped are the source's. So a retokenized
dataset holds, document for document, what `prepare` with the new tokenizer would write from
the same inputs; only the shard boundaries move (tokens per shard count the new tokens).

Decoding must give back the text that was encoded. It does for byte-level vocabularies (tiktoken
vocabularies by name; a tokenizer.json with a ByteLevel decoder, no ordinary added tokens and no
normalizer but NFC on text prepare made NFC); others are refused in one line saying why (prepare
from the source text then). Every document's text is also encoded back with the dataset's own
vocabulary and must give its stored tokens, and every block of the source is held to its
checksums as it is read (convert's checks), so nothing damaged or not round-tripping is written.

Positions: document i of a split is document i of the same split in the result (its tokens
start at the new index's offset i), so a run stopped at a document goes on at the same document:
`same_document(old, new, split, token)` maps a token position.

The result is built beside `--out` and replaces it only when complete (`output.staged_output`),
in the source's shard encoding (`shard_encoding` to choose another; zstd frames without a
dictionary, which `lmshard convert --to zstd` adds).

Documents are decoded and encoded by `workers` processes (default: the CPUs available, as for
prepare), a block of about BLOCK_TOKENS source tokens at a time, handed back in order, so the
result does not depend on their number; this process reads the source and writes the shards.
`--num-tasks N` runs the same steps as planned tasks on any engine, the same bytes (retoktasks.py).

Memory model: at most 2 × workers blocks in flight (BLOCK_TOKENS source tokens each, with their
texts and new tokens), each worker's two vocabularies, one source shard's provenance records
(12 bytes a document) and attribute records (twice: the file's bytes and the records) and the
shard writers' buffers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..errors import ArgumentError, ConfigError, FormatError
from ..format import (
    INDEX_DTYPE,
    METADATA_FILE,
    SPLITS,
    TOKENIZER_FILE,
    DatasetMeta,
    Encoding,
    RunInfo,
    ShardInfo,
    SplitInfo,
    TokenizerInfo,
    atomic_write_json,
    file_xxh3,
    load_metadata,
    write_vocab_copy,
)
from ..format.attributes import row_dtype, to_rows
from ..format.provenance import SRC_DTYPE
from ..prepare.config import PrepareConfig
from ..tokenizers import Tokenizer
from .convert import checked_chunks, copy_checked
from .output import staged_output
from .source import Block, open_source, shard_blocks

CHECKED_DOCS = 256  # documents of each split decoded and encoded again with the dataset's tokenizer first
BLOCK_TOKENS = 1 << 20  # source tokens decoded and encoded at a time (a worker's task)


@dataclasses.dataclass(frozen=True)
class RetokenizeResult:
    meta: DatasetMeta  # the new dataset's (root: --out)
    source: DatasetMeta


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a retokenize works from, in one process or in each task (retoktasks.py)."""

    meta: DatasetMeta  # the source's
    splits: tuple[str, ...]
    old: Tokenizer  # the source's vocabulary, which gives back its documents' text
    config: PrepareConfig  # the new dataset's options (inputs: the source)
    new: Tokenizer
    encoding: Encoding
    bos: int | None  # the BOS written before each text, or None
    specials: int  # what each stored source document holds besides its text (EOT, and a BOS)

    def units(self) -> list[tuple[str, int, ShardInfo]]:
        """The source's shards that hold documents, in order (train's, then val's), each with its
        split and the split's documents before it."""
        out = []
        for split in self.splits:
            first = 0
            for shard in self.meta.split_shards(split):
                if shard.n_docs:
                    out.append((split, first, shard))
                first += shard.n_docs
        return out

    def rows(self) -> np.dtype | None:
        """The attribute records' dtype (kept as they are, as .src is), or None without attributes."""
        return row_dtype(self.meta.attributes) if self.meta.attributes else None

    def writer(self, root: Path, split: str, number: int = 0) -> Any:
        """A ShardWriter of `split` under `root` in the new encoding, from shard `number` on."""
        from ..prepare.output.writer import ShardWriter

        return ShardWriter(root, split, self.config.tokens_per_shard, encoding=self.encoding, provenance=True,
                           attributes=self.rows(), number=number)  # fmt: skip

    def encode_here(self) -> None:
        """Make this process one that encodes (`_encode`) with the tokenizers loaded here."""
        _here.update(old=self.old, new=self.new, specials=self.specials, bos=self.bos,
                     position=self.meta.eot_position)  # fmt: skip


def setup(dataset: str | os.PathLike[str], tokenizer: str, out: str | os.PathLike[str], *,
          tokenizer_backend: str = "auto", shard_encoding: str | None = None, tokens_per_shard: int | None = None,
          workers: int | None = None, separator: str | None = None, bos: str | None = None,
          meta: DatasetMeta | None = None) -> Setup:  # fmt: skip
    """The source, checked to give back its text (its metadata read and every shard's files held
    to their sizes; or `meta` as given: a task's, which checks the shards it reads), and the new
    vocabulary and options."""
    from ..prepare.output.claim import bos_written, run_tokenizer

    if tokens_per_shard is not None and tokens_per_shard < 1:
        raise ConfigError(f"--tokens-per-shard {tokens_per_shard}: must be at least 1")
    if meta is None:
        meta, splits = open_source(dataset, "all")
    else:
        splits = tuple(split for split in SPLITS if meta.n_docs(split))
    old = decoder(dataset, meta, "prepare the new dataset from the source text instead")
    recorded = meta.config or {}
    config = PrepareConfig(inputs=[str(dataset)], out=str(out), tokenizer=tokenizer,
                           tokenizer_backend=tokenizer_backend, separator=separator,
                           bos=bos or recorded.get("bos", "auto"), eot_position=meta.eot_position,
                           shard_encoding=shard_encoding or meta.encoding.name,
                           tokens_per_shard=tokens_per_shard or int(recorded.get("tokens_per_shard") or 100_000_000),
                           workers=workers or 0)  # fmt: skip
    new = run_tokenizer(config)
    encoding = config.encoding(new.n_vocab)  # (uint16 for a larger vocabulary: refused naming --shard-encoding)
    specials = 1 if meta.tokenizer.bos_id is None else 2
    return Setup(meta, splits, old, config, new, encoding, bos_written(config, new), specials)


def retokenize_dataset(dataset: str | os.PathLike[str], tokenizer: str, out: str | os.PathLike[str], *,
                       tokenizer_backend: str = "auto", shard_encoding: str | None = None,
                       tokens_per_shard: int | None = None, overwrite: bool = False, workers: int | None = None,
                       separator: str | None = None, bos: str | None = None) -> RetokenizeResult:  # fmt: skip
    """Write `dataset`'s documents encoded with `tokenizer` to `out` (module docstring).

        retokenize_dataset("data/owt", "meta-llama/Llama-3.2-1B", "data/owt_llama")
    """
    from ..prepare.output.build import sigterm_stops

    s = setup(dataset, tokenizer, out, tokenizer_backend=tokenizer_backend, shard_encoding=shard_encoding,
              tokens_per_shard=tokens_per_shard, workers=workers, separator=separator, bos=bos)  # fmt: skip
    meta = s.meta
    n = s.config.n_workers()
    with contextlib.ExitStack() as stack:
        stack.enter_context(sigterm_stops())  # (SIGTERM as Ctrl-C: the staging directory is removed)
        staging = stack.enter_context(staged_output(out, overwrite, [meta.root], flag="--overwrite"))
        encoded = stack.enter_context(encoder(s, n))
        shards = []
        for split in s.splits:
            writer = s.writer(staging, split)
            for _, first, shard in (u for u in s.units() if u[0] == split):
                add_shard(s, writer, shard, encoded(numbered_blocks(meta, shard, split, first)))
            shards += writer.close()
        for key_file in meta.dedup.files if meta.dedup else ():  # (of the text: the same for any vocabulary)
            copy_checked(meta, key_file.path, staging, key_file.xxh3_64)
        result = write_metadata(s, staging, tuple(shards))
    return RetokenizeResult(dataclasses.replace(result, root=Path(os.path.realpath(out))), meta)


@contextlib.contextmanager
def encoder(s: Setup, n: int) -> Iterator[Callable[[Iterator[Any]], Iterator[tuple[np.ndarray, np.ndarray]]]]:
    """A function from numbered blocks to their documents in the new vocabulary, in order:
    encoded by `n` worker processes (a block each at a time), or here when n is 1."""
    from ..prepare.execution.pool import OrderedPool, start_method

    if n <= 1:
        s.encode_here()
        yield lambda blocks: map(_encode, blocks)
        return
    head = dataclasses.replace(s.meta, splits={}, sources=())  # (what a worker needs: not the shards)
    pool: OrderedPool[Any, Any] = OrderedPool(n, _start, (head, s.config, s.specials, s.bos),
                                              start=start_method())  # fmt: skip
    with pool:
        yield lambda blocks: pool.imap(_encode, blocks, 2 * n)


def add_shard(s: Setup, writer: Any, shard: ShardInfo, encoded: Iterator[tuple[np.ndarray, np.ndarray]]) -> None:
    """A source shard's documents, encoded, added to `writer` with their provenance and
    attribute records; the shard's stored bytes held to their checksums first."""
    _check_source(s.meta, shard)
    src, done = per_doc_records(s.meta, shard, shard.src_path, shard.src_xxh3_64, SRC_DTYPE), 0
    attrs = None if s.rows() is None else attribute_records(s.meta, shard)
    for tokens, lengths in encoded:
        writer.add(tokens, lengths, src[done : done + len(lengths)],
                   None if attrs is None else attrs[done : done + len(lengths)])  # fmt: skip
        done += len(lengths)


def write_metadata(s: Setup, staging: Path, shards: tuple[ShardInfo, ...]) -> DatasetMeta:
    """The new dataset's vocabulary copy, tokenizer state and metadata (last: its presence means
    complete), parsed back as any reader will."""
    write_vocab_copy(staging, s.new.vocab_format, s.new.vocab_bytes)
    atomic_write_json(staging / TOKENIZER_FILE, s.new.identity())
    result = _metadata(s.meta, staging, s.config, s.new, s.bos, s.encoding, shards)
    atomic_write_json(staging / METADATA_FILE, result.to_json())
    load_metadata(staging)  # the metadata as any reader will parse it
    return result


_here: dict[str, Any] = {}  # the tokenizers and separators of the process that encodes (`_start`)


def _start(arg: tuple[DatasetMeta, PrepareConfig, int, int | None]) -> None:
    """A worker: load the dataset's tokenizer and the new one (one thread each: the workers are the
    parallelism)."""
    from ..prepare.output.claim import run_tokenizer
    from ..tokenizers.of_dataset import tokenizer_for

    meta, config, specials, bos = arg
    new = run_tokenizer(config)
    new.use_threads(1)
    _here.update(old=tokenizer_for(meta), new=new, specials=specials, bos=bos, position=meta.eot_position)


def numbered_blocks(meta: DatasetMeta, shard: ShardInfo, split: str, first: int) -> Iterator[tuple[str, int, Block]]:
    """The shard's blocks of documents, each with its split and the number there of its first
    document (`first`: the split's documents before the shard), for a message."""
    for block in shard_blocks(meta, shard, "after", BLOCK_TOKENS):
        yield split, first, block
        first += len(block.lengths)


def _encode(work: tuple[str, int, Block]) -> tuple[np.ndarray, np.ndarray]:
    """A block of the source's documents in the new vocabulary: its tokens and lengths, separators
    included. Each document's text is held to its tokens first: the dataset's own tokenizer
    encodes it back to them, else the run stops naming the document (it does not round-trip)."""
    from ..prepare.output.writer import with_separators

    split, first, block = work
    new = _here["new"]
    texts = checked_texts(split, first, block, _here["old"], _here["specials"], "prepare the new dataset")
    tokens, lengths = new.encode_batch(texts)
    return with_separators(tokens, lengths, np.ones(len(lengths), bool), new.eot_id, _here["position"], _here["bos"])


def checked_texts(split: str, first: int, block: Block, old: Tokenizer, specials: int, instead: str) -> list[str]:
    """The texts of a block of documents, each held to its tokens: the dataset's own tokenizer
    encodes it back to them, else ConfigError naming the document (`instead`: what to do)."""
    texts = _texts(block.tokens, block.lengths, old, specials)
    again, again_lengths = old.encode_batch(texts)
    keep = np.ones(len(block.tokens), bool)  # the stored tokens of the texts: without the separators
    ends = np.cumsum(block.lengths)
    keep[ends - 1] = False
    if specials == 2:
        keep[ends - block.lengths] = False
    stored = block.tokens[keep]
    if not np.array_equal(again_lengths, block.lengths - specials) or not np.array_equal(again, stored):
        d = _first_mismatch(again, again_lengths, stored, block.lengths - specials)
        raise ConfigError(f"{split} document {first + d + 1} does not decode to the text it was made from (its "
                          f"vocabulary does not round-trip it); {instead} from the source text instead")  # fmt: skip
    return texts


def _first_mismatch(a: np.ndarray, a_lengths: np.ndarray, b: np.ndarray, b_lengths: np.ndarray) -> int:
    a_parts, b_parts = np.split(a, np.cumsum(a_lengths)[:-1]), np.split(b, np.cumsum(b_lengths)[:-1])
    return next(d for d, (x, y) in enumerate(zip(a_parts, b_parts, strict=True)) if not np.array_equal(x, y))


def decoder(dataset: Any, meta: DatasetMeta, instead: str) -> Tokenizer:
    """The dataset's own tokenizer, which must give back the text its documents were made from;
    ConfigError saying why not and what to do `instead`."""
    from ..tokenizers.of_dataset import tokenizer_for

    why: list[str] = []
    old = tokenizer_for(meta, why)
    if old is None:
        raise ConfigError(f"{dataset}: cannot decode its documents: {' '.join(why)}")
    if (why_not := lossy(old, meta)) is not None:
        raise ConfigError(f"{dataset}: its {meta.tokenizer.name} vocabulary cannot give back the text its documents "
                          f"were made from ({why_not}); {instead}")  # fmt: skip
    return old


def lossy(old: Tokenizer, meta: DatasetMeta) -> str | None:
    """Why decoding with `old` may not give back the text it encoded, or None: tiktoken
    vocabularies and byte-level tokenizer.json ones (a ByteLevel decoder; no normalizer, or NFC
    on text prepare made NFC already; no ordinary added tokens, which are matched in text and
    decode as their content) do."""
    if old.vocab_format == "tiktoken":
        return None
    if old.vocab_format != "tokenizer.json" or old.vocab_bytes is None:
        return f"a {old.vocab_format} vocabulary normalizes text"
    spec = json.loads(old.vocab_bytes)
    normalizer = (spec.get("normalizer") or {}).get("type")
    if normalizer and not (normalizer == "NFC" and (meta.config or {}).get("normalize", "nfc") == "nfc"):
        return f"its normalizer ({normalizer}) changes the text before it is encoded"
    if (spec.get("decoder") or {}).get("type") != "ByteLevel":
        return "its decoder is not byte-level"
    if ordinary := [t.get("content") for t in spec.get("added_tokens") or () if not t.get("special")]:
        return f"its ordinary added tokens ({', '.join(map(repr, ordinary[:3]))}) are matched in text"
    return None


def _texts(tokens: np.ndarray, lengths: np.ndarray, old: Tokenizer, specials: int) -> list[str]:
    """Each document's text: its tokens without the BOS before them and the EOT after, decoded."""
    ends = np.cumsum(lengths)
    first = 1 if specials == 2 else 0
    return [old.decode(tokens[end - n + first : end - 1].tolist()) for end, n in zip(ends, lengths, strict=True)]


def _check_source(meta: DatasetMeta, shard: ShardInfo) -> None:
    """The shard's stored bytes held to their block sums and checksum, its ids below n_vocab
    (convert's checks: a damaged source is refused, never re-encoded into a dataset that
    verifies)."""
    for _ in checked_chunks(meta, shard, "the dataset"):
        pass


def attribute_records(meta: DatasetMeta, shard: ShardInfo) -> np.ndarray:
    """The shard's documents' attribute records (its .attr, held to its checksum)."""
    data = per_doc_records(meta, shard, shard.attr_path, shard.attr_xxh3_64, "u1").tobytes()
    return to_rows(data, row_dtype(meta.attributes), shard.n_docs)


def per_doc_records(meta: DatasetMeta, shard: ShardInfo, rel: str, xxh3_64: str, dtype: Any) -> np.ndarray:
    """The shard's documents' provenance (its .src) or attribute (.attr) records, held to their checksum."""
    if not rel:
        raise FormatError(f"{meta.root}: {shard.path} has no provenance file (a dataset written before lmshard kept "
                          "them); prepare the new dataset from the source text instead")  # fmt: skip
    path = meta.abspath(rel)
    if (digest := file_xxh3(path)) != xxh3_64:
        raise FormatError(f"{path}: checksum {digest} != {xxh3_64} in the metadata (damaged); run `lmshard "
                          "inspect` on the dataset")  # fmt: skip
    return np.fromfile(path, dtype=dtype)


def _metadata(meta: DatasetMeta, staging: Path, config: PrepareConfig, new: Tokenizer, bos: int | None,
              encoding: Encoding, shards: tuple[ShardInfo, ...]) -> DatasetMeta:  # fmt: skip
    tokenizer = TokenizerInfo(name=new.name, backend=new.backend, n_vocab=new.n_vocab, eot_id=new.eot_id, bos_id=bos,
                              ranks_sha256=new.vocab_sha256, vocab_format=new.vocab_format)  # fmt: skip
    splits = {name: SplitInfo.of(tuple(s for s in shards if s.split == name)) for name in SPLITS}
    recorded = {**(meta.config or {}), "tokenizer": new.name, "shard_encoding": encoding.name,
                "tokens_per_shard": config.tokens_per_shard}  # fmt: skip
    step = RunInfo.step("retokenize", time.time(), meta.total_docs, sum(s.n_tokens for s in shards), __version__,
                        tokenizer=new.name, source=os.path.realpath(meta.root))  # fmt: skip
    run = dataclasses.replace(meta.run, lineage=(*RunInfo.history(meta), step), out=str(config.out),
                              workers=config.n_workers(), tokens_per_s=None, elapsed_s=0.0)  # fmt: skip
    return dataclasses.replace(meta, root=staging, tokenizer=tokenizer, encoding=encoding, splits=splits,
                               total_tokens=sum(s.n_tokens for s in shards), config=recorded, run=run,
                               lmshard_version=__version__)  # fmt: skip


def same_document(old: DatasetMeta, new: DatasetMeta, split: str, token: int) -> int:
    """The position in `new` (a retokenized `old`) of the start of the document of `split` that
    holds token `token` of `old`: where a run stopped inside a document goes on."""
    starts_old, starts_new = _starts(old, split), _starts(new, split)
    if len(starts_old) != len(starts_new):
        raise ArgumentError(f"the {split} splits hold {len(starts_old):,} and {len(starts_new):,} documents: the "
                            "second dataset is not the first retokenized")  # fmt: skip
    if not 0 <= token < old.n_tokens(split):
        raise ArgumentError(f"token {token:,} is not in the {split} split (0 .. {old.n_tokens(split) - 1:,})")
    return int(starts_new[int(np.searchsorted(starts_old, token, side="right")) - 1])


def _starts(meta: DatasetMeta, split: str) -> np.ndarray:
    """Each document's first token in the split's concatenated shards."""
    out, base = [], 0
    for shard in meta.split_shards(split):
        offsets = np.fromfile(meta.abspath(shard.index_path), dtype=INDEX_DTYPE).astype(np.int64)
        out.append(offsets[:-1] + base)
        base += shard.n_tokens
    return np.concatenate(out) if out else np.zeros(0, np.int64)
