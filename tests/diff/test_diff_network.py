"""Network or job: B replayed with A's calibration on the network A ran on."""

from __future__ import annotations

import pytest
from diff_helpers import synth

from tracekit.diff import diff_runs

TOPOLOGY = "rail-optimized:nic_gbps=400"
SMALL = {"hosts": 2, "gpus_per_host": 4, "steps": 4}


@pytest.fixture(scope="module")
def small_base():
    return synth(**SMALL)


def _check(d):
    n = d.network
    assert n is not None and n.steps == d.decomposition.steps
    assert n.network_ns + n.job_ns == pytest.approx(n.step_b_ns - n.step_a_ns)
    assert n.step_b_ns - n.step_a_ns == pytest.approx(d.decomposition.delta_ns, rel=0.02, abs=20_000)
    assert n.step_error < 0.1
    return n


def test_a_slow_nic_is_the_network(small_base):
    d = diff_runs(small_base, synth(**SMALL, slow_nic_rank=5), topology=TOPOLOGY)
    n = _check(d)
    assert n.dominant == "network" and n.network_ns > 0.8 * (n.step_b_ns - n.step_a_ns)
    assert "the network delivered less for the same work" in d.verdict, d.verdict


def test_slower_compute_is_the_job(small_base):
    d = diff_runs(small_base, synth(**SMALL, slow_stage=1), topology=TOPOLOGY)
    n = _check(d)
    assert n.dominant == "job" and n.job_ns > 0.8 * (n.step_b_ns - n.step_a_ns)
    assert "the job asked for more" in d.verdict, d.verdict


def test_cli_topology_prints_the_split(tmp_path, small_base):
    from click.testing import CliRunner

    from tracekit.cli import main
    from tracekit.synth import write_run

    write_run(small_base, tmp_path / "a")
    write_run(synth(**SMALL, slow_nic_rank=5), tmp_path / "b")
    res = CliRunner().invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--topology", TOPOLOGY])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stdout.splitlines() if x.startswith("network or job"))
    assert "with A's calibration" in line and "network +" in line and "cross-validated on A" in line


def test_topology_needs_something_to_replay(base):
    from tracekit.errors import TracekitError

    with pytest.raises(TracekitError, match="replays the runs"):
        diff_runs(base, base, topology=TOPOLOGY)


def test_a_slower_fabric_everywhere_is_the_network_not_the_calibration(small_base):
    """Every NIC at half speed: B's own calibration would absorb it; A's does not."""
    d = diff_runs(small_base, synth(**SMALL, nic_gbs=25.0), topology=TOPOLOGY)
    n = _check(d)
    assert n.dominant == "network" and n.network_ns > 0.8 * (n.step_b_ns - n.step_a_ns) > 0


def test_a_run_against_itself_is_neither(small_base):
    d = diff_runs(small_base, small_base, topology=TOPOLOGY)
    n = d.network
    assert n.job_ns == pytest.approx(0, abs=1.0) and n.network_ns == pytest.approx(0, abs=1.0)
    assert n.dominant == "neither" and "neither the network (+0 ns) nor the job (+0 ns)" in d.verdict


def test_steps_matched_in_order_are_replayed_under_their_own_numbers(small_base):
    from diff_helpers import shift_steps

    d = diff_runs(small_base, shift_steps(small_base, 10), topology=TOPOLOGY)
    n = d.network
    assert n.step_b_ns == pytest.approx(n.step_a_ns) and n.step_a_ns > 0
    assert n.job_ns == pytest.approx(0, abs=1.0) and n.network_ns == pytest.approx(0, abs=1.0)


@pytest.mark.xfail(strict=True, reason="known gap: with the hardware profiles and NICs shared per connection set, "
                   "the seeds' +1.4% step change is 1.1% unexplained by the replay (job +47 us, network +170 us), "
                   "just above the 1% floor; the floor needs the replay's error on a change, not on a step")
def test_two_seeds_of_one_job_are_neither(small_base):
    d = diff_runs(small_base, synth(**SMALL, seed=2), topology=TOPOLOGY)
    n = d.network
    assert n.network_ns != 0 and n.job_ns != 0  # small moves, both within the replay's error and 1% of the step
    assert n.dominant == "neither", (n.job_ns, n.network_ns)
