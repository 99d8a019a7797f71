"""Benchmark near-duplicate clusters: `components` (quality/clusters.py) against the whole-array
algorithm it replaced, and the same clusters found over P parts (quality/clusterparts.py).

Graphs shaped like a run's near-duplicate edges: ids unit << 32 | document (10,000 documents per
unit, 10 documents per edge); 90% of the edges in clusters of 2..5 documents (each member to a
random earlier member), 8% in stars of 1,000..100,000 onto their first member, 2% in chains of
1,000..20,000 (each document near the one before); sorted by member, as `unique_edges` gives
them to the dedup stage.

1. Time: CPU seconds of one call, the lowest of --repeats (algorithms and sizes alternated, so
   a shared machine's load hits each alike), at each size; the ratio of the largest size to the
   smallest for each algorithm, and the whole-array algorithm's time over the new one's. Beside
   them two yardsticks of what this machine's caches make of arrays 4× larger: `components` on
   4 disjoint copies of the smallest graph (exactly 4× the work), and `np.sort` of the 2m ends.
2. Memory per edge, beyond the input's 16 bytes: the peak of numpy's allocations during a call
   (tracemalloc, a separate call), and the rise of the peak RSS of a fresh process over its RSS
   with the input loaded (VmHWM reset before the call).
3. Over parts: the smallest size over P = 8 and 64 parts (fan-in 8: one hop, then two), run
   task after task in this process through files: supersteps, messages per edge, CPU seconds
   of all tasks, and the largest peak of one task (tracemalloc around each call) per edge of a
   part (m / P).
4. Over parts of a fixed size (--edges-per-part, 125,000: 8 parts of the smallest graph, 32 of
   4× it), as a planned run cuts them (fan-in 64): the time split over tasks (each phase's
   longest task, added up: every part's task on a core of its own) and all tasks' CPU, and
   their ratios between the sizes.

    python scripts/bench_near_clusters.py [--no-write] [--repeats 3] [--sizes 1000000 4000000] [--parts 8 64]
        [--edges-per-part 125000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import load, machine, update_performance_md  # noqa: E402

from lmshard.quality import clusterparts  # noqa: E402
from lmshard.quality.clusters import components  # noqa: E402
from lmshard.quality.near import unique_edges  # noqa: E402


def whole_array_components(child: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The algorithm `components` replaced: every edge in every round, each round np.minimum.at
    over all labels and pointer jumping over every node until none moves."""
    child, parent = np.asarray(child, dtype=np.uint64), np.asarray(parent, dtype=np.uint64)
    nodes = np.unique(np.concatenate([child, parent]))
    if not len(nodes):
        return nodes, nodes
    c, p = np.searchsorted(nodes, child), np.searchsorted(nodes, parent)
    label = np.arange(len(nodes))
    while True:
        lc, lp = label[c], label[p]
        low = np.minimum(lc, lp)
        new = label.copy()
        np.minimum.at(new, lc, low)
        np.minimum.at(new, lp, low)
        while True:
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, label):
            break
        label = new
    removed = label != np.arange(len(nodes))
    return nodes[removed], nodes[label[removed]]


ALGORITHMS = {"components": components, "whole-array": whole_array_components}


def near_duplicate_graph(m: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """About m distinct edges (see the module docstring), sorted by member."""
    rng = np.random.default_rng(seed)
    n_docs = 10 * m
    child: list[np.ndarray] = []
    parent: list[np.ndarray] = []
    for share, low, high, star in ((0.02, 1000, 20_000, False), (0.08, 1000, 100_000, True)):
        left = int(share * m)
        while left > 0:
            size = int(min(left, rng.integers(low, high)))
            docs = np.sort(rng.choice(n_docs, size + 1, replace=False))
            child.append(docs[1:])
            parent.append(np.full(size, docs[0]) if star else docs[:-1])
            left -= size
    sizes = rng.integers(2, 6, m)
    sizes = sizes[np.cumsum(sizes - 1) <= m - sum(len(c) for c in child)]
    docs = rng.choice(n_docs, int(sizes.sum())).astype(np.int64)
    start = np.repeat(np.cumsum(sizes) - sizes, sizes)
    group = np.repeat(np.arange(len(sizes)), sizes)
    docs = docs[np.lexsort((docs, group))]  # each cluster's members in id order
    at = np.arange(len(docs)) - start
    later = at > 0
    child.append(docs[later])
    parent.append(docs[start[later] + (rng.random(int(later.sum())) * at[later]).astype(np.int64)])
    c, p = (np.concatenate(x).astype(np.uint64) for x in (child, parent))
    ids = lambda d: ((d // np.uint64(10_000)) << np.uint64(32)) | (d % np.uint64(10_000))  # noqa: E731
    keep = c != p
    return unique_edges(ids(c[keep]), ids(p[keep]))


COPIES = "components, the smallest graph's disjoint copies"


def disjoint_copies(child: np.ndarray, parent: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """k copies of a graph in units of their own: k times the same work, for a ratio that only
    the machine's caches can move off k."""
    shift = lambda i: np.uint64(i * 10**6) << np.uint64(32)  # noqa: E731
    return np.concatenate([child + shift(i) for i in range(k)]), np.concatenate([parent + shift(i) for i in range(k)])


def _lowest(best: dict, key: tuple, seconds: float) -> None:
    best[key] = min(best.get(key, float("inf")), seconds)


def section_time(graphs: dict[int, tuple[np.ndarray, np.ndarray]], repeats: int) -> tuple[list[str], dict]:
    best: dict[tuple[str, int], float] = {}
    for r in range(repeats):
        for name, run in ALGORITHMS.items():
            for m, (child, parent) in graphs.items():
                t0 = time.process_time()
                run(child, parent)
                _lowest(best, (name, m), time.process_time() - t0)
                print(f"1. round {r + 1}: {name} {m:,} edges {best[name, m]:.3f} s", flush=True)
    small, large = min(graphs), max(graphs)
    copies = disjoint_copies(*graphs[small], large // small)
    for _ in range(repeats):
        t0 = time.process_time()
        components(*copies)
        _lowest(best, (COPIES, large), time.process_time() - t0)
        for m, (child, parent) in graphs.items():
            ends = np.concatenate([child, parent])
            t0 = time.process_time()
            ends.sort()
            _lowest(best, ("np.sort of the ends", m), time.process_time() - t0)
    best[COPIES, small] = best["components", small]
    first = graphs[small]
    same = all(np.array_equal(a, b) for a, b in zip(components(*first), whole_array_components(*first), strict=True))
    rows = [f"| | {small:,} edges | {large:,} edges | {large // small}× the edges: × the time |", "|---|---|---|---|"]
    for name in (*ALGORITHMS, COPIES, "np.sort of the ends"):
        rows.append(f"| {name} | {best[name, small]:.3f} s | {best[name, large]:.3f} s | "
                    f"**{best[name, large] / best[name, small]:.2f}×** |")  # fmt: skip
    speed = {m: best["whole-array", m] / best["components", m] for m in graphs}
    note = (f"The whole-array algorithm takes {speed[small]:.0f}× the time of `components` at {small:,} edges and "
            f"{speed[large]:.0f}× at {large:,}; their results are equal ({same}). The disjoint copies are exactly "
            f"{large // small}× the work of the {small:,}-edge graph: their ratio is what this machine makes of linear "
            "work at these sizes (its caches, and page faults of fresh arrays).")  # fmt: skip
    return [*rows, "", note], best


def rss_worker(path: str, name: str) -> None:
    """In a fresh process: load the edges, reset the peak RSS, run one algorithm, print the rise."""
    child, parent = np.load(f"{path}/child.npy"), np.load(f"{path}/parent.npy")
    ALGORITHMS[name](child[:1000], parent[:1000])  # imports and first allocations before the baseline

    def status(key: str) -> int:  # kB
        return next(int(x.split()[1]) for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key))

    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = status("VmRSS:")
    ALGORITHMS[name](child, parent)
    print(json.dumps({"rise_kb": status("VmHWM:") - before}))


def section_memory(graphs: dict[int, tuple[np.ndarray, np.ndarray]]) -> list[str]:
    rows = ["| algorithm | edges | peak allocated (traced) | per edge | peak RSS rise | per edge |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        for m, (child, parent) in graphs.items():
            np.save(f"{d}/child.npy", child)
            np.save(f"{d}/parent.npy", parent)
            for name, run in ALGORITHMS.items():
                tracemalloc.start()
                run(child, parent)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                out = subprocess.run([sys.executable, __file__, "--rss-worker", d, name], capture_output=True,
                                     text=True, check=True).stdout  # fmt: skip
                rise = json.loads(out.strip().splitlines()[-1])["rise_kb"] * 1024
                print(
                    f"2. {name} {m:,} edges: traced {peak / m:.0f} B/edge, RSS rise {rise / m:.0f} B/edge", flush=True
                )
                rows.append(f"| {name} | {m:,} | {peak / 1e6:,.0f} MB | **{peak / m:.0f} B** | {rise / 1e6:,.0f} MB | "
                            f"**{rise / m:.0f} B** |")  # fmt: skip
    return rows


def _task(peaks: list[int], call, *args, cpu: list[float] | None = None) -> int:  # type: ignore[no-untyped-def]
    """Run one task's call, recording its peak of traced allocations (and its CPU seconds in `cpu`)."""
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    t = time.process_time()
    out = call(*args)
    if cpu is not None:
        cpu.append(time.process_time() - t)
    peaks.append(tracemalloc.get_traced_memory()[1] - base)
    return out


def run_parts(child: np.ndarray, parent: np.ndarray, parts: int, fan_in: int, work: Path) -> dict:
    """The task-parallel clusters, task after task (as clusterparts.components_in_parts runs them)."""
    from lmshard.quality.clusterparts import make_plan, part_result, quiet, remove_step, route, scatter, superstep

    plan = make_plan(work, parts, clusterparts.id_bounds(np.concatenate([child, parent]), parts), fan_in)
    peaks: list[int] = []
    longest = 0.0  # the phases' longest tasks, added up: the time with every part's task running at once
    sent = 0
    t0 = time.process_time()
    tracemalloc.start()
    cpu: list[float] = []
    for s, (c, p) in enumerate(zip(np.array_split(child, parts), np.array_split(parent, parts), strict=True)):
        sent += _task(peaks, scatter, work, s, c, p, cpu=cpu)
    longest += max(cpu)
    step, quiet_run = 0, 0
    while quiet_run < 2:
        for hop in range(1, plan.levels):
            cpu = []
            for q in range(plan.positions):
                _task(peaks, route, work, step, hop, q, cpu=cpu)
            longest += max(cpu)
        step += 1
        cpu = []
        for j in range(parts):
            _task(peaks, superstep, work, step, j, cpu=cpu)
            sent += json.loads((work / f"changed_{step:04d}_{j:06d}.json").read_text())["sent"]
        longest += max(cpu)
        remove_step(work, step - 1)
        quiet_run = quiet_run + 1 if quiet(work, step, parts) else 0
    tracemalloc.stop()
    cpu = []
    results = [_task(peaks, part_result, work, step, j, cpu=cpu) for j in range(parts)]
    longest += max(cpu)
    removed = np.concatenate([r[0] for r in results])
    return {"steps": step, "seconds": time.process_time() - t0, "peak": max(peaks), "sent": sent, "longest": longest,
            "equal": bool(np.array_equal(removed, components(child, parent)[0]))}  # fmt: skip


def section_parts(child: np.ndarray, parent: np.ndarray, part_counts: list[int], fan_in: int) -> list[str]:
    m = len(child)
    rows = ["| parts | hops | supersteps | messages per edge | CPU seconds, all tasks | largest task peak | "
            "per edge of a part | result equal |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for parts in part_counts:
        with tempfile.TemporaryDirectory() as d:
            got = run_parts(child, parent, parts, fan_in, Path(d))
            hops = clusterparts.load_plan(Path(d)).levels
        per = got["peak"] / (m / parts)
        print(f"3. {parts} parts: {got['steps']} supersteps, {got['seconds']:.1f} s, largest task peak "
              f"{got['peak'] / 1e6:.1f} MB ({per:.0f} B per edge of a part), equal {got['equal']}", flush=True)  # fmt: skip
        rows.append(f"| {parts} | {hops} | {got['steps']} | {got['sent'] / m:.1f} | {got['seconds']:.1f} | "
                    f"{got['peak'] / 1e6:.1f} MB | **{per:.0f} B** | {got['equal']} |")  # fmt: skip
    return rows


def section_scaled(graphs: dict[int, tuple[np.ndarray, np.ndarray]], per_part: int) -> list[str]:
    """The parts at a fixed number of edges per part (as a planned run cuts them): the time
    split over tasks (each phase's longest task, added up) and all tasks' CPU, per size."""
    rows = ["| edges | parts | supersteps | split over tasks: seconds | all tasks: CPU seconds | largest task peak | "
            "result equal |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    got = {}
    for m, (child, parent) in sorted(graphs.items()):
        parts = max(1, m // per_part)
        with tempfile.TemporaryDirectory() as d:
            got[m] = run_parts(child, parent, parts, clusterparts.FAN_IN, Path(d))
        print(f"4. {m:,} edges over {parts} parts: {got[m]['longest']:.2f} s split over tasks, {got[m]['seconds']:.1f} "
              f"s in all, equal {got[m]['equal']}", flush=True)  # fmt: skip
        rows.append(f"| {m:,} | {parts} | {got[m]['steps']} | {got[m]['longest']:.2f} | {got[m]['seconds']:.1f} | "
                    f"{got[m]['peak'] / 1e6:.1f} MB | {got[m]['equal']} |")  # fmt: skip
    small, big = min(got), max(got)
    if big > small:
        rows += ["", f"{big // small}× the edges: **{got[big]['longest'] / got[small]['longest']:.2f}×** the time split "
                 f"over tasks, {got[big]['seconds'] / got[small]['seconds']:.2f}× the CPU of all tasks."]  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/performance.md alone")
    parser.add_argument("--repeats", type=int, default=3, help="alternated calls of each algorithm at each size")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000], help="edges per graph")
    parser.add_argument("--parts", type=int, nargs="+", default=[8, 64], help="part counts for section 3")
    parser.add_argument("--fan-in", type=int, default=8, help="message files a task reads per hop, in section 3")
    parser.add_argument("--edges-per-part", type=int, default=125_000, help="edges per part, in section 4")
    parser.add_argument("--rss-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_worker:
        return rss_worker(*args.rss_worker)
    print(f"{machine()}, load {load()}", flush=True)
    graphs = {m: near_duplicate_graph(m) for m in sorted(args.sizes)}
    times, _ = section_time(graphs, args.repeats)
    memory = section_memory(graphs)
    parts = section_parts(*graphs[min(graphs)], args.parts, args.fan_in)
    scaled = section_scaled(graphs, args.edges_per_part)
    small = min(graphs)
    body = [f"{machine()}; load average (1 min) {load()} at the end. Command: `make bench` "
            "(`python scripts/bench_near_clusters.py`).", "",
            "Graphs shaped like a run's near-duplicate edges (scripts/bench_near_clusters.py): ids unit << 32 | document, "
            "90% of the edges in clusters of 2..5 documents, 8% in stars of 1,000..100,000, 2% in chains of "
            "1,000..20,000, sorted by member as the dedup stage reads them.", "",
            "### one process: time", "", "CPU seconds of one call, the lowest of "
            f"{args.repeats} (algorithms and sizes alternated).", "", *times, "",
            "### one process: memory", "", "Beyond the edges themselves (16 bytes each): the peak of numpy's "
            "allocations during a call (tracemalloc), and the rise of the peak RSS of a fresh process over its RSS "
            "with the edges loaded.", "", *memory, "",
            f"### over parts ({small:,} edges)", "", "Every task run in this process, one after another, through "
            f"the files (fan-in {args.fan_in}); a task's peak is its traced allocations during its call.", "",
            *parts, "", f"### over parts of {args.edges_per_part:,} edges each", "",
            "As a planned run cuts them (prepare/execution/nearparts.py: a part per EDGES_PER_PART edges, fan-in 64): "
            "every task run in this process, one after another; the time split over tasks is each phase's longest "
            "task's CPU seconds, added up (the time with every part's task on a core of its own), beside all the "
            "tasks' CPU.", "", *scaled]  # fmt: skip
    if not args.no_write:
        update_performance_md("near-duplicate clusters (scripts/bench_near_clusters.py)", "\n".join(body))
    print("\n".join(body))


if __name__ == "__main__":
    main()
