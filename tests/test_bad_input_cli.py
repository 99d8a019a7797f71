"""Every bad input gets an answer (#13): the real CLI on damaged compressed files, oversize text
files, dropped documents, OS errors and bad options. Each case asserts the exit code, that no
traceback (or click's bare "Aborted.") is printed, and the words of the message: the file, how
far reading got, the reason and the fix. Skip cases also check that the documents kept are
tiktoken's own encoding of the records before the damage."""

from __future__ import annotations

import bz2
import csv
import errno
import gzip
import io
import json
import lzma
import os
import random
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zstandard
from conftest import GPT2_EOT, read_docs, write
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import EXIT_CORRUPT, EXIT_ERROR, EXIT_OK, EXIT_USAGE, ConfigError
from lmshard.prepare import PrepareConfig
from lmshard.prepare.documents.files import detect
from lmshard.prepare.documents.sources import SPLIT_INTO_PARAGRAPHS, plan

runner = CliRunner()
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega", "river",
         "stone", "cloud"]  # fmt: skip


def texts(n: int, seed: int = 0) -> list[str]:
    """Distinct ASCII one-line texts (cleaning leaves them as they are), ~150 bytes each."""
    rng = random.Random(seed)
    return [f"doc {i} " + " ".join(rng.choices(WORDS, k=rng.randint(15, 30))) for i in range(n)]


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    output = result.output
    assert "Traceback" not in output and "Aborted" not in output, output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, " ".join(output.split())  # one line, whatever the terminal width


def prepare_cli(out: Path, *args: str) -> tuple[int, str]:
    return cli("prepare", *args, "--out", str(out), "--val-fraction", "0")


def kept(out: Path) -> list[list[int]]:
    return [d[:-1].tolist() for d in read_docs(out, "train")]


def encoded(reference, records: list[str]) -> list[list[int]]:
    return [reference.encode_ordinary(t) for t in records]


def meta_of(out: Path) -> dict:
    return json.loads((out / "dataset_metadata.json").read_text())


# ---------------------------------------------------------------------------------------------
# Damaged compressed inputs: every codec, every format that can be compressed.

COMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gz": gzip.compress,
    "bz2": lambda b: bz2.compress(b, compresslevel=1),  # 100 kB blocks: a truncated file keeps some
    "xz": lzma.compress,
    "zst": lambda b: zstandard.ZstdCompressor(write_checksum=True).compress(b),
}
CODEC = {"gz": "gzip", "bz2": "bz2", "xz": "xz", "zst": "zstd"}


def decodable_prefix(ext: str, damaged: bytes) -> bytes:
    """Everything an independent decompressor decodes from a truncated file."""
    if ext == "gz":
        return zlib.decompressobj(wbits=31).decompress(damaged)
    if ext == "bz2":
        return bz2.BZ2Decompressor().decompress(damaged)
    if ext == "xz":
        return lzma.LZMADecompressor().decompress(damaged)
    return zstandard.ZstdDecompressor().decompressobj().decompress(damaged)


NL = b"\n"


def _complete_lines(prefix: bytes) -> list[str]:
    return prefix[: prefix.rfind(b"\n") + 1].decode().splitlines()


def _paragraph_cut(prefix: bytes) -> int:
    """Where the planner cuts: just past the last blank line."""
    c = prefix.rfind(b"\n\n")
    return 0 if c < 0 else prefix.index(b"\n", c + 1) + 1


def _lines_done(prefix: bytes) -> str:
    return f"after {prefix.count(NL):,} lines"


def _json_elements(prefix: bytes) -> list[str]:
    text, found, decoder = prefix.decode(errors="ignore"), [], json.JSONDecoder()
    pos = text.index("[") + 1
    while True:
        pos = len(text) - len(text[pos:].lstrip(" \n,"))
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return found
        found.append(obj["text"])


# format → (suffix, extra flags, serialise texts, records kept from a prefix, how far: unit and count)
FORMATS: dict[str, tuple[str, list[str], Callable, Callable, Callable]] = {
    "jsonl": (".jsonl", [], lambda ts: "".join(json.dumps({"text": t}) + "\n" for t in ts),
              lambda p: [json.loads(x)["text"] for x in _complete_lines(p)],
              _lines_done),
    "json": (".json", [], lambda ts: "[\n" + ",\n".join(json.dumps({"text": t}) for t in ts) + "\n]\n",
             _json_elements, lambda p: f"after {len(_json_elements(p)):,} records"),
    "csv": (".csv", [], lambda ts: "id,text\n" + "".join(f"{i},{t}\n" for i, t in enumerate(ts)),
            lambda p: [row["text"] for row in csv.DictReader(io.StringIO("\n".join(_complete_lines(p))))],
            _lines_done),
    "line": (".txt", ["--text-mode", "line"], lambda ts: "".join(t + "\n" for t in ts), _complete_lines,
             _lines_done),
    "paragraph": (".txt", ["--text-mode", "paragraph"],
                  lambda ts: "".join(t.replace(" zeta ", " zeta\n", 1) + "\n\n" for t in ts),
                  lambda p: [x.strip("\n") for x in p[: _paragraph_cut(p)].decode().split("\n\n") if x.strip()],
                  lambda p: _lines_done(p[: _paragraph_cut(p)])),
    "file": (".txt", ["--text-mode", "file"], lambda ts: "\n".join(ts), lambda p: [],
             lambda p: f"after {len(p):,} uncompressed bytes"),
    "auto": (".txt", [], lambda ts: "\n".join(ts), lambda p: [], lambda p: f"after {len(p):,} uncompressed bytes"),
}  # fmt: skip


def damaged_input(tmp_path: Path, fmt: str, ext: str) -> tuple[Path, Path, bytes, list[str], list[str]]:
    """A good plain file and a truncated compressed one, with the texts of each."""
    suffix, _, serialise, _, _ = FORMATS[fmt]
    good_texts, damaged_texts = texts(20, seed=1), texts(2000, seed=2)
    good = write(tmp_path / f"good{suffix}", serialise(good_texts) if fmt not in ("file", "auto") else good_texts[0])
    full = COMPRESS[ext](serialise(damaged_texts).encode())
    cut = full[: len(full) * 6 // 10]
    path = write(tmp_path / f"damaged{suffix}.{ext}", cut)
    return good, path, cut, good_texts, damaged_texts


@pytest.mark.parametrize("ext", list(COMPRESS))
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_truncated_input_is_one_line_and_skip_keeps_the_records_before(tmp_path, reference, fmt, ext):
    _, flags, _, records_in, how_far = FORMATS[fmt]
    good, path, cut, good_texts, _ = damaged_input(tmp_path, fmt, ext)
    prefix = decodable_prefix(ext, cut)
    code, message = prepare_cli(tmp_path / "fail", str(good), str(path), "--workers", "1", *flags)
    assert code == EXIT_ERROR
    assert f"{path}:" in message and f"truncated {CODEC[ext]} data" in message, message
    assert how_far(prefix) in message, message
    assert "re-download or re-create the file" in message and "--on-error skip to keep the records" in message
    assert not (tmp_path / "fail" / "dataset_metadata.json").exists()

    code, output = prepare_cli(tmp_path / "skip", str(good), str(path), "--workers", "1", "--on-error", "skip", *flags)
    assert code == EXIT_OK, output
    good_docs = records_in(good.read_bytes()) if fmt not in ("file", "auto") else good_texts[:1]
    assert kept(tmp_path / "skip") == encoded(reference, good_docs + records_in(prefix))
    meta = meta_of(tmp_path / "skip")
    assert meta["drops"]["truncated_compression"] == 1
    assert meta["sources"][1]["dropped"]["truncated_compression"] == 1
    assert meta["drop_examples"]["truncated_compression"].startswith(f"{path}:")
    assert f"truncated_compression 1: {path} (1)" in output


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "file", "json"])
def test_truncated_input_with_workers_keeps_the_same_documents(tmp_path, fmt):
    _, flags, _, _, _ = FORMATS[fmt]
    good, path, _, _, _ = damaged_input(tmp_path, fmt, "gz")
    runs = {}
    for workers in ("1", "3"):
        out = tmp_path / f"w{workers}"
        code, message = prepare_cli(out, str(good), str(path), "--workers", workers, *flags)
        assert code == EXIT_ERROR and f"{path}:" in message and "truncated gzip data" in message
        code, output = prepare_cli(out, str(good), str(path), "--workers", workers, "--on-error", "skip", *flags)
        assert code == EXIT_OK, output
        runs[workers] = kept(out)
    assert runs["1"] == runs["3"] and runs["1"]


def _flip(data: bytes, at: int, n: int = 16) -> bytes:
    return data[:at] + bytes(b ^ 0xA5 for b in data[at : at + n]) + data[at + n :]


def _two_gzip_members(data: bytes, damage: Callable[[bytes], bytes]) -> bytes:
    """Two gzip members (as `cat a.gz b.gz` makes), the second one damaged. Deflate decodes
    most flipped bytes as other data, so the second member's first block is given a reserved
    block type: an error where it starts."""
    half = data.index(b"\n", len(data) // 2) + 1
    return gzip.compress(data[:half]) + damage(gzip.compress(data[half:]))


def _reserved_block_type(member: bytes) -> bytes:
    return member[:10] + bytes([member[10] | 0b110]) + member[11:]  # BTYPE 11 after the 10-byte header


@pytest.mark.parametrize(("ext", "damage", "reason"), [
    ("gz", lambda d: _two_gzip_members(d, lambda m: m[:-8] + bytes([m[-8] ^ 1]) + m[-7:]),
     "gzip checksum mismatch (CRC check failed"),  # the second member's CRC-32
    ("gz", lambda d: _two_gzip_members(d, _reserved_block_type), "corrupt gzip data (Error -3"),
    ("gz", lambda d: b"not gzip at all\n" * 4, "corrupt gzip data (Not a gzipped file"),
    ("bz2", lambda d: _flip(COMPRESS["bz2"](d), len(COMPRESS["bz2"](d)) // 2), "corrupt bz2 data"),
    ("xz", lambda d: _flip(lzma.compress(d), len(lzma.compress(d)) // 2), "corrupt xz data"),
    ("zst", lambda d: _flip(COMPRESS["zst"](d), len(COMPRESS["zst"](d)) // 2), "corrupt zstd data"),
])  # fmt: skip
def test_corrupt_input_is_one_line_and_skip_keeps_only_whole_records(tmp_path, reference, ext, damage, reason):
    records = texts(2000, seed=3)
    data = "".join(json.dumps({"text": t}) + "\n" for t in records).encode()
    path = write(tmp_path / f"c.jsonl.{ext}", damage(data))
    good = write(tmp_path / "good.jsonl", json.dumps({"text": "a good document"}) + "\n")
    code, message = prepare_cli(tmp_path / "fail", str(good), str(path), "--workers", "1")
    assert code == EXIT_ERROR and f"{path}:" in message and reason in message, message
    assert "uncompressed bytes read" in message and "re-download" in message
    code, output = prepare_cli(tmp_path / "skip", str(good), str(path), "--workers", "1", "--on-error", "skip")
    assert code == EXIT_OK, output
    docs = kept(tmp_path / "skip")
    n = len(docs) - 1
    assert n < len(records) or "checksum" in reason  # a CRC is checked after its member's data
    assert docs == encoded(reference, ["a good document", *records[:n]])  # a prefix of the records, no garbage
    assert meta_of(tmp_path / "skip")["drops"]["corrupt_compression"] == 1


def test_real_console_script_on_truncated_gzip_even_verbose(tmp_path):
    """The installed script, as a user runs it: one line naming the file, never "Aborted."."""
    body = "".join(json.dumps({"text": t}) + "\n" for t in texts(500)).encode()
    path = write(tmp_path / "cut.jsonl.gz", gzip.compress(body)[:3000])
    exe = Path(sys.executable).with_name("lmshard")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for verbose in ([], ["-v"]):
        done = subprocess.run([str(exe), *verbose, "prepare", str(path), "--out", str(tmp_path / "o")],
                              capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        assert done.returncode == EXIT_ERROR, done.stderr
        assert "Aborted" not in done.stderr and f"{path}:" in done.stderr and "truncated gzip data" in done.stderr
        assert ("Traceback" in done.stderr) == bool(verbose)  # -v shows it, as documented


def test_first_bad_record_in_input_order_is_the_one_named(tmp_path):
    """A bad line early and a truncation later: the line is named, with any number of workers."""
    lines = [json.dumps({"text": t}) for t in texts(3000, seed=4)]
    lines[4] = "{broken"
    path = write(tmp_path / "a.jsonl.gz", gzip.compress(("\n".join(lines) + "\n").encode())[:-2000])
    for workers in ("1", "2"):
        code, message = prepare_cli(tmp_path / f"o{workers}", str(path), "--workers", workers)
        assert code == EXIT_ERROR and f"{path}:5: invalid JSON" in message, message


def test_no_eof_error_escapes_from_a_compressed_csv_header(tmp_path):
    path = write(tmp_path / "h.csv.xz", lzma.compress(b"id,text\n" + b"1,abc\n" * 10)[:20])
    code, message = prepare_cli(tmp_path / "o", str(path), "--workers", "1")
    assert code == EXIT_ERROR and f"{path}:1: truncated xz data after 0 lines" in message, message


# ---------------------------------------------------------------------------------------------
# Large text files: --text-mode auto (the default) splits a file over --max-chars bytes.


@pytest.mark.parametrize("workers", ["1", "2"])
def test_auto_splits_a_text_file_over_max_chars_into_paragraphs(tmp_path, monkeypatch, reference, workers):
    """A file over the default --max-chars (10 MB) is paragraphs, counted and named; a small
    file beside it stays one document, with 1 worker and 2."""
    paragraphs = [t + "\n" + t[::-1] for t in texts(36_000, seed=5)]
    big = write(tmp_path / "big.txt", "\n\n".join(paragraphs) + "\n")
    assert big.stat().st_size > 10_000_000
    small = write(tmp_path / "small.md", "one small file\n\nwith two paragraphs\n")
    code, output = prepare_cli(tmp_path / "o", str(small), str(big), "--workers", workers)
    assert code == EXIT_OK, output
    docs = kept(tmp_path / "o")
    assert docs[0] == reference.encode_ordinary("one small file\n\nwith two paragraphs\n")
    assert docs[1:4] == encoded(reference, paragraphs[:3]) and len(docs) == 1 + len(paragraphs)
    assert f"split into paragraphs (over --max-chars bytes) 1: {big}" in output
    meta = meta_of(tmp_path / "o")
    assert meta["sources"][1][SPLIT_INTO_PARAGRAPHS] == 1 and meta["n_docs"] == 1 + len(paragraphs)
    assert SPLIT_INTO_PARAGRAPHS not in meta["sources"][0] and SPLIT_INTO_PARAGRAPHS not in meta["drops"]
    assert "dropped" not in meta["sources"][1], "a split file is not a drop"


def test_auto_splits_at_the_max_chars_the_run_was_given(tmp_path, reference):
    """--max-chars 100: a 300-byte text file is split into its paragraphs, not dropped whole."""
    paragraphs = ["first paragraph " * 5, "second paragraph " * 5, "third one " * 5]
    path = write(tmp_path / "mid.txt", "\n\n".join(paragraphs) + "\n")
    assert 100 < path.stat().st_size < 1000
    code, output = prepare_cli(tmp_path / "o", str(path), "--max-chars", "100", "--workers", "1")
    assert code == EXIT_OK, output
    assert kept(tmp_path / "o") == encoded(reference, paragraphs)
    assert meta_of(tmp_path / "o")["sources"][0][SPLIT_INTO_PARAGRAPHS] == 1


@pytest.mark.parametrize("ext", ["", ".gz", ".zst"])
def test_auto_plans_by_the_uncompressed_size(tmp_path, ext):
    body = "\n\n".join(texts(40, seed=6)).encode()
    compress = {"": lambda b: b, ".gz": gzip.compress, ".zst": zstandard.compress}[ext]
    path = write(tmp_path / f"t.txt{ext}", compress(body))
    src = detect(str(path))
    whole = list(plan([src], "auto", "text", max_chars=len(body)))
    assert [(i.kind, i.split_file) for i in whole] == [("files", False)]
    split = list(plan([src], "auto", "text", max_chars=len(body) - 1))
    assert split[0].kind == "lines" and split[0].split_file and not any(i.split_file for i in split[1:])


def test_text_mode_file_drops_an_oversize_file_and_names_it(tmp_path):
    big = write(tmp_path / "data" / "big.txt", "x" * 5000)
    small = write(tmp_path / "data" / "ok.txt", "fits")
    code, output = prepare_cli(tmp_path / "o", str(big), str(small), "--text-mode", "file", "--max-chars", "1000")
    assert code == EXIT_OK, output
    assert f"too_long 1: {big} (1)" in output
    assert f"first too_long: {big}:1: over 4,000 bytes" in output


@pytest.mark.parametrize("planned", [[], ["--num-tasks", "2"]])
def test_stdin_text_is_paragraphs_by_default_and_one_document_in_file_mode(tmp_path, reference, planned):
    """Read as it comes or saved first by a planned run, stdin is paragraphs unless --text-mode
    file asks for one document (which runs planned, on the saved copy: as a file in file mode)."""
    text = "first paragraph\nstill first\n\nsecond paragraph\n"
    result = runner.invoke(app, ["prepare", "-", "--format", "text", "--out", str(tmp_path / "o"),
                                 "--val-fraction", "0", "--workers", "1", *planned], input=text)  # fmt: skip
    assert result.exit_code == EXIT_OK, result.output
    assert kept(tmp_path / "o") == encoded(reference, ["first paragraph\nstill first", "second paragraph"])
    meta = json.loads((tmp_path / "o" / "dataset_metadata.json").read_text())
    assert not meta["sources"][0].get("split_into_paragraphs"), meta["sources"]
    result = runner.invoke(app, ["prepare", "-", "--format", "text", "--text-mode", "file", "--val-fraction", "0",
                                 "--out", str(tmp_path / "p"), "--workers", "1", *planned], input=text)  # fmt: skip
    assert result.exit_code == EXIT_OK, result.output
    (tmp_path / "t.txt").write_text(text)
    result = runner.invoke(app, ["prepare", str(tmp_path / "t.txt"), "--text-mode", "file", "--val-fraction", "0",
                                 "--out", str(tmp_path / "f"), "--workers", "1"])  # fmt: skip
    assert result.exit_code == EXIT_OK, result.output
    assert kept(tmp_path / "p") == kept(tmp_path / "f") and len(kept(tmp_path / "p")) == 1


# ---------------------------------------------------------------------------------------------
# Drops named by file.


def test_summary_names_the_files_with_the_most_drops_per_reason(tmp_path):
    files = []
    for k, n_long in enumerate([2, 1, 3, 1, 1]):
        rows = [json.dumps({"text": "y" * 50})] * n_long + [json.dumps({"text": f"ok {k}"}), '{"text": ""}']
        files.append(write(tmp_path / "data" / f"f{k}.jsonl", "\n".join(rows) + "\n"))
    code, output = prepare_cli(tmp_path / "o", *map(str, files), "--max-chars", "20", "--workers", "1")
    assert code == EXIT_OK, output
    # 8 of 50 characters each, of the 420 read (and the 5 kept "ok k"): 95.2% of the characters
    assert f"too_long 8 (95.2% of the characters): {files[2]} (3), {files[0]} (2), {files[1]} (1) and 2 more " \
           "files" in output
    assert f"empty 5: {files[0]} (1), {files[1]} (1), {files[2]} (1) and 2 more files" in output
    assert f"first too_long: {files[0]}:1: 50 characters, over --max-chars 20" in output
    assert f"first empty: {files[0]}:4: no text left after cleaning" in output
    meta = meta_of(tmp_path / "o")
    assert meta["drop_examples"]["too_long"] == f"{files[0]}:1: 50 characters, over --max-chars 20"
    assert [s["dropped"]["too_long"] for s in meta["sources"]] == [2, 1, 3, 1, 1]


def test_too_short_example_names_file_and_line(tmp_path):
    path = write(tmp_path / "a.txt", "long enough line\nab\nanother long line\n")
    code, output = prepare_cli(tmp_path / "o", str(path), "--text-mode", "line", "--min-chars", "5")
    assert code == EXIT_OK and f"first too_short: {path}:2: 2 characters, under --min-chars 5" in output, output


# ---------------------------------------------------------------------------------------------
# OS errors and EOFError that escape the library: one line, exit 1, never a traceback.


def test_os_error_escaping_prepare_is_one_line(tmp_path, monkeypatch):
    import lmshard.prepare.execution.runplan as runplan  # (the walk of the inputs every prepare takes)

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "secret"))

    monkeypatch.setattr(runplan, "discover", denied)
    code, message = prepare_cli(tmp_path / "o", str(tmp_path))
    assert code == EXIT_ERROR
    assert message.endswith(f"error: {tmp_path / 'secret'}: Permission denied; check its permissions"), message


def test_eof_error_escaping_prepare_is_one_line_not_aborted(tmp_path, monkeypatch):
    import lmshard.prepare.execution.runplan as runplan

    def ended(*args, **kwargs):
        raise EOFError("Ran out of input")

    monkeypatch.setattr(runplan, "discover", ended)
    code, message = prepare_cli(tmp_path / "o", str(tmp_path))
    assert code == EXIT_ERROR and "error: the input ended unexpectedly (Ran out of input)" in message, message


def test_os_error_in_inspect_and_tokenizer_is_one_line(tmp_path, monkeypatch):
    import lmshard.tokenizers as tokenizers

    def broken(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error", str(tmp_path / "train" / "shard_000000.bin"))

    write(tmp_path / "ds" / "dataset_metadata.json", "{}")
    from lmshard.inspect import audit

    monkeypatch.setattr(audit, "require_dataset", broken)
    code, message = cli("inspect", str(tmp_path / "ds"))
    assert code == EXIT_ERROR and message == f"error: {tmp_path / 'train' / 'shard_000000.bin'}: Input/output error"
    monkeypatch.setattr(tokenizers, "load_tokenizer", broken)
    code, message = cli("tokenizer", "info", "gpt2")
    assert code == EXIT_ERROR and "Input/output error" in message


# ---------------------------------------------------------------------------------------------
# Option errors.


def test_stdin_that_is_not_json_lines_says_how_to_pass_text(tmp_path):
    result = runner.invoke(app, ["prepare", "-", "--out", str(tmp_path / "o"), "--workers", "1"],
                           input="just some plain text\nmore of it\n")  # fmt: skip
    assert result.exit_code == EXIT_ERROR and "Traceback" not in result.output
    message = " ".join(result.output.split())
    assert "-:1: invalid JSON" in message and "stdin is read as JSON lines" in message
    assert "--format text" in message and "--text-mode line or paragraph" in message


@pytest.mark.parametrize("planned", [[], ["--num-tasks", "2"]])
def test_compressed_data_on_stdin_or_under_a_plain_name_says_how_to_read_it(tmp_path, planned):
    """gzip, zstd, xz and bzip2 data read as it is (piped in, or a file without its suffix) is
    named by its magic bytes, with the fix: decompress it before the pipe, or name the file with
    the suffix prepare decompresses (it was "binary data (NUL byte...)": remove the file)."""
    import zstandard

    data = ('{"text": "a document about rivers and the sea"}\n' * 50).encode()
    packed = {"gzip": (gzip.compress(data), ".gz", "zcat"), "xz": (lzma.compress(data), ".xz", "xzcat"),
              "zstd": (zstandard.ZstdCompressor().compress(data), ".zst", "zstdcat"),
              "bzip2": (bz2.compress(data), ".bz2", "bzcat")}  # fmt: skip
    for codec, (raw, suffix, tool) in packed.items():
        out = str(tmp_path / f"o_{codec}")
        result = runner.invoke(app, ["prepare", "-", "--out", out, "--workers", "1", *planned], input=raw)
        message = " ".join(result.output.split())
        assert result.exit_code == EXIT_ERROR and "Traceback" not in result.output, result.output
        assert f"-:1: {codec}-compressed data, read as it is; decompress it before the pipe ({tool} FILE{suffix} |" \
            in message, message
        src = tmp_path / f"{codec}.jsonl"  # (the suffix says plain JSON lines)
        src.write_bytes(raw)
        result = runner.invoke(app, ["prepare", str(src), "--out", out, "--workers", "1", *planned])
        message = " ".join(result.output.split())
        assert result.exit_code == EXIT_ERROR, result.output
        assert f"{src}:1: {codec}-compressed data, read as it is; name the file with the suffix {suffix}" in message
    twice = tmp_path / "twice.jsonl.gz"  # (read decompressed once by its suffix: gzip data still)
    twice.write_bytes(gzip.compress(packed["gzip"][0]))
    result = runner.invoke(app, ["prepare", str(twice), "--out", str(tmp_path / "o_twice"), "--workers", "1", *planned])
    message = " ".join(result.output.split())
    assert result.exit_code == EXIT_ERROR and f"{twice}:1: gzip-compressed data once decompressed (compressed " \
        "twice); decompress it once (zcat)" in message, message
    plain = tmp_path / "BZh.jsonl"  # text that starts as bzip2 data does is text
    plain.write_text('{"text": "BZh9 is how a bzip2 file starts, and this is a sentence"}\n')
    result = runner.invoke(app, ["prepare", str(plain), "--out", str(tmp_path / "plain"), "--workers", "1",
                                 "--val-fraction", "0", *planned])  # fmt: skip
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("args", "words"), [
    (["--hf", "./typo_dir"], "--hf ./typo_dir: no such directory"),
    (["--hf", "~/nowhere/data"], "--hf ~/nowhere/data: no such directory"),
    (["--hf", "corpora/web/part1"], "--hf corpora/web/part1: no such directory"),
    (["--hf", "train.parquet"], "--hf train.parquet: no such directory"),
    (["--hf", "some/ds", "--hf-tasks", "0"], "--hf-tasks must be at least 1 (got 0)"),
    (["--hf", "some/ds", "--hf-tasks", "3", "--hf-task", "3"], "--hf-task must be in [0, 3) for --hf-tasks 3 (got 3)"),
    (["--hf", "some/ds", "--hf-task", "-1"], "--hf-task must be in [0, 1)"),
    (["x.txt", "--hf-tasks", "2"], "--hf-task/--hf-tasks split only the --hf stream, and there is no --hf"),
    (["x.txt", "--hf-task", "1", "--hf-tasks", "2"], "there is no --hf"),
    (["x.txt", "--format", "xml"], "--format must be one of text, jsonl, json, csv, parquet, arrow (got 'xml')"),
    (["x.txt", "--text-mode", "pages"], "--text-mode must be one of auto, file, line, paragraph (got 'pages')"),
])  # fmt: skip
def test_bad_option_is_one_line_exit_1(tmp_path, monkeypatch, no_network, args, words):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "x.txt", "text")
    code, message = cli("prepare", *args, "--out", str(tmp_path / "o"))
    assert code == EXIT_ERROR and words in message, message
    assert "cannot reach the Hugging Face hub" not in message
    assert no_network == []  # refused before anything tried the hub
    assert not (tmp_path / "o").exists()


def test_hf_given_a_file_says_pass_it_as_an_input(tmp_path):
    path = write(tmp_path / "rows.parquet", b"PAR1")
    code, message = cli("prepare", "--hf", str(path), "--out", str(tmp_path / "o"))
    assert code == EXIT_ERROR and f"--hf {path}: a file, not a directory; pass it as an input" in message


def test_a_damaged_parquet_row_group_is_named_as_the_inputs_not_outs(tmp_path):
    """Damage inside a row group's compressed data (pyarrow: an OSError with no errno) is the
    file's fault: it names the file and the row group, and offers no --resume of --out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    table = pa.table({"text": texts(200)})
    pq.write_table(table, path, compression="snappy", use_dictionary=False, row_group_size=100)
    column = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    middle = column.data_page_offset + column.total_compressed_size // 2  # inside the page's snappy data
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    path.write_bytes(bytes(data))
    out = tmp_path / "o"
    code, message = cli("prepare", str(path), "--out", str(out), "--workers", "2")
    assert code == EXIT_ERROR
    error = message[message.index("error: ") :]
    assert error.startswith(f"error: {path}: row group 1: not readable parquet data (Corrupt snappy compressed data")
    assert error.endswith("; re-create the file"), error
    assert f"{out}:" not in error and "--resume" not in error and "kept in" not in error
    assert not (tmp_path / ".o.lmshard-partial").exists()


@pytest.mark.parametrize("args", [["--max-chars", "many"], ["--no-such-option"], []])
def test_malformed_command_line_is_exit_usage(tmp_path, args):
    result = runner.invoke(app, ["prepare", "x.txt", "--out", str(tmp_path / "o"), *args] if args else ["nope"])
    assert result.exit_code == EXIT_USAGE and "Usage" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("field", "value", "words"), [
    ("max_chars", "10", "'max_chars' must be a whole number (got '10')"),
    ("val_fraction", "0.1", "'val_fraction' must be a number (got '0.1')"),
    ("workers", 1.5, "'workers' must be a whole number (got 1.5)"),
    ("dedup_lines", "yes", "'dedup_lines' must be true or false (got 'yes')"),
    ("exclude", [1], "'exclude' must be a list of strings (or one string) (got [1])"),
    ("hf_tasks", None, "'hf_tasks' must be a whole number (got None)"),
])  # fmt: skip
def test_prepare_config_built_directly_is_type_checked(field, value, words):
    with pytest.raises(ConfigError) as e:
        PrepareConfig(out="o", inputs=["a.txt"], **{field: value})
    assert str(e.value) == f"PrepareConfig field {words}"


def test_prepare_config_normalises_what_it_can():
    cfg = PrepareConfig(out="o", inputs="a.txt", tokens_per_shard=1e6, val_fraction=0)  # type: ignore[arg-type]
    assert cfg.inputs == ["a.txt"] and cfg.tokens_per_shard == 1_000_000 and isinstance(cfg.val_fraction, float)


# ---------------------------------------------------------------------------------------------
# JSON leftovers and exit codes.


def test_json_file_of_json_lines_checks_utf8_and_counts_leading_blank_lines(tmp_path, reference):
    path = write(tmp_path / "l.json", b'\n\n{"text": "one"}\n{"text": "caf\xe9"}\n{"text": "three"}\n')
    code, message = prepare_cli(tmp_path / "f", str(path), "--workers", "1")
    assert code == EXIT_ERROR and f"{path}:4: line 4 is not valid UTF-8" in message, message
    code, output = prepare_cli(tmp_path / "s", str(path), "--workers", "1", "--on-error", "skip")
    assert code == EXIT_OK and kept(tmp_path / "s") == encoded(reference, ["one", "three"])
    assert meta_of(tmp_path / "s")["drop_examples"]["decode_error"] == f"{path}:4: line 4 is not valid UTF-8"


@pytest.mark.parametrize(("body", "words"), [
    ('[\n{"text": "a"},\n\n{"text": nope},\n{"text": "c"}\n]', ":4: record 2: invalid JSON (Expecting value)"),
    ('\ufeff[{"text": "a"}, {"text": "b"}', ":1: record 3: the file ends before the array is closed"),
])  # fmt: skip
def test_bad_json_array_element_says_why_skip_cannot_apply(tmp_path, body, words):
    path = write(tmp_path / "a.json", body)
    for on_error in ("fail", "skip"):
        code, message = prepare_cli(tmp_path / on_error, str(path), "--on-error", on_error, "--workers", "1")
        assert code == EXIT_ERROR and f"{path}{words}" in message, message
        assert "--on-error skip cannot skip it" in message and "convert it to JSON lines" in message


def test_inspect_exit_codes(tmp_path):
    write(tmp_path / "a.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts(50)))
    assert prepare_cli(tmp_path / "ds", str(tmp_path / "a.jsonl"), "--workers", "1")[0] == EXIT_OK
    assert cli("inspect", str(tmp_path / "ds"))[0] == EXIT_OK
    shard = tmp_path / "ds" / "train" / "shard_000000.bin"
    tokens = np.fromfile(shard, dtype=np.uint32)
    tokens[3] = GPT2_EOT + 7  # an id outside the vocabulary
    tokens.tofile(shard)
    code, message = cli("inspect", str(tmp_path / "ds"))
    assert code == EXIT_CORRUPT and "CORRUPT" in message
    code, message = cli("inspect", str(tmp_path / "nowhere"))
    assert code == EXIT_ERROR and "no such directory" in message
