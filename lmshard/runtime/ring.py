"""Host buffers for batches on their way to the device: a ring of them, reused round-robin,
pinned and paired with a copy stream on CUDA (see batches.py).

Memory model: `size` buffers of `numel` int32 each, allocated once.
"""

from __future__ import annotations

from typing import Any

import torch


class Ring:
    """Host buffers reused round-robin; pinned and paired with a copy stream on CUDA."""

    def __init__(self, device: torch.device, numel: int, size: int = 2) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.buffers = [torch.empty(numel, dtype=torch.int32, pin_memory=self.cuda) for _ in range(size)]
        self.events: list[Any] = [None] * size
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.next = 0

    def host(self, rows: int, cols: int) -> torch.Tensor:
        slot = self.next
        if self.events[slot] is not None:
            self.events[slot].synchronize()  # its previous copy must finish before we overwrite
        return self.buffers[slot][: rows * cols].view(rows, cols)

    def send(self, host: torch.Tensor) -> tuple[torch.Tensor, Any]:
        slot = self.next
        self.next = (slot + 1) % len(self.buffers)
        if not self.cuda:
            return host, None
        assert self.stream is not None
        with torch.cuda.stream(self.stream):
            moved = host.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        self.events[slot] = event
        return moved, event

    def receive(self, moved: torch.Tensor, event: Any) -> torch.Tensor:
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
            moved.record_stream(torch.cuda.current_stream(self.device))
        return moved
