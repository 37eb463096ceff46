"""Fixtures for the diff tests: the base synthetic run and its analysis, made once."""

from __future__ import annotations

import pytest
from diff_helpers import synth

from tracekit.analysis import analyze


@pytest.fixture(scope="session")
def base_tables():
    return synth()


@pytest.fixture(scope="session")
def base(base_tables):
    return analyze(base_tables, write=False)
