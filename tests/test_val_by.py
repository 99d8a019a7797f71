"""`prepare --val-by input --val-tokens N` (prepare/execution/valby.py): each input's val part is
its documents of smallest keyed draw until N tokens (at most half the input's), checked against
the shards' own bytes (numpy over .bin/.idx/.src) and a hand-made draw of every document; the
same bytes for any worker count and task count, and per-input val streams disjoint from train."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash
from conftest import write
from test_stages import _files

from lmshard import TokenDataset
from lmshard.errors import ConfigError
from lmshard.format import INDEX_DTYPE, SRC_DTYPE, load_metadata
from lmshard.format.provenance import src_path
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.documents.dedup import uniform_from_keys
from lmshard.prepare.documents.sources import discover
from lmshard.prepare.output.claim import _fingerprint, difference
from lmshard.tokenizers import load_tokenizer

BUDGET = 3_000


def _inputs(root: Path) -> list[Path]:
    """Four inputs: large; middling, with one record repeated 12 times (equal draws under --dedup
    none); small (under twice the budget: its cap is half of it); and one document."""
    out = []
    for name, n in (("big", 300), ("mid", 120), ("small", 12), ("one", 1)):
        texts = [f"{name} record {i}: " + " ".join(f"w{(i * 7 + j) % 97}" for j in range(20 + i * 13 % 90))
                 for i in range(n)]  # fmt: skip
        if name == "mid":
            texts += [texts[5]] * 11
        out.append(write(root / f"{name}.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts)))
    return out


def _docs(path: Path, split: str) -> list[tuple[int, np.ndarray]]:
    """(input number, tokens as written) of every document of a split, from the files' bytes."""
    meta, out = load_metadata(path), []
    for shard in meta.split_shards(split):
        tokens = np.fromfile(path / shard.path, dtype="<u4")
        starts = np.fromfile(path / shard.index_path, dtype=INDEX_DTYPE)
        src = np.fromfile(path / src_path(shard.path), dtype=SRC_DTYPE)
        out += [(int(src["source"][d]), tokens[starts[d] : starts[d + 1]]) for d in range(len(src))]
    return out


def _prepare(root: Path, name: str, **options) -> Path:
    out = root / name
    prepare(PrepareConfig(inputs=[str(p) for p in _inputs(root)], out=str(out), tokenizer="gpt2", val_fraction=0,
                          val_by="input", val_tokens=BUDGET, tokens_per_shard=5_000, **options))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("valby")
    return root, _prepare(root, "one", workers=1)


def _expected(docs: list[tuple[float, int, bytes]], budget: int) -> set[bytes]:
    """The rule, by hand: groups of equal draw in order until --val-tokens is reached, none that
    would take val past half the input's tokens."""
    docs, half = sorted(docs), sum(n for _, n, _ in docs) // 2
    groups: list[list[tuple[float, int, bytes]]] = []
    for doc in docs:
        if groups and groups[-1][0][0] == doc[0]:
            groups[-1].append(doc)
        else:
            groups.append([doc])
    chosen: set[bytes] = set()
    total = 0
    for group in groups:
        if total >= budget or total + sum(n for _, n, _ in group) > half:
            break
        total += sum(n for _, n, _ in group)
        chosen |= {text for _, _, text in group}
    return chosen


def _check_rule(path: Path, enc, budget: int) -> dict[int, tuple[int, int]]:
    """Per input, its val and train tokens, once its val is checked to be the rule's."""
    split_of, by_input = {}, {}
    for split in ("train", "val"):
        for source, tokens in _docs(path, split):
            text = enc.decode(tokens[tokens != enc.eot_token].tolist())
            key = np.array([xxhash.xxh3_64_intdigest(text.encode())], dtype=np.uint64)
            draw = float(uniform_from_keys(key, 1337)[0])
            by_input.setdefault(source, []).append((draw, len(tokens), text.encode()))
            split_of.setdefault((source, text.encode()), set()).add(split)
    out = {}
    for source, docs in by_input.items():
        val = _expected(docs, budget)
        got = {text for (s, text), splits in split_of.items() if s == source and "val" in splits}
        assert got == val, (source, len(got), len(val))
        assert all(split_of[(source, text)] == {"val"} for text in val)  # copies of a text go together
        out[source] = (sum(n for _, n, t in docs if t in val), sum(n for _, n, t in docs if t not in val))
    return out


def test_each_input_holds_out_its_smallest_draws_up_to_the_budget(made, reference):
    """Per input: val is the documents of smallest draw (the xxh3-64 of the text, as dedup keys
    it), whose tokens first reach the budget, never past half the input's; with --dedup none, a
    record's copies (equal draws) go together; an input of one document keeps it in train."""
    root, path = made
    tokens = _check_rule(path, reference, BUDGET)
    assert sorted(tokens) == [0, 1, 2, 3]
    assert tokens[0][0] >= BUDGET and tokens[1][0] >= BUDGET  # the budget, reached
    assert 0 < tokens[2][0] <= tokens[2][1] < 2 * BUDGET  # a small input: at most half
    assert tokens[3][0] == 0 and tokens[3][1] > 0  # one document: no val
    copies = _check_rule(_prepare(root, "copies", workers=2, dedup="none"), reference, BUDGET)
    assert copies[1] != tokens[1]  # (the repeated record is kept 12 times)
    near = _check_rule(_prepare(root, "near", workers=2, near_dedup=True), reference, BUDGET)  # (survivors only)
    assert near[0][0] + near[0][1] < tokens[0][0] + tokens[0][1] and near[0][0] > 0


def test_the_same_bytes_for_any_worker_and_task_count(made, tmp_path):
    root, one = made
    files = _files(one)  # (the metadata but its run record too)
    for name, options in (("two", {"workers": 2}), ("tasks", {"workers": 1, "num_tasks": 3})):
        assert _files(_prepare(root, name, **options)) == files, name


def test_val_streams_per_input_are_disjoint_from_train(made):
    root, path = made
    val = TokenDataset(path, "val")
    with pytest.warns(UserWarning, match="without --near-dedup"):  # (exact copies only are removed here)
        streams = val.val_streams(tokens=BUDGET, seq_len=64, batch_size=4, by="input")
    assert sorted(Path(name).name for name in streams) == ["big.jsonl", "mid.jsonl", "small.jsonl"]
    assert all(s.tokens > BUDGET - 64 for name, s in streams.items() if "small" not in name)  # each a full budget
    train = {tokens.tobytes() for _, tokens in _docs(path, "train")}
    assert not any(tokens.tobytes() in train for _, tokens in _docs(path, "val"))


def test_refusals_and_stdin(tmp_path):
    src = _inputs(tmp_path)[0]
    base = {"inputs": [str(src)], "out": str(tmp_path / "o"), "tokenizer": "gpt2"}
    with pytest.raises(ConfigError, match="pass --val-fraction 0"):
        PrepareConfig(**base, val_by="input", val_tokens=10)  # (its default fraction, 0.01)
    with pytest.raises(ConfigError, match="needs --val-tokens"):
        PrepareConfig(**base, val_by="input", val_fraction=0)
    with pytest.raises(ConfigError, match="no --append or --max-docs"):
        PrepareConfig(**base, val_by="input", val_tokens=10, val_fraction=0, max_docs=5)
    with pytest.raises(ConfigError, match="without --val-by"):
        PrepareConfig(**base, val_tokens=10)
    lmshard = [sys.executable, "-m", "lmshard", "prepare"]
    done = subprocess.run([*lmshard, "-", "--out", str(tmp_path / "p"), "--val-by", "input", "--val-tokens", "500"],
                          input=src.read_text(), text=True, capture_output=True)  # fmt: skip
    assert done.returncode == 0, done.stderr  # stdin, spooled, as --num-tasks takes it
    val = load_metadata(tmp_path / "p").n_tokens("val")
    assert 500 <= val <= load_metadata(tmp_path / "p").n_tokens("train")
    hub = tmp_path / "hub"
    write(hub / "data.jsonl", src.read_text())
    done = subprocess.run([*lmshard, "--hf", str(hub), "--out", str(tmp_path / "h"), "--val-by", "input",
                           "--val-tokens", "500"], text=True, capture_output=True)  # fmt: skip
    assert done.returncode == 0, done.stderr  # a stream, planned by its data files
    assert 500 <= load_metadata(tmp_path / "h").n_tokens("val") == val  # (the same documents, the same draw)
    done = subprocess.run([*lmshard, str(src), "--out", str(tmp_path / "p"), "--append"], text=True,
                          capture_output=True)  # fmt: skip
    assert done.returncode != 0 and "which an --append cannot extend" in done.stderr, done.stderr


def test_inspect_reads_the_splits_of_a_val_by_dataset(made):
    """inspect --overlap splits: no document of val in train (its splits read from the documents)."""
    _, path = made
    done = subprocess.run([sys.executable, "-m", "lmshard", "inspect", str(path), "--overlap", "splits", "--json"],
                          text=True, capture_output=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    train, val = load_metadata(path).n_docs("train"), load_metadata(path).n_docs("val")
    assert (report["scanned"], report["indexed"], report["exact"]) == (train, val, 0)


def test_the_budget_is_in_the_fingerprint(tmp_path):
    """A resume with another --val-tokens, or without --val-by, is refused naming the option."""
    src = _inputs(tmp_path)[2]

    def fingerprint(**options):
        config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "o"), **options)
        return _fingerprint(config, discover(config.inputs), load_tokenizer(config.tokenizer), None)

    by = fingerprint(val_by="input", val_tokens=100, val_fraction=0)
    assert "--val-tokens was 100 when the run started and is 200 now" in difference(
        by, fingerprint(val_by="input", val_tokens=200, val_fraction=0))
    assert "--val-by was 'input' when the run started and is not given now" in difference(by, fingerprint())
    assert "--near-dedup was off when the run started and is on now" in difference(  # (in words, not False/True)
        fingerprint(), fingerprint(near_dedup=True))


def test_inputs_of_one_document_each_warn_that_the_val_split_is_empty(tmp_path, capsys):
    """Text files of one document each: no input can lend a document to val (a domain keeps half
    its tokens in train), so val is empty, and the run says so and how to get one, as an empty
    --val-fraction split does; inputs of several documents get no warning."""
    files = [write(tmp_path / "in" / f"f{i}.txt", f"document {i} " + "word " * (30 + i)) for i in range(5)]
    out = tmp_path / "one_each"
    prepare(PrepareConfig(inputs=[str(tmp_path / "in")], out=str(out), val_fraction=0, val_by="input",
                          val_tokens=200, workers=1))  # fmt: skip
    assert load_metadata(out).n_docs("val") == 0 and load_metadata(out).n_docs("train") == len(files)
    err = " ".join(capsys.readouterr().err.split())
    assert "the val split is empty: --val-by input: no input file has more than one document" in err, err
    assert "--text-mode paragraph" in err
    _prepare(tmp_path, "several")
    assert "the val split is empty" not in capsys.readouterr().err


def test_domains_whose_first_drawn_document_is_most_of_them_warn_with_that_reason(tmp_path, capsys):
    """Inputs of two documents, one long and one short: where every input draws its long one
    first, val is empty (a domain keeps half its tokens in train), and the warning says that,
    not that the inputs have one document each (the first seed that gives it, found by trying)."""
    for i in range(2):
        write(tmp_path / "in" / f"f{i}.jsonl", json.dumps({"text": f"long {i} " + "word " * 300}) + "\n" +
              json.dumps({"text": f"short one {i}"}) + "\n")  # fmt: skip
    for seed in range(40):
        out = tmp_path / f"s{seed}"
        prepare(PrepareConfig(inputs=[str(tmp_path / "in")], out=str(out), val_fraction=0, val_by="input",
                              val_tokens=1000, workers=1, seed=seed))  # fmt: skip
        err = " ".join(capsys.readouterr().err.split())
        if load_metadata(out).n_docs("val") == 0:
            break
        assert "the val split is empty" not in err, err
    else:
        pytest.fail("no seed drew the long document first in both inputs")
    assert "the val split is empty: --val-by input: every domain keeps at least half its tokens in train, and in " \
        "each the first document drawn holds more than half" in err, err
    assert "--text-mode paragraph" not in err
