"""The Links tab's measured-vs-replayed panel, drawn from a `TelemetryComparison` (no computing
here beyond unit conversion: bytes per window -> Gb/s). `comparison_data` imports no Bokeh."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tracekit.telemetry.compare import LinkAgreement, TelemetryComparison

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")
NO_TELEMETRY = "No switch or NIC telemetry in this run: nothing measured to set beside the replay."


@dataclass(frozen=True)
class LinkSeries:
    """One link's compared windows: start and width (ms), measured and replayed Gb/s, the flags."""

    link: str
    x_ms: np.ndarray
    width_ms: np.ndarray
    measured_gbps: np.ndarray
    replayed_gbps: np.ndarray
    flags: list[str]


@dataclass(frozen=True)
class LinkComparison:
    """The measured-vs-replayed panel: the one-line `message` when there is nothing to draw, else the
    topology, the series of the links that disagree most, the table's links, the notes, how many
    links are left out, where the time axis starts (ns) and whether that is the timeline's start."""

    message: str | None = None
    topology: str | None = None
    series: list[LinkSeries] = field(default_factory=list)
    table: list[LinkAgreement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    more: int = 0
    base_ns: int = 0
    aligned: bool = False


def comparison_data(cmp: TelemetryComparison | None, *, has_telemetry: bool, top: int = 8,
                    t0_ns: int | None = None) -> LinkComparison:
    """Plain data for the panel: per link (in the comparison's disagreement order, first `top`)
    the windows' start (ms from `t0_ns`, the timeline's start, else the first window), measured
    and replayed Gb/s, flags; the table
    rows; and the one-line message when there is nothing to draw."""
    if not has_telemetry:
        return LinkComparison(message=NO_TELEMETRY)
    if cmp is None or not cmp.links:
        notes = list(getattr(cmp, "notes", []) or [])
        return LinkComparison(message="Telemetry is present but not compared with a replay"
                              + (f" ({notes[0]})" if notes else ": run `tracekit replay RUN --topology observed`")
                              + ".")
    w = cmp.windows
    link = np.array(w.column("link").to_pylist(), dtype=object)
    ts = w.column("ts_ns").to_numpy()
    first = int(ts.min()) if len(ts) else 0
    aligned = t0_ns is not None and abs(first - t0_ns) < 3_600 * 10**9
    base = int(t0_ns) if aligned else first
    secs = w.column("interval_ns").to_numpy() / 1e9
    measured = np.asarray(w.column("measured_bytes").to_numpy(zero_copy_only=False), dtype=float)
    replayed = w.column("replayed_bytes").to_numpy()
    flags = w.column("flags").to_pylist()
    series = []
    for a in cmp.links[:top]:
        sel = np.flatnonzero(link == a.link)
        series.append(LinkSeries(link=a.link, x_ms=(ts[sel] - base) / 1e6, width_ms=secs[sel] * 1e3,
                                 measured_gbps=measured[sel] * 8 / secs[sel] / 1e9,
                                 replayed_gbps=replayed[sel] * 8 / secs[sel] / 1e9,
                                 flags=[", ".join(flags[i]) for i in sel.tolist()]))
    return LinkComparison(topology=cmp.topology, series=series, table=list(cmp.links[:20]), notes=list(cmp.notes),
                          more=max(0, len(cmp.links) - top), base_ns=base, aligned=aligned)


def comparison_panel(data: LinkComparison, *, width: int = 1400) -> Any:
    """Measured (solid) and replayed (dashed) Gb/s per link, one colour per link, flagged windows
    marked; the links that disagree most as a table; or the one-line message."""
    from bokeh.layouts import column
    from bokeh.models import ColumnDataSource, HoverTool, Legend, LegendItem
    from bokeh.plotting import figure

    from tracekit.viz._bokeh import esc, html_div, style

    if data.message is not None:
        return html_div(f"<p>{esc(data.message)}</p>", width=width)
    axis = "time (ms) since run start" if data.aligned else "time (ms) from the first compared window"
    f = figure(width=width, height=320, x_axis_label=axis,
               y_axis_label="Gb/s (window mean)", tools="xpan,xwheel_zoom,box_zoom,reset,save",
               title=f"Measured (solid) vs replayed on {data.topology} (dashed), per telemetry window")
    style(f)
    f.y_range.start = 0
    items = []
    for i, s in enumerate(data.series):
        color = COLORS[i % len(COLORS)]
        start = np.asarray(s.x_ms, dtype=float)
        x = start + np.asarray(s.width_ms) / 2
        # Window means as steps: each window's value held over the window (the last one closed at its end).
        xs = np.append(start, start[-1] + s.width_ms[-1]) if len(start) else start
        src = ColumnDataSource({"x": xs, "m": np.append(s.measured_gbps, s.measured_gbps[-1:]),
                                "r": np.append(s.replayed_gbps, s.replayed_gbps[-1:]),
                                "link": [s.link] * len(xs), "flags": [*s.flags, *s.flags[-1:]]})
        m = f.step("x", "m", source=src, color=color, line_width=2, mode="after")
        r = f.step("x", "r", source=src, color=color, line_width=2, line_dash="dashed", mode="after")
        flagged = [j for j, fl in enumerate(s.flags) if fl]
        renderers = [m, r]
        if flagged:
            fsrc = ColumnDataSource({"x": x[flagged], "y": np.zeros(len(flagged)),
                                     "link": [s.link] * len(flagged), "flags": [s.flags[j] for j in flagged]})
            renderers.append(f.scatter("x", "y", source=fsrc, marker="x", size=11, color=color, line_width=2))
        items.append(LegendItem(label=s.link[:60], renderers=renderers))
    f.add_tools(HoverTool(tooltips=[("link", "@link"), ("time", "@x{0,0.000} ms"), ("measured", "@m{0,0.00} Gb/s"),
                                    ("replayed", "@r{0,0.00} Gb/s"), ("flags", "@flags")]))
    f.add_layout(Legend(items=items, click_policy="hide", label_text_font_size="8pt", border_line_color=None),
                 "right")
    rows = "".join(
        f"<tr><td>{esc(a.link)}</td><td>{a.measured_bytes / 1e6:,.1f}</td><td>{a.replayed_bytes / 1e6:,.1f}"
        f"</td><td>{a.unexplained_bytes / 1e6:+,.1f}</td><td>"
        f"{'-' if a.explained_share is None else format(a.explained_share, '.1%')}</td><td>"
        f"{'-' if a.worst_window_error is None else format(a.worst_window_error, '.1%')}</td>"
        f"<td>{a.flagged_windows}</td></tr>" for a in data.table)
    table = html_div(
        "<p><b>Links where measured and replayed disagree most</b> (bytes over the compared windows; "
        "unexplained = measured - replayed: other traffic such as storage, checkpoints or other jobs)</p>"
        "<table class='tk'><tr><th>link</th><th>measured MB</th><th>replayed MB</th><th>unexplained MB</th>"
        f"<th>explained</th><th>worst window</th><th>flagged windows</th></tr>{rows}</table>"
        + "".join(f"<p>note: {esc(n)}</p>" for n in data.notes), width=width)
    return column(f, table)
