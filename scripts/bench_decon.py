"""Benchmark decontamination on planted contamination in real text, in one process.

Clean documents: the shared corpus's first 6,000 records. Benchmark: "questions" (runs of 15 to
40 words) and short "answers" (8 to 11 words) cut from the prose among 2,000 other records of the
corpus (up to 1,000 and 300), written as JSONL. Planted, each into its own copy of a clean document: whole items,
items inside a long document, short answers as a line, and items with their whitespace, case and
punctuation changed. Prints recall per kind, false positives on the clean documents (a flagged
clean document shares a 13-gram with an item: often a real repeat in web text, shown), the
index's build time, and prepare's tokens/s with and without --decontaminate in the same run.

    python scripts/bench_decon.py [--no-write]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import load, load_texts, machine, update_performance_md  # noqa: E402

from lmshard.prepare import PrepareConfig, prepare  # noqa: E402
from lmshard.quality.decon import Decontaminator  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    texts = load_texts()
    rng = random.Random(0)
    clean, held = texts[:6000], texts[6000:8000]
    questions, answers = [], []
    for t in held:  # prose: records of mostly alphabetic words (not code, markup or tables)
        words = t.split()
        if len(words) >= 80 and sum(w.strip(".,;:!?\"'()").isalpha() for w in words) >= 0.8 * len(words):
            start = rng.randrange(0, len(words) - 60)
            questions.append(" ".join(words[start : start + rng.randint(15, 40)]))
            answers.append(" ".join(words[start + 45 : start + 45 + rng.randint(8, 11)]))
    questions, answers = questions[:1000], answers[:300]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "bench.jsonl").write_text("".join(json.dumps({"question": q}) + "\n" for q in questions) +
                                          "".join(json.dumps({"answer": a}) + "\n" for a in answers))  # fmt: skip
        t0 = time.perf_counter()
        decon = Decontaminator([str(root / "bench.jsonl")])
        built = time.perf_counter() - t0
        kinds = {
            "whole item": lambda i, t: questions[i % len(questions)],
            "inside a long document": lambda i, t: t + "\n" + questions[i % len(questions)] + " " + t,
            "short answer as a line": lambda i, t: t + "\n" + answers[i % len(answers)] + "\n" + t,
            "reformatted (case, spaces, punctuation)": lambda i, t: t + " " + re.sub(
                " ", lambda m: rng.choice(["  ", "\n", " , ", " "]), questions[i % len(questions)].upper()),
        }  # fmt: skip
        rows = []
        for name, plant in kinds.items():
            docs = [plant(i, clean[i]) for i in range(1000)]  # (items cycle when the corpus gives fewer)
            rows.append((name, sum(decon.matches(d) is not None for d in docs) / len(docs)))
        t0 = time.perf_counter()
        flagged = [t for t in clean if decon.matches(t) is not None]
        check = time.perf_counter() - t0
        mb = sum(len(t.encode()) for t in clean) / 1e6
        src = root / "clean.jsonl"
        src.write_text("".join(json.dumps({"text": t}) + "\n" for t in clean))
        rates = {}
        for label, extra in (("without", {}), ("with", {"decontaminate": [str(root / "bench.jsonl")]})):
            best = 0.0
            for _ in range(3):
                t0 = time.perf_counter()
                result = prepare(PrepareConfig(inputs=[str(src)], out=str(root / label), overwrite=True, workers=1,
                                               val_fraction=0, quiet=True, dedup="none", **extra))  # fmt: skip
                best = max(best, result.n_tokens("train") / (time.perf_counter() - t0))
            rates[label] = best
    for name, recall in rows:
        print(f"recall, {name}: {recall:.4f}")
    print(f"false positives: {len(flagged)} of {len(clean)} clean documents ({len(flagged) / len(clean):.4%})")
    for t in flagged[:3]:
        print(f"  {t[:120]!r}")
    print(f"index: {decon.grams:,} n-grams built in {built:.2f} s; check: {mb / check:.1f} MB/s of text on one core")
    print(f"prepare, one worker: {rates['with']:,.0f} tokens/s with --decontaminate, {rates['without']:,.0f} without "
          f"({rates['with'] / rates['without']:.2f}x)")  # fmt: skip
    if not args.no_write:
        body = (f"Machine: {machine()}; load {load()}. `python scripts/bench_decon.py`: 1,000 questions and 300 "
                "answers cut from held-out records of the shared corpus, planted into 1,000 copies of clean records "
                "per kind.\n\n| planted | recall |\n|---|---:|\n" + "".join(f"| {n} | {r:.4f} |\n" for n, r in rows)
                + f"\nFalse positives: {len(flagged)} of {len(clean):,} clean records ({len(flagged) / len(clean):.3%})."
                f" Index: {decon.grams:,} n-grams in {built:.2f} s; checking runs at {mb / check:.1f} MB/s of text "
                f"per core. prepare (one worker, best of 3): {rates['with'] / rates['without']:.2f}x the tokens/s "
                "without --decontaminate.\n")  # fmt: skip
        update_performance_md("Decontamination", body)


if __name__ == "__main__":
    main()
