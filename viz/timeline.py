"""The timeline: one row per rank on the aligned clock, with a range selector over the whole run.

Each rank's row has a compute lane (gray, top) and a communication lane (coloured by dim,
bottom); the part of a collective spent waiting for the last participant is hatched. Levels of
detail precomputed by `viz.data.timeline_data` are swapped in by a CustomJS callback as the view
narrows (a static file cannot ask a server), and each swap keeps only the bars near the view.
"""

from __future__ import annotations

from typing import Any

from bokeh.layouts import column
from bokeh.models import (
    BoxAnnotation,
    ColumnDataSource,
    CustomJS,
    Div,
    FixedTicker,
    HoverTool,
    Label,
    Legend,
    LegendItem,
    LinearAxis,
    Range1d,
    RangeTool,
    Span,
)
from bokeh.models.layouts import LayoutDOM
from bokeh.plotting import figure

from tracekit.viz import data as D
from tracekit.viz._bokeh import bytes_fmt, duration_fmt, gbps_fmt, lookup, note_div, rank_fmt, seq_fmt, style

LOD_JS = """
if (cb_obj.__tk_timer != null) clearTimeout(cb_obj.__tk_timer);
cb_obj.__tk_timer = setTimeout(() => {
  const start = xr.start, end = xr.end, w = end - start;
  const want = 2 * w / width_px;
  let k = level_px.length - 1;
  for (let i = 0; i < level_px.length; i++) { if (level_px[i] <= want) { k = i; break; } }
  const lo = start - w, hi = end + w;
  for (const [name, src] of Object.entries(shown)) {
    if (src.__tk_full == null) src.__tk_full = src.data;
    const full = k == 0 ? src.__tk_full : (finer[k - 1][name] ? finer[k - 1][name].data : null);
    if (full == null) continue;
    const x0 = full.x0, x1 = full.x1, idx = [];
    for (let i = 0; i < x0.length; i++) { if (x1[i] >= lo && x0[i] <= hi) idx.push(i); }
    if (k == 0 && idx.length == x0.length) {
      if (src.data !== full) src.data = full;
      continue;
    }
    const out = {};
    for (const key of Object.keys(full)) {
      const col = full[key];
      out[key] = Array.from(idx, (i) => col[i]);
    }
    src.data = out;
  }
  info.text = k == 0 ? "" : `detail level ${k + 1} of ${level_px.length}`;
}, 60);
"""


def _row_px(nrows: int) -> float:
    if nrows <= 16:
        return 26.0
    if nrows <= 64:
        return 16.0
    return max(2.0, min(12.0, 1500.0 / nrows))


def _tooltips(layer: str) -> list[tuple[str, str]]:
    if layer == "compute":
        return [("kernel", "@name_id{name}"), ("rank", "@y{rank}"), ("start", "@x0{0,0.000} ms"),
                ("duration", "@dur_ns{dur}"), ("intervals", "@count"), ("busy", "@busy{0%}")]
    return [("name", "@name_id{name}"), ("op", "@op"), ("group", "@group"), ("seq", "@seq{seq}"),
            ("rank", "@y{rank}"), ("start", "@x0{0,0.000} ms"), ("bytes", "@bytes{bytes}"),
            ("duration", "@dur_ns{dur}"), ("busbw", "@busbw{gbps}"),
            ("waited", "@wait_ns{dur}"), ("waited for", "@waited_on{who}"), ("root of the wait", "@root{who}"),
            ("intervals", "@count")]


def timeline_figure(td: D.TimelineData, *, width: int = 1400) -> tuple[LayoutDOM, Range1d]:
    """The timeline layout (notices, main plot, range selector) and its shared x range."""
    rows = td.rows
    nrows = max(len(rows.order), 1)
    row_px = _row_px(nrows)
    frame_h = int(nrows * row_px) + 24
    pad = td.span_ms * 0.01
    x_range = Range1d(-pad, td.span_ms + pad, bounds=(-pad * 5, td.span_ms + pad * 5))
    top = -0.5 - 16 / row_px  # room above row 0 for the step labels
    p = figure(width=width, height=frame_h + 126, x_range=x_range, y_range=Range1d(nrows - 0.5, top),
               tools="xpan,xwheel_zoom,box_zoom,reset,save", active_scroll="xwheel_zoom", active_drag="xpan",
               toolbar_location="above",
               title=f"Timeline: {len(rows.order)} ranks on the aligned clock "
                     f"(each row: compute on top, communication below; striped = waiting for the last rank)",
               x_axis_label="time since run start (ms, aligned clock)")
    style(p)
    p.ygrid.grid_line_color = None
    p.min_border_left = 110

    left = p.yaxis[0]
    step = 1 if row_px >= 9 else max(1, round(9 / row_px))
    left.ticker = FixedTicker(ticks=list(range(0, nrows, step)))
    left.major_label_overrides = {i: lab for i, lab in rows.labels.items() if i % step == 0}
    left.major_label_text_font_size = "8pt" if row_px < 14 else "9pt"
    left.axis_label = "rank"
    # bands per (stage, host) group, named on a right-hand axis
    band_ticks, band_labels = [], {}
    for i, band in enumerate(rows.bands):
        if i % 2 == 0:
            p.add_layout(BoxAnnotation(bottom=band.y0 - 0.5, top=band.y1 + 0.5, fill_color="#f3f3f3",
                                       fill_alpha=1.0, line_color=None, level="underlay"))
        if (band.y1 - band.y0 + 1) * row_px >= 10:
            mid = (band.y0 + band.y1) / 2
            band_ticks.append(mid)
            band_labels[mid] = band.label
    if band_ticks:
        right = LinearAxis(ticker=FixedTicker(ticks=band_ticks), major_label_overrides=band_labels,
                           major_tick_line_color=None, axis_line_color=None, major_label_text_font_size="8pt",
                           major_label_text_color="#444444")
        p.add_layout(right, "right")

    formatters: dict[str, Any] = {"@name_id": lookup(td.names), "@dur_ns": duration_fmt(),
                                  "@wait_ns": duration_fmt(), "@bytes": bytes_fmt(), "@busbw": gbps_fmt(),
                                  "@seq": seq_fmt(), "@waited_on": rank_fmt(), "@root": rank_fmt(),
                                  "@y": lookup([f"r{r}" for r in rows.order])}
    level0 = td.levels[0] if td.levels else {}
    shown: dict[str, ColumnDataSource] = {}
    items: list[LegendItem] = []
    hover_compute, hover_comm = [], []
    for layer in td.layers:
        src = ColumnDataSource(level0[layer], name=f"timeline:{layer}")
        shown[layer] = src
        if layer == "stall":
            # pale stripes over the collective's colour: waiting, not moving data
            r = p.hbar(y="y", left="x0", right="x1", height=D.LANE_HEIGHT, source=src, fill_alpha=0.0,
                       line_color=None, hatch_pattern="/", hatch_color="#ffffff", hatch_alpha=0.9,
                       hatch_scale=7, hatch_weight=2.0)
            swatch = p.hbar(y=[-1e6], left=[0], right=[1], height=D.LANE_HEIGHT, fill_color="#707070",
                            line_color=None,
                            hatch_pattern="/", hatch_color="#ffffff", hatch_alpha=0.9, hatch_scale=7,
                            hatch_weight=2.0)
            items.append(LegendItem(label="waiting for the last rank (hover: who, and the root)",
                                    renderers=[swatch, r]))
            continue
        color = D.COMPUTE_COLOR if layer == "compute" else D.DIM_COLORS[layer.split(":", 1)[1]]
        r = p.hbar(y="y", left="x0", right="x1", height=D.LANE_HEIGHT, source=src, fill_color=color,
                   fill_alpha="alpha", line_color=None)
        # the legend swatch comes from an off-screen bar with constant styling, so it stays visible
        # when the view holds no bar of this layer (its alpha is a data column)
        swatch = p.hbar(y=[-1e6], left=[0], right=[1], height=D.LANE_HEIGHT, fill_color=color, fill_alpha=0.9,
                        line_color=None)
        label = "compute" if layer == "compute" else f"{D.DIM_LABELS[layer.split(':', 1)[1]]} comm"
        items.append(LegendItem(label=label, renderers=[swatch, r]))
        (hover_compute if layer == "compute" else hover_comm).append(r)
    if hover_compute:
        p.add_tools(HoverTool(renderers=hover_compute, tooltips=_tooltips("compute"), formatters=formatters))
    if hover_comm:
        p.add_tools(HoverTool(renderers=hover_comm, tooltips=_tooltips("comm"), formatters=formatters))
    legend = Legend(items=items, orientation="horizontal", click_policy="hide", location="top_left",
                    label_text_font_size="9pt", border_line_color=None, spacing=14)
    p.add_layout(legend, "above")

    for s in td.steps:
        p.add_layout(Span(location=s["x0"], dimension="height", line_color="#333333", line_dash="dashed",
                          line_width=1, line_alpha=0.7))
        p.add_layout(Label(x=s["x0"], y=-0.5, y_offset=2, text=f"step {s['step']}", text_font_size="8pt",
                           text_color="#333333", x_offset=3, text_baseline="bottom"))

    info = Div(text="", width=width, styles={"font-size": "11px", "color": "#777777", "text-align": "right"})
    finer = [{k: ColumnDataSource(v, name=f"timeline:{k}:lod{i + 1}") for k, v in lv.items()}
             for i, lv in enumerate(td.levels[1:])]
    if finer or td.merged_full_view:
        cb = CustomJS(args={"xr": x_range, "shown": shown, "finer": finer, "level_px": td.level_ms_per_px,
                            "width_px": width - 130, "info": info}, code=LOD_JS)
        x_range.js_on_change("start", cb)
        x_range.js_on_change("end", cb)

    overview = _overview(td, x_range, width)
    parts = [x for x in (note_div(td.notes, width=width), p, info, overview) if x is not None]
    return column(*parts), x_range


def _overview(td: D.TimelineData, x_range: Range1d, width: int) -> figure:
    """Ranks busy over the whole run (stacked communication per dim, compute as a line), with a
    RangeTool that drives the timeline's x range."""
    ov = td.overview
    src: dict[str, Any] = {"x": ov["x"]}
    stack, colors, labels = [], [], []
    for layer in td.layers:
        if layer.startswith("comm:"):
            dim = layer.split(":", 1)[1]
            src[dim] = ov["series"][layer]
            stack.append(dim)
            colors.append(D.DIM_COLORS[dim])
            labels.append(f"{D.DIM_LABELS[dim]} comm")
    pad = td.span_ms * 0.01
    n = max(int(ov["nrows"]), 1)
    o = figure(width=width, height=170, x_range=Range1d(-pad, td.span_ms + pad), y_range=Range1d(0, n * 1.08),
               tools="", toolbar_location=None,
               title=f"Whole run: how many of the {n} ranks communicate (stacked by dim) and compute (line); "
                     "drag or resize the box to move the timeline",
               x_axis_label="time since run start (ms)", y_axis_label="ranks")
    style(o, title_size="10pt")
    o.min_border_left = 110
    source = ColumnDataSource(src)
    items = []
    if stack:
        rs = o.varea_stack(stackers=stack, x="x", color=colors, fill_alpha=0.85, source=source)
        items += [LegendItem(label=lab, renderers=[r]) for lab, r in zip(labels, rs, strict=True)]
    if "compute" in ov["series"]:
        source.data["compute"] = ov["series"]["compute"]
        r = o.line(x="x", y="compute", source=source, color="#555555", line_width=1)
        items.append(LegendItem(label="compute", renderers=[r]))
    if items:
        o.add_layout(Legend(items=items, orientation="horizontal", label_text_font_size="8pt",
                            border_line_color=None, glyph_height=10, glyph_width=14, spacing=10, padding=0,
                            margin=2, location="top_right"), "above")
    o.ygrid.grid_line_color = None
    rt = RangeTool(x_range=x_range)
    rt.overlay.fill_color = "#0072B2"
    rt.overlay.fill_alpha = 0.12
    o.add_tools(rt)
    return o
