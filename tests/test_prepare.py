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
import xxhash
from conftest import GPT2_EOT, read_docs, write
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lmshard.errors import ConfigError, InputError
from lmshard.format import load_metadata
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.documents.dedup import uniform_from_keys

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


def run(tmp_path: Path, inputs: list[Path | str], on_progress=None, **kw) -> dict:
    kw.setdefault("workers", 1)
    kw.setdefault("out", str(tmp_path / "out"))
    return prepare(PrepareConfig(inputs=[str(p) for p in inputs], **kw), on_progress).to_json()


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


def many_item_inputs(root: Path) -> list[str]:
    """A directory whose files span many work items under `small_items`: six JSON-lines files
    (two gzipped) of ~5 items each, a CSV of 4 items, seven text files in 3 items; documents
    repeat across files and items. Returns every document's text in input order."""
    texts = make_texts(260, seed=5)
    order: list[str] = []
    for k in range(6):
        part = texts[30 * k : 30 * k + 30] + (texts[30 * k - 25 : 30 * k - 20] if k else [])  # 5 repeat earlier items
        name = f"a{k}.jsonl" + (".gz" if k % 3 == 2 else "")
        jsonl(root / name, part, opener=gzip.open if name.endswith(".gz") else open)
        order.extend(part)
    import csv

    rows = texts[180:230] + texts[0:3]
    with open(root / "b.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["text"], *([t] for t in rows)])
    order.extend(rows)
    for k, t in enumerate(texts[230:236] + texts[231:232]):
        write(root / f"c{k}.txt", t)
        order.append(t)
    return order


def test_worker_counts_1_2_3_byte_identical_over_many_work_items(tmp_path, reference, small_items, eager_pool):
    """Output bytes must not depend on --workers: results drained out of order only show with
    several items in flight, so the input spans ~40 items of ~2 KiB in 14 files."""
    texts = many_item_inputs(tmp_path / "in")
    trees, metas = [], []
    for n in (1, 2, 3):
        items: list = []
        run(tmp_path, [tmp_path / "in"], out=str(tmp_path / f"w{n}"), workers=n, tokens_per_shard=800,
            val_fraction=0.2, on_progress=items.append)  # fmt: skip
        assert len(items) >= 35, "the input must span many work items"
        trees.append(_tree(tmp_path / f"w{n}"))
        meta = json.loads(trees[-1].pop("dataset_metadata.json"))
        assert meta.pop("run")["workers"] == n
        metas.append(meta)
    assert trees[0] == trees[1] == trees[2] and metas[0] == metas[1] == metas[2]
    assert len(metas[0]["splits"]["train"]["shards"]) > 10 and metas[0]["drops"]["duplicate"] == 5 * 5 + 3 + 1
    assert_tokens_match(tmp_path / "w3", texts, reference)


@pytest.mark.parametrize("mode", ["paragraph", "line", "file"])
def test_work_item_size_does_not_change_the_output(tmp_path, monkeypatch, mode):
    """Blocks cut at 7 or 333 bytes (mid-record, mid-CRLF, mid-paragraph separator) give the same
    shards as one 1 MiB block: the planner carries partial records into the next item."""
    import lmshard.prepare.documents.sources as sources

    rng = random.Random(1)
    paras = ["\n".join(make_texts(rng.randint(1, 3), seed=k)) for k in range(120)]
    seps = ["\n\n", "\n\n\n", "\r\n\r\n", "\n \n", "\n\r\n"]
    write(tmp_path / "p.txt", "".join(p + rng.choice(seps) for p in paras))
    src = tmp_path / "p.txt"
    if mode == "file":  # whole .txt files are not cut: use CRLF JSON lines instead
        src = write(tmp_path / "p.jsonl", "".join(json.dumps({"text": p}) + "\r\n" for p in paras))
    kw = {"text_mode": mode, "val_fraction": 0.0, "tokens_per_shard": 2000}
    run(tmp_path, [src], out=str(tmp_path / "big"), **kw)
    expected = _tree(tmp_path / "big")
    expected.pop("dataset_metadata.json")
    for block in (7, 333):
        monkeypatch.setattr(sources, "BLOCK_BYTES", block)
        items: list = []
        run(tmp_path, [src], out=str(tmp_path / f"b{block}"), on_progress=items.append, **kw)
        got = _tree(tmp_path / f"b{block}")
        got.pop("dataset_metadata.json")
        assert got == expected and len(items) > 10, block


def test_duplicates_across_files_and_work_items_removed(tmp_path, reference, small_items):
    """The first copy wins wherever the later copies are: another work item of the same file,
    another file, another kind of item (whole text files, parsed CSV records)."""
    texts = make_texts(240, seed=7)
    a = jsonl(tmp_path / "in" / "a.jsonl", texts[:120] + texts[:10])  # ~20 items: the copies are items later
    b = jsonl(tmp_path / "in" / "b.jsonl", texts[120:] + texts[50:60] + texts[200:205])
    for k, t in enumerate([texts[0], "own text", texts[130], "own text", texts[239]]):
        write(tmp_path / "t" / f"{k}.txt", t)  # 3 files per item: the second "own text" is in another item
    items: list = []
    meta = run(tmp_path, [tmp_path / "in", tmp_path / "t"], val_fraction=0.3, on_progress=items.append)
    assert len(items) > 30
    assert_tokens_match(tmp_path / "out", texts + ["own text"], reference)
    assert meta["drops"]["duplicate"] == 10 + 15 + 4 and meta["n_docs"] == 241
    assert [(s["path"], s["kept"], s.get("dropped", {}).get("duplicate", 0)) for s in meta["sources"]] == [
        (str(a), 120, 10), (str(b), 120, 15), *((str(tmp_path / "t" / f"{k}.txt"), int(k == 1), int(k != 1))
                                                for k in range(5)),
    ]  # fmt: skip


def test_val_split_depends_on_content_and_seed_only(tmp_path, reference, small_items):
    """Every copy of a document lands in the split its content and the seed pick, wherever it
    sits (file, work item, position): recomputed here from xxh3-64 of the text."""
    texts = make_texts(150, seed=9)
    jsonl(tmp_path / "in" / "a.jsonl", texts)
    jsonl(tmp_path / "in" / "b.jsonl", texts[::-1])  # the same documents in other items and positions
    by_tokens = {tuple(reference.encode_ordinary(t) + [GPT2_EOT]): t for t in texts}
    for seed in (4, 5):
        out = tmp_path / f"s{seed}"
        items: list = []
        run(tmp_path, [tmp_path / "in"], out=str(out), dedup="none", val_fraction=0.3, seed=seed,
            on_progress=items.append)  # fmt: skip
        assert len(items) > 20
        keys = np.array([xxhash.xxh3_64_intdigest(t.encode()) for t in texts], dtype=np.uint64)
        expected_val = {t for t, u in zip(texts, uniform_from_keys(keys, seed), strict=True) if u < 0.3}
        assert 20 < len(expected_val) < 70
        for split in ("train", "val"):
            got = [by_tokens[tuple(d.tolist())] for d in read_docs(out, split)]
            wanted = [t for t in texts + texts[::-1] if (t in expected_val) == (split == "val")]
            assert got == wanted, split


def test_eot_before(tmp_path, reference):
    texts = make_texts(30)
    run(tmp_path, [jsonl(tmp_path / "a.jsonl", texts)], eot_position="before")
    assert_tokens_match(tmp_path / "out", texts, reference, eot_position="before")


@pytest.mark.parametrize("max_docs", [3, 37])
def test_max_docs_keeps_the_first_documents_by_content(tmp_path, reference, small_items, max_docs):
    """The first N kept documents in input order (duplicates do not count), and reading stops
    soon after: 3 ends inside the first work item, 37 several items in."""
    texts = make_texts(200, seed=12)
    src = jsonl(tmp_path / "a.jsonl", texts[:2] + texts[:2] + texts[2:])
    meta = run(tmp_path, [src], max_docs=max_docs, val_fraction=0.0)
    docs = [d.tolist() for d in read_docs(tmp_path / "out", "train")]
    assert docs == [reference.encode_ordinary(t) + [GPT2_EOT] for t in texts[:max_docs]]
    assert meta["n_docs"] == max_docs and meta["records_read"] < 100
    run(tmp_path, [src], out=str(tmp_path / "v"), max_docs=max_docs, val_fraction=0.3)
    assert_tokens_match(tmp_path / "v", texts[:max_docs], reference)


@pytest.mark.parametrize("workers", [1, 2])
def test_max_docs_counts_what_was_read_up_to_the_nth_kept_document(tmp_path, workers):
    """The records, drops and duplicates counted are those up to and including the N-th kept
    document's record, whatever the work items (a planned run counts the same): a hand count."""
    texts = make_texts(40, seed=13)
    lines = []
    for i, t in enumerate(texts):
        lines.append(json.dumps({"text": t}))
        lines += ["not json"] * (i % 3) + [json.dumps({"text": texts[0]})] * (i % 2)  # bad records, duplicates
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    meta = run(tmp_path, [tmp_path / "a.jsonl"], max_docs=10, on_error="skip", workers=workers)
    # the 10th kept document is texts[9]: records up to its line, with the bad ones and the copies of texts[0] before
    assert meta["n_docs"] == 10
    assert meta["records_read"] == 10 + sum(i % 3 for i in range(9)) + sum(i % 2 for i in range(9))
    assert meta["drops"]["json_error"] == sum(i % 3 for i in range(9))
    assert meta["drops"]["duplicate"] == sum(i % 2 for i in range(9))


def test_val_split_is_seeded(tmp_path):
    src = jsonl(tmp_path / "a.jsonl", make_texts(400))
    a = run(tmp_path, [src], out=str(tmp_path / "a"), val_fraction=0.25, seed=1)
    run(tmp_path, [src], out=str(tmp_path / "b"), val_fraction=0.25, seed=2)
    run(tmp_path, [src], out=str(tmp_path / "c"), val_fraction=0.25, seed=1)
    assert 60 < a["splits"]["val"]["n_docs"] < 140

    def val(name):
        return [tuple(d.tolist()) for d in read_docs(tmp_path / name, "val")]

    assert val("a") != val("b") and val("a") == val("c")
    run(tmp_path, [src], out=str(tmp_path / "d"), val_fraction=0.25, seed=-1)  # a negative seed is modulo 2**64
    run(tmp_path, [src], out=str(tmp_path / "e"), val_fraction=0.25, seed=2**64 - 1)
    assert val("d") == val("e") and val("d") != val("a")


@pytest.mark.parametrize("suffix,opener", [(".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open)])
def test_compressed_inputs(tmp_path, reference, suffix, opener):
    texts = make_texts(40)
    run(tmp_path, [jsonl(tmp_path / f"a.jsonl{suffix}", texts, opener=opener)])
    assert_tokens_match(tmp_path / "out", texts, reference)


def test_zstd_input(tmp_path, reference):
    import zstandard  # the zstd extra is part of the test setup: missing, this fails rather than skips

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


def test_overwrite_leaves_no_shard_of_the_old_dataset(tmp_path):
    big = jsonl(tmp_path / "big.jsonl", make_texts(200))
    run(tmp_path, [big], tokens_per_shard=400, val_fraction=0.2)
    assert len(list((tmp_path / "out" / "train").glob("*.bin"))) > 5
    write(tmp_path / "out" / "notes.txt", "the user's own file")
    meta = run(tmp_path, [jsonl(tmp_path / "small.jsonl", make_texts(3))], tokens_per_shard=400, val_fraction=0.0,
               overwrite=True)  # fmt: skip
    shards = [s for split in meta["splits"].values() for s in split["shards"]]
    listed = {s[k] for s in shards for k in ("path", "index_path", "sums_path", "src_path")}
    keys = {f["path"] for f in meta["dedup"]["files"]}
    on_disk = {str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert on_disk == listed | keys | {"dataset_metadata.json", "tokenizer_state.json", "notes.txt"}
    assert listed == {"train/shard_000000.bin", "train/shard_000000.idx", "train/shard_000000.sums",
                      "train/shard_000000.src"}  # fmt: skip
    assert keys == {"dedup/doc_keys_000000.u64"}
    assert (tmp_path / "out" / "notes.txt").read_text() == "the user's own file"


def test_shards_hold_whole_documents_and_fill_greedily(tmp_path, reference):
    """A shard closes only before a document that would take it past tokens_per_shard; a longer
    document gets a shard of its own."""
    exact = make_texts(6, seed=3)
    first_two = sum(len(reference.encode_ordinary(t)) + 1 for t in exact[:2])  # + EOT each
    run(tmp_path, [jsonl(tmp_path / "e.jsonl", exact)], out=str(tmp_path / "e"), tokens_per_shard=first_two,
        val_fraction=0.0)  # fmt: skip
    offsets = np.fromfile(tmp_path / "e" / "train" / "shard_000000.idx", dtype="<u8")
    assert offsets.tolist()[-1] == first_two and len(offsets) == 3, "two documents fill the shard exactly"
    texts = make_texts(150, seed=2)
    texts[40] = "long " * 700  # ~700 tokens: more than a shard
    run(tmp_path, [jsonl(tmp_path / "a.jsonl", texts)], tokens_per_shard=300, val_fraction=0.0)
    shards = []
    for bin_path in sorted((tmp_path / "out" / "train").glob("*.bin")):
        offsets = np.fromfile(bin_path.with_suffix(".idx"), dtype="<u8")
        shards.append(np.diff(offsets).tolist())
    assert sum(len(s) for s in shards) == 150 and len(shards) > 10
    assert any(len(s) == 1 and s[0] > 300 for s in shards)
    for shard, following in zip(shards, shards[1:], strict=False):
        assert sum(shard) <= 300 or len(shard) == 1
        assert sum(shard) + following[0] > 300, "this shard had room for the next document"


def test_failed_run_leaves_no_dataset(tmp_path):
    write(tmp_path / "bad.jsonl", '{"text": "fine"}\n{"oops"\n')
    with pytest.raises(InputError, match="bad.jsonl:2"):
        run(tmp_path, [tmp_path / "bad.jsonl"])
    assert not (tmp_path / "out" / "dataset_metadata.json").exists()
    assert not list((tmp_path / "out").rglob("*.bin"))


def test_config_validation():
    with pytest.raises(ConfigError, match="--val-fraction"):
        PrepareConfig(inputs=["x"], out="y", val_fraction=1.5)
    with pytest.raises(ConfigError, match="--normalize"):
        PrepareConfig(inputs=["x"], out="y", normalize="nfd")


def expected_line_dedup(texts: list[str]) -> tuple[list[str], int]:
    """Hand-rolled reference: drop every non-blank line whose exact text appeared earlier; a
    text left with no non-blank line (but the blank ones between those removed) is empty."""
    seen: set[str] = set()
    out, removed = [], 0
    for t in texts:
        kept, dropped = [], 0
        for line in t.split("\n"):
            if line.strip() and line in seen:
                dropped += 1
                continue
            seen.add(line) if line.strip() else None
            kept.append(line)
        removed += dropped
        out.append("" if dropped and not any(line.strip() for line in kept) else "\n".join(kept))
    return out, removed


def test_line_dedup_removes_repeated_lines_in_input_order(tmp_path, reference, eager_pool):
    boiler = "Copyright (c) Example Corp. All rights reserved."
    texts = [f"{boiler}\nreal text {i}\n\nshared footer line\nunique {i * 7}" for i in range(40)] + [boiler]
    texts += [f"{boiler}\n\nshared footer line\n"]  # (only lines met before, and the blank ones between them)
    src = jsonl(tmp_path / "a.jsonl", texts)
    expected, removed = expected_line_dedup(texts)
    meta = run(tmp_path, [src], dedup_lines=True)
    assert meta["dedup"]["lines_removed"] == removed == 2 * 39 + 1 + 2
    assert meta["drops"]["empty"] == 2  # the last documents were only boilerplate
    assert_tokens_match(tmp_path / "out", [t for t in expected if t], reference)
    run(tmp_path, [src], out=str(tmp_path / "w2"), dedup_lines=True, workers=2)
    assert _tree(tmp_path / "w2") | {"dataset_metadata.json": b""} == _tree(tmp_path / "out") | {
        "dataset_metadata.json": b""
    }


def test_line_dedup_across_many_work_items(tmp_path, reference, small_items):
    """Keep-marks travel per work item as packed bits: items whose line count is not a multiple
    of 8 must keep their last lines when those are new (headers repeat, the texts' lines rarely do)."""
    headers = ["Posted by admin", "Share this:", "Home > News", "Cookie notice"]
    texts = [f"{headers[i % 4]}\n{t}" for i, t in enumerate(make_texts(150, seed=8))]
    expected, removed = expected_line_dedup(texts)
    items: list = []
    meta = run(tmp_path, [jsonl(tmp_path / "a.jsonl", texts)], dedup_lines=True, val_fraction=0.0,
               on_progress=items.append)  # fmt: skip
    assert len(items) > 2 * 10 and 140 < removed == meta["dedup"]["lines_removed"]
    assert_tokens_match(tmp_path / "out", [t for t in expected if t], reference)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(min_size=1, max_size=80), min_size=1, max_size=12))
@example(["\x1f"])  # cleans to nothing
def test_round_trip_text_to_shards_to_decoded_text(tmp_path_factory, reference, texts):
    """Any text → prepare → raw .bin/.idx read with numpy → decoded: the cleaned text, once each."""
    from lmshard.prepare.documents.clean import CleanConfig, clean_text, fix_surrogates

    tmp = tmp_path_factory.mktemp("rt")
    jsonl(tmp / "a.jsonl", texts)
    cleaned = [clean_text(fix_surrogates(t), CleanConfig()) for t in texts]
    expected = list(dict.fromkeys(c for c in cleaned if c))  # empties dropped, first copy kept
    if not expected:  # nothing survives cleaning (["\x1f"]): an error, and no dataset
        with pytest.raises(InputError, match="no document was kept"):
            run(tmp, [tmp / "a.jsonl"], val_fraction=0.0)
        assert not (tmp / "out" / "dataset_metadata.json").exists()
        return
    run(tmp, [tmp / "a.jsonl"], val_fraction=0.0)
    docs = read_docs(tmp / "out", "train")
    assert all(int(d[-1]) == GPT2_EOT for d in docs)
    assert [reference.decode(d[:-1].tolist()) for d in docs] == expected


def test_an_empty_val_split_is_warned_at_prepare_and_explained_at_load(tmp_path, capsys):
    """--val-fraction 0.001 of 50 kept documents sends none to val: prepare warns (one line), and
    opening the val split says why and what fraction would give one."""
    from lmshard import TokenDataset
    from lmshard.errors import FormatError

    src = jsonl(tmp_path / "a.jsonl", make_texts(50, seed=2))
    meta = run(tmp_path, [src], val_fraction=0.001)
    assert meta["splits"]["val"]["n_docs"] == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "val split is empty" in line]
    assert len(warned) == 1 and "--val-fraction 0.001 of its 50 documents sent none to val" in warned[0]
    with pytest.raises(FormatError, match=r"split 'val' holds no tokens; --val-fraction 0.001 of its 50 documents .* "
                                          r"prepare again with --val-fraction 0.088 or more \(an empty val split is "
                                          r"then under 1% likely\), or another --seed"):  # fmt: skip
        TokenDataset(tmp_path / "out", split="val")
    assert run(tmp_path, [src], out=str(tmp_path / "advised"), val_fraction=0.088)["splits"]["val"]["n_docs"] > 0
    run(tmp_path, [src], out=str(tmp_path / "none"), val_fraction=0.0)
    assert "val split is empty" not in capsys.readouterr().err  # no val split was asked for


@pytest.mark.parametrize(("n", "advised"), [(6, None), (7, 0.49), (30, 0.15)])
def test_the_advised_val_fraction_makes_an_empty_val_split_under_1_percent_likely(tmp_path, n, advised):
    """The fraction advised for an empty val split, rounded up (never down) to two figures:
    (1 - f)^n under 1% (7 documents: 0.51^7 = 0.9%; 30: 0.85^30 = 0.8%); for 6 documents none
    under 0.5 is, and the advice is more data."""
    from lmshard import TokenDataset
    from lmshard.errors import FormatError

    run(tmp_path, [jsonl(tmp_path / "a.jsonl", make_texts(n, seed=3))], val_fraction=0.001)
    with pytest.raises(FormatError) as e:
        TokenDataset(tmp_path / "out", split="val")
    if advised is None:
        assert "too few documents for a val split by fraction: prepare more data" in str(e.value)
        return
    assert f"prepare again with --val-fraction {advised} or more" in str(e.value)
    assert (1 - advised) ** n < 0.01 < (1 - (advised - 0.01)) ** n  # the smallest two-figure fraction that does


def test_a_dataset_decodes_its_own_tokens(tmp_path, reference):
    """TokenDataset.decode / .tokenizer: the dataset's vocabulary, equal to the reference
    library's decode of the same ids; a batch gives one string per row; an in-memory dataset,
    which records no vocabulary, says so in one line."""
    from lmshard import LmshardError, TokenDataset

    texts = make_texts(30, seed=5)
    src = jsonl(tmp_path / "a.jsonl", texts)
    run(tmp_path, [src], val_fraction=0.0)
    ds = TokenDataset(tmp_path / "out")
    ids = ds.tokens(0, 200)
    assert ds.decode(ids) == reference.decode(ids.tolist())
    assert ds.decode(ids.tolist()) == reference.decode(ids.tolist())
    batch = next(iter(ds.random_batches(3, 16, seed=1)))
    assert ds.decode(batch.x) == [reference.decode(row.tolist()) for row in batch.x]
    assert ds.tokenizer.eot_id == ds.eot_id
    memory = TokenDataset.from_tokens(np.arange(5), eot_id=0, vocab_size=10)
    with pytest.raises(LmshardError, match="no tokenizer to decode with"):
        memory.decode([1, 2])
