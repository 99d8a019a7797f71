"""lmshard.stream under a schedule: each reader's rows go on one after another whatever the
step's shape, so the rows of a scheduled run, in order, are the rows of a one-shape run of the
same reader (the truth: that run, and the tokens `prepare --no-dedup` writes), and a stopped
run resumes onto the uninterrupted one, with DataLoader workers too."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_stream import _drain, _same, corpus, prepared, write_parts  # noqa: F401

import lmshard
from lmshard.errors import ArgumentError

PLAN = [(0, 2, 32), (3, 4, 32), (6, 3, 48)]


def _rows(batches) -> np.ndarray:
    """Every row's x and label tokens, one after another (windows: each row's full read)."""
    return np.concatenate([np.concatenate([b.x.numpy(), b.y.numpy()[:, -1:]], axis=1).ravel() for b in batches])


def test_a_scheduled_window_stream_cuts_the_same_token_stream(corpus):  # noqa: F811
    root, _ = corpus
    stream = lmshard.stream(str(root / "src"), epochs=1)
    got = _drain(stream.windows(schedule=PLAN), 10)
    assert [tuple(b.x.shape) for b in got] == [(2, 32)] * 3 + [(4, 32)] * 3 + [(3, 48)] * 4
    # the windows are the epoch's token stream cut one row after another, at each row's length
    want = prepared(root, [str(root / "src")], "ds_sched").tokens(0, 2 * 3 * 33 + 4 * 3 * 33 + 3 * 4 * 49 + 200)
    at = 0
    for b in got:
        for x, y in zip(b.x.numpy(), b.y.numpy(), strict=True):
            T = len(x)
            assert np.array_equal(x, want[at : at + T]) and np.array_equal(y, want[at + 1 : at + T + 1])
            at += T  # stride: the row's length


@pytest.mark.parametrize("workers", [0, 2])
def test_a_scheduled_stream_resumes_onto_the_uninterrupted_run(corpus, workers):  # noqa: F811
    root, _ = corpus
    for shape in ("windows", "packed"):
        plan = PLAN if shape == "windows" else [(0, 2, 64), (4, 3, 64)]

        def make(shape=shape, plan=plan):  # noqa: ANN202
            s = lmshard.stream(str(root / "src"), shuffle_buffer=20, seed=3)
            return getattr(s, shape)(schedule=plan, num_workers=workers)

        whole = _drain(make(), 14)
        first = make()
        _drain(first, 5)
        resumed = make()
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        for k, b in enumerate(_drain(resumed, 9)):
            assert _same(b, whole[5 + k]), (shape, k)
        assert resumed.batch_size == plan[-1][1] and resumed.seq_len == plan[-1][2]
        other = make()
        other.options["schedule"] = [[0, 2, 64]]  # a stream of another schedule: refused on resume
        with pytest.raises(ArgumentError, match="the state was saved with schedule="):
            other.load_state_dict(first.state_dict())


def test_schedule_mistakes_on_a_stream_are_one_line(corpus):  # noqa: F811
    root, _ = corpus
    stream = lmshard.stream(str(root / "src"))
    for call, words in ((lambda: stream.packed(schedule=PLAN), "a stream's packs have one seq_len"),
                        (lambda: stream.windows(2, 32, schedule=PLAN), "not both"),
                        (lambda: stream.windows(schedule=[(0, 3, 32)], world_size=2, rank=0), "does not split"),
                        (lambda: stream.windows(seq_len=32), "batch_size=None")):  # fmt: skip
        with pytest.raises(ArgumentError) as caught:
            call()
        assert words in str(caught.value) and "\n" not in str(caught.value)
