"""The standalone HTML report: `build_report_data` (plain data, unit-tested) and `write_report`.

The report is one file (Bokeh `file_html`, resources inline by default so it works offline; a
CDN is opt-in) with tabs, in this order and each only when its data exists: Summary, Timeline,
Overlap, EP, Links, Replay, What-if, Hang. Every string from a trace is escaped: Bokeh escapes tooltip
fields, and the HTML written here goes through `html.escape`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.store import Run
from tracekit.viz import data as D

TABLES = ("ranks", "groups", "events", "collectives", "link_samples", "topology_links")
TAB_ORDER = ("Summary", "Timeline", "Overlap", "EP", "Links", "Replay", "What-if", "Hang")


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


def _as_json(obj: Any) -> dict[str, Any] | None:
    if obj is None:
        return None
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"expected a result object with to_json() or a dict, got {type(obj).__name__}")


def _inputs(run: Run | Mapping[str, pa.Table], analysis: Any) -> tuple[dict[str, pa.Table], dict | None, list[str]]:
    """The tables to draw (prepared by the analysis when possible) and the analysis as JSON."""
    notes: list[str] = []
    tables = D.tables_of(run, TABLES)
    if analysis is None:
        try:
            from tracekit.analysis import analyze
        except ImportError:
            analyze = None  # type: ignore[assignment]
            if isinstance(run, Run):
                analysis = run.read_json("analysis")
        if analyze is not None:
            try:
                analysis = analyze(run if isinstance(run, Run) else dict(tables), write=False)
            except Exception as exc:  # the report still shows what the tables hold
                notes.append(f"The analysis could not run on this input ({type(exc).__name__}: {exc}); "
                             f"the report shows the raw tables.")
                analysis = run.read_json("analysis") if isinstance(run, Run) else None
    prepared = {name: getattr(analysis, name, None) for name in ("ranks", "groups", "collectives")}
    if all(isinstance(t, pa.Table) for t in prepared.values()):
        tables.update(prepared)
    elif tables["ranks"].num_rows and tables["ranks"].column("clock_offset_ns").null_count == tables["ranks"].num_rows:
        tables.update(_prepare(run, tables, notes))
    return tables, _as_json(analysis), notes


def _prepare(run: Any, tables: dict[str, pa.Table], notes: list[str]) -> dict[str, pa.Table]:
    """Aligned clocks, instances and dims for tables that lack them (analysis given as JSON)."""
    try:
        from tracekit.analysis import prepare
    except ImportError:
        return {}
    try:
        out = prepare(run if isinstance(run, Run) else dict(tables), write=False)
    except Exception as exc:  # the report still draws the tables on their own clocks
        notes.append(f"Clock alignment failed ({type(exc).__name__}: {exc}); ranks are drawn on their own clocks.")
        return {}
    return {k: v for k, v in out.items() if k in ("ranks", "groups", "collectives")}


def _hang_input(run: Any, hang: Any, tables: Mapping[str, pa.Table]) -> Any:
    if hang is not None:
        return hang
    if isinstance(run, Run):
        saved = run.read_json("hang")
        if isinstance(saved, Mapping):
            # accept {group: {rank: seq}} or a result with a "last_seq" mapping
            return saved.get("last_seq", saved)
    return D.hang_from_collectives(tables)


def build_report_data(run: Run | Mapping[str, pa.Table], *, analysis: Any = None, replay: Any = None,
                      hang: Mapping[str, Mapping[Any, int]] | None = None, whatif: Any = None,
                      width_px: int = 1400, max_glyphs: int = 60_000, max_total: int = 250_000) -> dict[str, Any]:
    """Everything the report shows, as plain data (dicts, lists, numpy arrays); no Bokeh.

    `run` is a `Run` or a dict of tables. `analysis` is an `AnalysisResult` or its JSON (computed
    with `tracekit.analysis.analyze` when omitted and importable); `replay` is a `ReplayResult` or
    its JSON (read from the run's results/replay.json when omitted); `hang` is
    {group: {rank: last seq}} (derived from unfinished collectives when omitted); `whatif` is a
    `tracekit.whatif.WhatIfResult` (the What-if tab only appears with one).
    """
    tables, aj, notes = _inputs(run, analysis)
    if replay is None and isinstance(run, Run):
        replay = run.read_json("replay")
    rj = _as_json(replay)
    td = D.timeline_data(tables, width_px=width_px, max_glyphs=max_glyphs, max_total=max_total)
    order = td.rows["order"]
    ov = D.overlap_data(aj, order)
    ep = D.ep_data(tables)
    links = D.link_data(tables, t0_ns=td.t0_ns)
    rp = D.replay_data(rj)
    hg = D.hang_data(_hang_input(run, hang, tables))
    name = str(run.path.name) if isinstance(run, Run) else "tables"
    data: dict[str, Any] = {
        "title": f"tracekit report: {name}",
        "run": name,
        "timeline": None if td.empty else td,
        "overlap": ov,
        "ep": ep,
        "analysis_ep": (aj or {}).get("ep") or [],
        "links": links,
        "replay": rp,
        "hang": hg,
        "what-if": D.whatif_data(whatif),
        "notes": notes + td.notes + (links or {}).get("notes", []),
    }
    data["summary"] = summary_data(tables, td, aj, data)
    data["tabs"] = [t for t in TAB_ORDER if t == "Summary" or data[t.lower()] is not None]
    return data


def summary_data(tables: Mapping[str, pa.Table], td: D.TimelineData, aj: Mapping[str, Any] | None,
                 data: Mapping[str, Any]) -> dict[str, Any]:
    """Headline numbers, findings in words, and the worst stalls and stragglers."""
    aj = aj or {}
    ranks = td.rows["order"]
    hosts = sorted({h for h in td.rows["host"].values() if h})
    kpis: list[tuple[str, str]] = [("ranks", f"{len(ranks):,}"), ("hosts", f"{len(hosts):,}")]
    prs = aj.get("per_rank_step") or []
    steps = sorted({r.get("step") for r in prs if r.get("step") is not None}) or [s["step"] for s in td.steps]
    kpis.append(("steps", f"{len(steps):,}"))
    spans = [float(r["span_ns"]) for r in prs if r.get("span_ns")]
    if spans:
        kpis.append(("mean step time (per rank)", D.fmt_ns(float(np.mean(spans)))))
    elif td.steps:
        kpis.append(("mean step time", D.fmt_ns(1e6 * float(np.mean([s["x1"] - s["x0"] for s in td.steps])))))
    if prs:
        exposed = sum(float(r.get("exposed_total_ns") or sum((r.get("exposed_ns") or {}).values())) for r in prs)
        comm = sum(float(r.get("comm_total_ns") or sum((r.get("comm_ns") or {}).values())) for r in prs)
        span = sum(float(r.get("span_ns") or 0) for r in prs)
        if span:
            kpis.append(("exposed comm, share of step", f"{100 * exposed / span:.1f}%"))
        if comm:
            kpis.append(("comm hidden behind compute", f"{100 * (1 - exposed / comm):.0f}%"))
    resid = aj.get("alignment_residual_ns")
    if isinstance(resid, Mapping) and resid.get("median") is not None:
        kpis.append(("clock alignment residual (p90)", D.fmt_ns(float(resid.get("p90") or resid["median"]))))
    kpis.append(("intervals drawn", f"{td.raw_intervals:,}"))

    findings = [str(f) for f in (aj.get("findings") or [])][:12]
    sentences: list[str] = []
    ep = data.get("ep")
    if ep and not aj.get("ep"):
        sentences.append(f"EP load: rank {ep['hot']} receives {100 * ep['hot_share']:.1f}% of all-to-all bytes, "
                         f"{ep['imbalance']:.2f}x the mean.")
    rp = data.get("replay")
    if rp:
        for name, rep, tr in zip(rp["topologies"], rp["replayed_step_ms"], rp["traced_step_ms"], strict=True):
            if rep == rep and tr == tr and tr:
                sentences.append(f"Replayed on {name}, the step takes {rep:.2f} ms "
                                 f"({100 * (rep / tr - 1):+.1f}% vs the traced {tr:.2f} ms).")
    hg = data.get("hang")
    if hg:
        for g in hg["groups"]:
            if g["behind"]:
                who = ", ".join(map(str, g["behind"][:10])) + (" ..." if len(g["behind"]) > 10 else "")
                who = f"rank {who}" if len(g["behind"]) == 1 else f"ranks {who}"
                sentences.append(f"Hang: in group {g['group']}, {who} stopped before seq {g['max_seq']}, "
                                 f"which the others reached.")
    stalls = [dict(s) for s in (aj.get("stalls") or [])[:8]]
    stragglers = [dict(s) for s in (aj.get("stragglers") or [])[:5]]
    return {"kpis": kpis, "findings": findings, "sentences": sentences, "stalls": stalls,
            "stragglers": stragglers}


def render(data: Mapping[str, Any], *, cdn: bool = False, width: int = 1400) -> str:
    """The report's HTML text, from `build_report_data`'s output."""
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import TabPanel, Tabs
    from bokeh.resources import CDN, INLINE

    from tracekit.viz import figures
    from tracekit.viz._bokeh import html_div
    from tracekit.viz.summary import header_html, summary_html
    from tracekit.viz.timeline import timeline_figure

    panels = []
    for tab in data["tabs"]:
        if tab == "Summary":
            child = html_div(summary_html(data), width=width)
        elif tab == "Timeline":
            child, _ = timeline_figure(data["timeline"], width=width)
        elif tab == "Overlap":
            child = figures.overlap_figure(data["overlap"], width=width)
        elif tab == "EP":
            child = figures.ep_figures(data["ep"], data.get("analysis_ep"), width=width)
        elif tab == "Links":
            child = figures.link_figures(data["links"], width=width)
        elif tab == "Replay":
            child = figures.replay_figures(data["replay"], width=width)
        elif tab == "What-if":
            child = figures.whatif_figures(data["what-if"], width=width)
        else:
            child = figures.hang_div(data["hang"], width=width)
        panels.append(TabPanel(child=child, title=tab))
    root = column(html_div(header_html(data), width=width), Tabs(tabs=panels))
    return file_html(root, CDN if cdn else INLINE, title=data["title"])


def write_report(run: Run | Mapping[str, pa.Table] | str | os.PathLike[str], out_path: str | os.PathLike[str], *,
                 analysis: Any = None, replay: Any = None, hang: Mapping[str, Mapping[Any, int]] | None = None,
                 whatif: Any = None, cdn: bool = False, width: int = 1400) -> ReportInfo:
    """Write the standalone HTML report for a run; return where, how big, and what was merged."""
    if isinstance(run, (str, os.PathLike)):
        run = Run(run)
    data = build_report_data(run, analysis=analysis, replay=replay, hang=hang, whatif=whatif, width_px=width - 130)
    text = render(data, cdn=cdn, width=width)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    td = data["timeline"]
    return ReportInfo(path=out, size_bytes=out.stat().st_size,
                      merged_intervals=td.merged_finest if td else 0,
                      merged_full_view=td.merged_full_view if td else 0,
                      raw_intervals=td.raw_intervals if td else 0, tabs=list(data["tabs"]), notes=list(data["notes"]))
