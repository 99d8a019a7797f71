"""Benchmark the scale-out path on one machine: a planned run against the fused one, and what
each stage costs.

1. `lmshard prepare --workers 2` (the fused path) against `lmshard prepare --workers 2
   --num-tasks 4` (the local executor: plan, units tokenized two at a time while the merge
   follows them), and with `--before CHECKOUT` the fused path of an older checkout (make one
   with `git worktree add /tmp/old COMMIT`; PYTHONPATH pins it), rotated, 3 runs each, on the
   shared corpus written twice (salted) as uncompressed JSON lines with 8 MiB units
   (LMSHARD_UNIT_BYTES) so that it is cut into ranges. Prints the ratios of median wall times
   and whether the outputs are byte-identical (metadata apart from its run record).
2. One task of each stage run alone (`lmshard run-task`): wall time, peak RSS, tokens per
   second; and the plan's and the work directory's sizes per unit and per token, from which
   docs/scaling.md estimates a 1,000-node run.

    python scripts/bench_scaleout.py [--before CHECKOUT] [--no-write]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import compile_package, load, machine, require_corpus, run_measuring_rss, update_performance_md  # noqa: E402

LMSHARD = [sys.executable, "-m", "lmshard"]
UNIT = 8 << 20


def corpus(path: Path, copies: int = 2) -> Path:
    with gzip.open(require_corpus(), "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    with open(path, "w", encoding="utf-8") as f:
        for k in range(copies):
            for r in records:
                f.write(
                    json.dumps({"id": f"{r['id']}#{k}", "text": r["text"] if k == 0 else f"copy {k}\n{r['text']}"})
                    + "\n"
                )
    return path


def revision(checkout: Path) -> str:
    """The commit a checkout is at (short hash), or its directory name outside git."""
    import subprocess

    got = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return got.stdout.strip() or checkout.name


def files(root: Path) -> dict[str, bytes]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "dataset_metadata.json":
                meta = json.loads(data)
                meta.pop("run")
                data = json.dumps(meta, sort_keys=True).encode()
            out[p.relative_to(root).as_posix()] = data
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-write", action="store_true", help="do not update docs/performance.md")
    ap.add_argument("--before", type=Path, help="an older checkout whose fused path is the baseline too")
    args = ap.parse_args()
    compile_package()
    print(machine(), flush=True)
    started = load()
    env = {**os.environ, "LMSHARD_UNIT_BYTES": str(UNIT), "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        src = corpus(t / "corpus.jsonl")
        kinds = ["fused", "planned"] + (["before"] if args.before else [])
        times: dict[str, list[tuple[float, int]]] = {k: [] for k in kinds}
        for i in range(3):
            for kind in kinds[i % len(kinds) :] + kinds[: i % len(kinds)]:
                out = t / f"{kind}{i}"
                extra = ["--num-tasks", "4"] if kind == "planned" else []
                run_env = env | {"PYTHONPATH": str(args.before.resolve())} if kind == "before" else env
                sec, _, tree = run_measuring_rss([*LMSHARD, "prepare", str(src), "--out", str(out), "--workers", "2",
                                                  *extra], run_env)  # fmt: skip
                times[kind].append((sec, tree))
                print(f"1. {kind}: {sec:.2f} s, peak RSS of the tree {tree / 2**20:.0f} MiB", flush=True)
        fused, planned = times["fused"], times["planned"]
        same = files(t / "fused0") == files(t / "planned0")
        meta = json.loads((t / "fused0" / "dataset_metadata.json").read_text())
        tokens = meta["n_tokens"]
        f_med, p_med = statistics.median(s for s, _ in fused), statistics.median(s for s, _ in planned)
        b_med = statistics.median(s for s, _ in times["before"]) if args.before else None
        print(f"1. planned / fused wall time: {p_med / f_med:.2f} (fused {f_med:.2f} s, planned {p_med:.2f} s); "
              f"byte-identical: {same}", flush=True)  # fmt: skip
        if b_med is not None:
            print(f"1. planned / fused before: {p_med / b_med:.2f} (before {b_med:.2f} s)", flush=True)
        dist = t / "dist"
        run_measuring_rss(
            [*LMSHARD, "prepare", str(src), "--out", str(dist), "--num-tasks", "4", "--executor", "none"], env
        )
        work = t / ".dist.lmshard-work"
        plan = json.loads((work / "plan.json").read_text())
        stage_rows = []
        for stage, task in (("tokenize", ["--task", "0"]), ("tokenize", ["--task", "1"]), ("tokenize", ["--task", "2"]),
                            ("tokenize", ["--task", "3"]), ("dedup", ["--task", "0"]), ("dedup", ["--task", "1"]),
                            ("dedup", ["--task", "2"]), ("dedup", ["--task", "3"]), ("merge", [])):  # fmt: skip
            sec, main_rss, _ = run_measuring_rss([*LMSHARD, "run-task", "--stage", stage, *task, str(dist)], env)
            stage_rows.append((stage, " ".join(task), sec, main_rss))
            print(f"2. {stage} {' '.join(task)}: {sec:.2f} s, peak RSS {main_rss / 2**20:.0f} MiB", flush=True)
        work_bytes = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
        plan_bytes = (work / "plan.json").stat().st_size
        n_units = len(plan["units"])
    tok = [r for r in stage_rows if r[0] == "tokenize"]
    per_task_tokens = tokens / 4
    rows = ["| run | wall time (median of 3) | peak RSS of the process tree |", "|---|---|---|",
            f"| `prepare --workers 2` (fused) | {f_med:.2f} s | {max(r for _, r in fused) / 2**20:.0f} MiB |",
            f"| `prepare --workers 2 --num-tasks 4` (local executor) | {p_med:.2f} s | "
            f"{max(r for _, r in planned) / 2**20:.0f} MiB |",
            *([f"| `prepare --workers 2`, fused, at {revision(args.before)} | {b_med:.2f} s | "
               f"{max(r for _, r in times['before']) / 2**20:.0f} MiB |"] if b_med is not None else []),
            f"| ratio planned / fused | **{p_med / f_med:.2f}** | |",
            *([f"| ratio planned / fused before | **{p_med / b_med:.2f}** | |"] if b_med is not None else []), "",
            f"Outputs byte-identical (metadata apart from its run record): **{same}**. "
            f"{tokens:,} tokens, {n_units} units of {UNIT >> 20} MiB.", "",
            "| stage, one task alone | wall time | peak RSS | tokens/s |", "|---|---|---|---|"]  # fmt: skip
    for stage, task, sec, rss in stage_rows:
        rate = f"{(per_task_tokens if stage == 'tokenize' else tokens) / sec:,.0f}" if stage != "dedup" else "—"
        rows.append(f"| {stage} {task} | {sec:.2f} s | {rss / 2**20:.0f} MiB | {rate} |")
    rows += ["", f"Plan: {plan_bytes:,} bytes for {n_units} units ({plan_bytes / n_units:.0f} bytes per unit, "
             f"options included). Work directory: {work_bytes / tokens:.2f} bytes per token. "
             f"Tokenize tasks: {statistics.median(s for _, _, s, _ in tok):.2f} s median."]  # fmt: skip
    body = [f"Machine: {machine()}; load average (1 min) {started} at the start, {load()} at the end. Command: "
            "`python scripts/bench_scaleout.py` (in `make bench`).", "", *rows]  # fmt: skip
    if not args.no_write:
        update_performance_md("scale-out", "\n".join(body))


if __name__ == "__main__":
    main()
