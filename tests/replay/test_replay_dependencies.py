"""Dependencies read from the trace: blocked launches, cuda_sync waits, the gap rule as a last resort.

Each trace is built by hand (tests/replay/hand_traces.py); the all-reduce's modelled time is the
closed form S / B_nic = 50 MB / 50 B/ns = 1 ms on the baseline and 8 ms at nic_gbps=50, plus
NCCL's 36.4 us of latency on both (no link latency), so the expected replayed times below are
derived by hand (`at_slow8`: 1 ms traced replays in 7.754 ms).
"""

import pytest
from hand_traces import BASE, SLOW8, T0, Trace, at_slow8

from tracekit.replay.engine import replay
from tracekit.results import to_builtins

S7, S20 = "gpu0/stream7", "gpu0/stream20"


def _times(result, rank):
    t = result.timeline.to_pydict()
    rows = [(lane, ts - T0, dur) for r, lane, ts, dur in zip(t["rank"], t["lane"], t["ts_ns"], t["dur_ns"], strict=True)
            if r == rank]
    return sorted(rows, key=lambda x: (x[1], x[0]))


def _exposed_allreduce(opt_gap=12_000, optimizer_launch=30_000):
    """Per rank: B1 and B2 on the compute stream; the all-reduce on the comm stream ends after B2
    (exposed); the optimizer O was launched long before and starts 12 µs after the all-reduce
    ends (so the 5 µs gap rule would miss it); O2 follows O."""
    tr = Trace()
    for r in (0, 1):
        tr.kernel(r, S7, "compute", 2_000, 400_000, launch=0)
        tr.kernel(r, S20, "comm", 12_000, 1_000_000, launch=10_000, coll=tr.collective(0, "all_reduce", "dp", 0, r))
        tr.kernel(r, S7, "compute", 402_500, 497_500, launch=20_000)
        tr.kernel(r, S7, "compute", 1_012_000 + opt_gap, 100_000, launch=optimizer_launch)
        tr.kernel(r, S7, "compute", 1_125_000 + opt_gap, 50_000, launch=40_000 + optimizer_launch)
    return tr.tables()


def test_blocked_launch_waits_for_the_allreduce_and_everything_after_moves_by_the_excess():
    res = replay(_exposed_allreduce(), [BASE, SLOW8])
    assert res.dependencies["launch"] == 2 and res.dependencies["gap"] == 0 and res.dependencies["sync"] == 0
    base, slow = res.results
    slow_ns = at_slow8(1_000_000)
    assert base.instances[0].replayed_ns == 1_000_000 and slow.instances[0].replayed_ns == slow_ns
    excess = slow_ns - 1_000_000  # the all-reduce ends at 12 µs + 7.754 ms instead of 12 µs + 1 ms
    for r in (0, 1):
        traced = _times(base, r)
        assert traced == [(S7, 2_000, 400_000), (S20, 12_000, 1_000_000), (S7, 402_500, 497_500),
                          (S7, 1_024_000, 100_000), (S7, 1_137_000, 50_000)]
        expected = [(S7, 2_000, 400_000), (S20, 12_000, slow_ns), (S7, 402_500, 497_500),
                    (S7, 1_024_000 + excess, 100_000), (S7, 1_137_000 + excess, 50_000)]
        assert _times(slow, r) == sorted(expected, key=lambda x: (x[1], x[0]))
    assert slow.step_ns["0"] - base.step_ns["0"] == excess


def test_a_kernel_launched_just_in_time_was_not_blocked():
    """Launched 2 µs before it started: the CPU, not the all-reduce, held it back; no edge (and
    the gap rule does not apply to events whose launch is known)."""
    res = replay(_exposed_allreduce(opt_gap=2_000, optimizer_launch=1_011_000), [BASE, SLOW8])
    assert res.dependencies["launch"] == 0 and res.dependencies["gap"] == 0
    # O and O2 keep their times; the step now ends with the all-reduce (7.766 ms) instead of O2 (1.177 ms)
    assert res.results[1].step_ns["0"] - res.results[0].step_ns["0"] == 12_000 + at_slow8(1_000_000) - 1_177_000


def _hidden_allreduce(with_sync=True):
    """The all-reduce (800 µs) ends before B2 (hidden under compute); the optimizer waits for it
    through cudaEventRecord (corr 4) + cudaStreamWaitEvent (corr 5): a cuda_sync Stream Wait Event
    on the compute stream. O itself started 2 µs after B2, its stream predecessor."""
    tr = Trace()
    for r in (0, 1):
        tr._corr = 0
        tr.kernel(r, S7, "compute", 2_000, 400_000, launch=0)
        tr.kernel(r, S20, "comm", 12_000, 800_000, launch=10_000, coll=tr.collective(0, "all_reduce", "dp", 0, r))
        tr.kernel(r, S7, "compute", 402_500, 497_500, launch=20_000)
        tr._corr = 5
        if with_sync:
            tr.event(r, S7, "sync", 25_000, 1_000, corr=5, sync_lane=S20, sync_corr=4, name="Stream Wait Event")
        tr.kernel(r, S7, "compute", 902_000, 100_000, launch=30_000)
        tr.kernel(r, S7, "compute", 1_003_000, 50_000, launch=40_000)
    return tr.tables()


def test_stream_wait_event_ties_the_optimizer_to_a_hidden_allreduce():
    res = replay(_hidden_allreduce(), [BASE, SLOW8])
    assert res.dependencies["sync"] == 2 and res.dependencies["launch"] == 0
    base, slow = res.results
    slow_ns = at_slow8(800_000)
    assert base.instances[0].replayed_ns == 800_000 and slow.instances[0].replayed_ns == slow_ns
    excess = 12_000 + slow_ns - 900_000  # past its overlap: the all-reduce now ends after B2
    for r in (0, 1):
        expected = [(S7, 2_000, 400_000), (S20, 12_000, slow_ns), (S7, 402_500, 497_500),
                    (S7, 902_000 + excess, 100_000), (S7, 1_003_000 + excess, 50_000)]
        assert _times(slow, r) == sorted(expected, key=lambda x: (x[1], x[0]))
    assert slow.step_ns["0"] - base.step_ns["0"] == excess


def test_without_the_sync_event_the_hidden_dependency_is_invisible():
    res = replay(_hidden_allreduce(with_sync=False), [BASE, SLOW8])
    assert res.dependencies["sync"] == 0 and res.dependencies["launch"] == 0
    _base, slow = res.results
    assert _times(slow, 0)[-1] == (S7, 1_003_000, 50_000)
    assert slow.step_ns["0"] == 12_000 + at_slow8(800_000) - 2_000


def test_gap_rule_is_the_last_resort_without_launch_times():
    """No runtime events: a compute start within 5 µs of the comm end is tied to it (gap rule)."""
    tr = Trace()
    for r in (0, 1):
        tr.kernel(r, S7, "compute", 0, 100_000)
        tr.kernel(r, S20, "comm", 100_000, 1_000_000, coll=tr.collective(0, "all_reduce", "dp", 0, r))
        tr.kernel(r, S7, "compute", 1_103_000, 100_000)
    res = replay(tr.tables(), [BASE, SLOW8])
    assert res.dependencies == {"stream": 2, "sync": 0, "launch": 0, "gap": 4, "sync_unresolved": 0}
    assert res.results[1].step_ns["0"] - res.results[0].step_ns["0"] == at_slow8(1_000_000) - 1_000_000
    assert to_builtins(res.summary)["dependencies"] == res.dependencies


def test_sync_pointing_at_an_unknown_lane_is_counted_not_dropped():
    tr = Trace()
    for r in (0, 1):
        tr.kernel(r, S20, "comm", 100_000, 1_000_000, coll=tr.collective(0, "all_reduce", "dp", 0, r))
    tr.event(0, S7, "sync", 50_000, 0, sync_lane="gpu0/stream99", sync_corr=3)
    res = replay(tr.tables(), [BASE])
    assert res.dependencies["sync_unresolved"] == 1


@pytest.mark.parametrize("gap", [1_000, 4_000])
def test_identity_holds_with_every_rule(gap):
    res = replay(_exposed_allreduce(opt_gap=gap), [BASE])
    assert res.identity.max_step_error == 0 and res.identity.max_event_error_ns == 0
    res = replay(_hidden_allreduce(), [BASE])
    assert res.identity.max_event_error_ns == 0


def test_cuda_sync_edges_on_a_real_trace(tmp_path):
    """HTA's cuda_event_sync_multi_stream trace: every Stream Wait Event / Event Sync, resolved
    by an independent scan of the raw JSON (last GPU op launched on the recorded stream before the
    record; first launched after the sync on the waiting stream, or on every other stream when
    the CPU waited), is a `sync` edge, and nothing else is."""
    import gzip
    import json
    from pathlib import Path

    from tracekit.replay.engine import dependency_edges
    from tracekit.workflows import open as open_run

    path = Path(__file__).parents[3] / "shared" / "real_traces" / "kineto" / "hta_edge_cases"
    path = path / "event_sync_trace.json.gz"
    if not path.exists():
        pytest.skip("no real traces here")
    with gzip.open(path) as f:
        raw = json.loads(f.read())["traceEvents"]
    ops = [e for e in raw if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    by_stream = {}
    for e in ops:
        by_stream.setdefault(e["args"]["stream"], []).append(e)
    expected = set()
    for s in raw:
        a = s.get("args") or {}
        record = a.get("wait_on_cuda_event_record_corr_id", -1)
        if s.get("cat") != "cuda_sync" or a.get("wait_on_stream", -1) < 0 or record < 0:
            continue
        before = [e for e in by_stream.get(a["wait_on_stream"], []) if e["args"]["correlation"] < record]
        target = max(before, key=lambda e: e["args"]["correlation"])
        lanes = [a["stream"]] if a["stream"] >= 0 else [x for x in by_stream if x != a["wait_on_stream"]]
        for lane in lanes:
            after = [e for e in by_stream.get(lane, []) if e["args"]["correlation"] > a["correlation"]]
            if after:
                waiter = min(after, key=lambda e: e["args"]["correlation"])
                expected.add((target["ts"] * 1000, waiter["ts"] * 1000))
    assert len(expected) == 3
    run = open_run([path], cache=tmp_path / "run")
    edges = dependency_edges({"events": run.table("events")}).to_pydict()
    got = {(s, d) for s, d, r in zip(edges["src_ts_ns"], edges["dst_ts_ns"], edges["rule"], strict=True) if r == "sync"}
    assert got == expected
