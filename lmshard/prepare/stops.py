"""Stop points: a process stops itself at an exact place in its work, so a fault test can kill
it there whatever the machine's speed.

`LMSHARD_STOP_AT=POINT:N` (several separated by commas) makes the process that passes POINT
for the Nth time send itself SIGSTOP. The test sees it stopped (state T in /proc), sends the
signal it is testing (SIGKILL, SIGINT, SIGTERM...) and, for a catchable one, SIGCONT. A run
without the variable pays one dictionary lookup per point passed.

The points:
- `item`: the main process merged its Nth work item (checkpoint taken where one was due);
- `worker-item`: a worker tokenized its Nth work item, before sending the result back;
- `unit`: a planned run's worker wrote its Nth unit's results and marker, before reporting it.

Memory model: one counter per point.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

_passed: Counter[str] = Counter()


def _wanted() -> dict[str, int]:
    spec = os.environ.get("LMSHARD_STOP_AT", "")
    wanted = {}
    for part in filter(None, spec.split(",")):
        point, _, n = part.partition(":")
        wanted[point.strip()] = int(n or 1)
    return wanted


def stop_point(point: str) -> None:
    """Count a pass through `point`; stop this process if LMSHARD_STOP_AT names this pass."""
    if "LMSHARD_STOP_AT" not in os.environ:
        return
    _passed[point] += 1
    if _wanted().get(point) == _passed[point]:
        os.kill(os.getpid(), signal.SIGSTOP)
