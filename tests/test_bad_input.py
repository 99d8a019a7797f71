"""Bad input: a one-line error naming file and record under --on-error fail (the default),
a counted skip under --on-error skip; the real CLI exits 1 with no traceback."""

from __future__ import annotations

import gzip
import json

import pytest
from conftest import read_docs, write
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import InputError
from lmshard.prepare import PrepareConfig, prepare

GOOD = '{"text": "good one"}\n'
BAD_INPUTS = {
    "utf8.jsonl": (GOOD.encode() + b'{"text": "caf\xe9"}\n', "utf8.jsonl:2", "decode_error"),
    "json.jsonl": (GOOD + '{"text": "unterminated\n', "json.jsonl:2", "json_error"),
    "field.jsonl": (GOOD + '{"body": "wrong field"}\n', "field.jsonl:2", "missing_field"),
    "notobj.jsonl": (GOOD + "[1, 2]\n", "notobj.jsonl:2", "not_an_object"),
    "utf8.txt": (b"caf\xe9 au lait", "utf8.txt:1", "decode_error"),
    "binary.txt": (b"\x7fELF\x00\x01\x02" * 20, "binary.txt", "binary_file"),
    "binary.jsonl": (b"\x00\x01\x02\x03" * 20, "binary.jsonl", "binary_file"),
}


def run(tmp_path, name, **kw):
    kw.setdefault("allow_empty", True)  # these inputs hold one bad record and nothing else
    return prepare(PrepareConfig(inputs=[str(tmp_path / name)], out=str(tmp_path / "out"), workers=1, **kw)).to_json()


@pytest.mark.parametrize("name", [n for n, v in BAD_INPUTS.items() if v[1]])
def test_fail_names_file_and_record(tmp_path, name):
    data, where, _ = BAD_INPUTS[name]
    write(tmp_path / name, data)
    with pytest.raises(InputError) as e:
        run(tmp_path, name)
    message = str(e.value)
    assert where in message and "\n" not in message
    assert "--on-error skip" in message


@pytest.mark.parametrize("name", [n for n, v in BAD_INPUTS.items() if v[2]])
def test_skip_counts_the_record(tmp_path, name):
    data, _, reason = BAD_INPUTS[name]
    write(tmp_path / name, data)
    meta = run(tmp_path, name, on_error="skip")
    assert meta["drops"][reason] == 1
    assert reason in meta["drop_examples"]
    assert meta["n_docs"] == (0 if name.startswith("binary") or name.endswith(".txt") else 1)


def test_empty_file_is_counted_not_fatal(tmp_path):
    write(tmp_path / "empty.jsonl", b"")
    write(tmp_path / "empty.txt", b"")
    meta = prepare(PrepareConfig(inputs=[str(tmp_path / "empty.jsonl"), str(tmp_path / "empty.txt")],
                                 out=str(tmp_path / "out"), workers=1, allow_empty=True)).to_json()  # fmt: skip
    assert meta["n_docs"] == 0
    assert [s["records"] for s in meta["sources"]] == [0, 1]
    assert meta["drops"]["empty"] == 1


@pytest.mark.parametrize("block", [7, 100, 1 << 20])
def test_line_numbers_are_right_in_any_work_item(tmp_path, monkeypatch, block):
    """Line 57 is named as line 57 whichever work item it falls in, failing and skipping."""
    import lmshard.prepare.sources as sources

    monkeypatch.setattr(sources, "BLOCK_BYTES", block)
    lines = [json.dumps({"text": f"document number {i}"}) for i in range(100)]
    lines[56] = '{"text": broken'
    write(tmp_path / "bad.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(InputError, match="bad.jsonl:57: invalid JSON"):
        run(tmp_path, "bad.jsonl")
    meta = run(tmp_path, "bad.jsonl", on_error="skip")
    assert meta["drop_examples"]["json_error"].startswith(f"{tmp_path / 'bad.jsonl'}:57: invalid JSON")
    assert meta["n_docs"] == 99 and meta["records_read"] == 100


def test_gigantic_line_is_refused(tmp_path, monkeypatch):
    import lmshard.prepare.sources as sources

    monkeypatch.setattr(sources, "MAX_RECORD_BYTES", 1000)
    monkeypatch.setattr(sources, "BLOCK_BYTES", 256)
    write(tmp_path / "big.jsonl", GOOD + json.dumps({"text": "x" * 5000}) + "\n")
    with pytest.raises(InputError, match="big.jsonl:2: a record longer than"):
        run(tmp_path, "big.jsonl")


def test_missing_parquet_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a", "b"]}), tmp_path / "x.parquet")
    with pytest.raises(InputError, match="no column 'text' .*--text-field"):
        run(tmp_path, "x.parquet")


def test_lone_surrogates_replaced(tmp_path, reference):
    """JSON escapes can spell lone surrogates, which UTF-8 cannot hold: each becomes U+FFFD."""
    write(tmp_path / "s.jsonl", '{"text": "a\\ud800b"}\n{"text": "\\udfffc\\ud83d"}\n')
    meta = run(tmp_path, "s.jsonl", val_fraction=0.0)
    assert meta["n_docs"] == 2
    docs = read_docs(tmp_path / "out", "train")
    assert [reference.decode(d[:-1].tolist()) for d in docs] == ["a\ufffdb", "\ufffdc\ufffd"]


def test_unknown_suffix(tmp_path):
    write(tmp_path / "x.docx", b"zz")
    with pytest.raises(InputError, match="unknown file type"):
        run(tmp_path, "x.docx")


runner = CliRunner()


def test_cli_bad_input_exit_1_one_line_no_traceback(tmp_path):
    write(tmp_path / "bad.jsonl.gz", gzip.compress(b'{"text": "ok"}\n{nope\n'))
    result = runner.invoke(app, ["prepare", str(tmp_path / "bad.jsonl.gz"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    text = result.output.strip()
    assert "bad.jsonl.gz:2: invalid JSON" in text and "Traceback" not in text
    assert "--on-error skip" in text


def test_cli_missing_input_and_out(tmp_path):
    result = runner.invoke(app, ["prepare", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1 and "no input files found" in result.output
    result = runner.invoke(app, ["prepare", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 1 and "missing --out" in result.output


def test_csv_invalid_utf8_row(tmp_path):
    write(tmp_path / "a.csv", b"id,text\n1,fine\n2,caf\xe9\n3,also fine\n")
    with pytest.raises(InputError, match="a.csv:3"):
        run(tmp_path, "a.csv")
    meta = run(tmp_path, "a.csv", on_error="skip")
    assert meta["drops"]["decode_error"] == 1 and meta["n_docs"] == 2


def test_full_disk_is_one_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    import errno

    from lmshard.errors import LmshardError
    from lmshard.prepare.writer import ShardWriter

    def full(self, tokens, ends):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "train" / "shard_000000.bin.tmp"))

    monkeypatch.setattr(ShardWriter, "_write", full)
    write(tmp_path / "a.jsonl", GOOD * 3)
    with pytest.raises(LmshardError, match="no space left on the device; free space"):
        run(tmp_path, "a.jsonl")
    assert not list((tmp_path / "out").rglob("*.bin*")) and not (tmp_path / "out" / "dataset_metadata.json").exists()


def test_bad_utf8_paragraph_is_one_record_not_the_block(tmp_path, reference):
    parts = [f"paragraph {i} text".encode() for i in range(200)]
    parts[57] = b"bad \xff byte"
    write(tmp_path / "p.txt", b"\n\n".join(parts) + b"\n")
    meta = run(tmp_path, "p.txt", text_mode="paragraph", on_error="skip", val_fraction=0.0)
    assert meta["drops"]["decode_error"] == 1 and meta["n_docs"] == 199
    assert meta["drop_examples"]["decode_error"].endswith("p.txt:115: invalid UTF-8 in the paragraph at line 115")
    docs = [d[:-1].tolist() for d in read_docs(tmp_path / "out", "train")]
    assert docs == [reference.encode_ordinary(f"paragraph {i} text") for i in range(200) if i != 57]
    with pytest.raises(InputError, match="p.txt:115: invalid UTF-8"):
        run(tmp_path, "p.txt", text_mode="paragraph", overwrite=True)
