"""JSON lines read through orjson (the `fast` extra) give exactly the records and messages of
the standard parser alone: the same texts, the same problems, the same line numbers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lmshard.prepare.documents.records as records
from lmshard.prepare.documents.records import parse_jsonl

pytest.importorskip("orjson", reason="the fast JSON parser is in the `fast` extra")


def _both(payload: bytes) -> tuple[list, list]:
    fast = list(parse_jsonl(payload, 7, "text"))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(records, "_FAST_JSON", [None])  # the standard parser alone
        standard = list(parse_jsonl(payload, 7, "text"))
    return fast, standard


EDGE_LINES = [
    b'{"text": "plain"}',
    b"",
    b"   ",
    b"\r",
    b'{"text": "crlf"}\r',
    b'{"text": "\\ud800 lone surrogate"}',
    b'{"text": "\\ud83d\\ude00 pair"}',
    b'{"text": NaN}',
    b'{"text": 123456789012345678901234567890}',
    b'{"text": 1e400}',
    b'{"text": "dup", "text": "last wins"}',
    b"\xef\xbb\xbf" + b'{"text": "bom"}',
    b'{"text": "raw \x01 control"}',
    b'{"text": "unterminated',
    b"[1, 2]",
    b'{"other": "no text"}',
    b'{"text": "bad utf-8 \xff"}',
    b"\xc2\xa0",  # a no-break space alone: blank to the standard parser
    b"[" * 5000 + b"]" * 5000,  # deeper than either parser allows
    b'{"text": "nested", "meta": {"a": [1, {"b": null}]}}',
]


def test_edge_lines_give_the_standard_records():
    fast, standard = _both(b"\n".join(EDGE_LINES))
    assert fast == standard
    assert [r.number for r in fast if r.text == "plain"] == [7]  # numbering starts where the item does
    assert any(r.problem == "json_error" and "nested too deeply" in r.detail for r in fast)


PIECES = [b'{"text": ', b'"', b"\\", b"u", b"d8", b"00", b"\\n", b"}", b"{", b"[", b"]", b",", b":", b" ", b"\r",
          b"\xff", b"\xc3\xa9", b"\x00", b"1", b"e9", b"null", b"text", b"\n"]  # fmt: skip
pieces = st.sampled_from(PIECES)


@settings(max_examples=300, deadline=None)
@given(st.lists(pieces, max_size=40))
def test_random_bytes_give_the_standard_records(parts):
    payload = b"".join(parts)
    fast, standard = _both(payload)
    assert fast == standard


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["text", "id", "meta"]),
                                st.one_of(st.text(), st.integers(), st.floats(allow_nan=False), st.none())),
                max_size=8))  # fmt: skip
def test_valid_objects_give_the_standard_records(objs):
    payload = "\n".join(json.dumps(o, ensure_ascii=bool(len(o) % 2)) for o in objs).encode("utf-8", "surrogatepass")
    fast, standard = _both(payload)
    assert fast == standard
