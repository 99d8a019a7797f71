"""The general rule: anything that determines a dataset's bytes is in its fingerprint. Every
option of `PrepareConfig` is either recorded (a changed value changes the fingerprint, and a
resume names it in one line) or listed as transient (where the dataset is written, how many
processes write it, how the run treats --out: the bytes are the same whatever its value, as
the byte-identity tests of each check); so are the inputs' identities, the vocabulary and a
filter plugin's code. A new option fails here until it is put on one side."""

from __future__ import annotations

import dataclasses

import pytest
from test_prepare import jsonl, make_texts

from lmshard.prepare import PrepareConfig
from lmshard.prepare.config import TRANSIENT_OPTIONS
from lmshard.prepare.documents.sources import discover
from lmshard.prepare.output.claim import _fingerprint, difference
from lmshard.tokenizers import load_tokenizer

# A value other than the default for every recorded option (valid with the base configuration).
OTHER = {"inputs": None, "exclude": ["*.md"], "filters": ["c4"], "include_hidden": True, "tokenizer": "TINY",
         "separator": "<|endoftext|>", "bos": "yes", "format": "jsonl", "text_field": "body", "text_mode": "line",
         "normalize": "none", "byte_exact": True, "min_chars": 5, "max_chars": 5000, "overlong": "truncate",
         "dedup": "none", "dedup_lines": True, "near_dedup": True, "minhash": "5:20x5:0.7", "val_fraction": 0.2,
         "seed": 7, "tokens_per_shard": 1000, "shard_encoding": "uint16", "eot_position": "before", "max_docs": 10,
         "on_error": "skip", "decode_errors": "replace", "hf": None, "hf_config": "x", "hf_split": "test",
         "streaming": True, "revision": "main", "hf_task": None, "hf_tasks": None, "decontaminate": None,
         "decontaminate_n": 10, "decontaminate_lines": True, "attributes": ["length"],
         "val_by": None, "val_tokens": None}  # fmt: skip (--val-by with --val-tokens: tests/test_val_by.py)


def _tiny_vocabulary(path, words="hello world the cat"):
    """A small tokenizer.json with an end-of-text token, trained here on `words` (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([words] * 10, BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                     show_progress=False))  # fmt: skip
    tok.save(str(path))
    return str(path)


def _fp(config: PrepareConfig) -> dict:
    sources = discover(config.inputs, config.format, config.exclude, include_hidden=config.include_hidden)
    return _fingerprint(config, sources, load_tokenizer(config.tokenizer), None)


def test_every_option_is_recorded_or_transient():
    fields = {f.name for f in dataclasses.fields(PrepareConfig)}
    assert set(TRANSIENT_OPTIONS) <= fields
    assert fields - set(TRANSIENT_OPTIONS) == set(OTHER), "a new option: add it to OTHER or TRANSIENT_OPTIONS"


@pytest.mark.parametrize("option", [k for k, v in OTHER.items() if v is not None])
def test_a_changed_recorded_option_changes_the_fingerprint_and_is_named(tmp_path, option):
    src = jsonl(tmp_path / "a.jsonl", make_texts(5))
    bench = []
    if option == "decontaminate_lines":  # (it needs a benchmark to match lines against)
        bench = [str(jsonl(tmp_path / "quiz.jsonl", ["a benchmark question of more than thirteen words, to be "
                                                     "matched against the documents as they are read"]))]  # fmt: skip
    base = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "o"), decontaminate=bench)
    value = _tiny_vocabulary(tmp_path / "tok.json") if option == "tokenizer" else OTHER[option]
    changed = dataclasses.replace(base, **{option: value})
    said = difference(_fp(base), _fp(changed))
    assert said is not None and option.replace("_", "-") in said, said


def test_inputs_vocabulary_and_plugin_code_are_in_the_fingerprint(tmp_path):
    src = jsonl(tmp_path / "a.jsonl", make_texts(5))
    rules = tmp_path / "rules.py"
    rules.write_text("def keep(text):\n    return None\n")
    config = PrepareConfig(inputs=[str(src)], out=str(tmp_path / "o"), filters=[f"{rules}:keep"])
    before = _fp(config)
    assert "filter_sources" in before["config"]
    rules.write_text("def keep(text):\n    return 'gone'\n")
    assert "the filter plugin" in (difference(before, _fp(config)) or "")
    rules.write_text("def keep(text):\n    return None\n")
    assert difference(before, _fp(config)) is None
    jsonl(src, make_texts(6))
    assert f"input {src} changed" in (difference(before, _fp(config)) or "")
    vocab = _tiny_vocabulary(tmp_path / "tok.json")
    tiny = dataclasses.replace(config, tokenizer=vocab)
    first = _fp(tiny)
    _tiny_vocabulary(tmp_path / "tok.json")  # the same file again: the same fingerprint
    assert difference(first, _fp(tiny)) is None
    _tiny_vocabulary(tmp_path / "tok.json", "a dog is not a cat")  # the same path, another vocabulary
    assert "vocabulary changed" in (difference(first, _fp(tiny)) or "")
    for transient in ("workers", "num_tasks", "unit_size", "quiet", "log_interval"):
        moved = dataclasses.replace(config, **{transient: {"workers": 3, "num_tasks": 4, "unit_size": 1 << 20,
                                                           "quiet": True, "log_interval": 1.0}[transient]})  # fmt: skip
        assert difference(_fp(config), _fp(moved)) is None, transient
