"""The report's other figures: overlap, EP traffic, link utilisation, replay, hang.

Each function takes the plain data from `viz.data` and returns a Bokeh layout. Every string that
came from a trace reaches the page either as a Bokeh data field (escaped by BokehJS) or through
`esc` inside a Div.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import (
    BasicTicker,
    ColorBar,
    ColumnDataSource,
    FactorRange,
    FixedTicker,
    HoverTool,
    Legend,
    LegendItem,
    LinearColorMapper,
    NumeralTickFormatter,
    Range1d,
    Span,
)
from bokeh.models.layouts import LayoutDOM
from bokeh.palettes import Viridis256
from bokeh.plotting import figure

from tracekit._text import fmt_bytes, fmt_pct
from tracekit.viz import data as D
from tracekit.viz._bokeh import esc as _esc
from tracekit.viz._bokeh import html_div, lookup, note_div, style

LINE_COLORS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")
MARKERS = ("circle", "triangle", "square", "diamond", "inverted_triangle", "hex")


def _rows_px(n: int, *, big: float = 18.0, total: float = 1400.0) -> float:
    return max(4.0, min(big, total / max(n, 1)))


# ---------------------------------------------------------------------------------------------
# Overlap


def overlap_figure(ov: D.OverlapData, *, width: int = 1400) -> LayoutDOM:
    """Hidden vs exposed communication per rank and dim (ms per step), stacked per rank."""
    cols = ov.columns
    labels = cols["rank"]
    n = len(labels)
    px = _rows_px(n)
    p = figure(width=width, height=int(n * px) + 140, y_range=FactorRange(*labels[::-1]),
               title="Communication per rank and step: exposed (solid) vs hidden behind compute (pale, hatched)",
               x_axis_label="ms per step (mean over steps)", tools="xpan,xwheel_zoom,box_zoom,reset,save",
               toolbar_location="right")
    style(p)
    p.ygrid.grid_line_color = None
    p.yaxis.major_label_text_font_size = "8pt" if px < 14 else "9pt"
    if px < 9:
        p.yaxis.major_label_text_font_size = "0pt"
        p.yaxis.axis_label = f"ranks r{labels[0][1:]}..{labels[-1]} (top to bottom; hover for values)"
    left = np.zeros(n)
    items = []
    for dim in ov.dims:
        for part in ("exposed", "hidden"):
            vals = np.asarray(cols[f"{dim}_{part}"], dtype=np.float64)
            src = ColumnDataSource({"rank": labels, "left": left.copy(), "right": left + vals, "ms": vals,
                                    "dim": [D.DIM_LABELS[dim]] * n, "part": [part] * n})
            kw: dict[str, Any] = {"fill_alpha": 0.95} if part == "exposed" else {
                "fill_alpha": 0.3, "hatch_pattern": "/", "hatch_color": D.DIM_COLORS[dim], "hatch_alpha": 0.8}
            r = p.hbar(y="rank", left="left", right="right", height=0.75, source=src, fill_color=D.DIM_COLORS[dim],
                       line_color=None, **kw)
            items.append(LegendItem(label=f"{D.DIM_LABELS[dim]} {part}", renderers=[r]))
            left = left + vals
    p.add_tools(HoverTool(tooltips=[("rank", "@rank"), ("dim", "@dim"), ("", "@part"),
                                    ("ms per step", "@ms{0,0.000}")]))
    p.x_range.start = 0
    p.add_layout(Legend(items=items, orientation="horizontal", click_policy="hide", label_text_font_size="9pt",
                        border_line_color=None), "above")
    tot = ov.totals_ms
    nranks = max(len(ov.ranks), 1)
    parts = [f"<b>{_esc(D.DIM_LABELS[d])}</b> {h / nranks + e / nranks:.2f} ms "
             f"({e / nranks:.2f} ms exposed, {100 * e / max(h + e, 1e-12):.0f}%)" for d, (h, e) in tot.items()]
    text = ("<p>Mean per rank and step: " + "; ".join(parts) + ". Exposed communication is the part no "
            "compute overlaps: it adds to the step time.</p>")
    return column(html_div(text, width=width), p)


# ---------------------------------------------------------------------------------------------
# EP


def ep_figures(ep: D.EPData, *, width: int = 1400) -> LayoutDOM:
    """The per-group EP figures of the analysis (a table), the traffic matrix among the ranks
    present and the bytes each receives, in the unit that fits the data."""
    groups = sorted(ep.groups, key=lambda g: (g["imbalance"] is None, -(g["imbalance"] or 0), str(g["group"])))
    rows = "".join(_ep_row(g) for g in groups[:12])
    head = ("<h3>EP groups, most imbalanced first</h3><table><tr><th>group</th><th>ranks</th><th>splits</th>"
            "<th>hot rank</th><th>hot share</th><th>imbalance (max/mean)</th><th>inter-host bytes</th></tr>"
            + rows + "</table><p class='muted small'>A rank is hot when it receives at least 1.25x the mean in "
            "some all-to-all; imbalance is the largest max/mean over the group's all-to-alls (as tracekit "
            "analyze prints it).</p>")
    labels = ep.labels
    n = len(labels)
    if n == 0:
        return html_div(head, width=width)
    unit = ep.unit
    mat = np.asarray(ep.matrix)
    src_i, dst_i = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    side = int(min(640, max(400, 16 * n + 120)))
    mapper = LinearColorMapper(palette=Viridis256, low=0.0, high=float(mat.max()) or 1.0)
    what = "assumed even (split sizes not in the trace)" if ep.assumed else "from the traced split sizes"
    m = figure(width=side + 110, height=side, x_range=FactorRange(*labels), y_range=FactorRange(*labels[::-1]),
               title=f"EP traffic ({unit}), source to destination", x_axis_label="destination rank",
               y_axis_label="source rank", tools="box_zoom,reset,save", toolbar_location="below")
    style(m)
    m.grid.grid_line_color = None
    m.xaxis.major_label_orientation = 1.0
    if n > 40:
        m.xaxis.major_label_text_font_size = "0pt"
        m.yaxis.major_label_text_font_size = "0pt"
    cells = ColumnDataSource({"src": [labels[i] for i in src_i.ravel()], "dst": [labels[j] for j in dst_i.ravel()],
                              "v": mat.ravel()})
    m.rect(x="dst", y="src", width=1, height=1, source=cells, line_color=None,
           fill_color={"field": "v", "transform": mapper})
    m.add_tools(HoverTool(tooltips=[("from", "@src"), ("to", "@dst"), (unit, "@v{0,0.00}")]))
    m.add_layout(ColorBar(color_mapper=mapper, ticker=BasicTicker(), title=unit, width=10, label_standoff=6),
                 "right")
    recv = np.asarray(ep.recv)
    runit = ep.recv_unit
    hot = set(ep.hot)
    colors = [D.DIM_COLORS["TP"] if lab in hot else D.DIM_COLORS["EP"] for lab in labels]
    b = figure(width=max(width - side - 140, 420), height=side, x_range=FactorRange(*labels),
               title="Bytes received per rank" + (" (vermillion: hot ranks)" if hot else ""),
               x_axis_label="rank", y_axis_label=f"{runit} received", tools="box_zoom,reset,save",
               toolbar_location="below")
    style(b)
    b.xgrid.grid_line_color = None
    b.xaxis.major_label_orientation = 1.0
    if n > 40:
        b.xaxis.major_label_text_font_size = "0pt"
    src = ColumnDataSource({"rank": labels, "v": recv, "sent": np.asarray(ep.sent), "color": colors})
    b.vbar(x="rank", top="v", width=0.8, source=src, fill_color="color", line_color=None)
    b.add_layout(Span(location=float(recv.mean()), dimension="width", line_color="#333333", line_dash="dashed"))
    b.add_tools(HoverTool(tooltips=[("rank", "@rank"), ("received", f"@v{{0,0.00}} {runit}"),
                                    ("sent", f"@sent{{0,0.00}} {runit}")]))
    b.y_range.start = 0
    head += f"<p>Traffic among the ranks present, summed over the all-to-alls, {_esc(what)}. The dashed line is the " \
            "mean received.</p>"
    if ep.block > 1:
        head += f"<p class='muted'>Ranks are grouped in blocks of {ep.block} to keep the matrix readable.</p>"
    return column(html_div(head, width=width), row(m, b))


def _ep_row(g: Mapping[str, Any]) -> str:
    ranks = str(g["members"]) if g["complete"] else f"{g['present']} of {g['members']}"
    hot = "-" if g["hot_rank"] is None else f"r{g['hot_rank']}"
    imb = "-" if g["imbalance"] is None else f"{g['imbalance']:.2f}x"
    cells = [(g["group"], False), (ranks, True), (_splits(g["splits_assumed"]), False), (hot, False),
             (fmt_pct(g["hot_share"]), True), (imb, True), (fmt_pct(g["inter_host_share"]), True)]
    return "<tr>" + "".join(f"<td class='num'>{_esc(v)}</td>" if num else f"<td>{_esc(v)}</td>"
                            for v, num in cells) + "</tr>"


def _splits(share: float) -> str:
    return "assumed" if share >= 1 else ("measured" if share <= 0 else f"{100 * share:.0f}% assumed")


# ---------------------------------------------------------------------------------------------
# Links


PCT = "0.[00]%"


def link_figures(ld: D.LinkData, *, width: int = 1400) -> LayoutDOM:
    """One utilisation heatmap per origin, stacked in the order given (telemetry first, then the
    replayed topologies as passed to --topology), each titled in full and labelled with its own
    busiest links, on one colour scale; then the busiest link of each origin as a line."""
    panels = ld.panels
    top = max(max(p.peak for p in panels), 1e-6)
    high = 1.0 if top > 0.5 else top
    mapper = LinearColorMapper(palette=Viridis256, low=0.0, high=high, nan_color="#e8e8e8")
    aligned = [p for p in panels if p.aligned]
    shared = Range1d(0.0, max(p.x0_ms + p.dw_ms for p in aligned)) if len(aligned) > 1 else None
    figs: list[Any] = []
    for p in panels:
        nl = len(p.links)
        px = _rows_px(nl, big=16, total=420)
        kind = "telemetry" if p.kind == "telemetry" else f"replay on {p.name}"
        f = figure(width=width - 110, height=max(200, int(nl * px) + 90), y_range=Range1d(-0.5, nl - 0.5),
                   x_range=shared if shared is not None and p.aligned else Range1d(p.x0_ms,
                                                                                       p.x0_ms + p.dw_ms),
                   title=f"Link utilisation, {kind}",
                   x_axis_label="time (ms)" + (" since run start" if p.aligned else ""),
                   tools="xpan,xwheel_zoom,box_zoom,reset,save", toolbar_location="right")
        style(f, title_size="11pt")
        f.grid.grid_line_color = None
        grid = np.asarray(p.grid)
        if p.kind != "telemetry":
            grid = np.nan_to_num(grid, nan=0.0)  # a replayed link with no sample carried nothing
        f.image(image=[grid[::-1]], x=p.x0_ms, y=-0.5, dw=p.dw_ms, dh=nl, color_mapper=mapper)
        f.yaxis.ticker = FixedTicker(ticks=list(range(nl)))
        f.yaxis.major_label_overrides = {nl - 1 - j: name for j, name in enumerate(p.links)}
        f.yaxis.major_label_text_font_size = "8pt" if px >= 8 else "0pt"
        f.add_tools(HoverTool(tooltips=[("link", "$y{link}"), ("time", "$x{0,0.000} ms"),
                                        ("utilisation", "@image{0.[00]%}")],
                              formatters={"$y": lookup(p.links[::-1])}))
        f.add_layout(ColorBar(color_mapper=mapper, title="utilisation", width=10,
                              formatter=NumeralTickFormatter(format=PCT)), "right")
        figs.append(f)
    lines = figure(width=width - 110, height=300, title="The busiest link of each source over time",
                   x_axis_label="time (ms)", y_axis_label="utilisation", tools="xpan,xwheel_zoom,box_zoom,reset,save")
    style(lines)
    lines.yaxis.formatter = NumeralTickFormatter(format=PCT)
    lines.y_range.start = 0
    items = []
    for i, p in enumerate(panels):
        line = p.line
        src = ColumnDataSource({"x": line.x, "util": line.util, "link": [line.link] * len(line.x),
                                "origin": [p.name] * len(line.x)})
        r = lines.line(x="x", y="util", source=src, color=LINE_COLORS[i % len(LINE_COLORS)], line_width=1.8,
                       line_dash="solid" if p.kind == "telemetry" else DASHES[(i // len(LINE_COLORS)) % 3])
        items.append(LegendItem(label=f"{p.name}: {line.link}"[:90], renderers=[r]))
    lines.add_tools(HoverTool(tooltips=[("link", "@link"), ("source", "@origin"), ("time", "@x{0,0.000} ms"),
                                        ("utilisation", "@util{0.[00]%}")]))
    lines.add_layout(Legend(items=items, click_policy="hide", label_text_font_size="8pt", border_line_color=None),
                     "below")
    parts = [x for x in (note_div(ld.notes or [], width=width), *figs, lines) if x is not None]
    return column(*parts)


DASHES = ("dashed", "dotted", "dashdot")


# ---------------------------------------------------------------------------------------------
# Replay


def replay_figures(rd: D.ReplayData, *, width: int = 1400) -> LayoutDOM:
    """Step time per topology (in the order given, against the baseline, as `tracekit replay`
    prints it), exposed communication per topology, and traced vs replayed per instance; for a run the
    network model does not apply to, the sentence that says so."""
    if rd.not_modelled:
        text = "".join(f"<div class='warn'>{_esc(f.text)}</div>" for f in rd.not_modelled)
        text += "".join(f"<div class='note'>{_esc(f.text)}</div>" for f in rd.findings)
        return html_div(f"<h2>Replay</h2>{text}", width=width)
    topo = rd.topologies
    n = len(topo)
    if not rd.simulated:
        # nothing was simulated: no step bars that cannot differ, no diagonal of traced durations
        text = (f"<p>Replay error: not available: {_esc(rd.not_simulated or 'Nothing was simulated.')}</p>"
                + (f"<p>Traced step (mean) {rd.traced_step_ms:.3f} ms.</p>" if rd.traced_step_ms else "")
                + "".join(f"<div class='warn'>{_esc(f.text)}</div>" for f in rd.findings
                          if f.kind != "not_simulated"))
        return column(html_div(text, width=width))
    labels = [f"{ms:.3f} ms ({d:+.1%})" for ms, d in zip(rd.step_ms, rd.delta, strict=True)]
    height = 80 + 44 * n
    s = figure(width=width - 110, height=height, y_range=FactorRange(*topo[::-1]),
               title="Step time per topology (mean; change against the first, the baseline)",
               x_axis_label="step time (ms)", tools="save", toolbar_location="right")
    style(s)
    s.ygrid.grid_line_color = None
    colors = ["#555555"] + ["#0072B2"] * (n - 1)
    src = ColumnDataSource({"topology": topo, "ms": rd.step_ms, "label": labels, "color": colors})
    s.hbar(y="topology", right="ms", height=0.6, source=src, fill_color="color", line_color=None)
    s.text(x="ms", y="topology", text="label", source=src, text_baseline="middle", text_font_size="9pt",
           x_offset=6)
    if rd.traced_step_ms:
        s.add_layout(Span(location=rd.traced_step_ms, dimension="height", line_color="#D55E00",
                          line_dash="dashed", line_width=1.5))
    s.add_tools(HoverTool(tooltips=[("topology", "@topology"), ("step", "@label")]))
    s.x_range = Range1d(0, max([x for x in rd.step_ms if x == x] + [rd.traced_step_ms or 0, 1e-9]) * 1.3)
    figs: list[Any] = [s]
    exposed = rd.exposed_ms
    dims = [d for d in D.DIM_ORDER if any(d in exposed.get(t, {}) for t in topo)]
    if dims:
        e = figure(width=width - 110, height=height + 40, y_range=FactorRange(*topo[::-1]),
                   title="Exposed communication per step, by dim", x_axis_label="ms per step", tools="save",
                   toolbar_location="right")
        style(e)
        e.ygrid.grid_line_color = None
        cols: dict[str, Any] = {"topology": topo}
        for d in dims:
            cols[d] = [exposed.get(t, {}).get(d, 0.0) for t in topo]
        rs = e.hbar_stack(dims, y="topology", height=0.6, color=[D.DIM_COLORS[d] for d in dims],
                          source=ColumnDataSource(cols), line_color=None)
        e.add_layout(Legend(items=[LegendItem(label=D.DIM_LABELS[d], renderers=[r]) for d, r in zip(dims, rs,
                                                                                               strict=True)],
                            orientation="horizontal", label_text_font_size="8pt", border_line_color=None), "above")
        e.x_range.start = 0
        figs.append(e)
    inst = rd.instances
    sc = figure(width=900, height=520, x_axis_type="log", y_axis_type="log",
                title="Per collective: traced vs replayed (dashed: equal)",
                x_axis_label="traced (ms)", y_axis_label="replayed (ms)", tools="box_zoom,wheel_zoom,reset,save")
    style(sc)
    items = []
    if inst["traced_ms"]:
        allv = np.array(inst["traced_ms"] + inst["replayed_ms"], dtype=np.float64)
        allv = allv[allv > 0]
        lo, hi = (float(allv.min()) * 0.8, float(allv.max()) * 1.25) if allv.size else (1e-3, 1.0)
        sc.line([lo, hi], [lo, hi], color="#555555", line_dash="dashed")
        tarr = np.array(inst["topology"])
        darr = np.array(inst["dim"])
        for ti, name in enumerate(topo):
            for dim in D.DIM_ORDER:
                sel = np.flatnonzero((tarr == name) & (darr == dim))
                if not sel.size:
                    continue
                src = ColumnDataSource({k: [inst[k][i] for i in sel] for k in inst})
                r = sc.scatter(x="traced_ms", y="replayed_ms", source=src, marker=MARKERS[ti % len(MARKERS)],
                               size=8, fill_color=D.DIM_COLORS[dim], fill_alpha=0.6, line_color=D.DIM_COLORS[dim])
                items.append(LegendItem(label=f"{D.DIM_LABELS[dim]} on {name}"[:80], renderers=[r]))
        sc.add_tools(HoverTool(tooltips=[("topology", "@topology"), ("group", "@group"), ("seq", "@seq"),
                                         ("op", "@op"), ("dim", "@dim"), ("traced", "@traced_ms{0,0.000} ms"),
                                         ("replayed", "@replayed_ms{0,0.000} ms")]))
        sc.add_layout(Legend(items=items, click_policy="hide", label_text_font_size="8pt", border_line_color=None),
                      "right")
    text = ""
    med, p90 = rd.error_median[0], rd.error_p90[0]
    if med is not None:
        how = ("cross-validated: each collective predicted without its own step or itself"
               if rd.error_calibrated_on is None
               else f"out of sample: calibrated on {_esc(str(rd.error_calibrated_on))}")
        text += (f"<p>Replay error of the baseline {_esc(topo[0])} (the observed network replayed against the "
                 f"trace, {how}): median "
                 f"{100 * float(med):.1f}%, p90 {100 * float(p90 or 0):.1f}% per collective.</p>")
    if rd.traced_step_ms:
        text += f"<p>Dashed vermillion line: the traced step (mean) {rd.traced_step_ms:.3f} ms.</p>"
    text += "".join(f"<div class='warn'>{_esc(f.text)}</div>" for f in rd.findings)
    hot = rd.hot_links
    table = ""
    if hot:
        table = ("<h3>Hottest links in the replay</h3><table><tr><th>topology</th><th>link</th><th>peak</th>"
                 "<th>mean</th><th>bytes</th></tr>" + "".join(
                     f"<tr><td>{_esc(topology)}</td><td>{_esc(h.link)}</td>"
                     f"<td class='num'>{100 * float(h.peak_util or 0):.0f}%</td>"
                     f"<td class='num'>{100 * float(h.mean_util or 0):.0f}%</td>"
                     f"<td class='num'>{_esc(fmt_bytes(h.bytes))}</td></tr>" for topology, h in hot) + "</table>")
    parts = [*figs, html_div(text, width=width), sc]
    if table:
        parts.append(html_div(table, width=width))
    return column(*parts)


# ---------------------------------------------------------------------------------------------
# Hang

_STATUS = {"ok": ("#d9f0e3", "#1b5e20"), "dump_skew": ("#fde0b2", "#000000"), "stuck": ("#f9b26b", "#000000"),
           "hang": ("#e9772f", "#ffffff"), "mismatch": ("#e9772f", "#ffffff")}
SUSPECT = ("#c0392b", "#ffffff")


def hang_div(hd: D.HangData, *, width: int = 1400) -> LayoutDOM:
    """The verdict of `tracekit hang`, then per group its verdict and each rank's last seq, the
    ranks the verdict names in red."""
    lead = "".join(f"<li>{_esc(x)}</li>" for x in hd.findings) or \
        "<li>no divergence: every rank reached the same seq in every group.</li>"
    parts = [f"<h2>Verdict</h2><ul class='findings'>{lead}</ul><p class='muted small'>Sequence numbers from "
             f"{_esc(hd.source)}. Each cell is a rank and the last collective sequence number it reached in that "
             "group; red: a rank the verdict names.</p>"]
    order = {"mismatch": 0, "hang": 0, "stuck": 1, "dump_skew": 2, "ok": 3}
    for g in sorted(hd.groups, key=lambda g: (order.get(g.status, 3), g.group)):
        cells = []
        for r, seq in zip(g.ranks, g.last_seq, strict=True):
            bg, fg = SUSPECT if r in g.suspects else _STATUS.get(g.status, _STATUS["ok"])
            cells.append(f'<span class="cell" style="background:{bg};color:{fg}" '
                         f'title="rank {r}: last seq {seq}">r{r}<br>{seq}</span>')
        title = f"group {g.group}" + (f" ({g.desc})" if g.desc and g.desc != g.group else "")
        parts.append(f"<h3>{_esc(title)}: {_esc(g.status)}</h3><p>{_esc(g.verdict)}</p>"
                     f"<div>{''.join(cells)}</div>")
    return html_div("".join(parts), width=width)



# ---------------------------------------------------------------------------------------------
# What-if


def _hsize(names: Sequence[str]) -> int:
    return 90 + 34 * len(names)


def _bars(title: str, labels: Sequence[str], names: Sequence[str], values: Sequence[float], unit: str, *,
          width: int) -> Any:
    """Horizontal bars, the baseline (first, gray) on top, each labelled with its value and change
    as `tracekit whatif` prints them ("44.423 ms (-2.2%)")."""
    base = values[0] if values and values[0] == values[0] else None
    delta = ["" if i == 0 or not base else f"({(v - base) / base:+.1%})" for i, v in enumerate(values)]
    top = max((v for v in values if v == v), default=1.0) or 1.0
    p = figure(width=width, height=_hsize(labels), y_range=FactorRange(*reversed(labels)), title=title,
               x_range=Range1d(0, top * 1.55), x_axis_label=unit, tools="save", toolbar_location="right")
    style(p)
    p.ygrid.grid_line_color = None
    src = ColumnDataSource({"label_": list(labels), "name": list(names), "v": list(values), "delta": delta,
                            "color": ["#9A9A9A"] + ["#0072B2"] * (len(names) - 1),
                            "label": [f" {v:.3f} {unit} {d}".rstrip() for v, d in zip(values, delta, strict=True)]})
    p.hbar(y="label_", right="v", height=0.7, source=src, fill_color="color", line_color=None)
    p.text(x="v", y="label_", text="label", source=src, text_align="left", text_baseline="middle",
           text_font_size="9pt")
    p.add_tools(HoverTool(tooltips=[("scenario", "@name"), ("value", f"@v{{0,0.000}} {unit}"),
                                    ("vs baseline", "@delta")]))
    return p


def _scale_plot(points: Sequence[D.ScalePoint], *, width: int) -> Any:
    """Step time against simulated GPUs (log 2 axis): the baseline at the traced size (gray), then
    each scale scenario."""
    p = figure(width=width, height=320, x_axis_type="log", title="Step time against GPUs (scale scenarios)",
               x_axis_label="simulated GPUs", y_axis_label="step (ms, mean over steps)", tools="save,hover",
               toolbar_location="right", tooltips=[("scenario", "@scenario"), ("GPUs", "@gpus"),
                                                   ("step", "@step_ms{0,0.000} ms")])
    style(p)
    src = ColumnDataSource({"gpus": [int(x.gpus) for x in points], "step_ms": [x.step_ms for x in points],
                            "scenario": [str(x.scenario) for x in points],
                            "color": ["#9A9A9A" if x.scenario == "baseline" else "#0072B2" for x in points]})
    p.line("gpus", "step_ms", source=src, color="#0072B2", line_width=2)
    p.scatter("gpus", "step_ms", source=src, color="color", size=9)
    return p


def _stacked(title: str, labels: Sequence[str], names: Sequence[str], per_name: Mapping[str, Mapping[str, float]],
             keys: Sequence[str], unit: str, *, width: int) -> Any:
    """Horizontal bars stacked by dim, the baseline on top."""
    p = figure(width=width, height=_hsize(labels), y_range=FactorRange(*reversed(labels)), title=title,
               x_axis_label=unit, tools="save", toolbar_location="right")
    style(p)
    p.ygrid.grid_line_color = None
    data: dict[str, Any] = {"label_": list(labels), "name": list(names)}
    for k in keys:
        data[k] = [float(per_name.get(n, {}).get(k, 0.0)) for n in names]
    colors = [D.DIM_COLORS.get(k, D.STORAGE_COLOR) for k in keys]
    rs = p.hbar_stack(list(keys), y="label_", height=0.7, color=colors, source=ColumnDataSource(data), line_color=None)
    p.add_layout(Legend(items=[LegendItem(label=D.DIM_LABELS.get(k, k), renderers=[r]) for k, r in zip(keys, rs,
                                                                                                   strict=True)],
                        label_text_font_size="8pt", border_line_color=None), "right")
    p.add_tools(HoverTool(tooltips=[("scenario", "@name"), *((k, f"@{{{k}}}{{0,0.000}} {unit}") for k in keys)]))
    p.x_range.start = 0
    return p


def _ep_load(ep: D.EPLoad, *, width: int) -> Any:
    """Bytes each rank received, before (gray) and after (green) side by side."""
    from bokeh.transform import dodge

    ranks = [f"r{r}" for r in ep.ranks]
    p = figure(width=width, height=320, x_range=FactorRange(*ranks), tools="save", toolbar_location="right",
               title="EP load per rank", y_axis_label="GB received over the run")
    style(p)
    p.xgrid.grid_line_color = None
    p.xaxis.major_label_orientation = 1.2 if len(ranks) > 32 else 0
    src = ColumnDataSource({"rank": ranks, "before": list(ep.before_gb), "after": list(ep.after_gb)})
    p.vbar(x=dodge("rank", -0.18, range=p.x_range), top="before", width=0.34, source=src, fill_color="#9A9A9A",
           line_color=None, legend_label="before")
    p.vbar(x=dodge("rank", 0.18, range=p.x_range), top="after", width=0.34, source=src,
           fill_color=D.DIM_COLORS["EP"], line_color=None, legend_label="after")
    p.legend.label_text_font_size = "8pt"
    p.legend.border_line_color = None
    p.add_tools(HoverTool(tooltips=[("rank", "@rank"), ("before", "@before{0,0.000} GB"),
                                    ("after", "@after{0,0.000} GB")]))
    p.y_range.start = 0
    return p


def _placement_grid(grid: D.PlacementGrid, title: str, moved: set[int]) -> Any:
    hosts = list(reversed(grid.hosts))
    p = figure(width=max(260, 70 * grid.gpus + 140), height=max(160, 34 * len(hosts) + 70),
               x_range=FactorRange(*[str(g) for g in range(grid.gpus)]), y_range=FactorRange(*hosts),
               title=title, x_axis_label="GPU", tools="save", toolbar_location=None)
    style(p, title_size="10pt")
    p.xgrid.grid_line_color = None
    p.ygrid.grid_line_color = None
    src = ColumnDataSource({"gpu": [str(g) for g in grid.gpu], "host": [grid.hosts[h] for h in grid.host],
                            "rank": [str(r) for r in grid.rank],
                            "color": ["#E69F00" if r in moved else "#CFE3F3" for r in grid.rank]})
    p.rect(x="gpu", y="host", width=0.92, height=0.85, source=src, fill_color="color", line_color="#ffffff")
    p.text(x="gpu", y="host", text="rank", source=src, text_align="center", text_baseline="middle",
           text_font_size="10pt")
    p.add_tools(HoverTool(tooltips=[("rank", "@rank"), ("host", "@host"), ("GPU", "@gpu")]))
    return p


def whatif_figures(wd: D.WhatIfData, *, width: int = 1400) -> LayoutDOM:
    """Scenario vs baseline step and exposed time, inter-host traffic by dim, EP load per rank,
    placement grids, and the north-south transfers, from `viz.data.whatif_data`; for a run the network
    model does not apply to, the sentence that says so."""
    if wd.not_modelled:
        said = "".join(f"<div class='warn'>{_esc(f.text)}</div>" for f in wd.not_modelled)
        return html_div(f"<h2>What-if on {_esc(wd.topology)}</h2>{said}", width=width)
    names = wd.names
    bar_w = width // 2 - 20
    head = (f"<p>On <b>{_esc(wd.topology)}</b>: {_esc(wd.comparison)}.</p>"
            + (f"<p class='muted'>Replay error of the baseline (cross-validated, per collective): median "
               f"{100 * float(wd.error_median):.1f}%, p90 {100 * float(wd.error_p90 or 0):.1f}%; the scenarios "
               "carry it plus the model's limits.</p>" if isinstance(wd.error_median, (int, float)) else "")
            + "".join(f"<div class='note'>{_esc(c)}</div>" for c in wd.cautions or []))
    labels = wd.labels
    parts: list[Any] = [html_div(head, width=width),
                        row(_bars("Step time (mean over steps)", labels, names, wd.step_ms, "ms", width=bar_w),
                            _stacked("Exposed communication per step", labels, names, wd.exposed_ms, wd.dims,
                                     "ms", width=bar_w))]
    if wd.scale:
        parts.append(_scale_plot(wd.scale, width=bar_w))
    if wd.traffic_dims:
        parts.append(_stacked("Inter-host traffic by dim", labels, names, wd.traffic_gb, wd.traffic_dims,
                              "GB leaving hosts through their NICs, over the run", width=bar_w))
    for ep in wd.ep:
        text = []
        if ep.imbalance:
            text.append(f"max/mean {ep.imbalance[0]:.2f} &rarr; {ep.imbalance[1]:.2f} (worst EP group)")
        if ep.a2a_ms:
            text.append(f"EP all-to-all per instance (mean) {ep.a2a_ms[0]:.3f} ms &rarr; {ep.a2a_ms[1]:.3f} ms")
        if ep.truncated:
            text.append(f"first {len(ep.ranks)} ranks shown")
        parts.append(html_div(f"<h3>{_esc(ep.scenario)}</h3><p>{'; '.join(text)}</p>", width=width))
        parts.append(_ep_load(ep, width=min(width, 240 + 40 * len(ep.ranks))))
    for g in wd.grids:
        moved = set(g.moved)
        parts.append(html_div(f"<h3>{_esc(g.scenario)}: rank &rarr; host</h3><p class='muted'>"
                              "Each cell is a GPU, labelled with the rank on it; orange: a rank on another host "
                              "or GPU than traced.</p>", width=width))
        parts.append(row(_placement_grid(g.before, "traced", set()), _placement_grid(g.after, "scenario", moved)))
    for g in wd.gantt or []:
        share = (f" DualPipe's paired chunks overlap one's communication with the other's compute; the communication "
                 f"takes {g.sm_share:.3f} of the SMs while it runs." if any(
                     "dualpipe" in r.title for r in g.runs) else "")
        parts.append(html_div(f"<h3>{_esc(g.scenario)}: pipeline schedule</h3><p class='muted'>Each bar is a "
                              "chunk (F forward, B backward, Bi input gradient, W weight gradient, FB a forward and "
                              "a backward run together); the red band behind is the stage's bubble (idle, waiting "
                              f"for another stage), summed at the right.{share}</p>", width=width))
        longest = max(r.span_ms for r in g.runs)
        parts.append(column(*(_gantt(r, width=width, span_ms=longest) for r in g.runs)))
    rows = []
    for st in wd.storage:
        worst = st.worst
        ckpt = "-" if st.checkpoint_ms is None else f"{st.checkpoint_ms:.3f} ms"
        rows.append(f"<tr><td>{_esc(st.scenario)}</td><td>{_esc(st.network)}</td>"
                    f"<td class='num'>{ckpt}</td>"
                    f"<td class='num'>{st.slowed}</td><td>"
                    + ("-" if worst is None else _esc(f"{worst.op} {worst.dim} group {worst.group} seq "
                                                      f"{worst.seq}: {worst.baseline_ms:.3f} ms -> "
                                                      f"{worst.scenario_ms:.3f} ms"))
                    + "</td></tr>")
    if rows:
        parts.append(html_div("<h3>North-south transfers</h3><table><tr><th>scenario</th><th>network</th>"
                              "<th>checkpoint</th><th>collectives slowed</th><th>worst</th></tr>" + "".join(rows)
                              + "</table>", width=width))
    notes = "".join(f"<li><b>{_esc(name)}</b><ul>{''.join(f'<li>{_esc(n)}</li>' for n in ns)}</ul></li>"
                    for name, ns in wd.notes.items() if ns)
    if notes:
        parts.append(html_div(f"<h3>Assumptions</h3><ul>{notes}</ul>", width=width))
    return column(*parts)


def traced_pipeline(g: D.Gantt, *, width: int) -> LayoutDOM:
    """The traced pipeline schedule as a Gantt chart (`viz.data.traced_pipeline_gantt`)."""
    head = html_div("<h3>Pipeline schedule</h3><p class='muted'>Each bar is a stage's compute between two of its "
                    "PP transfers, labelled with the chunks the named schedule runs there (the compute before the "
                    "first transfer and after the last is left out); the bubble at the right is the analysis' "
                    "(idle plus receive waits in the stage's step window).</p>", width=width)
    return column(head, _gantt(g, width=width, span_ms=g.span_ms))


GANTT_COLORS = {"F": "#0072B2", "B": "#009E73", "Bi": "#56B4E9", "W": "#E69F00", "FB": "#CC79A7", "C": "#9A9A9A"}


def _gantt(g: D.Gantt, *, width: int, span_ms: float) -> Any:
    """One pipeline as a Gantt chart from `viz.data.pipeline_gantt`: a row per stage, a bar per
    chunk, the stage's span behind in red (what the chunks leave uncovered is the bubble); the x
    axis runs to `span_ms`, so the charts of one scenario compare."""
    stages = list(g.stages)
    p = figure(width=width, height=60 + 28 * len(stages), y_range=FactorRange(*reversed(stages)),
               title=g.title + (" (first chunks only)" if g.truncated else ""), x_axis_label="ms",
               x_range=Range1d(0, span_ms * 1.18 or 1.0), tools="xpan,xwheel_zoom,reset,save",
               toolbar_location="right")
    style(p)
    p.ygrid.grid_line_color = None
    band = ColumnDataSource({"stage": stages, "span": [g.span_ms] * len(stages),
                             "label": [f" bubble {b:.3f} ms" for b in g.bubble_ms]})
    p.hbar(y="stage", left=0, right="span", height=0.8, source=band, fill_color="#F4A6A6", line_color=None)
    p.text(x="span", y="stage", text="label", source=band, text_align="left", text_baseline="middle",
           text_font_size="9pt")
    src = ColumnDataSource({"stage": list(g.stage), "left": list(g.left_ms), "right": list(g.right_ms),
                            "kind": list(g.kind), "chunk": list(g.chunk), "exposed": list(g.exposed_ms),
                            "color": [GANTT_COLORS.get(k, "#9A9A9A") for k in g.kind]})
    bars = p.hbar(y="stage", left="left", right="right", height=0.8, source=src, fill_color="color",
                  line_color="white", line_width=0.5)
    p.add_tools(HoverTool(renderers=[bars], tooltips=[("chunk", "@chunk"), ("stage", "@stage"),
                                                      ("ms", "@left{0.000} - @right{0.000}"),
                                                      ("exposed comm", "@exposed{0.000} ms")]))
    return p


# ---------------------------------------------------------------------------------------------
# nccl-tests: predicted against measured per file


def microbench_figures(md: D.MicrobenchData, *, width: int = 1400) -> LayoutDOM:
    """Per nccl-tests file, busbw by size: measured (solid) and predicted on the topology (dashed), one
    colour per table, with each table's health sentence (and its latency-floor sentence) above the plot."""
    blocks: list[Any] = []
    notes = "".join(f"<div class='note'>{_esc(t)}</div>" for t in md.findings)
    blocks.append(html_div(f"<h2>nccl-tests replayed on {_esc(md.topology)}</h2>{notes}", width=width))
    for f in md.files:
        said = "".join(f"<div class='{'warn' if t.verdict == 'degraded' else 'note'}'>{_esc(t.sentence)}</div>"
                       + (f"<div class='note'>{_esc(t.floor)}</div>" if t.floor else "")
                       for t in f.tables)
        blocks.append(html_div(f"<h3>{_esc(f.file)}</h3>{said}", width=width))
        p = figure(width=min(width, 1000), height=420, x_axis_type="log", y_axis_type="log",
                   title=f"{f.file}: busbw by size, measured (solid) and predicted (dashed)"[:160],
                   x_axis_label="size (bytes)", y_axis_label="busbw (GB/s)", tools="box_zoom,wheel_zoom,reset,save")
        style(p)
        items = []
        for i, t in enumerate(f.tables):
            if not t.size_bytes:
                continue
            color = LINE_COLORS[i % len(LINE_COLORS)]
            src = ColumnDataSource({"x": t.size_bytes, "size": t.size, "measured": t.measured,
                                    "predicted": t.predicted, "table": [t.label] * len(t.size)})
            m = p.line("x", "measured", source=src, color=color, line_width=2)
            ms = p.scatter("x", "measured", source=src, color=color, size=6)
            q = p.line("x", "predicted", source=src, color=color, line_width=2, line_dash="dashed")
            items.append(LegendItem(label=t.label, renderers=[m, ms, q]))
        p.add_tools(HoverTool(tooltips=[("table", "@table"), ("size", "@size"),
                                        ("measured", "@measured{0,0.0} GB/s"),
                                        ("predicted", "@predicted{0,0.0} GB/s")]))
        if items:
            p.add_layout(Legend(items=items, click_policy="hide", label_text_font_size="8pt",
                                border_line_color=None), "right")
        blocks.append(p)
    return column(*blocks)
