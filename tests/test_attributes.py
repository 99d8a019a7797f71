"""Per-document attributes (`prepare --attribute`, format/attributes.py) and their use at load time
(`TokenDataset(where=...)`, `Mixture.by_attribute`, `inspect --attribute`).

Independent truths: the filters' own verdicts (a `where` that restates a filter's rules keeps
exactly what `--filter` keeps), numpy reading the raw `.attr`, `.idx` and `.bin` bytes, and
hand counts of the texts."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lmshard import Mixture, TokenDataset
from lmshard.cli import app
from lmshard.errors import ArgumentError, ConfigError, InputError
from lmshard.format import load_metadata
from lmshard.prepare import PrepareConfig, prepare

VOCAB = ["the", "be", "to", "of", "and", "that", "have", "with", "river", "stone", "light", "cloud", "paper",
         "window", "garden", "music"]  # fmt: skip
DTYPES = {"float32": "<f4", "uint32": "<u4", "category": "<u2"}


def _texts(n: int, seed: int = 0) -> list[str]:
    """Documents that fall on both sides of every Gopher and FineWeb rule: short and long, with
    bullets, ellipses, '#', digits, repeated and short lines."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        lines = []
        for _ in range(rng.randint(1, 8)):
            words = rng.choices(VOCAB + ["#", "...", "42", "x1"] * rng.randint(0, 2), k=rng.randint(1, 25))
            line = (rng.choice(["", "", "• ", "- "]) + " ".join(words) + rng.choice(["", ".", "!", "…"]))
            lines.append(line)
            if rng.random() < 0.2:
                lines.append(line)  # a repeated line
        out.append(f"doc {i}: " + ("\n\n" if rng.random() < 0.3 else "\n").join(lines))
    return out


def _write(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def _prepare(out: Path, src: Path, **kw) -> Path:
    kw.setdefault("workers", 1)
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), tokenizer="gpt2", **kw))
    return out


def _rows(root: Path, split: str = "train") -> tuple[np.ndarray, list[np.ndarray]]:
    """Every document's attribute record and tokens (separator included), from the raw files."""
    meta = json.loads((root / "dataset_metadata.json").read_text())
    dtype = np.dtype([(a["name"], DTYPES[a["dtype"]]) for a in meta["attributes"]])
    rows, docs = [], []
    for shard in meta["splits"][split]["shards"]:  # the columns one after another (docs/format.md)
        data, n, at = (root / shard["attr_path"]).read_bytes(), shard["n_docs"], 0
        assert len(data) == n * dtype.itemsize
        part = np.zeros(n, dtype)
        for name in dtype.names:
            kind = dtype.fields[name][0]
            part[name] = np.frombuffer(data, dtype=kind, count=n, offset=at)
            at += n * kind.itemsize
        rows.append(part)
        index = np.fromfile(root / shard["index_path"], dtype="<u8").astype(np.int64)
        tokens = np.fromfile(root / shard["path"], dtype="<u4")
        docs += [tokens[a:b] for a, b in zip(index[:-1], index[1:], strict=True)]
    return np.concatenate(rows), docs


def _doc_set(root: Path) -> set[bytes]:
    return {d.tobytes() for split in ("train", "val") for d in _rows_plain(root, split)}


def _rows_plain(root: Path, split: str) -> list[np.ndarray]:
    meta = load_metadata(root)
    out = []
    for shard in meta.split_shards(split):
        index = np.fromfile(root / shard.index_path, dtype="<u8").astype(np.int64)
        tokens = np.fromfile(root / shard.path, dtype="<u4")
        out += [tokens[a:b] for a, b in zip(index[:-1], index[1:], strict=True)]
    return out


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """A dataset with every built-in numeric scorer, several shards, and its source."""
    root = tmp_path_factory.mktemp("attributes")
    src = _write(root / "docs.jsonl", _texts(1500))
    out = _prepare(root / "ds", src, attributes=["length", "gopher_quality", "gopher_repetition", "fineweb_quality"],
                   tokens_per_shard=20_000, val_fraction=0.1)  # fmt: skip
    return src, out


RULES = {  # each filter's rules restated as a where= over its statistics (quality/gopher.py, repetition.py)
    "gopher_quality": "50 <= gopher_word_count <= 100000 and 3 <= gopher_word_length <= 10 and gopher_symbols <= 0.1 "
                      "and not gopher_bullets > 0.9 and not gopher_ellipsis_lines > 0.3 and gopher_alphabetic >= 0.8 "
                      "and gopher_stop_words >= 2",
    "fineweb_quality": "(lines == 0) or (fineweb_line_punctuation >= 0.12 and fineweb_short_lines <= 0.67 and "
                       "fineweb_dup_line_chars <= 0.01 and not fineweb_newlines > 0.3)",
    "gopher_repetition": "(chars == 0) or (not gopher_dup_paragraphs > 0.3 and gopher_dup_paragraph_chars <= 0.2 and "
                         "not gopher_dup_lines > 0.3 and gopher_dup_line_chars <= 0.2 and gopher_top_2gram <= 0.2 and "
                         "gopher_top_3gram <= 0.18 and gopher_top_4gram <= 0.16 and gopher_dup_5gram <= 0.15 and "
                         "gopher_dup_6gram <= 0.14 and gopher_dup_7gram <= 0.13 and gopher_dup_8gram <= 0.12 and "
                         "gopher_dup_9gram <= 0.11 and gopher_dup_10gram <= 0.1)",
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_where_restating_a_filter_keeps_what_the_filter_keeps(scored, tmp_path, name):
    src, out = scored
    filtered = _prepare(tmp_path / "f", src, filters=[name], val_fraction=0.1)
    chosen = {d.tobytes() for split in ("train", "val") for d in _tokens(TokenDataset(out, split, where=RULES[name]))}
    assert chosen == _doc_set(filtered)
    kept = len(chosen)
    assert 0 < kept < load_metadata(out).total_docs  # (the rules cut the set: the test can fail)


def _tokens(data: TokenDataset) -> list[np.ndarray]:
    """The documents a where= dataset holds, by its own document index (its store's)."""
    stream = data.tokens(0, data.n_tokens)
    ends = np.flatnonzero(stream == 50256) + 1
    return np.split(stream, ends)[:-1]


def test_length_columns_are_hand_counts_of_the_kept_text(scored, reference):
    _, out = scored
    rows, docs = _rows(out)
    enc = reference
    for r, d in list(zip(rows, docs, strict=True))[:200]:
        text = enc.decode(d[:-1].tolist())
        assert r["chars"] == len(text)
        assert r["lines"] == sum(1 for line in text.splitlines() if line.strip())
        assert r["words"] >= 1 and r["words"] <= len(text.split())


def test_the_same_bytes_for_any_workers_and_tasks(scored, tmp_path):
    src, out = scored
    kw = {"attributes": ["length", "gopher_quality", "gopher_repetition", "fineweb_quality"],
          "tokens_per_shard": 20_000, "val_fraction": 0.1}  # fmt: skip
    for name, extra in (("w2", {"workers": 2}), ("t3", {"workers": 2, "num_tasks": 3, "unit_size": 64 << 10})):
        other = _prepare(tmp_path / name, src, **kw, **extra)
        files = sorted(p.relative_to(out) for p in out.rglob("shard_*"))
        assert any(str(f).endswith(".attr") for f in files)
        for rel in files:
            assert (other / rel).read_bytes() == (out / rel).read_bytes(), (name, rel)


def test_where_draws_only_passing_documents_and_their_tokens(scored):
    _, out = scored
    where = "fineweb_short_lines < 0.5 and words > 20"
    rows, docs = _rows(out)
    passing = (rows["fineweb_short_lines"] < np.float32(0.5)) & (rows["words"] > 20)
    expected = np.concatenate([d for d, ok in zip(docs, passing, strict=True) if ok])
    data = TokenDataset(out, where=where)
    assert data.n_tokens == len(expected) and data.n_docs == int(passing.sum())
    assert 0 < data.n_tokens < TokenDataset(out).n_tokens
    assert np.array_equal(data.tokens(0, data.n_tokens), expected)
    x, _ = next(data.window_batches(4, 64, stride=64, shuffle=False))
    assert np.array_equal(x.numpy(), expected[: 4 * 64].reshape(4, 64).astype(np.int64))
    batches = data.random_batches(8, 32, seed=3)
    text = expected.tobytes()
    for _ in range(5):  # every random row is a piece of the passing documents' stream
        x, _ = next(batches)
        for row in x.numpy().astype(np.uint32):
            assert text.find(row.tobytes()) % 4 == 0
    assert data.data_id != TokenDataset(out).data_id != TokenDataset(out, where="words > 21").data_id
    # the rows' token share: a row starts in a document as often as its tokens' share of the selection
    kept = [(r, len(d)) for r, d in zip(rows, docs, strict=True) if r["fineweb_short_lines"] < np.float32(0.5) and
            r["words"] > 20]  # fmt: skip
    starts = np.cumsum([0] + [n for _, n in kept])
    long_docs = np.array([r["words"] > 60 for r, _ in kept])
    share = sum(n for (r, n), big in zip(kept, long_docs, strict=True) if big) / starts[-1]
    stream = data.random_batches(8, 32, seed=11)
    offsets = np.concatenate([stream.global_reads(step)[0] for step in range(2000)])
    in_long = long_docs[np.searchsorted(starts, offsets, side="right") - 1]
    assert 0.05 < share < 0.95 and abs(in_long.mean() - share) < 0.02, (in_long.mean(), share)


def test_where_with_a_load_time_split_and_on_val(scored):
    _, out = scored
    both = TokenDataset(out, split="val", where="words > 20")
    rows, docs = _rows(out, "val")
    assert both.n_tokens == sum(len(d) for d, r in zip(docs, rows, strict=True) if r["words"] > 20)


def test_where_refuses_what_it_cannot_read(scored, tmp_path):
    _, out = scored
    for bad, said in (("wrods > 3", "did you mean words"), ("words", "not a condition"),
                      ("__import__('os').system('x') > 0", "not allowed"), ("words >", "does not parse"),
                      ("words > 1e9", "without a document")):  # fmt: skip
        with pytest.raises(ArgumentError, match=said):
            TokenDataset(out, where=bad)
    plain = _prepare(tmp_path / "plain", _write(tmp_path / "p.jsonl", _texts(20)))
    with pytest.raises(ArgumentError, match="keeps none; prepare it with --attribute"):
        TokenDataset(plain, where="words > 3")


def test_a_category_compares_with_its_labels(tmp_path):
    pytest.importorskip("py3langid")
    texts = [f"the river and the stone of the garden, number {i}." for i in range(30)]
    texts += [f"der Fluss und der Stein des Gartens ist sehr schön, Nummer {i}." for i in range(30)]
    out = _prepare(tmp_path / "lang", _write(tmp_path / "l.jsonl", texts), attributes=["language"], val_fraction=0)
    meta = load_metadata(out)
    labels = meta.attributes[0].labels
    rows, docs = _rows(out)
    english = TokenDataset(out, where="language == 'en' and language_score > 0.5")
    assert english.n_tokens == sum(len(d) for d, r in zip(docs, rows, strict=True)
                                   if labels[r["language"]] == "en" and r["language_score"] > 0.5)  # fmt: skip
    assert 0 < english.n_docs < 60
    either = TokenDataset(out, where="language in ('en', 'de')")
    assert either.n_docs == sum(labels[r["language"]] in ("en", "de") for r in rows)
    with pytest.raises(ArgumentError, match="no label 'english'"):
        TokenDataset(out, where="language == 'english'")
    with pytest.raises(ArgumentError, match="is a category"):
        TokenDataset(out, where="language > 3")


PLUGIN = '''
def quality(text):
    return text.count("river") / max(1, len(text.split()))

def pair(text):
    return {"a": len(text), "b": None if "stone" in text else 1.5}

def broken(text):
    return "high" if "garden" in text else 1.0
'''


def test_plugin_scorers_and_their_code_in_the_fingerprint(tmp_path, reference):
    from lmshard.prepare.documents.sources import discover
    from lmshard.prepare.output.claim import _fingerprint, difference
    from lmshard.tokenizers import load_tokenizer

    plugin = tmp_path / "scores.py"
    plugin.write_text(PLUGIN)
    texts = _texts(100, seed=2)
    src = _write(tmp_path / "d.jsonl", texts)
    out = _prepare(tmp_path / "ds", src, attributes=[f"{plugin}:quality", f"{plugin}:pair=a,b"], val_fraction=0)
    rows, docs = _rows(out)
    enc = reference
    for r, d in zip(rows, docs, strict=True):
        text = enc.decode(d[:-1].tolist())
        assert r["quality"] == np.float32(text.count("river") / max(1, len(text.split())))
        assert r["a"] == len(text) and (np.isnan(r["b"]) if "stone" in text else r["b"] == 1.5)
    assert [f.by for f in load_metadata(out).attributes][-1].endswith("scores.py:pair=a,b")
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "o"), attributes=[f"{plugin}:quality"])
    fp = lambda: _fingerprint(config, discover(config.inputs), load_tokenizer("gpt2"), None)  # noqa: E731
    before = fp()
    plugin.write_text(PLUGIN.replace('"river"', '"stone"'))
    assert "the attribute plugin" in (difference(before, fp()) or "")
    more = _write(tmp_path / "more.jsonl", _texts(20, seed=9))
    with pytest.raises(ConfigError, match=r"--append: the scorer .*scores\.py.* changed"):
        _prepare(out, more, append=True, attributes=[f"{plugin}:quality", f"{plugin}:pair=a,b"], val_fraction=0)
    with pytest.raises(InputError, match=r"d\.jsonl:\d+: --attribute .*broken returned str"):
        _prepare(tmp_path / "bad", src, attributes=[f"{plugin}:broken"])
    with pytest.raises(ConfigError, match="not a built-in scorer"):
        PrepareConfig(inputs=[str(src)], out=str(tmp_path / "o"), attributes=["gopher"])
    with pytest.raises(ConfigError, match="made twice"):
        PrepareConfig(inputs=[str(src)], out=str(tmp_path / "o"), attributes=["length", f"{plugin}:pair=chars,b"])


def test_append_keeps_the_columns_and_refuses_others(tmp_path):
    a = _write(tmp_path / "a.jsonl", _texts(200, seed=4))
    b = _write(tmp_path / "b.jsonl", _texts(200, seed=5))
    out = _prepare(tmp_path / "ds", a, attributes=["length"])
    with pytest.raises(ConfigError, match="keeps the attributes of --attribute length"):
        _prepare(out, b, append=True)
    _prepare(out, b, append=True, attributes=["length"])
    whole = _prepare(tmp_path / "whole", a, attributes=["length"])
    _prepare(whole, b, append=True, attributes=["length"], workers=2, num_tasks=2)
    for split in ("train", "val"):
        rows, docs = _rows(out, split)
        assert len(rows) == len(docs) == load_metadata(out).n_docs(split)
        assert np.array_equal(rows, _rows(whole, split)[0])


def test_verify_convert_and_a_damaged_file(scored, tmp_path):
    import shutil

    _, out = scored
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    runner = CliRunner()
    assert runner.invoke(app, ["inspect", str(copy)]).exit_code == 0
    converted = tmp_path / "zstd"
    assert runner.invoke(app, ["convert", str(copy), "--to", "zstd", "--out", str(converted)]).exit_code == 0
    assert np.array_equal(_rows(converted)[0], _rows(out)[0])
    assert TokenDataset(converted, where="words > 20").n_tokens == TokenDataset(out, where="words > 20").n_tokens
    shard = load_metadata(copy).split_shards("train")[0]
    attr = copy / shard.attr_path
    data = bytearray(attr.read_bytes())
    data[shard.n_docs * 4 + 1] ^= 0xFF  # a byte of the second column, `words`
    attr.write_bytes(bytes(data))
    done = runner.invoke(app, ["inspect", str(copy)])
    assert done.exit_code == 3 and f"{shard.attr_path}: checksum" in done.output
    assert TokenDataset(copy, where="chars > 20").n_tokens  # a reader of another column reads on
    with pytest.raises(Exception, match="column words does not match"):
        TokenDataset(copy, where="words > 20")


def test_inspect_attribute_counts(scored):
    _, out = scored
    done = CliRunner().invoke(app, ["inspect", str(out), "--attribute", "words", "--attribute",
                                    "gopher_word_length", "--json"])  # fmt: skip
    assert done.exit_code == 0, done.output
    found = {a["name"]: a for a in json.loads(done.output)["attributes"]}
    rows, docs = _rows(out)
    words = found["words"]
    assert words["docs"] == len(rows) and words["min"] == rows["words"].min() and words["max"] == rows["words"].max()
    assert sum(b["docs"] for b in words["histogram"]) == len(rows)
    first = words["histogram"][0]
    assert first["docs"] == int(((rows["words"] >= first["from"]) & (rows["words"] < first["to"])).sum())
    nan = np.isnan(rows["gopher_word_length"])
    assert found["gopher_word_length"]["nan"] == int(nan.sum())
    assert abs(sum(b["token_share"] for b in words["histogram"]) - 1) < 1e-9
    shown = CliRunner().invoke(app, ["inspect", str(out), "--attribute", "nope"])
    assert shown.exit_code == 1 and "no such attribute" in shown.output


def test_mixture_buckets_hold_their_weights(scored):
    _, out = scored
    mix = Mixture.by_attribute(out, "words", edges=[20, 60], weights=[0.2, 0.3, 0.5], max_epochs=100)
    rows, docs = _rows(out)
    sizes = [sum(len(d) for d, r in zip(docs, rows, strict=True) if ok(r["words"]))
             for ok in (lambda w: w < 20, lambda w: 20 <= w < 60, lambda w: w >= 60)]  # fmt: skip
    assert [d.n_tokens for d in mix.datasets] == sizes
    report = mix.report(steps=200, global_batch_size=8, seq_len=32)
    for row, target in zip(report, [0.2, 0.3, 0.5], strict=True):
        assert abs(row["share"] - target) <= 1 / (200 * 8)
    soft = Mixture.by_attribute(out, "words", weight=lambda w: w.astype(float) ** 2, bins=4)
    lo, hi = int(rows["words"].min()), int(rows["words"].max())
    edge = float(np.float32(lo + (hi - lo) / 4))  # four equal-width bins from the smallest value to the largest
    assert len(soft.datasets) == 4 and soft.names[0].endswith(f"?{float(lo)!r} <= words < {edge!r}")
    assert soft.names[-1].endswith(f" <= words <= {float(hi)!r}")
    mass = [float(r["words"]) ** 2 * len(d) for r, d in zip(rows, docs, strict=True)]  # w² × tokens, per document
    first = sum(m for m, r in zip(mass, rows, strict=True) if r["words"] < edge) / sum(mass)
    assert abs(soft.weights[0] - first) < 1e-9


def test_where_on_a_dataset_at_a_url(scored, s3):
    from test_remote_loader import upload

    server, url = s3
    _, out = scored
    remote = TokenDataset(upload(server, url, out), where="words > 20 and gopher_symbols < 0.05")
    local = TokenDataset(out, where="words > 20 and gopher_symbols < 0.05")
    assert remote.n_tokens == local.n_tokens and remote.data_id == local.data_id
    assert np.array_equal(remote.tokens(0, remote.n_tokens), local.tokens(0, local.n_tokens))
    src, _ = scored  # prepared straight to the bucket: the .attr files are published with the shards
    direct = _prepare(f"{url}/direct", src, attributes=["length"], tokens_per_shard=20_000, val_fraction=0.1)
    assert TokenDataset(direct, where="words > 20").n_tokens == local.__class__(out, where="words > 20").n_tokens
    done = CliRunner().invoke(app, ["inspect", str(direct)])
    assert done.exit_code == 0, done.output


def test_an_interrupted_run_resumes_to_the_same_attributes(scored, tmp_path, monkeypatch):
    import os
    import signal

    from proctree import finish, start_prepare, wait_stopped

    src, out = scored
    args = [str(src), "--out", str(tmp_path / "r"), "--attribute", "length", "--attribute", "gopher_quality",
            "--attribute", "gopher_repetition", "--attribute", "fineweb_quality", "--tokens-per-shard", "20000",
            "--val-fraction", "0.1", "--workers", "1", "--quiet"]  # fmt: skip
    monkeypatch.setenv("LMSHARD_BLOCK_BYTES", str(1 << 16))  # many work items
    monkeypatch.setenv("LMSHARD_STOP_AT", "item:3")
    proc = start_prepare(args)
    assert wait_stopped(proc) == proc.pid
    monkeypatch.delenv("LMSHARD_STOP_AT")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    code, err = finish(start_prepare([*args, "--resume"]), 300)
    assert code == 0, err
    for rel in sorted(p.relative_to(out) for p in out.rglob("shard_*")):
        assert (tmp_path / "r" / rel).read_bytes() == (out / rel).read_bytes(), rel


def test_where_edge_cases_nan_and_hostile_conditions(tmp_path):
    plugin = tmp_path / "odd.py"
    plugin.write_text("def s(text):\n    return None if 'river' in text else len(text) / 10\n")
    texts = [f"the river {i}" for i in range(10)] + [f"a stone and the light {i}" * (i + 1) for i in range(30)]
    out = _prepare(tmp_path / "ds", _write(tmp_path / "o.jsonl", texts), attributes=[f"{plugin}:s"], val_fraction=0)
    rows, docs = _rows(out)
    nan = np.isnan(rows["s"])
    assert nan.sum() == 10
    count = lambda where: TokenDataset(out, where=where).n_docs  # noqa: E731
    some = float(rows["s"][~nan][3])
    assert count(f"s != {some!r}") == int((~nan).sum()) - int((rows["s"] == np.float32(some)).sum())
    assert count(f"s in ({some!r},)") == count(f"s == {some!r}") == int((rows["s"] == np.float32(some)).sum())
    assert count(f"s not in ({some!r},)") == count(f"s != {some!r}")  # NaN passes neither
    assert count(f"not s == {some!r}") == len(rows) - int((rows["s"] == np.float32(some)).sum())  # it passes `not`
    assert count("-s < -1") == int((rows["s"] > 1).sum())
    for bad in ("-(s < 1) < 0", "s" + " + s" * 500 + " > 1", "not " * 1200 + "s > 1", "s < " + "9" * 400,
                "s > 1 or (" * 200 + "s > 2" + ")" * 200, "s.real > 1", "(lambda: 1)() > 0"):  # fmt: skip
        with pytest.raises(ArgumentError):
            TokenDataset(out, where=bad)
    for edges, weights in (([float("nan")], [1, 1]), (["a"], [1, 1]), (5, [1]), ([1, 2], [1])):
        with pytest.raises(ArgumentError):
            Mixture.by_attribute(out, "s", edges=edges, weights=weights)
    with pytest.raises(ArgumentError, match="no val_fraction="):
        Mixture.by_attribute(out, "s", weight=lambda v: v, val_fraction=0.1)
    within = Mixture.by_attribute(out, "s", weight=lambda v: v * 0 + 1, bins=3, where="s > 5")
    assert sum(d.n_docs for d in within.datasets) == int((rows["s"] > 5).sum())  # (only those, each in one bucket)
    assert all(d.n_tokens for d in within.datasets) and abs(sum(within.weights) - 1) < 1e-9
    buckets = Mixture.by_attribute(out, "s", edges=[8.0], weights=[1, 1], where="s > 5")
    assert [d.n_docs for d in buckets.datasets] == [int(((rows["s"] > 5) & (rows["s"] < 8)).sum()),
                                                    int((rows["s"] >= 8).sum())]  # fmt: skip
    with pytest.raises(ArgumentError, match="weight= failed"):
        Mixture.by_attribute(out, "s", weight=lambda v: "x")
    one = Mixture.by_attribute(out, "s", weight=lambda v: v + 1, bins=1)
    assert one.datasets[0].n_docs == int((~nan).sum())
    keyword = tmp_path / "kw.py"
    keyword.write_text("def k(text):\n    return {'not': 1, 'ok': 10 ** 400}\n")
    with pytest.raises(ConfigError, match="not a Python keyword"):
        PrepareConfig(inputs=[str(tmp_path / "o.jsonl")], out=str(tmp_path / "x"), attributes=[f"{keyword}:k=not"])
    with pytest.raises(InputError, match="past the range"):
        _prepare(tmp_path / "big", tmp_path / "o.jsonl", attributes=[f"{keyword}:k=ok"])


def test_trace_and_resume_of_a_where_state(scored, tmp_path):
    _, out = scored
    stream = TokenDataset(out, where="fineweb_short_lines < 0.5 and words > 20").random_batches(2, 64, seed=3)
    next(iter(stream))
    state = stream.state_dict()
    (tmp_path / "state.json").write_text(json.dumps(state))
    done = CliRunner().invoke(app, ["trace", str(out), "--state", str(tmp_path / "state.json"), "--json"])
    assert done.exit_code == 0, done.output
    same = TokenDataset(out, where="(fineweb_short_lines<0.5) and (words>20)").random_batches(2, 64, seed=3)
    same.load_state_dict(state)  # the same condition, written otherwise
    other = TokenDataset(out, where="fineweb_short_lines < 0.6 and words > 20").random_batches(2, 64, seed=3)
    with pytest.raises(ArgumentError, match="continues only on the selection it was saved on"):
        other.load_state_dict(state)


def test_inspect_names_infinities_and_expands_a_scorer(tmp_path):
    plugin = tmp_path / "ppl.py"
    plugin.write_text("def ppl(text):\n    return float('inf') if 'river' in text else len(text)\n")
    texts = [f"the river {i}" for i in range(7)] + [f"a stone {i}" for i in range(13)]
    out = _prepare(tmp_path / "ds", _write(tmp_path / "p.jsonl", texts), attributes=[f"{plugin}:ppl", "length"],
                   val_fraction=0)  # fmt: skip
    done = CliRunner().invoke(app, ["inspect", str(out), "--attribute", "length", "--attribute", "ppl", "--json"])
    assert done.exit_code == 0, done.output
    found = {a["name"]: a for a in json.loads(done.output)["attributes"]}
    assert sorted(found) == ["chars", "lines", "ppl", "words"]  # (length: its three columns)
    assert found["ppl"]["inf"] == 7 and found["ppl"]["nan"] == 0 and found["ppl"]["max"] < 100
    assert TokenDataset(out, where="ppl > 100").n_docs == 7
    with pytest.raises(ConfigError, match="not an attribute name"):
        PrepareConfig(inputs=[str(tmp_path / "p.jsonl")], out=str(tmp_path / "x"), attributes=[f"{plugin}:ppl="])


def test_score_adds_columns_as_prepare_would_have(scored, tmp_path):
    src, out = scored
    plain = _prepare(tmp_path / "plain", src, attributes=["length"], tokens_per_shard=20_000, val_fraction=0.1)
    from lmshard.interop.score import score_dataset

    result = score_dataset(plain, ["gopher_quality", "gopher_repetition", "fineweb_quality"], tmp_path / "s1",
                           workers=1)  # fmt: skip
    done = CliRunner().invoke(app, ["score", str(plain), "--attribute", "gopher_quality", "--attribute",
                                    "gopher_repetition", "--attribute", "fineweb_quality", "--out",
                                    str(tmp_path / "s2"), "--workers", "2"])  # fmt: skip
    assert done.exit_code == 0 and "new columns" in done.output, done.output
    assert result.added[0] == "gopher_word_count" and len(result.added) == 24
    for rel in sorted(p.relative_to(out) for p in out.rglob("shard_*")):  # prepare's, with all four scorers
        assert (tmp_path / "s1" / rel).read_bytes() == (out / rel).read_bytes(), rel
        assert (tmp_path / "s2" / rel).read_bytes() == (out / rel).read_bytes(), rel
    meta = load_metadata(tmp_path / "s1")
    assert meta.attributes == load_metadata(out).attributes
    assert meta.run.lineage[-1]["op"] == "score"
    assert CliRunner().invoke(app, ["inspect", str(tmp_path / "s1")]).exit_code == 0
    assert TokenDataset(tmp_path / "s1", where="fineweb_short_lines < 0.5").n_tokens == \
        TokenDataset(out, where="fineweb_short_lines < 0.5").n_tokens  # fmt: skip
    with pytest.raises(ConfigError, match="has an attribute 'chars' already"):
        score_dataset(plain, ["length"], tmp_path / "s3")
    with pytest.raises(ConfigError, match="is the dataset being scored"):
        score_dataset(plain, ["fineweb_quality"], plain)
    with pytest.raises(ConfigError, match="not a built-in scorer"):
        score_dataset(plain, ["fineweb"], tmp_path / "s4")
    assert not (tmp_path / "s3").exists() and not (tmp_path / "s4").exists()


def test_score_keeps_the_hashes_of_the_scorers_it_did_not_run(tmp_path):
    from lmshard.interop.score import score_dataset

    plugin = tmp_path / "p1.py"
    plugin.write_text("def f(text):\n    return len(text)\n")
    src = _write(tmp_path / "d.jsonl", _texts(60, seed=6))
    out = _prepare(tmp_path / "ds", src, attributes=[f"{plugin}:f"], val_fraction=0)
    before = load_metadata(out).config["attribute_sources"]
    plugin.write_text("def f(text):\n    return 2 * len(text)\n")  # changed since: its scores are the old code's
    scored = score_dataset(out, ["length"], tmp_path / "scored", workers=1).meta
    assert scored.config["attribute_sources"] == before
    with pytest.raises(ConfigError, match="changed since the dataset was prepared"):
        _prepare(tmp_path / "scored", _write(tmp_path / "e.jsonl", _texts(10, seed=7)), append=True, val_fraction=0,
                 attributes=[f"{plugin}:f", "length"])  # fmt: skip


def test_the_attribute_values_of_a_split_and_of_a_selection(scored):
    _, out = scored
    rows, _ = _rows(out)
    assert np.array_equal(TokenDataset(out).attribute("words"), rows["words"])
    chosen = TokenDataset(out, where="fineweb_short_lines < 0.5 and words > 20")
    passing = (rows["fineweb_short_lines"] < np.float32(0.5)) & (rows["words"] > 20)
    assert np.array_equal(chosen.attribute("gopher_symbols"), rows["gopher_symbols"][passing], equal_nan=True)
    assert "where='fineweb_short_lines < 0.5 and words > 20'" in repr(chosen)
    with pytest.raises(ArgumentError, match="no attribute 'nope'"):
        chosen.attribute("nope")


def test_a_selection_in_dataloader_workers(scored):
    """A where= stream pickled into DataLoader workers (spawned: the selection travels as its
    condition and bits) gives the batches the main process would."""
    import pickle

    import torch

    _, out = scored
    data = TokenDataset(out, where="fineweb_short_lines < 0.5 and words > 20")
    copy = pickle.loads(pickle.dumps(data.store))
    offsets = np.array([0, 1234, data.n_tokens - 40])
    assert np.array_equal(copy.gather(offsets, 32), data.store.gather(offsets, 32))
    stream = data.random_batches(4, 32, seed=5)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    truth = data.random_batches(4, 32, seed=5)
    for (x, y), _ in zip(loader, range(6), strict=False):
        want = next(truth)
        assert torch.equal(x, want[0]) and torch.equal(y, want[1])
