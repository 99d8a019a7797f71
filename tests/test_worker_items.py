"""The separators around each document (output/writer.with_separators), and the worker pool's
side of a work item (documents/worker.py): a work item's process's tokens come back intact.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import write
from hypothesis import given, settings
from hypothesis import strategies as st

from lmshard.prepare.documents.clean import CleanConfig
from lmshard.prepare.documents.sources import discover, plan
from lmshard.prepare.documents.worker import WorkerConfig, run_item
from lmshard.prepare.output.writer import with_separators
from lmshard.tokenizers import load_tokenizer


def test_separators_with_and_without_bos():
    tokens = np.array([1, 2, 3, 4, 5], dtype=np.uint32)
    lengths, every = np.array([2, 0, 3]), np.ones(3, bool)
    out, lens = with_separators(tokens, lengths, every, 9, "after", 7)
    assert out.tolist() == [7, 1, 2, 9, 7, 9, 7, 3, 4, 5, 9] and lens.tolist() == [4, 2, 5]
    out, lens = with_separators(tokens, lengths, every, 9, "before", 7)
    assert out.tolist() == [9, 7, 1, 2, 9, 7, 9, 7, 3, 4, 5] and lens.tolist() == [4, 2, 5]
    some = np.array([True, False, True])
    out, lens = with_separators(tokens, lengths, some, 9, "after")
    assert out.tolist() == [1, 2, 9, 3, 4, 5, 9] and lens.tolist() == [3, 4]
    out, lens = with_separators(tokens, lengths, some, 9, "before", 7)
    assert out.tolist() == [9, 7, 1, 2, 9, 7, 3, 4, 5] and lens.tolist() == [4, 5]
    assert out.dtype == np.dtype("<u4")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2**32 - 1), max_size=6), st.booleans()), max_size=8),
       st.sampled_from(["after", "before"]), st.sampled_from([None, 7]))  # fmt: skip
def test_separators_match_a_plain_python_reference(docs, position, bos):
    tokens = np.array([t for d, _ in docs for t in d], dtype=np.uint32)
    lengths = np.array([len(d) for d, _ in docs], dtype=np.int64)
    keep = np.array([k for _, k in docs], dtype=bool)
    expected: list[int] = []
    for d, k in docs:
        if k:
            head = [] if bos is None else [bos]
            expected += head + d + [9] if position == "after" else [9] + head + d
    out, lens = with_separators(tokens, lengths, keep, 9, position, bos)
    assert out.tolist() == expected and out.dtype == np.dtype("<u4")
    assert lens.tolist() == [len(d) + (1 if bos is None else 2) for d, k in docs if k]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """~45 work items of one JSON-lines file (1 KiB blocks), a worker config and a tokenizer."""
    root = tmp_path_factory.mktemp("feed")
    src = write(root / "a.jsonl", "".join(json.dumps({"text": f"document {i} " + "w " * (i % 50)}) + "\n"
                                          for i in range(640)))  # fmt: skip
    sources = discover([str(src)])
    wcfg = WorkerConfig(sources=tuple(sources), clean=CleanConfig(), tokenizer="gpt2", tokenizer_backend="tiktoken")
    tok = load_tokenizer("gpt2", "tiktoken")
    return sources, wcfg, tok


def test_ids_travel_back_narrow_only_when_every_one_fits(setup):
    """Workers send uint16 for vocabularies under 65,536 ids; a backend whose ids exceed what
    its n_vocab says still gets every id back intact (uint32), never wrapped."""
    from lmshard.tokenizers import Tokenizer

    sources, wcfg, _ = setup

    class Fixed(Tokenizer):
        def __init__(self, n_vocab: int, ids: list[int]) -> None:
            self.n_vocab, self.ids = n_vocab, ids

        def encode_batch(self, texts):
            return (np.array(self.ids * len(texts), dtype=np.uint32),
                    np.full(len(texts), len(self.ids), dtype=np.int64))  # fmt: skip

        def decode(self, ids):
            return ""

        def identity(self):
            return {}

    item = next(iter(plan(sources, "auto", "text")))
    narrow = run_item(item, wcfg, Fixed(50_257, [1, 50_256]))
    assert narrow.tokens.dtype == np.uint16 and set(narrow.tokens.tolist()) == {1, 50_256}
    lying = run_item(item, wcfg, Fixed(1_000, [1, 70_000]))  # n_vocab understated
    assert lying.tokens.dtype == np.uint32 and set(lying.tokens.tolist()) == {1, 70_000}
