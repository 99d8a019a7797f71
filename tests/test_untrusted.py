"""Datasets from someone else (downloaded, copied, tampered with): every tampered dataset in the
table is refused by `lmshard inspect` (a corrupt exit, one "problem:" line naming the file and
what is wrong, no traceback) and by the runtime loader (a one-line FormatError naming the file
and the field), before either allocates anything large or maps a shard it should not.

Each case starts from a small real dataset made by `prepare` and changes one thing. Where a
count is changed, the split and dataset totals are changed with it, so that only the check
being tested stands between the dataset and "verified"."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import traced_peak, write
from typer.testing import CliRunner

from lmshard import TokenDataset
from lmshard.cli import app
from lmshard.errors import EXIT_CORRUPT, FormatError
from lmshard.format import load_metadata, read_document
from lmshard.inspect import verify
from lmshard.inspect.verify import verify_dataset
from lmshard.prepare import PrepareConfig, prepare
from lmshard.runtime import store

runner = CliRunner()
META = "dataset_metadata.json"
BIN, IDX = "train/shard_000001.bin", "train/shard_000001.idx"
MAX_PEAK = 64 << 20  # bytes traced while inspecting and loading: the dataset itself is ~40 KB


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Four or more train shards and a val split, made by prepare from real text."""
    tmp = tmp_path_factory.mktemp("untrusted")
    texts = [f"document {i}: " + " ".join(f"word{(i * 7 + j) % 97}" for j in range(20 + i % 40)) for i in range(150)]
    src = write(tmp / "a.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp / "ds"), workers=1, tokens_per_shard=1200, val_fraction=0.1))
    assert len(load_metadata(tmp / "ds").split_shards("train")) >= 4
    return tmp / "ds"


@pytest.fixture
def dataset(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "ds")


# -- tampering ----------------------------------------------------------------------------------


def edit(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def tamper(ds: Path) -> None:
        meta = json.loads((ds / META).read_text())
        change(meta)
        (ds / META).write_text(json.dumps(meta))

    return tamper


def shard(meta: dict, k: int = 1) -> dict:
    return meta["splits"]["train"]["shards"][k]


def set_count(key: str, value: int | Callable[[int], int], k: int = 1) -> Callable[[Path], None]:
    """Shard k's count set to `value` (or value(count)), the split and dataset totals moved to match."""

    def change(meta: dict) -> None:
        old = shard(meta, k)[key]
        new = value(old) if callable(value) else value
        shard(meta, k)[key] = new
        meta["splits"]["train"][key] += new - old
        meta[key] += new - old

    return edit(change)


def set_shard(**fields: object) -> Callable[[Path], None]:
    return edit(lambda m: shard(m).update(fields))


def text_edit(old: str, new: str) -> Callable[[Path], None]:
    def tamper(ds: Path) -> None:
        text = (ds / META).read_text()
        assert old in text
        (ds / META).write_text(text.replace(old, new, 1))

    return tamper


def listed_twice(meta: dict) -> None:
    train = meta["splits"]["train"]
    train["shards"].append(dict(shard(meta)))
    for entry in (train, meta):
        entry["n_tokens"] += shard(meta)["n_tokens"]
        entry["n_docs"] += shard(meta)["n_docs"]


def reordered(meta: dict) -> None:
    """The train stream's first two shards swapped: every count still adds up."""
    shards = meta["splits"]["train"]["shards"]
    shards[0], shards[1] = shards[1], shards[0]


def resize(rel: str, delta: int) -> Callable[[Path], None]:
    def tamper(ds: Path) -> None:
        data = (ds / rel).read_bytes()
        (ds / rel).write_bytes(data[:delta] if delta < 0 else data + bytes(delta))

    return tamper


def replace_file(rel: str, make: Callable[[Path], object]) -> Callable[[Path], None]:
    def tamper(ds: Path) -> None:
        (ds / rel).unlink()
        make(ds / rel)

    return tamper


def link_outside(ds: Path) -> None:
    """The same bytes, but in a file outside the dataset: sizes and checksums all match."""
    outside = shutil.copy(ds / BIN, ds.parent / "elsewhere.bin")
    (ds / BIN).unlink()
    (ds / BIN).symlink_to(outside)


def split_dir_outside(ds: Path) -> None:
    (ds / "train").rename(ds.parent / "train_elsewhere")
    (ds / "train").symlink_to(ds.parent / "train_elsewhere")


def offsets_edit(change: Callable[[np.ndarray], None]) -> Callable[[Path], None]:
    def tamper(ds: Path) -> None:
        offsets = np.fromfile(ds / IDX, dtype="<u8")
        change(offsets)
        offsets.tofile(ds / IDX)

    return tamper


def swap(offsets: np.ndarray) -> None:
    offsets[2], offsets[3] = offsets[3], offsets[2]


def swap_index(ds: Path) -> None:
    """Shard 1 gets shard 0's index (and provenance), n_docs edited to fit: sizes agree, the end
    does not."""
    meta = json.loads((ds / META).read_text())
    assert shard(meta, 0)["n_tokens"] != shard(meta, 1)["n_tokens"]
    set_count("n_docs", shard(meta, 0)["n_docs"])(ds)
    shutil.copy(ds / shard(meta, 0)["index_path"], ds / IDX)
    if "src_path" in shard(meta, 0):
        shutil.copy(ds / shard(meta, 0)["src_path"], ds / shard(meta, 1)["src_path"])


# (id, tamper, file the messages must name, words they must hold, refused when: "open" or "index")
# fmt: off
CASES = [
    ("format-version-99", edit(lambda m: m.update(format_version=99)), META, ["format version 99"], "open"),
    ("format-version-str", edit(lambda m: m.update(format_version="1")), META, ["'format_version' is str"], "open"),
    ("format-name", edit(lambda m: m.update(format="webdataset")), META, ["not lmshard metadata"], "open"),
    ("path-dotdot", set_shard(path="../../etc/passwd"), META, ["'../../etc/passwd'", "escapes"], "open"),
    ("path-absolute", set_shard(path="/etc/passwd"), META, ["'/etc/passwd'", "escapes"], "open"),
    ("index-path-absolute", set_shard(index_path="/etc/hostname"), META, ["'/etc/hostname'", "escapes"], "open"),
    ("path-not-a-shard-name", set_shard(path="train/tokens.bin"), META, ["'train/tokens.bin'",
                                                                        "train/shard_NNNNNN.bin"], "open"),
    ("path-of-another-split", set_shard(path="val/shard_000001.bin", index_path="val/shard_000001.idx"), META,
     ["'val/shard_000001.bin'", "not train/shard_NNNNNN.bin"], "open"),
    ("index-of-another-shard", set_shard(index_path="train/shard_000002.idx"), META,
     ["'train/shard_000002.idx'", "not train/shard_NNNNNN.bin and .idx"], "open"),
    ("shard-listed-twice", edit(listed_twice), META, ["'train/shard_000001.bin'", "listed in order"], "open"),
    ("shards-reordered", edit(reordered), META, ["shard entry 0 is 'train/shard_000001.bin', not "
                                                 "'train/shard_000000.bin'", "listed in order"], "open"),
    ("n_docs-negative", set_shard(n_docs=-1), META, ["'n_docs' is negative"], "open"),
    ("n_tokens-float", set_shard(n_tokens=12.0), META, ["'n_tokens' is float, not int"], "open"),
    ("n_tokens-bool", set_shard(n_tokens=True), META, ["'n_tokens' is bool, not int"], "open"),
    ("n_tokens-str", set_shard(n_tokens="1200"), META, ["'n_tokens' is str, not int"], "open"),
    ("n_docs-above-n_tokens", set_count("n_docs", 10**6), META, ["'n_docs' 1000000 is impossible"], "open"),
    ("split-total", edit(lambda m: m["splits"]["train"].update(n_tokens=1)), META,
     ["split train: n_tokens 1 != sum of its shards"], "open"),
    ("dataset-total", edit(lambda m: m.update(n_docs=10**15)), META,
     ["n_docs 1000000000000000 != sum of shards"], "open"),
    ("int-of-5000-digits", text_edit('"records_read": ', '"records_read": ' + "9" * 5000), META,
     ["unreadable"], "open"),
    ("json-nested-deeply", text_edit('"config": ', '"config": ' + "[" * 100_000 + "]" * 100_000 + ", \"x\": "),
     META, ["unreadable"], "open"),
    ("n_tokens-10e15", set_count("n_tokens", 10**15), BIN, ["'n_tokens' 1000000000000000", "bytes"], "open"),
    ("n_docs-plus-one", set_count("n_docs", lambda n: n + 1), IDX, ["'n_docs'", "bytes"], "open"),
    ("bin-truncated", resize(BIN, -4), BIN, ["bytes, but 'n_tokens'"], "open"),
    ("bin-extended", resize(BIN, 4), BIN, ["bytes, but 'n_tokens'"], "open"),
    ("idx-truncated", resize(IDX, -8), IDX, ["bytes, but 'n_docs'"], "open"),
    ("bin-missing", lambda ds: (ds / BIN).unlink(), BIN, ["is missing"], "open"),
    ("bin-symlink-outside", link_outside, BIN, ["outside the dataset directory"], "open"),
    ("split-dir-symlink-outside", split_dir_outside, "train/shard_000000.bin", ["outside the dataset"], "open"),
    ("bin-is-a-directory", replace_file(BIN, Path.mkdir), BIN, ["not a regular file"], "open"),
    ("bin-is-a-fifo", replace_file(BIN, os.mkfifo), BIN, ["not a regular file"], "open"),
    ("index-starts-at-1", offsets_edit(lambda o: o.__setitem__(0, 1)), IDX, ["document index spans 1.."], "index"),
    ("index-ends-short", offsets_edit(lambda o: o.__setitem__(-1, o[-1] - 1)), IDX, ["document index spans 0.."],
     "index"),
    ("index-ends-at-10e15", offsets_edit(lambda o: o.__setitem__(-1, 10**15)), IDX,
     ["spans 0..1000000000000000, not 0.."], "index"),
    ("index-decreasing", offsets_edit(swap), IDX, ["not strictly increasing"], "index"),
    ("index-swapped", swap_index, IDX, ["document index spans 0..", "('n_tokens')"], "index"),
]
# fmt: on


# -- what inspect and the loader must do ---------------------------------------------------------


def inspect(ds: Path, sample: int = 3):
    """`lmshard inspect DS --sample N`: sampling reads documents of the shards that fail too."""
    result = runner.invoke(app, ["inspect", str(ds), "--sample", str(sample)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result


def load_everything(ds: Path) -> None:
    """Open every split with the loader and load every shard's document index."""
    for split in ("train", "val"):
        data = TokenDataset(ds, split)
        for k in range(len(data.store.shards)):
            data.store.index(k)


def test_the_pristine_dataset_passes_both(dataset):
    """The control: what every case below changes one thing of."""
    assert inspect(dataset).exit_code == 0
    assert traced_peak(lambda: load_everything(dataset)) < MAX_PEAK


@pytest.mark.parametrize("tamper,where,words,stage", [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_tampered_dataset_is_refused_by_inspect_and_the_loader(dataset, monkeypatch, tamper, where, words, stage):
    tamper(dataset)
    result = None

    def both() -> None:
        nonlocal result
        result = inspect(dataset)
        if stage == "open":  # refused by the constructor, before any shard is opened or mapped
            monkeypatch.setattr(store, "_Open", lambda *a: pytest.fail("the loader opened a shard"))
            with pytest.raises(FormatError) as refused:
                TokenDataset(dataset)
        else:  # opens (sizes agree); refused when the index is loaded
            with pytest.raises(FormatError) as refused:
                load_everything(dataset)
        message = str(refused.value)
        assert "\n" not in message and where in message and all(w in message for w in words), message

    assert traced_peak(both) < MAX_PEAK
    assert result is not None
    assert result.exit_code == EXIT_CORRUPT and "CORRUPT" in result.output, result.output
    problems = [line for line in result.output.splitlines() if line.startswith("problem:")]
    assert any(where in p and all(w in p for w in words) for p in problems), result.output
    quick = [str(p) for p in verify_dataset(dataset, quick=True).problems]  # structure: no token read
    assert any(where in p and all(w in p for w in words) for p in quick), quick


def test_a_symlink_inside_the_dataset_is_followed(dataset):
    (dataset / "stash").mkdir()
    (dataset / BIN).rename(dataset / "stash" / "s.bin")
    (dataset / BIN).symlink_to(Path("..") / "stash" / "s.bin")
    assert inspect(dataset).exit_code == 0
    load_everything(dataset)


def test_a_tokenizer_state_outside_the_dataset_is_a_problem(dataset):
    """Only inspect reads tokenizer_state.json; a link to a copy elsewhere agrees in every field."""
    outside = shutil.copy(dataset / "tokenizer_state.json", dataset.parent / "state.json")
    (dataset / "tokenizer_state.json").unlink()
    (dataset / "tokenizer_state.json").symlink_to(outside)
    result = inspect(dataset)
    problems = [line for line in result.output.splitlines() if line.startswith("problem:")]
    assert result.exit_code == EXIT_CORRUPT and len(problems) == 1, result.output
    assert "tokenizer_state.json" in problems[0] and "outside the dataset directory" in problems[0]


def test_metadata_outside_the_dataset_or_too_large_is_refused_unread(dataset, monkeypatch):
    """dataset_metadata.json is held to what the other files are: a regular file inside the
    dataset, of a metadata's size, checked again on the file opened (a FIFO swapped in would
    otherwise block the read forever)."""
    import lmshard.format.files as files_mod

    meta = dataset / "dataset_metadata.json"
    outside = shutil.copy(meta, dataset.parent / "elsewhere.json")
    meta.unlink()
    meta.symlink_to(outside)
    with pytest.raises(FormatError, match="outside the dataset directory"):
        load_metadata(dataset)
    meta.unlink()
    shutil.copy(outside, meta)
    load_metadata(dataset)  # the control
    monkeypatch.setattr(files_mod, "MAX_METADATA_BYTES", 100)
    with pytest.raises(FormatError, match="more than any lmshard metadata"):
        load_metadata(dataset)
    monkeypatch.undo()
    real_size = files_mod.dataset_file_size

    def swap_after_check(root, rel):  # the check passes, then a FIFO takes the file's place
        size = real_size(root, rel)
        meta.unlink()
        os.mkfifo(meta)
        return size

    monkeypatch.setattr(files_mod, "dataset_file_size", swap_after_check)
    with pytest.raises(FormatError, match="not a regular file"):
        load_metadata(dataset)


def test_a_document_read_never_runs_past_the_files(dataset):
    """inspect --doc/--sample read single documents: an index entry beyond n_tokens is refused
    before the read, not turned into a read of 4e15 bytes."""
    offsets_edit(lambda o: o.__setitem__(1, 10**15))(dataset)
    meta = load_metadata(dataset)
    entry = next(s for s in meta.shards if s.path == BIN)
    with pytest.raises(FormatError, match=r"document 0 spans 0\.\.1000000000000000"):
        read_document(meta, entry, 0)
    result = inspect(dataset, sample=40)
    assert result.exit_code == EXIT_CORRUPT and "CORRUPT" in result.output and "tokens)" in result.output


def test_a_huge_vocabulary_gets_no_histogram_of_that_size(dataset):
    """n_vocab 2**26 (consistent in both files, so the dataset is sound): a full verify must not
    allocate 2**26 int64 counters (512 MiB), let alone count one block into another such array."""
    n_vocab = verify.MAX_COUNTED_VOCAB * 4
    edit(lambda m: m["tokenizer"].update(n_vocab=n_vocab))(dataset)
    state = json.loads((dataset / "tokenizer_state.json").read_text())
    (dataset / "tokenizer_state.json").write_text(json.dumps({**state, "n_vocab": n_vocab}))
    report = None

    def run() -> None:
        nonlocal report
        report = verify_dataset(dataset)

    assert traced_peak(run) < MAX_PEAK
    assert report is not None and report.ok and report.token_counts is None, report.problems


def test_a_store_whose_init_failed_is_deleted_silently(monkeypatch):
    """__del__ of a half-built store at interpreter shutdown, when module globals are gone."""
    half = store.TokenStore.__new__(store.TokenStore)
    monkeypatch.setattr(store, "contextlib", None)
    half.__del__()
