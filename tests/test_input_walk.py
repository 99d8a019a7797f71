"""What a directory input means (#27, #29): the walk reads the files of known types, skips
hidden entries (unless --include-hidden), lmshard's own datasets and work directories and files
of unknown types, counts each by reason in the summary, --json and the metadata, and names
--format text when the skipped files look like text. Counts are checked against the files each
test made by hand; tokens against tiktoken's own encoding of those files."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import GPT2_EOT, read_docs, write
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.format import METADATA_FILE, parse_metadata
from lmshard.prepare import PrepareConfig, prepare

runner = CliRunner()
NOTHING_SKIPPED = {"unknown_type": {}, "hidden_files": 0, "hidden_dirs": 0, "lmshard": 0, "excluded": 0,
                   "unreadable_dirs": 0, "text_like": []}  # fmt: skip
MAN_PAGE = ".TH LS{0} 1\n.SH NAME\nls{0} \\- list directory contents\n.SH DESCRIPTION\nList the FILEs of {0}.\n"


def cli(*args: str | Path) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of the real command, each on one line."""
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, " ".join(result.stdout.split()), " ".join(result.stderr.split())


def prepare_json(inputs: list[Path], out: Path, *flags: str) -> dict:
    code, stdout, stderr = cli("prepare", *inputs, "--out", out, "--val-fraction", "0", "--json", *flags)
    assert code == 0, stderr
    return json.loads(stdout)


def metadata(out: Path) -> dict:
    return json.loads((out / METADATA_FILE).read_text())


def texts_of(out: Path, reference) -> list[str]:
    return [reference.decode(doc[:-1].tolist()) for doc in read_docs(out, "train") if doc[-1] == GPT2_EOT]


def man_pages(root: Path, n: int) -> list[str]:
    pages = [MAN_PAGE.format(i) for i in range(n)]
    for i, page in enumerate(pages):
        write(root / f"ls{i}.1.gz", gzip.compress(page.encode()))
    return pages


def test_a_folder_of_man_pages_names_the_suffix_and_format_text_reads_it(tmp_path, reference):
    pages = man_pages(tmp_path / "man", 5)
    code, _, err = cli("prepare", tmp_path / "man", "--out", tmp_path / "o")
    assert code == 1
    assert f"{tmp_path / 'man'}: nothing to read: skipped 5 files of unknown type (.1.gz 5)" in err
    assert "the skipped .1.gz files look like text: pass --format text" in err
    assert "check the path" not in err and "no input files found" not in err
    summary = prepare_json([tmp_path / "man"], tmp_path / "o", "--format", "text")
    assert summary["n_docs"] == 5 and summary["skipped_inputs"] == NOTHING_SKIPPED
    assert texts_of(tmp_path / "o", reference) == pages  # sorted by path: ls0 .. ls4


def documentation_folder(root: Path) -> dict[str, str]:
    """3 files of known types, 3 HTML pages, a PNG, a README without a suffix, a hidden file and
    a .git directory; returns the texts of the known ones by name."""
    known = {"a.md": "# Guide\n\nread me first", "b.txt": "plain notes", "c.rst": "Title\n=====\n\nbody"}
    for name, text in known.items():
        write(root / name, text)
    for i in range(3):
        write(root / "html" / f"page{i}.html", f"<html><body>page {i}</body></html>\n")
    write(root / "img" / "logo.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00")
    write(root / "README", "the readme, in plain text\n")
    write(root / ".notes.txt", "a hidden note")
    write(root / ".git" / "description.txt", "git internals")
    return known


def test_a_documentation_folder_counts_what_was_skipped_by_suffix(tmp_path, reference):
    known = documentation_folder(tmp_path / "docs")
    code, out, err = cli("prepare", tmp_path / "docs", "--out", tmp_path / "o", "--val-fraction", "0")
    assert code == 0, err
    expected = {**NOTHING_SKIPPED, "unknown_type": {".html": 3, "(none)": 1, ".png": 1}, "hidden_files": 1,
                "hidden_dirs": 1, "text_like": [".html", "(none)"]}  # fmt: skip
    assert sorted(texts_of(tmp_path / "o", reference)) == sorted(known.values())
    assert metadata(tmp_path / "o")["skipped_inputs"] == expected
    for part in ("3 .html,", "1 (none),", "1 .png (unknown type),", "1 hidden dir,", "1 hidden file"):
        assert part in out  # the summary's "skipped" row
    # 4 skipped files look like text and 3 were read: the warning and the summary name the
    # text-like suffixes and the fix, leaving out the binary one.
    assert "warning: skipped 5 files of unknown type (.html 3, (none) 1, .png 1)" in err
    hint = "the skipped .html, suffix-less files look like text: pass --format text --exclude '*.png' to read them"
    assert hint in err and f"hint: {hint}" in out
    summary = prepare_json([tmp_path / "docs"], tmp_path / "o2", "--format", "text", "--exclude", "*.png")
    assert summary["n_docs"] == 3 + 3 + 1
    assert summary["skipped_inputs"] == {**expected, "unknown_type": {}, "text_like": [], "excluded": 1}


def test_a_few_skipped_text_files_beside_many_read_ones_are_counted_without_a_warning(tmp_path):
    for i in range(3):
        write(tmp_path / "d" / f"{i}.txt", f"note {i}")
    write(tmp_path / "d" / "index.html", "<p>one page</p>")
    code, out, err = cli("prepare", tmp_path / "d", "--out", tmp_path / "o", "--val-fraction", "0")
    assert code == 0 and "warning" not in err and "hint" not in out and "1 .html (unknown type)" in out
    assert metadata(tmp_path / "o")["skipped_inputs"]["text_like"] == [".html"]


def test_a_dataset_written_inside_its_input_folder_is_not_read_back(tmp_path, reference):
    docs = tmp_path / "docs"
    known = {"a.txt": "alpha document", "b.md": "bravo document"}
    for name, text in known.items():
        write(docs / name, text)
    first = prepare_json([docs], docs / "ds")
    again = prepare_json([docs], docs / "ds2")
    assert first["n_docs"] == again["n_docs"] == 2 and again["skipped_inputs"]["lmshard"] == 1
    assert [s["path"] for s in metadata(docs / "ds2")["sources"]] == [str(docs / "a.txt"), str(docs / "b.md")]
    assert texts_of(docs / "ds2", reference) == list(known.values())
    # Neither --format text (which takes every file) nor --include-hidden reads the datasets back.
    third = prepare_json([docs], docs / "ds3", "--format", "text", "--include-hidden")
    assert third["n_docs"] == 2 and third["skipped_inputs"]["lmshard"] == 2
    assert prepare_json([docs], docs / "ds", "--overwrite")["n_docs"] == 2


def project(root: Path) -> None:
    write(root / "README.md", "the project readme")
    write(root / "notes.txt", "design notes")
    write(root / ".git" / "HEAD", "ref: refs/heads/main\n")
    write(root / ".git" / "hooks" / "pre-commit.sample", "#!/bin/sh\nexit 0\n")
    write(root / ".venv" / "lib" / "site.py", "import sys  # a virtualenv's module")
    write(root / ".cache" / "pip" / "notes.md", "a cache entry")
    write(root / ".env.txt", "SECRET=1")


def test_hidden_directories_are_skipped_and_counted_and_include_hidden_takes_them(tmp_path, reference):
    project(tmp_path / "p")
    summary = prepare_json([tmp_path / "p"], tmp_path / "o")
    assert texts_of(tmp_path / "o", reference) == ["the project readme", "design notes"]
    assert summary["skipped_inputs"] == {**NOTHING_SKIPPED, "hidden_files": 1, "hidden_dirs": 3}
    summary = prepare_json([tmp_path / "p"], tmp_path / "all", "--include-hidden")
    names = [str(Path(s["path"]).relative_to(tmp_path / "p")) for s in metadata(tmp_path / "all")["sources"]]
    assert names == [".cache/pip/notes.md", ".env.txt", ".venv/lib/site.py", "README.md", "notes.txt"]
    assert summary["skipped_inputs"]["unknown_type"] == {"(none)": 1, ".sample": 1}  # .git/HEAD, the hook
    assert summary["skipped_inputs"]["hidden_dirs"] == summary["skipped_inputs"]["hidden_files"] == 0


def test_files_named_explicitly_are_read_hidden_or_not(tmp_path, reference):
    write(tmp_path / ".hidden" / ".note.txt", "named on purpose")
    summary = prepare_json([tmp_path / ".hidden" / ".note.txt"], tmp_path / "o")
    assert summary["n_docs"] == 1 and texts_of(tmp_path / "o", reference) == ["named on purpose"]
    assert prepare_json([tmp_path / ".hidden"], tmp_path / "o2", "--include-hidden")["n_docs"] == 1
    code, _, err = cli("prepare", tmp_path / ".hidden", "--out", tmp_path / "o3")
    assert code == 1 and "skipped 1 hidden file; pass --include-hidden" in err


def test_a_run_inside_its_input_records_the_same_skipped_inputs_resumed_or_not(tmp_path, small_items, monkeypatch):
    """--out inside the input directory: a run interrupted in its write stage and resumed (its
    build and work folder there when it walks the input again) records the skipped inputs of an
    uninterrupted run, which found neither (so does an --overwrite of it): the run's own are
    not counted."""
    import shutil

    from lmshard.prepare.execution.run import Run

    docs = tmp_path / "docs"
    for i in range(10):
        write(docs / f"{i:02d}.txt", f"document number {i} of the folder")
    shutil.copytree(docs, tmp_path / "copy")
    config = PrepareConfig(inputs=[str(docs)], out=str(docs / "ds"), workers=1, val_fraction=0)
    fresh = prepare(replace(config, inputs=[str(tmp_path / "copy")], out=str(tmp_path / "copy" / "ds"))).skipped_inputs
    real = Run.do
    with monkeypatch.context() as m:
        m.setattr(Run, "do", lambda r, stage, *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()) if stage == "write"
                  else real(r, stage, *a, **k))  # fmt: skip
        with pytest.raises(KeyboardInterrupt):
            prepare(config)
    assert (docs / ".ds.lmshard-partial").is_dir() and (docs / ".ds.lmshard-work").is_dir()
    resumed = prepare(replace(config, resume=True)).skipped_inputs
    assert resumed == fresh and fresh.lmshard == 0
    assert prepare(replace(config, overwrite=True)).skipped_inputs == fresh
    globbed = replace(config, inputs=[f"{docs}/*"], include_hidden=True)  # (its matches: the run's own folders too)
    with monkeypatch.context() as m:
        m.setattr(Run, "do", lambda r, stage, *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()) if stage == "write"
                  else real(r, stage, *a, **k))  # fmt: skip
        with pytest.raises(KeyboardInterrupt):
            prepare(replace(globbed, overwrite=True))
    assert prepare(replace(globbed, resume=True)).skipped_inputs == fresh


def test_a_killed_runs_partial_directory_inside_the_input_is_not_read(tmp_path, small_items, reference):
    docs = tmp_path / "docs"
    texts = [f"document number {i} of the folder" for i in range(10)]
    for i, text in enumerate(texts):
        write(docs / f"{i:02d}.txt", text)
    config = PrepareConfig(inputs=[str(docs)], out=str(docs / "ds"), workers=1, val_fraction=0)
    calls = []

    def ctrl_c(progress) -> None:  # a Ctrl-C after the second of four work items
        calls.append(progress)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare(config, ctrl_c)
    partial, work = docs / ".ds.lmshard-partial", docs / ".ds.lmshard-work"
    assert partial.is_dir() and (work / "plan.json").is_file()
    # Another run over the folder, reading every file as text, reads neither the build nor its work folder...
    for i, flags in enumerate([(), ("--include-hidden",)]):
        other = prepare_json([docs], tmp_path / f"other{i}", "--format", "text", *flags)
        assert texts_of(tmp_path / f"other{i}", reference) == texts and other["skipped_inputs"]["lmshard"] == 2
    # ...and the interrupted run resumes over the same inputs, to the same documents.
    resumed = prepare_json([docs], docs / "ds", "--resume")
    assert resumed["n_docs"] == 10 and texts_of(docs / "ds", reference) == texts
    assert not partial.exists() and not work.exists()


def test_a_json_file_holding_one_object_says_what_the_format_expects(tmp_path):
    write(tmp_path / "one.json", json.dumps({"text": "a document", "id": 7}, indent=2))
    code, _, err = cli("prepare", tmp_path / "one.json", "--out", tmp_path / "o")
    assert code == 1
    assert f"{tmp_path / 'one.json'}:1: one JSON object over lines 1-4, not one record per line" in err
    assert "a .json file holds an array of records ([{...}, {...}]) or JSON lines (one object per line)" in err
    assert "fix the line" not in err
    # A .json of JSON lines with a bad line: fix that line, and what the format is.
    write(tmp_path / "lines.json", '{"text": "good"}\n{"text": "cut\n')
    code, _, err = cli("prepare", tmp_path / "lines.json", "--out", tmp_path / "o")
    assert code == 1 and f"{tmp_path / 'lines.json'}:2: invalid JSON" in err
    assert "fix the line (a .json file holds an array of records" in err
    # One object on one line is one record, as before; under --on-error skip a spread one is counted.
    write(tmp_path / "flat.json", json.dumps({"text": "a document"}))
    assert prepare_json([tmp_path / "flat.json"], tmp_path / "flat")["n_docs"] == 1
    summary = prepare_json([tmp_path / "one.json", tmp_path / "flat.json"], tmp_path / "skip", "--on-error", "skip")
    assert summary["n_docs"] == 1 and summary["drops"] == {"not_records": 1}


def test_metadata_without_skipped_inputs_still_opens(tmp_path):
    from lmshard.format import SkippedInputs

    write(tmp_path / "a.txt", "one document")
    prepare_json([tmp_path / "a.txt"], tmp_path / "o")
    raw = metadata(tmp_path / "o")
    assert raw["skipped_inputs"] == NOTHING_SKIPPED
    del raw["skipped_inputs"]  # as lmshard wrote it before the field existed
    meta = parse_metadata(tmp_path / "o", raw)
    assert meta.skipped_inputs == SkippedInputs() and not meta.skipped_inputs


def test_text_is_told_from_binary_by_its_first_bytes(tmp_path):
    from lmshard.prepare.documents.walk import looks_like_text

    page = write(tmp_path / "ls.1.gz", gzip.compress(MAN_PAGE.format(1).encode()))
    png = write(tmp_path / "logo.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    latin1 = write(tmp_path / "old.txt", "caf\xe9 cr\xe8me".encode("latin-1"))
    empty = write(tmp_path / "empty.log", b"")
    assert looks_like_text([str(page)]) and looks_like_text([str(empty), str(page)])
    assert not looks_like_text([str(png)]) and not looks_like_text([str(page), str(png)])
    assert not looks_like_text([str(latin1)])  # lmshard reads UTF-8: --format text would fail on it
    assert not looks_like_text([str(empty)])  # no evidence either way


def _deny(monkeypatch, denied: Path) -> None:
    """`denied` cannot be listed or passed through, as a directory without r/x permission is for
    a user other than root (the suite may run as root, where chmod denies nothing)."""
    import os

    real_scandir, real_stat = os.scandir, os.stat

    def scandir(path=".", *args):
        if not isinstance(path, int) and Path(path) == denied:  # (an open directory's fd: shutil.rmtree's)
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path, *args)

    def stat(path, *args, **kwargs):
        if denied in Path(os.fspath(path)).parents:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "stat", stat)


def test_an_unreadable_directory_is_named_and_a_file_inside_it_says_why(tmp_path, monkeypatch):
    data = tmp_path / "data"
    write(data / "a.jsonl", json.dumps({"text": "one document"}) + "\n")
    write(data / "locked" / "b.jsonl", json.dumps({"text": "another document"}) + "\n")
    _deny(monkeypatch, data / "locked")
    code, out, err = cli("prepare", data, "--out", tmp_path / "o", "--workers", "1")
    assert code == 0, err
    said = " ".join(err.split())
    assert f"could not list {data / 'locked'} (Permission denied); their files are not read" in said, said
    code, out, err = cli("prepare", data / "locked" / "b.jsonl", "--out", tmp_path / "o2", "--workers", "1")
    said = " ".join(err.split())
    assert code == 1 and "cannot reach it (Permission denied)" in said and "no input files found" not in said, said


def test_a_large_pretty_printed_json_gz_is_one_not_records_not_thousands_of_bad_lines(tmp_path):
    """A .json.gz holding one pretty-printed object of several MiB (larger than what is sniffed)
    is one `not_records` record under --on-error skip, as a small one is: not a line-by-line read
    counting each of its 100,000 lines as a bad record."""
    import gzip

    obj = {"data": [{"text": f"document {i} " + "word " * 10, "id": i} for i in range(30_000)]}
    with gzip.open(tmp_path / "big.json.gz", "wt") as f:
        f.write(json.dumps(obj, indent=2))
    write(tmp_path / "flat.json", json.dumps({"text": "a document"}))
    summary = prepare_json([tmp_path / "big.json.gz", tmp_path / "flat.json"], tmp_path / "skip", "--on-error", "skip")
    assert summary["n_docs"] == 1 and summary["drops"] == {"not_records": 1}, summary["drops"]
    assert summary["records_read"] == 2


def test_the_format_text_hint_counts_suffixes_as_suffixes_and_can_be_pasted():
    """Many suffixes: "and those of N more suffixes", and an --exclude for every suffix that does
    not look like text, so the advice runs as printed."""
    from lmshard.format.skipped import SkippedInputs

    text = [f".t{i}" for i in range(8)]
    other = [f".b{i}" for i in range(6)]
    skipped = SkippedInputs(unknown_type={s: 5 for s in text + other}, text_like=text)
    hint = skipped.text_hint(files_read=1)
    assert hint is not None and "the skipped .t0, .t1, .t2 files (and those of 5 more suffixes) look like text" in hint
    assert hint.count("--exclude") == 6 and all(f"--exclude '*{s}'" in hint for s in other), hint
    assert "more files" not in hint


def test_an_input_can_carry_its_own_format(tmp_path):
    """`text:man/` reads that directory's files as text (their suffixes unknown), while a JSON
    lines file beside it is read as JSON lines: one run, each input in its format; a path that
    exists as written (a file named `text:x`) stays a path."""
    write(tmp_path / "a.jsonl", "".join(json.dumps({"text": f"json doc {i}"}) + "\n" for i in range(3)))
    for i in range(4):
        write(tmp_path / "man" / f"page{i}.1", f"NAME\n  tool{i} - does thing {i}\n")
    code, _, err = cli("prepare", tmp_path / "a.jsonl", tmp_path / "man", "--out", tmp_path / "plain")
    assert code == 1 and f"or read this input alone as text: text:{tmp_path / 'man'}" in err, err
    summary = prepare_json([tmp_path / "a.jsonl", f"text:{tmp_path / 'man'}"], tmp_path / "both")
    assert summary["n_docs"] == 3 + 4, summary
    meta = metadata(tmp_path / "both")
    assert {s["format"] for s in meta["sources"]} == {"jsonl", "text"}
    write(tmp_path / "text:odd.jsonl", json.dumps({"text": "a file with a colon in its name"}) + "\n")
    assert prepare_json([tmp_path / "text:odd.jsonl"], tmp_path / "odd")["n_docs"] == 1  # read as JSON lines


def test_a_format_prefix_keeps_an_inputs_checks_and_its_credentials_out_of_the_metadata(tmp_path):
    """`jsonl:URL` is recorded with the URL's credentials taken out, as the bare URL is (`text:-`
    is stdin to what one pass over stdin cannot do: test_reading.py)."""
    from lmshard.prepare import PrepareConfig

    url = "https://user:hunter2@example.com/x.jsonl?X-Amz-Signature=abc123"
    for spec in (url, f"jsonl:{url}"):
        recorded = PrepareConfig(inputs=[spec], out=str(tmp_path / "o")).recorded()["inputs"]
        assert "hunter2" not in recorded[0] and "abc123" not in recorded[0], recorded
    assert PrepareConfig(inputs=[f"jsonl:{url}"], out="o").recorded()["inputs"][0].startswith("jsonl:https://")



def test_a_quoted_glob_walks_the_directories_it_matches_as_the_shell_would(tmp_path):
    """`prepare 'g/*'`: a directory the glob matches is walked, as one named on the command line
    (the shell's expansion of the same glob gives the same dataset), not dropped unsaid."""
    write(tmp_path / "g" / "a.jsonl", '{"text": "top"}\n')
    write(tmp_path / "g" / "sub" / "c.jsonl", '{"text": "in sub"}\n')
    write(tmp_path / "g" / "sub" / "deeper" / "d.jsonl", '{"text": "deeper"}\n')
    quoted = prepare_json([tmp_path / "g" / "*"], tmp_path / "quoted")
    expanded = prepare_json(sorted((tmp_path / "g").iterdir()), tmp_path / "expanded")
    assert quoted["n_docs"] == expanded["n_docs"] == 3
    assert [d.tolist() for d in read_docs(tmp_path / "quoted", "train")] == \
        [d.tolist() for d in read_docs(tmp_path / "expanded", "train")]  # fmt: skip


def test_exclude_leaves_out_a_named_file_counted_and_says_when_it_matched_nothing(tmp_path):
    """A file named on the command line that --exclude matches is left out and counted (as a
    shell-expanded `DIR/* --exclude '*.png'` needs), not an error; every input left out is one;
    a pattern that matched no file (a directory's bare path) is said, with the way to write it."""
    a = write(tmp_path / "t" / "a.jsonl", '{"text": "kept"}\n')
    b = write(tmp_path / "t" / "b.txt", "left out\n")
    write(tmp_path / "t" / "sub" / "c.jsonl", '{"text": "under sub"}\n')
    summary = prepare_json([a, b], tmp_path / "o1", "--exclude", "*.txt")
    assert summary["n_docs"] == 1 and summary["skipped_inputs"]["excluded"] == 1, summary
    code, _, stderr = cli("prepare", b, "--out", tmp_path / "o2", "--exclude", "*.txt")
    assert code == 1 and f"{b}: --exclude leaves out every input file named; nothing to read" in stderr, stderr
    code, _, stderr = cli("prepare", tmp_path / "t", "--out", tmp_path / "o3", "--exclude", str(tmp_path / "t" / "sub"),
                          "--val-fraction", "0")  # fmt: skip
    assert code == 0 and f"--exclude {tmp_path / 't' / 'sub'} matched no input file" in stderr, stderr
    assert "DIR/* leaves a directory out" in stderr
    summary = prepare_json([tmp_path / "t"], tmp_path / "o4", "--exclude", f"{tmp_path / 't' / 'sub'}/*")
    assert summary["n_docs"] == 2 and summary["skipped_inputs"]["excluded"] == 1, summary
