"""Fuzz tests: seeds and the short CI profile (TRACEKIT_FUZZ_EXAMPLES cases per parser, 200 by
default; benchmarks/fuzz.py runs the long campaigns)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import fuzzing


@pytest.fixture(scope="session")
def seeds() -> dict[str, list[fuzzing.Seed]]:
    return fuzzing.cached_seeds()


@pytest.fixture(scope="session")
def repo_seeds() -> dict[str, list[fuzzing.Seed]]:
    """The seeds the repository holds, without ../shared/real_traces."""
    return fuzzing.load_seeds(real=False)
