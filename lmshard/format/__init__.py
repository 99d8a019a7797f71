"""The on-disk contract of an lmshard dataset: the centre every other part imports.

Writer, `inspect` and the runtime loader all import this package; it imports none of them, and
neither torch nor tiktoken, so a training node can read a dataset with numpy alone.
`layout` holds the file names, dtypes and crash-safe writes; `schema` the metadata as typed
values (built by prepare, parsed and validated for every reader), with `skipped` the part that
records what an input directory held that was not read; `blocks` the per-block checksums;
`files` reads the metadata and holds a dataset's files to it (paths, sizes, document indexes) before anyone reads them.

Memory model: metadata is a few hundred bytes per shard and per source file; `read_document`
reads one document. Nothing here holds a shard.
"""

from .blocks import BLOCK_TOKENS, BlockHasher, block_damage, bytes_xxh3, check_blocks, file_xxh3, sums_path
from .encoding import NAMES as ENCODINGS
from .encoding import UINT32, Encoding, blocks_path
from .files import (
    check_index,
    check_shard_files,
    dataset_file_size,
    dataset_files,
    file_checksums,
    find_shard,
    load_metadata,
    read_document,
    read_small,
    shard_file_sizes,
)
from .layout import (
    EOT_POSITIONS,
    FORMAT_NAME,
    FORMAT_VERSION,
    IN_PROGRESS_FILE,
    INDEX_DTYPE,
    MAX_TOKENIZER_BYTES,
    METADATA_FILE,
    REGENERATE_HINT,
    SPLITS,
    TOKEN_DTYPE,
    TOKENIZER_FILE,
    VOCAB_COPIES,
    VOCAB_COPY,
    atomic_file,
    atomic_write_bytes,
    atomic_write_json,
    in_folder,
    shard_paths,
    write_vocab_copy,
)
from .parts import DedupInfo, KeyFile, SourceInfo, SplitInfo, TokenizerInfo
from .provenance import SRC_DTYPE, src_path
from .runinfo import RunInfo
from .schema import DatasetMeta, parse_metadata
from .shard import ShardInfo
from .skipped import SkippedInputs

__all__ = [
    "BLOCK_TOKENS", "BlockHasher", "block_damage", "check_blocks", "bytes_xxh3", "file_xxh3", "sums_path",
    "EOT_POSITIONS", "FORMAT_NAME", "FORMAT_VERSION", "IN_PROGRESS_FILE", "INDEX_DTYPE", "MAX_TOKENIZER_BYTES",
    "METADATA_FILE", "REGENERATE_HINT", "SPLITS", "TOKEN_DTYPE", "TOKENIZER_FILE", "VOCAB_COPY", "VOCAB_COPIES",
    "atomic_file", "atomic_write_bytes", "atomic_write_json", "in_folder", "shard_paths",
    "write_vocab_copy", "DatasetMeta",
    "DedupInfo", "KeyFile", "RunInfo", "ShardInfo", "SourceInfo",
    "SkippedInputs", "SplitInfo",
    "TokenizerInfo",
    "find_shard", "load_metadata", "read_document", "read_small", "check_index", "check_shard_files",
    "dataset_file_size", "dataset_files", "file_checksums", "shard_file_sizes",
    "parse_metadata", "ENCODINGS", "UINT32", "Encoding", "blocks_path", "SRC_DTYPE", "src_path",
]  # fmt: skip
