"""Benchmark prepare per tokenizer backend and vocabulary, and its start-up on small inputs.

Every figure is a ratio to a baseline measured in the same run (medians of alternating runs):

1. Backends, tiktoken vocabulary (GPT-2), the shared corpus repeated: `lmshard prepare` end to
   end (the CLI in a subprocess, all cores) with `--tokenizer-backend tiktoken` and `auto`
   (splintr when installed and exact), each against the raw tiktoken ceiling on all cores
   (`encode_to_numpy` per document, one process per core, texts already in memory, warm). The
   two runs' shards must be byte-identical (the script exits 1 if not). Also splintr's own raw
   rate under the same conditions, to show how much of it prepare keeps.
2. Start-up: prepare of a few MB of prose (the corpus's first documents) and of code (Python's
   standard library sources), start-up included, against the same warm ceiling on the same
   texts; and a one-record prepare's wall time against `lmshard --help` (the CLI's import).
3. A Hugging Face tokenizer.json (a byte-level BPE of 50k tokens trained here on the corpus):
   prepare against `tokenizers`' own `encode_batch` over the same texts, in one process with
   the library's thread pool on all cores, and in one single-threaded process per core.

    python scripts/bench_tokenizers.py [--copies 2] [--repeats 3] [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (  # noqa: E402
    compile_package,
    load,
    load_texts,
    machine,
    run_measuring_rss,
    update_performance_md,
    write_repeated,
)

LMSHARD = str(Path(sys.executable).with_name("lmshard"))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
BATCH_CHARS = 1 << 20  # texts per encode call: about one prepare work item


# --- raw encoders, warm, one process per core ----------------------------------------------


def _read(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _batches(texts: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    size = 0
    for t in texts:
        if size >= BATCH_CHARS:
            out.append([])
            size = 0
        out[-1].append(t)
        size += len(t)
    return out


def _encoder(kind: str, spec: str, threads: int):  # type: ignore[no-untyped-def]
    """A function from a batch of texts to its token count: the call under test."""
    if kind == "tiktoken":  # exactly what prepare's tiktoken backend does per document
        from lmshard.tokenizers.tiktoken_backend import TiktokenTokenizer

        enc = TiktokenTokenizer(spec)._enc
        return lambda batch: sum(len(enc.encode_to_numpy(t, disallowed_special=())) for t in batch)
    if kind == "splintr":
        from lmshard.tokenizers.splintr_backend import SplintrTokenizer

        tok = SplintrTokenizer(spec, threads=threads)
        return lambda batch: len(tok.encode_batch(batch)[0])
    import tokenizers  # the library itself, with its defaults

    lib = tokenizers.Tokenizer.from_file(spec)
    lib.encode_special_tokens = True
    return lambda batch: sum(len(e.ids) for e in lib.encode_batch(batch, add_special_tokens=False))


def _raw_worker(rank: int, n: int, kind: str, spec: str, threads: int, path: str, whole: bool,
                barrier, results) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    if kind == "hf":
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
        os.environ["RAYON_NUM_THREADS"] = str(threads)
    encode = _encoder(kind, spec, threads)
    texts = _read(path)[rank::n]
    batches = [texts] if whole else _batches(texts)
    encode(texts[:50])  # warm: a process's first calls are slower
    barrier.wait()
    start = time.perf_counter()
    tokens = sum(encode(b) for b in batches)
    results.put((tokens, time.perf_counter() - start))


def raw_rate(kind: str, spec: str, path: Path, processes: int, threads: int = 1, whole: bool = False) -> float:
    """Tokens/s of `kind` over the texts of `path`: `processes` warm processes, each encoding its
    share (in ~1 MiB batches, or in one call when `whole`) after a barrier; the slowest sets the time."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_raw_worker, args=(r, processes, kind, spec, threads, str(path), whole, barrier, results))
             for r in range(processes)]  # fmt: skip
    for p in procs:
        p.start()
    parts = [results.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(t for t, _ in parts) / max(s for _, s in parts)


# --- lmshard prepare, end to end -----------------------------------------------------------


def prepare(src: Path, out: Path, *extra: str) -> dict:
    cmd = [LMSHARD, "prepare", str(src), "--out", str(out), "--overwrite", *extra]
    seconds, _, _ = run_measuring_rss(cmd, env=ENV)
    meta = json.loads((out / "dataset_metadata.json").read_text())
    specials = 1 + (meta["tokenizer"].get("bos_id") is not None)
    tokens = meta["n_tokens"] - specials * meta["n_docs"]  # separators are not tokenizer output
    return {"tps": tokens / seconds, "seconds": seconds, "tokens": tokens, "backend": meta["tokenizer"]["backend"]}


def shard_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.suffix in (".bin", ".idx"):
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    run_measuring_rss(cmd, env=ENV)
    return time.perf_counter() - start


# --- inputs --------------------------------------------------------------------------------


def write_jsonl(path: Path, texts: list[str]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return path


def prose(mb: float) -> list[str]:
    texts, size = [], 0
    for t in load_texts(1):
        if size >= mb * 1e6:
            break
        texts.append(t)
        size += len(t.encode())
    return texts


def code(mb: float) -> list[str]:
    """Python standard library sources in path order, up to `mb` MB."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, size = [], 0
    for p in sorted(root.rglob("*.py")):
        if size >= mb * 1e6:
            break
        try:
            t = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(t)
        size += len(t.encode())
    return texts


def train_bpe(texts: list[str], path: Path, vocab: int = 50_000) -> Path:
    """A GPT-2-style byte-level BPE with <|endoftext|>, trained on `texts` (not a real model's
    vocabulary: none is reachable offline, and the speed depends on the model type and size)."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)  # fmt: skip
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))
    return path


# --- the three sections ---------------------------------------------------------------------


def section_backends(tmp: Path, copies: int, repeats: int, cores: int) -> tuple[list[str], bool]:
    src = write_repeated(tmp / f"corpus_x{copies}.jsonl.gz", copies)
    ceil, splintr_raw, runs = [], [], {"tiktoken": [], "auto": []}
    digests = {}
    for i in range(repeats):
        order = ["tiktoken", "auto"] if i % 2 == 0 else ["auto", "tiktoken"]
        ceil.append(raw_rate("tiktoken", "gpt2", src, cores))
        splintr_raw.append(raw_rate("splintr", "gpt2", src, cores))
        for backend in order:
            out = tmp / f"ds_{backend}"
            r = prepare(src, out, "--tokenizer-backend", backend, "--workers", str(cores))
            runs[backend].append(r)
            digests[backend] = shard_digest(out)
    c, s = statistics.median(ceil), statistics.median(splintr_raw)
    t, a = (statistics.median(r["tps"] for r in runs[b]) for b in ("tiktoken", "auto"))
    identical = digests["tiktoken"] == digests["auto"]
    tokens = runs["tiktoken"][0]["tokens"]

    def listed(values: list[float]) -> str:
        return " ".join(f"{v / 1e6:.2f}" for v in values)

    print(f"1. backends, corpus x{copies} ({tokens / 1e6:.1f} M tokens), {cores} cores, M tok/s per run: "
          f"ceiling {listed(ceil)}; splintr raw {listed(splintr_raw)}; "
          f"prepare tiktoken {listed([r['tps'] for r in runs['tiktoken']])}; "
          f"prepare auto ({runs['auto'][0]['backend']}) {listed([r['tps'] for r in runs['auto']])}")  # fmt: skip
    print(f"   ratios of medians to the tiktoken ceiling: prepare tiktoken {t / c:.2f}, prepare auto {a / c:.2f} "
          f"(target >= 2), splintr raw {s / c:.2f}; shards byte-identical: {'yes' if identical else 'NO'}")  # fmt: skip
    rows = [
        f"Corpus ×{copies} ({tokens / 1e6:.1f} M GPT-2 tokens), {cores} workers, medians of {repeats} alternating runs "
        "(M tokens/s of document text; the ceiling is tiktoken's `encode_to_numpy` per document, one warm process "
        "per core, texts in memory):", "",
        "| what | M tok/s | ratio to the tiktoken ceiling |", "|---|---|---|",
        f"| tiktoken ceiling | {c / 1e6:.2f} | 1.00 |",
        f"| splintr raw (same conditions, `encode_batch_flat` per ~1 MiB batch) | {s / 1e6:.2f} | {s / c:.2f} |",
        f"| prepare `--tokenizer-backend tiktoken` | {t / 1e6:.2f} | {t / c:.2f} |",
        f"| prepare `--tokenizer-backend auto` ({runs['auto'][0]['backend']}) | {a / 1e6:.2f} | **{a / c:.2f}** |", "",
        f"Shards of the two prepare runs byte-identical: **{'yes' if identical else 'NO'}** (sha256 over every .bin/.idx).",
    ]  # fmt: skip
    return rows, identical


def section_startup(tmp: Path, repeats: int, cores: int, sizes: list[float]) -> list[str]:
    rows = ["| input | M tokens | warm ceiling (M tok/s) | prepare auto, start-up included (s) | ratio | "
            "prepare tiktoken (s) | ratio |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, make, extra in (("prose", prose, []), ("code", code, ["--no-normalize"])):
        for mb in sizes:
            src = write_jsonl(tmp / f"{name}_{mb:g}.jsonl", make(mb))
            ceil, runs = [], {"auto": [], "tiktoken": []}
            for i in range(repeats):
                ceil.append(raw_rate("tiktoken", "gpt2", src, cores))
                for backend in ["auto", "tiktoken"] if i % 2 == 0 else ["tiktoken", "auto"]:
                    runs[backend].append(prepare(src, tmp / "small", "--tokenizer-backend", backend, *extra))
            c = statistics.median(ceil)
            a, t = (statistics.median(r["tps"] for r in runs[b]) for b in ("auto", "tiktoken"))
            sa, st = (statistics.median(r["seconds"] for r in runs[b]) for b in ("auto", "tiktoken"))
            tokens = runs["auto"][0]["tokens"]
            print(f"2. {name} {mb:g} MB ({tokens / 1e6:.2f} M tokens): warm ceiling {c / 1e6:.2f} M tok/s; prepare auto "
                  f"{sa:.2f} s = {a / c:.2f} of it (target >= 0.9), tiktoken {st:.2f} s = {t / c:.2f}", flush=True)  # fmt: skip
            rows.append(f"| {name}, {mb:g} MB | {tokens / 1e6:.2f} | {c / 1e6:.2f} | {sa:.2f} | **{a / c:.2f}** | "
                        f"{st:.2f} | {t / c:.2f} |")  # fmt: skip
    one = write_jsonl(tmp / "one.jsonl", ["one small record"])
    tiny = statistics.median(wall([LMSHARD, "prepare", str(one), "--out", str(tmp / "one"), "--overwrite"])
                             for _ in range(5))  # fmt: skip
    helps = statistics.median(wall([LMSHARD, "--help"]) for _ in range(5))
    print(f"2. one-record prepare {tiny:.2f} s; `lmshard --help` {helps:.2f} s (ratio {tiny / helps:.2f})")
    rows += ["", f"A one-record prepare takes {tiny:.2f} s against {helps:.2f} s for `lmshard --help` (the CLI's "
             f"import and start): {tiny / helps:.2f}× (medians of 5)."]  # fmt: skip
    return rows


def section_hf(tmp: Path, repeats: int, cores: int, mb: float) -> list[str]:
    texts = prose(mb)
    src = write_jsonl(tmp / "hf_input.jsonl", texts)
    start = time.perf_counter()
    spec = train_bpe(prose(5), tmp / "tokenizer.json")
    print(f"3. trained a 50k byte-level BPE on 5 MB in {time.perf_counter() - start:.1f} s", flush=True)
    threaded, single, runs = [], [], []
    for _ in range(repeats):
        threaded.append(raw_rate("hf", str(spec), src, 1, threads=cores, whole=True))
        single.append(raw_rate("hf", str(spec), src, cores, threads=1))
        runs.append(prepare(src, tmp / "hf_ds", "--tokenizer", str(spec), "--workers", str(cores)))
    t, s, p = statistics.median(threaded), statistics.median(single), statistics.median(r["tps"] for r in runs)
    print(f"3. tokenizer.json, {mb:g} MB ({runs[0]['tokens'] / 1e6:.2f} M tokens): encode_batch 1 process x {cores} threads "
          f"{t / 1e6:.2f} M tok/s, {cores} processes x 1 thread {s / 1e6:.2f}; prepare {p / 1e6:.2f} "
          f"= {p / t:.2f} / {p / s:.2f} of them")  # fmt: skip
    return [
        f"A 50k-token byte-level BPE trained here on 5 MB of the corpus (no real model's tokenizer.json is reachable "
        f"offline), over the corpus's first {mb:g} MB ({runs[0]['tokens'] / 1e6:.2f} M tokens), medians of {repeats}:", "",
        "| what | M tok/s | prepare's ratio to it |", "|---|---|---|",
        f"| `tokenizers` `encode_batch` (all texts in one call), 1 process × {cores} threads | {t / 1e6:.2f} | **{p / t:.2f}** |",
        f"| `tokenizers` `encode_batch` per ~1 MiB batch, {cores} processes × 1 thread | {s / 1e6:.2f} | {p / s:.2f} |",
        f"| lmshard prepare `--tokenizer tokenizer.json`, {cores} workers, end to end | {p / 1e6:.2f} | 1.00 |",
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=2, help="corpus repeats for the backend runs")
    ap.add_argument("--repeats", type=int, default=3, help="alternating baseline/prepare runs per figure")
    ap.add_argument("--quick", action="store_true", help="a smoke run: one repeat, small inputs")
    ap.add_argument("--no-write", action="store_true", help="do not update docs/performance.md")
    args = ap.parse_args()
    compile_package()
    if args.quick:
        args.copies, args.repeats = 1, 1
    cores = os.cpu_count() or 1
    print(f"{machine()}; load average {load()}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        backends, identical = section_backends(tmp, args.copies, args.repeats, cores)
        startup = section_startup(tmp, args.repeats, cores, [4] if args.quick else [4, 16])
        hf = section_hf(tmp, args.repeats, cores, 2 if args.quick else 10)
    body = "\n".join([
        f"Machine: {machine()}; load average {load()} after the run (other sessions share the cores: only the "
        "ratios mean anything). Command: `make bench` (`python scripts/bench_tokenizers.py`).", "",
        "### Backends (GPT-2 vocabulary)", "", *backends, "",
        "### Start-up on small inputs", "",
        "Wall time of the whole `lmshard prepare` command (interpreter start, imports, tokenizer load and gate, "
        "reading, cleaning, dedup, writing), as tokens/s against the tiktoken ceiling with warm workers on the same "
        f"texts (all {cores} cores). Code is prepared with `--no-normalize`.", "", *startup, "",
        "### Hugging Face tokenizer.json", "", *hf,
    ])  # fmt: skip
    if not args.no_write and not args.quick:
        update_performance_md("tokenizers", body)
    if not identical:
        raise SystemExit("the tiktoken and auto backends wrote different shards")


if __name__ == "__main__":
    main()
