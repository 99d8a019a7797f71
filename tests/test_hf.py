"""Hugging Face inputs, with local data only, through the same code path as hub streaming."""

from __future__ import annotations

import dataclasses
import gzip
import json

import datasets  # the hf extra is part of the test setup: missing, this fails rather than skips
import pytest
from conftest import read_docs
from test_prepare import jsonl, make_texts
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import InputError
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.documents.hf import PRESETS, HFSpec
from lmshard.prepare.documents.hfread import hf_records

runner = CliRunner()


@pytest.fixture(scope="module")
def rows():
    return make_texts(120, seed=21)


@pytest.fixture(scope="module")
def local(tmp_path_factory, rows):
    tmp = tmp_path_factory.mktemp("hf")
    ds = datasets.Dataset.from_dict({"text": rows, "n": list(range(len(rows)))})
    ds.save_to_disk(str(tmp / "saved"))
    (tmp / "pq").mkdir()
    ds.to_parquet(str(tmp / "pq" / "train-00000-of-00001.parquet"))
    jsonl(tmp / "rows.jsonl", rows)
    return tmp


def tokens_of(root):
    return [[d.tolist() for d in read_docs(root, s)] for s in ("train", "val")]


def test_saved_dataset_and_parquet_dir_equal_jsonl(local, tmp_path):
    prepare(PrepareConfig(inputs=[str(local / "rows.jsonl")], out=str(tmp_path / "j"), workers=1, val_fraction=0.1))
    expected = tokens_of(tmp_path / "j")
    for name in ("saved", "pq"):
        meta = prepare(PrepareConfig(hf=str(local / name), out=str(tmp_path / name), workers=1, val_fraction=0.1))
        meta = json.loads((tmp_path / name / "dataset_metadata.json").read_text())
        assert tokens_of(tmp_path / name) == expected, name
        assert meta["sources"][0]["hf"]["kind"] == ("saved" if name == "saved" else "local")
        assert meta["records_read"] == 120


def test_one_file_stream_split_into_three_tasks_covers_every_row_once(local, rows):
    seen = []
    for task in range(3):
        spec = HFSpec(dataset=str(local / "pq"), streaming=True, task=task, tasks=3)
        part = [record.text for record in hf_records(spec)]
        assert part, f"task {task} got nothing"
        seen.extend(part)
    assert sorted(seen) == sorted(rows) and len(seen) == len(rows)


def test_saved_dataset_split_into_tasks(local, rows):
    parts = [[r.text for r in hf_records(HFSpec(dataset=str(local / "saved"), task=i, tasks=3))] for i in range(3)]
    assert sorted(sum(parts, [])) == sorted(rows)


def test_task_split_recorded_in_metadata(local, tmp_path):
    prepare(PrepareConfig(hf=str(local / "pq"), out=str(tmp_path / "t"), workers=1, hf_task=1, hf_tasks=3))
    meta = json.loads((tmp_path / "t" / "dataset_metadata.json").read_text())
    assert meta["sources"][0]["hf"]["task"] == 1 and meta["sources"][0]["hf"]["tasks"] == 3
    assert meta["config"]["hf_tasks"] == 3
    assert 0 < meta["records_read"] < 120


def test_missing_field_is_named(local, tmp_path):
    with pytest.raises(InputError, match="no field 'body'"):
        prepare(PrepareConfig(hf=str(local / "saved"), text_field="body", out=str(tmp_path / "x"), workers=1))


def test_a_null_text_is_wrong_type_numbered_from_1(tmp_path):
    """As in files (#29): a null text is `wrong_type`, "null" (not NoneType), at its example number."""
    datasets.Dataset.from_dict({"text": ["one", "two", None]}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(InputError, match=r":3: field 'text' is null, not a string; make the field a string"):
        prepare(PrepareConfig(hf=str(tmp_path / "saved"), out=str(tmp_path / "x"), workers=1))
    meta = prepare(PrepareConfig(hf=str(tmp_path / "saved"), out=str(tmp_path / "x"), workers=1, on_error="skip"))
    assert meta.drops["wrong_type"] == 1 and "missing_field" not in meta.drops


def test_a_split_a_single_saved_dataset_does_not_have_is_refused(local, tmp_path, rows):
    """A save_to_disk Dataset (not a DatasetDict) holds one split, named or not: a --split it
    does not have is refused in one line, not read as that split and recorded as the other."""
    datasets.Dataset.from_dict({"text": rows[:5]}, split="test").save_to_disk(str(tmp_path / "test"))
    cases = [(local / "saved", ["--split", "validation"], "no split 'validation' (it holds one unnamed split, "
                                                           "read as train; drop --split)"),
             (tmp_path / "test", [], "no split 'train' (its one split is 'test'; pass --split test)")]  # fmt: skip
    for saved, flags, words in cases:
        out = tmp_path / f"o_{saved.name}"
        result = runner.invoke(app, ["prepare", "--hf", str(saved), "--out", str(out), "--workers", "1", *flags])
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        assert errors == [f"error: --hf {saved}: a single saved dataset, {words}"], result.output
        assert not out.exists()
    result = runner.invoke(app, ["prepare", "--hf", str(tmp_path / "test"), "--split", "test", "--out",
                                 str(tmp_path / "ok"), "--workers", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "ok" / "dataset_metadata.json").read_text())
    assert meta["sources"][0]["hf"]["split"] == "test" and meta["records_read"] == 5


def test_hub_id_offline_fails_fast_and_clearly(tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = runner.invoke(app, ["prepare", "--preset", "fineweb-edu", "--out", str(tmp_path / "o"), "--max-docs", "5"])
    assert result.exit_code == 1
    assert "cannot reach the Hugging Face hub" in result.output and "--hf" in result.output
    assert "Traceback" not in result.output
    assert no_network == []  # offline means no connection tried (no retries to wait through)
    assert not (tmp_path / "o" / "dataset_metadata.json").exists()


def test_presets_table():
    assert set(PRESETS) == {"fineweb", "fineweb-edu", "pile", "tiny_shakespeare", "shakespeare"}
    for p in PRESETS.values():
        assert "/" in p.hub_id and p.text_field and p.tokenizer == "gpt2" and p.description
    result = runner.invoke(app, ["datasets"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name, p in PRESETS.items():
        assert name in result.output and p.hub_id in result.output


def test_cli_hf_local(local, tmp_path):
    result = runner.invoke(app, ["prepare", "--hf", str(local / "pq"), "--out", str(tmp_path / "c"), "--workers", "1"])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "c" / "dataset_metadata.json").read_text())
    assert meta["n_docs"] == 120


def _truncated_jsonl_gz(path, n):
    rows = "".join(json.dumps({"text": f"row {i} " + "words and more words " * 20}) + "\n" for i in range(n))
    data = gzip.compress(rows.encode(), compresslevel=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data[: len(data) * 3 // 4])


def test_truncated_data_file_read_at_load_is_one_line(tmp_path):
    _truncated_jsonl_gz(tmp_path / "d" / "train.jsonl.gz", 200)
    args = ["prepare", "--hf", str(tmp_path / "d"), "--out", str(tmp_path / "o"), "--workers", "1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "Traceback" not in result.output and "Aborted" not in result.output
    assert f"--hf {tmp_path / 'd'}: truncated compressed data in a data file; re-download" in result.output


def test_truncated_data_file_mid_stream_is_a_bad_record_after_the_good_ones(tmp_path):
    """`datasets` streams a data file in 10 MB chunks: damage past the first is found mid-stream."""
    _truncated_jsonl_gz(tmp_path / "d" / "train.jsonl.gz", 60_000)
    records = list(hf_records(HFSpec(dataset=str(tmp_path / "d"))))
    *good, last = records
    assert len(good) > 20_000 and all(r.text == f"row {r.number - 1} " + "words and more words " * 20 for r in good)
    assert last.number == len(good) + 1 and last.problem == "truncated_compression"
    where = f"a data file of --hf {tmp_path / 'd'}"
    assert last.detail == f"truncated compressed data in {where} after {len(good):,} records"


def test_a_data_file_damaged_midway_ends_its_shard_only_read_whole_or_by_shards(tmp_path):
    """A stream of three data files, the middle one truncated past its first 10 MB chunk: read in
    one process, its shard ends with one bad record and the third shard goes on; each shard read
    alone (as a planned run's unit, numbered from where the one before ends) gives the same
    records, numbers and messages."""
    from lmshard.prepare.documents.hfread import shard_records

    data = tmp_path / "d" / "data"
    jsonl(data / "train-00000-of-00003.jsonl", [f"first {i}" for i in range(50)])
    _truncated_jsonl_gz(data / "train-00001-of-00003.jsonl.gz", 60_000)
    jsonl(data / "train-00002-of-00003.jsonl", [f"third {i}" for i in range(40)])
    spec = HFSpec(dataset=str(tmp_path / "d"))
    whole = list(hf_records(spec))
    by_shard, start = [], 0
    for s in range(3):
        by_shard += list(shard_records(spec, s, 3, start))
        start = by_shard[-1].number
    assert whole == by_shard
    bad = [r for r in whole if r.problem]
    assert len(bad) == 1 and whole[-1].text == "third 39" and whole[-1].number == len(whole)
    where = f"data file 2 of 3 of --hf {tmp_path / 'd'}"
    assert bad[0].detail == f"truncated compressed data in {where} after {bad[0].number - 51:,} records"


@pytest.mark.parametrize(("n_tasks", "streaming"), [(1, None), (3, None), (3, True)])
def test_a_saved_dataset_as_planned_tasks_equals_one_process(tmp_path, n_tasks, streaming):
    """`--hf SAVED --num-tasks N`: the saved split is cut into units of rows, each task reads its
    own rows from the memory-mapped arrow (--streaming or not), and the dataset equals a
    one-process prepare of it, byte for byte: duplicates across units, a null text numbered by
    its row, the metadata."""
    from test_stages import _files

    from lmshard.prepare.execution import local_exec, units
    from lmshard.prepare.execution.stages import STAGES, run_task
    from lmshard.prepare.execution.taskplan import load_plan, work_dir

    texts = make_texts(700, seed=4)
    column = texts[:500] + texts[:40] + [None] + texts[500:]
    datasets.Dataset.from_dict({"text": column}).save_to_disk(str(tmp_path / "saved"))
    opts = dict(hf=str(tmp_path / "saved"), workers=1, val_fraction=0.1, tokens_per_shard=5_000, on_error="skip",
                streaming=streaming)  # fmt: skip
    one = prepare(PrepareConfig(out=str(tmp_path / "one"), **opts))
    config = PrepareConfig(out=str(tmp_path / "tasks"), **opts)
    local_exec.claim(config, n_tasks)
    plan = load_plan(work_dir(config.out))
    rows = max(units.MIN_ROWS, -(-len(column) // (4 * n_tasks)))  # 311 rows a unit for one task, 256 for 3
    assert [u[1] for u in plan["units"]] == ["rows"] * -(-len(column) // rows) and plan["units"][-1][3] == len(column)
    for stage in STAGES[:-1]:
        for task in reversed(range(n_tasks)):
            run_task(config, n_tasks, stage, task)
    run_task(config, n_tasks, "finish", 0)
    assert one.drops["duplicate"] == 40 and one.drops["wrong_type"] == 1
    assert ":541:" in one.drop_examples["wrong_type"]
    assert _files(tmp_path / "one") == _files(tmp_path / "tasks")


@pytest.mark.parametrize("n_tasks", [1, 2, 5])
def test_a_stream_as_planned_tasks_is_cut_into_its_shards_and_equals_one_process(tmp_path, n_tasks):
    """`--hf DIR --num-tasks N` of a directory of data files (streamed as a hub id is): a unit
    per shard (data file), each numbered from its own start until the finish, and the dataset
    equals a one-process prepare of the stream, byte for byte: duplicates across shards, a null
    text in a later shard named at its record in the stream, provenance, the metadata."""
    from test_stages import _files

    from lmshard.prepare.execution import local_exec
    from lmshard.prepare.execution.stages import STAGES, run_task
    from lmshard.prepare.execution.taskplan import load_plan, work_dir

    texts = make_texts(400, seed=9)
    files = [texts[:120], texts[120:200] + texts[:30], [*texts[200:260], None, *texts[260:330]], texts[330:]]
    (tmp_path / "pq" / "data").mkdir(parents=True)
    for k, column in enumerate(files):
        path = tmp_path / "pq" / "data" / f"train-{k:05d}-of-{len(files):05d}.parquet"
        datasets.Dataset.from_dict({"text": column}).to_parquet(str(path))
    opts = dict(hf=str(tmp_path / "pq"), workers=1, val_fraction=0.1, tokens_per_shard=5_000, on_error="skip")
    one = prepare(PrepareConfig(out=str(tmp_path / "one"), **opts))
    assert one.drops["duplicate"] == 30 and one.drops["wrong_type"] == 1
    assert ":291:" in one.drop_examples["wrong_type"]  # (120 + 110 + 61: the record in the stream)
    config = PrepareConfig(out=str(tmp_path / "tasks"), **opts)
    local_exec.claim(config, n_tasks)
    plan = load_plan(work_dir(config.out))
    assert [u[1:4] for u in plan["units"]] == [["shard", k, len(files)] for k in range(len(files))]
    for stage in STAGES[:-1]:
        for task in reversed(range(n_tasks)):
            run_task(config, n_tasks, stage, task)
    run_task(config, n_tasks, "finish", 0)
    assert _files(tmp_path / "one") == _files(tmp_path / "tasks")


@pytest.mark.parametrize("ext", ["parquet", "jsonl"])
def test_a_task_that_finds_other_data_files_than_planned_is_refused(tmp_path, ext):
    """The plan records which data files a stream was planned with (their names, relative to a
    directory; a hub dataset's name the commit `datasets` resolved them at): a task that finds
    another set of as many (a revision pushed meanwhile; here a file renamed) is refused in one
    line before it reads a record, and goes on once the planned files are back. The record is the
    same in every process, wherever the directory is."""
    import shutil

    from lmshard.errors import ConfigError, InputError
    from lmshard.prepare.documents import hfread
    from lmshard.prepare.execution import local_exec
    from lmshard.prepare.execution.stages import run_task

    data = tmp_path / "pq" / "data"
    data.mkdir(parents=True)
    for k in range(3):
        column, path = make_texts(30, seed=k), data / f"train-{k:05d}-of-00003.{ext}"
        if ext == "parquet":
            datasets.Dataset.from_dict({"text": column}).to_parquet(str(path))
        else:
            jsonl(path, column)
    mark = hfread.stream_mark(HFSpec(dataset=str(tmp_path / "pq")))
    shutil.copytree(tmp_path / "pq", tmp_path / "elsewhere")
    hfread._STREAMS.clear()
    assert len(mark) == 16 and hfread.stream_mark(HFSpec(dataset=str(tmp_path / "elsewhere"))) == mark
    config = PrepareConfig(out=str(tmp_path / "tasks"), hf=str(tmp_path / "pq"), workers=1)
    local_exec.claim(config, 3)
    assert run_task(config, 3, "tokenize", 0) == 1
    planned, renamed = data / f"train-00002-of-00003.{ext}", data / f"train-00002-of-00003-new.{ext}"
    planned.rename(renamed)
    hfread._STREAMS.clear()  # (as another process opens the stream)
    with pytest.raises(InputError, match="its data files are not the ones the run was planned with") as e:
        run_task(config, 3, "tokenize", 1)
    assert "\n" not in str(e.value) and "--revision" in str(e.value)
    resumed = dataclasses.replace(config, resume=True)  # a local run resumed: refused as it claims --out
    with pytest.raises(ConfigError, match="changed since the run started \\(its data files"):
        local_exec.run(resumed, 3)
    renamed.rename(planned)
    hfread._STREAMS.clear()
    assert run_task(config, 3, "tokenize", 1) == 1
    assert local_exec.run(resumed, 3).total_docs == 90


@pytest.mark.parametrize("kind", ["parquet", "saved"])
def test_a_resume_refuses_data_files_changed_since(tmp_path, monkeypatch, kind):
    """A run records its Hugging Face input's data files too (hfread.resume_mark):
    the names of a stream's, the save of a saved dataset. A --resume after a data file was
    renamed (as a new revision renames them) or the dataset was saved again is refused in one
    line naming the input, before anything is read; with the files back it goes on and ends as
    an uninterrupted run does."""
    from lmshard.errors import ConfigError
    from lmshard.prepare.documents import hfread, sources
    from lmshard.prepare.execution import unitfiles
    from lmshard.prepare.output.staging import Interrupted

    texts = [make_texts(30, seed=k) for k in range(3)]
    data = tmp_path / "ds" / "data"
    if kind == "parquet":
        data.mkdir(parents=True)
        for k in range(3):
            datasets.Dataset.from_dict({"text": texts[k]}).to_parquet(str(data / f"train-{k:05d}-of-00003.parquet"))
    else:
        datasets.Dataset.from_dict({"text": sum(texts, [])}).save_to_disk(str(tmp_path / "ds"))
    monkeypatch.setattr(sources, "RECORDS_PER_ITEM", 10)  # (several work items, as the resumed run plans them)
    real_stop = unitfiles.stop_point

    def ctrl_c(point: str, key: int | None = None) -> None:  # Ctrl-C once the first work item is written
        raise KeyboardInterrupt

    monkeypatch.setattr(unitfiles, "stop_point", ctrl_c)
    config = PrepareConfig(out=str(tmp_path / "o"), hf=str(tmp_path / "ds"), workers=1, val_fraction=0)
    with pytest.raises(Interrupted):
        prepare(config)
    monkeypatch.setattr(unitfiles, "stop_point", real_stop)
    resumed = dataclasses.replace(config, resume=True)
    if kind == "parquet":
        planned, renamed = data / "train-00002-of-00003.parquet", data / "train-00002-of-00003-new.parquet"
        planned.rename(renamed)
    else:
        datasets.Dataset.from_dict({"text": sum(texts, [])[::-1]}).save_to_disk(str(tmp_path / "ds2"))
        (tmp_path / "ds").rename(tmp_path / "ds1")
        (tmp_path / "ds2").rename(tmp_path / "ds")
    hfread._STREAMS.clear()
    with pytest.raises(ConfigError) as e:
        prepare(resumed)
    said = str(e.value)
    assert f"input hf:{tmp_path / 'ds'} changed since the run started (its data files" in said and "\n" not in said
    if kind == "parquet":
        renamed.rename(planned)
    else:
        (tmp_path / "ds").rename(tmp_path / "ds2")
        (tmp_path / "ds1").rename(tmp_path / "ds")
    hfread._STREAMS.clear()
    assert prepare(resumed).total_docs == 90
    prepare(dataclasses.replace(config, out=str(tmp_path / "whole")))
    assert tokens_of(tmp_path / "o") == tokens_of(tmp_path / "whole")


def test_a_data_file_list_one_side_could_not_name_is_not_compared():
    """hfread.resume_mark is "" where the stream cannot be listed (offline; `datasets` before 5):
    a resume then compares the rest of the input's identity only."""
    from lmshard.prepare.output.claim import difference

    def fingerprint(mark: str) -> dict:
        return {"sources": [["hf:/d", "hf", 0, mark]]}

    assert difference(fingerprint("abc"), fingerprint("")) is None
    assert difference(fingerprint(""), fingerprint("abc")) is None
    assert "input hf:/d changed since the run started (its data files" in difference(fingerprint("abc"),
                                                                                     fingerprint("abd"))


def test_a_stream_split_into_datasets_is_not_planned_too(local, tmp_path):
    """--hf-tasks (separate datasets) and --num-tasks (one dataset) are refused together in one line."""
    result = runner.invoke(app, ["prepare", "--hf", str(local / "pq"), "--out", str(tmp_path / "o"), "--num-tasks",
                                 "2", "--hf-tasks", "2", "--hf-task", "0", "--workers", "1"])  # fmt: skip
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "--hf-tasks makes part I of N a dataset of its own, and --num-tasks plans one dataset of the whole" in (
        " ".join(result.output.split()))
    assert not (tmp_path / "o").exists()


def test_a_sources_bytes_size_a_plans_dedup_buckets(tmp_path, monkeypatch):
    """A directory's files' bytes; a hub stream's as its card states them, else 1 GiB per data
    file (the stream of a local directory stands in for the hub's here: no card, 3 files)."""
    from lmshard.prepare.documents import hfread
    from lmshard.prepare.execution.taskplan import bucket_count

    data = tmp_path / "d" / "data"
    for k in range(3):
        jsonl(data / f"train-{k:05d}-of-00003.jsonl", [f"file {k} row {i}" for i in range(20)])
    spec = HFSpec(dataset=str(tmp_path / "d"))
    assert hfread.source_bytes(spec) == sum(p.stat().st_size for p in data.iterdir())
    hfread.stream_shards(spec)  # (opened now: the stream a "hub" id reads below, from this process's cache)
    monkeypatch.setattr(HFSpec, "kind", lambda self: "hub")
    assert hfread.source_bytes(spec) == 3 << 30 and bucket_count(3 << 30) == 32 and bucket_count(2000 << 30) == 4096


@pytest.mark.parametrize(("kind", "max_docs"), [("parquet", None), ("saved", None), ("parquet", 150)])
def test_a_plain_prepare_of_a_hugging_face_dataset_runs_the_stages_reading_it_here(tmp_path, monkeypatch, kind,
                                                                                  max_docs):  # fmt: skip
    """A plain `prepare --hf` with 2 workers: this process, which opened the dataset, reads every
    unit (a data file of a stream, rows of a saved dataset) and the workers tokenize its work
    items (none in a unit's own code); a worker would open the dataset again. The units go out
    in one window, which holds the items of two units at once (the next one's go out while the
    last results of the one before come back; not with --max-docs). The dataset equals a
    one-worker prepare of it, byte for byte (duplicates across units, a null text named at
    its record; with --max-docs, stopped in the second data file)."""
    from test_stages import _files

    from lmshard.prepare.execution import itempool, local_exec, unitfiles
    from lmshard.prepare.execution.run import Run

    texts = make_texts(400, seed=9)
    files = [texts[:120], texts[120:200] + texts[:30], [*texts[200:260], None, *texts[260:330]], texts[330:]]
    if kind == "parquet":
        (tmp_path / "ds" / "data").mkdir(parents=True)
        for k, column in enumerate(files):
            path = tmp_path / "ds" / "data" / f"train-{k:05d}-of-{len(files):05d}.parquet"
            datasets.Dataset.from_dict({"text": column}).to_parquet(str(path))
    else:
        datasets.Dataset.from_dict({"text": sum(files, [])}).save_to_disk(str(tmp_path / "ds"))
    opts = dict(hf=str(tmp_path / "ds"), val_fraction=0.1, tokens_per_shard=5_000, on_error="skip", max_docs=max_docs)
    one = prepare(PrepareConfig(out=str(tmp_path / "one"), workers=1, **opts))
    assert one.drops["duplicate"] == (0 if max_docs else 30) and one.total_docs == (max_docs or 400)
    runs, real = [], local_exec.run
    monkeypatch.setattr(local_exec, "run", lambda *a, **k: runs.append(a[1]) or real(*a, **k))
    spreads, do, chained = [], Run.do, itempool._Chain.results
    monkeypatch.setattr(Run, "do", lambda r, stage, i, stop=None, spread=None: (
        spreads.append(i) if spread is not None else None) or do(r, stage, i, stop, spread))  # fmt: skip
    monkeypatch.setattr(itempool._Chain, "results", lambda chain, u: spreads.append(u) or chained(chain, u))
    monkeypatch.setattr(unitfiles, "run_item", lambda *a: pytest.fail("a unit tokenized in its own code"))
    at_once, fill = [0], itempool._Chain._fill  # (the most units whose items were in the window together)
    monkeypatch.setattr(itempool._Chain, "_fill", lambda chain: fill(chain) or at_once.append(
        len({u for u, _ in chain.window})))  # fmt: skip
    prepare(PrepareConfig(out=str(tmp_path / "two"), workers=2, **opts))
    n_units = len(files) if kind == "parquet" else 2  # (a saved dataset of 431 rows: units of 256 rows)
    assert runs and spreads == list(range(2 if max_docs else n_units))  # (--max-docs: none read after the 2nd)
    assert (max(at_once) >= 2) if not max_docs else at_once == [0]  # (--max-docs: a unit at a time, its stop)
    assert _files(tmp_path / "two") == _files(tmp_path / "one")


def test_the_stages_of_a_stream_fork_their_workers_before_they_open_it(tmp_path):
    """`lmshard prepare --hf DIR --workers 2`: opening
    a Hugging Face dataset starts threads in the process, after which workers can only be
    spawned (a new interpreter each, ≈0.5 s of a core); the workers are forked before the claim
    opens it and build their run from the plan at their first item. No interpreter but the
    command's starts (each records its start through a sitecustomize), and the dataset equals a
    one-process prepare's, byte for byte. Their work files are left unsynced, as a local run's
    (volatile.py: a worker forked before the run marked its work folder finds the mark)."""
    import os
    import subprocess
    import sys

    from test_local_exec import _RECORDING
    from test_stages import _files

    texts = make_texts(400, seed=9)
    (tmp_path / "ds" / "data").mkdir(parents=True)
    for k in range(4):
        path = tmp_path / "ds" / "data" / f"train-{k:05d}-of-00004.parquet"
        datasets.Dataset.from_dict({"text": texts[k * 100 : (k + 1) * 100] + texts[:10]}).to_parquet(str(path))
    prepare(PrepareConfig(out=str(tmp_path / "one"), hf=str(tmp_path / "ds"), workers=1, val_fraction=0.1))
    (tmp_path / "site").mkdir()
    started = "\nif os.environ.get('STARTED'):\n    open(os.environ['STARTED'], 'a').write(f'{os.getpid()}\\n')\n"
    (tmp_path / "site" / "sitecustomize.py").write_text(_RECORDING + started)
    path = os.pathsep.join([str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "STARTED": str(tmp_path / "started"),
           "HF_HUB_OFFLINE": "1", "SYNCED": str(tmp_path / "synced")}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "lmshard", "prepare", "--hf", str(tmp_path / "ds"), "--out",
                           str(tmp_path / "two"), "--workers", "2", "--val-fraction", "0.1", "--quiet"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "started").read_text().split()) == 1  # (spawned workers: 3)
    work = [p.rsplit("/", 1)[-1] for p in (tmp_path / "synced").read_text().splitlines() if ".lmshard-work" in p]
    assert [n for n in work if not n.startswith((".plan", "..plan.json", ".volatile.json"))] == [], work
    assert _files(tmp_path / "two") == _files(tmp_path / "one")


