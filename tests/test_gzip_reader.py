"""The fast gzip reader (ISA-L, `fast` extra) returns exactly the bytes of the standard one, on
intact and on damaged files: up to the last good byte, then the same kind of damage."""

from __future__ import annotations

import gzip
import random
import zlib

import pytest

from lmshard.prepare.documents.decompress import DamagedInput, _gzip_reader
from lmshard.prepare.documents.files import detect, open_binary

pytest.importorskip("isal", reason="the fast gzip reader is in the `fast` extra")


def _payload(n: int = 400_000) -> bytes:
    rng = random.Random(5)
    words = [b"alpha", b"beta", b"gamma", b"delta", b"\xc3\xa9t\xc3\xa9", b'{"text": 1}']
    return b" ".join(rng.choice(words) + (b"\n" if rng.random() < 0.1 else b"") for _ in range(n))


def _read_all(path: str, step: int) -> tuple[bytes, str | None]:
    """Everything the reader gives in reads of `step` bytes, and the damage it then reports."""
    stream, raw = open_binary(detect(path))
    out = bytearray()
    try:
        while chunk := stream.read(step):
            out += chunk
        return bytes(out), None
    except DamagedInput as e:
        return bytes(out), e.problem
    finally:
        raw.close()


def _standard(data: bytes) -> tuple[bytes, str | None]:
    """What zlib itself decodes from `data`: the independent truth."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data)
    except zlib.error:
        return b"", "corrupt_compression"  # not reached by the cases below before their damage
    return out, None if d.eof else "truncated_compression"


def test_the_fast_reader_is_used(tmp_path):
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(gzip.compress(b"{}\n"))
    fast, _ = _gzip_reader()
    stream, raw = open_binary(detect(str(path)))
    decompressed = stream._inner  # type: ignore[attr-defined]  # under the reader that takes a byte-order mark off
    assert fast is not None and type(decompressed._inner).__module__ == fast.__name__
    raw.close()


@pytest.mark.parametrize("step", [1 << 16, 1 << 20, 3 << 20])
def test_intact_and_truncated_files_give_the_standard_bytes(tmp_path, step):
    full = gzip.compress(_payload())
    whole = tmp_path / "whole.jsonl.gz"
    whole.write_bytes(full)
    assert _read_all(str(whole), step) == (gzip.decompress(full), None)
    for cut in (len(full) // 3, len(full) * 9 // 10, len(full) - 4):
        part = tmp_path / f"cut{cut}.jsonl.gz"
        part.write_bytes(full[:cut])
        got, problem = _read_all(str(part), step)
        expected, _ = _standard(full[:cut])
        assert problem == "truncated_compression"
        assert got == expected and len(got) > 0  # nothing the standard reader decodes is lost


def test_a_checksum_mismatch_is_reported_after_every_byte(tmp_path):
    full = bytearray(gzip.compress(_payload(50_000)))
    full[-8] ^= 0xFF  # the CRC32 in the trailer
    path = tmp_path / "crc.jsonl.gz"
    path.write_bytes(bytes(full))
    got, problem = _read_all(str(path), 1 << 20)
    assert problem == "corrupt_compression"
    assert got == gzip.decompress(gzip.compress(_payload(50_000)))
