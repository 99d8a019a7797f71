"""Advice that points the right way: other tools' option spellings get the lmshard equivalent
(or do exactly what it does), and each refusal names the thing the user typed and the fix."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from conftest import write
from test_hf_tokenizer import BOT, EOT, small
from test_prepare import make_texts
from test_stages import _files
from typer.testing import CliRunner

import lmshard.prepare.configfile as config_module
import lmshard.tokenizers.vocab as vocabularies
from lmshard.cli import app, spellings
from lmshard.errors import ConfigError
from lmshard.prepare import PrepareConfig, prepare, presets
from lmshard.runtime import Mixture, TokenDataset

runner = CliRunner()
WIDE = {"COLUMNS": "400", "HF_HUB_OFFLINE": "1"}  # a message is one line: no panel wrapping


def _invoke(args: list[str]):
    """(exit code, stdout and stderr as one line of words) of `lmshard ARGS`."""
    result = runner.invoke(app, args, env=WIDE)
    text = " ".join((result.stdout + result.stderr).replace("│", " ").split())
    return result.exit_code, text


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("advice")
    return write(tmp / "a.jsonl", "".join(json.dumps({"text": t}) + "\n" for t in make_texts(60, seed=4)))


# --- other tools' spellings ----------------------------------------------------------------

# (the spelling as typed, the words of the lmshard equivalent the answer must hold)
REFUSED = [
    (["--output-prefix", "data/x"], "use --out data/x"),
    (["--output_prefix=data/x"], "use --out data/x"),
    (["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "gpt2-vocab.json"], "use --tokenizer gpt2"),
    (["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "meta-llama/Meta-Llama-3-8B"],
     "use --tokenizer meta-llama/Meta-Llama-3-8B"),
    (["--tokenizer-model", "meta-llama/Meta-Llama-3-8B"], "use --tokenizer meta-llama/Meta-Llama-3-8B"),
    (["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", "tok.model"], "use --tokenizer tok.model"),
    (["--tokenizer-type", "SentencePieceTokenizer"], "use --tokenizer with the model's SentencePiece .model file"),
    (["--dtype", "int64"], "--shard-encoding uint32 (the default), uint16, packed or zstd, not int64"),
    (["--dataset-type", "webdataset"], "--format text|jsonl|json|csv|parquet|arrow forces one"),
    (["--vocab-file", "gpt2-vocab.json", "--merge-file", "gpt2-merges.txt"], "use --tokenizer gpt2"),
    (["--vocab-file", "mine/vocab.json", "--merge-file", "mine/merges.txt"],
     "names the vocabulary with --tokenizer alone: gpt2, r50k_base"),
    (["--tokenization", "bpe"], "names the vocabulary with --tokenizer alone: gpt2, r50k_base"),
    (["--data_name", "fineweb-edu"], "use --preset fineweb-edu"),
    (["--data_name", "openwebtext"], "--hf ID for a Hugging Face dataset, or --preset NAME"),
    (["--validation_split_percentage", "5"], "use --val-fraction 0.05"),
    (["--split-sentences"], "--text-mode line or paragraph"),
    (["--partitions", "4"], "--workers N"),
    (["--seq-length", "2048"], "the sequence length is chosen when loading"),
    (["--input"], "pass the input paths as arguments: lmshard prepare PATH... --out DIR"),
]  # fmt: skip


@pytest.mark.parametrize(("given", "fix"), REFUSED, ids=[" ".join(g) for g, _ in REFUSED])
def test_another_tools_option_gets_the_lmshard_equivalent(tmp_path, text, given, fix):
    code, said = _invoke(["prepare", str(text), "--out", str(tmp_path / "o"), *given])
    assert code == 2, said
    name = given[0].split("=")[0].replace("_", "-")
    assert f"{name}: " in said and fix in said, said
    assert "Possible options" not in said and "Did you mean" not in said  # click's guess is gone
    assert not (tmp_path / "o").exists()


def _flags(monkeypatch, args: list[str]) -> dict:
    """The options `prepare` hands the library for ARGS (the run itself is cut short)."""
    seen = {}

    def capture(*, file=None, flags=None, **kw):
        seen.update(flags)
        raise ConfigError("stop here")

    monkeypatch.setattr(config_module, "resolve_config", capture)
    code, said = _invoke(["prepare", *args])
    assert code == 1 and "stop here" in said, said
    return {k: v for k, v in seen.items() if v not in (None, [])}


# (another tool's spelling, lmshard's own), each with a value that differs from the default
SAME = [
    (["--num-proc", "3"], ["--workers", "3"]),
    (["--num_proc", "3"], ["--workers", "3"]),
    (["--preprocessing_num_workers", "3"], ["--workers", "3"]),
    (["--json-keys", "body"], ["--text-field", "body"]),
    (["--text_key", "body"], ["--text-field", "body"]),
    (["--max-samples", "5"], ["--max-docs", "5"]),
    (["--dataset_name", "org/ds"], ["--hf", "org/ds"]),
    (["--dataset_config_name", "en"], ["--hf-config", "en"]),
    (["--out_dir", "elsewhere"], ["--out", "elsewhere"]),
    (["--output_dir", "elsewhere"], ["--out", "elsewhere"]),
    (["--output-folder", "elsewhere"], ["--out", "elsewhere"]),
    (["--tasks", "4"], ["--num-tasks", "4"]),
    (["--eos-token", "<|endoftext|>"], ["--separator", "<|endoftext|>"]),
    (["--input", "b.txt"], ["b.txt"]),
    (["--input=b.txt"], ["b.txt"]),
    (["--input_files", "b.txt", "c.txt"], ["b.txt", "c.txt"]),
    (["--append-eod"], []),
    (["--tokenization", "gpt2"], ["--tokenizer", "gpt2"]),  # the seeds' spellings: read as the option, noted
    (["--tokens_per_chunk", "1024"], ["--tokens-per-shard", "1024"]),
    (["--output_path", "elsewhere"], ["--out", "elsewhere"]),
    (["--dtype", "uint16"], ["--shard-encoding", "uint16"]),
    (["--dataset-type", "jsonl"], ["--format", "jsonl"]),
]  # fmt: skip


@pytest.mark.parametrize(("alias", "canonical"), SAME, ids=[" ".join(a) for a, _ in SAME])
def test_an_alias_hands_the_library_what_the_lmshard_option_does(monkeypatch, alias, canonical):
    mine = _flags(monkeypatch, [*alias, "--out", "o"] if "elsewhere" not in alias else alias)
    own = _flags(monkeypatch, [*canonical, "--out", "o"] if "elsewhere" not in canonical else canonical)
    assert mine == own
    assert mine != _flags(monkeypatch, ["--out", "o"]) or alias == ["--append-eod"]  # not silently ignored


def test_every_spelling_of_the_issue_is_answered():
    """Each spelling the issue lists is an alias, an input option, a no-op or answered."""
    listed = ["input", "output-prefix", "append-eod", "tokenizer-type", "tokenizer-model", "input-files", "out-dir",
              "tokenization", "data-name", "output-path", "tokens-per-chunk", "json-keys", "workers", "vocab-file",
              "num-proc"]  # fmt: skip
    for name in listed:
        known = (name in spellings.ALIASES or name in spellings.INPUT_OPTIONS or name in spellings.NO_OPS
                 or spellings.advice(f"--{name}", [f"--{name}", "x"]) is not None or name == "workers")  # fmt: skip
        assert known, name


def test_megatron_input_and_append_eod_give_the_dataset_of_the_plain_command(tmp_path, text):
    """`--input FILE --append-eod` (Megatron-LM) is `FILE`: the same bytes, and a note that
    the end-of-text token is already the default."""
    plain = runner.invoke(app, ["prepare", str(text), "--out", str(tmp_path / "plain"), "--workers", "1"])
    assert plain.exit_code == 0, plain.output
    megatron = runner.invoke(app, ["prepare", "--input", str(text), "--append-eod", "--output_dir",
                                   str(tmp_path / "megatron"), "--workers", "1"])  # fmt: skip
    assert megatron.exit_code == 0, megatron.output
    assert _files(tmp_path / "megatron") == _files(tmp_path / "plain")
    assert "note: --append-eod: lmshard appends the end-of-text token after every document by default" in " ".join(
        megatron.stderr.split()
    )
    meta = json.loads((tmp_path / "plain" / "dataset_metadata.json").read_text())
    tokens = np.fromfile(next((tmp_path / "plain" / "train").glob("*.bin")), dtype="<u4")
    assert int((tokens == meta["tokenizer"]["eot_id"]).sum()) >= 1  # what --append-eod asks for is there


# --- the other advice ------------------------------------------------------------------------


def test_an_unknown_tokenizer_names_every_kind_it_can_be(tmp_path, text):
    code, said = _invoke(["prepare", str(text), "--out", str(tmp_path / "o"), "--tokenizer", "llama3"])
    assert code == 1
    for words in ("unknown tokenizer 'llama3'", "gpt2", "o200k_base", ".tiktoken file", "tokenizer.json",
                  "a directory holding one (save_pretrained)", "org/name"):  # fmt: skip
        assert words in said, (words, said)


def test_a_preset_name_given_to_hf_is_that_preset_with_a_note(tmp_path, monkeypatch):
    """`--hf fineweb-edu` is `--preset fineweb-edu` (as lmshard.stream("fineweb-edu") takes it),
    with a note; the options it gives the library are the preset's."""
    seen = []
    monkeypatch.setattr(config_module, "PrepareConfig", lambda **values: seen.append(values) or (_ for _ in ()).throw(
        ConfigError("stop here")))  # fmt: skip
    code, said = _invoke(["prepare", "--hf", "fineweb-edu", "--out", str(tmp_path / "o")])
    assert code == 1 and "stop here" in said, said
    assert "note: --hf fineweb-edu read as --preset fineweb-edu (it reads HuggingFaceFW/fineweb-edu" in said, said
    preset = [p for p in presets() if p.name == "fineweb-edu"][0]
    assert (seen[0]["hf"], seen[0].get("hf_config")) == (preset.hub_id, preset.config)
    assert not (tmp_path / "o").exists()
    code, listed = _invoke(["datasets"])
    assert code == 0
    names = [p.name for p in presets()]
    assert "fineweb-edu" in names and all(n in listed for n in names)
    assert all(p.hub_id in listed for p in presets())


def test_fetch_says_which_vocabularies_have_an_offline_route(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))

    def offline(url):
        raise OSError("offline (simulated)")

    def no_index(*args):
        raise AssertionError("a vocabulary without a package route was looked up on the index")

    monkeypatch.setattr(vocabularies, "_download", offline)
    monkeypatch.setattr(vocabularies, "_from_package_index", no_index)
    # every known vocabulary has a route today: the message as it would be for one without
    monkeypatch.setattr(vocabularies, "_PACKAGE_FALLBACK", {"r50k_base": vocabularies._PACKAGE_FALLBACK["r50k_base"]})
    for name in ("cl100k_base", "o200k_base"):
        code, said = _invoke(["tokenizer", "fetch", name])
        assert code == 1 and "trying the package index" not in said, said
        assert f"{name} has no offline route: only gpt2, r50k_base can also come from the package index" in said
        assert f"{name}.tiktoken (a .tiktoken file) here by hand" in said
        assert f"lmshard tokenizer fetch {name} --from FILE" in said


@pytest.fixture(scope="module")
def planned(tmp_path_factory, text):
    """A complete local scale-out run: prepare --num-tasks 2 with the local executor."""
    out = tmp_path_factory.mktemp("planned") / "ds"
    result = runner.invoke(app, ["prepare", str(text), "--out", str(out), "--num-tasks", "2", "--workers", "1"])
    assert result.exit_code == 0, result.output
    return out


def test_status_of_a_complete_local_run_says_it_is_done(planned):
    code, said = _invoke(["status", str(planned)])
    assert code == 0
    assert said == f"done: the dataset is complete; check it with: lmshard inspect {planned}"  # nothing is left to run
    assert not (planned.parent / f".{planned.name}.lmshard-work").exists()  # the work folder went with it
    code, usage = _invoke(["status", "-h"])
    assert code == 0 and "{DIR}" in usage and "{out}" not in usage


def test_packing_0_names_the_option(planned):
    cases = ((["--packing", "0"], "--packing 0: pass the row length in tokens, 1 or more"),
             (["--packing", "64", "--world-size", "0"], "--world-size 0: pass the number of ranks"),
             (["--packing", "64", "--batch-size", "0"], "--batch-size 0: pass the rows per rank"))  # fmt: skip
    for args, words in cases:
        code, said = _invoke(["inspect", str(planned), *args])
        assert code == 1 and words in said and "seq_len" not in said and "world_size" not in said, said


def test_the_default_worker_count_is_what_the_scheduler_granted(monkeypatch):
    """Not the node's cores: SLURM_CPUS_PER_TASK where a Slurm task has it, else the CPU affinity
    (taskset, a cgroup cpuset), checked in a process pinned to one core."""
    import subprocess
    import sys

    from lmshard.prepare import PrepareConfig

    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    assert PrepareConfig(inputs=["x"], out="o").n_workers() == 3
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    code = "from lmshard.prepare import PrepareConfig; print(PrepareConfig(inputs=['x'], out='o').n_workers())"
    pinned = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))  # fmt: skip
    assert pinned.stdout.strip() == "1"


def test_workers_0_says_what_it_means(tmp_path, text):
    code, said = _invoke(["prepare", str(text), "--out", str(tmp_path / "o"), "--workers", "0"])
    assert code == 0, said
    cores = len(os.sched_getaffinity(0))
    assert f"note: --workers 0 means one worker process per core this job may use: {cores} here" in said
    code, usage = _invoke(["prepare", "-h"])
    assert re.search(r"Worker processes \(0: one per core\)", usage), usage


def test_a_gpt2_and_llama_mixture_names_the_vocabularies(tmp_path, text):
    tok = small(tmp_path / "vocab", [BOT, EOT], bos_template=BOT)
    for name, tokenizer in (("web", "gpt2"), ("llama", str(tok))):
        prepare(PrepareConfig(inputs=[str(text)], out=str(tmp_path / name), tokenizer=tokenizer, workers=1,
                              val_fraction=0.0))  # fmt: skip
    import tokenizers

    n_llama = tokenizers.Tokenizer.from_file(str(tok)).get_vocab_size()  # 256 bytes and the two specials
    with pytest.raises(ConfigError) as caught:
        Mixture([(TokenDataset(tmp_path / "web"), 1), (TokenDataset(tmp_path / "llama"), 1)])
    said = str(caught.value)
    assert f"different vocabularies: {tmp_path / 'web'} with gpt2 (50,257 ids)" in said, said
    assert f"{tmp_path / 'llama'} with {tok} ({n_llama:,} ids)" in said, said
    assert said.endswith("prepare every source with one tokenizer") and "bos_id" not in said


def test_a_seeds_spelling_read_as_the_lmshard_option_says_so(monkeypatch):
    """`--tokens_per_chunk 1024` (a seed's prepare command) runs as --tokens-per-shard 1024, with
    a note naming both; a value that option would not take is answered instead (exit 2)."""
    def capture(*, file=None, flags=None, **kw):
        raise ConfigError("stop here")

    monkeypatch.setattr(config_module, "resolve_config", capture)
    code, said = _invoke(["prepare", "a.jsonl", "--out", "o", "--tokens_per_chunk", "1024", "--output_path", "o"])
    assert code == 1 and "stop here" in said, said
    assert "note: --tokens-per-chunk 1024 read as --tokens-per-shard 1024: shards of about that many tokens" in said
    assert "note: --output-path o read as --out o" in said
    code, said = _invoke(["prepare", "a.jsonl", "--out", "o", "--tokens_per_chunk", "lots"])
    assert code == 2 and "--tokens-per-chunk: use --tokens-per-shard lots" in said, said
