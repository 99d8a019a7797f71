"""`lmshard.load_config`: a loader configuration file gives the stream the same calls of the
Python API give, batch for batch and state for state (the truth: those calls, made here), and
every mistake in the file is one line naming the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write
from test_remote_loader import same

import lmshard
from lmshard import Mixture, TokenDataset
from lmshard.errors import InputError
from lmshard.prepare import PrepareConfig, prepare


def _prepare(root: Path, name: str, n_docs: int, salt: str = "") -> Path:
    texts = [f"{salt}document {i} " + "word " * (i * 37 % 700) for i in range(n_docs)]
    src = write(root / f"{name}.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = root / "data" / name
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), tokenizer="gpt2", val_fraction=0.1, tokens_per_shard=20_000))
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("loadconfig")
    return root, _prepare(root, "web", 300), _prepare(root, "code", 150, salt="def ")


def _config(root: Path, text: str) -> Path:
    return write(root / "conf" / "loader.toml", text)  # a folder of its own: paths are relative to the file


def _equal(a, b, steps: int = 12) -> None:
    for _ in range(steps):
        same(next(a), next(b))
    assert a.state_dict() == b.state_dict()


@pytest.mark.parametrize(("sample", "truth"), [
    ('shape = "random"\nbatch_size = 4\nseq_len = 64\nshift = "random"\ndoc_aligned = true',
     lambda d: d.random_batches(4, 64, seed=7, shift="random", doc_aligned=True)),
    ('shape = "windows"\nbatch_size = 3\nseq_len = 100\nstride = 60\nshuffle = false',
     lambda d: d.window_batches(3, 100, seed=7, stride=60, shuffle=False)),
    ('shape = "packed"\nbatch_size = 2\nseq_len = 256\npadding_free = true\n[packing]\nstrategy = "greedy"',
     lambda d: d.packed(256, seed=7, strategy="greedy").batches(2, padding_free=True)),
    ('shape = "padded"\nbatch_size = 4\nseq_len = 300\ngroup_by_length = false',
     lambda d: d.padded_batches(4, 300, seed=7, group_by_length=False)),
    ('schedule = [[0, 2, 64], [3, 4, 64], {step = 6, batch_size = 8, seq_len = 128}]',
     lambda d: d.random_batches(schedule=[(0, 2, 64), (3, 4, 64), (6, 8, 128)], seed=7)),
    ('shape = "windows"\norder = "rows"\nschedule = [{tokens = 0, batch_size = 2, seq_len = 64}, '
     '{tokens = 400, batch_size = 6, seq_len = 64}]',
     lambda d: d.window_batches(schedule=[(0, 2, 64), (4, 6, 64)], seed=7, order="rows")),
    ('shape = "packed"\nseq_len = 256\nschedule = [[0, 2, 256], [4, 4, 256]]',
     lambda d: d.packed(256, seed=7).batches(schedule=[(0, 2, 256), (4, 4, 256)])),
])  # fmt: skip
def test_each_shape_is_the_api_calls_stream(data, sample, truth):
    root, web, _ = data
    conf = _config(root, f'seed = 7\ndataset = "../data/web"\n[sample]\n{sample}\n')
    _equal(lmshard.load_config(conf), truth(TokenDataset(web)))


def test_a_mixture_split_and_the_process_arguments(data):
    root, web, code = data
    conf = _config(root, 'seed = 3\nsplit = "val"\nmax_epochs = 50\n'
                         '[[source]]\npath = "../data/web"\nweight = 0.7\n[[source]]\npath = "../data/code"\n'
                         'weight = 0.3\n[sample]\nbatch_size = 4\nseq_len = 32\n')  # fmt: skip
    mix = Mixture({str(web): 0.7, str(code): 0.3}, split="val", max_epochs=50)
    _equal(lmshard.load_config(conf, rank=1, world_size=2), mix.random_batches(4, 32, seed=3, rank=1, world_size=2))
    packed = conf.read_text().replace("seq_len = 32", 'seq_len = 128\nshape = "packed"\n[packing]\nshuffle = false')
    _equal(lmshard.load_config(write(conf, packed)), mix.packed_batches(4, 128, seed=3, shuffle=False))



def test_a_curriculum_and_a_schedule_from_the_file(data):
    root, web, code = data
    conf = _config(root, 'seed = 3\nmax_epochs = 50\ncurriculum = [[0, [0.9, 0.1]], [2e4, [0.3, 0.7]]]\n'
                         'ramp = "step"\n[[source]]\npath = "../data/web"\n[[source]]\npath = "../data/code"\n'
                         '[sample]\nschedule = [[0, 4, 32], [5, 8, 32]]\n')  # fmt: skip
    mix = Mixture([str(web), str(code)], max_epochs=50, curriculum=[(0, [0.9, 0.1]), (20_000, [0.3, 0.7])],
                  ramp="step")  # fmt: skip
    _equal(lmshard.load_config(conf), mix.random_batches(schedule=[(0, 4, 32), (5, 8, 32)], seed=3))
    with pytest.raises(InputError, match=r"unknown key 'weight' in \[source\[2\]\]; it takes path"):
        lmshard.load_config(write(conf, conf.read_text().replace('code"\n', 'code"\nweight = 1\n')))


@pytest.mark.parametrize(("text", "words"), [
    ('dataset = "../data/web"\ncolour = 1\n[sample]\nbatch_size = 2\nseq_len = 8',
     "unknown key 'colour' in the top level; it takes seed, split, dataset"),
    ('dataset = "../data/web"\n[sample]\nbatch_size = 2\nseq_len = 8\nstride = 4',
     "unknown key 'stride' in [sample]; it takes shape, batch_size, seq_len, shift"),
    ('dataset = "../data/web"\n[sample]\nshape = "pack"\nbatch_size = 2\nseq_len = 8',
     "[sample] shape = 'pack'; use one of random, windows, packed, padded"),
    ('dataset = "../data/web"\n[sample]\nbatch_size = 2\nseq_len = 8\n[packing]\nstrategy = "bfd"',
     '[packing] applies to shape = "packed", not \'random\''),
    ('dataset = "../data/web"\n[sample]\nbatch_size = 2', "[sample] needs seq_len"),
    ('dataset = "../data/web"\n[[source]]\npath = "../data/web"\nweight = 1\n[sample]\nbatch_size = 2\nseq_len = 8',
     "name the data once"),
    ('dataset = "../data/web"\n[sample]\nbatch_size = 0\nseq_len = 8', "batch_size"),
    ('dataset = "../data/nothing"\n[sample]\nbatch_size = 2\nseq_len = 8', "data/nothing"),
    ('[[source]]\npath = "../data/web"\nweight = 1\n[sample]\nshape = "padded"\nbatch_size = 2\nseq_len = 8',
     'shape = "padded" reads one dataset'),
    ('dataset = "../data/web"\n[sample\nbatch_size = 2', "cannot read the loader configuration"),
    ('dataset = "../data/web"\n[sample]\nbatch_size = 2\nschedule = [[0, 2, 8]]', "has a schedule and batch_size"),
    ('dataset = "../data/web"\n[sample]\nschedule = [[2, 2, 8]]', "schedule phase 1 starts at step 2"),
    ('dataset = "../data/web"\n[sample]\norder = "epochs"\nbatch_size = 2\nseq_len = 8', "order='epochs'"),
])  # fmt: skip
def test_mistakes_are_one_line_naming_the_file(data, text, words):
    root, _, _ = data
    conf = _config(root, text)
    with pytest.raises(InputError) as e:
        lmshard.load_config(conf)
    message = str(e.value)
    assert message.startswith(f"{conf}: ") and words in message and "\n" not in message, message


def test_a_stream_table_is_lmshard_stream(tmp_path):
    texts = [f"streamed document {i} " + "word " * (i * 13 % 200) for i in range(200)]
    write(tmp_path / "conf" / "text" / "a.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in texts))
    path = _config(tmp_path, """
seed = 4
[stream]
inputs = ["text"]
tokenizer = "gpt2"
shuffle_buffer = 50
[sample]
shape = "packed"
batch_size = 2
seq_len = 128
[packing]
strategy = "greedy"
buffer = 30
overlong = "truncate"
""")
    got = lmshard.load_config(path)
    want = lmshard.stream(str(tmp_path / "conf" / "text"), seed=4, shuffle_buffer=50).packed(
        2, 128, strategy="greedy", buffer=30, overlong="truncate")
    _equal(got, want)
    assert got.state_dict() == want.state_dict()
    windows = _config(tmp_path, '[stream]\ninputs = "text"\n[sample]\nshape = "windows"\nbatch_size = 3\nseq_len = 32\n'
                                'stride = 16\n')  # fmt: skip
    _equal(lmshard.load_config(windows), lmshard.stream(str(tmp_path / "conf" / "text")).windows(3, 32, stride=16))
    ramp = _config(tmp_path, '[stream]\ninputs = "text"\n[sample]\nshape = "windows"\n'
                             'schedule = [[0, 2, 32], [3, 4, 48]]\n')  # fmt: skip
    _equal(lmshard.load_config(ramp), lmshard.stream(str(tmp_path / "conf" / "text")).windows(
        schedule=[(0, 2, 32), (3, 4, 48)]), steps=6)  # fmt: skip


def test_stream_packing_of_a_dataset_from_the_file(data):
    root, web, _ = data
    path = _config(root, f'dataset = "{web}"\n[sample]\nshape = "packed"\nbatch_size = 2\nseq_len = 256\n'
                         '[packing]\nstrategy = "stream"\nbuffer = 100\n')  # fmt: skip
    _equal(lmshard.load_config(path), TokenDataset(web).packed(256, strategy="stream", buffer=100).batches(2))


@pytest.mark.parametrize(("text", "words"), [
    ('dataset = "d"\n[stream]\ninputs = ["x"]\n[sample]\nshape = "windows"\nbatch_size = 1\nseq_len = 8\n',
     "name the data once"),
    ('[stream]\ninputs = ["x"]\n[sample]\nshape = "random"\nbatch_size = 1\nseq_len = 8\n', 'shape = "windows" or'),
    ('[stream]\ninputs = ["x"]\nworkers = 2\n[sample]\nshape = "windows"\nbatch_size = 1\nseq_len = 8\n',
     r"unknown key 'workers' in \[stream\]"),
    ('[stream]\ntokenizer = "gpt2"\n[sample]\nshape = "windows"\nbatch_size = 1\nseq_len = 8\n', "needs inputs"),
])  # fmt: skip
def test_stream_table_mistakes_are_one_line(tmp_path, text, words):
    with pytest.raises(InputError, match=words) as e:
        lmshard.load_config(_config(tmp_path, text))
    assert str(e.value).startswith(str(tmp_path / "conf" / "loader.toml")) and "\n" not in str(e.value)


def test_a_yaml_file_says_what_the_toml_file_says(data, tmp_path):
    root, web, _ = data
    toml = _config(root, f'seed = 3\ndataset = "{web}"\n[sample]\nshape = "windows"\nbatch_size = 2\nseq_len = 64\n'
                         "stride = 32\n")  # fmt: skip
    yml = write(root / "conf" / "loader.yaml", f"seed: 3\ndataset: {web}\nsample:\n  shape: windows\n  batch_size: 2\n"
                                               "  seq_len: 64\n  stride: 32\n")  # fmt: skip
    _equal(lmshard.load_config(yml), lmshard.load_config(toml))
    bad = write(tmp_path / "bad.yaml", "sample: [unclosed\n")
    with pytest.raises(InputError, match=r"bad.yaml: cannot read the loader configuration"):
        lmshard.load_config(bad)
