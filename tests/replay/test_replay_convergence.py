"""The schedule/simulate fixed point says how it ended: rounds run, the last round's largest start
move against the tolerance, and a replay_caution when the cap was hit with starts still moving."""

import json

import numpy as np
import pyarrow as pa
import pytest
from hand_traces import BASE, PHYSICS_NS, Trace

from tracekit.replay import engine
from tracekit.replay.engine import ReplayResult, ReplaySummary, replay
from tracekit.results import from_builtins


def _late_all_reduce():
    """Compute replayed 1.5 ms longer than traced: the all-reduce's start moves from 1 ms to
    2.5 ms in the first round, and nothing moves in the second."""
    tr = Trace()
    for r in (0, 1):
        tr.kernel(r, "gpu0/stream7", "compute", 0, 1_000_000)
        tr.kernel(r, "gpu0/stream7", "comm", 1_000_000, PHYSICS_NS, coll=tr.collective(0, "all_reduce", "dp", 0, r))
    tables = tr.tables()
    tables["events"] = tables["events"].append_column(
        "replay_dur_ns", pa.array([2_500_000, None, 2_500_000, None], pa.int64()))
    return tables


def _not_converged(res):
    return [f for f in res.findings if f.kind == "replay_caution" and f.data.get("reason") == "not_converged"]


def test_settled_replay_records_its_rounds_and_has_no_caution():
    res = replay(_late_all_reduce(), [BASE, "single-switch:gpus=1,latency_ns=0,pcie_gbps=500"])
    for r in res.results:
        cv = r.convergence
        assert cv.converged and cv.rounds == 2
        assert cv.moves_ns[0] == pytest.approx(1_500_000) and cv.residual_ns == cv.moves_ns[-1] == 0.0
        assert cv.tolerance_ns == pytest.approx(engine.SETTLE_FRAC * max(i.replayed_ns for i in r.instances),
                                                abs=1e-3)
    assert not _not_converged(res)


def test_cap_hit_records_the_residual_and_cautions():
    """One round allowed: the start moved 1.5 ms, far above the tolerance (10^-3 of ~1 ms)."""
    res = replay(_late_all_reduce(), [BASE], max_iter=1)
    cv = res.results[0].convergence
    assert cv.rounds == 1 and not cv.converged
    assert cv.residual_ns == pytest.approx(1_500_000) and cv.tolerance_ns < 2_000
    (f,) = _not_converged(res)
    assert f.severity == "warning" and f.value == cv.residual_ns
    assert f.data["topology"] == res.results[0].topology == BASE and f.data["rounds"] == 1
    assert BASE in f.text and "1500.0 µs" in f.text and "1 rounds" in f.text
    doc = json.loads(res.dumps())
    moving = {"group": "dp", "seq": 0, "op": "all_reduce", "dim": "DP", "start_swing_ns": cv.residual_ns,
              "duration_swing_ns": 0.0}
    assert doc["results"][0]["convergence"] == {"rounds": 1, "residual_ns": cv.residual_ns,
                                                "tolerance_ns": cv.tolerance_ns, "converged": False,
                                                "moves_ns": [cv.residual_ns], "cycle": 0, "cycle_from": 0,
                                                "n_oscillating": 1, "oscillating": [moving]}
    assert doc["findings"][[g["data"].get("reason") for g in doc["findings"] if "data" in g].index(
        "not_converged")]["kind"] == "replay_caution"


def test_each_unsettled_topology_gets_its_own_caution():
    slow = "single-switch:gpus=1,latency_ns=0,pcie_gbps=500"
    res = replay(_late_all_reduce(), [BASE, slow], max_iter=1)
    assert [f.data["topology"] for f in _not_converged(res)] == [BASE, slow]
    assert [f.value for f in _not_converged(res)] == [r.convergence.residual_ns for r in res.results]


def test_convergence_round_trips_and_old_json_reads_as_unknown():
    res = replay(_late_all_reduce(), [BASE], max_iter=1)
    back = ReplayResult.of(from_builtins(json.loads(res.dumps()), ReplaySummary))
    assert back.results[0].convergence == res.results[0].convergence
    assert [f.data for f in back.findings] == [f.data for f in res.findings]
    old = json.loads(res.dumps())
    del old["results"][0]["convergence"]
    assert ReplayResult.of(from_builtins(old, ReplaySummary)).results[0].convergence is None


# ------------------------------------------------------------------------------------------
# A limit cycle on a 16-rank DP x PP x EP run (`tracekit synth --hosts 8 --gpus 2 --pp 2 --ep 8
# --steps 3`): at 100 Gb/s a DP all-reduce and the EP all-to-all behind it take turns to overlap,
# and the plain rounds repeat a 783 us start move with period 2 from round 4 (793.7 us before the
# two-term calibration; the 8-round cap was hit and the last round printed).

PP_EP = dict(hosts=8, gpus_per_host=2, pp=2, ep=8, steps=3)
PP_EP_TOPOLOGIES = ["rail-optimized:hosts=8,gpus=2", "rail-optimized:hosts=8,gpus=2,nic_gbps=100"]


@pytest.fixture(scope="module")
def pp_ep_tables():
    from tracekit.synth import make_run_tables

    return make_run_tables(**PP_EP)[0]


@pytest.fixture
def per_flow_sharing(monkeypatch):
    """NICs shared per flow (the sharing before connection sets, docs/replay.md 4.1), under which
    this run's rounds cycle; shared per connection set they converge (test below)."""
    monkeypatch.setattr(engine, "connection_weights", lambda topology, indptr, ids, key: np.ones(indptr.size - 1))


def test_pp_ep_run_settles_or_says_what_kept_moving(pp_ep_tables):
    """Shared per connection set, the baseline's rounds fall into a small 2-cycle that damping
    settles; the 100 Gb/s what-if approaches its fixed point slowly, with no cycle (81 ms, 36 ms,
    ... 213 us after 9 rounds, still above the 5 us tolerance at the cap): the damped rounds take
    it from there, and both settle."""
    res = replay(pp_ep_tables, PP_EP_TOPOLOGIES)
    base, slow = (r.convergence for r in res.results)
    assert base.cycle == 2 and base.converged
    assert slow.cycle == 0 and slow.moves_ns[engine.MAX_ITER - 1] > 10 * slow.tolerance_ns
    assert slow.converged and slow.rounds > engine.MAX_ITER and not _not_converged(res)


def test_pp_ep_limit_cycle_is_damped_to_its_fixed_point(pp_ep_tables, per_flow_sharing):
    res = replay(pp_ep_tables, PP_EP_TOPOLOGIES)
    base, slow = (r.convergence for r in res.results)
    assert base.converged and base.cycle == 0
    assert slow.cycle == 2 and slow.cycle_from >= 3  # round 4 here
    repeated = slow.moves_ns[slow.cycle_from - 1]
    assert slow.moves_ns[slow.cycle_from] == pytest.approx(repeated, rel=1e-2) and repeated > 100 * slow.tolerance_ns
    assert slow.converged and slow.residual_ns <= slow.tolerance_ns < 10_000
    assert slow.rounds <= engine.MAX_ITER + engine.DAMPED_ROUNDS
    assert slow.n_oscillating == 0 and not _not_converged(res)


def test_an_undamped_cycle_says_which_instances_oscillate(pp_ep_tables, monkeypatch, per_flow_sharing):
    from tracekit.present import replay_comparison

    monkeypatch.setattr(engine, "DAMPED_ROUNDS", 0)
    res = replay(pp_ep_tables, PP_EP_TOPOLOGIES)
    cv = res.results[1].convergence
    assert not cv.converged and cv.cycle == 2 and cv.residual_ns > 100 * cv.tolerance_ns
    assert cv.n_oscillating > len(cv.oscillating) == engine.OSCILLATING_LISTED
    cause = cv.oscillating[0]  # the call whose network time flips, not the ones that wait for it
    assert (cause.op, cause.dim) == ("all_reduce", "DP")
    assert cause.duration_swing_ns > 100_000 and cause.start_swing_ns < 0.01 * cause.duration_swing_ns
    assert any(o.op == "all_to_all" and o.start_swing_ns == pytest.approx(cause.duration_swing_ns, rel=1e-2)
               for o in cv.oscillating)
    (f,) = _not_converged(res)
    assert "cycled with period 2" in f.text and "kept moving: all_reduce" in f.text and f.data["cycle"] == 2
    text = "\n".join(replay_comparison(res))
    moves = ", ".join(f"{m / 1e3:.1f}" for m in cv.moves_ns)
    assert f"residual per round on {PP_EP_TOPOLOGIES[1]} (µs): {moves}\n" in text
    assert (f"  kept moving: all_reduce {cause.group}#{cause.seq} (DP): start over "
            f"{cause.start_swing_ns / 1e3:.1f} µs, network time over {cause.duration_swing_ns / 1e3:.1f} µs") in text
