"""`--hf ... --no-streaming`: the split `datasets` downloads (or converts) into its cache, read by
rows as a saved dataset is (hfread.mapped_split): a plain prepare runs it on the stages, a planned
run (--num-tasks) cuts it into units of rows, and both equal a one-process run of it, byte for
byte. A task or a --resume that finds another copy (its data files changed) is refused in one
line. The cache of `datasets` is a folder of each test's own (HF_DATASETS_CACHE)."""

from __future__ import annotations

import dataclasses
import os

import pytest
from test_prepare import make_texts
from test_stages import _files

from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.execution import local_exec

datasets = pytest.importorskip("datasets")


@pytest.fixture
def data(tmp_path, monkeypatch):
    """3 parquet data files (duplicates across them, a null text in the second), and a cache of
    `datasets` of this test's own."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    texts = make_texts(600, seed=8)
    files = [texts[:200], texts[200:400] + texts[:30] + [None], texts[400:]]
    (tmp_path / "pq" / "data").mkdir(parents=True)
    for k, column in enumerate(files):
        path = tmp_path / "pq" / "data" / f"train-{k:05d}-of-00003.parquet"
        datasets.Dataset.from_dict({"text": column}).to_parquet(str(path))
    return tmp_path / "pq"


def _options(data, **more):
    return {"hf": str(data), "streaming": False, "val_fraction": 0.1, "tokens_per_shard": 5_000, "on_error": "skip",
            **more}


def _units(monkeypatch) -> list:
    """The kinds of the units of each run planned from now on (runplan.plan_run cuts them)."""
    from lmshard.prepare.execution import runplan

    kinds: list = []
    real = runplan.cut_units

    def cut(*args, **kwargs):
        out = real(*args, **kwargs)
        kinds.append([u.kind for u in out])
        return out

    monkeypatch.setattr(runplan, "cut_units", cut)
    return kinds


def test_a_plain_prepare_runs_the_downloaded_copy_on_the_stages_by_rows(tmp_path, monkeypatch, data):
    """With 2 workers: the stages, in units of rows of the cached copy (read by every worker),
    and the bytes of one worker's run; the records are those of the stream too (its tokens)."""
    from test_hf import tokens_of

    kinds = _units(monkeypatch)
    one = prepare(PrepareConfig(out=str(tmp_path / "one"), workers=1, **_options(data)))
    staged = prepare(PrepareConfig(out=str(tmp_path / "staged"), workers=2, **_options(data)))
    assert len(kinds) == 2 and set(kinds[0]) == set(kinds[1]) == {"rows"}, kinds
    assert one.drops["duplicate"] == 30 and one.drops["wrong_type"] == 1 and staged.total_docs == one.total_docs
    assert _files(tmp_path / "staged") == _files(tmp_path / "one")
    prepare(PrepareConfig(out=str(tmp_path / "streamed"), workers=2, **_options(data, streaming=None)))
    assert kinds[-1] == ["shard"] * 3
    assert tokens_of(tmp_path / "streamed") == tokens_of(tmp_path / "one")


@pytest.mark.parametrize("n_tasks", [1, 3])
def test_a_planned_run_cuts_the_downloaded_copy_into_rows_and_equals_one_process(tmp_path, monkeypatch, data,
                                                                                n_tasks):  # fmt: skip
    """`--num-tasks N --no-streaming`: the planner downloads the split, the plan's units are its
    rows, every task reads its own from the cached copy; the dataset is one process's."""
    from lmshard.prepare.execution.plantables import PlanSources
    from lmshard.prepare.execution.stages import STAGES, run_task
    from lmshard.prepare.execution.taskplan import load_plan, work_dir

    prepare(PrepareConfig(out=str(tmp_path / "one"), workers=1, **_options(data)))
    config = PrepareConfig(out=str(tmp_path / "tasks"), workers=1, **_options(data))
    local_exec.claim(config, n_tasks)
    plan = load_plan(work_dir(config.out))
    assert {u[1] for u in plan["units"]} == {"rows"} and plan["units"][-1][3] == 631
    assert len(PlanSources(plan["sources"])[0].version) == 16  # (the copy's fingerprint: hfread.mapped_mark)
    for stage in STAGES[:-1]:
        for task in reversed(range(n_tasks)):
            run_task(config, n_tasks, stage, task)
    run_task(config, n_tasks, "finish", 0)
    assert _files(tmp_path / "tasks") == _files(tmp_path / "one")


def test_a_task_or_a_resume_that_finds_another_copy_is_refused(tmp_path, monkeypatch, data):
    """A data file rewritten after planning: `datasets` makes another copy (another fingerprint),
    and the next task is refused in one line before it reads a row, as is a --resume of a plain
    prepare; with the file back both go on and end as one process does."""
    from lmshard.errors import ConfigError, InputError
    from lmshard.prepare.documents import hfread
    from lmshard.prepare.execution.stages import run_task

    first = data / "data" / "train-00000-of-00003.parquet"
    kept, st = first.read_bytes(), first.stat()
    config = PrepareConfig(out=str(tmp_path / "tasks"), workers=1, **_options(data))
    local_exec.claim(config, 3)
    assert run_task(config, 3, "tokenize", 0) >= 1
    datasets.Dataset.from_dict({"text": make_texts(200, seed=9)}).to_parquet(str(first))
    resumed = dataclasses.replace(config, resume=True)
    with pytest.raises(ConfigError, match=f"input hf:{data} changed since the run started"):
        local_exec.run(resumed, 3)  # (in this process, which opened the copy before: a run opens it again)
    with pytest.raises(InputError, match="the copy `datasets` loads now is not the one the run was planned") as e:
        run_task(config, 3, "tokenize", 1)
    assert "\n" not in str(e.value) and "--revision" in str(e.value)
    first.write_bytes(kept)
    os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns))  # (the file as it was: `datasets` keys its copy by both)
    hfread.forget()  # (as another process opens the split)
    assert run_task(config, 3, "tokenize", 1) >= 1
    assert local_exec.run(resumed, 3).total_docs > 0
    prepare(PrepareConfig(out=str(tmp_path / "one"), workers=1, **_options(data)))
    assert _files(tmp_path / "tasks") == _files(tmp_path / "one")


@pytest.mark.parametrize("kind", ["saved", "downloaded"])
def test_a_part_of_a_mapped_split_is_planned_by_rows_and_a_streams_as_one_unit(tmp_path, monkeypatch, data, kind):
    """`--hf-tasks 3 --hf-task 1` of a saved or downloaded split: part 1 of 3 of its rows
    (`split_dataset_by_node`: contiguous rows), in units of its rows, the same bytes with 1 and
    2 workers (the part recorded in the metadata); of a stream it is one unit (a stream of fewer
    data files than parts is split example by example)."""
    from lmshard.errors import ConfigError

    kinds = _units(monkeypatch)
    if kind == "saved":
        whole = datasets.load_dataset(str(data), split="train", streaming=False)
        whole.save_to_disk(str(tmp_path / "saved"))
    options = _options(tmp_path / "saved" if kind == "saved" else data, hf_tasks=3, hf_task=1)
    one = prepare(PrepareConfig(out=str(tmp_path / "one"), workers=1, **options))
    prepare(PrepareConfig(out=str(tmp_path / "staged"), workers=2, **options))
    assert len(kinds) == 2 and set(kinds[0]) == set(kinds[1]) == {"rows"}
    assert one.total_docs == 210  # (rows 211-420 of 631)
    assert _files(tmp_path / "staged") == _files(tmp_path / "one")
    streamed = _options(data, streaming=None, hf_tasks=3, hf_task=1)  # (the data files streamed: the second file)
    assert prepare(PrepareConfig(out=str(tmp_path / "part_of_stream"), workers=2, **streamed)).total_docs == 230
    assert kinds[-1] == ["shard"]
    with pytest.raises(ConfigError, match="--hf-tasks makes part I of N a dataset of its own, and --num-tasks"):
        prepare(PrepareConfig(out=str(tmp_path / "planned"), workers=1, num_tasks=2, **options))
    assert not (tmp_path / "planned").exists()


def test_a_second_run_in_one_process_sees_a_data_file_changed_since_the_first(tmp_path, monkeypatch, data):
    """prepare() twice in one Python process, a data file rewritten between: the second run
    opens the copy again (runplan.load_run, hfread.forget) and writes the new records."""
    first = prepare(PrepareConfig(out=str(tmp_path / "a"), workers=1, **_options(data)))
    datasets.Dataset.from_dict({"text": make_texts(50, seed=9)}).to_parquet(str(data / "data" /
                                                                              "train-00000-of-00003.parquet"))
    second = prepare(PrepareConfig(out=str(tmp_path / "b"), workers=1, **_options(data)))
    assert first.total_docs == 600 and second.total_docs == 600 - 200 + 50 + 30  # (the 30 repeats now kept)


def test_a_hub_ids_downloaded_copy_sizes_the_plan_by_its_arrow_tables(tmp_path, monkeypatch, data):
    """A hub id's size with --no-streaming: its copy's arrow tables (a local directory's copy
    stands in for the hub's here), where a stream's is its card's, else 1 GiB per data file."""
    from lmshard.prepare.documents import hfread
    from lmshard.prepare.documents.hf import HFSpec

    spec = HFSpec(dataset=str(data), streaming=False)
    table = hfread.mapped_split(spec).data
    monkeypatch.setattr(HFSpec, "kind", lambda self: "hub")
    assert hfread.source_bytes(spec) == table.nbytes > 100_000


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_copy(data, name="lmshard-test/tiny", commit=COMMIT):
    """The copy `datasets` leaves in its cache when it downloads hub id `name` at `commit`: built
    here by `datasets` itself from the parquet files (its parquet builder, as for a hub dataset
    of parquet files), then placed where the hub download puts it (OWNER___NAME/CONFIG/VERSION/
    COMMIT, its arrow files and info named after the dataset)."""
    import json
    import shutil
    from pathlib import Path

    built = datasets.load_dataset(str(data), split="train")
    owner, repo = name.split("/")
    copy = Path(datasets.config.HF_DATASETS_CACHE) / f"{owner}___{repo}" / "default" / "0.0.0" / commit
    shutil.copytree(Path(built.cache_files[0]["filename"]).parent, copy)
    for f in copy.glob("*-train*.arrow"):
        f.rename(copy / (repo + f.name[f.name.index("-train") :]))
    info = json.loads((copy / "dataset_info.json").read_text())
    (copy / "dataset_info.json").write_text(json.dumps(info | {"config_name": "default", "dataset_name": repo}))


def test_offline_a_hub_ids_cached_copy_is_read_and_a_revision_must_name_its_commit(tmp_path, monkeypatch, data):
    """With HF_HUB_OFFLINE set (a cluster's compute nodes), `--hf OWNER/NAME --no-streaming` reads
    the copy `datasets` cached when it downloaded it: in one process and as planned tasks, the
    bytes of the same rows read from the data files (planned offline too: the planner and every
    task read the copy). A --revision must name the copy's commit; another commit, a branch name
    (which cannot be resolved offline) or an id with no copy cached is refused in one line naming
    the fix; a stream still needs the hub, and its refusal says --no-streaming reads the copy."""
    from test_hf import tokens_of

    from lmshard.errors import InputError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _hub_copy(data)
    hub = {"hf": "lmshard-test/tiny"}
    prepare(PrepareConfig(out=str(tmp_path / "files"), workers=1, **_options(data)))
    prepare(PrepareConfig(out=str(tmp_path / "hub"), workers=1, **_options(data) | hub))
    assert tokens_of(tmp_path / "hub") == tokens_of(tmp_path / "files")
    config = PrepareConfig(out=str(tmp_path / "tasks"), workers=1, num_tasks=2, **_options(data) | hub)
    local_exec.run(config, 2)
    assert _files(tmp_path / "tasks") == _files(tmp_path / "hub")
    pinned = COMMIT[:12].upper()  # (the start of the commit, in either case)
    prepare(PrepareConfig(out=str(tmp_path / "pinned"), workers=1, revision=pinned, **_options(data) | hub))
    assert tokens_of(tmp_path / "pinned") == tokens_of(tmp_path / "files")
    refusals = {"f" * 40: "another commit", "main": "a branch or tag cannot be resolved offline",
                COMMIT[:6]: "a commit is named by 7 or more of its hex digits"}  # fmt: skip
    for revision, why in refusals.items():
        with pytest.raises(InputError, match="HF_HUB_OFFLINE is set") as e:
            prepare(PrepareConfig(out=str(tmp_path / "r"), workers=1, revision=revision, **_options(data) | hub))
        words = f"of commit {COMMIT}, which --revision {revision} does not name ({why})"
        assert words in str(e.value) and f"pass --revision {COMMIT} to read it" in str(e.value), str(e.value)
        assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="cannot load the copy `datasets` cached") as e:
        prepare(PrepareConfig(out=str(tmp_path / "r"), workers=1, **_options(data) | {"hf": "lmshard-test/other"}))
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="cannot reach the Hugging Face hub.*with --no-streaming, the copy"):
        prepare(PrepareConfig(out=str(tmp_path / "s"), workers=1, **_options(data) | hub | {"streaming": None}))
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".s.")]  # (nothing left to refuse a next run)
    prepare(PrepareConfig(out=str(tmp_path / "s"), workers=1, **_options(data) | hub))  # (the fix it names)
    assert tokens_of(tmp_path / "s") == tokens_of(tmp_path / "files")


def test_the_command_line_keeps_datasets_own_notes_and_progress_bars_off_a_quiet_run(tmp_path, monkeypatch, data):
    """`lmshard prepare --hf ... --quiet` with stderr to a file: nothing on it but lmshard's (here,
    nothing), neither the progress bar `datasets` draws when it converts data files into its cache
    (control codes in a log) nor its notes when it reads a cached hub copy offline."""
    import subprocess
    import sys

    _hub_copy(data)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "fresh")}  # (converted anew)
    for hf in (str(data), "lmshard-test/tiny"):
        if hf == "lmshard-test/tiny":
            env["HF_DATASETS_CACHE"] = str(tmp_path / "cache")  # (the hub copy's cache)
        out = tmp_path / f"o{len(hf)}"
        args = ["--hf", hf, "--no-streaming", "--out", str(out), "--on-error", "skip", "--quiet"]
        done = subprocess.run([sys.executable, "-m", "lmshard", "prepare", *args], env=env, text=True,
                              capture_output=True)  # fmt: skip
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert (out / "dataset_metadata.json").exists()
