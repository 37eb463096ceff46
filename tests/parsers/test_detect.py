"""Format detection by content, not by name."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tracekit.parsers.detect import detect_bytes, detect_format


@pytest.mark.parametrize("head", [
    b'{"schemaVersion": 1, "traceEvents": [',
    b'\n  {\n  "deviceProperties": [], "traceEvents": []}',
    b'{"username": "x", "distributedInfo": {"rank": 3}}',
    b'\xef\xbb\xbf{"traceEvents": []}',
    b'{"INFO": ["long log"], "traceEvents"  : [',
])
def test_kineto_heads(head: bytes) -> None:
    assert detect_bytes(head) == "kineto"


@pytest.mark.parametrize("head", [b"", b"[]", b'{"foo": 1}', b"NCCL INFO Init", b"\x80\x04\x95"])
def test_unknown_heads(head: bytes) -> None:
    assert detect_bytes(head) is None


def test_detect_ignores_names_and_gunzips(tmp_path: Path) -> None:
    body = b'{"traceName": "x", "traceEvents": []}'
    (tmp_path / "trace.txt").write_bytes(gzip.compress(body))
    (tmp_path / "trace.json").write_bytes(b"not json at all")
    (tmp_path / "short.gz").write_bytes(gzip.compress(body)[:15])
    assert detect_format(tmp_path / "trace.txt") == "kineto"
    assert detect_format(tmp_path / "trace.json") is None
    assert detect_format(tmp_path / "missing.json") is None
    assert detect_format(tmp_path / "short.gz") is None
