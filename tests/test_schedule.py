"""Row order and schedules, checked against the tokens themselves: each row's tokens are read
with numpy from the split at the row's offset, and a run's ledger (each row's offset and
length, in order) is compared between batch sizes, world sizes and interrupted runs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmshard.errors import ArgumentError, ConfigError
from lmshard.runtime import Mixture, TokenDataset
from lmshard.runtime.schedule import Schedule

VOCAB, EOT = 1000, 999


def _tokens(n: int, seed: int, lo: int = 0, hi: int = 998) -> np.ndarray:
    tokens = np.random.default_rng(seed).integers(lo, hi, size=n).astype(np.uint32)
    tokens[39::40] = EOT  # documents of 40 tokens
    return tokens


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    return _tokens(60_000, 1)


def _data(tokens: np.ndarray) -> TokenDataset:
    return TokenDataset.from_tokens(tokens, np.full(len(tokens) // 40, 40), eot_id=EOT, vocab_size=VOCAB)


def _mixture() -> Mixture:
    a, b = _tokens(30_000, 2, 0, 500), _tokens(9_000, 3, 500, 998)
    return Mixture({_data(a): 0.7, _data(b): 0.3})


# Each kind: (build(dataset, mixture, **options) -> stream, how a batch's rows are named).
KINDS = {
    "random": lambda d, m, **kw: d.random_batches(seed=5, **kw),
    "doc_aligned": lambda d, m, **kw: d.random_batches(seed=5, doc_aligned=True, **kw),
    "windows": lambda d, m, **kw: d.window_batches(seed=5, order="rows", **kw),
    "windows_in_order": lambda d, m, **kw: d.window_batches(seed=5, order="rows", shuffle=False, **kw),
    "mixture": lambda d, m, **kw: m.random_batches(seed=5, **kw),
    "mixture_windows": lambda d, m, **kw: m.window_batches(seed=5, **kw),
}


def _rows(batch) -> list[tuple[int, int]]:
    """Each row of a batch as (offset, length): the ledger's entries."""
    return [(int(o), int(batch.x.shape[-1])) for o in batch.offsets]


def _check_tokens(batch, stream_tokens: np.ndarray) -> None:
    for row, (o, T) in zip(batch.x, _rows(batch), strict=True):
        assert row.tolist() == stream_tokens[o : o + T].tolist()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_global_batch_draws_the_same_rows_in_the_same_order(kind, tokens):
    """Global batch 16 for 12 steps and 64 for 3 steps (and 64 over 4 ranks): the same 192 rows."""
    mix = _mixture()
    small = KINDS[kind](_data(tokens), mix, batch_size=16, seq_len=32)
    large = KINDS[kind](_data(tokens), mix, batch_size=64, seq_len=32)
    ranks = [KINDS[kind](_data(tokens), mix, batch_size=16, seq_len=32, rank=r, world_size=4) for r in range(4)]
    a = [r for _ in range(12) for r in _rows(next(small))]
    b = [r for _ in range(3) for r in _rows(next(large))]
    c = [r for _ in range(3) for s in ranks for r in _rows(next(s))]
    assert a == b == c and len(a) == 192
    if kind in ("random", "windows"):
        _check_tokens(next(small), tokens)


def test_packed_batches_in_row_order_draw_the_same_packs_at_any_batch_size(tokens):
    packs = _data(tokens).packed(64, seed=3)
    small, large = packs.batches(4, order="rows"), packs.batches(16, order="rows")
    a = [int(p) for _ in range(12) for p in next(small)["packs"]]
    b = [int(p) for _ in range(3) for p in next(large)["packs"]]
    assert a == b and sorted(a) == sorted(set(a))  # 48 packs, none twice (fewer than one epoch)
    # an epoch's end inside a step: rows go on into the next epoch's order, no pack left out
    n = len(packs)
    odd = packs.batches(7, order="rows")
    drawn = [int(p) for _ in range(-(-n // 7) + 1) for p in next(odd)["packs"]]
    assert sorted(drawn[:n]) == list(range(n))
    assert drawn[n:] == packs.order(1)[: len(drawn) - n].tolist()


def test_windows_in_row_order_visit_every_window_once_an_epoch(tokens):
    data = _data(tokens)
    stream = data.window_batches(48, 32, seed=2, order="rows")
    n = (len(tokens) - 33) // 32 + 1  # windows of 32 + 1 tokens at stride 32
    assert n % 48  # the epoch ends inside a step
    starts = [o for _ in range(n // 48 + 1) for o, _ in _rows(next(stream))]
    assert sorted(starts[:n]) == [i * 32 for i in range(n)]  # no window dropped, none twice
    assert stream.epoch == 1 and stream.steps_per_epoch == n // 48
    stepwise = data.window_batches(48, 32, seed=2)  # order="steps": whole steps, a remainder dropped
    first = [o for _ in range(n // 48) for o, _ in _rows(next(stepwise))]
    assert len(set(first)) == n - n % 48 and stepwise.epoch == 1


SCHEDULE = [(0, 8, 32), (3, 32, 32), (6, 64, 64), (9, 16, 32)]


def _ledger(stream, steps: int) -> list[list[tuple[int, int]]]:
    return [_rows(next(stream)) for _ in range(steps)]


@pytest.mark.parametrize("kind", ["random", "windows", "mixture", "mixture_windows"])
def test_a_schedule_stopped_and_resumed_at_other_world_sizes_is_the_uninterrupted_run(kind, tokens):
    """8 → 32 → 64 rows with seq_len 32 → 64 → 32: stopped at random steps, resumed at world
    sizes 1, 2 and 4, the run's ledger equals the uninterrupted one: no row skipped or repeated."""
    mix = _mixture()
    whole = _ledger(KINDS[kind](_data(tokens), mix, schedule=SCHEDULE), 14)
    assert [len(step) for step in whole] == [8] * 3 + [32] * 3 + [64] * 3 + [16] * 5
    assert [step[0][1] for step in whole] == [32] * 6 + [64] * 3 + [32] * 5
    rng = np.random.default_rng(0)
    for _ in range(3):
        stops = sorted(rng.choice(np.arange(1, 14), size=3, replace=False).tolist()) + [14]
        got, state, at = [], None, 0
        for stop, world in zip(stops, (1, 2, 4, 2), strict=True):
            ranks = [KINDS[kind](_data(tokens), mix, schedule=SCHEDULE, rank=r, world_size=world) for r in range(world)]
            for s in ranks:
                if state is not None:
                    s.load_state_dict(state)
            for _ in range(stop - at):
                got.append([row for s in ranks for row in _rows(next(s))])
            state, at = ranks[0].state_dict(), stop
        assert got == whole


def test_a_scheduled_packed_stream_resumes_at_another_world_size(tokens):
    packs = _data(tokens).packed(64, seed=3)
    plan = [(0, 4, 64), (2, 8, 64), (4, 16, 64)]
    whole = [next(s)["packs"].tolist() for s in [packs.batches(schedule=plan)] for _ in range(6)]
    first = packs.batches(schedule=plan)
    got = [next(first)["packs"].tolist() for _ in range(3)]
    two = [packs.batches(schedule=plan, rank=r, world_size=2) for r in range(2)]
    for s in two:
        s.load_state_dict(first.state_dict())
    got += [sum((next(s)["packs"].tolist() for s in two), []) for _ in range(3)]
    assert got == whole and [len(g) for g in got] == [4, 4, 8, 8, 16, 16]
    with pytest.raises(ArgumentError, match="a packed stream's rows are its plan's seq_len 64"):
        packs.batches(schedule=[(0, 4, 64), (2, 4, 128)])


def test_the_stream_reports_the_shape_of_its_next_step(tokens):
    stream = _data(tokens).random_batches(schedule=SCHEDULE, world_size=2, rank=1)
    seen = []
    for _ in range(10):
        seen.append((stream.batch_size, stream.global_batch_size, stream.seq_len, stream.tokens_per_step))
        batch = next(stream)
        assert batch.x.shape == (seen[-1][0], seen[-1][2])
    assert seen[2] == (4, 8, 32, 256) and seen[3] == (16, 32, 32, 1024) and seen[6] == (32, 64, 64, 4096)
    assert stream.tokens_seen == 3 * 8 * 32 + 3 * 32 * 32 + 3 * 64 * 64 + 16 * 32


def test_staged_batches_follow_the_schedule(tokens):
    """The pinned-ring path (on the CPU here) sizes its buffers for the largest step of the schedule."""
    direct = _data(tokens).random_batches(schedule=SCHEDULE, seed=1)
    staged = _data(tokens).random_batches(schedule=SCHEDULE, seed=1)
    staged.staged = True
    for _ in range(12):
        a, b = next(direct), next(staged)
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_a_schedule_in_tokens_and_its_mistakes():
    s = Schedule([{"tokens": 0, "batch_size": 8, "seq_len": 32}, {"tokens": 1000, "batch_size": 16, "seq_len": 64},
                  {"tokens": 2e4, "global_batch_size": 32, "seq_len": 64}])  # fmt: skip
    # 8 × 32 = 256 tokens a step: step 4 is the first at or after 1,000 tokens (1,024)
    assert s.record() == [[0, 8, 32], [4, 16, 64], [23, 32, 64]]
    assert s.tokens_before(4) == 1024 and s.tokens_before(23) == 1024 + 19 * 1024 and s.first_row(5) == 48
    bad = {
        "starts at step 3": [(3, 8, 32)],
        "not after phase 1": [(0, 8, 32), (0, 16, 32)],
        "is not \\(step, global_batch_size, seq_len\\)": [(0, 8)],
        "has no phase": [],
        "batch_size=0": [(0, 0, 32)],
        "a phase has 'step' or 'tokens'": [{"step": 0, "tokens": 0, "batch_size": 8, "seq_len": 32}],
    }
    for message, phases in bad.items():
        with pytest.raises(ArgumentError, match=message) as caught:
            Schedule(phases)
        assert "\n" not in str(caught.value)
    data = TokenDataset.synthetic(20_000, vocab_size=100, doc_len=50)
    with pytest.raises(ArgumentError, match="does not split over world_size=4"):
        data.random_batches(schedule=[(0, 8, 32), (2, 6, 32)], world_size=4, rank=0)
    with pytest.raises(ArgumentError, match="needs order='rows'"):
        data.window_batches(schedule=SCHEDULE, order="steps")
    with pytest.raises(ArgumentError, match="not both"):
        data.random_batches(8, 32, schedule=SCHEDULE)
    with pytest.raises(ConfigError, match="set_epoch needs one batch shape"):
        data.window_batches(schedule=SCHEDULE).set_epoch(1)


def test_a_state_drawn_in_step_order_keeps_its_batches(tokens):
    """States saved before row order existed have no 'order': a stream built without order=
    draws them in step order, as they were drawn; one built with order='rows' refuses them."""
    old = _data(tokens).random_batches(8, 32, seed=9, order="steps")
    for _ in range(4):
        next(old)
    state = {k: v for k, v in old.state_dict().items() if k != "order"}
    resumed = _data(tokens).random_batches(8, 32, seed=9)
    resumed.load_state_dict(state)
    assert resumed.order == "steps"
    for _ in range(3):
        assert next(resumed).offsets.tolist() == next(old).offsets.tolist()
    with pytest.raises(ArgumentError, match="build the stream with order='steps'"):
        _data(tokens).random_batches(8, 32, seed=9, order="rows").load_state_dict(state)


def test_a_changed_schedule_is_refused_or_taken_from_a_stated_step(tokens):
    first = _data(tokens).random_batches(schedule=SCHEDULE, seed=4)
    whole = _ledger(_data(tokens).random_batches(schedule=SCHEDULE, seed=4), 12)
    for _ in range(5):
        next(first)
    state = first.state_dict()
    later = [(0, 8, 32), (3, 32, 32), (8, 16, 64)]
    with pytest.raises(ArgumentError, match="differ from step 6; build the stream with the saved schedule"):
        _data(tokens).random_batches(schedule=later, seed=4).load_state_dict(state)
    with pytest.raises(ArgumentError, match="from_step=4.*at or after the state's step 5"):
        _data(tokens).random_batches(schedule=later, seed=4).load_state_dict(state, from_step=4)
    moved = _data(tokens).random_batches(schedule=later, seed=4)
    moved.load_state_dict(state, from_step=7)
    got = _ledger(moved, 5)
    assert got[:2] == whole[5:7]  # steps 5 and 6 as the saved schedule has them
    assert [len(g) for g in got] == [32, 64, 32, 16, 16] and got[3][0][1] == 64
    assert moved.state_dict()["schedule"] == [[0, 8, 32], [3, 32, 32], [6, 64, 64], [7, 32, 32], [8, 16, 64]]
    # the rows go on from where step 6 left them: step 7 begins at row 3·8 + 3·32 + 64 of the run
    assert got[2] == _ledger(_data(tokens).random_batches(schedule=[(0, 184, 32), (1, 32, 32)], seed=4), 2)[1]


@pytest.mark.parametrize("kind", ["random", "windows", "packed"])
def test_trace_rebuilds_a_scheduled_run_from_its_state(kind, tokens):
    """What `lmshard trace` reads a state with draws the steps the scheduled run drew."""
    from lmshard.runtime.trace import stream_of_state

    data = _data(tokens)
    if kind == "packed":
        run = data.packed(64, seed=3).batches(schedule=[(0, 4, 64), (2, 8, 64)])
    elif kind == "windows":
        run = data.window_batches(schedule=SCHEDULE, seed=2)
    else:
        run = data.random_batches(schedule=SCHEDULE, seed=2)
    traced = [run.trace(step) for step in range(4) if next(run) is not None]
    rebuilt = stream_of_state(data, run.state_dict())
    assert [rebuilt.trace(step) for step in range(4)] == traced
    assert "auto" in run.state_dict()["kind"] if kind == "windows" else True


def test_a_packed_mixture_draws_the_same_packs_at_any_batch_size_and_resumes_on_a_schedule():
    mix = _mixture()
    small, large = mix.packed_batches(4, 64, seed=2), mix.packed_batches(16, 64, seed=2)

    def rows(batch) -> list[tuple[int, int]]:
        return list(zip(batch["sources"].tolist(), batch["packs"].tolist(), strict=True))

    assert [r for _ in range(12) for r in rows(next(small))] == [r for _ in range(3) for r in rows(next(large))]
    plan = [(0, 4, 64), (2, 8, 64), (5, 16, 64)]
    whole = [rows(next(s)) for s in [mix.packed_batches(schedule=plan, seed=2)] for _ in range(8)]
    first = mix.packed_batches(schedule=plan, seed=2)
    got = [rows(next(first)) for _ in range(3)]
    two = [mix.packed_batches(schedule=plan, seed=2, rank=r, world_size=2) for r in range(2)]
    for s in two:
        s.load_state_dict(first.state_dict())
    got += [rows(next(two[0])) + rows(next(two[1])) for _ in range(5)]
    assert got == whole and [len(g) for g in got] == [4, 4, 8, 8, 8, 16, 16, 16]


def test_a_skipped_range_and_a_new_batch_size_on_resume_leave_no_row_out(tokens):
    """Steps 2..4 skipped (mode "data"), the run resumed at step 6 with twice the batch: the next
    step starts at the run's row 9 × 8 (data step 9), as the uninterrupted run's ledger has it."""
    run = _data(tokens).random_batches(8, 32, seed=5).skip(2, 5)
    for _ in range(6):
        next(run)
    wider = _data(tokens).random_batches(16, 32, seed=5)
    wider.load_state_dict(run.state_dict())
    rows = [o for s in [_data(tokens).random_batches(8, 32, seed=5)] for _ in range(12) for o in next(s).offsets]
    assert next(wider).offsets.tolist() == [int(o) for o in rows[72:88]]
    assert wider.state_dict()["schedule"] == [[0, 8, 32], [9, 16, 32]]
    packs = _data(tokens).packed(64, seed=3)
    p = packs.batches(4, order="rows").skip(1, 3)
    for _ in range(3):
        next(p)
    q = packs.batches(8, order="rows")
    q.load_state_dict(p.state_dict())
    truth = packs.batches(4, order="rows")
    order = [int(i) for _ in range(10) for i in next(truth)["packs"]]
    assert next(q)["packs"].tolist() == order[20:28]  # data step 5 of 4 packs: packs 20 ..


def test_after_a_new_seq_len_on_resume_the_past_traces_as_it_was(tokens):
    run = _data(tokens).random_batches(8, 32, seed=3)
    first = run.trace(0) if next(run) is not None else None
    for _ in range(3):
        next(run)
    longer = _data(tokens).random_batches(8, 64, seed=3)
    longer.load_state_dict(run.state_dict())
    assert longer.trace(0) == first and next(longer).x.shape == (8, 64)
    w = _data(tokens).window_batches(schedule=[(0, 8, 32), (2, 8, 48)], stride=16, seed=1)
    for _ in range(4):
        next(w)
    one = _data(tokens).window_batches(8, 64, stride=16, order="rows", seed=1)  # a length the run never drew
    one.load_state_dict(w.state_dict())
    assert next(one).x.shape == (8, 64)


def test_random_shifts_keep_row_order_at_any_batch_size(tokens):
    a = _data(tokens).random_batches(16, 32, shift="random", seed=2)
    b = _data(tokens).random_batches(64, 32, shift="random", seed=2)
    small = [o for _ in range(8) for o in next(a).offsets.tolist()]
    assert small == [o for _ in range(2) for o in next(b).offsets.tolist()]


def test_phases_out_of_order_are_refused_even_where_one_changes_nothing():
    with pytest.raises(ArgumentError, match="phase 3 starts at step 3, not after phase 2's step 5"):
        Schedule([(0, 8, 32), (5, 8, 32), (3, 16, 32)])
    with pytest.raises(ArgumentError, match="phase 3 starts at 500 tokens, not after the phase before it"):
        Schedule([{"tokens": 0, "batch_size": 8, "seq_len": 32}, {"tokens": 1000, "batch_size": 16, "seq_len": 32},
                  {"tokens": 500, "batch_size": 4, "seq_len": 32}])  # fmt: skip


def test_lmshard_trace_names_each_steps_ranks_under_a_schedule(tmp_path):
    """The CLI traces a scheduled state of 4 ranks: step 0 (8 rows) is 2 rows a rank, step 3 (32) 8."""
    import json

    from test_prepare import jsonl, make_texts
    from typer.testing import CliRunner

    from lmshard.cli import app
    from lmshard.prepare import PrepareConfig, prepare

    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "a.jsonl", make_texts(300, seed=2)))], out=str(tmp_path / "d"),
                          workers=1, val_fraction=0))  # fmt: skip
    stream = TokenDataset(tmp_path / "d").random_batches(schedule=[(0, 8, 16), (3, 32, 16)], rank=0, world_size=4)
    for _ in range(4):
        next(stream)
    (tmp_path / "s.json").write_text(json.dumps(stream.state_dict()))
    out = CliRunner().invoke(app, ["trace", str(tmp_path / "d"), "--state", str(tmp_path / "s.json"), "--steps", "0:4",
                                   "--json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    steps = [json.loads(line) for line in out.output.splitlines()]
    assert [[r["rank"] for r in s["rows"]] for s in steps][0] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [r["rank"] for r in steps[3]["rows"]] == [k // 8 for k in range(32)]
    val = TokenDataset(tmp_path / "d", "val", val_fraction=0.2, split_seed=1).random_batches(2, 16, seed=1)
    next(val)
    (tmp_path / "v.json").write_text(json.dumps(val.state_dict()))
    out = CliRunner().invoke(app, ["trace", str(tmp_path / "d"), "--state", str(tmp_path / "v.json"), "--steps", "0",
                                   "--json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    docs = [p["doc"] for r in json.loads(out.output)["rows"] for p in r["pieces"]]
    assert docs == [p.doc for row in val.trace(0) for p in row]
