"""Document filters as prepare steps (`--filter`): drops counted by reason against the filters
called on the same cleaned texts here, the same bytes for any worker or task count, and one-line
errors for a filter that cannot be found or answers wrongly."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from test_gopher import _document, reference
from test_prepare import jsonl
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import ConfigError
from lmshard.format import load_metadata
from lmshard.prepare import PrepareConfig, prepare

FILTER_FILE = '''
def no_river(text):
    return "mentions_river" if "river" in text.split()[:3] else None

def loud(text):
    return not text.isupper()

def broken(text):
    return 42
'''


@pytest.fixture
def corpus(tmp_path):
    rng = random.Random(8)
    texts = [_document(rng) for _ in range(1500)]
    texts += [t.upper() for t in texts[:40]]
    return jsonl(tmp_path / "docs.jsonl", texts), texts


def _run(tmp_path, src, name, filters, **kw):
    out = tmp_path / name
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), filters=filters, val_fraction=0.1, quiet=True,
                          tokens_per_shard=50_000, dedup="none", **kw))  # fmt: skip
    return out


def test_drops_by_reason_are_the_filters_verdicts(tmp_path, corpus):
    src, texts = corpus
    (tmp_path / "myfilters.py").write_text(FILTER_FILE)
    spec = f"{tmp_path / 'myfilters.py'}"
    out = _run(tmp_path, src, "ds", ["gopher_quality", f"{spec}:no_river", f"{spec}:loud"], workers=2)
    expected: Counter[str] = Counter()
    for t in texts:  # the first filter that objects names the reason (the texts are clean already)
        reason = reference(t) or ("mentions_river" if "river" in t.split()[:3] else None)
        reason = reason or (None if not t.isupper() else "loud")
        expected[reason or "kept"] += 1
    meta = load_metadata(out)
    drops = {k: v for k, v in meta.drops.items() if v}
    kept = expected.pop("kept")
    assert drops == dict(expected) and meta.n_docs() == kept
    assert meta.config["filters"] == ["gopher_quality", f"{spec}:no_river", f"{spec}:loud"]
    assert meta.drop_examples["mentions_river"].endswith(f"dropped by --filter {spec}:no_river")


def test_the_same_bytes_for_any_workers_and_tasks(tmp_path, corpus):
    src, _ = corpus
    runs = [_run(tmp_path, src, f"w{w}", ["gopher_quality"], workers=w) for w in (1, 2)]
    runs.append(_run(tmp_path, src, "tasks3", ["gopher_quality"], workers=2, num_tasks=3))
    first = load_metadata(runs[0])
    for other in runs[1:]:
        meta = load_metadata(other)
        assert meta.drops == first.drops
        for a, b in zip(first.shards, meta.shards, strict=True):
            assert (runs[0] / a.path).read_bytes() == (other / b.path).read_bytes()


def test_mistakes_are_one_line(tmp_path, corpus):
    src, _ = corpus
    (tmp_path / "myfilters.py").write_text(FILTER_FILE)
    with pytest.raises(ConfigError, match="not a built-in filter"):
        PrepareConfig(inputs=[str(src)], out=str(tmp_path / "x"), filters=["gopher"])
    with pytest.raises(ConfigError, match="has no function 'nothing'"):
        PrepareConfig(inputs=[str(src)], out=str(tmp_path / "x"), filters=[f"{tmp_path / 'myfilters.py'}:nothing"])
    result = CliRunner().invoke(app, ["prepare", str(src), "--out", str(tmp_path / "y"), "--filter",
                                      f"{tmp_path / 'myfilters.py'}:broken", "--workers", "1"])  # fmt: skip
    text = " ".join(result.output.split())
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "returned 42" in text and "return None to keep" in text, text
    assert not (tmp_path / "y" / "dataset_metadata.json").exists()
