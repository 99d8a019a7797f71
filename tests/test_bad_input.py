"""Bad input: a one-line error naming file and record under --on-error fail (the default),
a counted skip under --on-error skip; the real CLI exits 1 with no traceback. Files in the
encodings users really have: a UTF-8 byte-order mark is read as if absent, UTF-16 and UTF-32
are refused with the command that re-encodes them."""

from __future__ import annotations

import gzip
import io
import json

import pytest
import zstandard
from conftest import read_docs, write
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import InputError
from lmshard.prepare import PrepareConfig, prepare

GOOD = '{"text": "good one"}\n'
TEXT = "good one\nand a second line of it\n"


def _columnar(kind: str, values: list, row_group_size: int | None = None) -> bytes:
    """A parquet or arrow file holding one column, "text", as bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table, buf = pa.table({"text": values}), io.BytesIO()
    if kind == "parquet":
        pq.write_table(table, buf, row_group_size=row_group_size)
    else:
        with pa.ipc.new_file(buf, table.schema) as writer:
            writer.write_table(table)
    return buf.getvalue()


# name → (bytes, where the error points, the drop reason under --on-error skip, documents kept then)
BAD_INPUTS = {
    "utf8.jsonl": (GOOD.encode() + b'{"text": "caf\xe9"}\n', "utf8.jsonl:2", "decode_error", 1),
    "json.jsonl": (GOOD + '{"text": "unterminated\n', "json.jsonl:2", "json_error", 1),
    "field.jsonl": (GOOD + '{"body": "wrong field"}\n', "field.jsonl:2", "missing_field", 1),
    "notobj.jsonl": (GOOD + "[1, 2]\n", "notobj.jsonl:2", "not_an_object", 1),
    "utf8.txt": (b"caf\xe9 au lait", "utf8.txt:1", "decode_error", 0),
    "binary.txt": (b"\x7fELF\x00\x01\x02" * 20, "binary.txt", "binary_file", 0),
    "binary.jsonl": (b"\x00\x01\x02\x03" * 20, "binary.jsonl", "binary_file", 0),
    # #29: messages of every JSON error read "... at column N" (Python's own ends some with "at")
    "control.jsonl": (GOOD + '{"text": "a\tb"}\n', "control.jsonl:2", "json_error", 1),
    "unterminated.jsonl": (GOOD + '{"text": "no end}\n' + GOOD, "unterminated.jsonl:2", "json_error", 1),
    # #29: a text field that is there but is not a string is `wrong_type`, not `missing_field`
    "number.jsonl": (GOOD + '{"text": 42}\n', "number.jsonl:2", "wrong_type", 1),
    "null.jsonl": (GOOD + '{"text": null}\n', "null.jsonl:2", "wrong_type", 1),
    "list.jsonl": (GOOD + '{"text": ["a", "b"]}\n', "list.jsonl:2", "wrong_type", 1),
    "object.json": ('[{"text": "good one"}, {"text": {"a": 1}}]', "object.json:2", "wrong_type", 1),
    "short.csv": ("id,text\n1,good one\n2\n", "short.csv:3", "missing_field", 1),
    # #29: parquet and arrow rows are numbered from 1 (as lines are), across row groups; null is "null"
    "null.parquet": (_columnar("parquet", ["good one", None]), "null.parquet:2", "wrong_type", 1),
    "groups.parquet": (_columnar("parquet", ["one a", "two b", "three c", None, "five e"], row_group_size=2),
                       "groups.parquet:4", "wrong_type", 4),  # fmt: skip
    "int.parquet": (_columnar("parquet", [7]), "int.parquet:1", "wrong_type", 0),
    "null.arrow": (_columnar("arrow", ["good one", None]), "null.arrow:2", "wrong_type", 1),
    # #29: UTF-16 and UTF-32 (PowerShell's `>` writes UTF-16 LE) are named, with how to re-encode
    "utf16le.txt": (TEXT.encode("utf-16"), "utf16le.txt:1", "wrong_encoding", 0),
    "utf16be.txt": (b"\xfe\xff" + TEXT.encode("utf-16-be"), "utf16be.txt:1", "wrong_encoding", 0),
    "utf16le.jsonl": ((GOOD * 3).encode("utf-16"), "utf16le.jsonl:1", "wrong_encoding", 0),
    "utf32le.jsonl": ((GOOD * 3).encode("utf-32"), "utf32le.jsonl:1", "wrong_encoding", 0),
    "utf32be.jsonl": (b"\x00\x00\xfe\xff" + (GOOD * 3).encode("utf-32-be"), "utf32be.jsonl:1", "wrong_encoding", 0),
    "utf16.csv": ("text,id\ngood one,1\n".encode("utf-16"), "utf16.csv:1", "wrong_encoding", 0),
    "utf16.json": ('[{"text": "good one"}]'.encode("utf-16"), "utf16.json:1", "wrong_encoding", 0),
    "utf16.jsonl.gz": (gzip.compress((GOOD * 3).encode("utf-16")), "utf16.jsonl.gz:1", "wrong_encoding", 0),
    "nomark.txt": ((TEXT * 4).encode("utf-16-le"), "nomark.txt:1", "wrong_encoding", 0),  # UTF-16 with no mark
}


def run(tmp_path, name, **kw):
    kw.setdefault("allow_empty", True)  # these inputs hold one bad record and nothing else
    return prepare(PrepareConfig(inputs=[str(tmp_path / name)], out=str(tmp_path / "out"), workers=1, **kw)).to_json()


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_fail_names_file_and_record(tmp_path, name):
    data, where, _, _ = BAD_INPUTS[name]
    write(tmp_path / name, data)
    with pytest.raises(InputError) as e:
        run(tmp_path, name)
    message = str(e.value)
    assert where in message and "\n" not in message
    assert "--on-error skip" in message
    assert " at at " not in message and "NoneType" not in message


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_skip_counts_the_record(tmp_path, name):
    data, _, reason, kept = BAD_INPUTS[name]
    write(tmp_path / name, data)
    meta = run(tmp_path, name, on_error="skip")
    assert meta["drops"][reason] == 1
    assert reason in meta["drop_examples"]
    assert meta["n_docs"] == kept


@pytest.mark.parametrize(("name", "words"), [
    ("utf16le.txt", "UTF-16 text (a little-endian byte-order mark), not UTF-8; re-encode it as UTF-8: iconv -f UTF-16 "
                    "-t UTF-8 {path} > {dir}/utf16le.utf8.txt (in Python: read it with encoding='utf-16'"),
    ("utf32be.jsonl", "UTF-32 text (a big-endian byte-order mark), not UTF-8; re-encode it as UTF-8: iconv -f UTF-32"),
    ("nomark.txt", "UTF-16LE text (no byte-order mark, NUL bytes between ASCII letters), not UTF-8; re-encode it as "
                   "UTF-8: iconv -f UTF-16LE -t UTF-8"),
    ("utf16.jsonl.gz", "UTF-16 text (a little-endian byte-order mark), not UTF-8; decompress it, re-encode it as UTF-8 "
                       "(iconv -f UTF-16 -t UTF-8) and compress it again"),
])  # fmt: skip
def test_a_utf16_or_utf32_file_says_how_to_re_encode_it_not_to_remove_it(tmp_path, name, words):
    write(tmp_path / name, BAD_INPUTS[name][0])
    with pytest.raises(InputError) as e:
        run(tmp_path, name)
    assert words.format(path=tmp_path / name, dir=tmp_path) in str(e.value)
    assert "binary" not in str(e.value) and "remove the file" not in str(e.value)


BOM = b"\xef\xbb\xbf"
# name → (the file as saved with a UTF-8 byte-order mark, the same file without it)
BOM_INPUTS = {
    "bom.jsonl": (BOM + (GOOD * 2).encode(), (GOOD * 2).encode()),
    "bom.txt": (BOM + TEXT.encode(), TEXT.encode()),  # one document
    "bom.md": (BOM + b"# title\n\nbody text\n", b"# title\n\nbody text\n"),
    "excel.csv": (BOM + b"text,id\r\ngood one,1\r\n", b"text,id\r\ngood one,1\r\n"),  # Excel's "CSV UTF-8"
    "bom.json": (BOM + b'[{"text": "good one"}]', b'[{"text": "good one"}]'),
    "bom.jsonl.gz": (gzip.compress(BOM + GOOD.encode()), gzip.compress(GOOD.encode())),
    "excel.csv.zst": (zstandard.compress(BOM + b"text\ngood one\n"), zstandard.compress(b"text\ngood one\n")),
    "joined.jsonl": ((BOM + GOOD.encode()) * 3, GOOD.encode() * 3),  # files with marks joined by `cat`
}


@pytest.mark.parametrize("on_error", ["fail", "skip"])
@pytest.mark.parametrize("name", list(BOM_INPUTS))
def test_a_utf8_byte_order_mark_is_read_as_if_absent(tmp_path, reference, name, on_error):
    """The mark is neither refused, nor a lost first record under --on-error skip, nor part of
    the first column's name or the first document's text."""
    marked, plain = BOM_INPUTS[name]
    runs = []
    for sub, data in (("marked", marked), ("plain", plain)):
        write(tmp_path / sub / name, data)
        meta = run(tmp_path / sub, name, on_error=on_error, val_fraction=0.0)
        runs.append((meta["n_docs"], meta["records_read"], meta["drops"], read_docs(tmp_path / sub / "out", "train")))
    (n, records, drops, docs), (n_plain, records_plain, drops_plain, docs_plain) = runs
    assert (n, records, drops) == (n_plain, records_plain, drops_plain) and n > 0
    assert [d.tolist() for d in docs] == [d.tolist() for d in docs_plain]
    assert reference.encode_ordinary("\ufeff")[0] not in docs[0].tolist()


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
    import lmshard.prepare.documents.sources as sources

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
    import lmshard.prepare.documents.sources as sources

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
    from lmshard.prepare.execution.run import Run

    real = Run.do

    def full(self, stage, i, *a, **kw):
        if stage == "write":
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".out.lmshard-partial" / "train"))
        return real(self, stage, i, *a, **kw)

    monkeypatch.setattr(Run, "do", full)
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


def test_a_folder_of_the_users_train_and_val_is_foreign_not_an_unfinished_run(tmp_path):
    """Only lmshard's own files (a shard, a key file, its run record) make a folder of its names
    an unfinished run that --overwrite may replace; the user's train/ and val/ are left alone."""
    from lmshard.errors import ConfigError

    write(tmp_path / "a.jsonl", GOOD * 3)
    out = tmp_path / "data"
    write(out / "train" / "part1.txt", "the user's own text")
    (out / "val").mkdir()
    for overwrite in (False, True):
        with pytest.raises(ConfigError) as e:
            prepare(PrepareConfig(inputs=[str(tmp_path / "a.jsonl")], out=str(out), workers=1, overwrite=overwrite))
        assert str(e.value) == f"{out}: not empty and not an lmshard dataset (train, val); choose an empty or new --out"
    assert (out / "train" / "part1.txt").read_text() == "the user's own text"
    write(out / "train" / "shard_000000.bin", b"")  # what an older lmshard, killed while writing in place, left
    with pytest.raises(ConfigError, match="holds an unfinished prepare run; pass --overwrite"):
        prepare(PrepareConfig(inputs=[str(tmp_path / "a.jsonl")], out=str(out), workers=1))
