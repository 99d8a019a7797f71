"""Near-duplicate clusters: `components` (quality/clusters.py) and the same clusters found over P
parts through files (quality/clusterparts.py), both against a union-find written plainly here,
on seeded graphs (chains in every order, stars, many small clusters, repeated edges and
self-loops, ids unit << 32 | document) and on generated ones."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmshard.quality import clusterparts, near
from lmshard.quality.clusterparts import components_in_parts, make_plan, unit_bounds
from lmshard.quality.clusters import components, least_labels


def _union_find(child: np.ndarray, parent: np.ndarray) -> dict[int, int]:
    """{removed: survivor}: every id joined to a lesser one, and the least id of its set."""
    up: dict[int, int] = {}

    def root(x: int) -> int:
        up.setdefault(x, x)
        while up[x] != x:
            up[x] = up[up[x]]  # path halving: keeps long chains cheap
            x = up[x]
        return x

    for a, b in zip(child.tolist(), parent.tolist(), strict=True):
        ra, rb = root(a), root(b)
        up[max(ra, rb)] = min(ra, rb)
    return {x: root(x) for x in sorted(up) if root(x) != x}


def _check(child: np.ndarray, parent: np.ndarray, removed: np.ndarray, survivor: np.ndarray) -> None:
    assert removed.dtype == np.uint64 and survivor.dtype == np.uint64
    assert bool((removed[1:] > removed[:-1]).all())  # sorted, each once
    assert dict(zip(removed.tolist(), survivor.tolist(), strict=True)) == _union_find(child, parent)


def _ids(docs: np.ndarray, per_unit: int = 1000) -> np.ndarray:
    """Document ordinals as planned ids: unit << 32 | document, units of `per_unit` documents."""
    docs = np.asarray(docs, dtype=np.uint64)
    return ((docs // np.uint64(per_unit)) << np.uint64(32)) | (docs % np.uint64(per_unit))


def _chain(n: int, order: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    docs = {"sorted": np.arange(n), "reversed": np.arange(n)[::-1],
            "random": np.random.default_rng(seed).permutation(n)}[order]  # fmt: skip
    ids = _ids(docs)
    return ids[1:], ids[:-1]


def _near_duplicate_shaped(seed: int, n_docs: int = 20_000) -> tuple[np.ndarray, np.ndarray]:
    """Many clusters of 2..5 (each member to an earlier one), a few stars onto their first
    member, a few chains, some edges twice (two bands) and in both directions."""
    rng = np.random.default_rng(seed)
    child, parent = [], []
    for _ in range(n_docs // 10):
        members = np.sort(rng.choice(n_docs, int(rng.integers(2, 6)), replace=False))
        for i in range(1, len(members)):
            child.append(members[i])
            parent.append(members[int(rng.integers(0, i))])
    for _ in range(3):
        members = np.sort(rng.choice(n_docs, 300, replace=False))
        child += members[1:].tolist()
        parent += [members[0]] * 299
        chain = np.sort(rng.choice(n_docs, 200, replace=False))
        child += chain[1:].tolist()
        parent += chain[:-1].tolist()
    c, p = _ids(np.array(child)), _ids(np.array(parent))
    twice = rng.random(len(c)) < 0.1
    flip = rng.random(len(c)) < 0.1
    return np.concatenate([np.where(flip, p, c), c[twice]]), np.concatenate([np.where(flip, c, p), p[twice]])


def _seeded() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(5)
    star = _ids(np.arange(1, 500))
    small = _ids(rng.integers(0, 3000, (2000, 2)))
    loops = _ids(rng.integers(0, 50, 40))
    wide = rng.integers(0, 2**64, 300, dtype=np.uint64)  # (too wide to pack with a position: the argsort path)
    return {
        **{f"chain {order}": _chain(2000, order) for order in ("sorted", "reversed", "random")},
        "star onto its first member": (star, np.full(len(star), _ids(np.array([0]))[0])),
        "star onto a late member": (star, np.full(len(star), _ids(np.array([250]))[0])),
        "many small clusters": (small[:, 0], small[:, 1]),
        "self-loops and repeats": (np.concatenate([loops, loops[:10]]), np.concatenate([loops, loops[5:15]])),
        "near-duplicate shaped": _near_duplicate_shaped(1),
        "ids over all 64 bits": (wide[small[:, 0] % 300], wide[small[:, 1] % 300]),
        "ids over all 64 bits, sorted by child": near.unique_edges(wide[small[:, 0] % 300], wide[small[:, 1] % 300]),
        "no edges": (np.zeros(0, np.uint64), np.zeros(0, np.uint64)),
    }


@pytest.mark.parametrize("name", list(_seeded()))
def test_components_equal_a_union_find(name):
    child, parent = _seeded()[name]
    _check(child, parent, *components(child, parent))


@pytest.mark.parametrize("order", ["sorted", "reversed", "random"])
def test_a_chain_of_100_000(order):
    child, parent = _chain(100_001, order, seed=7)
    removed, survivor = components(child, parent)
    _check(child, parent, removed, survivor)
    assert len(removed) == 100_000 and set(survivor.tolist()) == {0}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=80), st.integers(1, 3))
def test_components_of_generated_graphs(pairs, per_unit):
    edges = _ids(np.array(pairs, dtype=np.uint64).reshape(-1, 2), per_unit)
    _check(edges[:, 0], edges[:, 1], *components(edges[:, 0], edges[:, 1]))


def test_least_labels_name_every_end_and_near_reexports_components():
    nodes, least = least_labels(np.array([9, 5, 7], np.uint64), np.array([5, 3, 7], np.uint64))
    assert nodes.tolist() == [3, 5, 7, 9] and least.tolist() == [3, 3, 7, 3]
    assert near.components is components  # the dedup stage imports it from near


def _all_seeded() -> tuple[np.ndarray, np.ndarray]:
    """The seeded graphs side by side, each in units of its own (ids unit << 32 | document)."""
    shifted = [(c + (np.uint64(100 * i) << np.uint64(32)), p + (np.uint64(100 * i) << np.uint64(32)))
               for i, (c, p) in enumerate(_seeded().values())]  # fmt: skip
    return np.concatenate([c for c, _ in shifted]), np.concatenate([p for _, p in shifted])


@pytest.mark.parametrize(("parts", "fan_in"), [(1, 64), (2, 64), (3, 2), (3, 64), (7, 2), (7, 64)])
def test_parts_equal_components(tmp_path, parts, fan_in):
    child, parent = _all_seeded()
    removed, survivor = components_in_parts(child, parent, tmp_path, parts, fan_in)
    _check(child, parent, removed, survivor)
    files = [np.fromfile(tmp_path / f"result_{j:06d}.u64", dtype="<u8").reshape(2, -1) for j in range(parts)]
    assert np.array_equal(np.concatenate(files, axis=1), np.stack([removed, survivor]))  # in part order


@pytest.mark.parametrize("parts", [1, 2, 3, 7])
def test_parts_on_a_random_chain_of_100_000(tmp_path, parts):
    child, parent = _chain(100_001, "random", seed=3)
    removed, survivor = components_in_parts(child, parent, tmp_path, parts, fan_in=2)
    assert np.array_equal(removed, _ids(np.arange(1, 100_001))) and set(survivor.tolist()) == {0}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=60), st.sampled_from([1, 2, 3, 7]))
def test_parts_of_generated_graphs(pairs, parts):
    edges = _ids(np.array(pairs, dtype=np.uint64).reshape(-1, 2), 4)
    with tempfile.TemporaryDirectory() as work:
        _check(edges[:, 0], edges[:, 1], *components_in_parts(edges[:, 0], edges[:, 1], Path(work), parts, 2))


def test_routing_plans(tmp_path):
    """Hops and radix per part count: a task reads at most `fan_in` message files per hop."""
    got = {}
    for parts, fan_in in [(1, 64), (64, 64), (65, 64), (64_000, 64), (7, 2), (3, 2)]:
        plan = make_plan(tmp_path, parts, np.arange(1, parts, dtype=np.uint64), fan_in)
        got[parts, fan_in] = (plan.levels, plan.radix, plan.positions)
    assert got == {(1, 64): (1, 1, 1), (64, 64): (1, 64, 64), (65, 64): (2, 9, 81), (64_000, 64): (3, 40, 64_000),
                   (7, 2): (3, 2, 8), (3, 2): (2, 2, 4)}  # fmt: skip
    assert unit_bounds(10, 4).tolist() == [2 << 32, 5 << 32, 7 << 32]


def test_each_task_reads_at_most_radix_message_files_and_only_its_messages(tmp_path, monkeypatch):
    """Run the stages by hand (7 parts, fan-in 2: three hops over 8 positions), counting the
    message files each task opens; every message a part reads is addressed to it; a superstep
    run twice writes the same bytes (a task may be run again after a failure)."""
    child, parent = _near_duplicate_shaped(2, n_docs=3000)
    parts = 7
    plan = make_plan(tmp_path, parts, clusterparts.id_bounds(np.concatenate([child, parent]), parts), fan_in=2)
    opened: set[str] = set()
    real = np.fromfile

    def counting(path, *args, **kwargs):
        if Path(path).name.startswith("msgs_"):
            opened.add(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(clusterparts.np, "fromfile", counting)
    for s, (c, p) in enumerate(zip(np.array_split(child, parts), np.array_split(parent, parts), strict=True)):
        clusterparts.scatter(tmp_path, s, c, p)
    step, quiet = 0, 0
    while quiet < 2:
        for hop in range(1, plan.levels):
            for q in range(plan.positions):
                opened.clear()
                clusterparts.route(tmp_path, step, hop, q)
                assert len(opened) <= plan.radix
        step += 1
        for j in range(parts):
            opened.clear()
            inbox = clusterparts._gather(tmp_path, plan, step - 1, plan.levels - 1, j)
            assert len(opened) <= plan.radix and bool((inbox["dest"] == j).all())
            clusterparts.superstep(tmp_path, step, j)
        again = (tmp_path / f"labels_{step:04d}_000003.u64").read_bytes()
        clusterparts.superstep(tmp_path, step, 3)
        assert (tmp_path / f"labels_{step:04d}_000003.u64").read_bytes() == again
        quiet = quiet + 1 if clusterparts.quiet(tmp_path, step, parts) else 0
    results = [clusterparts.part_result(tmp_path, step, j) for j in range(parts)]
    _check(child, parent, np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results]))


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000])
def test_distinct_equals_np_unique(n):
    """quality/sets.distinct, which replaces np.unique of integers, against np.unique itself:
    repeats, the extremes of uint64, a 2-D array read flat, other integer types."""
    from lmshard.quality.sets import distinct

    rng = np.random.default_rng(n)
    values = rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False)
    values[: n // 3] = values[n // 3 : 2 * (n // 3)]  # (repeats)
    if n:
        values[0] = np.uint64(2**64 - 1)
    for a in (values, values.reshape(-1, 1), (values >> np.uint64(40)).astype(np.int64), values.astype(np.uint32)):
        got = distinct(a)
        assert got.dtype == a.dtype and np.array_equal(got, np.unique(a))
