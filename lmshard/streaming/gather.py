"""`state_dict(gather=True)` of a text stream: every stream rank's state, gathered over
torch.distributed so that rank 0 can save it alone.

Memory model: one state (a few integers per reader) per process of the group.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ArgumentError


def gather_states(own: dict[str, Any], world_size: int, group: Any) -> dict[str, Any]:
    """Every process's `own` state (or the error it met making it), checked: one state per
    stream rank (processes that share a rank agree), every rank of `world_size` present."""
    gathered: list[Any] = [own]
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        gathered = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, own, group=group)
    elif world_size > 1:
        raise ArgumentError("state_dict(gather=True) on a stream of several ranks gathers over "
                            "torch.distributed: initialise it first (torchrun, init_process_group)")  # fmt: skip
    failed = [g for g in gathered if g.get("kind") == "lmshard.stream.error"]
    if failed:
        raise ArgumentError(f"state_dict(gather=True): rank {failed[0]['rank']}: {failed[0]['error']}")
    ranks: dict[int, Any] = {}
    for g in gathered:
        if ranks.setdefault(g["rank"], g) != g:
            raise ArgumentError(f"state_dict(gather=True): processes that share stream rank {g['rank']} are at "
                                "different positions; give each data-parallel rank its own rank= (tensor and "
                                "pipeline peers share theirs and draw the same batches)")  # fmt: skip
    if set(ranks) != set(range(world_size)):
        raise ArgumentError(f"state_dict(gather=True) gathered the states of stream ranks {sorted(ranks)}, but the "
                            f"stream has world_size={world_size}: pass a group that holds every data-parallel rank "
                            "(or none: all processes)")  # fmt: skip
    return {"kind": "lmshard.stream.ranks", "world_size": world_size, "ranks": [ranks[r] for r in range(world_size)]}
