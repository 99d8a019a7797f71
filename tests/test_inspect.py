"""`lmshard inspect`: verification catches each kind of corruption, names the shard, exits 2."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import xxhash
from conftest import GPT2_EOT, read_docs
from test_prepare import jsonl, make_texts
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.errors import EXIT_CORRUPT
from lmshard.format.blocks import block_sums
from lmshard.inspect import verify
from lmshard.inspect.verify import verify_dataset
from lmshard.prepare import PrepareConfig, prepare

runner = CliRunner()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inspect")
    src = jsonl(tmp / "a.jsonl", make_texts(400, seed=3))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp / "ds"), workers=1, tokens_per_shard=3000, val_fraction=0.1))
    return tmp / "ds"


@pytest.fixture
def dataset(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "ds")
    return tmp_path / "ds"


def inspect_json(path, *extra):
    result = runner.invoke(app, ["inspect", str(path), "--json", *extra])
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip().startswith("{") else result.output


def test_fresh_dataset_verifies_and_counts_match_raw_files(dataset):
    code, report = inspect_json(dataset)
    assert code == 0 and report["ok"] and report["problems"] == []
    for split in ("train", "val"):
        docs = read_docs(dataset, split)
        assert report["splits"][split]["n_docs"] == len(docs)
        assert report["splits"][split]["n_tokens"] == sum(len(d) for d in docs)
    lengths = [len(d) for s in ("train", "val") for d in read_docs(dataset, s)]
    assert report["doc_length_tokens"]["max"] == max(lengths)
    assert report["doc_length_tokens"]["median"] == float(np.median(lengths))
    assert report["top_tokens"][0]["count"] > 0


def first_shard(ds):
    return json.loads((ds / "dataset_metadata.json").read_text())["splits"]["train"]["shards"][1]


def flip_byte(ds):
    path = ds / first_shard(ds)["path"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2 + 1] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(ds):
    path = ds / first_shard(ds)["path"]
    path.write_bytes(path.read_bytes()[:-3])


def delete(ds):
    (ds / first_shard(ds)["path"]).unlink()


def edit_count(ds):
    """A shard's n_tokens, with the totals edited to match (else the metadata alone is refused)."""
    meta = json.loads((ds / "dataset_metadata.json").read_text())
    for entry in (meta["splits"]["train"]["shards"][1], meta["splits"]["train"], meta):
        entry["n_tokens"] += 1
    (ds / "dataset_metadata.json").write_text(json.dumps(meta))


def token_too_big(ds):
    path = ds / first_shard(ds)["path"]
    tokens = np.fromfile(path, dtype="<u4")
    tokens[5] = 50257
    tokens.tofile(path)


def bad_index(ds):
    path = ds / first_shard(ds)["index_path"]
    offsets = np.fromfile(path, dtype="<u8")
    offsets[2], offsets[3] = offsets[3], offsets[2]
    offsets.tofile(path)


@pytest.mark.parametrize("corrupt", [flip_byte, truncate, delete, edit_count, token_too_big, bad_index])
def test_corruption_exits_2_and_names_the_shard(dataset, corrupt):
    corrupt(dataset)
    code, report = inspect_json(dataset)
    assert code == EXIT_CORRUPT and not report["ok"]
    name = first_shard(dataset)["path"]
    assert any(name in p for p in report["problems"]), report["problems"]
    assert all("lmshard prepare" in p for p in report["problems"])


def test_the_figures_of_a_damaged_dataset_say_they_are_of_the_shards_read(dataset):
    """inspect of a dataset with a shard missing still shows its length figures and top tokens,
    labelled as those of the shards it could read; a sound dataset's are not labelled."""
    whole = runner.invoke(app, ["inspect", str(dataset)])
    assert whole.exit_code == 0 and "doc length " in whole.output and "of the shards read" not in whole.output
    keys = next((dataset / "dedup").glob("doc_keys_*.u64"))  # a damaged key file: every shard still read whole
    good = keys.read_bytes()
    keys.write_bytes(bytes([good[0] ^ 1]) + good[1:])
    result = runner.invoke(app, ["inspect", str(dataset)])
    assert result.exit_code == EXIT_CORRUPT and "doc length " in result.output, result.output
    assert "of the shards read" not in result.output, result.output
    keys.write_bytes(good)
    delete(dataset)
    result = runner.invoke(app, ["inspect", str(dataset)])
    assert result.exit_code == EXIT_CORRUPT, result.output
    assert "doc length (of the shards read)" in result.output, result.output
    assert "most frequent tokens (of the shards read):" in result.output, result.output


def test_quick_skips_checksums_but_catches_structure(dataset):
    flip_byte(dataset)
    assert inspect_json(dataset, "--quick")[0] == 0  # a flipped byte needs the checksum
    truncate(dataset)
    assert inspect_json(dataset, "--quick")[0] == EXIT_CORRUPT


def test_quick_reads_no_token_data(dataset, monkeypatch):
    """--quick must not open token files: make every .bin unreadable and check it still passes."""
    for path in dataset.rglob("*.bin"):
        path.chmod(0)
    import builtins

    real_open = builtins.open

    def guarded(file, *a, **k):
        assert not str(file).endswith(".bin"), f"--quick opened {file}"
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(np, "memmap", lambda *a, **k: pytest.fail("--quick memory-mapped tokens"))
    report = verify_dataset(dataset, quick=True)
    assert report.ok and report.token_counts is None


def test_usage_errors_exit_1(tmp_path):
    """Each in one line naming what is there and what to run: nothing, a directory of other
    files, a file (an input, say), a build a prepare run left unfinished beside its --out, or
    that build itself."""

    def said(path):
        result = runner.invoke(app, ["inspect", str(path)])
        assert result.exit_code == 1, result.output
        return " ".join(result.output.split())

    assert "no such directory" in said(tmp_path / "missing")
    assert "not an lmshard dataset" in said(tmp_path)
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    assert f"a file, not a dataset directory; `lmshard prepare {tmp_path / 'a.jsonl'} --out DIR`" in said(
        tmp_path / "a.jsonl")
    build = tmp_path / ".ds.lmshard-partial"
    build.mkdir()
    assert f"not there yet: a prepare run left its build in {build}" in said(tmp_path / "ds")
    assert f"is the unfinished build of {tmp_path / 'ds'}" in said(build)


def test_sample_and_doc_decode_real_text(dataset, reference):
    result = runner.invoke(app, ["inspect", str(dataset), "--sample", "3", "--doc", "train/shard_000000:0"])
    assert result.exit_code == 0, result.output
    first = read_docs(dataset, "train")[0]
    assert reference.decode(first[:-1].tolist())[:30] in result.output
    assert result.output.count("tokens)") == 4
    result = runner.invoke(app, ["inspect", str(dataset), "--doc", "train/shard_000000:99999"])
    assert result.exit_code == 1 and "no document 99999" in result.output


def test_doc_to_a_file_saves_the_documents_text_exactly(dataset, reference):
    """`inspect --doc SHARD:I > doc.txt`: the document's own text, byte for byte (no separator
    decoded after it, no newline added), its name and length on stderr."""
    import subprocess
    import sys

    first = read_docs(dataset, "train")[0]
    done = subprocess.run([sys.executable, "-m", "lmshard", "inspect", str(dataset), "--doc", "train/shard_000000:0"],
                          capture_output=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert first[-1] == GPT2_EOT and done.stdout == reference.decode(first[:-1].tolist()).encode()
    assert f"train/shard_000000:0 ({len(first):,} tokens)" in done.stderr.decode()


def test_unfinished_run_is_reported(dataset):
    (dataset / "dataset_metadata.json").unlink()
    (dataset / "_PREPARE_IN_PROGRESS").write_text("{}")
    code, out = inspect_json(dataset)
    assert code == EXIT_CORRUPT and "did not finish" in json.dumps(out)


def test_metadata_path_escaping_the_dataset_is_refused(dataset):
    meta = json.loads((dataset / "dataset_metadata.json").read_text())
    meta["splits"]["train"]["shards"][0]["path"] = "../../etc/passwd"
    (dataset / "dataset_metadata.json").write_text(json.dumps(meta))
    code, report = inspect_json(dataset)
    assert code == EXIT_CORRUPT and "escapes the dataset directory" in report["problems"][0]


def test_plot_writes_a_png(dataset, tmp_path):
    result = runner.invoke(app, ["inspect", str(dataset), "--quick", "--plot", str(tmp_path / "h.png")])
    assert result.exit_code == 0, result.output
    png = (tmp_path / "h.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


# -- corruptions only one check can see -------------------------------------------------------
# Each edit below keeps every token id in range and the structure plausible, and most rewrite
# the metadata checksum to match, so exactly one check stands between it and "verified".


def shard_arrays(ds, split="train", k=1):
    """(metadata entry, tokens, offsets) of shard k of a split, read with numpy."""
    entry = json.loads((ds / "dataset_metadata.json").read_text())["splits"][split]["shards"][k]
    return entry, np.fromfile(ds / entry["path"], dtype="<u4"), np.fromfile(ds / entry["index_path"], dtype="<u8")


def save(ds, entry, tokens=None, offsets=None, fix_checksums=False):
    """Write edited arrays back; with fix_checksums, record their new xxh3-64 in the metadata."""
    if tokens is not None:
        tokens.tofile(ds / entry["path"])
    if offsets is not None:
        offsets.tofile(ds / entry["index_path"])
    if fix_checksums:
        meta = json.loads((ds / "dataset_metadata.json").read_text())
        for split in meta["splits"].values():
            for shard in split["shards"]:
                if shard["path"] == entry["path"]:
                    shard["xxh3_64"] = xxhash.xxh3_64_hexdigest((ds / shard["path"]).read_bytes())
                    shard["index_xxh3_64"] = xxhash.xxh3_64_hexdigest((ds / shard["index_path"]).read_bytes())
                    sums = block_sums((ds / shard["path"]).read_bytes())  # the per-block sums as well
                    (ds / shard["sums_path"]).write_bytes(sums)
                    shard["sums_xxh3_64"] = xxhash.xxh3_64_hexdigest(sums)
        (ds / "dataset_metadata.json").write_text(json.dumps(meta))


def only_problem(ds, *words):
    """inspect exits 2 with exactly one problem, naming the shard and containing `words`."""
    code, report = inspect_json(ds)
    assert code == EXIT_CORRUPT and len(report["problems"]) == 1, report
    assert all(w in report["problems"][0] for w in words), report["problems"]
    return report["problems"][0]


def test_token_changed_to_another_valid_id_is_caught_by_the_checksum(dataset):
    entry, tokens, offsets = shard_arrays(dataset)
    pos = int(offsets[1])  # the first token of document 1: not a boundary, not EOT
    tokens[pos] = 11 if tokens[pos] != 11 else 12
    save(dataset, entry, tokens)
    only_problem(dataset, entry["path"], f"block {pos // 16384} (tokens", "does not match its checksum",
                 "lmshard prepare")  # fmt: skip


def test_index_entry_moved_to_another_eot_is_caught_by_the_index_checksum(dataset):
    """Document 2's start moves one token later and that token becomes an EOT, with the token
    checksum updated: sizes, ordering, ids and EOT boundaries all still look right."""
    entry, tokens, offsets = shard_arrays(dataset)
    k = next(i for i in range(1, len(offsets) - 1) if offsets[i + 1] - offsets[i] > 2)
    offsets[k] += 1
    tokens[offsets[k] - 1] = GPT2_EOT
    save(dataset, entry, tokens, fix_checksums=True)  # the token checksum only: the index's stays old
    save(dataset, entry, offsets=offsets)
    only_problem(dataset, entry["path"], "index checksum", entry["index_xxh3_64"])


def test_eot_replaced_by_another_token_is_caught_at_the_boundary(dataset):
    entry, tokens, offsets = shard_arrays(dataset)
    assert tokens[offsets[3] - 1] == GPT2_EOT
    tokens[offsets[3] - 1] = 13
    save(dataset, entry, tokens, fix_checksums=True)
    only_problem(dataset, entry["path"], "1 document boundaries without the EOT token 50256")


@pytest.fixture(scope="module")
def before(tmp_path_factory):
    """A small dataset with the EOT before each document (llm.c style)."""
    tmp = tmp_path_factory.mktemp("before")
    src = jsonl(tmp / "a.jsonl", make_texts(120, seed=4))
    prepare(PrepareConfig(inputs=[str(src)], out=str(tmp / "ds"), workers=1, tokens_per_shard=1500,
                          val_fraction=0.0, eot_position="before"))  # fmt: skip
    return tmp / "ds"


def test_eot_before_dataset_verifies_and_its_boundaries_are_checked(before, tmp_path):
    code, report = inspect_json(before)
    assert code == 0 and report["eot_position"] == "before", report
    ds = shutil.copytree(before, tmp_path / "b")
    entry, tokens, offsets = shard_arrays(ds)
    assert (tokens[offsets[:-1]] == GPT2_EOT).all() and tokens[-1] != GPT2_EOT
    tokens[offsets[2]] = 13  # the separator opening document 2
    save(ds, entry, tokens, fix_checksums=True)
    only_problem(ds, entry["path"], "1 document boundaries without the EOT token")


@pytest.mark.parametrize("side", ["after", "before"])
def test_eot_on_the_wrong_side_of_the_metadata_is_caught(dataset, before, tmp_path, side):
    """An "after" dataset whose metadata says "before", and the reverse: every boundary fails."""
    ds = dataset if side == "after" else shutil.copytree(before, tmp_path / "b")
    meta = json.loads((ds / "dataset_metadata.json").read_text())
    meta["eot_position"] = "before" if side == "after" else "after"
    (ds / "dataset_metadata.json").write_text(json.dumps(meta))
    code, report = inspect_json(ds)
    assert code == EXIT_CORRUPT and report["problems"]
    assert all("document boundaries without the EOT token" in p for p in report["problems"])
    n_shards = sum(len(s["shards"]) for s in meta["splits"].values())
    assert len(report["problems"]) == n_shards


def test_small_blocks_verify_the_same_and_count_every_token(dataset, monkeypatch):
    """Shards read in blocks of 97 tokens (not 16 Mi): checksums, EOT boundaries and token counts
    must carry across block edges. Counts are checked against numpy's bincount of the raw files."""
    monkeypatch.setattr(verify, "BLOCK_TOKENS", 97)
    report = verify_dataset(dataset)
    assert report.ok, report.problems
    everything = np.concatenate([d for s in ("train", "val") for d in read_docs(dataset, s)])
    assert np.array_equal(report.token_counts, np.bincount(everything, minlength=50257))
    entry, tokens, offsets = shard_arrays(dataset)
    edge = int(offsets[4] - 1)  # an EOT; blocks of `edge` tokens start the second block on it
    tokens[edge] = 13
    tokens[int(offsets[1])] ^= 1  # and an in-range change in the first block
    save(dataset, entry, tokens)
    for block in (edge, edge + 1, 97):  # the EOT first in a block, last in a block, anywhere
        monkeypatch.setattr(verify, "BLOCK_TOKENS", block)
        problems = [str(p) for p in verify_dataset(dataset).problems]
        assert len(problems) == 2, (block, problems)
        assert "checksum" in problems[0] and "1 document boundaries without the EOT" in problems[1]


# -- structure, totals and metadata: --quick reads no tokens, so these are its only defence ----


def swap_index(ds):
    entry, _, offsets = shard_arrays(ds)
    offsets[2], offsets[3] = offsets[3], offsets[2]
    save(ds, entry, offsets=offsets)


def index_ends_short(ds):
    entry, _, offsets = shard_arrays(ds)
    offsets[-1] -= 1
    save(ds, entry, offsets=offsets)


def index_starts_late(ds):
    entry, _, offsets = shard_arrays(ds)
    offsets[0] = 1
    save(ds, entry, offsets=offsets)


def truncate_index(ds):
    entry, _, offsets = shard_arrays(ds)
    save(ds, entry, offsets=offsets[:-1])


@pytest.mark.parametrize("corrupt", [swap_index, index_ends_short, index_starts_late, truncate_index])
@pytest.mark.parametrize("quick", [True, False])
def test_index_structure_is_checked_even_in_quick_mode(dataset, corrupt, quick):
    corrupt(dataset)
    report = verify_dataset(dataset, quick=quick)
    structural = [p for p in report.problems if "checksum" not in p.what]
    assert len(structural) == 1 and structural[0].where == shard_arrays(dataset)[0]["path"], report.problems


def edit_meta(ds, change):
    meta = json.loads((ds / "dataset_metadata.json").read_text())
    change(meta)
    (ds / "dataset_metadata.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "change,words",
    [
        (lambda m: m["splits"]["train"].update(n_docs=m["splits"]["train"]["n_docs"] + 1), "split train: n_docs"),
        (lambda m: m["splits"]["val"].update(n_tokens=m["splits"]["val"]["n_tokens"] - 1), "split val: n_tokens"),
        (lambda m: m.update(n_tokens=m["n_tokens"] + 1), "n_tokens"),
        (lambda m: m.update(n_docs=m["n_docs"] - 1), "n_docs"),
    ],
)
def test_totals_must_equal_the_sum_of_the_shards(dataset, change, words):
    edit_meta(dataset, change)
    for quick in (True, False):
        problems = [str(p) for p in verify_dataset(dataset, quick=quick).problems]
        assert len(problems) == 1 and words in problems[0] and "sum of" in problems[0], problems


@pytest.mark.parametrize("key,value", [("eot_id", 0), ("n_vocab", 50000), ("ranks_sha256", "0" * 64), ("name", "x")])
def test_tokenizer_state_must_agree_with_the_metadata(dataset, key, value):
    state = json.loads((dataset / "tokenizer_state.json").read_text())
    state[key] = value
    (dataset / "tokenizer_state.json").write_text(json.dumps(state))
    problems = [str(p) for p in verify_dataset(dataset, quick=True).problems]
    assert problems == [f"tokenizer_state.json: '{key}' disagrees with the metadata; {verify.FIX_SHARD}"]


@pytest.mark.parametrize("content", ["[]", "{not json", None])
def test_unreadable_tokenizer_state_is_a_problem_not_a_crash(dataset, content):
    path = dataset / "tokenizer_state.json"
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    problems = [str(p) for p in verify_dataset(dataset, quick=True).problems]
    assert len(problems) == 1 and problems[0].startswith("tokenizer_state.json: "), problems


@pytest.mark.parametrize(
    "change,words",
    [
        (lambda m: m.update(format_version=4), "format version 4"),
        (lambda m: m.update(dtype="uint16"), "'uint16'"),
        (lambda m: m.update(byte_order="big"), "'big'"),
        (lambda m: m.update(eot_position="middle"), "eot_position 'middle'"),
        (lambda m: m.update(format="other"), "not lmshard metadata"),
        (lambda m: m["splits"]["train"]["shards"][0].update(n_docs=-1), "'n_docs' is negative"),
        (lambda m: m["splits"]["train"]["shards"][0].pop("xxh3_64"), "'xxh3_64' is missing"),
        (lambda m: m["splits"]["train"]["shards"][0].update(index_path="/etc/passwd"), "escapes the dataset"),
        (lambda m: m["tokenizer"].pop("eot_id"), "tokenizer entry: 'eot_id' is missing"),
        (lambda m: m["splits"].update(val="x"), "split 'val' is not an object"),  # was an AttributeError
        (lambda m: m["splits"]["train"].update(shards=5), "split 'train' is not an object with a list"),
        (lambda m: m["tokenizer"].update(n_vocab="50257"), "'n_vocab' is str, not int"),
        (lambda m: m["splits"]["train"]["shards"][0].update(n_tokens=True), "'n_tokens' is bool, not int"),
        (lambda m: m.update(sources="x"), "'sources' is str, not list"),
        (lambda m: m["splits"].update(test=m["splits"].pop("val")), "unknown split(s) 'test'"),
        (lambda m: m["drops"].update(decode_error="many"), "'decode_error' is str, not int"),
        (lambda m: m["tokenizer"].update(n_vocab=10**13), "outside [1, 2**32]"),
        (lambda m: m["tokenizer"].update(eot_id=50257), "'eot_id' 50257 is not below n_vocab"),
    ],
)
def test_metadata_schema_is_refused_with_the_fix(dataset, change, words):
    edit_meta(dataset, change)
    code, report = inspect_json(dataset, "--quick")
    assert code == EXIT_CORRUPT and len(report["problems"]) == 1, report
    assert words in report["problems"][0] and "re-run `lmshard prepare` with --overwrite" in report["problems"][0]


def test_doc_index_bounds_and_shard_names(dataset, reference):
    entry, tokens, offsets = shard_arrays(dataset, k=0)
    name, n = entry["path"][: -len(".bin")], entry["n_docs"]
    last = reference.decode(tokens[offsets[-2] : offsets[-1] - 1].tolist())
    for spec in (f"{name}:{n - 1}", f"{name}.bin:{n - 1}"):
        result = runner.invoke(app, ["inspect", str(dataset), "--quick", "--doc", spec])
        assert result.exit_code == 0 and last[:40] in result.output, result.output
    result = runner.invoke(app, ["inspect", str(dataset), "--quick", "--doc", f"{name}:{n}"])
    assert result.exit_code == 1 and f"no document {n}" in result.output
    result = runner.invoke(app, ["inspect", str(dataset), "--quick", "--doc", "train/shard_999999:0"])
    assert result.exit_code == 1 and "no shard 'train/shard_999999'" in result.output


def test_packing_report_plans_from_the_raw_index(dataset):
    lengths = [len(d) for d in read_docs(dataset, "train")]
    result = runner.invoke(app, ["inspect", str(dataset), "--packing", "64", "--json", "--world-size", "3"])
    assert result.exit_code == 0, result.output
    rows = {r["strategy"]: r for r in json.loads(result.stdout)["strategies"]}
    assert list(rows) == ["bfd", "first_fit", "window_1000", "greedy", "stream_10000"]
    total = sum(lengths)  # overlong "split" keeps every token
    for r in rows.values():
        assert r["tokens"] == total and r["documents"] == len(lengths)
        multiple = 1 if r["strategy"].startswith("stream") else 3  # (stream packing is not balanced over ranks)
        assert r["lower_bound"] == -(-total // 64) <= r["packs"] and r["packs"] % multiple == 0
        assert r["split_documents"] == sum(n > 64 for n in lengths)
        assert r["steps_per_rank"] == r["packs"] // 3
    fills = [rows[s]["fill"] for s in ("bfd", "first_fit", "window_1000", "greedy")]
    assert fills == sorted(fills, reverse=True)
    text = runner.invoke(app, ["inspect", str(dataset), "--packing", "64", "--strategy", "greedy"])
    assert text.exit_code == 0 and "greedy" in text.stdout and "bfd" not in text.stdout
    bad = runner.invoke(app, ["inspect", str(dataset), "--packing", "64", "--strategy", "best"])
    assert bad.exit_code == 1 and "not a packing strategy" in bad.output


def test_a_shard_entry_dropped_from_the_metadata_is_a_problem(dataset):
    """The last train shard's entry removed, every total lowered to match: the metadata is
    consistent, but the shard's file is still there and a reader would leave its documents out.
    Inspect names the file (a structure check: --quick finds it too)."""
    def drop(meta):
        train = meta["splits"]["train"]
        last = train["shards"].pop()
        for entry in (train, meta):
            entry["n_tokens"] -= last["n_tokens"]
            entry["n_docs"] -= last["n_docs"]

    n = len(json.loads((dataset / "dataset_metadata.json").read_text())["splits"]["train"]["shards"])
    edit_meta(dataset, drop)
    for flags in ((), ("--quick",)):
        code, report = inspect_json(dataset, *flags)
        assert code == EXIT_CORRUPT and len(report["problems"]) == 1, report
        assert f"train/shard_{n - 1:06d}.bin: a shard file the metadata does not list (1 such file in train/, " \
            f"which lists {n - 1} shards)" in report["problems"][0], report  # fmt: skip
