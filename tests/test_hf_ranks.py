"""A byte-level BPE tokenizer.json read by splintr as a ranks table (tokenizers/hf_ranks.py), and
what is remembered per file so that a run starts without parsing it (tokenizers/hf_cache.py).

The truth for ids is the `tokenizers` library's own loading of the same file (test_hf_fast's
`truth`). Which files qualify is checked on the family shapes (tests/vocab_shapes.py) and on
copies changed in each way that must disqualify them."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import tokenizers
import vocab_shapes
from test_hf_fast import _restore_parallelism, assert_same_ids, gate_dir, module_gate, shape_files  # noqa: F401
from tokenizers import decoders, models, pre_tokenizers, trainers

from lmshard.tokenizers import gate, hf_cache, hf_fast, load_tokenizer
from lmshard.tokenizers.hf_backend import HFTokenizer
from lmshard.tokenizers.hf_ranks import BYTE_LEVEL_PATTERN, ranks_form

TEXTS = vocab_shapes.local_documents()[:80]


def every_cut_listed(path, out):
    """The tokenizer.json at `path` with every cut of every token into two tokens of its
    vocabulary listed as a merge, ordered by the ranks of the token made and of its parts: what
    converting a tiktoken vocabulary writes (Llama 3's file is so)."""
    parsed = json.loads(path.read_bytes())
    vocab = parsed["model"]["vocab"]
    cuts = {(t[:k], t[k:]) for t in vocab for k in range(1, len(t)) if t[:k] in vocab and t[k:] in vocab}
    parsed["model"]["merges"] = [[a, b] for a, b in sorted(cuts, key=lambda c: (vocab[c[0] + c[1]], vocab[c[0]],
                                                                                 vocab[c[1]]))]  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(parsed, ensure_ascii=False), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def converted(shape_files, tmp_path_factory):  # noqa: F811
    """Llama 3's shape as a converted tiktoken vocabulary (`every_cut_listed`)."""
    return every_cut_listed(shape_files("llama3"), tmp_path_factory.mktemp("converted") / "tokenizer.json")


def test_which_shapes_have_a_ranks_form(shape_files, converted):  # noqa: F811
    """Byte-level BPEs that emit whole pieces found in the vocabulary, with an explicit split
    pattern, no normalizer, no ordinary added token and every cut of a token listed as a merge
    (Llama 3's shape, converted as tiktoken vocabularies are); none of the shapes as trained
    here (their merges leave cuts out: a ranks table would merge them, `tokenizers` does not)."""
    found = {k for k in vocab_shapes.SHAPES if ranks_form(json.loads(shape_files(k).read_bytes())) is not None}
    assert found == set()
    assert ranks_form(json.loads(converted.read_bytes())) is not None
    bloom = json.loads(every_cut_listed(shape_files("bloom"), converted.parent / "bloom.json").read_bytes())
    assert ranks_form(bloom) is None  # it merges every piece, even one found whole
    bloom["model"]["ignore_merges"] = True
    assert ranks_form(bloom) is not None  # (its only reason)


def _gpt2_style(tmp_path):
    """A byte-level BPE whose ByteLevel pre-tokenizer splits with its own (GPT-2's) regex."""
    tok = tokenizers.Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(iter(vocab_shapes.training_texts()), trainers.BpeTrainer(
        vocab_size=vocab_shapes.VOCAB_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"], show_progress=False))  # fmt: skip
    tok.save(str(tmp_path / "trained.json"))
    return every_cut_listed(tmp_path / "trained.json", tmp_path / "tokenizer.json")


def test_the_ranks_table_is_the_vocabulary_in_bytes(tmp_path, converted):
    """Each line is a token's bytes (base64) and its id; the bytes, decoded by the file's own
    ByteLevel decoder where they are whole UTF-8, are the token's text."""
    for path, pattern in ((_gpt2_style(tmp_path), BYTE_LEVEL_PATTERN), (converted, None)):
        parsed = json.loads(path.read_bytes())
        found = ranks_form(parsed)
        assert found is not None
        got_pattern, table = found
        if pattern is not None:
            assert got_pattern == pattern
        lines = table.decode().splitlines()
        assert len(lines) == len(parsed["model"]["vocab"])
        ref = tokenizers.Tokenizer.from_file(str(path))
        checked = 0
        for line in lines:
            raw, rank = line.split(" ")
            data = base64.b64decode(raw)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue  # a piece of a character: no text of its own to compare
            assert ref.decode([int(rank)], skip_special_tokens=False) == text
            checked += 1
        assert checked > len(lines) // 2


@pytest.mark.parametrize("change", ["normalizer", "ordinary added token", "merges out of rank order",
                                    "byte fallback", "prefix space", "dropout", "not BPE",
                                    "merges every piece", "a cut not listed"])  # fmt: skip
def test_a_file_its_ranks_cannot_express_has_no_ranks_form(converted, change):
    parsed = json.loads(converted.read_bytes())
    assert ranks_form(parsed) is not None
    if change == "normalizer":
        parsed["normalizer"] = {"type": "NFC"}
    elif change == "ordinary added token":
        parsed["added_tokens"].append({"id": 99999, "content": "<x>", "special": False})
    elif change == "merges out of rank order":
        merges = parsed["model"]["merges"]
        merges[0], merges[-1] = merges[-1], merges[0]
    elif change == "byte fallback":
        parsed["model"]["byte_fallback"] = True
    elif change == "prefix space":
        parsed["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
    elif change == "dropout":
        parsed["model"]["dropout"] = 0.1
    elif change == "merges every piece":
        parsed["model"]["ignore_merges"] = False
    elif change == "a cut not listed":
        merges = parsed["model"]["merges"]
        del merges[len(merges) // 2]
    else:
        parsed["model"]["type"] = "WordPiece"
    assert ranks_form(parsed) is None


@pytest.mark.parametrize("kind", ["llama3", "gpt2-style"])
def test_the_ranks_form_passes_the_gate_and_gives_the_truths_ids(kind, tmp_path, converted, gate_dir):  # noqa: F811
    path = _gpt2_style(tmp_path) if kind == "gpt2-style" else converted
    tok = load_tokenizer(str(path), "auto", warn=pytest.fail)
    assert isinstance(tok, HFTokenizer) and tok.backend == "splintr" and tok.splintr_form == "ranks"
    assert tok.identity()["splintr_form"] == "ranks"
    assert_same_ids(tok, path, TEXTS)


@pytest.mark.parametrize("seen", ["on the sample", "on an ASCII probe"])
def test_a_ranks_table_that_differs_is_caught_and_the_file_read_instead(converted, gate_dir, monkeypatch,  # noqa: F811
                                                                        seen):
    """Two ranks swapped in the table: the gate fails the ranks form, splintr reads the
    tokenizer.json itself (exact, no warning), and the next load goes there without the gate.
    Whether the swap shows on the sample only, or on the probe of an ASCII letter too (which the
    gate never routes to `tokenizers`: both classify ASCII alike, so it is the table's fault)."""
    import splintr

    path = converted
    real = hf_fast.ranks_form

    def swap(table: bytes, rank: int) -> bytes:
        lines = table.split(b"\n")
        by_rank = {int(line.split(b" ")[1]): i for i, line in enumerate(lines) if line}
        a, b = by_rank[rank], by_rank[rank + 1]
        ra, rb = lines[a].split(b" "), lines[b].split(b" ")
        lines[a], lines[b] = ra[0] + b" " + rb[1], rb[0] + b" " + ra[1]
        return b"\n".join(lines)

    # Two early merges (tokens every text is made of) whose swap changes the tokens of some ASCII
    # text of the gate's sample but of no code point's probe, or of an ASCII letter's probe, found
    # with splintr itself: which pairs do depends on the vocabulary trained here (from the
    # repository's docs).
    pattern, table = real(json.loads(path.read_bytes()))
    texts = [text for _, text in gate.sample() if text.isascii()]
    probes = [hf_fast._probe(c) for c in hf_fast.probe_points()]
    ascii_probes = [hf_fast._probe(c) for c in range(0x80)]

    def encoded(ranks: bytes) -> tuple[list[list[int]], ...]:
        enc = splintr.Tokenizer.from_bytes(ranks, pattern, {})
        return enc.encode_batch(texts), enc.encode_batch(probes), enc.encode_batch(ascii_probes)

    def fits(got: tuple[list[list[int]], ...]) -> bool:
        if seen == "on the sample":
            return got[0] != want[0] and got[1] == want[1]
        return got[2] != want[2]

    want = encoded(table)
    rank = next(r for r in range(300, 2000) if fits(encoded(swap(table, r))))

    def swapped(parsed):
        found_pattern, found = real(parsed)
        return found_pattern, swap(found, rank)

    monkeypatch.setattr(hf_fast, "ranks_form", swapped)
    gates = []
    real_admit = hf_fast._admit
    monkeypatch.setattr(hf_fast, "_admit", lambda *a, **k: gates.append(a[0].splintr_form) or real_admit(*a, **k))
    tok = load_tokenizer(str(path), "auto", warn=pytest.fail)
    assert gates == ["ranks", "json"] and tok.backend == "splintr" and tok.splintr_form == "json"
    assert_same_ids(tok, path, TEXTS)
    stored = [json.loads(p.read_text()) for p in gate_dir.glob("*.json")]
    assert len(stored) == 1 and stored[0]["splintr_form"] == "json" and "token" in stored[0]["ranks_failed"]
    again = load_tokenizer(str(path), "auto", warn=pytest.fail)
    assert gates == ["ranks", "json"] and again.splintr_form == "json"  # no gate the second time
    assert_same_ids(again, path, TEXTS)


def test_a_second_load_parses_nothing_until_a_decode_asks(converted, gate_dir):  # noqa: F811
    path = converted
    first = load_tokenizer(str(path), "auto", warn=pytest.fail)
    second = load_tokenizer(str(path), "auto", warn=pytest.fail)
    assert "tok" not in second._lazy and "json" not in second._lazy  # neither the parsed JSON nor tokenizers'
    assert second.identity() == first.identity()
    assert (second.n_vocab, second.eot_id, second.bos_id, second.adds_bos) == \
        (first.n_vocab, first.eot_id, first.bos_id, first.adds_bos)  # fmt: skip
    assert_same_ids(second, path, TEXTS)
    assert "tok" not in second._lazy  # encoding needed only splintr
    ids = list(second.encode_batch(["Hello world"])[0])
    assert second.decode(ids) == "Hello world" and "tok" in second._lazy


def test_damaged_remembered_entries_are_made_again(converted, gate_dir):  # noqa: F811
    path = converted
    first = load_tokenizer(str(path), "auto", warn=pytest.fail)
    hf_cache.newer_code_points.cache_clear()  # (computed once per process: here into this test's directory)
    table = hf_cache.newer_code_points()
    assert np.array_equal(table, hf_cache._unassigned())
    entries = list((gate.gate_dir() / "hf").iterdir())
    assert {e.name.split("-")[0] for e in entries} == {"facts", "bytes", "table"}
    for entry in entries:
        entry.write_bytes(entry.read_bytes()[:-3] + b"zzz")  # each entry's own sha256 no longer matches
    again = load_tokenizer(str(path), "auto", warn=pytest.fail)
    assert again.identity() == first.identity() and again.splintr_form == "ranks"
    assert_same_ids(again, path, TEXTS)
    hf_cache.newer_code_points.cache_clear()
    assert np.array_equal(hf_cache.newer_code_points(), table)


def test_a_worker_takes_the_form_its_run_admitted(converted, gate_dir, monkeypatch):  # noqa: F811
    """With a cache that remembers nothing (read-only), a worker (gated=True) is told the form
    the run's gate admitted and loads that one, running no gate."""
    monkeypatch.setattr(gate, "remember", lambda *a, **k: None)
    monkeypatch.setattr(hf_fast, "remember", lambda *a, **k: None)
    monkeypatch.setattr(hf_fast, "_admit", lambda *a, **k: pytest.fail("a worker ran the gate"))
    for form in ("json", "ranks"):
        tok = load_tokenizer(str(converted), "auto", gated=True, splintr_form=form, warn=pytest.fail)
        assert tok.splintr_form == form
        assert_same_ids(tok, converted, TEXTS)


def test_a_merge_met_only_inside_a_longer_piece_is_caught(shape_files, tmp_path, gate_dir):  # noqa: F811
    """A token added with a merge of its own ("Ġh" + "ard" = "Ġhard"): ignore_merges looks every
    vocabulary word up whole, so only the sample's words run on into a letter ("Ġhardq") reach
    the merge, where splintr and `tokenizers` part ways (" harder"): caught, and the file falls
    back to `tokenizers`."""
    parsed = json.loads(shape_files("llama3").read_bytes())
    vocab = parsed["model"]["vocab"]
    assert "Ġh" in vocab and "ard" in vocab and "Ġhard" not in vocab
    vocab["Ġhard"] = 1 + max([*vocab.values(), *(t["id"] for t in parsed["added_tokens"])])
    parsed["model"]["merges"].append(["Ġh", "ard"])
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(parsed, ensure_ascii=False), encoding="utf-8")
    warnings: list[str] = []
    tok = load_tokenizer(str(path), "auto", warn=warnings.append)
    assert tok.backend == "tokenizers"
    assert len(warnings) == 1 and "each run on into a letter" in warnings[0], warnings
    assert_same_ids(tok, path, [" harder", *TEXTS])
