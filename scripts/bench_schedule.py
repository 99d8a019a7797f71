"""Benchmark what schedules cost the loader, in one process, alternating rounds (medians).

On the shared corpus prepared once (GPT-2, one split, no val), batches/s of B=32 × T=1024 random
rows (on the CPU, `cpu_batch`-free: `next(stream)` as a training loop calls it) for:

- row order (the default) and step order (lmshard 0.2's draw): the price of batch-size invariance;
- a scheduled stream measured inside its (32, 1024) phase, against the unscheduled one;
- a two-source mixture with a curriculum (a linear ramp) against the same mixture at fixed weights;
- a load-time val split's side (`val_fraction=0.1`, read piece by piece) against a prepared split.

    python scripts/bench_schedule.py [--seconds 1.5] [--rounds 5] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import load, machine, require_corpus, update_performance_md  # noqa: E402

from lmshard import Mixture, TokenDataset  # noqa: E402
from lmshard.prepare import PrepareConfig, prepare  # noqa: E402

B, T = 32, 1024


def rate(stream: Any, seconds: float) -> float:
    """Batches per second drawn with next() for `seconds`."""
    next(stream)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        next(stream)
        n += 1
    return n / (time.perf_counter() - t0)


def compare(pairs: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], seconds: float,
            rounds: int) -> list[tuple[str, float, float, float]]:  # fmt: skip
    """(name, ours batches/s, baseline batches/s, ratio) per pair: medians of alternated rounds."""
    out = []
    for name, (ours, base) in pairs.items():
        a, b = [], []
        for _ in range(rounds):
            a.append(rate(ours(), seconds))
            b.append(rate(base(), seconds))
        ratios = [x / y for x, y in zip(a, b, strict=True)]
        out.append((name, statistics.median(a), statistics.median(b), statistics.median(ratios)))
        print(f"{name:44s} {out[-1][1]:10,.0f} {out[-1][2]:10,.0f} {out[-1][3]:6.2f}x", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.5, help="timing window per measurement")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, salt in (("a", 0), ("b", 1)):  # two sources for the mixtures
            prepare(PrepareConfig(inputs=[str(require_corpus())], out=str(root / name), val_fraction=0,
                                  seed=salt, quiet=True))  # fmt: skip
        prepare(PrepareConfig(inputs=[str(require_corpus())], out=str(root / "v"), val_fraction=0.1, quiet=True))
        data = TokenDataset(root / "a")
        plan = [(0, 16, 512), (1, B, T), (10**9, 64, T)]  # measured from step 1: the (32, 1024) phase
        pair = [TokenDataset(root / "a"), TokenDataset(root / "b")]
        ramp = [(0, [0.9, 0.1]), (10**10, [0.3, 0.7])]

        def scheduled() -> Any:
            stream = data.random_batches(schedule=plan, seed=1)
            next(stream)
            return stream

        pairs = {
            "row order / step order": (lambda: data.random_batches(B, T, seed=1),
                                       lambda: data.random_batches(B, T, seed=1, order="steps")),
            "scheduled (in its 32x1024 phase) / one shape": (scheduled, lambda: data.random_batches(B, T, seed=1)),
            "curriculum mixture / fixed weights": (
                lambda: Mixture(pair, curriculum=ramp, max_epochs=1e9).random_batches(B, T, seed=1),
                lambda: Mixture({pair[0]: 0.9, pair[1]: 0.1}, max_epochs=1e9).random_batches(B, T, seed=1)),
            "load-time val side / prepared val split": (
                lambda: TokenDataset(root / "a", "val", val_fraction=0.1).random_batches(B, T, seed=1),
                lambda: TokenDataset(root / "v", "val").random_batches(B, T, seed=1)),
        }  # fmt: skip
        print(f"{'B=32, T=1024, batches/s':44s} {'ours':>10s} {'baseline':>10s}  ratio")
        rows = compare(pairs, args.seconds, args.rounds)
    if not args.no_write:
        body = (f"Machine: {machine()}; load {load()}. `python scripts/bench_schedule.py` (medians of "
                f"{args.rounds} alternated rounds of {args.seconds:g} s, `next(stream)` on the CPU, random rows "
                "B=32 × T=1024 of the shared corpus).\n\n| stream / baseline | batches/s | baseline | ratio |\n"
                "|---|---:|---:|---:|\n"
                + "".join(f"| {n} | {a:,.0f} | {b:,.0f} | {r:.2f}x |\n" for n, a, b, r in rows))  # fmt: skip
        update_performance_md("Schedules, curricula and load-time splits", body)


if __name__ == "__main__":
    main()
