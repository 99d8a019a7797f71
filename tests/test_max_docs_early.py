"""--max-docs N on one machine (the local executor: `prepare --num-tasks N`, and the stages of a
plain prepare) reads its units in plan order and stops once the units from the first on hold N
kept documents: the units after are never read (no stage writes a file for them; with
--dedup-lines they are written as units of no documents that keep their lines' keys), and the
dataset is the one a one-process run writes, byte for byte. The truth for "which units must be
read" is a hand count over the input file: each unit's lines (its byte range in the plan), a
text kept when not met before."""

from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
from test_prepare import jsonl, make_texts
from test_stages import _files

from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.execution import local_exec, plainplan, unitfiles
from lmshard.prepare.execution.taskplan import load_plan
from lmshard.prepare.output.staging import Interrupted

UNIT = 64 << 10
OPTS = dict(val_fraction=0.1, tokens_per_shard=5_000)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """4,500 documents in one file (about 25 units), 500 of them repeats of earlier ones."""
    texts = make_texts(4000, seed=5)
    return jsonl(tmp_path_factory.mktemp("early") / "a.jsonl", texts[:1500] + texts[200:700] + texts[1500:])


def _markers(monkeypatch) -> dict:
    """The run's plan, tokenize markers and the units any work file is named after, read as its
    finish starts (the finish removes them)."""
    seen: dict = {}
    real = local_exec.finish

    def finish(config, paths, work, *rest):
        seen["units"] = list(load_plan(work)["units"])
        done = (work / "tokenize").glob("unit_*.done")
        seen["markers"] = {int(p.name[5:11]): json.loads(p.read_text()) for p in done}
        named = (re.match(r"\.?unit_(\d{6})\.", p.name) for p in work.rglob("*"))
        seen["named"] = {int(m[1]) for m in named if m}
        return real(config, paths, work, *rest)

    monkeypatch.setattr(local_exec, "finish", finish)
    return seen


def load_plan_units(config) -> list:
    """The units a plan for `config` (3 tasks) cuts, planned in a folder of their own."""
    from lmshard.prepare.execution.run import Run

    return list(Run.of(replace(config, out=str(Path(config.out).parent / "planned_units")), 3).plan["units"])


def _last_needed(path, units, n: int, dedup: bool) -> int:
    """By hand: the unit that holds the N-th kept document (the last if none does)."""
    data, met, kept = path.read_bytes(), set(), 0
    for u, (_, kind, start, end, *_) in enumerate(units):
        assert kind == "range"
        for line in data[start:end].splitlines():
            text = json.loads(line)["text"]
            kept += not dedup or text not in met
            met.add(text)
        if kept >= n:
            return u
    return len(units) - 1


@pytest.mark.parametrize(("workers", "extra"), [(1, {}), (1, {"dedup": "none"}), (2, {}), (1, {"dedup_lines": True}),
                                                (1, {"near_dedup": True})])  # fmt: skip
def test_a_max_docs_run_on_one_machine_reads_no_unit_after_the_nth_kept_document(tmp_path, monkeypatch, corpus,
                                                                                 workers, extra):  # fmt: skip
    """In one process exactly the units up to the one that holds the N-th kept document are read
    (N before the repeats and past them); in the pool at least those, and none after them is read
    that was not started before it (the workers finish the units they hold); with --near-dedup
    every unit. The bytes are one process's."""
    for n in (700, 1700) if not extra.get("near_dedup") else (1700,):
        opts = dict(OPTS, max_docs=n, **extra)
        one = prepare(PrepareConfig(inputs=[str(corpus)], out=str(tmp_path / f"one{n}"), workers=1, **opts))
        seen = _markers(monkeypatch)
        config = PrepareConfig(inputs=[str(corpus)], out=str(tmp_path / f"planned{n}"), workers=workers,
                               unit_size=UNIT, **opts)  # fmt: skip
        assert local_exec.run(config, 3).total_docs == one.total_docs == n
        assert _files(tmp_path / f"planned{n}") == _files(tmp_path / f"one{n}"), n
        units = list(range(len(seen["units"])))
        read = sorted(u for u, m in seen["markers"].items() if not m.get("skipped"))
        skipped = sorted(u for u, m in seen["markers"].items() if m.get("skipped"))  # (--dedup-lines only)
        never = sorted(set(units) - set(read) - set(skipped))  # no work file in any stage is named after these
        assert len(units) > 20 and not set(never) & seen["named"] and (skipped == [] or never == []), n
        if extra.get("near_dedup"):
            assert read == units
            continue
        if extra.get("dedup_lines"):  # (lines removed change what a document is: no hand count)
            assert read and skipped and read + skipped == units and read == list(range(read[-1] + 1)), (n, read)
            continue
        last = _last_needed(corpus, seen["units"], n, extra.get("dedup") != "none")
        assert last < len(units) - 2 and skipped == []
        if workers == 1:
            assert read == list(range(last + 1)) and never == units[last + 1 :], (n, last, read)
        else:  # (how many units after it the other worker started depends on the machine)
            assert set(range(last + 1)) <= set(read) and all(u > last for u in never), (n, last, read)


@pytest.mark.parametrize(("point", "when"), [("unit", 2), ("unit", "needed"), ("part", "last"), ("piece", 1)])
def test_a_max_docs_run_stopped_in_any_stage_resumes_to_the_same_bytes(tmp_path, monkeypatch, corpus, point, when):
    """Stopped (Ctrl-C) after its second unit is tokenized, after the unit that holds the N-th
    kept document (before the run could say the units after it are never read), or late in the
    write stage (its last part written, its first shard sealed: the units' files already
    removed), the run resumed ends with one process's bytes; resumed from the tokenize stage it
    counts the units done before and reads no unit after that one."""
    from lmshard.prepare.execution import owners

    opts = dict(OPTS, max_docs=1700)
    prepare(PrepareConfig(inputs=[str(corpus)], out=str(tmp_path / "one"), workers=1, **opts))
    module = unitfiles if point == "unit" else owners
    real_stop, passes = module.stop_point, []

    def ctrl_c_at(n: int):  # Ctrl-C at the n-th pass of the stop point (one process: in plan order)
        def stop(name: str, key: int | None = None) -> None:
            passes.append(name)
            if name == point and passes.count(point) == n:
                raise KeyboardInterrupt

        return stop

    config = PrepareConfig(inputs=[str(corpus)], out=str(tmp_path / "o"), workers=1, unit_size=UNIT, **opts)
    n = when
    if when == "last":  # the last part: counted in a run that goes through
        monkeypatch.setattr(module, "stop_point", ctrl_c_at(0))
        local_exec.run(replace(config, out=str(tmp_path / "count")), 3)
        n, passes[:] = passes.count("part"), []
    if when == "needed":  # the unit that holds the N-th kept document (one process: units in plan order)
        n = _last_needed(corpus, load_plan_units(config), 1700, True) + 1
    monkeypatch.setattr(module, "stop_point", ctrl_c_at(n))
    with pytest.raises(Interrupted):
        local_exec.run(config, 3)
    monkeypatch.setattr(module, "stop_point", real_stop)
    seen = _markers(monkeypatch)
    assert local_exec.run(replace(config, resume=True), 3).total_docs == 1700
    assert _files(tmp_path / "o") == _files(tmp_path / "one")
    if point == "unit":
        last = _last_needed(corpus, seen["units"], 1700, True)
        assert sorted(u for u, m in seen["markers"].items() if not m.get("skipped")) == list(range(last + 1))


@pytest.mark.parametrize("dedup", ["document", "none"])
def test_the_unit_that_holds_the_nth_kept_document_is_read_only_up_to_its_work_item(tmp_path, monkeypatch, corpus,
                                                                                      small_items, dedup):  # fmt: skip
    """One unit (the whole file), tokenized in this process: it ends after the work item that
    holds the N-th kept document, as one process does (its marker says `stopped`), and the bytes
    are one process's. The truth is a hand count of the file's lines in order: the items before
    the last hold fewer than N kept documents, all of them N or more."""
    opts = dict(OPTS, max_docs=700, dedup=dedup)
    prepare(PrepareConfig(inputs=[str(corpus)], out=str(tmp_path / "one"), workers=1, **opts))
    seen = _markers(monkeypatch)
    config = PrepareConfig(inputs=[str(corpus)], out=str(tmp_path / "o"), workers=1, unit_size=64 << 20, **opts)
    assert local_exec.run(config, 1).total_docs == 700
    assert _files(tmp_path / "o") == _files(tmp_path / "one")
    assert len(seen["units"]) == 1 and seen["markers"][0]["stopped"] == 1
    per_item = [row["docs"] for row in seen["markers"][0]["table"]]
    met, kept = set(), []  # kept documents after each of the file's lines, by hand
    for line in corpus.read_bytes().splitlines():
        text = json.loads(line)["text"]
        kept.append((kept[-1] if kept else 0) + (dedup == "none" or text not in met))
        met.add(text)
    read = sum(per_item)
    assert len(per_item) > 3 and read < len(kept)  # (items of 2 KiB: the unit is read in part)
    assert kept[read - per_item[-1] - 1] < 700 <= kept[read - 1]


# Imported first by each spawned worker of the pool: where $LMSHARD_TEST_LATE_UNITS is set, a unit
# started before the units ahead of it are done (its stop has no room) waits, before its first
# work item, until the run has its N documents (the ENOUGH file), as a unit that the worker
# reaches late would: it is then given up.
_LATE_UNITS = """
import os
if os.environ.get("LMSHARD_TEST_LATE_UNITS"):
    import time
    from lmshard.prepare.execution import maxdocs
    real = maxdocs.UnitStop.abandoned
    def abandoned(self):
        for _ in range(6000):
            if self.room is not None or self.flag.exists():
                break
            time.sleep(0.01)
        return real(self)
    maxdocs.UnitStop.abandoned = abandoned
"""


def test_a_unit_given_up_writes_nothing_and_the_pool_gives_up_the_units_after_the_cut(tmp_path, monkeypatch, corpus):
    """A unit whose stop says the run has its N documents (maxdocs.ENOUGH) is given up before
    its first work item and leaves no file (unitfiles.Abandoned). In the pool the first unit,
    which holds the N-th kept document, is told to stop within (it is started with nothing
    before it: its one work item here); the units after it, held in their workers until the run
    has its N documents (`_LATE_UNITS`), are given up and have no file in any stage: the bytes
    are one process's."""
    from lmshard.prepare.execution.maxdocs import ENOUGH, UnitStop
    from lmshard.prepare.execution.run import Run

    opts = dict(OPTS, max_docs=100)
    config = PrepareConfig(inputs=[str(corpus)], out=str(tmp_path / "given"), workers=1, unit_size=UNIT, **opts)
    r = Run.of(config, 3)
    flag = r.work / "tokenize" / ENOUGH
    flag.parent.mkdir(parents=True)
    flag.write_bytes(b"")
    with pytest.raises(unitfiles.Abandoned):
        r.do("tokenize", 2, UnitStop(None, None, flag))
    assert sorted(p.name for p in flag.parent.iterdir()) == [ENOUGH]
    prepare(PrepareConfig(inputs=[str(corpus)], out=str(tmp_path / "one"), workers=1, **opts))
    monkeypatch.setattr(plainplan, "POOL_BYTES", 0)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_LATE_UNITS)
    path = [str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    monkeypatch.setenv("LMSHARD_TEST_LATE_UNITS", "1")
    seen = _markers(monkeypatch)
    config = PrepareConfig(inputs=[str(corpus)], out=str(tmp_path / "pool"), workers=2, unit_size=UNIT, **opts)
    assert local_exec.run(config, 3).total_docs == 100
    assert _files(tmp_path / "pool") == _files(tmp_path / "one")
    assert _last_needed(corpus, seen["units"], 100, True) == 0
    first = seen["markers"][0]
    assert first["stopped"] == 1 and first["docs"] >= 100
    assert set(seen["markers"]) == {0} and not seen["named"] - {0}  # (every later unit given up: no file)


def test_a_bad_record_past_the_nth_kept_document_in_a_unit_started_early_is_never_an_error(tmp_path):
    """In the pool the second unit starts with the first (before it knows how many documents it
    lacks): the bad record on its 60th line, past the 5th kept document, fails it, as one process
    never reads so far. Its error waits for the first unit; then it runs again knowing it lacks 4,
    stops before that line, and the run ends as one process ends, byte for byte. Items of 2 KiB,
    so that one process stops before the bad line too."""
    import subprocess

    from proctree import LMSHARD

    texts = make_texts(500, seed=2)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text(json.dumps({"text": texts[0]}) + "\n")
    lines = [json.dumps({"text": t}) for t in texts[1:400]]
    lines[59] = "{not json"
    (tmp_path / "in" / "b.jsonl").write_text("\n".join(lines) + "\n")
    env = {**__import__("os").environ, "LMSHARD_BLOCK_BYTES": "2048", "LMSHARD_POOL_BYTES": "0"}
    for name, extra in (("one", ["--workers", "1"]), ("pool", ["--workers", "2", "--num-tasks", "2", "--unit-size",
                                                                "64K"])):  # fmt: skip
        done = subprocess.run([*LMSHARD, "prepare", str(tmp_path / "in"), "--out", str(tmp_path / name), "--max-docs",
                               "5", "--val-fraction", "0", *extra], capture_output=True, text=True, env=env,
                              timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert _files(tmp_path / "pool") == _files(tmp_path / "one")
    assert json.loads((tmp_path / "one" / "dataset_metadata.json").read_text())["n_docs"] == 5


def test_an_input_changed_past_the_nth_kept_document_is_never_read_as_in_one_process(tmp_path, monkeypatch):
    """The second unit (the first range of b.jsonl) starts in the pool with the first, which
    holds the 5 documents; b.jsonl changed after the plan was made, so that unit fails (the plan
    refuses a changed input). Its error waits, and is dropped once the first unit holds the N:
    one process never opens b.jsonl either. The bytes are one process's."""
    (tmp_path / "in").mkdir()
    jsonl(tmp_path / "in" / "a.jsonl", make_texts(10, seed=3))
    b = jsonl(tmp_path / "in" / "b.jsonl", make_texts(400, seed=4))
    assert b.stat().st_size > UNIT
    opts = dict(OPTS, max_docs=5, val_fraction=0.0)
    prepare(PrepareConfig(inputs=[str(tmp_path / "in")], out=str(tmp_path / "one"), workers=1, **opts))
    real = local_exec._planned

    def planned(*args, **kwargs):
        r = real(*args, **kwargs)
        with open(b, "a") as f:
            f.write(json.dumps({"text": "written after the plan"}) + "\n")
        return r

    monkeypatch.setattr(local_exec, "_planned", planned)
    monkeypatch.setattr(plainplan, "POOL_BYTES", 0)
    seen = _markers(monkeypatch)
    config = PrepareConfig(inputs=[str(tmp_path / "in")], out=str(tmp_path / "pool"), workers=2, unit_size=UNIT, **opts)
    assert local_exec.run(config, 2).total_docs == 5
    one, pool = _files(tmp_path / "one"), _files(tmp_path / "pool")
    meta = json.loads(pool.pop("dataset_metadata.json"))
    assert meta["sources"][1].pop("grew") == 1  # (it did grow while the run was going: said as one process says it)
    assert json.loads(one.pop("dataset_metadata.json")) == meta and pool == one
    assert [u[1] for u in seen["units"][:2]] == ["file", "range"] and 1 not in seen["named"]


def test_a_compressed_file_is_read_here_and_tokenized_by_every_worker_up_to_the_nth_kept_document(
        tmp_path, monkeypatch):  # fmt: skip
    """A .gz file is one unit, larger than a worker's share: once the unit before it is done (by
    a worker), it is read in the main process and its work items of 4 KiB tokenized in the pool
    (none by the reader), and it stops after the item that holds the N-th kept document, as one
    process does (its marker says `stopped`). A bad record 2 to 4 items after that one is read
    ahead by the pool's window, and is no error, as in one process. The bytes are one process's."""
    import gzip

    import lmshard.prepare.documents.sources as sources
    from lmshard.prepare.execution import itempool
    from lmshard.prepare.execution.run import Run

    monkeypatch.setattr(sources, "BLOCK_BYTES", 1 << 12)  # work items of 4 KiB: many in the file
    monkeypatch.setenv("LMSHARD_BLOCK_BYTES", str(1 << 12))  # (as workers started afresh read it)
    (tmp_path / "in").mkdir()
    jsonl(tmp_path / "in" / "a.jsonl", make_texts(10, seed=3))
    lines = [json.dumps({"text": t}) + "\n" for t in make_texts(3000, seed=4)]
    n = 300  # the 290th line of the .gz holds the N-th kept document (the texts are distinct)
    offsets = [0, *itertools.accumulate(len(line) for line in lines)]
    bad = next(i for i, at in enumerate(offsets) if at >= offsets[n - 10] + (10 << 10))
    assert offsets[bad] < offsets[n - 10] + (14 << 10)  # 2 to 4 items of 4 KiB after the N-th document's
    lines[bad] = "{not json\n"
    (tmp_path / "in" / "b.jsonl.gz").write_bytes(gzip.compress("".join(lines).encode(), mtime=0))
    opts = dict(OPTS, max_docs=n)
    one = prepare(PrepareConfig(inputs=[str(tmp_path / "in")], out=str(tmp_path / "one"), workers=1, **opts))
    assert one.total_docs == n
    monkeypatch.setattr(plainplan, "POOL_BYTES", 0)
    spreads, do = [], Run.do
    monkeypatch.setattr(Run, "do", lambda r, stage, i, stop=None, spread=None: (spreads.append(
        (stage, i, stop is not None)) if spread is not None else None) or do(r, stage, i, stop, spread))  # fmt: skip
    monkeypatch.setattr(unitfiles, "run_item", lambda *a: pytest.fail("an item tokenized by the reader"))
    submitted, submit = [], itempool._submit  # (the work items handed to the pool)
    monkeypatch.setattr(itempool, "_submit", lambda pool, stage, fn, *args: submitted.extend(
        getattr(a, "payload", b"") for a in args) or submit(pool, stage, fn, *args))  # fmt: skip
    seen = _markers(monkeypatch)
    assert prepare(PrepareConfig(inputs=[str(tmp_path / "in")], out=str(tmp_path / "two"), workers=2, unit_size=UNIT,
                                 **opts)).total_docs == n  # fmt: skip
    assert spreads == [("tokenize", 1, True)] and [u[1] for u in seen["units"]] == ["file", "file"]
    assert seen["markers"][0]["docs"] == 10 and seen["markers"][1]["stopped"] == 1
    assert n - 10 <= seen["markers"][1]["docs"] < bad and any(b"{not json" in p for p in submitted)  # (read ahead)
    assert _files(tmp_path / "two") == _files(tmp_path / "one")


def test_units_from_the_first_never_read_count_as_done_for_every_caller(tmp_path, corpus):
    """Once `tokenize/enough` names the first unit never read, the tokenize and select stages
    list no unit from it on as missing, whether asked for all their units (a run) or for a
    task's (`status`, `run-task`); before it, every unit is missing."""
    import json as json_

    from lmshard.prepare.execution.maxdocs import ENOUGH
    from lmshard.prepare.execution.run import Run

    config = PrepareConfig(inputs=[str(corpus)], out=str(tmp_path / "o"), workers=1, unit_size=UNIT, **OPTS,
                           max_docs=100)  # fmt: skip
    r = Run.of(config, 3)
    units = list(range(r.n_units))
    assert r.missing("tokenize") == units == r.missing("select", range(r.n_units)) and len(units) > 10
    (r.work / "tokenize").mkdir(parents=True, exist_ok=True)
    (r.work / "tokenize" / ENOUGH).write_text(json_.dumps({"from": 5}))
    for stage in ("tokenize", "select"):
        assert r.missing(stage) == r.missing(stage, range(r.n_units)) == units[:5]
        assert r.missing(stage, range(3, 9)) == [3, 4]
