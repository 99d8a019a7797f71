"""`lmshard inspect` on datasets in every shard encoding: the checks of a uint32 dataset, made on
decoded tokens, and damage named by shard and block.

The truth is independent of lmshard's readers: the uint32 source read with numpy, each encoding
decoded here from its specification (docs/format.md: uint16 little-endian; packed, b bits per
token, least significant bit first; zstd, one frame per block at the byte offsets in `.blocks`,
each id `width` little-endian bytes), and each block's xxh3-64 computed here.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import xxhash
from conftest import GPT2_EOT, read_docs
from test_prepare import jsonl, make_texts
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import EXIT_CORRUPT
from lmshard.inspect.verify import verify_dataset
from lmshard.interop.convert import convert_dataset
from lmshard.prepare import PrepareConfig, prepare

runner = CliRunner()
ENCODINGS = ("uint32", "uint16", "packed", "zstd")


# --- independent readers ------------------------------------------------------------------------


def metadata(root: Path) -> dict:
    return json.loads((root / "dataset_metadata.json").read_text())


def shard_entries(root: Path) -> list[dict]:
    meta = metadata(root)
    return [s for split in ("train", "val") for s in meta["splits"].get(split, {}).get("shards", [])]


def decode_file(root: Path, entry: dict, encoding: dict | None) -> np.ndarray:
    """A shard's tokens as uint32, decoded from the format's description alone."""
    raw = (root / entry["path"]).read_bytes()
    name, n = (encoding or {"name": "uint32"})["name"], entry["n_tokens"]
    if name == "uint32":
        return np.frombuffer(raw, dtype="<u4").astype(np.uint32)
    if name == "uint16":
        return np.frombuffer(raw, dtype="<u2").astype(np.uint32)
    if name == "packed":
        bits = encoding["bits"]
        stream = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")[: n * bits]
        return (stream.reshape(n, bits).astype(np.uint64) << np.arange(bits, dtype=np.uint64)).sum(1).astype(np.uint32)
    import zstandard

    offsets = np.fromfile(root / entry["blocks_path"], dtype="<u8")
    width, parts = encoding["width"], []
    # format version 3: every frame compressed with the dictionary the metadata holds (base64)
    held = encoding.get("dictionary")
    dictionary = zstandard.ZstdCompressionDict(base64.b64decode(held["base64"])) if held else None
    for lo, hi in zip(offsets[:-1], offsets[1:], strict=True):
        frame = zstandard.ZstdDecompressor(dict_data=dictionary).decompress(raw[lo:hi])
        data = np.frombuffer(frame, dtype=np.uint8).reshape(-1, width)
        wide = np.zeros((len(data), 4), dtype=np.uint8)
        wide[:, :width] = data
        parts.append(wide.view("<u4").reshape(-1))
    return np.concatenate(parts).astype(np.uint32) if parts else np.zeros(0, np.uint32)


def block_bounds(root: Path, entry: dict, encoding: dict | None) -> list[tuple[int, int]]:
    """(first byte, end byte) of each checksum block of a shard's token file."""
    if entry.get("blocks_path"):
        offsets = np.fromfile(root / entry["blocks_path"], dtype="<u8").tolist()
        return list(zip(offsets[:-1], offsets[1:], strict=True))
    bits = {"uint32": 32, "uint16": 16}.get((encoding or {"name": "uint32"})["name"]) or encoding["bits"]
    size, n = entry["block_tokens"], entry["n_tokens"]
    return [(k * bits // 8, (min(k + size, n) * bits + 7) // 8) for k in range(0, n, size)]


def check_sums(root: Path, entry: dict, encoding: dict | None) -> None:
    raw = (root / entry["path"]).read_bytes()
    sums = np.fromfile(root / entry["sums_path"], dtype="<u8").tolist()
    assert sums == [xxhash.xxh3_64_intdigest(raw[lo:hi]) for lo, hi in block_bounds(root, entry, encoding)]
    assert xxhash.xxh3_64_hexdigest(raw) == entry["xxh3_64"]


def inspect_json(path, *extra):
    result = runner.invoke(app, ["inspect", str(path), "--json", *extra])
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip().startswith("{") else result.output


# --- datasets -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A small GPT-2 dataset in every encoding: {name: root}. uint32 is prepared; zstd is
    prepared with --shard-encoding (the writer's path); uint16 and packed are converted."""
    tmp = tmp_path_factory.mktemp("enc")
    src = jsonl(tmp / "a.jsonl", make_texts(400, seed=3))
    roots = {}
    for name in ("uint32", "zstd"):
        roots[name] = tmp / name
        prepare(PrepareConfig(inputs=[str(src)], out=str(roots[name]), workers=1, tokens_per_shard=6000,
                              val_fraction=0.1, shard_encoding=name))  # fmt: skip
    for name in ("uint16", "packed"):
        roots[name] = tmp / name
        convert_dataset(roots["uint32"], name, roots[name])
    return roots


@pytest.fixture
def copy_of(gpt2, tmp_path):
    return lambda name: shutil.copytree(gpt2[name], tmp_path / name)


# --- every encoding verifies, with the checks of a uint32 dataset ---------------------------------


@pytest.mark.parametrize("name", ENCODINGS)
def test_every_encoding_decodes_to_the_uint32_tokens_and_verifies(gpt2, name):
    root, meta = gpt2[name], metadata(gpt2[name])
    encoding = meta.get("encoding")
    assert (encoding or {"name": "uint32"})["name"] == name
    assert meta["format_version"] == (1 if name == "uint32" else 3 if name == "zstd" else 2)
    truth = {s["path"]: np.fromfile(gpt2["uint32"] / s["path"], dtype="<u4") for s in shard_entries(gpt2["uint32"])}
    for entry in shard_entries(root):
        assert np.array_equal(decode_file(root, entry, encoding), truth[entry["path"]]), entry["path"]
        check_sums(root, entry, encoding)
    code, report = inspect_json(root)
    assert code == 0 and report["ok"], report
    stored = sum((root / s["path"]).stat().st_size for s in shard_entries(root))
    assert report["encoding"]["name"] == name
    assert report["encoding"]["bytes_per_token"] == round(stored / report["n_tokens"], 3)
    everything = np.concatenate([d for s in ("train", "val") for d in read_docs(gpt2["uint32"], s)])
    counts = verify_dataset(root).token_counts
    assert np.array_equal(counts, np.bincount(everything, minlength=50257))


def test_bytes_per_token_is_what_each_encoding_promises(gpt2):
    per = {name: inspect_json(gpt2[name], "--quick")[1]["encoding"]["bytes_per_token"] for name in ENCODINGS}
    assert per["uint32"] == 4.0 and per["uint16"] == 2.0 and per["packed"] == 2.0  # GPT-2: 16 bits
    assert per["zstd"] < 2.0


@pytest.mark.parametrize("name", ENCODINGS)
def test_documents_decode_the_same_in_every_encoding(gpt2, name):
    expected = runner.invoke(app, ["inspect", str(gpt2["uint32"]), "--doc", "train/shard_000001:3"])
    got = runner.invoke(app, ["inspect", str(gpt2[name]), "--doc", "train/shard_000001:3"])
    assert got.exit_code == expected.exit_code == 0
    assert got.stdout == expected.stdout and len(got.stdout) > 20


# --- damage, named by shard and block -------------------------------------------------------------


def flip(root: Path, entry: dict, byte: int) -> None:
    path = root / entry["path"]
    data = bytearray(path.read_bytes())
    data[byte] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["zstd", "packed", "uint16"])
def test_a_flipped_byte_exits_3_naming_the_shard_and_the_block(copy_of, name):
    root = copy_of(name)
    encoding = metadata(root).get("encoding")
    entry = shard_entries(root)[1]
    bounds = block_bounds(root, entry, encoding)
    k = len(bounds) - 1  # the last block: damage past the first is found where it is
    flip(root, entry, (bounds[k][0] + bounds[k][1]) // 2)
    result = runner.invoke(app, ["inspect", str(root), "--top", "0"])
    assert result.exit_code == EXIT_CORRUPT
    lines = [line for line in result.output.splitlines() if line.startswith("problem:")]
    assert len(lines) == 1, result.output
    size = entry["block_tokens"]
    assert f"{entry['path']}: block {k} (tokens {k * size:,}.." in lines[0]
    assert "does not match its checksum" in lines[0]
    assert inspect_json(root, "--quick")[0] == 0  # --quick reads no token: it cannot see a byte


def test_a_zstd_frame_that_does_not_decode_is_named_even_with_matching_sums(copy_of):
    """The damaged frame's block sum, the sums file's checksum and the token file's checksum are
    all rewritten to match: only decoding the frame can find it."""
    root = copy_of("zstd")
    meta = metadata(root)
    entry = meta["splits"]["train"]["shards"][0]
    bounds = block_bounds(root, entry, meta["encoding"])
    lo, hi = bounds[1]
    flip(root, entry, hi - 2)  # inside the frame's checksum: it no longer decodes
    raw = (root / entry["path"]).read_bytes()
    sums = np.fromfile(root / entry["sums_path"], dtype="<u8")
    sums[1] = xxhash.xxh3_64_intdigest(raw[lo:hi])
    sums.tofile(root / entry["sums_path"])
    entry["sums_xxh3_64"] = xxhash.xxh3_64_hexdigest(sums.tobytes())
    entry["xxh3_64"] = xxhash.xxh3_64_hexdigest(raw)
    (root / "dataset_metadata.json").write_text(json.dumps(meta))
    code, report = inspect_json(root)
    assert code == EXIT_CORRUPT and len(report["problems"]) == 1, report
    assert f"{entry['path']}: block 1 (tokens" in report["problems"][0]
    assert "does not decode as zstd" in report["problems"][0]


def test_damaged_block_offsets_are_named(copy_of):
    root = copy_of("zstd")
    entry = shard_entries(root)[0]
    offsets = np.fromfile(root / entry["blocks_path"], dtype="<u8")
    offsets[1] += 1  # still increasing, still the same size: only its checksum tells
    offsets.tofile(root / entry["blocks_path"])
    code, report = inspect_json(root)
    assert code == EXIT_CORRUPT and len(report["problems"]) == 1, report
    assert entry["blocks_path"] in report["problems"][0] and "corrupt block offsets" in report["problems"][0]


def test_boundary_checks_run_on_decoded_tokens(gpt2, tmp_path):
    """A uint32 dataset with one EOT replaced (its checksums rewritten to match), converted to
    zstd: only the check of the decoded tokens at document boundaries can find it."""
    root = shutil.copytree(gpt2["uint32"], tmp_path / "u")
    meta = metadata(root)
    entry = meta["splits"]["train"]["shards"][0]
    tokens = np.fromfile(root / entry["path"], dtype="<u4")
    offsets = np.fromfile(root / entry["index_path"], dtype="<u8")
    assert tokens[offsets[3] - 1] == GPT2_EOT
    tokens[offsets[3] - 1] = 13
    tokens.tofile(root / entry["path"])
    raw = tokens.tobytes()
    sums = np.array([xxhash.xxh3_64_intdigest(raw[a : a + 65536]) for a in range(0, len(raw), 65536)], dtype="<u8")
    sums.tofile(root / entry["sums_path"])
    entry |= {"xxh3_64": xxhash.xxh3_64_hexdigest(raw), "sums_xxh3_64": xxhash.xxh3_64_hexdigest(sums.tobytes())}
    (root / "dataset_metadata.json").write_text(json.dumps(meta))
    convert_dataset(root, "zstd", tmp_path / "z")
    code, report = inspect_json(tmp_path / "z")
    assert code == EXIT_CORRUPT and len(report["problems"]) == 1, report
    assert report["problems"][0].startswith(entry["path"])
    assert "1 document boundaries without the EOT token 50256" in report["problems"][0]
