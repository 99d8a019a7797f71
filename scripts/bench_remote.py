"""Benchmark the loader on a dataset in S3 (moto's S3 server on loopback) against the same
dataset read locally, in one run: B=32, T=1024 random batches/s and peak RSS, each reader in a
process of its own.

The dataset is the shared corpus (16.4 M GPT-2 tokens, 63 MiB), prepared with 4 M-token shards
(16 MB objects) and uploaded with boto3 to a bucket of a moto server this script starts and
stops by pid. moto reads a whole object for every ranged GET, so a request costs more the larger
its object is; smaller shards keep the server's cost per request close to a real store's.

Rows, each measured in a fresh process:
- local: the dataset directory, mapped (the figure the remote rows are compared with);
- remote, exact prefetch, no disk cache: the time to the first batch; the first pass, while the
  pool (256 MiB by default, more than this split) fills from the server, until it holds every
  block, and the token bytes fetched meanwhile per byte of the split (1.00: each byte once); then
  the rate from the pool alone; the same without prefetch;
- remote, prefetch, a pool of a quarter of the split, no disk cache: every batch needs blocks
  from the server, as on a split much larger than the pool; the rate the server allows;
- the same without prefetch (`prefetch_steps=0`): every batch waits for its own requests;
- remote, disk cache warm (filled by an earlier process, as a second epoch is), pool of a quarter
  of the split: pool misses are read from the local disk, checked, instead of the server.

Cold start against a peer, on the same server: a fresh process, nothing cached, from its first
import to its first batch and to its 450th (B=32 rows of T+1 tokens, shuffled): lmshard's random
batches against litdata's StreamingDataset with TokensLoader over `export --to litdata`'s chunks
(as litgpt reads pretraining data). litdata reads S3 through obstore, which refuses plain http;
its child process lets it (`allow_http`) for the loopback server, and changes nothing else.
(mosaic streaming's MDS export holds whole documents, not rows of T tokens: no row of its own.)

    python scripts/bench_remote.py [--seconds 3] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import load, machine, require_corpus, update_performance_md  # noqa: E402

B, T = 32, 1024
SHARD_TOKENS = 4_000_000
ROUNDS = 7  # alternated cold rounds per reader (medians)
MOTO = Path(sys.executable).with_name("moto_server")
BUCKET = "lmshard-bench"
KEY_ID, SECRET = "bench-key-id", "bench-secret-key"


# -- the server -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    port = free_port()
    proc = subprocess.Popen([str(MOTO), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"moto_server did not start on port {port} (is moto[server] installed?)")
        time.sleep(0.05)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": KEY_ID,
           "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    return proc, env  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def upload(env: dict[str, str], local: Path, prefix: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=KEY_ID,
                          aws_secret_access_key=SECRET, region_name="us-east-1")  # fmt: skip
    client.create_bucket(Bucket=BUCKET)
    for path in sorted(local.rglob("*")):
        if path.is_file() and ".lmshard-cache" not in path.parts:
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(local)}")
    return f"s3://{BUCKET}/{prefix}"


# -- one reader, in a process of its own -----------------------------------------------------


def rate(fn, seconds: float) -> float:  # type: ignore[no-untyped-def]
    """Calls per second of fn over `seconds`: the better of two windows."""
    best = 0.0
    for _ in range(2):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 2:
            fn()
            n += 1
        best = max(best, n / (time.perf_counter() - start))
    return best


def count_requests() -> dict[str, int]:
    """Ranged GETs of token bytes and their bytes, counted from now on (every read of blocks goes
    through Remote.read_ranges)."""
    from lmshard.remote.objects import Remote

    seen = {"requests": 0, "bytes": 0}
    original = Remote.read_ranges

    def counted(remote, rels, starts, ends):  # type: ignore[no-untyped-def]
        for rel, a, b in zip(rels, starts, ends, strict=True):
            if rel.endswith(".bin"):
                seen["requests"] += 1
                seen["bytes"] += b - a
        return original(remote, rels, starts, ends)

    Remote.read_ranges = counted  # type: ignore[method-assign]
    return seen


def child(config: dict) -> dict:  # type: ignore[type-arg]
    """Measure one reader; the figures as a dict."""
    from lmshard import TokenDataset

    seen = count_requests()

    options = {k: v for k, v in config.items() if k in ("pool_limit", "prefetch_steps", "cache_dir", "cache_limit")}
    start = time.perf_counter()
    data = TokenDataset(config["path"], **options)
    stream = data.random_batches(B, T, seed=config.get("seed", 1))
    next(stream)
    out: dict[str, float] = {"first_batch_s": time.perf_counter() - start}
    if config.get("fill"):  # until the pool holds every block of the split (bench only: reads the store's pool)
        n, start = 0, time.perf_counter()
        total = int(data.store.geometry.base[-1])
        while len(data.store.blocks.pool.where) < total:
            next(stream)
            n += 1
        out["fill_s"], out["fill_batches"] = time.perf_counter() - start, n
        out["fill_fetched"] = seen["bytes"] / (data.n_tokens * 4)  # token bytes fetched per byte of the (uint32) split
        out["fill_requests"] = seen["requests"]
    else:
        for _ in range(20):
            next(stream)
    before, steps = dict(seen), [0]

    def step() -> None:
        next(stream)
        steps[0] += 1

    out["rate"] = rate(step, config["seconds"])
    out["requests_per_batch"] = (seen["requests"] - before["requests"]) / steps[0]
    out["mib_per_batch"] = (seen["bytes"] - before["bytes"]) / steps[0] / 2**20
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def cold(config: dict) -> dict:  # type: ignore[type-arg]
    """A cold reader: seconds from the first import to the first batch and to batch 450."""
    start = time.perf_counter()
    peer = config.get("peer")
    if peer == "litdata":
        import obstore.store as ost

        plain = ost.S3Store  # litdata builds obstore's store without allow_http: the loopback server is http
        ost.S3Store = lambda *a, **k: plain(*a, **{**k, "client_options": {"allow_http": True}})
        from litdata import StreamingDataLoader, StreamingDataset
        from litdata.streaming.item_loader import TokensLoader

        lit = StreamingDataset(config["path"], item_loader=TokensLoader(block_size=T + 1), shuffle=True,
                               cache_dir=config["cache"], storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
        batches: Any = iter(StreamingDataLoader(lit, batch_size=B, num_workers=0))
    else:
        from lmshard import TokenDataset

        seen = count_requests()
        batches = TokenDataset(config["path"]).random_batches(B, T, seed=1)
    next(batches)
    out = {"first_batch_s": time.perf_counter() - start}
    for _ in range(449):
        next(batches)
    out["batches_450_s"] = time.perf_counter() - start
    if peer is None:
        out["requests"] = seen["requests"]
    return out


def measure(config: dict, env: dict[str, str]) -> dict:  # type: ignore[type-arg]
    python = config.pop("python", sys.executable)
    done = subprocess.run([python, __file__, "--child", json.dumps(config)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"reader {config} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- the run -----------------------------------------------------------------------------------


def prepare_dataset(out: Path) -> None:
    from lmshard.prepare import PrepareConfig, prepare

    prepare(PrepareConfig(inputs=[str(require_corpus())], out=str(out), val_fraction=0.0,
                          tokens_per_shard=SHARD_TOKENS))  # fmt: skip


def run(seconds: float, work: Path) -> tuple[str, list[tuple[str, dict]]]:  # type: ignore[type-arg]
    from lmshard import TokenDataset

    local = work / "corpus"
    prepare_dataset(local)
    split = TokenDataset(local)
    split_bytes = split.n_tokens * 4
    quarter = split_bytes // 4
    setup = (f"the shared corpus ({split.n_tokens / 1e6:.1f} M tokens, {split_bytes / 2**20:.0f} MiB) in "
             f"{len(split.store.shards)} shards of up to {SHARD_TOKENS / 1e6:.0f} M tokens, B={B}, T={T}")  # fmt: skip
    proc, env = start_moto()
    web_port = free_port()
    server = Path(__file__).resolve().parents[1] / "tests" / "range_http.py"
    web_proc = subprocess.Popen([sys.executable, str(server), str(local), str(web_port)], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 30
    while socket.socket().connect_ex(("127.0.0.1", web_port)) != 0:
        if time.monotonic() > deadline or web_proc.poll() is not None:
            raise SystemExit(f"the HTTP range server did not start on port {web_port}")
        time.sleep(0.05)
    try:
        url = upload(env, local, "corpus")
        base = {"seconds": seconds}
        cache = str(work / "cache")
        rows = [("local (mapped)", {**base, "path": str(local)})]
        rows.append(("remote, prefetch, no disk cache", {**base, "path": url, "fill": True}))
        rows.append(("remote, no prefetch, no disk cache", {**base, "path": url, "fill": True, "prefetch_steps": 0}))
        rows.append((f"remote, prefetch, pool {quarter >> 20} MiB (1/4 of the split)",
                     {**base, "path": url, "pool_limit": quarter}))  # fmt: skip
        rows.append((f"remote, no prefetch, pool {quarter >> 20} MiB", {**base, "path": url, "pool_limit": quarter,
                                                                        "prefetch_steps": 0}))  # fmt: skip
        warm = {**base, "path": url, "cache_dir": cache, "cache_limit": 1 << 30}
        rows.append(("(filling the disk cache: one pass)", {**warm, "fill": True, "seed": 2}))
        rows.append((f"remote, disk cache warm, pool {quarter >> 20} MiB", {**warm, "pool_limit": quarter}))
        rows.append(("remote, disk cache warm, default pool", {**warm, "fill": True}))
        # A server whose cost per request is the range it sends (moto's is the whole object): the
        # dataset's directory served over HTTP with byte ranges, from the page cache.
        web = f"http://127.0.0.1:{web_port}"
        rows.append((f"HTTP ranges, prefetch, pool {quarter >> 20} MiB", {**base, "path": web, "pool_limit": quarter}))
        rows.append((f"HTTP ranges, no prefetch, pool {quarter >> 20} MiB", {**base, "path": web,
                                                                              "pool_limit": quarter,
                                                                              "prefetch_steps": 0}))  # fmt: skip
        results = []
        for name, config in rows:
            got = measure(config, env)
            results.append((name, got))
            show(name, got, results[0][1]["rate"])
        from lmshard.interop.export import export_dataset

        export_dataset(str(local), "litdata", str(work / "lit"), tokens_per_shard=SHARD_TOKENS)
        lit = upload(env, work / "lit", "lit")
        readers = (("cold: lmshard, random batches", {"cold": True, "path": url}),
                   ("cold: litdata, TokensLoader", {"cold": True, "path": f"{lit}/train", "peer": "litdata"}))
        rounds: dict[str, list[dict]] = {name: [] for name, _ in readers}  # type: ignore[type-arg]
        for k in range(ROUNDS):  # alternated rounds, each reader in a fresh process with a fresh cache: medians
            for name, config in readers:
                rounds[name].append(measure({**config, "cache": str(work / f"lit-cache-{k}")}, env))
        for name, got_all in rounds.items():
            got = {key: statistics.median(g[key] for g in got_all) for key in got_all[0]}
            results.append((name, got))
            print(f"{name:>52}: first batch {got['first_batch_s']:.2f} s, 450 batches {got['batches_450_s']:.2f} s"
                  + (f" ({got['requests']:.0f} GETs)" if "requests" in got else "") + f" (medians of {ROUNDS})",
                  flush=True)  # fmt: skip
        again = measure(rows[0][1], env)  # local again: the machine's load may have moved meanwhile
        show("local (mapped), again", again, results[0][1]["rate"])
        results.append(("local (mapped), again", again))
    finally:
        stop(proc)
        stop(web_proc)
    return setup, results


def show(name: str, got: dict, local: float) -> None:  # type: ignore[type-arg]
    fill = (f"; pool filled in {got['fill_s']:.1f} s ({got['fill_batches']:.0f} batches, "
            f"{got['fill_batches'] / got['fill_s']:.0f}/s; fetched {got.get('fill_fetched', 0):.2f}x the split in "
            f"{got.get('fill_requests', 0):.0f} GETs)"
            if "fill_s" in got else "")  # fmt: skip
    print(f"{name:>52}: {got['rate']:8,.0f} batches/s  ratio {got['rate'] / local:5.2f}  first batch "
          f"{got['first_batch_s'] * 1000:5.0f} ms  peak RSS {got['peak_rss_mb']:5.0f} MB  GETs/batch "
          f"{got['requests_per_batch']:5.1f} ({got['mib_per_batch']:.2f} MiB){fill}", flush=True)  # fmt: skip


def report(setup: str, loads: str, results: list[tuple[str, dict]]) -> str:  # type: ignore[type-arg]
    local = results[0][1]["rate"]
    lines = [
        f"Machine: {machine()}. Data: {setup}; moto's S3 server on loopback, started by the benchmark (it reads a "
        "whole object for every ranged GET), and a byte-range HTTP server (tests/range_http.py) over the same "
        "files. Each reader "
        f"in a process of its own; rates are the better of two windows after the first batches. Load average (1 min) "
        f"{loads}. Command: `python scripts/bench_remote.py`.", "",
        "| reader | batches/s | ratio to local | first batch | pool filled from the server / disk | peak RSS "
        "| token GETs per batch (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    cold = [(name, got) for name, got in results if "batches_450_s" in got]
    results = [(name, got) for name, got in results if "batches_450_s" not in got]
    for name, got in results:
        fill = (f"{got['fill_s']:.1f} s, {got['fill_batches']:.0f} batches, {got['fill_fetched']:.2f}× the split's "
                f"bytes in {got['fill_requests']:.0f} GETs" if "fill_s" in got else "")  # fmt: skip
        lines.append(f"| {name} | {got['rate']:,.0f} | {got['rate'] / local:.2f}× | "
                     f"{got['first_batch_s'] * 1000:.0f} ms | {fill} | {got['peak_rss_mb']:.0f} MB | "
                     f"{got['requests_per_batch']:.1f} ({got['mib_per_batch']:.2f}) |")  # fmt: skip
    if cold:
        lines += ["", "Cold start, from the first import (torch's included, in both), nothing cached (B=32, T=1024, "
                  f"shuffled; medians of {ROUNDS} alternated rounds):", "",
                  "| reader | first batch | 450 batches |", "|---|---|---|"]  # fmt: skip
        lines += [f"| {name.removeprefix('cold: ')} | {got['first_batch_s']:.2f} s | {got['batches_450_s']:.2f} s |"
                  for name, got in cold]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="timing window per reader")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/performance.md alone")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        config = json.loads(args.child)
        print(json.dumps(cold(config) if config.get("cold") else child(config)))
        return
    if not MOTO.exists():
        raise SystemExit(f"{MOTO} not found: pip install 'moto[server]' into this environment")
    print(machine(), flush=True)
    started = load()
    with tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp:
        setup, results = run(args.seconds, Path(tmp))
    loads = f"{started} before, {load()} after"
    print(f"data: {setup}\nload average (1 min): {loads}")
    if not args.no_write:
        update_performance_md("remote loader", report(setup, loads, results))


if __name__ == "__main__":
    main()
