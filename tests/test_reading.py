"""Reading inputs (#29): a failure while reading names the input that failed, not --out (an
injected EIO, an EACCES, in this process or in a worker); pipes (a FIFO, `<(...)`) are read as
stdin is and are never offered a --resume; a file that changes while the run reads it is read
up to its size at the start (a half-written last record is left out, the growth is counted and
said) or refused as "changed while reading", never reported as a bad line.

Faults are injected where prepare opens its inputs (tests/faults.py), so they hold as root; a
file "still being written" is changed at a fixed point: just after prepare recorded the
inputs' sizes, before it reads any (`after_discovery`), never by a racing thread."""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import read_docs, write
from faults import failing_reads, unreadable
from test_prepare import run
from typer.testing import CliRunner

import lmshard.prepare.execution.runplan as runplan
import lmshard.prepare.execution.unitfiles as unitfiles
from lmshard.cli import app
from lmshard.errors import InputError
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.documents.files import detect
from lmshard.prepare.documents.reading import InputReadError
from lmshard.prepare.documents.records import read_whole_file
from lmshard.prepare.execution.pool import OrderedPool

runner = CliRunner()


def lines(n: int, tag: str = "doc") -> str:
    return "".join(json.dumps({"text": f"{tag} {i} " + "word " * (i % 7 + 1)}) + "\n" for i in range(n))


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    return result.exit_code, " ".join(result.output.split())


def docs(out: Path) -> list[list[int]]:
    return [d.tolist() for split in ("train", "val") for d in read_docs(out, split)]


def reference_docs(tmp_path: Path, name: str, data: str | bytes, **kw) -> list[list[int]]:
    """The documents of a run over `data` in a file of its own (what a changed file must give)."""
    path = write(tmp_path / "reference" / name, data)
    prepare(PrepareConfig(inputs=[str(path)], out=str(path.parent / "out"), workers=1, **kw))
    return docs(path.parent / "out")


# --- item 3: errors name the right file ------------------------------------------------------------


def test_an_io_error_reading_an_input_names_it_and_its_line_and_keeps_the_work(tmp_path, monkeypatch, small_items):
    a = write(tmp_path / "a.jsonl", lines(200))
    out = tmp_path / "out"
    args = ("prepare", str(a), "--out", str(out), "--workers", "1")
    with monkeypatch.context() as m:
        failing_reads(m, "a.jsonl", after=5000)  # the third 2 KiB block fails, as a bad sector would
        code, text = cli(*args)
    line = 1 + lines(200).encode()[:4096].count(b"\n")  # the first line of the block that failed
    assert code == 1
    assert f"error: {a}:{line}: cannot read this input after 5,000 bytes (Input/output error); check the disk" in text
    assert f"kept in {out.parent / '.out.lmshard-work'}: run the same command with --resume" in text
    assert "choose an --out" not in text and f"{out}: Input/output error" not in text
    code, text = cli(*args, "--resume")  # the disk is back: the run finishes as if nothing happened
    assert code == 0, text
    assert docs(out) == reference_docs(tmp_path, "a.jsonl", lines(200))


@pytest.mark.parametrize("name", ["b.jsonl", "b.txt", "b.csv"])  # read in planning, by a worker, parsed whole
def test_an_unreadable_input_is_named_with_its_fix_not_outs(tmp_path, monkeypatch, name):
    first = write(tmp_path / "a.jsonl", lines(3))
    bad = write(tmp_path / name, "text\nsome text\n")
    unreadable(monkeypatch, name)
    code, text = cli("prepare", str(first), str(bad), "--out", str(tmp_path / "out"), "--workers", "1")
    assert code == 1
    assert f"error: {bad}: cannot read this input (Permission denied); make it readable (chmod u+r {bad})" in text
    assert "choose an --out" not in text


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="chmod 000 does not deny root (see above)")
def test_a_chmod_000_input_is_named_with_its_fix(tmp_path):
    bad = write(tmp_path / "a.jsonl", lines(3))
    bad.chmod(0)
    code, text = cli("prepare", str(bad), "--out", str(tmp_path / "out"), "--workers", "1")
    assert code == 1 and f"{bad}: cannot read this input (Permission denied)" in text
    assert "choose an --out" not in text


def test_an_os_error_is_blamed_on_out_only_when_it_is_the_outputs(tmp_path):
    """The last line of defence (an OSError that reached the run without being named by a
    reader): --out advice only for --out, its build beside it, or no file named (a write's)."""
    from lmshard.prepare.output.staging import os_error

    out = tmp_path / "ds"
    paths = (tmp_path / "in.jsonl", out / "train" / "x", tmp_path / ".ds.lmshard-partial" / "y")
    denied = [PermissionError(13, "Permission denied", str(p)) for p in paths]
    assert [str(os_error(e, out)) for e in denied] == [
        f"{tmp_path / 'in.jsonl'}: Permission denied",
        f"{out / 'train' / 'x'}: Permission denied; choose an --out in a directory you can write",
        f"{tmp_path / '.ds.lmshard-partial' / 'y'}: Permission denied; choose an --out in a directory you can write",
    ]
    assert str(os_error(OSError(28, "No space left on device"), out)).startswith(f"{out}: no space left on the device")
    # Where the work is kept for a --resume (the caller says so), the fix is that, not another --out.
    assert [str(os_error(e, out, resumable=True)) for e in denied[1:]] == [
        f"{out / 'train' / 'x'}: Permission denied; make it writable",
        f"{tmp_path / '.ds.lmshard-partial' / 'y'}: Permission denied; make it writable",
    ]
    assert str(os_error(OSError(28, "No space left on device"), out, resumable=True)) == (
        f"{out}: no space left on the device; free space")


def _read_whole(src):  # runs in the worker process
    return read_whole_file(src, 1 << 20, truncate=False)


def _no_setup(_: object) -> None:
    pass


@pytest.mark.skipif(sys.platform != "linux", reason="the injected fault reaches the worker by fork")
def test_a_read_error_in_a_worker_reaches_the_main_process_as_the_inputs(tmp_path, monkeypatch):
    src = detect(str(write(tmp_path / "b.txt", "x" * 3000)))
    failing_reads(monkeypatch, "b.txt", after=100)
    with OrderedPool(1, _no_setup, None, start="fork") as pool, pytest.raises(InputReadError) as e:
        list(pool.imap(_read_whole, [src], window=1))
    assert str(e.value).startswith(f"{src.path}: cannot read this input after 100 bytes (Input/output error)")


# --- item 3: pipes ------------------------------------------------------------------------------------


def _feed(path: str | int, data: bytes, readers: int = 1) -> None:
    """Write `data` into a pipe from a thread (less than a pipe holds, so it never blocks long),
    for each of `readers` readers that open a FIFO one after another (0: for any number)."""
    assert len(data) < 60_000

    def write_all() -> None:
        served = 0
        while readers == 0 or served < readers:
            with open(path, "wb") as f:  # a FIFO's open waits for its reader
                f.write(data)
            served += 1

    threading.Thread(target=write_all, daemon=True).start()


def _pipe(tmp_path: Path, kind: str, data: bytes) -> str:
    """A FIFO (mkfifo), or what `<(...)` passes: /dev/fd/N of a pipe, fed with `data`."""
    if kind == "fifo":
        path = str(tmp_path / "in.jsonl")
        os.mkfifo(path)
        _feed(path, data)
        return path
    read_end, write_end = os.pipe()
    _feed(write_end, data)
    return f"/dev/fd/{read_end}"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
@pytest.mark.parametrize("kind", ["fifo", "process substitution"])
def test_a_pipe_is_read_as_stdin_is(tmp_path, kind):
    path = _pipe(tmp_path, kind, lines(50).encode())
    code, text = cli("prepare", path, "--format", "jsonl", "--out", str(tmp_path / "out"), "--workers", "1")
    assert code == 0, text
    assert docs(tmp_path / "out") == reference_docs(tmp_path, "a.jsonl", lines(50))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
@pytest.mark.parametrize("planned", [[], ["--num-tasks", "2"]], ids=["one process", "planned"])
def test_a_pipe_that_fails_offers_no_resume_and_keeps_nothing(tmp_path, monkeypatch, small_items, planned):
    """In one process, and in a planned run as it saves the pipe for its tasks (its spool)."""
    path = _pipe(tmp_path, "fifo", lines(300).encode())
    failing_reads(monkeypatch, "in.jsonl", after=5000)
    code, text = cli("prepare", path, "--out", str(tmp_path / "out"), "--workers", "1", *planned)
    assert code == 1
    assert f"{path}:" in text and "Input/output error" in text and "Illegal seek" not in text
    assert f"nothing was kept (a run reading the pipe {path} cannot be resumed)" in text and "--resume" not in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_a_planned_run_reading_a_pipe_resumes_from_its_saved_copy(tmp_path, monkeypatch):
    """A planned run saves its pipe before it plans (its spool): stopped after that, it keeps
    its work, and --resume goes on from the saved copy, never reading the pipe again (a pipe
    fed nothing stands in for it), to the documents of the same input read from a file."""
    from lmshard.prepare.execution import local_exec, unitfiles
    from lmshard.prepare.output.staging import Interrupted

    data = lines(500)
    path = _pipe(tmp_path, "fifo", data.encode())
    real_stop = unitfiles.stop_point

    def ctrl_c(point: str, key: int | None = None) -> None:  # Ctrl-C once its one unit is tokenized
        raise KeyboardInterrupt

    monkeypatch.setattr(unitfiles, "stop_point", ctrl_c)
    config = PrepareConfig(inputs=[path], out=str(tmp_path / "out"), workers=1)
    with pytest.raises(Interrupted, match="kept in"):
        local_exec.run(config, 2)
    monkeypatch.setattr(unitfiles, "stop_point", real_stop)
    _feed(path, b"", readers=0)
    assert local_exec.run(replace(config, resume=True), 2).total_docs == 500
    assert docs(tmp_path / "out") == reference_docs(tmp_path, "in.jsonl", data)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_a_planned_run_interrupted_while_it_saves_a_pipe_offers_no_resume(tmp_path, monkeypatch):
    """Ctrl-C while a planned run saves its pipe (before it is planned): exit 130, no --resume
    offered, nothing left beside --out."""
    path = _pipe(tmp_path, "fifo", lines(20).encode())

    class CtrlC:  # the pipe's reader, stopped after its first read
        def __init__(self, raw):
            self.raw = raw

        def read(self, n):
            self.raw.read(n)
            raise KeyboardInterrupt

        def close(self):
            self.raw.close()

    real_open = runplan.open_raw
    monkeypatch.setattr(runplan, "open_raw", lambda src: CtrlC(real_open(src)))
    code, text = cli("prepare", path, "--out", str(tmp_path / "out"), "--workers", "1", "--num-tasks", "2")
    assert code == 130 and "--resume" not in text, text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
@pytest.mark.parametrize("kind", ["fifo", "process substitution"])
def test_an_interrupted_pipe_run_resumes_from_its_saved_copy(tmp_path, monkeypatch, kind):
    """A pipe is saved whole before the run plans (runplan.spool_streams): interrupted after
    that, the run offers --resume, which goes on from the copy without opening the pipe again
    (a FIFO has no writer now, an open would wait for ever; a process substitution's /dev/fd/N
    is not there in the process that resumes), to the documents of a file."""
    import subprocess
    import sys

    path = _pipe(tmp_path, kind, lines(20).encode())

    def ctrl_c(point: str, key: int | None = None) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(unitfiles, "stop_point", ctrl_c)  # Ctrl-C once the first work item is written
        code, text = cli("prepare", path, "--format", "jsonl", "--out", str(tmp_path / "out"), "--workers", "1")
    assert code == 130 and f"kept in {tmp_path / '.out.lmshard-work'}; continue with:" in text, text
    done = subprocess.run([sys.executable, "-m", "lmshard", "prepare", path, "--format", "jsonl", "--out",
                           str(tmp_path / "out"), "--workers", "1", "--resume"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert docs(tmp_path / "out") == reference_docs(tmp_path, "a.jsonl", lines(20))


def _one_pass_input(name: str) -> bytes:
    """Input bytes for what one pass over a pipe cannot do: a parquet file; lines with repeats."""
    if name.endswith(".parquet"):
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        buffer = io.BytesIO()
        pq.write_table(pa.table({"text": [f"row {i} " + "word " * (i % 5 + 1) for i in range(300)]}), buffer)
        return buffer.getvalue()
    if name.endswith(".txt"):
        return "".join(f"paragraph {i % 40}\nline {i}\n\n" for i in range(200)).encode()
    return (lines(150) + lines(150, tag="again") + lines(100)).encode()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
@pytest.mark.parametrize(("name", "options"), [("in.parquet", {}), ("in.jsonl", {"dedup_lines": True}),
                                               ("in.jsonl", {"near_dedup": True}), ("in.txt", {"text_mode": "file"})])
def test_what_one_pass_over_a_pipe_cannot_do_runs_on_a_saved_copy(tmp_path, name, options):
    """A pipe that one pass cannot read as asked (parquet is read by seeking, --dedup-lines and
    --near-dedup read the input twice, --text-mode file makes it one document): a plain prepare
    saves it first and runs the stages on the copy (runplan.spool_streams), reading the pipe
    once, to the documents of the same bytes read from a file."""
    data = _one_pass_input(name)
    path = tmp_path / name
    os.mkfifo(path)
    _feed(str(path), data)  # (one reader: a second open of the pipe would wait for ever)
    prepare(PrepareConfig(inputs=[str(path)], out=str(tmp_path / "out"), workers=1, **options))
    assert docs(tmp_path / "out") == reference_docs(tmp_path, name, data, **options)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name, "out", "reference"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_a_local_run_saves_a_pipe_unsynced_and_a_claim_for_other_machines_syncs_it(tmp_path, monkeypatch):
    """The copy of a pipe is a work file: a run whose stages all run here leaves it unsynced (its
    boot recorded first, volatile.py), as its other work files; a claim that hands the plan to
    other machines (`--executor none`) syncs it. The local run ends with the documents of the
    same bytes read from a file."""
    from lmshard.prepare.execution import local_exec

    data = _one_pass_input("in.jsonl")
    synced, real = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))[1])
    for out in ("local", "claimed"):
        path = tmp_path / f"{out}.jsonl"
        os.mkfifo(path)
        _feed(str(path), data)
        config = PrepareConfig(inputs=[str(path)], out=str(tmp_path / out), workers=1, dedup_lines=True)
        synced.clear()
        if out == "local":
            prepare(config)
            assert docs(tmp_path / out) == reference_docs(tmp_path, "in.jsonl", data, dedup_lines=True)
        else:
            local_exec.claim(config, 2)
        spooled = [Path(p) for p in synced if "/spool/" in p]
        spool = tmp_path / f".{out}.lmshard-work" / "spool"
        assert [(p.parent, p.name.split(".")[1]) for p in spooled] == ([] if out == "local" else [
            (spool, "input_000000")]), synced  # fmt: skip


@pytest.mark.parametrize("options", [["--dedup-lines"], ["--near-dedup"], ["--text-mode", "file"]])
def test_what_one_pass_over_stdin_cannot_do_runs_on_a_saved_copy(tmp_path, options):
    """The same for stdin (`-`; `text:-` for text): --dedup-lines, --near-dedup and --text-mode
    file, once refused for it."""
    name = "in.txt" if "file" in options else "in.jsonl"
    data = _one_pass_input(name)
    stdin = "text:-" if "file" in options else "-"
    result = runner.invoke(app, ["prepare", stdin, "--out", str(tmp_path / "out"), "--workers", "1", *options],
                           input=data)  # fmt: skip
    assert result.exit_code == 0, result.output
    kw = {"dedup_lines": "--dedup-lines" in options, "near_dedup": "--near-dedup" in options}
    if "file" in options:
        kw.update(format="text", text_mode="file")
    assert docs(tmp_path / "out") == reference_docs(tmp_path, name, data, **kw)


# --- item 5: inputs that change while being read ------------------------------------------------------


def after_discovery(monkeypatch, change) -> None:
    """Call `change()` once prepare has recorded its inputs (paths, sizes), before it reads any."""
    discover = runplan.discover  # (the walk of the inputs every prepare takes)

    def discover_then_change(*args, **kwargs):
        found = discover(*args, **kwargs)
        change()
        return found

    monkeypatch.setattr(runplan, "discover", discover_then_change)


def append(path: Path, data: str | bytes) -> None:
    with open(path, "ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


@pytest.mark.parametrize(("name", "at_start", "written_later", "as_read"), [
    # JSON lines, read in blocks by the planner: the record half-written at the start is left out
    ("a.jsonl", lines(40) + '{"text": "half a rec', 'ord"}\n' + lines(5, "late"), lines(40)),
    # ... and one whole at the start, though its line end came later, is kept
    ("b.jsonl", lines(40) + '{"text": "whole"}', "\n" + lines(5, "late"), lines(40) + '{"text": "whole"}\n'),
    # a text file read whole by a worker: its last, unfinished line is left out
    ("c.txt", "first line\nsecond line\nthird li", "ne\nfourth line\n", "first line\nsecond line\n"),
])  # fmt: skip
def test_a_file_still_being_written_is_read_up_to_its_size_at_the_start(tmp_path, monkeypatch, name, at_start,
                                                                        written_later, as_read):  # fmt: skip
    path = write(tmp_path / name, at_start)
    after_discovery(monkeypatch, lambda: append(path, written_later))
    code, text = cli("prepare", str(path), "--out", str(tmp_path / "out"), "--workers", "1")
    assert code == 0, text
    assert f"warning: {path}: grew while the run read it; read up to the {len(at_start.encode()):,} bytes" in text
    assert "grew while read (read up to their size at the start) 1:" in text  # the summary's count
    meta = json.loads((tmp_path / "out" / "dataset_metadata.json").read_text())
    assert meta["sources"][0]["grew"] == 1 and "json_error" not in meta["drops"]
    assert docs(tmp_path / "out") == reference_docs(tmp_path, name, as_read)


@pytest.mark.parametrize(("name", "at_start", "written_later", "words"), [
    ("a.jsonl.gz", gzip.compress(lines(200).encode())[:600], gzip.compress(lines(200).encode())[600:],
     "it grew past the {size:,} bytes it held when the run started, and its gzip data is cut there"),
    ("a.json", '[{"text": "one"},\n{"text": "two"},\n{"text": "th', 'ree"}\n]\n',
     "it grew past the {size:,} bytes it held when the run started, and its JSON array is not closed there"),
])  # fmt: skip
def test_a_file_still_being_written_that_cannot_be_cut_is_refused(tmp_path, monkeypatch, name, at_start,
                                                                 written_later, words):  # fmt: skip
    path = write(tmp_path / name, at_start)
    after_discovery(monkeypatch, lambda: append(path, written_later))
    with pytest.raises(InputError) as e:
        prepare(PrepareConfig(inputs=[str(path)], out=str(tmp_path / "out"), workers=1))
    words = words.format(size=len(at_start.encode() if isinstance(at_start, str) else at_start))
    assert str(e.value) == f"{path}: changed while reading: {words}; run again once nothing writes to it"


def _shrink(path: Path) -> None:
    os.truncate(path, 100)


def _replace(path: Path) -> None:
    other = write(path.with_name("other"), lines(60))
    os.replace(other, path)


@pytest.mark.parametrize(("change", "words"), [
    (_shrink, "it held {size:,} bytes when the run started and holds 100 now"),
    (_replace, "it was replaced by another file after the run started"),
])  # fmt: skip
@pytest.mark.parametrize("name", ["a.jsonl", "a.txt"])
def test_a_file_that_shrank_or_was_replaced_is_one_line_naming_it(tmp_path, monkeypatch, change, words, name):
    path = write(tmp_path / name, lines(50))
    size = path.stat().st_size
    after_discovery(monkeypatch, lambda: change(path))
    code, text = cli("prepare", str(path), "--out", str(tmp_path / "out"), "--workers", "1")
    assert code == 1
    assert f"error: {path}: changed while reading: {words.format(size=size)}; run again once nothing writes" in text
    assert "fix the line" not in text and not (tmp_path / "out").exists()


def test_a_partial_record_at_the_size_recorded_is_never_a_bad_line_in_a_scale_out_unit(tmp_path, monkeypatch):
    """The last unit of a cut file ends at the recorded size: a growing file's half-written last
    record is left out there too."""
    from lmshard.prepare.execution.units import cut_units, unit_items

    path = write(tmp_path / "a.jsonl", lines(3000) + '{"text": "half')
    src = detect(str(path))
    append(path, ' a record"}\n')
    units = cut_units([src], "auto", 1000, 64 << 10)
    assert len(units) >= 2
    payload = b"".join(it.payload for u in units for it in unit_items([src], u, "auto", "text", 1000))
    assert payload == lines(3000).encode()


def straddling(half: str, block: int) -> str:
    """Whole JSON lines ending 10 bytes before the second read of `block` bytes ends, so that a
    record `half` written after them is cut by that read: it begins in one read, ends in the
    next (the last, at the recorded size)."""
    head = lines(block // 60)
    pad = 2 * block - 10 - len(head) - len('{"text": ""}\n')
    assert pad >= 0 and len(half) > 10
    return head + json.dumps({"text": "p" * pad}) + "\n"


@pytest.mark.parametrize(("name", "half", "options"), [
    ("a.jsonl", '{"text": "a record still being written', ()),
    ("a.txt", "a line still being written", ("--text-mode", "line")),  # it would be a document
])  # fmt: skip
def test_a_half_written_record_across_the_last_read_is_left_out(tmp_path, monkeypatch, small_items, name, half,
                                                                options):  # fmt: skip
    whole = straddling(half, 2048)  # small_items: reads of 2 KiB
    path = write(tmp_path / name, whole + half)
    after_discovery(monkeypatch, lambda: append(path, ', now finished"}\n' + lines(5, "late")))
    code, text = cli("prepare", str(path), "--out", str(tmp_path / "out"), "--workers", "1", *options)
    assert code == 0, text  # --on-error fail: a half record would have stopped the run
    assert f"warning: {path}: grew while the run read it; read up to the {len(whole) + len(half):,} bytes" in text
    kw = {"text_mode": "line"} if options else {}
    assert docs(tmp_path / "out") == reference_docs(tmp_path, name, whole, **kw)


def test_a_half_written_record_across_a_units_last_read_is_left_out(tmp_path, small_items):
    from lmshard.prepare.execution.units import cut_units, unit_items

    half = '{"text": "' + "half " * 500  # longer than a 2 KiB read: whatever the unit's start, it spans two
    path = write(tmp_path / "a.jsonl", lines(3000) + half)
    src = detect(str(path))
    append(path, 'and the rest"}\n')
    units = cut_units([src], "auto", 1000, 64 << 10)
    assert len(units) >= 2
    payload = b"".join(it.payload for u in units for it in unit_items([src], u, "auto", "text", 1000))
    assert payload == lines(3000).encode()


def test_an_input_gone_before_the_run_claims_out_is_the_inputs_error(tmp_path, monkeypatch):
    data = write(tmp_path / "a.jsonl", json.dumps({"text": "one document"}) + "\n")
    after_discovery(monkeypatch, data.unlink)
    code, said = cli("prepare", str(data), "--out", str(tmp_path / "o"), "--workers", "1")
    assert code == 1 and f"{data}: this input is gone" in said and "--out" not in said.split("gone")[0], said
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text_mode", ["auto", "line", "paragraph"])
def test_decode_errors_replace_keeps_a_file_with_a_latin1_byte(tmp_path, reference, text_mode):
    """One Latin-1 byte (caf\\xe9) in a text file and in a JSON line: strict makes that record a
    decode_error (the whole file, read as one document); --decode-errors replace keeps it with
    U+FFFD for the byte (the tokens are the reference's of that text), counted per file."""
    from lmshard import TokenDataset

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_bytes(b"A caf\xe9 on the corner.\n\nIt opens at nine.\n")
    (tmp_path / "in" / "b.jsonl").write_bytes(b'{"text": "good line"}\n{"text": "caf\xe9 au lait"}\n')
    strict = run(tmp_path, [tmp_path / "in"], out=str(tmp_path / "s"), on_error="skip", text_mode=text_mode,
                 val_fraction=0.0)  # fmt: skip
    assert strict["drops"]["decode_error"] >= 2
    kept = run(tmp_path, [tmp_path / "in"], out=str(tmp_path / "r"), on_error="skip", text_mode=text_mode,
               val_fraction=0.0, decode_errors="replace")  # fmt: skip
    assert "decode_error" not in kept["drops"]
    texts = {s["path"].rsplit("/", 1)[-1]: s.get("decode_replaced", 0) for s in kept["sources"]}
    assert texts == {"b.jsonl": 1, "notes.txt": 1}
    ds = TokenDataset(tmp_path / "r")
    decoded = ds.decode(ds.tokens(0, ds.n_tokens))
    assert "caf\ufffd au lait" in decoded and "A caf\ufffd on the corner." in decoded
    expected = reference.encode_ordinary("caf\ufffd au lait")
    assert any(ds.tokens(i, len(expected)).tolist() == expected for i in range(ds.n_tokens - len(expected)))


def test_a_csv_rows_record_is_the_line_it_starts_on(tmp_path, reference):
    """A CSV row's record number (its `.src` entry) is the line it starts on, as `sed -n Np`
    finds it: a quoted value over several lines, a blank line between rows, a short and a long
    row; a header without the text column names the columns as written (a tab shown as \\t)."""
    import numpy as np

    from lmshard.format.provenance import SRC_DTYPE

    src = write(tmp_path / "a.csv", 'id,text\n1,"first\nrow of two lines"\n2,second\n\n3,"third"\n4\n5,fifth,extra\n')
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "o"), workers=1, val_fraction=0.0, on_error="skip"))
    meta = json.loads((tmp_path / "o" / "dataset_metadata.json").read_text())
    shard = meta["splits"]["train"]["shards"][0]
    records = np.fromfile(tmp_path / "o" / shard["src_path"], dtype=SRC_DTYPE)["record"].tolist()
    texts = [reference.decode(d[:-1].tolist()) for d in read_docs(tmp_path / "o", "train")]
    assert texts == ["first\nrow of two lines", "second", "third", "fifth"] and records == [2, 4, 6, 8]
    assert meta["drops"]["missing_field"] == 1  # the row "4" (line 7): no text value
    tabs = write(tmp_path / "b.csv", "id\ttext\n1\thello\n")
    with pytest.raises(InputError, match=r"no column 'text' \(columns: 'id\\ttext'\)"):
        prepare(PrepareConfig(inputs=[str(tabs)], out=str(tmp_path / "o2"), workers=1))
