"""Batches on the training device: the host path, the resident path (runtime/resident.py) and
nanoGPT's get_batch, against the floors of the two ways a batch can reach the device, in one
run. Run by scripts/bench_loader.py (`make bench`), or alone:

    python scripts/bench_device.py [--seconds 2] [--tokens 16500000] [--no-write]

For B×T of 16×1024 and 64×2048, on a split stored as uint32 and as uint16, µs per batch of:
- nanoGPT get_batch: a fresh np.memmap per call, per-row astype(int64), torch.stack, then (on
  CUDA) pin_memory() and a non-blocking copy, as nanoGPT's train.py does;
- host path: `TokenDataset(...).random_batches(B, T, device=dev)`: rows gathered on the host
  into a ring of pinned int32 buffers, copied on a side stream, widened on the device;
- resident path: `TokenDataset(..., device=dev, resident=True)`: offsets from the host, rows
  gathered and widened on the device;
- pinned-copy floor (CUDA only): one non-blocking copy of a [B, T+1] int32 pinned buffer;
- host-gather floor: the host path's host work alone (offsets and the rows copied into a reused
  int32 buffer), which bounds it with the copy: max(host gather, pinned copy);
- resident-gather floor: x and y gathered and widened from a split already on the device with
  offsets already there (`data.take(off[:, None] + arange(T))`), nothing else.
On the CPU (no GPU here) the device is the CPU: the copy floor does not apply and the
resident path's tensors are CPU tensors; on a GPU every figure includes waiting for the device
(a synchronize after each timed loop).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import machine, update_performance_md, write_repeated  # noqa: E402

from lmshard import TokenDataset  # noqa: E402
from lmshard.interop.convert import convert_dataset  # noqa: E402
from lmshard.prepare import PrepareConfig, prepare  # noqa: E402

SHAPES = ((16, 1024), (64, 2048))


def rate(fn: Callable[[], object], seconds: float, device: torch.device) -> float:
    """Calls per second of fn, waiting for the device at the end of the timed loop."""
    for _ in range(5):
        fn()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    sync()
    return n / (time.perf_counter() - start)


def nanogpt(path: str, B: int, T: int, device: torch.device, dtype: type) -> Callable[[], object]:
    rng = np.random.default_rng(0)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        data = np.memmap(path, dtype=dtype, mode="r")
        ix = rng.integers(0, len(data) - T - 1, size=B)
        x = torch.stack([torch.from_numpy(data[i : i + T].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + T].astype(np.int64)) for i in ix])
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    return get_batch


def copy_floor(B: int, T: int, device: torch.device) -> Callable[[], object] | None:
    if device.type != "cuda":
        return None
    host = torch.empty((B, T + 1), dtype=torch.int32, pin_memory=True)
    return lambda: host.to(device, non_blocking=True)


def host_gather(stream) -> Callable[[], object]:  # type: ignore[no-untyped-def]
    """The host path's host work: this step's offsets, and its rows into a reused int32 buffer."""
    buf = np.empty((stream.batch_size, stream.seq_len + 1), dtype=np.uint32)
    at = {"step": 0}

    def gather() -> None:
        offsets, _, _ = stream._rows(at["step"])
        at["step"] += 1
        stream.store.read_rows(offsets, buf)

    return gather


def gather_floor(data: TokenDataset, B: int, T: int, device: torch.device) -> Callable[[], object]:
    """x and y from the split on the device, offsets on the device beforehand: the least a
    device-side loader does."""
    tokens = data.resident.data  # the resident copy itself (int32, or int16 for uint16)
    mask = tokens.dtype == torch.int16
    offsets = torch.randint(0, data.n_tokens - T - 1, (1024, B), device=device)
    cols = torch.arange(T, device=device)
    at = {"i": 0}

    def gather() -> tuple[torch.Tensor, torch.Tensor]:
        at["i"] = (at["i"] + 1) % len(offsets)
        idx = offsets[at["i"]][:, None] + cols
        x, y = tokens.take(idx).long(), tokens.take(idx + 1).long()
        if mask:
            x &= 0xFFFF
            y &= 0xFFFF
        return x, y

    return gather


def device_rows(roots: dict[str, Path], seconds: float, device: torch.device) -> list[tuple]:  # type: ignore[type-arg]
    """(shape, encoding, µs: nanoGPT, host, resident, copy floor, host gather floor, resident
    gather floor); each timed twice in turn, best kept."""
    rows = []
    for B, T in SHAPES:
        for encoding, root in roots.items():
            host = TokenDataset(root)
            res = TokenDataset(root, device=device, resident=True)
            hs, rs = host.random_batches(B, T, seed=1, device=device), res.random_batches(B, T, seed=1)
            path = str(sorted((root / "train").glob("*.bin"))[0])
            fns = {"nanogpt": nanogpt(path, B, T, device, np.uint32 if encoding == "uint32" else np.uint16),
                   "host": lambda s=hs: next(s), "resident": lambda s=rs: next(s),
                   "copy": copy_floor(B, T, device), "host gather": host_gather(host.random_batches(B, T, seed=2)),
                   "gather": gather_floor(res, B, T, device)}  # fmt: skip
            best = dict.fromkeys(fns, 0.0)
            for _ in range(2):
                for name, fn in fns.items():
                    if fn is not None:
                        best[name] = max(best[name], rate(fn, seconds, device))
            us = {k: 1e6 / v if v else float("nan") for k, v in best.items()}
            rows.append((f"{B}×{T}", encoding, us))
            bound = max(us["host gather"], us["copy"]) if device.type == "cuda" else us["host gather"]
            print(f"{B}×{T} {encoding:>6}: nanoGPT {us['nanogpt']:7.1f} us  host {us['host']:7.1f} us  resident "
                  f"{us['resident']:7.1f} us | floors: copy {us['copy']:6.1f}  host gather {us['host gather']:6.1f}  "
                  f"resident gather {us['gather']:6.1f} | resident/gather floor {us['resident'] / us['gather']:.2f}x  "
                  f"host/max(host gather, copy) {us['host'] / bound:.2f}x  nanoGPT/resident "
                  f"{us['nanogpt'] / us['resident']:.1f}x", flush=True)  # fmt: skip
            res.resident = None  # free the device copy before the next
    return rows


def _copy_cells(us: dict[str, float], cuda: bool) -> tuple[str, str]:
    """The pinned-copy floor and host / max(host gather, copy): only on CUDA (on the CPU there
    is no copy, and the host path also widens to int64, which its host gather floor does not)."""
    if not cuda:
        return "—", "—"
    return f"{us['copy']:.0f}", f"{us['host'] / max(us['host gather'], us['copy']):.2f}×"


def report(rows: list[tuple], device: torch.device, setup: str) -> str:  # type: ignore[type-arg]
    cuda = device.type == "cuda"
    return "\n".join([
        f"Machine: {machine()}; device: {torch.cuda.get_device_name(device) if cuda else 'the CPU (no GPU here)'}. "
        f"Data: {setup}. One process, every figure of a row timed twice in turn, best kept; µs per batch of random "
        "offsets, x and y int64 on the device (`python scripts/bench_device.py`, run by `make bench`).", "",
        "| B×T | stored | nanoGPT get_batch | host path | resident path | pinned-copy floor | host-gather floor "
        "| resident-gather floor | resident / its floor | host / max(host gather, copy) |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *[f"| {s} | {e} | {u['nanogpt']:.0f} | {u['host']:.0f} | **{u['resident']:.0f}** | "
          f"{_copy_cells(u, cuda)[0]} | {u['host gather']:.0f} | {u['gather']:.0f} | "
          f"{u['resident'] / u['gather']:.2f}× | {_copy_cells(u, cuda)[1]} |" for s, e, u in rows], "",
        "Resident path: `TokenDataset(path, device=..., resident=True)` (runtime/resident.py): the host draws the "
        "offsets, the device gathers and widens; the same batches as the host path. Host path: rows gathered on "
        "the host into pinned buffers and copied on a side stream (on the CPU: gathered and widened there). "
        + ("" if cuda else "On the CPU there is no copy (—), the host path also widens to int64 (so it is not "
           "compared with its host-gather floor), and the resident path runs torch gathers on CPU tensors: there the "
           "host path is the faster one, and the resident path is meant for a GPU."),
    ])  # fmt: skip


def prepared(tmp: Path, tokens: int) -> tuple[dict[str, Path], str]:
    """The shared corpus, prepared as one uint32 shard and converted to uint16."""
    tmp.mkdir(parents=True, exist_ok=True)
    src = write_repeated(tmp / "x.jsonl.gz", max(1, round(tokens / 16.5e6)))
    root = tmp / "u32"
    prepare(PrepareConfig(inputs=[str(src)], out=str(root), val_fraction=0.0, tokens_per_shard=10**10, quiet=True))
    convert_dataset(root, "uint16", tmp / "u16")
    n = TokenDataset(root).n_tokens
    return {"uint32": root, "uint16": tmp / "u16"}, f"the shared corpus, {n / 1e6:.1f} M GPT-2 tokens, one shard"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--tokens", type=float, default=16.5e6, help="about how many tokens the split holds")
    ap.add_argument("--no-write", action="store_true", help="print only; do not update docs/performance.md")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        roots, setup = prepared(Path(tmp), int(args.tokens))
        print(f"{machine()}\ndevice: {device}; data: {setup}", flush=True)
        table = report(device_rows(roots, args.seconds, device), device, setup)
    print(table)
    if not args.no_write:
        update_performance_md("batches on the device", table)


if __name__ == "__main__":
    main()
