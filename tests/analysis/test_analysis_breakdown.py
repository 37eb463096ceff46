import polars as pl
from analysis_helpers import coll_table, events_table
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.analysis import breakdown, steps
from tracekit.analysis._frames import frame


def _frames(events, coll):
    return frame(events_table(events), "events"), frame(coll_table(coll), "collectives")


def _run(events, coll, compute="auto"):
    ev, c = _frames(events, coll)
    w = steps.step_windows(ev, c)
    wide, long = breakdown.per_rank_step(ev, c, w, compute=compute)
    return w, wide, long


def test_gpu_compute_comm_overlap_exposed_idle():
    events = [
        {"rank": 0, "kind": "annotation", "name": "ProfilerStep#3", "ts_ns": 0, "dur_ns": 100},
        {"rank": 0, "kind": "compute", "name": "gemm", "ts_ns": 0, "dur_ns": 30},
        {"rank": 0, "kind": "compute", "name": "gemm", "ts_ns": 20, "dur_ns": 20},
        {"rank": 0, "kind": "comm", "name": "nccl", "ts_ns": 30, "dur_ns": 30, "coll_id": 0},
        {"rank": 0, "kind": "comm", "name": "nccl", "ts_ns": 70, "dur_ns": 10, "coll_id": 1},
        {"rank": 0, "kind": "memcpy", "name": "copy", "ts_ns": 90, "dur_ns": 5},
    ]
    coll = [{"rank": 0, "group": "g", "seq": 0, "op": "all_reduce", "dim": "DP", "ts_ns": 30, "dur_ns": 30},
            {"rank": 0, "group": "e", "seq": 0, "op": "all_to_all", "dim": "EP", "ts_ns": 70, "dur_ns": 10}]
    w, wide, long = _run(events, coll)
    assert w.select("step", "start_ns", "end_ns", "source").row(0) == (3, 0, 100, "annotation")
    row = wide.row(0, named=True)
    assert row["compute_ns"] == 40 and row["comm_ns"] == 40
    assert row["overlap_ns"] == 10 and row["exposed_ns"] == 30
    assert row["busy_ns"] == 75 and row["idle_ns"] == 25
    dp = long.filter(pl.col("dim") == "DP").row(0, named=True)
    assert (dp["comm_ns"], dp["overlap_ns"], dp["exposed_ns"]) == (30, 10, 20)
    ep = long.filter(pl.col("dim") == "EP").row(0, named=True)
    assert (ep["comm_ns"], ep["overlap_ns"], ep["exposed_ns"]) == (10, 0, 10)


def test_intervals_are_cut_at_step_boundaries():
    events = [
        {"rank": 0, "kind": "annotation", "name": "ProfilerStep#0", "ts_ns": 0, "dur_ns": 50},
        {"rank": 0, "kind": "annotation", "name": "ProfilerStep#1", "ts_ns": 50, "dur_ns": 50},
        {"rank": 0, "kind": "annotation", "name": "ProfilerStep#2", "ts_ns": 100, "dur_ns": 50},
        {"rank": 0, "kind": "compute", "name": "k", "ts_ns": 40, "dur_ns": 80},
    ]
    _, wide, _ = _run(events, [])
    assert wide.sort("step")["compute_ns"].to_list() == [10, 50, 20]


def test_cpu_only_compute_excludes_comm_ops_and_wrappers():
    events = [
        {"rank": 0, "kind": "annotation", "name": "ProfilerStep#1", "ts_ns": 0, "dur_ns": 100},
        {"rank": 0, "kind": "cpu_op", "name": "aten::mm", "ts_ns": 0, "dur_ns": 20},
        {"rank": 0, "kind": "cpu_op", "name": "AllToAllBackward", "ts_ns": 25, "dur_ns": 40},
        {"rank": 0, "kind": "cpu_op", "name": "c10d::alltoall_base_", "ts_ns": 26, "dur_ns": 2},
        {"rank": 0, "kind": "cpu_op", "name": "aten::empty", "ts_ns": 28, "dur_ns": 2},
        {"rank": 0, "kind": "cpu_op", "name": "aten::add", "ts_ns": 70, "dur_ns": 10},
    ]
    coll = [{"rank": 0, "group": "e", "seq": 0, "op": "all_to_all", "dim": "EP", "ts_ns": 30, "dur_ns": 30}]
    _, wide, _ = _run(events, coll)
    row = wide.row(0, named=True)
    assert row["compute_ns"] == 32  # mm + empty + add; the autograd wrapper and c10d op are not compute
    assert row["comm_ns"] == 30 and row["exposed_ns"] == 30
    _, wide_all, _ = _run(events, coll, compute=["cpu_op"])
    assert wide_all.row(0, named=True)["compute_ns"] == 20 + 40 + 10


def test_step_sources_events_step_cadence_and_whole():
    ev = [{"rank": 0, "kind": "compute", "name": "k", "ts_ns": 10 * s, "dur_ns": 5, "step": s} for s in range(3)]
    w, _, _ = _run(ev, [])
    assert w["source"].unique().to_list() == ["events.step"] and w.height == 3
    coll = [{"rank": r, "group": "dp", "seq": s, "op": "all_reduce", "dim": "DP", "in_bytes": 1 << 20,
             "ts_ns": 100 * s + 80, "dur_ns": 10} for r in range(2) for s in range(4)]
    coll += [{"rank": r, "group": "dp", "seq": 10 + s, "op": "all_reduce", "dim": "DP", "in_bytes": 64,
              "ts_ns": 100 * s + 30 + 5 * k, "dur_ns": 2} for r in range(2) for s in range(4) for k in range(3)]
    w, _, _ = _run([], coll)
    assert w.filter(pl.col("rank") == 0).select("step", "start_ns", "end_ns").rows() == [
        (0, 30, 90), (1, 90, 190), (2, 190, 290), (3, 290, 390)]
    assert set(w["source"].to_list()) == {"cadence"}
    w, _, _ = _run([{"rank": 0, "kind": "compute", "name": "k", "ts_ns": 5, "dur_ns": 5}], [])
    assert w.select("step", "start_ns", "end_ns", "source").rows() == [(0, 5, 10, "whole")]


def test_assign_step_fills_only_nulls():
    w = pl.DataFrame({"rank": [0, 0], "step": [4, 5], "start_ns": [0, 100], "end_ns": [100, 200],
                      "source": ["annotation"] * 2}, schema=steps.WINDOW_SCHEMA)
    df = pl.DataFrame({"rank": [0, 0, 0, 0], "ts_ns": [10, 150, 250, 20], "step": [None, None, None, 9]},
                      schema={"rank": pl.Int32, "ts_ns": pl.Int64, "step": pl.Int32})
    assert steps.assign_step(df, w)["step"].to_list() == [4, 5, None, 9]


kinds = st.sampled_from(["compute", "comm", "memcpy"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), kinds, st.integers(0, 200), st.integers(1, 60),
                          st.sampled_from(["DP", "EP", None])), min_size=1, max_size=30))
def test_breakdown_invariants(rows):
    events = [{"rank": r, "kind": "annotation", "name": f"ProfilerStep#{s}", "ts_ns": 100 * s, "dur_ns": 100}
              for r in (0, 1) for s in range(3)]
    coll = []
    for i, (rank, kind, ts, dur, dim) in enumerate(rows):
        events.append({"rank": rank, "kind": kind, "name": "k", "ts_ns": ts, "dur_ns": dur,
                       "coll_id": i if kind == "comm" else None})
        if kind == "comm":
            coll.append({"coll_id": i, "rank": rank, "group": "g", "seq": i, "op": "all_reduce", "dim": dim})
    _, wide, long = _run(events, coll)
    for row in wide.iter_rows(named=True):
        assert 0 <= row["overlap_ns"] <= min(row["comm_ns"], row["compute_ns"])
        assert row["exposed_ns"] + row["overlap_ns"] == row["comm_ns"]
        assert row["busy_ns"] <= row["span_ns"] and row["idle_ns"] == row["span_ns"] - row["busy_ns"]
        assert max(row["compute_ns"], row["comm_ns"]) <= row["busy_ns"]
    for row in long.iter_rows(named=True):
        assert row["exposed_ns"] + row["overlap_ns"] == row["comm_ns"]
        total = wide.filter((pl.col("rank") == row["rank"]) & (pl.col("step") == row["step"])).row(0, named=True)
        assert row["comm_ns"] <= total["comm_ns"] and row["overlap_ns"] <= total["compute_ns"]
