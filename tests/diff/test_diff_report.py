"""The Diff tab: its data (no browser) and the standalone report `tracekit diff --report` writes."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from diff_helpers import synth

from tracekit.cli import main
from tracekit.diff import diff_runs
from tracekit.synth import write_run
from tracekit.viz.diff import diff_data


@pytest.fixture(scope="module")
def slow_nic():
    return diff_runs(synth(), synth(slow_nic_rank=5))


def test_waterfall_steps_chain_from_a_to_b(slow_nic):
    steps = diff_data(slow_nic).waterfall
    assert steps[0].name == "step time in A" and steps[-1].name == "step time in B"
    for prev, cur in zip(steps[1:-2], steps[2:-1], strict=True):  # noqa: RUF007 - the parts only
        assert cur.start == pytest.approx(prev.end)
    assert steps[-2].end == pytest.approx(steps[-1].end)  # the remainder closes on B
    assert steps[-1].end == pytest.approx(slow_nic.decomposition.step_b_ns)


def test_heat_names_the_slow_host_late(slow_nic):
    heat = diff_data(slow_nic).heat
    assert set(heat) == {"node000", "node001", "node002", "node003"}
    assert max(heat, key=lambda h: heat[h]["exposed comm"]) in ("node000", "node001")
    assert heat["node001"]["exposed comm"] > 1e6 and abs(heat["node001"]["compute"]) < 2e5  # comm rose, not compute
    late = {r.rank_b: r.late_b_ns - r.late_a_ns for r in slow_nic.ranks if r.host == "node001"}
    assert heat["node001"]["late"] == pytest.approx(sum(late.values()) / len(late))


def test_cli_report_writes_a_diff_tab(tmp_path):
    write_run(synth(), tmp_path / "a")
    write_run(synth(slow_nic_rank=5), tmp_path / "b")
    out = tmp_path / "diff.html"
    res = CliRunner().invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--report", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert '"Diff"' in text and "Per host: mean change per rank" in text and "node001" in text
    assert res.stdout.splitlines()[-1] == f"report: {out}"
