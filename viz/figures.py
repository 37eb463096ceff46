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

from tracekit.viz import data as D
from tracekit.viz._bokeh import esc as _esc
from tracekit.viz._bokeh import html_div, lookup, note_div, style

LINE_COLORS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")
MARKERS = ("circle", "triangle", "square", "diamond", "inverted_triangle", "hex")


def _rows_px(n: int, *, big: float = 18.0, total: float = 1400.0) -> float:
    return max(4.0, min(big, total / max(n, 1)))


# ---------------------------------------------------------------------------------------------
# Overlap


def overlap_figure(ov: Mapping[str, Any], *, width: int = 1400) -> LayoutDOM:
    """Hidden vs exposed communication per rank and dim (ms per step), stacked per rank."""
    cols = ov["columns"]
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
    for dim in ov["dims"]:
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
    tot = ov["totals_ms"]
    nranks = max(len(ov["ranks"]), 1)
    parts = [f"<b>{_esc(D.DIM_LABELS[d])}</b> {h / nranks + e / nranks:.2f} ms "
             f"({e / nranks:.2f} ms exposed, {100 * e / max(h + e, 1e-12):.0f}%)" for d, (h, e) in tot.items()]
    text = ("<p>Mean per rank and step: " + "; ".join(parts) + ". Exposed communication is the part no "
            "compute overlaps: it adds to the step time.</p>")
    return column(html_div(text, width=width), p)


# ---------------------------------------------------------------------------------------------
# EP


def ep_figures(ep: Mapping[str, Any], analysis_ep: Sequence[Mapping[str, Any]] | None = None, *,
               width: int = 1400) -> LayoutDOM:
    """The EP traffic matrix (src x dst, MB) and the bytes each rank receives."""
    labels = ep["labels"]
    n = len(labels)
    mat = np.asarray(ep["matrix_bytes"]) / 1e6
    src_i, dst_i = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    side = int(min(640, max(400, 16 * n + 120)))
    mapper = LinearColorMapper(palette=Viridis256, low=0.0, high=float(mat.max()) or 1.0)
    m = figure(width=side + 90, height=side, x_range=FactorRange(*labels), y_range=FactorRange(*labels[::-1]),
               title="EP traffic: MB sent, source to destination", x_axis_label="destination rank",
               y_axis_label="source rank", tools="box_zoom,reset,save", toolbar_location="right")
    style(m)
    m.grid.grid_line_color = None
    m.xaxis.major_label_orientation = 1.0
    if n > 40:
        m.xaxis.major_label_text_font_size = "0pt"
        m.yaxis.major_label_text_font_size = "0pt"
    cells = ColumnDataSource({"src": [labels[i] for i in src_i.ravel()], "dst": [labels[j] for j in dst_i.ravel()],
                              "mb": mat.ravel()})
    m.rect(x="dst", y="src", width=1, height=1, source=cells, line_color=None,
           fill_color={"field": "mb", "transform": mapper})
    m.add_tools(HoverTool(tooltips=[("from", "@src"), ("to", "@dst"), ("MB", "@mb{0,0.00}")]))
    m.add_layout(ColorBar(color_mapper=mapper, ticker=BasicTicker(), title="MB", width=10,
                          label_standoff=6), "right")

    recv = np.asarray(ep["recv_bytes"]) / 1e6
    hot = ep["hot"]
    hot_set = {hot} | {f"r{g.get('hot_rank')}" for g in (analysis_ep or []) if g.get("hot_rank") is not None}
    colors = [D.DIM_COLORS["TP"] if lab in hot_set else D.DIM_COLORS["EP"] for lab in labels]
    b = figure(width=max(width - side - 120, 420), height=side, x_range=FactorRange(*labels),
               title=f"Bytes received per rank (vermillion: hot ranks). Hottest: {hot}, "
                     f"{ep['imbalance']:.2f}x the mean",
               x_axis_label="rank", y_axis_label="MB received", tools="box_zoom,reset,save",
               toolbar_location="right")
    style(b)
    b.xgrid.grid_line_color = None
    b.xaxis.major_label_orientation = 1.0
    if n > 40:
        b.xaxis.major_label_text_font_size = "0pt"
    src = ColumnDataSource({"rank": labels, "mb": recv, "sent": np.asarray(ep["sent_bytes"]) / 1e6, "color": colors})
    b.vbar(x="rank", top="mb", width=0.8, source=src, fill_color="color", line_color=None)
    b.add_layout(Span(location=float(recv.mean()), dimension="width", line_color="#333333", line_dash="dashed"))
    b.add_tools(HoverTool(tooltips=[("rank", "@rank"), ("received", "@mb{0,0.00} MB"),
                                    ("sent", "@sent{0,0.00} MB")]))
    b.y_range.start = 0
    head = (f"<p>{ep['calls']:,} all-to-all calls. The dashed line is the mean load; the hottest rank is "
            f"<b>{_esc(hot)}</b>, receiving {ep['imbalance']:.2f}x the mean ({100 * ep['hot_share']:.1f}% of all "
            f"all-to-all bytes).</p>")
    if ep.get("block", 1) > 1:
        head += f"<p class='muted'>Ranks are grouped in blocks of {ep['block']} to keep the matrix readable.</p>"
    if analysis_ep:
        rows = "".join(
            f"<tr><td>{_esc(g.get('group'))}</td><td class='num'>{len(g.get('ranks') or [])}</td>"
            f"<td>r{_esc(g.get('hot_rank'))}</td><td class='num'>{100 * float(g.get('hot_share') or 0):.1f}%</td>"
            f"<td class='num'>{float(g.get('imbalance') or 0):.2f}x</td>"
            f"<td class='num'>{100 * float(g.get('inter_host_share') or 0):.0f}%</td></tr>"
            for g in sorted(analysis_ep, key=lambda g: -float(g.get("imbalance") or 0))[:12])
        head += ("<h3>EP groups, most imbalanced first</h3><table><tr><th>group</th><th>ranks</th><th>hot rank</th>"
                 "<th>hot share</th><th>imbalance (max/mean)</th><th>inter-host bytes</th></tr>" + rows + "</table>")
    return column(html_div(head, width=width), row(m, b))


# ---------------------------------------------------------------------------------------------
# Links


def link_figures(ld: Mapping[str, Any], *, width: int = 1400) -> LayoutDOM:
    """Link utilisation heatmaps (telemetry and replay side by side, one colour scale) and the
    busiest links as lines."""
    links = ld["links"]
    nl = len(links)
    origins = ld["origins"]
    mapper = LinearColorMapper(palette=Viridis256, low=0.0, high=1.0, nan_color="#ffffff")
    px = _rows_px(nl, big=16, total=700)
    each = int((width - 120) / max(len(origins), 1))
    y_range = Range1d(-0.5, nl - 0.5)  # busiest link at the top: row j is drawn at y = nl - 1 - j
    overrides = {nl - 1 - j: name for j, name in enumerate(links)}
    figs = []
    link_fmt = lookup(links[::-1])
    # heatmaps on the run's clock share one x range (pan one, the others follow)
    aligned = [ld["grids"][o] for o in origins if ld["grids"][o].get("aligned")]
    shared = Range1d(min(g["x0_ms"] for g in aligned), max(g["x0_ms"] + g["dw_ms"] for g in aligned)) \
        if len(aligned) > 1 else None
    for i, origin in enumerate(origins):
        g = ld["grids"][origin]
        kind = "telemetry" if origin == "telemetry" else f"replay on {origin.split(':', 1)[-1]}"
        f = figure(width=each + (190 if i == 0 else 0), height=max(260, int(nl * px) + 90), y_range=y_range,
                   x_range=shared if shared is not None and g.get("aligned") else Range1d(
                       g["x0_ms"], g["x0_ms"] + g["dw_ms"]), title=f"Link utilisation: {kind}",
                   x_axis_label="time (ms)" + (" since run start" if g.get("aligned") else ""),
                   tools="xpan,xwheel_zoom,box_zoom,reset,save", toolbar_location="right")
        style(f)
        f.grid.grid_line_color = None
        f.image(image=[np.asarray(g["grid"])[::-1]], x=g["x0_ms"], y=-0.5, dw=g["dw_ms"], dh=nl,
                color_mapper=mapper)
        f.yaxis.ticker = FixedTicker(ticks=list(range(nl)))
        f.yaxis.major_label_overrides = overrides
        f.yaxis.major_label_text_font_size = "8pt" if px >= 8 else "0pt"
        if i:
            f.yaxis.visible = False
        f.add_tools(HoverTool(tooltips=[("link", "$y{link}"), ("time", "$x{0,0.000} ms"),
                                        ("utilisation", "@image{0.0%}")], formatters={"$y": link_fmt}))
        figs.append(f)
    figs[-1].add_layout(ColorBar(color_mapper=mapper, title="utilisation", width=10,
                                 formatter=NumeralTickFormatter(format="0%")), "right")

    lines = figure(width=width, height=300, title="Busiest links over time (solid: telemetry, dashed: replay)",
                   x_axis_label="time (ms)", y_axis_label="utilisation", tools="xpan,xwheel_zoom,box_zoom,reset,save")
    style(lines)
    lines.yaxis.formatter = NumeralTickFormatter(format="0%")
    lines.y_range.start = 0
    items = []
    color_of: dict[str, str] = {}
    for origin in origins:
        for name, series in ld["lines"].get(origin, {}).items():
            color = color_of.setdefault(name, LINE_COLORS[len(color_of) % len(LINE_COLORS)])
            src = ColumnDataSource({"x": series["x"], "util": series["util"], "link": [name] * len(series["x"]),
                                    "origin": [origin] * len(series["x"])})
            r = lines.line(x="x", y="util", source=src, color=color, line_width=1.6,
                           line_dash="solid" if origin == "telemetry" else "dashed")
            items.append(LegendItem(label=f"{name} ({origin})"[:70], renderers=[r]))
    lines.add_tools(HoverTool(tooltips=[("link", "@link"), ("source", "@origin"), ("time", "@x{0,0.000} ms"),
                                        ("utilisation", "@util{0.0%}")]))
    lines.add_layout(Legend(items=items, click_policy="hide", label_text_font_size="8pt", border_line_color=None),
                     "right")
    parts = [x for x in (note_div(ld.get("notes") or [], width=width), row(*figs), lines) if x is not None]
    return column(*parts)


# ---------------------------------------------------------------------------------------------
# Replay


def replay_figures(rd: Mapping[str, Any], *, width: int = 1400) -> LayoutDOM:
    """Step time per topology, traced vs replayed per instance, and exposed comm per topology."""
    topo = rd["topologies"]
    traced = [x for x in rd["traced_step_ms"] if x == x]
    cats = (["traced"] if traced else []) + topo
    vals = ([float(np.mean(traced))] if traced else []) + list(rd["replayed_step_ms"])
    base = vals[0] if traced else None
    delta = [("" if base in (None, 0) or (i == 0 and traced) else f"{100 * (v / base - 1):+.0f}%")
             for i, v in enumerate(vals)]
    colors = ["#9A9A9A" if (traced and i == 0) else "#0072B2" for i in range(len(cats))]
    s = figure(width=min(560, 140 + 110 * len(cats)), height=380, x_range=FactorRange(*cats),
               title="Step time per topology", y_axis_label="mean step time (ms)", tools="save",
               toolbar_location="right")
    style(s)
    s.xgrid.grid_line_color = None
    s.xaxis.major_label_orientation = 0.5 if len(cats) > 3 else 0
    src = ColumnDataSource({"topology": cats, "ms": vals, "delta": delta, "color": colors,
                            "label": [f"{v:.2f} ms {d}".strip() for v, d in zip(vals, delta, strict=True)]})
    s.vbar(x="topology", top="ms", width=0.7, source=src, fill_color="color", line_color=None)
    s.text(x="topology", y="ms", text="label", source=src, text_align="center", text_baseline="bottom",
           text_font_size="9pt", y_offset=-2)
    s.add_tools(HoverTool(tooltips=[("topology", "@topology"), ("step", "@ms{0,0.000} ms"), ("vs traced", "@delta")]))
    s.y_range.start = 0
    s.y_range.range_padding = 0.15

    inst = rd["instances"]
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
                items.append(LegendItem(label=f"{D.DIM_LABELS[dim]} on {name}"[:60], renderers=[r]))
        sc.add_tools(HoverTool(tooltips=[("topology", "@topology"), ("group", "@group"), ("seq", "@seq"),
                                         ("op", "@op"), ("dim", "@dim"), ("traced", "@traced_ms{0,0.000} ms"),
                                         ("replayed", "@replayed_ms{0,0.000} ms")]))
        sc.add_layout(Legend(items=items, click_policy="hide", label_text_font_size="8pt", border_line_color=None),
                      "right")

    figs: list[Any] = [s, sc]
    exposed = rd.get("exposed_ms") or {}
    dims = [d for d in D.DIM_ORDER if any(d in exposed.get(t, {}) for t in topo)]
    if dims:
        e = figure(width=min(520, 160 + 90 * len(topo)), height=380, x_range=FactorRange(*topo),
                   title="Exposed comm per step", y_axis_label="ms per step", tools="save",
                   toolbar_location="right")
        style(e)
        e.xgrid.grid_line_color = None
        e.xaxis.major_label_orientation = 0.5 if len(topo) > 2 else 0
        data: dict[str, Any] = {"topology": topo}
        for d in dims:
            data[d] = [exposed.get(t, {}).get(d, 0.0) for t in topo]
        rs = e.vbar_stack(dims, x="topology", width=0.7, color=[D.DIM_COLORS[d] for d in dims],
                          source=ColumnDataSource(data), line_color=None)
        e.add_layout(Legend(items=[LegendItem(label=D.DIM_LABELS[d], renderers=[r]) for d, r in zip(dims, rs,
                                                                                               strict=True)],
                            label_text_font_size="8pt", border_line_color=None), "right")
        e.y_range.start = 0
        figs.append(e)

    rows_html = []
    errors = {(med, p90) for med, p90 in zip(rd["error_median"], rd["error_p90"], strict=True) if med is not None}
    for name, med, p90 in zip(topo, rd["error_median"], rd["error_p90"], strict=True):
        if med is not None:
            label = "the baseline replay" if len(errors) == 1 else f"<b>{_esc(name)}</b>"
            rows_html.append(f"<li>Replay error of {label} (the observed network replayed against the trace, "
                             "cross-validated: each collective predicted without its own step or itself): "
                             f"median {100 * float(med):.1f}%, p90 {100 * float(p90 or 0):.1f}% per collective.</li>")
            if len(errors) == 1:
                break
    hot = rd.get("hot_links") or []
    text = ""
    if rows_html:
        text += "<ul>" + "".join(rows_html) + "</ul>"
    if hot:
        text += ("<h3>Hottest links in the replay</h3><table><tr><th>topology</th><th>link</th><th>peak</th>"
                 "<th>mean</th><th>bytes</th></tr>" + "".join(
                     f"<tr><td>{_esc(h['topology'])}</td><td>{_esc(h.get('link'))}</td>"
                     f"<td class='num'>{100 * float(h.get('peak_util') or 0):.0f}%</td>"
                     f"<td class='num'>{100 * float(h.get('mean_util') or 0):.0f}%</td>"
                     f"<td class='num'>{_esc(D.fmt_bytes(h.get('bytes')))}</td></tr>" for h in hot) + "</table>")
    parts: list[Any] = [row(figs[0], *figs[2:]), figs[1]]
    if text:
        parts.append(html_div(text, width=width))
    return column(*parts)


# ---------------------------------------------------------------------------------------------
# Hang


def _lag_color(lag: int, max_lag: int) -> tuple[str, str]:
    if lag <= 0:
        return "#d9f0e3", "#1b5e20"
    steps = ("#fde0b2", "#f9b26b", "#e9772f", "#c0392b")
    i = min(len(steps) - 1, int((len(steps) - 1) * (lag - 1) / max(max_lag - 1, 1)))
    return steps[i], "#000000" if i < 2 else "#ffffff"


def hang_div(hd: Mapping[str, Any], *, width: int = 1400) -> LayoutDOM:
    """Per group, each rank's last sequence number, coloured by how far it lags the furthest."""
    parts = ["<h2>Where each rank stopped</h2><p>Each cell is a rank and the last collective sequence number "
             "it reached in that group. Green: reached the furthest seq; orange to red: behind it (the likely "
             "culprits are the ranks that are behind, or the ones the others wait for).</p>"]
    for g in sorted(hd["groups"], key=lambda g: (-max(g["lag"]), g["group"])):
        cells = []
        for r, seq, lag in zip(g["ranks"], g["last_seq"], g["lag"], strict=True):
            bg, fg = _lag_color(lag, hd["max_lag"])
            cells.append(f'<span class="cell" style="background:{bg};color:{fg}" '
                         f'title="rank {r}: last seq {seq}">r{r}<br>{seq}</span>')
        if g["behind"]:
            ahead = len(g["ranks"]) - len(g["behind"])
            who = ", ".join(str(r) for r in g["behind"][:20]) + (" ..." if len(g["behind"]) > 20 else "")
            verb = f"rank {who} is" if len(g["behind"]) == 1 else f"ranks {who} are"
            msg = f"{verb} behind; {ahead} rank{'s' if ahead != 1 else ''} reached seq {g['max_seq']}."
        else:
            msg = f"all {len(g['ranks'])} ranks reached seq {g['max_seq']}."
        parts.append(f"<h3>group {_esc(g['group'])}</h3><p>{_esc(msg)}</p><div>{''.join(cells)}</div>")
    return html_div("".join(parts), width=width)



# ---------------------------------------------------------------------------------------------
# What-if


def _hsize(names: Sequence[str]) -> int:
    return 90 + 34 * len(names)


def _bars(title: str, labels: Sequence[str], names: Sequence[str], values: Sequence[float], unit: str, *,
          width: int) -> Any:
    """Horizontal bars, the baseline (first, gray) on top, each labelled with its change."""
    base = values[0] if values and values[0] == values[0] else None
    delta = ["" if i == 0 or not base else f"{100 * (v / base - 1):+.1f}%" for i, v in enumerate(values)]
    p = figure(width=width, height=_hsize(labels), y_range=FactorRange(*reversed(labels)), title=title,
               x_axis_label=unit, tools="save", toolbar_location="right")
    style(p)
    p.ygrid.grid_line_color = None
    src = ColumnDataSource({"label_": list(labels), "name": list(names), "v": list(values), "delta": delta,
                            "color": ["#9A9A9A"] + ["#0072B2"] * (len(names) - 1),
                            "label": [f" {v:.2f} {unit} {d}".rstrip() for v, d in zip(values, delta, strict=True)]})
    p.hbar(y="label_", right="v", height=0.7, source=src, fill_color="color", line_color=None)
    p.text(x="v", y="label_", text="label", source=src, text_align="left", text_baseline="middle",
           text_font_size="9pt")
    p.add_tools(HoverTool(tooltips=[("scenario", "@name"), ("value", f"@v{{0,0.000}} {unit}"),
                                    ("vs baseline", "@delta")]))
    p.x_range.start = 0
    p.x_range.range_padding = 0.45
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


def _ep_load(ep: Mapping[str, Any], *, width: int) -> Any:
    """Bytes each rank received, before (gray) and after (green) side by side."""
    from bokeh.transform import dodge

    ranks = [f"r{r}" for r in ep["ranks"]]
    p = figure(width=width, height=320, x_range=FactorRange(*ranks), tools="save", toolbar_location="right",
               title="EP load per rank", y_axis_label="GB received over the run")
    style(p)
    p.xgrid.grid_line_color = None
    p.xaxis.major_label_orientation = 1.2 if len(ranks) > 32 else 0
    src = ColumnDataSource({"rank": ranks, "before": list(ep["before_gb"]), "after": list(ep["after_gb"])})
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


def _placement_grid(grid: Mapping[str, Any], title: str, moved: set[int]) -> Any:
    hosts = list(reversed(grid["hosts"]))
    p = figure(width=max(260, 70 * grid["gpus"] + 140), height=max(160, 34 * len(hosts) + 70),
               x_range=FactorRange(*[str(g) for g in range(grid["gpus"])]), y_range=FactorRange(*hosts),
               title=title, x_axis_label="GPU", tools="save", toolbar_location=None)
    style(p, title_size="10pt")
    p.xgrid.grid_line_color = None
    p.ygrid.grid_line_color = None
    src = ColumnDataSource({"gpu": [str(g) for g in grid["gpu"]], "host": [grid["hosts"][h] for h in grid["host"]],
                            "rank": [str(r) for r in grid["rank"]],
                            "color": ["#E69F00" if r in moved else "#CFE3F3" for r in grid["rank"]]})
    p.rect(x="gpu", y="host", width=0.92, height=0.85, source=src, fill_color="color", line_color="#ffffff")
    p.text(x="gpu", y="host", text="rank", source=src, text_align="center", text_baseline="middle",
           text_font_size="10pt")
    p.add_tools(HoverTool(tooltips=[("rank", "@rank"), ("host", "@host"), ("GPU", "@gpu")]))
    return p


def whatif_figures(wd: Mapping[str, Any], *, width: int = 1400) -> LayoutDOM:
    """Scenario vs baseline step and exposed time, inter-host traffic by dim, EP load per rank,
    placement grids, and the north-south transfers, from `viz.data.whatif_data`."""
    names = wd["names"]
    bar_w = width // 2 - 20
    err = wd.get("replay_error") or {}
    head = (f"<p>On <b>{_esc(wd['topology'])}</b>: {_esc(wd['comparison'])}.</p>"
            + (f"<p class='muted'>Replay error of the baseline (cross-validated, per collective): median "
               f"{100 * float(err['median']):.1f}%, p90 {100 * float(err.get('p90') or 0):.1f}%; the scenarios "
               "carry it plus the model's limits.</p>" if isinstance(err.get("median"), (int, float)) else "")
            + "".join(f"<div class='note'>{_esc(c)}</div>" for c in wd.get("cautions") or []))
    labels = wd["labels"]
    parts: list[Any] = [html_div(head, width=width),
                        row(_bars("Step time (mean over steps)", labels, names, wd["step_ms"], "ms", width=bar_w),
                            _stacked("Exposed communication per step", labels, names, wd["exposed_ms"], wd["dims"],
                                     "ms", width=bar_w))]
    if wd["traffic_dims"]:
        parts.append(_stacked("Inter-host traffic by dim (bytes leaving hosts through their NICs)", labels, names,
                              wd["traffic_gb"], wd["traffic_dims"], "GB", width=bar_w))
    for ep in wd["ep"]:
        text = []
        if ep["imbalance"]:
            text.append(f"max/mean {ep['imbalance'][0]:.2f} &rarr; {ep['imbalance'][1]:.2f} (worst EP group)")
        if ep["a2a_ms"]:
            text.append(f"all-to-all per instance {ep['a2a_ms'][0]:.3f} &rarr; {ep['a2a_ms'][1]:.3f} ms")
        if ep["truncated"]:
            text.append(f"first {len(ep['ranks'])} ranks shown")
        parts.append(html_div(f"<h3>{_esc(ep['scenario'])}</h3><p>{'; '.join(text)}</p>", width=width))
        parts.append(_ep_load(ep, width=min(width, 240 + 40 * len(ep["ranks"]))))
    for g in wd["grids"]:
        moved = set(g["moved"])
        parts.append(html_div(f"<h3>{_esc(g['scenario'])}: rank &rarr; host</h3><p class='muted'>"
                              f"{len(moved)} rank(s) moved (orange).</p>", width=width))
        parts.append(row(_placement_grid(g["before"], "traced", set()), _placement_grid(g["after"], "scenario", moved)))
    rows = []
    for st in wd["storage"]:
        worst = st["worst"]
        ckpt = "-" if st["checkpoint_ms"] is None else f"{st['checkpoint_ms']:.2f} ms"
        rows.append(f"<tr><td>{_esc(st['scenario'])}</td><td>{_esc(st['network'])}</td>"
                    f"<td class='num'>{ckpt}</td>"
                    f"<td class='num'>{st['slowed']}</td><td>"
                    + ("-" if worst is None else _esc(f"{worst['op']} {worst['dim']} group {worst['group']} seq "
                                                      f"{worst['seq']}: {worst['baseline_ms']:.3f} -> "
                                                      f"{worst['scenario_ms']:.3f} ms"))
                    + "</td></tr>")
    if rows:
        parts.append(html_div("<h3>North-south transfers</h3><table><tr><th>scenario</th><th>network</th>"
                              "<th>checkpoint</th><th>collectives slowed</th><th>worst</th></tr>" + "".join(rows)
                              + "</table>", width=width))
    notes = "".join(f"<li><b>{_esc(name)}</b><ul>{''.join(f'<li>{_esc(n)}</li>' for n in ns)}</ul></li>"
                    for name, ns in wd["notes"].items() if ns)
    if notes:
        parts.append(html_div(f"<h3>Assumptions</h3><ul>{notes}</ul>", width=width))
    return column(*parts)
