"""Llama 3's vocabulary at GPT-2's cost, in one run: the start-up of `lmshard prepare` on one
record, its rate on ~19 MB and ~62 MB of the shared corpus against `tokenizers`' own
encode_batch, and the peak memory of its process tree against GPT-2's on the same text.

    python scripts/bench_llama.py [--repeats 3] [--no-write]

- start-up: median wall time of `lmshard prepare` on a one-record file (interpreter, imports,
  tokenizer load with its gate passed before, writing), GPT-2 (tiktoken vocabulary) and Llama 3
  (tokenizer.json, backend auto);
- rate: `lmshard prepare --workers <cores>` wall time, as tokens/s of document text, against
  `tokenizers`' encode_batch of the same texts in one warm process with as many threads (its
  load not counted), medians of `repeats` alternated runs;
- memory: the peak of the sum of VmRSS over the prepare process and its workers (each process's
  RSS counts the pages it shares with the others: the sum is an upper bound) and of their PSS
  (shared pages split between the processes that share them: what the machine spends), sampled
  every 50 ms, GPT-2 and Llama 3 on the ~19 MB text.

Llama 3's tokenizer.json comes from a package on the index, pinned by sha256
(bench_tokenizers.REAL_VOCABULARIES); without it the benchmark says so and stops.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tokenizers import ENV, LMSHARD, REAL_VOCABULARIES, prepare, raw_rate, real_vocabulary, write_jsonl  # noqa: E402
from benchlib import load, load_texts, machine, run_measuring_memory, update_performance_md  # noqa: E402


def texts_of(mb: float) -> list[str]:
    out, size = [], 0
    for t in load_texts(2):
        if size >= mb * 1e6:
            break
        out.append(t)
        size += len(t.encode())
    return out


def tree_memory(cmd: list[str]) -> tuple[float, float]:
    """(peak summed VmRSS, peak summed PSS) in MB of a command's process tree."""
    _, _, rss, pss = run_measuring_memory(cmd, env=ENV)
    return rss / 2**20, pss / 2**20


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=ENV, capture_output=True, check=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    label, req, member, sha = REAL_VOCABULARIES[0]
    llama = real_vocabulary(req, member, sha)
    if llama is None:
        raise SystemExit(f"{label}'s tokenizer.json could not be had from the index; nothing measured")
    cores = os.cpu_count() or 1
    print(f"{machine()}; load average {load()}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        one = write_jsonl(tmp / "one.jsonl", ["one small record"])
        inputs = {mb: write_jsonl(tmp / f"t{mb}.jsonl", texts_of(mb)) for mb in (19, 62)}
        vocab = {"GPT-2": [], "Llama 3": ["--tokenizer", str(llama)]}
        for extra in vocab.values():  # the gate, once per installation: not in the figures
            subprocess.run([LMSHARD, "prepare", str(one), "--out", str(tmp / "warm"), "--overwrite", *extra], env=ENV,
                           capture_output=True, check=True)  # fmt: skip
        start = {k: [] for k in vocab}
        for _ in range(max(5, args.repeats)):
            for k, extra in vocab.items():
                start[k].append(wall([LMSHARD, "prepare", str(one), "--out", str(tmp / "s"), "--overwrite", *extra]))
        s = {k: statistics.median(v) for k, v in start.items()}
        print(f"start-up: GPT-2 {s['GPT-2']:.2f} s, Llama 3 {s['Llama 3']:.2f} s (+{s['Llama 3'] - s['GPT-2']:.2f} s)",
              flush=True)  # fmt: skip
        rates = {}
        for mb, src in inputs.items():
            base, ours = [], []
            for _ in range(args.repeats):
                base.append(raw_rate("hf", str(llama), src, 1, threads=cores, whole=True))
                ours.append(prepare(src, tmp / "p", "--tokenizer", str(llama), "--workers", str(cores))["tps"])
            rates[mb] = (statistics.median(base), statistics.median(ours))
            b, o = rates[mb]
            print(f"{mb} MB: encode_batch {b / 1e6:.2f} M tok/s, prepare {o / 1e6:.2f} M tok/s = {o / b:.2f}x",
                  flush=True)  # fmt: skip
        memory = {}
        for k, extra in vocab.items():
            runs = [tree_memory([LMSHARD, "prepare", str(inputs[19]), "--out", str(tmp / "m"), "--overwrite",
                                 "--workers", str(cores), *extra]) for _ in range(2)]  # fmt: skip
            memory[k] = (max(r[0] for r in runs), max(r[1] for r in runs))
            print(f"memory, {k}: tree RSS {memory[k][0]:.0f} MB, tree PSS {memory[k][1]:.0f} MB", flush=True)
    g, m = memory["GPT-2"], memory["Llama 3"]
    table = "\n".join([
        f"Machine: {machine()}; load average {load()} after the run. Llama 3.1/3.2's tokenizer.json (backend auto: "
        f"splintr, {cores} workers) against GPT-2's vocabulary and against `tokenizers`' encode_batch (one warm "
        f"process, {cores} threads, its load not counted). Command: `python scripts/bench_llama.py` (`make bench`).",
        "", "| measured | GPT-2 | Llama 3 | Llama 3 against the other |", "|---|---|---|---|",
        f"| start-up: prepare of one record (median of {len(start['GPT-2'])}) | {s['GPT-2']:.2f} s | "
        f"{s['Llama 3']:.2f} s | **+{s['Llama 3'] - s['GPT-2']:.2f} s** |",
        *[f"| prepare of {mb} MB, M tokens/s (median of {args.repeats}) | | {o / 1e6:.2f} | **{o / b:.2f}×** "
          f"encode_batch's {b / 1e6:.2f} |" for mb, (b, o) in rates.items()],
        f"| peak memory of the process tree, summed VmRSS (19 MB) | {g[0]:.0f} MB | {m[0]:.0f} MB | **{m[0] / g[0]:.2f}×** |",
        f"| the same, summed PSS | {g[1]:.0f} MB | {m[1]:.0f} MB | **{m[1] / g[1]:.2f}×** |", "",
        "Llama 3's tokenizer.json is read by splintr as a ranks table (tokenizers/hf_ranks.py), its facts are "
        "remembered per file (tokenizers/hf_cache.py), and splintr's tables are loaded before the workers fork, "
        "shared with them.",
    ])  # fmt: skip
    print(table)
    if not args.no_write:
        update_performance_md("Llama 3 at GPT-2's cost (scripts/bench_llama.py)", table)


if __name__ == "__main__":
    main()
