"""Stop points (lmshard/prepare/stops.py), the fault tests' way to stop a process at an exact
place: `POINT:N!` stops the process, and once woken it waits for a stop signal and handles it as
it would have, whenever the signal came: while it was stopped (before SIGCONT) or once woken.
(The signals are blocked from before the stop and taken by sigwait: a wait by signal.pause could
miss one that arrived between its last check and the wait, and wait forever.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import signal, sys
from lmshard.prepare.stops import stop_point

def stop(signum, frame):
    print(f"handled {signal.Signals(signum).name}", flush=True)
    sys.exit(3)

signal.signal(signal.SIGTERM, stop)
stop_point("unit", 4)
stop_point("unit", 5)
print("went on", flush=True)
"""


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _until_stopped(pid: int) -> None:
    deadline = time.monotonic() + 60  # a timeout, never a condition
    while _state(pid) != "T":
        assert time.monotonic() < deadline, "the child never stopped at its stop point"
        time.sleep(0.01)


def test_a_stop_signal_sent_while_stopped_is_handled_once_woken():
    env = os.environ | {"LMSHARD_STOP_AT": "unit=5!"}
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, text=True)
    try:
        _until_stopped(child.pid)
        os.kill(child.pid, signal.SIGTERM)  # kept pending while the child is stopped
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert (child.returncode, out) == (3, "handled SIGTERM\n")


def test_a_woken_process_waits_for_the_stop_signal():
    env = os.environ | {"LMSHARD_STOP_AT": "unit=5!"}
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, text=True)
    try:
        _until_stopped(child.pid)
        os.kill(child.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while _state(child.pid) not in ("S", "Z"):  # woken: waiting for the signal (or, wrongly, gone on)
            assert time.monotonic() < deadline, "the child never woke"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGTERM)
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert (child.returncode, out) == (3, "handled SIGTERM\n")  # (not "went on" first)
