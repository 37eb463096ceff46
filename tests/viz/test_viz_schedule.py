"""The What-if tab's pipeline Gantt charts: drawn from the schedule scenario's result as it is,
the bubbles it labels the ones `tracekit whatif` prints."""

from __future__ import annotations

import re

import pytest
from bokeh.models import ColumnDataSource

from tracekit.present import whatif_comparison
from tracekit.synth import make_run_tables
from tracekit.viz import data as D
from tracekit.viz import figures
from tracekit.whatif import whatif


@pytest.fixture(scope="module")
def schedule_whatif():
    tables, _ = make_run_tables(schedule="1f1b", pp=2, micro_batches=4, hosts=2, gpus_per_host=4, ep=2, steps=2,
                                straggler_rank=None)
    return whatif(tables, ["schedule:dualpipe", "schedule:zb-h1"])


def test_gantt_is_the_result_unchanged(schedule_whatif) -> None:
    wd = D.whatif_data(schedule_whatif)
    assert [g.scenario for g in wd.gantt] == ["schedule:dualpipe", "schedule:zb-h1"]
    for g, s in zip(wd.gantt, schedule_whatif.scenarios, strict=True):
        for drawn, run in zip(g.runs, (s.schedule.baseline, s.schedule.scenario), strict=True):
            assert drawn.bubble_ms == [b / 1e6 for b in run.bubble_ns]
            assert drawn.span_ms == run.span_ns / 1e6
            assert drawn.left_ms == [p.start_ns / 1e6 for p in run.placed]
            assert drawn.kind == [p.kind for p in run.placed] and not drawn.truncated
    dualpipe = wd.gantt[0].runs[1]
    assert "FB" in dualpipe.kind and dualpipe.title.startswith("scenario: dualpipe (2 stages, 4 micro")


def test_bubble_labels_are_the_ones_the_cli_prints(schedule_whatif) -> None:
    wd = D.whatif_data(schedule_whatif)
    lay = figures.whatif_figures(wd, width=1400)
    labels = {str(x).strip() for src in lay.select({"type": ColumnDataSource}) for x in src.data.get("label", [])}
    printed = "\n".join(whatif_comparison(schedule_whatif))
    bubbles = re.findall(r"(\d+: [\d.]+ ms) -> ([\d.]+ ms)", printed)
    assert len(bubbles) == 4  # two scenarios, two stages
    for before, after in bubbles:
        assert f"bubble {before.split(': ')[1]}" in labels and f"bubble {after}" in labels


def test_traced_gantt_draws_the_analysis() -> None:
    import polars as pl

    from tracekit.analysis import analyze

    tables, _ = make_run_tables(schedule="zb-h1", pp=2, micro_batches=4, hosts=2, gpus_per_host=4, ep=2, steps=2,
                                straggler_rank=None)
    result = analyze(tables)
    g = D.traced_pipeline_gantt(result)
    sched = result.pp_schedule
    assert g is not None and sched is not None and g.title.startswith("as traced in step 0: zb-h1 (2 stages")
    assert g.chunk == [b.chunks for b in sched.blocks] and "W0" in " ".join(g.chunk)
    bubbles = pl.from_arrow(result.pp_bubbles).filter(pl.col("step") == sched.step)
    for stage, ranks in enumerate(sched.stage_ranks):
        rank = next(b.rank for b in sched.blocks if b.stage == stage)
        assert rank in ranks
        assert g.bubble_ms[stage] == bubbles.filter(pl.col("rank") == rank).get_column("bubble_ns")[0] / 1e6
    lay = figures.traced_pipeline(g, width=1000)
    labels = {str(x).strip() for src in lay.select({"type": ColumnDataSource}) for x in src.data.get("label", [])}
    assert {f"bubble {b:.3f} ms" for b in g.bubble_ms} <= labels
