"""Calibration and its error: uncalibrated physics against a closed form derived by hand, in-sample
against cross-validated on held-out steps and instances, unseen buckets, cautions."""

from pathlib import Path

import numpy as np
import pytest
from hand_traces import BASE, MODELLED_NS, NCCL_LATENCY_NS, PHYSICS_NS, SLOW8, Trace

from tracekit.finding import Finding
from tracekit.replay.calibration import (
    FITTED,
    INTERPOLATED,
    LEAVE_ONE_INSTANCE_OUT,
    LEAVE_ONE_STEP_OUT,
    UNCALIBRATED,
    calibrate,
    fit_two_terms,
    replay_errors,
    unseen_buckets,
)
from tracekit.replay.engine import replay
from tracekit.results import from_builtins, to_builtins

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
    """S / B = 50e6 B / (400 Gb/s = 50 B/ns) = 1 ms plus NCCL's 36.4 us; traced 1.25 ms: error
    (1.25 - 1.0364) / 1.25. A simulator wrong by any constant factor, or without NCCL's latency,
    fails this."""
    res = replay(_allreduces([1_250_000]), [BASE])
    err = res.results[0].replay_error
    assert err.uncalibrated.median == pytest.approx((1_250_000 - MODELLED_NS) / 1_250_000, rel=1e-6)
    assert res.efficiency == {"all_reduce:2^24": pytest.approx(1_250_000 / MODELLED_NS, rel=1e-6)}
    assert err.in_sample.median == pytest.approx(0.0, abs=1e-9)
    assert res.results[0].instances[0].replayed_ns == 1_250_000


def test_what_if_duration_follows_the_closed_form():
    """At nic_gbps=50 the physics is 8 ms plus the same latency; one size, so one factor
    (1.25 ms / 1.0364 ms) scales both."""
    res = replay(_allreduces([1_250_000]), [BASE, SLOW8])
    expected = (8 * PHYSICS_NS + NCCL_LATENCY_NS) * 1_250_000 / MODELLED_NS
    assert res.results[1].instances[0].replayed_ns == pytest.approx(expected, rel=1e-6)


def test_cross_validated_error_scores_held_out_steps_only():
    """Step 0 runs at the physics (ratio 1), step 1 at half speed (ratio 2). In sample both get the
    median 1.5 (errors 0.5 and 0.25); left out, step 0 is predicted from step 1 (error 1.0) and step
    1 from step 0 (error 0.5)."""
    res = replay(_allreduces([PHYSICS_NS, 2 * PHYSICS_NS]), [BASE])
    err = res.results[0].replay_error
    assert err.split == LEAVE_ONE_STEP_OUT
    assert err.uncalibrated.median == pytest.approx(
        ((MODELLED_NS - PHYSICS_NS) / PHYSICS_NS + (2 * PHYSICS_NS - MODELLED_NS) / (2 * PHYSICS_NS)) / 2, rel=1e-6)
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
    base, slow = (to_builtins(r.replay_error) for r in res.results)
    assert list(base)[:4] == ["uncalibrated", "in_sample", "cross_validated", "by_op"]
    assert base["basis"] == "measured" and slow["basis"] == "baseline"
    assert "baseline's cross-validated error plus the model's limits" in slow["note"]
    assert slow["cross_validated"] == base["cross_validated"]


def test_caution_when_cross_validated_p90_is_high():
    res = replay(_allreduces([PHYSICS_NS, 2 * PHYSICS_NS]), [BASE])
    cautions = [f for f in res.findings if f.data.get("reason") == "cross_validated_p90"]
    assert len(cautions) == 1 and isinstance(cautions[0], Finding) and cautions[0].kind == "replay_caution"
    assert to_builtins(res.summary)["findings"][0]["kind"] == "replay_caution"
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
    assert unseen_buckets(ops, nbytes, traced, modelled, cal) == {
        "all_reduce:2^20": INTERPOLATED, "all_reduce:2^22": INTERPOLATED, "all_reduce:2^24": INTERPOLATED,
        "all_to_all:2^20": UNCALIBRATED}


def test_leave_one_instance_out_medians():
    ops = ["send"] * 4
    nbytes = np.full(4, 1024.0)
    traced = np.array([1.0, 2.0, 3.0, 10.0])
    cal = calibrate(ops, nbytes, traced, np.ones(4), folds=None)
    assert cal.cross_validated.tolist() == [3.0, 3.0, 2.0, 2.0]
    assert cal.efficiency == {"send:2^10": 2.5}


# ------------------------------------------------------------------------------------------
# Two terms: latency and transfer per (op, algorithm)

def _rows(a, b, sizes):
    """Instances whose traced time is exactly a x latency + b x transfer, latency 20 us and the
    transfer growing with size (a latency-bound end and a bandwidth-bound end)."""
    latency = np.full(len(sizes), 20_000.0)
    transfer = np.asarray(sizes, np.float64) / 50.0
    return latency, transfer, a * latency + b * transfer


SIZES = [2.0**e for e in range(8, 30, 2)]


def test_two_terms_recover_known_factors_within_one_percent():
    latency, transfer, traced = _rows(3.7, 1.6, SIZES)
    a, b = fit_two_terms(latency, transfer, traced)
    assert a == pytest.approx(3.7, rel=1e-2) and b == pytest.approx(1.6, rel=1e-2)
    traced[3] *= 5.0  # a stalled call: the least-absolute fit passes through the others
    a, b = fit_two_terms(latency, transfer, traced)
    assert a == pytest.approx(3.7, rel=1e-2) and b == pytest.approx(1.6, rel=1e-2)


def test_two_terms_are_never_negative():
    """Traced times that fall with size would need b < 0: b is 0 and a carries them."""
    latency = np.full(4, 10.0)
    transfer = np.array([1.0, 10.0, 100.0, 1000.0])
    a, b = fit_two_terms(latency, transfer, np.array([40.0, 35.0, 30.0, 25.0]))
    assert b == 0.0 and a > 0


def test_calibrate_fits_two_terms_per_op_and_algorithm():
    latency, transfer, traced = _rows(3.7, 1.6, SIZES)
    n = len(SIZES)
    ops, algos = ["all_reduce"] * n, ["ring"] * n
    cal = calibrate(ops, np.array(SIZES), traced, latency + transfer, np.arange(n), latency=latency, algos=algos)
    (name, terms), = cal.terms.items()
    assert name == "all_reduce:ring" and terms.n == n and terms.buckets == n
    assert (terms.latency, terms.transfer) == (pytest.approx(3.7, rel=1e-2), pytest.approx(1.6, rel=1e-2))
    assert cal.predict(latency, transfer) == pytest.approx(traced, rel=1e-2)
    # held out one step at a time, each is predicted by the others' fit, not by its bucket
    assert cal.predict(latency, transfer, cross_validated=True) == pytest.approx(traced, rel=1e-2)
    assert cal.cross_validated_source == [FITTED] * n
    err = replay_errors(ops, np.array(SIZES), traced, latency + transfer, cal, latency=latency)
    assert err.cross_validated.p90 < 1e-2 and err.uncalibrated.median > 0.3
    # a what-if that only doubles bandwidth halves the transfer term and leaves the latency term
    assert cal.predict(latency, transfer / 2) == pytest.approx(3.7 * latency + 0.8 * transfer, rel=1e-2)


def test_one_size_falls_back_to_one_factor():
    """One size bucket cannot tell latency from transfer: the bucket's efficiency scales both."""
    latency, transfer = np.full(3, 20_000.0), np.full(3, 80_000.0)
    traced = np.array([200_000.0, 220_000.0, 240_000.0])
    cal = calibrate(["all_reduce"] * 3, np.full(3, 4e6), traced, latency + transfer, None, latency=latency,
                    algos=["ring"] * 3)
    assert cal.terms == {}
    assert cal.predict(latency, transfer) == pytest.approx(np.full(3, 220_000.0))
    assert cal.predict(latency, transfer / 2) == pytest.approx(np.full(3, 2.2 * 60_000.0))


def test_terms_round_trip_through_the_replay_json():
    from tracekit.replay.calibration import TwoTerms
    from tracekit.replay.engine import ReplayResult, ReplaySummary

    res = replay(_allreduces([PHYSICS_NS, 2 * PHYSICS_NS]), [BASE])
    doc = to_builtins(res.summary)
    doc["calibration"]["terms"] = {"all_reduce:ring": {"latency": 2.0, "transfer": 1.5, "n": 3, "buckets": 2}}
    back = ReplayResult.of(from_builtins(doc, ReplaySummary))
    assert back.terms == {"all_reduce:ring": TwoTerms(2.0, 1.5, 3, 2)}


# ------------------------------------------------------------------------------------------
# Real data: PARAM's DLRM trace (8 x V100, one step), out of sample by leave-one-instance-out

DLRM = Path(__file__).parents[2].parent / "shared" / "real_traces" / "kineto" / "param_dlrm_kineto_8rank"
V100 = "single-switch:gpus=8,nvlink_gbs=150"
FAST_NVLINK = "single-switch:gpus=8,nvlink_gbs=450"


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    if not DLRM.is_dir():
        pytest.skip(f"{DLRM} is not here (the real traces live in ../shared)")
    from tracekit.analysis import prepare
    from tracekit.workflows import open as open_run

    tables = prepare(open_run([DLRM], cache=tmp_path_factory.mktemp("dlrm") / "run"), write=False)
    return replay(tables, [V100, FAST_NVLINK])


def test_dlrm_cross_validated_error_per_op(dlrm):
    """Before (one factor per op and size, no NCCL latency): all-reduce 30.4 % median / 45.4 % p90,
    all-to-all 4.9 % / 5.6 %, overall p90 36.0 %. After: 15.6 % / 25.0 %, 4.7 % / 5.3 %, 19.1 %."""
    err = dlrm.errors
    assert err.split == LEAVE_ONE_INSTANCE_OUT
    assert err.by_op["all_reduce"]["cross_validated"].median < 0.25
    assert err.by_op["all_to_all"]["cross_validated"].median < 0.06
    assert err.cross_validated.p90 < 0.30 and err.by_op["all_reduce"]["cross_validated"].p90 < 0.35
    assert err.by_op["all_reduce"]["uncalibrated"].median < 0.45  # 63.5 % without NCCL's latency
    assert "all_reduce:ring" in dlrm.terms  # all-to-all too, while its model has no latency of NCCL's


def test_dlrm_latency_bound_all_reduce_does_not_get_the_bandwidth_ratio(dlrm):
    """NVLink 150 -> 450 GB/s changes only bandwidth. The 448-byte all-reduce is latency: it moves
    by less than 10 %. The 908 kB one is half latency in the model: one factor moved it 2.25x,
    the two terms less than 2x; every all-reduce keeps at least its fitted latency term."""
    base, fast = dlrm.results
    terms = dlrm.terms["all_reduce:ring"]
    by_seq = {i.seq: (i, j) for i, j in zip(base.instances, fast.instances, strict=True) if i.op == "all_reduce"}
    small, _ = by_seq[6]
    assert small.traced_ns == 22_644
    ratio = {seq: i.replayed_ns / j.replayed_ns for seq, (i, j) in by_seq.items()}
    assert ratio[6] < 1.1
    assert 1.0 < ratio[7] < 2.0 and 1.0 < ratio[4] < 2.2
    assert terms.latency > 0 and terms.transfer > 0
    for _, fast_one in by_seq.values():  # NCCL's ring LL latency on 8 GPUs: 6.6 + 14 x 0.6 = 15 us
        assert fast_one.replayed_ns >= terms.latency * 15_000


def test_dlrm_text_prints_the_two_terms(dlrm):
    from tracekit.present import replay_comparison

    t = dlrm.terms["all_reduce:ring"]
    text = "\n".join(replay_comparison(dlrm))
    assert (f"calibration in two terms (traced = a x latency + b x transfer): all_reduce:ring a {t.latency:.2f}, "
            f"b {t.transfer:.2f}") in text


def test_applied_terms_take_precedence_over_the_buckets(tmp_path):
    """A calibration from another run: its two terms per group, where the group has them, else
    its bucket efficiencies; read back from a calibration file as `replay` writes it."""
    import json

    from tracekit.replay.calibration import TwoTerms, applied
    from tracekit.replay.engine import ReplayError
    from tracekit.results import to_builtins
    from tracekit.workflows import calibration

    terms = {"all_reduce:ring": TwoTerms(3.0, 1.5, 4, 3)}
    cal = applied(["all_reduce", "all_reduce", "all_to_all"], np.array([1e6, 1e6, 1e6]), np.ones(3),
                  {"all_reduce:2^20": 2.0, "all_to_all:2^20": 4.0}, terms=terms, algos=["ring", "tree", None])
    latency, transfer = np.array([10.0, 10.0, 10.0]), np.array([100.0, 100.0, 100.0])
    assert cal.predict(latency, transfer).tolist() == [180.0, 220.0, 440.0]
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"run": "healthy", "topology": BASE, "efficiency": {"all_reduce:2^20": 2.0},
                                "terms": to_builtins(terms)}))
    saved = calibration(path, [BASE]).saved
    assert saved.terms == terms and saved.efficiency == {"all_reduce:2^20": 2.0}
    path.write_text(json.dumps({"efficiency": {"all_reduce:2^20": 2.0}, "terms": {"all_reduce:ring": {"a": 1}}}))
    with pytest.raises(ReplayError, match=r"calibration\.json: two-term calibration values must be numbers"):
        calibration(path, [BASE])


def test_a_large_group_without_steps_is_cross_validated_in_ten_folds(monkeypatch):
    """Each held-out tenth (by position) is predicted by the two terms fitted on the other nine,
    and never by a fit that saw it; each size is alone in its bucket, so no one-factor fallback
    could predict them as well."""
    from tracekit.replay import calibration

    monkeypatch.setattr(calibration, "LOO_MAX", 5)
    latency, transfer, traced = _rows(3.7, 1.6, SIZES)
    traced *= np.random.default_rng(1).uniform(0.8, 1.2, traced.size)
    n = len(SIZES)
    cal = calibrate(["all_reduce"] * n, np.array(SIZES), traced, latency + transfer, None, latency=latency,
                    algos=["ring"] * n)
    assert cal.cross_validated_source == [FITTED] * n
    position = np.arange(n) % calibration.LARGE_GROUP_FOLDS
    for f in range(calibration.LARGE_GROUP_FOLDS):
        held = position == f
        a, b = fit_two_terms(latency[~held], transfer[~held], traced[~held])
        assert cal.predict(latency, transfer, cross_validated=True)[held] == pytest.approx(
            a * latency[held] + b * transfer[held], rel=1e-9)


def test_two_instances_are_too_few_for_two_terms():
    latency, transfer, traced = _rows(3.7, 1.6, SIZES[:2])
    cal = calibrate(["all_reduce"] * 2, np.array(SIZES[:2]), traced, latency + transfer, None, latency=latency,
                    algos=["ring"] * 2)
    assert cal.terms == {}
