"""Fixtures for the analysis tests: synthetic runs with known truth."""

from __future__ import annotations

import pytest
from analysis_helpers import strip_derived

from tracekit.synth import SynthSpec, make_run_tables


@pytest.fixture(scope="session")
def synth_small():
    tables, truth = make_run_tables(SynthSpec(hosts=2, gpus_per_host=4, pp=2, ep=2, steps=3,
                                              clock_skew_ns=2_000_000, seed=3))
    return strip_derived(tables), truth


@pytest.fixture(scope="session")
def synth_wide():
    """4 hosts x 4 GPUs, 4 stages: every host has its own clock offset."""
    tables, truth = make_run_tables(SynthSpec(hosts=4, gpus_per_host=4, pp=4, ep=2, steps=3, seed=11,
                                              clock_skew_ns=3_000_000, straggler_rank=6, straggler_step=2))
    return strip_derived(tables), truth
