"""zstd with a dictionary (format version 3): the same dictionary and bytes for every executor,
older zstd datasets (version 2: no dictionary, 1,024-token frames) read and extended as they
are, convert adds or drops the dictionary, and frames decode with the dictionary the metadata
holds (zstandard itself, reading the base64 of the metadata: tests/test_inspect_encodings.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_prepare import jsonl, make_texts

from lmshard.errors import InputError
from lmshard.format import Encoding, load_metadata
from lmshard.format.dictionary import spread, train
from lmshard.interop.convert import convert_dataset
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.output.dictfile import DICT_FILE, run_encoding
from lmshard.runtime import TokenDataset


def _prepare(out: Path, inputs: list[Path], encoding: str | None = "zstd", **kw) -> Path:
    prepare(PrepareConfig(inputs=[str(p) for p in inputs], out=str(out), shard_encoding=encoding,
                          val_fraction=0.1, tokens_per_shard=kw.pop("tokens_per_shard", 40_000), quiet=True,
                          workers=kw.pop("workers", 2), **kw))  # fmt: skip
    return out


def _raw(root: Path) -> dict:
    return json.loads((root / "dataset_metadata.json").read_text())


def _tokens(root: Path, split: str = "train") -> np.ndarray:
    ds = TokenDataset(root, split=split)
    return np.asarray(ds.tokens(0, ds.n_tokens))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zdict")
    return [jsonl(tmp / f"part{i}.jsonl", make_texts(700, seed=20 + i)) for i in range(3)]


def test_training_is_deterministic_across_processes():
    rng = np.random.default_rng(0)
    tokens = rng.zipf(1.3, 300_000).clip(0, 50_000).astype(np.uint32)
    enc = Encoding.choose("zstd", 50_257)
    here = train(tokens, enc)
    assert here is not None and len(here) <= 64 << 10
    code = ("import sys, hashlib, numpy as np; from lmshard.format import Encoding; "
            "from lmshard.format.dictionary import train; rng = np.random.default_rng(0); "
            "t = rng.zipf(1.3, 300_000).clip(0, 50_000).astype(np.uint32); "
            "print(hashlib.sha256(train(t, Encoding.choose('zstd', 50_257))).hexdigest())")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == hashlib.sha256(here).hexdigest()
    assert train(tokens[:2000], enc) is None  # a sample too small for a dictionary: none


def test_spread_runs_are_evenly_spaced_and_inside_the_stream():
    runs = spread(10_000_000)
    assert len(runs) == 16 and runs[0][0] == 0 and runs[-1][0] + runs[-1][1] == 10_000_000
    gaps = np.diff([offset for offset, _ in runs])
    assert np.abs(gaps - (10_000_000 - runs[0][1]) / 15).max() <= 1
    assert spread(1000) == [(0, 1000)] and spread(0) == []


def test_every_executor_trains_the_same_dictionary_and_writes_the_same_bytes(tmp_path, corpus, monkeypatch):

    one = _prepare(tmp_path / "one", corpus, workers=1)
    pool = _prepare(tmp_path / "pool", corpus)
    tasks = _prepare(tmp_path / "tasks", corpus, num_tasks=3)
    raw = _raw(one)
    assert raw["format_version"] == 3 and raw["encoding"]["dictionary"]["bytes"] > 0
    assert raw["encoding"]["block_tokens"] == 3072 and raw["encoding"]["level"] == 6
    for other in (pool, tasks):
        assert _raw(other)["encoding"] == raw["encoding"]
        for shard in load_metadata(one).shards:
            for f in shard.files():
                assert (one / f).read_bytes() == (other / f).read_bytes(), f
    assert not any(p.name == DICT_FILE for root in (one, pool, tasks) for p in root.rglob("*"))  # (in the metadata)
    truth = _prepare(tmp_path / "u32", corpus, None, workers=1)
    for split in ("train", "val"):
        assert np.array_equal(_tokens(one, split), _tokens(truth, split))


@pytest.mark.parametrize("num_tasks", [None, 2])
def test_a_version_2_dataset_reads_and_is_extended_as_it_is(tmp_path, corpus, monkeypatch, num_tasks):
    """What lmshard wrote before dictionaries: 1,024-token frames at level 3, no dictionary;
    extended in one process and by a planned run alike."""
    import lmshard.format.encoding as encoding_module
    import lmshard.prepare.output.dictfile as dictfile

    with monkeypatch.context() as m:
        m.setattr(encoding_module, "ZSTD_BLOCK_TOKENS", 1024)
        m.setattr(encoding_module, "ZSTD_LEVEL", 3)
        m.setattr(dictfile, "train", lambda tokens, encoding: None)
        old = _prepare(tmp_path / "old", corpus[:2], workers=1)  # (in this process: the patches hold)
    raw = _raw(old)
    assert raw["format_version"] == 2 and "dictionary" not in raw["encoding"]
    assert raw["encoding"]["block_tokens"] == 1024
    truth = _prepare(tmp_path / "truth", corpus, None)
    prepare(PrepareConfig(inputs=[str(corpus[2])], out=str(old), append=True, workers=2, val_fraction=0.1,
                          tokens_per_shard=40_000, quiet=True, num_tasks=num_tasks))  # fmt: skip
    assert _raw(old)["encoding"] == raw["encoding"] and _raw(old)["format_version"] == 2
    for split in ("train", "val"):
        assert np.array_equal(_tokens(old, split), _tokens(truth, split))
    from typer.testing import CliRunner

    from lmshard.cli import app

    result = CliRunner().invoke(app, ["inspect", str(old)])
    assert result.exit_code == 0 and "verified" in result.output, result.output


def test_append_keeps_the_dataset_dictionary(tmp_path, corpus):
    out = _prepare(tmp_path / "ds", corpus[:2])
    before = _raw(out)["encoding"]
    prepare(PrepareConfig(inputs=[str(corpus[2])], out=str(out), append=True, workers=2, val_fraction=0.1,
                          tokens_per_shard=40_000, quiet=True))  # fmt: skip
    assert _raw(out)["encoding"] == before
    truth = _prepare(tmp_path / "truth", corpus, None)
    assert np.array_equal(_tokens(out), _tokens(truth))


def test_small_and_stdin_inputs_have_no_dictionary(tmp_path, corpus):
    tiny = jsonl(tmp_path / "tiny.jsonl", make_texts(20, seed=1))
    out = _prepare(tmp_path / "tiny", [tiny])
    assert _raw(out)["format_version"] == 2 and "dictionary" not in _raw(out)["encoding"]
    assert np.array_equal(_tokens(out), _tokens(_prepare(tmp_path / "tiny32", [tiny], None)))
    exe = Path(sys.executable).with_name("lmshard")
    args = [str(exe), "prepare", "-", "--out", str(tmp_path / "piped"), "--shard-encoding", "zstd", "--quiet"]
    piped = subprocess.run(args, input=corpus[0].read_text(), capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0, piped.stderr
    assert "dictionary" not in _raw(tmp_path / "piped")["encoding"]  # stdin is read once: not sampled


def test_a_build_whose_dictionary_is_gone_is_refused(tmp_path):
    config = PrepareConfig(inputs=["x"], out=str(tmp_path / "ds"), shard_encoding="zstd")
    with pytest.raises(InputError, match="zstd dictionary .* is missing; start again with --overwrite"):
        run_encoding(config, 50_257, None, tmp_path)
    (tmp_path / DICT_FILE).write_bytes(b"")  # none trained: frames without one
    assert run_encoding(config, 50_257, None, tmp_path).dictionary is None


def test_convert_adds_or_drops_the_dictionary(tmp_path, corpus):
    plain = _prepare(tmp_path / "u16", corpus, "uint16")
    with_dict = convert_dataset(plain, "zstd", tmp_path / "z").meta
    again = convert_dataset(plain, "zstd", tmp_path / "z2").meta
    without = convert_dataset(tmp_path / "z", "zstd", tmp_path / "z0", dictionary=False).meta
    assert with_dict.encoding.dictionary is not None and with_dict.encoding == again.encoding
    assert _raw(tmp_path / "z")["format_version"] == 3 and _raw(tmp_path / "z0")["format_version"] == 2
    assert without.encoding.dictionary is None
    held = _raw(tmp_path / "z")["encoding"]["dictionary"]
    assert base64.b64decode(held["base64"]) == with_dict.encoding.dictionary
    for root in ("z", "z0"):
        assert np.array_equal(_tokens(tmp_path / root), _tokens(plain))
    size = {r: sum(s.n_bytes for s in load_metadata(tmp_path / r).shards) for r in ("z", "z0")}
    assert size["z"] < size["z0"]


@pytest.mark.parametrize("width", [2, 3, 4])
def test_frame_ids_widen_to_what_the_bytes_say(width):
    rng = np.random.default_rng(width)
    ids = rng.integers(0, 1 << (8 * width), 1001, dtype=np.uint64)
    raw = b"".join(int(i).to_bytes(width, "little") for i in ids)
    from lmshard.format.encoding import widen

    got = widen(np.frombuffer(raw, dtype=np.uint8), width)
    assert got.dtype == np.uint32 and got.tolist() == ids.tolist()
    assert widen(np.zeros(0, np.uint8), width).tolist() == []


@pytest.mark.parametrize("num_tasks", [None, 2])
def test_a_stop_while_the_dictionary_trains_leaves_nothing(tmp_path, corpus, monkeypatch, num_tasks):
    import lmshard.prepare.output.dictfile as dictfile

    def stopped(tokens, encoding):
        raise KeyboardInterrupt

    monkeypatch.setattr(dictfile, "train", stopped)
    with pytest.raises(KeyboardInterrupt):
        _prepare(tmp_path / "ds", corpus, num_tasks=num_tasks)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name not in {c.name for c in corpus}) == []
    monkeypatch.undo()
    _prepare(tmp_path / "ds", corpus, num_tasks=num_tasks)  # a plain run again, as if nothing happened
    assert _raw(tmp_path / "ds")["format_version"] == 3


def _config(inputs: list[Path], **kw) -> tuple[PrepareConfig, list, object, object]:
    from lmshard.prepare.documents.sources import discover
    from lmshard.prepare.execution.runplan import worker_config
    from lmshard.prepare.output.claim import run_tokenizer

    config = PrepareConfig(inputs=[str(p) for p in inputs], out="unused", shard_encoding="zstd", **kw)
    tokenizer = run_tokenizer(config)
    sources = discover(config.inputs, config.format)
    return config, sources, tokenizer, worker_config(config, sources, tokenizer)


def test_the_sample_comes_from_every_file_and_stays_bounded(tmp_path):
    from lmshard.prepare.output.dictfile import POINT_BYTES, SAMPLE_POINTS, sample_tokens

    words = ["alpha", "bravo", "charlie"]
    files = []
    for i, word in enumerate(words):  # three files, each of one word: the sample holds each
        files.append(jsonl(tmp_path / f"f{i}.jsonl", [f"{word} " * 400 + str(n) for n in range(300)]))
    config, sources, tokenizer, wcfg = _config(files)
    sample = sample_tokens(config, sources, tokenizer, wcfg)
    text = tokenizer.decode(sample.tolist())
    assert all(word in text for word in words), {w: text.count(w) for w in words}
    big = []  # whole-file text documents of 1 MiB each: the sample keeps POINT_BYTES characters a point
    for i in range(20):
        (tmp_path / "big").mkdir(exist_ok=True)
        big.append(tmp_path / "big" / f"doc{i:02d}.txt")
        big[-1].write_text(f"word{i} " * (1 << 18))
    config, sources, tokenizer, wcfg = _config(big, text_mode="file", max_chars=1 << 22)
    sample = sample_tokens(config, sources, tokenizer, wcfg)
    assert 0 < len(sample) <= SAMPLE_POINTS * POINT_BYTES  # (a token holds a character at least)


def test_records_parsed_by_the_planner_are_sampled_from_a_bounded_start(tmp_path, monkeypatch):
    """A CSV's items (2,048 records each) have no byte sizes: the sample reads MAX_ITEMS of them."""
    import lmshard.prepare.output.dictfile as dictfile

    path = tmp_path / "big.csv"
    path.write_text("text\n" + "".join(f"row {n} of the table\n" for n in range(200_000)))
    config, sources, tokenizer, wcfg = _config([path])
    seen = []
    real = dictfile.plan

    def counted(*args, **kwargs):
        for item in real(*args, **kwargs):
            seen.append(item)
            yield item

    monkeypatch.setattr(dictfile, "plan", counted)
    assert len(dictfile.sample_tokens(config, sources, tokenizer, wcfg))
    assert len(seen) <= dictfile.MAX_ITEMS < 200_000 // 2048


def test_the_swap_and_a_recovery_remove_the_build_dictionary(tmp_path, corpus):
    from lmshard.prepare.output.staging import DICT_FILE as NAME
    from lmshard.prepare.output.staging import OutputPaths, recover

    out = _prepare(tmp_path / "ds", corpus[:1])
    (out / NAME).write_bytes(b"left by a kill after the swap")
    recover(OutputPaths.of(out))
    assert not (out / NAME).exists() and _raw(out)["format_version"] == 3
