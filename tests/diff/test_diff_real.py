"""Real traces: the bundled sample against itself, and HTA's trace_diff control and test pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.cli import main
from tracekit.diff import diff_runs
from tracekit.ingest import ingest

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample_traces" / "synth_moe_16rank"
KINETO = REPO.parent / "shared" / "real_traces" / "kineto"
CONTROL = KINETO / "hta_trace_diff_control"
TEST = KINETO / "hta_trace_diff_test"


@pytest.fixture(scope="module")
def hta(tmp_path_factory):
    if not (CONTROL.is_dir() and TEST.is_dir()):
        pytest.skip(f"HTA's trace_diff pair not present under {KINETO}")
    out = tmp_path_factory.mktemp("hta")
    ingest([str(CONTROL)], out / "control")
    ingest([str(TEST)], out / "test")
    return diff_runs(out / "control", out / "test")


def test_the_bundled_sample_against_itself_reports_no_change(tmp_path):
    ingest([str(SAMPLE)], tmp_path / "a")
    ingest([str(SAMPLE)], tmp_path / "b")
    d = diff_runs(tmp_path / "a", tmp_path / "b")
    assert d.verdict.startswith("no significant change: step +0 ns (+0%)"), d.verdict
    assert d.decomposition.source == "critical_path" and d.decomposition.remainder_ns == 0
    assert not any(b.flagged for b in d.buckets) and not d.setup and not d.culprits and not d.matching.notes
    assert d.matching.instances_by_seq == 204


def test_hta_pair_says_the_runs_differ_and_compares_the_one_rank_each_has(hta):
    m = hta.matching
    assert m.ranks_by == "order" and m.ranks == {3: 1}
    assert "world sizes differ: A 8 ranks, B 2" in m.notes
    assert "caution: world sizes differ" in hta.verdict
    deco = hta.decomposition
    assert deco.source == "rank_means" and deco.steps == 6
    assert deco.parts_sum_ns + deco.remainder_ns == pytest.approx(deco.delta_ns)
    assert abs(deco.remainder_ns) < 0.01 * abs(deco.delta_ns)  # one rank: its window is the step
    # test's steps are 60% longer than control's, and compute is most of it
    assert deco.delta_ns / deco.step_a_ns == pytest.approx(0.60, abs=0.02)
    assert hta.verdict.startswith("step +46.6 ms (+60%): +44.3 ms is compute"), hta.verdict


def test_hta_pair_through_the_cli_from_raw_traces(hta):
    res = CliRunner().invoke(main, ["diff", str(CONTROL), str(TEST), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "tracekit.diff/1" and doc["verdict"] == hta.verdict
    assert next(p["name"] for p in doc["decomposition"]["parts"]) == "compute"


NCCL_LOGS = REPO.parent / "shared" / "real_traces" / "nccl_logs"


def test_two_nccl_logs_compare_their_setup_without_step_times():
    """Two real NCCL INFO logs (no timed collectives): each half of a 16-rank job, 2.27.5 and 2.29.3."""
    a, b = NCCL_LOGS / "slurmv4_nccl2.27.5_2node_16rank_roce", NCCL_LOGS / "slurmv4_nccl2.29.3_2node_16rank_roce"
    if not (a.is_dir() and b.is_dir()):
        pytest.skip(f"the slurmv4 NCCL logs are not present under {NCCL_LOGS}")
    res = CliRunner().invoke(main, ["diff", str(a), str(b)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("step time not compared: neither run has timed steps; NCCL version: 2.27.5 in A, "
                               "2.29.3 in B; caution: A has 8 of its 16 ranks (missing: 0-7)")
    assert "note: no rank in common: the 8 present rank(s) matched in order (8->0, 9->1, 10->2, 11->3)" in lines
    assert "Step time, A -> B" not in res.stdout and "Setup differences" in res.stdout
