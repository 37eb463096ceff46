"""HTML for the report's header and Summary tab. Every value is escaped with `esc`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tracekit import __version__
from tracekit.viz._bokeh import esc
from tracekit.viz.data import fmt_ns

TAB_HELP = {
    "Timeline": "every rank on one clock; striped = waiting for the last rank; drag the lower box to zoom",
    "Overlap": "communication hidden behind compute vs exposed, per rank and dim",
    "EP": "who sends how much to whom in all-to-all, and the load per rank",
    "Links": "link utilisation over time, telemetry next to replay",
    "Replay": "the same work on other networks: step time and per-collective durations",
    "Hang": "the last collective each rank reached",
}


def header_html(data: Mapping[str, Any]) -> str:
    """The title line above the tabs."""
    kpis = dict(data["summary"]["kpis"])
    hosts = str(kpis.get("hosts", "0"))
    where = "hosts unknown" if hosts in ("0", "") else f"on {esc(hosts)} hosts"
    return (f"<h2>{esc(data['title'])}</h2><p class='muted'>{esc(kpis.get('ranks', '0'))} ranks, "
            f"{where} · made by tracekit {esc(__version__)} · hover for details, "
            f"click legend entries to hide them</p>")


def _table(head: list[str], rows: list[list[tuple[str, bool]]]) -> str:
    h = "".join(f"<th>{esc(x)}</th>" for x in head)
    body = "".join("<tr>" + "".join(f"<td class='num'>{esc(v)}</td>" if num else f"<td>{esc(v)}</td>"
                                    for v, num in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def summary_html(data: Mapping[str, Any]) -> str:
    """Headline numbers, findings in words, the worst stalls and stragglers, and notices."""
    s = data["summary"]
    out = ["<div>" + "".join(f"<div class='kpi'><b>{esc(v)}</b><span>{esc(k)}</span></div>"
                             for k, v in s["kpis"]) + "</div>"]
    lines = [*s["findings"], *s["sentences"]]
    out.append("<h3>What stands out</h3>")
    if lines:
        out.append("<ul>" + "".join(f"<li>{esc(x)}</li>" for x in lines) + "</ul>")
    else:
        out.append("<p class='muted'>No findings: no analysis results for this run.</p>")
    if s["stalls"]:
        rows = [[(str(x.get("group", "")), False), (str(x.get("op", "")), False), (str(x.get("dim", "")), False),
                 (str(x.get("seq", "")), True), (str(x.get("step", "")), True), (f"r{x.get('last_rank', '?')}", False),
                 (fmt_ns(_num(x.get("max_wait_ns"))), True)] for x in s["stalls"]]
        out.append("<h3>Longest stalls (others waiting for the last rank to join)</h3>")
        out.append(_table(["group", "op", "dim", "seq", "step", "last rank", "longest wait"], rows))
    if s["stragglers"]:
        rows = [[(f"r{x.get('rank', '?')}", False), (str(x.get("times_last", "")), True),
                 (str(x.get("instances", "")), True), (fmt_ns(_num(x.get("delay_ns"))), True),
                 (fmt_ns(_num(x.get("worst_wait_ns"))), True),
                 (", ".join(str(v) for v in (x.get("steps") or [])[:8]), False)] for x in s["stragglers"]]
        out.append("<h3>Ranks most often last</h3>")
        out.append(_table(["rank", "times last", "collectives", "total delay caused", "worst wait", "steps"], rows))
    if data.get("notes"):
        out.append("<h3>Notes on this report</h3>")
        out.append("".join(f"<div class='note'>{esc(n)}</div>" for n in data["notes"]))
    tabs = [t for t in data["tabs"] if t in TAB_HELP]
    if tabs:
        out.append("<h3>Tabs</h3><ul>" + "".join(f"<li><b>{esc(t)}</b>: {esc(TAB_HELP[t])}</li>" for t in tabs)
                   + "</ul>")
    return "".join(out)


def _num(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None
