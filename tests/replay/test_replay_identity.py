"""Identity: the schedule replayed with every traced duration reproduces every traced event time,
on hand-built contradictions of the model and on every real multi-rank trace at hand."""

from pathlib import Path

import pytest
from hand_traces import BASE, T0, Trace

from tracekit.replay.engine import ReplayError, identity, replay
from tracekit.results import to_builtins

ROOT = Path(__file__).parents[2]
REAL = ROOT.parent / "shared" / "real_traces"
S20 = "gpu0/stream20"


def _buffered_send():
    """Rank 0's send completes (eager, buffered) before rank 1 posts the recv; then both compute."""
    tr = Trace()
    tr.kernel(0, S20, "comm", 10_000, 10_000, coll=tr.collective(0, "send", "dp", 0, 0, nbytes=1_000_000, peer=1))
    tr.kernel(1, S20, "comm", 50_000, 30_000, coll=tr.collective(0, "recv", "dp", 0, 1, nbytes=1_000_000, peer=0))
    for r in (0, 1):
        tr.kernel(r, S20, "compute", 100_000, 20_000)
    return tr.tables()


def test_send_that_completed_before_its_recv_was_posted_falls_back():
    ident = identity(_buffered_send())
    assert ident.max_step_error == 0 and ident.max_event_error_ns == 0
    assert ident.instances_fallen_back == 1
    fb = ident.fallbacks[0]
    assert (fb.reason, fb.ranks, fb.op) == ("ended_before_peer_arrived", (0,), "send")
    assert "completed before its recv was posted" in fb.text


def test_members_ending_far_apart_fall_back_and_keep_their_relation():
    tr = Trace()
    tr.kernel(0, S20, "comm", 0, 600_000, coll=tr.collective(0, "all_reduce", "dp", 0, 0))
    tr.kernel(1, S20, "comm", 100_000, 1_000_000, coll=tr.collective(0, "all_reduce", "dp", 0, 1))
    res = replay(tr.tables(), [BASE])
    assert res.identity.max_event_error_ns == 0
    assert [f.reason for f in res.identity.fallbacks] == ["members_end_apart"]
    assert to_builtins(res.summary)["identity"]["instances_fallen_back"] == 1
    assert res.results[0].instances[0].fallback == "members_end_apart"


def test_identity_json_shape():
    doc = to_builtins(replay(_buffered_send(), [BASE]).summary)
    assert list(doc["identity"])[:2] == ["max_step_error", "instances_fallen_back"]
    assert doc["identity"]["max_step_error"] == 0.0


def _prepared(path: Path, tmp: Path) -> dict:
    from tracekit.analysis import prepare
    from tracekit.workflows import open as open_run

    return prepare(open_run([path], cache=tmp), write=False)


REAL_MULTI_RANK = [
    REAL / "kineto" / "param_dlrm_kineto_8rank",
    REAL / "kineto" / "hta_trace_filter_sampled_2rank",
]
SAMPLES = [ROOT / "sample_traces" / "gloo_moe_8rank", ROOT / "sample_traces" / "synth_moe_16rank"]


@pytest.mark.parametrize("path", SAMPLES + REAL_MULTI_RANK, ids=lambda p: p.name)
def test_identity_on_real_and_sample_traces(path, tmp_path):
    if not path.exists():
        pytest.skip(f"{path} is not here")
    ident = identity(_prepared(path, tmp_path / "run"))
    assert ident.max_step_error < 1e-12
    assert ident.max_event_error_ns < 1e-3


def test_every_real_multi_rank_kineto_folder_is_covered():
    """Any Kineto folder under real_traces with several trace files must be in REAL_MULTI_RANK."""
    kineto = REAL / "kineto"
    if not kineto.exists():
        pytest.skip("no real traces here")
    multi = {d for d in kineto.iterdir() if d.is_dir() and len([f for f in d.iterdir() if ".json" in f.name]) > 1
             and not d.name.startswith("hta_edge")}
    assert multi == set(REAL_MULTI_RANK)


def test_flight_recorder_gloo_dumps_carry_no_durations(tmp_path):
    """gloo FR entries have creation times but no durations: nothing to replay, said plainly."""
    path = REAL / "flight_recorder" / "gloo_torch2.13_cpu" / "healthy" / "json"
    if not path.exists():
        pytest.skip("no real traces here")
    with pytest.raises(ReplayError, match="no timed events"):
        identity(_prepared(path, tmp_path / "run"))


def test_buffered_send_keeps_its_own_time_on_a_slower_network():
    """The recv (1 MB over 4 p2p channels at NCCL's 14 GB/s each, 56 above the 400G NIC's 50, so
    20 us of transfer at the NIC, plus NCCL's p2p latency 22.4 us; traced 30 us, so one calibration
    factor 30 / 42.4 = 0.708 on both terms) takes (22.4 + 1 MB / 6.25 GB/s) x 0.708 = 129.1 us at
    nic_gbps=50 (the NIC binds there too) and delays rank 1's compute by 99.1 us; the sender, which
    never waited for it, and rank 0's compute keep their traced times."""
    from hand_traces import SLOW8

    res = replay(_buffered_send(), [BASE, SLOW8])
    t = res.results[1].timeline.to_pydict()
    rows = sorted((r, ts - T0, d) for r, ts, d in zip(t["rank"], t["ts_ns"], t["dur_ns"], strict=True))
    assert rows == [(0, 10_000, 10_000), (0, 100_000, 20_000), (1, 50_000, 129_057), (1, 199_057, 20_000)]
