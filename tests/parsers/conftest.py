"""Fixtures for parser tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from kineto_helpers import REAL


@pytest.fixture(scope="session")
def real() -> Path:
    if not REAL.is_dir():
        pytest.skip(f"real traces not present at {REAL}")
    return REAL.resolve()
