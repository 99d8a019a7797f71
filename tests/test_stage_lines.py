"""Line numbers in a planned run: a bad record in a late unit of a file cut into byte ranges is
named by the line a one-machine run names (planning never counts a file's lines; the task that
tokenizes a range counts on from the nearest range before it)."""

from __future__ import annotations

import json

import pytest

from lmshard.errors import InputError
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.execution.local_exec import run
from lmshard.prepare.execution.units import _WINDOW


def _input(tmp_path, bad_at: int):
    lines = [json.dumps({"text": f"document {i} " + "word " * 40}) for i in range(1, 4001)]
    lines[bad_at - 1] = "{not json"
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size > 4 * _WINDOW  # cut into several units
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_a_bad_record_in_a_late_unit_is_named_by_its_line(tmp_path, workers):
    src = _input(tmp_path, bad_at=3217)
    opts = dict(inputs=[str(src)], on_error="skip", workers=workers)
    one = prepare(PrepareConfig(out=str(tmp_path / "one"), **{**opts, "workers": 1}))
    staged = run(PrepareConfig(out=str(tmp_path / "staged"), **opts), 3, _WINDOW)
    assert ":3217" in json.dumps(one.drop_examples), one.drop_examples  # the truth: the line number itself
    assert staged.drop_examples == one.drop_examples
    with pytest.raises(InputError, match=":3217"):
        run(PrepareConfig(out=str(tmp_path / "fails"), **{**opts, "on_error": "fail"}), 3, _WINDOW)
