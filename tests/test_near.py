"""`prepare --near-dedup`: planted near-duplicates of known Jaccard similarity (computed here from
word 5-gram sets with Python sets) found and kept apart as the configuration promises; the same
survivors for any worker count, task count and engine; `--append` against the persisted
signatures; the clustering against a union-find written here."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import xxhash
from test_minhash import WORDS, _jaccard
from test_prepare import jsonl
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import ConfigError
from lmshard.format import load_metadata
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.execution import taskplan
from lmshard.quality.minhash import MinHashConfig, signature
from lmshard.quality.near import MAX_REPRESENTATIVES, components, group_edges, near_duplicates


def _copy(rng: random.Random, base: list[str], lo: float, hi: float) -> tuple[list[str], float]:
    """A copy of `base` with words replaced at random places until its 5-gram Jaccard
    similarity to `base` lies in [lo, hi] (never an exact copy: those are exact dedup's)."""
    while True:
        copy = list(base)
        share = rng.uniform(0.0, 0.45)
        for i in rng.sample(range(len(base)), int(share * len(base))):
            copy[i] = rng.choice(WORDS)
        j = _jaccard(base, copy)
        if lo <= j <= hi and copy != base:
            return copy, j


def _planted(seed: int, bins: list[tuple[float, float, int]]) -> tuple[list[str], list[tuple[str, float]]]:
    """Documents in input order (each pair's original, later its copy) and (copy, Jaccard) pairs."""
    rng = random.Random(seed)
    originals, copies = [], []
    for lo, hi, n in bins:
        for _ in range(n):
            base = rng.sample(WORDS, rng.randint(120, 300))
            copy, j = _copy(rng, base, lo, hi)
            originals.append(" ".join(base))
            copies.append((" ".join(copy), j))
    order = list(range(len(copies)))
    rng.shuffle(order)
    return originals + [copies[i][0] for i in order], copies


def _kept_keys(out: Path) -> set[int]:
    """The exact keys of the documents the dataset kept (its dedup key files, read here)."""
    meta = load_metadata(out)
    files = [f for f in meta.dedup.files if f.kind == "doc"]
    return {int(k) for f in files for k in np.fromfile(out / f.path, dtype="<u8")}


def _key(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode())


def test_planted_near_duplicates_recall_and_false_positives(tmp_path):
    """Default configuration: recall >= 0.95 for pairs at J >= 0.8 (and at J in [0.8, 0.85] on
    its own), <= 1% false positives for pairs at J <= 0.5 (and in [0.45, 0.5] on its own)."""
    bins = [(0.8, 0.85, 200), (0.85, 1.0, 200), (0.3, 0.45, 200), (0.45, 0.5, 200)]
    texts, copies = _planted(3, bins)
    src = jsonl(tmp_path / "docs.jsonl", texts)
    meta = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "ds"), near_dedup=True, workers=2,
                                 val_fraction=0.0))  # fmt: skip
    kept = _kept_keys(tmp_path / "ds")
    assert all(_key(t) in kept for t in texts[: len(copies)])  # every original survives
    removed = np.array([_key(c) not in kept for c, _ in copies])
    j = np.array([j for _, j in copies])
    assert removed[j >= 0.8].mean() >= 0.95
    assert removed[(j >= 0.8) & (j <= 0.85)].mean() >= 0.95
    assert removed[j <= 0.5].mean() <= 0.01
    assert removed[(j >= 0.45) & (j <= 0.5)].mean() <= 0.01
    assert meta.drops["near_duplicate"] == removed.sum()
    assert meta.dedup.near["removed"] == removed.sum()
    assert meta.dedup.near["minhash"] == MinHashConfig().to_json()


def _clustered(seed: int, n: int = 160) -> list[str]:
    """Clusters of near-copies (J about 0.85-1), chains (each copy of the previous copy) and
    unrelated documents, interleaved."""
    rng = random.Random(seed)
    docs: list[str] = []
    for _ in range(n):
        base = rng.sample(WORDS, rng.randint(100, 250))
        docs.append(" ".join(base))
        for _ in range(rng.choice([0, 0, 1, 2, 3])):
            prev = base if rng.random() < 0.6 else docs[-1].split()
            docs.append(" ".join(_copy(rng, prev, 0.6, 1.0)[0]))
    rng.shuffle(docs)
    return docs


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and p.name != "dataset_metadata.json"}  # fmt: skip


def _meta_without_run(root: Path) -> dict:
    meta = json.loads((root / "dataset_metadata.json").read_text())
    meta.pop("run")
    return meta


@pytest.mark.parametrize("shard_tokens", [3_000, 10**8])
def test_survivors_are_the_same_for_any_workers_and_tasks(tmp_path, monkeypatch, shard_tokens):
    """Any worker or task count, and the dedup buckets resolved in groups (t7g: 2 groups of 16,
    as a plan of many tasks groups them): the same survivors and bytes."""
    docs = _clustered(11)
    src = jsonl(tmp_path / "docs.jsonl", docs)
    runs = {}
    for name, kw in {"w1": {"workers": 1}, "w2": {"workers": 2}, "w3": {"workers": 3},
                     "t1": {"num_tasks": 1, "workers": 2}, "t3": {"num_tasks": 3, "workers": 3, "unit_size": 65536},
                     "t7": {"num_tasks": 7, "workers": 2, "unit_size": 65536},
                     "t7g": {"num_tasks": 7, "workers": 2, "unit_size": 65536}}.items():  # fmt: skip
        if shard_tokens > 3_000 and name not in ("w1", "w3", "t7g"):  # (one shard: the runs that differ most)
            continue
        out = tmp_path / name
        with monkeypatch.context() as m:
            if name == "t7g":
                m.setattr(taskplan, "PAIRS", 2 * 7)
            prepare(PrepareConfig(inputs=[str(src)], out=str(out), near_dedup=True, val_fraction=0.1,
                                  tokens_per_shard=shard_tokens, **kw))  # fmt: skip
        runs[name] = out
    first = runs.pop("w1")
    for name, out in runs.items():
        assert _tree(out) == _tree(first), name
        assert _meta_without_run(out) == _meta_without_run(first), name
    kept = _kept_keys(first)
    removed = [d for d in docs if _key(d) not in kept]
    assert len(removed) == load_metadata(first).drops["near_duplicate"] > 10
    words = [d.split() for d in docs]
    for i, d in enumerate(docs):  # removed: a near-copy of an earlier document; kept: of no earlier kept one
        earlier = [_jaccard(words[i], words[k]) for k in range(i)]
        if _key(d) in kept:
            assert all(j < 0.9 for k, j in enumerate(earlier) if _key(docs[k]) in kept), i
        else:
            assert max(earlier) >= 0.5, i


def test_append_removes_near_copies_of_the_dataset(tmp_path):
    rng = random.Random(5)
    old = [" ".join(rng.sample(WORDS, 200)) for _ in range(120)]
    out = tmp_path / "ds"
    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "old.jsonl", old))], out=str(out), near_dedup=True,
                          workers=1))  # fmt: skip
    copies = [" ".join(_copy(rng, d.split(), 0.8, 0.95)[0]) for d in old[:50]]
    fresh = [" ".join(rng.sample(WORDS, 200)) for _ in range(30)]
    new = copies + fresh
    rng.shuffle(new)
    meta = prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "new.jsonl", new))], out=str(out), near_dedup=True,
                                 append=True, workers=2))  # fmt: skip
    kept = _kept_keys(out)
    assert all(_key(d) in kept for d in old + fresh)
    assert sum(_key(c) in kept for c in copies) <= 2  # recall 0.95 or better at J >= 0.8
    assert meta.drops["near_duplicate"] == sum(_key(c) not in kept for c in copies)
    sigs = [f for f in meta.dedup.files if f.kind == "near"]
    assert sum(f.n_keys for f in sigs) == meta.total_docs
    rows = np.concatenate([np.fromfile(out / f.path, dtype="<u4").reshape(-1, 110) for f in sigs])
    by_key = {_key(d): signature(d) for d in old + new}
    doc_keys = np.concatenate([np.fromfile(out / f.path, dtype="<u8") for f in meta.dedup.files if f.kind == "doc"])
    assert all(np.array_equal(rows[i], by_key[int(k)]) for i, k in enumerate(doc_keys))  # in the keys' order
    example = meta.dedup.near["examples"][0]
    assert example["survivor"]["source"] == "the dataset appended to" and example["agreement"] >= 0.7
    runner = CliRunner()
    for extra, says in (([], "--near-dedup --minhash 5:22x5:0.7"), (["--near-dedup", "--minhash", "5:20x5:0.7"],
                                                                   "pass the same")):  # fmt: skip
        result = runner.invoke(app, ["prepare", str(tmp_path / "new.jsonl"), "--out", str(out), "--append", *extra])
        assert result.exit_code != 0 and says in result.output and "Traceback" not in result.output
    plain = tmp_path / "plain"
    prepare(PrepareConfig(inputs=[str(tmp_path / "old.jsonl")], out=str(plain), workers=1))
    result = runner.invoke(app, ["prepare", str(tmp_path / "new.jsonl"), "--out", str(plain), "--append",
                                 "--near-dedup"])  # fmt: skip
    assert result.exit_code != 0 and "keeps no MinHash signatures" in result.output


@pytest.mark.parametrize("n_tasks", [1, 3])
def test_a_planned_append_removes_near_copies_of_the_dataset_as_one_process_does(tmp_path, n_tasks):
    """--append --near-dedup as planned tasks (in reversed order) equals a local one, byte for
    byte: the dataset's signatures numbered before the new documents, copies of its documents
    (and of each other) removed, an example whose survivor is in the dataset, and the signature
    files listed as one process lists them."""
    import shutil

    from lmshard.prepare.execution import local_exec
    from lmshard.prepare.execution.stages import STAGES, run_task

    rng = random.Random(7)
    old = _clustered(3, n=60)
    copies = [" ".join(_copy(rng, d.split(), 0.8, 0.95)[0]) for d in old[:40]]
    new = copies + _clustered(4, n=60)
    rng.shuffle(new)
    opts = dict(near_dedup=True, workers=1, val_fraction=0.1, tokens_per_shard=3_000)
    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "old.jsonl", old))], out=str(tmp_path / "local"), **opts))
    shutil.copytree(tmp_path / "local", tmp_path / "tasks", copy_function=os.link)
    src = str(jsonl(tmp_path / "new.jsonl", new))
    local = prepare(PrepareConfig(inputs=[src], out=str(tmp_path / "local"), append=True, **opts))
    config = PrepareConfig(inputs=[src], out=str(tmp_path / "tasks"), append=True, unit_size=65536, **opts)
    local_exec.claim(config, n_tasks)
    for stage in STAGES[:-1]:
        for task in reversed(range(n_tasks)):
            run_task(config, n_tasks, stage, task, 65536)
    run_task(config, n_tasks, "finish", 0, 65536)
    assert local.drops["near_duplicate"] > 40
    assert any(e["survivor"]["source"] == "the dataset appended to" for e in local.dedup.near["examples"])
    assert _tree(tmp_path / "tasks") == _tree(tmp_path / "local")
    assert _meta_without_run(tmp_path / "tasks") == _meta_without_run(tmp_path / "local")


def test_examples_pair_each_removed_document_with_its_survivor(tmp_path):
    """One process and a planned run cut into ranges (their lines numbered from each range's
    start, then made the file's): each example names its document's source and record."""
    docs = _clustered(2, n=60)
    src = jsonl(tmp_path / "docs.jsonl", docs)
    for name, kw in (("local", {"workers": 1}), ("tasks", {"num_tasks": 3, "unit_size": 65536, "workers": 2})):
        meta = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / name), near_dedup=True, **kw))
        examples = meta.dedup.near["examples"]
        assert 1 <= len(examples) <= 5
        for ex in examples:
            removed = [k for k, d in enumerate(docs) if d.startswith(ex["removed"]["text"])]
            survivor = [k for k, d in enumerate(docs) if d.startswith(ex["survivor"]["text"])]
            assert removed and survivor and min(survivor) < max(removed)  # an earlier document survived
            assert any(_jaccard(docs[r].split(), docs[s].split()) >= 0.5 for r in removed for s in survivor)
            assert ex["removed"]["source"] == ex["survivor"]["source"] == str(src)
            assert ex["agreement"] >= 0.7
            # each side names its record: the line of docs.jsonl it is on (one document a line), counted by hand
            assert ex["removed"]["record"] - 1 in removed and ex["survivor"]["record"] - 1 in survivor, ex


def test_minhash_option_is_checked_and_recorded(tmp_path):
    with pytest.raises(ConfigError, match="SHINGLE_WORDS:BANDSxROWS:THRESHOLD"):
        PrepareConfig(inputs=["x"], out="o", minhash="5x22")
    with pytest.raises(ConfigError, match="threshold"):
        PrepareConfig(inputs=["x"], out="o", minhash="5:22x5:1.5")
    src = jsonl(tmp_path / "docs.jsonl", _clustered(4, n=30))
    result = CliRunner().invoke(app, ["prepare", str(src), "--out", str(tmp_path / "ds"), "--near-dedup",
                                      "--minhash", "3:10x4:0.6", "--quiet"])  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = load_metadata(tmp_path / "ds")
    assert meta.dedup.near["minhash"]["n_grams"] == 3 and meta.dedup.near["minhash"]["bands"] == 10
    assert meta.config["near_dedup"] is True and meta.config["minhash"] == "3:10x4:0.6"
    result = CliRunner().invoke(app, ["prepare", "-", "--out", str(tmp_path / "x"), "--near-dedup", "--minhash",
                                      "3:10x4:0.6", "--quiet"], input=src.read_bytes())  # (read from a saved copy)
    assert result.exit_code == 0, result.output
    assert load_metadata(tmp_path / "x").total_docs == meta.total_docs


def _union_find(n: int, edges: list[tuple[int, int]]) -> list[int]:
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for a, b in edges:
        x, y = root(a), root(b)
        parent[max(x, y)] = min(x, y)
    return [root(i) for i in range(n)]


def test_components_equal_a_union_find():
    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(2, 400))
        m = int(rng.integers(0, 2 * n))
        a, b = rng.integers(0, n, m), rng.integers(0, n, m)
        ids = np.sort(rng.choice(10**12, n, replace=False)).astype(np.uint64)  # ids grow in plan order
        removed, survivor = components(ids[a], ids[b])
        roots = _union_find(n, list(zip(a.tolist(), b.tolist(), strict=True)))
        want = {int(ids[i]): int(ids[r]) for i, r in enumerate(roots) if r != i}
        assert dict(zip(removed.tolist(), survivor.tolist(), strict=True)) == want


def test_group_edges_follow_the_representative_rule():
    """Each group's members in id order: an edge to the first representative agreeing on enough
    values, else a new representative (a reference written here with Python loops)."""
    config = MinHashConfig(bands=2, rows=2, threshold=0.5)
    rng = np.random.default_rng(8)
    n = 300
    sigs = rng.integers(0, 3, (n, config.n_hashes)).astype(np.uint32)  # few values: many agreements
    keys = rng.integers(0, 25, n).astype(np.uint64)
    ids = rng.permutation(n).astype(np.uint64)
    member, rep = group_edges(keys, ids, lambda want: sigs[want.astype(np.int64)], config)
    want = set()
    for key in set(keys.tolist()):
        group = sorted(int(i) for i in ids[keys == key])
        reps = [group[0]]
        for m in group[1:]:
            hit = next((r for r in reps if (sigs[r] == sigs[m]).sum() >= config.agree_at_least), None)
            if hit is not None:
                want.add((m, hit))
            elif len(reps) < MAX_REPRESENTATIVES:
                reps.append(m)
    assert set(zip(member.tolist(), rep.tolist(), strict=True)) == want


def test_near_duplicates_keeps_a_dataset_appended_to():
    config = MinHashConfig()
    rng = random.Random(1)
    base = [" ".join(rng.sample(WORDS, 150)) for _ in range(20)]
    docs = base + base[:5]  # the last five copy the first five exactly
    sigs = np.stack([signature(d, config) for d in docs])
    removed, survivor = near_duplicates(sigs, config)
    assert removed.tolist() == list(range(20, 25)) and survivor.tolist() == list(range(5))
    removed, _ = near_duplicates(sigs, config, first_new=22)
    assert removed.tolist() == [22, 23, 24]


def _killed_and_resumed(monkeypatch, args: list[str], item: int) -> None:
    """`lmshard prepare ARGS` in many small work items, killed after its unit's work item
    `item` (the tokenize stage), then finished with --resume."""
    from proctree import finish, kill_group, start_prepare, wait_stopped

    monkeypatch.setenv("LMSHARD_BLOCK_BYTES", str(1 << 16))
    monkeypatch.setenv("LMSHARD_STOP_AT", f"item:{item}")
    proc = start_prepare(args)
    assert wait_stopped(proc) is not None
    monkeypatch.delenv("LMSHARD_STOP_AT")
    kill_group(proc.pid)
    proc.communicate()
    code, err = finish(start_prepare([*args, "--resume"]), 300)
    assert code == 0, err
    monkeypatch.delenv("LMSHARD_BLOCK_BYTES")  # (this process read the default: its workers must too)


def test_a_killed_run_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    """Killed midway through its tokenize stage, --resume goes on: the same bytes and signatures
    as a run that was never stopped."""
    src = jsonl(tmp_path / "docs.jsonl", _clustered(9, n=400))
    truth = tmp_path / "truth"
    prepare(PrepareConfig(inputs=[str(src)], out=str(truth), near_dedup=True, workers=2, val_fraction=0.1))
    out = tmp_path / "ds"
    _killed_and_resumed(monkeypatch, [str(src), "--out", str(out), "--workers", "2", "--near-dedup", "--val-fraction",
                                      "0.1", "--quiet"], 6)  # fmt: skip
    assert _tree(out) == _tree(truth)
    assert _meta_without_run(out)["dedup"] == _meta_without_run(truth)["dedup"]
    assert not list(out.rglob("*.tmp"))


def test_inspect_checks_the_signature_files(tmp_path):
    src = jsonl(tmp_path / "docs.jsonl", _clustered(6, n=40))
    out = tmp_path / "ds"
    meta = prepare(PrepareConfig(inputs=[str(src)], out=str(out), near_dedup=True, workers=1))
    runner = CliRunner()
    assert runner.invoke(app, ["inspect", str(out)]).exit_code == 0
    sigs = out / next(f.path for f in meta.dedup.files if f.kind == "near")
    data = bytearray(sigs.read_bytes())
    data[5] ^= 1
    sigs.write_bytes(bytes(data))
    result = runner.invoke(app, ["inspect", str(out)])
    assert result.exit_code != 0 and "near_sigs_000000.u32" in result.output and "checksum" in result.output
    sigs.write_bytes(bytes(data[:-4]))
    result = runner.invoke(app, ["inspect", str(out)])
    assert result.exit_code != 0 and "but 'n_keys'" in result.output


def test_overwrite_replaces_the_signature_files(tmp_path):
    """--overwrite of a --near-dedup dataset: the new dataset's signature files are its own (the
    old ones are lmshard's, not the user's, and are not carried over)."""
    out = tmp_path / "ds"
    first = jsonl(tmp_path / "a.jsonl", _clustered(1, n=80))
    prepare(PrepareConfig(inputs=[str(first)], out=str(out), near_dedup=True, workers=1))
    second = jsonl(tmp_path / "b.jsonl", _clustered(2, n=30))
    meta = prepare(PrepareConfig(inputs=[str(second)], out=str(out), near_dedup=True, workers=1, overwrite=True))
    assert CliRunner().invoke(app, ["inspect", str(out)]).exit_code == 0
    rows = np.concatenate([np.fromfile(out / f.path, dtype="<u4") for f in meta.dedup.files if f.kind == "near"])
    assert len(rows) == 110 * meta.total_docs
    prepare(PrepareConfig(inputs=[str(first)], out=str(out), workers=1, overwrite=True))
    assert not list(out.glob("dedup/near_sigs_*"))


def test_a_unit_that_keeps_nothing_and_documents_without_words(tmp_path):
    """A planned run with an empty input and a file of bad records (units that keep no
    document) gives the one-process bytes; documents without a word (all-punctuation lines)
    are not near-duplicates of each other."""
    src = tmp_path / "in"
    jsonl(src / "a.jsonl", _clustered(3, n=60))
    (src / "empty.jsonl").write_text("")
    (src / "bad.jsonl").write_text("not json\n" * 50)
    (src / "code.txt").write_text("int main() {\n}\n});\n]\n:-)\n}\n")
    kw = {"near_dedup": True, "on_error": "skip", "text_mode": "line"}
    one = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "one"), workers=1, **kw))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "many"), num_tasks=3, unit_size=65536, workers=2, **kw))
    assert _tree(tmp_path / "many") == _tree(tmp_path / "one")
    assert _meta_without_run(tmp_path / "many") == _meta_without_run(tmp_path / "one")
    kept = _kept_keys(tmp_path / "one")
    assert all(_key(t) in kept for t in ("});", "]", ":-)", "int main() {"))  # the second "}" is an exact copy
    assert one.drops["duplicate"] >= 1


def test_chains_and_large_clusters():
    """A chain of a hundred thousand edges in random order, and stars: one cluster each, its
    least id the survivor (what a union-find gives)."""
    rng = np.random.default_rng(4)
    n = 100_000
    ids = rng.permutation(n).astype(np.uint64)
    removed, survivor = components(ids[1:], ids[:-1])
    assert removed.tolist() == list(range(1, n)) and set(survivor.tolist()) == {0}
    star = np.arange(1, 1000, dtype=np.uint64)
    removed, survivor = components(star, np.full(len(star), 500, np.uint64))
    assert (survivor == 1).all() and 1 not in removed.tolist() and len(removed) == 998


def test_examples_survive_a_resume_and_skip_exact_copies(tmp_path, monkeypatch):
    """Near-copies late in the input, a kill after a few work items: the resumed run's examples
    (survivors' texts included) equal an uninterrupted run's; an exact copy of a document is
    never shown as a near-duplicate example."""
    rng = random.Random(3)
    docs = [" ".join(rng.sample(WORDS, 150)) for _ in range(400)]
    docs += [docs[0], docs[1]] + [" ".join(_copy(rng, docs[i].split(), 0.85, 0.95)[0]) for i in range(2, 12)]
    src = jsonl(tmp_path / "docs.jsonl", docs)
    truth = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "truth"), near_dedup=True, workers=2))
    assert len(truth.dedup.near["examples"]) == 5 and truth.drops["duplicate"] == 2
    assert all(e["agreement"] < 1 and e["survivor"]["text"] for e in truth.dedup.near["examples"])
    out = tmp_path / "ds"
    _killed_and_resumed(monkeypatch, [str(src), "--out", str(out), "--workers", "2", "--near-dedup", "--quiet"], 3)
    assert _meta_without_run(out)["dedup"] == _meta_without_run(tmp_path / "truth")["dedup"]
    tasks = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "tasks"), near_dedup=True, workers=2,
                                  num_tasks=3, unit_size=65536))  # fmt: skip
    assert tasks.dedup.near == truth.dedup.near


def test_tampered_near_metadata_is_one_line(tmp_path):
    out = tmp_path / "ds"
    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / "a.jsonl", _clustered(5, n=20)))], out=str(out),
                          near_dedup=True, workers=1))  # fmt: skip
    path = out / "dataset_metadata.json"
    good = json.loads(path.read_text())
    for bad in ({"bands": "abc"}, {"rows": -3}, {"threshold": 2}, {"n_grams": 0}):
        meta = json.loads(json.dumps(good))
        meta["dedup"]["near"]["minhash"].update(bad)
        path.write_text(json.dumps(meta))
        for args in (["inspect", str(out)], ["inspect", str(out), "--overlap", "splits"]):
            result = CliRunner().invoke(app, args)
            assert result.exit_code != 0 and "Traceback" not in result.output and "near" in result.output, bad
