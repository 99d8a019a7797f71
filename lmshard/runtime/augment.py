"""Augmentation hooks: `stream.augment(fn)` transforms every batch after it is drawn.

    def mask_some(batch, *, step, rank, generator):
        drop = torch.rand(batch.x.shape, generator=generator) < 0.05
        batch.x[drop] = 0                    # a tensor the batch owns: change it in place
        return batch

    train = ds.window_batches(16, 1024, seed=1).augment(mask_some)

`fn(batch, step=, rank=, generator=)` gets the batch as the stream made it (a `Batch`, or the
mapping of a packed or padded batch), the run's step number (`batch.step`), this rank, and a CPU
`torch.Generator` seeded from (the stream's seed, step, rank), and returns the batch (changed in
place, or a new one). Drawn from that generator, a transform is a pure function of the step and
rank like the batch itself: the same for any DataLoader worker count, after a restart, and on a
resumed run. It runs where the batch is made (in a DataLoader worker on the CPU, else in the
training process, on the batch's device). The stream's state records the hook's name
(`module.qualname`), and a state is refused by a stream with another hook or none. `trace` lists
the documents drawn, before the hook.

Memory model: nothing beyond what the hook allocates.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError
from . import checks
from .keyed import keyed_ints

_SALT = 0xA0C3E7


def name_of(fn: Callable[..., Any]) -> str:
    """How a state records a hook: its module and qualified name (a `functools.partial`: its
    function's, with the arguments it binds). Every lambda of a module shares one name."""
    if isinstance(fn, functools.partial):
        bound = [repr(a) for a in fn.args] + [f"{k}={v!r}" for k, v in sorted(fn.keywords.items())]
        return f"{name_of(fn.func)}({', '.join(bound)})"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


class Augmented:
    """The hook of a stream (mixed into BatchStream, the packed and padded streams and a text
    stream's batches); `seed` and `rank` come from the stream."""

    rank: int
    _hook: Callable[..., Any] | None = None
    _hook_name: str | None = None
    _hook_spec: str | None = None  # "module:function" or "path.py:function": imported again when unpickled

    def augment(self, fn: Callable[..., Any] | str | None, what: str | None = None) -> Any:
        """Transform every batch with `fn(batch, step=, rank=, generator=)` (see
        runtime/augment.py; None: no hook), or the function a "module:function" or
        "path/to/file.py:function" string names; returns the stream. `what`: how an import
        error names the hook (default: augment='...')."""
        spec = fn if isinstance(fn, str) else None
        if spec is not None:
            from ..errors import ConfigError
            from ..plugins import import_callable

            try:
                fn = import_callable(spec, what or f"augment={spec!r}")
            except ConfigError as e:
                raise ArgumentError(str(e)) from None
        if fn is not None and not callable(fn):
            raise ArgumentError(f"augment={checks.show(fn)} is not callable; pass a function (batch, *, step, rank, "
                                "generator) -> batch")  # fmt: skip
        self._hook, self._hook_name, self._hook_spec = fn, None if fn is None else name_of(fn), spec
        return self

    def __getstate__(self) -> dict[str, Any]:
        """A hook named by a string travels as the string (a function loaded from a file path
        cannot be pickled by reference: a spawned DataLoader worker imports it again)."""
        state = dict(self.__dict__)
        if state.get("_hook_spec"):
            state["_hook"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._hook is None and self._hook_spec:
            from ..plugins import import_callable

            self._hook = import_callable(self._hook_spec, f"augment={self._hook_spec!r}")

    def _augmented(self, batch: Any, step: int) -> Any:
        """`batch` (of the run's step `step`) through the hook, if there is one."""
        if self._hook is None:
            return batch
        key = np.array([step * 65536 + self.rank], dtype=np.uint64)
        seed = int(self.seed)  # type: ignore[attr-defined]  # (every stream has one: attribute or property)
        generator = torch.Generator().manual_seed(int(keyed_ints(seed ^ _SALT, key, 1 << 62)[0]))
        out = self._hook(batch, step=step, rank=self.rank, generator=generator)
        if out is None:
            raise ArgumentError(f"the augment hook {self._hook_name} returned None at step {step}; return the batch "
                                "(changed in place, or a new one)")  # fmt: skip
        return out

    def _augment_state(self) -> dict[str, Any]:
        return {"augment": self._hook_name} if self._hook_name else {}

    def _check_augment(self, state: Mapping[str, Any]) -> None:
        """Refuse a state saved with another hook than this stream's (or with one, without)."""
        saved = state.get("augment")
        if saved != self._hook_name:
            raise ArgumentError(f"cannot resume: the state was saved with augment={saved!r}, and this stream has "
                                f"augment={self._hook_name!r}; pass the same hook to stream.augment() to continue "
                                "that run")  # fmt: skip
