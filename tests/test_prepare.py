"""prepare end to end (in-process): tokens, dedup, splits, shards, determinism, formats."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import GPT2_EOT, read_docs, write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmshard.errors import ConfigError
from lmshard.format import load_metadata
from lmshard.prepare import PrepareConfig, prepare

WORDS = [
    "the",
    "of",
    "and",
    "lorem",
    "ipsum",
    "data",
    "token",
    "shard",
    "naïve",
    "café",
    "東京",
    "😀",
    "x=1;",
    "def",
    "f():",
    "return",
]


def make_texts(n: int, seed: int = 0) -> list[str]:
    """Clean texts (NFC, no control characters, LF newlines) so cleaning leaves them as is."""
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        lines = [" ".join(rng.choices(WORDS, k=rng.randint(1, 30))) for _ in range(rng.randint(1, 5))]
        texts.append(f"doc {i}: " + "\n".join(lines))
    return texts


def run(tmp_path: Path, inputs: list[Path | str], **kw) -> dict:
    kw.setdefault("workers", 1)
    kw.setdefault("out", str(tmp_path / "out"))
    return prepare(PrepareConfig(inputs=[str(p) for p in inputs], **kw))


def jsonl(path: Path, texts: list[str], opener=open) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with opener(path, "wt", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t, "id": len(t)}) + "\n")
    return path


def assert_tokens_match(root: Path, texts: list[str], reference, eot_position="after") -> None:
    """Documents in train+val equal tiktoken's encoding of each unique text plus EOT, each split
    keeping input order, and together covering every unique text exactly once."""
    expected = {}
    for t in texts:
        ids = reference.encode_ordinary(t)
        doc = ids + [GPT2_EOT] if eot_position == "after" else [GPT2_EOT] + ids
        expected.setdefault(tuple(doc), len(expected))
    seen = []
    for split in ("train", "val"):
        positions = [expected[tuple(d.tolist())] for d in read_docs(root, split)]
        assert positions == sorted(positions), f"{split} is out of input order"
        seen.extend(positions)
    assert sorted(seen) == list(range(len(expected)))


def test_tokens_equal_tiktoken_across_shards_and_splits(tmp_path, reference):
    texts = make_texts(300)
    src = jsonl(tmp_path / "in" / "a.jsonl", texts[:150])
    src2 = jsonl(tmp_path / "in" / "b.jsonl.gz", texts[150:], opener=gzip.open)
    meta = run(tmp_path, [tmp_path / "in"], tokens_per_shard=500, val_fraction=0.2)
    root = tmp_path / "out"
    assert_tokens_match(root, texts, reference)
    assert len(meta["splits"]["train"]["shards"]) > 5
    assert meta["splits"]["val"]["n_docs"] > 20  # 20% of 300, give or take the hash
    assert [s["path"] for s in meta["sources"]] == [str(src), str(src2)]
    assert meta["n_docs"] == 300 and meta["records_read"] == 300


def test_metadata_matches_files(tmp_path, reference):
    meta = run(tmp_path, [jsonl(tmp_path / "a.jsonl", make_texts(200))], tokens_per_shard=700)
    root = tmp_path / "out"
    total = 0
    for split in ("train", "val"):
        for shard in meta["splits"][split]["shards"]:
            tokens = np.fromfile(root / shard["path"], dtype="<u4")
            offsets = np.fromfile(root / shard["index_path"], dtype="<u8")
            assert len(tokens) == shard["n_tokens"] and len(offsets) == shard["n_docs"] + 1
            assert offsets[0] == 0 and offsets[-1] == len(tokens)
            assert (tokens[offsets[1:] - 1] == GPT2_EOT).all()  # EOT closes every document
            import xxhash

            assert xxhash.xxh3_64_hexdigest(tokens.tobytes()) == shard["xxh3_64"]
            total += len(tokens)
    assert total == meta["n_tokens"]
    assert load_metadata(root).n_tokens() == total
    state = json.loads((root / "tokenizer_state.json").read_text())
    assert state["ranks_sha256"] == meta["tokenizer"]["ranks_sha256"]
    assert state["eot_id"] == GPT2_EOT and state["n_vocab"] == 50257


def test_duplicates_removed_exactly_once(tmp_path, reference):
    texts = make_texts(50)
    dup = texts + [texts[3], texts[7], texts[3]] + texts[10:20]
    meta = run(tmp_path, [jsonl(tmp_path / "a.jsonl", dup)])
    assert meta["drops"]["duplicate"] == 13
    assert meta["dedup"]["duplicates_removed"] == 13
    assert meta["n_docs"] == 50
    assert meta["sources"][0]["kept"] == 50 and meta["sources"][0]["dropped"]["duplicate"] == 13
    assert_tokens_match(tmp_path / "out", texts, reference)


def test_no_dedup_keeps_duplicates(tmp_path):
    texts = make_texts(10)
    meta = run(tmp_path, [jsonl(tmp_path / "a.jsonl", texts + texts)], dedup="none")
    assert meta["n_docs"] == 20 and meta["drops"]["duplicate"] == 0


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_one_and_two_workers_byte_identical(tmp_path):
    texts = make_texts(2000, seed=5)
    src = jsonl(tmp_path / "a.jsonl", texts + texts[:100])
    run(tmp_path, [src], out=str(tmp_path / "w1"), workers=1, tokens_per_shard=5000, val_fraction=0.1)
    run(tmp_path, [src], out=str(tmp_path / "w2"), workers=2, tokens_per_shard=5000, val_fraction=0.1)
    one, two = _tree(tmp_path / "w1"), _tree(tmp_path / "w2")
    meta1 = json.loads(one.pop("dataset_metadata.json"))
    meta2 = json.loads(two.pop("dataset_metadata.json"))
    assert meta1.pop("run")["workers"] == 1 and meta2.pop("run")["workers"] == 2
    assert one == two and meta1 == meta2
    assert len(one) > 4


def test_eot_before(tmp_path, reference):
    texts = make_texts(30)
    run(tmp_path, [jsonl(tmp_path / "a.jsonl", texts)], eot_position="before")
    assert_tokens_match(tmp_path / "out", texts, reference, eot_position="before")


def test_max_docs_stops_early(tmp_path):
    meta = run(tmp_path, [jsonl(tmp_path / "a.jsonl", make_texts(100))], max_docs=17)
    assert meta["n_docs"] == 17


def test_val_split_is_seeded(tmp_path):
    src = jsonl(tmp_path / "a.jsonl", make_texts(400))
    a = run(tmp_path, [src], out=str(tmp_path / "a"), val_fraction=0.25, seed=1)
    run(tmp_path, [src], out=str(tmp_path / "b"), val_fraction=0.25, seed=2)
    run(tmp_path, [src], out=str(tmp_path / "c"), val_fraction=0.25, seed=1)
    assert 60 < a["splits"]["val"]["n_docs"] < 140

    def val(name):
        return [tuple(d.tolist()) for d in read_docs(tmp_path / name, "val")]

    assert val("a") != val("b") and val("a") == val("c")


@pytest.mark.parametrize("suffix,opener", [(".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open)])
def test_compressed_inputs(tmp_path, reference, suffix, opener):
    texts = make_texts(40)
    run(tmp_path, [jsonl(tmp_path / f"a.jsonl{suffix}", texts, opener=opener)])
    assert_tokens_match(tmp_path / "out", texts, reference)


def test_zstd_input(tmp_path, reference):
    zstandard = pytest.importorskip("zstandard")
    texts = make_texts(40)
    raw = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    write(tmp_path / "a.jsonl.zst", zstandard.ZstdCompressor().compress(raw))
    run(tmp_path, [tmp_path / "a.jsonl.zst"])
    assert_tokens_match(tmp_path / "out", texts, reference)


def test_text_modes(tmp_path, reference):
    paragraphs = ["first para\nstill first", "second para", "third\r\npara"]
    write(tmp_path / "p.txt", "\n\n".join(paragraphs) + "\n\n\n")
    run(tmp_path, [tmp_path / "p.txt"], out=str(tmp_path / "file"))
    assert_tokens_match(tmp_path / "file", ["\n\n".join(paragraphs).replace("\r", "") + "\n\n\n"], reference)
    run(tmp_path, [tmp_path / "p.txt"], out=str(tmp_path / "para"), text_mode="paragraph")
    assert_tokens_match(tmp_path / "para", [p.replace("\r", "") for p in paragraphs], reference)
    run(tmp_path, [tmp_path / "p.txt"], out=str(tmp_path / "line"), text_mode="line")
    lines = ["first para", "still first", "second para", "third", "para"]
    assert_tokens_match(tmp_path / "line", lines, reference)


def test_directory_recursive_sorted_and_glob(tmp_path, reference):
    write(tmp_path / "d" / "b.txt", "bravo text")
    write(tmp_path / "d" / "a" / "z.md", "alpha text")
    write(tmp_path / "d" / ".hidden.txt", "hidden text")
    write(tmp_path / "d" / "image.png", b"\x89PNG\x00")
    meta = run(tmp_path, [tmp_path / "d"])
    assert [Path(s["path"]).name for s in meta["sources"]] == ["z.md", "b.txt"]
    assert_tokens_match(tmp_path / "out", ["alpha text", "bravo text"], reference)
    meta = run(tmp_path, [str(tmp_path / "d" / "*.txt")], out=str(tmp_path / "g"))
    assert [Path(s["path"]).name for s in meta["sources"]] == ["b.txt"]


def test_csv_json_array_parquet_arrow_agree_with_jsonl(tmp_path, reference):
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = make_texts(60) + ['quoted, "comma"\nand newline']
    with open(tmp_path / "a.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "text"])
        w.writerows([i, t] for i, t in enumerate(texts))
    write(tmp_path / "a.json", json.dumps([{"text": t} for t in texts], indent=1))
    table = pa.table({"text": texts, "n": list(range(len(texts)))})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=16)
    with pa.ipc.new_stream(tmp_path / "a.arrow", table.schema) as w:
        for batch in table.to_batches(max_chunksize=10):
            w.write_batch(batch)
    for name in ("a.csv", "a.json", "a.parquet", "a.arrow"):
        out = tmp_path / name.replace(".", "_")
        meta = run(tmp_path, [tmp_path / name], out=str(out))
        assert meta["records_read"] == len(texts), name
        assert_tokens_match(out, texts, reference)


def test_cleaning_applied_and_byte_exact_keeps_text(tmp_path, reference):
    raw = "Cafe\u0301\r\nline\x07two\x00\ufeff"
    write(tmp_path / "a.jsonl", json.dumps({"text": raw}) + "\n")
    run(tmp_path, [tmp_path / "a.jsonl"], out=str(tmp_path / "c"))
    assert_tokens_match(tmp_path / "c", ["Café\nlinetwo\ufeff"], reference)
    run(tmp_path, [tmp_path / "a.jsonl"], out=str(tmp_path / "b"), byte_exact=True)
    assert_tokens_match(tmp_path / "b", [raw], reference)


def test_length_filters_counted(tmp_path):
    texts = ["x" * 5, "y" * 50, "z" * 500, ""]
    meta = run(tmp_path, [jsonl(tmp_path / "a.jsonl", texts)], min_chars=10, max_chars=100)
    assert meta["drops"] == {"duplicate": 0, "empty": 1, "too_long": 1, "too_short": 1}
    meta = run(tmp_path, [jsonl(tmp_path / "a.jsonl", texts)], out=str(tmp_path / "t"),
               min_chars=10, max_chars=100, overlong="truncate")  # fmt: skip
    assert meta["n_docs"] == 2 and meta["drops"].get("too_long", 0) == 0


def test_refuses_existing_dataset_unless_overwrite(tmp_path):
    src = jsonl(tmp_path / "a.jsonl", make_texts(5))
    run(tmp_path, [src])
    with pytest.raises(ConfigError, match="--overwrite"):
        run(tmp_path, [src])
    run(tmp_path, [src], overwrite=True)
    write(tmp_path / "other" / "keep.txt", "mine")
    with pytest.raises(ConfigError, match="not empty"):
        run(tmp_path, [src], out=str(tmp_path / "other"))


def test_failed_run_leaves_no_dataset(tmp_path):
    write(tmp_path / "bad.jsonl", '{"text": "fine"}\n{"oops"\n')
    with pytest.raises(Exception, match="bad.jsonl:2"):
        run(tmp_path, [tmp_path / "bad.jsonl"])
    assert not (tmp_path / "out" / "dataset_metadata.json").exists()
    assert not list((tmp_path / "out").rglob("*.bin"))


def test_config_validation():
    with pytest.raises(ConfigError, match="--val-fraction"):
        PrepareConfig(inputs=["x"], out="y", val_fraction=1.5)
    with pytest.raises(ConfigError, match="--normalize"):
        PrepareConfig(inputs=["x"], out="y", normalize="nfd")


def expected_line_dedup(texts: list[str]) -> tuple[list[str], int]:
    """Hand-rolled reference: drop every non-blank line whose exact text appeared earlier."""
    seen: set[str] = set()
    out, removed = [], 0
    for t in texts:
        kept = []
        for line in t.split("\n"):
            if line.strip() and line in seen:
                removed += 1
                continue
            seen.add(line) if line.strip() else None
            kept.append(line)
        out.append("\n".join(kept))
    return out, removed


def test_line_dedup_removes_repeated_lines_in_input_order(tmp_path, reference):
    boiler = "Copyright (c) Example Corp. All rights reserved."
    texts = [f"{boiler}\nreal text {i}\n\nshared footer line\nunique {i * 7}" for i in range(40)] + [boiler]
    src = jsonl(tmp_path / "a.jsonl", texts)
    expected, removed = expected_line_dedup(texts)
    meta = run(tmp_path, [src], dedup_lines=True)
    assert meta["dedup"]["lines_removed"] == removed == 2 * 39 + 1
    assert meta["drops"]["empty"] == 1  # the last document was only boilerplate
    assert_tokens_match(tmp_path / "out", [t for t in expected if t], reference)
    run(tmp_path, [src], out=str(tmp_path / "w2"), dedup_lines=True, workers=2)
    assert _tree(tmp_path / "w2") | {"dataset_metadata.json": b""} == _tree(tmp_path / "out") | {
        "dataset_metadata.json": b""
    }


def test_line_dedup_refuses_stdin():
    with pytest.raises(ConfigError, match="stdin"):
        PrepareConfig(inputs=["-"], out="x", dedup_lines=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(min_size=1, max_size=80), min_size=1, max_size=12))
def test_round_trip_text_to_shards_to_decoded_text(tmp_path_factory, reference, texts):
    """Any text → prepare → raw .bin/.idx read with numpy → decoded: the cleaned text, once each."""
    from lmshard.clean import CleanConfig, clean_text, fix_surrogates

    tmp = tmp_path_factory.mktemp("rt")
    jsonl(tmp / "a.jsonl", texts)
    run(tmp, [tmp / "a.jsonl"], val_fraction=0.0)
    cleaned = [clean_text(fix_surrogates(t), CleanConfig()) for t in texts]
    expected = list(dict.fromkeys(c for c in cleaned if c))  # empties dropped, first copy kept
    docs = read_docs(tmp / "out", "train")
    assert all(int(d[-1]) == GPT2_EOT for d in docs)
    assert [reference.decode(d[:-1].tolist()) for d in docs] == expected
