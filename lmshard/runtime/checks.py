"""Argument checks for the runtime's public API, run when a dataset or stream is built.

Each raises a one-line `ArgumentError` naming the argument, the value it got and the fix, so a
misuse never surfaces later as a raw numpy/torch error or a silently wrong stream. Ints may be
Python or numpy integers; bools are refused where an int is meant (True is an int in Python,
`batch_size=True` is a mistake), and only real bools (or numpy's) pass where a flag is meant
(`shuffle="False"` is truthy).
"""

from __future__ import annotations

import contextlib
import numbers
import os
import re
import reprlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..errors import ArgumentError

_short = reprlib.Repr()  # attributes, not keywords: Python 3.11 takes none
_short.maxstring = _short.maxother = 40


def show(value: object) -> str:
    """`repr(value)`, short and on one line (an error message is a single line)."""
    if isinstance(value, np.ndarray):
        return f"array(shape {value.shape}, dtype {value.dtype})"
    return " ".join(_short.repr(value).split())


def is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(name: str, value: object, low: int | None = None, high: int | None = None, fix: str = "") -> int:
    """`value` as an int in [low, high]; None bounds are open."""
    if not is_int(value):
        raise ArgumentError(f"{name}={show(value)} is not an int; {fix or _int_fix(name, value)}")
    n = int(value)  # type: ignore[call-overload]  # an Integral
    if low is not None and n < low:
        raise ArgumentError(f"{name}={n} must be at least {low}; {fix or f'pass {name}={low} or more'}")
    if high is not None and n > high:
        raise ArgumentError(f"{name}={n} must be at most {high}; {fix or f'pass {name}={high} or less'}")
    return n


def positive(name: str, value: object, fix: str = "") -> int:
    return integer(name, value, low=1, fix=fix)


def nonnegative(name: str, value: object, fix: str = "") -> int:
    return integer(name, value, low=0, fix=fix)


def _int_fix(name: str, value: object) -> str:
    """The fix for a value that is not an int: the int it looks like, if there is one."""
    if isinstance(value, bool):
        return f"pass an int, not a bool ({name}={int(value)} if you meant it)"
    looks_whole = isinstance(value, float) and value.is_integer()
    looks_whole |= isinstance(value, str) and value.strip().lstrip("-").isdigit()
    return f"pass {name}={int(value)}" if looks_whole else f"pass {name} as an int"  # type: ignore[call-overload]


def flag(name: str, value: object) -> bool:
    """A real bool: a string such as "False" is truthy, and 0/1 hide a swapped argument."""
    if not isinstance(value, bool | np.bool_):
        raise ArgumentError(f"{name}={show(value)} is not a bool; pass {name}=True or False")
    return bool(value)


def seed(value: object) -> int:
    return integer("seed", value, low=0, fix="pass a seed that is an int, at least 0")


def device(value: object) -> torch.device:
    """A device the stream can put batches on: the CPU, or a CUDA device that exists. Checked
    now, not at the first batch (pinned memory on a machine without CUDA fails only there).
    Other device types are refused: the staged path's host-to-device copy is written for
    CUDA streams and would leave batches on the CPU."""
    if not isinstance(value, str | torch.device):
        raise ArgumentError(f"device={show(value)} is not a device; pass device='cpu' or device='cuda'")
    try:
        dev = torch.device(value)
    except (RuntimeError, ValueError):
        raise ArgumentError(f"device={value!r} is not a device torch knows; pass device='cpu' or device='cuda' "
                            "(or 'cuda:<index>')") from None  # fmt: skip
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(f"device={str(dev)!r} but torch.cuda.is_available() is False; pass device='cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ArgumentError(f"device={str(dev)!r} but this machine has {torch.cuda.device_count()} CUDA "
                                "device(s); pass device='cuda' (the current one) or device='cpu'")  # fmt: skip
    elif dev.type != "cpu":
        raise ArgumentError(f"device={str(dev)!r}: the loader makes batches on 'cpu' or 'cuda' only; pass "
                            f"device='cpu' and move each batch with x.to({dev.type!r})")  # fmt: skip
    return dev


def fits(where: str, n_tokens: int, seq_len: int, shift: int) -> None:
    """At least one row of seq_len + shift tokens fits in the `n_tokens` of `where`."""
    if n_tokens < seq_len + shift:
        raise ArgumentError(f"{where} has {n_tokens} tokens, fewer than seq_len + shift = {seq_len + shift} "
                            f"({seq_len} + {shift}); lower seq_len or use a larger split")  # fmt: skip


STATE_FIX = "pass the dict that stream.state_dict() returned, unchanged"


def rewind(step: int, in_hand: int) -> int:
    """The step a state saved with `in_hand` batches drawn but not yet used resumes at."""
    n = integer("in_hand", in_hand, low=0, fix="pass how many drawn batches the loop holds unused (0 or 1)")
    if n > step:
        raise ArgumentError(f"in_hand={n}, but the stream has handed out only {step} batches; pass at most {step}")
    return step - n


def state_int(state: dict[str, Any], key: str, low: int | None = None) -> int:
    """An int field of a resume state."""
    if key not in state:
        raise ArgumentError(f"state has no {key!r}; {STATE_FIX}")
    return integer(f"saved {key}", state[key], low=low, fix=STATE_FIX)


def data_of(data: Any) -> dict[str, str]:
    """The `data` entry of a state for a stream over `data` (a TokenDataset: its data_id)."""
    data_id = getattr(data, "data_id", None)
    return {"data": data_id} if isinstance(data_id, str) else {}


def same_data(saved: Any, mine: str | None, growable: bool | None = None) -> None:
    """Refuse a state saved on other data than the stream reads (`TokenDataset.data_id`): one line
    saying what changed. A state without it (saved before states recorded it) is not checked.
    `growable`, for streams that can continue on a grown split (runtime/growth.py): whether the
    saved data is the first shards of this split."""
    if saved is None or mine is None or saved == mine:
        return
    was, now = _data_words(saved), _data_words(mine)
    before, after = was[2], now[2]
    grew = after - before if isinstance(before, int) and isinstance(after, int) else 0
    if growable:
        raise ArgumentError(f"cannot resume: the state was saved on {_data_text(was)}, and the split has grown by "
                            f"{grew:,} tokens since (an --append); pass grown='continue' to load_state_dict "
                            "to go on with the new documents added from the next epoch (random batches: from this "
                            "step), or start from step 0")  # fmt: skip
    if was[1] == now[1] and grew > 0 and growable is None:
        why = f"the split has grown by {grew:,} tokens since (an --append?)"
    elif was[1] and was[1] == now[1] and before == after:  # (its checksums are of the shards' stored bytes)
        why = ("the data changed since (a rebuild of as many tokens, or the same tokens in another shard encoding: "
               "`lmshard convert` it back to the one it was saved on)")  # fmt: skip
    elif growable is False:
        why = "the data changed since (a rebuild, another dataset or split; not the saved data with documents added)"
    else:
        why = "the data changed since (a rebuild, another dataset or split)"
    raise ArgumentError(f"cannot resume: the state was saved on {_data_text(was)}, and this stream reads "
                        f"{_data_text(now)}: {why}; a state continues only on the data it was saved on, so resume "
                        "on that dataset, or start this one from step 0")  # fmt: skip


def describe_data(data_id: Any) -> str:
    """A data_id as messages name it: "split train of 7,650 tokens (data 99f9…)"."""
    return _data_text(_data_words(data_id))


def cannot_grow(kind: str, saved: Any, mine: str | None, grown: Any) -> None:
    """For streams that do not continue on a grown split: refuse other data in one line, and a
    grown='continue' that would be needed (validated as the streams that take it do)."""
    if grown not in (None, "refuse", "continue"):
        raise ArgumentError(f"grown={show(grown)}: pass grown='continue' or leave it unset")
    if grown == "continue" and saved is not None and mine is not None and saved != mine:
        raise ArgumentError(f"cannot resume: {kind} streams do not continue on a grown split (the state was saved "
                            f"on {describe_data(saved)}, this stream reads {describe_data(mine)}); use window, "
                            "random, packed or padded batches for that, or start from step 0")  # fmt: skip
    same_data(saved, mine)


@contextlib.contextmanager
def unchanged_on_error(*where: tuple[Any, str]) -> Iterator[None]:
    """Put the (object, attribute) pairs back as they were if the block raises: a refused
    `load_state_dict` leaves the stream as it was."""
    before = [(obj, name, getattr(obj, name)) for obj, name in where]
    try:
        yield
    except BaseException:
        for obj, name, value in before:
            setattr(obj, name, value)
        raise


def _data_words(data_id: Any) -> tuple[str, str, int | str]:
    """(digest, split, tokens) of a data_id ("digest:split:tokens", where the split may hold a
    load-time split's "@fraction/seed" and a where= condition after "?", colons included; in
    memory "name:tokens")."""
    digest, _, rest = str(data_id).partition(":")
    split, _, n = rest.rpartition(":")
    if re.fullmatch(r"[0-9a-f]{16}", digest) and split and n.isdigit():
        return digest, split, int(n)
    name, _, n = str(data_id).rpartition(":")
    return name, "", int(n) if n.isdigit() else n


def data_split(data_id: Any) -> str:
    """The split part of a data_id ("train", "val@0.01/0", "train?words > 20"); "" in memory."""
    return _data_words(data_id)[1]


def _data_text(words: tuple[str, str, int | str]) -> str:
    digest, split, n = words
    size = f"{n:,} tokens" if isinstance(n, int) else str(n)
    split = split.replace("?", " where ", 1)  # (a where= selection)
    return f"split {split} of {size} (data {digest})" if split else f"{digest} ({size})"


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """rank/world_size from the arguments, else torchrun's environment, else (0, 1)."""
    world = _from_env("WORLD_SIZE", "1") if world_size is None else integer("world_size", world_size)
    r = _from_env("RANK", "0") if rank is None else integer("rank", rank)
    if world < 1:
        raise ArgumentError(f"world_size={world} must be at least 1; pass world_size=1 for a single process")
    if not 0 <= r < world:
        raise ArgumentError(f"rank={r} is not in [0, world_size={world}); pass a rank below world_size "
                            "(ranks count from 0)")  # fmt: skip
    return r, world


def _from_env(var: str, default: str) -> int:
    """torchrun's RANK / WORLD_SIZE, read only when the argument is None."""
    raw = os.environ.get(var, default)
    try:
        return int(raw)
    except ValueError:
        raise ArgumentError(f"environment variable {var}={raw!r} is not an int; pass {var.lower()}=<int> "
                            f"explicitly or fix {var}") from None  # fmt: skip


def ids(name: str, values: object, one: bool = False) -> np.ndarray:
    """`values` as a one-dimensional integer array (no float or bool: a cast would truncate)."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ArgumentError(f"{name} has shape {array.shape}; pass a one-dimensional array of integers")
    if array.dtype.kind not in "iu":
        raise ArgumentError(f"{name} has dtype {array.dtype}; pass integer {'token ids' if one else 'lengths'}")
    if one and array.size == 0:
        raise ArgumentError(f"{name} is empty; pass at least one token")
    return array

