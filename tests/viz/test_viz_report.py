"""viz.report: the report's plain data, the written file, and the `tracekit report` command."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from viz_inputs import HOSTILE, tiny_link_samples

from tracekit.cli import main
from tracekit.viz import report as R


@pytest.fixture
def full(tables, analysis, replay):
    tables = {**tables, "link_samples": tiny_link_samples()}
    return R.build_report_data(tables, analysis=analysis, replay=replay, hang={"dp0": {0: 3, 1: 3, 2: 2, 3: 3}})


def test_tabs_in_order_when_data_exists(full) -> None:
    assert full["tabs"] == ["Summary", "Timeline", "Overlap", "EP", "Links", "Replay", "Hang"]


def test_tabs_only_when_data_exists(tables) -> None:
    data = R.build_report_data(tables, analysis={"findings": []})
    assert data["tabs"] == ["Summary", "Timeline", "EP"]
    assert data["overlap"] is None and data["replay"] is None and data["hang"] is None


def test_summary_has_numbers_and_findings(full) -> None:
    s = full["summary"]
    kpis = dict(s["kpis"])
    assert kpis["ranks"] == "4" and kpis["hosts"] == "2" and kpis["steps"] == "1"
    assert any("late" in f for f in s["findings"])
    assert any("rail-2x" in x and "-" in x for x in s["sentences"])
    assert any("Hang" in x and "rank 2 stopped" in x for x in s["sentences"])
    assert s["stalls"][0]["last_rank"] == 3


def test_analysis_is_computed_when_omitted(tables) -> None:
    pytest.importorskip("tracekit.analysis")
    data = R.build_report_data(tables)
    assert data["overlap"] is not None and "Overlap" in data["tabs"]


def test_write_report_escapes_trace_strings(tmp_path, tables, analysis, replay) -> None:
    tables = {**tables, "link_samples": tiny_link_samples()}
    info = R.write_report(tables, tmp_path / "r.html", analysis=analysis, replay=replay, hang={HOSTILE: {0: 1, 1: 0}})
    text = info.path.read_text()
    assert info.size_bytes == len(text.encode()) and info.size_bytes < 5_000_000
    assert info.tabs[-1] == "Hang" and info.raw_intervals > 0
    assert HOSTILE not in text  # never raw: Bokeh's JSON is HTML-escaped, Div text is escaped twice
    # Div text decodes to escaped HTML; data fields decode to the raw string that BokehJS escapes
    assert "&amp;lt;img src=x onerror" in text
    assert re.search(r"<script[^>]*>\s*window.__pwned", text) is None


def test_write_report_cdn_is_small(tmp_path, tables, analysis) -> None:
    inline = R.write_report(tables, tmp_path / "a.html", analysis=analysis)
    cdn = R.write_report(tables, tmp_path / "b.html", analysis=analysis, cdn=True)
    assert cdn.size_bytes < inline.size_bytes / 4
    assert "cdn.bokeh.org" in cdn.path.read_text()


def test_write_report_from_run_dir_and_cli(tmp_path) -> None:
    from tracekit.synth import make_run_tables, write_run

    tables, _ = make_run_tables(hosts=1, gpus_per_host=4, pp=2, ep=2, steps=1)
    write_run(tables, tmp_path / "run")
    result = CliRunner().invoke(main, ["report", str(tmp_path / "run"), "-o", str(tmp_path / "out" / "r.html")])
    assert result.exit_code == 0, result.output
    assert re.match(r"wrote .*r\.html \(\d+\.\d MB; tabs: Summary, Timeline, Overlap, EP\)", result.output)
    assert "intervals" in result.output
    assert (tmp_path / "out" / "r.html").stat().st_size > 100_000


def test_cli_missing_run_is_a_clean_error(tmp_path) -> None:
    result = CliRunner().invoke(main, ["report", str(tmp_path / "nope"), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 1 and "not a tracekit run" in result.output


def test_hang_dump_without_times(tmp_path) -> None:
    """A Flight Recorder-like input: collectives with no times, some never completed."""
    from tracekit import schema

    rows = {"coll_id": [], "rank": [], "group": [], "seq": [], "op": [], "state": []}
    for rank in range(4):
        last = 7 if rank == 2 else 8
        for seq in range(last + 1):
            for k, v in (("coll_id", rank * 100 + seq), ("rank", rank), ("group", "0"), ("seq", seq),
                         ("op", "all_reduce"), ("state", "completed" if seq < last else "started")):
                rows[k].append(v)
    tables = {"ranks": schema.conform("ranks", {"rank": [0, 1, 2, 3], "host": ["a", "a", "b", "b"]}),
              "collectives": schema.conform("collectives", rows)}
    data = R.build_report_data(tables)
    assert data["tabs"][0] == "Summary" and data["tabs"][-1] == "Hang" and "Timeline" not in data["tabs"]
    assert data["hang"]["groups"][0]["behind"] == [2]
    info = R.write_report(tables, tmp_path / "hang.html")
    assert info.raw_intervals == 0 and info.tabs == data["tabs"]


def test_unaligned_tables_are_prepared_when_analysis_is_json(tables) -> None:
    pytest.importorskip("tracekit.analysis")
    import pyarrow as pa

    ranks = tables["ranks"]
    i = ranks.schema.get_field_index("clock_offset_ns")
    tables = {**tables, "ranks": ranks.set_column(i, "clock_offset_ns", pa.nulls(4, pa.int64()))}
    data = R.build_report_data(tables, analysis={"findings": []})
    assert any(v != 0 for v in data["timeline"].rows["offset"].values())  # host b's clock was moved
