"""format.atomic_file: a file written whole under this host's temporary name and renamed into
place, its folder made where it is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmshard.format import atomic_file


def test_a_file_whose_folder_is_missing_is_written_and_its_folder_made(tmp_path):
    path = tmp_path / "lines" / "unit_000000.bin"
    with atomic_file(path) as f:
        f.write(b"abc")
    assert path.read_bytes() == b"abc"
    assert [p.name for p in path.parent.iterdir()] == ["unit_000000.bin"]  # (no temporary file left)


def test_a_file_whose_folder_above_is_gone_fails_and_makes_nothing(tmp_path):
    """A task still running when the finish removed the work folder: its unit's file fails to be
    written, and the work folder is not made again beside the finished dataset."""
    work = tmp_path / ".ds.lmshard-work"
    with pytest.raises(FileNotFoundError), atomic_file(work / "tokenize" / "unit_000000.bin") as f:
        f.write(b"abc")
    assert list(tmp_path.iterdir()) == []


def test_a_file_whose_folder_is_there_makes_no_folder(tmp_path, monkeypatch):
    """One lookup fewer per file: a stage's task writes a file per unit into one folder."""
    made = []
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **k: made.append(self))
    with atomic_file(tmp_path / "f.bin") as f:
        f.write(b"x")
    assert made == [] and (tmp_path / "f.bin").read_bytes() == b"x"


def test_a_block_that_raises_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_file(path) as f:
        f.write(b"new, half written")
        raise RuntimeError("stopped")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.bin"]
