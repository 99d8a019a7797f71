"""Benchmark the runtime loader against a nanoGPT-style get_batch, in the same process.

Baseline (nanoGPT train.py): a fresh np.memmap per call, per-row `astype(np.int64)`,
`torch.from_numpy`, `torch.stack` for x and y. Same data, B, T and dtype for both; batches/s
and the ratio are printed for random-offset batches (B=32,T=1024 and B=8,T=4096), sliding
windows and shift="random", on two splits of the same tokens (the shared corpus ×8, 132 M
tokens): one shard, and the shards `prepare` writes by default (100 M tokens each, so two),
which is what any split over 100 M tokens looks like. Beside each row, the memory-work floor:
offsets drawn beforehand, one gather of the rows from each mapped shard and one widening copy
into int64 x and y, with no loader logic at all; its ratio to the baseline bounds what any
numpy/torch loader can reach. Also: time to first batch on a dataset of 1,000 small shards, and
RSS while reading 2 GB of tokens (ours vs a persistent np.memmap, the nanoGPT#287 pattern), and
the device table of scripts/bench_device.py (host path, resident path and their floors).

    python scripts/bench_loader.py [--seconds 2] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_device import device_rows, prepared  # noqa: E402
from bench_device import report as device_report  # noqa: E402
from benchlib import load, machine, update_performance_md, write_repeated  # noqa: E402

from lmshard import TokenDataset  # noqa: E402
from lmshard.prepare import PrepareConfig, prepare  # noqa: E402

COPIES = 8  # corpus repeats: 132 M tokens, more than one default shard (PrepareConfig.tokens_per_shard)


def nanogpt_get_batch(path: str, B: int, T: int, rng: np.random.Generator, shift: int = 1):  # type: ignore[no-untyped-def]
    data = np.memmap(path, dtype=np.uint32, mode="r")
    ix = rng.integers(0, len(data) - T - shift, size=B)
    x = torch.stack([torch.from_numpy(data[i : i + T].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + shift : i + shift + T].astype(np.int64)) for i in ix])
    return x, y


def rate(fn, seconds: float) -> float:  # type: ignore[no-untyped-def]
    """Calls per second of fn, after a short warm-up."""
    for _ in range(5):
        fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    return n / (time.perf_counter() - start)


def host_side(stream, buf: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    """What the CPU does per batch when device="cuda": draw offsets and gather the rows into a
    (pinned) int32 host buffer allocated once; the int64 widening then happens on the GPU."""
    offsets, shift = stream._rows(stream.step)
    stream.step += 1
    stream.store.read_rows(offsets, buf[:, : stream.seq_len + shift])


def row_plans(sizes: list[int], B: int, T: int, n: int = 4096) -> list[list[tuple[int, np.ndarray]]]:
    """For n batches, drawn beforehand: B row starts uniform over the shards' concatenated tokens,
    as [(shard, starts within it)] grouped by shard; a row that would cross the shard's end is
    moved back inside it (the floor copies no row piecewise)."""
    ends = np.cumsum(sizes)
    offsets = np.random.default_rng(5).integers(0, int(ends[-1]) - T - 1, size=(n, B))
    shard = np.searchsorted(ends, offsets, side="right")
    local = np.minimum(offsets - (ends - sizes)[shard], np.asarray(sizes)[shard] - (T + 1))
    return [[(k, local[i][shard[i] == k]) for k in np.unique(shard[i]).tolist()] for i in range(n)]


def widen(pair: torch.Tensor, rows: np.ndarray, first: int, T: int) -> None:
    """The loader's single widening copy (numpy's, on this thread, as lmshard/runtime/batches.py
    does it): rows [n, T + 1] (int32) into x and y, pair[:, first : first + n]."""
    n = rows.shape[0]
    dst = pair.numpy() if n == pair.shape[1] else pair.numpy()[:, first : first + n]
    np.copyto(dst, np.lib.stride_tricks.as_strided(rows, (2, n, T), (rows.itemsize, rows.strides[0], rows.itemsize)))


def memory_floor(shards: list[str], B: int, T: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """The least work any loader must do per batch: gather B rows of T + 1 tokens at random
    offsets from the mapped shards (one numpy call per shard the batch has rows in) and widen
    them into new int64 x and y (one torch copy per shard). Offsets are drawn and grouped by
    shard beforehand; no bookkeeping, no checks."""
    maps = [np.memmap(s, dtype=np.uint32, mode="r") for s in shards]
    views = [np.lib.stride_tricks.sliding_window_view(m, T + 1) for m in maps]
    plans = row_plans([len(m) for m in maps], B, T)
    state = {"i": 0}

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        state["i"] = (state["i"] + 1) % len(plans)
        pair, first = torch.empty((2, B, T), dtype=torch.int64), 0
        for k, starts in plans[state["i"]]:
            widen(pair, views[k][starts].view(np.int32), first, T)
            first += len(starts)
        return pair[0], pair[1]

    return batch


def read_floor(shards: list[str], B: int, T: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """The read-mode counterpart of `memory_floor`: one bare `os.preadv` per row into a reused
    buffer, then the same widening copy (one for the whole batch)."""
    fds = [os.open(s, os.O_RDONLY) for s in shards]
    plans = row_plans([os.fstat(fd).st_size // 4 for fd in fds], B, T)
    reads = [[(fds[k], at) for k, starts in plan for at in (starts * 4).tolist()] for plan in plans]
    buf = np.empty((B, T + 1), dtype=np.uint32)
    rows = [buf[r] for r in range(B)]
    state = {"i": 0}

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        state["i"] = (state["i"] + 1) % len(reads)
        for row, (fd, at) in zip(rows, reads[state["i"]], strict=True):
            os.preadv(fd, [row], at)
        pair = torch.empty((2, B, T), dtype=torch.int64)
        widen(pair, buf.view(np.int32), 0, T)
        return pair[0], pair[1]

    return batch


def rss_kb(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def rss_while_reading(read_batch, total_tokens: int, tokens_per_batch: int) -> tuple[float, ...]:  # type: ignore[no-untyped-def]
    """Reading `total_tokens` in batches: VmRSS (MB) before, at its peak (sampled every 64
    batches) and after; RssAnon (MB, the process's private memory) before and after; batches/s."""
    before, anon = rss_kb(), rss_kb("RssAnon")
    peak, n = before, total_tokens // tokens_per_batch
    start = time.perf_counter()
    for i in range(n):
        read_batch()
        if i % 64 == 0:
            peak = max(peak, rss_kb())
    speed = n / (time.perf_counter() - start)
    after = rss_kb()
    return before / 1024, max(peak, after) / 1024, after / 1024, anon / 1024, rss_kb("RssAnon") / 1024, speed


def bins(root: Path) -> list[str]:
    return [str(p) for p in sorted((root / "train").glob("*.bin"))]


KINDS = (  # (name, B, T, read mode, make a stream from a dataset)
    ("random B=32 T=1024", 32, 1024, False, lambda d: d.random_batches(32, 1024, seed=1)),
    ("random B=8 T=4096", 8, 4096, False, lambda d: d.random_batches(8, 4096, seed=1)),
    ("windows B=32 T=1024", 32, 1024, False, lambda d: d.window_batches(32, 1024, seed=1)),
    ("shift=random B=32 T=1024", 32, 1024, False, lambda d: d.random_batches(32, 1024, seed=1, shift="random")),
    ("read mode: random B=32 T=1024", 32, 1024, True, lambda d: d.random_batches(32, 1024, seed=1)),
    ("read mode: random B=8 T=4096", 8, 4096, True, lambda d: d.random_batches(8, 4096, seed=1)),
)


def loader_rows(one: Path, multi: Path, seconds: float) -> list[tuple[str, float, float, float, float, float]]:
    """(name, baseline/s, lmshard/s, ratio, floor ratio, host-work ratio) per kind of batch and
    split. For each kind the baseline, both splits and their floors are timed in turn, twice,
    best kept: the one-shard and multi-shard rows share one baseline and the same minutes of a
    shared machine. The baseline reads the one-shard file: nanoGPT's get_batch knows one file,
    and both splits hold the same tokens."""
    baseline_file = bins(one)[0]
    splits = {"1 shard": one, f"{len(bins(multi))} shards": multi}
    mapped = {label: TokenDataset(root) for label, root in splits.items()}
    read = {label: TokenDataset(root, rss_limit=0) for label, root in splits.items()}  # as if over rss_limit
    rows = []
    for kind, B, T, read_mode, make in KINDS:
        rng = np.random.default_rng(0)
        base = 0.0
        best: dict[str, list[float]] = {label: [0.0, 0.0] for label in splits}  # lmshard, floor
        streams = {label: make((read if read_mode else mapped)[label]) for label in splits}
        floors = {
            label: (read_floor if read_mode else memory_floor)(bins(root), B, T) for label, root in splits.items()
        }
        for _ in range(2):
            base = max(base, rate(lambda: nanogpt_get_batch(baseline_file, B, T, rng), seconds))
            for label in splits:
                best[label][0] = max(best[label][0], rate(lambda: next(streams[label]), seconds))
                best[label][1] = max(best[label][1], rate(floors[label], seconds))
        buf = np.empty((B, T + T // 2), dtype=np.uint32)
        for label in splits:
            (ours, low), host = best[label], rate(lambda: host_side(streams[label], buf), seconds)
            name = f"{label}, {kind}"
            rows.append((name, base, ours, ours / base, low / base, host / base))
            print(f"{name:>40}: nanoGPT get_batch {base:6.0f}/s  lmshard {ours:6.0f}/s ({1e6 / ours:4.0f} us)  "
                  f"ratio {ours / base:5.1f}x  [memory-work floor {low / base:5.1f}x, lmshard at {ours / low:4.0%} "
                  f"of it; host work of the CUDA path {host / base:5.1f}x]", flush=True)  # fmt: skip
    return rows


def first_batch(src: Path, tmp: Path) -> tuple[int, float]:
    """(shards, seconds) to open a dataset of ~1,000 small shards and draw its first batch."""
    many = tmp / "many"
    prepare(PrepareConfig(inputs=[str(src)], out=str(many), val_fraction=0.0, tokens_per_shard=60_000, max_docs=40_000))
    start = time.perf_counter()
    small = TokenDataset(many)
    next(small.random_batches(8, 1024, seed=0))
    return len(small.store.shards), time.perf_counter() - start


def rss_rows(root: Path) -> list[tuple]:  # type: ignore[type-arg]
    """RSS while reading 2 GB of tokens in B=32, T=1024 batches: read mode, mapped, and a
    persistent np.memmap, each from scratch in this process."""
    total = 2 * 2**30 // 4  # 2 GB of uint32 tokens
    rows = []
    for label, limit in (("lmshard, read mode (`rss_limit` below the split's size)", 0),
                         ("lmshard, mapped (default `rss_limit` = 1 GiB, above the split's size)", 1 << 30)):  # fmt: skip
        reader = TokenDataset(root, rss_limit=limit)
        stream = reader.random_batches(32, 1024, seed=3)
        rows.append((label, *rss_while_reading(lambda: next(stream), total, 32 * 1025)))
        reader.store.close()
    mm = np.memmap(bins(root)[0], dtype=np.uint32, mode="r")
    rng = np.random.default_rng(0)

    def memmap_batch() -> None:
        ix = rng.integers(0, len(mm) - 1025, size=32)
        torch.stack([torch.from_numpy(mm[i : i + 1025].astype(np.int64)) for i in ix])

    rows.append(("persistent np.memmap (nanoGPT#287)", *rss_while_reading(memmap_batch, total, 32 * 1025)))
    for label, before, peak, after, anon0, anon1, speed in rows:
        print(f"RSS reading 2 GB of tokens, {label}: {before:.0f} -> peak {peak:.0f} -> {after:.0f} MB "
              f"(RssAnon {anon0:.0f} -> {anon1:.0f} MB), {speed:,.0f} batches/s")  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="timing window per measurement")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = write_repeated(Path(tmp) / f"x{COPIES}.jsonl.gz", COPIES)
        one, multi = Path(tmp) / "one", Path(tmp) / "multi"
        prepare(PrepareConfig(inputs=[str(src)], out=str(one), val_fraction=0.0, tokens_per_shard=10**9))
        default = PrepareConfig(inputs=[str(src)], out=str(multi), val_fraction=0.0)  # the default shard size
        prepare(default)
        data, split = TokenDataset(one), TokenDataset(multi).store
        sizes = " + ".join(f"{n / 1e6:.1f}" for n in split.sizes.tolist())
        setup = (f"the shared corpus ×{COPIES} ({data.n_tokens / 1e6:.1f} M tokens, {data.n_tokens * 4 / 2**20:.0f} MiB), "
                 f"prepared twice: as one shard, and with prepare's default tokens_per_shard "
                 f"({default.tokens_per_shard / 1e6:.0f} M) as {len(split.shards)} shards ({sizes} M tokens), the layout of "
                 f"any split over {default.tokens_per_shard / 1e6:.0f} M tokens; both in the page cache, and mapped "
                 f"(under the default rss_limit of 1 GiB) except in the read-mode rows")  # fmt: skip
        print(f"{machine()}\ndata: {setup}", flush=True)
        started = load()
        rows = loader_rows(one, multi, args.seconds)
        loads = f"{started} before the timed rows, {load()} after"
        print(f"load average (1 min): {loads}")
        n_shards, first = first_batch(src, Path(tmp))
        print(f"time to first batch, {n_shards} shards: {first * 1000:.0f} ms")
        data.store.close()  # measure each RSS reader from scratch
        rss = rss_rows(one)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # batches on the device
        roots, on_device = prepared(Path(tmp) / "device", 16_500_000)
        device_table = device_report(device_rows(roots, args.seconds, device), device, on_device)
    if not args.no_write:
        update_performance_md("loader", report(setup, loads, rows, n_shards, first, rss))
        update_performance_md("batches on the device", device_table)


def report(setup: str, loads: str, rows: list[tuple], n_shards: int, first: float, rss: list[tuple]) -> str:  # type: ignore[type-arg]
    return "\n".join([
        f"Machine: {machine()}. Data: {setup}. Baseline: nanoGPT's get_batch (np.memmap per call, per-row astype "
        "int64, torch.stack) on the one-shard file (it reads one file; both splits hold the same tokens), same "
        "process, same B, T; for each kind of batch the baseline, both splits and their floors timed in turn, "
        f"twice, best kept. Load average (1 min, this benchmark included) {loads}: the cores are shared with other work, so only "
        "ratios from one run mean anything. Command: `make bench` (`python scripts/bench_loader.py`).", "",
        "| batches | nanoGPT get_batch (/s) | lmshard, x/y int64 on CPU (/s) | ratio | memory-work floor, ratio "
        "| host work of the CUDA path, ratio |",
        "|---|---|---|---|---|---|",
        *[f"| {n} | {b:,.0f} | {o:,.0f} ({1e6 / o:.0f} µs) | **{r:.1f}×** | {f:.1f}× | {h:.1f}× |"
          for n, b, o, r, f, h in rows], "",
        "Memory-work floor: offsets drawn beforehand and grouped by shard, one numpy gather of the rows from each "
        "mapped shard the batch has rows in and one widening copy of them into new int64 x and y, nothing else; no "
        "loader that hands out fresh int64 tensors can do much better (lmshard gathers the rows of all shards with "
        "one call, so it saves the floor's extra calls on a multi-shard split). Host work of the CUDA path: offsets "
        "and the row copy into a reused int32 host buffer (the GPU widens to int64 after the copy). Read mode: what "
        "splits larger than `rss_limit` (default 1 GiB) get, one `preadv` per row instead of a mapped gather, so "
        "that RSS stays flat; measured here on the same splits opened with `rss_limit=0`; its floor is a bare "
        "`preadv` loop plus the same widening copy. Every figure is the best of two timings.", "",
        f"Time to first batch (open + validate + first batch) on a dataset of {n_shards} shards: {first * 1000:.0f} ms.",
        "",
        "RSS while reading 2 GB of tokens in B=32, T=1024 batches from the one-shard split, each reader from scratch "
        "in the same process (VmRSS from /proc/self/status, peak sampled every 64 batches):", "",
        "| reader | VmRSS before → peak → after (MB) | RssAnon before → after (MB) | batches/s while reading |",
        "|---|---|---|---|",
        *[f"| {label} | {b:.0f} → {p:.0f} → {a:.0f} | {a0:.0f} → {a1:.0f} | {v:,.0f} |"
          for label, b, p, a, a0, a1, v in rss], "",
        "Touched pages of a file mapping count in the process's RSS (RssFile) although they are page cache, shared "
        "and reclaimable; the process's own memory (RssAnon) does not grow for any reader. lmshard maps a split only "
        "when it is no larger than `rss_limit`, so mapped RSS can reach the split's size and no more; larger splits "
        "are read with `preadv` and leave RSS where it was. A persistent memmap keeps every page it touched, "
        "whatever the file's size.",
    ])  # fmt: skip


if __name__ == "__main__":
    main()
