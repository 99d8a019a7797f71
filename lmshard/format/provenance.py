"""Where each document came from: a shard's provenance file (`shard_N.src`, beside its `.bin`
and `.idx`), a fixed-width record per document, in the shard's document order:

    source  uint32 little-endian: the document's input, an index into the metadata's `sources`
    record  uint64 little-endian: its record in that input, as the summary's examples name it
            (the line of a JSON-lines or text file, the row of a parquet file or a Hugging Face
            stream, 1 for a whole file)

12 bytes a document. Written by every path with the same bytes; `--append` keeps the old
shards' files and gives the new documents the indices of the new sources; `convert` copies the
file. Datasets written before it was kept have none (`src_path` empty): their documents' sources
are not known.

Memory model: constants; `records` builds one array of 12 bytes per document given.
"""

from __future__ import annotations

import numpy as np

SRC_DTYPE = np.dtype([("source", "<u4"), ("record", "<u8")])  # 12 bytes, no padding


def src_path(bin_rel: str) -> str:
    """The provenance file of the token file `bin_rel` (train/shard_000000.bin → .src)."""
    return bin_rel.removesuffix(".bin") + ".src"


def records(sources: np.ndarray, numbers: np.ndarray) -> np.ndarray:
    """Provenance records of documents given their source indices and record numbers."""
    out = np.empty(len(sources), dtype=SRC_DTYPE)
    out["source"], out["record"] = sources, numbers
    return out
