"""The standalone HTML report: `build_report_data` (plain data, unit-tested) and `write_report`.

The report draws the typed results of the library and decides nothing itself: the analysis
(`tracekit.analysis.analyze`), the hang verdict (`tracekit.hang`, which the front door attaches
to the analysis), the replay (`tracekit.replay.engine.ReplayResult`) and the telemetry comparison, which the front door
gathers (`tracekit.workflows.report`). It is one file (Bokeh `file_html`,
resources inline by default so it works offline; a CDN is opt-in) with tabs, in this order and
each only when its data exists: Summary, Timeline, Overlap, EP, Links, Replay, What-if, Hang. Every
string from a trace is escaped: Bokeh escapes tooltip fields, and the HTML written here goes
through `html.escape`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit._progress import status
from tracekit._text import fmt_ns, fmt_ranks
from tracekit.analysis import AnalysisResult
from tracekit.analysis.steps import STEP_TIME
from tracekit.atomic import atomic_write_text
from tracekit.finding import Finding
from tracekit.microbench import MicrobenchRun
from tracekit.present import RootCauseRow, StragglerRow, root_cause_rows, straggler_rows
from tracekit.store import Run
from tracekit.telemetry import TelemetrySummary, telemetry_summary
from tracekit.validity import run_name
from tracekit.viz import data as D

if TYPE_CHECKING:
    from tracekit.hang import HangResult
    from tracekit.replay.engine import ReplayResult
    from tracekit.replay.microbench import MicrobenchReport
    from tracekit.telemetry.compare import TelemetryComparison
    from tracekit.viz.links import LinkComparison
    from tracekit.whatif import WhatIfResult

TAB_ORDER = ("Summary", "Timeline", "Overlap", "EP", "Links", "Replay", "What-if", "Hang")
WIDTH = 1400
#: Plot width inside the page (the room left of the plot for rank labels).
PLOT_MARGIN = 130


@dataclass
class ReportInfo:
    """What `write_report` wrote."""

    path: Path
    size_bytes: int
    merged_intervals: int  # intervals still merged into busy bars at the finest zoom level
    merged_full_view: int  # intervals merged at the full (unzoomed) view
    raw_intervals: int
    tabs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ReportSummary:
    """The Summary tab: headline numbers (label, value), findings, the replay's lines, the stalls by
    root cause, the stragglers, the nccl-tests tables, what the step time is, the missing ranks."""

    kpis: list[tuple[str, str]]
    findings: list[Finding]
    replay: list[str]
    roots: list[RootCauseRow]
    stragglers: list[StragglerRow]
    microbench: list[MicrobenchRun]
    step_time: str
    missing: str


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows (`build_report_data`), one field per tab that has data (None when
    it has none) and the header's, Summary's and caveats' parts; no Bokeh."""

    title: str
    run: str
    presence: str
    hosts: list[str]
    microbench: list[MicrobenchRun]
    telemetry: TelemetrySummary | None
    timeline: D.TimelineData | None
    pipeline: D.Gantt | None
    overlap: D.OverlapData | None
    ep: D.EPData | None
    links: D.LinkData | None
    link_compare: LinkComparison
    replay: D.ReplayData | None
    hang: D.HangData | None
    whatif: D.WhatIfData | None
    caveats: dict[str, list[str]]
    notes: list[str]
    summary: ReportSummary
    tabs: list[str]


def _typed(analysis: object, replay: object, hang: object) -> None:
    if analysis is not None and not isinstance(analysis, AnalysisResult):
        raise TypeError(f"analysis must be an AnalysisResult, not {type(analysis).__name__}")
    from tracekit.replay.engine import ReplayResult

    if replay is not None and not isinstance(replay, ReplayResult):
        raise TypeError(f"replay must be a ReplayResult, not {type(replay).__name__}")
    from tracekit.hang import HangResult

    if hang is not None and not isinstance(hang, HangResult):
        raise TypeError(f"hang must be a HangResult, not {type(hang).__name__}")


def build_report_data(run: Run | str | os.PathLike[str], *, analysis: AnalysisResult,
                      replay: ReplayResult | None = None, hang: HangResult | None = None,
                      whatif: WhatIfResult | None = None, links: TelemetryComparison | None = None,
                      width_px: int = WIDTH - PLOT_MARGIN,
                      max_glyphs: int = 60_000,
                      max_total: int = 250_000) -> ReportData:
    """Everything the report shows, as plain data (typed parts, lists, numpy arrays); no Bokeh.

    `analysis` is the run's `AnalysisResult`; `replay` a `ReplayResult`; `hang` a `HangResult`
    (the one the analysis carries, when omitted); `whatif` a
    `tracekit.whatif.WhatIfResult` (the What-if tab only appears with one); `links` the
    measured-vs-replayed `TelemetryComparison`. `tracekit.workflows.report_data` gathers them
    from a run (the analysis computed, the rest as stored).
    """
    _typed(analysis, replay, hang)
    run = run if isinstance(run, Run) else Run(run)
    hang = hang if hang is not None else analysis.hang
    events = run.scan("events").collect() if run.has("events") else pl.DataFrame(
        schema={"rank": pl.Int32, "kind": pl.String, "name": pl.String, "ts_ns": pl.Int64, "dur_ns": pl.Int64,
                "step": pl.Int32, "coll_id": pl.Int64})
    v = analysis.validity
    td = D.timeline_data(analysis, events, width_px=width_px, max_glyphs=max_glyphs, max_total=max_total)
    links = D.link_data(run.table("link_samples"), run.table("topology_links"),
                        order=list(replay.topologies) if replay is not None else (), t0_ns=td.t0_ns)
    link_compare = _link_comparison(run, links, td.t0_ns)
    hd = D.hang_data(hang) if hang is not None and (hang.hung or hang.source == "flight_recorder") else None
    name = run_name(run)
    caveats = _caveats(analysis)
    bench = analysis.microbench
    hosts = sorted({h for h in td.rows.host.values() if h})
    presence = v.presence()
    if not v.n_present and bench:
        hosts = sorted({h for b in bench for h in b.host_names})
        presence = f"{max(b.nranks or 0 for b in bench)} ranks (nccl-tests header), no trace"
    telemetry = telemetry_summary(run)
    rd = D.replay_data(replay)
    shown = {"Timeline": None if td.empty else td, "Overlap": D.overlap_data(analysis, td.rows.order),
             "EP": D.ep_data(analysis), "Links": links, "Replay": rd, "What-if": D.whatif_data(whatif), "Hang": hd}
    return ReportData(
        title=f"tracekit report: {name}", run=name, presence=presence, hosts=hosts, microbench=bench,
        telemetry=telemetry, timeline=shown["Timeline"], pipeline=D.traced_pipeline_gantt(analysis),
        overlap=shown["Overlap"], ep=shown["EP"], links=links, link_compare=link_compare, replay=rd, hang=hd,
        whatif=shown["What-if"], caveats=caveats,
        notes=td.notes + (links.notes if links is not None else []) + list(run.stale),
        summary=summary_data(analysis, td, hosts=hosts, replay=rd, telemetry=telemetry),
        tabs=[t for t in TAB_ORDER if t == "Summary" or shown[t] is not None])


def _link_comparison(run: Run, links: TelemetryComparison | None, t0_ns: int | None) -> LinkComparison:
    """The measured-vs-replayed panel's data from a `TelemetryComparison`."""
    from tracekit.viz.links import comparison_data

    return comparison_data(links, has_telemetry=run.has("counters"), t0_ns=t0_ns)


def _caveats(analysis: AnalysisResult) -> dict[str, list[str]]:
    """What each tab must say about the data it rests on, in the findings' own words."""
    v = analysis.validity
    out: dict[str, list[str]] = {tab: [] for tab in TAB_ORDER}
    run_wide = [f.text for f in v.findings()]
    for tab in ("Summary", "Timeline", "Overlap"):
        out[tab] += [t for f, t in zip(v.findings(), run_wide, strict=True) if f.kind != "unknown_hosts"]
    out["Links"] += run_wide  # the Replay tab shows the replay's own cautions, which say the same
    out["EP"] += [f.text for f in analysis.findings if f.kind in ("assumed_splits", "partial_run") and f.group]
    out["EP"] += [t for f, t in zip(v.findings(), run_wide, strict=True) if f.kind == "unknown_hosts"]
    return out


def summary_data(analysis: AnalysisResult, td: D.TimelineData, *, hosts: list[str], replay: D.ReplayData | None,
                 telemetry: TelemetrySummary | None) -> ReportSummary:
    """Headline numbers, findings, the stalls by root cause and the stragglers: every number as
    `tracekit analyze` prints it (`hosts` as the header counts them, the Replay tab's data, the
    run's telemetry)."""
    v = analysis.validity
    kpis: list[tuple[str, str]] = [
        ("ranks present" if v.partial else "ranks", f"{v.n_present} of {v.world_size}" if v.partial
         else f"{v.n_present:,}"),
        ("hosts", f"{len(hosts):,}" if hosts and not v.hosts_unknown else "unknown"),
        ("steps", f"{analysis.step_times.num_rows:,}"),
    ]
    if not v.n_present and analysis.microbench:
        from tracekit._text import fmt_rate

        bench = analysis.microbench
        kpis = [("ranks (nccl-tests header)", f"{max(b.nranks or 0 for b in bench):,}"),
                ("hosts", f"{len(hosts):,}" if hosts else "unknown"),
                ("nccl-tests tables", f"{len(bench):,}"),
                ("peak busbw", fmt_rate(max((b.peak_busbw_gbps or 0.0) for b in bench)))]
    mean = analysis.mean_step_ns()
    if mean is not None:
        kpis.append(("mean step time (first rank in to last rank out)", fmt_ns(mean)))
    exposed = next((f for f in analysis.findings if f.kind == "exposed_comm"), None)
    if exposed is not None and exposed.value is not None:
        kpis.append(("exposed comm, share of the ranks' step windows", f"{100 * exposed.value:.0f}%"))
    res = analysis.alignment.residual_ns
    if analysis.alignment.instances_used and res.get("p90") is not None:
        kpis.append(("clock alignment residual (p90)", fmt_ns(res["p90"])))
    kpis.append(("intervals drawn", f"{td.raw_intervals:,}"))
    roots = root_cause_rows(analysis)
    stragglers = straggler_rows(analysis)
    rp = replay
    replay_lines = []
    findings = list(analysis.findings)
    if rp is not None and not rp.simulated:
        replay_lines.append(f"Replay error not available: {rp.not_simulated or 'nothing was simulated'}")
        findings += [f for f in rp.findings if f.kind != "not_simulated"]
    elif rp is not None:
        for name, ms, d in zip(rp.topologies, rp.step_ms, rp.delta, strict=True):
            replay_lines.append(f"Replayed on {name}: step (mean) {ms:.3f} ms ({d:+.1%} against the baseline "
                                f"{rp.topologies[0]}).")
        findings += rp.findings
        findings += rp.not_modelled
    if telemetry is not None:
        findings.append(telemetry.finding())
    said = {f.kind for f in analysis.findings}  # the replay's run-validity cautions repeat the analysis' own
    findings = [f for f in findings if not (f.kind == "replay_caution" and (f.data or {}).get("reason") in said)]
    return ReportSummary(kpis=kpis, findings=findings, replay=replay_lines, roots=roots, stragglers=stragglers,
                         microbench=list(analysis.microbench), step_time=STEP_TIME,
                         missing=fmt_ranks(v.missing_ranks, limit=8))


def render(data: ReportData, *, cdn: bool = False, width: int = WIDTH) -> str:
    """The report's HTML text, from `build_report_data`'s output."""
    from tracekit.viz._bokeh import standalone_html

    root = layout(data, width=width)
    status("report: writing the HTML")
    return standalone_html(root, cdn=cdn, title=data.title)


def layout(data: ReportData, *, width: int = WIDTH) -> Any:
    """The report's Bokeh layout (a header above one tab per part), from `build_report_data`'s output."""
    from bokeh.layouts import column
    from bokeh.models import TabPanel, Tabs

    from tracekit.viz import figures
    from tracekit.viz._bokeh import html_div, note_div
    from tracekit.viz.summary import header_html, summary_html
    from tracekit.viz.timeline import timeline_figure

    panels = []
    for tab in data.tabs:
        if tab == "Summary":
            child = html_div(summary_html(data), width=width)
        elif tab == "Timeline":
            child, _ = timeline_figure(data.timeline, width=width)
            if data.pipeline:
                child = column(child, figures.traced_pipeline(data.pipeline, width=width))
        elif tab == "Overlap":
            child = figures.overlap_figure(data.overlap, width=width)
        elif tab == "EP":
            child = figures.ep_figures(data.ep, width=width)
        elif tab == "Links":
            from tracekit.viz.links import comparison_panel

            child = column(figures.link_figures(data.links, width=width),
                           comparison_panel(data.link_compare, width=width))
        elif tab == "Replay":
            child = figures.replay_figures(data.replay, width=width)
        elif tab == "What-if":
            child = figures.whatif_figures(data.whatif, width=width)
        else:
            child = figures.hang_div(data.hang, width=width)
        caveat = note_div(data.caveats.get(tab, []) if tab != "Summary" else [], width=width, warn=True)
        if caveat is not None:
            child = column(caveat, child)
        panels.append(TabPanel(child=child, title=tab))
    return column(html_div(header_html(data), width=width), Tabs(tabs=panels))


def write_report(run: Run | str | os.PathLike[str], out_path: str | os.PathLike[str], *,
                 analysis: AnalysisResult, replay: ReplayResult | None = None, hang: HangResult | None = None,
                 whatif: WhatIfResult | None = None, links: TelemetryComparison | None = None, cdn: bool = False,
                 width: int = WIDTH) -> ReportInfo:
    """Write the standalone HTML report for a run (the results as `build_report_data` takes them;
    `tracekit.workflows.report` gathers them); return where, how big, and what was merged."""
    status("report: collecting the tables")
    data = build_report_data(run, analysis=analysis, replay=replay, hang=hang, whatif=whatif, links=links,
                             width_px=width - PLOT_MARGIN)
    status("report: drawing the plots")
    text = render(data, cdn=cdn, width=width)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, text)
    td = data.timeline
    return ReportInfo(path=out, size_bytes=out.stat().st_size,
                      merged_intervals=td.merged_finest if td else 0,
                      merged_full_view=td.merged_full_view if td else 0,
                      raw_intervals=td.raw_intervals if td else 0, tabs=list(data.tabs), notes=list(data.notes))


def write_microbench_report(report: MicrobenchReport, out_path: str | os.PathLike[str], *, cdn: bool = False,
                            width: int = WIDTH) -> ReportInfo:
    """Write a standalone HTML page drawing an nccl-tests replay (`validate.MicrobenchReport`):
    predicted against measured busbw per file, and each table's health."""
    from tracekit.replay.microbench import MicrobenchReport
    from tracekit.viz._bokeh import standalone_html
    from tracekit.viz.figures import microbench_figures

    if not isinstance(report, MicrobenchReport):
        raise TypeError(f"report must be a MicrobenchReport, not {type(report).__name__}")
    data = D.microbench_data(report)
    text = standalone_html(microbench_figures(data, width=width), cdn=cdn,
                           title=f"tracekit nccl-tests: {Path(report.path).name or report.path}")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, text)
    return ReportInfo(path=out, size_bytes=out.stat().st_size, merged_intervals=0, merged_full_view=0,
                      raw_intervals=0, tabs=["nccl-tests"])
