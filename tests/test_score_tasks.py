"""`lmshard score --num-tasks N`: a dataset of several shards scored as planned tasks (in any
task order, by hand through `run-task`, in the local pool) is byte for byte what a one-process
score writes, a plugin scorer included; a plugin changed after the plan is refused, and the
plan's files are read a task's rows at a time."""

from __future__ import annotations

import json

import pytest
from test_attributes import _prepare, _texts, _write
from test_retokenize_tasks import _files
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import ConfigError
from lmshard.format import load_metadata
from lmshard.interop import rewriteengines, scoretasks
from lmshard.interop.score import score_dataset
from lmshard.prepare.execution.taskplan import work_dir


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A GPT-2 dataset of several shards in both splits, with a `length` attribute, and a plugin
    scorer beside it."""
    root = tmp_path_factory.mktemp("score_tasks")
    plugin = root / "plug.py"
    plugin.write_text("def digits(text):\n    return sum(c.isdigit() for c in text)\n")
    out = _prepare(root / "ds", _write(root / "docs.jsonl", _texts(700, seed=9)), attributes=["length"],
                   tokens_per_shard=4_000, val_fraction=0.1)  # fmt: skip
    meta = load_metadata(out)
    assert len(meta.split_shards("train")) >= 6 and meta.n_docs("val")
    return out, [f"{plugin}:digits", "fineweb_quality"]


@pytest.fixture(scope="module")
def one(source, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "one"
    score_dataset(source[0], source[1], out, workers=1)
    return _files(out)


@pytest.mark.parametrize("n", [1, 5])
def test_planned_tasks_in_any_order_write_the_one_process_bytes(tmp_path, source, one, n):
    out = tmp_path / "scored"
    scoretasks.plan(source[0], source[1], out, n)
    for task in reversed(range(n)):
        assert rewriteengines.tasks_for(out).run("score", task) == len(rewriteengines.tasks_for(out).share(
            rewriteengines.tasks_for(out).n_units, task))  # fmt: skip
    rewriteengines.tasks_for(out).run("finish", 0)
    assert _files(out) == one and not work_dir(out).exists()
    meta = load_metadata(out)
    assert {"digits", "fineweb_short_lines"} <= {a.name for a in meta.attributes}
    assert meta.run.lineage[-1]["op"] == "score"
    assert CliRunner().invoke(app, ["inspect", str(out)]).exit_code == 0


def test_by_hand_the_local_pool_and_a_changed_plugin(tmp_path, source, one):
    runner = CliRunner()
    attrs = [x for a in source[1] for x in ("--attribute", a)]
    out = tmp_path / "by_hand"
    planned = runner.invoke(app, ["score", str(source[0]), *attrs, "--out", str(out), "--num-tasks", "3",
                                  "--executor", "none"])  # fmt: skip
    assert planned.exit_code == 0 and f"lmshard run-task --stage score --task I {out}" in planned.output
    early = runner.invoke(app, ["run-task", "--stage", "finish", str(out)])
    assert early.exit_code == 1 and "the score stage is not complete" in early.output, early.output
    for task in (1, 0, 2, 1):
        done = runner.invoke(app, ["run-task", "--stage", "score", "--task", str(task), str(out)])
        assert done.exit_code == 0, done.output
    assert "finish: not run" in runner.invoke(app, ["status", str(out)]).output
    assert runner.invoke(app, ["run-task", "--stage", "finish", str(out)]).exit_code == 0
    assert _files(out) == one

    pooled = runner.invoke(app, ["score", str(source[0]), *attrs, "--out", str(tmp_path / "pool"), "--num-tasks", "4",
                                 "--workers", "2"])  # fmt: skip
    assert pooled.exit_code == 0 and "in 4 tasks" in pooled.output, pooled.output
    assert _files(tmp_path / "pool") == one

    plugin = tmp_path / "p.py"
    plugin.write_text("def f(text):\n    return len(text)\n")
    scoretasks.plan(source[0], [f"{plugin}:f"], tmp_path / "changed", 2)
    plugin.write_text("def f(text):\n    return 2 * len(text)\n")  # the code the plan hashed is gone
    with pytest.raises(ConfigError, match="a plugin's code changed since the score was planned"):
        rewriteengines.tasks_for(tmp_path / "changed").run("score", 0)
    again = runner.invoke(app, ["score", str(source[0]), "--attribute", "gopher_quality", "--out",
                                str(tmp_path / "changed"), "--num-tasks", "2"])  # fmt: skip
    assert again.exit_code == 1 and "a score was planned there with --attribute" in again.output, again.output
    head = json.loads((work_dir(tmp_path / "changed") / "rewrite.json").read_text())
    assert head["kind"] == "score" and head["units"] == len(load_metadata(source[0]).shards)


def test_a_task_or_a_finish_stopped_anywhere_is_finished_by_running_it_again(tmp_path, source, one, monkeypatch):
    """A score task stopped after linking its shards' files (before its marker), a stray
    temporary file of a killed writer, a finish stopped right after the swap, and one stopped
    while removing its work folder: each run again ends with the one-process bytes."""
    from lmshard.interop import rewrite

    out = tmp_path / "again"
    scoretasks.plan(source[0], source[1], out, 2, overwrite=True)
    work = work_dir(out)
    rewriteengines.tasks_for(out).run("score", 0)
    for marker in [*(work / "done").rglob("*.json"), *(work / "score").glob("unit_*.json")]:
        marker.unlink()  # (its links and attribute files are in the build already)
    for task in (0, 1):
        rewriteengines.tasks_for(out).run("score", task)
    (work / "build" / "train" / "shard_000000.attr.4242.tmp").write_bytes(b"half")  # a killed writer's
    out.mkdir()
    (out / "dataset_metadata.json").write_text("{}")  # an old dataset at --out, replaced (--overwrite)

    def stopped(_work):
        raise KeyboardInterrupt

    monkeypatch.setattr(rewrite, "remove_work", stopped)
    with pytest.raises(KeyboardInterrupt):
        rewriteengines.tasks_for(out).run("finish", 0)
    monkeypatch.undo()
    assert _files(out) == one  # (swapped in: complete)
    (work / "source.json").unlink()  # as if the removal had stopped halfway
    shown = CliRunner().invoke(app, ["status", str(out)])
    assert "done: the dataset is complete" in shown.output, shown.output
    done = CliRunner().invoke(app, ["run-task", "--stage", "finish", str(out)])
    assert done.exit_code == 0, done.output
    assert _files(out) == one and not work.exists()


def test_a_symlinked_out(tmp_path, source, one):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    attrs = [x for a in source[1] for x in ("--attribute", a)]
    done = CliRunner().invoke(app, ["score", str(source[0]), *attrs, "--out", str(tmp_path / "link" / "ds"),
                                    "--num-tasks", "2", "--executor", "none"])  # fmt: skip
    assert done.exit_code == 0, done.output
    for stage, task in (("score", 0), ("score", 1), ("finish", 0)):
        ran = CliRunner().invoke(app, ["run-task", "--stage", stage, "--task", str(task), str(tmp_path / "link/ds")])
        assert ran.exit_code == 0, ran.output
    assert _files(tmp_path / "real" / "ds") == one
