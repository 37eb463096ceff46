"""viz.data: shaping the library's typed results into column dicts (no Bokeh, no browser).

Inputs come from the real pipeline (tests/viz/conftest.py); each defect of issue 12 that lived in
this module has a regression test here, named after it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from viz_runs import SYNTH_TOPOLOGIES

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


def test_level_for_picks_the_coarsest_fine_enough_level() -> None:
    px = [1.0, 0.125, 0.015625]
    assert D.level_for(px, 1000, 1000) == 0
    assert D.level_for(px, 100, 1000) == 1
    assert D.level_for(px, 1, 1000) == 2


def test_coverage_counts_fractions_of_bins() -> None:
    cov = D.coverage(np.array([0.0, 5.0]), np.array([10.0, 25.0]), 40.0, 4)
    assert cov.tolist() == pytest.approx([1.5, 1.0, 0.5, 0.0])


def test_coverage_rows_counts_a_rank_once_per_moment() -> None:
    """Two overlapping intervals of one rank cover a bin once; two ranks cover it twice."""
    cov = D.coverage_rows(np.array([0, 0, 1]), np.array([0.0, 0.0, 0.0]), np.array([10.0, 10.0, 5.0]), 2, 10.0, 2)
    assert np.allclose(cov, [[1.0, 1.0], [1.0, 0.0]])


def test_pipeline_stages_are_the_analysis_stages(gloo, synth) -> None:
    """Regression: the report numbered stages by its own rule (a 3 -> 1 pipeline came out {1:0, 3:1});
    the rows now follow `AnalysisResult.pp_stages`, and the gloo sample's truth (stage 0: ranks 0-3)."""
    for p in (gloo, synth):
        td = p.data.timeline
        assert td.rows.stage == dict(pl.from_arrow(p.analysis.pp_stages).iter_rows())
        stages = [td.rows.stage[r] for r in td.rows.order]
        assert stages == sorted(stages)
    assert {r for r, s in gloo.data.timeline.rows.stage.items() if s == 0} == {0, 1, 2, 3}


def test_timeline_waits_are_the_analysis_waits(gloo) -> None:
    """Regression: the report computed waits with its own rule. Every striped bar is a
    participant's `wait_ns` from the analysis (clipped to its interval), and names the rank
    waited on and the root of the wait."""
    parts = pl.from_arrow(gloo.analysis.participants).filter(pl.col("wait_ns") > 0)
    waits: dict[int, list[int]] = {}
    for w, on in parts.select("wait_ns", "waited_on").iter_rows():
        waits.setdefault(on, []).append(w)
    seen = 0
    for layer, cols in gloo.data.timeline.levels[-1].items():
        if not layer.startswith("comm:"):
            continue
        for wait, on, root in zip(cols["wait_ns"], cols["waited_on"], cols["root"], strict=True):
            if wait > 0:
                seen += 1
                assert on >= 0 and root >= 0
                assert any(wait <= w + 1 for w in waits[on])
    assert seen > 20


def test_overview_never_counts_more_ranks_than_the_run_has(synth, gloo) -> None:
    """Regression: "ranks busy" reached 30 on 16 ranks (streams and dims counted twice)."""
    for p in (synth, gloo):
        ov = p.data.timeline.overview
        comm = sum(v for k, v in ov["series"].items() if k.startswith("comm:"))
        assert comm.max() <= ov["nrows"] + 1e-6
        assert ov["series"]["compute"].max() <= ov["nrows"] + 1e-6
        assert comm.max() > 0.5 * ov["nrows"]  # and it still shows the busy moments


def test_ep_figures_are_the_analysis_figures(synth) -> None:
    """Regression: the EP headline (5.61x, 35.1%) disagreed with its own table (5.69x, 70.1%);
    there is no run-wide headline any more, only the analysis' per-group figures."""
    ep = synth.data.ep
    groups = {g["group"]: g for g in pl.from_arrow(synth.analysis.ep_groups).to_dicts()}
    assert {g["group"]: g["imbalance"] for g in ep.groups} == {k: g["imbalance"] for k, g in groups.items()}
    assert sorted(ep.hot) == sorted(f"r{r}" for g in groups.values() for r in g["hot_ranks"])
    traffic = pl.from_arrow(synth.analysis.ep_traffic)
    assert ep.matrix.sum() * ep.scale == pytest.approx(traffic["bytes"].sum())


def test_ep_unit_fits_kilobyte_traffic(gloo) -> None:
    """Regression: MB for kilobyte data (the gloo sample moves a few KB per all-to-all)."""
    ep = gloo.data.ep
    assert ep.unit == "KB" and ep.matrix.max() >= 1
    assert ep.recv_unit == "KB"


def test_ep_draws_only_ranks_present(two_of_128) -> None:
    """Regression: 2 of 128 ranks present, the EP tab invented 126 absent ranks each receiving 12.4 MB."""
    ep = two_of_128.data.ep
    assert ep.labels == ["r0", "r1"] and ep.matrix.shape == (2, 2)
    group = ep.groups[0]
    assert not group["complete"] and group["members"] == 128 and group["hot_rank"] is None
    assert group["bytes_outside"] > 0
    assert any("2 of 128 members present" in n for n in ep.notes)


def test_ep_assumed_splits_are_said(tmp_path) -> None:
    """Regression: DLRM has no split sizes; the matrix was drawn as observed and even traffic was "hot".
    Now (its all-to-all EP only because the user says so, every member present) no flat heatmap is
    drawn at all, and the finding says why."""
    from viz_runs import pipeline

    path = Path(__file__).parents[2].parent / "shared" / "real_traces" / "kineto" / "param_dlrm_kineto_8rank"
    if not path.exists():
        pytest.skip(f"real traces not present at {path}")
    p = pipeline([path], tmp_path / "run", dims="ep=0")
    assert p.analysis.ep_groups.num_rows == 1 and p.data.ep is None and "EP" not in p.data.tabs
    assert any("traffic assumed even" in f.text for f in p.analysis.findings)


def test_dlrm_embedding_all_to_all_has_no_ep_tab(dlrm) -> None:
    """DLRM's all-to-all carries embeddings, not tokens to experts: no EP tab (it had one, flat)."""
    assert dlrm.data.ep is None and "EP" not in dlrm.data.tabs


def test_link_panels_keep_the_topology_order(synth) -> None:
    """Regression: panels were in alphabetical order, not the --topology order."""
    assert [p.name for p in synth.data.links.panels] == SYNTH_TOPOLOGIES


def test_link_panels_label_their_own_links(synth) -> None:
    """Regression: one link list for all panels left white bands (links absent from a topology)
    and labels on the first panel only."""
    for p in synth.data.links.panels:
        grid = np.asarray(p.grid)
        assert grid.shape[0] == len(p.links) and len(set(p.links)) == len(p.links)
        assert not np.isnan(grid).all(axis=1).any()  # every drawn link has samples in this panel
        assert p.line.link == p.links[0]


def test_replay_data_follows_the_topology_order_and_the_cli(synth) -> None:
    rd = synth.data.replay
    assert rd.topologies == SYNTH_TOPOLOGIES
    assert rd.delta[0] == 0.0
    steps = [float(np.mean(list(r.step_ns.values()))) / 1e6 for r in synth.replay.results]
    assert rd.step_ms == pytest.approx(steps)


def test_hang_data_is_tracekit_hang(type_mismatch) -> None:
    """Regression: on the real type_mismatch dumps the Hang tab was all green while `tracekit hang`
    blamed rank 3 (a broadcast against an all_reduce)."""
    hd = type_mismatch.data.hang
    assert hd.hung and hd.suspects == [3]
    group = next(g for g in hd.groups if g.group == "0")
    assert group.status == "mismatch" and group.suspects == [3]
    assert hd.findings[0].startswith("Start with rank 3")


def test_world_is_named_as_the_cli_names_it() -> None:
    """Regression: "WORLD" in the CLI was "other comm" in the report."""
    assert D.norm_dim("WORLD") == "WORLD" and D.DIM_LABELS["WORLD"] == "WORLD"
    assert D.norm_dim(None) == "OTHER" and D.DIM_COLORS["WORLD"] != D.DIM_COLORS["OTHER"]


def test_timeline_merges_below_pixel_and_reports(synth) -> None:
    td = D.timeline_data(synth.analysis, synth.run.scan("events").collect(), width_px=200)
    assert td.merged_full_view > 0 and any("merged" in n for n in td.notes)
    assert td.levels[-1]["compute"]["count"].max() == 1 and td.merged_finest == 0  # the finest level shows all
    assert td.names[0] == D.MERGED_NAME


def test_timeline_glyph_cap_is_respected(synth) -> None:
    td = D.timeline_data(synth.analysis, synth.run.scan("events").collect(), width_px=100_000, max_glyphs=200)
    for k, level in enumerate(td.levels):
        assert D._max_per_window(level, td.span_ms / 8**k) <= 200
    assert td.merged_finest > 0 and "stay merged" in " ".join(td.notes)


def test_data_module_never_imports_bokeh() -> None:
    import subprocess

    code = "import sys, tracekit.viz.data; sys.exit('bokeh' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
