"""`lmshard inspect`: verification catches each kind of corruption, names the shard, exits 2."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import read_docs
from test_prepare import jsonl, make_texts
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.prepare import PrepareConfig, prepare
from lmshard.verify import verify_dataset

runner = CliRunner()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inspect")
    src = jsonl(tmp / "a.jsonl", make_texts(400, seed=3))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp / "ds"), workers=1, tokens_per_shard=3000, val_fraction=0.1))
    return tmp / "ds"


@pytest.fixture
def dataset(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "ds")
    return tmp_path / "ds"


def inspect_json(path, *extra):
    result = runner.invoke(app, ["inspect", str(path), "--json", *extra])
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip().startswith("{") else result.output


def test_fresh_dataset_verifies_and_counts_match_raw_files(dataset):
    code, report = inspect_json(dataset)
    assert code == 0 and report["ok"] and report["problems"] == []
    for split in ("train", "val"):
        docs = read_docs(dataset, split)
        assert report["splits"][split]["n_docs"] == len(docs)
        assert report["splits"][split]["n_tokens"] == sum(len(d) for d in docs)
    lengths = [len(d) for s in ("train", "val") for d in read_docs(dataset, s)]
    assert report["doc_length_tokens"]["max"] == max(lengths)
    assert report["doc_length_tokens"]["median"] == float(np.median(lengths))
    assert report["top_tokens"][0]["count"] > 0


def first_shard(ds):
    return json.loads((ds / "dataset_metadata.json").read_text())["splits"]["train"]["shards"][1]


def flip_byte(ds):
    path = ds / first_shard(ds)["path"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2 + 1] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(ds):
    path = ds / first_shard(ds)["path"]
    path.write_bytes(path.read_bytes()[:-3])


def delete(ds):
    (ds / first_shard(ds)["path"]).unlink()


def edit_count(ds):
    meta = json.loads((ds / "dataset_metadata.json").read_text())
    meta["splits"]["train"]["shards"][1]["n_tokens"] += 1
    (ds / "dataset_metadata.json").write_text(json.dumps(meta))


def token_too_big(ds):
    path = ds / first_shard(ds)["path"]
    tokens = np.fromfile(path, dtype="<u4")
    tokens[5] = 50257
    tokens.tofile(path)


def bad_index(ds):
    path = ds / first_shard(ds)["index_path"]
    offsets = np.fromfile(path, dtype="<u8")
    offsets[2], offsets[3] = offsets[3], offsets[2]
    offsets.tofile(path)


@pytest.mark.parametrize("corrupt", [flip_byte, truncate, delete, edit_count, token_too_big, bad_index])
def test_corruption_exits_2_and_names_the_shard(dataset, corrupt):
    corrupt(dataset)
    code, report = inspect_json(dataset)
    assert code == 2 and not report["ok"]
    name = first_shard(dataset)["path"]
    assert any(name in p for p in report["problems"]), report["problems"]
    assert all("lmshard prepare" in p for p in report["problems"])


def test_quick_skips_checksums_but_catches_structure(dataset):
    flip_byte(dataset)
    assert inspect_json(dataset, "--quick")[0] == 0  # a flipped byte needs the checksum
    truncate(dataset)
    assert inspect_json(dataset, "--quick")[0] == 2


def test_quick_reads_no_token_data(dataset, monkeypatch):
    """--quick must not open token files: make every .bin unreadable and check it still passes."""
    for path in dataset.rglob("*.bin"):
        path.chmod(0)
    import builtins

    real_open = builtins.open

    def guarded(file, *a, **k):
        assert not str(file).endswith(".bin"), f"--quick opened {file}"
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(np, "memmap", lambda *a, **k: pytest.fail("--quick memory-mapped tokens"))
    report = verify_dataset(dataset, quick=True)
    assert report.ok and report.token_counts is None


def test_usage_errors_exit_1(tmp_path):
    result = runner.invoke(app, ["inspect", str(tmp_path / "missing")])
    assert result.exit_code == 1 and "no such directory" in result.output
    result = runner.invoke(app, ["inspect", str(tmp_path)])
    assert result.exit_code == 1 and "not an lmshard dataset" in result.output


def test_sample_and_doc_decode_real_text(dataset, reference):
    result = runner.invoke(app, ["inspect", str(dataset), "--sample", "3", "--doc", "train/shard_000000:0"])
    assert result.exit_code == 0, result.output
    first = read_docs(dataset, "train")[0]
    assert reference.decode(first[:-1].tolist())[:30] in result.output
    assert result.output.count("tokens)") == 4
    result = runner.invoke(app, ["inspect", str(dataset), "--doc", "train/shard_000000:99999"])
    assert result.exit_code == 1 and "no document 99999" in result.output


def test_unfinished_run_is_reported(dataset):
    (dataset / "dataset_metadata.json").unlink()
    (dataset / "_PREPARE_IN_PROGRESS").write_text("{}")
    code, out = inspect_json(dataset)
    assert code == 2 and "did not finish" in json.dumps(out)


def test_metadata_path_escaping_the_dataset_is_refused(dataset):
    meta = json.loads((dataset / "dataset_metadata.json").read_text())
    meta["splits"]["train"]["shards"][0]["path"] = "../../etc/passwd"
    (dataset / "dataset_metadata.json").write_text(json.dumps(meta))
    code, report = inspect_json(dataset)
    assert code == 2 and "escapes the dataset directory" in report["problems"][0]


def test_plot_needs_matplotlib_or_writes_png(dataset, tmp_path):
    result = runner.invoke(app, ["inspect", str(dataset), "--quick", "--plot", str(tmp_path / "h.png")])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert result.exit_code == 1 and "lmshard[plot]" in result.output
    else:
        assert result.exit_code == 0 and (tmp_path / "h.png").stat().st_size > 1000
