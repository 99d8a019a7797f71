"""`prepare --val-by FIELD --val-tokens N` (prepare/execution/valby.py): each value of a record
field is a domain whose val part is its documents of smallest keyed draw until N tokens (at most
half the domain's), checked against the shards' own bytes (numpy over .bin/.idx/.attr) and each
document's field read by hand from its input; the domain kept as a category attribute; the same
bytes for any worker count and task count; per-domain val streams disjoint from train."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from conftest import write
from test_stages import _files

from lmshard import TokenDataset
from lmshard.errors import ConfigError
from lmshard.format import INDEX_DTYPE, load_metadata
from lmshard.prepare import PrepareConfig, domains, prepare
from lmshard.prepare.documents.dedup import uniform_from_keys

BUDGET = 2_000
DOMAINS = ("wiki", "code", "news", "7")  # (the last one written as the number 7)


def _text(name: str, i: int) -> str:
    return f"{name} record {i}: " + " ".join(f"w{(i * 11 + j) % 89}" for j in range(15 + i * 17 % 80))


def _inputs(root: Path) -> tuple[list[Path], dict[str, str]]:
    """Three inputs whose records' domains are mixed across files: JSON lines with the domain in
    `meta.src`, a CSV whose column is named `meta.src`, and parquet with a struct column `meta`;
    and each text's domain, by hand."""
    domain_of: dict[str, str] = {}
    rows: dict[str, list[tuple[str, str]]] = {"a": [], "b": [], "c": []}
    for i in range(420):
        d = DOMAINS[(i * 7) % 5 % 4] if i % 37 else "wiki"
        name = "abc"[i % 3]
        text = _text(name, i)
        rows[name].append((text, d))
        domain_of[text] = d
    a = write(root / "a.jsonl", "".join(json.dumps({"text": t, "meta": {"src": 7 if d == "7" else d}}) + "\n"
                                        for t, d in rows["a"]))  # fmt: skip
    b = root / "b.csv"
    with open(b, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["meta.src", "text"])
        w.writerows([(d, t) for t, d in rows["b"]])
    c = root / "c.parquet"
    pq.write_table(pa.table({"text": [t for t, _ in rows["c"]], "meta": [{"src": d} for _, d in rows["c"]]}), c,
                   row_group_size=40)  # fmt: skip
    return [a, b, c], domain_of


def _prepare(root: Path, name: str, **options) -> Path:
    out = root / name
    paths, _ = _inputs(root)
    prepare(PrepareConfig(inputs=[str(p) for p in paths], out=str(out), tokenizer="gpt2", val_fraction=0,
                          val_by="meta.src", val_tokens=BUDGET, tokens_per_shard=4_000, **options))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("valbyfield")
    return root, _prepare(root, "one", workers=1)


def _docs(path: Path, split: str) -> list[tuple[str, np.ndarray]]:
    """(stored domain label, tokens as written) of every document of a split, from the files'
    bytes: the category column read from each shard's .attr with numpy."""
    meta, out = load_metadata(path), []
    (field,) = meta.attributes
    for shard in meta.split_shards(split):
        tokens = np.fromfile(path / shard.path, dtype="<u4")
        starts = np.fromfile(path / shard.index_path, dtype=INDEX_DTYPE)
        codes = np.fromfile(path / shard.path.replace(".bin", ".attr"), dtype="<u2")
        assert len(codes) == len(starts) - 1
        out += [(field.labels[codes[d]], tokens[starts[d] : starts[d + 1]]) for d in range(len(codes))]
    return out


def _expected(docs: list[tuple[float, int, str]], budget: int) -> set[str]:
    """The rule by hand (texts are distinct here): in order of draw until the budget is reached,
    none that would take val past half the domain's tokens."""
    docs, half, total, chosen = sorted(docs), sum(n for _, n, _ in docs) // 2, 0, set()
    for _, n, text in docs:
        if total >= budget or total + n > half:
            break
        total, chosen = total + n, chosen | {text}
    return chosen


def test_each_domain_holds_out_its_smallest_draws_and_keeps_its_label(made, reference):
    root, path = made
    _, domain_of = _inputs(root / "hand")
    meta = load_metadata(path)
    assert [(f.name, f.dtype, f.labels) for f in meta.attributes] == [("src", "category", tuple(sorted(DOMAINS)))]
    by_domain: dict[str, list[tuple[float, int, str]]] = {}
    split_of = {}
    for split in ("train", "val"):
        for label, tokens in _docs(path, split):
            text = reference.decode(tokens[tokens != reference.eot_token].tolist())
            assert label == domain_of[text]  # the stored category is the record's own field
            key = np.array([xxhash.xxh3_64_intdigest(text.encode())], dtype=np.uint64)
            by_domain.setdefault(label, []).append((float(uniform_from_keys(key, 1337)[0]), len(tokens), text))
            split_of[text] = split
    assert sorted(split_of) == sorted(domain_of)  # every record, once
    for label, docs in by_domain.items():
        val = _expected(docs, BUDGET)
        assert {t for _, _, t in docs if split_of[t] == "val"} == val, label
        assert sum(n for _, n, t in docs if t in val) >= BUDGET  # each domain here is large enough


def test_the_same_bytes_for_any_worker_and_task_count(made):
    root, one = made
    files = _files(one)  # (the metadata but its run record too)
    for name, options in (("two", {"workers": 2}), ("tasks", {"workers": 1, "num_tasks": 3})):
        assert _files(_prepare(root, name, **options)) == files, name


def test_val_streams_and_where_by_the_field(made):
    _, path = made
    val = TokenDataset(path, "val")
    with pytest.warns(UserWarning, match="without --near-dedup"):
        streams = val.val_streams(tokens=BUDGET, seq_len=64, batch_size=4, by="src")
    assert sorted(streams) == sorted(DOMAINS)
    with pytest.warns(UserWarning, match="without --near-dedup"):
        again = val.val_streams(tokens=BUDGET, seq_len=64, batch_size=4, by="src")
    for name, stream in streams.items():
        assert [x.tolist() for x, _ in stream] == [x.tolist() for x, _ in again[name]]  # a fixed stream per domain
    train = {tokens.tobytes() for _, tokens in _docs(path, "train")}
    assert not any(tokens.tobytes() in train for _, tokens in _docs(path, "val"))
    wiki = TokenDataset(path, "train", where="src == 'wiki'")
    assert wiki.n_tokens == sum(len(t) for label, t in _docs(path, "train") if label == "wiki")


def test_records_without_the_field_and_plain_text(tmp_path):
    lines = [json.dumps({"text": _text("x", i), "meta": {"src": "a"}}) for i in range(30)]
    src = write(tmp_path / "x.jsonl", "\n".join([*lines, json.dumps({"text": "no domain here"})]) + "\n")
    lmshard = [sys.executable, "-m", "lmshard", "prepare", str(src), "--val-by", "meta.src", "--val-tokens", "100",
               "--val-fraction", "0"]  # fmt: skip
    done = subprocess.run([*lmshard, "--out", str(tmp_path / "o")], text=True, capture_output=True)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"{src}:31: no field 'meta.src' (--val-by meta.src)" in done.stderr and "--on-error skip" in done.stderr
    done = subprocess.run([*lmshard, "--out", str(tmp_path / "s"), "--on-error", "skip"], text=True,
                          capture_output=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert load_metadata(tmp_path / "s").drops["missing_domain"] == 1
    text = write(tmp_path / "t.txt", "a line\nanother line\n")
    done = subprocess.run([sys.executable, "-m", "lmshard", "prepare", str(text), "--out", str(tmp_path / "t"),
                           "--val-by", "src", "--val-tokens", "10", "--val-fraction", "0"], text=True,
                          capture_output=True)  # fmt: skip
    assert done.returncode != 0 and "plain text has no fields" in done.stderr and "Traceback" not in done.stderr


def test_options_refused_and_too_many_values(tmp_path, monkeypatch):
    base = {"inputs": [str(tmp_path / "x.jsonl")], "out": str(tmp_path / "o"), "tokenizer": "gpt2",
            "val_fraction": 0, "val_tokens": 10}  # fmt: skip
    with pytest.raises(ConfigError, match="the attribute 'chars', which an --attribute makes too"):
        PrepareConfig(**base, val_by="stats.chars", attributes=["length"])
    assert domains.attribute_name("meta.pile_set_name") == "pile_set_name"
    assert domains.attribute_name("source-name") == "source_name" and domains.attribute_name("class") == "class_"
    write(tmp_path / "x.jsonl", "".join(json.dumps({"text": _text("y", i), "id": i}) + "\n" for i in range(40)))
    monkeypatch.setattr(domains, "MAX_LABELS", 16)  # (the workers are forked: they see it)
    with pytest.raises(Exception, match="--val-by id: more than 16 distinct values"):
        prepare(PrepareConfig(**base, val_by="id", workers=1))


def test_arrow_and_a_saved_hugging_face_dataset(tmp_path, reference):
    """The field read from an arrow file's column and a saved Hugging Face dataset's rows: each
    document's stored label is its row's (a number as JSON writes it)."""
    import datasets

    rows = [(_text("h", i), ["x", "y", 3][i % 3]) for i in range(90)]
    datasets.Dataset.from_dict({"text": [t for t, _ in rows], "meta": [{"src": str(d)} for _, d in rows]}
                               ).save_to_disk(str(tmp_path / "saved"))  # fmt: skip
    arrow = tmp_path / "a.arrow"
    table = pa.table({"text": [_text("r", i) for i in range(60)], "src": [i % 2 for i in range(60)]})
    with pa.ipc.new_file(arrow, table.schema) as w:
        w.write_table(table, max_chunksize=16)
    expected = {t: str(d) for t, d in rows} | {_text("r", i): str(i % 2) for i in range(60)}
    for name, options in (("hf", {"hf": str(tmp_path / "saved"), "val_by": "meta.src"}),
                          ("arrow", {"inputs": [str(arrow)], "val_by": "src"})):  # fmt: skip
        out = tmp_path / name
        prepare(PrepareConfig(out=str(out), tokenizer="gpt2", val_fraction=0, val_tokens=300, workers=2, **options))
        docs = _docs(out, "train") + _docs(out, "val")
        assert len(docs) == (90 if name == "hf" else 60) and load_metadata(out).n_tokens("val") >= 300
        for label, tokens in docs:
            assert label == expected[reference.decode(tokens[tokens != reference.eot_token].tolist())]


def _kept_texts(path: Path, enc) -> list[str]:
    docs = _docs(path, "train") + _docs(path, "val")
    return sorted(enc.decode(t[t != enc.eot_token].tolist()) for _, t in docs)


def test_line_dedup_reads_the_records_the_tokenize_stage_reads(tmp_path, reference):
    """--dedup-lines with records skipped for their domain: the kept text is the same whether
    the records come as JSON lines, CSV or a JSON array (the lines stage skips the same records)."""
    rows = [(f"line one {i}\nSHARED LINE everywhere\nunique line {i} beta", None if i % 7 == 3 else "ab"[i % 2])
            for i in range(40)]  # fmt: skip
    write(tmp_path / "r.jsonl", "".join(json.dumps({"text": t} | ({"src": d} if d else {})) + "\n" for t, d in rows))
    with open(tmp_path / "r.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "src"])
        w.writerows([(t, d) if d else (t,) for t, d in rows])
    write(tmp_path / "r.json", json.dumps([{"text": t} | ({"src": d} if d else {}) for t, d in rows]))
    kept = {}
    for name in ("r.jsonl", "r.csv", "r.json"):
        out = tmp_path / f"out_{name}"
        prepare(PrepareConfig(inputs=[str(tmp_path / name)], out=str(out), tokenizer="gpt2", val_fraction=0,
                              val_by="src", val_tokens=30, dedup_lines=True, on_error="skip", workers=1))  # fmt: skip
        kept[name] = _kept_texts(out, reference)
        assert load_metadata(out).drops["missing_domain"] == 6
    assert kept["r.jsonl"] == kept["r.csv"] == kept["r.json"]
    assert sum("SHARED LINE" in t for t in kept["r.jsonl"]) == 1 and len(kept["r.jsonl"]) == 34


def test_labels_are_exact_and_any_text_a_label_can_be(tmp_path, reference):
    """Integers past 64 bits stay distinct labels (JSON lines parsed fast or not); a label that
    is rich markup is printed as it is; a field named `input` is kept as `input_`."""
    big = 18446744073709551616
    lines = [json.dumps({"text": _text("n", i), "meta": {"input": big + i % 2 if i % 3 else "[/]"}}) for i in range(60)]
    src = write(tmp_path / "n.jsonl", "\n".join(lines) + "\n")
    out = tmp_path / "n"
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), tokenizer="gpt2", val_fraction=0, val_by="meta.input",
                          val_tokens=100, workers=1))  # fmt: skip
    (field,) = load_metadata(out).attributes
    assert (field.name, field.labels) == ("input_", (str(big), str(big + 1), "[/]"))
    with pytest.warns(UserWarning, match="without --near-dedup"):
        streams = TokenDataset(out, "val").val_streams(tokens=100, seq_len=16, batch_size=2, by="input_")
    assert sorted(streams) == sorted(field.labels)
    done = subprocess.run([sys.executable, "-m", "lmshard", "inspect", str(out), "--attribute", "input_"],
                          text=True, capture_output=True)  # fmt: skip
    assert done.returncode == 0 and "[/]" in done.stdout, done.stderr


def test_an_empty_run_and_a_plain_text_input_among_records(tmp_path):
    """--allow-empty with every record skipped writes a dataset that loads; a .txt input, even
    an empty one, is refused before anything is read."""
    src = write(tmp_path / "x.csv", "text\n" + "".join(f"record {i}\n" for i in range(5)))
    out = tmp_path / "e"
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), tokenizer="gpt2", val_fraction=0, val_by="src",
                          val_tokens=10, on_error="skip", allow_empty=True, workers=1))  # fmt: skip
    assert load_metadata(out).drops["missing_domain"] == 5 and load_metadata(out).n_tokens("train") == 0
    done = subprocess.run([sys.executable, "-m", "lmshard", "inspect", str(out)], text=True,
                          capture_output=True)  # fmt: skip
    assert done.returncode == 0 and "CORRUPT" not in done.stdout + done.stderr, done.stdout + done.stderr
    empty = write(tmp_path / "empty.txt", "")
    with pytest.raises(ConfigError, match="empty.txt: --val-by src: plain text has no fields"):
        prepare(PrepareConfig(inputs=[str(src), str(empty)], out=str(tmp_path / "t"), tokenizer="gpt2",
                              val_fraction=0, val_by="src", val_tokens=10))  # fmt: skip
    assert not (tmp_path / "t").exists()
