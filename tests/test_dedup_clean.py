"""The dedup key set against a Python set, and the cleaning rules one by one."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import numpy as np
from conftest import read_docs, write
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from lmshard.cli import app
from lmshard.prepare.documents.clean import CleanConfig, _has_control, clean_text, length_filter
from lmshard.prepare.documents.dedup import KeySet, uniform_from_keys


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 60), max_size=40), max_size=12))
def test_keyset_first_occurrence_matches_python_set(batches):
    ks, seen = KeySet(capacity=4), set()  # tiny capacity: forces growth and probe collisions
    for batch in batches:
        keys = np.array(batch, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15 % 2**61)
        expected = []
        for k in keys.tolist():
            k = k or 1  # 0 is stored as 1
            expected.append(k not in seen)
            seen.add(k)
        assert ks.add_new(keys).tolist() == expected
    assert len(ks) == len(seen)


def test_keyset_memory_per_key():
    ks = KeySet()
    rng = np.random.default_rng(0)
    for _ in range(10):
        ks.add_new(rng.integers(1, 2**63, size=100_000, dtype=np.uint64))
    assert len(ks) == 1_000_000
    assert ks.nbytes / len(ks) <= 21.4  # 8-byte slots, at least 37.5% full


def test_uniform_from_keys_is_seeded_and_uniform():
    keys = np.arange(1, 200_001, dtype=np.uint64)
    u = uniform_from_keys(keys, 7)
    assert ((u >= 0) & (u < 1)).all()
    assert abs((u < 0.1).mean() - 0.1) < 0.005
    assert not np.array_equal(u, uniform_from_keys(keys, 8))
    assert np.array_equal(u, uniform_from_keys(keys, 7))
    # any int seed, taken modulo 2**64 (a negative --seed was an OverflowError with a traceback)
    assert np.array_equal(uniform_from_keys(keys, -1), uniform_from_keys(keys, 2**64 - 1))
    assert np.array_equal(uniform_from_keys(keys, 2**64 + 7), u)


def test_clean_rules():
    cfg = CleanConfig()
    assert clean_text("a\r\nb\rc", cfg) == "a\nb\nc"
    assert clean_text("\ufeffx\x00y\x1b[0m\x7f\x85z\tw\n", cfg) == "xy[0mz\tw\n"
    assert clean_text("e\u0301", cfg) == "é"
    assert clean_text("10³", CleanConfig(normalize="nfkc")) == "103"
    assert clean_text("10³", cfg) == "10³"
    assert clean_text("e\u0301", CleanConfig(normalize="none")) == "e\u0301"
    raw = "\r\n\x00e\u0301"
    assert clean_text(raw, CleanConfig(byte_exact=True)) == raw


@given(st.text())
def test_clean_output_is_nfc_without_controls(text):
    text = text.encode("utf-8", "replace").decode("utf-8")
    out = clean_text(text, CleanConfig())
    assert unicodedata.is_normalized("NFC", out) and "\r" not in out
    assert not any(ord(c) < 32 and c not in "\t\n" for c in out)


def test_control_check_on_bytes_agrees_with_the_character_class_on_every_code_point():
    # the fast check (UTF-8 bytes) against the plain definition, one character in a word
    expected = {c for c in range(0x110000) if c < 0x20 and c not in (0x09, 0x0A) or 0x7F <= c <= 0x9F}
    found = {c for c in range(0x110000) if _has_control(f"ab{chr(c)}\u00e9")}
    assert found == expected
    assert not _has_control("\u00c2x\u00a0\u0100")  # C3 82, C2 A0, C4 80: no C2 80-9F
    assert clean_text("caf\u00e9\u0085\u0099 ok", CleanConfig()) == "caf\u00e9 ok"


# docs/cli.md's account of --normalize: text -> what each form tokenizes
NFC_CLAIMS = {"\u212a": "K", "\u2126": "\u03a9", "\u212b": "\u00c5", "e\u0301": "\u00e9", "\u037e": ";",
              "\uf900": "\u8c48", "\u0958": "\u0915\u093c", "\ufb01": "\ufb01", "\u00b2": "\u00b2",
              "\uff21": "\uff21"}  # fmt: skip
NFKC_CLAIMS = {"10\u00b3": "103", "\ufb01": "fi"}


def _prepared_texts(tmp_path: Path, reference, texts: list[str], *flags: str) -> list[str]:
    """The texts as a prepare run with `flags` tokenized them, in input order."""
    src = write(tmp_path / "in.jsonl", "".join(json.dumps({"text": f"[{t}]"}) + "\n" for t in texts))
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
    result = CliRunner().invoke(app, ["prepare", str(src), "--out", str(out), "--val-fraction", "0", *flags])
    assert result.exit_code == 0, result.output
    return [reference.decode(d[:-1].tolist())[1:-1] for d in read_docs(out, "train")]


def test_normalisation_changes_exactly_what_docs_cli_md_says(tmp_path, reference):
    """The default NFC is not lossless: a Kelvin sign is tokenized as "K"; compatibility forms
    stay for NFC and fold under nfkc; --no-normalize keeps every code point."""
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text().split())
    assert "default, lossless" not in doc and 'U+212A KELVIN SIGN → "K" U+004B' in doc and '"10³" → "103"' in doc
    assert _prepared_texts(tmp_path, reference, list(NFC_CLAIMS)) == list(NFC_CLAIMS.values())
    assert _prepared_texts(tmp_path, reference, list(NFKC_CLAIMS), "--normalize", "nfkc") == list(NFKC_CLAIMS.values())
    assert _prepared_texts(tmp_path, reference, list(NFC_CLAIMS), "--no-normalize") == list(NFC_CLAIMS)


def test_length_filter():
    cfg = CleanConfig(min_chars=3, max_chars=5)
    assert length_filter("", cfg) == (None, "empty")
    assert length_filter("ab", cfg) == (None, "too_short")
    assert length_filter("abcdef", cfg) == (None, "too_long")
    assert length_filter("abcdef", CleanConfig(min_chars=3, max_chars=5, overlong="truncate")) == ("abcde", None)
