"""Scale-out stages: the same corpus prepared on one machine and as N tasks (tokenize, dedup
buckets, select, write pieces, finish) gives byte-identical shards and metadata, timings aside;
so does a plain prepare that runs the stages in its worker pool."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess

import numpy as np
import pytest
from proctree import LMSHARD, finish, signal_stopped, wait_stopped
from test_prepare import jsonl, make_texts

import lmshard.prepare.execution.barrier as barrier
import lmshard.prepare.execution.layout as layout
import lmshard.prepare.execution.stages as stages_module
import lmshard.prepare.output.build as build
from lmshard.errors import ConfigError, InputError
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.execution import local_exec, plainplan, taskplan
from lmshard.prepare.execution.layout import STREAMS
from lmshard.prepare.execution.layoutfiles import Layout
from lmshard.prepare.execution.stages import STAGES, Run, plan_run, run_task
from lmshard.prepare.execution.taskplan import load_plan, work_dir
from lmshard.prepare.execution.units import _WINDOW


def _corpus(tmp):
    texts = make_texts(1500, seed=21)
    repeats = texts[:40]  # duplicates straddling files, units and tasks
    jsonl(tmp / "in" / "a.jsonl", texts[:900] + repeats)
    jsonl(tmp / "in" / "b.jsonl", repeats + texts[900:])
    (tmp / "in" / "c.txt").write_text("\n\n".join(texts[:30] + [f"para {i} " * 40 for i in range(600)]) + "\n")
    (tmp / "in" / "d.jsonl").write_text('{"text": "fine"}\n{"oops": 1}\n{"text": ""}\nnot json\n')
    return tmp / "in"


def _files(root):
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "dataset_metadata.json":
                meta = json.loads(data)
                meta.pop("run")
                data = json.dumps(meta, sort_keys=True).encode()
            out[p.relative_to(root).as_posix()] = data
    return out


def _cli(cwd, **extra):
    """`lmshard ARGS` in `cwd`, with units of 64 KiB (so the files are cut) unless `extra` says."""
    env = os.environ | {"LMSHARD_UNIT_BYTES": str(_WINDOW)} | extra
    return lambda *args: subprocess.run([*LMSHARD, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                                        env=env)  # fmt: skip


def _here(monkeypatch, cwd):
    """`run_task(stage, task)` in this process for the plan `prepare --out dist` made in `cwd`
    (the plan names --out as the command line gave it: run from there)."""
    monkeypatch.chdir(cwd)
    config, n_tasks, unit_bytes = stages_module.config_of("dist")
    return lambda stage, task: run_task(config, n_tasks, stage, task, unit_bytes)


def _hold(cwd, args, stop_at):
    """`lmshard ARGS` in a session of its own, stopped by itself at LMSHARD_STOP_AT=stop_at."""
    env = os.environ | {"LMSHARD_UNIT_BYTES": str(_WINDOW), "LMSHARD_STOP_AT": stop_at}
    proc = subprocess.Popen([*LMSHARD, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    assert wait_stopped(proc) == proc.pid
    return proc


def _small_key_files(monkeypatch, n):
    """Dedup key files of `n` keys, here and in any subprocess (layout.py imports the constant)."""
    monkeypatch.setenv("LMSHARD_KEYS_PER_FILE", str(n))
    monkeypatch.setattr(build, "KEYS_PER_FILE", n)
    monkeypatch.setattr(layout, "KEYS_PER_FILE", n)


_OPTS = dict(val_fraction=0.1, tokens_per_shard=5_000, on_error="skip")


@pytest.mark.parametrize(("n_tasks", "keys_per_file", "groups", "pairs"),
                         [(1, None, 1, None), (3, 400, 4, None), (7, 400, 32, None), (7, 400, 4, 4 * 7)])  # fmt: skip
def test_every_stage_as_tasks_in_any_order_equals_one_machine(tmp_path, monkeypatch, n_tasks, keys_per_file, groups,
                                                              pairs):  # fmt: skip
    """Every task of every stage, in reversed task order, then the finish: the one-machine
    bytes, with files cut into units, duplicates across units and tasks, shards of 5,000 tokens
    (c.txt is one document longer than that), when asked several dedup key files, and the 32
    dedup buckets resolved in one group (one task, one worker), a group per task, one per item
    (as a plan of many processes has them), or in fewer groups (as a plan of very many tasks)."""
    if keys_per_file:
        _small_key_files(monkeypatch, keys_per_file)
    if pairs is not None:
        monkeypatch.setattr(taskplan, "PAIRS", pairs)
    if groups == 32:  # (tasks of many workers each)
        real = taskplan.group_count
        monkeypatch.setattr(taskplan, "group_count", lambda b, t, size, processes: real(b, t, size, processes * 8))
    src = _corpus(tmp_path)
    local = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "local"), workers=1, **_OPTS))
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "scaled"), workers=1, unit_size=_WINDOW, **_OPTS)
    local_exec.claim(config, n_tasks)
    for stage in STAGES[:-1]:
        for task in reversed(range(n_tasks)):  # any order
            run_task(config, n_tasks, stage, task, unit_bytes=_WINDOW)
    plan = load_plan(work_dir(config.out))
    assert (plan["buckets"], plan["groups"]) == (32, groups)
    assert len(plan["units"]) > 5  # the large files really were cut
    b_start = min(u for u, unit in enumerate(plan["units"]) if unit[0] == 1)
    assert n_tasks == 1 or plan["tasks"][0][1] <= b_start  # a.jsonl's first texts, repeated in b.jsonl by another task
    work = work_dir(config.out)  # the write stage's summary holds every piece's entry: the finish reads no piece file
    entries = json.loads((work / "done" / "write.json").read_text())["pieces"]
    assert len(entries) == len(Layout(work, plan["tasks"], STREAMS)["pieces"])
    assert run_task(config, n_tasks, "finish", 0, unit_bytes=_WINDOW) == 1
    assert not work_dir(config.out).exists()
    assert local.drops["duplicate"] >= 80 and local.drop_examples and local.splits["val"].shards
    assert any(s.n_docs == 1 and s.n_tokens > 5_000 for s in local.shards)
    assert len(local.dedup.files) == (-(-local.total_docs // keys_per_file) if keys_per_file else 1)
    local_files, scaled = _files(tmp_path / "local"), _files(tmp_path / "scaled")
    assert local_files.keys() == scaled.keys() and len(local_files) > 30
    for name in local_files:
        assert local_files[name] == scaled[name], name


def test_many_small_files_share_units_and_equal_one_machine(tmp_path):
    """A directory of many small files (whole text documents, JSON lines with a bad record, gzip,
    duplicates across files) around a large file that is cut: consecutive small files share a
    unit (so far fewer units than files), and every stage's tasks, in reversed order, give the
    one-machine bytes, drop examples named at their file and line included."""
    texts = make_texts(600, seed=31)
    root = tmp_path / "in"
    root.mkdir()
    for i in range(120):
        (root / f"a{i:03d}.txt").write_text(" ".join([texts[i % 100]] * 8))  # 20 duplicates across files, units
    for i in range(30):
        jsonl(root / f"b{i:03d}.jsonl", texts[100 + 3 * i : 103 + 3 * i])
    (root / "b007.jsonl").write_text('{"text": "fine"}\n{"oops": 1}\nnot json\n')
    jsonl(root / "c.jsonl", texts[200:] * 2)  # cut into ranges
    import gzip

    for i in range(20):
        (root / f"d{i:03d}.jsonl.gz").write_bytes(gzip.compress(json.dumps({"text": texts[i]}).encode() + b"\n"))
    local = prepare(PrepareConfig(inputs=[str(root)], out=str(tmp_path / "local"), workers=1, **_OPTS))
    config = PrepareConfig(inputs=[str(root)], out=str(tmp_path / "scaled"), workers=1, unit_size=_WINDOW, **_OPTS)
    local_exec.claim(config, 3)
    plan = load_plan(work_dir(config.out))
    kinds = [unit[1] for unit in plan["units"]]
    assert kinds.count("files") >= 3 and "range" in kinds and len(kinds) < 60  # (191 files)
    assert plan["units"][1][1] == "files" and plan["units"][1][0] > 0  # (whole text files after the first unit's)
    for stage in STAGES[:-1]:
        for task in reversed(range(3)):
            run_task(config, 3, stage, task, unit_bytes=_WINDOW)
    assert run_task(config, 3, "finish", 0, unit_bytes=_WINDOW) == 1
    assert local.drops["duplicate"] >= 20 and any("b007.jsonl:2" in e for e in local.drop_examples.values())
    local_files, scaled = _files(tmp_path / "local"), _files(tmp_path / "scaled")
    assert local_files.keys() == scaled.keys()
    for name in local_files:
        assert local_files[name] == scaled[name], name


@pytest.mark.parametrize(("workers", "large"), [(1, True), (2, True), (3, True), (2, False)])
def test_a_plain_prepare_of_a_large_input_runs_the_stages_in_its_pool(tmp_path, monkeypatch, workers, large):
    """A plain prepare of a large input (no in-memory dedup table) writes the bytes of one
    worker's run: with several workers in the pool,
    planned 2 tasks of 4 units per worker, but one unit below ONE_UNIT_BYTES (every worker
    tokenizes it); with one worker in this process, in units of up to 64 MiB (one here). The
    work folder is gone afterwards."""
    _small_key_files(monkeypatch, 500)
    src = _corpus(tmp_path)
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "local"), workers=1, **_OPTS))
    monkeypatch.setattr(plainplan, "POOL_BYTES", 0)  # (in the pool)
    if large:
        monkeypatch.setattr(plainplan, "ONE_UNIT_BYTES", 0)
    calls, real = [], local_exec.run
    monkeypatch.setattr(local_exec, "run", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    units, stages, pooled, in_pool = [], local_exec._stages, [], local_exec.in_pool
    monkeypatch.setattr(local_exec, "_stages", lambda r, *a, **k: units.append(r.n_units) or stages(r, *a, **k))
    monkeypatch.setattr(local_exec, "in_pool", lambda pool, stage, *a: pooled.append(stage) or in_pool(pool, stage, *a))
    meta = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "staged"), workers=workers, **_OPTS))
    assert calls == [plainplan.TASKS_PER_WORKER * workers if workers > 1 and large else 1]
    assert (units == [1]) == (workers == 1 or not large) and units[0] >= 1, units
    assert pooled == ([] if workers == 1 or not large else ["keys", "dedup", "select", "write", "seal"]), pooled
    assert meta.run.dedup_table_bytes == 0
    assert not work_dir(tmp_path / "staged").exists() and not (tmp_path / ".staged.lmshard-partial").exists()
    assert _files(tmp_path / "local") == _files(tmp_path / "staged")


@pytest.mark.parametrize(("start", "options"), [("auto", {}), ("spawn", {"near_dedup": True}),
                                               ("auto", {"dedup_lines": True})])  # fmt: skip
def test_a_unit_larger_than_a_workers_share_is_tokenized_by_every_worker(tmp_path, monkeypatch, start, options):
    """A .gz file is one unit: one .gz file with 2 workers (a plain prepare, a task of 2 cores) is
    read in the main process and its work items tokenized in the pool (none here, in the unit's
    own code), in order: the bytes are one machine's, with forked or spawned workers, with
    near-duplicates and with repeated lines removed."""
    import gzip

    import lmshard.prepare.documents.sources as sources
    import lmshard.prepare.execution.itempool as itempool
    import lmshard.prepare.execution.linestage as linestage
    import lmshard.prepare.execution.unitfiles as unitfiles

    monkeypatch.setattr(sources, "BLOCK_BYTES", 1 << 12)  # work items of 4 KiB: many in the file
    monkeypatch.setenv("LMSHARD_BLOCK_BYTES", str(1 << 12))  # (as workers started afresh read it)
    monkeypatch.setenv("LMSHARD_WORKER_START", start)
    src = tmp_path / "in"
    src.mkdir()
    text = "".join(json.dumps({"text": t}) + "\n" for t in make_texts(1200, seed=5))
    (src / "part.jsonl.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    items = []
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "local"), workers=1, **options, **_OPTS), items.append)
    assert len(items) >= 8  # (one progress call per item)
    monkeypatch.setattr(plainplan, "POOL_BYTES", 0)
    monkeypatch.setattr(plainplan, "ONE_UNIT_BYTES", 0)  # (as a large .gz file: its later stages in the pool too)
    calls, real = [], local_exec.run
    monkeypatch.setattr(local_exec, "run", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    spreads, do, chained = [], Run.do, itempool._Chain.results
    monkeypatch.setattr(Run, "do", lambda r, stage, i, stop=None, spread=None: (
        spreads.append(stage) if spread is not None else None) or do(r, stage, i, stop, spread))  # fmt: skip
    monkeypatch.setattr(itempool._Chain, "results", lambda chain, u: spreads.append("tokenize") or chained(chain, u))
    spread_stages = ["lines", "tokenize"] if options.get("dedup_lines") else ["tokenize"]  # (of the one unit, 0)
    monkeypatch.setattr(unitfiles, "run_item", lambda *a: pytest.fail("an item tokenized by the reader"))
    monkeypatch.setattr(linestage, "hash_lines", lambda *a: pytest.fail("an item hashed by the reader"))
    steps = []
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "two"), workers=2, **options, **_OPTS), steps.append)
    assert calls and spreads == spread_stages
    assert len(steps) >= 8 and steps[-1].bytes_done == steps[-1].bytes_total  # the progress follows the items
    assert _files(tmp_path / "local") == _files(tmp_path / "two")
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "task"), workers=2, **options, **_OPTS)
    local_exec.claim(config, 1)  # a task of a node's cores (`run-task --workers 2`) spreads its one unit too
    for stage in Run.of(config, 1).stages:
        run_task(config, 1, stage, 0)
    assert spreads == spread_stages * 2 and _files(tmp_path / "local") == _files(tmp_path / "task")


@pytest.mark.parametrize(("sizes", "workers", "large"), [([100], 2, [0]), ([50, 50], 2, []), ([60, 20, 20], 2, []),
                                                         ([80, 10, 10], 2, [0]), ([30, 30, 20, 20], 4, []),
                                                         ([5, 90, 5], 4, [1]), ([100], 1, [])])  # fmt: skip
def test_a_unit_is_spread_over_the_workers_when_larger_than_half_again_a_share(sizes, workers, large):
    from types import SimpleNamespace

    from lmshard.prepare.execution.itempool import large_units

    r = SimpleNamespace(plan={"units": [(0, "file", 0, 0, n) for n in sizes]})
    assert large_units(r, list(range(len(sizes))), workers) == large
    streamed = SimpleNamespace(plan={"units": [(0, "shard", 0, 1, 1), *r.plan["units"]]})
    assert large_units(streamed, list(range(len(sizes) + 1)), workers) == []  # (a stream's shards: not bytes)


def test_a_stage_waits_for_the_one_before_and_a_killed_task_redoes_only_its_item(tmp_path):
    """Each stage refuses to start before the stage above is complete, naming it; a task killed
    before its last item (its other items' markers written, no mark of its own) redoes that item
    only when run again; a changed --num-tasks is refused. The result is still one machine's
    bytes."""
    src = _corpus(tmp_path)
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "local"), workers=1, **_OPTS))
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "scaled"), workers=1, unit_size=_WINDOW, **_OPTS)
    local_exec.claim(config, 3)
    r = Run.of(config, 3, _WINDOW)
    for before, stage in zip(STAGES[:3], STAGES[1:4], strict=True):
        owner = 1  # (the refusal names the task left, not its item)
        for task in (0, 2):
            run_task(config, 3, before, task, _WINDOW)
        for i in r.items(before, owner)[:-1]:  # the owner killed before its last item
            r.do(before, i)
        with pytest.raises(InputError, match=f"the {stage} stage needs the {before} stage complete; 1 .* are not done "
                           rf"\(tasks {owner}\); run `lmshard run-task --stage {before} --task I "):
            run_task(config, 3, stage, 0, _WINDOW)
        assert [run_task(config, 3, before, t, _WINDOW) for t in range(3)] == [t == owner for t in range(3)]
    # The write stage: a task that never ran (its parts' markers absent, their pieces unsealed).
    assert [run_task(config, 3, "write", t, _WINDOW) for t in (1, 2)] == [len(r.items("write", t)) for t in (1, 2)]
    first = len(r.items("write", 0))
    with pytest.raises(InputError, match=rf"the finish stage needs the write stage complete; {first} .*\(tasks 0\)"):
        run_task(config, 3, "finish", 0, _WINDOW)
    assert run_task(config, 3, "write", 0, _WINDOW) == first
    assert [run_task(config, 3, "write", t, _WINDOW) for t in range(3)] == [0, 0, 0]
    work = work_dir(config.out)  # each task removed what its mark made redundant: the finish removes little
    assert not list(work.glob("tokenize/*")) and not list(work.glob("select/*")) and not list(work.glob("keys/*"))
    assert {p.name.split("_")[0] for p in (work / "write").iterdir()} == {"piece"}
    forgotten = [p for p in work.glob("done/*/0_*/*") if not p.match("done/write/*/*")]
    assert not forgotten  # the next stage's tasks forgot their marks
    with pytest.raises(ConfigError, match="--num-tasks was 3 and is 4 now"):
        run_task(config, 4, "tokenize", 0, _WINDOW)
    run_task(config, 3, "finish", 0, _WINDOW)
    assert _files(tmp_path / "local") == _files(tmp_path / "scaled")


def _selected(tmp_path, n_tasks, killed_fold=False):
    """The corpus prepared by one process into `local`, and planned for `n_tasks` tasks into
    `scaled` with every task of the tokenize, dedup and select stages run: its config.
    `killed_fold`: the last select task is killed as it writes the stage's summary (its mark
    and its units' fates written, the fold of the marks not)."""
    src = _corpus(tmp_path)
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "local"), workers=1, **_OPTS))
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "scaled"), workers=1, unit_size=_WINDOW, **_OPTS)
    local_exec.claim(config, n_tasks)
    for stage in STAGES[:3]:
        for task in range(n_tasks):
            if killed_fold and (stage, task) == ("select", n_tasks - 1):
                def killed(path, summary, real=barrier._write):
                    if path.name == "select.json":
                        raise SystemExit(9)
                    real(path, summary)

                with pytest.MonkeyPatch.context() as m, pytest.raises(SystemExit):
                    m.setattr(barrier, "_write", killed)
                    run_task(config, n_tasks, stage, task, _WINDOW)
                continue
            run_task(config, n_tasks, stage, task, _WINDOW)
    return config


def test_a_piece_is_sealed_by_one_task_and_a_dead_sealers_claim_is_taken_over_by_the_finish(tmp_path):
    """Two tasks that complete a piece together: the one that claimed the seal seals it, the other
    leaves it (its seal returns False, no marker); a claim left by a sealer that died is taken
    over by the finish, and the dataset is one machine's."""
    config = _selected(tmp_path, 2)
    r = Run.of(config, 2, _WINDOW)
    first, end = r.layout()["pieces"][0][4]
    for p in range(first, end):
        assert r.do("write", p)
    claim = work_dir(config.out) / "write" / "piece_000000.sealing"
    claim.touch()  # another task is sealing piece 0 (or died doing so)
    assert not r.do("seal", 0) and not (work_dir(config.out) / "write" / "piece_000000.json").exists()
    for task in range(2):
        run_task(config, 2, "write", task, _WINDOW)
    assert claim.exists()  # no write task sealed it
    sealer = subprocess.Popen(["sleep", "600"])  # a sealer that still runs on this host: the finish waits for it
    try:
        claim.write_text(f"{socket.gethostname()} {sealer.pid}\n")
        with pytest.raises(InputError, match=f"piece 0 of the dataset is being sealed by pid {sealer.pid}"):
            run_task(config, 2, "finish", 0, _WINDOW)
    finally:
        sealer.kill()
        sealer.wait()
    run_task(config, 2, "finish", 0, _WINDOW)  # the sealer is gone: its claim is taken over
    assert _files(tmp_path / "local") == _files(tmp_path / "scaled")


def test_a_select_stage_marked_but_not_folded_is_folded_by_the_write_tasks(tmp_path):
    """Every select task marked its share (the first two removed their units' markers), but the
    last was killed as it folded the marks into the stage's summary: `status` says the write stage
    can start, a write task makes the summary from the tasks' marks, and the dataset is one
    machine's."""
    config = _selected(tmp_path, 3, killed_fold=True)
    work = work_dir(config.out)
    assert not (work / "done" / "select.json").exists() and not (work / "layout.json").exists()
    assert len(list(work.glob("done/select/*/*.json"))) == 3  # the tasks' marks, not folded
    said = _cli(tmp_path)("status", "scaled").stdout
    assert "write: not started (its first task lays the shards out); run: lmshard run-task --stage write" in said, said
    for task in (2, 0, 1):
        run_task(config, 3, "write", task, _WINDOW)
    run_task(config, 3, "finish", 0, _WINDOW)
    assert _files(tmp_path / "local") == _files(tmp_path / "scaled")


def test_the_write_stage_needs_a_claimed_build(tmp_path):
    """Tasks can tokenize, dedup and select without a claim, but nothing is written into --out's
    staging directory before `prepare --num-tasks` claimed it."""
    src = _corpus(tmp_path)
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "scaled"), workers=1, unit_size=_WINDOW, **_OPTS)
    for stage in STAGES[:3]:
        run_task(config, 2, stage, 0, _WINDOW)
        run_task(config, 2, stage, 1, _WINDOW)
    with pytest.raises(InputError, match="no build is claimed for this plan"):
        run_task(config, 2, "write", 0, _WINDOW)
    assert not (tmp_path / "scaled").exists() and not (tmp_path / ".scaled.lmshard-partial").exists()


def test_the_command_line_plans_runs_every_stage_reports_status_and_finishes(tmp_path, monkeypatch):
    """`prepare --num-tasks 4 --executor none`, `run-task` for every stage's tasks in any order,
    `status` naming the task still missing and the stages waiting, an early finish refused in
    one line, `status` done at the end: the bytes of a local prepare; so does `--num-tasks 3`
    with the local executor and --workers 2."""
    src = _corpus(tmp_path)
    run = _cli(tmp_path)
    common = [str(src), "--workers", "1", "--on-error", "skip", "--tokens-per-shard", "5000"]
    assert run("prepare", *common, "--out", "local").returncode == 0
    planned = run("prepare", *common, "--out", "dist", "--num-tasks", "4", "--executor", "none")
    assert planned.returncode == 0 and "lmshard run-task --stage tokenize --task I dist" in planned.stdout
    assert "lmshard run-task --stage finish dist" in planned.stdout, planned.stdout
    assert (tmp_path / ".dist.lmshard-partial").is_dir()  # claimed
    plan = load_plan(work_dir(tmp_path / "dist"))
    assert all(b > a for a, b in plan["tasks"]), plan["tasks"]  # no task is empty
    for task in (3, 1, 2):
        assert run("run-task", "--stage", "tokenize", "--task", str(task), "dist").returncode == 0
    waiting = run("status", "dist").stdout
    n0 = plan["tasks"][0][1] - plan["tasks"][0][0]
    assert "tokenize: 3 of 4 tasks complete" in waiting, waiting
    assert f"  task 0: 0 of {n0}; run: lmshard run-task --stage tokenize --task 0 dist\n" in waiting, waiting
    assert "dedup: waits for the stages above" in waiting and "finish: waits for the stages above" in waiting
    early = run("run-task", "--stage", "finish", "dist")
    assert early.returncode == 1 and "Traceback" not in early.stderr, early.stderr
    assert len(early.stderr.strip().splitlines()) == 1 and "the finish stage needs the" in early.stderr, early.stderr
    assert run("run-task", "--stage", "tokenize", "--task", "0", "dist").returncode == 0
    here = _here(monkeypatch, tmp_path)  # (3 of each stage's tasks run in this process)
    for stage in STAGES[1:-1]:
        for task in (2, 0, 3):
            here(stage, task)
        assert run("run-task", "--stage", stage, "--task", "1", "dist").returncode == 0
        assert f"{stage}: 4 of 4 tasks complete" in run("status", "dist").stdout
    assert "finish: not run; run: lmshard run-task --stage finish dist" in run("status", "dist").stdout
    wrong = run("run-task", "--stage", "write", "--task", "9", "dist")
    assert wrong.returncode == 1 and "task 9 is not in [0, 4)" in wrong.stderr, wrong.stderr
    assert run("run-task", "--stage", "finish", "dist").returncode == 0
    assert run("status", "dist").stdout == "done: the dataset is complete; check it with: lmshard inspect dist\n"
    local = _files(tmp_path / "local")
    assert local == _files(tmp_path / "dist") and len(local) > 30
    here = run("prepare", *common[:1], "--on-error", "skip", "--tokens-per-shard", "5000", "--workers", "2",
               "--out", "here", "--num-tasks", "3")  # fmt: skip
    assert here.returncode == 0, here.stderr
    assert _files(tmp_path / "here") == local


def test_a_task_with_several_workers_hands_its_items_to_the_pool(tmp_path, monkeypatch):
    """A task whose config has 2 workers (`run-task --workers 2`: a node's cores) gives its items
    to a pool of its own (every stage but the finish), and the result is one machine's bytes;
    `--workers 0` is refused in one line."""
    src = _corpus(tmp_path)
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "local"), workers=1, **_OPTS))
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "wide"), workers=2, unit_size=_WINDOW, **_OPTS)
    local_exec.claim(config, 2)
    pooled, real = [], stages_module.run_items
    monkeypatch.setattr(stages_module, "run_items", lambda r, stage, items, w: (pooled.append((stage, w)),
                                                                              real(r, stage, items, w))[1])  # fmt: skip
    for stage in STAGES:
        for task in range(2 if stage != "finish" else 1):
            run_task(config, 2, stage, task, _WINDOW)
    assert {stage for stage, _ in pooled} == set(STAGES[:-1]) and {w for _, w in pooled} == {2}
    assert _files(tmp_path / "local") == _files(tmp_path / "wide")
    bad = _cli(tmp_path)("run-task", "--stage", "tokenize", "--task", "0", "--workers", "0", "wide")
    assert bad.returncode == 1 and "--workers 0: pass 1 or more" in bad.stderr, bad.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_the_local_executor_goes_on_with_items_done_before(tmp_path, monkeypatch, workers):
    """A claimed run whose task 1 was tokenized by run-task (or by a run that was killed),
    resumed by the local executor: those units are not tokenized again, and the bytes are one
    machine's."""
    src = _corpus(tmp_path)
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "local"), workers=1, **_OPTS))
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "scaled"), workers=workers, unit_size=_WINDOW,
                           resume=True, **_OPTS)  # fmt: skip
    local_exec.claim(config, 3)
    run_task(config, 3, "tokenize", 1, _WINDOW)
    tok = work_dir(config.out) / "tokenize"
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in tok.glob("unit_*.done")}
    plan_units = load_plan(work_dir(config.out))["units"]
    assert 0 < len(before) < len(plan_units)
    seen, real = {}, local_exec.finish

    def finish_seen(config, paths, work, *rest):  # the markers as the finish finds them
        seen.update({p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (work / "tokenize").glob("*.done")})
        return real(config, paths, work, *rest)

    monkeypatch.setattr(local_exec, "finish", finish_seen)
    local_exec.run(config, 3, _WINDOW)
    assert len(seen) == len(plan_units) and {k: seen[k] for k in before} == before
    assert not work_dir(config.out).exists()
    assert _files(tmp_path / "local") == _files(tmp_path / "scaled")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_task_killed_or_stopped_midway_is_named_by_status_and_its_rerun_completes(tmp_path, monkeypatch, sig):
    """A real SIGKILL, or the SIGTERM of scancel or a time limit, to a `run-task` process after
    3 of its units: `status` names the task (died, or stopped by SIGTERM: recorded, not left
    "running"), a stopped task exits 143 in one line, and re-running only that task finishes
    the rest; the dataset equals one machine's."""
    src = tmp_path / "in"
    jsonl(src / "big.jsonl", make_texts(6_000, seed=5))  # ~20 units of 64 KiB
    run = _cli(tmp_path)
    assert run("prepare", str(src), "--workers", "1", "--out", "local").returncode == 0
    assert run("prepare", str(src), "--workers", "1", "--out", "dist", "--num-tasks", "2",
               "--executor", "none").returncode == 0  # fmt: skip
    first, end = load_plan(work_dir(tmp_path / "dist"))["tasks"][0]
    assert end - first > 4
    proc = _hold(tmp_path, ["run-task", "--stage", "tokenize", "--task", "0", "dist"], "unit:3")
    signal_stopped(proc.pid, sig)
    code, err = finish(proc, 120)
    assert len(list((work_dir(tmp_path / "dist") / "tokenize").glob("unit_*.done"))) == 3
    assert run("run-task", "--stage", "tokenize", "--task", "1", "dist").returncode == 0
    shown = run("status", "dist").stdout
    assert "run: lmshard run-task --stage tokenize --task 0 dist" in shown and "task 1:" not in shown, shown
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL and f"task 0: 3 of {end - first} (died on " in shown, shown
    else:
        assert code == 143 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert f"tokenize task 0 stopped by SIGTERM with 3 of {end - first} done" in err, err
        assert "run the same command again" in err, err
        state = json.loads((work_dir(tmp_path / "dist") / "tasks" / "tokenize_000000.json").read_text())
        assert state["state"] == "stopped" and state["signal"] == "SIGTERM" and state["pid"] == proc.pid
        assert f"task 0: 3 of {end - first} (stopped on " in shown and f"(pid {proc.pid}) by SIGTERM" in shown
    redo = run("run-task", "--stage", "tokenize", "--task", "0", "dist")
    assert redo.returncode == 0 and f"tokenize task 0: {end - first - 3} units tokenized" in redo.stderr, redo.stderr
    again = run("run-task", "--stage", "tokenize", "--task", "0", "dist")  # (a retried job: nothing left)
    said = f"tokenize task 0: nothing to do, its {end - first} units were done before"
    assert again.returncode == 0 and said in again.stderr, again.stderr
    here = _here(monkeypatch, tmp_path)
    for stage in STAGES[1:-1]:
        for task in (1, 0):
            here(stage, task)
    assert here("finish", 0) == 1
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")


def test_a_write_task_stopped_by_sigterm_goes_on_when_its_command_is_run_again(tmp_path, monkeypatch):
    """A write task stopped after 2 of its parts of shards: exit 143, the parts written are kept
    (not written again), the re-run writes the rest and seals the shards, and the dataset is one
    machine's."""
    src = _corpus(tmp_path)
    run = _cli(tmp_path)
    common = [str(src), "--workers", "1", "--on-error", "skip", "--tokens-per-shard", "5000"]
    assert run("prepare", *common, "--out", "local").returncode == 0
    assert run("prepare", *common, "--out", "dist", "--num-tasks", "2", "--executor", "none").returncode == 0
    here = _here(monkeypatch, tmp_path)
    for stage in STAGES[:3]:
        for task in (0, 1):
            here(stage, task)
    work = work_dir(tmp_path / "dist")
    n = len(Layout(work, load_plan(work)["tasks"], STREAMS)["tasks"][0])
    assert n > 3
    proc = _hold(tmp_path, ["run-task", "--stage", "write", "--task", "0", "dist"], "part:2")
    signal_stopped(proc.pid, signal.SIGTERM)
    code, err = finish(proc, 120)
    assert code == 143 and f"write task 0 stopped by SIGTERM with 2 of {n} done" in err, err
    assert "Traceback" not in err and not (tmp_path / "dist").exists()
    again = run("run-task", "--stage", "write", "--task", "0", "dist")
    assert again.returncode == 0 and f"write task 0: {n - 2} parts" in again.stderr, again.stderr
    assert run("run-task", "--stage", "write", "--task", "1", "dist").returncode == 0
    assert run("run-task", "--stage", "finish", "dist").returncode == 0
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")


def test_a_finish_signalled_in_its_swap_completes_and_its_command_again_has_nothing_to_do(tmp_path):
    """SIGTERM to the finish just after the build was renamed to --out: taken once the swap and
    the work folder's removal are done, it stops the task (exit 143) with nothing left beside the
    dataset; `status` says done, and its command, run again, has nothing to do."""
    src = _corpus(tmp_path)
    run = _cli(tmp_path)
    common = [str(src), "--workers", "1", "--on-error", "skip"]
    assert run("prepare", *common, "--out", "local").returncode == 0
    assert run("prepare", *common, "--out", "dist", "--num-tasks", "1", "--executor", "none").returncode == 0
    for stage in STAGES[:-1]:
        assert run("run-task", "--stage", stage, "--task", "0", "dist").returncode == 0
    proc = _hold(tmp_path, ["run-task", "--stage", "finish", "dist"], "swap:1")
    signal_stopped(proc.pid, signal.SIGTERM)
    code, err = finish(proc, 120)
    assert code == 143 and "Traceback" not in err, err
    assert run("status", "dist").stdout.startswith("done: the dataset is complete")
    assert not (tmp_path / ".dist.lmshard-work").exists()
    again = run("run-task", "--stage", "finish", "dist")
    assert again.returncode == 0, again.stderr
    assert run("status", "dist").stdout.startswith("done: the dataset is complete")
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")


def test_units_are_sized_to_the_task_count_and_unit_size_is_an_option(tmp_path, monkeypatch):
    """8 tasks over a few MB each get units (64 MiB units would give one task everything); an
    explicit --unit-size is the plan's; the output is one machine's bytes either way."""
    import lmshard.prepare.execution.units as units

    monkeypatch.setattr(units, "UNIT_BYTES", 64 << 20)  # the default, whatever LMSHARD_UNIT_BYTES says
    src = jsonl(tmp_path / "in" / "a.jsonl", make_texts(12_000, seed=9))
    size = src.stat().st_size
    plan, _, _ = plan_run(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "p8"), workers=1), 8)
    assert plan["unit_bytes"] == -(-size // 32) and len(plan["units"]) >= 8
    assert all(end > first for first, end in plan["tasks"])  # no task without work
    plan, _, _ = plan_run(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "u"), workers=1, unit_size=128 << 10), 2)
    assert plan["unit_bytes"] == 128 << 10 and len(plan["units"]) == -(-size // (128 << 10))
    env = {k: v for k, v in os.environ.items() if k != "LMSHARD_UNIT_BYTES"}
    lmshard = [*LMSHARD, "prepare", str(src), "--workers", "1"]
    for args in (["--out", str(tmp_path / "one")], ["--out", str(tmp_path / "eight"), "--num-tasks", "8"],
                 ["--out", str(tmp_path / "sized"), "--num-tasks", "2", "--unit-size", "256K"]):  # fmt: skip
        done = subprocess.run([*lmshard, *args], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr
    assert _files(tmp_path / "one") == _files(tmp_path / "eight") == _files(tmp_path / "sized")
    for bad, words in (("12x", "pass a size in bytes"), ("16K", "pass at least 65,536 bytes")):
        done = subprocess.run([*lmshard, "--out", str(tmp_path / "bad"), "--num-tasks", "2", "--unit-size", bad],
                              capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
        assert done.returncode == 1 and words in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_an_input_changed_after_planning_is_named_not_the_unit_size(tmp_path):
    """The unit size was sized from the inputs when the plan was made: a later task keeps the
    plan's, so the refusal names what changed (the input), not a recomputed unit size; the
    planner (a prepare run again) names it too. A task that reads no changed input (another
    file) goes on: it checks only its own."""
    src = jsonl(tmp_path / "in" / "a.jsonl", make_texts(3_000, seed=2))
    other = jsonl(tmp_path / "in" / "b.jsonl", make_texts(3_000, seed=3))
    config = PrepareConfig(inputs=[str(src), str(other)], out=str(tmp_path / "o"), workers=1)
    plan, _, _ = plan_run(config, 4)
    with open(src, "a") as f:
        f.write('{"text": "one more document"}\n')
    reads_a = next(t for t in range(4) if plan["units"][plan["tasks"][t][0]][0] == 0)
    reads_b = next(t for t in range(4) if plan["units"][plan["tasks"][t][1] - 1][0] == 1 and
                   plan["units"][plan["tasks"][t][0]][0] == 1)  # fmt: skip
    with pytest.raises(ConfigError) as e:
        run_task(config, 4, "tokenize", reads_a)
    assert "unit size" not in str(e.value) and "a.jsonl changed after the run was planned" in str(e.value), e.value
    with pytest.raises(ConfigError) as e:
        plan_run(config, 4, loaded=local_exec.load_run(config))
    assert "unit size" not in str(e.value) and "a.jsonl" in str(e.value), str(e.value)
    assert run_task(config, 4, "tokenize", reads_b) > 0
    st = other.stat()
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # (touched: the same size, modified since)
    with pytest.raises(ConfigError, match=r"b\.jsonl changed after the run was planned \(the same size, modified"):
        run_task(config, 4, "tokenize", next(t for t in range(4) if t not in (reads_a, reads_b) and
                                             plan["units"][plan["tasks"][t][1] - 1][0] == 1))  # (another that reads b)


@pytest.mark.parametrize(("n_tasks", "keys_per_file", "encoding"), [(1, None, "uint32"), (3, 400, "uint32"),
                                                                    (3, 400, "uint16")])  # fmt: skip
def test_a_planned_append_equals_a_local_append(tmp_path, monkeypatch, n_tasks, keys_per_file, encoding):
    """--append as planned tasks (run in reversed order) equals a local --append, byte for byte:
    the new shards and key files numbered after the dataset's (whose files are linked in, the
    same inodes) and in its encoding, the documents that repeat one of the dataset's dropped (its
    key files shared out to the tokenize tasks), the metadata over both runs."""
    import shutil

    if keys_per_file:
        _small_key_files(monkeypatch, keys_per_file)
    texts = make_texts(1200, seed=5)
    first = jsonl(tmp_path / "first.jsonl", texts[:500])
    second = _corpus(tmp_path)
    jsonl(second / "e.jsonl", texts[450:700])  # 50 repeat the dataset's documents
    base = prepare(PrepareConfig(inputs=[str(first)], out=str(tmp_path / "base"), workers=1, shard_encoding=encoding,
                                 **_OPTS))  # fmt: skip
    for name in ("local", "planned"):
        shutil.copytree(tmp_path / "base", tmp_path / name, copy_function=os.link)
    local = prepare(PrepareConfig(inputs=[str(second)], out=str(tmp_path / "local"), workers=1, append=True, **_OPTS))
    config = PrepareConfig(inputs=[str(second)], out=str(tmp_path / "planned"), workers=1, append=True,
                           unit_size=_WINDOW, **_OPTS)  # fmt: skip
    local_exec.claim(config, n_tasks)
    plan = load_plan(work_dir(config.out))
    assert plan["previous"]["first"]["train"] == len(base.splits["train"].shards) > 0
    for stage in STAGES[:-1]:
        for task in reversed(range(n_tasks)):
            run_task(config, n_tasks, stage, task, unit_bytes=_WINDOW)
    assert run_task(config, n_tasks, "finish", 0, unit_bytes=_WINDOW) == 1
    assert local.drops["duplicate"] >= 80 + 50 and local.total_docs > base.total_docs
    assert len(local.dedup.files) > 1 and len(local.splits["train"].shards) > len(base.splits["train"].shards)
    local_files, planned = _files(tmp_path / "local"), _files(tmp_path / "planned")
    assert local_files.keys() == planned.keys()
    for name in local_files:
        assert local_files[name] == planned[name], name
    shard = base.splits["train"].shards[0].path
    assert (tmp_path / "planned" / shard).stat().st_ino == (tmp_path / "base" / shard).stat().st_ino


def test_an_append_in_the_local_pool_equals_a_local_append(tmp_path):
    """`prepare --append --num-tasks 2` run here (the local pool, as a large plain --append is):
    the dataset's files, totals and encoding (uint16) carried as by one process."""
    import shutil

    texts = make_texts(900, seed=9)
    first = jsonl(tmp_path / "first.jsonl", texts[:400])
    second = jsonl(tmp_path / "second.jsonl", texts[350:900])
    opts = dict(workers=2, val_fraction=0.1, tokens_per_shard=5_000)
    prepare(PrepareConfig(inputs=[str(first)], out=str(tmp_path / "one"), shard_encoding="uint16", **opts))
    shutil.copytree(tmp_path / "one", tmp_path / "pool", copy_function=os.link)
    one = prepare(PrepareConfig(inputs=[str(second)], out=str(tmp_path / "one"), append=True, **opts))
    pool = local_exec.run(PrepareConfig(inputs=[str(second)], out=str(tmp_path / "pool"), append=True,
                                        unit_size=_WINDOW, **opts), 2)  # fmt: skip
    assert one.drops["duplicate"] == 50 and pool.total_docs == one.total_docs > 850
    assert _files(tmp_path / "one") == _files(tmp_path / "pool")


@pytest.mark.parametrize("executor", ["local", "none"])
def test_a_planned_run_of_stdin_equals_the_one_process_run(tmp_path, monkeypatch, executor):
    """`prepare - --num-tasks 3` saves stdin in the work folder before planning, so its units
    are cut and read like a file's by any task: the one-process bytes, the input still named
    '-' (its bytes 0, its bad records '-:LINE'), and the saved copy gone with the work folder."""
    texts = make_texts(900, seed=8)
    lines = [json.dumps({"text": t}) for t in texts[:600] + texts[:50]] + ["not json", '{"oops": 1}']
    data = "\n".join(lines + [json.dumps({"text": t}) for t in texts[600:]]) + "\n"
    env = os.environ | {"LMSHARD_UNIT_BYTES": str(_WINDOW)}
    common = ["-", "--workers", "1", "--on-error", "skip", "--val-fraction", "0.1", "--tokens-per-shard", "5000"]

    def run(*args):
        return subprocess.run([*LMSHARD, "prepare", *common, *args], input=data, capture_output=True, text=True,
                              timeout=300, cwd=tmp_path, env=env)  # fmt: skip

    assert run("--out", "local").returncode == 0
    got = run("--out", "dist", "--num-tasks", "3", "--executor", executor, "--quiet")
    assert got.returncode == 0, got.stderr
    if executor == "none":  # tasks run elsewhere: here, in turn, from the saved copy (stdin is long gone)
        plan = load_plan(work_dir(tmp_path / "dist"))
        assert len(plan["units"]) > 3 and plan["sources"][0][0] == "-" and plan["sources"][0][-1]
        monkeypatch.chdir(tmp_path)  # (the plan records --out as given: dist)
        config, n_tasks, unit_bytes = stages_module.config_of(tmp_path / "dist")
        for stage in STAGES:
            for task in range(n_tasks if stage != "finish" else 1):
                run_task(config, n_tasks, stage, task, unit_bytes)
    meta = json.loads((tmp_path / "dist" / "dataset_metadata.json").read_text())
    assert meta["sources"][0]["path"] == "-" and meta["sources"][0]["bytes"] == 0 and meta["drops"]["duplicate"] == 50
    assert any(str(e).startswith("-:") for e in meta["drop_examples"].values()), meta["drop_examples"]
    assert _files(tmp_path / "local") == _files(tmp_path / "dist")
    assert not work_dir(tmp_path / "dist").exists()


def test_a_planned_run_of_a_pipe_finishes_after_the_pipe_is_gone(tmp_path):
    """A FIFO input (as `<(...)` gives) planned for 2 tasks: saved before planning, its units
    read from the copy, and the finish, run once the FIFO is gone (as on another node), names it
    from the plan without looking for it: the bytes of a one-process run of the same pipe."""
    import threading

    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    data = "".join(json.dumps({"text": t}) + "\n" for t in make_texts(600, seed=3) + make_texts(600, seed=3)[:30])

    def fed(run):
        feeder = threading.Thread(target=lambda: fifo.write_text(data))
        feeder.start()
        try:
            return run()
        finally:
            feeder.join()

    opts = dict(inputs=[str(fifo)], workers=1, val_fraction=0.1, tokens_per_shard=5_000)
    fed(lambda: prepare(PrepareConfig(out=str(tmp_path / "one"), **opts)))
    config = PrepareConfig(out=str(tmp_path / "tasks"), unit_size=_WINDOW, **opts)
    fed(lambda: local_exec.claim(config, 2))
    assert len(load_plan(work_dir(config.out))["units"]) > 2
    for stage in STAGES[:-1]:
        for task in range(2):
            run_task(config, 2, stage, task, _WINDOW)
    fifo.unlink()
    run_task(config, 2, "finish", 0, _WINDOW)
    assert json.loads((tmp_path / "tasks" / "dataset_metadata.json").read_text())["drops"]["duplicate"] == 30
    assert _files(tmp_path / "one") == _files(tmp_path / "tasks")


def test_the_python_api_runs_num_tasks_as_a_plan_here_and_refuses_other_executors(tmp_path):
    """prepare(num_tasks=N) plans N tasks and runs them here, as `--num-tasks N` does; another
    executor is the command line's, refused in one line before anything is written."""
    src = _corpus(tmp_path)
    seen = []
    real = local_exec.run
    meta = None

    def spy(config, n_tasks, *rest, **kw):
        seen.append(n_tasks)
        return real(config, n_tasks, *rest, **kw)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(local_exec, "run", spy)
        meta = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "tasks"), workers=1, num_tasks=3,
                                     unit_size=_WINDOW, **_OPTS))  # fmt: skip
    assert seen == [3]
    one = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "one"), workers=1, **_OPTS))
    assert _files(tmp_path / "tasks") == _files(tmp_path / "one") and meta.total_tokens == one.total_tokens
    with pytest.raises(ConfigError, match="executor 'local'.*--executor slurm"):
        prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "slurm"), num_tasks=3, executor="slurm"))
    assert not (tmp_path / "slurm").exists() and not work_dir(tmp_path / "slurm").exists()


def test_a_planned_run_that_keeps_nothing_equals_the_one_process_run(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    for name, kw in (("one", {"workers": 1}), ("many", {"num_tasks": 2, "workers": 2})):
        prepare(PrepareConfig(inputs=[str(tmp_path / "empty.jsonl")], out=str(tmp_path / name), allow_empty=True, **kw))
    assert _files(tmp_path / "one") == _files(tmp_path / "many")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl", "many", "one"]


def _boilerplate_corpus(tmp, seed=31, n=900):
    """Documents that share lines: a footer on every third, a header on every fifth, and lines
    of earlier documents quoted in later ones (across files, units and tasks)."""
    texts = make_texts(n, seed=seed)
    for i in range(0, n, 3):
        texts[i] += "\nShare this article with your friends\nCopyright 2024 Example Corp. All rights reserved."
    for i in range(0, n, 5):
        texts[i] = "Home | News | Sport | Weather\n" + texts[i]
    for i in range(7, n, 11):
        texts[i] += "\n" + texts[i - 7].splitlines()[-1]
    jsonl(tmp / "lines" / "a.jsonl", texts[: n // 2])
    jsonl(tmp / "lines" / "b.jsonl", texts[n // 2 :] + texts[:20])
    (tmp / "lines" / "c.txt").write_text("\n\n".join(t for t in texts[100:300]) + "\n")
    return tmp / "lines"


@pytest.mark.parametrize(("n_tasks", "keys_per_file", "dedup"), [(1, None, "document"), (3, 300, "document"),
                                                                 (7, 300, "none"), (3, 300, "near")])  # fmt: skip
def test_a_planned_dedup_lines_run_equals_one_machine(tmp_path, monkeypatch, n_tasks, keys_per_file, dedup):
    """--dedup-lines as planned tasks (the lines and linedup stages first, every stage's tasks
    in reversed order): the same lines removed, documents kept, shards, document and line key
    files (cut at the key file size) and metadata as one process, byte for byte; with
    --near-dedup too (the signatures of the documents as their lines left them)."""
    if keys_per_file:
        _small_key_files(monkeypatch, keys_per_file)
    src = _boilerplate_corpus(tmp_path)
    opts = dict(_OPTS, dedup_lines=True, dedup="document" if dedup == "near" else dedup, near_dedup=dedup == "near")
    local = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "local"), workers=1, **opts))
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "scaled"), workers=1, unit_size=_WINDOW, **opts)
    local_exec.claim(config, n_tasks)
    stages = stages_module.run_stages(config)
    assert stages[:3] == ("lines", "linedup", "tokenize")
    for stage in stages[:-1]:
        for task in reversed(range(n_tasks)):
            run_task(config, n_tasks, stage, task, unit_bytes=_WINDOW)
    plan = load_plan(work_dir(config.out))
    assert len(plan["units"]) > 3  # the files really were cut
    assert run_task(config, n_tasks, "finish", 0, unit_bytes=_WINDOW) == 1
    assert local.dedup.lines_removed > 600  # the footers, headers and quoted lines after their first
    lines = [f for f in local.dedup.files if f.kind == "line"]
    assert len(lines) == (-(-sum(f.n_keys for f in lines) // keys_per_file) if keys_per_file else 1)
    local_files, scaled = _files(tmp_path / "local"), _files(tmp_path / "scaled")
    assert local_files.keys() == scaled.keys()
    for name in local_files:
        assert local_files[name] == scaled[name], name
    unique = set()  # the line key files hold each distinct non-blank line once (a hand count from the inputs)
    for f in lines:
        unique.update(np.fromfile(tmp_path / "local" / f.path, dtype="<u8").tolist())
    assert len(unique) == sum(f.n_keys for f in lines)


@pytest.mark.parametrize("n_tasks", [1, 3])
def test_a_planned_dedup_lines_append_equals_a_local_append(tmp_path, monkeypatch, n_tasks):
    """--append --dedup-lines as planned tasks: the lines the dataset has seen are removed from
    the new documents (its line key files shared out to the lines tasks), and the new line key
    files are numbered after the dataset's, as a local --append does."""
    import shutil

    _small_key_files(monkeypatch, 200)
    first = _boilerplate_corpus(tmp_path / "first", seed=3, n=300)
    second = _boilerplate_corpus(tmp_path / "second", seed=4, n=600)
    opts = dict(_OPTS, dedup_lines=True)
    prepare(PrepareConfig(inputs=[str(first)], out=str(tmp_path / "base"), workers=1, **opts))
    for name in ("local", "planned"):
        shutil.copytree(tmp_path / "base", tmp_path / name, copy_function=os.link)
    local = prepare(PrepareConfig(inputs=[str(second)], out=str(tmp_path / "local"), workers=1, append=True, **opts))
    config = PrepareConfig(inputs=[str(second)], out=str(tmp_path / "planned"), workers=1, append=True,
                           unit_size=_WINDOW, **opts)  # fmt: skip
    local_exec.claim(config, n_tasks)
    for stage in stages_module.run_stages(config)[:-1]:
        for task in reversed(range(n_tasks)):
            run_task(config, n_tasks, stage, task, unit_bytes=_WINDOW)
    assert run_task(config, n_tasks, "finish", 0, unit_bytes=_WINDOW) == 1
    kinds = [f.kind for f in local.dedup.files]
    assert kinds.count("line") > 2 and local.dedup.lines_removed > 0
    assert _files(tmp_path / "local") == _files(tmp_path / "planned")


def test_a_dedup_lines_run_in_the_local_pool_equals_one_process_and_status_names_its_line_stages(tmp_path):
    """`prepare --dedup-lines --num-tasks 3 --workers 2` here (the local pool, as a large plain
    --dedup-lines prepare runs): one process's bytes; a plan run by hand shows the line stages
    first in `status` and in the commands `--executor none` prints."""
    src = _boilerplate_corpus(tmp_path)
    opts = dict(_OPTS, dedup_lines=True)
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "one"), workers=1, **opts))
    local_exec.run(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "pool"), workers=2, unit_size=_WINDOW,
                                 **opts), 3)  # fmt: skip
    assert _files(tmp_path / "one") == _files(tmp_path / "pool")
    cli = _cli(tmp_path)
    planned = cli("prepare", str(src), "--out", "hand", "--dedup-lines", "--num-tasks", "2", "--executor", "none",
                  "--val-fraction", "0.1", "--on-error", "skip")  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    said = [line.split()[3] for line in planned.stdout.splitlines() if "run-task --stage" in line]
    assert said == ["lines", "linedup", "tokenize", "dedup", "select", "write", "finish"]
    status = cli("status", "hand")
    assert status.stdout.splitlines()[0].startswith("lines: 0 of 2 tasks complete"), status.stdout
    early = cli("run-task", "--stage", "tokenize", "--task", "0", "hand")
    assert early.returncode != 0 and "needs the lines stage complete" in early.stderr, early.stderr


@pytest.mark.parametrize(("n_tasks", "extra"), [(3, {}), (1, {}), (7, {"near_dedup": True}), (3, {"dedup_lines": True}),
                                                (3, {"dedup": "none"})])  # fmt: skip
def test_a_planned_max_docs_run_equals_one_machine(tmp_path, n_tasks, extra):
    """--max-docs N as planned tasks: the first N kept documents, and the counts (records read,
    drops, duplicates, their examples) of what a one-process run reads up to the N-th kept
    document's record, byte for byte: N inside a unit, past a duplicate, at the last kept document,
    and beyond the input (with another dedup, N inside a unit, past a duplicate, at the last)."""
    src = _corpus(tmp_path)
    total = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "all"), workers=1, **_OPTS, **extra)).total_docs
    cuts = (7, 950, 1234, total, total + 5) if n_tasks == 3 and not extra else (950, total + 5) if not extra else \
        (7, 950, total)
    for n in cuts:
        opts = dict(_OPTS, max_docs=n, **extra)
        local = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / f"local{n}"), workers=1, **opts))
        config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / f"planned{n}"), workers=1, unit_size=_WINDOW,
                               **opts)  # fmt: skip
        local_exec.claim(config, n_tasks)
        for stage in stages_module.run_stages(config)[:-1]:
            for task in reversed(range(n_tasks)):
                run_task(config, n_tasks, stage, task, unit_bytes=_WINDOW)
        assert run_task(config, n_tasks, "finish", 0, unit_bytes=_WINDOW) == 1
        assert local.total_docs == min(n, total), n
        local_files, planned = _files(tmp_path / f"local{n}"), _files(tmp_path / f"planned{n}")
        assert local_files.keys() == planned.keys(), n
        for name in local_files:
            assert local_files[name] == planned[name], (n, name)
    if n_tasks != 3 or extra:
        return
    pool = local_exec.run(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "pool"), workers=2, unit_size=_WINDOW,
                                        **dict(_OPTS, max_docs=950, **extra)), 3)  # (the local pool: --num-tasks 3)
    assert pool.total_docs == min(950, total) and _files(tmp_path / "pool") == _files(tmp_path / "local950")


def test_status_names_a_task_whose_items_are_done_but_not_its_key_file(tmp_path, monkeypatch):
    """A lines task that hashed its units and then failed gathering their keys is not done:
    `status` lists it (with what is missing) and the run goes on from it, not from the next stage."""
    import lmshard.prepare.execution.run as run_module

    src = _boilerplate_corpus(tmp_path)
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "o"), workers=1, unit_size=_WINDOW, dedup_lines=True,
                           **_OPTS)  # fmt: skip
    local_exec.claim(config, 2)
    run_task(config, 2, "lines", 0)

    def out_of_memory(*args, **kw):
        raise MemoryError

    with monkeypatch.context() as m:
        m.setattr(run_module, "write_task_lines", out_of_memory)
        with pytest.raises(MemoryError):
            run_task(config, 2, "lines", 1)
    task = stages_module.status(config.out)["stages"]["lines"]["tasks"][1]
    assert task["done"] == task["items"] > 0 and task.get("pending"), task
    said = _cli(tmp_path)("status", str(tmp_path / "o")).stdout
    assert "task 1:" in said and "its units are done, its key file is not" in said and "--stage lines --task 1" in said
    run_task(config, 2, "lines", 1)  # run again: it gathers its keys and the stage is complete
    assert not stages_module.status(config.out)["stages"]["lines"]["tasks"][1].get("pending")
