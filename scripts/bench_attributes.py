"""Benchmark per-document attributes (`prepare --attribute`) and their use at load time, in one run.

On the shared corpus (8,847 records), one worker, alternated rounds (median of 3):
- prepare's tokens/s with each built-in scorer, and with all of them, against none;
- the bytes the `.attr` files add per document and against the shards' tokens;
- choosing a threshold: opening `TokenDataset(path, where=...)` against preparing the corpus
  again with the filter (what tuning a threshold costs where filters only drop), and the random
  batch rate (B=32, T=1024, one core) from the selection against the whole split.

    python scripts/bench_attributes.py [--no-write]
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import compile_package, load, machine, require_corpus, update_performance_md  # noqa: E402

from lmshard import TokenDataset  # noqa: E402
from lmshard.prepare import PrepareConfig, prepare  # noqa: E402

SCORERS = ["length", "gopher_quality", "gopher_repetition", "fineweb_quality"]
WHERE = "fineweb_line_punctuation >= 0.12 and fineweb_short_lines <= 0.67 and fineweb_dup_line_chars <= 0.01 and " \
        "not fineweb_newlines > 0.3"  # fineweb_quality's rules (a document without lines aside)  # fmt: skip


def _prepare(src: Path, out: Path, **kw: object) -> float:
    t0 = time.perf_counter()
    result = prepare(PrepareConfig(inputs=[str(src)], out=str(out), overwrite=True, workers=1, val_fraction=0,
                                   dedup="none", quiet=True, **kw))  # type: ignore[arg-type]  # fmt: skip
    return result.n_tokens("train") / (time.perf_counter() - t0)


def _batches_per_s(data: TokenDataset, n: int = 200) -> float:
    stream = data.random_batches(32, 1024, seed=0)
    next(stream)
    t0 = time.perf_counter()
    for _ in range(n):
        next(stream)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    compile_package()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        src = root / "corpus.jsonl"
        with gzip.open(require_corpus(), "rb") as f, open(src, "wb") as g:
            shutil.copyfileobj(f, g)
        configs = {"none": [], **{name: [name] for name in SCORERS}, "all four": SCORERS}
        rates: dict[str, list[float]] = {name: [] for name in configs}
        for _ in range(3):  # alternated rounds: the machine's load falls on every configuration alike
            for name, specs in configs.items():
                rates[name].append(_prepare(src, root / "ds", attributes=specs))
        rate = {name: statistics.median(r) for name, r in rates.items()}
        out = root / "scored"
        _prepare(src, out, attributes=SCORERS)
        full = TokenDataset(out)
        attr = sum(p.stat().st_size for p in out.rglob("*.attr"))
        bins = sum(p.stat().st_size for p in out.rglob("*.bin"))
        opens, reprepares, chosen = [], [], None
        for _ in range(3):
            t0 = time.perf_counter()
            chosen = TokenDataset(out, where=WHERE)
            opens.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            _prepare(src, root / "filtered", filters=["fineweb_quality"])
            reprepares.append(time.perf_counter() - t0)
        assert chosen is not None
        filtered = TokenDataset(root / "filtered")
        whole_rate, where_rate = _batches_per_s(full), _batches_per_s(chosen)
    lines = [f"| {name} | {rate[name]:,.0f} | {rate[name] / rate['none']:.2f}x |" for name in configs]
    open_s, again_s = statistics.median(opens), statistics.median(reprepares)
    print("\n".join(lines))
    print(f".attr: {attr / full.n_docs:.0f} bytes per document ({len(SCORERS)} scorers, 27 columns), "
          f"{attr / bins:.2%} of the token files")  # fmt: skip
    print(f"where= open: {open_s * 1e3:.1f} ms; prepare again with --filter fineweb_quality: {again_s:.2f} s "
          f"({again_s / open_s:,.0f}x); kept {chosen.n_docs:,} documents, --filter kept {filtered.n_docs:,}")
    print(f"random batches (32 x 1024, one core): {where_rate:,.0f}/s from the where= selection, {whole_rate:,.0f}/s "
          f"from the whole split ({where_rate / whole_rate:.2f}x)")  # fmt: skip
    if not args.no_write:
        body = (f"Machine: {machine()}; load {load()}. `python scripts/bench_attributes.py`: the shared corpus, one "
                "worker, median of 3 alternated rounds.\n\n| --attribute | tokens/s | against none |\n|---|---:|---:|\n"
                + "\n".join(lines) + f"\n\nThe `.attr` files of all four: {attr / full.n_docs:.0f} bytes per document "
                f"(27 columns), {attr / bins:.2%} of the token files. Choosing a threshold: `TokenDataset(path, "
                f"where=...)` (fineweb_quality's rules) opens in {open_s * 1e3:.1f} ms; preparing the corpus again with "
                f"`--filter fineweb_quality` takes {again_s:.2f} s ({again_s / open_s:,.0f}x), and keeps the same "
                f"documents ({chosen.n_docs:,} and {filtered.n_docs:,}). Random batches (B=32, T=1024, one core) from "
                f"the selection: {where_rate:,.0f}/s, {where_rate / whole_rate:.2f}x the whole split's "
                f"{whole_rate:,.0f}/s (a row is read a document piece at a time).\n")  # fmt: skip
        update_performance_md("Attributes", body)


if __name__ == "__main__":
    main()
