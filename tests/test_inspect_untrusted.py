"""`lmshard inspect` of someone else's dataset: what its tokenizer files may make inspect read.

test_untrusted.py tampers with the shards and the metadata's counts; here the dataset names or
holds tokenizer files (a Hugging Face tokenizer.json copy, tokenizer_state.json, a tiktoken
vocabulary path in the metadata) that an ordinary reader would load whole or choke on. The truth
is what a careful reader must do: show token ids undecoded or report one problem, never a
traceback, and never read more than a tokenizer's size (`MAX_TOKENIZER_BYTES`) of any file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from conftest import traced_peak, write
from test_hf_tokenizer import small
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import EXIT_CORRUPT, TokenizerError
from lmshard.format import files as files_mod
from lmshard.format import load_metadata
from lmshard.inspect.audit import decoder_for
from lmshard.inspect.verify import verify_dataset
from lmshard.prepare import PrepareConfig, prepare
from lmshard.tokenizers import hf_backend

runner = CliRunner()
META, STATE, COPY = "dataset_metadata.json", "tokenizer_state.json", "tokenizer.json"
TEXTS = [f"document {i}: some words, more words" for i in range(40)]


@pytest.fixture(autouse=True)
def _restore_parallelism(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # the backend sets it around its calls


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Two small datasets made by prepare: a Hugging Face tokenizer.json one and a gpt2 one."""
    tmp = tmp_path_factory.mktemp("inspect-untrusted")
    src = write(tmp / "a.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    vocab = small(tmp / "tok", ["<|endoftext|>"])
    for name, tokenizer in (("hf", str(vocab)), ("gpt2", "gpt2")):
        prepare(PrepareConfig(inputs=[str(src)], out=str(tmp / name), tokenizer=tokenizer, workers=1,
                              val_fraction=0.1))  # fmt: skip
    return tmp


@pytest.fixture
def hf_dataset(pristine, tmp_path):
    return shutil.copytree(pristine / "hf", tmp_path / "ds")


@pytest.fixture
def gpt2_dataset(pristine, tmp_path):
    return shutil.copytree(pristine / "gpt2", tmp_path / "ds")


def set_tokenizer(ds: Path, **fields: object) -> None:
    """Change the tokenizer's fields in both files that record them, consistently."""
    for name, section in ((META, "tokenizer"), (STATE, None)):
        data = json.loads((ds / name).read_text())
        (data[section] if section else data).update(fields)
        (ds / name).write_text(json.dumps(data))


def inspect(ds: Path, *args: str):
    result = runner.invoke(app, ["inspect", str(ds), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result


def traced_decoder(ds: Path) -> tuple[object, list[str], int]:
    """decoder_for(ds): the decoder, the reasons it gave, and the bytes traced meanwhile."""
    why: list[str] = []
    found = []
    peak = traced_peak(lambda: found.append(decoder_for(load_metadata(ds), why)))
    return found[0], why, peak


class Blocked(Exception):
    """Not an OSError (as TimeoutError is), so no handler of read errors can swallow it."""


class Alarm:
    """Fail, rather than hang, a call that blocks (a FIFO opened for reading waits for a writer)."""

    def __init__(self, seconds: int, what: str) -> None:
        self.seconds, self.what = seconds, what

    def __enter__(self) -> None:
        def timed_out(*_a: object) -> None:
            raise Blocked(self.what)

        self.previous = signal.signal(signal.SIGALRM, timed_out)
        signal.alarm(self.seconds)

    def __exit__(self, *_exc: object) -> None:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)


def test_the_pristine_datasets_decode(hf_dataset, pristine):
    """The control: both datasets verify and decode their samples."""
    for ds in (hf_dataset, pristine / "gpt2"):
        why: list[str] = []
        decode = decoder_for(load_metadata(ds), why)
        assert decode is not None and why == []
        result = inspect(ds, "--sample", "2")
        assert result.exit_code == 0 and "document " in result.output, result.output


def test_a_copy_holding_an_int_of_5000_digits_shows_ids_not_a_traceback(hf_dataset):
    """Python's JSON parser refuses an int of more than 4,300 digits with a bare ValueError (not
    a JSONDecodeError). The metadata's sha256 is the planted copy's, so verification passes and
    only the decoder stands between the planted file and a crash."""
    planted = b'{"model": {"type": "BPE", "vocab": {}, "merges": []}, "n": ' + b"9" * 5000 + b"}"
    (hf_dataset / COPY).write_bytes(planted)
    set_tokenizer(hf_dataset, ranks_sha256=hashlib.sha256(planted).hexdigest())
    why: list[str] = []
    assert decoder_for(load_metadata(hf_dataset), why) is None and "undecoded" in why[0]
    result = inspect(hf_dataset, "--sample", "2")
    assert result.exit_code == 0 and "token ids are shown undecoded" in result.output, result.output


def test_a_tiktoken_dataset_naming_a_file_never_reads_it(gpt2_dataset, tmp_path):
    """prepare records a tiktoken vocabulary by name (a .tiktoken file by the name its sha256
    matched), so a path in the metadata is someone else's: a 300 MB file there is not read (it
    would be, whole, to hash it), and even the real GPT-2 ranks under another name are not."""
    from lmshard.tokenizers import cache_dir

    huge = tmp_path / "huge.tiktoken"
    with open(huge, "wb") as f:
        f.truncate(300 << 20)  # sparse
    real = shutil.copy(next(cache_dir().glob("*")), tmp_path / "ranks.tiktoken")
    for named in (huge, real):
        set_tokenizer(gpt2_dataset, name=str(named))
        decode, why, peak = traced_decoder(gpt2_dataset)
        assert decode is None and "never reads a path a dataset's metadata names" in why[0], why
        assert peak < 64 << 20, peak
        result = inspect(gpt2_dataset, "--sample", "2")
        assert result.exit_code == 0 and "token ids are shown undecoded" in result.output, result.output


def test_a_recorded_vocabulary_sha256_not_the_named_ones_says_so_not_fetch(gpt2_dataset):
    """The metadata names gpt2 with another sha256 than gpt2's: ids are shown undecoded, saying
    the vocabulary here differs from the recorded one, not to fetch what is already here."""
    set_tokenizer(gpt2_dataset, ranks_sha256="0" * 64)
    decode, why, _ = traced_decoder(gpt2_dataset)
    assert decode is None and "the gpt2 vocabulary here has sha256" in why[0], why
    assert "not the 000000000000… the metadata records" in why[0] and "tokenizer fetch" not in why[0], why


def grow(path: Path, extra: int = 300 << 20) -> None:
    """Make `path` `extra` bytes longer (NULs, sparse: no disk used)."""
    with open(path, "r+b") as f:
        f.truncate(os.fstat(f.fileno()).st_size + extra)


def test_an_oversized_tokenizer_state_is_one_problem_not_a_read(hf_dataset):
    """tokenizer_state.json was read whole, however large, even with --quick."""
    grow(hf_dataset / STATE)
    reports = []
    peak = traced_peak(lambda: reports.append(verify_dataset(hf_dataset, quick=True)))
    problems = [str(p) for p in reports[0].problems]
    assert peak < 64 << 20 and len(problems) == 1 and STATE in problems[0] and "not read" in problems[0], problems
    result = inspect(hf_dataset, "--quick")
    assert result.exit_code == EXIT_CORRUPT and "not read" in result.output, result.output


@pytest.mark.parametrize("rel", [STATE, COPY])
@pytest.mark.parametrize("swap", ["grown", "fifo"])
def test_a_file_swapped_after_its_size_check_is_held_to_it_as_read(hf_dataset, monkeypatch, rel, swap):
    """Someone else's dataset may change under inspect: the file verify opens, not only the name
    it checked a moment earlier, must be a regular file within the tokenizer size cap."""
    real = files_mod.dataset_file_size

    def check_then_swap(root: Path, name: str) -> int:
        size = real(root, name)
        if name == rel:
            (root / rel).unlink()
            if swap == "fifo":
                os.mkfifo(root / rel)  # opening it to read would wait for a writer forever
            else:
                (root / rel).touch()
                grow(root / rel)
        return size

    monkeypatch.setattr(files_mod, "dataset_file_size", check_then_swap)  # (read_small's own check)
    with Alarm(10, f"verify reading the {swap} {rel}"):
        problems = [str(p) for p in verify_dataset(hf_dataset, quick=True).problems]
    words = "not a regular file" if swap == "fifo" else "not read"
    assert any(p.startswith(rel) and words in p for p in problems), problems


@pytest.mark.parametrize("swap", ["grown", "fifo"])
def test_a_tokenizer_file_swapped_after_resolution_is_held_to_the_checks(hf_dataset, monkeypatch, swap):
    """resolve(untrusted) checks the name (a regular file within the cap); the backend then
    reads the file it opens, which the dataset's owner may have swapped meanwhile. Before, a
    300 MB file was read whole and a FIFO blocked inspect forever."""
    real = hf_backend.resolve

    def resolve_then_swap(spec: str, **kw: object):
        source = real(spec, **kw)
        source.tokenizer_json.unlink()
        if swap == "fifo":
            os.mkfifo(source.tokenizer_json)
        else:
            source.tokenizer_json.touch()
            grow(source.tokenizer_json)
        return source

    monkeypatch.setattr(hf_backend, "resolve", resolve_then_swap)
    errors: list[str] = []

    def load() -> None:
        with Alarm(10, f"reading a {swap} tokenizer.json"), pytest.raises(TokenizerError) as e:
            hf_backend.HFTokenizer(str(hf_dataset / COPY), untrusted=True)
        errors.append(str(e.value))

    assert traced_peak(load) < 64 << 20
    assert "not read: a dataset may name only a regular file" in errors[0] and "\n" not in errors[0], errors


def test_the_recorded_separator_is_read_from_the_file_opened_not_the_name_checked(hf_dataset, monkeypatch):
    """decoder_for reads the separator from tokenizer_state.json; a FIFO swapped in after its
    size check blocked it forever. Now it is refused and the vocabulary's own choice stands."""
    from lmshard.tokenizers import of_dataset

    real, swapped = files_mod.dataset_file_size, []

    def check_then_swap(root: Path, name: str) -> int:
        size = real(root, name)
        if name == STATE and not swapped:
            swapped.append((root / STATE).read_bytes())
            (root / STATE).unlink()
            os.mkfifo(root / STATE)
        return size

    for module in (of_dataset, files_mod):  # whichever checks the name, the file is swapped after it
        monkeypatch.setattr(module, "dataset_file_size", check_then_swap)
    with Alarm(10, "reading tokenizer_state.json, a FIFO"):
        decode = decoder_for(load_metadata(hf_dataset))
    assert swapped and decode is not None and decode([0]) == "!"
