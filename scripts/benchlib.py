"""Helpers shared by the benchmarks: the shared corpus, process-tree RSS sampling, a machine line,
the load average."""

from __future__ import annotations

import gzip
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

CORPUS = Path(
    os.environ.get(
        "LMSHARD_BENCH_CORPUS", Path(__file__).resolve().parents[2] / "shared" / "corpus" / "linux-docs.jsonl.gz"
    )
)


# Runs lmshard's command line in this process, then writes the CPU seconds of this process and
# of its reaped children (the workers) to the file named by $RUSAGE_OUT.
WRAPPER = """
import json, os, resource, sys
from lmshard.cli import main
sys.argv[0] = "lmshard"
try:
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
# VmHWM: this process's own peak since exec (ru_maxrss starts from the RSS of the process it was forked from)
hwm = next((int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")), me.ru_maxrss)
with open(os.environ["RUSAGE_OUT"], "w") as f:
    json.dump({"main": me.ru_utime + me.ru_stime, "children": kids.ru_utime + kids.ru_stime,
               "main_rss_mb": hwm / 1024, "child_rss_mb": kids.ru_maxrss / 1024}, f)
sys.exit(code)
"""


def run_measuring_cpu(args: list[str], env: dict[str, str], usage: Path) -> tuple[float, dict[str, float]]:
    """(wall seconds, WRAPPER's figures) of `lmshard ARGS` run through WRAPPER."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", WRAPPER, *args], check=True, env=env | {"RUSAGE_OUT": str(usage)},
                   capture_output=True)  # fmt: skip
    return time.perf_counter() - start, json.loads(usage.read_text())


def compile_package() -> None:
    """Write lmshard's bytecode, as `pip install` does for an installed package. In an editable
    install with PYTHONDONTWRITEBYTECODE set (as on these machines) every `lmshard` run would
    otherwise compile the package again (~0.1 s of CPU), a cost no installed copy pays."""
    import compileall

    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "lmshard"), quiet=1)


def require_corpus() -> Path:
    if not CORPUS.is_file():
        raise SystemExit(
            f"benchmark corpus not found at {CORPUS}; set LMSHARD_BENCH_CORPUS to ../shared/corpus/linux-docs.jsonl.gz"
        )
    return CORPUS


def load_texts(copies: int = 1) -> list[str]:
    """The corpus texts, repeated `copies` times; copies after the first get a salt line so that
    deduplication does not remove them (as the corpus README describes)."""
    with gzip.open(require_corpus(), "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    out = list(texts)
    for k in range(1, copies):
        out.extend(f"copy {k}\n{t}" for t in texts)
    return out


def write_repeated(path: Path, copies: int) -> Path:
    """The corpus as a .jsonl.gz file repeated `copies` times (salted, per-copy ids)."""
    if copies == 1:
        return require_corpus()
    with gzip.open(require_corpus(), "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1) as f:
        for k in range(copies):
            for r in records:
                text = r["text"] if k == 0 else f"copy {k}\n{r['text']}"
                f.write(json.dumps({"id": f"{r['id']}#{k}", "text": text}) + "\n")
    return path


def _pss(pid: int) -> int:
    """A process's PSS in bytes: its pages, each shared one split between its sharers."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
    except (OSError, StopIteration, ValueError):
        return 0


def _tree_rss(pid: int, pss: bool = False) -> tuple[int, int, int]:
    """(RSS of pid, RSS of pid and all its descendants, their PSS with `pss`, else 0) in bytes, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, shared, stack = 0, 0, [pid]
    while stack:
        p = stack.pop()
        total += rss.get(p, 0)
        shared += _pss(p) if pss else 0
        stack.extend(children.get(p, []))
    return rss.get(pid, 0), total, shared


def run_measuring_rss(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, int]:
    """Run a command; return (seconds, peak RSS of the main process, peak RSS of its tree)."""
    seconds, main, tree, _ = run_measuring_memory(cmd, env, pss=False)
    return seconds, main, tree


def run_measuring_memory(cmd: list[str], env: dict[str, str] | None = None,
                         pss: bool = True) -> tuple[float, int, int, int]:  # fmt: skip
    """Run a command; return (seconds, peak RSS of the main process, peak of its tree's summed
    RSS (each process counts the pages it shares: an upper bound), peak of its tree's PSS (0
    without `pss`)), sampled every 50 ms."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks = [0, 0, 0]

    def sample() -> None:
        while proc.poll() is None:
            now = _tree_rss(proc.pid, pss)
            peaks[:] = [max(a, b) for a, b in zip(peaks, now, strict=True)]
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    _, err = proc.communicate()
    seconds = time.perf_counter() - start  # (before the sampler's last sleep: its 50 ms are not the command's)
    t.join()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
    return seconds, peaks[0], peaks[1], peaks[2]


def _io() -> dict[str, int]:
    with open("/proc/self/io", encoding="ascii") as f:
        return {key: int(value) for key, value in (line.split(":") for line in f)}


def run_measuring_io(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, int]:
    """Run a command to its end; the I/O of its whole process tree (Linux's /proc/self/io: the
    kernel adds a reaped child's counters to its parent's, so a command's workers count when the
    command waited for them): `rchar`/`wchar`, bytes through read and write calls (not through a
    memory map), `write_bytes`, bytes dirtied for the storage, and `cancelled_write_bytes`, those
    of files removed before they reached it."""
    before = _io()
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = _io()
    return {key: after[key] - before[key] for key in before}


def machine() -> str:
    cpu = "unknown cpu"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, Python {platform.python_version()}, {platform.system()}"


def load() -> str:
    """The 1-minute load average: on a shared machine, how many other processes wanted the cores."""
    return f"{os.getloadavg()[0]:.1f}"


def update_performance_md(section: str, body: str) -> None:
    """Replace (or add) `## section` in docs/performance.md, keeping a hand-written `## notes…`
    section last."""
    path = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
    text = (
        path.read_text()
        if path.exists()
        else "# Performance\n\nFigures written by `make bench` (scripts/bench_*.py).\n"
    )
    head, *sections = text.split("\n## ")
    sections = [s.rstrip() + "\n" for s in sections if not s.startswith(section + "\n")]
    notes = [s for s in sections if s.startswith("notes")]
    others = [s for s in sections if not s.startswith("notes")]
    ordered = [*others, f"{section}\n{body.rstrip()}\n", *notes]
    path.write_text("\n## ".join([head.rstrip() + "\n", *ordered]))
