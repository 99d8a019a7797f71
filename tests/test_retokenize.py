"""`lmshard retokenize`: a GPT-2 dataset encoded with a Llama-3-like vocabulary (byte-level BPE
of more than 65,536 ids that puts a BOS before each text) equals a fresh prepare with that
vocabulary on the same inputs, document for document, in order and split, provenance and dedup
keys included; a vocabulary that normalizes text is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tokenizers
from test_hf_tokenizer import EOT, alphabet, big, byte_level  # noqa: F401  (module fixture: the big vocabulary)
from test_prepare import jsonl, make_texts
from tokenizers import AddedToken, normalizers
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import ArgumentError, ConfigError, FormatError
from lmshard.format import INDEX_DTYPE, load_metadata
from lmshard.format.provenance import SRC_DTYPE
from lmshard.interop.retokenize import retokenize_dataset, same_document
from lmshard.prepare import PrepareConfig, prepare


def _prepare(out, inputs, **kw):
    prepare(PrepareConfig(inputs=[str(p) for p in inputs], out=str(out), workers=2, val_fraction=0.1,
                          tokens_per_shard=kw.pop("tokens_per_shard", 30_000), quiet=True, **kw))  # fmt: skip
    return out


def _documents(root, split):
    """Every document of the split as its tokens, read with numpy from the shards and indexes."""
    meta = load_metadata(root)
    docs = []
    for shard in meta.split_shards(split):
        tokens = np.fromfile(root / shard.path, dtype="<u4")
        offsets = np.fromfile(root / shard.index_path, dtype=INDEX_DTYPE)
        docs += [tokens[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    return docs


def _records(root, split, kind="src"):
    """The split's provenance records (or with kind="attr", its attribute records), read with numpy."""
    meta = load_metadata(root)
    if kind == "src":
        return np.concatenate([np.fromfile(root / s.src_path, dtype=SRC_DTYPE) for s in meta.split_shards(split)])
    # (attributes: `length`'s three uint32 columns, one after another in each file)
    return np.concatenate([np.fromfile(root / s.attr_path, dtype="<u4").reshape(3, -1).T for s in
                           meta.split_shards(split)])  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("retok")
    texts = make_texts(900, seed=41)
    return [jsonl(tmp / "a.jsonl", texts[:500] + texts[:30]), jsonl(tmp / "b.jsonl", texts[500:])]


def test_retokenize_equals_a_fresh_prepare_with_the_new_vocabulary(tmp_path, inputs, big):  # noqa: F811
    source = _prepare(tmp_path / "gpt2", inputs, attributes=["length"])
    result = retokenize_dataset(source, str(big["file"]), tmp_path / "re", shard_encoding="uint32", workers=3)
    one = retokenize_dataset(source, str(big["file"]), tmp_path / "one", shard_encoding="uint32", workers=1).meta
    for shard in one.shards:  # the same bytes for any number of workers
        for f in shard.files():
            assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "re" / f).read_bytes(), f
    fresh = _prepare(tmp_path / "fresh", inputs, tokenizer=str(big["file"]), attributes=["length"])
    re_meta, fresh_meta = load_metadata(tmp_path / "re"), load_metadata(fresh)
    assert re_meta.tokenizer == fresh_meta.tokenizer and re_meta.tokenizer.bos_id is not None  # (BOS: auto)
    for split in ("train", "val"):
        got, want = _documents(tmp_path / "re", split), _documents(fresh, split)
        assert len(got) == len(want) == load_metadata(source).n_docs(split) > 0
        assert got == want  # every document's tokens, separators included, in order
        assert np.array_equal(_records(tmp_path / "re", split), _records(fresh, split))
        assert np.array_equal(_records(tmp_path / "re", split, "attr"), _records(fresh, split, "attr"))  # (kept)
    for key_file in fresh_meta.dedup.files:  # keys of the text: the same files
        assert (tmp_path / "re" / key_file.path).read_bytes() == (fresh / key_file.path).read_bytes()
    assert re_meta.drops == fresh_meta.drops and re_meta.records_read == fresh_meta.records_read
    assert re_meta.run.lineage[-1]["op"] == "retokenize" and result.source.tokenizer.name == "gpt2"
    code = CliRunner().invoke(app, ["inspect", str(tmp_path / "re")])
    assert code.exit_code == 0 and "verified" in code.output, code.output
    # a position in the old dataset: the start of the same document in the new one
    old_idx = np.fromfile(source / load_metadata(source).split_shards("train")[0].index_path, dtype=INDEX_DTYPE)
    new_idx = np.fromfile(fresh / fresh_meta.split_shards("train")[0].index_path, dtype=INDEX_DTYPE)
    assert same_document(load_metadata(source), re_meta, "train", int(old_idx[3]) + 2) == int(new_idx[3])


def test_the_command_line_and_a_uint16_source_for_a_larger_vocabulary(tmp_path, inputs, big):  # noqa: F811
    source = _prepare(tmp_path / "u16", inputs, shard_encoding="uint16")
    with pytest.raises(ConfigError, match="uint16 holds ids up to 65,535"):
        retokenize_dataset(source, str(big["file"]), tmp_path / "no")
    assert not (tmp_path / "no").exists()
    done = CliRunner().invoke(app, ["retokenize", str(source), "--tokenizer", str(big["file"]), "--out",
                                    str(tmp_path / "re"), "--shard-encoding", "packed"])  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "retokenized 9" in done.output and load_metadata(tmp_path / "re").encoding.name == "packed"


def test_a_vocabulary_that_normalizes_text_is_refused(tmp_path, inputs):
    tok = byte_level(alphabet(), [])
    tok.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])
    tok.normalizer = normalizers.Lowercase()  # decoding gives lower-case text, not the text encoded
    path = tmp_path / "lower.json"
    tok.save(str(path))
    assert isinstance(tokenizers.Tokenizer.from_file(str(path)).normalizer, normalizers.Lowercase)
    source = _prepare(tmp_path / "lower", inputs[:1], tokenizer=str(path))
    with pytest.raises(ConfigError, match="its normalizer \\(Lowercase\\) changes the text"):
        retokenize_dataset(source, "gpt2", tmp_path / "re")
    assert not (tmp_path / "re").exists()
    assert json.loads((source / "dataset_metadata.json").read_text())["tokenizer"]["vocab_format"] == "tokenizer.json"


def test_a_document_that_does_not_round_trip_is_named(tmp_path):
    """Tokens no tokenizer would have made from their text ("a" "b" where GPT-2 has "ab"), imported
    from a nanoGPT file: the text decodes, but encodes back to other tokens."""
    from lmshard.interop.importer import import_dataset

    ab = [64, 65]  # 'a', 'b'
    docs = [[314, 716, 257, 3797, 13, 50256]] * 3 + [ab + [50256]]  # the fourth document is the odd one
    (tmp_path / "nano").mkdir()
    (tmp_path / "nano" / "train.bin").write_bytes(np.array(sum(docs, []), dtype="<u2").tobytes())
    import_dataset(tmp_path / "nano", "nanogpt", tmp_path / "imported", tokenizer="gpt2")
    with pytest.raises(ConfigError, match="train document 4 does not decode to the text it was made from"):
        retokenize_dataset(tmp_path / "imported", "gpt2", tmp_path / "re", workers=1)
    assert not (tmp_path / "re").exists()


def test_damage_ordinary_added_tokens_separators_and_positions(tmp_path, inputs, big):  # noqa: F811
    source = _prepare(tmp_path / "src", inputs, separator="<|endoftext|>")  # (GPT-2's own, spelled out)
    retokenize_dataset(source, str(big["file"]), tmp_path / "ok", shard_encoding="uint32")  # the new one's own EOT
    meta = load_metadata(source)
    with pytest.raises(ArgumentError, match="token 10,000,000 is not in the train split"):
        same_document(meta, load_metadata(tmp_path / "ok"), "train", 10_000_000)
    shard = meta.split_shards("train")[0]
    data = bytearray((source / shard.path).read_bytes())
    data[40] ^= 1  # one token changed: the block no longer matches its sum
    (source / shard.path).write_bytes(bytes(data))
    with pytest.raises(FormatError, match="block 0"):
        retokenize_dataset(source, "gpt2", tmp_path / "re")
    assert not (tmp_path / "re").exists()
    tok = tokenizers.Tokenizer.from_file(str(big["file"]))
    tok.add_tokens([AddedToken("naïve")])  # an ordinary added token: matched in text
    tok.save(str(tmp_path / "added.json"))
    with_added = _prepare(tmp_path / "added", inputs[:1], tokenizer=str(tmp_path / "added.json"))
    with pytest.raises(ConfigError, match="its ordinary added tokens \\('naïve'\\) are matched in text"):
        retokenize_dataset(with_added, "gpt2", tmp_path / "re")
