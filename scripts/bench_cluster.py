"""File operations per task of a planned `prepare` as the plan grows: does any task's (or
once-step's) filesystem work grow with the number of units U?

What it runs. For each plan size U (`--units`, default 1000,4000), real planned runs in the two
task shapes of the 1,000-node plan in docs/scaling.md: one-core tasks of `--units-per-task` (4)
units (the plan's --workers 1: a task runs its items in its own process), and wide tasks of
`--wide-units` (262) units that run their items in a pool of `--wide-workers` processes (the
plan's --workers; 64 cores at scale, this machine's cores here). A run is `lmshard prepare IN
--out OUT --num-tasks N --executor none` with N = U / units per task, so the task count grows
with U and each task's share stays fixed; then every task of every stage (tokenize, dedup,
select, write; with `--dedup-lines`, lines and linedup first) and the finish. A few tasks of each stage are measured (the first, the middle,
the first with items, those with the fewest and the most items, and the last), each in a fresh
`lmshard run-task` process under `strace -f -y`. The measured tasks but the last run first, so
that they are typical tasks: none of them completes a group of the stage's marks (the fold,
which one task in 64 does) or a shard (its seal, once per shard); then the other tasks,
unmeasured, in this process (`stages.run_task` in `--jobs` forked processes), then the last
measured task, which finishes its stage (folds up to its summary, seals what is left) and makes
the stage's once-step: the layout (select) and, with
--near-dedup, the near-duplicate clusters (dedup); a once-step's counts are that task's less the
largest other measured task's (a rough figure where a task's own items cost more than the step).
The plan (the prepare command) and the finish are measured too.

What it counts, for paths under the run's input directory, its work directory and everything
else beside --out (the output, its staging directory and lock), each as strace's `-y` resolved
it: opens (open/openat/creat), stats (stat/lstat/newfstatat/statx/access/faccessat/readlink; an
fstat of an open file, an empty path, is not a lookup and is left out), creates (opens with
O_CREAT, mkdir, link and rename targets), unlinks (unlink/unlinkat/rmdir), directory listings
(getdents64 calls), bytes read (read/pread64/readv/preadv/sendfile, plus the length of each
mapping of such a file: np.memmap reads by page faults, which strace cannot see, so a mapping
counts whole) and bytes copied (copy_file_range: the write stage's tokens). "Metadata ops" is
opens + stats + listings + unlinks + mkdir/link/rename: one request to a parallel filesystem's
metadata servers each. A failed lookup (a marker not there yet) counts like any other. The
interpreter's start (imports, the vocabulary) touches no run path and is not counted; with
--wide-workers, the pool's processes are traced too (`-f`).

Inputs: generated text, `--docs-per-unit` (4) documents of about `--unit-bytes` (1000) bytes in
all per unit, with some exact and near duplicates. `--input parquet` (the default): files of
`--units-per-file` (100) row groups, one unit each, so input files grow with U as at scale (5.5
TB in ~2,600 files of ~2 GB holds ~100 units of 21 MB per file); `--input jsonl`: a file per unit
(a line-based file is cut into byte ranges of at least 64 KiB, so tiny units must be whole
files), where every per-input-file cost is a per-unit cost. Shards (--tokens-per-shard) and key
files (LMSHARD_KEYS_PER_FILE) hold about 20 units each, as 13,000 shards of 262,000 units do at
scale. Dedup buckets follow the input's size (32, the minimum, here); one more plan per shape at
the smallest U with more buckets (`--bucket-point`; planned with `taskplan.bucket_count`
replaced in the planning process, since no option sets them) gives each count's growth per
bucket.

Printed: per shape and U, each step's counts (per stage: its largest measured task with items,
its largest without, "idle", and the last); each step's metadata ops at every U and its growth
exponent k (count ~ U^k between the smallest and the largest U: 0 is flat, 1 grows like the
plan), and the same for bytes read; then the 1,000-node plan extrapolated (U = 262,000 units, B
= 4,096 buckets) per shape. There a stage's per-task count is a line in U through its values at
the smallest and largest U (from the largest; a count that shrinks, or grows by at most 10%, the
measure of fixed work, is taken as flat; a write
task's: its count per part, the largest over the measured tasks, times the parts per task at
the largest U, since a write task's parts and seals vary from task to task) except its
operations on the dedup groups' files (`dedup/group_*`, counted apart), taken as so many per
group of the largest plan times the groups at scale (a plan's buckets, or groups of them where
it has many tasks: taskplan.group_count, whose plans here group every bucket as a plan at scale
does, whatever their size; the bucket point is printed to show the same per group); a dedup task's count is its count per group held times the groups a task holds at scale
(its bytes read: the measured group's over the ratio of groups), and idle dedup tasks count as
the idle one measured; run totals add up every task, each counted as the median measured task
of its stage (the largest may have folded a group of the stage's marks, which happens once per
64 tasks; for the write stage, the median per part); wall times take the filesystem rates below
(MDS_OPS_PER_S, CLIENT_OPS_PER_S, CLIENT_BYTES_PER_S) and count only metadata ops and the bytes
read beyond the data's own (which these tiny units do not model: at scale a unit holds 21 MB).
The counts and their ratios are measured in one run; the extrapolation and the wall times are
estimates from them and the stated rates.

Time on this project's 2-core machines (shared, load 3 to 5): every unmeasured task costs O(U)
(it lists the inputs and parses the whole plan; where a stage's readiness is checked marker
by marker, it also stats every marker of the stages before it), so a size costs O(U^2) in
one-core tasks.
--quick (U = 100, 400, wide tasks of 25 units, fewer tasks measured) takes about a minute;
the default (1000, 4000, both shapes) 6 to 10 minutes; U = 16,000 adds 17 minutes of one-core
tasks and 2 of wide ones. 64,000 would take several hours here and is not in the default list
(`--units 1000,4000,16000,64000` runs it).

Memory model: this process holds one plan at a time (what `run_task` loads: about 300 bytes per
unit), one result per plan (a few counters per measured task), the generator one input file's
documents and a pool of up to 10,000 earlier texts to copy; a trace is parsed line by line from
its file (deleted after), holding only the calls another thread left unfinished. Run directories
go under `--dir` (/dev/shm with 4 GiB free: the counts do not depend on the disk) and are removed
when their plan is done; the inputs stay until the end.

    python scripts/bench_cluster.py [--quick] [--units 1000,4000,16000] [--near-dedup] [--attribute NAME]
        [--val-tokens N] [--checkout DIR]
"""

from __future__ import annotations

import argparse
import codecs
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import compile_package, load, machine  # noqa: E402

# The plan of docs/scaling.md: FineWeb-Edu, 5.5 TB of JSON lines on 1,000 nodes of 64 cores.
SCALE_UNITS = 262_000
SCALE_BUCKETS = 4_096
SCALE_CORES = 64
# Filesystem rates for the wall-time estimates (assumptions, not measurements): a parallel
# filesystem's metadata servers together, one process waiting on one metadata request at a
# time, and one node's read bandwidth.
MDS_OPS_PER_S = 50_000
CLIENT_OPS_PER_S = 2_000
CLIENT_BYTES_PER_S = 1e9

DOMAINS = ("web", "books", "code", "papers", "forums", "news", "wiki", "law")  # --val-by domain: the field's values
STAGES = ("tokenize", "dedup", "select", "write")
LINE_STAGES = ("lines", "linedup")  # with --dedup-lines, first


def stages_of(lines: bool) -> tuple[str, ...]:
    return (*LINE_STAGES, *STAGES) if lines else STAGES

KEYS = ("opens", "stats", "creates", "unlinks", "lists", "read", "copied", "meta", "in_meta", "group_meta")
TRACED = ("open,openat,creat,stat,lstat,newfstatat,statx,access,faccessat,faccessat2,readlink,readlinkat,mkdir,"
          "mkdirat,link,linkat,rename,renameat,renameat2,unlink,unlinkat,rmdir,getdents64,read,pread64,readv,preadv,"
          "preadv2,mmap,copy_file_range,sendfile")  # fmt: skip
# A count within this fraction of its value at the smallest U is flat (the check of fixed work per task); a
# line through two such values would turn a task sampled with one more marker into growth with U.
FLAT = 0.10
UNITS_PER_SHARD = 20  # units per shard and per key file: 262,000 units / 13,000 shards at scale

# Runs `python -m lmshard` in this process. A plan groups its dedup buckets as a plan at scale does
# (every bucket a group, below the 2^24 cap: taskplan.group_count without the input's size and
# processes), not as few as these tiny inputs and few processes would get, so that the count per group
# is measured at the same grouping at every U; with BENCH_CLUSTER_BUCKETS set, the plan gets that many
# dedup buckets (no option sets them: they follow the input's size).
WRAPPER = """
import os, runpy
from lmshard.prepare.execution import taskplan
grouped = taskplan.group_count
taskplan.group_count = lambda n_buckets, n_tasks, *sized: grouped(n_buckets, n_tasks)
if os.environ.get("BENCH_CLUSTER_BUCKETS"):
    taskplan.bucket_count = lambda total_bytes: int(os.environ["BENCH_CLUSTER_BUCKETS"])
runpy.run_module("lmshard", run_name="__main__", alter_sys=True)
"""


# --- counting --------------------------------------------------------------------------------

_GROUP_FILE = re.compile(r"/(dedup|lines)/group_")
_CALL = re.compile(r"^(\w+)\((.*)\)\s+=\s+(-?\d+|\?)")  # (a resumed call is padded: ")      = 3")
_FD = re.compile(r"^(?:\d+|AT_FDCWD)<(.*)>$")
_PATH1 = {"open", "creat", "stat", "lstat", "access", "readlink", "mkdir", "unlink", "rmdir"}
_AT1 = {"openat", "newfstatat", "statx", "faccessat", "faccessat2", "readlinkat", "mkdirat", "unlinkat"}
_STATS = {"stat", "lstat", "newfstatat", "statx", "access", "faccessat", "faccessat2", "readlink", "readlinkat"}
_READS = {"read", "pread64", "readv", "preadv", "preadv2"}


def _split_args(s: str) -> list[str]:
    """strace's argument list split at top-level commas (strings, structures and fd paths kept whole)."""
    out, cur, depth, quoted, i = [], [], 0, False, 0
    while i < len(s):
        c = s[i]
        if quoted:
            cur.append(c)
            if c == "\\" and i + 1 < len(s):
                cur.append(s[i + 1])
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
            cur.append(c)
        elif c in "{[(" or (c == "<" and cur and (cur[-1].isdigit() or cur[-1] == "D")):
            depth += 1
            cur.append(c)
        elif c in "}])>" and depth:
            depth -= 1
            cur.append(c)
        elif c == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    if cur:
        out.append("".join(cur).strip())
    return out


def _string(arg: str) -> str | None:
    if len(arg) < 2 or not arg.startswith('"'):
        return None
    body = arg[1 : arg.rindex('"')]
    return codecs.escape_decode(body.encode())[0].decode("utf-8", "surrogateescape")


def _fd_path(arg: str) -> str | None:
    m = _FD.match(arg)
    return m.group(1) if m else None


@dataclass
class Roots:
    """Where a run's files are: its inputs, its work directory, and everything else beside --out."""

    inputs: str
    work: str
    run: str
    cwd: str

    def area(self, path: str | None) -> str | None:
        if not path:
            return None
        for name, root in (("input", self.inputs), ("work", self.work), ("output", self.run)):
            if path == root or path.startswith(root + os.sep):
                return name
        return None


def _resolve(base: str | None, path: str, cwd: str) -> str:
    return os.path.normpath(path if path.startswith("/") else os.path.join(base or cwd, path))


def count_trace(lines: Iterator[str], roots: Roots) -> Counter[str]:
    """The counts (see the module docstring) of an `strace -f -y -s 0` log."""
    counts: Counter[str] = Counter()
    pending: dict[str, str] = {}

    def add(area: str | None, key: str, n: int = 1, meta: bool = False, path: str | None = None) -> None:
        if area is None:
            return
        counts[key] += n
        if meta:
            counts["meta"] += 1
            if area == "input":
                counts["in_meta"] += 1
            if path is not None and _GROUP_FILE.search(path):  # a file per dedup group (of documents or lines)
                counts["group_meta"] += 1

    for raw in lines:
        pid, _, rest = raw.rstrip("\n").partition(" ")
        rest = rest.lstrip()
        if rest.endswith("<unfinished ...>"):
            pending[pid] = rest[: -len("<unfinished ...>")].rstrip()
            continue
        if rest.startswith("<... "):
            m = re.match(r"<\.\.\. \w+ resumed>(.*)$", rest)
            if not m or pid not in pending:
                continue
            rest = pending.pop(pid) + m.group(1)
        m = _CALL.match(rest)
        if not m:
            continue
        name, args_s, ret_s = m.groups()
        ret = int(ret_s) if ret_s != "?" else -1
        args = _split_args(args_s)
        if name in _READS or name == "getdents64" or name in ("mmap", "copy_file_range", "sendfile"):
            at = {"mmap": 4, "sendfile": 1}.get(name, 0)
            if len(args) <= at:
                continue
            area = roots.area(_fd_path(args[at]))
            if name == "getdents64":
                add(area, "lists", meta=True, path=_fd_path(args[at]))
            elif name == "mmap":
                add(area, "read", int(args[1]) if args[1].isdigit() else 0)
            elif ret > 0:
                add(area, "copied" if name == "copy_file_range" else "read", ret)
            continue
        paths: list[str] = []
        if name in _PATH1 and args:
            p = _string(args[0])
            paths = [_resolve(None, p, roots.cwd)] if p is not None else []
        elif name in _AT1 and len(args) >= 2:
            p = _string(args[1])
            if p == "":  # fstat of an open file (AT_EMPTY_PATH): no lookup
                continue
            paths = [_resolve(_fd_path(args[0]), p, roots.cwd)] if p is not None else []
        elif name in ("rename", "link") and len(args) >= 2:
            p = _string(args[1])
            paths = [_resolve(None, p, roots.cwd)] if p is not None else []
        elif name in ("renameat", "renameat2", "linkat") and len(args) >= 4:
            p = _string(args[3])
            paths = [_resolve(_fd_path(args[2]), p, roots.cwd)] if p is not None else []
        if not paths:
            continue
        area, at = roots.area(paths[0]), paths[0]
        if name in ("open", "openat", "creat"):
            add(area, "opens", meta=True, path=at)
            if name == "creat" or (len(args) > 2 and "O_CREAT" in args[2 if name == "openat" else 1]):
                add(area, "creates")
        elif name in _STATS:
            add(area, "stats", meta=True, path=at)
        elif name in ("mkdir", "mkdirat", "rename", "renameat", "renameat2", "link", "linkat"):
            add(area, "creates", meta=True, path=at)
        elif name in ("unlink", "unlinkat", "rmdir"):
            add(area, "unlinks", meta=True, path=at)
    return counts


# --- inputs ----------------------------------------------------------------------------------

_SYLLABLES = [a + b for a in "bcdfghjklmnprstvwz" for b in ("a", "e", "i", "o", "u", "ar", "en", "is", "on")]


def _texts(rng: random.Random, n: int, words: int, pool: list[str]) -> list[str]:
    """n documents of `words` pseudo-words; about 5% copy an earlier one, 3% copy it with one word
    changed (a near duplicate); `pool` keeps up to 10,000 earlier texts to copy from."""
    out = []
    for _ in range(n):
        r = rng.random()
        if pool and r < 0.05:
            text = rng.choice(pool)
        elif pool and r < 0.08:
            ws = rng.choice(pool).split(" ")
            ws[rng.randrange(len(ws))] = "".join(rng.choices(_SYLLABLES, k=3))
            text = " ".join(ws)
        else:
            text = " ".join("".join(rng.choices(_SYLLABLES, k=rng.randint(1, 3))) for _ in range(words))
        out.append(text)
        if len(pool) < 10_000:
            pool.append(text)
        else:
            pool[rng.randrange(len(pool))] = text
    return out


def make_inputs(root: Path, units: int, kind: str, per_file: int, docs: int, unit_bytes: int) -> Path:
    """U units of generated text under root (see the module docstring); reused when present."""
    done = root / ".complete-domains"  # (inputs of a checkout that wrote no domain field are made again)
    if done.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    rng, pool = random.Random(units), list[str]()
    words = max(4, unit_bytes // docs // 6)  # ~6 bytes per pseudo-word and its space
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        for f in range(-(-units // per_file)):
            n = min(per_file, units - f * per_file)
            texts = _texts(rng, n * docs, words, pool)
            table = pa.table({"text": texts, "domain": [DOMAINS[k % len(DOMAINS)] for k in range(len(texts))]})
            pq.write_table(table, root / f"part-{f:05d}.parquet", row_group_size=docs)
    else:
        for u in range(units):
            sub = root / f"{u // 1000:04d}"
            sub.mkdir(exist_ok=True)
            lines = [json.dumps({"text": t, "domain": DOMAINS[k % len(DOMAINS)]})
                     for k, t in enumerate(_texts(rng, docs, words, pool))]  # fmt: skip
            (sub / f"unit-{u:06d}.jsonl").write_text("\n".join(lines) + "\n")
    done.touch()
    return root


# --- running ---------------------------------------------------------------------------------

_BULK: dict[str, Any] = {}  # what the forked bulk processes inherit: the run's configuration


def _bulk_task(job: tuple[str, int]) -> int:
    from lmshard.prepare.execution import stages

    stage, task = job
    config, n_tasks, unit_bytes = _BULK["run"]
    return stages.run_task(config, n_tasks, stage, task, unit_bytes)


def run_unmeasured(out: Path, stage: str, tasks: Sequence[int], jobs: int) -> None:
    """Tasks of `stage` through `stages.run_task`, here (jobs 1) or in forked processes (not
    daemonic: a task may start a pool of its own). A task that fails is run once more, as a
    failed task is recovered, and named on stderr."""
    from lmshard.prepare.execution import stages

    _BULK["run"] = stages.config_of(out)
    work = [(stage, t) for t in tasks]
    failed: list[tuple[tuple[str, int], BaseException]] = []
    if jobs <= 1 or len(work) < 2:
        for w in work:
            try:
                _bulk_task(w)
            except Exception as e:
                failed.append((w, e))
    else:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = {pool.submit(_bulk_task, w): w for w in work}
            for future in as_completed(futures):
                if (error := future.exception()) is not None:
                    failed.append((futures[future], error))
    for w, error in failed:
        print(f"warning: {stage} task {w[1]} failed ({type(error).__name__}: {error}); running it again",
              file=sys.stderr, flush=True)  # fmt: skip
        _bulk_task(w)


@dataclass
class Tracer:
    """Runs lmshard command lines under strace and counts their file operations."""

    roots: Roots
    env: dict[str, str]
    logs: Path
    keep: Path | None = None
    seq: int = 0

    def __call__(self, args: Sequence[str], extra_env: dict[str, str] | None = None) -> Counter[str]:
        self.seq += 1
        log = self.logs / f"trace-{self.seq}.log"
        cmd = ["strace", "-f", "-y", "-s", "0", "-qq", "-e", "signal=none", "-e", f"trace={TRACED}", "-o", str(log),
               sys.executable, "-c", WRAPPER, *args]  # fmt: skip
        got = subprocess.run(cmd, cwd=self.roots.cwd, env=self.env | (extra_env or {}), capture_output=True,
                             text=True)  # fmt: skip
        if got.returncode:
            raise SystemExit(f"lmshard {' '.join(args)} failed ({got.returncode}):\n{got.stderr[-3000:]}")
        with open(log, encoding="utf-8", errors="surrogateescape") as f:
            counts = count_trace(f, self.roots)
        if self.keep is not None:  # --keep-traces: named by what ran
            what = "-".join(str(a) for a in args[:5:2])
            shutil.move(log, self.keep / f"{self.seq:04d}-{Path(self.roots.run).name}-{what}.log")
        else:
            log.unlink()
        return counts


@dataclass
class Measured:
    task: int
    items: int
    counts: Counter[str]


@dataclass
class Result:
    shape: str
    units: int
    tasks: int
    buckets: int
    files: int
    groups: int = 0  # the dedup stage's items (taskplan.group_count)
    parts: int = 0
    plan: Counter[str] = field(default_factory=Counter)
    finish: Counter[str] = field(default_factory=Counter)
    stages: dict[str, list[Measured]] = field(default_factory=dict)  # the last one finished the stage
    seconds: dict[str, float] = field(default_factory=dict)


def pick(items: Sequence[int], few: bool = False) -> list[int]:
    """The tasks to measure: the first, the middle, the first with items, those with the fewest
    and the most items (`few`: only the first with items), and the last (run last: the one that
    finishes the stage)."""
    last = len(items) - 1
    rest = range(last)
    chosen = {next((t for t in rest if items[t]), 0)}
    if last > 0 and not few:
        chosen |= {0, len(items) // 2, min(rest, key=lambda t: items[t]), max(rest, key=lambda t: items[t])}
    return sorted(chosen - {last}) + [last]


@dataclass(frozen=True)
class Shape:
    name: str
    units_per_task: int
    workers: int  # the plan's --workers: the pool a task runs its items in (1: its own process)


def run_plan(args: argparse.Namespace, shape: Shape, units: int, buckets: int | None, root: Path,
             env: dict[str, str]) -> Result:  # fmt: skip
    """One planned run of `units` units, every stage, measuring the sampled tasks."""
    from lmshard.prepare.execution import stages
    from lmshard.prepare.execution.taskplan import work_dir

    started = time.perf_counter()
    inputs = make_inputs(root / f"in-{args.input}-{units}", units, args.input, args.units_per_file,
                         args.docs_per_unit, args.unit_bytes)  # fmt: skip
    made = time.perf_counter()
    run_dir = root / f"run-{re.sub(r'[^a-z0-9]+', '-', shape.name)}{units}-{buckets or 0}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    out = run_dir / "out"
    roots = Roots(str(inputs), str(work_dir(out)), str(run_dir), str(root))
    trace = Tracer(roots, env, root, args.keep_traces)
    n_tasks = -(-units // shape.units_per_task)
    tokens_per_unit = args.unit_bytes // 3  # pseudo-words of ~2 tokens per 6 bytes
    plan_args = ["prepare", str(inputs), "--out", str(out), "--num-tasks", str(n_tasks), "--executor", "none",
                 "--unit-size", "64K", "--tokens-per-shard", str(UNITS_PER_SHARD * tokens_per_unit),
                 "--workers", str(shape.workers), "--quiet", *(["--near-dedup"] if args.near_dedup else []),
                 *(["--dedup-lines"] if args.dedup_lines else []),
                 *(a for name in args.attribute for a in ("--attribute", name)),
                 *(["--val-by", args.val_by, "--val-tokens", str(args.val_tokens)] if args.val_tokens else [])]  # fmt: skip
    plan = trace(plan_args, {"BENCH_CLUSTER_BUCKETS": str(buckets)} if buckets else None)
    info = stages.status(out)
    if info["units"] != units:
        raise SystemExit(f"the plan cut the input into {info['units']} units, not {units}: --unit-bytes must stay "
                         "under 64 KiB so that each generated unit is one")  # fmt: skip
    res = Result(shape.name, units, n_tasks, info["buckets"], sum(1 for p in inputs.rglob("*") if p.is_file()) - 1,
                 groups=info["groups"], plan=plan)  # fmt: skip
    bulk = traced = 0.0
    for stage in stages_of(args.dedup_lines):
        row = stages.status(out)["stages"][stage]
        items = [t["items"] for t in row["tasks"]]
        if stage == "write":
            res.parts = int(row["total"])
        chosen = pick(items, few=args.quick)
        cmd = lambda t: ["run-task", "--stage", stage, "--task", str(t), str(out)]  # noqa: E731
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:  # (tasks of one stage are independent)
            counts = list(pool.map(lambda t: trace(cmd(t)), chosen[:-1]))  # first: typical tasks (no fold, no seal)
        t1 = time.perf_counter()
        run_unmeasured(out, stage, [t for t in range(n_tasks) if t not in chosen], args.jobs)
        t2 = time.perf_counter()
        counts.append(trace(cmd(chosen[-1])))  # the last task to finish the stage: its once-step
        res.stages[stage] = [Measured(t, items[t], c) for t, c in zip(chosen, counts, strict=True)]
        bulk, traced = bulk + t2 - t1, traced + (t1 - t0) + time.perf_counter() - t2
    res.finish = trace(["run-task", "--stage", "finish", str(out)])
    if not (out / "dataset_metadata.json").is_file():
        raise SystemExit(f"{out}: the finish left no dataset")
    shutil.rmtree(run_dir)
    res.seconds = {"inputs": made - started, "bulk": bulk, "traced": traced,
                   "total": time.perf_counter() - started}  # fmt: skip
    return res


# --- reading the results ---------------------------------------------------------------------


def _max(counters: Sequence[Counter[str]]) -> Counter[str]:
    return Counter({k: max((c[k] for c in counters), default=0) for k in KEYS})


def once_steps(near: bool) -> dict[str, str]:
    """Stages whose last task makes a once-step: {stage: the step}."""
    return {**({"dedup": "clusters"} if near else {}), "select": "layout"}


Row = tuple[int | None, Counter[str]]


def steps(res: Result, near: bool) -> dict[str, Row]:
    """Each step's row, {name: (items, counts)}: per stage the largest of its measured tasks with
    items ("task"), the largest without ("idle task", when one was measured) and the task that
    finished the stage ("last task"); a once-step is that last task less the largest other."""
    rows: dict[str, Row] = {"plan (once)": (None, res.plan)}
    once: dict[str, Row] = {}
    for stage, measured in res.stages.items():
        others, last = measured[:-1] or measured, measured[-1]
        busy = [m for m in others if m.items] or others
        idle = [m for m in others if not m.items]
        rows[f"{stage} task"] = (max(m.items for m in busy), _max([m.counts for m in busy]))
        if idle:
            rows[f"{stage} idle task"] = (0, _max([m.counts for m in idle]))
        rows[f"{stage} last task"] = (last.items, last.counts)
        if stage == "write":  # a write task's work is its parts (and the pieces it seals): per part, for fixed work
            per = sorted(busy, key=lambda m: m.counts["meta"] / max(1, m.items))
            for name, m in (("write task, per part", per[-1]), ("write task, per part, median", per[len(per) // 2])):
                rows[name] = (1, Counter({k: round(m.counts[k] / max(1, m.items)) for k in KEYS}))
        else:  # the typical task, for a run's totals (the largest may have folded a group of marks: once per 64)
            mid = sorted(busy, key=lambda m: m.counts["meta"])[len(busy) // 2]
            rows[f"{stage} task, median"] = (mid.items, mid.counts)
        if stage in once_steps(near):
            top = _max([m.counts for m in busy])
            once[f"{once_steps(near)[stage]} (once)"] = (None, Counter({k: max(0, last.counts[k] - top[k])
                                                                        for k in KEYS}))  # fmt: skip
    rows.update(once)
    rows["finish (once)"] = (None, res.finish)
    return rows


def per_bucket(res: Result, stage: str = "dedup") -> dict[str, float]:
    """A dedup stage's largest count per item (group of buckets) held, over its measured tasks
    with items."""
    busy = [m for m in res.stages[stage][:-1] if m.items] or [m for m in res.stages[stage] if m.items]
    return {k: max((m.counts[k] / m.items for m in busy), default=0.0) for k in KEYS}


def _kb(n: float) -> str:
    return f"{n / 1024:,.1f}"


def table(res: Result, near: bool) -> list[str]:
    head = (f"{res.shape}, U = {res.units:,} units: {res.tasks:,} tasks, {res.buckets} buckets, {res.files:,} input "
            f"files, {res.parts:,} parts of shards and key files; {res.seconds['total']:.0f} s (inputs "
            f"{res.seconds['inputs']:.0f} s, unmeasured tasks {res.seconds['bulk']:.0f} s, traced {res.seconds['traced']:.0f} s)")  # fmt: skip
    rows = [head, f"  {'step':<20} {'items':>6} {'opens':>8} {'stats':>8} {'creates':>8} {'unlinks':>8} {'lists':>6} "
            f"{'KB read':>10} {'KB copied':>10} {'input ops':>10}"]  # fmt: skip
    for name, (items, c) in steps(res, near).items():
        rows.append(f"  {name:<20} {'' if items is None else items:>6} {c['opens']:>8,} {c['stats']:>8,} "
                    f"{c['creates']:>8,} {c['unlinks']:>8,} {c['lists']:>6,} {_kb(c['read']):>10} "
                    f"{_kb(c['copied']):>10} {c['in_meta']:>10,}")  # fmt: skip
    return rows


def exponent(a: float, b: float, ua: int, ub: int) -> str:
    """k in b / a = (ub / ua)^k; "new" for a count that was 0, "none" for one that went to 0."""
    if a <= 0 and b <= 0:
        return "0"
    if a <= 0 or b <= 0:
        return "new" if a <= 0 else "none"
    return f"{math.log(b / a) / math.log(ub / ua):.2f}"


def growth(results: list[Result], near: bool) -> list[str]:
    """Each step's metadata ops and KB read at every U, and k in count ~ U^k from the smallest U to the largest."""
    if len(results) < 2:
        return []
    lo, hi = results[0], results[-1]
    us = " ".join(f"{r.units:>9,}" for r in results)
    out = [f"{lo.shape}: growth with U (count ~ U^k from U = {lo.units:,} to {hi.units:,}; k = 0: flat, 1: grows "
           "like the plan)", f"  {'step':<20} {'meta ops at U =':>15} {us}  {'k':>5} | {'KB read':>9} {'k':>5}"]  # fmt: skip
    rows = [steps(r, near) for r in results]
    for name in rows[-1]:
        if not all(name in row for row in rows):
            continue
        m = [row[name][1]["meta"] for row in rows]
        b = [row[name][1]["read"] for row in rows]
        out.append(f"  {name:<20} {'':>15} " + " ".join(f"{v:>9,}" for v in m)
                   + f"  {exponent(m[0], m[-1], lo.units, hi.units):>5} | {_kb(b[-1]):>9} "
                   f"{exponent(b[0], b[-1], lo.units, hi.units):>5}")  # fmt: skip
    return out


@dataclass
class Model:
    """A count as a line in U from its value at the largest U, plus a slope per dedup group (the
    plan's buckets, or groups of them where a plan has many tasks: taskplan.group_count); a count
    that shrinks with U or B (another task measured, a step of a fold) is taken as flat."""

    at: float  # at the largest U, with the input's buckets
    per_unit: float
    per_bucket: float
    u0: int
    b0: int

    def __call__(self, units: int, buckets: int) -> float:
        return max(0.0, self.at + self.per_unit * (units - self.u0) + self.per_bucket * (buckets - self.b0))


def fit(values: Sequence[float], results: list[Result], point: tuple[float, Result] | None) -> Model:
    """`values` at each U of `results`; `point`: the value at the bucket point (the smallest U)."""
    lo, hi = results[0], results[-1]
    per_unit = (values[-1] - values[0]) / (hi.units - lo.units) if hi.units != lo.units else 0.0
    if values[0] > 0 and abs(values[-1] - values[0]) <= FLAT * values[0]:
        per_unit = 0.0  # flat by the measure of fixed work (another task sampled, a folder made): not a slope
    per_bucket = (point[0] - values[0]) / (point[1].groups - lo.groups) if point else 0.0
    return Model(max(values), max(0.0, per_unit), max(0.0, per_bucket), hi.units, hi.groups)


def _fit_row(results: list[Result], point: Result | None, near: bool, name: str, key: str) -> Model:
    """A step's count (0 where a plan has no such row) as a Model: its metadata operations on the
    dedup groups' files (counted apart, `group_meta`) as so many per group of the largest plan,
    the rest as a line in U."""

    def value(r: Result, k: str) -> float:
        row = steps(r, near).get(name)
        return float(row[1][k]) if row else 0.0

    if key != "meta":
        return fit([value(r, key) for r in results], results, None)
    rest = fit([value(r, "meta") - value(r, "group_meta") for r in results], results, None)
    hi = results[-1]
    per_group = value(hi, "group_meta") / max(1, hi.groups)
    return Model(rest.at + per_group * hi.groups, rest.per_unit, per_group, rest.u0, hi.groups)


def extrapolate(shape: Shape, results: list[Result], point: Result | None, near: bool,
                lines: bool = False) -> list[str]:  # fmt: skip
    """The 1,000-node plan of docs/scaling.md from the fitted counts of one task shape (see the
    module docstring)."""
    from lmshard.prepare.execution.barrier import FAN_IN
    from lmshard.prepare.execution.taskplan import group_count

    u = SCALE_UNITS
    n_tasks = -(-u // shape.units_per_task)
    b = group_count(SCALE_BUCKETS, n_tasks)  # the dedup stage's items at scale
    cores = 1 if shape.workers == 1 else SCALE_CORES
    busy = min(n_tasks, b)  # tasks holding a group
    held = -(-b // n_tasks)  # the most groups a task holds
    measured = results[-1].groups
    fitted = f"fitted from U = {results[0].units:,}..{results[-1].units:,}"
    fitted += f", G = {results[0].groups} and {point.groups} at U = {point.units:,}" if point else ", no bucket point"
    out = [f"  {n_tasks:,} tasks of {shape.units_per_task} units ({cores} core{'s' if cores > 1 else ''} each; "
           f"{SCALE_BUCKETS:,} buckets in {b:,} dedup groups; {fitted}):",
           f"    {'step':<26} {'per-task meta ops':>17} {'per-task MB read':>16} {'run meta ops':>14} {'est. wall':>10}"]  # fmt: skip
    run_meta = run_wall = 0.0
    for stage in stages_of(lines):
        if stage in ("dedup", "linedup"):
            pb = [per_bucket(r, stage) for r in results]
            bucket = {k: fit([p[k] for p in pb], results, None)(u, measured) for k in ("meta", "read")}
            bucket["read"] *= measured / b  # a group holds 1/G of the keys
            idle = {k: _fit_row(results, point, near, f"{stage} idle task", k)(u, b) for k in ("meta", "read")}
            task = {k: held * bucket[k] for k in bucket}
            total = b * bucket["meta"] + (n_tasks - busy) * idle["meta"]
            label = f"{stage} ({held:,} group{'s' if held > 1 else ''})"
        elif stage == "write":  # per part (fixed work), times the parts a task holds at scale: as measured
            parts = results[-1].parts / results[-1].tasks
            task = {k: parts * _fit_row(results, point, near, "write task, per part", k)(u, b) for k in ("meta", "read")}
            total = n_tasks * parts * _fit_row(results, point, near, "write task, per part, median", "meta")(u, b)
            label = f"write ({parts:.1f} parts)"
        else:
            task = {k: _fit_row(results, point, near, f"{stage} task", k)(u, b) for k in ("meta", "read")}
            total = n_tasks * _fit_row(results, point, near, f"{stage} task, median", "meta")(u, b)
            label = stage
        wall = max(task["meta"] / (CLIENT_OPS_PER_S * cores) + task["read"] / CLIENT_BYTES_PER_S,
                   total / MDS_OPS_PER_S)  # fmt: skip
        run_meta, run_wall = run_meta + total, run_wall + wall
        out.append(f"    {label:<26} {task['meta']:>17,.0f} {task['read'] / 1e6:>16,.1f} {total:>14,.3g} "
                   f"{_dur(wall):>10}")  # fmt: skip
    for name in steps(results[-1], near):
        if "(once)" not in name:
            continue
        meta = _fit_row(results, point, near, name, "meta")(u, b)
        read = _fit_row(results, point, near, name, "read")(u, b)
        wall = meta / CLIENT_OPS_PER_S + read / CLIENT_BYTES_PER_S
        run_meta, run_wall = run_meta + meta, run_wall + wall
        out.append(f"    {name:<26} {meta:>17,.0f} {read / 1e6:>16,.1f} {meta:>14,.3g} {_dur(wall):>10}")
    # The folds of the stages' marks, which the typical tasks measured do not do: per group of FAN_IN tasks, its
    # marks read and removed, a listing and the group's mark written (about 2 operations per task and stage).
    folds = len(stages_of(lines)) * -(-n_tasks // FAN_IN) * (2 * FAN_IN + 4)
    run_meta += folds
    out.append(f"    {'folds of marks (computed)':<26} {'':>17} {'':>16} {folds:>14,.3g} {'':>10}")
    out.append(f"    {'whole run':<26} {'':>17} {'':>16} {run_meta:>14,.3g} {_dur(run_wall):>10}")
    return out


def _dur(sec: float) -> str:
    if sec < 120:
        return f"{sec:.1f} s"
    if sec < 7200:
        return f"{sec / 60:.0f} min"
    return f"{sec / 3600:.1f} h"


def revision(checkout: Path) -> str:
    got = subprocess.run(["git", "-C", str(checkout), "describe", "--always", "--dirty"], capture_output=True,
                         text=True)  # fmt: skip
    return got.stdout.strip() or checkout.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", default="1000,4000", help="plan sizes U, comma-separated (default 1000,4000)")
    ap.add_argument("--quick", action="store_true",
                    help="U = 100, 400, wide tasks of 25 units, fewer tasks measured, one bucket point (64): about a "
                         "minute")  # fmt: skip
    ap.add_argument("--units-per-task", type=int, default=4, help="units per one-core task (default 4)")
    ap.add_argument("--wide-units", type=int, default=None,
                    help="units per wide task (default 262, as 1,000 tasks at scale; 0: no wide sweep)")  # fmt: skip
    ap.add_argument("--wide-workers", type=int, default=min(2, os.cpu_count() or 1),
                    help="a wide task's pool: the plan's --workers (default: this machine's cores, up to 2)")  # fmt: skip
    ap.add_argument("--unit-bytes", type=int, default=1000, help="bytes of text per unit (under 64 KiB)")
    ap.add_argument("--docs-per-unit", type=int, default=4)
    ap.add_argument("--input", choices=("parquet", "jsonl"), default="parquet",
                    help="parquet: files of --units-per-file row groups; jsonl: one file per unit")  # fmt: skip
    ap.add_argument("--units-per-file", type=int, default=100, help="--input parquet: row groups (units) per file")
    ap.add_argument("--near-dedup", action="store_true", help="plan with --near-dedup (exact dedup stays on)")
    ap.add_argument("--dedup-lines", action="store_true", help="plan with --dedup-lines (its two stages first)")
    ap.add_argument("--attribute", action="append", default=[], help="plan with --attribute NAME (repeatable)")
    ap.add_argument("--val-tokens", type=int, default=0, help="plan with --val-by VAL_BY --val-tokens N")
    ap.add_argument("--val-by", default="input", choices=("input", "domain"),
                    help="with --val-tokens: a val part of each input, or of each value of the inputs' `domain` "
                         f"field ({len(DOMAINS)} values, every unit holding each)")  # fmt: skip
    ap.add_argument("--bucket-point", type=int, default=None,
                    help="buckets of one more plan per shape at the smallest U (default: the largest power of two "
                         "up to its one-core task count, at least twice the input's; 0: none)")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes for unmeasured tasks")
    ap.add_argument("--dir", type=Path, default=None,
                    help="where runs go (default: /dev/shm with 4 GiB free, else the temp dir)")  # fmt: skip
    ap.add_argument("--checkout", type=Path, default=None, help="run the lmshard of another checkout (PYTHONPATH)")
    ap.add_argument("--keep-traces", type=Path, default=None, help="keep each strace log in this folder")
    args = ap.parse_args()
    if shutil.which("strace") is None:
        raise SystemExit("strace not found: install it (apt-get install strace; `make bench` does as root)")
    if args.unit_bytes >= 64 << 10:
        raise SystemExit("--unit-bytes must be under 64 KiB: a larger file would be cut into several units")
    sizes = sorted(int(s) for s in args.units.split(","))
    if args.quick:
        sizes = [100, 400]
        args.bucket_point = 64 if args.bucket_point is None else args.bucket_point
    if args.wide_units is None:
        args.wide_units = 25 if args.quick else 262
    os.environ["LMSHARD_KEYS_PER_FILE"] = str(UNITS_PER_SHARD * args.docs_per_unit)  # before lmshard is imported
    os.environ["HF_HUB_OFFLINE"] = "1"
    if args.checkout:
        sys.path.insert(0, str(args.checkout.resolve()))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(args.checkout.resolve()), os.environ.get("PYTHONPATH", "")])
    else:
        compile_package()
    from lmshard.prepare.execution import taskplan

    src = args.checkout.resolve() if args.checkout else Path(__file__).resolve().parents[1]
    print(f"{machine()}; load average (1 min) {load()}; lmshard at {revision(src)} "
          f"({Path(taskplan.__file__).parents[2]})", flush=True)  # fmt: skip
    kind = ("exact and near dedup" if args.near_dedup else "exact dedup") + (", line dedup" if args.dedup_lines else "")
    kind += "".join(f", --attribute {name}" for name in args.attribute)
    kind += f", --val-by {args.val_by} --val-tokens {args.val_tokens:,}" if args.val_tokens else ""
    print(f"{kind}; {args.input} inputs ({args.units_per_file} units per file)" if args.input == "parquet" else
          f"{kind}; jsonl inputs (one file per unit)", flush=True)  # fmt: skip
    shapes = [Shape("one-core tasks", args.units_per_task, 1)]
    if args.wide_units:
        shapes.append(Shape(f"wide tasks ({args.wide_workers} workers)", args.wide_units, args.wide_workers))
    shm = Path("/dev/shm")
    roomy = os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 4 << 30
    base = args.dir or (shm if roomy else Path(tempfile.gettempdir()))
    measured: list[tuple[Shape, list[Result], Result | None]] = []
    with tempfile.TemporaryDirectory(dir=base, prefix="bench-cluster-") as tmp:
        root, env = Path(tmp), dict(os.environ)
        for shape in shapes:
            results = []
            for units in sizes:
                if units < 2 * shape.units_per_task:
                    print(f"{shape.name}: U = {units:,} is under two tasks: left out", flush=True)
                    continue
                results.append(run_plan(args, shape, units, None, root, env))
                print("\n".join(table(results[-1], args.near_dedup)), flush=True)
            if not results:
                continue
            lo, point = results[0], None
            want = args.bucket_point if not (args.quick and shape.workers > 1) else 0
            if want is None:
                want = max(2 * lo.buckets, 1 << max(0, -(-sizes[0] // args.units_per_task).bit_length() - 1))
            if want:
                point = run_plan(args, shape, lo.units, want, root, env)
                if point.buckets != want:
                    print(f"(the bucket point planned {point.buckets} buckets, not {want}: left out)")
                    point = None
                else:
                    print("bucket point: " + "\n".join(table(point, args.near_dedup)), flush=True)
            measured.append((shape, results, point))
    for _, results, _ in measured:
        print()
        print("\n".join(growth(results, args.near_dedup)))
    print()
    print(f"extrapolated to the 1,000-node plan of docs/scaling.md: U = {SCALE_UNITS:,} units, B = {SCALE_BUCKETS:,} "
          f"buckets; assumed rates: metadata servers {MDS_OPS_PER_S:,} ops/s in all, one process {CLIENT_OPS_PER_S:,} "
          f"ops/s, one node {CLIENT_BYTES_PER_S / 1e9:.0f} GB/s; est. wall: metadata ops and bytes read beyond the "
          "data's own, per stage the larger of its slowest task and the servers' share of all its tasks")  # fmt: skip
    if args.quick:
        print("  (--quick: plans this small are a check of the harness; their extrapolation means little)")
    for shape, results, point in measured:
        print("\n".join(extrapolate(shape, results, point, args.near_dedup, args.dedup_lines)))
    print(f"load average (1 min) at the end: {load()}")


if __name__ == "__main__":
    main()
