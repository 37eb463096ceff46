"""viz.report: the report's data, the file, and `tracekit report`, built from real pipeline
outputs; what the report shows equals what the CLI prints for the same run."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from viz_runs import GLOO_TOPOLOGIES, HOSTILE, SAMPLES

from tracekit.cli import main
from tracekit.results import to_builtins
from tracekit.viz import report as R
from tracekit.viz.summary import summary_html

#: A number as the CLI and the report print it: a duration, a share, a size, a factor or a count.
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?: ?(?:ns|µs|ms|s|%|x|KB|MB|GB|B)\b)?")


def cli(*args: str) -> str:
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def _strip_tags(html: str) -> str:
    import html as h

    return h.unescape(re.sub(r"<[^>]+>", " ", html))


def test_tabs_in_order_when_data_exists(synth, gloo, type_mismatch) -> None:
    assert synth.data.tabs == ["Summary", "Timeline", "Overlap", "EP", "Links", "Replay"]
    # + FR dumps; a CPU/gloo run is not replayed on a GPU fabric: no replayed link samples, a Replay tab that says so
    assert gloo.data.tabs == ["Summary", "Timeline", "Overlap", "EP", "Replay", "Hang"]
    # a 4-rank Flight Recorder hang whose all-to-alls recorded no splits: no flat, assumed EP heatmap
    assert type_mismatch.data.tabs == ["Summary", "Hang"]


def test_results_must_be_typed(gloo) -> None:
    """Regression: the report took ad-hoc dicts, and grew branches to serve hand-made stand-ins."""
    with pytest.raises(TypeError, match="AnalysisResult"):
        R.build_report_data(gloo.run, analysis=json.loads(gloo.analysis.dumps()))
    with pytest.raises(TypeError, match="ReplayResult"):
        R.build_report_data(gloo.run, analysis=gloo.analysis, replay=to_builtins(gloo.replay.summary))


def test_title_names_the_input_not_a_cache_hash(tmp_path) -> None:
    """Regression: `replay PATH --report` titled the report with its cache directory's hash."""
    out = tmp_path / "r.html"
    cli("replay", str(SAMPLES / "gloo_moe_8rank"), "--topology", "single-switch", "--cache",
        str(tmp_path / "0f3a9c2e"), "--report", str(out))
    text = out.read_text()
    assert "<title>tracekit report: gloo_moe_8rank</title>" in text and "0f3a9c2e" not in text.split("</title>")[0]


def test_one_step_time_named_everywhere(synth) -> None:
    """Regression: two step-time definitions side by side (39.85 ms "per rank" vs 45.48 ms "traced")."""
    kpis = dict(synth.data.summary.kpis)
    label = "mean step time (first rank in to last rank out)"
    assert list(kpis).count(label) == 1 and not any("per rank" in k for k in kpis)
    from tracekit._text import fmt_ns

    assert kpis[label] == fmt_ns(synth.analysis.mean_step_ns())
    out = cli("analyze", str(synth.run.path), "--no-write")
    assert f"step time: first rank in to last rank out (ProfilerStep windows on the aligned clock): mean " \
           f"{kpis[label]}" in out


@pytest.mark.parametrize("name", ["gloo", "synth", "type_mismatch", "one_of_eight", "dlrm"])
def test_every_number_in_the_summary_is_one_the_cli_prints(name, request) -> None:
    """Each number of the Summary tab (headline figures, findings, stall and straggler tables)
    appears, formatted the same way, in the output of the CLI commands for the same run."""
    p = request.getfixturevalue(name)
    run = str(p.run.path)
    outputs = [cli("analyze", run, "--no-write"), cli("info", run),
               cli("report", run, "-o", str(p.run.path / "r.html"))]
    if p.replay is not None:
        args = ["replay", run, "--no-write"]
        for t in p.topologies:
            args += ["--topology", t]
        outputs.append(cli(*args))
    said = set(NUMBER.findall("\n".join(outputs)))
    shown = set(NUMBER.findall(_strip_tags(summary_html(p.data))))
    assert len(shown) >= 5
    assert shown <= said, sorted(shown - said)


def test_report_names_the_rank_hang_names(type_mismatch) -> None:
    """Regression: `tracekit hang` blamed rank 3 on the real type_mismatch dumps while the report's
    Hang tab was green and the Summary said nothing; now both quote the same verdict."""
    hang_out = cli("hang", str(type_mismatch.run.path), "--no-write")
    verdict = type_mismatch.data.hang.findings[0]
    assert verdict in hang_out and "rank 3" in verdict
    texts = [f.text for f in type_mismatch.data.summary.findings if f.kind == "hang"]
    assert verdict in texts
    analyze_out = cli("analyze", str(type_mismatch.run.path), "--no-write")
    assert verdict in analyze_out


def test_partial_run_is_said_on_every_tab(one_of_eight) -> None:
    """Regression: rank 0 of an 8-rank job was reported as "the most idle of any rank", never as
    1 of 8 ranks present."""
    data = one_of_eight.data
    assert data.presence == "1 of 8 ranks present"
    assert dict(data.summary.kpis)["ranks present"] == "1 of 8"
    for tab in data.tabs:
        if tab != "Summary":
            assert any("1 of 8 ranks present" in c for c in data.caveats[tab]), tab
    texts = " ".join(f.text for f in data.summary.findings)
    assert "the most of any rank" not in texts and "cross-rank findings (waits" in texts


def test_unknown_hosts_are_said(dlrm) -> None:
    """Regression: with hosts unknown, every rank silently landed on one host."""
    assert dict(dlrm.data.summary.kpis)["hosts"] == "unknown"
    for tab in ("Links", "EP"):
        assert any("name no rank's host" in c for c in dlrm.data.caveats[tab])
    cautions = [f.text for f in dlrm.data.replay.findings if f.kind == "replay_caution"]
    assert any(t.startswith("hosts unknown: ranks were placed on hosts by rank order") for t in cautions)


def test_write_report_escapes_trace_strings(hostile, tmp_path) -> None:
    """A kernel name and a process-group description that are HTML, from a real trace."""
    info = R.write_report(hostile.run, tmp_path / "r.html", analysis=hostile.analysis, replay=hostile.replay)
    text = info.path.read_text()
    assert info.size_bytes == len(text.encode()) and info.size_bytes < 8_000_000
    assert HOSTILE in hostile.data.timeline.names  # reaches the page as a data field for Bokeh to escape
    assert HOSTILE not in text  # never raw: Bokeh's JSON is HTML-escaped, Div text is escaped twice
    assert "&amp;lt;img src=x onerror" in text  # the group description in a finding, inside a Div
    assert re.search(r"<script[^>]*>\s*window.__pwned", text) is None


def test_write_report_cdn_is_small(gloo, tmp_path) -> None:
    inline = R.write_report(gloo.run, tmp_path / "a.html", analysis=gloo.analysis, replay=gloo.replay)
    cdn = R.write_report(gloo.run, tmp_path / "b.html", analysis=gloo.analysis, replay=gloo.replay, cdn=True)
    assert cdn.size_bytes < inline.size_bytes / 4
    assert "cdn.bokeh.org" in cdn.path.read_text()


def test_cli_report_reads_the_stored_replay(gloo, tmp_path) -> None:
    out = cli("report", str(gloo.run.path), "-o", str(tmp_path / "out" / "r.html"))
    assert re.match(r"wrote .*r\.html \(\d+\.\d MB; tabs: Summary, Timeline, Overlap, EP, Replay, Hang\)", out)
    assert "intervals" in out


def test_cli_missing_run_is_a_clean_error(tmp_path) -> None:
    result = CliRunner().invoke(main, ["report", str(tmp_path / "nope"), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 1 and "not a tracekit run" in result.output


def test_replay_quotes_the_analysis_step_time(gloo, synth) -> None:
    """One step time: the replay's traced step is the analysis' (first rank in to last rank out)."""
    import polars as pl

    assert not gloo.replay.results  # a CPU/gloo run has no replayed steps
    for p in (synth,):
        want = {str(s): ns for s, ns in pl.from_arrow(p.analysis.step_times).select("step", "step_ns").iter_rows()}
        for res in p.replay.results:
            assert res.traced_step_ns == pytest.approx(want)


def test_replay_quotes_the_analysis_step_time_when_events_carry_no_step(one_of_eight) -> None:
    """Regression: on the B200 trace (steps only from the ProfilerStep annotation, no events.step)
    replay printed a traced step of 84.5 ms against the analysis' 87.4 ms."""
    import polars as pl

    from tracekit.workflows import replay as replay_run

    want = {str(s): ns for s, ns in pl.from_arrow(one_of_eight.analysis.step_times).select("step", "step_ns")
            .iter_rows()}
    assert want
    res = replay_run(one_of_eight.run.path, ["single-switch"]).results[0]
    assert res.traced_step_ns == pytest.approx(want)


def test_busiest_links_chart_one_line_per_source_each_its_own_style(synth) -> None:
    """Regression: 12-14 dashed lines with repeated colours, and "0%" on every y tick on small runs."""
    from bokeh.models import GlyphRenderer
    from bokeh.plotting import figure as Figure

    from tracekit.viz import figures

    panels = synth.data.links.panels
    lay = figures.link_figures(synth.data.links, width=1400)
    chart = next(m for m in lay.select({"type": Figure}) if m.title.text.startswith("The busiest link"))
    lines = [r.glyph for r in chart.select({"type": GlyphRenderer})]
    assert len(lines) == len(panels) >= 3
    styles = {(g.line_color, tuple(g.line_dash) if isinstance(g.line_dash, list) else str(g.line_dash))
              for g in lines}
    assert len(styles) == len(lines)
    assert chart.yaxis[0].formatter.format == figures.PCT and "[00]" in figures.PCT  # 0.4% is not "0%"


def test_stall_table_is_one_row_per_cascade(synth) -> None:
    """Regression: the synth stall table listed one cascade eight times, each with its own "last
    rank"; now a row is a root (rank and step), and the Summary's table is the analysis' table."""
    import polars as pl

    casc = pl.from_arrow(synth.analysis.root_causes)
    assert casc.height >= 3 and casc.select("root_rank", "root_step").is_unique().all()
    assert casc["instances"].max() >= 8  # the big cascade of the synth sample, in one row
    html = summary_html(synth.data)
    for row in casc.head(3).iter_rows(named=True):
        assert f"<td>r{row['root_rank']}</td><td class='num'>{row['root_step']}</td>" in html


def test_replay_of_a_partial_run_says_so(one_of_eight) -> None:
    """Regression: rank 0 of an 8-rank job replayed with error 0.0% and the same step on every
    topology, without a word that 7 of its 8 ranks were absent."""
    from tracekit.workflows import replay as replay_run

    res = replay_run(one_of_eight.run.path, ["single-switch", "fat-tree:nic_gbps=100,oversub=4"])
    partial = [f for f in res.findings if f.kind == "replay_caution" and f.data.get("reason") == "partial_run"]
    assert len(partial) == 1 and partial[0].severity == "warning"
    assert partial[0].text.startswith("1 of 8 ranks present: the replay moves only their traffic")


def test_replay_baseline_far_from_the_trace_is_a_caution(two_of_128) -> None:
    """Regression: a baseline replay +29% off the traced step came with no caution. On the real 2-rank
    HTA trace the replay of step 551 is more than 5% off: the Replay tab and the Summary say it. (The
    gloo sample showed it before; a CPU/gloo run is no longer replayed on a GPU fabric.)"""
    from tracekit.replay.engine import CAUTION_STEP
    from tracekit.workflows import replay as replay_run

    replay = replay_run(two_of_128.run.path, GLOO_TOPOLOGIES, write=False)
    base = replay.results[0]
    off = {s for s, ns in base.step_ns.items() if abs(ns / base.traced_step_ns[s] - 1) > CAUTION_STEP}
    said = {str(f.step) for f in replay.findings if f.data.get("reason") == "baseline_step"}
    assert off and said == off
    assert all(f.kind == "replay_caution" and f.severity == "warning" for f in replay.findings
               if f.data.get("reason") == "baseline_step")
    data = R.build_report_data(two_of_128.run, analysis=two_of_128.analysis, replay=replay)
    assert any("off the traced step" in f.text for f in data.replay.findings)


def test_cpu_gloo_run_says_the_network_model_does_not_apply(gloo) -> None:
    """The gloo sample: the Replay tab and the Summary carry the replay's one `cpu_backend` finding,
    and the tab draws no modelled times."""
    [cpu] = [f for f in gloo.replay.findings if f.kind == "cpu_backend"]
    assert gloo.data.replay.not_modelled == [cpu] and gloo.data.replay.topologies == []
    assert cpu in gloo.data.summary.findings
    html = R.render(gloo.data)
    assert "CPU/gloo run" in html and "does not apply" in html


def test_every_layout_passes_bokehs_validation(synth, gloo, type_mismatch) -> None:
    """The HTML is written without Bokeh's document validation (a fifth of the render): the
    layouts it would check are checked here, with the replay and hang tabs among them."""
    from tracekit.viz._bokeh import validation_issues

    for case in (synth, gloo, type_mismatch):
        assert validation_issues(R.layout(case.data)) == []
