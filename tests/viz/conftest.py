"""Fixtures for the viz tests."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from viz_inputs import tiny_analysis, tiny_replay, tiny_tables


@pytest.fixture
def tables() -> dict[str, pa.Table]:
    return tiny_tables()


@pytest.fixture
def analysis() -> dict[str, Any]:
    return tiny_analysis()


@pytest.fixture
def replay() -> dict[str, Any]:
    return tiny_replay()
