"""Stop points: a process stops itself at an exact place in its work, so a fault test can kill
it there whatever the machine's speed.

`LMSHARD_STOP_AT=POINT:N` (several separated by commas) makes a process that passes POINT for
the Nth time send itself SIGSTOP; `POINT=K` stops the one process that passes POINT for the work
item or unit numbered K (where several workers count passes of their own, only one of them
handles K). A trailing `!` (`unit=5!`) makes the woken process wait for a stop signal (SIGINT, SIGTERM)
before it goes on, then handle it as it would have: scancel wakes a task with SIGCONT before it
sends SIGTERM, and a task going on at once could do more work in between. The stop signals are
blocked from before the process stops itself, so one that arrives while it is stopped or waking
is kept for the wait (signal.pause could miss it and wait forever). They are blocked in the
thread that stops only: one that another thread of the process takes (a native library's) runs
its handler there, which the wait, in steps of 50 ms, lets through. The test sees it stopped (state T in
/proc), sends the signal it is testing (SIGKILL, SIGINT, SIGTERM...) and, for a catchable one,
SIGCONT. A run without the variable pays one dictionary lookup per point passed.

The points:
- `item`: a process writing a unit of the tokenize stage took its Nth work item's result (the
  unit's file in progress, no marker yet);
- `worker-item`: a worker tokenized its Nth work item (key: the item number in the first input),
  before sending the result back;
- `unit`: a planned run's process (a local worker or `run-task`) wrote its Nth unit's results and
  marker, before reporting it (a planned retokenize or score: its source shard numbered N);
- `bucket`, `select`, `part`, `piece`: the same for a dedup group of buckets, a selected unit, a
  written part of a shard or key file, a sealed shard or key file (keys: their numbers; a planned
  retokenize's written shard: its number in the layout);
- `round` (--near-dedup over parts, nearparts.py): a select task claimed its Nth item of the
  rounds that find the clusters, before doing it;
- `lines`, `linebucket` (--dedup-lines): the same for a unit whose lines were hashed, and a group
  of buckets of line keys resolved;
- `swap`: the main process passed a step of the final swap (staging.commit). With the atomic
  exchange (`--overwrite`, `--append`): 1 after the exchange (the old dataset under the build's
  name), 2 after the old one was renamed to the trash. With two renames (no exchange): 1 between
  them (`--out` missing), 2 after the second, 3 after the trash rename. A new `--out`: 1 after its
  rename. The last pass is before the run record in the dataset is removed and the trash emptied.

The stop signals themselves (`STOP_SIGNALS`) are the main process's to handle: a worker ignores
them (`ignore_stop_signals`), and starts with them held (`stop_signals_held`, around its start).

Memory model: one counter per point.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # what stops a run: Ctrl-C, and SIGTERM (kill, a scheduler)
_passed: Counter[str] = Counter()


def _wanted() -> list[tuple[str, str, int, bool]]:
    wanted = []
    for part in filter(None, os.environ.get("LMSHARD_STOP_AT", "").split(",")):
        how = "=" if "=" in part else ":"
        point, _, n = part.strip().partition(how)
        wait = n.endswith("!")
        wanted.append((point.strip(), how, int(n.rstrip("!") or 1), wait))
    return wanted


def stop_point(point: str, key: int | None = None) -> None:
    """Count a pass through `point` (of item or unit `key`); stop this process if LMSHARD_STOP_AT
    names this pass."""
    if "LMSHARD_STOP_AT" not in os.environ:
        return
    _passed[point] += 1
    for name, how, n, wait in _wanted():
        if name == point and n == (_passed[point] if how == ":" else key):
            if wait:
                signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            os.kill(os.getpid(), signal.SIGSTOP)
            if wait:
                try:
                    got = None
                    while got is None:  # (in steps: a signal another thread of the process took runs its handler
                        info = signal.sigtimedwait(STOP_SIGNALS, 0.05)  # here, between two, and ends the wait)
                        got = info.si_signo if info is not None else None
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
                signal.raise_signal(got)  # (its handler runs now: the run stops as that signal stops it)


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held around a process start (in the main thread, where handlers live):
    blocked, so the child starts with them blocked through fork and exec and cannot die of a
    Ctrl-C, or of a scheduler's SIGTERM to the whole process group, while it imports, before it
    ignores them (`ignore_stop_signals`); and in this process recorded by a handler of their own
    (another thread may take one sent to the process), then taken by its own handlers once they
    are back. Ignoring them meanwhile, as this once did, lost them: a Ctrl-C while the pool
    started a worker stopped nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    old = {sig: signal.signal(sig, lambda sig, frame: held.append(sig)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for again in dict.fromkeys(held):  # (one another thread took: sent again, for the handlers that are back)
            signal.pthread_kill(threading.main_thread().ident or 0, again)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # (every one held is taken now)


def ignore_stop_signals() -> None:
    """In a worker: Ctrl-C and SIGTERM ignored (the parent's to handle: it stops the workers),
    and no longer blocked, as `stop_signals_held` started the worker."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
