"""Bucket changes stand out of each run's own step-to-step variation, or are not flagged."""

from __future__ import annotations

import polars as pl

from tracekit.diff.core import MIN_RELATIVE, bucket_changes
from tracekit.diff.results import GroupPair

STEP_NS = 10_000_000.0
PAIRS = [GroupPair(group_a="g", group_b="g", desc=None, size=8, by="membership")]


def _inst(durations: list[list[float]], op: str = "all_reduce", nbytes: int = 1 << 26) -> pl.DataFrame:
    rows = []
    for step, per_step in enumerate(durations):
        for d in per_step:
            rows.append({"instance": len(rows), "group": "g", "seq": len(rows), "op": op, "dim": "DP", "step": step,
                         "bytes": nbytes, "duration_ns": d, "busbw_gbps": nbytes / d})
    return pl.DataFrame(rows)


def _one(a: pl.DataFrame, b: pl.DataFrame):
    (row,) = bucket_changes(a, b, PAIRS, sorted(set(a["step"]) | set(b["step"])), STEP_NS)
    return row


NOISY_A = [[1.00e6], [1.10e6], [0.90e6], [1.05e6], [0.95e6]]


def test_a_change_within_the_step_to_step_spread_is_not_flagged():
    a = _inst([[1.0e6], [1.3e6], [0.7e6], [1.2e6], [0.8e6]])
    row = _one(a, _inst([[1.1e6], [1.4e6], [0.8e6], [1.3e6], [0.85e6]]))
    assert not row.flagged and row.duration_b_ns / row.duration_a_ns > 1 + MIN_RELATIVE  # +10%, inside the spread


def test_a_change_beyond_both_spreads_is_flagged():
    row = _one(_inst(NOISY_A), _inst([[1.5e6], [1.6e6], [1.4e6], [1.55e6], [1.45e6]]))
    assert row.flagged and row.ratio is not None and abs(row.ratio - 1 / 1.5) < 1e-9
    assert row.spread_a_ns > 0 and row.spread_b_ns > 0 and row.busbw_spread_a_gbps > 0 and row.busbw_spread_b_gbps > 0


def test_a_tiny_change_of_time_per_step_is_not_flagged():
    a = _inst([[10e3]] * 5)
    row = _one(a, _inst([[11e3]] * 5))  # +10%, no spread, but 1 us of a 10 ms step
    assert not row.flagged


def test_a_new_call_per_step_is_flagged_whatever_its_speed():
    row = _one(_inst([[1e6]] * 5), _inst([[1e6, 1e6]] * 5))
    assert row.flagged and (row.per_step_a, row.per_step_b) == (1, 2) and row.ratio == 1.0


def test_a_bucket_in_one_run_only_is_flagged():
    rows = bucket_changes(_inst([[1e6]] * 5), _inst([[1e6]] * 5, op="all_gather"), PAIRS, list(range(5)), STEP_NS)
    assert [(r.op, r.per_step_a, r.per_step_b, r.flagged) for r in rows] == [
        ("all_gather", 0.0, 1.0, True), ("all_reduce", 1.0, 0.0, True)]


def test_a_group_without_a_match_makes_no_bucket():
    other = _inst([[1e6]] * 5, op="all_to_all").with_columns(pl.lit("other").alias("group"))
    b = pl.concat([_inst([[1e6]] * 5), other])
    rows = bucket_changes(_inst([[1e6]] * 5), b, PAIRS, list(range(5)), STEP_NS)
    assert [(r.op, r.group_b, r.flagged) for r in rows] == [("all_reduce", "g", False)]
