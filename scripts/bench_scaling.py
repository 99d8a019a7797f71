"""How `lmshard prepare` scales with cores and with tasks, against the tokenizer's own ceiling.

1. Workers: tokens/s of `prepare --workers W` for W = 1, 2, 4, ... up to the cores this process
   may use, each beside the ceiling at the same process count in the same run: W processes
   that only encode the same texts with the same backend (`load_tokenizer("gpt2", "auto")`,
   `encode_batch` per ~1 MiB batch, texts already in memory). Input: the shared corpus ×4
   (distinct copies: a salt line per copy), uncompressed JSON lines.
2. The coordinator's share: CPU seconds of prepare's main process divided by its worker
   processes' (getrusage of the process and of its reaped children, in a wrapper that runs the
   command line in-process).
3. A cluster on one machine: N = 1, 2, 4, 8 tasks with a fixed amount of data per task (one
   corpus copy each), planned with `--executor none` and each task run alone with
   `lmshard run-task`, as separate nodes would: the longest task of each stage (tokenize, dedup,
   select, write) and the finish, each beside its time at N = 1. A stage whose longest task
   grows with N does work that grows with the total data. (Each `run-task` is a fresh process:
   its start and the vocabulary load are in every figure. The page cache is synced before each
   task, as if it ran on a node of its own: a task's fsyncs then wait for its own writes only,
   not for those of the tasks run before it on this one disk.)

Prints ratios measured in one run; writes the `scaling` section of docs/performance.md unless
--no-write.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

from benchlib import WRAPPER, compile_package, load, load_texts, machine, run_measuring_cpu, update_performance_md

from lmshard.prepare.config import available_cpus  # the cores prepare's --workers 0 would use

LMSHARD = [sys.executable, "-m", "lmshard"]
BATCH_CHARS = 1 << 20  # characters per encode_batch call in the ceiling, about a work item's text
UNIT = 8 << 20  # bytes per unit of a planned run (LMSHARD_UNIT_BYTES): several units per corpus copy



def write_corpus(path: Path, copies: int) -> tuple[Path, list[str]]:
    texts = load_texts(copies)
    with open(path, "w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"id": i, "text": t}) + "\n")
    return path, texts


def batches(texts: list[str]) -> list[list[str]]:
    out, cur, size = [], [], 0
    for t in texts:
        cur.append(t)
        size += len(t)
        if size >= BATCH_CHARS:
            out.append(cur)
            cur, size = [], 0
    return out + ([cur] if cur else [])


_tok = None


def _init() -> None:
    global _tok
    from lmshard.tokenizers import load_tokenizer

    _tok = load_tokenizer("gpt2", "auto", threads=1)


def _encode(batch: list[str]) -> int:
    assert _tok is not None
    tokens, _ = _tok.encode_batch(batch)
    return len(tokens)


def ceiling(texts: list[str], procs: int) -> tuple[float, int]:
    """(tokens/s, tokens): `procs` warm processes encoding the texts, nothing else."""
    work = batches(texts)
    with get_context("fork").Pool(procs, initializer=_init) as pool:
        pool.map(_encode, work[:procs])  # warm: vocabulary loaded, first encode done
        start = time.perf_counter()
        n = sum(pool.imap_unordered(_encode, work))
        sec = time.perf_counter() - start
    return n / sec, n


def prepare(src: Path, out: Path, workers: int, env: dict[str, str],
            extra: tuple[str, ...] = ()) -> tuple[float, dict[str, float], int]:  # fmt: skip
    """(wall seconds, CPU seconds of the main process and its workers, tokens) of one prepare."""
    usage = out.with_suffix(".rusage.json")
    cmd = [sys.executable, "-c", WRAPPER, "prepare", str(src), "--out", str(out), "--workers", str(workers),
           "--quiet", *extra]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env | {"RUSAGE_OUT": str(usage)})
    sec = time.perf_counter() - start
    meta = json.loads((out / "dataset_metadata.json").read_text())
    return sec, json.loads(usage.read_text()), int(meta["n_tokens"])


PEAK: dict[str, float] = {}  # stage -> the largest peak RSS (MiB) of any of its tasks


def run_task(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `lmshard run-task`; its peak RSS goes to PEAK."""
    usage = Path(tempfile.mktemp(suffix=".rusage.json"))
    os.sync()  # as on a node of its own: no other task's writes left to flush when this one fsyncs its own
    sec, used = run_measuring_cpu(args, env, usage)
    stage = args[args.index("--stage") + 1]
    PEAK[stage] = max(PEAK.get(stage, 0.0), used["main_rss_mb"])
    usage.unlink()
    return sec, used["main"] + used["children"]


def section_workers(t: Path, env: dict[str, str], copies: int = 4) -> tuple[list[str], list[str]]:
    src, texts = write_corpus(t / f"x{copies}.jsonl", copies)
    counts = [w for w in (1, 2, 4, 8, 16, 32, 64) if w <= available_cpus()]
    rows = ["| workers | ceiling (M tok/s) | prepare (M tok/s) | ratio | main process CPU / workers' CPU | peak RSS: "
            "main, largest worker |", "|---|---|---|---|---|---|"]  # fmt: skip
    printed = []
    for w in counts:
        c_rate, _ = ceiling(texts, w)
        sec, cpu, tokens = prepare(src, t / f"w{w}", w, env)
        rate = tokens / sec
        # --workers 1 does everything in the main process: no workers, so no share
        share = f"{100 * cpu['main'] / cpu['children']:.0f}%" if cpu["children"] > 0.05 else "— (no worker processes)"
        rss = f"{cpu['main_rss_mb']:.0f} MiB, {cpu['child_rss_mb']:.0f} MiB" if cpu["children"] > 0.05 else \
            f"{cpu['main_rss_mb']:.0f} MiB"
        rows.append(f"| {w} | {c_rate / 1e6:.2f} | {rate / 1e6:.2f} | **{rate / c_rate:.2f}** | {share} "
                    f"({cpu['main']:.2f} s / {cpu['children']:.1f} s) | {rss} |")  # fmt: skip
        printed.append(f"1. workers {w}: prepare {rate / 1e6:.2f} M tok/s, ceiling {c_rate / 1e6:.2f}, ratio "
                       f"{rate / c_rate:.2f}; main process CPU {cpu['main']:.2f} s, workers {cpu['children']:.1f} s "
                       f"({share}); peak RSS {rss}")  # fmt: skip
        print(printed[-1], flush=True)
    # --dedup-lines reads the input twice (its lines hashed, then tokenized without the lines met before): its share
    sec, cpu, tokens = prepare(src, t / "lines", counts[-1], env, ("--dedup-lines",))
    lines_share = 100 * cpu["main"] / cpu["children"]
    printed.append(f"1. --dedup-lines, workers {counts[-1]}: {tokens / sec / 1e6:.2f} M tok/s; "
                   f"main process CPU {cpu['main']:.2f} s, workers {cpu['children']:.1f} s "
                   f"({lines_share:.0f}%)")  # fmt: skip
    print(printed[-1], flush=True)
    rows += ["", f"`--dedup-lines` (the input read twice, see scaling.md), {counts[-1]} workers: "
             f"{tokens / sec / 1e6:.2f} M tokens/s; the main process spends {lines_share:.0f}% of its workers' CPU time "
             f"({cpu['main']:.2f} s / {cpu['children']:.1f} s)."]  # fmt: skip
    return rows, printed


STAGES = ("tokenize", "dedup", "select", "write")
# Shards of the simulation: a few per task, as at scale (1.3 T tokens in 100 M-token shards is
# 13,000 shards for 1,000 nodes). A shard is sealed (hashed start to end) by one task, so a
# shard larger than a task's share of the data would show as a write task that grows with N.
SIM_SHARD = 2_000_000
# Units of the simulation: 2 MiB, about 20 per task, so that tasks (whole units) hold the same
# data within a few percent whatever N (with 8 MiB units a task gets 5 or 6: ±10%).
SIM_UNIT = 2 << 20


def simulate(t: Path, n: int, env: dict[str, str]) -> tuple[dict[str, float], dict[str, float], int]:
    """One simulated run of n tasks: each stage's longest task (wall, CPU seconds), and the tokens."""
    env = env | {"LMSHARD_UNIT_BYTES": str(SIM_UNIT)}
    src, _ = write_corpus(t / f"c{n}.jsonl", n)
    out = t / f"cluster{n}"
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([*LMSHARD, "prepare", str(src), "--out", str(out), "--num-tasks", str(n), "--executor", "none",
                    "--tokens-per-shard", str(SIM_SHARD), "--quiet", "--overwrite"], check=True, env=env,
                   capture_output=True)  # fmt: skip
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for stage in STAGES:
        times = [run_task(["run-task", "--stage", stage, "--task", str(i), str(out)], env) for i in range(n)]
        wall[stage], cpu[stage] = max(w for w, _ in times), max(c for _, c in times)
    wall["finish"], cpu["finish"] = run_task(["run-task", "--stage", "finish", str(out)], env)
    return wall, cpu, json.loads((out / "dataset_metadata.json").read_text())["n_tokens"]


def section_cluster(t: Path, env: dict[str, str], rounds: int) -> list[str]:
    rows = ["| tasks N (one corpus copy each) | tokens | " + " | ".join(f"longest {s} task" for s in STAGES)
            + " | finish |", "|---|---|" + "---|" * (len(STAGES) + 1)]  # fmt: skip
    best: dict[int, tuple[dict[str, float], dict[str, float], int]] = {}
    for _ in range(rounds):  # each figure is the lower of its rounds: a task slowed by a neighbour is not its work
        for n in (1, 2, 4, 8):
            wall, cpu, tokens = simulate(t, n, env)
            if n in best:
                wall = {s: min(wall[s], best[n][0][s]) for s in wall}
                cpu = {s: min(cpu[s], best[n][1][s]) for s in cpu}
            best[n] = (wall, cpu, tokens)
    first = best[1][1]
    for n, (wall, cpu, tokens) in best.items():
        cells = " | ".join(f"{cpu[s]:.2f} s CPU (**{cpu[s] / first[s]:.2f}×**), {wall[s]:.2f} s wall"
                           for s in (*STAGES, "finish"))  # fmt: skip
        rows.append(f"| {n} | {tokens:,} | {cells} |")
        print(f"3. {n} tasks, longest task by CPU time (× N=1), wall: " + ", ".join(
            f"{s} {cpu[s]:.2f} s ({cpu[s] / first[s]:.2f}×) {wall[s]:.2f} s" for s in (*STAGES, "finish")),
            flush=True)  # fmt: skip
    peaks = ", ".join(f"{s} {PEAK[s]:.0f}" for s in (*STAGES, "finish"))
    rows += ["", f"Peak RSS of any task of each stage, MiB (all N): {peaks}."]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-write", action="store_true", help="do not update docs/performance.md")
    ap.add_argument("--skip-cluster", action="store_true", help="only the workers section")
    ap.add_argument("--skip-workers", action="store_true", help="only the cluster section (implies --no-write)")
    ap.add_argument("--rounds", type=int, default=2, help="simulations of each N; each figure is the lowest")
    ap.add_argument("--copies", type=int, default=4, help="corpus copies in the workers section (24: about 1 GB)")
    args = ap.parse_args()
    compile_package()
    print(machine(), flush=True)
    started = load()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LMSHARD_UNIT_BYTES": str(UNIT)}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        worker_rows = [] if args.skip_workers else section_workers(t, env, args.copies)[0]
        cluster_rows = [] if args.skip_cluster else section_cluster(t, env, args.rounds)
    body = [f"Machine: {machine()}; {available_cpus()} cores usable; load average (1 min) {started} at the start, {load()} at "
            "the end. Command: `python scripts/bench_scaling.py` (in `make bench`).", "",
            f"Workers: the shared corpus ×{args.copies} (distinct copies), GPT-2, `--tokenizer-backend auto`. The ceiling is the "
            "same number of warm processes doing nothing but `encode_batch` on the same texts in memory; the last "
            "column is the CPU time of prepare's main process over that of its workers.", "", *worker_rows]  # fmt: skip
    if cluster_rows:
        body += ["", "A cluster simulated on this machine: one corpus copy per task, each task of a stage run "
                 f"alone (`lmshard run-task`), as on separate nodes, with units of {SIM_UNIT >> 20} MiB and shards of "
                 f"{SIM_SHARD:,} tokens (a few per task). Data per task is fixed, so a stage whose longest task grows "
                 "with N does work that grows with the whole run. Each figure includes the start of a fresh process "
                 "(imports, the vocabulary: about 0.25 s here); the page cache is synced before each task, as if "
                 "it ran on a node of its own. The ratio is the longest task's CPU time (the work it did) over N = 1's; "
                 "wall times, which include waiting for the disk, are beside it; each figure is the lower of two "
                 "simulations.", "", *cluster_rows]  # fmt: skip
    if not args.no_write and not args.skip_workers:
        update_performance_md("scaling", "\n".join(body))


if __name__ == "__main__":
    main()
