"""The CLI: exit codes, messages, config files, and the real console script in a subprocess."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml
from conftest import read_docs, write
from typer.testing import CliRunner

from lmshard import __version__
from lmshard.cli import app
from lmshard.errors import ConfigError
from lmshard.prepare.config import PrepareConfig
from lmshard.prepare.configfile import canonical, resolve_config

runner = CliRunner()


def test_version_and_help():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output
    result = runner.invoke(app, ["prepare", "-h"])
    assert result.exit_code == 0 and "--val-fraction" in result.output


def test_every_command_summary_in_the_help_is_a_whole_sentence():
    """`lmshard -h` lists each command by its docstring's first line: a whole sentence (a list that
    shows only that line never cuts one mid-way)."""
    import re

    from lmshard.cli.render import _number

    for command in app.registered_commands:
        doc = (command.callback.__doc__ or "").strip()
        first = doc.splitlines()[0].strip() if doc else ""
        assert re.search(r"[.)]$", first), (command.name, first)
    assert [_number(v) for v in (3606220.0, 12.5, 0.3333, 5.0)] == ["3,606,220", "12.5", "0.333", "5"]  # no 3.6e+06


def test_config_file_supplies_fields_and_flags_win(tmp_path):
    write(tmp_path / "a.jsonl", "".join(json.dumps({"body": f"doc {i}"}) + "\n" for i in range(30)))
    write(
        tmp_path / "prepare.yaml",
        f"inputs: [{tmp_path / 'a.jsonl'}]\ntext-field: body\nval-fraction: 0.5\nmax_docs: 10\n",
    )
    result = runner.invoke(app, ["prepare", "--config", str(tmp_path / "prepare.yaml"),
                                 "--out", str(tmp_path / "o"), "--max-docs", "12", "--workers", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "o" / "dataset_metadata.json").read_text())
    assert meta["n_docs"] == 12 and meta["config"]["val_fraction"] == 0.5
    write(tmp_path / "p.toml", 'inputs = ["x"]\ntext_feild = 1\n')
    result = runner.invoke(app, ["prepare", "--config", str(tmp_path / "p.toml"), "--out", "z"])
    assert result.exit_code == 1 and "'text_feild' is not a prepare option (did you mean text-field?)" in result.output


def _long_options() -> set[str]:
    """Every long option of `lmshard prepare`, as typer registered them."""
    command = typer.main.get_command(app).commands["prepare"]  # type: ignore[attr-defined]
    return {o[2:] for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}


def test_every_cli_option_is_a_config_key_in_both_spellings():
    options = _long_options() - {"config", "help"}
    assert {"out", "split", "no-normalize", "no-streaming", "preset", "hf-tasks"} <= options
    with pytest.raises(ConfigError, match="not a prepare option"):
        canonical({"text_feild": "x"}, "f:")
    for option in options:
        for key in (option, option.replace("-", "_")):
            try:
                canonical({key: None}, "f:")
            except ConfigError as e:  # a type error is fine here; an unknown key is not
                assert "not a prepare option" not in str(e), key


def test_config_with_cli_names_prepares_the_same_dataset_as_flags(tmp_path):
    """Dash and underscore spellings and the CLI's own aliases (split, no-normalize, no-dedup)."""
    texts = [f"line {i % 40}\r\nbody {i}" for i in range(120)]
    write(tmp_path / "a.jsonl", "".join(json.dumps({"body": t}) + "\n" for t in texts))
    flags = ["--text-field", "body", "--no-normalize", "--no-dedup", "--tokens-per-shard", "300",
             "--val-fraction", "0.2", "--seed", "9", "--eot-position", "before", "--workers", "1"]  # fmt: skip
    by_flags = runner.invoke(app, ["prepare", str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "f"), *flags])
    assert by_flags.exit_code == 0, by_flags.output
    write(tmp_path / "c.yaml", f"inputs: {tmp_path / 'a.jsonl'}\ntext_field: body\nno-normalize: true\n"
                               "no_dedup: true\ntokens_per_shard: 3e2\nval-fraction: 0.2\nseed: 9\n"
                               "eot-position: before\nworkers: 1\nsplit: validation\n")  # fmt: skip
    by_file = runner.invoke(app, ["prepare", "--config", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "c")])
    assert by_file.exit_code == 0, by_file.output
    meta_f, meta_c = (json.loads((tmp_path / d / "dataset_metadata.json").read_text()) for d in "fc")
    assert meta_c["config"] == {**meta_f["config"], "hf_split": "validation"}
    assert meta_c["config"]["byte_exact"] is True and meta_c["config"]["dedup"] == "none"
    assert meta_c["splits"] == meta_f["splits"] and len(meta_c["splits"]["train"]["shards"]) > 1
    for split in ("train", "val"):
        docs_c, docs_f = read_docs(tmp_path / "c", split), read_docs(tmp_path / "f", split)
        assert [d.tolist() for d in docs_c] == [d.tolist() for d in docs_f]


@pytest.mark.parametrize(("line", "message"), [
    ("workers: two", "'workers' must be a whole number (got 'two')"),
    ("val-fraction: [0.1]", "'val-fraction' must be a number (got [0.1])"),
    ("dedup-lines: 'yes'", "'dedup-lines' must be true or false (got 'yes')"),
    ("inputs: 5", "'inputs' must be a list of strings (or one string) (got 5)"),
    ("tokens_per_shard: 2.5", "'tokens_per_shard' must be a whole number (got 2.5)"),
    ("text-field: 3", "'text-field' must be a string (got 3)"),
])  # fmt: skip
def test_wrongly_typed_config_value_is_one_line(tmp_path, line, message):
    write(tmp_path / "a.jsonl", '{"text": "x"}\n')
    write(tmp_path / "c.yaml", f"inputs: [{tmp_path / 'a.jsonl'}]\nout: {tmp_path / 'o'}\n{line}\n")
    result = runner.invoke(app, ["prepare", "--config", str(tmp_path / "c.yaml")])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert f"{tmp_path / 'c.yaml'}: key {message}" in " ".join(result.output.split())
    assert not (tmp_path / "o").exists()


def test_string_where_a_list_is_expected_is_one_item(tmp_path):
    write(tmp_path / "docs" / "a.txt", "first document")
    write(tmp_path / "docs" / "b.txt", "second document")
    write(tmp_path / "c.yaml", f"inputs: {tmp_path / 'docs'}\nexclude: '*b.txt'\n")
    cfg = resolve_config(file=tmp_path / "c.yaml", flags={"out": str(tmp_path / "o")})
    assert cfg.inputs == [str(tmp_path / "docs")] and cfg.exclude == ["*b.txt"]


def test_docs_example_config_names_every_option_with_its_default(tmp_path):
    """The example in docs/cli.md loads, covers every option, and states the real defaults."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    write(tmp_path / "example.yaml", example)
    raw = yaml.safe_load(example)
    assert set(raw) | {"no-dedup", "no-streaming"} == _long_options() - {"config", "help"} | {"inputs"}
    cfg = resolve_config(file=tmp_path / "example.yaml")
    defaults = PrepareConfig(inputs=["x"], out="y")
    differ = {k for k, v in dataclasses.asdict(cfg).items() if getattr(defaults, k) != v}
    assert differ == {"inputs", "exclude", "out"}


def test_bad_option_value_is_one_line(tmp_path):
    write(tmp_path / "a.txt", "x")
    result = runner.invoke(
        app, ["prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "o"), "--on-error", "maybe"]
    )
    assert result.exit_code == 1 and "--on-error must be one of fail, skip" in result.output


def test_an_option_that_would_do_nothing_is_one_line(tmp_path):
    """Options that have no effect in the combination given are refused, not ignored: the line
    names the option and what it needs. Nothing is read or written (the inputs do not exist)."""
    cases = [
        (["prepare", "a.jsonl", "--out", "o", "--decontaminate-lines"],
         "--decontaminate-lines removes the lines that match a --decontaminate benchmark, and none is given"),
        (["convert", "ds", "--to", "uint16", "--no-dictionary", "--out", "c"],
         "--no-dictionary: only zstd shards have a dictionary, and --to uint16 writes none"),
        (["inspect", "ds", "--sample", "-1"], "--sample -1: pass the number of documents to decode, 0 or more"),
    ]  # fmt: skip
    for args, said in cases:
        result = runner.invoke(app, [*args[:1], *(str(tmp_path / a) if a in ("a.jsonl", "o", "ds", "c") else a
                                                  for a in args[1:])])  # fmt: skip
        assert result.exit_code == 1 and said in " ".join(result.output.split()), result.output
    assert not list(tmp_path.iterdir())


def test_console_script_end_to_end_with_stdin(tmp_path, reference):
    """The installed `lmshard` command, run as a user would, reading JSON lines from stdin."""
    lines = "".join(json.dumps({"text": f"stdin document {i} ünïcode"}) + "\n" for i in range(50))
    exe = Path(sys.executable).with_name("lmshard")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([str(exe), "prepare", "-", "--out", str(tmp_path / "o"), "--val-fraction", "0"],
                          input=lines, capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    docs = read_docs(tmp_path / "o", "train")
    assert [d.tolist() for d in docs] == [
        reference.encode_ordinary(f"stdin document {i} ünïcode") + [50256] for i in range(50)
    ]
    again = subprocess.run([str(exe), "prepare", "-", "--out", str(tmp_path / "o")], input=lines,
                           capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert "holds a dataset; pass --overwrite" in again.stderr


def test_config_edge_cases_are_one_line_or_accepted(tmp_path):
    """A key given twice, a demo/preset in both file and flags, --format, a 400-digit seed."""
    write(tmp_path / "dup.yaml", "inputs: [a]\nout: o\ntext-field: a\ntext_field: b\n")
    with pytest.raises(ConfigError, match="'text_field' sets the same option as 'text-field'"):
        resolve_config(file=tmp_path / "dup.yaml")
    agreed = resolve_config(flags={"inputs": ["a"], "out": "o", "dedup": "none", "no_dedup": True})
    assert agreed.dedup == "none"  # two spellings of one value: given twice, not in conflict
    with pytest.raises(ConfigError, match="option --no-dedup sets the same option as --dedup, to another value"):
        resolve_config(flags={"inputs": ["a"], "out": "o", "dedup": "document", "no_dedup": True})
    write(tmp_path / "d.yaml", "demo: false\npreset: pile\n")
    cfg = resolve_config(file=tmp_path / "d.yaml", flags={"demo": True, "preset": "fineweb-edu", "out": "o"})
    assert cfg.hf == "HuggingFaceFW/fineweb-edu" and cfg.inputs  # the flags' preset, and the demo inputs
    with pytest.raises(ConfigError, match="--format must be one of"):
        resolve_config(flags={"inputs": ["a"], "out": "o", "format": "xml"})
    write(tmp_path / "big.yaml", f"inputs: [a]\nout: o\nseed: {9 * 10**400}\nval-fraction: {9 * 10**400}\n")
    with pytest.raises(ConfigError, match="'val-fraction' must be a number"):
        resolve_config(file=tmp_path / "big.yaml")


def _option_help(name: str) -> str:
    command = typer.main.get_command(app).commands["prepare"]  # type: ignore[attr-defined]
    return next(p.help for p in command.params if f"--{name}" in p.opts)


@pytest.mark.parametrize("position", ["after", "before"])
def test_the_separator_help_says_where_prepare_writes_it(tmp_path, monkeypatch, position):
    """The truth is the written tokens: with a BOS, [BOS] text EOT (after) or EOT BOS text
    (before); the --separator help must say both sides."""
    import tokenizers
    from test_hf_tokenizer import small

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    vocab = small(tmp_path / "tok", ["<|endoftext|>", "<s>"])
    src = write(tmp_path / "a.jsonl", "".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(20)))
    result = runner.invoke(app, ["prepare", str(src), "--out", str(tmp_path / "o"), "--tokenizer", str(vocab),
                                 "--bos", "yes", "--eot-position", position, "--workers", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    library = tokenizers.Tokenizer.from_file(str(vocab))
    eot, bos = library.token_to_id("<|endoftext|>"), library.token_to_id("<s>")
    docs = read_docs(tmp_path / "o", "train")
    assert len(docs) > 10
    firsts = {(int(d[0]), int(d[1])) for d in docs}
    last = {int(d[-1]) for d in docs}
    if position == "after":
        assert {f for f, _ in firsts} == {bos} and last == {eot}
    else:
        assert firsts == {(eot, bos)} and eot not in last
    words = "after each document" if position == "after" else "before it with --eot-position before"
    assert words in _option_help("separator")


def test_an_append_keeps_the_datasets_tokens_per_shard_unless_given(tmp_path):
    """`--append` without --tokens-per-shard cuts the new shards at the dataset's size (as it
    keeps its encoding); the metadata records it; given, the option wins."""
    for name, n in (("a", 300), ("b", 200)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"text": f"{name} {i} " + "w " * 30}) + "\n"
                                                        for i in range(n)))  # fmt: skip
    common = ["--out", str(tmp_path / "ds"), "--workers", "1", "--val-fraction", "0"]
    first = runner.invoke(app, ["prepare", str(tmp_path / "a.jsonl"), *common, "--tokens-per-shard", "2000"])
    assert first.exit_code == 0, first.output
    result = runner.invoke(app, ["prepare", str(tmp_path / "b.jsonl"), *common, "--append"])
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "ds" / "dataset_metadata.json").read_text())
    assert meta["config"]["tokens_per_shard"] == 2000
    sizes = [s["n_tokens"] for s in meta["splits"]["train"]["shards"]]
    assert len(sizes) > 4 and max(sizes) < 2000 + 40  # whole documents: a shard ends after the one that passes 2000


def test_lines_removed_by_dedup_lines_are_said_wherever_drops_are(tmp_path):
    """--dedup-lines takes lines out of kept documents: the start line names it, and the summary,
    the done line, --json and inspect count them (a hand count), where a run that only removes
    lines said "dropped none" and nothing more."""
    texts = [f"Copyright (c) Example Corp.\nreal text {i}\nshared footer line" for i in range(30)]
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    removed = 2 * 29  # the boilerplate and the footer, met before in every document but the first
    out = str(tmp_path / "ds")
    result = runner.invoke(app, ["prepare", str(src), "--out", out, "--dedup-lines", "--workers", "1"])
    said = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "dedup document + lines," in said and "filter" not in said.split(";")[0], said
    assert f"lines removed by --dedup-lines (each line met before) {removed:,}: {src} ({removed:,})" in said, said
    assert f"dropped none; lines removed --dedup-lines {removed:,};" in said, said
    result = runner.invoke(app, ["prepare", str(src), "--out", out, "--dedup-lines", "--workers", "1", "--json",
                                 "--overwrite"])  # fmt: skip
    assert json.loads(result.stdout.strip().splitlines()[-1])["lines_removed"] == {"dedup_lines": removed}
    result = runner.invoke(app, ["inspect", out])
    assert result.exit_code == 0 and f"lines removed │ --dedup-lines {removed:,}" in result.output, result.output


def test_a_ctrl_c_before_the_command_starts_says_nothing_was_done(monkeypatch, capsys):
    """Ctrl-C while the command line is still importing (before any command runs): exit 130 and
    one line saying nothing was done, where it said only 'interrupted'."""
    import types

    import lmshard.__main__ as entry

    class Importing(types.ModuleType):
        def __getattr__(self, name: str):
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "lmshard.cli", Importing("lmshard.cli"))
    with pytest.raises(SystemExit) as stop:
        entry.main()
    assert stop.value.code == 130
    assert capsys.readouterr().err == "interrupted: before the command started, nothing was done\n"
