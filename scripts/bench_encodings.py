"""Benchmark the shard encodings (`prepare --shard-encoding`): size, loader speed, prepare speed.

Every speed is a ratio to uint32 measured in the same run:

1. Bytes per token of each encoding (uint32, uint16 where the vocabulary fits, packed, zstd) on
   the shared corpus and on code (the Python sources of the installed numpy and torch packages,
   sorted by path: local, offline and the same on every machine), for GPT-2 and a 128k-id
   vocabulary (Llama 3's tokenizer.json from a package on the index, pinned by sha256; skipped,
   with the reason, when it cannot be had).
2. The zstd parameters: block size × level × dictionary (none, or the dataset's trained from
   evenly spaced runs of its tokens, as `convert` trains it), each written with the format's
   own sealing, bytes per token and the time to decode the rows of a random B=32 × T=1024 batch
   (every block the rows touch, once) on the shared corpus: what the default (3,072-token
   blocks, level 6, a dictionary) was chosen from. Then the same tokens in the whole-shard
   codecs of two peers, on the same documents: mosaic streaming's MDSWriter with
   `compression="zstd"` (in the interop environment) and litdata's BinaryWriter with
   `compression="zstd"` (chunks of 64 MB), against lmshard's zstd, whose every row stays
   randomly readable.
3. Loader batches/s of each encoding against uint32, B=32, T=1024 and B=8, T=4096 random
   batches, on the corpus repeated 4 times (65 M tokens): mapped (the default for a split of
   at most 1 GiB) and read mode (`rss_limit=0`: what a split over 1 GiB, i.e. any pretraining
   set, gets). Best of 2 alternated timings of `--seconds` each.
4. Prepare throughput of each encoding against uint32 (the corpus repeated 2 times, 2 workers).

    python scripts/bench_encodings.py [--no-write] [--seconds 1.5]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tokenizers import REAL_VOCABULARIES, real_vocabulary  # noqa: E402
from benchlib import load, machine, require_corpus, update_performance_md, write_repeated  # noqa: E402

from lmshard import TokenDataset  # noqa: E402
from lmshard.format import Encoding, load_metadata  # noqa: E402
from lmshard.format.dictionary import SAMPLE_TOKENS, spread, train  # noqa: E402
from lmshard.format.sealing import seal_encoded, shard_entry  # noqa: E402
from lmshard.format.tokenfile import TokenFile  # noqa: E402
from lmshard.prepare import PrepareConfig, prepare  # noqa: E402

ENCODINGS = ("uint32", "uint16", "packed", "zstd")


def code_corpus(path: Path, mb: int = 40) -> Path:
    """Python sources of installed packages as one JSON line per file, up to `mb` MB."""
    import numpy
    import torch

    files = sorted(p for pkg in (numpy, torch) for p in Path(pkg.__file__).parent.rglob("*.py"))
    size = 0
    with open(path, "w", encoding="utf-8") as f:
        for p in files:
            text = p.read_text(encoding="utf-8", errors="replace")
            f.write(json.dumps({"text": text}) + "\n")
            size += len(text)
            if size > mb << 20:
                break
    return path


def _prepare(inputs: list[Path], out: Path, encoding: str, tokenizer: str) -> float:
    started = time.perf_counter()
    meta = prepare(PrepareConfig(inputs=[str(p) for p in inputs], out=str(out), shard_encoding=encoding,
                                 tokenizer=tokenizer, workers=2, val_fraction=0, overwrite=True, quiet=True))
    return meta.total_tokens / (time.perf_counter() - started)


def bytes_per_token(root: Path) -> float:
    meta = load_metadata(root)
    return sum(s.bin_bytes for s in meta.shards) / meta.total_tokens


def section_sizes(tmp: Path, vocabularies: list[tuple[str, str]], corpora: dict[str, Path]) -> list[str]:
    rows = ["| vocabulary | text | " + " | ".join(ENCODINGS) + " | zstd ÷ packed |", "|---|---|" + "---|" * 5]
    for label, tokenizer in vocabularies:
        for name, src in corpora.items():
            sizes = {}
            for enc in ENCODINGS:
                out = tmp / "size"
                try:
                    _prepare([src], out, enc, tokenizer)
                except Exception as e:  # uint16 for a vocabulary above 65,536 ids: refused, as it must be
                    sizes[enc] = None
                    print(f"   {label} {enc}: {str(e)[:90]}", flush=True)
                    continue
                sizes[enc] = bytes_per_token(out)
            cells = " | ".join("refused" if sizes[e] is None else f"{sizes[e]:.3f}" for e in ENCODINGS)
            ratio = (sizes["zstd"] or 0) / (sizes["packed"] or 1)
            print(f"1. {label}, {name}: {cells}", flush=True)
            rows.append(f"| {label} | {name} | {cells} | **{ratio:.2f}** |")
    return ["Bytes per token of the shard files (`.bin`; the block sums and offsets add 16 bytes per 3,072-token "
            "zstd block, 0.005 B/token, and 8 bytes per 16,384 tokens for the others; zstd's 64 KiB dictionary is in "
            "the metadata).", "", *rows]


def section_zstd(tmp: Path, root: Path) -> list[str]:
    """Block size × level × dictionary on the uint32 dataset `root`'s first train shard."""
    meta = load_metadata(root)
    shard = max(meta.split_shards("train"), key=lambda s: s.n_tokens)
    plain = root / shard.path
    tokens = np.fromfile(plain, dtype="<u4")
    sample = np.concatenate([tokens[offset : offset + n] for offset, n in spread(len(tokens))])
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, shard.n_tokens - 1025, 32) for _ in range(200)]
    rows = ["| block tokens | level | dictionary | bytes/token | decode a B=32 × T=1024 batch (µs) | encode (M tokens/s) |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for block, level, with_dict in itertools.product((1024, 2048, 3072, 4096, 16384), (3, 6, 9), (False, True)):
        enc = dataclasses.replace(Encoding.choose("zstd", meta.tokenizer.n_vocab), block_tokens=block, level=level)
        if with_dict:
            enc = enc.with_dictionary(train(sample, enc))
        tmp_bin = tmp / "u32.tmp"
        tmp_bin.write_bytes(plain.read_bytes())
        (tmp / "train").mkdir(exist_ok=True)
        started = time.perf_counter()
        sealed = seal_encoded(tmp_bin, tmp / "train" / "shard_000000.bin", "train/shard_000000.bin", enc,
                              shard.n_tokens)  # fmt: skip
        encode = shard.n_tokens / (time.perf_counter() - started) / 1e6
        info = shard_entry("train", "train/shard_000000.bin", "train/shard_000000.idx", shard.n_tokens,
                           shard.n_docs, "", enc, sealed)  # fmt: skip
        f = TokenFile(tmp, info, enc, mapped=True)
        for starts in batches[:5]:
            f.read_rows(starts, 1025)
        best = float("inf")
        for _ in range(2):
            started = time.perf_counter()
            for starts in batches:
                f.read_rows(starts, 1025)
            best = min(best, (time.perf_counter() - started) / len(batches))
        f.close()
        size = sealed.n_bytes / shard.n_tokens
        kib = f"{len(enc.dictionary) >> 10} KiB" if enc.dictionary else "none"
        print(f"2. block {block} level {level} dictionary {kib}: {size:.3f} B/token, {best * 1e6:.0f} us/batch, "
              f"encode {encode:.1f} M tokens/s", flush=True)  # fmt: skip
        rows.append(f"| {block:,} | {level} | {kib} | {size:.3f} | {best * 1e6:.0f} | {encode:.1f} |")
    return [f"The shared corpus, GPT-2 ({shard.n_tokens:,} tokens), one shard sealed per setting; a batch decodes each "
            "block its 32 random rows touch once (from the mapped file: no read calls). The dictionary is trained from "
            f"{SAMPLE_TOKENS:,} tokens in 16 evenly spaced runs (format/dictionary.py); its bytes are not counted "
            "here (64 KiB: 0.004 bytes per token of this shard).", "", *rows]


_MDS = """
import json, sys
import numpy as np
from streaming import MDSWriter
tokens, lengths, out = np.load(sys.argv[1]), np.load(sys.argv[2]), sys.argv[3]
with MDSWriter(out=out, columns={"tokens": "ndarray:uint16"}, compression="zstd") as w:
    at = 0
    for n in lengths.tolist():
        w.write({"tokens": tokens[at : at + n]})
        at += n
"""


def _litdata_zstd() -> None:
    """litdata's `compression="zstd"` (each chunk one zstd frame at level 4: its ZSTDCompressor(4))
    with the `zstd` module it imports answered by `zstandard` (the same libzstd), which the
    project has: litdata's own writer then writes its compressed chunks."""
    import types

    import litdata.streaming.compression as compression
    import zstandard

    shim = types.SimpleNamespace(compress=lambda data, level: zstandard.ZstdCompressor(level=level).compress(data),
                                 decompress=lambda data: zstandard.ZstdDecompressor().decompress(data))  # fmt: skip
    zstd = compression.ZSTDCompressor.__new__(compression.ZSTDCompressor)  # (its __init__ asks for the module)
    zstd.level, zstd.extension, zstd._zstd = 4, "zstd", shim
    compression._COMPRESSORS.setdefault("zstd", zstd)


def section_peers(tmp: Path, zstd_root: Path) -> list[str]:
    """lmshard's zstd (with and without its dictionary) against two peers' whole-shard zstd, on
    the same documents' tokens (the train split of the corpus, GPT-2)."""
    from litdata.streaming.writer import BinaryWriter

    meta = load_metadata(zstd_root)
    ds = TokenDataset(zstd_root)
    tokens = np.asarray(ds.tokens(0, ds.n_tokens)).astype(np.uint16)
    lengths = np.concatenate([np.diff(np.fromfile(zstd_root / s.index_path, dtype="<u8")) for s in
                              meta.split_shards("train")])  # fmt: skip
    assert lengths.sum() == len(tokens)
    np.save(tmp / "tokens.npy", tokens)
    np.save(tmp / "lengths.npy", lengths)
    stub = tmp / "placeholder"  # mosaic streaming imports torchvision at its top; the bench reads no image
    for rel, text in {"torchvision/__init__.py": "", "torchvision/datasets.py": "class VisionDataset: pass\n"
                      "class CIFAR10: pass\n", "torchvision/transforms/__init__.py": "",
                      "torchvision/transforms/functional.py": "def to_tensor(x): raise NotImplementedError\n"}.items():  # fmt: skip
        (stub / rel).parent.mkdir(parents=True, exist_ok=True)
        (stub / rel).write_text(text)
    sizes: dict[str, float | None] = {}
    interop = Path(sys.prefix) / "interop" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(interop), "-c", _MDS, str(tmp / "tokens.npy"), str(tmp / "lengths.npy"),
                           str(tmp / "mds")], env={**env, "PYTHONPATH": str(stub)}, capture_output=True, text=True)  # fmt: skip
    sizes["mosaic streaming MDS, zstd (whole 64 MB shards, level 3)"] = (
        sum(p.stat().st_size for p in (tmp / "mds").glob("shard.*.mds.zstd")) / len(tokens)
        if done.returncode == 0 else None)  # fmt: skip
    if done.returncode:
        print(f"   MDS: {done.stderr.strip().splitlines()[-1:]}", flush=True)
    _litdata_zstd()
    writer = BinaryWriter(str(tmp / "litdata"), chunk_bytes="64MB", compression="zstd")
    at = 0
    for i, n in enumerate(lengths.tolist()):
        writer.add_item(i, tokens[at : at + n])
        at += n
    writer.done()
    sizes["litdata, zstd (64 MB chunks, level 4)"] = sum(p.stat().st_size for p in (tmp / "litdata").glob("*.bin")) / len(tokens)
    ours = sum(s.bin_bytes for s in meta.split_shards("train")) / len(tokens)
    plain = tmp / "plain_zstd"
    from lmshard.interop.convert import convert_dataset

    convert_dataset(zstd_root, "zstd", plain, dictionary=False)
    without = sum(s.bin_bytes for s in load_metadata(plain).split_shards("train")) / len(tokens)
    rows = ["| shards | bytes/token | lmshard zstd ÷ it |", "|---|---|---|",
            f"| lmshard zstd: {meta.encoding.describe()}, every row randomly readable | {ours:.3f} | **1.00** |",
            f"| lmshard zstd without the dictionary | {without:.3f} | **{ours / without:.2f}** |"]  # fmt: skip
    for name, size in sizes.items():
        rows.append(f"| {name} | " + ("failed" if size is None else f"{size:.3f} | **{ours / size:.2f}**") + " |")
    print("2b. " + "; ".join(r for r in rows[2:]), flush=True)
    return [f"The corpus' train split ({len(tokens):,} GPT-2 tokens in {len(lengths):,} documents, as uint16), written "
            "by each tool; the shard files' bytes only.", "", *rows]


def _rate(it, seconds: float) -> float:  # type: ignore[no-untyped-def]
    for _ in range(3):
        next(it)
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        next(it)
        n += 1
    return n / (time.perf_counter() - started)


def section_loader(tmp: Path, src: Path, seconds: float, tokenizer: str = "gpt2",
                   label: str = "GPT-2") -> tuple[list[str], dict[str, float]]:  # fmt: skip
    encodings = [e for e in ENCODINGS if e != "uint16" or tokenizer == "gpt2"]
    roots = {e: tmp / f"load_{e}" for e in encodings}
    speed = {e: _prepare([src], roots[e], e, tokenizer) for e in encodings}
    n_tokens = load_metadata(roots["uint32"]).total_tokens
    others = encodings[1:]
    rows = ["| mode | batch | " + " | ".join(f"{e} (batches/s)" for e in encodings) + " | "
            + " | ".join(f"{e} ÷ uint32" for e in others) + " |",
            "|---|---|" + "---|" * (len(encodings) + len(others))]  # fmt: skip
    for mode, rss in (("mapped", None), ("read", 0)):
        for B, T in ((32, 1024), (8, 4096)):
            best = dict.fromkeys(encodings, 0.0)
            sets = {e: TokenDataset(roots[e], rss_limit=rss) for e in encodings}
            for _ in range(2):  # alternated: a shared machine's load hits every encoding alike
                for e in encodings:
                    best[e] = max(best[e], _rate(iter(sets[e].random_batches(B, T, seed=1)), seconds))
            ratios = {e: best[e] / best["uint32"] for e in others}
            print(f"3. {label} {mode} B={B} T={T}: " + ", ".join(f"{e} {best[e]:,.0f}" for e in encodings), flush=True)
            rows.append(f"| {mode} | B={B}, T={T} | " + " | ".join(f"{best[e]:,.0f}" for e in encodings) + " | "
                        + " | ".join(f"**{ratios[e]:.2f}**" for e in others) + " |")  # fmt: skip
    for root in roots.values():
        shutil.rmtree(root)
    return [f"{label}: the corpus ×4 ({n_tokens:,} tokens), random batches (`random_batches(B, T)`, x and y as int64 "
            "tensors), best of 2 alternated timings.", "", *rows], speed


ZSTD_NOTE = ("A zstd batch decodes every 3,072-token frame its rows touch (B=32 × T=1,024: about 43 frames, 12-18 µs "
             "each on this machine, in zstd's C code, with the dataset's dictionary) where a uint32 batch is a gather "
             "at about 2 ns a token, so zstd serves several times fewer batches a second: still over 1,000 a second, "
             "far more than a GPU step consumes. A packed batch of 8, 16 or 32 bits is read as plain integers; other "
             "widths (17 bits) unpack one word per token. The uint32 figures are for a split held in the page cache: "
             "a zstd split needs a fifth of the memory to stay there.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/performance.md alone")
    parser.add_argument("--seconds", type=float, default=1.5, help="length of one loader timing")
    args = parser.parse_args()
    require_corpus()
    print(f"{machine()}, load {load()}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        corpora = {"shared corpus": require_corpus(), "code": code_corpus(tmp / "code.jsonl")}
        vocabularies = [("GPT-2 (50,257 ids)", "gpt2")]
        label, req, member, sha = REAL_VOCABULARIES[0]
        llama = real_vocabulary(req, member, sha)
        if llama is not None:
            vocabularies.append((f"{label} (128,256 ids)", str(llama)))
        sizes = section_sizes(tmp, vocabularies, corpora)
        _prepare([require_corpus()], tmp / "plain", "uint32", "gpt2")
        (tmp / "z").mkdir()
        zstd = section_zstd(tmp / "z", tmp / "plain")
        _prepare([require_corpus()], tmp / "zstd", "zstd", "gpt2")
        (tmp / "peers").mkdir()
        peers = section_peers(tmp / "peers", tmp / "zstd")
        four = write_repeated(tmp / "x4.jsonl.gz", 4)
        loader, speed = section_loader(tmp, four, args.seconds)
        if llama is not None:  # 17 bits per packed token, 3-byte ids in zstd frames
            loader += ["", *section_loader(tmp, four, args.seconds, str(llama), "Llama 3 (128,256 ids)")[0]]
        twice = write_repeated(tmp / "x2.jsonl.gz", 2)
        speed2 = {e: _prepare([twice], tmp / f"p_{e}", e, "gpt2") for e in ENCODINGS}
        for e in ENCODINGS:  # best of the two prepares of each encoding (×4 above, ×2 here)
            speed[e] = max(speed[e], speed2[e])
    prep = ["| encoding | prepare tokens/s (2 workers) | ÷ uint32 |", "|---|---|---|"]
    prep += [f"| {e} | {speed[e]:,.0f} | **{speed[e] / speed['uint32']:.2f}** |" for e in ENCODINGS]
    print("4. prepare: " + ", ".join(f"{e} {speed[e]:,.0f}" for e in ENCODINGS), flush=True)
    body = [f"{machine()}, load {load()} at the end. `python scripts/bench_encodings.py`.", "",
            "### bytes per token", "", *sizes, "", "### zstd block size, level and dictionary", "", *zstd, "",
            "### zstd against whole-shard codecs", "", *peers, "",
            "### loader", "", *loader, "", ZSTD_NOTE, "", "### prepare", "",
            "The best tokens/s of two runs per encoding (the corpus ×4 and ×2), 2 workers.", "", *prep]  # fmt: skip
    print("\n".join(body))
    if not args.no_write:
        update_performance_md("shard encodings (scripts/bench_encodings.py)", "\n".join(body))


if __name__ == "__main__":
    main()
