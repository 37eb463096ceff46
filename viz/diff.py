"""The Diff tab: the waterfall of the step-time change, the buckets that changed, a per-host
heatmap of what rose, and the setup differences. `diff_data` shapes a `RunDiff` into plain data
(no Bokeh); `diff_panel` draws it; `write_diff_report` writes a standalone HTML file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracekit.atomic import atomic_write_text
from tracekit.diff import present
from tracekit.diff.results import RunDiff

HEAT_COLUMNS = ("compute", "exposed comm", "late")
WIDTH = 1400


@dataclass(frozen=True)
class WaterfallStep:
    """One bar of the waterfall (ns): a total ("total") or a part of the change ("up", "down")."""

    name: str
    start: float
    end: float
    delta: float
    kind: str
    significant: bool = False


@dataclass(frozen=True)
class DiffData:
    """The Diff tab: the verdict and notes, the waterfall, the bucket and setup rows (cells as text),
    per host the mean change per rank of each `HEAT_COLUMNS` figure (ns), and the network and
    matching lines."""

    verdict: str
    notes: list[str]
    waterfall: list[WaterfallStep]
    buckets: list[list[str]]
    setup: list[list[str]]
    heat: dict[str, dict[str, float]]
    network: str | None
    matching: str


def diff_data(d: RunDiff) -> DiffData:
    """Plain data for the tab: the waterfall steps (start, end, label), bucket and setup rows, and
    the mean change per host of each rank figure (ns)."""
    deco = d.decomposition
    steps = []
    level = deco.step_a_ns
    steps.append(WaterfallStep(name="step time in A", start=0.0, end=level, delta=level, kind="total"))
    for p in [*deco.parts, None]:
        name, delta = ("remainder", deco.remainder_ns) if p is None else (p.name, p.delta_ns)
        steps.append(WaterfallStep(name=name, start=level, end=level + delta, delta=delta,
                                   kind="up" if delta > 0 else "down", significant=bool(p and p.significant)))
        level += delta
    steps.append(WaterfallStep(name="step time in B", start=0.0, end=level, delta=level, kind="total"))
    hosts: dict[str, dict[str, list[float]]] = {}
    for r in d.ranks:
        h = hosts.setdefault(r.host or "?", {c: [] for c in HEAT_COLUMNS})
        h["compute"].append(r.compute_b_ns - r.compute_a_ns)
        h["exposed comm"].append(r.exposed_b_ns - r.exposed_a_ns)
        h["late"].append(r.late_b_ns - r.late_a_ns)
    heat = {host: {c: sum(v) / len(v) for c, v in cols.items() if v} for host, cols in sorted(hosts.items())}
    return DiffData(verdict=d.verdict, notes=list(d.matching.notes), waterfall=steps,
                    buckets=present.bucket_rows(d, 20), setup=present.setup_rows(d), heat=heat,
                    network=present.network_line(d), matching=present.matching_line(d))


def diff_panel(data: DiffData, *, width: int = WIDTH) -> Any:
    """The Diff tab's layout: verdict, waterfall figure, per-host heatmap, tables."""
    from bokeh.layouts import column
    from bokeh.models import ColumnDataSource, FactorRange, HoverTool, LinearColorMapper
    from bokeh.plotting import figure

    from tracekit._text import fmt_ns
    from tracekit.viz._bokeh import esc, html_div, style

    head = f"<h2>{esc(data.verdict)}</h2>" + "".join(f'<div class="note">{esc(n)}</div>' for n in data.notes)
    names = [s.name for s in data.waterfall]
    colors = {"total": "#9A9A9A", "up": "#D55E00", "down": "#009E73"}
    src = ColumnDataSource({"name": names, "lo": [min(s.start, s.end) / 1e6 for s in data.waterfall],
                            "hi": [max(s.start, s.end) / 1e6 for s in data.waterfall],
                            "color": [colors[s.kind] for s in data.waterfall],
                            "label": [fmt_ns(s.delta) if s.kind == "total" else present.signed(s.delta)
                                      for s in data.waterfall]})
    p = figure(width=width, height=320, x_range=FactorRange(*names), title="Step time, A -> B (waterfall of the parts)",
               y_axis_label="ms", tools="save", toolbar_location="right")
    style(p)
    p.vbar(x="name", bottom="lo", top="hi", width=0.7, color="color", source=src)
    p.add_tools(HoverTool(tooltips=[("part", "@name"), ("change", "@label")]))
    parts = [html_div(head, width=width), p]
    heat = data.heat
    if heat:
        hosts = list(heat)
        xs, ys, vals = [], [], []
        for h in hosts:
            for c in HEAT_COLUMNS:
                xs.append(c)
                ys.append(h)
                vals.append(heat[h].get(c, 0.0) / 1e6)
        top = max((abs(v) for v in vals), default=1.0) or 1.0
        mapper = LinearColorMapper(palette=["#2166ac", "#67a9cf", "#d1e5f0", "#f7f7f7", "#fddbc7", "#ef8a62",
                                            "#b2182b"], low=-top, high=top)
        hm = figure(width=min(width, 600), height=max(160, 22 * len(hosts) + 80), x_range=list(HEAT_COLUMNS),
                    y_range=FactorRange(*reversed(hosts)), title="Per host: mean change per rank (ms per step)",
                    tools="save", toolbar_location="right")
        style(hm)
        hm.rect(x="x", y="y", width=1, height=1, source=ColumnDataSource({"x": xs, "y": ys, "v": vals}),
                fill_color={"field": "v", "transform": mapper}, line_color="white")
        hm.add_tools(HoverTool(tooltips=[("host", "@y"), ("figure", "@x"), ("change", "@v{0.000} ms")]))
        parts.append(hm)
    parts.append(html_div(_table("Collective buckets that changed", present.BUCKET_COLUMNS, data.buckets)
                          + _table("Setup differences", present.SETUP_COLUMNS, data.setup)
                          + (f"<p>{esc(data.network)}</p>" if data.network else "")
                          + f'<p class="muted">{esc(data.matching)}</p>', width=width))
    return column(*parts)


def _table(title: str, columns: list[str], rows: list[list[str]]) -> str:
    from tracekit.viz._bokeh import esc

    if not rows:
        return f'<h3>{esc(title)}</h3><p class="muted">none</p>'
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<h3>{esc(title)}</h3><table><tr>{head}</tr>{body}</table>"


def write_diff_report(d: RunDiff, out_path: str | os.PathLike[str], *, cdn: bool = False,
                      width: int = WIDTH) -> Path:
    """A standalone HTML file with the Diff tab (assets inlined unless `cdn`)."""
    from bokeh.models import TabPanel, Tabs

    from tracekit.viz._bokeh import standalone_html

    root = Tabs(tabs=[TabPanel(child=diff_panel(diff_data(d), width=width), title="Diff")])
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, standalone_html(root, cdn=cdn, title=f"tracekit diff: {d.a} -> {d.b}"))
    return out
