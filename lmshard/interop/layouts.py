"""Other trainers' on-disk token formats, as constants and small header codecs.

Each layout was checked against the code that reads it:

- nanoGPT (`data/openwebtext/prepare.py`, `train.py`): `train.bin` / `val.bin`, raw uint16
  tokens, no header, the EOT token after each document, read with `np.memmap(..., np.uint16)`.
- llm.c (`dev/data/data_common.py`, `dev/data/fineweb.py`, `llmc/dataloader.h`,
  `train_llama3.py`): a header of 256 little-endian int32 (magic, version, token count, zeros),
  then the tokens: magic 20240520 version 1 with uint16 tokens (GPT-2), magic 20240801 version 7
  with uint32 tokens (Llama 3); the EOT token *before* each document; files
  `NAME_val_000000.bin`, `NAME_train_000001.bin`, ... (one counter, val first), 10^8 tokens each.
- modded-nanogpt (`data/fineweb.py`, `train_gpt.py`): the llm.c version-1 header and uint16
  tokens only; the EOT token (its BOS_ID) at each document start; `fineweb_val_000000.bin`,
  `fineweb_train_000001.bin`, ...
- Megatron-LM (`megatron/core/datasets/indexed_dataset.py`): `PREFIX.bin` holds the tokens,
  `PREFIX.idx` is magic `MMIDIDX\\x00\\x00`, uint64 version 1, uint8 dtype code, uint64 sequence
  count, uint64 document-index count (documents + 1), then int32 sequence lengths, int64
  sequence byte offsets, int64 document indices (0, then the end of each document in sequences).
  `--append-eod` puts the EOD token after each document's text; the token dtype is uint16 (code
  8) for vocabularies below 65,500 ids (`DType.optimal_dtype`), else int32 (code 4).
- Hugging Face `datasets` (`save_to_disk`, `load_from_disk`): a `DatasetDict` of splits `train`
  and `validation`, each a row per document with one column `input_ids` (a list of int32: the
  document's tokens with its separators, as the dataset holds them), written by `datasets`
  itself.

Memory model: constants and 1 KiB headers.
"""

from __future__ import annotations

import struct

import numpy as np

from ..errors import InputError

FORMATS = ("nanogpt", "llmc", "modded-nanogpt", "megatron", "hf", "litdata", "mds", "olmo")  # (last three: chunked.py)
UINT16_IDS = 1 << 16  # a uint16 token holds ids 0 .. 65,535

# llm.c: 256 int32 values before the tokens.
LLMC_HEADER_INTS = 256
LLMC_HEADER_BYTES = LLMC_HEADER_INTS * 4
LLMC_V1 = (20240520, 1, np.dtype("<u2"))  # GPT-2: uint16 tokens
LLMC_V7 = (20240801, 7, np.dtype("<u4"))  # Llama 3: uint32 tokens
LLMC_MAX_TOKENS = (1 << 31) - 1  # the count is an int32
LLMC_TOKENS_PER_SHARD = 100_000_000  # dev/data/fineweb.py --shard_size default

# Megatron-LM IndexedDataset.
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_VERSION = 1
MEGATRON_HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequences, document-index entries
# Megatron's DType codes of the integer types (6, 7 are float64, float32; uint32 has no code)
MEGATRON_CODES: dict[int, np.dtype] = {1: np.dtype("u1"), 2: np.dtype("i1"), 3: np.dtype("<i2"), 4: np.dtype("<i4"),
                                       5: np.dtype("<i8"), 8: np.dtype("<u2")}  # fmt: skip
MEGATRON_UINT16_BELOW = 65_500  # DType.optimal_dtype: uint16 below this vocabulary size, else int32


def llmc_header(magic: int, version: int, n_tokens: int) -> bytes:
    header = np.zeros(LLMC_HEADER_INTS, dtype="<i4")
    header[:3] = magic, version, n_tokens
    return header.tobytes()


def megatron_dtype(n_vocab: int) -> tuple[int, np.dtype]:
    """The (code, dtype) Megatron's preprocess_data.py picks for a vocabulary of `n_vocab` ids."""
    return (8, MEGATRON_CODES[8]) if n_vocab < MEGATRON_UINT16_BELOW else (4, MEGATRON_CODES[4])


def read_megatron_header(path: str, data: bytes) -> tuple[np.dtype, int, int]:
    """(token dtype, sequence count, document-index entries) from the first bytes of a .idx;
    InputError, naming the file, for anything Megatron's reader would refuse."""
    if len(data) < MEGATRON_HEADER.size:
        raise InputError(f"{path}: {len(data)} bytes, too short for a Megatron index header")
    magic, version, code, n_seq, n_doc_idx = MEGATRON_HEADER.unpack(data[: MEGATRON_HEADER.size])
    if magic != MEGATRON_MAGIC:
        raise InputError(f"{path}: not a Megatron .idx (magic {magic!r}, expected {MEGATRON_MAGIC!r})")
    if version != MEGATRON_VERSION:
        raise InputError(f"{path}: Megatron index version {version}, this lmshard reads {MEGATRON_VERSION}")
    if code not in MEGATRON_CODES:
        raise InputError(f"{path}: dtype code {code} is not an integer token type (codes {sorted(MEGATRON_CODES)})")
    return MEGATRON_CODES[code], n_seq, n_doc_idx
