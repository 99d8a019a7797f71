"""Exports read back by the real libraries that do not install beside lmshard's own packages:
MosaicML `streaming` (numpy < 2.2, transformers < 5) and OLMo-core (rich < 14). `make setup`
builds them an environment of their own (.venv/interop: its own torch, the same CPU build); the
readers run there as a subprocess and print what they read, which is compared here with the
documents read with numpy from the dataset's own files.

streaming imports torchvision for its image datasets, at `import streaming`; PyPI's torchvision
is built against CUDA torch and cannot load beside the CPU build, so the interop environment has
none, and the reader gets a placeholder package with the three names streaming's vision module
imports (nothing of it is used to read MDS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_hf_tokenizer import big  # noqa: F401
from test_interop import (  # noqa: F401  (the module-scoped datasets)
    big_ds,  # noqa: F401
    datasets,
    flat,
    truth,
)

from lmshard.format import load_metadata
from lmshard.interop import export_dataset

INTEROP = Path(os.environ.get("LMSHARD_INTEROP_PYTHON", Path(sys.prefix) / "interop" / "bin" / "python"))

_PLACEHOLDER = {
    "torchvision/__init__.py": "",
    "torchvision/datasets.py": "class VisionDataset: pass\nclass CIFAR10: pass\n",
    "torchvision/transforms/__init__.py": "",
    "torchvision/transforms/functional.py": "def to_tensor(x): raise NotImplementedError\n",
}

_READ = """
import glob, json, sys
import numpy as np
out, which = sys.argv[1], sys.argv[2]
said = {}
if which == "mds":
    from streaming import StreamingDataset
    for split in ("train", "val"):
        ds = StreamingDataset(local=out, split=split, shuffle=False, batch_size=1, validate_hash="xxh64")
        docs = [ds[i]["tokens"] for i in range(len(ds))]
        said[split] = {"docs": [d.tolist() for d in docs], "dtype": str(docs[0].dtype)}
else:
    from olmo_core.data.utils import get_document_indices, iter_document_indices, load_array_slice
    eos, dtype = int(sys.argv[3]), getattr(np, sys.argv[4])  # (OLMo-core takes a numpy scalar type)
    for split in ("train", "val"):
        docs, scanned = [], []
        for path in sorted(glob.glob(f"{out}/{split}/part-*.npy")):
            for start, end in get_document_indices(path):  # from the .csv.gz beside it
                docs.append(load_array_slice(path, start, end, dtype).tolist())
            scanned += [[int(s), int(e)] for s, e in iter_document_indices(path, eos_token_id=eos, dtype=dtype)]
        said[split] = {"docs": docs, "scanned": scanned}
    from olmo_core.data import NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig  # (as docs/interop.md)
    config = NumpyFSLDatasetConfig(paths=[f"{out}/train/part-*.npy"], expand_glob=True, sequence_length=16,
                                   tokenizer=TokenizerConfig(vocab_size=int(sys.argv[5]), eos_token_id=eos,
                                                             pad_token_id=eos),
                                   dtype=getattr(NumpyDatasetDType, sys.argv[4]), work_dir=f"{out}.work")
    fsl = config.build()
    fsl.prepare()
    said["fsl"] = [fsl[i]["input_ids"].tolist() for i in range(len(fsl))]
print(json.dumps(said))
"""


def _read(out: Path, which: str, tmp_path: Path, *args: str) -> dict:
    if not INTEROP.exists():
        pytest.fail(f"{INTEROP}: the interop environment is missing; `make setup` builds it")
    stub = tmp_path / "placeholder"
    for rel, text in _PLACEHOLDER.items():
        (stub / rel).parent.mkdir(parents=True, exist_ok=True)
        (stub / rel).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(INTEROP), "-c", _READ, str(out), which, *args], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(stub)}, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("which", ["gpt2", "big"])
def test_an_mds_export_reads_back_with_mosaicml_streaming(datasets, big_ds, which, tmp_path):  # noqa: F811
    """`export --to mds`: streaming's StreamingDataset (every shard held to its xxh64) gives a
    sample per document, its `tokens` the document as the dataset holds it, uint16 for GPT-2
    and int32 past 65,536 ids, across several shards."""
    root = datasets["after"] if which == "gpt2" else big_ds
    export_dataset(root, "mds", tmp_path / "mds", tokens_per_shard=500)
    assert len(list((tmp_path / "mds" / "train").glob("shard.*.mds"))) > 1
    said = _read(tmp_path / "mds", "mds", tmp_path)
    meta = load_metadata(root)
    for split in ("train", "val"):
        want = [d.tolist() for d in truth(root, split, meta.eot_position)]
        assert said[split]["docs"] == want, split
        assert said[split]["dtype"] == ("uint16" if which == "gpt2" else "int32")


@pytest.mark.parametrize("which", ["gpt2", "big", "before"])
def test_an_olmo_export_reads_back_with_olmo_core(datasets, big_ds, which, tmp_path):  # noqa: F811
    """`export --to olmo`: OLMo-core's get_document_indices (from the dolma .csv.gz metadata) and
    load_array_slice give the split's documents with the EOS after each (moved there from a
    dataset that has it before), across several part files; its scan for EOS finds the same
    boundaries, so the metadata and the arrays agree; NumpyFSLDatasetConfig, as docs/interop.md
    writes it, gives the files' tokens in instances of 16."""
    root = {"gpt2": datasets["after"], "before": datasets["before"], "big": big_ds}[which]
    export_dataset(root, "olmo", tmp_path / "olmo", tokens_per_shard=700)
    assert len(list((tmp_path / "olmo" / "train").glob("part-*.npy"))) > (1 if which != "big" else 0)
    meta = load_metadata(root)
    dtype = "uint16" if which != "big" else "uint32"
    said = _read(tmp_path / "olmo", "olmo", tmp_path, str(meta.tokenizer.eot_id), dtype, str(meta.tokenizer.n_vocab))
    fsl = [np.fromfile(p, dtype=dtype) for p in sorted((tmp_path / "olmo" / "train").glob("part-*.npy"))]
    assert said["fsl"] == [t[k * 16 : (k + 1) * 16].tolist() for t in fsl for k in range(len(t) // 16)]
    for split in ("train", "val"):
        docs = truth(root, split, "after")
        assert said[split]["docs"] == [d.tolist() for d in docs], split
        per_file = []
        for path in sorted((tmp_path / "olmo" / split).glob("part-*.npy")):
            tokens = np.fromfile(path, dtype=dtype)  # a raw array, no header
            ends = np.flatnonzero(tokens == meta.tokenizer.eot_id) + 1
            per_file += [[int(a), int(b)] for a, b in zip(np.r_[0, ends[:-1]], ends, strict=True)]
        assert said[split]["scanned"] == per_file
        assert sum(len(d) for d in docs) == len(flat(docs))


def test_an_mds_export_with_concat_tokens_reads_back_as_llm_foundry_samples(datasets, tmp_path):  # noqa: F811
    """`--concat-tokens 64`: streaming reads samples of exactly 64 tokens that are the split's
    concatenated documents in order, the tail shorter than a sample left out and counted."""
    root = datasets["after"]
    result = export_dataset(root, "mds", tmp_path / "mds", tokens_per_shard=500, concat_tokens=64)
    said = _read(tmp_path / "mds", "mds", tmp_path)
    meta = load_metadata(root)
    for split in ("train", "val"):
        stream = flat(truth(root, split, meta.eot_position))
        whole = len(stream) // 64 * 64
        assert said[split]["docs"] == stream[:whole].reshape(-1, 64).tolist(), split
        entry = next(f for f in result.files if f["split"] == split)
        assert (entry["samples"], entry["tail_left_out"]) == (whole // 64, len(stream) - whole)
