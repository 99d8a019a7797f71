"""Benchmark decontamination on planted contamination in real text, in one process.

Clean documents: the shared corpus's first 6,000 records. Benchmark: "questions" (runs of 15 to
40 words) and short "answers" (8 to 11 words) cut from the prose among 2,000 other records of
the corpus (up to 1,000 and 300), written as JSONL. Planted, each into its own copy of a clean
document: whole items, items inside a long document, short answers as a line, and items with
their whitespace, case and punctuation changed. Prints recall per kind, the clean documents
flagged (a flagged clean document shares a 13-gram with an item: often a real repeat in web
text, shown) and how many of them truly hold an item's passage (a plain search of their words;
the others are false positives), the index's build time, and prepare's tokens/s with and without
--decontaminate in the same run.

Against datatrove's n-gram decontamination (`NGramsDecontFilter`, its default configuration:
12-grams of its normalised words, an item's n-grams as the "answer"), on the same items and
documents, in a virtual environment of its own (`--datatrove-python`; `make bench` makes one):
recall per kind, false positives, and how fast each checks text on one core. datatrove builds
its index from lighteval's task registry, which reaches the hub; here its indexer's own
`compute_hashes` hashes the items and the index file is written as its indexer writes it.

    python scripts/bench_decon.py [--no-write] [--datatrove-python PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_DATATROVE = Path(__file__).resolve().parents[1] / ".venv" / "bench-datatrove" / "bin" / "python"


def datatrove_worker(folder: Path) -> None:
    """datatrove's side, under its own interpreter (imports no lmshard): index the items of
    `folder/items.json`, check every document of `folder/docs.json` ({kind: [texts]}), print JSON."""
    import os
    from importlib.metadata import version

    import numpy as np
    from datatrove.data import Document
    from datatrove.pipeline.decont import NGramsDecontConfig, NGramsDecontFilter, NGramsDecontIndexer

    items, docs = json.loads((folder / "items.json").read_text()), json.loads((folder / "docs.json").read_text())
    config = NGramsDecontConfig()  # (its defaults: 12-grams, an item indexed as an answer)
    NGramsDecontIndexer._requires_dependencies = []  # (lighteval: only for its run(), which reaches the hub)
    started = time.perf_counter()
    indexer = NGramsDecontIndexer(str(folder / "index"), config=config)
    hashes = {h for item in items for h in indexer.compute_hashes(item)}
    os.makedirs(folder / "index", exist_ok=True)
    np.array(sorted(hashes), dtype=config.hash_config.np_descr).tofile(folder / "index" / "bench.index.hashes")
    built = time.perf_counter() - started
    check = NGramsDecontFilter(str(folder / "index"), config=config)
    check.filter(Document(text="a first document loads the index and the word tokenizer", id="warm"))
    out: dict[str, object] = {"version": version("datatrove"), "grams": len(hashes), "built": built, "n": 12}
    for kind, texts in docs.items():
        t0 = time.perf_counter()
        flagged = [check.filter(Document(text=t, id=str(i))) is not True for i, t in enumerate(texts)]
        out[kind] = {"flagged": sum(flagged), "docs": len(texts), "seconds": time.perf_counter() - t0}
    print(json.dumps(out), flush=True)


def run_datatrove(python: Path, folder: Path, items: list[str], docs: dict[str, list[str]]) -> tuple[dict, str]:
    """datatrove's results on the same items and documents, or {} and why not."""
    if not python.is_file():
        return {}, f"datatrove not measured: no interpreter at {python} (`make bench` makes one; or --datatrove-python)"
    (folder / "items.json").write_text(json.dumps(items))
    (folder / "docs.json").write_text(json.dumps(docs))
    done = subprocess.run([str(python), __file__, "--datatrove-worker", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        return {}, f"datatrove not measured: its worker failed ({done.stderr.strip().splitlines()[-1:]})"
    return json.loads(done.stdout.strip().splitlines()[-1]), ""


if __name__ == "__main__" and sys.argv[1:2] == ["--datatrove-worker"]:
    datatrove_worker(Path(sys.argv[2]))
    sys.exit(0)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import load, load_texts, machine, update_performance_md  # noqa: E402

from lmshard.prepare import PrepareConfig, prepare  # noqa: E402
from lmshard.quality.decon import Decontaminator  # noqa: E402


def _plain_words(text: str) -> list[str]:
    """Words as the documentation defines them, written here apart from lmshard's code (NFKC,
    lowercase, runs of ASCII letters and digits and of characters outside ASCII)."""
    import unicodedata

    return re.findall(r"[a-z0-9]+|[^\x00-\x7f]+", unicodedata.normalize("NFKC", text).lower())


def shares_passage(text: str, items: list[str], n: int = 13) -> bool:
    """Whether `text` really holds an item's n-gram, or a whole item of 8 to n - 1 words, by a
    plain search of its words (the truth a flagged clean record is held to)."""
    doc = " " + " ".join(_plain_words(text)) + " "
    for item in items:
        w = _plain_words(item)
        spans = [w] if 8 <= len(w) < n else [w[i : i + n] for i in range(len(w) - n + 1)]
        if any(" " + " ".join(span) + " " in doc for span in spans):
            return True
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--datatrove-python", type=Path, default=DEFAULT_DATATROVE)
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
        rows, planted = [], {}
        for name, plant in kinds.items():
            docs = [plant(i, clean[i]) for i in range(1000)]  # (items cycle when the corpus gives fewer)
            planted[name] = docs
            rows.append((name, sum(decon.matches(d) is not None for d in docs) / len(docs)))
        t0 = time.perf_counter()
        flagged = [t for t in clean if decon.matches(t) is not None]
        check = time.perf_counter() - t0
        real = sum(shares_passage(t, questions + answers) for t in flagged)
        theirs, why_not = run_datatrove(args.datatrove_python, root, questions + answers, {**planted, "clean": clean})
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
    print(f"flagged clean documents: {len(flagged)} of {len(clean)} ({len(flagged) / len(clean):.4%}); {real} of them "
          f"hold an item's passage word for word; false positives (none): {len(flagged) - real} "
          f"({(len(flagged) - real) / len(clean):.4%})")  # fmt: skip
    for t in flagged[:3]:
        print(f"  {t[:120]!r}")
    print(f"index: {decon.grams:,} n-grams built in {built:.2f} s; check: {mb / check:.1f} MB/s of text on one core")
    print(f"prepare, one worker: {rates['with']:,.0f} tokens/s with --decontaminate, {rates['without']:,.0f} without "
          f"({rates['with'] / rates['without']:.2f}x)")  # fmt: skip
    versus = ""
    if theirs:
        lines = [f"| {name} | {recall:.4f} | {theirs[name]['flagged'] / theirs[name]['docs']:.4f} |"
                 for name, recall in rows]  # fmt: skip
        fp = theirs["clean"]["flagged"]
        rate = mb / theirs["clean"]["seconds"]
        versus = ("\n\nAgainst datatrove " + theirs["version"] + "'s `NGramsDecontFilter` (its defaults: 12-grams of its "
                  "normalised words; its indexer's `compute_hashes` over the same items), on the same documents:\n\n"
                  "| planted | lmshard recall | datatrove recall |\n|---|---:|---:|\n" + "\n".join(lines) +
                  f"\n\nClean records flagged: lmshard {len(flagged)}, datatrove {fp} of {len(clean):,}. "
                  f"Checking text, one core: lmshard {mb / check:.1f} MB/s, datatrove {rate:.1f} MB/s "
                  f"({mb / check / rate:.1f}x); index: lmshard {built:.2f} s, datatrove {theirs['built']:.2f} s.")  # fmt: skip
        print(versus.strip())
    else:
        print(why_not)
    if not args.no_write:
        body = (f"Machine: {machine()}; load {load()}. `python scripts/bench_decon.py`: 1,000 questions and 300 "
                "answers cut from held-out records of the shared corpus, planted into 1,000 copies of clean records "
                "per kind.\n\n| planted | recall |\n|---|---:|\n" + "".join(f"| {n} | {r:.4f} |\n" for n, r in rows)
                + f"\nClean records flagged: {len(flagged)} of {len(clean):,} ({len(flagged) / len(clean):.3%}); {real} "
                "of them hold an item's 13-gram or a whole short item word for word (found by a plain search of their "
                "words, apart from lmshard's code: web text repeats licence notices and copied documentation, and the "
                f"items were cut from the same corpus), so false positives, flagged without a shared passage: "
                f"{len(flagged) - real} ({(len(flagged) - real) / len(clean):.3%})."
                f" Index: {decon.grams:,} n-grams in {built:.2f} s; checking runs at {mb / check:.1f} MB/s of text "
                f"per core. prepare (one worker, best of 3): {rates['with'] / rates['without']:.2f}x the tokens/s "
                "without --decontaminate." + versus + "\n")  # fmt: skip
        update_performance_md("Decontamination", body)


if __name__ == "__main__":
    main()
