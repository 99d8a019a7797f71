"""The C4 rules against a small implementation of the published rules written here (a regular
expression per rule over the document's lines), on generated web pages that trip each rule; and
filters that edit: the edited text is what prepare keys and tokenizes, the next filters see it,
an empty edit drops the document, and a wrong answer stops the run in one line."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest
from conftest import GPT2_EOT, read_docs
from test_prepare import jsonl
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.format import load_metadata
from lmshard.prepare import PrepareConfig, prepare
from lmshard.prepare.documents.clean import CleanConfig
from lmshard.prepare.documents.records import Record
from lmshard.prepare.documents.worker import clean_document
from lmshard.quality.c4 import C4Quality, c4_quality
from lmshard.quality.filters import Edit, run_filters

VOCAB = ["river", "stone", "cloud", "light", "dark", "sound", "ocean", "field", "winter", "summer", "the", "of"]
LINE_RULES = ("long_word", "end_mark", "short", "javascript", "policy")


def ref_c4(text: str, removed: Counter[str] | None = None) -> str:
    """The C4 rules as published: the kept text, or 'c4_<reason>' for a dropped page."""
    removed = Counter() if removed is None else removed
    kept, sentences = [], 0
    pieces = re.split(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]", text)
    for raw in pieces[:-1] if pieces[-1] == "" else pieces:  # a line break at the end starts no line
        line = raw.strip()
        if re.search(r"\S{1001}", line):
            removed["long_word"] += 1
            continue
        line = re.sub(r"\[(\d*|edit|citation needed)\]", "", line)
        if not re.search(r"[.?!\"]$", line) or re.search(r"\.\.\.$", line):
            removed["end_mark"] += 1
            continue
        if len(re.findall(r"\S+", line)) < 5:
            removed["short"] += 1
            continue
        if re.search("lorem ipsum", line, re.IGNORECASE):
            return "c4_lorem_ipsum"
        if re.search("javascript", line, re.IGNORECASE):
            removed["javascript"] += 1
            continue
        if "{" in line:
            return "c4_curly_bracket"
        if re.search(r"terms of use|privacy policy|cookie policy|uses cookies|use of cookies|use cookies", line, re.I):
            removed["policy"] += 1
            continue
        # a sentence ends at the last of a run of . ! ?, closing quotes or brackets after it, then space or end
        ends = 0
        for i, ch in enumerate(line):
            if ch in ".!?" and (i + 1 == len(line) or line[i + 1] not in ".!?"):
                j = i + 1
                while j < len(line) and line[j] in "\"'”’)]":
                    j += 1
                ends += j == len(line) or line[j].isspace()
        sentences += ends or 1
        kept.append(line)
    if sentences < 3:
        return "c4_too_few_sentences"
    return "\n".join(kept).strip()


def _sentence(rng: random.Random, end: str = ".") -> str:
    return " ".join(rng.choices(VOCAB, k=rng.randint(5, 14))).capitalize() + end


def _line(rng: random.Random) -> str:
    kind = rng.choices(["prose", "menu", "ellipsis", "short", "js", "policy", "cite", "long", "quote", "rare"],
                       weights=[30, 6, 3, 4, 2, 2, 3, 1, 2, 1])[0]  # fmt: skip
    if kind == "prose":
        return " ".join(_sentence(rng, rng.choice([".", "!", "?", "..."])) for _ in range(rng.randint(1, 3)))
    if kind == "menu":
        return " ".join(rng.choices(["Home", "About", "Contact", "Menu", "Login"], k=rng.randint(1, 4)))
    if kind == "ellipsis":
        return _sentence(rng, "...")
    if kind == "short":
        return " ".join(rng.choices(VOCAB, k=rng.randint(1, 4))) + "."
    if kind == "js":
        return "Please enable JavaScript in your browser to see this page."
    if kind == "policy":
        return rng.choice(["By using this site you accept our Terms of Use.", "This site uses cookies to help you."])
    if kind == "cite":
        return _sentence(rng, rng.choice([".[1]", ". [2]", "[citation needed].", "[edit]."]))
    if kind == "long":
        return "a" * rng.choice([1000, 1001]) + " is a very long word indeed."
    if kind == "quote":
        return f'"{_sentence(rng, "!")}" Mr. Smith said "so"'
    return rng.choice(["Lorem ipsum dolor sit amet, consectetur.", "var x = {a: 1} is code here today.",
                       "Some code { here with no end mark", "Lorem ipsum in a line with no end mark"])  # fmt: skip


def _page(rng: random.Random) -> str:
    lines = [_line(rng) for _ in range(rng.randint(1, 14))]
    if rng.random() < 0.2:
        lines = [" " * rng.randint(0, 3) + ln + rng.choice(["", "  "]) for ln in lines] + [""]
    return "\n".join(lines)


def test_verdicts_and_edits_equal_the_reference():
    rng = random.Random(11)
    pages = [_page(rng) for _ in range(3000)]
    removed: Counter[str] = Counter()
    theirs = [ref_c4(p, removed) for p in pages]
    ours = []
    for page in pages:
        verdict = c4_quality(page)
        assert verdict is None or isinstance(verdict, Edit) or verdict.startswith("c4_")
        ours.append(page if verdict is None else str(verdict))
    assert ours == theirs
    reasons = Counter(t if t.startswith("c4_") else "kept" for t in theirs)
    assert len(reasons) == 4 and min(reasons.values()) >= 20, reasons  # every document rule dropped some
    assert set(removed) == set(LINE_RULES) and min(removed.values()) >= 20, removed  # every line rule removed some
    assert sum(isinstance(c4_quality(p), Edit) for p in pages) > 500


def test_thresholds_are_options():
    page = "\n".join(["One two three four.", "Five six seven eight.", "Nine ten eleven twelve."])
    assert c4_quality(page) == "c4_too_few_sentences"  # four words a line: every line removed
    assert C4Quality(min_words_per_line=4)(page) is None
    assert C4Quality(min_words_per_line=4, min_sentences=4)(page) == "c4_too_few_sentences"


@pytest.fixture
def pages(tmp_path):
    rng = random.Random(12)
    texts = [_page(rng) for _ in range(1200)]
    body = "\n".join(_sentence(rng) for _ in range(4))
    texts += [f"{menu}\n{body}" for menu in ("Home", "About Contact", "Login")]  # equal once their menus are removed
    return jsonl(tmp_path / "pages.jsonl", texts), texts


def _prepare(tmp_path, src, name, filters, **kw):
    out = tmp_path / name
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), filters=filters, val_fraction=0.1, quiet=True,
                          tokens_per_shard=20_000, **kw))  # fmt: skip
    return out


def test_prepare_keys_and_tokenizes_the_edited_text(tmp_path, pages, reference, eager_pool, small_items):
    src, texts = pages
    expected = [ref_c4(t) for t in texts]
    kept = [t for t in expected if not t.startswith("c4_")]
    runs = [_prepare(tmp_path, src, f"w{w}", ["c4"], workers=w) for w in (1, 3)]
    meta = load_metadata(runs[0])
    duplicates = len(kept) - len(set(kept))  # the menu pages, once their menus are removed
    drops = Counter(t for t in expected if t.startswith("c4_")) + Counter(duplicate=duplicates)
    assert {k: v for k, v in meta.drops.items() if v} == dict(drops) and duplicates >= 2
    assert meta.dedup is not None and meta.dedup.duplicates_removed == duplicates
    decoded = [reference.decode(d[:-1].tolist()) for s in ("train", "val") for d in read_docs(runs[0], s)]
    assert all(d[-1] == GPT2_EOT for s in ("train", "val") for d in read_docs(runs[0], s))
    assert sorted(decoded) == sorted(set(kept))  # the edited texts, each once: keyed after the edit
    assert meta.config["filters"] == ["c4"]
    lines: Counter[str] = Counter()  # the lines the rules removed from the pages c4 kept, by rule
    for t in texts:
        removed: Counter[str] = Counter()
        if not ref_c4(t, removed).startswith("c4_"):
            lines.update(removed)
    names = {"long_word": "c4_long_word", "end_mark": "c4_end_mark", "short": "c4_short_line",
             "javascript": "c4_javascript", "policy": "c4_policy"}  # fmt: skip
    assert {k: v["lines"] for k, v in meta.line_drops.items()} == {names[k]: v for k, v in lines.items()}
    assert all(v["example"].startswith(f"{src}:") for v in meta.line_drops.values()) and len(lines) == 5
    other = load_metadata(runs[1])
    assert other.line_drops == meta.line_drops
    assert other.drops == meta.drops and len(other.shards) == len(meta.shards)
    for a, b in zip(meta.shards, other.shards, strict=True):
        assert (runs[0] / a.path).read_bytes() == (runs[1] / b.path).read_bytes()


FILTER_FILE = '''
from lmshard.quality.filters import Edit

def saw_menu(text):
    return "saw_menu" if any(line.strip() in ("Home", "Login") for line in text.splitlines()) else None

def blank(text):
    return Edit("  \\n") if "Home" in text.split() else None

def forgot_edit(text):
    return "the text, edited: " + text + " " * 60
'''


def test_the_next_filters_see_the_edit_and_an_empty_edit_drops(tmp_path, pages):
    src, texts = pages
    (tmp_path / "rules.py").write_text(FILTER_FILE)
    rules = tmp_path / "rules.py"
    before = load_metadata(_prepare(tmp_path, src, "before", [f"{rules}:saw_menu", "c4"], workers=1)).drops
    after = load_metadata(_prepare(tmp_path, src, "after", ["c4", f"{rules}:saw_menu"], workers=1)).drops
    menus = sum(any(ln.strip() in ("Home", "Login") for ln in t.splitlines()) for t in texts)
    assert before["saw_menu"] == menus > 50 and after.get("saw_menu", 0) == 0
    blanked = load_metadata(_prepare(tmp_path, src, "blank", [f"{rules}:blank"], workers=1)).drops
    assert blanked["blank_empty"] == sum("Home" in t.split() for t in texts) > 50
    assert run_filters((f"{rules}:blank",), "Home page") == (None, "blank_empty", f"{rules}:blank", None)


def test_clean_document_returns_the_edited_text():
    page = "Home\n" + "\n".join(["The river runs to the sea today."] * 3)
    clean = CleanConfig(filters=("c4",))
    assert clean_document(Record(1, page), clean) == ("\n".join(["The river runs to the sea today."] * 3), None)
    assert clean_document(Record(2, "Home\nAbout us"), clean) == (None, "c4_too_few_sentences")


def test_a_text_returned_without_edit_is_one_line(tmp_path, pages):
    src, _ = pages
    (tmp_path / "rules.py").write_text(FILTER_FILE)
    result = CliRunner().invoke(app, ["prepare", str(src), "--out", str(tmp_path / "y"), "--filter",
                                      f"{tmp_path / 'rules.py'}:forgot_edit", "--workers", "1"])  # fmt: skip
    text = " ".join(result.output.split())
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "forgot_edit returned '" in text and "...; return None to keep" in text and "Edit(text)" in text, text
    assert len(text.split("returned ")[1].split("; return None")[0]) <= 60  # the text, cut short
    assert not (tmp_path / "y" / "dataset_metadata.json").exists()
