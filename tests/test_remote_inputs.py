"""`prepare` from URLs against a real S3 API server (moto) and a byte-range HTTP server on loopback:
the same dataset, byte for byte, as `prepare` of local copies of the same files (objects, globs,
prefixes walked as directories, compressed files, parquet, arrow, CSV), for one worker and two,
on the one-reader path and as scale-out tasks that cut a large file into byte ranges; one-line
errors for a missing object, an empty glob and a dead server; credentials never shown.

The truth each run is compared with is `prepare` of the local files the objects were uploaded
from. What may differ is named in `_files`: the metadata's "run" record (timings, host, --out),
and where the inputs were (the recorded `config.inputs` and `sources[].path`), which are checked
apart: the URLs, redacted, in the local inputs' order.
"""

from __future__ import annotations

import bz2
import gzip
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import lmshard.prepare.documents.sources as sources_mod
from lmshard.cli import app
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.documents.reading import InputReadError
from lmshard.prepare.documents.sources import discover, plan
from lmshard.prepare.documents.urlfile import URLInput
from lmshard.prepare.execution import local_exec, plainplan
from lmshard.prepare.execution.stages import STAGES, run_task
from lmshard.prepare.execution.taskplan import load_plan, work_dir
from lmshard.prepare.execution.units import _WINDOW
from lmshard.remote import Retry

runner = CliRunner()
_OPTS = dict(val_fraction=0.1, tokens_per_shard=4_000, on_error="skip")


def _texts(n: int, seed: int) -> list[str]:
    words = ["the", "of", "shard", "naïve", "東京", "😀", "token", "x=1;", "data"]
    return [f"doc {seed}-{i}: " + " ".join(words[(i * 7 + k) % len(words)] for k in range(i % 40)) for i in range(n)]


def _jsonl(texts: list[str]) -> bytes:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()


def _corpus(root: Path) -> Path:
    """A folder of every input kind, with duplicates across files, a hidden folder and a file of
    unknown type (both left out and counted), and a nested folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    texts = _texts(1200, 1)
    root.mkdir(parents=True)
    (root / "a.jsonl").write_bytes(_jsonl(texts[:500] + texts[:20]))
    (root / "b.jsonl.gz").write_bytes(gzip.compress(_jsonl(texts[500:800]), mtime=0))
    (root / "c.txt").write_text("\n\n".join(texts[800:900]) + "\n")
    (root / "c2.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(_jsonl(texts[:60])))
    (root / "c3.md.bz2").write_bytes(bz2.compress("\n\n".join(texts[60:90]).encode()))
    (root / "sub").mkdir()
    pq.write_table(pa.table({"text": texts[900:1100]}), root / "sub" / "d.parquet", row_group_size=64)
    with pa.ipc.new_stream(root / "sub" / "e.arrow", pa.schema([("text", pa.string())])) as w:
        for k in range(1100, 1200, 30):
            w.write_batch(pa.record_batch([pa.array(texts[k : k + 30])], names=["text"]))
    (root / "f.csv").write_text("id,text\n" + "".join(f'{i},"{t}"\n' for i, t in enumerate(texts[:40])))
    (root / ".hidden").mkdir()
    (root / ".hidden" / "x.jsonl").write_bytes(_jsonl(["hidden"]))
    (root / "notes.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    return root


def _upload(server, bucket_url: str, prefix: str, local: Path) -> str:
    """Every file under `local` as objects under `bucket_url/prefix`; returns that URL."""
    client, bucket = server.client(), bucket_url.removeprefix("s3://")
    for p in sorted(local.rglob("*")):
        if p.is_file():
            client.put_object(Bucket=bucket, Key=f"{prefix}/{p.relative_to(local).as_posix()}", Body=p.read_bytes())
    return f"{bucket_url}/{prefix}"


def _files(root: Path) -> tuple[dict[str, bytes], list[str], list[str]]:
    """Every file of a dataset, the metadata without its "run" record and the inputs' locations;
    those locations (recorded inputs, source paths) come back apart."""
    out, inputs, paths = {}, [], []
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        data = p.read_bytes()
        if p.name == "dataset_metadata.json":
            meta = json.loads(data)
            meta.pop("run")
            inputs = meta["config"].pop("inputs")
            paths = [s.pop("path") for s in meta["sources"]]
            data = json.dumps(meta, sort_keys=True).encode()
        out[p.relative_to(root).as_posix()] = data
    return out, inputs, paths


def _same_dataset(local: Path, remote: Path, local_base: str, url_base: str) -> list[str]:
    """Assert the two datasets hold the same bytes; their sources (relative to each base) match."""
    a, a_inputs, a_paths = _files(local)
    b, b_inputs, b_paths = _files(remote)
    assert a.keys() == b.keys() and any(k.endswith(".bin") for k in a)
    for name in a:
        assert a[name] == b[name], name
    assert [p.removeprefix(local_base) for p in a_paths] == [p.removeprefix(url_base) for p in b_paths]
    assert all(p.startswith(url_base) for p in b_paths) and all(i.startswith(url_base) for i in b_inputs)
    assert len(a_inputs) == len(b_inputs)
    return b_paths


@pytest.mark.parametrize("workers", [1, 2])
def test_a_prefix_on_s3_gives_the_local_folders_dataset(tmp_path, s3, eager_pool, workers, monkeypatch):
    """The prefix is walked as the folder is (hidden and unknown files left out and counted), and
    every kind of input reads to the same bytes; small work items so that the files span many."""
    monkeypatch.setattr(sources_mod, "BLOCK_BYTES", 4096)
    monkeypatch.setenv("LMSHARD_BLOCK_BYTES", "4096")  # (and in the pool's spawned workers)
    server, bucket = s3
    local = _corpus(tmp_path / "corpus")
    url = _upload(server, bucket, "data/corpus", local)
    prepare(PrepareConfig(inputs=[str(local)], out=str(tmp_path / "local"), workers=workers, **_OPTS))
    meta = prepare(PrepareConfig(inputs=[url + "/"], out=str(tmp_path / "remote"), workers=workers, **_OPTS))
    paths = _same_dataset(tmp_path / "local", tmp_path / "remote", str(local), url)
    assert [p.removeprefix(url + "/") for p in paths] == ["a.jsonl", "b.jsonl.gz", "c.txt", "c2.txt.zst", "c3.md.bz2",
                                                          "f.csv", "sub/d.parquet", "sub/e.arrow"]  # fmt: skip
    assert meta.skipped_inputs.hidden_dirs == 1 and meta.skipped_inputs.unknown_type == {".png": 1}
    assert meta.drops["duplicate"] >= 20 and meta.splits["val"].n_docs > 0


def test_globs_and_objects_on_s3_give_the_local_globs_dataset(tmp_path, s3):
    """Globs (`*` leaves hidden names out, as the shell's does; `**` goes down folders) and
    single objects, in order; --exclude matches the URL as it matches the path."""
    server, bucket = s3
    local = _corpus(tmp_path / "corpus")
    (local / ".hidden.jsonl").write_bytes(_jsonl(["hidden"]))
    url = _upload(server, bucket, "corpus", local)
    for base, out in ((str(local), "local"), (url, "remote")):
        prepare(PrepareConfig(inputs=[f"{base}/*.jsonl*", f"{base}/**/*.parquet", f"{base}/c.txt"],
                              exclude=["*/b.*"], out=str(tmp_path / out), workers=1, **_OPTS))  # fmt: skip
    paths = _same_dataset(tmp_path / "local", tmp_path / "remote", str(local), url)
    assert [p.removeprefix(url + "/") for p in paths] == ["a.jsonl", "sub/d.parquet", "c.txt"]


@pytest.mark.parametrize("workers", [1, 2])
def test_https_style_inputs_give_the_local_files_dataset(tmp_path, http_server, eager_pool, workers, monkeypatch):
    monkeypatch.setattr(sources_mod, "BLOCK_BYTES", 4096)
    monkeypatch.setenv("LMSHARD_BLOCK_BYTES", "4096")  # (and in the pool's spawned workers)
    local = _corpus(http_server.root / "corpus")
    names = ["a.jsonl", "b.jsonl.gz", "c.txt", "c2.txt.zst", "sub/d.parquet", "sub/e.arrow", "f.csv"]
    base = f"{http_server.url}/corpus/"
    prepare(PrepareConfig(inputs=[str(local / n) for n in names], out=str(tmp_path / "local"), workers=workers,
                          **_OPTS))  # fmt: skip
    prepare(PrepareConfig(inputs=[base + n for n in names], out=str(tmp_path / "remote"), workers=workers, **_OPTS))
    _same_dataset(tmp_path / "local", tmp_path / "remote", f"{local}/", base)


def _big_jsonl(root: Path) -> Path:
    root.mkdir(parents=True)
    texts = _texts(6000, 2)
    (root / "big.jsonl").write_bytes(_jsonl(texts + texts[:300]))  # duplicates across byte ranges
    (root / "small.jsonl").write_bytes(_jsonl(texts[5000:5100]))
    return root


@pytest.mark.parametrize("pool", [False, True], ids=["here", "pool"])
def test_a_large_line_file_is_planned_in_byte_ranges_as_a_local_one_is(tmp_path, s3, monkeypatch, pool):
    """The work items of a large object are the local file's, block for block (ranged reads),
    and the dataset is the local one's: its stages in this process, and in the pool of two
    workers that a plain prepare of a large input takes."""
    monkeypatch.setattr(sources_mod, "BLOCK_BYTES", 8192)
    monkeypatch.setenv("LMSHARD_BLOCK_BYTES", "8192")  # for spawned workers (fsspec's thread rules out fork)
    if pool:
        monkeypatch.setattr(plainplan, "POOL_BYTES", 0)
    server, bucket = s3
    local = _big_jsonl(tmp_path / "in")
    url = _upload(server, bucket, "in", local)
    items = {}
    for where in (str(local / "big.jsonl"), url + "/big.jsonl"):
        items[where] = [(i.kind, i.first_line, i.payload, i.nbytes) for i in plan(discover([where]), "auto", "text")]
    local_items, remote_items = items.values()
    assert len(local_items) > 20 and remote_items == local_items
    prepare(PrepareConfig(inputs=[str(local)], out=str(tmp_path / "local"), workers=1, **_OPTS))
    pooled, real = [], local_exec.item_pool
    monkeypatch.setattr(local_exec, "item_pool", lambda *a, **k: pooled.append(1) or real(*a, **k))
    prepare(PrepareConfig(inputs=[url], out=str(tmp_path / "remote"), workers=2, **_OPTS))
    assert bool(pooled) == pool
    _same_dataset(tmp_path / "local", tmp_path / "remote", str(local), url)


def test_a_store_gone_during_a_staged_run_keeps_the_work_for_resume(tmp_path, http_server, monkeypatch):
    """The server stops after the plan, before the workers read: the run ends in one line naming
    the URL and --resume, keeps its work (the store failed, not the input), and --resume once the
    server is back gives the local files' dataset."""
    monkeypatch.setattr(sources_mod, "BLOCK_BYTES", 8192)
    monkeypatch.setenv("LMSHARD_BLOCK_BYTES", "8192")
    monkeypatch.setenv("LMSHARD_REMOTE_ATTEMPTS", "1")  # the spawned workers' budget: no backoff to wait out
    local = _big_jsonl(tmp_path / "in")
    (http_server.root / "big.jsonl").write_bytes((local / "big.jsonl").read_bytes())
    url = f"{http_server.url}/big.jsonl"
    real_stages = local_exec._stages

    def server_gone_then_stages(r, on_progress, *rest):
        http_server.stop()
        real_stages(r, on_progress, *rest)

    monkeypatch.setattr(local_exec, "_stages", server_gone_then_stages)
    out = tmp_path / "remote"
    message = _cli_error([url, "--out", str(out), "--workers", "2", "--val-fraction", "0.1", "--tokens-per-shard",
                          "4000", "--on-error", "skip"])  # fmt: skip
    assert message.startswith(f"error: {url}") and "failed after 1 attempt " in message, message
    assert message.endswith("run the same command with --resume to continue") and ".remote.lmshard-work" in message
    assert work_dir(out).is_dir()
    monkeypatch.setattr(local_exec, "_stages", real_stages)
    http_server.start()
    prepare(PrepareConfig(inputs=[url], out=str(out), workers=2, resume=True, **_OPTS))
    prepare(PrepareConfig(inputs=[str(local / "big.jsonl")], out=str(tmp_path / "local"), workers=1, **_OPTS))
    _same_dataset(tmp_path / "local", out, str(local / "big.jsonl"), url)


@pytest.mark.parametrize("n_tasks", [1, 3])
def test_scale_out_tasks_cut_an_object_into_byte_ranges_with_the_one_machine_bytes(tmp_path, s3, n_tasks):
    """`--num-tasks N`: the plan cuts the large object into range units of 64 KiB; every task of
    every stage in reversed order gives the dataset of a one-machine prepare of the local files."""
    server, bucket = s3
    local = _big_jsonl(tmp_path / "in")
    url = _upload(server, bucket, "in", local)
    prepare(PrepareConfig(inputs=[str(local)], out=str(tmp_path / "local"), workers=1, **_OPTS))
    config = PrepareConfig(inputs=[url], out=str(tmp_path / "scaled"), workers=1, unit_size=_WINDOW, **_OPTS)
    local_exec.claim(config, n_tasks)
    units = load_plan(work_dir(config.out))["units"]
    assert sum(kind == "range" for _, kind, *_ in units) >= 5  # big.jsonl (about 400 KB) cut by byte ranges
    for stage in STAGES[:-1]:
        for task in reversed(range(n_tasks)):
            run_task(config, n_tasks, stage, task, unit_bytes=_WINDOW)
    assert run_task(config, n_tasks, "finish", 0, unit_bytes=_WINDOW) == 1
    _same_dataset(tmp_path / "local", tmp_path / "scaled", str(local), url)


def _cli_error(args: list[str]) -> str:
    """The error of `lmshard prepare ARGS`: exit 1, and one line (after the run's start line)."""
    result = runner.invoke(app, ["prepare", *args])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert "Traceback" not in result.output and lines[-1].startswith("error: "), result.output
    assert len(lines) == 1 or (len(lines) == 2 and lines[0].startswith("lmshard prepare: ")), result.output
    return lines[-1]


def test_a_missing_object_an_empty_glob_and_an_empty_prefix_are_one_line(tmp_path, s3, http_server):
    server, bucket = s3
    server.client().put_object(Bucket=bucket.removeprefix("s3://"), Key="data/x.png", Body=b"\x89PNG\x00")
    out = ["--out", str(tmp_path / "o"), "--workers", "1"]
    assert f"{bucket}/nope.jsonl: no such object, and no objects under it as a prefix; check the URL" in \
        _cli_error([f"{bucket}/nope.jsonl", *out])  # fmt: skip
    assert "s3://no-such-bucket-here/in/: the bucket 'no-such-bucket-here' does not exist" in \
        _cli_error(["s3://no-such-bucket-here/in/", *out])  # fmt: skip
    assert f"{bucket}/data/*.jsonl: no object matches this glob; check the URL and the pattern" in \
        _cli_error([f"{bucket}/data/*.jsonl", *out])  # fmt: skip
    assert f"{bucket}/data: nothing to read: skipped 1 file of unknown type (.png 1)" in \
        _cli_error([f"{bucket}/data", *out])  # fmt: skip
    assert f"{http_server.url}/nope.jsonl: no such file on the server" in \
        _cli_error([f"{http_server.url}/nope.jsonl", *out])  # fmt: skip
    assert "ftp://h/x.jsonl: lmshard reads s3://, gs://, az://, hf:// and https:// URLs, not ftp://" in \
        _cli_error(["ftp://h/x.jsonl", *out])  # fmt: skip
    assert not (tmp_path / "o").exists()


def test_a_scheme_whose_package_is_missing_names_the_extra(tmp_path, monkeypatch):
    """gs:// needs gcsfs: one line naming the package and the extra to install (simulated absent
    where it is installed)."""
    import sys

    import fsspec  # noqa: F401  (its registry module, below)

    monkeypatch.setitem(sys.modules, "gcsfs", None)  # `import gcsfs` raises ImportError
    monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, "gs", raising=False)  # no class cached for gs
    message = _cli_error(["gs://bucket/data/*.jsonl", "--out", str(tmp_path / "o"), "--quiet"])
    assert message == ("error: gs://bucket/data/*.jsonl: gs:// needs the 'gcsfs' package: "
                       "pip install 'lmshard[gcs]'")  # fmt: skip
    assert _cli_error([str(tmp_path), "--out", "gs://bucket/ds", "--quiet"]) == (
        "error: gs://bucket/ds: gs:// needs the 'gcsfs' package: pip install 'lmshard[gcs]'")  # written, not read


def _password_url(http_server) -> str:
    (http_server.root / "a.jsonl").write_bytes(_jsonl(_texts(50, 3)))
    return http_server.url.replace("http://", "http://reader:s3cr3t-pw'q@") + "/a.jsonl"  # a quote in it, too


def test_credentials_in_a_url_are_never_recorded_nor_in_messages(tmp_path, http_server):
    """http://user:secret@host/... is read (the password goes to the server), and nothing the
    run writes, nor a message about the URL, holds the password."""
    url = _password_url(http_server)
    out = tmp_path / "o"
    prepare(PrepareConfig(inputs=[url], out=str(out), workers=1))
    recorded = "".join(p.read_bytes().decode("latin-1") for p in out.rglob("*") if p.is_file())
    assert "s3cr3t-pw" not in recorded and "reader:" not in recorded and "http://***@127.0.0.1" in recorded
    meta = json.loads((out / "dataset_metadata.json").read_text())
    assert meta["sources"][0]["path"] == meta["config"]["inputs"][0] == url.replace("reader:s3cr3t-pw'q@", "***@")
    message = _cli_error([url.replace("a.jsonl", "missing.jsonl"), "--out", str(tmp_path / "p"), "--quiet"])
    assert "s3cr3t-pw" not in message and "***@127.0.0.1" in message


def test_a_plan_that_holds_a_urls_credentials_is_readable_by_its_owner_only(tmp_path, http_server):
    """The tasks of a scale-out run read their inputs from the plan, credentials and all: the plan
    is then mode 0600 whatever the umask, and the dataset it finishes records none of them."""
    url = _password_url(http_server)
    config = PrepareConfig(inputs=[url], out=str(tmp_path / "o"), workers=1, **_OPTS)
    plain = PrepareConfig(inputs=[str(tmp_path / "plain.jsonl")], out=str(tmp_path / "p"), workers=1, **_OPTS)
    (tmp_path / "plain.jsonl").write_bytes(_jsonl(_texts(50, 3)))
    for c in (config, plain):
        local_exec.claim(c, 2)
    plan_file = work_dir(config.out) / "plan.json"
    assert "s3cr3t-pw" in plan_file.read_text()  # what the tasks read the input with
    assert plan_file.stat().st_mode & 0o777 == 0o600
    umask = os.umask(0)
    os.umask(umask)
    assert (work_dir(plain.out) / "plan.json").stat().st_mode & 0o777 == 0o666 & ~umask  # as every other file
    for stage in STAGES:
        for task in range(1 if stage == "finish" else 2):
            run_task(config, 2, stage, task)
    recorded = "".join(p.read_bytes().decode("latin-1") for p in Path(config.out).rglob("*") if p.is_file())
    assert "s3cr3t-pw" not in recorded and "***@127.0.0.1" in recorded
    assert not work_dir(config.out).exists()  # the plan went with the work folder


def test_redaction_finds_urls_anywhere_in_a_text():
    from lmshard.remote import redact

    quoted = '{"inputs": ["https://u:pw@h/a.jsonl"], "x": "(s3://AK:SK@b/k)"}'
    assert redact(quoted) == '{"inputs": ["https://***@h/a.jsonl"], "x": "(s3://***@b/k)"}'
    signed = "https://storage.example/b/o?X-Goog-Signature=GSIG&X-Goog-Credential=GC&alt=media"
    assert redact(signed) == "https://storage.example/b/o?X-Goog-Signature=***&X-Goog-Credential=***&alt=media"
    assert redact("hf://datasets/org/name@main/f.parquet") == "hf://datasets/org/name@main/f.parquet"
    assert redact("hf://gpt2@main/config.json") == "hf://gpt2@main/config.json"  # a revision, not a user
    assert redact("abfss://data@acct.dfs.core.windows.net/x") == "abfss://data@acct.dfs.core.windows.net/x"
    assert redact("https://u:it's@h/x") == "https://***@h/x" and redact("https://u:p@ss@h/x") == "https://***@h/x"
    assert redact("https://h/x?sig=ab'cd&z=1") == "https://h/x?sig=***&z=1"


def test_credentials_in_a_url_are_never_printed(tmp_path, http_server):
    result = runner.invoke(app, ["prepare", _password_url(http_server), "--out", str(tmp_path / "o"), "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert "s3cr3t-pw" not in result.output and "***@127.0.0.1" in result.output


class _Flaky:
    """An fsspec filesystem whose every other GET fails as a dropped connection would."""

    def __init__(self, fs):
        self.fs, self.gets = fs, 0

    def cat_file(self, path, start=None, end=None):
        self.gets += 1
        if self.gets % 2:
            raise ConnectionResetError("connection reset by peer")
        return self.fs.cat_file(path, start=start, end=end)

    def size(self, path):
        return self.fs.size(path)


def test_a_dropped_connection_is_retried_from_where_the_read_was(http_server, monkeypatch):
    import lmshard.prepare.documents.urlfile as urlfile

    data = bytes(range(256)) * 4000  # 1,024,000 bytes
    (http_server.root / "x.bin").write_bytes(data)
    monkeypatch.setattr(urlfile, "READ_BYTES", 100_000)
    monkeypatch.setattr(urlfile, "SEEK_READ_BYTES", 100_000)
    waits: list[float] = []
    f = URLInput(f"{http_server.url}/x.bin", "x.bin", len(data), Retry(attempts=2, sleep=waits.append))
    f._fs = flaky = _Flaky(f._fs)
    f.seek(1000)
    got = b"".join(iter(lambda: f.read(30_000), b""))
    assert got == data[1000:] and flaky.gets == 2 * -(-(len(data) - 1000) // 100_000) and len(waits) == flaky.gets // 2


def test_a_server_gone_mid_read_ends_in_one_line_naming_the_url(http_server):
    (http_server.root / "x.jsonl").write_bytes(_jsonl(_texts(3000, 4)))
    url = http_server.url.replace("http://", "http://u:pw-secret@") + "/x.jsonl"
    waits: list[float] = []
    f = URLInput(url, "shown-name", None, Retry(attempts=3, sleep=waits.append))
    assert f.read(10) == b'{"text": "'
    http_server.stop()
    f.seek(f.size - 5)
    with pytest.raises(InputReadError) as e:
        f.read()
    message = str(e.value)
    assert message.startswith(f"{http_server.url.replace('http://', 'http://***@')}/x.jsonl: GET bytes ")
    assert "failed after 3 attempts" in message and "pw-secret" not in message and "\n" not in message
    assert len(waits) == 2


def test_a_replaced_object_changes_the_resume_fingerprint(tmp_path, s3):
    """--resume compares each input's identity: for an object, its size and ETag from the
    listing; the same bytes again keep it, other bytes of the same size change it."""
    from lmshard.prepare.output.claim import _fingerprint
    from lmshard.tokenizers import load_tokenizer

    server, bucket = s3
    client, name = server.client(), bucket.removeprefix("s3://")
    client.put_object(Bucket=name, Key="a.jsonl", Body=_jsonl(["one"]))
    config = PrepareConfig(inputs=[f"{bucket}/a.jsonl"], out=str(tmp_path / "o"))
    tokenizer = load_tokenizer("gpt2")

    def fingerprint():
        return _fingerprint(config, discover(config.inputs), tokenizer, None)["sources"]

    first = fingerprint()
    client.put_object(Bucket=name, Key="a.jsonl", Body=_jsonl(["one"]))
    assert fingerprint() == first and first[0][:3] == [f"{bucket}/a.jsonl", "jsonl", 16] and first[0][3]
    client.put_object(Bucket=name, Key="a.jsonl", Body=_jsonl(["two"]))
    assert fingerprint() != first


def test_https_to_a_server_without_tls_is_named_as_such_not_missing(tmp_path, http_server, monkeypatch):
    """The HTTP client reports a failed TLS handshake as "not found": the cause decides, so the
    one line says the handshake failed, for an input and for a dataset the loader opens."""
    from lmshard import TokenDataset
    from lmshard.remote import RemoteError

    (http_server.root / "a.jsonl").write_bytes(_jsonl(_texts(5, 1)))
    url = http_server.url.replace("http://", "https://") + "/a.jsonl"
    monkeypatch.setenv("LMSHARD_REMOTE_ATTEMPTS", "1")
    message = _cli_error([url, "--out", str(tmp_path / "o"), "--quiet"])
    assert "TLS handshake failed: check the URL's scheme" in message and "no such file" not in message, message
    with pytest.raises(RemoteError, match="TLS handshake failed") as e:
        TokenDataset(url.removesuffix("/a.jsonl") + "/ds")
    assert "missing" not in str(e.value)
