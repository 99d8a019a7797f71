"""Faults of the machine, injected by the suite: a device that fills up or fails while the
build writes, with the error arriving again as the writers close their buffered tails. The
message keeps its advice, every file is closed, and `--resume` ends byte-identical."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from faults import full_disk
from test_reliability import assert_identical, inputs, reference, run  # noqa: F401 (fixtures)

import lmshard.prepare.build as build_mod
import lmshard.prepare.writer as writer_mod
from lmshard.errors import LmshardError
from lmshard.prepare.staging import OutputPaths


def _open_under(root: Path) -> list[str]:
    """This process's open descriptors on files under `root`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            found.append(target)
    return found


@pytest.mark.parametrize(("code", "words"), [
    (errno.ENOSPC, "no space left on the device"),
    (errno.EDQUOT, "no space left on the device"),
    (errno.EIO, "Input/output error"),
])  # fmt: skip
def test_a_device_that_fails_again_at_close_keeps_the_advice(tmp_path, monkeypatch, inputs, reference, code, words):
    """At the default checkpoint interval the writers hold buffered tails when the device fails;
    closing them raises the same error again, which must not replace the message."""
    monkeypatch.delenv("LMSHARD_CHECKPOINT_SECONDS", raising=False)
    out = tmp_path / "ds"
    device = full_disk(monkeypatch, [writer_mod, build_mod], budget=700_000, code=code)
    with pytest.raises(LmshardError) as e:
        run(out, inputs[0])
    message = str(e.value)
    assert words in message and "run the same command with --resume" in message and "\n" not in message, message
    assert device.failures >= 2, "the error came again at close"
    staging = OutputPaths.of(str(out)).staging
    assert staging.exists() and _open_under(staging) == []  # every writer and the key file closed
    monkeypatch.undo()  # space is back
    run(out, inputs[0], resume=True)
    assert_identical(reference, out)
