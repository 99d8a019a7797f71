"""`lmshard inspect A --diff B`: the documents of a dataset and of its `--append`ed copy, by key:
exactly the appended documents are added (none removed, every old one kept), each example named
by its place in a new shard and by its input and record (provenance); with dedup off (keys
decoded from the shards) the same answer."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import write
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.prepare import PrepareConfig, prepare


def _texts(n: int, salt: str) -> str:
    return "".join(json.dumps({"text": f"{salt} document {i}: " + "word " * (i % 13 + 1)}) + "\n" for i in range(n))


@pytest.mark.parametrize("dedup", ["document", "none"])
def test_diff_of_a_dataset_and_its_append_lists_exactly_the_appended_documents(tmp_path, dedup):
    write(tmp_path / "old.jsonl", _texts(120, "old"))
    write(tmp_path / "new.jsonl", _texts(45, "new") + _texts(5, "old"))  # 5 the dataset has already
    common = {"workers": 1, "val_fraction": 0.2, "quiet": True, "dedup": dedup, "tokens_per_shard": 600}
    prepare(PrepareConfig(inputs=[str(tmp_path / "old.jsonl")], out=str(tmp_path / "a"), **common))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    prepare(PrepareConfig(inputs=[str(tmp_path / "new.jsonl")], out=str(tmp_path / "b"), append=True, **common))
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "a"), "--diff", str(tmp_path / "b"), "--json"])
    assert result.exit_code == 0, result.output
    said = json.loads(result.output)
    appended = 45 if dedup == "document" else 50  # (dedup off: the 5 repeats are new documents, with old keys)
    assert (said["added"], said["removed"], said["kept"]) == (45, 0, 120)
    assert (said["a_documents"], said["b_documents"]) == (120, 120 + appended)
    for example in said["examples"]["added"]:
        assert example["input"].endswith("new.jsonl") and 1 <= example["record"] <= 45
        number = int(example["document"].rsplit(":", 1)[0].rsplit("_", 1)[1])
        old = [p for p in (tmp_path / "a" / example["document"].split("/")[0]).glob("shard_*.bin")]
        assert number >= len(old)  # in a shard the append wrote
    plain = CliRunner().invoke(app, ["inspect", str(tmp_path / "b"), "--diff", str(tmp_path / "a")])
    assert plain.exit_code == 0 and "added 0, removed 45, kept 120" in " ".join(plain.output.split()), plain.output


def test_the_lineage_lists_prepare_append_and_convert_in_order(tmp_path):
    """run.lineage: prepare, then append, then convert, each with the dataset's documents and
    tokens after it (equal to the metadata's totals at that point), oldest first; inspect shows
    it; an import starts its own."""
    from lmshard.format import load_metadata
    from lmshard.interop import convert_dataset, export_dataset, import_dataset

    write(tmp_path / "a.jsonl", _texts(80, "first"))
    write(tmp_path / "b.jsonl", _texts(30, "second"))
    common = {"workers": 1, "val_fraction": 0.1, "quiet": True}
    prepare(PrepareConfig(inputs=[str(tmp_path / "a.jsonl")], out=str(tmp_path / "ds"), **common))
    first = load_metadata(tmp_path / "ds")
    prepare(PrepareConfig(inputs=[str(tmp_path / "b.jsonl")], out=str(tmp_path / "ds"), append=True, **common))
    second = load_metadata(tmp_path / "ds")
    convert_dataset(tmp_path / "ds", "uint16", tmp_path / "small")
    third = load_metadata(tmp_path / "small")
    steps = [(e["op"], e["docs"], e["tokens"]) for e in third.run.lineage]
    assert steps == [("prepare", first.total_docs, first.total_tokens), ("append", second.total_docs,
                     second.total_tokens), ("convert", second.total_docs, second.total_tokens)]  # fmt: skip
    assert third.run.lineage[1]["inputs"] == 1 and third.run.lineage[2]["encoding"] == "uint16"
    shown = CliRunner().invoke(app, ["inspect", str(tmp_path / "small")])
    assert "history" in shown.output and "convert" in shown.output, shown.output
    as_json = json.loads(CliRunner().invoke(app, ["inspect", str(tmp_path / "small"), "--json"]).output)
    assert as_json["history"] == list(third.run.lineage)
    export_dataset(tmp_path / "ds", "nanogpt", tmp_path / "nano")
    back = import_dataset(tmp_path / "nano", "nanogpt", tmp_path / "back", tokenizer="gpt2")
    assert [e["op"] for e in back.run.lineage] == ["import"] and back.run.lineage[0]["from"] == "nanogpt"
