"""viz.data: shaping tables into column dicts (no Bokeh, no browser)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from viz_inputs import HOSTILE, MS, tiny_link_samples

from tracekit.viz import data as D


def naive_merge(lane, start, end, min_ns, max_bar_px=8):
    """Slow twin of merge_short: walk each lane in start order."""
    items = sorted(zip(lane, start, end, range(len(lane)), strict=False))
    keep, bars = [], []
    cluster: list = []
    base = min(start) if len(start) else 0

    def flush():
        if len(cluster) == 1:
            keep.append(cluster[0][3])
        elif cluster:
            bars.append((cluster[0][0], min(c[1] for c in cluster), max(c[2] for c in cluster), len(cluster)))
        cluster.clear()

    runmax = None
    prev = None
    for item in items:
        ln, s, e, _i = item
        short = e - s < min_ns
        joins = (prev is not None and short and prev[2] - prev[1] < min_ns and prev[0] == ln
                 and s - runmax < min_ns
                 and (s - base) // (max_bar_px * min_ns) == (prev[1] - base) // (max_bar_px * min_ns))
        if not joins:
            flush()
        cluster.append(item)
        runmax = e if prev is None or prev[0] != ln else max(runmax, e)
        prev = item
    flush()
    return sorted(keep), sorted(bars)


def test_merge_short_keeps_long_and_merges_runs_of_short() -> None:
    lane = np.array([0, 0, 0, 0, 0, 1])
    start = np.array([0, 10, 20, 30, 1000, 0])
    end = np.array([5, 15, 25, 500, 1003, 3])
    m = D.merge_short(lane, start, end, min_ns=8)
    assert sorted(m.keep.tolist()) == [3, 4, 5]  # the long one, an isolated short, another lane's lone short
    assert m.count.tolist() == [3]
    assert (m.start.tolist(), m.end.tolist(), m.busy_ns.tolist()) == ([0], [25], [15])
    assert m.merged == 3 and m.glyphs == 4


def test_merge_short_never_joins_lanes_or_long_gaps() -> None:
    m = D.merge_short(np.array([0, 1]), np.array([0, 1]), np.array([1, 2]), min_ns=10)
    assert m.count.size == 0 and sorted(m.keep.tolist()) == [0, 1]
    m = D.merge_short(np.array([0, 0]), np.array([0, 100]), np.array([1, 101]), min_ns=10)
    assert m.count.size == 0


def test_merge_short_empty_and_zero_threshold() -> None:
    m = D.merge_short(np.array([], dtype=np.int64), np.array([]), np.array([]), min_ns=5)
    assert m.glyphs == 0
    m = D.merge_short(np.array([0, 0]), np.array([0, 1]), np.array([1, 2]), min_ns=0)
    assert m.keep.tolist() == [0, 1] and m.merged == 0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 400), st.integers(0, 40)), max_size=40),
       st.integers(1, 30))
def test_merge_short_matches_naive_twin(rows, min_ns) -> None:
    lane = np.array([r[0] for r in rows], dtype=np.int64)
    start = np.array([r[1] for r in rows], dtype=np.int64)
    end = start + np.array([r[2] for r in rows], dtype=np.int64)
    m = D.merge_short(lane, start, end, min_ns=min_ns)
    keep, bars = naive_merge(lane.tolist(), start.tolist(), end.tolist(), min_ns)
    assert sorted(m.keep.tolist()) == keep
    got = sorted(zip(m.lane.tolist(), m.start.tolist(), m.end.tolist(), m.count.tolist(), strict=False))
    assert got == bars
    assert m.keep.size + m.merged == len(rows)


def test_timeline_aligns_clocks_and_marks_the_stall(tables) -> None:
    td = D.timeline_data(tables, width_px=1000)
    assert td.rows["order"] == [0, 1, 2, 3]
    dp = td.levels[-1]["comm:DP"]
    # aligned: ranks 0-2 enter at 2 ms, rank 3 at 3 ms; all end at 4 ms (t0 is the run start, 0 ms)
    starts = sorted(np.round(dp["x0"], 3).tolist())
    assert starts == [2.0, 2.0, 2.0, 3.0]
    waits = sorted(dp["wait_ns"].tolist())
    assert waits == [0.0, MS, MS, MS]
    stall = td.levels[-1]["stall"]
    assert len(stall["x0"]) == 3 and np.allclose(stall["x1"], 3.0)
    # busbw of an all-reduce: 2(n-1)/n * bytes / (dur - wait), bytes/ns == GB/s
    late = int(np.argmin(dp["wait_ns"]))
    assert dp["busbw"][late] == pytest.approx(1.5 * 64 * MS / MS, rel=1e-4)


def test_timeline_includes_collectives_without_kernels(tables) -> None:
    td = D.timeline_data(tables)
    pp = td.levels[-1]["comm:PP"]
    assert sorted(pp["op"]) == ["recv", "send"]
    assert np.allclose(pp["x0"], 4.5)


def test_timeline_merges_below_pixel_and_reports(tables) -> None:
    td = D.timeline_data(tables, width_px=200)
    assert td.merged_full_view >= 80  # 4 ranks x 20 tiny kernels
    comp = td.levels[0]["compute"]
    assert comp["count"].sum() == 4 * 21
    assert any("merged" in n for n in td.notes)
    assert td.levels[-1]["compute"]["count"].max() == 1  # the finest level shows every kernel
    assert td.merged_finest == 0
    # merged bars get the merged label, real kernels keep their (unescaped) names for Bokeh to escape
    assert td.names[0] == D.MERGED_NAME and HOSTILE in td.names


def test_timeline_glyph_cap_is_respected(tables) -> None:
    td = D.timeline_data(tables, width_px=100_000, max_glyphs=20)
    for k, level in enumerate(td.levels):
        assert D._max_per_window(level, td.span_ms / 8**k) <= 20
    assert td.merged_finest > 0 and "stay merged" in " ".join(td.notes)


def test_timeline_from_synth_groups_by_stage_and_host() -> None:
    from tracekit.synth import make_run_tables

    tables, _ = make_run_tables(hosts=2, gpus_per_host=4, pp=2, ep=2, steps=1)
    td = D.timeline_data(tables)
    labels = [b["label"] for b in td.rows["bands"]]
    assert labels == ["stage 0 · node000", "stage 1 · node001"]
    assert td.steps and td.steps[0]["step"] == 0
    assert set(td.layers) >= {"compute", "comm:DP", "comm:EP", "comm:PP"}


def test_level_for_picks_the_coarsest_fine_enough_level() -> None:
    px = [1.0, 0.125, 0.015625]
    assert D.level_for(px, 1000, 1000) == 0
    assert D.level_for(px, 100, 1000) == 1
    assert D.level_for(px, 1, 1000) == 2


def test_coverage_counts_fractions_of_bins() -> None:
    cov = D.coverage(np.array([0.0, 5.0]), np.array([10.0, 25.0]), 40.0, 4)
    assert cov.tolist() == pytest.approx([1.5, 1.0, 0.5, 0.0])


def test_overlap_data_mean_per_step(analysis) -> None:
    ov = D.overlap_data(analysis)
    assert ov["dims"] == ["DP", "EP"]
    assert ov["columns"]["DP_exposed"].tolist() == pytest.approx([2.0] * 4)
    assert ov["columns"]["EP_hidden"].tolist() == pytest.approx([0.25] * 4)
    assert D.overlap_data(None) is None


def test_ep_matrix_from_splits(tables) -> None:
    ep = D.ep_data(tables)
    assert ep["labels"] == ["r0", "r1", "r2", "r3"]
    assert ep["matrix_bytes"].sum() == pytest.approx(4 * 10_000)
    assert ep["recv_bytes"].tolist() == pytest.approx([4_000, 28_000, 4_000, 4_000])
    assert ep["hot"] == "r1" and ep["imbalance"] == pytest.approx(2.8)


def test_ep_blocks_large_matrices(tables) -> None:
    ep = D.ep_data(tables, max_ranks=2)
    assert ep["labels"] == ["r0-1", "r2-3"] and ep["matrix_bytes"].shape == (2, 2)


def test_link_data_grid_and_lines(tables) -> None:
    tables = {**tables, "link_samples": tiny_link_samples()}
    ld = D.link_data(tables, max_links=2, top_n=1)
    assert ld["links"][0] == "host-a/nic0->leaf0" and len(ld["links"]) == 2
    assert ld["origins"] == ["telemetry", "replay:rail-2x"]
    grid = ld["grids"]["telemetry"]["grid"]
    assert grid.shape == (2, 10) and grid[0].tolist() == pytest.approx([max(0.1 * w, 0.05) for w in range(10)])
    assert ld["notes"] and list(ld["lines"]["telemetry"]) == ["host-a/nic0->leaf0"]
    assert D.link_data({}) is None


def test_replay_data(replay) -> None:
    rd = D.replay_data(replay)
    assert rd["topologies"] == ["observed", "rail-2x"]
    assert rd["traced_step_ms"] == pytest.approx([8.0, 8.0])
    assert rd["replayed_step_ms"] == pytest.approx([8.0, 6.4])
    assert len(rd["instances"]["traced_ms"]) == 4
    assert D.replay_data({"results": []}) is None


def test_hang_data_and_from_collectives(tables) -> None:
    hd = D.hang_data({"dp0": {0: 42, 1: 42, "2": 41, 3: 42}})
    g = hd["groups"][0]
    assert g["behind"] == [2] and g["lag"] == [0, 0, 1, 0] and hd["max_lag"] == 1
    assert D.hang_from_collectives(tables) is None  # everything completed


def test_formatters() -> None:
    assert D.fmt_ns(1.5e6) == "1.50 ms" and D.fmt_ns(2500) == "2.5 µs" and D.fmt_ns(None) == "n/a"
    assert D.fmt_bytes(2e9) == "2.00 GB" and D.busbw_factor("all_reduce", 4) == 1.5
    assert D.norm_dim("WORLD") == "OTHER" and D.norm_dim(None) == "OTHER"


def test_data_module_never_imports_bokeh() -> None:
    import subprocess

    code = "import sys, tracekit.viz.data; sys.exit('bokeh' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_cpu_ops_are_compute_when_a_rank_has_no_kernels() -> None:
    import polars as pl

    ev = pl.DataFrame({
        "rank": [0, 0, 0, 0, 0, 1],
        "kind": ["cpu_op", "cpu_op", "cpu_op", "comm", "cpu_op", "compute"],
        "name": ["aten::mm", "autograd::MoE", "gloo:all_to_all", "gloo:all_to_all", "aten::add", "gemm"],
        "ts_ns": [0, 100, 110, 120, 300, 0],
        "dur_ns": [50, 100, 30, 30, 10, 40],
        "coll_id": [None, None, None, 7, None, None],
    })
    comm = ev.filter(pl.col("kind") == "comm").select("rank", "ts_ns", "dur_ns")
    got = D.compute_intervals(ev, comm).sort("rank", "ts_ns")
    # rank 0: aten ops only (the wrapper enclosing the all-to-all and the comm-named op are left out);
    # rank 1 has GPU kernels, so its CPU ops would be ignored
    assert got["name"].to_list() == ["aten::mm", "aten::add", "gemm"]


def test_hang_needs_uneven_seqs_or_a_started_call() -> None:
    from tracekit import schema

    def colls(states, seqs):
        return {"collectives": schema.conform("collectives", {
            "coll_id": list(range(len(seqs))), "rank": list(range(len(seqs))), "group": ["0"] * len(seqs),
            "seq": seqs, "state": states})}

    assert D.hang_from_collectives(colls(["scheduled"] * 4, [5, 5, 5, 5])) is None  # gloo marks done calls so
    assert D.hang_from_collectives(colls(["completed", "started", "completed", "completed"], [5] * 4)) is not None
    assert D.hang_from_collectives(colls(["scheduled"] * 4, [5, 5, 4, 5])) == {"0": {0: 5, 1: 5, 2: 4, 3: 5}}
