"""--near-dedup in a planned run whose edges do not fit one task: the clusters found over P
parts (quality/clusterparts.py) by the select stage's tasks together, each holding one part.

**How many parts.** The task that completes the dedup stage counts the edges its groups found
(the sizes of their `.near` files) and writes `dedup/parts.json`. Up to ONE_TASK × EDGES_PER_PART
edges (6 × 8 Mi: about 3.5 GB at the one-process algorithm's 70 bytes per edge) that task finds
the clusters itself, in one process (nearstage.py): P = 1. Beyond, P = the edges over
EDGES_PER_PART, rounded up (a part's rounds hold about 6 times as much per edge as the one-process
algorithm, and take about 40 times its CPU: docs/performance.md), at most the run's tasks and
clusterparts' fan-in (64: one hop, so no routing phase); fewer than 7 parts would hold more than
one task, so then one task finds them. A run on one machine (the local executor, a Ray
instance the run started: its plan's executor says so, and one task is passed here) always finds
them in one task: its parts would share the machine's memory. With P > 1 it writes the parts'
plan (P ranges of whole units, `clusterparts.unit_bounds`) and leaves the rest to the select
stage's tasks, which all need the clusters.

**The rounds.** Each select task takes part before it selects: the scatter (share s: the dedup
groups [s·G/P, (s+1)·G/P)), then superstep after superstep of the P parts until two are quiet,
then each part's result. In each phase a task first does the item of its own number, then any
item not done that no task has claimed (a claim: `NAME.claim`, created exclusively, holding the
host and pid), then waits for the phase to complete, and takes over an item whose claimant died
(same host) or has held it for STALE_SECONDS (another host). Every item's output is a pure
function of the phase before, written atomically with its marker last, so an item done twice
writes the same bytes: the rounds complete whatever tasks run, when and where, and one task
alone does every item. A task that is not one of the first P joins the rounds when the scatter
item of its number modulo P is not started yet (the tasks run one after another, or that one
has not started); else it waits on the summary only (one file, read less and less often), and
joins if the rounds have not moved for STALE_SECONDS (a cluster with fewer free slots than P).

**Files**, in `WORK/dedup/parts/`: clusterparts' (`plan.json`, `bounds.u64`, the supersteps'
messages and labels, the superstep before the last removed as each completes; its markers
`changed_K_J.json` kept, as are `scattered_S.done` and `routed_K_H_Q.done`, so a task that comes
late passes the phases done without redoing them), claims (`MARKER.claim`), `progress.json` (the
phase reached), `result_J.u64` (part J's removed ids, those of the appended-to dataset left out,
sorted, then their survivors: as `dedup/near.removed`), `result_J.json` (their count); the
summary `dedup/near.json` as nearstage writes it, by the task that completes the results.

Memory model, per task: a part's share of the rounds (clusterparts: about 330 to 420 bytes per
edge of its part at the peak, measured), so at most about EDGES_PER_PART × 420 bytes (3.5 GB);
the scatter, its share of the groups' edges (16 bytes each). Beyond 64 parts' worth of edges (5 × 10^8
with the default) the parts grow instead.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ...format import atomic_write_bytes, atomic_write_json
from ...quality import clusterparts
from ..stops import stop_point
from .barrier import running
from .buckets import read_edges

EDGES_PER_PART = int(os.environ.get("LMSHARD_NEAR_EDGES_PER_PART", 8 << 20))
ONE_TASK = 6  # parts' worth of edges that one task clusters alone, in the same memory
STALE_SECONDS = float(os.environ.get("LMSHARD_NEAR_STALE_SECONDS", 300))
CLAIMS_SECONDS = 10.0  # how often a waiting task looks at the claims of the items not done
PARTS, PARTS_FILE = "parts", "parts.json"
_U64 = np.dtype("<u8")


def decide(dedup: Path, n_groups: int, n_tasks: int, n_units: int) -> int:
    """P for this run (see the module docstring), decided once: by the task that completes the
    dedup stage (a stat per group), read from `parts.json` by every later caller; with P > 1
    the parts' plan written too. `n_units`: the ids' units, an appended-to dataset's files
    included."""
    path = dedup / PARTS_FILE
    if path.exists():
        return int(json.loads(path.read_text())["parts"])
    edges = sum((dedup / f"group_{g:06d}.near").stat().st_size // 16 for g in range(n_groups))
    parts = min(n_tasks, clusterparts.FAN_IN, -(-edges // EDGES_PER_PART))
    if parts <= ONE_TASK:  # (a part holds about 6 times as much per edge: fewer parts would hold more than one task)
        parts = 1
    if parts > 1:
        clusterparts.make_plan(dedup / PARTS, parts, clusterparts.unit_bounds(n_units, parts))
    atomic_write_json(path, {"parts": parts, "edges": edges})  # (last: the plan is whole once this says so)
    return parts


def parts_of(work: Path) -> int:
    """The parts a run's clusters were found over (1: by one task, or not decided yet)."""
    try:
        return int(json.loads((work / "dedup" / PARTS_FILE).read_text())["parts"])
    except (OSError, ValueError, KeyError):
        return 1


def rounds(work: Path) -> dict[str, Any] | None:
    """For `status`, a run's clusters over parts: the parts, the last phase a task completed
    (None: not begun), whether the summary is written; None for clusters found by one task."""
    parts = parts_of(work)
    if parts == 1:
        return None
    try:
        phase = json.loads((work / "dedup" / PARTS / "progress.json").read_text())["phase"]
    except (OSError, ValueError, KeyError):
        phase = None
    return {"parts": parts, "phase": phase, "done": (work / "dedup" / "near.json").exists()}


def result_path(dedup: Path, id_unit: int) -> Path:
    """The result file of the part that holds unit `id_unit`'s ids (numbered as the ids are)."""
    folder = dedup / PARTS
    plan = clusterparts.load_plan(folder)
    part = int(plan.owner(np.array([id_unit << 32], dtype=_U64))[0])
    return folder / f"result_{part:06d}.u64"


def take_part(dedup: Path, n_groups: int, me: int, base: int, done: Callable[[], bool],
              summarize: Callable[[Iterator[tuple[int, int]], int], None]) -> None:  # fmt: skip
    """Task `me`'s part in the rounds, until the summary exists (`done()`); `base`: the ids below
    base << 32 are an appended-to dataset's, never removed; `summarize(pairs, count)` writes the
    summary from the removed ids and their survivors in id order, and their count."""
    folder = dedup / PARTS
    plan = clusterparts.load_plan(folder)
    p = plan.parts
    if me >= p and _started(scatter_marker(folder, me % p)) and not _waited(folder, done):
        return
    phase = _Phase(folder, me)
    shares = [range(s * n_groups // p, (s + 1) * n_groups // p) for s in range(p)]

    def scatter(s: int) -> None:
        clusterparts.scatter(folder, s, *read_edges(dedup, shares[s]))
        _mark(scatter_marker(folder, s))

    def route(step: int, hop: int, q: int) -> None:
        clusterparts.route(folder, step, hop, q)
        _mark(_route_marker(folder, step, hop, q))

    phase.run("scatter", range(p), partial(scatter_marker, folder), scatter)
    step, quiet_run = 0, 0
    while quiet_run < 2:
        for hop in range(1, plan.levels):
            phase.run(f"route {step} {hop}", range(plan.positions), partial(_route_marker, folder, step, hop),
                      partial(route, step, hop))  # fmt: skip
        step += 1
        phase.run(f"superstep {step}", range(p), partial(_changed, folder, step),
                  partial(clusterparts.superstep, folder, step))  # fmt: skip
        _remove_step(folder, step - 1)
        quiet_run = quiet_run + 1 if clusterparts.quiet(folder, step, p) else 0
    phase.run("results", range(p), lambda j: folder / f"result_{j:06d}.json",
              lambda j: _result(folder, step, j, base))  # fmt: skip
    phase.run("summary", [0], lambda _: dedup / "near.json",
              lambda _: summarize(_pairs(folder, p), sum(_count(folder, j) for j in range(p))))  # fmt: skip
    _remove_step(folder, step)


class _Phase:
    """Runs the items of one phase of the rounds with the other tasks (see the module docstring)."""

    def __init__(self, folder: Path, me: int) -> None:
        self.folder, self.me = folder, me

    def run(self, name: str, items: Sequence[int], marker: Callable[[int], Path], do: Callable[[int], Any]) -> None:
        """The phase's items: this task's first, then any unclaimed; then, until every marker is
        there, a stat of the first item not done per look (its markers come in any order, so the
        look moves on past each one there), and every CLAIMS_SECONDS a look at the claims of those
        not done, to take over a stale one (see the module docstring)."""
        order = [items[(self.me + k) % len(items)] for k in range(len(items))]
        did = False
        for i in order:
            if not marker(i).exists() and _claim(marker(i)):
                _do(marker(i), do, i)
                did = True
        left, delay, claims_seen = [i for i in order if not marker(i).exists()], 0.01, None
        while left:
            if marker(left[0]).exists():
                left.pop(0)
                continue
            if claims_seen is None or time.monotonic() - claims_seen >= CLAIMS_SECONDS:
                left = [i for i in left if not marker(i).exists()]
                for i in left:
                    if _stale(_claim_path(marker(i))) and not marker(i).exists():
                        _claim(marker(i), take_over=True)
                        _do(marker(i), do, i)
                        did = True
                claims_seen = time.monotonic()
                continue
            time.sleep(delay)
            delay = min(2.0, delay * 2)
        if did:  # (a task that passes phases done, coming late, leaves the progress as it is)
            atomic_write_json(self.folder / "progress.json", {"phase": name})


def scatter_marker(folder: Path, share: int) -> Path:
    """The marker of the scatter's share `share` (kept when its messages go)."""
    return folder / f"scattered_{share:06d}.done"


def _route_marker(folder: Path, step: int, hop: int, position: int) -> Path:
    return folder / f"routed_{step:04d}_{hop}_{position:06d}.done"


def _mark(marker: Path) -> None:
    atomic_write_bytes(marker, b"")


def _changed(folder: Path, step: int, part: int) -> Path:
    """The marker of part `part`'s superstep `step`."""
    return folder / f"changed_{step:04d}_{part:06d}.json"


def _claim_path(marker: Path) -> Path:
    return marker.with_name(marker.name + ".claim")


def _claim(marker: Path, take_over: bool = False) -> bool:
    """Claim the item whose output is `marker`: True when this process holds it now."""
    claim = _claim_path(marker)
    mine = f"{socket.gethostname()} {os.getpid()}\n"
    if take_over:
        atomic_write_bytes(claim, mine.encode())
        return True
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(mine)
    return True


def _started(marker: Path) -> bool:
    """Whether the item whose output is `marker` is done or claimed."""
    return marker.exists() or _claim_path(marker).exists()


def _stale(claim: Path) -> bool:
    """Whether a claim is to be taken over: it is gone (never claimed), its process is this one
    (an earlier attempt that failed) or died (on this host), or it is older than STALE_SECONDS
    (held by a process stopped, or on another host; one cut short before it named its holder)."""
    try:
        age = time.time() - claim.stat().st_mtime
        text = claim.read_text()
    except OSError:
        return True
    try:
        host, pid = text.split()
    except ValueError:
        return age >= STALE_SECONDS  # (being written by its claimant, or never will be)
    if host == socket.gethostname() and (int(pid) == os.getpid() or not running(int(pid))):
        return True
    return age >= STALE_SECONDS


def _do(marker: Path, do: Callable[[int], Any], i: int) -> None:
    """Item i, claimed; one that another task completed meanwhile (and whose inputs the rounds
    have since removed) is left to it."""
    stop_point("round")
    try:
        do(i)
    except FileNotFoundError:
        if not marker.exists():
            raise


def _waited(folder: Path, done: Callable[[], bool]) -> bool:
    """A task that holds no part: wait for the summary (`done()`: False, returned) while the
    rounds move; True when they have not moved for STALE_SECONDS (then it takes part)."""
    progress = folder / "progress.json"
    seen, since, delay = None, time.monotonic(), 0.05
    while not done():
        try:
            now = progress.read_bytes()
        except OSError:
            now = None
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= STALE_SECONDS:
            return True
        time.sleep(delay)
        delay = min(5.0, delay * 2)
    return False


def _result(folder: Path, step: int, part: int, base: int) -> None:
    """Part `part`'s removed ids (not the appended-to dataset's) and their survivors, after the
    last superstep; then their count, the marker."""
    nodes, label, _ = np.fromfile(folder / f"labels_{step:04d}_{part:06d}.u64", dtype=_U64).reshape(3, -1)
    removed = (label != nodes) & (nodes >= np.uint64(base) << np.uint64(32))
    atomic_write_bytes(folder / f"result_{part:06d}.u64", nodes[removed].tobytes() + label[removed].tobytes())
    atomic_write_json(folder / f"result_{part:06d}.json", {"removed": int(removed.sum())})


def _count(folder: Path, part: int) -> int:
    return int(json.loads((folder / f"result_{part:06d}.json").read_text())["removed"])


def _pairs(folder: Path, parts: int) -> Iterator[tuple[int, int]]:
    """(removed, survivor) in id order: the parts' results in part order, read as asked for."""
    for j in range(parts):
        both = np.fromfile(folder / f"result_{j:06d}.u64", dtype=_U64).reshape(2, -1)
        yield from zip(both[0].tolist(), both[1].tolist(), strict=True)


def _remove_step(folder: Path, step: int) -> None:
    """Superstep `step`'s messages and labels, once the superstep after it is complete (each task
    that gets there removes what is left of them); its markers stay (a few bytes per part), for a
    task that reads them late."""
    for pattern in (f"msgs_{step:04d}_*", f"labels_{step:04d}_*"):
        for path in folder.glob(pattern):
            path.unlink(missing_ok=True)
