"""`prepare --out s3://...` against a real S3 API server on loopback (moto): the same objects as
a local prepare, byte for byte; one writer per prefix; --overwrite, --append and --resume keep
their guarantees; an interrupted --overwrite leaves the old dataset readable and whole."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import write
from servers import local_tree

from lmshard.errors import ConfigError, LmshardError
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.output import publish


def texts(n: int, salt: str = "") -> str:
    return "".join(json.dumps({"text": f"{salt}document {i}: " + "word " * (i * 53 % 900)}) + "\n" for i in range(n))


@pytest.fixture
def inputs(tmp_path, monkeypatch):
    monkeypatch.setenv("LMSHARD_PUBLISH_DIR", str(tmp_path / "publish"))
    return write(tmp_path / "in" / "a.jsonl", texts(300))


def config(out, src, **options):
    base = {"tokens_per_shard": 30_000, "val_fraction": 0.1, "workers": 1}
    return PrepareConfig(inputs=[str(src)], out=out, tokenizer="gpt2", **(base | options))


def comparable(tree: dict[str, bytes], out: str | None = None) -> dict[str, bytes]:
    """The files of a dataset with its metadata's run record left out (its timings differ from
    run to run); `out`: the output the run record must name."""
    result = dict(tree)
    for name in [k for k in result if k.endswith("dataset_metadata.json")]:
        raw = json.loads(result[name])
        run = raw.pop("run", None)
        if out is not None and run is not None:
            assert run["out"] == out
        result[name] = json.dumps(raw).encode()
    return result


def remote_tree(server, url):
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return comparable(server.objects(bucket, prefix))


def test_s3_output_equals_local(s3, inputs, tmp_path):
    server, bucket = s3
    prepare(config(str(tmp_path / "local"), inputs))
    prepare(config(bucket + "/ds", inputs))
    local = comparable(local_tree(tmp_path / "local"))
    assert any(k.endswith(".sums") for k in local) and len([k for k in local if k.endswith(".bin")]) > 3
    assert remote_tree(server, bucket + "/ds") == local  # every object, byte for byte; the lock is gone


def test_one_writer_per_prefix(s3, inputs):
    server, bucket = s3
    url = bucket + "/ds"
    server.client().put_object(Bucket=bucket.removeprefix("s3://"), Key="ds/_lmshard_writer.json",
                               Body=json.dumps({"run": "other-run", "since": 0}).encode())
    with pytest.raises(ConfigError, match="another prepare is writing here .*other-run"):
        prepare(config(url, inputs))
    assert set(remote_tree(server, url)) == {"_lmshard_writer.json"}


def test_a_store_that_ignores_conditional_puts_is_warned_about(s3, inputs, capfd, monkeypatch):
    """moto refuses a second conditional PUT (as AWS S3 does): no warning. A store that ignores
    If-None-Match (here: the header left out of the real request) cannot keep two writers apart:
    the run says so, once, and goes on."""
    import s3fs

    server, bucket = s3
    prepare(config(bucket + "/a", inputs))
    assert "conditional PUT" not in capfd.readouterr().err
    real = s3fs.S3FileSystem._pipe_file

    async def unconditional(self, path, data, *args, mode="overwrite", **kwargs):
        return await real(self, path, data, *args, **kwargs)  # the store never sees the condition

    monkeypatch.setattr(s3fs.S3FileSystem, "_pipe_file", unconditional)
    s3fs.S3FileSystem.clear_instance_cache()  # instances bind their sync methods when made
    try:
        prepare(config(bucket + "/b", inputs))
    finally:
        monkeypatch.undo()
        s3fs.S3FileSystem.clear_instance_cache()  # no later test gets the unconditional instance
    err = capfd.readouterr().err
    assert err.count("does not keep a second prepare from writing here") == 1, err
    assert f"{bucket}/b: the store accepted a conditional PUT of an object that exists" in err
    assert remote_tree(server, bucket + "/b") == remote_tree(server, bucket + "/a")  # the run went on, whole


def test_existing_dataset_needs_a_flag_and_overwrite_replaces_it(s3, inputs, tmp_path):
    server, bucket = s3
    url = bucket + "/ds"
    prepare(config(url, inputs))
    with pytest.raises(ConfigError, match="already holds a dataset"):
        prepare(config(url, inputs))
    other = write(tmp_path / "in2" / "b.jsonl", texts(50, salt="other "))
    prepare(config(url, other, overwrite=True))
    prepare(config(str(tmp_path / "local"), other))
    objects = remote_tree(server, url)
    redirect = json.loads(objects["dataset_metadata.json"])
    generation = redirect["redirect"]
    assert set(redirect) == {"format", "redirect"} and generation.startswith("g-")
    inside = {k[len(generation) + 1 :]: v for k, v in objects.items() if k.startswith(generation + "/")}
    assert inside == comparable(local_tree(tmp_path / "local"))
    assert set(objects) == {"dataset_metadata.json"} | {f"{generation}/{k}" for k in inside}  # the old ones: gone


def test_interrupted_overwrite_leaves_the_old_dataset_whole(s3, inputs, tmp_path, monkeypatch):
    server, bucket = s3
    url = bucket + "/ds"
    prepare(config(url, inputs))
    before = remote_tree(server, url)

    def killed(self, meta):  # the run dies after its data objects are up, before the commit
        raise KeyboardInterrupt

    real_publish = publish.Publisher.publish
    monkeypatch.setattr(publish.Publisher, "publish", killed)
    other = write(tmp_path / "in2" / "b.jsonl", texts(50, salt="other "))
    with pytest.raises(KeyboardInterrupt):
        prepare(config(url, other, overwrite=True))
    after = remote_tree(server, url)
    assert {k: v for k, v in after.items() if k in before} == before  # untouched, and still the dataset
    assert json.loads(after["dataset_metadata.json"]) == json.loads(before["dataset_metadata.json"])
    monkeypatch.setattr(publish.Publisher, "publish", real_publish)
    prepare(config(url, other, overwrite=True, resume=True))  # --resume takes over its own lock and commits
    prepare(config(str(tmp_path / "local"), other))
    objects = remote_tree(server, url)
    generation = json.loads(objects["dataset_metadata.json"])["redirect"]
    assert {k[len(generation) + 1 :]: v for k, v in objects.items() if k.startswith(generation + "/")} == \
        comparable(local_tree(tmp_path / "local"))


@pytest.mark.parametrize("encoding", [None, "zstd"])
def test_append_adds_objects_and_keeps_the_old_ones(s3, inputs, tmp_path, encoding):
    server, bucket = s3
    url = bucket + "/ds"
    prepare(config(url, inputs, shard_encoding=encoding))
    before = remote_tree(server, url)
    more = write(tmp_path / "in2" / "b.jsonl", texts(40, salt="more "))
    prepare(config(url, more, append=True))  # (keeps the dataset's encoding)
    # The same append made locally, to a local copy of the first dataset.
    prepare(config(str(tmp_path / "local"), inputs, shard_encoding=encoding))
    prepare(config(str(tmp_path / "local"), more, append=True))
    after = remote_tree(server, url)
    assert after == comparable(local_tree(tmp_path / "local"))
    assert all(after[k] == v for k, v in before.items() if k != "dataset_metadata.json")
    if encoding:
        assert any(k.endswith(".blocks") for k in after)
        from lmshard import TokenDataset

        local, remote = TokenDataset(tmp_path / "local"), TokenDataset(url)
        assert np.array_equal(local.tokens(0, local.n_tokens), remote.tokens(0, remote.n_tokens))


def test_inspect_export_import_take_urls(s3, inputs, tmp_path):
    from typer.testing import CliRunner

    from lmshard.cli import app
    from lmshard.errors import EXIT_CORRUPT

    server, bucket = s3
    url = bucket + "/ds"
    prepare(config(url, inputs))
    runner = CliRunner()
    result = runner.invoke(app, ["inspect", url, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] and report["dataset"] == url and report["n_tokens"] > 0
    # export from the URL equals export from a local copy
    prepare(config(str(tmp_path / "local"), inputs))
    assert runner.invoke(app, ["export", url, "--to", "nanogpt", "--out", str(tmp_path / "e1")]).exit_code == 0
    assert runner.invoke(app, ["export", str(tmp_path / "local"), "--to", "nanogpt", "--out",
                               str(tmp_path / "e2")]).exit_code == 0
    e1, e2 = local_tree(tmp_path / "e1"), local_tree(tmp_path / "e2")
    assert json.loads(e1.pop("lmshard_export.json"))["source"] == url
    e2.pop("lmshard_export.json")
    assert e1 == e2
    # import to a URL equals import to a directory
    args = ["import", str(tmp_path / "e2"), "--from", "nanogpt", "--tokenizer", "gpt2", "--tokens-per-shard", "20000"]
    assert runner.invoke(app, [*args, "--out", bucket + "/imported"]).exit_code == 0
    assert runner.invoke(app, [*args, "--out", str(tmp_path / "imported")]).exit_code == 0
    assert remote_tree(server, bucket + "/imported") == comparable(local_tree(tmp_path / "imported"))
    # a flipped byte in one shard object: inspect exits 3 naming the shard and the block
    name = bucket.removeprefix("s3://")
    key = "ds/train/shard_000001.bin"
    data = bytearray(server.client().get_object(Bucket=name, Key=key)["Body"].read())
    data[20_000 * 4] ^= 0x01
    server.client().put_object(Bucket=name, Key=key, Body=bytes(data))
    result = runner.invoke(app, ["inspect", url, "--json"])
    assert result.exit_code == EXIT_CORRUPT
    problems = json.loads(result.stdout)["problems"]
    assert len(problems) == 1 and problems[0].startswith("train/shard_000001.bin: block 1 (tokens 16,384..")
    # a missing shard and a cut index: named by their URLs, never by the temporary copies
    server.client().delete_object(Bucket=name, Key="ds/train/shard_000002.bin")
    idx = server.client().get_object(Bucket=name, Key="ds/train/shard_000000.idx")["Body"].read()
    server.client().put_object(Bucket=name, Key="ds/train/shard_000000.idx", Body=idx[:-8])
    result = runner.invoke(app, ["inspect", url, "--json"])
    problems = json.loads(result.stdout)["problems"]
    assert result.exit_code == EXIT_CORRUPT and len(problems) == 3, problems
    assert not any("lmshard-remote-" in p or "/tmp" in p for p in problems), problems
    assert any(f"{url}/train/shard_000002.bin" in p and "missing" in p for p in problems), problems


def test_scale_out_tasks_publish_the_same_objects(s3, inputs, tmp_path):
    from typer.testing import CliRunner

    from lmshard.cli import app

    server, bucket = s3
    runner = CliRunner()
    common = [str(inputs), "--tokens-per-shard", "30000", "--val-fraction", "0.1", "--workers", "2", "-q"]
    for out in (bucket + "/ds", str(tmp_path / "local")):
        result = runner.invoke(app, ["prepare", *common, "--out", out, "--num-tasks", "3"])
        assert result.exit_code == 0, result.output
    assert remote_tree(server, bucket + "/ds") == comparable(local_tree(tmp_path / "local"))
    result = runner.invoke(app, ["prepare", *common, "--out", bucket + "/other", "--num-tasks", "3",
                                 "--executor", "slurm"])
    assert result.exit_code == 1 and "--executor slurm" in result.output and "Traceback" not in result.output


def _upload_at(monkeypatch, module, point: str, nth: int, server, url) -> dict[str, object]:
    """At the `nth` pass of stop point `point` (through `module`'s stop_point), the watcher's pass
    (called there instead of on its clock): what it sent, and the objects there then."""
    seen: dict[str, object] = {}
    real_watch, real_stop = publish.Publisher.watch, module.stop_point

    def watch(self):
        seen["publisher"] = self
        return real_watch(self)

    def at(name, key=None):
        real_stop(name, key)
        seen[name] = seen.get(name, 0) + 1
        if name == point and seen[name] == nth:
            seen["sent"] = seen["publisher"].upload_finished()
            seen["objects"] = set(remote_tree(server, url))

    monkeypatch.setattr(publish.Publisher, "watch", watch)
    monkeypatch.setattr(module, "stop_point", at)
    return seen


@pytest.mark.parametrize("num_tasks", [None, 3], ids=["plain", "planned"])
def test_shards_go_up_while_the_build_writes(s3, inputs, monkeypatch, num_tasks):
    """A plain or planned run (every stage here, one worker): once its write stage has sealed 4
    shards or key files, they are uploaded, before the dataset is committed; the dataset equals
    a local one."""
    from lmshard.prepare.execution import owners

    server, bucket = s3
    url = bucket + "/ds"
    seen = _upload_at(monkeypatch, owners, "piece", 4, server, url)
    prepare(config(url, inputs, tokens_per_shard=3000, num_tasks=num_tasks))
    assert seen["piece"] > 4 and seen["sent"] and "dataset_metadata.json" not in seen["objects"]
    assert {k for k in seen["objects"] if k.endswith(".bin")} and "_lmshard_writer.json" in seen["objects"]
    monkeypatch.undo()
    prepare(config(str(Path(inputs).parent / "local"), inputs, tokens_per_shard=3000))
    assert remote_tree(server, url) == comparable(local_tree(Path(inputs).parent / "local"))


def die_in_uploads(monkeypatch, url, src, after: int, **options) -> list[str]:
    """Run a prepare to `url` that dies (as Ctrl-C would) after `after` uploads, one at a time;
    the list of what it sent. Leaves put_file patched to record into that list."""
    sent = cut_uploads(monkeypatch, after)
    with pytest.raises(KeyboardInterrupt):
        prepare(config(url, src, **options))
    return sent


def cut_uploads(monkeypatch, after: int) -> list[str]:
    """Make uploads go one at a time and the one after `after` die as Ctrl-C would; the list of
    what was sent."""
    sent: list[str] = []
    real_put = publish.Remote.put_file

    def put(self, rel, local):
        if len(sent) == after:
            raise KeyboardInterrupt
        sent.append(rel)
        return real_put(self, rel, local)

    monkeypatch.setattr(publish, "UPLOADERS", 1)
    monkeypatch.setattr(publish.Remote, "put_file", put)
    return sent


def test_resume_uploads_only_what_is_missing(s3, inputs, tmp_path, monkeypatch):
    server, bucket = s3
    url = bucket + "/ds"
    real_put = publish.Remote.put_file
    sent = die_in_uploads(monkeypatch, url, inputs, after=6)
    assert "dataset_metadata.json" not in remote_tree(server, url)  # not committed
    first = list(sent)
    monkeypatch.setattr(publish.Remote, "put_file",
                        lambda self, rel, local: sent.append(rel) or real_put(self, rel, local))  # fmt: skip
    prepare(config(url, inputs, resume=True))
    again = sent[len(first) :]
    assert not set(first) & set(again)  # nothing sent twice
    prepare(config(str(tmp_path / "local"), inputs))
    assert remote_tree(server, url) == comparable(local_tree(tmp_path / "local"))


def test_s3_inputs_to_s3_output_equal_local(s3, inputs, tmp_path):
    """The issue's check: prepare from s3:// inputs to an s3:// output, against a local prepare of
    the same files to a local directory; the metadata differs only in where the inputs and the
    output were (config.inputs, sources[].path, run)."""
    server, bucket = s3
    name = bucket.removeprefix("s3://")
    server.client().put_object(Bucket=name, Key="raw/a.jsonl", Body=inputs.read_bytes())
    prepare(config(bucket + "/ds", bucket + "/raw/a.jsonl"))
    prepare(config(str(tmp_path / "local"), inputs))
    remote, local = remote_tree(server, bucket + "/ds"), comparable(local_tree(tmp_path / "local"))
    r_meta, l_meta = json.loads(remote.pop("dataset_metadata.json")), json.loads(local.pop("dataset_metadata.json"))
    assert remote == local and len(remote) > 10
    assert r_meta["config"].pop("inputs") == [bucket + "/raw/a.jsonl"] and l_meta["config"].pop("inputs")
    assert [s.pop("path") for s in r_meta["sources"]] == [bucket + "/raw/a.jsonl"]
    [s.pop("path") for s in l_meta["sources"]]
    assert r_meta == l_meta


def test_a_dead_runs_lock_and_uploads_are_cleared_by_the_next_run(s3, inputs, tmp_path, monkeypatch):
    """A run of this machine that died mid-upload (its pid gone) holds the lock and left
    uncommitted objects: the same command again is refused, as on a local --out, naming --resume
    and --overwrite; with --overwrite the run takes the lock over, removes exactly those objects
    (its journal lists them), says so, and publishes a whole dataset."""
    import socket
    import subprocess

    server, bucket = s3
    url, name = bucket + "/ds", bucket.removeprefix("s3://")
    real_put = publish.Remote.put_file
    die_in_uploads(monkeypatch, url, inputs, after=4)
    monkeypatch.setattr(publish.Remote, "put_file", real_put)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs
    lock = {"run": "dead-run", "host": socket.gethostname(), "pid": gone.pid, "since": 0}
    server.client().put_object(Bucket=name, Key="ds/_lmshard_writer.json", Body=json.dumps(lock).encode())
    before = remote_tree(server, url)
    refused = r"an interrupted prepare run of this machine .* left its build in .* and \d+ objects uploaded under s3://"
    with pytest.raises(ConfigError, match=refused + ".*pass --resume .* or --overwrite"):
        prepare(config(url, inputs))
    before.pop("_lmshard_writer.json")  # the dead run's lock: taken over, then released by the refused run
    assert remote_tree(server, url) == before  # nothing discarded
    server.client().put_object(Bucket=name, Key="ds/notes.txt", Body=b"someone else's")
    with pytest.raises(ConfigError, match="no dataset_metadata.json .notes.txt"):  # only the journal's are removed
        prepare(config(url, inputs, overwrite=True))
    server.client().delete_object(Bucket=name, Key="ds/notes.txt")
    server.client().put_object(Bucket=name, Key="ds/_lmshard_writer.json", Body=json.dumps(lock).encode())
    prepare(config(url, inputs))  # the journal went with the objects it listed: nothing left to refuse for
    prepare(config(str(tmp_path / "local"), inputs))
    assert remote_tree(server, url) == comparable(local_tree(tmp_path / "local"))


def dead_lock(server, url):
    """Make the prefix's writer lock a dead process's of this machine (as after kill -9)."""
    import socket
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    lock = {"run": "killed", "host": socket.gethostname(), "pid": gone.pid, "since": 0}
    server.client().put_object(Bucket=bucket, Key=f"{prefix}/_lmshard_writer.json", Body=json.dumps(lock).encode())


def test_a_put_cut_short_after_its_object_landed_is_cleared_and_resume_never_trusts_cleared_uploads(
        s3, inputs, tmp_path, monkeypatch):  # fmt: skip
    server, bucket = s3
    url = bucket + "/ds"
    real_put = publish.Remote.put_file
    count = []

    def put_then_die(self, rel, local):
        real_put(self, rel, local)  # the object lands; the run dies before its journal line
        count.append(rel)
        if len(count) == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(publish, "UPLOADERS", 1)
    monkeypatch.setattr(publish.Remote, "put_file", put_then_die)
    with pytest.raises(KeyboardInterrupt):
        prepare(config(url, inputs))
    monkeypatch.setattr(publish.Remote, "put_file", real_put)
    dead_lock(server, url)
    name = bucket.removeprefix("s3://")
    server.client().put_object(Bucket=name, Key="ds/notes.txt", Body=b"mine")
    with pytest.raises(ConfigError, match="no dataset_metadata.json"):
        prepare(config(url, inputs, overwrite=True))  # clears the dead run's five objects, then refuses the foreign one
    assert set(remote_tree(server, url)) == {"notes.txt"}
    server.client().delete_object(Bucket=name, Key="ds/notes.txt")
    prepare(config(url, inputs, resume=True))  # nothing to trust any more: everything is sent
    prepare(config(str(tmp_path / "local"), inputs))
    assert remote_tree(server, url) == comparable(local_tree(tmp_path / "local"))


def test_a_live_holder_of_this_machine_is_refused_even_with_resume(s3, inputs, monkeypatch):
    import socket
    import subprocess

    server, bucket = s3
    url = bucket + "/ds"
    die_in_uploads(monkeypatch, url, inputs, after=3)
    run = json.loads(publish.Journal.load(publish.work_root(url) / publish.JOURNAL).path.read_text())["run"]
    alive = subprocess.Popen(["sleep", "60"])
    try:
        lock = {"run": run, "host": socket.gethostname(), "pid": alive.pid, "since": 0}
        server.client().put_object(Bucket=bucket.removeprefix("s3://"), Key="ds/_lmshard_writer.json",
                                   Body=json.dumps(lock).encode())  # fmt: skip
        with pytest.raises(ConfigError, match=f"another prepare is writing here .*pid {alive.pid}"):
            prepare(config(url, inputs, resume=True))
    finally:
        alive.kill()
        alive.wait()


def test_a_killed_append_run_again_leaves_no_orphans(s3, inputs, tmp_path, monkeypatch):
    server, bucket = s3
    url = bucket + "/ds"
    prepare(config(url, inputs))
    more = write(tmp_path / "in2" / "b.jsonl", texts(120, salt="more "))
    real_put = publish.Remote.put_file
    assert len(die_in_uploads(monkeypatch, url, more, after=3, append=True)) == 3
    monkeypatch.setattr(publish.Remote, "put_file", real_put)
    dead_lock(server, url)
    other = write(tmp_path / "in3" / "c.jsonl", texts(10, salt="other "))
    with pytest.raises(ConfigError, match=r"pass --append --resume \(with its options\) to continue it, or delete "
                                          r"(.+) to discard it") as e:  # as a local --out: never thrown away unasked
        prepare(config(url, other, append=True))
    for build in re.search(r"or delete (.+) to discard it", str(e.value)).group(1).split(" and "):
        shutil.rmtree(build)
    prepare(config(url, other, append=True))  # the build deleted: its uploads are removed, the append runs
    prepare(config(str(tmp_path / "local"), inputs))
    prepare(config(str(tmp_path / "local"), other, append=True))
    assert remote_tree(server, url) == comparable(local_tree(tmp_path / "local"))


def test_a_run_cut_after_its_redirect_has_the_old_objects_removed_by_the_next(s3, inputs, tmp_path, monkeypatch):
    server, bucket = s3
    url = bucket + "/ds"
    prepare(config(url, inputs))
    other = write(tmp_path / "in2" / "b.jsonl", texts(50, salt="other "))
    monkeypatch.setattr(publish.Publisher, "_remove_replaced", lambda self: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        prepare(config(url, other, overwrite=True))  # committed: the redirect is in place, the old objects not gone
    monkeypatch.undo()
    monkeypatch.setenv("LMSHARD_PUBLISH_DIR", str(tmp_path / "publish"))
    assert any(k.startswith("train/") for k in remote_tree(server, url))
    prepare(config(url, other, overwrite=True, resume=True))
    prepare(config(str(tmp_path / "local"), other))
    objects = remote_tree(server, url)
    generation = json.loads(objects.pop("dataset_metadata.json"))["redirect"]
    assert all(k.startswith(generation + "/") for k in objects)  # the old dataset's objects: all removed


def test_urls_where_only_local_paths_go_are_refused(s3, inputs, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from lmshard.cli import app

    _, bucket = s3
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for args in (["prepare", str(inputs), "--out", "ftp://host/x"], ["prepare", str(inputs), "--out", "hf://d/x"],
                 ["export", str(tmp_path), "--to", "nanogpt", "--out", bucket + "/exp"],
                 ["import", bucket + "/nano", "--from", "nanogpt", "--tokenizer", "gpt2", "--out", "x"],
                 ["status", bucket + "/ds"], ["run-task", bucket + "/ds", "--stage", "finish"]):  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 1 and "Traceback" not in result.output, (args, result.output)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(":")]  # no directory named like a scheme
    result = runner.invoke(app, ["inspect", bucket + "/nothing-here"])
    assert result.exit_code == 1 and "missing" in result.output  # not a dataset: an error, not "corrupt"


def test_import_to_an_existing_url_names_its_own_flag(s3, inputs, tmp_path):
    from lmshard.interop import export_dataset, import_dataset

    _, bucket = s3
    prepare(config(str(tmp_path / "local"), inputs))
    export_dataset(tmp_path / "local", "nanogpt", tmp_path / "nano")
    import_dataset(tmp_path / "nano", "nanogpt", bucket + "/ds", tokenizer="gpt2")
    with pytest.raises(ConfigError, match="already holds a dataset; pass --force to replace it"):
        import_dataset(tmp_path / "nano", "nanogpt", bucket + "/ds", tokenizer="gpt2")
    import_dataset(tmp_path / "nano", "nanogpt", bucket + "/ds", tokenizer="gpt2", force=True)


def test_inspect_a_dataset_on_a_web_server(http_server, inputs, tmp_path):
    """A web server lists nothing: inspect finds each file's size by its own request."""
    import shutil

    from typer.testing import CliRunner

    from lmshard.cli import app

    prepare(config(str(tmp_path / "local"), inputs))
    shutil.copytree(tmp_path / "local", http_server.root / "ds")
    result = CliRunner().invoke(app, ["inspect", http_server.url + "/ds", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ok"]


def test_resume_of_a_committed_url_dataset_has_nothing_to_do(s3, inputs):
    server, bucket = s3
    url = bucket + "/ds"
    first = prepare(config(url, inputs))
    before = remote_tree(server, url)
    again = prepare(config(url, inputs, resume=True))  # a retry loop that always passes --resume
    assert again.n_tokens() == first.n_tokens() and remote_tree(server, url) == before


def test_a_run_that_failed_on_its_input_leaves_nothing_to_refuse(s3, inputs, tmp_path):
    """A bad record stops the run before it built or sent anything: the prefix is free and the
    work directory gone, so the command runs once the input is fixed (as for a local --out)."""
    server, bucket = s3
    url = bucket + "/ds"
    bad = write(tmp_path / "bad" / "a.jsonl", texts(5) + "not json\n")
    with pytest.raises(LmshardError, match=r"a\.jsonl:6: invalid JSON"):
        prepare(config(url, bad))
    assert remote_tree(server, url) == {} and not publish.work_root(url).exists()
    bad.write_text(texts(5))
    prepare(config(url, bad))
    assert "dataset_metadata.json" in remote_tree(server, url)


def test_a_refused_resume_names_the_url_not_the_work_directory(s3, inputs, tmp_path, monkeypatch):
    server, bucket = s3
    url = bucket + "/ds"
    die_in_uploads(monkeypatch, url, inputs, after=2)  # the build finished, its upload did not
    with pytest.raises(ConfigError) as e:
        prepare(config(url, inputs, resume=True, val_fraction=0.2))
    assert str(e.value) == (f"{url}: cannot resume: the dataset there is built already, with --val-fraction 0.1 "
                            "(this run: 0.2); pass the options and inputs it was made with to find it complete, "
                            "--overwrite to replace it, or --append to add to it")  # fmt: skip
    p = publish.Publisher(url)  # a refusal naming the work directory's copy names the URL
    named = p.named(ConfigError(f"{p.mirror}: cannot resume: x"))
    assert type(named) is ConfigError and str(named) == f"{url}: cannot resume: x"
    full = LmshardError(f"{p.mirror}/train/shard_000000.bin: no space left on device")
    assert p.named(full) is full  # the work directory's own trouble keeps its local path



def test_an_append_with_nothing_new_leaves_no_work_directory(s3, inputs):
    server, bucket = s3
    url = bucket + "/ds"
    prepare(config(url, inputs))
    before = remote_tree(server, url)
    with pytest.raises(LmshardError, match="no new document"):
        prepare(config(url, inputs, append=True))  # every document a duplicate of the dataset's
    assert not publish.work_root(url).exists() and remote_tree(server, url) == before


def test_an_import_cut_short_runs_again_as_it_has_no_resume(s3, inputs, tmp_path, monkeypatch):
    """`import --out URL` has no --resume: the same import again clears what the cut one sent and
    publishes the whole dataset (a prepare would be refused, naming --resume)."""
    from lmshard.interop.export import export_dataset
    from lmshard.interop.importer import import_dataset

    server, bucket = s3
    prepare(config(str(tmp_path / "local"), inputs))
    export_dataset(tmp_path / "local", "nanogpt", tmp_path / "nano")
    url = bucket + "/imported"
    real_put = publish.Remote.put_file
    cut_uploads(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        import_dataset(tmp_path / "nano", "nanogpt", url, tokenizer="gpt2", tokens_per_shard=20_000)
    monkeypatch.setattr(publish.Remote, "put_file", real_put)
    dead_lock(server, url)
    import_dataset(tmp_path / "nano", "nanogpt", url, tokenizer="gpt2", tokens_per_shard=20_000)
    import_dataset(tmp_path / "nano", "nanogpt", tmp_path / "imported", tokenizer="gpt2", tokens_per_shard=20_000)
    assert remote_tree(server, url) == comparable(local_tree(tmp_path / "imported"))


def test_a_failed_upload_says_to_resume_and_resume_finishes(s3, inputs, tmp_path, monkeypatch):
    from lmshard.remote import RemoteError

    server, bucket = s3
    url = bucket + "/ds"
    real_put = publish.Remote.put_file

    def store_gone(self, rel, local):
        raise RemoteError(f"{url}/{rel}: PUT failed after 6 attempts over 9.1 s (EndpointConnectionError: ...); "
                          "check that the endpoint is reachable, then retry")  # fmt: skip

    monkeypatch.setattr(publish.Remote, "put_file", store_gone)
    with pytest.raises(RemoteError) as e:
        prepare(config(url, inputs))
    message = str(e.value)
    assert "PUT failed" in message and message.endswith("run the same command with --resume to finish the upload")
    assert "\n" not in message and "dataset_metadata.json" not in remote_tree(server, url)
    monkeypatch.setattr(publish.Remote, "put_file", real_put)
    prepare(config(url, inputs, resume=True))
    prepare(config(str(tmp_path / "local"), inputs))
    assert remote_tree(server, url) == comparable(local_tree(tmp_path / "local"))


def test_uncommitted_shards_of_a_run_from_another_machine_are_named_as_such(s3, inputs, tmp_path):
    """A prefix holding only shard objects (a run killed on a node whose work directory is gone):
    the refusal says whose they are and the two ways on; foreign objects keep the plain refusal."""
    server, bucket = s3
    name = bucket.removeprefix("s3://")
    prepare(config(str(tmp_path / "local"), inputs))
    for rel in ("train/shard_000000.bin", "train/shard_000000.idx", "train/shard_000000.sums"):
        server.client().put_object(Bucket=name, Key=f"ds/{rel}", Body=(tmp_path / "local" / rel).read_bytes())
    whose = r"holds lmshard's shard objects \(train/shard_000000\.bin, .*the uploads of a prepare that never committed"
    with pytest.raises(ConfigError, match=whose + ".*--resume where it ran, or delete"):
        prepare(config(bucket + "/ds", inputs))
    server.client().put_object(Bucket=name, Key="ds/notes.txt", Body=b"mine")
    with pytest.raises(ConfigError, match="nothing here is known to be lmshard's; choose an empty prefix"):
        prepare(config(bucket + "/ds", inputs))


def test_a_bucket_that_does_not_exist_is_named_by_prepare_and_by_readers(s3, inputs):
    """prepare --out, inspect and TokenDataset on s3://nobucket/...: one line saying the bucket
    does not exist (the real server's NoSuchBucket), not a conditional PUT's 404 or 'not a dataset'."""
    from typer.testing import CliRunner

    from lmshard import TokenDataset
    from lmshard.cli import app

    missing = "s3://no-such-bucket-here/ds"
    with pytest.raises(LmshardError, match=r"the bucket no-such-bucket-here does not exist"):
        prepare(config(missing, inputs))
    with pytest.raises(LmshardError, match=r"the bucket no-such-bucket-here does not exist"):
        TokenDataset(missing)
    said = CliRunner().invoke(app, ["inspect", missing])
    errors = [line for line in said.output.splitlines() if line.startswith("error:")]
    assert said.exit_code != 0 and len(errors) == 1 and "the bucket no-such-bucket-here does not exist" in errors[0]


def test_cp_copies_a_dataset_to_s3_and_back_byte_for_byte(s3, inputs, tmp_path):
    """`lmshard cp DIR s3://...` then `lmshard cp s3://... DIR2`: every file equal to the
    source's; an existing destination is refused without --force and replaced whole with it."""
    from typer.testing import CliRunner

    from lmshard.cli import app

    server, bucket = s3
    prepare(config(str(tmp_path / "local"), inputs))
    runner = CliRunner()
    up = runner.invoke(app, ["cp", str(tmp_path / "local"), bucket + "/copy"])
    assert up.exit_code == 0, up.output
    assert remote_tree(server, bucket + "/copy") == comparable(local_tree(tmp_path / "local"))
    down = runner.invoke(app, ["cp", bucket + "/copy", str(tmp_path / "back")])
    assert down.exit_code == 0, down.output
    assert comparable(local_tree(tmp_path / "back")) == comparable(local_tree(tmp_path / "local"))
    again = runner.invoke(app, ["cp", str(tmp_path / "local"), bucket + "/copy"])
    assert again.exit_code != 0 and "pass --force to replace it" in " ".join(again.output.split()), again.output
    prepare(config(str(tmp_path / "other"), inputs, val_fraction=0.3))
    forced = runner.invoke(app, ["cp", str(tmp_path / "other"), bucket + "/copy", "--force"])
    assert forced.exit_code == 0, forced.output
    from lmshard.remote.dataset import open_remote

    assert open_remote(bucket + "/copy")[0].config["val_fraction"] == 0.3


def test_a_cp_that_fails_midway_leaves_the_old_dataset_whole(s3, inputs, tmp_path, monkeypatch):
    """An upload that fails after some objects (the store gone, a kill): the dataset at DST is the
    old one, every file of it as it was; the new one's objects are not committed."""
    from lmshard.errors import LmshardError
    from lmshard.interop.copy import copy_dataset
    from lmshard.remote.dataset import open_remote
    from lmshard.remote.objects import Remote

    server, bucket = s3
    prepare(config(str(tmp_path / "old"), inputs))
    prepare(config(str(tmp_path / "new"), inputs, val_fraction=0.3))
    copy_dataset(str(tmp_path / "old"), bucket + "/ds")
    before = open_remote(bucket + "/ds")[0]
    real, sent = Remote.put_file, []

    def failing(self, rel, local):
        if len(sent) == 3:
            raise LmshardError("the store went away")
        sent.append(rel)
        return real(self, rel, local)

    monkeypatch.setattr(Remote, "put_file", failing)
    with pytest.raises(LmshardError, match="the store went away"):
        copy_dataset(str(tmp_path / "new"), bucket + "/ds", force=True)
    monkeypatch.setattr(Remote, "put_file", real)
    after, remote = open_remote(bucket + "/ds")
    assert after.config == before.config and after.shards == before.shards
    for shard in after.shards:  # the old dataset's objects, whole
        assert remote.read(shard.path) == (tmp_path / "old" / shard.path).read_bytes()


def test_cp_to_the_url_of_an_interrupted_prepare_leaves_its_build_and_uploads(s3, inputs, tmp_path, monkeypatch):
    """A prepare --out URL killed mid-upload, then `lmshard cp DS URL` without --force: refused in
    one line naming prepare --resume and --force; the prepare's objects and build are untouched,
    and its --resume then publishes the dataset it was building."""
    from lmshard.interop.copy import copy_dataset

    server, bucket = s3
    url = bucket + "/ds"
    real_put = publish.Remote.put_file
    die_in_uploads(monkeypatch, url, inputs, after=4)
    monkeypatch.setattr(publish.Remote, "put_file", real_put)
    dead_lock(server, url)
    before = remote_tree(server, url)
    prepare(config(str(tmp_path / "other"), inputs, val_fraction=0.3))
    with pytest.raises(ConfigError, match=r"an interrupted prepare run of this machine left its build in .*; resume "
                                          r"it with prepare --resume .* or pass --force to discard it"):  # fmt: skip
        copy_dataset(str(tmp_path / "other"), url)
    before.pop("_lmshard_writer.json")
    assert {k: v for k, v in remote_tree(server, url).items() if k != "_lmshard_writer.json"} == before
    prepare(config(url, inputs, resume=True))
    prepare(config(str(tmp_path / "local"), inputs))
    assert remote_tree(server, url) == comparable(local_tree(tmp_path / "local"))


def test_a_cp_killed_mid_upload_and_run_again_sends_only_what_is_missing(s3, inputs, tmp_path, monkeypatch):
    """`lmshard cp DIR s3://...` killed after 3 uploads (its lock left, as kill -9 leaves it),
    then the same command again: it goes on from the journal, sending only the files not yet
    sent, and the result equals the source file for file. A copy of another dataset there would
    not resume it: its uploads are cleared first."""
    from lmshard.interop.copy import copy_dataset

    server, bucket = s3
    url = bucket + "/ds"
    prepare(config(str(tmp_path / "local"), inputs))
    real_put = publish.Remote.put_file
    sent = cut_uploads(monkeypatch, after=3)
    with pytest.raises(KeyboardInterrupt):
        copy_dataset(str(tmp_path / "local"), url)
    assert len(sent) == 3
    dead_lock(server, url)
    again: list[str] = []

    def counting(self, rel, local):
        again.append(rel)
        return real_put(self, rel, local)

    monkeypatch.setattr(publish.Remote, "put_file", counting)
    copy_dataset(str(tmp_path / "local"), url)
    files = [k for k in local_tree(tmp_path / "local") if k != "dataset_metadata.json"]
    assert sorted(r.rsplit("/", 1)[-1] for r in again) == sorted(
        f.rsplit("/", 1)[-1] for f in files if f not in sent)  # fmt: skip
    assert remote_tree(server, url) == comparable(local_tree(tmp_path / "local"))


def test_prepare_resume_at_the_url_of_an_interrupted_cp_does_not_take_over_its_uploads(s3, inputs, tmp_path,
                                                                                       monkeypatch):  # fmt: skip
    """A cp killed mid-upload, then `prepare --out URL --resume`: the copy's journal is not the
    prepare's to go on with; its uploads are cleared and the prepare publishes its own dataset."""
    from lmshard.interop.copy import copy_dataset

    server, bucket = s3
    url = bucket + "/ds"
    prepare(config(str(tmp_path / "other"), inputs, val_fraction=0.3))
    real_put = publish.Remote.put_file
    cut_uploads(monkeypatch, after=3)
    with pytest.raises(KeyboardInterrupt):
        copy_dataset(str(tmp_path / "other"), url)
    monkeypatch.setattr(publish.Remote, "put_file", real_put)
    dead_lock(server, url)
    prepare(config(url, inputs, resume=True))
    prepare(config(str(tmp_path / "local"), inputs))
    assert remote_tree(server, url) == comparable(local_tree(tmp_path / "local"))
