"""HTML for the report's header and Summary tab. Every value is escaped with `esc`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracekit import __version__
from tracekit.viz._bokeh import esc

if TYPE_CHECKING:
    from tracekit.viz.report import ReportData

TAB_HELP = {
    "Timeline": "every rank on one clock; striped = waiting for the last rank (hover names it, and the root of "
                "the wait); drag the lower box to zoom",
    "Overlap": "communication hidden behind compute vs exposed, per rank and dim",
    "EP": "who sends how much to whom in all-to-all, and the load per rank",
    "Links": "link utilisation over time: telemetry, then each replayed topology in the order given",
    "Replay": "the same work on other networks: step time and per-collective durations",
    "Hang": "the verdict of tracekit hang: the last collective each rank reached, and who to look at",
}
_SEVERITY = {"error": "sev-error", "warning": "sev-warning", "info": "sev-info"}


def header_html(data: ReportData) -> str:
    """The title line above the tabs: what the run holds, warnings included."""
    hosts = data.hosts
    where = "hosts unknown" if not hosts else f"on {len(hosts)} host{'s' if len(hosts) != 1 else ''}"
    return (f"<h2>{esc(data.title)}</h2><p class='muted'>{esc(data.presence)}, {esc(where)} · made by "
            f"tracekit {esc(__version__)} · hover for details, click legend entries to hide them</p>")


def _table(head: list[str], rows: list[list[tuple[str, bool]]], caption: str | None = None) -> str:
    h = "".join(f"<th>{esc(x)}</th>" for x in head)
    body = "".join("<tr>" + "".join(f"<td class='num'>{esc(v)}</td>" if num else f"<td>{esc(v)}</td>"
                                    for v, num in r) + "</tr>" for r in rows)
    cap = f"<p class='muted small'>{esc(caption)}</p>" if caption else ""
    return f"<table><tr>{h}</tr>{body}</table>{cap}"


def _num(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def summary_html(data: ReportData) -> str:
    """Headline numbers, findings (warnings marked), the stalls by root cause, the stragglers."""
    s = data.summary
    out = ["<div>" + "".join(f"<div class='kpi'><b>{esc(v)}</b><span>{esc(k)}</span></div>"
                             for k, v in s.kpis) + "</div>"]
    out.append(f"<p class='muted small'>{esc(s.step_time[0].upper() + s.step_time[1:])}.</p>")
    out.append("<h3>What stands out</h3>")
    if s.findings or s.replay:
        items = [f"<li class='{_SEVERITY.get(f.severity, 'sev-info')}'>{esc(f.text)}</li>" for f in s.findings]
        items += [f"<li class='sev-info'>{esc(x)}</li>" for x in s.replay]
        out.append("<ul class='findings'>" + "".join(items) + "</ul>")
    else:
        out.append("<p class='muted'>Nothing stands out.</p>")
    if s.roots:
        rows = [[(f"r{x.root}", False), (x.step, True), (x.busy, True), (x.waits, True),
                 (x.lost, True), (x.worst, False)] for x in s.roots]
        out.append("<h3>Stalls by root cause (one row per cascade of waits)</h3>")
        out.append(_table(["root", "step", "busy", "waits", "lost", "worst wait"], rows,
                          "root: the rank at the end of the chain of waits; busy: how long it was busy with its own "
                          "work while the others waited; lost: every waiting rank's wait, summed."))
    if s.stragglers:
        rows = [[(f"r{x.rank}", False), (x.last, True), (x.of, True), (x.delay, True),
                 (x.caused, True), (x.excess, True), (x.steps, False)] for x in s.stragglers]
        out.append("<h3>Stragglers (ranks most often last)</h3>")
        out.append(_table(["rank", "last", "of", "delay", "caused", "excess", "steps"], rows,
                          "delay: the waits of the collectives where the rank was last; caused: the part its own "
                          "work explains; excess: the part beyond the step's usual pattern."))
    for mb in s.microbench or []:
        rows = [[(str(x.size_bytes), True), (_num(x.oop_time_us, 1), True), (_num(x.oop_busbw_gbps, 2), True),
                 (_num(x.ip_time_us, 1), True), (_num(x.ip_busbw_gbps, 2), True)] for x in mb.sizes]
        out.append(f"<h3>nccl-tests {esc(mb.test or '')} busbw</h3><p>{esc(mb.headline())}.</p>")
        out.append(_table(["size (B)", "time (us)", "busbw (GB/s)", "in-place time (us)", "in-place busbw (GB/s)"],
                          rows, f"as nccl-tests printed it, from {mb.source}."))
    if data.notes:
        out.append("<h3>Notes on this report</h3>")
        out.append("".join(f"<div class='note'>{esc(n)}</div>" for n in data.notes))
    tabs = [t for t in data.tabs if t in TAB_HELP]
    if tabs:
        out.append("<h3>Tabs</h3><ul>" + "".join(f"<li><b>{esc(t)}</b>: {esc(TAB_HELP[t])}</li>" for t in tabs)
                   + "</ul>")
    return "".join(out)
