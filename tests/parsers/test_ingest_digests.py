"""The columnar Kineto marker store and the streamed run merge give the tables the
object-per-marker parser and the copy-and-sort merge gave (digests in golden/, made by them)."""

from __future__ import annotations

import json

import pytest
from ingest_digests import GOLDEN, compute

_EXPECTED = json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def actual() -> dict[str, dict[str, str]]:
    return compute(set(_EXPECTED))


@pytest.mark.parametrize("case", sorted(_EXPECTED))
def test_ingest_gives_the_golden_tables(case, actual):
    if case not in actual:
        pytest.skip(f"input of {case} not present")
    assert actual[case] == _EXPECTED[case]
