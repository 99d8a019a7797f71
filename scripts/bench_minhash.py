"""Benchmark MinHash near-duplicate signatures: lmshard against datatrove, and lmshard's clustering.

1. Signatures, documents per second of one process (= per core), on the same documents of the
   shared corpus (`--docs`, evenly spaced through it; the corpus is repeated with a salt line
   per copy when more are asked for than it holds):
   (a) lmshard, `band_keys(signature(text, config), config)` per document, default configuration
       (word 5-grams, 22 bands × 5 rows = 110 uint32 values);
   (b) the same with datatrove's layout, `MinHashConfig(bands=14, rows=8)`;
   (c) datatrove's `MinhashDedupSignature` with its default configuration (5-grams, 14 buckets ×
       8 hashes, 64-bit xxhash, English word tokenizer), per document what its `run` loop does
       before writing: `get_shingles(text)`, then `get_signature(shingles)` when there are any.
       The writing of its bucket files and their sorting are not timed.
   datatrove runs in a virtual environment of its own (`--datatrove-python`; `make bench` makes
   one), as a worker process that loads the same documents and times one pass when asked, so
   that (a), (b) and (c) alternate `--repeats` times on the same cores. Reported: medians, and
   the median of the per-round ratios lmshard ÷ datatrove.
2. Clustering: `near_duplicates` on synthetic signatures (default 1 M documents, 5% of them
   near-copies of an earlier one with value agreement uniform in [0.75, 1]), read from a memory
   map as prepare's signature files are: seconds, and the peak of the memory it allocates
   (tracemalloc, a second run), per million documents; removed against the expected count.
3. Signature storage per million documents, lmshard's and datatrove's.

    python scripts/bench_minhash.py [--no-write] [--docs 4000] [--repeats 3]
        [--cluster-docs 1000000] [--datatrove-python PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import load, load_texts, machine, update_performance_md  # noqa: E402

CORPUS_DOCS = 8847  # records in linux-docs.jsonl.gz
DEFAULT_DATATROVE = Path(__file__).resolve().parents[1] / ".venv" / "bench-datatrove" / "bin" / "python"


def documents(n: int) -> list[str]:
    """`n` documents evenly spaced through the corpus (repeated, salted, when n exceeds it)."""
    texts = load_texts(max(1, math.ceil(n / CORPUS_DOCS)))
    step = len(texts) / n
    return [texts[int(i * step)] for i in range(n)]


# ---- datatrove's side: runs under its own interpreter, imports no lmshard ----


def datatrove_worker(n: int) -> None:
    """Answer "time" on stdin with one timed pass (JSON on stdout), until stdin closes."""
    from importlib.metadata import version

    from datatrove.pipeline.dedup.minhash import MinhashDedupSignature

    texts = documents(n)
    stage = MinhashDedupSignature(output_folder=tempfile.mkdtemp(prefix="dt-minhash-"))
    _datatrove_pass(stage, texts[:50])  # loads spaCy's tokenizer
    print(json.dumps({"version": version("datatrove"), "config": str(stage.config)}), flush=True)
    for line in sys.stdin:
        if line.strip() == "time":
            print(json.dumps(_datatrove_pass(stage, texts)), flush=True)


def _datatrove_pass(stage, texts: list[str]) -> dict[str, float]:  # type: ignore[no-untyped-def]
    shingling = hashing = 0.0
    signed = 0
    for text in texts:
        t0 = time.perf_counter()
        shingles = stage.get_shingles(text)
        t1 = time.perf_counter()
        if shingles.size != 0:  # as MinhashDedupSignature.run: documents without shingles get none
            stage.get_signature(shingles)
            signed += 1
        hashing += time.perf_counter() - t1
        shingling += t1 - t0
    return {"seconds": shingling + hashing, "shingles": shingling, "signature": hashing, "signed": signed}


class Datatrove:
    """The worker process, or None where datatrove's interpreter is missing (said why)."""

    def __init__(self, python: Path, n: int) -> None:
        self.proc = subprocess.Popen([str(python), __file__, "--datatrove-worker", "--docs", str(n)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError(f"{python} could not run datatrove's MinhashDedupSignature (see its error above)")
        info = json.loads(ready)
        self.version, self.config = info["version"], info["config"]

    def time(self) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("time\n")
        self.proc.stdin.flush()
        return dict(json.loads(self.proc.stdout.readline()))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def start_datatrove(python: Path, n: int) -> tuple[Datatrove | None, str]:
    if not python.is_file():
        return None, (f"datatrove not measured: no interpreter at {python} (`make bench` creates one with "
                      "datatrove in it; or pass --datatrove-python)")  # fmt: skip
    try:
        return Datatrove(python, n), ""
    except (RuntimeError, ValueError) as e:
        return None, f"datatrove not measured: {e}"


# ---- lmshard's side ----


def lmshard_pass(texts: list[str], config) -> float:  # type: ignore[no-untyped-def]
    from lmshard.quality.minhash import band_keys, signature

    started = time.perf_counter()
    for text in texts:
        band_keys(signature(text, config), config)
    return time.perf_counter() - started


def lmshard_parts(texts: list[str], config) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Seconds in each step over the texts: a pass of its own, for the shares only."""
    from lmshard.quality.minhash import band_keys, shingles, signature_of

    seeds = config.seeds()
    parts = dict.fromkeys(("shingles", "signature", "band keys"), 0.0)
    for text in texts:
        t0 = time.perf_counter()
        sh = shingles(text, config.n_grams)
        t1 = time.perf_counter()
        sig = signature_of(sh, seeds)
        t2 = time.perf_counter()
        band_keys(sig, config)
        parts["shingles"] += t1 - t0
        parts["signature"] += t2 - t1
        parts["band keys"] += time.perf_counter() - t2
    return parts


def section_signatures(n: int, repeats: int, python: Path) -> list[str]:
    from lmshard.quality.minhash import MinHashConfig

    texts = documents(n)
    configs = {"lmshard 22×5 (default)": MinHashConfig(), "lmshard 14×8": MinHashConfig(bands=14, rows=8)}
    dt, why = start_datatrove(python, n)
    for config in configs.values():
        lmshard_pass(texts[:50], config)  # warm: imports, seeds, the character table
    rates: dict[str, list[float]] = {name: [] for name in configs}
    dt_runs: list[dict[str, float]] = []
    for r in range(repeats):  # alternated: a shared machine's load hits every side alike
        for name, config in configs.items():
            rates[name].append(n / lmshard_pass(texts, config))
        if dt is not None:
            dt_runs.append(dt.time())
        line = ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items())
        print(f"1. round {r + 1}: {line}" + (f", datatrove {n / dt_runs[-1]['seconds']:,.0f} docs/s" if dt_runs else ""),
              flush=True)  # fmt: skip
    parts = {name: lmshard_parts(texts, config) for name, config in configs.items()}
    if dt is not None:
        dt.close()
    return _signature_table(n, rates, parts, dt, dt_runs, why)


def _signature_table(n: int, rates: dict[str, list[float]], parts: dict[str, dict[str, float]], dt: Datatrove | None,
                     dt_runs: list[dict[str, float]], why: str) -> list[str]:  # fmt: skip
    dt_rates = [n / run["seconds"] for run in dt_runs]
    head = "| signatures of | docs/s, one core (median) | share of the time: shingles / signature / band keys |"
    rows = [
        head + (" ÷ datatrove (median of rounds) |" if dt_rates else ""),
        "|---|---|---|" + ("---|" if dt_rates else ""),
    ]
    for name, got in rates.items():
        p = parts[name]
        steps = " / ".join(f"{p[k] / sum(p.values()):.0%}" for k in ("shingles", "signature", "band keys"))
        ratio = statistics.median(a / b for a, b in zip(got, dt_rates, strict=True)) if dt_rates else 0
        rows.append(
            f"| {name} | {statistics.median(got):,.0f} | {steps} |" + (f" **{ratio:.1f}×** |" if dt_rates else "")
        )
    if dt is not None:
        sh = statistics.median(run["shingles"] / run["seconds"] for run in dt_runs)
        rows.append(f"| datatrove {dt.version} MinhashDedupSignature, 14×8 | {statistics.median(dt_rates):,.0f} | "
                    f"{sh:.0%} / {1 - sh:.0%} / none (it writes the values) | 1 |")  # fmt: skip
        signed = int(dt_runs[0]["signed"])
        note = (f"datatrove {dt.version} ({dt.config}): `get_shingles` then `get_signature` per document, as its "
                f"stage's `run` does before writing ({signed:,} of {n:,} documents had shingles), in a worker "
                "process of its own virtual environment; its bucket files are not written.")  # fmt: skip
    else:
        note = why
    return [f"{n:,} documents evenly spaced through the corpus; each side one process, alternated, "
            f"{len(next(iter(rates.values())))} rounds. lmshard: `band_keys(signature(text, config), config)` per "
            f"document. {note}", "", *rows]  # fmt: skip


SIGNATURES_NOTE = (
    "Where the time goes: datatrove splits the words with its English tokenizer (spaCy), hashes the text "
    "of each 5-gram with xxhash in a Python loop, then takes 112 values per shingle as (a·h + b) mod 2^61 "
    "- 1 in uint64; lmshard normalises the text through one character table, hashes each word once "
    "(xxh3), builds each 5-gram's hash from its words' hashes in numpy, and mixes 110 seeded values per "
    "shingle with 64-bit integer operations."
)


# ---- clustering ----


def planted(n: int, config, share: float = 0.05, seed: int = 0) -> tuple[np.ndarray, float]:  # type: ignore[no-untyped-def]
    """Random signatures with `share` of the documents near-copies of an earlier original (each
    value kept with probability uniform in [0.75, 1]); and how many of the copies the
    configuration is expected to find."""
    rng = np.random.default_rng(seed)
    sig = rng.integers(0, 2**32, size=(n, config.n_hashes), dtype=np.uint32)
    k = int(n * share)
    copies = np.sort(rng.choice(np.arange(1, n), k, replace=False))
    originals = np.setdiff1d(np.arange(n), copies)  # document 0 is one: every copy has an earlier original
    bases = originals[(rng.random(k) * np.searchsorted(originals, copies)).astype(np.int64)]
    agree = rng.uniform(0.75, 1.0, k)
    chunk = 1 << 16  # copies at a time: the mask is n_hashes bytes per copy
    for a in range(0, k, chunk):
        c, b, p = copies[a : a + chunk], bases[a : a + chunk], agree[a : a + chunk]
        keep = rng.random((len(c), config.n_hashes)) < p[:, None]
        sig[c] = np.where(keep, sig[b], sig[c])
    return sig, float(sum(config.detection_probability(float(p)) for p in agree))


def section_clustering(sizes: list[int]) -> list[str]:
    from lmshard.quality.minhash import MinHashConfig
    from lmshard.quality.near import near_duplicates

    config = MinHashConfig()
    rows = ["| documents | near-copies planted | removed (expected) | seconds | per million documents | peak allocated "
            "| per million documents |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        for n in sizes:
            sig, expected = planted(n, config)
            path = Path(d) / "signatures.npy"
            np.save(path, sig)
            del sig
            mapped = np.load(path, mmap_mode="r")
            started = time.perf_counter()
            removed, _ = near_duplicates(mapped, config)
            seconds = time.perf_counter() - started
            tracemalloc.start()  # a second run: tracing slows the allocations it counts
            near_duplicates(mapped, config)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            del mapped
            m = n / 1e6
            print(f"2. {n:,} documents: {seconds:.2f} s, peak {peak / 1e6:,.0f} MB, removed {len(removed):,} "
                  f"(expected {expected:,.0f})", flush=True)  # fmt: skip
            rows.append(f"| {n:,} | {n // 20:,} | {len(removed):,} ({expected:,.0f}) | {seconds:.2f} | "
                        f"**{seconds / m:.1f} s** | {peak / 1e6:,.0f} MB | **{peak / 1e6 / m:,.0f} MB** |")  # fmt: skip
    return ["`near_duplicates` (22×5, threshold 0.7) over uint32 signatures read from a memory-mapped .npy file, one "
            "process. Peak allocated: the most memory it held at once (numpy's allocations, traced), the mapped "
            "signatures not included; the page cache holds those (the storage below).", "", *rows]  # fmt: skip


def section_storage() -> list[str]:
    lm = 22 * 5 * 4
    lm148 = 14 * 8 * 4
    dt = 14 * (8 * 8 + 4)  # per bucket: 8 uint64 hashes and a uint32 document index
    return ["| signatures | bytes per document | per million documents |", "|---|---|---|",
            f"| lmshard 22×5: 110 uint32 | {lm} | {lm} MB |",
            f"| lmshard 14×8: 112 uint32 | {lm148} | {lm148} MB |",
            f"| datatrove 14×8, 64-bit: 14 records of 8 uint64 + a uint32 document index | {dt} | {dt} MB |"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/performance.md alone")
    parser.add_argument("--docs", type=int, default=4000, help="documents per signature pass")
    parser.add_argument("--repeats", type=int, default=3, help="alternated rounds of (a), (b), (c)")
    parser.add_argument("--cluster-docs", type=int, nargs="+", default=[250_000, 1_000_000])
    parser.add_argument("--datatrove-python", type=Path, default=Path(os.environ.get("LMSHARD_BENCH_DATATROVE",
                        DEFAULT_DATATROVE)), help="an interpreter with datatrove, spaCy and xxhash installed")  # fmt: skip
    parser.add_argument("--datatrove-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.datatrove_worker:
        return datatrove_worker(args.docs)
    print(f"{machine()}, load {load()}", flush=True)
    sigs = section_signatures(args.docs, args.repeats, args.datatrove_python)
    clusters = section_clustering(args.cluster_docs)
    body = [f"{machine()}; load average (1 min) {load()} at the end. Command: `make bench` "
            "(`python scripts/bench_minhash.py`).", "", "### signatures per document", "", *sigs, "", SIGNATURES_NOTE, "",
            "### clustering", "", *clusters, "", "### signature storage", "", *section_storage()]  # fmt: skip
    print("\n".join(body))
    if not args.no_write:
        update_performance_md("near-duplicate signatures (scripts/bench_minhash.py)", "\n".join(body))


if __name__ == "__main__":
    main()
