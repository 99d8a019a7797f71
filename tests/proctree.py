"""Process-tree helpers for the worker-death tests and scripts/stress_workers.py (Linux /proc).

A prepare run is started in a session of its own, so its process group holds the run and every
worker it spawned; a test that times out kills that group, never anything it did not start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LMSHARD = [sys.executable, "-m", "lmshard"]  # honours PYTHONPATH, so a stress run can pin a checkout


def start_prepare(args: list[str]) -> subprocess.Popen[str]:
    """`lmshard prepare ARGS` in a new session (its own process group), output captured, with
    SIGINT at its default, as in a terminal's foreground job (a test run started in the
    background inherits SIGINT ignored, and prepare keeps an ignored SIGINT ignored)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([*LMSHARD, "prepare", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True, preexec_fn=_default_sigint)  # fmt: skip


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # [state, ppid, pgrp, ...]; the name may hold spaces


def alive(pid: int) -> bool:
    """Running or sleeping: not gone, and not a zombie waiting for its parent to reap it."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                found.append(int(entry))
    return found


def workers_of(pid: int) -> list[int]:
    """The live worker processes of `pid`: spawned children (a fresh interpreter running
    multiprocessing's `spawn_main`) and forked ones (the parent's own command line)."""
    try:
        parent = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else None
        if fields is None or int(fields[1]) != pid or fields[0] in ("Z", "X"):
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline or cmdline == parent:
            found.append(int(entry))
    return found


def wait_for_workers(proc: subprocess.Popen[str], n: int, timeout: float = 60.0) -> list[int]:
    """Poll (every 2 ms) until `proc` has `n` live workers; [] if it ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        found = workers_of(proc.pid)
        if len(found) >= n:
            return sorted(found)
        time.sleep(0.002)
    return []


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int | None, str]:
    """(exit code, stderr) of a run; None if it did not end in `timeout` seconds, after which
    its whole process group has been killed, so a hang never outlives the test. The stderr of
    a hung run ends with where each of its processes was (`describe_group`)."""
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        where = describe_group(proc.pid)
        kill_group(proc.pid)
        _, err = proc.communicate()
        return None, f"{err}\n{where}"


def describe_group(pgid: int) -> str:
    """For a hang's report: each live process of the group, its parent, state, the kernel
    function it waits in, and its threads' states (Linux /proc; what cannot be read is left
    out)."""
    lines = ["the run's processes when it was called hung (pid ppid state wchan threads):"]
    for pid in sorted(group_members(pgid)):
        fields = _stat(pid) or ["?", "?"]
        wchan = ""
        with contextlib.suppress(OSError):
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        threads = []
        with contextlib.suppress(OSError):
            for tid in sorted(os.listdir(f"/proc/{pid}/task")):
                with contextlib.suppress(OSError):
                    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                    tw = Path(f"/proc/{pid}/task/{tid}/wchan").read_text().strip()
                    threads.append(f"{tid}:{stat[0]}:{tw}")
        lines.append(f"  {pid} {fields[1]} {fields[0]} {wchan or '-'} {' '.join(threads)}")
    return "\n".join(lines)


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Poll until none of `pids` is alive; return those still alive after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def wait_stopped(proc: subprocess.Popen[str], timeout: float = 300.0) -> int | None:
    """Poll (every 2 ms) until a process of `proc`'s group has stopped itself at a stop point
    and return its pid; None if the run ended first. The timeout only guards a hang: a run
    reaches its stop point after a fixed amount of work, however fast the machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for pid in group_members(proc.pid):
            fields = _stat(pid)
            if fields is not None and fields[0] == "T":
                return pid
        time.sleep(0.002)
    return None


def signal_stopped(pgid: int, sig: int) -> None:
    """Send `sig` to every process of a group held at a stop point, as a terminal or scheduler
    does, then let them go on (SIGCONT) to act on it. The group leader (the run's main process)
    gets it in its main thread: a process-directed signal may be taken by another of its threads
    (the pool's), whose handler can run after the main thread has passed its check for a stop,
    so the run would act on it one item later, or not at all at its last item."""
    for pid in group_members(pgid):
        with contextlib.suppress(ProcessLookupError):
            if pid != pgid or not _tgkill(pid, pid, sig):
                os.kill(pid, sig)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGCONT)


def _tgkill(pid: int, tid: int, sig: int) -> bool:
    """Linux's tgkill(2) through the C library: `sig` to thread `tid` (the main thread's id is the
    pid); False where the C library has no tgkill."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).tgkill
    except (AttributeError, OSError):
        return False
    if fn(pid, tid, sig) != 0:
        raise ProcessLookupError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return True
