"""Benchmark training from a stream (`lmshard.stream`) and constant-memory packing.

Every figure is a ratio to a baseline measured in the same run:

1. Tokenizing speed per reader: one reader of `lmshard.stream` over the shared corpus repeated 4
   times in 32 files (read, cleaned, tokenized, cut into B=8 × T=4096 windows) on one thread, against its tokenizer
   library's own batch encode of the same texts, already in memory, on one thread; for GPT-2
   (tiktoken's encode_ordinary_batch) and a Hugging Face vocabulary (`tokenizers` encode_batch;
   a real one from a package on the index, pinned by sha256, else a 50k BPE trained here).
   Then the whole stream with 2 DataLoader workers against 1 worker (the gain from more readers).
2. Packing fill at seq_len 4096 on the corpus repeated 4 times (35 k documents): a whole-split
   best-fit-decreasing plan (`bfd`) against stream packing (`strategy="stream"`, windows of
   10,000 documents from shuffled blocks), from the document index, as `inspect --packing` does.
3. Peak RSS of a process that opens a prepared split and serves 200 packed batches (B=8,
   T=4096), for a split of 1 M documents and one of 10 M (made here from short synthetic
   documents): stream packing against a `bfd` plan of the whole split.

    python scripts/bench_stream.py [--no-write] [--quick]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # the libraries' own baselines on one thread, as a reader runs
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tokenizers import REAL_VOCABULARIES, real_vocabulary, train_bpe  # noqa: E402
from benchlib import load, load_texts, machine, require_corpus, update_performance_md  # noqa: E402

import lmshard  # noqa: E402
from lmshard.prepare import PrepareConfig, prepare  # noqa: E402

B, T = 8, 4096


_RATE = """
import sys, time, lmshard
src, tokenizer, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = lmshard.stream(src, tokenizer=tokenizer, epochs=1)
s.use_threads(1)
started, n = time.perf_counter(), 0
with s.windows(B, T, num_workers=workers) as batches:
    for _ in batches:
        n += 1
print(n * B * T / (time.perf_counter() - started))
""".replace("B, T", f"{B}, {T}").replace("B * T", str(B * T))


def stream_rate(src: str, tokenizer: str, workers: int = 0) -> float:
    """Tokens/s of one epoch of windows from a fresh stream, in a fresh process (as a training
    run starts: no tokenizer thread pool started before its DataLoader workers fork)."""
    done = subprocess.run([sys.executable, "-c", _RATE, src, tokenizer, str(workers)], capture_output=True,
                          text=True, check=True, env={**os.environ, "RAYON_NUM_THREADS": "1"})  # fmt: skip
    return float(done.stdout.strip().splitlines()[-1])


def raw_tiktoken(texts: list[str]) -> float:
    from lmshard.tokenizers.tiktoken_backend import TiktokenTokenizer

    enc = TiktokenTokenizer("gpt2")._enc  # tiktoken's Encoding of the provisioned vocabulary
    started = time.perf_counter()
    n = sum(len(t) for t in enc.encode_ordinary_batch(texts, num_threads=1))
    return n / (time.perf_counter() - started)


def raw_hf(path: Path, texts: list[str]) -> float:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    started = time.perf_counter()
    n = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    return n / (time.perf_counter() - started)


def section_speed(tmp: Path, quick: bool) -> list[str]:
    texts = load_texts(1 if quick else 4)  # 4 copies: about 65 M tokens, so a worker's start is a small part
    if quick:
        texts = texts[:1500]
    import json

    src = tmp / "corpus"  # 32 files, as a dataset's data files come: each reader takes whole files
    src.mkdir()
    for k in range(32):
        part = texts[k::32]
        (src / f"part{k}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
    found = next(((label, p) for label, req, member, sha in REAL_VOCABULARIES[:1]
                  if (p := real_vocabulary(req, member, sha)) is not None), None)  # fmt: skip
    if found is None:
        found = ("50k byte-level BPE trained here", train_bpe(texts[:2000], tmp / "tokenizer.json"))
    texts_1 = texts[: len(texts) // (1 if quick else 4)]  # the baselines encode one copy
    rows = ["| vocabulary | library's batch encode, 1 thread (M tok/s) | stream, 1 reader (M tok/s) | "
            "stream ÷ library | stream, 2 DataLoader workers ÷ 1 |", "|---|---|---|---|---|"]  # fmt: skip
    for label, spec, raw in (("GPT-2 (tiktoken vocabulary)", "gpt2", lambda: raw_tiktoken(texts_1)),
                             (found[0], str(found[1]), lambda: raw_hf(found[1], texts_1))):  # fmt: skip
        base = raw()
        one = stream_rate(str(src), spec)
        w1 = stream_rate(str(src), spec, workers=1)
        w2 = stream_rate(str(src), spec, workers=2)
        print(f"1. {label}: library {base / 1e6:.2f} M tok/s, stream reader {one / 1e6:.2f} ({one / base:.2f}x); "
              f"2 workers ÷ 1: {w2 / w1:.2f}x", flush=True)  # fmt: skip
        rows.append(f"| {label} | {base / 1e6:.2f} | {one / 1e6:.2f} | **{one / base:.2f}** | {w2 / w1:.2f}× |")
    return [f"The corpus repeated 4 times ({len(texts):,} documents) in 32 JSONL files, one epoch of B={B} × T={T} "
            "windows; each "
            "reader reads its own files, cleans and tokenizes on one thread, in a fresh process. A reader's rate is what one DataLoader worker gives: a GPU step of "
            f"B × T = {B * T:,} tokens every 100 ms needs about {B * T * 10 / 1e6:.2f} M tokens/s.", "", *rows]


def section_fill(tmp: Path) -> list[str]:
    from lmshard import packing
    from lmshard.packing import stream as streampack
    from lmshard.packing.io import dataset_lengths

    src = tmp / "x4.jsonl.gz"
    from benchlib import write_repeated

    write_repeated(src, 4)
    out = tmp / "x4"
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), val_fraction=0, quiet=True))
    lengths = dataset_lengths(out, "train")
    counts = [s.n_docs for s in lmshard.load_metadata(out).split_shards("train")]
    bfd = packing.plan(lengths, 4096, "bfd").metrics()
    rows = ["| strategy | packs | fill |", "|---|---|---|", f"| bfd (whole split) | {bfd['packs']:,} | {bfd['fill']:.2%} |"]
    for buffer in (1000, 10_000):
        m = streampack.metrics(lengths, counts, 4096, buffer)
        rows.append(f"| stream_{buffer} | {m['packs']:,} | {m['fill']:.2%} ({(m['fill'] - bfd['fill']) * 100:+.2f} "
                    "points) |")  # fmt: skip
        print(f"2. stream_{buffer}: fill {m['fill']:.4f} vs bfd {bfd['fill']:.4f}", flush=True)
    return [f"The corpus repeated 4 times ({len(lengths):,} documents, {int(lengths.sum()) / 1e6:.1f} M tokens), "
            "seq_len 4096, overlong documents split.", "", *rows]


_RSS = """
import sys, tracemalloc
from lmshard import TokenDataset

def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) // 1024

ds = TokenDataset(sys.argv[1])
before = rss()
tracemalloc.start()
packs = ds.packed(4096, strategy=sys.argv[2], **({"buffer": 10_000} if sys.argv[2] == "stream" else {}))
it = iter(packs.batches(8))
for _ in range(200):
    next(it)
print(tracemalloc.get_traced_memory()[1] // (1 << 20), rss() - before)
"""


_ONLINE = """
import sys, tracemalloc, lmshard

def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) // 1024

stream = lmshard.stream(sys.argv[1], shuffle_buffer=10_000)
before = rss()
tracemalloc.start()
it = iter(stream.packed(8, 4096, buffer=10_000))
for _ in range(200):
    next(it)
print(tracemalloc.get_traced_memory()[1] // (1 << 20), rss() - before)
"""


def synthetic(path: Path, docs: int) -> Path:
    rng = np.random.default_rng(0)
    words = np.array(["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he", "this", "are", "or"])
    with path.open("w") as f:
        for i in range(docs):
            text = " ".join(words[rng.integers(0, len(words), rng.integers(3, 40))])
            f.write(f'{{"text": "{i} {text}"}}\n')
    return path


def section_rss(tmp: Path, quick: bool) -> list[str]:
    sizes = (100_000, 1_000_000) if quick else (500_000, 5_000_000)
    rows = ["| documents | stream packing of the split: peak allocated, RSS growth (MB) | bfd plan of the split: the "
            "same (MB) | `lmshard.stream(...).packed` of the text: the same (MB) |", "|---|---|---|---|"]  # fmt: skip
    for n in sizes:
        out = tmp / f"syn{n}"
        prepare(PrepareConfig(inputs=[str(synthetic(tmp / f"syn{n}.jsonl", n))], out=str(out), val_fraction=0,
                              dedup="none", quiet=True))  # fmt: skip
        rss = {}
        done = subprocess.run([sys.executable, "-c", _ONLINE, str(tmp / f"syn{n}.jsonl")], capture_output=True,
                              text=True, check=True)  # fmt: skip
        peak, grew = done.stdout.strip().splitlines()[-1].split()
        rss["online"] = f"{peak}, {grew}"
        (tmp / f"syn{n}.jsonl").unlink()
        for strategy in ("stream", "bfd"):
            done = subprocess.run([sys.executable, "-c", _RSS, str(out), strategy], capture_output=True, text=True,
                                  check=True)  # fmt: skip
            peak, grew = done.stdout.strip().splitlines()[-1].split()
            rss[strategy] = f"{peak}, {grew}"
        print(f"3. {n:,} documents: stream {rss['stream']} MB, bfd {rss['bfd']} MB, online {rss['online']}", flush=True)
        rows.append(f"| {n:,} | {rss['stream']} | {rss['bfd']} | {rss['online']} |")
    return ["A process opens the split (or the text, for the online packer: shuffle buffer and packing buffer of "
            "10,000 documents each), then packs and serves 200 batches (B=8, T=4096): the peak of what numpy and "
            "Python allocated meanwhile (tracemalloc) and how much its RSS grew (the memory-mapped tokens read "
            "count too). Synthetic documents of 3-40 words, 10x more in the second row. The bfd figure is the run "
            "that planned the split (its plan is cached on disk for later runs).", "", *rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/performance.md alone")
    parser.add_argument("--quick", action="store_true", help="a small run, for a smoke test")
    args = parser.parse_args()
    require_corpus()
    print(f"{machine()}, load {load()}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        body = ["### tokenizing per reader", "", *section_speed(tmp, args.quick), "", "### packing fill", "",
                *section_fill(tmp), "", "### packing memory", "", *section_rss(tmp, args.quick)]  # fmt: skip
    body = [f"{machine()}, load {load()} at the start. `python scripts/bench_stream.py`.", "", *body]
    print("\n".join(body))
    if not args.no_write:
        update_performance_md("stream (scripts/bench_stream.py)", "\n".join(body))


if __name__ == "__main__":
    main()
