"""Crash a multi-shard prepare at random moments and check nothing is lost.

    python scripts/stress_resume.py --runs 20 --overwrites 10

Mode "resume" (--runs): SIGKILL the whole prepare (parent and workers) at a random moment, run
`--resume` (itself killed again at a random moment one time in three), and finish with
`--resume`. The result must be byte-identical to an uninterrupted run of the same command
(every shard, index and key file; the metadata apart from its "run" record of timings and
host), and `lmshard inspect` must pass.
Mode "overwrite" (--overwrites): an `--overwrite` of an existing dataset is interrupted at a
random moment by SIGKILL or Ctrl-C (SIGINT to the group); the old dataset must be byte-identical
afterwards and pass `inspect`.

Input: the shared benchmark corpus (benchlib.CORPUS), ~12 shards at the default
--tokens-per-shard of this script. Checkpoints every --checkpoint seconds, so kills land
between checkpoints as well as on them. Not part of `make test` (minutes). `PYTHONPATH=CHECKOUT`
pins the code under test, as for stress_workers.py. Prints one line per run and a summary;
exits 1 on any failure.
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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from benchlib import require_corpus  # noqa: E402
from proctree import LMSHARD, finish, kill_group, start_prepare  # noqa: E402


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


def kill_at_random(args: list[str], rng: random.Random, upto: float) -> tuple[int | None, float]:
    """Start `prepare ARGS`, SIGKILL its group at a random moment in [0, upto) s; the exit code
    (None if killed) and the moment."""
    proc = start_prepare(args)
    delay = rng.uniform(0, upto)
    try:
        proc.wait(timeout=delay)
        return proc.returncode, delay
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        proc.communicate()
        return None, delay


def resume_run(args: list[str], reference: Path, out: Path, rng: random.Random, span: list[float]) -> str:
    shutil.rmtree(out, ignore_errors=True)
    started = time.monotonic()
    code, first = kill_at_random(args, rng, span[0])
    if code == 0:  # the machine got faster than when the reference ran: aim the next kills earlier
        span[0] = min(span[0], time.monotonic() - started)
    notes = [f"killed at {first:.2f}s" if code is None else f"finished before the kill ({first:.2f}s)"]
    if code is None and rng.random() < 1 / 3:
        code2, second = kill_at_random([*args, "--resume"], rng, span[0])
        notes.append(f"resume killed at {second:.2f}s" if code2 is None else "resume finished")
    code, err = finish(start_prepare([*args, "--resume"]), 600)
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


def overwrite_run(args: list[str], old: Path, out: Path, rng: random.Random, span: float) -> str:
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(old, out)
    snapshot = {n: (out / n).read_bytes() for n in files_of(out)}
    sig = rng.choice([signal.SIGKILL, signal.SIGINT])
    proc = start_prepare([*args, "--overwrite", "--seed", "7"])  # a different split: other bytes
    delay = rng.uniform(0, span)
    try:
        proc.wait(timeout=delay)
        return f"finished before the {sig.name} ({delay:.2f}s)"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, sig)
    code, err = finish(proc, 60)
    if code == 0:
        return f"finished as the {sig.name} came ({delay:.2f}s)"
    startup = "Traceback" in err and "_bootstrap" in err and "lmshard/cli.py" not in err
    if "Traceback" in err and not startup:  # (Python itself prints one for a Ctrl-C while it starts)
        return f"FAIL traceback after {sig.name} at {delay:.2f}s"
    if {n: (out / n).read_bytes() for n in files_of(out)} != snapshot:
        return f"FAIL the old dataset changed ({sig.name} at {delay:.2f}s)"
    if not inspect_ok(out):
        return f"FAIL inspect of the old dataset ({sig.name} at {delay:.2f}s)"
    return f"ok ({sig.name} at {delay:.2f}s, exit {code}{', during interpreter start-up' if startup else ''})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--overwrites", type=int, default=10)
    ap.add_argument("--tokens-per-shard", type=int, default=1_000_000)
    ap.add_argument("--checkpoint", type=float, default=1.0, help="LMSHARD_CHECKPOINT_SECONDS for the runs")
    ap.add_argument("--seed", type=int, default=0)
    opts = ap.parse_args()
    corpus, rng = require_corpus(), random.Random(opts.seed)
    # Started in the background, this process (and so its children) may ignore SIGINT; a handler
    # of our own is reset to the default in each child, which then gets Ctrl-C like a terminal's.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ["LMSHARD_CHECKPOINT_SECONDS"] = str(opts.checkpoint)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="lmshard-stress-resume-") as tmp:
        root = Path(tmp)
        args = [str(corpus), "--tokens-per-shard", str(opts.tokens_per_shard), "--workers", "2"]
        start = time.monotonic()
        code, err = finish(start_prepare([*args, "--out", str(root / "reference")]), 900)
        span = time.monotonic() - start
        if code != 0:
            raise SystemExit(f"the reference run failed: {err}")
        shards = len(list((root / "reference" / "train").glob("*.bin")))
        print(f"reference: {shards} train shards in {span:.1f} s; kills land in [0, {span:.1f}) s", flush=True)
        spans = [span]  # shrinks to the fastest run seen: a kill should land while the run is going
        for i in range(opts.runs):
            verdict = resume_run([*args, "--out", str(root / "ds")], root / "reference", root / "ds", rng, spans)
            failures += verdict.startswith("FAIL")
            print(f"resume {i + 1:3d}: {verdict}", flush=True)
        for i in range(opts.overwrites):
            verdict = overwrite_run([*args, "--out", str(root / "ow")], root / "reference", root / "ow", rng, spans[0])
            failures += verdict.startswith("FAIL")
            print(f"overwrite {i + 1:3d}: {verdict}", flush=True)
    print(f"{opts.runs + opts.overwrites - failures} ok, {failures} failed")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
