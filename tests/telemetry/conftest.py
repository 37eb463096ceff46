"""Fixtures for telemetry tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from telemetry_helpers import REAL


@pytest.fixture(scope="session")
def real() -> Path:
    if not REAL.is_dir():
        pytest.skip(f"real telemetry samples not present at {REAL}")
    return REAL.resolve()
