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


def mds(out):
    from streaming import StreamingDataset
    said = {}
    for split in ("train", "val"):
        ds = StreamingDataset(local=out, split=split, shuffle=False, batch_size=1, validate_hash="xxh64")
        docs = [ds[i]["tokens"] for i in range(len(ds))]
        said[split] = {"docs": [d.tolist() for d in docs], "dtype": str(docs[0].dtype)}
    return said


def olmo(out, eos, name, n_vocab):
    from olmo_core.data import NumpyDatasetDType, NumpyFSLDatasetConfig, TokenizerConfig  # (as docs/interop.md)
    from olmo_core.data.utils import get_document_indices, iter_document_indices, load_array_slice
    dtype, said = getattr(np, name), {}  # (OLMo-core takes a numpy scalar type)
    for split in ("train", "val"):
        docs, scanned = [], []
        for path in sorted(glob.glob(f"{out}/{split}/part-*.npy")):
            for start, end in get_document_indices(path):  # from the .csv.gz beside it
                docs.append(load_array_slice(path, start, end, dtype).tolist())
            scanned += [[int(s), int(e)] for s, e in iter_document_indices(path, eos_token_id=eos, dtype=dtype)]
        said[split] = {"docs": docs, "scanned": scanned}
    config = NumpyFSLDatasetConfig(paths=[f"{out}/train/part-*.npy"], expand_glob=True, sequence_length=16,
                                   tokenizer=TokenizerConfig(vocab_size=n_vocab, eos_token_id=eos, pad_token_id=eos),
                                   dtype=getattr(NumpyDatasetDType, name), work_dir=f"{out}.work")
    fsl = config.build()
    fsl.prepare()
    said["fsl"] = [fsl[i]["input_ids"].tolist() for i in range(len(fsl))]
    return said


jobs = json.loads(open(sys.argv[1]).read())
print(json.dumps({name: (mds(*job[1:]) if job[0] == "mds" else olmo(*job[1:])) for name, job in jobs.items()}))
"""


@pytest.fixture(scope="module")
def read_back(datasets, big_ds, tmp_path_factory):  # noqa: F811
    """Every export these tests check, written here and read back by the real libraries in ONE
    run of the interop environment (its imports take seconds): {name: what the reader said}."""
    if not INTEROP.exists():
        pytest.fail(f"{INTEROP}: the interop environment is missing; `make setup` builds it")
    tmp = tmp_path_factory.mktemp("readers")
    roots = {"gpt2": datasets["after"], "before": datasets["before"], "big": big_ds}
    jobs: dict[str, list] = {}
    for which in ("gpt2", "big"):
        export_dataset(roots[which], "mds", tmp / f"mds-{which}", tokens_per_shard=500)
        jobs[f"mds-{which}"] = ["mds", str(tmp / f"mds-{which}")]
    export_dataset(roots["gpt2"], "mds", tmp / "mds-concat", tokens_per_shard=500, concat_tokens=64)
    jobs["mds-concat"] = ["mds", str(tmp / "mds-concat")]
    for which in ("gpt2", "big", "before"):
        meta = load_metadata(roots[which])
        export_dataset(roots[which], "olmo", tmp / f"olmo-{which}", tokens_per_shard=700)
        jobs[f"olmo-{which}"] = ["olmo", str(tmp / f"olmo-{which}"), meta.tokenizer.eot_id,
                                 "uint16" if which != "big" else "uint32", meta.tokenizer.n_vocab]  # fmt: skip
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    stub = tmp / "placeholder"
    for rel, text in _PLACEHOLDER.items():
        (stub / rel).parent.mkdir(parents=True, exist_ok=True)
        (stub / rel).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(INTEROP), "-c", _READ, str(tmp / "jobs.json")], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(stub)}, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp, roots, json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("which", ["gpt2", "big"])
def test_an_mds_export_reads_back_with_mosaicml_streaming(read_back, which):
    """`export --to mds`: streaming's StreamingDataset (every shard held to its xxh64) gives a
    sample per document, its `tokens` the document as the dataset holds it, uint16 for GPT-2
    and int32 past 65,536 ids, across several shards."""
    tmp, roots, said = read_back
    assert len(list((tmp / f"mds-{which}" / "train").glob("shard.*.mds"))) > 1
    meta = load_metadata(roots[which])
    for split in ("train", "val"):
        want = [d.tolist() for d in truth(roots[which], split, meta.eot_position)]
        assert said[f"mds-{which}"][split]["docs"] == want, split
        assert said[f"mds-{which}"][split]["dtype"] == ("uint16" if which == "gpt2" else "int32")


def test_an_mds_export_with_concat_tokens_reads_back_as_llm_foundry_samples(read_back):
    """`--concat-tokens 64`: streaming reads samples of exactly 64 tokens that are the split's
    concatenated documents in order, the tail shorter than a sample left out (and counted in the
    export's record of its files)."""
    tmp, roots, said = read_back
    meta = load_metadata(roots["gpt2"])
    files = json.loads((tmp / "mds-concat" / "lmshard_export.json").read_text())["files"]
    for split in ("train", "val"):
        stream = flat(truth(roots["gpt2"], split, meta.eot_position))
        whole = len(stream) // 64 * 64
        assert said["mds-concat"][split]["docs"] == stream[:whole].reshape(-1, 64).tolist(), split
        entry = next(f for f in files if f["split"] == split)
        assert (entry["samples"], entry["tail_left_out"]) == (whole // 64, len(stream) - whole)


@pytest.mark.parametrize("which", ["gpt2", "big", "before"])
def test_an_olmo_export_reads_back_with_olmo_core(read_back, which):
    """`export --to olmo`: OLMo-core's get_document_indices (from the dolma .csv.gz metadata) and
    load_array_slice give the split's documents with the EOS after each (moved there from a
    dataset that has it before), across several part files; its scan for EOS finds the same
    boundaries, so the metadata and the arrays agree; NumpyFSLDatasetConfig, as docs/interop.md
    writes it, gives the files' tokens in instances of 16."""
    tmp, roots, said = read_back
    out, root = tmp / f"olmo-{which}", roots[which]
    assert len(list((out / "train").glob("part-*.npy"))) > (1 if which != "big" else 0)
    meta = load_metadata(root)
    dtype = "uint16" if which != "big" else "uint32"
    got = said[f"olmo-{which}"]
    fsl = [np.fromfile(p, dtype=dtype) for p in sorted((out / "train").glob("part-*.npy"))]
    assert got["fsl"] == [t[k * 16 : (k + 1) * 16].tolist() for t in fsl for k in range(len(t) // 16)]
    for split in ("train", "val"):
        docs = truth(root, split, "after")
        assert got[split]["docs"] == [d.tolist() for d in docs], split
        per_file = []
        for path in sorted((out / split).glob("part-*.npy")):
            tokens = np.fromfile(path, dtype=dtype)  # a raw array, no header
            ends = np.flatnonzero(tokens == meta.tokenizer.eot_id) + 1
            per_file += [[int(a), int(b)] for a, b in zip(np.r_[0, ends[:-1]], ends, strict=True)]
        assert got[split]["scanned"] == per_file
