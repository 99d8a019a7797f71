"""The share of planted near-duplicate pairs `--near-dedup` removes, by exact Jaccard similarity,
for the default MinHash configuration and FineWeb's 14 x 8 bands without the agreement check.

Pairs of 120-300-word documents of random words, the copy with words replaced until its exact
word 5-gram Jaccard similarity (Python sets) lies in each range (tests/test_near.py's generator);
both configurations judge the same pairs in the same run, through `near_duplicates` over the
documents' signatures, as prepare does. Prints a markdown table (docs/quality.md).

Usage: python scripts/near_recall.py [--pairs 400]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_near import _planted  # noqa: E402

from lmshard.quality.minhash import MinHashConfig, signature  # noqa: E402
from lmshard.quality.near import near_duplicates  # noqa: E402

RANGES = [(0.45, 0.5), (0.55, 0.6), (0.65, 0.7), (0.7, 0.75), (0.75, 0.8), (0.8, 0.85), (0.85, 0.9), (0.9, 1.0)]
CONFIGS = {"default 5:22x5:0.7": MinHashConfig(), "FineWeb 14 x 8, no check": MinHashConfig(bands=14, rows=8,
                                                                                            threshold=0.01)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=400, help="pairs per range")
    args = parser.parse_args()
    planted = {(lo, hi): _planted(int(lo * 100) + 7, [(lo, hi, args.pairs)])[0] for lo, hi in RANGES}
    print("| J of the pair | " + " | ".join(f"{lo}-{hi}" for lo, hi in RANGES) + " |")
    print("|---" * (len(RANGES) + 1) + "|")
    for name, config in CONFIGS.items():
        shares = []
        for texts in planted.values():  # the originals, then their copies: a removed document is a copy
            removed, _ = near_duplicates(np.stack([signature(t, config) for t in texts]), config)
            shares.append(len(removed) / args.pairs)
        print(f"| removed, {name} | " + " | ".join(f"{x:.3f}" for x in shares) + " |")


if __name__ == "__main__":
    main()
