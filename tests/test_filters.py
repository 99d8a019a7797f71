"""Document filters as prepare steps (`--filter`): drops counted by reason against the filters
called on the same cleaned texts here, the same bytes for any worker or task count, and one-line
errors for a filter that cannot be found or answers wrongly."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from test_gopher import _document, reference
from test_prepare import jsonl
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import ConfigError
from lmshard.format import load_metadata
from lmshard.prepare import PrepareConfig, prepare

FILTER_FILE = '''
def no_river(text):
    return "mentions_river" if "river" in text.split()[:3] else None

def loud(text):
    return not text.isupper()

def broken(text):
    return 42
'''


@pytest.fixture
def corpus(tmp_path):
    rng = random.Random(8)
    texts = [_document(rng) for _ in range(1500)]
    texts += [t.upper() for t in texts[:40]]
    return jsonl(tmp_path / "docs.jsonl", texts), texts


def _run(tmp_path, src, name, filters, **kw):
    out = tmp_path / name
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), filters=filters, val_fraction=0.1, quiet=True,
                          tokens_per_shard=50_000, dedup="none", **kw))  # fmt: skip
    return out


def test_drops_by_reason_are_the_filters_verdicts(tmp_path, corpus):
    src, texts = corpus
    (tmp_path / "myfilters.py").write_text(FILTER_FILE)
    spec = f"{tmp_path / 'myfilters.py'}"
    out = _run(tmp_path, src, "ds", ["gopher_quality", f"{spec}:no_river", f"{spec}:loud"], workers=2)
    expected: Counter[str] = Counter()
    for t in texts:  # the first filter that objects names the reason (the texts are clean already)
        reason = reference(t) or ("mentions_river" if "river" in t.split()[:3] else None)
        reason = reason or (None if not t.isupper() else "loud")
        expected[reason or "kept"] += 1
    meta = load_metadata(out)
    drops = {k: v for k, v in meta.drops.items() if v}
    kept = expected.pop("kept")
    assert drops == dict(expected) and meta.n_docs() == kept
    assert meta.config["filters"] == ["gopher_quality", f"{spec}:no_river", f"{spec}:loud"]
    # each reason's characters: the documents it dropped, counted by hand (the texts are clean already)
    river = sum(len(t) for t in texts if not reference(t) and "river" in t.split()[:3])
    assert meta.drop_chars["mentions_river"] == river > 0
    assert set(meta.drop_chars) == set(drops)
    assert meta.drop_examples["mentions_river"].endswith(f"dropped by --filter {spec}:no_river")


def test_the_same_bytes_for_any_workers_and_tasks(tmp_path, corpus):
    src, _ = corpus
    runs = [_run(tmp_path, src, f"w{w}", ["gopher_quality"], workers=w) for w in (1, 2)]
    runs.append(_run(tmp_path, src, "tasks3", ["gopher_quality"], workers=2, num_tasks=3))
    first = load_metadata(runs[0])
    for other in runs[1:]:
        meta = load_metadata(other)
        assert meta.drops == first.drops
        for a, b in zip(first.shards, meta.shards, strict=True):
            assert (runs[0] / a.path).read_bytes() == (other / b.path).read_bytes()


def test_mistakes_are_one_line(tmp_path, corpus):
    src, _ = corpus
    (tmp_path / "myfilters.py").write_text(FILTER_FILE)
    with pytest.raises(ConfigError, match="not a built-in filter .* did you mean gopher_quality"):
        PrepareConfig(inputs=[str(src)], out=str(tmp_path / "x"), filters=["gopher"])
    with pytest.raises(ConfigError, match="gopher_quality takes no arguments; pass --filter gopher_quality"):
        PrepareConfig(inputs=[str(src)], out=str(tmp_path / "x"), filters=["gopher_quality=3"])
    with pytest.raises(ConfigError, match=r"did you mean language=\.\.\.\?"):
        PrepareConfig(inputs=[str(src)], out=str(tmp_path / "x"), filters=["languge=en"])
    with pytest.raises(ConfigError, match="has no function 'nothing'"):
        PrepareConfig(inputs=[str(src)], out=str(tmp_path / "x"), filters=[f"{tmp_path / 'myfilters.py'}:nothing"])
    result = CliRunner().invoke(app, ["prepare", str(src), "--out", str(tmp_path / "y"), "--filter",
                                      f"{tmp_path / 'myfilters.py'}:broken", "--workers", "1"])  # fmt: skip
    text = " ".join(result.output.split())
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "returned 42" in text and "return None to keep" in text, text
    assert not (tmp_path / "y" / "dataset_metadata.json").exists()


RAISING = '''
def boom(text):
    if "river" in text:
        raise ValueError("no rivers here")

def two_args(text, other):
    return None

def bad_edit(text):
    from lmshard.quality.filters import Edit
    e = Edit(text)
    e.removed = {"x": "not a pair"}
    return e
'''


@pytest.mark.parametrize(("fn", "said"), [("boom", "raised ValueError: no rivers here"),
                                           ("two_args", "raised TypeError"),
                                           ("bad_edit", "returned a malformed Edit")])  # fmt: skip
@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_failing_plugin_is_one_line_naming_the_filter_and_the_record(tmp_path, corpus, fn, said, workers):
    src, texts = corpus
    (tmp_path / "rules.py").write_text(RAISING)
    result = CliRunner().invoke(app, ["prepare", str(src), "--out", str(tmp_path / "y"), "--filter",
                                      f"{tmp_path / 'rules.py'}:{fn}", "--workers", workers])  # fmt: skip
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    first = 1 + next(i for i, t in enumerate(texts) if "river" in t) if fn == "boom" else 1
    assert len(errors) == 1 and f"{src}:{first}: --filter {tmp_path / 'rules.py'}:{fn} {said}" in errors[0], lines


def test_a_plugin_edited_after_the_run_started_is_refused_on_resume_and_by_every_task(tmp_path, corpus, monkeypatch):
    """The plugin's source (and the Python files beside it) is in the fingerprint, the plan and
    the metadata: a resumed run or a task after an edit is refused in one line naming the file;
    a relative `rules.py:fn` is resolved where the run is planned, so a task started in another
    directory with a rules.py of its own imports the planned one."""
    from lmshard.errors import LmshardError
    from lmshard.prepare.execution import local_exec
    from lmshard.prepare.execution.stages import STAGES, run_task

    src, texts = corpus
    (tmp_path / "rules.py").write_text(FILTER_FILE)
    monkeypatch.chdir(tmp_path)
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "planned"), filters=["rules.py:no_river"],
                           workers=1, quiet=True, dedup="none")  # fmt: skip
    assert config.filters == [f"{tmp_path / 'rules.py'}:no_river"]
    local_exec.claim(config, 2)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "rules.py").write_text("def no_river(text):\n    return 'everything'\n")
    monkeypatch.chdir(elsewhere)
    for stage in STAGES[:-1]:
        for task in range(2):
            run_task(config, 2, stage, task)
    run_task(config, 2, "finish", 0)
    meta = load_metadata(tmp_path / "planned")
    kept = sum(1 for t in texts if "river" not in t.split()[:3])
    assert meta.n_docs() == kept  # the planned rules.py, not the one where the tasks ran
    path, digest = meta.config["filter_sources"][f"{tmp_path / 'rules.py'}:no_river"]
    assert path == str(tmp_path / "rules.py") and len(digest) == 64
    monkeypatch.chdir(tmp_path)
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "again"), filters=["rules.py:no_river"], workers=1,
                           quiet=True, dedup="none")  # fmt: skip
    local_exec.claim(config, 2)
    run_task(config, 2, "tokenize", 0)
    (tmp_path / "train.py").write_text("X = 1\n")  # a file beside it that it does not import: no matter
    run_task(config, 2, "tokenize", 1)
    (tmp_path / "helper.py").write_text("X = 1\n")
    (tmp_path / "rules.py").write_text("import helper\n" + FILTER_FILE)  # the plugin changed
    with pytest.raises(LmshardError, match=r"the filter plugin .*rules\.py \(--filter .*\) changed since the run"):
        run_task(config, 2, "dedup", 0)


def test_a_plugins_hash_covers_the_files_of_its_directory_it_imports(tmp_path):
    from lmshard.quality.filters import plugin_sources

    (tmp_path / "rules.py").write_text("from helper import LIMIT\n\ndef keep(text):\n    return None\n")
    (tmp_path / "helper.py").write_text("import deeper\nLIMIT = 3\n")
    (tmp_path / "deeper.py").write_text("DEPTH = 1\n")
    (tmp_path / "train.py").write_text("EPOCHS = 1\n")
    name = f"{tmp_path / 'rules.py'}:keep"
    first = plugin_sources([name])[name]
    (tmp_path / "train.py").write_text("EPOCHS = 2\n")  # not imported: the same hash
    assert plugin_sources([name])[name] == first
    for imported, text in (("helper.py", "import deeper\nLIMIT = 4\n"), ("deeper.py", "DEPTH = 2\n")):
        (tmp_path / imported).write_text(text)  # imported, directly or through helper: another hash
        assert plugin_sources([name])[name] != first, imported
        first = plugin_sources([name])[name]
    assert plugin_sources(["c4", "language=en"]) == {}


@pytest.mark.parametrize("stages", [False, True], ids=["here", "pool"])
def test_a_plugin_edited_before_a_resume_is_refused_in_one_line(tmp_path, corpus, monkeypatch, stages):
    """The stages in this process (held after its first work item), or in the pool (a worker
    held after its first unit): interrupted
    (its work left), the plugin edited, then --resume: refused, naming the file; put back, the
    resume goes on."""
    import os
    import signal

    from proctree import finish as finish_proc
    from proctree import start_prepare, wait_stopped

    src, _ = corpus
    rules = tmp_path / "rules.py"
    rules.write_text(FILTER_FILE)
    workers = ["--workers", "2", "--unit-size", "64K"] if stages else ["--workers", "1"]
    args = [str(src), "--out", str(tmp_path / "o"), "--filter", f"{rules}:no_river", *workers]
    if stages:
        monkeypatch.setenv("LMSHARD_POOL_BYTES", "0")
    os.environ["LMSHARD_STOP_AT"] = "unit:1" if stages else "item:1"
    try:
        proc = start_prepare(args)
    finally:
        del os.environ["LMSHARD_STOP_AT"]
    assert wait_stopped(proc) is not None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert (tmp_path / ".o.lmshard-work" / "plan.json").exists()
    rules.write_text(FILTER_FILE.replace('"river"', '"lake"'))
    code, err = finish_proc(start_prepare([*args, "--resume"]), 120)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code != 0 and len(lines) == 1 and f"the filter plugin {rules}" in lines[0] and "changed" in lines[0], err
    rules.write_text(FILTER_FILE)
    code, err = finish_proc(start_prepare([*args, "--resume"]), 120)
    assert code == 0, err


def test_a_run_imports_only_the_filters_and_scorers_it_names(tmp_path):
    """The built-in filters and scorers are imported when a run names them, not at every
    prepare's start: a plain run's process has none of their modules; one with --filter c4
    --attribute length has c4's and the scorers', and still no other filter's (sys.modules of a
    fresh interpreter that runs prepare)."""
    import json
    import os
    import subprocess
    import sys

    rng = random.Random(3)
    src = jsonl(tmp_path / "in.jsonl", [_document(rng) for _ in range(20)])
    probe = ("import json, sys; from lmshard.prepare import PrepareConfig, prepare; "
             "prepare(PrepareConfig(**json.loads(sys.argv[1]))); "
             "print(json.dumps(sorted(m for m in sys.modules if m.startswith('lmshard.quality'))))")  # fmt: skip
    optional = {f"lmshard.quality.{m}" for m in ("c4", "gopher", "repetition", "language", "decon", "scores")}

    def loaded(name: str, **kw) -> set[str]:
        cfg = {"inputs": [str(src)], "out": str(tmp_path / name), "workers": 1, "val_fraction": 0.0, **kw}
        done = subprocess.run([sys.executable, "-c", probe, json.dumps(cfg)], capture_output=True, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=True)  # fmt: skip
        return set(json.loads(done.stdout.splitlines()[-1])) & optional

    assert loaded("plain") == set()
    named = loaded("named", filters=["c4"], attributes=["length"], allow_empty=True)
    assert named == {f"lmshard.quality.{m}" for m in ("c4", "scores", "gopher", "repetition")}  # (the scorers' own)


def test_the_start_line_names_the_filters(tmp_path, corpus):
    """The run's first line names its --filter steps in order (a plugin by its file's name)."""
    src, _ = corpus
    (tmp_path / "myfilters.py").write_text(FILTER_FILE)
    result = CliRunner().invoke(app, ["prepare", str(src), "--out", str(tmp_path / "ds"), "--workers", "1",
                                      "--filter", "gopher_quality", "--filter", f"{tmp_path / 'myfilters.py'}:loud"])
    first = result.output.splitlines()[0]
    assert result.exit_code == 0 and ", filter gopher_quality myfilters.py:loud," in first, first
