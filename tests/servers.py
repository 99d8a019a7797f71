"""Real servers on loopback for the remote tests, started as processes and stopped by pid.

- `S3Server`: moto's standalone S3 API server (`moto_server`, from `moto[server]`), the server
  s3fs's own test suite runs against. `env()` gives the variables that point boto at it.
- `HttpServer`: a static file server with byte ranges (Python's http.server lacks them), for
  `https://`-style inputs; it serves a directory.

Both can be stopped and started again on the same port, to test a server that goes away.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BUCKET = "lmshard-test"
MOTO = Path(sys.executable).with_name("moto_server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within 60 s")


class _Process:
    command: list[str]
    what = "server"

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)  # fmt: skip
        _wait_listening(self.port, self.proc, self.what)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


class S3Server(_Process):
    what = "moto_server"

    def __init__(self) -> None:
        super().__init__()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.command = [str(MOTO), "-H", "127.0.0.1", "-p", str(self.port)]

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing-key-id",
                "AWS_SECRET_ACCESS_KEY": "testing-secret-key", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true", "LMSHARD_REMOTE_ATTEMPTS": "3"}  # fmt: skip

    def client(self):  # noqa: ANN201 (boto3 is a test dependency here)
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing-key-id",
                            aws_secret_access_key="testing-secret-key", region_name="us-east-1")  # fmt: skip

    def make_bucket(self, name: str = BUCKET) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str) -> dict[str, bytes]:
        """{key relative to prefix: bytes} of every object under `prefix/`, read with boto3."""
        client, out = self.client(), {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix.rstrip("/") + "/"):
            for item in page.get("Contents", []):
                key = item["Key"]
                out[key[len(prefix.rstrip("/")) + 1 :]] = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        return out


class HttpServer(_Process):
    what = "http server"

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [sys.executable, str(Path(__file__).with_name("range_http.py")), str(root), str(self.port)]


def local_tree(root: Path) -> dict[str, bytes]:
    """{path relative to root: bytes} of every file under `root`."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
