"""Benchmark the stages on one machine, every prepare's one path: against one reading process
(the path small inputs and streams took before, run from a checkout of that version: --reader),
and what each stage costs.

1. `lmshard prepare --workers 2` three ways: with one reading process feeding the workers (the
   retired path, from --reader), as staged tasks in the worker pool (what a plain prepare of this input
   does), and `--num-tasks 4` (the same stages, planned for 4 tasks); with `--before CHECKOUT`
   also a plain prepare of an older checkout (make one with `git worktree add /tmp/old COMMIT`;
   PYTHONPATH pins it). Rotated, 3 runs each, on the shared corpus written twice (salted) as
   uncompressed JSON lines with 8 MiB units (LMSHARD_UNIT_BYTES) so that it is cut into ranges.
   Prints the ratios of median wall times and whether the outputs are byte-identical (metadata
   apart from its run record); and, from one more run of the first two through a wrapper
   (benchlib.WRAPPER), the CPU time of the main process against its workers'.
2. One task of each stage run alone (`lmshard run-task`): wall time, peak RSS, tokens per
   second; and the plan's and the work directory's sizes per unit and per token, from which
   docs/scaling.md estimates a 1,000-node run.
3. Small inputs (the corpus's first 100 KB, 1, 8, 16 and 32 MB, and a directory of 300 small
   text files, 1 MB): the command's wall time (its start included), `--workers 2`, in one
   reading process (--reader), as the stages of a plain prepare (in this process below 4 MiB, one
   unit, the files sharing it; one unit tokenized by the pool above) and as the stages in the
   pool (LMSHARD_POOL_BYTES=0), medians of 15 rotated runs, and the ratios. Then `--workers 1` on
   the corpus's first 8 MB and 20 MB and all of it (46 MB), the stages in the main process: one
   reading process against the stages, medians of 5 rotated runs, and byte identity.

4. `--max-docs 2000` on the same input and `--workers 2`: in one reading process, as a plain
   prepare and planned (`--num-tasks 4`): the stages tokenize the units in order and stop once
   those from the first hold 2,000 kept documents; then on the input as one .gz file, in one
   reading process and as a plain prepare (the main process reads the unit, every worker
   tokenizes its items, up to the one that holds the 2,000th). Medians of 3 rotated runs,
   against one reading process and the whole planned run of section 1, and byte identity.
5. The same input as one .gz file (one unit), `--workers 2`: one reading process against a
   plain prepare (the stages: the main process reads the unit, every worker tokenizes its work
   items), medians of 3 rotated runs, and whether the outputs are byte-identical.
6. The same input as a Hugging Face dataset of 8 parquet data files (`--hf DIR`), and its first
   2 MB as 2 files: one reading process against the stages (the main process, which has the
   dataset open, reads every data file; the workers tokenize), the same way.
7. The corpus once (46 MB) through a pipe, `--workers 2`: read in one pass (--reader) against a
   plain prepare (the stages on the copy it saves first) and `--num-tasks 4`, medians of 5
   rotated runs, and byte identity.

With `--dedup-lines`, every run removes repeated lines too (the two line stages run first in
the staged ones); its figures go to a section of their own.

    python scripts/bench_scaleout.py --reader CHECKOUT [--before CHECKOUT] [--no-write] [--dedup-lines] [--small-only]
        [--compressed-only] [--max-docs-only] [--hf-only] [--stdin-only]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (  # noqa: E402
    compile_package,
    load,
    machine,
    require_corpus,
    run_measuring_cpu,
    run_measuring_io,
    run_measuring_rss,
    update_performance_md,
)

LMSHARD = [sys.executable, "-m", "lmshard"]
UNIT = 8 << 20
# The baseline "one reading process": the path that read an input in one process and fed its
# workers, which every prepare took below 16 MiB (and for stdin) until the stages became its only
# path. It runs from a checkout of that version (--reader; `make bench` makes one with `git
# worktree`), forced onto that path whatever the input's size.
READER: dict[str, str] = {}
READER_COMMIT = "8f3b906"  # the last commit with that path


def corpus(path: Path, copies: int = 2) -> Path:
    with gzip.open(require_corpus(), "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    with open(path, "w", encoding="utf-8") as f:
        for k in range(copies):
            for r in records:
                f.write(
                    json.dumps({"id": f"{r['id']}#{k}", "text": r["text"] if k == 0 else f"copy {k}\n{r['text']}"})
                    + "\n"
                )
    return path


def revision(checkout: Path) -> str:
    """The commit a checkout is at (short hash), or its directory name outside git."""
    import subprocess

    got = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return got.stdout.strip() or checkout.name


def files(root: Path) -> dict[str, bytes]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "dataset_metadata.json":
                meta = json.loads(data)
                meta.pop("run")
                data = json.dumps(meta, sort_keys=True).encode()
            out[p.relative_to(root).as_posix()] = data
    return out


def rotated(kinds: dict[str, tuple[list[str], dict[str, str]]], runs: int, out: Callable[[int, int], Path]) -> list[float]:
    """Each kind's command and environment run `runs` times, the kinds in rotated order (its
    output `out(run, kind's index)`, put for `{out}` in the command); each kind's median
    seconds, in order."""
    names = list(kinds)
    times: dict[str, list[float]] = {k: [] for k in names}
    for i in range(runs):
        for kind in names[i % len(names) :] + names[: i % len(names)]:
            cmd, env = kinds[kind]
            dest = str(out(i, names.index(kind)))
            times[kind].append(run_measuring_rss([a.replace("{out}", dest) for a in cmd], env)[0])
    return [statistics.median(times[k]) for k in names]


SMALL = (100_000, 1_000_000, 8_000_000, 16_000_000, 32_000_000)  # bytes of input (section 3)
SMALL_RUNS = 15  # rotated runs per figure: tens of milliseconds apart, on a machine noisy by as much
SMALL_FILES = 300  # files of a directory of small text files (section 3), 1 MB in all


def small_inputs(t: Path) -> list[str]:
    """Section 3: the rows of its table."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    kinds = {"one process": READER,
             "the stages of a plain prepare": {},
             "the stages in the pool": {"LMSHARD_POOL_BYTES": "0"}}  # fmt: skip
    with gzip.open(require_corpus(), "rb") as f:
        head = f.read(max(SMALL) + (1 << 20))
    rows = ["| input (`--workers 2`) | " + " | ".join(kinds) + " | the stages / one process: plain; the pool |",
            "|---" * (len(kinds) + 2) + "|"]  # fmt: skip
    inputs = []
    for size in SMALL:
        src = t / f"small_{size}.jsonl"
        src.write_bytes(head[: head.rindex(b"\n", 0, size) + 1])
        inputs.append((src, f"{src.stat().st_size / 1e6:.1f} MB"))
    files = t / "small_files"
    files.mkdir(exist_ok=True)
    texts = [json.loads(line)["text"] for line in head.splitlines()[:-1]]
    for k in range(SMALL_FILES):
        (files / f"{k:04d}.txt").write_text(texts[k % len(texts)][: 1_000_000 // SMALL_FILES])
    inputs.append((files, f"{SMALL_FILES} files, {sum(p.stat().st_size for p in files.iterdir()) / 1e6:.1f} MB"))
    names = list(kinds)
    for src, label in inputs:
        cmd = [*LMSHARD, "prepare", str(src), "--out", "{out}", "--workers", "2"]
        med = rotated({k: (cmd, env | kinds[k]) for k in names}, SMALL_RUNS,
                      lambda i, k, src=src: t / f"small_out_{src.name}_{i}_{k}")  # fmt: skip
        rows.append(f"| {label} | " + " | ".join(f"{m:.2f} s" for m in med) +
                    f" | **{med[1] / med[0]:.2f}**; **{med[2] / med[0]:.2f}** |")  # fmt: skip
        print(f"3. {label}: " + ", ".join(f"{k} {m:.3f} s" for k, m in zip(names, med, strict=True)), flush=True)
    return rows


ONE_WORKER = (8_000_000, 20_000_000, None)  # section 3, --workers 1: the corpus's first 8 and 20 MB, all of it


def one_worker_rows(t: Path) -> list[str]:
    """Section 3, with one worker: one reading process against the stages (in the main process,
    units of up to 64 MiB: a plain prepare from 16 MiB), medians of 5 rotated runs."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    kinds = {"one process": READER, "the stages": {}}
    whole = corpus(t / "one_worker_all.jsonl", 1)
    rows = ["| input (`--workers 1`) | " + " | ".join(kinds) + " | the stages / one process | byte-identical |",
            "|---" * (len(kinds) + 3) + "|"]  # fmt: skip
    for size in ONE_WORKER:
        src = whole
        if size is not None:
            head = whole.read_bytes()[: size + (1 << 20)]
            src = t / f"one_worker_{size}.jsonl"
            src.write_bytes(head[: head.rindex(b"\n", 0, size) + 1])
        names = list(kinds)
        cmd = [*LMSHARD, "prepare", str(src), "--out", "{out}", "--workers", "1"]
        med = rotated({k: (cmd, env | kinds[k]) for k in names}, 5, lambda i, k, src=src: t / f"w1_{src.name}_{i}_{k}")
        same = files(t / f"w1_{src.name}_0_0") == files(t / f"w1_{src.name}_0_1")
        label = f"{src.stat().st_size / 1e6:.1f} MB"
        rows.append(f"| {label} | " + " | ".join(f"{m:.2f} s" for m in med) + f" | **{med[1] / med[0]:.2f}** | {same} |")
        print(f"3. --workers 1, {label}: " + ", ".join(f"{k} {m:.3f} s" for k, m in zip(names, med, strict=True)) +
              f"; byte-identical: {same}", flush=True)  # fmt: skip
    return rows


MAX_DOCS = 2000  # section 4


def compressed_rows(t: Path, src: Path) -> list[str]:
    """Section 5: the input as one .gz file (one unit): one reading process against a plain
    prepare (the stages: the unit read in the main process, its work items tokenized by every
    worker), `--workers 2`, medians of 3 rotated runs, and whether the outputs are identical."""
    gz = gzipped(t, src)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    kinds = {"one reading process": READER, "a plain prepare (the stages)": {}}
    names = list(kinds)
    cmd = [*LMSHARD, "prepare", str(gz), "--out", "{out}", "--workers", "2"]
    med = rotated({k: (cmd, env | kinds[k]) for k in names}, 3, lambda i, k: t / f"gz_{i}_{k}")
    same = files(t / "gz_0_0") == files(t / "gz_0_1")
    print(f"5. one .gz file ({gz.stat().st_size / 1e6:.0f} MB): " + ", ".join(f"{k} {m:.2f} s" for k, m in
          zip(names, med, strict=True)) + f"; ratio {med[1] / med[0]:.2f}; byte-identical: {same}", flush=True)  # fmt: skip
    return [f"| one .gz file, {gz.stat().st_size / 1e6:.0f} MB (`--workers 2`) | wall time (median of 3) |",
            "|---|---|", *(f"| {k} | {m:.2f} s |" for k, m in zip(names, med, strict=True)),
            f"| ratio the stages / one reading process | **{med[1] / med[0]:.2f}** |", "",
            f"Outputs byte-identical: **{same}**."]  # fmt: skip


def max_docs_rows(t: Path, src: Path, env: dict[str, str], options: list[str], whole: float | None) -> list[str]:
    """Section 4: --max-docs in one reading process, as a plain prepare (the stages: the units
    tokenized in order until N kept documents are counted) and planned (`--num-tasks 4`), then on
    the input as one .gz file (one unit, read in the main process, its work items tokenized by
    every worker) in one reading process and as a plain prepare; medians of 3 rotated runs,
    against `whole` (the median wall time of the whole planned run), and byte identity."""
    one = READER
    gz = gzipped(t, src)
    kinds = {"one reading process": (src, one, []), "a plain prepare (the stages)": (src, {}, []),
             "planned (`--num-tasks 4`)": (src, {}, ["--num-tasks", "4"]),
             "one .gz file, one reading process": (gz, one, []),
             "one .gz file, a plain prepare (the stages)": (gz, {}, [])}  # fmt: skip
    names = list(kinds)
    runs = {k: ([*LMSHARD, "prepare", str(path), "--out", "{out}", "--workers", "2", "--max-docs", str(MAX_DOCS),
                 *options, *extra], env | extra_env) for k, (path, extra_env, extra) in kinds.items()}  # fmt: skip
    med = dict(zip(names, rotated(runs, 3, lambda i, k: t / f"maxdocs_{i}_{k}"), strict=True))
    out = [files(t / f"maxdocs_0_{k}") for k in range(len(names))]
    same = out[0] == out[1] == out[2] and out[3] == out[4]
    print(f"4. --max-docs {MAX_DOCS}: " + ", ".join(f"{k} {m:.2f} s" for k, m in med.items()) +
          (f"; the whole planned run {whole:.2f} s" if whole else "") + f"; byte-identical: {same}", flush=True)  # fmt: skip
    against = "" if whole is None else " against the whole planned run |"
    rows = [f"| `--max-docs {MAX_DOCS}` (`--workers 2`) | wall time (median of 3) | against one reading process |{against}",
            "|---|---|---|" + ("---|" if whole else "")]  # fmt: skip
    for k, m in med.items():
        base = med["one .gz file, one reading process" if "gz" in k else "one reading process"]
        rows.append(f"| {k} | {m:.2f} s | **{m / base:.2f}** |" + (f" {m / whole:.2f} |" if whole else ""))
    return [*rows, "", f"Outputs byte-identical, for each input: **{same}**."]


def hf_rows(t: Path, src: Path) -> list[str]:
    """Section 6: the input as a directory of 8 parquet data files (`--hf DIR`, streamed as a hub
    dataset is), and its first 2 MB as 2 files: one reading process against the stages (this
    process reads every data file, the workers tokenize), `--workers 2`, medians of 3 rotated
    runs, and whether the outputs are byte-identical; and the 8 files with `--no-streaming`,
    from the copy `datasets` made in its cache before the timed runs (the stages' main process
    reads its rows, the workers tokenize)."""
    import subprocess

    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [json.loads(line)["text"] for line in src.read_text(encoding="utf-8").splitlines()]
    head, size = [], 0
    for text in texts:  # (the first 2 MB)
        head.append(text)
        size += len(text)
        if size > 2 << 20:
            break
    dirs = {}
    for name, rows, n in (("large", texts, 8), ("small", head, 2)):
        (t / f"hf_{name}" / "data").mkdir(parents=True)
        for k in range(n):
            part = rows[k * len(rows) // n : (k + 1) * len(rows) // n]
            pq.write_table(pa.table({"text": part}), t / f"hf_{name}" / "data" / f"train-{k:05d}-of-{n:05d}.parquet")
        dirs[name] = t / f"hf_{name}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(t / "hf_cache")}
    warm = [*LMSHARD, "prepare", "--hf", str(dirs["large"]), "--out", str(t / "hf_warm"), "--no-streaming", "--quiet"]
    subprocess.run(warm, env=env, check=True, capture_output=True)  # (the copy made once, untimed)
    kinds = {"one reading process": READER, "the stages": {}}
    rows_out = ["| `--hf DIR` (`--workers 2`) | one reading process | the stages | the stages / one process |",
                "|---|---|---|---|"]  # fmt: skip
    for name, path, extra in (("large", dirs["large"], []), ("small", dirs["small"], []),
                              ("downloaded", dirs["large"], ["--no-streaming"])):  # fmt: skip
        names = list(kinds)
        cmd = [*LMSHARD, "prepare", "--hf", str(path), "--out", "{out}", "--workers", "2", *extra]
        med = rotated({k: (cmd, env | kinds[k]) for k in names}, 3, lambda i, k, name=name: t / f"hf_out_{name}_{i}_{k}")
        same = files(t / f"hf_out_{name}_0_0") == files(t / f"hf_out_{name}_0_1")
        mb = sum(p.stat().st_size for p in path.rglob("*.parquet")) / 1e6
        print(f"6. --hf, {name} ({mb:.1f} MB of parquet): " + ", ".join(f"{k} {m:.2f} s" for k, m in
              zip(names, med, strict=True)) + f"; ratio {med[1] / med[0]:.2f}; byte-identical: {same}", flush=True)  # fmt: skip
        how = ", `--no-streaming` (the cached copy)" if extra else ""
        rows_out.append(f"| {len(list(path.rglob('*.parquet')))} data files, {mb:.1f} MB of parquet{how} | {med[0]:.2f} s "
                        f"| {med[1]:.2f} s | **{med[1] / med[0]:.2f}**{'' if same else ' (outputs differ)'} |")  # fmt: skip
    return rows_out


# A producer that writes FILE to stdout at about RATE MB/s, as a download piped in does.
PACED = ("import sys, time\nrate, start = float(sys.argv[2]) * 1e6, time.perf_counter()\nsent = 0\n"
         "with open(sys.argv[1], 'rb') as f:\n    while block := f.read(1 << 20):\n"
         "        sys.stdout.buffer.write(block)\n        sent += len(block)\n"
         "        time.sleep(max(0.0, sent / rate - (time.perf_counter() - start)))\n")


def stdin_rows(t: Path) -> list[str]:
    """Section 7: the corpus once (46 MB) through a pipe (`cat FILE | lmshard prepare -`), and
    from a producer of 40 MB/s (as a download is), `--workers 2`: read in one pass (--reader)
    against a plain prepare (the stages on the copy it saves first) and `--num-tasks 4`, medians
    of 5 rotated runs, and byte identity."""
    src = corpus(t / "stdin.jsonl", 1)
    (t / "paced.py").write_text(PACED)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    kinds = {"one pass": ([], READER), "a plain prepare (its saved copy)": ([], {}),
             "`--num-tasks 4`": (["--num-tasks", "4"], {})}  # fmt: skip
    names = list(kinds)
    line = " ".join([*LMSHARD, "prepare", "-", "--out", "{out}", "--workers", "2"])
    rows = ["| a pipe (`--workers 2`) | " + " | ".join(kinds) + " | a plain prepare / one pass |",
            "|---" * (len(kinds) + 2) + "|"]  # fmt: skip
    mb = src.stat().st_size / 1e6
    for tag, label, producer in (("cat", f"{mb:.1f} MB, `cat`", f"cat {src}"),
                                 ("paced", f"{mb:.1f} MB at 40 MB/s", f"{sys.executable} {t / 'paced.py'} {src} 40")):
        runs = {k: (["sh", "-c", f"{producer} | {line} {' '.join(extra)}"], env | extra_env)
                for k, (extra, extra_env) in kinds.items()}  # fmt: skip
        med = rotated(runs, 5, lambda i, k, tag=tag: t / f"stdin_out_{tag}_{i}_{k}")
        same = all(files(t / f"stdin_out_{tag}_0_0") == files(t / f"stdin_out_{tag}_0_{k}") for k in (1, 2))
        print(f"7. stdin, {label}: " + ", ".join(f"{k} {m:.2f} s" for k, m in zip(names, med, strict=True)) +
              f"; ratio {med[1] / med[0]:.2f}; byte-identical: {same}", flush=True)  # fmt: skip
        rows.append(f"| {label} | " + " | ".join(f"{m:.2f} s" for m in med) +
                    f" | **{med[1] / med[0]:.2f}**{'' if same else ' (outputs differ)'} |")  # fmt: skip
    return rows


def gzipped(t: Path, src: Path) -> Path:
    """`src` as one .gz file in `t` (made once)."""
    gz = t / "corpus.jsonl.gz"
    if not gz.exists():
        with open(src, "rb") as f, gzip.open(gz, "wb", compresslevel=1) as out:
            out.write(f.read())
    return gz


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-write", action="store_true", help="do not update docs/performance.md")
    ap.add_argument("--before", type=Path, help="an older checkout whose plain prepare is a baseline too")
    ap.add_argument("--reader", type=Path, required=True,
                    help=f"a checkout of lmshard at {READER_COMMIT}, whose one reading process is the baseline "
                         f"(git worktree add --detach DIR {READER_COMMIT})")  # fmt: skip
    ap.add_argument("--copies", type=int, default=2, help="copies of the corpus in the input (salted; 2: 83 MB)")
    ap.add_argument("--dedup-lines", action="store_true", help="every run with --dedup-lines")
    ap.add_argument("--small-only", action="store_true", help="section 3 only, printed (docs/ unchanged)")
    ap.add_argument("--compressed-only", action="store_true", help="section 5 only, printed (docs/ unchanged)")
    ap.add_argument("--max-docs-only", action="store_true", help="section 4 only, printed (docs/ unchanged)")
    ap.add_argument("--hf-only", action="store_true", help="section 6 only, printed (docs/ unchanged)")
    ap.add_argument("--stdin-only", action="store_true", help="section 7 only, printed (docs/ unchanged)")
    args = ap.parse_args()
    READER.update({"PYTHONPATH": str(args.reader.resolve()), "LMSHARD_STAGED_BYTES": str(1 << 50)})
    import subprocess  # (its modules compiled as this checkout's are: a run must not compile them as it imports)

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(args.reader / "lmshard")], check=True)
    options = ["--dedup-lines"] if args.dedup_lines else []
    stages = (("lines", "linedup") if args.dedup_lines else ()) + ("tokenize", "dedup", "select", "write")
    compile_package()
    print(machine(), flush=True)
    started = load()
    env = {**os.environ, "LMSHARD_UNIT_BYTES": str(UNIT), "HF_HUB_OFFLINE": "1"}
    if args.small_only:
        with tempfile.TemporaryDirectory() as tmp:
            print("\n".join(small_inputs(Path(tmp)) + [""] + one_worker_rows(Path(tmp))))
        return
    if args.stdin_only:
        with tempfile.TemporaryDirectory() as tmp:
            print("\n".join(stdin_rows(Path(tmp))))
        return
    if args.hf_only:
        with tempfile.TemporaryDirectory() as tmp:
            print("\n".join(hf_rows(Path(tmp), corpus(Path(tmp) / "corpus.jsonl", args.copies))))
        return
    if args.max_docs_only:
        with tempfile.TemporaryDirectory() as tmp:
            print("\n".join(max_docs_rows(Path(tmp), corpus(Path(tmp) / "corpus.jsonl", args.copies), env, options,
                                           None)))  # fmt: skip
        return
    if args.compressed_only:
        with tempfile.TemporaryDirectory() as tmp:
            print("\n".join(compressed_rows(Path(tmp), corpus(Path(tmp) / "corpus.jsonl", args.copies))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        src = corpus(t / "corpus.jsonl", args.copies)
        kinds = ["reader", "staged", "planned"] + (["before"] if args.before else [])
        reader_env = env | READER
        times: dict[str, list[tuple[float, int]]] = {k: [] for k in kinds}
        for i in range(3):
            for kind in kinds[i % len(kinds) :] + kinds[: i % len(kinds)]:
                out = t / f"{kind}{i}"
                extra = ["--num-tasks", "4"] if kind == "planned" else []
                run_env = env | {"PYTHONPATH": str(args.before.resolve())} if kind == "before" else env
                if kind == "reader":
                    run_env = reader_env
                sec, _, tree = run_measuring_rss([*LMSHARD, "prepare", str(src), "--out", str(out), "--workers", "2",
                                                  *options, *extra], run_env)  # fmt: skip
                times[kind].append((sec, tree))
                print(f"1. {kind}: {sec:.2f} s, peak RSS of the tree {tree / 2**20:.0f} MiB", flush=True)
        io = {}  # one more run of each, for its file I/O (no sampling thread reading /proc meanwhile)
        for kind in ("reader", "staged", "planned"):
            extra = ["--num-tasks", "4"] if kind == "planned" else []
            run_env = reader_env if kind == "reader" else env
            io[kind] = run_measuring_io([*LMSHARD, "prepare", str(src), "--out", str(t / f"io_{kind}"), "--workers", "2",
                                         *options, *extra], run_env)  # fmt: skip
            print(f"1. {kind} I/O: " + ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in io[kind].items()
                                                 if "char" in k or "bytes" in k), flush=True)  # fmt: skip
        cpu = {}  # and one through a wrapper, for the CPU time of the main process against its workers'
        for kind in ("reader", "staged"):
            run_env = reader_env if kind == "reader" else env
            _, cpu[kind] = run_measuring_cpu(["prepare", str(src), "--out", str(t / f"cpu_{kind}"), "--workers", "2",
                                              "--quiet", *options], run_env, t / f"cpu_{kind}.json")  # fmt: skip
            print(f"1. {kind} CPU: main process {cpu[kind]['main']:.2f} s, its workers {cpu[kind]['children']:.2f} s "
                  f"({100 * cpu[kind]['main'] / cpu[kind]['children']:.1f}%)", flush=True)  # fmt: skip
        input_bytes = src.stat().st_size
        same = files(t / "reader0") == files(t / "staged0") == files(t / "planned0")
        meta = json.loads((t / "reader0" / "dataset_metadata.json").read_text())
        tokens = meta["n_tokens"]
        med = {k: statistics.median(s for s, _ in v) for k, v in times.items()}
        print(f"1. staged / one reader wall time: {med['staged'] / med['reader']:.2f}, planned / one reader: "
              f"{med['planned'] / med['reader']:.2f} (reader {med['reader']:.2f} s, staged {med['staged']:.2f} s, "
              f"planned {med['planned']:.2f} s); byte-identical: {same}", flush=True)  # fmt: skip
        dist = t / "dist"
        run_measuring_rss(
            [*LMSHARD, "prepare", str(src), "--out", str(dist), "--num-tasks", "4", "--executor", "none", *options], env
        )
        work = t / ".dist.lmshard-work"
        plan = json.loads((work / "plan.json").read_text())
        plan_bytes = sum(p.stat().st_size for p in work.glob("plan*"))  # the head and its tables
        stage_rows = []
        steps = [(stage, ["--task", str(i)]) for stage in stages for i in range(4)]
        work_bytes = 0
        for stage, task in [*steps, ("finish", [])]:
            if stage == "write" and not work_bytes:  # the work folder at its largest: the write stage deletes units
                work_bytes = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
                work_files = sum(1 for p in work.rglob("*") if p.is_file())
            sec, main_rss, _ = run_measuring_rss([*LMSHARD, "run-task", "--stage", stage, *task, str(dist)], env)
            stage_rows.append((stage, " ".join(task), sec, main_rss))
            print(f"2. {stage} {' '.join(task)}: {sec:.2f} s, peak RSS {main_rss / 2**20:.0f} MiB", flush=True)
        n_units = plan["n_units"]
        small = small_inputs(t) + ["", "With one worker (a plain prepare on the stages from 16 MiB; medians of 5 rotated runs):", ""] + \
            one_worker_rows(t) if not args.dedup_lines else []  # fmt: skip
        capped = max_docs_rows(t, src, env, options, med["planned"])
        compressed = compressed_rows(t, src) if not args.dedup_lines else []
        streamed = hf_rows(t, src) if not args.dedup_lines else []
        piped = stdin_rows(t) if not args.dedup_lines else []
    tok = [r for r in stage_rows if r[0] == "tokenize"]
    per_task_tokens = tokens / 4
    flags = "".join(f" {o}" for o in options)
    names = {"reader": f"`prepare --workers 2{flags}`, one reading process feeding the workers",
             "staged": f"`prepare --workers 2{flags}`, staged tasks in the pool (the default for this input)",
             "planned": f"`prepare --workers 2{flags} --num-tasks 4` (local executor)",
             "before": f"`prepare --workers 2{flags}` at {revision(args.before) if args.before else ''}"}
    rows = ["| run | wall time (median of 3) | peak RSS of the process tree |", "|---|---|---|",
            *(f"| {names[k]} | {med[k]:.2f} s | {max(r for _, r in times[k]) / 2**20:.0f} MiB |" for k in times),
            f"| ratio staged / one reader | **{med['staged'] / med['reader']:.2f}** | |", "",
            "CPU time of the main process against its workers' (one more run each, `getrusage` of the process and "
            "of its reaped children):", "", "| run | main process | workers | share |", "|---|---|---|---|",
            *(f"| {names[k]} | {cpu[k]['main']:.2f} s | {cpu[k]['children']:.2f} s | "
              f"**{100 * cpu[k]['main'] / cpu[k]['children']:.1f}%** |" for k in cpu), "",
            "Bytes per token of each run's file I/O, its workers included (`/proc/self/io` of the process that "
            f"waited for it; {input_bytes / tokens:.2f} bytes of input per token): read and written through system "
            "calls (the pipes between the processes included: the one-reading path sends every token from a worker "
            "to the writing process), and dirtied for the storage less what was removed before it got there "
            "(files: the shards, and on the staged path each unit's tokens first).", "",
            "| run | read | written | to the storage |", "|---|---|---|---|",
            *(f"| {names[k]} | {io[k]['rchar'] / tokens:.2f} | {io[k]['wchar'] / tokens:.2f} | "
              f"{(io[k]['write_bytes'] - io[k]['cancelled_write_bytes']) / tokens:.2f} |" for k in io),
            *([f"| ratio staged / before | **{med['staged'] / med['before']:.2f}** | |"] if args.before else []), "",
            f"Outputs byte-identical (metadata apart from its run record): **{same}**. "
            f"{tokens:,} tokens, {n_units} units of {UNIT >> 20} MiB.", "",
            "| stage, one task alone | wall time | peak RSS | tokens/s |", "|---|---|---|---|"]  # fmt: skip
    for stage, task_id, sec, rss in stage_rows:
        rate = f"{per_task_tokens / sec:,.0f}" if stage in ("tokenize", "write") else "—"
        rows.append(f"| {stage} {task_id} | {sec:.2f} s | {rss / 2**20:.0f} MiB | {rate} |")
    rows += ["", f"Plan: {plan_bytes:,} bytes for {n_units} units ({plan_bytes / n_units:.0f} bytes per unit, "
             f"options included). Work directory at its largest (before the write stage): {work_bytes / tokens:.2f} bytes "
             f"per token, {work_files} files ({work_files / n_units:.1f} per unit). "
             f"Tokenize tasks: {statistics.median(s for _, _, s, _ in tok):.2f} s median."]  # fmt: skip
    if small:
        rows += ["", "Small inputs (the corpus's first bytes), whose plain prepare keeps the one-process start below 16 MiB: the "
                 "command's wall time, its start included (medians of 15 rotated runs):", "", *small]  # fmt: skip
    rows += ["", f"`--max-docs {MAX_DOCS}` on the same input: the stages' tokenize stage stops once the "
             "units from the first hold that many kept documents, the unit that holds the last of them after its work "
             "item, as one process does.", "",
             *capped]  # fmt: skip
    if compressed:
        rows += ["", "The same input as one .gz file, which is one unit: the main process reads it and every worker "
                 "tokenizes its work items.", "", *compressed]  # fmt: skip
    if streamed:
        rows += ["", "The same input as a Hugging Face dataset of parquet data files (`--hf DIR`), and its first 2 MB: "
                 "the stages' main process reads every data file and the workers tokenize its work items.", "",
                 *streamed]  # fmt: skip
    if piped:
        rows += ["", "The corpus once through a pipe: read in one pass, against the stages on the copy the planner "
                 "saves first.", "", *piped]  # fmt: skip
    copies = f" --copies {args.copies}" if args.copies != 2 else ""
    body = [f"Machine: {machine()}; load average (1 min) {started} at the start, {load()} at the end. Command: "
            f"`python scripts/bench_scaleout.py{flags}{copies}` (in `make bench` without --copies: the corpus "
            f"twice; here {input_bytes / 1e9:.2f} GB of input).", "", *rows]  # fmt: skip
    if not args.no_write:
        update_performance_md("scale-out" + (", --dedup-lines" if args.dedup_lines else ""), "\n".join(body))


if __name__ == "__main__":
    main()
