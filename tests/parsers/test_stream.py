"""The Chrome-trace stream reader: exact scanning, fast cuts, metadata on both sides."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.parsers._stream import ChromeFormatError, ChromeTraceReader, value_end


def _chunks(data: bytes, n: int):
    for i in range(0, len(data), n):
        yield data[i:i + n]


def _read(data: bytes, n: int):
    reader = ChromeTraceReader(_chunks(data, n), msgspec.json.decode)
    events, bad = [], []
    for kind, item in reader:
        (events.extend(item) if kind == "batch" else bad.append(item))
    return reader, events, bad


@pytest.mark.parametrize("n", [1, 7, 64, 1 << 16])
def test_metadata_before_and_after(n: int) -> None:
    doc = {"a": {"x": [1, "]}"]}, "traceEvents": [{"n": i, "s": "}, {"} for i in range(20)],
           "distributedInfo": {"rank": 4}, "z": "tail"}
    reader, events, bad = _read(json.dumps(doc).encode(), n)
    assert events == doc["traceEvents"] and not bad
    assert reader.metadata == {"a": doc["a"], "distributedInfo": {"rank": 4}, "z": "tail"}
    assert reader.finished and not reader.truncated_tail


def test_bad_event_is_isolated() -> None:
    data = b'{"traceEvents": [{"a": 1}, {"b": tru}, {"c": 3}]}'
    _, events, bad = _read(data, 1 << 10)
    assert events == [{"a": 1}, {"c": 3}] and bad == [b'{"b": tru}']


def test_not_an_object() -> None:
    with pytest.raises(ChromeFormatError):
        _read(b"[1, 2]", 100)


def test_value_end() -> None:
    buf = b'{"a": "x\\"}", "b": [1, {"c": "]"}]} tail'
    assert buf[: value_end(buf, 0, False)] == b'{"a": "x\\"}", "b": [1, {"c": "]"}]}'
    assert value_end(b'{"a": "unterminated', 0, False) == -1
    assert value_end(b"123", 0, False) == -1 and value_end(b"123", 0, True) == 3


@settings(max_examples=80, deadline=None)
@given(events=st.lists(st.dictionaries(st.text(max_size=4), st.one_of(
    st.integers(), st.text(max_size=6), st.lists(st.text(max_size=3), max_size=3)), max_size=4),
    max_size=12), n=st.integers(1, 40), cut=st.integers(0, 400))
def test_random_docs_and_truncations(events: list, n: int, cut: int) -> None:
    data = json.dumps({"k": 1, "traceEvents": events, "t": [2]}).encode()
    reader, got, bad = _read(data, n)
    assert got == events and not bad and reader.metadata == {"k": 1, "t": [2]}
    part = data[: min(cut, len(data))]
    try:
        reader, got, bad = _read(part, n)
    except ChromeFormatError:
        assert len(part) < len(b'{"k": 1, "traceEvents": [')
        return
    assert got == events[: len(got)] and not bad
