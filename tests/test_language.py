"""`--filter language=CODES[:MIN]` against py3langid's own classifier called here on the same
texts: the verdicts on a sample of mixed-language documents, the drops a prepare run counts, and
one-line errors for arguments it cannot read."""

from __future__ import annotations

import random
import sys
from collections import Counter

import pytest
from test_prepare import jsonl

from lmshard.errors import ConfigError
from lmshard.format import load_metadata
from lmshard.prepare import PrepareConfig, prepare
from lmshard.quality import language
from lmshard.quality.filters import resolve

langid = pytest.importorskip("py3langid.langid", reason="the language model is in the `lang` extra")

SENTENCES = {
    "en": ["The river runs quietly past the old mill.", "We walked home after the long winter evening.",
           "She said that the weather would change tomorrow.", "Most of the houses were built of stone."],
    "de": ["Der Fluss fließt ruhig an der alten Mühle vorbei.", "Wir gingen nach dem langen Winterabend nach Hause.",
           "Sie sagte, dass sich das Wetter morgen ändern würde.", "Die meisten Häuser waren aus Stein gebaut."],
    "fr": ["La rivière coule doucement devant le vieux moulin.", "Nous sommes rentrés après la longue soirée d'hiver.",
           "Elle a dit que le temps changerait demain.", "La plupart des maisons étaient construites en pierre."],
    "es": ["El río corre tranquilo junto al viejo molino.", "Volvimos a casa después de la larga tarde de invierno.",
           "Ella dijo que el tiempo cambiaría mañana.", "La mayoría de las casas eran de piedra."],
    "nl": ["De rivier stroomt rustig langs de oude molen.", "We liepen naar huis na de lange winteravond.",
           "Ze zei dat het weer morgen zou veranderen.", "De meeste huizen waren van steen gebouwd."],
}  # fmt: skip


def _document(rng: random.Random) -> str:
    """One language, or a mix, or a few words: spread the model's answers and their probabilities."""
    langs = rng.sample(sorted(SENTENCES), k=rng.choice([1, 1, 2, 3]))
    picks = [rng.choice(SENTENCES[rng.choice(langs)]) for _ in range(rng.randint(1, 8))]
    if rng.random() < 0.15:
        picks = [" ".join(rng.choice(picks).split()[:2])]
    return "\n".join(picks)


def expected(text: str, codes: tuple[str, ...], min_score: float, model) -> str | None:
    lang, score = model.classify(text)
    if lang not in codes:
        return "language_not_" + "_".join(codes)
    return "language_low_score" if score < min_score else None


@pytest.fixture(scope="module")
def model():
    return langid.LanguageIdentifier.from_model_file(langid.MODEL_FILE, norm_probs=True)


@pytest.fixture(scope="module")
def docs():
    rng = random.Random(21)
    return [_document(rng) for _ in range(1500)]


@pytest.mark.parametrize(("spec", "codes", "min_score"), [("en", ("en",), 0.0), ("en,de:0.9", ("en", "de"), 0.9)])
def test_verdicts_equal_py3langid(docs, model, spec, codes, min_score):
    ours = [resolve(f"language={spec}")(d) for d in docs]
    theirs = [expected(d, codes, min_score, model) for d in docs]
    assert ours == theirs
    counts = Counter(ours)
    assert len(counts) == (2 if min_score == 0 else 3) and min(counts.values()) >= 30, counts


def test_prepare_counts_the_drops(tmp_path, docs, model):
    src = jsonl(tmp_path / "docs.jsonl", docs)
    out = tmp_path / "out"
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), filters=["language=en,de:0.9"], dedup="none",
                          val_fraction=0.0, quiet=True, workers=2))  # fmt: skip
    meta = load_metadata(out)
    reasons = Counter(expected(d, ("en", "de"), 0.9, model) for d in docs)
    assert {k: v for k, v in meta.drops.items() if v} == {k: v for k, v in reasons.items() if k}
    assert meta.n_docs() == reasons[None]
    assert meta.config["filters"] == ["language=en,de:0.9"]


@pytest.mark.parametrize(("spec", "message"), [
    ("language", "name the languages to keep"), ("language=", "name the languages to keep"),
    ("language=english", "knows no language 'english'; it knows"), ("language=en:1.5", "from 0 to 1, not '1.5'"),
    ("language=en:high", "from 0 to 1, not 'high'"),
])  # fmt: skip
def test_bad_arguments_are_one_line(tmp_path, spec, message):
    with pytest.raises(ConfigError, match=message) as caught:
        PrepareConfig(inputs=[str(tmp_path)], out=str(tmp_path / "x"), filters=[spec])
    assert "\n" not in str(caught.value) and str(caught.value).startswith(f"--filter {spec}:")


def test_without_the_package_the_fix_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "py3langid.langid", None)  # an import of it fails
    language.identifier.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"needs the py3langid package: pip install 'lmshard\[lang\]'"):
            resolve("language=fr")
    finally:
        language.identifier.cache_clear()


def test_a_long_list_of_codes_gets_a_short_reason():
    many = "en,de,fr,es,nl,it,pt,pl,sv,da,fi,cs,sk,sl,hr,ro,hu,tr"  # "language_not_" + these: over 64
    assert resolve(f"language={many}")("Это русский текст о реке и мельнице.") == "language_not_listed"
