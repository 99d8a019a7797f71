"""The object-store layer (lmshard/remote) against a real S3 API server and a real HTTP server
on loopback: ranged and concurrent reads, conditional puts, listings, retries with a driven
clock, and credentials kept out of messages."""

from __future__ import annotations

import pytest

from lmshard.remote import Remote, RemoteError, Retry, is_url, redact
from lmshard.remote.retry import transient


class Clock:
    """A sleep that only records, and the time it makes: the retry waits are driven, not waited."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)

    def now(self) -> float:
        return sum(self.waits)


def test_urls_and_redaction():
    assert is_url("s3://b/k") and is_url("https://h/x") and is_url("hf://datasets/a/b") and is_url("gs://b/x")
    assert not is_url("hf:wikitext") and not is_url("/tmp/x") and not is_url("data/file.jsonl")
    assert redact("https://user:pw@host/x?X-Amz-Signature=abc&ok=1") == "https://***@host/x?X-Amz-Signature=***&ok=1"
    assert "sig=***" in redact("az://c/x?sv=1&sig=SECRET") and "SECRET" not in redact("az://c/x?sv=1&sig=SECRET")


def test_objects_round_trip(s3):
    server, url = s3
    r = Remote(url + "/ds")
    r.put("a/x.bin", bytes(range(256)) * 4)
    assert r.size("a/x.bin") == 1024 and r.exists("a/x.bin") and not r.exists("a/y.bin")
    assert r.read_range("a/x.bin", 10, 20) == bytes(range(10, 20))
    got = r.read_ranges(["a/x.bin", "a/x.bin"], [0, 300], [3, 302])
    assert got == [bytes([0, 1, 2]), bytes([44, 45])]
    assert r.listing() == {"a/x.bin": 1024}
    assert r.create("lock", b"1") and not r.create("lock", b"2") and r.read("lock") == b"1"
    r.delete(["lock", "lock", "a/x.bin"])
    assert r.listing() == {}


def test_missing_object_is_one_line(s3):
    _, url = s3
    with pytest.raises(RemoteError, match=r"missing\.bin: GET failed \(.*\); check the URL") as e:
        Remote(url).read("missing.bin")
    assert "\n" not in str(e.value)


def test_dead_server_retries_then_one_line(s3):
    server, url = s3
    clock = Clock()
    r = Remote(url, retry=Retry(attempts=4, base=1.0, cap=5.0, sleep=clock, random=lambda: 1.0, clock=clock.now))
    r.put("x", b"abc")
    server.stop()
    try:
        with pytest.raises(RemoteError, match=r"x: GET bytes 0-1 failed after 4 attempts over 7\.0 s") as e:
            r.read_range("x", 0, 2)
        assert clock.waits == [1.0, 2.0, 4.0]  # exponential, full jitter drawn at its top here
        assert "testing-secret-key" not in str(e.value) and "\n" not in str(e.value)
    finally:
        server.start()
    server.make_bucket(url.removeprefix("s3://"))  # moto keeps its objects in memory: a restart starts empty
    r.put("x", b"abc")
    assert r.read_range("x", 0, 2) == b"ab"  # the same client reaches the restarted server


def test_transient_classification():
    class ClientError(Exception):
        def __init__(self, status: int, code: str) -> None:
            self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}

    assert transient(ClientError(503, "SlowDown")) and transient(ClientError(500, "InternalError"))
    assert transient(ClientError(429, "")) and transient(TimeoutError()) and transient(ConnectionResetError())
    assert not transient(ClientError(403, "AccessDenied")) and not transient(FileNotFoundError("x"))
    wrapped = OSError("wrapped")
    wrapped.__cause__ = ClientError(503, "SlowDown")
    assert transient(wrapped)


def test_http_ranges(http_server):
    (http_server.root / "f.txt").write_bytes(b"0123456789" * 10)
    r = Remote(http_server.url)
    assert r.size("f.txt") == 100
    assert r.read_range("f.txt", 5, 15) == b"5678901234"
    assert r.read("f.txt") == b"0123456789" * 10


def test_a_retry_asks_again_only_for_the_ranges_that_failed(http_server):
    """One of three ranges gets a 503: the next attempt asks for that one alone (the server's own
    log of GETs), and every range comes back whole."""
    root = http_server.root
    for name in ("a.bin", "b.bin", "c.bin"):
        (root / name).write_bytes(bytes(range(256)) * 4)
    (root / "b.bin.503").write_bytes(b"")
    (root / ".requests").write_text("")
    clock = Clock()
    r = Remote(http_server.url, retry=Retry(attempts=3, sleep=clock, clock=clock.now))
    got = r.read_ranges(["a.bin", "b.bin", "c.bin"], [0, 10, 1000], [100, 20, 1024])
    assert got == [(bytes(range(256)) * 4)[a:b] for a, b in ((0, 100), (10, 20), (1000, 1024))]
    asked = sorted(line.split()[0] for line in (root / ".requests").read_text().splitlines())
    assert asked == ["/a.bin", "/b.bin", "/b.bin", "/c.bin"] and len(clock.waits) == 1


def test_storage_options_merge_with_the_defaults(monkeypatch):
    from lmshard.remote.urls import _merged, _single_attempt

    given = {"config_kwargs": {"max_pool_connections": 8}, "anon": True}
    merged = _merged(_single_attempt("s3"), given)
    assert merged["anon"] is True and merged["config_kwargs"]["max_pool_connections"] == 8
    assert merged["config_kwargs"]["retries"] == {"max_attempts": 1, "mode": "standard"}  # kept: one attempt each


def test_a_refused_http_connection_is_retried_not_called_missing(tmp_path, monkeypatch):
    """fsspec's HTTP client reports a refused connection as FileNotFoundError; its cause decides."""
    from servers import free_port

    from lmshard.prepare import PrepareConfig, prepare

    url = f"http://127.0.0.1:{free_port()}/x.jsonl"  # nothing listens there
    clock = Clock()
    with pytest.raises(RemoteError, match=r"after 3 attempts .*check that the endpoint is reachable"):
        Remote(url.rsplit("/", 1)[0], retry=Retry(attempts=3, sleep=clock, clock=clock.now)).size("x.jsonl")
    assert len(clock.waits) == 2
    monkeypatch.setenv("LMSHARD_REMOTE_ATTEMPTS", "2")
    with pytest.raises(RemoteError, match=r"HEAD failed after 2 attempts .*ClientConnectorError"):
        prepare(PrepareConfig(inputs=[url], out=str(tmp_path / "out"), tokenizer="gpt2"))


def test_a_server_that_ignores_ranges_is_named_at_once(tmp_path):
    """Python's own http.server answers a Range request with the whole file."""
    import subprocess
    import sys

    from servers import _wait_listening, free_port

    (tmp_path / "f.bin").write_bytes(bytes(1000))
    port = free_port()
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(tmp_path)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, proc, "http.server")
        clock = Clock()
        r = Remote(f"http://127.0.0.1:{port}", retry=Retry(sleep=clock, clock=clock.now))
        with pytest.raises(RemoteError, match="the server ignores byte ranges .*1,000 bytes for a range of 10"):
            r.read_range("f.bin", 0, 10)
        assert clock.waits == []  # not retried: another attempt gets the same answer
        with pytest.raises(RemoteError, match="ignores byte ranges"):
            r.read_ranges(["f.bin"], [0], [10])
    finally:
        proc.kill()
        proc.wait()
    from lmshard import TokenDataset
    from lmshard.errors import ArgumentError

    with pytest.raises(ArgumentError, match="not a URL scheme lmshard reads"):
        TokenDataset("ftp://host/ds")


def test_a_refusal_of_the_client_itself_names_the_options_not_the_network(s3, monkeypatch):
    """A bad filesystem option fails before any request: one attempt, and the fix names the
    options; a user and password in an s3:// URL (which s3fs would take for the bucket) are refused
    before anything is sent, and never shown."""
    from lmshard.errors import ConfigError
    from lmshard.remote.urls import filesystem

    _, url = s3
    clock = Clock()
    monkeypatch.setenv("LMSHARD_STORAGE_OPTIONS", '{"bogus_option": 1}')
    with pytest.raises(RemoteError) as e:
        Remote(url + "/ds", retry=Retry(attempts=3, sleep=clock)).exists("dataset_metadata.json")
    assert "TypeError" in str(e.value) and "check the URL and the filesystem options (LMSHARD_STORAGE_OPTIONS" in str(
        e.value) and "endpoint" not in str(e.value) and clock.waits == []  # fmt: skip
    monkeypatch.delenv("LMSHARD_STORAGE_OPTIONS")
    with pytest.raises(ConfigError, match=r"s3://\*\*\*@b/k: a s3:// URL takes no user or password") as e:
        filesystem("s3://AKIAKEY:SECRETKEY@b/k")
    assert "SECRETKEY" not in str(e.value)

