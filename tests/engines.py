"""Real engines for the scale-out tests, started here and stopped by the pids they wrote: a
single-node Slurm cluster (munged, slurmctld, slurmd from Debian's packages) on loopback, under
one temporary directory. Recipe: ../shared/ENGINES.md (measured on these machines)."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo")


def slurm_available() -> bool:
    return all(shutil.which(b) for b in SLURM_BINARIES)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _conf(base: Path, ctld_port: int, d_port: int, limits: dict[str, int]) -> str:
    me = getpass.getuser()
    cpus = os.cpu_count() or 1
    extra = "".join(f"{key}={value}\n" for key, value in limits.items())
    return f"""{extra}ClusterName=lmshard-test
SlurmctldHost=localhost
SlurmUser={me}
SlurmdUser={me}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/munge/munge.socket
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
MpiDefault=none
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _pid(path: Path, timeout: float = 10.0) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text().strip())
        time.sleep(0.05)
    return None


@contextlib.contextmanager
def slurm_cluster(**limits: int) -> Iterator[dict[str, str]]:
    """Start munged, slurmctld and slurmd under a new directory of /tmp (munged wants every
    directory above its socket searchable by all, which pytest's tmp_path is not); yield the
    environment that points Slurm's commands at them; stop the three daemons by the pids they
    wrote, and remove the directory. `limits` are written into slurm.conf as they are named
    there (MaxJobCount=8, MaxArraySize=5: a site's caps on the jobs it holds at once)."""
    base = Path(tempfile.mkdtemp(prefix="lmshard-slurm-"))
    for d in ("etc", "state", "spool", "log", "run", "munge"):
        (base / d).mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)
    os.chmod(base / "munge", 0o755)
    key = base / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    conf = base / "etc" / "slurm.conf"
    conf.write_text(_conf(base, *_free_ports(2), limits))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    pid_files = [base / "munge" / "munged.pid", base / "run" / "slurmctld.pid", base / "run" / "slurmd.pid"]
    try:
        subprocess.run(["munged", f"--key-file={key}", f"--socket={base}/munge/munge.socket",
                        f"--pid-file={pid_files[0]}", f"--log-file={base}/munge/munged.log",
                        f"--seed-file={base}/munge/munged.seed"], check=True, env=env, timeout=30)  # fmt: skip
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=env, timeout=30)
        subprocess.run(["slurmd", "-f", str(conf), "-N", "localhost"], check=True, env=env, timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env)
            if state.stdout.strip() == "idle":
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"slurm did not become idle: {(base / 'log' / 'slurmctld.log').read_text()[-2000:]}")
        yield env
    finally:
        for pid_file in reversed(pid_files):
            pid = _pid(pid_file, timeout=1.0)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        for pid_file in pid_files:  # wait until they are gone (~5 s), then kill what is left
            pid = _pid(pid_file, timeout=0.1)
            deadline = time.monotonic() + 15
            while pid is not None and time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.1)
            if pid is not None and Path(f"/proc/{pid}").exists():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)
