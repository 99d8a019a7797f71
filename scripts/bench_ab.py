"""A/B: the same `lmshard prepare` run by two checkouts of lmshard, interleaved, in one run.

    python scripts/bench_ab.py OLD_CHECKOUT [NEW_CHECKOUT] [--runs 3] [--workers 2]

For refactors that must not change speed or bytes: each checkout runs `python -m lmshard
prepare` on the shared corpus (PYTHONPATH pins the checkout, so both use this venv's
packages), alternating A, B, A, B ... so drift on a shared machine hits both equally. Prints the
median wall time of each, the ratio B/A, and whether the two outputs are byte-identical
(shards, index, tokenizer state, and the metadata apart from its run record). Make one
checkout with `git worktree add /tmp/old COMMIT`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import machine, require_corpus

HERE = Path(__file__).resolve().parents[1]


def run(checkout: Path, corpus: Path, out: Path, workers: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "lmshard", "prepare", str(corpus), "--out", str(out), "--overwrite",
           "--workers", str(workers)]  # fmt: skip
    start = time.perf_counter()
    # run outside both checkouts: `python -m` puts the working directory ahead of PYTHONPATH
    subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=out.parent)
    return time.perf_counter() - start


def same_output(a: Path, b: Path) -> list[str]:
    """Files that differ between two dataset directories (metadata compared without `run`)."""
    names = sorted({p.relative_to(a) for p in a.rglob("*") if p.is_file()} |
                   {p.relative_to(b) for p in b.rglob("*") if p.is_file()})  # fmt: skip
    differ = []
    for name in names:
        pa, pb = a / name, b / name
        if not (pa.is_file() and pb.is_file()):
            differ.append(str(name))
        elif name.name == "dataset_metadata.json":
            ma, mb = (json.loads(p.read_text()) for p in (pa, pb))
            for m in (ma, mb):
                m.pop("run", None)
            if ma != mb or list(ma) != list(mb):
                differ.append(str(name))
        elif pa.read_bytes() != pb.read_bytes():
            differ.append(str(name))
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path, nargs="?", default=HERE)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    corpus = require_corpus()
    print(machine())
    times: dict[str, list[float]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        outs = {"A": Path(tmp) / "a", "B": Path(tmp) / "b"}
        for _ in range(args.runs):
            for label, checkout in (("A", args.old), ("B", args.new)):
                times[label].append(run(checkout, corpus, outs[label], args.workers))
        differ = same_output(outs["A"], outs["B"])
    a, b = statistics.median(times["A"]), statistics.median(times["B"])
    print(f"A {args.old}: median {a:.2f} s of {[round(t, 2) for t in times['A']]}")
    print(f"B {args.new}: median {b:.2f} s of {[round(t, 2) for t in times['B']]}")
    print(f"B/A wall time: {b / a:.3f} ({args.workers} workers, {args.runs} alternating runs each)")
    print("outputs byte-identical (metadata apart from its run record)" if not differ else f"DIFFER: {differ}")


if __name__ == "__main__":
    main()
