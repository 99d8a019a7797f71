"""`inspect --overlap`: planted exact and near copies between the splits of a dataset and between
two datasets are found, counted once each, with nothing else reported."""

from __future__ import annotations

import json
import random

from test_prepare import jsonl
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.format import load_metadata
from lmshard.inspect import audit, overlap
from lmshard.prepare import PrepareConfig, prepare

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join("".join(rng.choices(LETTERS, k=rng.randint(3, 9))) for _ in range(80)) + "." for _ in range(n)]


def _near(text: str, seed: int) -> str:
    words = text.split()
    words[random.Random(seed).randrange(len(words) - 1)] = "changed"  # 5-gram Jaccard about 0.9
    return " ".join(words)


def _prepare(tmp_path, name, texts, val_fraction=0.3):
    out = tmp_path / name
    prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / f"{name}.jsonl", texts))], out=str(out), quiet=True,
                          val_fraction=val_fraction, workers=1))  # fmt: skip
    return out


def _split_texts(root):
    meta = load_metadata(root)
    decode = audit.decoder_for(meta)
    return {s: {t for _, t in overlap.documents(meta, (s,), decode)} for s in meta.splits}


def test_near_copies_across_the_splits_of_a_dataset(tmp_path):
    base = _texts(300, 1)
    copies = {i: _near(base[i], i) for i in range(0, 120, 3)}
    root = _prepare(tmp_path, "a", base + list(copies.values()))
    texts = _split_texts(root)
    # the truth: planted pairs whose two documents landed in different splits (a train one counted once)
    expected = {(base[i] if base[i] in texts["train"] else c) for i, c in copies.items()
                if (base[i] in texts["train"]) != (c in texts["train"])}  # fmt: skip
    assert len(expected) >= 5
    result = overlap.overlap(*overlap.sides(str(root), None), (audit.decoder_for(load_metadata(root)),) * 2)
    assert (result.exact, result.near) == (0, len(expected))
    assert result.scanned == len(texts["train"]) and result.indexed == len(texts["val"])


def test_exact_and_near_copies_of_another_dataset(tmp_path):
    base = _texts(200, 2)
    train = _prepare(tmp_path, "train", base, val_fraction=0.1)
    evaluation = base[:10] + [_near(t, i) for i, t in enumerate(base[10:22])] + _texts(30, 3)
    eval_root = _prepare(tmp_path, "eval", evaluation, val_fraction=0.0)
    result = CliRunner().invoke(app, ["inspect", str(train), "--overlap", str(eval_root), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["exact"], report["near"]) == (10, 12)
    assert report["scanned"] == 200 and report["indexed"] == 52
    kinds = {e["kind"] for e in report["examples"]}
    assert kinds == {"exact", "near"} and all(0.8 <= e["similarity"] <= 1 for e in report["examples"])
    for e in report["examples"]:  # each side named with its dataset
        assert e["first"].startswith(f"{train}/train/shard_") and e["second"].startswith(f"{eval_root}/train/shard_")
    text = " ".join(CliRunner().invoke(app, ["inspect", str(train), "--overlap", str(eval_root)]).output.split())
    assert "exact overlap: 10" in text and "near overlap (estimated Jaccard >= 0.8): 12" in text


def test_stored_keys_and_signatures_give_the_decoded_answer(tmp_path):
    """Datasets made with --near-dedup are compared from their stored keys and signatures: the
    same counts and places as reading and signing every document again, without decoding them."""
    base = _texts(200, 4)
    evaluation = base[:10] + [_near(t, i) for i, t in enumerate(base[10:22])] + _texts(30, 5)
    roots = {}
    for name, texts, vf in (("train", base, 0.2), ("eval", evaluation, 0.3)):
        roots[name] = tmp_path / name
        prepare(PrepareConfig(inputs=[str(jsonl(tmp_path / f"{name}.jsonl", texts))], out=str(roots[name]),
                              quiet=True, val_fraction=vf, workers=1, near_dedup=True))  # fmt: skip
    metas = {k: load_metadata(v) for k, v in roots.items()}
    decoders = (audit.decoder_for(metas["train"]), audit.decoder_for(metas["eval"]))
    for sides in (overlap.sides(str(roots["train"]), str(roots["eval"])), overlap.sides(str(roots["eval"]), None)):
        fast = overlap.overlap(*sides, decoders)
        slow = overlap.overlap(*sides, decoders, stored=False)
        assert fast.to_json() == slow.to_json()
    assert (fast.exact, fast.near) == (0, 0)  # --near-dedup left no near-copies between the eval splits
    cross = overlap.overlap(*overlap.sides(str(roots["train"]), str(roots["eval"])), decoders)
    assert (cross.exact, cross.near) == (10, 12)
    calls = []
    real = overlap.documents
    try:
        overlap.documents = lambda *a: calls.append(a) or real(*a)  # type: ignore[assignment]
        overlap.overlap(*overlap.sides(str(roots["train"]), str(roots["eval"])), decoders)
    finally:
        overlap.documents = real  # type: ignore[assignment]
    assert calls == []  # nothing read back but the examples
