"""Benchmark decontamination (`prepare --decontaminate`), on planted contamination the test
brings: two benchmark files of generated questions, planted in four ways into clean documents
(whole items, items inside long documents, short one-line items, items with their whitespace,
case and punctuation changed); recall and false positives are counted by hand here, and the
removals are the same for any worker or task count."""

from __future__ import annotations

import json
import random
import re

import pytest
from test_prepare import jsonl, make_texts

from lmshard.errors import ConfigError
from lmshard.format import load_metadata
from lmshard.prepare import PrepareConfig, prepare
from lmshard.quality.decon import Decontaminator

HEADS = ("ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "ze")
TAILS = ("bar", "cen", "dol", "fim", "gus", "hap", "jor", "kel", "lun", "mos", "nip", "pol", "rus", "tam", "vex")
VOCAB = [a + b for a in HEADS for b in TAILS]


def _question(rng: random.Random, n: int) -> str:
    return "Which " + " ".join(rng.choice(VOCAB) for _ in range(n - 2)) + " is true?"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("decon")
    rng = random.Random(4)
    quiz = [{"question": _question(rng, rng.randint(14, 40)), "answer": _question(rng, rng.randint(8, 11))}
            for _ in range(200)]  # fmt: skip
    math = [_question(rng, rng.randint(20, 30)) for _ in range(100)]
    (root / "quiz.jsonl").write_text("".join(json.dumps(r) + "\n" for r in quiz))
    (root / "math.txt").write_text("\n".join(math) + "\n")
    clean = make_texts(3000, seed=9)
    docs, truth = [], []  # truth: the benchmark each planted document holds (None: clean)
    for i, text in enumerate(clean):
        kind = i % 10
        if kind == 1:  # a whole item
            docs.append(quiz[i % 200]["question"])
            truth.append("quiz")
        elif kind == 2:  # inside a long document
            docs.append(text + "\n" + " ".join(clean[(i + 7) % 3000].split()[:60]) + " " + math[i % 100] + " " + text)
            truth.append("math")
        elif kind == 3:  # a short one-line item (an answer of 8 to 11 words), as a line of a document
            docs.append(text + "\n" + quiz[i % 200]["answer"] + "\n" + text)
            truth.append("quiz")
        elif kind == 4:  # whitespace, case and punctuation changed
            item = quiz[(i + 3) % 200]["question"]
            docs.append(text + "\n" + re.sub(" ", lambda m: rng.choice(["  ", "\n", " , ", " "]), item.upper()))
            truth.append("quiz")
        else:
            docs.append(text)
            truth.append(None)
    return root, jsonl(root / "docs.jsonl", docs), docs, truth


def test_recall_and_false_positives_on_planted_contamination(planted):
    root, _, docs, truth = planted
    decon = Decontaminator([str(root / "quiz.jsonl"), str(root / "math.txt")])
    said = [decon.matches(d) for d in docs]
    names = [None if s is None else decon.benchmarks[s].name for s in said]
    for kind in (1, 2, 3, 4):
        planted_docs = [k for k in range(len(docs)) if k % 10 == kind]
        recall = sum(names[k] == truth[k] for k in planted_docs) / len(planted_docs)
        assert recall >= 0.99, (kind, recall)
    clean = [k for k in range(len(docs)) if truth[k] is None]
    assert sum(names[k] is not None for k in clean) <= 0.001 * len(clean)


def test_prepare_removes_them_counted_per_benchmark_the_same_for_any_workers_and_tasks(planted, tmp_path):
    root, src, docs, truth = planted
    benchmarks = [str(root / "quiz.jsonl"), f"arith={root / 'math.txt'}"]
    runs = []
    for name, kw in (("w1", {"workers": 1}), ("w2", {"workers": 2}), ("t3", {"workers": 2, "num_tasks": 3})):
        out = tmp_path / name
        prepare(PrepareConfig(inputs=[str(src)], out=str(out), decontaminate=benchmarks, val_fraction=0, quiet=True,
                              dedup="none", tokens_per_shard=20_000, **kw))  # fmt: skip
        runs.append(out)
    meta = load_metadata(runs[0])
    expected = {"contaminated_quiz": sum(t == "quiz" for t in truth),
                "contaminated_arith": sum(t == "math" for t in truth)}  # fmt: skip
    assert {k: v for k, v in meta.drops.items() if k.startswith("contaminated_")} == expected
    assert meta.n_docs() == sum(t is None for t in truth)
    assert set(meta.config["decontaminate_sources"]) == {"quiz", "arith"}
    for other in runs[1:]:
        b = load_metadata(other)
        assert b.drops == meta.drops
        for x, y in zip(meta.shards, b.shards, strict=True):
            assert (runs[0] / x.path).read_bytes() == (other / y.path).read_bytes()


def test_lines_mode_keeps_the_rest_of_the_document(planted, tmp_path):
    root, _, docs, truth = planted
    decon = Decontaminator([str(root / "quiz.jsonl")], mode="lines")
    k = next(i for i in range(len(docs)) if i % 10 == 3)  # a short item as a line of a document
    edited = decon(docs[k])
    assert str(edited) == "\n".join(line for line in docs[k].split("\n") if line not in docs[k].split("\n")[1:2]) or \
        len(str(edited)) < len(docs[k])  # fmt: skip
    assert list(edited.removed) == ["contaminated_quiz"] and decon.matches(str(edited)) is None


def test_decontaminate_mistakes_are_one_line(tmp_path):
    (tmp_path / "tiny.txt").write_text("too short\n")
    (tmp_path / "bad.jsonl").write_text('{"question": "a b c d e f g h i"}\nnot json\n')
    (tmp_path / "good.txt").write_text("one two three four five six seven eight nine\n")
    good = str(tmp_path / "good.txt")
    for specs, words in (([str(tmp_path / "missing.jsonl")], "cannot read it"),
                         ([str(tmp_path / "tiny.txt")], "no item of 8 words"),
                         ([str(tmp_path / "bad.jsonl")], "line 2 is not JSON"),
                         ([f"a={good}", f"a={good}"], "two benchmarks are named 'a'")):  # fmt: skip
        with pytest.raises(ConfigError, match=words) as caught:
            Decontaminator(specs)
        assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="--decontaminate-n 5"):
        Decontaminator([good], n=5)


def test_inspect_reports_what_prepare_would_remove_and_changes_nothing(planted, tmp_path):
    import hashlib

    from typer.testing import CliRunner

    from lmshard.cli import app

    root, src, docs, truth = planted
    out = tmp_path / "ds"
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), val_fraction=0.1, quiet=True, dedup="none"))
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*") if p.is_file()}
    said = CliRunner().invoke(app, ["inspect", str(out), "--decontaminate", str(root / "quiz.jsonl"),
                                    "--decontaminate", f"arith={root / 'math.txt'}", "--json"])  # fmt: skip
    assert said.exit_code == 0, said.output
    found = json.loads(said.output)
    assert {k: sum(v.values()) for k, v in found["contaminated"].items()} == {
        "quiz": sum(t == "quiz" for t in truth), "arith": sum(t == "math" for t in truth)}  # fmt: skip
    assert found["documents"] == len(docs) and set(found["contaminated"]["quiz"]) == {"train", "val"}
    records = [json.loads(line) for line in (root / "quiz.jsonl").read_text().splitlines()]
    items = [r[k] for r in records for k in ("question", "answer")]
    items += (root / "math.txt").read_text().splitlines()
    for e in found["examples"]:  # each example names the item the document shares its words with
        assert any(item.startswith(e["item"]) for item in items), e
    assert before == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.rglob("*") if p.is_file()}


def test_a_changed_benchmark_file_stops_a_resume_in_one_line(planted, tmp_path):
    from lmshard.prepare.output.claim import difference

    root, src, _, _ = planted
    bench = tmp_path / "quiz.jsonl"
    bench.write_text((root / "quiz.jsonl").read_text())
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "o"), decontaminate=[str(bench)])
    started = {"config": config.recorded()}
    bench.write_text((root / "quiz.jsonl").read_text().replace("Which", "What", 1))
    said = difference(started, {"config": config.recorded()})
    assert said == f"the benchmark {bench} (--decontaminate) changed since the run started; put it back as it was"
