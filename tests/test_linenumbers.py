"""Line numbers in a planned run (prepare/execution/linenumbers.py): a range of a large file
whose earlier ranges are not tokenized yet never reads them, and the examples in the metadata
and the message that stops a run name the same `file:line` as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_prepare import make_texts

from lmshard.errors import InputError
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.execution import local_exec
from lmshard.prepare.execution.stages import STAGES, plan_run, run_task
from lmshard.prepare.execution.units import _WINDOW

_OPTS = dict(val_fraction=0.1, tokens_per_shard=20_000, workers=1)


def _lines_with_faults(path, n=3000, bad_every=None):
    """JSON lines; `bad_every`: every k-th line past the first few hundred is not JSON, each a
    different reason's first example at a line far into the file (a line past the first unit)."""
    texts = make_texts(n, seed=5)
    rows = []
    for i, t in enumerate(texts):
        if bad_every and i > 600 and i % bad_every == 0:
            rows.append("not json" if i % (2 * bad_every) else '{"oops": 1}')
        elif i > 900 and i % 97 == 0:
            rows.append(json.dumps({"text": ""}))  # empty: counted, with its line as the example
        else:
            rows.append(json.dumps({"text": t}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")
    return path


def _meta(out):
    meta = json.loads((out / "dataset_metadata.json").read_text())
    meta.pop("run")
    return meta


def test_examples_name_one_machines_lines_when_every_range_is_tokenized_before_the_one_before_it(tmp_path):
    """Tokenize tasks run last to first (none knows where its lines begin), yet the metadata's
    examples give the absolute lines a one-process run gives, past the first unit."""
    src = _lines_with_faults(tmp_path / "in" / "a.jsonl", bad_every=251)
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "one"), on_error="skip", **_OPTS))
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "planned"), on_error="skip", unit_size=_WINDOW,
                           **_OPTS)  # fmt: skip
    local_exec.claim(config, 6)
    for stage in STAGES[:-1]:
        order = range(5, -1, -1) if stage == "tokenize" else range(6)
        for task in order:
            run_task(config, 6, stage, task, _WINDOW)
    run_task(config, 6, "finish", 0, _WINDOW)
    one, planned = _meta(tmp_path / "one"), _meta(tmp_path / "planned")
    lines = [int(e[len(str(src)) + 1 :].split(":")[0]) for e in one["drop_examples"].values()]
    assert lines and max(lines) > 1000  # examples from ranges that did not start the file
    assert planned["drop_examples"] == one["drop_examples"]
    assert planned == one


def test_a_range_that_stops_the_run_names_its_absolute_line(tmp_path):
    """A bad line in a late range, tokenized first: the error names the line one process names."""
    src = _lines_with_faults(tmp_path / "in" / "a.jsonl", bad_every=0)
    lines = src.read_text().split("\n")
    lines[2500] = "not json"
    src.write_text("\n".join(lines))
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "planned"), unit_size=_WINDOW, **_OPTS)
    with pytest.raises(InputError) as one:
        prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "one"), **_OPTS))
    assert f"{src}:2501:" in str(one.value)
    plan, _, _ = plan_run(config, 6)
    last = next(t for t in range(5, -1, -1) if plan["tasks"][t][1] > plan["tasks"][t][0])
    with pytest.raises(InputError) as planned:
        for task in range(last, -1, -1):
            run_task(config, 6, "tokenize", task, _WINDOW)
    assert str(planned.value).split(";")[0] == str(one.value).split(";")[0]


_READS = """
import sys
from lmshard.prepare import PrepareConfig
from lmshard.prepare.execution.stages import run_task
config = PrepareConfig(inputs=[sys.argv[1]], out=sys.argv[2], unit_size=int(sys.argv[3]), workers=1, on_error="skip")
run_task(config, 8, "tokenize", int(sys.argv[4]), int(sys.argv[3]))
print(next(int(l.split()[1]) for l in open("/proc/self/io") if l.startswith("rchar:")))
"""


def test_a_tokenize_task_reads_its_units_and_nothing_before_them(tmp_path):
    """A file of ~8 MiB cut into 8 tasks: the last task, started first, reads no more than the
    first task does beyond the difference of their shares, plus 1 MiB (bytes read by the whole
    process, /proc/self/io; both pay the same start-up)."""
    src = _lines_with_faults(tmp_path / "in" / "a.jsonl", n=40_000)
    size = src.stat().st_size
    unit = 256 << 10
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "planned"), unit_size=unit, workers=1,
                           on_error="skip")  # fmt: skip
    plan, _, _ = plan_run(config, 8)
    share = [sum(plan["units"][u][4] for u in range(*plan["tasks"][t])) for t in range(8)]
    assert size > 6 << 20 and share[7] > 0

    def read_by(task):
        env = os.environ | {"LMSHARD_UNIT_BYTES": str(unit)}
        done = subprocess.run([sys.executable, "-c", _READS, str(src), config.out, str(unit), str(task)],
                              capture_output=True, text=True, timeout=300, env=env, check=True)  # fmt: skip
        return int(done.stdout.split()[-1])

    last, first = read_by(7), read_by(0)
    assert last - first <= share[7] - share[0] + (1 << 20), (last, first, share)


def test_a_detail_that_names_the_line_names_one_machines_line(tmp_path):
    """A line that is not valid UTF-8 in a late range, tokenized before the ranges ahead of it:
    the example's prefix and its detail ("line N is not valid UTF-8") name the absolute line."""
    src = _lines_with_faults(tmp_path / "in" / "a.jsonl")
    data = src.read_bytes().split(b"\n")
    data[2716] = b'{"text": "bad \xff byte"}'
    src.write_bytes(b"\n".join(data))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "one"), on_error="skip", **_OPTS))
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "planned"), on_error="skip", unit_size=_WINDOW,
                           **_OPTS)  # fmt: skip
    local_exec.claim(config, 6)
    for stage in STAGES[:-1]:
        for task in range(5, -1, -1) if stage == "tokenize" else range(6):
            run_task(config, 6, stage, task, _WINDOW)
    run_task(config, 6, "finish", 0, _WINDOW)
    one = _meta(tmp_path / "one")
    assert any("2717" in e and "line 2717" in e for e in one["drop_examples"].values()), one["drop_examples"]
    assert _meta(tmp_path / "planned")["drop_examples"] == one["drop_examples"]
