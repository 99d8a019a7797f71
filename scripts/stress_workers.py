"""Stress the worker pool's failure paths: many prepare runs, each killed at a random moment.

    python scripts/stress_workers.py --runs 200 --main-kills 100

Mode "worker": SIGKILL (or SIGSEGV) one worker at a random moment, half of them in the first
0.3 s after the workers appear (interpreter start-up, tokenizer loading, the first items), the
rest spread over the run. Every run must end within --timeout seconds with exit 1, exactly one
`error:` line naming the worker, no traceback and no dataset left behind.
Mode "main": SIGKILL the prepare process itself; every one of its workers must be gone within
--timeout seconds.

Each run is in its own process group; one that overruns is killed whole and counted as a hang.
Input: the shared benchmark corpus (see benchlib.CORPUS). Prints a summary and exits 1 on any
failure. Not part of `make test`: it takes minutes (about 2-3 s a run on 2 cores). Runs use
`python -m lmshard`, so `PYTHONPATH=CHECKOUT` pins the code under test (a `git worktree`) while
the working tree is being edited.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from benchlib import require_corpus  # noqa: E402
from proctree import finish, start_prepare, wait_for_workers, wait_gone  # noqa: E402


def moment(rng: random.Random) -> float:
    return rng.uniform(0, 0.3) if rng.random() < 0.5 else rng.uniform(0.3, 3.0)


def start(corpus: Path, out: Path, rng: random.Random, timeout: float) -> tuple[Any, list[int], float]:
    """A 2-worker prepare, its workers, and a random moment to wait; no workers if it ended first."""
    proc = start_prepare([str(corpus), "--out", str(out), "--workers", "2", "--overwrite"])
    workers = wait_for_workers(proc, 2)
    if not workers:
        finish(proc, timeout)
    return proc, workers, moment(rng)


def kill_worker(corpus: Path, out: Path, rng: random.Random, timeout: float) -> tuple[str, float]:
    proc, workers, delay = start(corpus, out, rng, timeout)
    if not workers:
        return "no-workers", 0.0
    sig = rng.choice([signal.SIGKILL, signal.SIGKILL, signal.SIGKILL, signal.SIGSEGV])
    time.sleep(delay)
    if proc.poll() is not None:
        return "finished-first", delay
    try:
        os.kill(rng.choice(workers), sig)
    except ProcessLookupError:  # that worker ended on its own (the run was finishing): nothing to test
        finish(proc, timeout)
        return "finished-first", delay
    killed_at = time.monotonic()
    code, err = finish(proc, timeout)
    took = time.monotonic() - killed_at
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    if code is None:
        return "HANG", took
    ok = (code == 1 and len(errors) == 1 and f"killed by {sig.name}" in errors[0] and "Traceback" not in err
          and not (out / "dataset_metadata.json").exists())  # fmt: skip
    if wait_gone(workers, timeout):
        return "WORKER-LEFT", took
    return ("ok" if ok else f"BAD-EXIT {code}: {err.strip()[-300:]}"), took


def kill_main(corpus: Path, out: Path, rng: random.Random, timeout: float) -> tuple[str, float]:
    proc, workers, delay = start(corpus, out, rng, timeout)
    if not workers:
        return "no-workers", 0.0
    time.sleep(delay)
    if proc.poll() is not None:
        return "finished-first", 0.0
    proc.kill()
    killed_at = time.monotonic()
    proc.wait()
    left = wait_gone(workers, timeout)
    took = time.monotonic() - killed_at
    finish(proc, 1)  # reap; kills the group if anything is left
    return ("WORKER-LEFT" if left else "ok"), took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs with a worker killed")
    parser.add_argument("--main-kills", type=int, default=100, help="runs with prepare itself killed")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds before a run counts as hung")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    corpus, rng = require_corpus(), random.Random(args.seed)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for mode, n, fn in (("worker", args.runs, kill_worker), ("main", args.main_kills, kill_main)):
            outcomes: Counter[str] = Counter()
            slowest = 0.0
            for i in range(n):
                # A fresh --out per run: a run that finished leaves a complete dataset behind,
                # which the next run's "nothing kept" check would otherwise see.
                outcome, took = fn(corpus, Path(tmp) / f"o{mode}{i}", rng, args.timeout)
                outcomes[outcome.split(":")[0]] += 1
                slowest = max(slowest, took)
                if outcome not in ("ok", "finished-first"):
                    failures += 1
                    print(f"  {mode} run {i}: {outcome}", flush=True)
            print(f"kill {mode}: {n} runs: {dict(outcomes)}; slowest exit after the kill {slowest:.2f} s", flush=True)
    print("PASS" if failures == 0 else f"FAIL: {failures} bad runs")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
