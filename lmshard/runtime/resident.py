"""Device-resident splits: a split's tokens uploaded once to the device, and batches gathered
there (`TokenDataset(..., device="cuda", resident=True)`, `Mixture(..., resident=True)`).

A stream over a resident split draws exactly the batches the host path draws: the host still
computes each step's row offsets with the same closed-form generator (B integers, a few
microseconds), sends them to the device (B × 8 bytes, from pinned memory on CUDA), and the
device gathers x and y from its copy of the split and widens them to int64 in the same
operations. No token passes through the host after the upload, and `state_dict()` is the same
as the host path's, so a state saved on one resumes on the other.

The copy keeps the split's stored width: uint32 shards as int32 (4 bytes a token), uint16 as
int16 (2 bytes, widened and masked in the gather), packed shards as their bit stream (⌈log2
n_vocab⌉ bits a token, unpacked in the gather from two 32-bit words), zstd shards decoded to
their frame width (2 bytes up to 65,536 ids; else the bit stream of 8 × width bits). A mixture's
copy holds all its sources in the widest of their widths.

`resident=True` uploads or refuses, in one line, a split larger than `budget` (a fraction) of
the device's free memory; `resident="auto"` uploads when it fits and otherwise warns in one line
and keeps the host path. On the CPU (`device="cpu"`) the same code runs on a CPU tensor, which is
how the test suite checks that both paths give the same batches.

Memory model: on the device, the split in its stored width (`nbytes`, also `Resident.nbytes`
on the dataset's `resident`) and, per batch, its index and output tensors; on the host, one
upload chunk of CHUNK tokens (16 MiB) while uploading, then per step the rows' offsets only.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError
from ..format.bitpack import pack
from . import checks
from .packedbatch import row_segments

CHUNK = 1 << 22  # tokens uploaded at a time: a multiple of 32, so each packed chunk starts on a word


def _bits(store: Any) -> int:
    """Bits a token of `store` takes in its stored encoding (32 without an encoding)."""
    if hasattr(store, "stores"):  # a mixture's joint store: the widest of its sources
        return max(_bits(s) for s in store.stores)
    encoding = getattr(store, "encoding", None) or getattr(getattr(store, "base", None), "encoding", None)
    if encoding is None or encoding.name == "uint32":
        return 32
    return 16 if encoding.name == "uint16" else int(encoding.bits)


def resident_bytes(n_tokens: int, bits: int) -> int:
    """Device bytes of a resident copy of n_tokens at `bits` bits (see `Resident`)."""
    if bits >= 32:
        return 4 * n_tokens
    if bits == 16:
        return 2 * n_tokens
    return 4 * ((n_tokens * bits + 31) // 32 + 1)


def free_bytes(device: torch.device) -> int:
    """Free memory of `device`: CUDA's own count, or the host's MemAvailable for the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _normal(device: torch.device) -> torch.device:
    """`cuda` as `cuda:<current>`: two spellings of one device compare equal."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class Resident:
    """A store's tokens on `device`, in their stored width (see the module docstring); `take`
    reads any tensor of addresses as int64 token ids."""

    def __init__(self, store: Any, device: torch.device, bits: int | None = None) -> None:
        self.device, self.bits, self.n_tokens = _normal(device), bits or _bits(store), int(store.n_tokens)
        self.layout = "uint32" if self.bits >= 32 else "uint16" if self.bits == 16 else f"packed/{self.bits}"
        n, words = self.n_tokens, resident_bytes(self.n_tokens, self.bits) // 4
        dtype = torch.int16 if self.bits == 16 else torch.int32
        self.data = torch.zeros(words if self.layout.startswith("packed") else n, dtype=dtype, device=self.device)
        self._upload(store)
        self._cols: dict[tuple[int, int], torch.Tensor] = {}

    def __repr__(self) -> str:
        return f"Resident({self.n_tokens:,} tokens as {self.layout} on {self.device}, {self.nbytes:,} bytes)"

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def _upload(self, store: Any) -> None:
        """The store's tokens, CHUNK at a time, read on the host and copied into place."""
        raw = self.data.view(torch.uint8) if self.layout.startswith("packed") else None
        for a in range(0, self.n_tokens, CHUNK):
            chunk = np.empty(min(CHUNK, self.n_tokens - a), dtype=np.uint32)
            _read(store, a, chunk)
            if raw is not None:  # a: a multiple of 32 tokens, so the chunk's bytes start on a word
                packed = pack(chunk, self.bits)
                raw[a * self.bits // 8 : a * self.bits // 8 + len(packed)].copy_(torch.from_numpy(packed))
                continue
            narrow = chunk.view(np.int32) if self.bits != 16 else chunk.astype(np.uint16).view(np.int16)
            self.data[a : a + len(chunk)].copy_(torch.from_numpy(narrow))

    def take(self, at: torch.Tensor) -> torch.Tensor:
        """Token ids (int64, the shape of `at`) at the addresses `at` (int64, on the device).
        uint32 ids of 2**31 and above read as negative, as the host path's int32 view does."""
        # (`take`: one gather kernel on CUDA, and on the CPU several times faster than indexing)
        if self.layout == "uint32":
            return self.data.take(at).to(torch.int64)
        if self.layout == "uint16":
            return self.data.take(at).to(torch.int64).bitwise_and_(0xFFFF)
        pos = at * self.bits  # LSB first: token i is bits [i·b, (i+1)·b) of the stream (format/bitpack.py)
        word = pos >> 5
        low = self.data.take(word).to(torch.int64).bitwise_and_(0xFFFFFFFF)
        high = self.data.take(word + 1).to(torch.int64).bitwise_and_(0x7FFFFFFF)  # (bit 63 is never one of ours)
        return ((high << 32) | low).bitwise_right_shift_(pos & 31).bitwise_and_((1 << self.bits) - 1)

    def send(self, values: np.ndarray | torch.Tensor) -> torch.Tensor:
        return send(values, self.device)

    def __reduce__(self) -> Any:
        """Never pickled: a resident stream draws in the training process (see `no_workers`)."""
        raise ArgumentError(_WORKERS)

    def pair(self, offsets: np.ndarray, shift: int, T: int) -> torch.Tensor:
        """[2, rows, T] int64: x (the T tokens at each offset) and y (the same, `shift` on)."""
        cols = self._cols.get((shift, T))
        if cols is None:  # a few (shift, T) pairs per stream
            base = torch.arange(T, dtype=torch.int64, device=self.device)
            cols = self._cols[(shift, T)] = torch.stack([base, base + shift]).view(2, 1, T)
        return self.take(self.send(offsets).view(1, -1, 1) + cols)

    def packed_rows(self, starts: np.ndarray, lengths: np.ndarray, counts: np.ndarray, T: int, pad_id: int,
                    mask_boundary_labels: bool, ignore: int) -> dict[str, Any]:  # fmt: skip
        """`packed.build_rows` on the device: the same fields, equal values; input_ids, labels
        and position_ids on the device, length and segments on the host (a few integers a row)."""
        n_rows = len(counts)
        lengths = np.asarray(lengths, dtype=np.int64)
        first_of_row = np.cumsum(counts) - counts
        row = np.repeat(np.arange(n_rows), counts)
        ends = np.cumsum(lengths)
        at = ends - lengths - np.repeat(ends[first_of_row] - lengths[first_of_row], counts) + row * T
        real = np.bincount(row, weights=lengths, minlength=n_rows).astype(np.int64)
        n = n_rows * T
        dead = (at + lengths - 1) if mask_boundary_labels else (np.arange(n_rows) * T + real - 1)
        parts = [np.asarray(starts, dtype=np.int64), lengths, at, real, dead % max(n, 1)]
        sizes = [len(p) for p in parts]
        start_d, length_d, at_d, real_d, dead_d = torch.split(self.send(np.concatenate(parts)), sizes)
        p = torch.arange(n, dtype=torch.int64, device=self.device)
        item = (torch.searchsorted(at_d, p, right=True) - 1).clamp_(min=0)
        off = p - at_d[item]
        inside = (off >= 0) & (off < length_d[item])
        pad = int(np.array(pad_id, dtype=np.int64).astype(np.uint32).view(np.int32))
        ids = torch.where(inside, self.take(torch.where(inside, start_d[item] + off, 0)), pad)
        labels = torch.full((n,), ignore, dtype=torch.int64, device=self.device)
        labels[:-1] = ids[1:]
        labels.index_fill_(0, dead_d, ignore)
        row_of, col = p // T, p % T
        labels.masked_fill_(col >= real_d[row_of], ignore)
        position = torch.where(inside, off, col - real_d[row_of])
        segments = row_segments(lengths, counts, real, T)
        return {"input_ids": ids.view(n_rows, T), "labels": labels.view(n_rows, T),
                "position_ids": position.view(n_rows, T), "length": real, "segments": segments}  # fmt: skip


def send(values: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host array (int64 unless a tensor) on `device`: on CUDA from pinned memory, without a
    wait for the work queued on the device (a plain copy would wait for the training step)."""
    host = values if isinstance(values, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(values,
                                                                                                  dtype=np.int64))
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _read(store: Any, offset: int, out: np.ndarray) -> None:
    """`store.read_into`, split at a mixture's source boundaries (a read stays inside one)."""
    bases = getattr(store, "bases", None)
    if bases is None:
        store.read_into(offset, out)
        return
    done = 0
    while done < len(out):
        s = int(np.searchsorted(bases, offset + done, side="right")) - 1
        take = min(len(out) - done, int(bases[s + 1]) - offset - done)
        store.stores[s].read_into(offset + done - int(bases[s]), out[done : done + take])
        done += take


def place(store: Any, device: Any, mode: Any, budget: Any, where: str) -> Resident | None:
    """The resident copy `mode` asks for (None: the host path), or a one-line refusal."""
    if not (mode is True or mode is False or isinstance(mode, str) and mode == "auto"):
        raise ArgumentError(f"resident={checks.show(mode)}: pass True (upload, or refuse when it does not fit), "
                            "'auto' (upload when it fits) or False")  # fmt: skip
    if not isinstance(budget, int | float) or isinstance(budget, bool) or not 0 < budget <= 1:
        raise ArgumentError(f"resident_budget={checks.show(budget)}: pass the fraction of the device's free memory "
                            "the split may take, in (0, 1] (e.g. 0.5)")  # fmt: skip
    if mode is False:
        if device is not None:
            checks.device(device)
        return None
    if device is None:
        raise ArgumentError(f"resident={mode!r} needs the device to upload to; pass device='cuda' (or 'cpu')")
    dev = _normal(checks.device(device))
    bits = _bits(store)
    need, free = resident_bytes(int(store.n_tokens), bits), free_bytes(dev)
    if need > budget * free:
        why = (f"{where} takes {need:,} bytes on {dev} ({'uint32' if bits >= 32 else f'{bits} bits a token'}), "
               f"more than resident_budget={budget:g} of its {free:,} free bytes")  # fmt: skip
        if mode is True:
            raise ArgumentError(f"{why}; pass resident='auto' to fall back to the host path, a larger "
                                "resident_budget, or store the split as uint16 or packed")  # fmt: skip
        warnings.warn(f"{why}: batches are gathered on the host and copied instead", stacklevel=3)
        return None
    return Resident(store, dev, bits)


def stream_device(device: Any, resident: Resident | None, where: str) -> torch.device:
    """The device a stream makes batches on: the given one (default: the resident copy's, else
    the CPU); a device other than the resident copy's is refused in one line."""
    if resident is None:
        return checks.device("cpu" if device is None else device)
    if device is None:
        return resident.device
    dev = _normal(checks.device(device))
    if dev != resident.device:
        raise ArgumentError(f"device={str(device)!r}, but {where} is resident on {resident.device}; draw its "
                            f"batches there (device={str(resident.device)!r}, or no device=), or open it without "
                            f"resident= to draw on {dev}")  # fmt: skip
    return dev


def no_workers(resident: Resident | None) -> None:
    """A resident stream's batches are made on the device by the training process itself."""
    if resident is not None and torch.utils.data.get_worker_info() is not None:
        raise ArgumentError(_WORKERS)


_WORKERS = ("this stream draws on the device from a resident split; iterate it in the training process (next(stream), "
            "or a DataLoader(stream, batch_size=None) without workers)")
