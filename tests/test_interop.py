"""`lmshard export` / `lmshard import` against independent readers.

Each reader below is written from the format's own specification (the code of the trainer that
reads it: nanoGPT's train.py memmap, llm.c's dev/data/data_common.py header and
llmc/dataloader.h checks, modded-nanogpt's _load_data_shard, Megatron-LM's
indexed_dataset._IndexReader), with numpy and struct only, never lmshard's export code. The truth
is the dataset's own documents read with numpy from its .bin/.idx files (conftest.read_docs),
with the EOT token moved to the side each format puts it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import GPT2_EOT, read_docs, write
from test_hf_tokenizer import BOT, EOT, big  # noqa: F401  (big: the module-scoped >65,536-id vocabulary)
from typer.testing import CliRunner

import lmshard.interop.foreign as foreign
import lmshard.interop.source as source
from lmshard.cli import app
from lmshard.errors import ConfigError
from lmshard.format import load_metadata
from lmshard.inspect.verify import verify_dataset
from lmshard.interop import export_dataset, import_dataset
from lmshard.interop.layouts import MEGATRON_HEADER
from lmshard.prepare import PrepareConfig, prepare

runner = CliRunner()
SRC_RECORD = np.dtype([("source", "<u4"), ("record", "<u8")])  # a .src record, as docs/format.md states it


# --- independent readers, from each format's specification ------------------------------------


def nanogpt_tokens(path: Path) -> np.ndarray:
    """nanoGPT train.py: np.memmap(path, dtype=np.uint16, mode='r'), no header."""
    return np.asarray(np.memmap(path, dtype=np.uint16, mode="r"))


LLMC_KINDS = {(20240520, 1): np.dtype("<u2"), (20240801, 7): np.dtype("<u4")}


def llmc_shard(path: Path) -> tuple[tuple[int, int], np.ndarray]:
    """llm.c: 256 little-endian int32 (magic, version, token count, then zeros), then the tokens."""
    raw = path.read_bytes()
    header = struct.unpack("<256i", raw[:1024])
    kind = (header[0], header[1])
    assert kind in LLMC_KINDS, kind
    assert not any(header[3:]), "llm.c leaves the rest of the header zero"
    tokens = np.frombuffer(raw[1024:], dtype=LLMC_KINDS[kind])
    assert len(tokens) == header[2], "the header's token count is the file's"
    return kind, tokens


MEGATRON_DTYPES = {8: np.dtype("<u2"), 4: np.dtype("<i4")}


def megatron_documents(prefix: Path) -> tuple[int, list[np.ndarray], int]:
    """Megatron _IndexReader: b'MMIDIDX\\x00\\x00', <Q version 1, <B dtype code, <Q sequence count,
    <Q document-index count, int32 lengths, int64 byte pointers, int64 document indices; a
    document is its sequences [doc_idx[i], doc_idx[i+1]). Returns (code, documents, doc count field)."""
    raw = prefix.with_name(prefix.name + ".idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack_from("<Q", raw, 9)
    (code,) = struct.unpack_from("<B", raw, 17)
    n_seq, n_doc = struct.unpack_from("<QQ", raw, 18)
    assert version == 1 and code in MEGATRON_DTYPES
    at = 34
    lengths = np.frombuffer(raw, "<i4", n_seq, at)
    pointers = np.frombuffer(raw, "<i8", n_seq, at + 4 * n_seq)
    doc_idx = np.frombuffer(raw, "<i8", n_doc, at + 12 * n_seq)
    assert len(raw) == at + 12 * n_seq + 8 * n_doc, "nothing after the document indices"
    dtype = MEGATRON_DTYPES[code]
    data = prefix.with_name(prefix.name + ".bin").read_bytes()
    seqs = [np.frombuffer(data, dtype, int(n), int(p)) for n, p in zip(lengths, pointers, strict=True)]
    docs = [np.concatenate(seqs[a:b]) for a, b in zip(doc_idx[:-1], doc_idx[1:], strict=True)]
    return code, docs, n_doc


def with_eot(docs: list[np.ndarray], have: str, want: str, eot: int) -> list[np.ndarray]:
    """The documents with their EOT token on the `want` side (it is on `have`)."""
    if have == want:
        return docs
    if want == "after":
        assert all(d[0] == eot for d in docs)
        return [np.append(d[1:], eot) for d in docs]
    assert all(d[-1] == eot for d in docs)
    return [np.insert(d[:-1], 0, eot) for d in docs]


def flat(docs: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(docs).astype(np.int64)


# --- datasets ---------------------------------------------------------------------------------


def _texts(n: int) -> list[str]:
    rng = np.random.default_rng(3)
    words = ["the", "of", "river", "stone", "light", "quiet", "north", "42", "über", "日本", "{}", "code"]
    return [" ".join(rng.choice(words, size=int(rng.integers(2, 40)))) + f" #{i}" for i in range(n)]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """GPT-2 datasets with the EOT after / before each document: 300 documents, train and val,
    several shards per split."""
    tmp = tmp_path_factory.mktemp("interop")
    src = write(tmp / "docs.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in _texts(300)))
    made = {}
    for side in ("after", "before"):
        cfg = PrepareConfig(inputs=[str(src)], out=str(tmp / side), workers=1, val_fraction=0.25,
                            tokens_per_shard=1500, eot_position=side)  # fmt: skip
        prepare(cfg)
        made[side] = tmp / side
    return made


@pytest.fixture(scope="module")
def big_ds(big, tmp_path_factory):  # noqa: F811
    """A Llama-3-like dataset: ids above 65,535, a BOS before each text, EOT after it."""
    tmp = tmp_path_factory.mktemp("bigds")
    texts = [" ".join(big["high_words"][5 * i : 5 * i + 5]) + f" doc {i}" for i in range(60)]
    src = write(tmp / "docs.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp / "ds"), tokenizer=str(big["file"]), workers=1,
                          val_fraction=0.2, tokens_per_shard=400))  # fmt: skip
    return tmp / "ds"


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of ~50 tokens, so every export crosses many block boundaries."""
    monkeypatch.setattr(source, "BLOCK_TOKENS", 50)
    monkeypatch.setattr(foreign, "BLOCK_TOKENS", 37)


def truth(root: Path, split: str, want: str) -> list[np.ndarray]:
    meta = load_metadata(root)
    return with_eot(read_docs(root, split), meta.eot_position, want, meta.tokenizer.eot_id)


# --- export -----------------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["after", "before"])
def test_nanogpt_export_is_the_documents_uint16_with_eot_after(datasets, side, tmp_path, small_blocks):
    root = datasets[side]
    export_dataset(root, "nanogpt", tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["lmshard_export.json", "train.bin", "val.bin"]
    for split in ("train", "val"):
        tokens = nanogpt_tokens(tmp_path / "out" / f"{split}.bin")
        assert (tmp_path / "out" / f"{split}.bin").stat().st_size == 2 * len(tokens)
        assert np.array_equal(tokens, flat(truth(root, split, "after")))
        assert tokens[-1] == GPT2_EOT


def test_llmc_export_gpt2_is_v1_uint16_shards_of_whole_documents_eot_before(datasets, tmp_path, small_blocks):
    root = datasets["after"]
    result = export_dataset(root, "llmc", tmp_path / "out", tokens_per_shard=1000, name="corpus")
    names = sorted((p.name for p in (tmp_path / "out").glob("*.bin")), key=lambda n: n.rsplit("_", 1)[1])
    splits = [re.fullmatch(r"corpus_(train|val)_(\d{6})\.bin", n).groups() for n in names]  # type: ignore[union-attr]
    assert [int(number) for _, number in splits] == list(range(len(names)))  # one counter, from 000000
    kinds = [split for split, _ in splits]
    assert kinds == sorted(kinds, reverse=True) and kinds.count("val") >= 2 and kinds.count("train") >= 4  # val first
    assert [f["path"] for f in result.files] == names
    for split in ("train", "val"):
        shards = [llmc_shard(p) for p in sorted((tmp_path / "out").glob(f"corpus_{split}_*.bin"))]
        assert {kind for kind, _ in shards} == {(20240520, 1)}
        assert all(len(t) <= 1000 and t[0] == GPT2_EOT for _, t in shards)  # whole documents, EOT first
        assert np.array_equal(np.concatenate([t for _, t in shards]), flat(truth(root, split, "before")))


def test_llmc_export_of_a_large_vocabulary_is_v7_uint32_eot_then_bos(big, big_ds, tmp_path):  # noqa: F811
    import tokenizers

    ref = tokenizers.Tokenizer.from_file(str(big["file"]))
    bos, eot = ref.token_to_id(BOT), ref.token_to_id(EOT)
    export_dataset(big_ds, "llmc", tmp_path / "out", name="llama")
    for split in ("train", "val"):
        (kind, tokens), = [llmc_shard(p) for p in (tmp_path / "out").glob(f"llama_{split}_*.bin")]  # fmt: skip
        assert kind == (20240801, 7)
        assert tokens.max() > 0xFFFF
        expected = truth(big_ds, split, "before")
        assert all(d[0] == eot and d[1] == bos for d in expected)  # EOT, BOS, text
        assert np.array_equal(tokens, flat(expected))


def test_modded_nanogpt_export_uses_its_names_and_the_v1_header(datasets, tmp_path):
    root = datasets["before"]
    export_dataset(root, "modded-nanogpt", tmp_path / "out", tokens_per_shard=2000)
    export_dataset(root, "modded-nanogpt", tmp_path / "one", split="train")
    assert sorted(p.name for p in (tmp_path / "one").glob("*.bin"))[0] == "fineweb_train_000000.bin"
    names = sorted((p.name for p in (tmp_path / "out").glob("*.bin")), key=lambda n: n[-10:])
    n_val = sum("_val_" in n for n in names)
    assert names == [f"fineweb_val_{i:06d}.bin" for i in range(n_val)] + [
        f"fineweb_train_{i:06d}.bin" for i in range(n_val, len(names))
    ]
    for split in ("train", "val"):
        shards = [llmc_shard(p) for p in sorted((tmp_path / "out").glob(f"fineweb_{split}_*.bin"))]
        assert {kind for kind, _ in shards} == {(20240520, 1)}
        tokens = np.concatenate([t for _, t in shards])
        expected = truth(root, split, "before")
        assert np.array_equal(tokens, flat(expected))
        # train_gpt.py finds document starts as the positions of BOS_ID (50256)
        starts = np.flatnonzero(tokens == GPT2_EOT)
        assert np.array_equal(starts, np.cumsum([0, *map(len, expected)])[:-1])


@pytest.mark.parametrize("which", ["gpt2", "big"])
def test_megatron_export_opens_with_megatrons_layout(datasets, big_ds, which, tmp_path, small_blocks):
    root = datasets["before"] if which == "gpt2" else big_ds
    export_dataset(root, "megatron", tmp_path / "out", name="c")
    for split in ("train", "val"):
        code, docs, n_doc_field = megatron_documents(tmp_path / "out" / f"c_{split}_text_document")
        assert code == (8 if which == "gpt2" else 4)  # uint16 below 65,500 ids, else int32
        expected = truth(root, split, "after")
        assert n_doc_field == len(expected) + 1
        assert len(docs) == len(expected)
        assert all(np.array_equal(a, b) for a, b in zip(docs, expected, strict=True))


@pytest.mark.parametrize("to", ["nanogpt", "modded-nanogpt"])
def test_uint16_formats_refuse_a_vocabulary_past_65535(big_ds, to, tmp_path):
    result = runner.invoke(app, ["export", str(big_ds), "--to", to, "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "uint16" in lines[0] and "65,535" in lines[0] and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*")
            if p.is_file()}  # fmt: skip


def test_existing_out_is_refused_and_force_replaces_it_leaving_the_source_alone(datasets, tmp_path):
    root = datasets["after"]
    before = _digests(root)
    out = write(tmp_path / "out" / "keep.txt", "mine").parent
    result = runner.invoke(app, ["export", str(root), "--to", "nanogpt", "--out", str(out)])
    assert result.exit_code == 1 and "not empty; pass --force" in result.output
    assert (out / "keep.txt").read_text() == "mine" and not (out / "train.bin").exists()
    result = runner.invoke(app, ["export", str(root), "--to", "megatron", "--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert (out / "keep.txt").read_text() == "mine" and (out / "after_train_text_document.idx").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging or replaced directory left behind
    with pytest.raises(ConfigError, match="overlaps the input"):
        export_dataset(root, "nanogpt", root / "exported", force=True)
    assert _digests(root) == before


def test_force_replaces_only_what_lmshard_wrote(datasets, tmp_path):
    """export --force into a nanoGPT data folder keeps the user's prepare.py and readme.md and
    replaces train.bin; a later export drops the files the earlier one listed (stale llm.c
    shards); import --force over a dataset keeps the user's README.md, as prepare --overwrite."""
    root = datasets["after"]
    folder = tmp_path / "nanoGPT" / "data" / "mine"
    write(folder / "prepare.py", "print('mine')\n")
    write(folder / "readme.md", "notes\n")
    write(folder / "train.bin", b"old tokens")
    result = runner.invoke(app, ["export", str(root), "--to", "nanogpt", "--out", str(folder), "--force"])
    assert result.exit_code == 0, result.output
    assert (folder / "prepare.py").read_text() == "print('mine')\n" and (folder / "readme.md").read_text() == "notes\n"
    assert (folder / "train.bin").read_bytes() != b"old tokens" and (folder / "val.bin").is_file()
    llmc = tmp_path / "llmc"
    export_dataset(root, "llmc", llmc, tokens_per_shard=2_000)
    many = {p.name for p in llmc.glob("*.bin")}
    write(llmc / "notes.txt", "mine")
    export_dataset(root, "llmc", llmc, tokens_per_shard=200_000, force=True)
    few = {p.name for p in llmc.glob("*.bin")}
    listed = {f["path"] for f in json.loads((llmc / "lmshard_export.json").read_text())["files"]}
    assert few == listed and len(few) < len(many)  # the earlier export's extra shards are gone, not carried
    assert (llmc / "notes.txt").read_text() == "mine"
    ds = tmp_path / "imported"
    assert runner.invoke(app, ["import", str(folder), "--from", "nanogpt", "--out", str(ds), "--tokenizer", "gpt2"]
                         ).exit_code == 0  # fmt: skip
    write(ds / "README.md", "my dataset card")
    write(ds / "train" / "NOTES", "mine too")
    result = runner.invoke(app, ["import", str(folder), "--from", "nanogpt", "--out", str(ds), "--tokenizer", "gpt2",
                                 "--force"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (ds / "README.md").read_text() == "my dataset card" and (ds / "train" / "NOTES").read_text() == "mine too"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_export_refuses_a_source_without_eot_at_a_boundary(datasets, tmp_path):
    root = shutil.copytree(datasets["after"], tmp_path / "ds")
    shard = root / "train" / "shard_000000.bin"
    tokens = np.fromfile(shard, dtype="<u4")
    offsets = np.fromfile(shard.with_suffix(".idx"), dtype="<u8")
    tokens[offsets[2] - 1] = 11  # the second document's EOT
    tokens.tofile(shard)
    result = runner.invoke(app, ["export", str(root), "--to", "llmc", "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "1 document boundaries without the EOT token 50256" in result.output
    assert not (tmp_path / "out").exists()
    # a failed --force export leaves the old output as it was, and nothing beside it
    old = write(tmp_path / "old" / "train.bin", b"old").parent
    result = runner.invoke(app, ["export", str(root), "--to", "nanogpt", "--out", str(old), "--force"])
    assert result.exit_code == 1 and "without the EOT token" in result.output
    assert [p.name for p in old.iterdir()] == ["train.bin"] and (old / "train.bin").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "old"]


def test_export_and_import_commands_take_their_options():
    wanted = {"export": ["--to", "--out", "--split", "--force", "--tokens-per-shard", "--name"],
              "import": ["--from", "--out", "--tokenizer", "--eot-id", "--val", "--force"]}  # fmt: skip
    for command, options in wanted.items():
        result = runner.invoke(app, [command, "-h"])
        assert result.exit_code == 0 and all(o in result.output for o in options), result.output


# --- import -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("side", "fmt"), [("after", "nanogpt"), ("before", "nanogpt"), ("after", "megatron"),
                                           ("before", "megatron")])  # fmt: skip
def test_export_then_import_gives_back_every_split(datasets, side, fmt, tmp_path, small_blocks):
    root = datasets[side]
    export_dataset(root, fmt, tmp_path / "x", name="c")
    if fmt == "nanogpt":
        args = [str(tmp_path / "x")]
    else:
        args = [str(tmp_path / "x" / "c_train_text_document"), "--val", str(tmp_path / "x" / "c_val_text_document")]
    result = runner.invoke(app, ["import", *args, "--from", fmt, "--out", str(tmp_path / "back"), "--tokenizer",
                                 "gpt2", "--tokens-per-shard", "1200"])  # fmt: skip
    assert result.exit_code == 0, result.output
    report = verify_dataset(tmp_path / "back")
    assert report.ok, report.problems
    for split in ("train", "val"):
        back = read_docs(tmp_path / "back", split)
        original = truth(root, split, "after")  # an imported dataset has its EOT after each document
        assert len(back) == len(original) and all(np.array_equal(a, b) for a, b in zip(back, original, strict=True))


def test_megatron_int32_round_trip_with_a_hugging_face_vocabulary(big, big_ds, tmp_path):  # noqa: F811
    export_dataset(big_ds, "megatron", tmp_path / "x", name="b")
    meta = import_dataset(tmp_path / "x" / "b_train_text_document.bin", "megatron", tmp_path / "back",
                          tokenizer=str(big["file"]), val=tmp_path / "x" / "b_val_text_document")  # fmt: skip
    assert meta.tokenizer.ranks_sha256 == load_metadata(big_ds).tokenizer.ranks_sha256
    assert verify_dataset(tmp_path / "back").ok
    for split in ("train", "val"):
        assert flat(read_docs(tmp_path / "back", split)).tolist() == flat(read_docs(big_ds, split)).tolist()


def _one_line_error(args: list[str], *words: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in result.output, result.output
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_bad_inputs_are_refused_in_one_line(datasets, big_ds, tmp_path):
    export_dataset(datasets["after"], "nanogpt", tmp_path / "n")
    export_dataset(datasets["after"], "megatron", tmp_path / "m", name="c")
    export_dataset(big_ds, "megatron", tmp_path / "big", name="b")
    out = ["--out", str(tmp_path / "back"), "--tokenizer", "gpt2"]
    # a nanoGPT file cut in the middle of a token, and one cut after a document's text
    bad = shutil.copytree(tmp_path / "n", tmp_path / "n1")
    data = (bad / "train.bin").read_bytes()
    (bad / "train.bin").write_bytes(data[:-1])
    _one_line_error(["import", str(bad), "--from", "nanogpt", *out], "not a whole number of uint16 tokens")
    (bad / "train.bin").write_bytes(data[:-2])
    _one_line_error(["import", str(bad), "--from", "nanogpt", *out], "not followed by the EOT id 50256")
    # Megatron: a bad magic, a truncated .bin, ids outside the tokenizer's vocabulary
    prefix = tmp_path / "m" / "c_train_text_document"
    idx = prefix.with_suffix(".idx").read_bytes()
    prefix.with_suffix(".idx").write_bytes(b"MMIDIDY" + idx[7:])
    _one_line_error(["import", str(prefix), "--from", "megatron", *out], "not a Megatron .idx")
    prefix.with_suffix(".idx").write_bytes(idx)
    tokens = prefix.with_suffix(".bin").read_bytes()
    prefix.with_suffix(".bin").write_bytes(tokens[:-2])
    _one_line_error(["import", str(prefix), "--from", "megatron", *out], "truncated")
    prefix.with_suffix(".bin").write_bytes(tokens)
    _one_line_error(["import", str(tmp_path / "big" / "b_train_text_document"), "--from", "megatron", *out],
                    "outside the tokenizer's vocabulary (50,257 ids)")  # fmt: skip
    _one_line_error(["import", str(prefix), "--from", "megatron", *out, "--eot-id", "13"],
                    "do not end with the EOT id 13")  # fmt: skip
    assert not (tmp_path / "back").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def write_megatron(prefix: Path, docs: list[list[list[int]]]) -> None:
    """A Megatron IndexedDataset as its builder writes it (uint16 tokens): each document a list
    of sequences; preprocess_data.py gives an empty text no sequence at all."""
    seqs = [np.array(seq, "<u2") for doc in docs for seq in doc]
    lengths = np.array([len(s) for s in seqs], "<i4")
    pointers = (np.concatenate([[0], np.cumsum(lengths)[:-1]]) * 2).astype("<i8")
    doc_idx = np.concatenate([[0], np.cumsum([len(doc) for doc in docs])]).astype("<i8")
    header = MEGATRON_HEADER.pack(b"MMIDIDX\x00\x00", 1, 8, len(seqs), len(doc_idx))
    prefix.with_suffix(".idx").write_bytes(header + lengths.tobytes() + pointers.tobytes() + doc_idx.tobytes())
    prefix.with_suffix(".bin").write_bytes(b"".join(s.tobytes() for s in seqs))


def test_megatron_empty_documents_are_skipped_and_counted(tmp_path, monkeypatch):
    """preprocess_data.py writes an empty text as a document of no sequence (a sequence of no
    token is the same document): the import skips it and says how many it skipped."""
    monkeypatch.setattr(foreign, "BLOCK_TOKENS", 1)  # one document a block: some blocks hold only an empty one
    e = GPT2_EOT
    write_megatron(tmp_path / "t", [[[10, 11, e]], [], [[12], [13, e]], [[]], [[14, e]]])
    write_megatron(tmp_path / "v", [[], [[15, e]]])
    out = tmp_path / "back"
    result = runner.invoke(app, ["import", str(tmp_path / "t"), "--from", "megatron", "--val", str(tmp_path / "v"),
                                 "--out", str(out), "--tokenizer", "gpt2"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "imported 4 documents" in result.output and "skipped 3 empty documents" in result.output, result.output
    assert [d.tolist() for d in read_docs(out, "train")] == [[10, 11, e], [12, 13, e], [14, e]]
    assert [d.tolist() for d in read_docs(out, "val")] == [[15, e]]
    meta = load_metadata(out)
    assert meta.drops == {"empty": 3} and meta.records_read == 7
    assert [(s.records, s.kept, s.dropped) for s in meta.sources] == [(5, 3, {"empty": 2}), (2, 1, {"empty": 1})]
    assert verify_dataset(out).ok


@pytest.fixture(scope="module")
def qwen_like(tmp_path_factory):
    """A dataset made with a Qwen-like vocabulary: eos_token <|im_end|> (a chat turn's end) in
    its config, so lmshard separates documents with <|endoftext|>, and Megatron's tokenizer,
    which ends documents with the configured eos_token, would not."""
    from test_hf_tokenizer import small

    tmp = tmp_path_factory.mktemp("qwen")
    vocab = small(tmp / "tok", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]).parent
    write(vocab / "tokenizer_config.json", json.dumps({"eos_token": "<|im_end|>", "bos_token": None}))
    src = write(tmp / "docs.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in _texts(40)))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp / "ds"), tokenizer=str(vocab), workers=1, val_fraction=0.0))
    state = json.loads((tmp / "ds" / "tokenizer_state.json").read_text())
    ids = state["special_tokens"]
    assert state["eot_token"] == "<|endoftext|>" and state["config_eos_token"] == "<|im_end|>"
    return tmp / "ds", ids["<|endoftext|>"], ids["<|im_end|>"]


def _megatron_doc_ends(prefix: Path) -> np.ndarray:
    """The last token of every sequence, read from the .idx and .bin as Megatron lays them out."""
    data = prefix.with_suffix(".idx").read_bytes()
    _, _, code, n, _ = MEGATRON_HEADER.unpack_from(data)
    lengths = np.frombuffer(data, "<i4", n, MEGATRON_HEADER.size)
    dtype = {4: np.int32, 8: np.uint16}.get(code, np.int32)
    tokens = np.fromfile(prefix.with_suffix(".bin"), dtype=dtype)
    return tokens[np.cumsum(lengths) - 1]


def test_megatron_export_names_a_separator_its_tokenizer_does_not_end_documents_with(qwen_like, tmp_path):
    ds, sep, eos = qwen_like
    result = runner.invoke(app, ["export", str(ds), "--to", "megatron", "--out", str(tmp_path / "m")])
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())
    assert f"ends each document with {sep}" in said and f"eos_token <|im_end|> ({eos})" in said, said
    assert f"--eod-id {eos}" in said and f"--eod-id {sep}" in said and not (tmp_path / "m").exists()
    for choice in (eos, sep):
        out = tmp_path / f"m{choice}"
        result = runner.invoke(app, ["export", str(ds), "--to", "megatron", "--out", str(out), "--eod-id", str(choice)])
        assert result.exit_code == 0, result.output
        ends = _megatron_doc_ends(out / "ds_train_text_document")
        assert len(ends) == 40 and set(ends.tolist()) == {choice}
    result = runner.invoke(app, ["export", str(ds), "--to", "modded-nanogpt", "--out", str(tmp_path / "mn")])
    assert result.exit_code == 1 and "finds documents by the id 50256" in " ".join(result.output.split())


def test_llmc_files_are_even_so_none_is_a_short_tail(datasets, tmp_path):
    """llm.c asserts B·T+1 tokens in every file: a split's files are sized evenly (none a short
    remainder), and the command names the smallest file's size."""
    root = datasets["after"]
    total = load_metadata(root).n_tokens("train")
    per = total // 3 + 50  # greedy filling would leave a tail of ~total/3 - 150 tokens
    result = runner.invoke(app, ["export", str(root), "--to", "llmc", "--out", str(tmp_path / "l"), "--split", "train",
                                 "--tokens-per-shard", str(per)])  # fmt: skip
    assert result.exit_code == 0, result.output
    sizes = [int(np.fromfile(p, "<i4", 256)[2]) for p in sorted((tmp_path / "l").glob("*.bin"))]
    assert len(sizes) == 3 and sum(sizes) == total and max(sizes) <= per and min(sizes) > total // 3 - 200
    said = " ".join(result.output.split())
    assert f"the smallest file holds {min(sizes):,} tokens" in said and "B×T" in said, said


def test_a_full_disk_during_export_names_the_output_and_leaves_nothing(datasets, tmp_path, monkeypatch):
    import errno

    from faults import full_disk

    import lmshard.interop.output as output

    full_disk(monkeypatch, [output], budget=2_000, code=errno.ENOSPC)
    result = runner.invoke(app, ["export", str(datasets["after"]), "--to", "nanogpt", "--out", str(tmp_path / "x")])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and f"{tmp_path / 'x'}: No space left on device; free space" in said, said
    assert list(tmp_path.iterdir()) == []  # nothing beside --out, no --out


def test_force_refuses_to_leave_files_the_trainer_would_read_beside_the_new_ones(datasets, tmp_path):
    """Not lmshard's to delete, and read by the trainer with the new files: nanoGPT's meta.pkl
    (its vocab_size), llm.c shards the new export does not overwrite. Refused, nothing changed."""
    root = datasets["after"]
    folder = tmp_path / "shakespeare_char"
    write(folder / "meta.pkl", b"vocab_size 65")
    write(folder / "prepare.py", "print('mine')\n")
    before = _digests(folder)
    result = runner.invoke(app, ["export", str(root), "--to", "nanogpt", "--out", str(folder), "--force"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "meta.pkl would stay beside the new files" in said, said
    assert _digests(folder) == before and sorted(p.name for p in tmp_path.iterdir()) == ["shakespeare_char"]
    fw = tmp_path / "fw"
    for n in range(6):
        write(fw / f"fineweb_{'val' if n == 0 else 'train'}_{n:06d}.bin", b"old shard")
    result = runner.invoke(app, ["export", str(root), "--to", "modded-nanogpt", "--out", str(fw), "--force"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "fineweb_train_000002.bin" in said and "trainer reads those too" in said, said
    result = runner.invoke(app, ["export", str(root), "--to", "llmc", "--out", str(tmp_path / "l"), "--eod-id", "5"])
    assert result.exit_code == 1 and "--eod-id is for --to megatron" in " ".join(result.output.split())


def test_a_long_document_leaves_no_tiny_llmc_file_behind_it(tmp_path):
    words = " ".join(f"w{i}" for i in range(3000))
    texts = [words] + [f"short document number {i}" for i in range(400)]
    src = write(tmp_path / "docs.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "ds"), workers=1, val_fraction=0.0))
    result = export_dataset(tmp_path / "ds", "llmc", tmp_path / "out", tokens_per_shard=2000)
    sizes = [f["n_tokens"] for f in result.files]
    total = sum(sizes)
    assert total == load_metadata(tmp_path / "ds").n_tokens("train")
    assert max(sizes) > 2000 and min(sizes) > 500, sizes  # the long document's own file, then no 6-token files


LLMC_V1 = (20240520, 1, "<u2")


def _llmc_fineweb(out: Path, docs: list[list[int]], shard_size: int, version: tuple[int, int, str] = LLMC_V1,
                  sep: int = GPT2_EOT):  # fmt: skip
    """Shards as llm.c's dev/data/fineweb.py writes them (its write_datafile: a header of 256
    int32, magic, version, token count; then the tokens): each document [EOT, tokens...], shards
    of `shard_size` tokens, the first one val, a document that does not fit cut and carried on
    into the next shard. Returns the token stream of each split."""
    stream = np.array([t for d in docs for t in [sep, *d]], dtype=np.int64)
    streams: dict[str, list[int]] = {"val": [], "train": []}
    out.mkdir(parents=True, exist_ok=True)
    for k, start in enumerate(range(0, len(stream), shard_size)):
        toks = stream[start : start + shard_size]
        split = "val" if k == 0 else "train"
        header = np.zeros(256, dtype=np.int32)
        header[:3] = version[0], version[1], len(toks)
        (out / f"fineweb_{split}_{k:06d}.bin").write_bytes(header.tobytes() + toks.astype(version[2]).tobytes())
        streams[split] += toks.tolist()
    return streams


@pytest.mark.parametrize(("fmt", "version"), [("llmc", (20240520, 1, "<u2")), ("llmc", (20240801, 7, "<u4")),
                                              ("modded-nanogpt", (20240520, 1, "<u2"))])  # fmt: skip
def test_an_llmc_or_modded_nanogpt_directory_imports_as_its_own_token_stream(tmp_path, reference, fmt, version):
    """The imported splits are, token for token, the streams of the shards (val first, as
    fineweb.py writes it), each document its EOT and text, with documents cut across shards
    joined again (eot_position before)."""
    texts = [f"document {i}: " + " ".join(["word"] * (i % 37 + 3)) for i in range(120)]
    docs = [reference.encode_ordinary(t) for t in texts]
    streams = _llmc_fineweb(tmp_path / "fw", docs, shard_size=700, version=version)
    assert len(list((tmp_path / "fw").glob("*.bin"))) > 4  # several train shards, documents cut between them
    meta = import_dataset(tmp_path / "fw", fmt, tmp_path / "ds", tokenizer="gpt2")
    assert meta.eot_position == "before" and verify_dataset(tmp_path / "ds").ok
    # the first train shard begins inside the document the val shard was cut in: its tail is left out
    tail = streams["train"].index(GPT2_EOT)
    assert tail > 0 and meta.drops == {"partial_document": 1}
    for split, skip in (("train", tail), ("val", 0)):
        got = [t for d in read_docs(tmp_path / "ds", split) for t in d.tolist()]
        assert got == streams[split][skip:], split
        assert all(d[0] == GPT2_EOT for d in read_docs(tmp_path / "ds", split))
    train_docs = [d.tolist()[1:] for d in read_docs(tmp_path / "ds", "train")]
    assert train_docs[1:-1] == [d for d in docs if d in train_docs[1:-1]]  # whole documents, in order


def test_an_import_keeps_each_documents_input_and_number_there(tmp_path, reference):
    """Provenance of an llm.c import: each document names the shard its EOT (its start) is in and
    its number among that shard's document starts, counted here from the raw files; a nanoGPT
    import names its .bin and the document's number in it."""
    docs = [reference.encode_ordinary(f"doc {i}: " + "w " * (i % 23 + 2)) for i in range(90)]
    _llmc_fineweb(tmp_path / "fw", docs, shard_size=300)
    meta = import_dataset(tmp_path / "fw", "llmc", tmp_path / "ds", tokenizer="gpt2")
    assert verify_dataset(tmp_path / "ds").ok
    sources = [s.path for s in meta.sources]
    for split in ("val", "train"):
        files = sorted((tmp_path / "fw").glob(f"*_{split}_*.bin"))
        starts = []  # (file, number there) of every document start of the split, in order
        for f in files:
            tokens = np.fromfile(f, dtype="<u2", offset=1024)
            starts += [(str(f), j + 1) for j in range(int((tokens == GPT2_EOT).sum()))]
        records = np.concatenate([np.fromfile(tmp_path / "ds" / sh.src_path, dtype=SRC_RECORD)
                                  for sh in meta.split_shards(split)])  # fmt: skip
        assert [(sources[r["source"]], int(r["record"])) for r in records] == starts, split
    assert sum(s.kept for s in meta.sources) == meta.total_docs
    assert len(sources) == len(list((tmp_path / "fw").iterdir()))
    data = np.array([t for d in docs[:10] for t in [*d, GPT2_EOT]], dtype="<u2")
    (tmp_path / "nano").mkdir()
    data.tofile(tmp_path / "nano" / "train.bin")
    meta = import_dataset(tmp_path / "nano", "nanogpt", tmp_path / "ds2", tokenizer="gpt2")
    records = np.fromfile(tmp_path / "ds2" / meta.split_shards("train")[0].src_path, dtype=SRC_RECORD)
    assert records["source"].tolist() == [0] * 10 and records["record"].tolist() == list(range(1, 11))
    assert meta.sources[0].path.endswith("train.bin")


def test_an_llmc_export_imports_back_to_the_same_documents(datasets, tmp_path):
    """`export --to llmc` then `import --from llmc`: the same documents, in order."""
    root = datasets["after"]
    export_dataset(root, "llmc", tmp_path / "out", tokens_per_shard=1000, name="corpus")
    import_dataset(tmp_path / "out", "llmc", tmp_path / "back", tokenizer="gpt2")
    for split in ("train", "val"):
        before = [d.tolist() for d in read_docs(root, split)]  # EOT after each document
        after = [d.tolist() for d in read_docs(tmp_path / "back", split)]  # EOT before each one
        assert [d[:-1] for d in before] == [d[1:] for d in after], split


def test_an_llmc_shard_with_a_wrong_header_or_size_is_one_line(tmp_path):
    _llmc_fineweb(tmp_path / "fw", [[1, 2, 3]] * 50, shard_size=40)
    bad = sorted((tmp_path / "fw").glob("*_train_*.bin"))[0]
    data = bytearray(bad.read_bytes())
    with pytest.raises(Exception, match="truncated"):
        bad.write_bytes(bytes(data[:-2]))
        import_dataset(tmp_path / "fw", "llmc", tmp_path / "a", tokenizer="gpt2")
    data[0:4] = np.int32(123).tobytes()
    bad.write_bytes(bytes(data))
    with pytest.raises(Exception, match="magic 123 version 1, not a llmc shard"):
        import_dataset(tmp_path / "fw", "llmc", tmp_path / "b", tokenizer="gpt2")


def test_an_hf_export_loads_with_datasets_as_the_same_documents(datasets, tmp_path):
    """`export --to hf`: `datasets.load_from_disk(OUT)` gives a DatasetDict whose rows are the
    documents (input_ids, separators as the dataset holds them), split by split."""
    hf = pytest.importorskip("datasets")
    root = datasets["after"]
    result = export_dataset(root, "hf", tmp_path / "out")
    loaded = hf.load_from_disk(str(tmp_path / "out"))
    assert set(loaded) == {"train", "validation"} and result.format == "hf"
    for split, name in (("train", "train"), ("val", "validation")):
        assert [row["input_ids"] for row in loaded[name]] == [d.tolist() for d in read_docs(root, split)], split
    assert not (tmp_path / "out" / ".cache").exists()


def test_an_export_logged_to_a_file_holds_its_own_lines_only(datasets, tmp_path):
    """`export --to hf 2> log`: `datasets`' progress bars and notes stay out of the log; a
    nanoGPT export of a dataset without a val split says there is no val.bin to evaluate on."""
    import subprocess
    import sys

    pytest.importorskip("datasets")
    with open(tmp_path / "log", "w") as log:
        done = subprocess.run([sys.executable, "-m", "lmshard", "export", str(datasets["after"]), "--to", "hf",
                               "--out", str(tmp_path / "hf")], stdout=subprocess.PIPE, stderr=log, timeout=300,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert done.returncode == 0 and b"exported 300 documents" in done.stdout
    assert (tmp_path / "log").read_text() == ""
    src = write(tmp_path / "docs.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in _texts(20)))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "trainonly"), workers=1, val_fraction=0))
    result = runner.invoke(app, ["export", str(tmp_path / "trainonly"), "--to", "nanogpt", "--out",
                                 str(tmp_path / "nano")])  # fmt: skip
    said = " ".join(result.output.split())
    assert result.exit_code == 0 and "no val split, so there is no val.bin, which nanoGPT's train.py" in said, said
    assert sorted(p.name for p in (tmp_path / "nano").iterdir() if p.suffix == ".bin") == ["train.bin"]


def test_inspect_of_an_export_gives_the_import_that_reads_it_back(datasets, tmp_path):
    """`inspect` of an export directory says what it is and the import command, which works."""
    export_dataset(datasets["after"], "nanogpt", tmp_path / "nano")
    result = runner.invoke(app, ["inspect", str(tmp_path / "nano")])
    said = " ".join(result.output.split())
    command = f"lmshard import {tmp_path / 'nano'} --from nanogpt --tokenizer gpt2 --out DIR"
    assert result.exit_code == 1 and f"an export for nanogpt of the dataset {datasets['after']}" in said, said
    assert command in said, said
    result = runner.invoke(app, command.replace("DIR", str(tmp_path / "back")).split()[1:])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["inspect", str(tmp_path / "back")]).exit_code == 0


def test_cp_force_into_a_users_folder_keeps_every_file_it_does_not_replace(datasets, tmp_path):
    """`lmshard cp DS DIR --force` where DIR is not a dataset: the user's files stay, also inside
    folders the copy writes too (train/photo.jpg beside the new train/ shards); the copy's files
    equal the source's."""
    root = datasets["after"]
    folder = tmp_path / "project"
    write(folder / "train" / "photo.jpg", b"\xff\xd8 mine")
    write(folder / "notes.txt", "mine")
    refused = runner.invoke(app, ["cp", str(root), str(folder)])
    assert refused.exit_code != 0 and "--force" in refused.output
    result = runner.invoke(app, ["cp", str(root), str(folder), "--force"])
    assert result.exit_code == 0, result.output
    assert (folder / "train" / "photo.jpg").read_bytes() == b"\xff\xd8 mine"
    assert (folder / "notes.txt").read_text() == "mine"
    for path in root.rglob("*"):
        if path.is_file():
            assert (folder / path.relative_to(root)).read_bytes() == path.read_bytes(), path


def test_cp_of_a_dataset_missing_its_tokenizer_state_is_refused_in_one_line(datasets, tmp_path):
    """A source without tokenizer_state.json (a file with no checksum) is not copied as if whole:
    one line naming the file, and nothing at DST."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(datasets["after"], src)
    (src / "tokenizer_state.json").unlink()
    result = runner.invoke(app, ["cp", str(src), str(tmp_path / "dst")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "tokenizer_state.json: missing; the dataset is not whole" in " ".join(result.output.split())
    assert not (tmp_path / "dst").exists()


def test_llama3_llmc_shards_import_by_the_bos_that_starts_each_document(big, big_ds, tmp_path):  # noqa: F811
    """llm.c's Llama 3 fineweb.py starts each document with <|begin_of_text|> in v7 shards: the
    import finds the documents by it without --eot-id; lmshard's own v7 export (EOT, then BOS)
    imports back to the source's documents; a separator that never occurs is one line naming
    --eot-id, and a split cut before any document start counts its partial document."""
    import tokenizers

    ref = tokenizers.Tokenizer.from_file(str(big["file"]))
    bos, eot = ref.token_to_id(BOT), ref.token_to_id(EOT)
    rng = np.random.default_rng(5)
    docs = [rng.integers(300, 70_000, size=int(rng.integers(3, 40))).tolist() for _ in range(80)]
    streams = _llmc_fineweb(tmp_path / "fw", docs, shard_size=500, version=(20240801, 7, "<u4"), sep=bos)
    meta = import_dataset(tmp_path / "fw", "llmc", tmp_path / "ds", tokenizer=str(big["file"]))
    assert meta.tokenizer.eot_id == bos and meta.drops == {"partial_document": 1}
    tail = streams["train"].index(bos)
    assert [t for d in read_docs(tmp_path / "ds", "train") for t in d.tolist()] == streams["train"][tail:]
    export_dataset(big_ds, "llmc", tmp_path / "out", name="llama")
    back = import_dataset(tmp_path / "out", "llmc", tmp_path / "back", tokenizer=str(big["file"]))
    assert back.tokenizer.eot_id == eot
    for split in ("train", "val"):
        assert [d.tolist() for d in read_docs(tmp_path / "back", split)] == \
            [d.tolist() for d in truth(big_ds, split, "before")], split  # fmt: skip
    with pytest.raises(Exception, match=r"no document start \(the id 7\); pass --eot-id"):
        import_dataset(tmp_path / "fw", "llmc", tmp_path / "none", tokenizer=str(big["file"]), eot_id=7)


def test_an_llmc_split_before_its_first_document_start_counts_what_it_leaves_out(tmp_path, monkeypatch):
    """Leading blocks with no separator are left out and counted (partial_document 1), even when
    the first start is at the beginning of a later block; llm.c's starter files
    (tiny_shakespeare_train.bin, no shard number) are found."""
    out = tmp_path / "fw"
    out.mkdir()
    for name, toks in (("tiny_val.bin", [GPT2_EOT, 1, 2]), ("tiny_train.bin", [1, 2, 3, 4, 5, 6, GPT2_EOT, 7, 8])):
        header = np.zeros(256, dtype=np.int32)
        header[:3] = 20240520, 1, len(toks)
        (out / name).write_bytes(header.tobytes() + np.array(toks, dtype="<u2").tobytes())
    monkeypatch.setattr(foreign, "BLOCK_TOKENS", 3)  # the first start falls at offset 0 of the third block
    meta = import_dataset(out, "llmc", tmp_path / "ds", tokenizer="gpt2")
    assert meta.drops == {"partial_document": 1}
    assert [d.tolist() for d in read_docs(tmp_path / "ds", "train")] == [[GPT2_EOT, 7, 8]]
    assert [d.tolist() for d in read_docs(tmp_path / "ds", "val")] == [[GPT2_EOT, 1, 2]]


@pytest.mark.parametrize("which", ["gpt2", "big"])
def test_a_litdata_export_reads_back_with_litdatas_tokens_loader(datasets, big_ds, which, tmp_path):
    """`export --to litdata`: litdata's own StreamingDataset with TokensLoader (as litgpt reads
    its pretraining data) gives, block by block, the split's documents as the dataset holds them
    (uint16 tensors for GPT-2, int32 past 65,536 ids); with block_size=1 nothing is left out; a
    block never spans two chunks, and every chunk holds whole documents."""
    litdata = pytest.importorskip("litdata")
    from litdata.streaming.item_loader import TokensLoader

    root = datasets["after"] if which == "gpt2" else big_ds
    result = runner.invoke(app, ["export", str(root), "--to", "litdata", "--out", str(tmp_path / "lit"),
                                 "--tokens-per-shard", "600"])  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = load_metadata(root)
    for split in ("train", "val"):
        docs = truth(root, split, meta.eot_position)
        stream = flat(docs)
        index = json.loads((tmp_path / "lit" / split / "index.json").read_text())
        assert len(index["chunks"]) > 1 or len(stream) <= 1200  # (chunks of about 600 tokens)
        assert sum(c["dim"] for c in index["chunks"]) == len(stream)
        assert sum(c["chunk_size"] for c in index["chunks"]) == len(docs)  # an item per document
        ones = litdata.StreamingDataset(str(tmp_path / "lit" / split), item_loader=TokensLoader(block_size=1))
        got = [ones[i] for i in range(len(ones))]
        want_dtype = torch_dtype("uint16" if which == "gpt2" else "int32")
        assert got[0].dtype == want_dtype and np.array_equal(np.concatenate([t.numpy() for t in got]), stream)
        T = 33
        blocks = litdata.StreamingDataset(str(tmp_path / "lit" / split), item_loader=TokensLoader(block_size=T))
        chunk_starts = np.cumsum([0] + [c["dim"] for c in index["chunks"]])
        expected = [stream[s + k * T : s + (k + 1) * T] for s, c in zip(chunk_starts, index["chunks"], strict=False)
                    for k in range(c["dim"] // T)]  # fmt: skip
        assert len(blocks) == len(expected)
        assert all(np.array_equal(blocks[i].numpy(), expected[i]) for i in range(len(blocks)))
        ends = set(np.cumsum([len(d) for d in docs]).tolist())
        assert all(int(e) in ends for e in chunk_starts[1:])  # chunks end at document ends


def torch_dtype(name: str):
    import torch

    return {"uint16": torch.uint16, "int32": torch.int32}[name]


def test_a_litdata_export_under_a_launchers_environment_writes_as_one_writer(datasets, tmp_path):
    """WORLD_SIZE / GLOBAL_RANK set (as torchrun sets them): the export still writes one
    complete litdata dataset (litdata's writer would otherwise wait for writers that do not
    exist), read back whole."""
    import subprocess
    import sys

    pytest.importorskip("litdata")
    code = ("import sys; from lmshard.interop import export_dataset; "
            "export_dataset(sys.argv[1], 'litdata', sys.argv[2], tokens_per_shard=600)")  # fmt: skip
    env = {**os.environ, "WORLD_SIZE": "2", "GLOBAL_RANK": "1", "RANK": "1"}
    done = subprocess.run([sys.executable, "-c", code, str(datasets["after"]), str(tmp_path / "lit")], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    index = json.loads((tmp_path / "lit" / "train" / "index.json").read_text())
    assert sum(c["dim"] for c in index["chunks"]) == load_metadata(datasets["after"]).n_tokens("train")
    assert all(c["filename"].startswith("chunk-0-") for c in index["chunks"])


def test_force_over_an_earlier_chunked_export_keeps_the_users_files_inside_its_folders(datasets, tmp_path):
    """export --to olmo, a file of the user's put in train/, then export --to mds --force: the
    olmo parts go (the provenance lists every file an export wrote), the user's file stays."""
    root, out = datasets["after"], tmp_path / "x"
    export_dataset(root, "olmo", out, tokens_per_shard=700)
    write(out / "train" / "mine.txt", "mine")
    export_dataset(root, "mds", out, force=True)
    assert (out / "train" / "mine.txt").read_text() == "mine"
    assert not list(out.rglob("part-*")) and (out / "train" / "index.json").is_file()
    written = json.loads((out / "lmshard_export.json").read_text())["written"]
    assert "train/index.json" in written and "train/mine.txt" not in written


def test_olmo_export_of_a_dataset_separated_by_its_bos_needs_eod_id(big, tmp_path):  # noqa: F811
    """A dataset imported from llm.c's Llama 3 shards is separated by <|begin_of_text|>: --to
    olmo refuses in one line naming --eod-id (OLMo-core would read a file as one document); with
    --eod-id set to the vocabulary's end of text, that id ends every document."""
    import tokenizers

    ref = tokenizers.Tokenizer.from_file(str(big["file"]))
    bos, eot = ref.token_to_id(BOT), ref.token_to_id(EOT)
    rng = np.random.default_rng(9)
    docs = [rng.integers(300, 70_000, size=int(rng.integers(3, 30))).tolist() for _ in range(40)]
    _llmc_fineweb(tmp_path / "fw", docs, shard_size=400, version=(20240801, 7, "<u4"), sep=bos)
    import_dataset(tmp_path / "fw", "llmc", tmp_path / "ds", tokenizer=str(big["file"]))
    result = runner.invoke(app, ["export", str(tmp_path / "ds"), "--to", "olmo", "--out", str(tmp_path / "o")])
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and f"pass --eod-id {eot} to write <|end_of_text|>" in said, result.output
    export_dataset(tmp_path / "ds", "olmo", tmp_path / "o", eod_id=eot)
    tokens = np.concatenate([np.fromfile(p, dtype="<u4") for p in sorted((tmp_path / "o" / "train").glob("*.npy"))])
    want = [d.tolist() for d in read_docs(tmp_path / "ds", "train")]  # [BOS, text...]: BOS moved after, as EOT
    assert tokens.tolist() == [t for d in want for t in [*d[1:], eot]]
