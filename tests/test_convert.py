"""`lmshard convert`, and `export`/`import` of datasets in every shard encoding.

The truth is the uint32 source read with numpy and each encoding decoded from its specification
(test_inspect_encodings.decode_file), never lmshard's own readers. Byte identity after a round
trip is checked file by file against the original dataset.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import GPT2_EOT, read_docs, write
from test_hf_tokenizer import big  # noqa: F401  (big: the module-scoped >65,536-id vocabulary)
from test_inspect_encodings import check_sums, decode_file, inspect_json, metadata, shard_entries
from test_interop import big_ds  # noqa: F401  (a uint32 dataset of more than 65,536 ids, ids above 65,535 in it)
from test_prepare import jsonl, make_texts
from typer.testing import CliRunner

import lmshard.interop.convert as convert
from lmshard.cli import app
from lmshard.errors import ConfigError
from lmshard.interop import export_dataset, import_dataset
from lmshard.interop.convert import convert_dataset
from lmshard.prepare import PrepareConfig, prepare

runner = CliRunner()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A GPT-2 dataset, uint32, several shards in both splits, with its dedup keys."""
    tmp = tmp_path_factory.mktemp("conv")
    src = jsonl(tmp / "a.jsonl", make_texts(400, seed=5))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp / "ds"), workers=1, tokens_per_shard=6000,
                          val_fraction=0.1))  # fmt: skip
    return tmp / "ds"


def files(root: Path) -> dict[str, bytes]:
    """Every file of a dataset but its metadata: relative path → bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "dataset_metadata.json"}  # fmt: skip


def assert_decodes_to(root: Path, truth_root: Path) -> None:
    """Every shard of `root`, decoded independently, holds the tokens of the same shard of the
    uint32 dataset `truth_root`; block sums and checksums match the stored bytes."""
    encoding = metadata(root).get("encoding")
    entries = shard_entries(root)
    assert [e["path"] for e in entries] == [e["path"] for e in shard_entries(truth_root)]
    for entry in entries:
        expected = np.fromfile(truth_root / entry["path"], dtype="<u4")
        assert np.array_equal(decode_file(root, entry, encoding), expected), entry["path"]
        check_sums(root, entry, encoding)


# --- convert ------------------------------------------------------------------------------------


def test_uint32_to_zstd_and_back_is_byte_identical(source, tmp_path):
    convert_dataset(source, "zstd", tmp_path / "z")
    convert_dataset(tmp_path / "z", "uint32", tmp_path / "back")
    assert files(tmp_path / "back") == files(source)
    back, z, first = metadata(tmp_path / "back"), metadata(tmp_path / "z"), metadata(source)
    lineage = [entry.pop("lineage") for entry in (back["run"], z["run"], first["run"])]
    assert back == first  # run record and all: only the encoding changed, and the lineage grew
    assert [e["op"] for e in lineage[0]] == ["prepare", "convert", "convert"] and lineage[1] == lineage[0][:2]
    assert [e.get("encoding") for e in lineage[0][1:]] == ["zstd", "uint32"] and lineage[0][0] == lineage[2][0]
    assert z["format_version"] == 2 and z["encoding"]["name"] == "zstd"
    assert {k: v for k, v in z.items() if k not in ("encoding", "format_version", "splits", "config")} == {
        k: v for k, v in first.items() if k not in ("format_version", "splits", "config")}  # fmt: skip
    # the recorded options say the new encoding (a prepare --resume of the same command recognises it)
    assert z["config"] == {**metadata(source)["config"], "shard_encoding": "zstd"}
    # the copied files are the source's, byte for byte
    assert {k: v for k, v in files(tmp_path / "z").items() if not k.endswith((".bin", ".sums", ".blocks"))} == {
        k: v for k, v in files(source).items() if not k.endswith((".bin", ".sums"))}  # fmt: skip


def test_any_encoding_to_any_keeps_the_tokens(source, tmp_path, monkeypatch):
    """A chain through every encoding, read and compared in chunks of 1,000 tokens (so chunks
    end inside blocks and documents), ends where it began."""
    monkeypatch.setattr(convert, "CHUNK_TOKENS", 1000)
    at = source
    for i, name in enumerate(("uint16", "packed", "zstd", "packed", "uint16", "zstd", "uint32")):
        out = tmp_path / f"{i}_{name}"
        result = convert_dataset(at, name, out)
        assert result.meta.encoding.name == name and result.meta.root == out.resolve()
        assert_decodes_to(out, source)
        assert inspect_json(out)[0] == 0
        at = out
    assert files(at) == files(source)


@pytest.mark.parametrize("name", ["uint32", "packed", "zstd"])
def test_a_vocabulary_above_65536_ids_in_every_encoding_it_fits(big_ds, tmp_path, name):  # noqa: F811
    assert max(int(np.fromfile(p, dtype="<u4").max()) for p in big_ds.glob("*/shard_*.bin")) > 0xFFFF
    convert_dataset(big_ds, "zstd" if name == "uint32" else name, tmp_path / "a")
    convert_dataset(tmp_path / "a", name, tmp_path / "b")
    assert_decodes_to(tmp_path / "b", big_ds)
    code, report = inspect_json(tmp_path / "b")
    assert code == 0 and report["ok"], report
    if name == "packed":
        assert metadata(tmp_path / "b")["encoding"]["bits"] == 17  # 65,537 .. 131,072 ids
    if name == "zstd":
        assert metadata(tmp_path / "b")["encoding"]["width"] == 3


def test_uint16_is_refused_for_a_large_vocabulary_in_one_line(big, big_ds, tmp_path):  # noqa: F811
    result = runner.invoke(app, ["convert", str(big_ds), "--to", "uint16", "--out", str(tmp_path / "c")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    (line,) = result.output.strip().splitlines()
    assert "--to uint16" in line and "65,535" in line and "packed" in line
    assert not (tmp_path / "c").exists()
    src = write(tmp_path / "d.jsonl", json.dumps({"text": "abab cdcd"}) + "\n")
    result = runner.invoke(app, ["prepare", str(src), "--out", str(tmp_path / "p"), "--tokenizer", str(big["file"]),
                                 "--shard-encoding", "uint16"])  # fmt: skip
    assert result.exit_code == 1 and "Traceback" not in result.output
    (line,) = [x for x in result.output.strip().splitlines() if x.startswith("error:")]
    assert "--shard-encoding uint16" in line and "65,535" in line
    assert not (tmp_path / "p" / "dataset_metadata.json").exists()


def test_cli_convert_reports_and_refuses_an_existing_out(source, tmp_path):
    out = tmp_path / "z"
    result = runner.invoke(app, ["convert", str(source), "--to", "zstd", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "converted" in result.output and "zstd" in result.output and "4 →" in result.output
    result = runner.invoke(app, ["convert", str(source), "--to", "packed", "--out", str(out)])
    assert result.exit_code == 1 and "--overwrite" in result.output and len(result.output.strip().splitlines()) == 1
    assert metadata(out)["encoding"]["name"] == "zstd"  # untouched


def test_overwrite_replaces_the_dataset_and_keeps_the_users_files(source, tmp_path):
    out = tmp_path / "d"
    convert_dataset(source, "zstd", out)
    write(out / "README.md", "mine")
    write(out / "train" / "notes.txt", "mine too")
    convert_dataset(source, "packed", out, overwrite=True)
    assert metadata(out)["encoding"]["name"] == "packed"
    assert (out / "README.md").read_text() == "mine" and (out / "train" / "notes.txt").read_text() == "mine too"
    assert not list(out.rglob("*.blocks"))  # the zstd shards' offsets went with them
    assert_decodes_to(out, source)
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no staging directory left beside it


def test_urls_are_refused_in_one_line(source, tmp_path):
    for args in (["s3://bucket/ds", "--out", str(tmp_path / "o")], [str(source), "--out", "s3://bucket/o"]):
        result = runner.invoke(app, ["convert", *args, "--to", "zstd"])
        assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
        assert "local directories" in result.output


def test_a_damaged_source_is_refused_and_nothing_is_written(source, tmp_path):
    root = shutil.copytree(source, tmp_path / "src")
    entry = shard_entries(root)[2]
    path = root / entry["path"]
    tokens = np.fromfile(path, dtype="<u4")
    tokens[20_000 % len(tokens)] ^= 1  # a valid id still: only the block sum can tell
    tokens.tofile(path)
    block = (20_000 % len(tokens)) // entry["block_tokens"]
    result = runner.invoke(app, ["convert", str(root), "--to", "zstd", "--out", str(tmp_path / "z")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{entry['path']}: block {block} (tokens" in result.output and "does not match its checksum" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_copy_that_differs_from_the_source_never_replaces_out(source, tmp_path, monkeypatch):
    """A fault between decoding and sealing (one token changed in the uint32 temporary file,
    so the new shard is self-consistent): the comparison with the source finds it, and the
    existing --out stays as it was."""
    out = tmp_path / "d"
    convert_dataset(source, "packed", out)
    before = files(out)
    sealed = convert.seal_encoded

    def faulty(tmp, final, rel, encoding, n_tokens):
        if rel == "train/shard_000001.bin":
            tokens = np.fromfile(tmp, dtype="<u4")
            tokens[7] = 11 if tokens[7] != 11 else 12
            tokens.tofile(tmp)
        return sealed(tmp, final, rel, encoding, n_tokens)

    monkeypatch.setattr(convert, "seal_encoded", faulty)
    result = runner.invoke(app, ["convert", str(source), "--to", "zstd", "--out", str(out), "--overwrite"])
    assert result.exit_code == 1, result.output
    assert "train/shard_000001.bin" in result.output and "differs from the source at token 7" in result.output
    assert files(out) == before and metadata(out)["encoding"]["name"] == "packed"
    assert [p.name for p in tmp_path.iterdir()] == ["d"]


# --- export and import of encoded datasets -------------------------------------------------------


@pytest.mark.parametrize("name", ["uint16", "packed", "zstd"])
@pytest.mark.parametrize("to", ["nanogpt", "llmc", "megatron"])
def test_export_of_an_encoded_dataset_equals_export_of_the_uint32_one(source, tmp_path, name, to):
    convert_dataset(source, name, tmp_path / name)
    export_dataset(source, to, tmp_path / "from_uint32", name="x")
    export_dataset(tmp_path / name, to, tmp_path / f"from_{name}", name="x")
    expected = {k: v for k, v in files(tmp_path / "from_uint32").items() if k != "lmshard_export.json"}
    got = {k: v for k, v in files(tmp_path / f"from_{name}").items() if k != "lmshard_export.json"}
    assert got == expected and expected


def test_export_of_a_damaged_zstd_frame_is_one_line_naming_the_block(source, tmp_path):
    convert_dataset(source, "zstd", tmp_path / "z")
    entry = shard_entries(tmp_path / "z")[0]
    offsets = np.fromfile(tmp_path / "z" / entry["blocks_path"], dtype="<u8")
    path = tmp_path / "z" / entry["path"]
    data = bytearray(path.read_bytes())
    data[int(offsets[2]) - 2] ^= 0x10  # the end of frame 1: its checksum
    path.write_bytes(bytes(data))
    result = runner.invoke(app, ["export", str(tmp_path / "z"), "--to", "nanogpt", "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{entry['path']}: block 1 (tokens" in result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["zstd", "packed"])
def test_import_with_a_shard_encoding_then_inspect(source, tmp_path, name):
    """A nanoGPT directory made from the dataset's documents, imported with --shard-encoding:
    the new shards decode to the same documents and inspect verifies them."""
    nano = tmp_path / "nano"
    nano.mkdir()
    for split in ("train", "val"):
        np.concatenate(read_docs(source, split)).astype("<u2").tofile(nano / f"{split}.bin")
    out = tmp_path / "imported"
    result = runner.invoke(app, ["import", str(nano), "--from", "nanogpt", "--out", str(out), "--tokenizer", "gpt2",
                                 "--shard-encoding", name])  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = metadata(out)
    assert meta["encoding"]["name"] == name and meta["format_version"] == 2
    for split in ("train", "val"):
        decoded = [decode_file(out, e, meta["encoding"]) for e in meta["splits"][split]["shards"]]
        expected = np.concatenate(read_docs(source, split))
        assert np.array_equal(np.concatenate(decoded), expected)
        assert expected[-1] == GPT2_EOT
    code, report = inspect_json(out)
    assert code == 0 and report["ok"] and report["encoding"]["name"] == name, report


def test_import_refuses_uint16_for_a_large_vocabulary(big, tmp_path):  # noqa: F811
    nano = tmp_path / "nano"
    nano.mkdir()
    np.array([5, 7, 9], dtype="<u2").tofile(nano / "train.bin")
    with pytest.raises(ConfigError, match="--shard-encoding uint16 holds ids up to 65,535"):
        import_dataset(nano, "nanogpt", tmp_path / "o", tokenizer=str(big["file"]), shard_encoding="uint16")
    assert not (tmp_path / "o").exists()


def test_every_folder_of_a_converted_dataset_is_synced_before_the_swap(source, tmp_path, monkeypatch):
    """The names renamed into each of the new dataset's folders (train/, val/, dedup/) are made
    durable, the deepest first, before it replaces --out: a power loss after the swap leaves no
    shard under its temporary name."""
    import lmshard.interop.output as output

    synced, real = [], output._fsync_dir
    monkeypatch.setattr(output, "_fsync_dir", lambda path: synced.append(Path(path)) or real(path))
    convert_dataset(source, "zstd", tmp_path / "z")
    folders = sorted(p.relative_to(tmp_path / "z") for p in (tmp_path / "z").rglob("*") if p.is_dir())
    assert {"train", "val"} <= {str(f) for f in folders}
    staging = next(p for p in synced if p.parent == tmp_path and p.name.startswith(".z.lmshard-interop"))
    staged = [p.relative_to(staging) for p in synced if p.is_relative_to(staging)]  # (the build's folders, in order)
    assert staged[-1] == Path(".") and sorted(set(staged) - {Path(".")}) == folders
