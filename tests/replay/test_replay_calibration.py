"""Calibration and its error: uncalibrated physics against a closed form derived by hand, in-sample
against cross-validated on held-out steps and instances, unseen buckets, cautions."""

import numpy as np
import pytest
from hand_traces import BASE, PHYSICS_NS, SLOW8, Trace

from tracekit.finding import Finding
from tracekit.replay.calibration import (
    FITTED,
    INTERPOLATED,
    LEAVE_ONE_INSTANCE_OUT,
    LEAVE_ONE_STEP_OUT,
    UNCALIBRATED,
    calibrate,
    replay_errors,
)
from tracekit.replay.engine import replay

S7, S20 = "gpu0/stream7", "gpu0/stream20"


def _allreduces(durations, *, steps=None):
    """One 50 MB all-reduce over 2 ranks on 2 hosts per entry, 10 ms apart (no contention)."""
    tr = Trace()
    for k, d in enumerate(durations):
        step = k if steps is None else steps[k]
        for r in (0, 1):
            tr.kernel(r, S20, "comm", 10_000_000 * k, d, step=step,
                      coll=tr.collective(k, "all_reduce", "dp", k, r, step=step))
    return tr.tables()


def test_uncalibrated_error_is_the_raw_physics_against_a_closed_form():
    """S / B = 50e6 B / (400 Gb/s = 50 B/ns) = 1 ms; traced 1.25 ms: error exactly 0.2. A simulator
    wrong by any constant factor fails this."""
    res = replay(_allreduces([1_250_000]), [BASE])
    err = res.results[0].replay_error
    assert err.uncalibrated.median == pytest.approx(0.2, rel=1e-6)
    assert res.efficiency == {"all_reduce:2^24": pytest.approx(1.25, rel=1e-6)}
    assert err.in_sample.median == pytest.approx(0.0, abs=1e-9)
    assert res.results[0].instances[0].replayed_ns == 1_250_000


def test_what_if_duration_follows_the_closed_form():
    """At nic_gbps=50 the physics is 8 ms; calibrated by 1.25: 10 ms."""
    res = replay(_allreduces([1_250_000]), [BASE, SLOW8])
    assert res.results[1].instances[0].replayed_ns == pytest.approx(10_000_000, rel=1e-6)


def test_cross_validated_error_scores_held_out_steps_only():
    """Step 0 runs at the physics (ratio 1), step 1 at half speed (ratio 2). In sample both get the
    median 1.5 (errors 0.5 and 0.25); left out, step 0 is predicted from step 1 (error 1.0) and step
    1 from step 0 (error 0.5)."""
    res = replay(_allreduces([PHYSICS_NS, 2 * PHYSICS_NS]), [BASE])
    err = res.results[0].replay_error
    assert err.split == LEAVE_ONE_STEP_OUT
    assert err.uncalibrated.median == pytest.approx(0.25, rel=1e-6)
    assert err.in_sample.median == pytest.approx(0.375, rel=1e-6)
    assert err.cross_validated.median == pytest.approx(0.75, rel=1e-6)
    assert err.cross_validated.p90 == pytest.approx(0.95, rel=1e-6)
    assert err.by_op["all_reduce"]["cross_validated"].median == pytest.approx(0.75, rel=1e-6)
    assert res.results[0].replay_error.median == err.cross_validated.median


def test_one_step_leaves_one_instance_out():
    """Ratios 1, 2, 4 in one bucket of one step: each is predicted by the median of the other two
    (3, 2.5, 1.5): errors 2, 0.25, 0.625; in sample all get 2."""
    res = replay(_allreduces([PHYSICS_NS, 2 * PHYSICS_NS, 4 * PHYSICS_NS], steps=[0, 0, 0]), [BASE])
    err = res.results[0].replay_error
    assert err.split == LEAVE_ONE_INSTANCE_OUT
    assert err.cross_validated.median == pytest.approx(0.625, rel=1e-6)
    assert err.in_sample.median == pytest.approx(0.5, rel=1e-6)  # efficiency 2: errors 1, 0, 0.5


def test_what_ifs_carry_the_baselines_error_and_say_so():
    res = replay(_allreduces([PHYSICS_NS, 2 * PHYSICS_NS]), [BASE, SLOW8])
    base, slow = (r.to_dict()["replay_error"] for r in res.results)
    assert list(base)[:4] == ["uncalibrated", "in_sample", "cross_validated", "by_op"]
    assert base["basis"] == "measured" and slow["basis"] == "baseline"
    assert "baseline's cross-validated error plus the model's limits" in slow["note"]
    assert slow["cross_validated"] == base["cross_validated"]


def test_caution_when_cross_validated_p90_is_high():
    res = replay(_allreduces([PHYSICS_NS, 2 * PHYSICS_NS]), [BASE])
    cautions = [f for f in res.findings if f.data.get("reason") == "cross_validated_p90"]
    assert len(cautions) == 1 and isinstance(cautions[0], Finding) and cautions[0].kind == "replay_caution"
    assert res.to_json()["findings"][0]["kind"] == "replay_caution"
    quiet = replay(_allreduces([PHYSICS_NS, PHYSICS_NS]), [BASE])
    assert not [f for f in quiet.findings if f.severity == "warning"]


def test_unseen_bucket_is_interpolated_from_neighbouring_sizes_and_flagged():
    ops = ["all_reduce"] * 3 + ["all_to_all"]
    nbytes = np.array([2.0**20, 2.0**22, 2.0**24, 2.0**20])
    modelled = np.ones(4)
    traced = np.array([1.0, 7.0, 2.0, 3.0])
    cal = calibrate(ops, nbytes, traced, modelled, folds=np.arange(4))
    # the 2^22 bucket, held out, sits halfway between 2^20 (1.0) and 2^24 (2.0)
    assert cal.cross_validated[1] == pytest.approx(1.5)
    assert cal.cross_validated_source[1] == INTERPOLATED
    # 2^20 held out: only 2^22 (7.0) and 2^24 (2.0) remain, both above: the nearest
    assert cal.cross_validated[0] == pytest.approx(7.0) and cal.cross_validated_source[0] == INTERPOLATED
    # an op with nothing fitted gets no calibration at all
    assert cal.cross_validated[3] == 1.0 and cal.cross_validated_source[3] == UNCALIBRATED
    assert cal.in_sample_source == [FITTED] * 4
    err = replay_errors(ops, nbytes, traced, modelled, cal)
    assert err.unseen == {"all_reduce:2^20": INTERPOLATED, "all_reduce:2^22": INTERPOLATED,
                          "all_reduce:2^24": INTERPOLATED, "all_to_all:2^20": UNCALIBRATED}


def test_leave_one_instance_out_medians():
    ops = ["send"] * 4
    nbytes = np.full(4, 1024.0)
    traced = np.array([1.0, 2.0, 3.0, 10.0])
    cal = calibrate(ops, nbytes, traced, np.ones(4), folds=None)
    assert cal.cross_validated.tolist() == [3.0, 3.0, 2.0, 2.0]
    assert cal.efficiency == {"send:2^10": 2.5}
