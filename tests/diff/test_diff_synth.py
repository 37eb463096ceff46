"""Synthetic pairs with one known change each: the verdict names the change first, the parts of
the step-time change add up to it, and a change that is not there (a clock offset) never shows."""

from __future__ import annotations

import pytest
from diff_helpers import shift_rank_clock, synth

from tracekit.diff import diff_runs
from tracekit.diff.results import RunDiff


def _sums(d: RunDiff) -> None:
    deco = d.decomposition
    assert deco.parts_sum_ns == pytest.approx(sum(p.delta_ns for p in deco.parts))
    assert deco.parts_sum_ns + deco.remainder_ns == pytest.approx(deco.delta_ns, abs=1e-3)
    if deco.source == "critical_path":  # compute + comm per dim + idle = step time, per step
        assert abs(deco.remainder_ns) < 1.0
    assert deco.delta_ns == pytest.approx(deco.step_b_ns - deco.step_a_ns)


@pytest.fixture(scope="module")
def slow_nic(base):
    return diff_runs(base, synth(slow_nic_rank=5))


def test_slow_nic_names_dp_and_the_host(slow_nic):
    d = slow_nic
    _sums(d)
    assert d.decomposition.significant and d.decomposition.delta_ns > 2e6
    assert d.verdict.startswith("step +"), d.verdict
    lead = d.verdict.split(":", 1)[1]
    assert "DP communication" in lead and "all_reduce" in lead and "node001" in lead and "rank 5" in lead
    assert {(c.kind, c.name) for c in d.culprits} == {("rank", "5"), ("host", "node001")}
    top = next(b for b in d.buckets if b.flagged)
    assert (top.op, top.dim, top.per_step_a, top.per_step_b) == ("all_reduce", "DP", 2, 2)
    assert top.ratio is not None and top.ratio < 0.6
    ranks = {r.rank_b for r in d.ranks if "late" in r.slower_in}
    assert 5 in ranks
    assert d.decomposition.outlier is None  # every step slowed: a trend, not one step


def test_compute_regression_on_one_stage(base):
    d = diff_runs(base, synth(slow_stage=1, slow_stage_factor=1.5))
    _sums(d)
    assert ": +" in d.verdict and "is compute" in d.verdict and "ranks 8-15" in d.verdict, d.verdict
    slower = {r.rank_b for r in d.ranks if "compute" in r.slower_in}
    assert slower == set(range(8, 16))
    assert not any(b.flagged and b.ratio is not None and b.ratio < 1 for b in d.buckets)  # no collective slowed


def test_one_more_gradient_bucket(base):
    d = diff_runs(base, synth(dp_buckets=3))
    _sums(d)
    assert "2 -> 3 all_reduce of 67.11 MB per step" in d.verdict, d.verdict
    counted = [b for b in d.buckets if b.per_step_a != b.per_step_b]
    assert {(b.op, b.dim, b.per_step_a, b.per_step_b) for b in counted} == {("all_reduce", "DP", 2, 3)}
    assert d.buckets[0] in counted  # a change of count leads the buckets
    assert d.matching.instances_only_b == 10 and d.matching.instances_only_a == 0


def test_more_ep_skew(base):
    d = diff_runs(base, synth(hot_expert_share=0.9))
    _sums(d)
    assert "is compute" in d.verdict and "EP imbalance" in d.verdict, d.verdict
    assert [s.item for s in d.setup] == ["EP imbalance"]
    hot = {r.rank_b for r in d.ranks if "compute" in r.slower_in}
    assert hot == set(range(0, 16, 2))  # the first member of each EP pair holds the hot expert


def test_clock_offset_on_one_rank_is_no_difference(base, base_tables):
    d = diff_runs(base, shift_rank_clock(base_tables, 6, 3_000_000))
    _sums(d)
    assert d.verdict.startswith("no significant change"), d.verdict
    assert "but" not in d.verdict
    assert not any(b.flagged for b in d.buckets)
    assert not any(r.slower_in for r in d.ranks)
    assert d.decomposition.delta_ns == pytest.approx(0, abs=1_000)


def test_a_run_against_itself_changes_nothing(base, base_tables):
    d = diff_runs(base, base_tables)
    _sums(d)
    assert d.verdict.startswith("no significant change: step +0 ns"), d.verdict
    assert not d.decomposition.significant and not any(p.significant for p in d.decomposition.parts)
    assert not any(b.flagged for b in d.buckets) and not d.culprits and not d.setup and not d.waits
    assert not d.matching.notes


def test_two_seeds_of_one_job_are_no_regression(base):
    d = diff_runs(base, synth(seed=1))
    _sums(d)
    assert d.verdict.startswith("no significant change"), d.verdict
    idle = next(p for p in d.decomposition.parts if p.name == "idle")
    assert abs(idle.delta_ns) > 0.01 * d.decomposition.step_a_ns and not idle.significant  # inside its noise


def test_fewer_ring_channels_name_dp_and_the_channels():
    d = diff_runs(synth(ring_channels=4), synth(ring_channels=1))
    _sums(d)
    assert "is DP communication on the critical path, where all_reduces of 67.11 MB" in d.verdict, d.verdict
    assert d.verdict.endswith("; channels: 4 in A, 1 in B"), d.verdict
    assert not d.culprits  # every member of the group is in every slowed all-reduce: no one to blame
    assert [(s.item, s.a, s.b) for s in d.setup] == [("channels", "4", "1"),
                                                     ("NICs", "mlx5_0, mlx5_1, mlx5_2, mlx5_3", "mlx5_0")]


def test_a_one_off_stall_is_one_step_not_a_trend(base):
    d = diff_runs(base, synth(straggler_rank=6, straggler_step=2))
    _sums(d)
    assert d.verdict.startswith("no significant change"), d.verdict
    assert "but step 2 alone is +20.0 ms" in d.verdict and "waiting on rank 6 (node001)" in d.verdict
    out = d.decomposition.outlier
    assert out is not None and (out.step, out.root_rank) == (2, 6) and out.others_ns < 0.05 * out.delta_ns


def test_the_outlier_names_the_root_of_its_own_step(base):
    """Rank 5's waits grow in every step, rank 6's only in the outlying step: the step names rank 6."""
    from dataclasses import replace

    import polars as pl

    from tracekit.diff.core import step_outlier

    def with_steps(step_ns: list[int], waits: list[tuple[int, int, int]]):
        st = pl.DataFrame({"step": list(range(5)), "step_ns": step_ns}, schema={"step": pl.Int32, "step_ns": pl.Int64})
        rc = pl.DataFrame(waits, schema={"root_rank": pl.Int32, "root_step": pl.Int32, "total_wait_ns": pl.Int64},
                          orient="row")
        return replace(base, step_times=st.to_arrow(), root_causes=rc.to_arrow())

    a = with_steps([10_000_000] * 5, [])
    b = with_steps([10_100_000, 10_000_000, 30_000_000, 10_050_000, 9_900_000],
                   [(5, s, 50_000_000) for s in (0, 1, 3, 4)] + [(6, 2, 40_000_000)])
    out = step_outlier(a, b, list(range(5)), {r: r for r in range(16)}, {5: "node001", 6: "node001"}, 10_000_000)
    assert (out.step, out.delta_ns, out.root_rank, out.others_ns) == (2, 20_000_000, 6, 75_000)
    assert step_outlier(a, a, list(range(5)), {}, {}, 10_000_000) is None


def test_a_slow_nic_is_named_when_the_channels_say_which():
    d = diff_runs(synth(ring_channels=4), synth(ring_channels=4, slow_nic_rank=5))
    assert "through host node001 (rank 5, NIC mlx5_1)" in d.verdict, d.verdict
    assert next(c for c in d.culprits if c.kind == "rank").nics == ["mlx5_1"]
