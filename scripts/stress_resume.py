"""Kill a multi-shard prepare at random work items of its tokenize stage, and check nothing is lost.

    python scripts/stress_resume.py --runs 20 --overwrites 10

Every run is held at a stop point (LMSHARD_STOP_AT=item:K, prepare/stops.py) after a random K-th
work item of a unit (in the process writing it: a worker, each counting its own), so the kill
lands mid-stage whatever the machine's speed: nothing here is timed.

Mode "resume" (--runs): the held run must have its build and its plan (the work it keeps); then
SIGKILL the whole prepare (parent and workers), run `--resume` (itself held and killed again
after more items, one time in three), and finish with `--resume`.
The result must be byte-identical to an uninterrupted run of the same command (every shard,
index and key file; the metadata apart from its "run" record of timings and host), `lmshard
inspect` must pass, and nothing may be left beside `--out`.
Mode "overwrite" (--overwrites): an `--overwrite` of an existing dataset is held after a random
item and sent SIGKILL, Ctrl-C (SIGINT) or SIGTERM (as a scheduler stops a job) to the whole
group; the old dataset must be byte-identical afterwards and pass `inspect`; Ctrl-C and SIGTERM
must exit 130 and 143 without a traceback.

Input: the shared benchmark corpus (benchlib.CORPUS), ~12 shards at the default
--tokens-per-shard of this script, in work items of --block-bytes (LMSHARD_BLOCK_BYTES; the
output does not depend on it). The reference run counts the items (a progress line after each,
`--log-interval 0`). Not part of `make test` (minutes). `PYTHONPATH=CHECKOUT` pins the code under
test, as for stress_workers.py. Prints one line per run and a summary; exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from benchlib import require_corpus  # noqa: E402
from proctree import LMSHARD, finish, kill_group, signal_stopped, start_prepare, wait_stopped  # noqa: E402

EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as prepare exits after saving


def files_of(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def same(a: Path, b: Path) -> str | None:
    """None when the datasets are identical (metadata apart from "run"); else the first difference."""
    if files_of(a) != files_of(b):
        return f"file lists differ: {sorted(set(files_of(a)) ^ set(files_of(b)))[:4]}"
    for name in files_of(a):
        if name == "dataset_metadata.json":
            ma, mb = (json.loads((d / name).read_text()) for d in (a, b))
            ma.pop("run"), mb.pop("run")
            if ma != mb:
                return f"metadata differs in {[k for k in ma if ma[k] != mb.get(k)]}"
        elif not filecmp.cmp(a / name, b / name, shallow=False):
            return f"{name} differs"
    return None


def inspect_ok(root: Path) -> bool:
    proc = subprocess.run([*LMSHARD, "inspect", str(root), "--quick"], capture_output=True, text=True)
    return proc.returncode == 0


def kept(out: Path) -> bool:
    """Whether the build beside `out` and its plan are there (what a --resume goes on from)."""
    partial, work = (out.parent / f".{out.name}.lmshard-{kind}" for kind in ("partial", "work"))
    return (partial / "_PREPARE_IN_PROGRESS").exists() and (work / "plan.json").exists()


def held_at(args: list[str], item: int) -> subprocess.Popen[str] | None:
    """`prepare ARGS` held at its stop point after a unit's `item`-th work item; None (the run
    reaped) if it ended first."""
    os.environ["LMSHARD_STOP_AT"] = f"item:{item}"
    try:
        proc = start_prepare(args)
    finally:
        del os.environ["LMSHARD_STOP_AT"]
    if wait_stopped(proc) is None:
        proc.communicate()
        return None
    return proc


def kill_after(args: list[str], out: Path, item: int) -> str | None:
    """Hold the run after `item` items, check its build and plan are kept, SIGKILL its group;
    None when all went so, else what went wrong."""
    proc = held_at(args, item)
    if proc is None:
        return f"the run ended before item {item}"
    done = kept(out)
    kill_group(proc.pid)
    proc.communicate()
    return None if done else f"no build or plan kept before the kill after item {item}"


def resume_run(args: list[str], reference: Path, out: Path, rng: random.Random, n_items: int) -> str:
    shutil.rmtree(out, ignore_errors=True)
    for left in out.parent.glob(f".{out.name}.lmshard*"):  # what a failed run left: start afresh
        shutil.rmtree(left) if left.is_dir() else left.unlink()
    first = rng.randrange(1, n_items)
    wrong = kill_after(args, out, first)
    notes = [f"killed after item {first}"]
    if wrong is None and first < n_items - 1 and rng.random() < 1 / 3:
        second = rng.randrange(1, n_items - first)
        wrong = kill_after([*args, "--resume"], out, second)
        notes.append(f"resume killed after {second} more")
    if wrong is not None:
        return f"FAIL {wrong} ({', '.join(notes)})"
    code, err = finish(start_prepare([*args, "--resume"]), 900)
    if code != 0:
        return f"FAIL resume exit {code}: {err.strip().splitlines()[-1:]} ({', '.join(notes)})"
    diff = same(reference, out)
    if diff:
        return f"FAIL {diff} ({', '.join(notes)})"
    if not inspect_ok(out):
        return f"FAIL inspect ({', '.join(notes)})"
    left = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.lmshard")]
    if left:
        return f"FAIL leftovers {left}"
    return f"ok ({', '.join(notes)})"


def overwrite_run(args: list[str], old: Path, out: Path, rng: random.Random, n_items: int) -> str:
    shutil.rmtree(out, ignore_errors=True)  # (the last one's kept build is discarded by this --overwrite)
    shutil.copytree(old, out)
    snapshot = {n: (out / n).read_bytes() for n in files_of(out)}
    sig = rng.choice([signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
    item = rng.randrange(1, n_items)
    proc = held_at([*args, "--overwrite", "--seed", "7"], item)  # a different split: other bytes
    if proc is None:
        return f"FAIL the run ended before item {item}"
    signal_stopped(proc.pid, sig)  # to the whole group, as a terminal, a scheduler or kill -9 sends it
    code, err = finish(proc, 300)
    if sig != signal.SIGKILL and (code != EXIT[sig] or "Traceback" in err):
        return f"FAIL {sig.name} after item {item}: exit {code}{', a traceback' if 'Traceback' in err else ''}"
    if {n: (out / n).read_bytes() for n in files_of(out)} != snapshot:
        return f"FAIL the old dataset changed ({sig.name} after item {item})"
    if not inspect_ok(out):
        return f"FAIL inspect of the old dataset ({sig.name} after item {item})"
    return f"ok ({sig.name} after item {item}, exit {code})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--overwrites", type=int, default=10)
    ap.add_argument("--tokens-per-shard", type=int, default=1_000_000)
    ap.add_argument("--block-bytes", type=int, default=1 << 18, help="LMSHARD_BLOCK_BYTES: input bytes per work item")
    ap.add_argument("--seed", type=int, default=0)
    opts = ap.parse_args()
    corpus, rng = require_corpus(), random.Random(opts.seed)
    # Started in the background, this process (and so its children) may ignore SIGINT; a handler
    # of our own is reset to the default in each child, which then gets Ctrl-C like a terminal's.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ["LMSHARD_BLOCK_BYTES"] = str(opts.block_bytes)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="lmshard-stress-resume-") as tmp:
        root = Path(tmp)
        args = [str(corpus), "--tokens-per-shard", str(opts.tokens_per_shard), "--workers", "2"]
        code, err = finish(start_prepare([*args, "--out", str(root / "reference"), "--log-interval", "0"]), 900)
        if code != 0:
            raise SystemExit(f"the reference run failed: {err}")
        n_items = sum(line.startswith("prepare: ") and " read, " in line for line in err.splitlines())
        shards = len(list((root / "reference" / "train").glob("*.bin")))
        if n_items < 2:
            raise SystemExit(f"the reference run has {n_items} work items: lower --block-bytes")
        print(f"reference: {shards} train shards, {n_items} work items; kills land after items 1 .. {n_items - 1}",
              flush=True)  # fmt: skip
        for i in range(opts.runs):
            verdict = resume_run([*args, "--out", str(root / "ds")], root / "reference", root / "ds", rng, n_items)
            failures += verdict.startswith("FAIL")
            print(f"resume {i + 1:3d}: {verdict}", flush=True)
        for i in range(opts.overwrites):
            verdict = overwrite_run([*args, "--out", str(root / "ow")], root / "reference", root / "ow", rng, n_items)
            failures += verdict.startswith("FAIL")
            print(f"overwrite {i + 1:3d}: {verdict}", flush=True)
    print(f"{opts.runs + opts.overwrites - failures} ok, {failures} failed")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
