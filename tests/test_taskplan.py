"""The scale-out plan: units that tile the input on record boundaries, tasks that cover the
units in order, and a persisted plan that refuses another run's options."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from conftest import write

from lmshard.errors import ConfigError
from lmshard.prepare.documents.files import detect
from lmshard.prepare.execution.taskplan import assign, ensure_plan, load_plan, make_plan, units_of, work_dir
from lmshard.prepare.execution.units import _WINDOW, Unit, cut_units

U = _WINDOW  # the smallest unit size: small files still get several units


def _jsonl(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return b"".join(json.dumps({"text": "w" * int(k)}).encode() + b"\n" for k in rng.integers(1, 3000, size=n))


def test_ranges_tile_a_jsonl_file_on_newlines(tmp_path):
    data = _jsonl(400, 1)
    src = detect(str(write(tmp_path / "a.jsonl", data)))
    units = cut_units([src], "auto", 100_000, U)
    assert len(units) > 3 and all(u.kind == "range" for u in units)
    assert b"".join(data[u.start : u.end] for u in units) == data
    for k, u in enumerate(units):
        assert data[u.end - 1 : u.end] == b"\n"  # every unit ends a line
        if k:
            assert u.start >= k * U and u.start - k * U <= 3000 + 20  # the first boundary past the multiple
    records = [r for u in units for r in data[u.start : u.end].splitlines()]
    assert records == data.splitlines()  # no record is cut


def test_paragraph_text_is_cut_after_blank_lines_lf_and_crlf(tmp_path):
    rng = np.random.default_rng(2)
    for newline in (b"\n", b"\r\n"):
        paragraphs = [newline.join([b"line %d" % i] * int(k)) for i, k in enumerate(rng.integers(1, 400, size=300))]
        data = (newline + newline).join(paragraphs) + newline
        src = detect(str(write(tmp_path / f"p{len(newline)}.txt", data)))
        units = cut_units([src], "paragraph", 1000, U)
        assert len(units) > 3 and b"".join(data[u.start : u.end] for u in units) == data
        for u in units[1:]:
            before = data[u.start - 2 * len(newline) : u.start]
            assert before == newline + newline, (newline, before)


def test_what_is_not_cut(tmp_path):
    big = _jsonl(400, 3)
    gz = detect(str(write(tmp_path / "a.jsonl.gz", gzip.compress(big))))
    small = detect(str(write(tmp_path / "b.jsonl", _jsonl(3, 4))))
    array = detect(str(write(tmp_path / "c.json", b"[" + b",".join([b'{"text": "x"}'] * 20000) + b"]")))
    whole_text = detect(str(write(tmp_path / "d.txt", b"word " * 100_000)))  # text mode file: one document
    units = cut_units([gz, small, array, whole_text], "file", 1000, U)
    # each whole; the two small ones share a unit (units of several files)
    assert [(u.source, u.kind, u.start, u.end) for u in units] == [
        (0, "files", 0, 2), (2, "file", 0, array.size), (3, "file", 0, whole_text.size)]  # fmt: skip
    assert gz.size + small.size <= U < min(array.size, whole_text.size)
    one_long_line = detect(str(write(tmp_path / "e.jsonl", b'{"text": "' + b"x" * 300_000 + b'"}\n')))
    assert [u.kind for u in cut_units([one_long_line], "auto", 1000, U)] == ["range"]
    with pytest.raises(ConfigError, match="stdin"):
        cut_units([detect("-")], "auto", 1000, U)


def test_consecutive_small_files_share_units_up_to_the_unit_size(tmp_path):
    """A directory of many small files is a few units, each of consecutive whole files up to the
    unit size in all; a file that is cut (or too large to share) ends the run; one small file
    alone stays a `file` unit. Their items are `plan`'s for the same files."""
    from lmshard.prepare.documents.sources import plan
    from lmshard.prepare.execution.units import unit_items

    rng = np.random.default_rng(11)
    smalls = [detect(str(write(tmp_path / f"a{i:03d}.txt", b"word %d " % i * int(k))))
              for i, k in enumerate(rng.integers(100, 2000, size=120))]  # fmt: skip
    big = detect(str(write(tmp_path / "b.jsonl", _jsonl(200, 12))))
    tail = [detect(str(write(tmp_path / "c.jsonl", _jsonl(3, 13))))]
    sources = [*smalls, big, *tail]
    units = cut_units(sources, "auto", 100_000, U)
    groups = [u for u in units if u.kind == "files"]
    assert 2 <= len(groups) < 120 // 4  # (1-8 KB files into 64 KiB units)
    assert [u.source for u in groups] == [u.start for u in groups]
    assert groups[0].start == 0 and groups[-1].end == 120  # they tile the small files, in order
    assert all(a.end == b.start for a, b in zip(groups, groups[1:], strict=False))
    assert all(u.nbytes == sum(s.size for s in sources[u.start : u.end]) <= U for u in groups)
    assert all(u.nbytes + sources[u.end].size > U for u in groups[:-1])  # each as full as the next file allows
    assert [u.kind for u in units[len(groups):]] == ["range"] * (len(units) - len(groups) - 1) + ["file"]
    cut = [it for u in units for it in unit_items(sources, u, "auto", "text", 100_000)]
    whole = list(plan(sources, "auto", "text", max_chars=100_000))
    assert any(it.kind == "files" and it.source > 0 for it in cut)  # (whole files, numbered as in the input)
    assert _documents(cut, sources) == _documents(whole, sources)


def _documents(items: list, sources: list) -> list:
    """The records the items stand for: each whole file's path, each line's bytes."""
    out = []
    for it in items:
        if it.kind == "files":
            out += [sources[s].path for s in it.payload]
        else:
            out += [(sources[it.source].path, line) for line in it.payload.splitlines()]
    return out


def test_parquet_row_groups_are_units(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"text": [f"doc {i}" for i in range(1000)]}), path, row_group_size=300)
    units = cut_units([detect(str(path))], "auto", 1000, U)
    assert [(u.kind, u.start) for u in units] == [("row_group", g) for g in range(4)]


@pytest.mark.parametrize("n_tasks", [1, 3, 7, 40])
def test_tasks_cover_the_units_in_order_balanced_by_bytes(n_tasks):
    sizes = np.random.default_rng(5).integers(1, 1000, size=25).tolist()
    units = [Unit(0, "range", 0, 0, s) for s in sizes]
    ranges = assign(units, n_tasks)
    assert len(ranges) == n_tasks and ranges[0][0] == 0 and ranges[-1][1] == len(units)
    assert all(a[1] == b[0] for a, b in zip(ranges[:-1], ranges[1:], strict=True))  # contiguous, in order
    per_task = [sum(sizes[a:b]) for a, b in ranges]
    if n_tasks <= len(units):
        assert max(per_task) <= sum(sizes) / n_tasks + max(sizes)
        assert all(b > a for a, b in ranges)  # nobody idle
    else:
        assert sum(b > a for a, b in ranges) == len(units)  # one unit each, the rest empty
    with pytest.raises(ConfigError, match="at least 1"):
        assign(units, 0)


def test_the_plan_is_written_once_and_refuses_another_run(tmp_path):
    data = _jsonl(400, 6)
    src = detect(str(write(tmp_path / "in" / "a.jsonl", data)))
    fingerprint = {"config": {"val_fraction": 0.01, "seed": 0}, "sources": [[src.path, "jsonl", src.size, 1]]}
    units = cut_units([src], "auto", 1000, U)
    plan = make_plan(fingerprint, [src], units, 3, U)
    work = work_dir(tmp_path / "out")
    assert work.name == ".out.lmshard-work" and not work.exists()
    assert _whole(ensure_plan(work, plan)) == _whole(plan) == _whole(load_plan(work))
    assert _whole(ensure_plan(work, json.loads(json.dumps(plan)))) == _whole(plan)  # a second task validates it
    stored = load_plan(work)  # its tables are read a row at a time: the same units, tasks and inputs
    assert len(stored["units"]) == len(units) and stored["units"][-1] == plan["units"][-1]
    assert stored["tasks"][1:3] == plan["tasks"][1:3] and stored["sources"][0] == plan["sources"][0]
    got = [(u.start, u.end) for t in range(3) for u in units_of(stored, t)]
    assert got == [(u.start, u.end) for u in units]
    with pytest.raises(ConfigError, match="--num-tasks was 3 and is 5 now"):
        ensure_plan(work, make_plan(fingerprint, [src], units, 5, U))
    other = {**fingerprint, "config": {"val_fraction": 0.05, "seed": 0}}
    with pytest.raises(ConfigError, match="--val-fraction was 0.01 when the run started and is 0.05 now"):
        ensure_plan(work, make_plan(other, [src], units, 3, U))
    with pytest.raises(ConfigError, match=r"task 3 is not in \[0, 3\)"):
        units_of(plan, 3)
    assert not list(work.glob("*.tmp"))


def _whole(plan):
    """A plan as plain lists (a stored plan's tables read whole), without the counts of its head."""
    out = {k: v for k, v in plan.items() if k not in ("n_units", "n_sources")}
    out |= {k: list(plan[k]) for k in ("units", "tasks", "sources")}
    out["fingerprint"] = {k: v for k, v in plan["fingerprint"].items() if k != "sources"}
    return out


def _lined(units, sources):
    """The units with the first line numbers their tasks find (planning leaves later ones 0)."""
    from dataclasses import replace

    from lmshard.prepare.execution.units import count_newlines

    assert all((u.first_line == 0) == (u.kind == "range" and u.start > 0) for u in units)
    return [replace(u, first_line=1 + count_newlines(sources[u.source], 0, u.start)) if u.first_line == 0 else u
            for u in units]  # fmt: skip


def _numbered(items) -> list[tuple[int, int, bytes]]:
    """(source, line number, line) of every line the items carry, as the workers number them."""
    out = []
    for item in items:
        assert item.kind == "lines", item.kind
        out += [(item.source, item.first_line + k, line) for k, line in enumerate(item.payload.splitlines(True))]
    return out


@pytest.mark.parametrize("mode", ["jsonl", "paragraph", "auto"])
def test_unit_items_carry_the_same_numbered_lines_as_the_whole_file(tmp_path, mode):
    """Cut into units, a file gives prepare's workers exactly the lines (and line numbers) of
    the single-machine plan; --text-mode auto marks the file as split into paragraphs once."""
    from lmshard.prepare.documents.sources import plan
    from lmshard.prepare.execution.units import unit_items

    rng = np.random.default_rng(7)
    if mode == "jsonl":
        data, name, text_mode = _jsonl(500, 8), "a.jsonl", "auto"
    else:
        paragraphs = [b"\n".join([b"w%d" % i] * int(k)) for i, k in enumerate(rng.integers(1, 300, size=400))]
        data, name, text_mode = b"\n\n".join(paragraphs) + b"\n", "a.txt", mode
    small = write(tmp_path / "0.jsonl", _jsonl(5, 9))
    sources = [detect(str(small)), detect(str(write(tmp_path / name, data)))]
    units = cut_units(sources, text_mode, 1000, U)
    assert sum(u.source == 1 for u in units) > 3
    whole = list(plan(sources, text_mode, "text", max_chars=1000))
    cut = [it for u in _lined(units, sources) for it in unit_items(sources, u, text_mode, "text", 1000)]
    assert _numbered(cut) == _numbered(whole)
    assert [it.split_file for it in cut].count(True) == [it.split_file for it in whole].count(True)
    assert sum(it.nbytes for it in cut if it.source == 1) == len(data)


def test_a_binary_file_stays_one_unit(tmp_path):
    data = b"\x00" * 10 + _jsonl(400, 10)
    assert [u.kind for u in cut_units([detect(str(write(tmp_path / "b.jsonl", data)))], "auto", 1000, U)] == ["file"]


def test_a_byte_order_mark_is_taken_off_the_first_unit_only(tmp_path):
    """A UTF-8 byte-order mark is at offset 0 only: the first unit's data starts after it, the
    others at their record boundary; together they are the file's records, numbered as in the
    single-machine plan."""
    from lmshard.prepare.documents.sources import plan
    from lmshard.prepare.execution.units import unit_items

    data = _jsonl(400, 3)
    src = detect(str(write(tmp_path / "a.jsonl", b"\xef\xbb\xbf" + data)))
    units = cut_units([src], "auto", 1000, U)
    assert len(units) > 3 and units[0].start == 0
    cut = [it for u in _lined(units, [src]) for it in unit_items([src], u, "auto", "text", 1000)]
    assert b"".join(it.payload for it in cut) == data
    assert _numbered(cut) == _numbered(list(plan([src], "auto", "text", max_chars=1000)))
    assert sum(it.nbytes for it in cut) == len(data) + 3


def test_a_utf16_file_stays_one_unit_read_as_one_wrong_encoding_record(tmp_path):
    from lmshard.prepare.execution.units import unit_items

    src = detect(str(write(tmp_path / "a.jsonl", _jsonl(400, 4).decode().encode("utf-16"))))
    units = cut_units([src], "auto", 1000, U)
    assert [u.kind for u in units] == ["file"]
    (item,) = unit_items([src], units[0], "auto", "text", 1000)
    assert [r.problem for r in item.payload] == ["wrong_encoding"]


def test_the_task_of_a_unit_skips_empty_tasks():
    """A binary search of the tasks' first units: an empty task starts where the next one does,
    which holds the unit."""
    from lmshard.prepare.execution.plantables import task_of_unit

    tasks = [[0, 2], [2, 2], [2, 5], [5, 5], [5, 6]]
    assert [task_of_unit(tasks, u) for u in range(6)] == [0, 0, 2, 2, 2, 4]
