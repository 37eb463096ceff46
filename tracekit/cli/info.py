"""`tracekit info`: what a run directory holds."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tracekit._text import fmt_ranks
from tracekit.cli._common import console as safe_console
from tracekit.cli._common import json_option, open_run_arg, run_argument, user_errors

if TYPE_CHECKING:
    from tracekit.nccl_fabric import Communicator
    from tracekit.runinfo import RunInfo
    from tracekit.telemetry import TelemetryInfo


@click.command()
@run_argument
@json_option
@user_errors
def info(run: Path, as_json: bool) -> None:
    """Ranks, hosts, groups, steps, time span, formats and per-source counts of RUN.

    RUN|PATH is a run directory, or a trace file or folder, ingested first into the run `tracekit
    replay` keeps for it.
    """
    from tracekit import workflows
    from tracekit.runinfo import info_json

    found = workflows.info(open_run_arg(run))
    if as_json:
        click.echo(info_json(found))
        return
    _print(found)
    if found.telemetry:
        _print_links(found.telemetry)


#: Links listed, and flagged windows listed per link, in the text output (`--json` has them all).
MAX_LINKS = 30
MAX_FLAGGED = 5


def _print_links(doc: TelemetryInfo) -> None:
    """The telemetry section: per link peak/mean utilisation, and flagged windows with reasons."""
    import datetime as dt

    from rich.table import Table

    console = safe_console(soft_wrap=True)
    if not console.is_terminal:
        console = safe_console(soft_wrap=True, width=160)
    out = console.print
    links = doc.links
    stats = doc.stats or {}
    n_flagged = sum(link.flagged_windows for link in links)
    mapped = sum(1 for link in links if link.link_end)
    out()
    summary = doc.summary
    if summary is not None:
        out(f"telemetry  {summary.accounting_text}")
        out(f"           {stats.get('windows', 0):,} window(s) on {len(links)} port(s) ({mapped} on topology links), "
            f"{n_flagged:,} flagged")
    else:
        out(f"telemetry  {doc.counters:,} counter samples, {len(links)} port(s) ({mapped} on topology links), "
            f"{stats.get('windows', 0):,} window(s), {n_flagged:,} flagged")
    if not links:
        out("           no rated windows (a rate needs two timed samples of one counter on a port)")
        return
    t = Table(title="links (telemetry)", title_justify="left", show_edge=False)
    for col in ("link", "port", "speed", "windows", "peak util", "mean util", "tx", "rx", "flagged"):
        t.add_column(col, justify="left" if col in ("link", "port") else "right")
    for link in links[:MAX_LINKS]:
        where = _clean(f"{link.host + '/' if link.host and link.host != link.device else ''}"
                       f"{link.device}:{link.port}")
        t.add_row(_clean(link.link), where if where != link.link else "=", _gbps(link.speed_bps),
                  f"{link.windows:,}", _pct(link.peak_util), _pct(link.mean_util),
                  _bytes(link.tx_bytes), _bytes(link.rx_bytes), f"{link.flagged_windows:,}")
    out()
    out(t)
    if len(links) > MAX_LINKS:
        out(f"... and {len(links) - MAX_LINKS} more port(s) (tracekit info --json lists all)")
    flagged = [link for link in links if link.flagged_windows]
    if flagged:
        out()
        out("flagged windows (reason per metric; gap/wrapped without a metric are notes, numbers kept)")
    for link in flagged[:MAX_LINKS]:
        for f in link.flagged[:MAX_FLAGGED]:
            start = dt.datetime.fromtimestamp(f.ts_ns / 1e9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
            out(f"  {_clean(link.link)}  {start} UTC +{f.interval_ns / 1e9:g} s  "
                f"{_clean(', '.join(f.reasons))}")
        if link.flagged_windows > MAX_FLAGGED:
            out(f"  {_clean(link.link)}  ... and {link.flagged_windows - MAX_FLAGGED:,} more")
    for w in doc.warnings or []:
        out(f"warning: {_clean(w)}")


def _clean(text: str) -> str:
    """Control characters in trace strings are shown escaped, never sent to the terminal."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in str(text))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _gbps(bps: float | None) -> str:
    return "-" if bps is None else f"{bps / 1e9:g} Gb/s"


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def _print(doc: RunInfo) -> None:
    from rich.table import Table


    console = safe_console(soft_wrap=True)
    if not console.is_terminal:
        console = safe_console(soft_wrap=True, width=160)
    out = console.print
    ranks = doc.ranks
    out(f"run        {doc.run}")
    out(f"tracekit   {doc.tracekit_version} (schema {doc.schema_version})")
    validity = doc.validity
    world = validity.world_size
    presence = (f" ({len(ranks)} of {world} present; missing {fmt_ranks(validity.missing_ranks, limit=8)})"
                if validity.missing_ranks else "")
    out(f"ranks      {len(ranks)}: {fmt_ranks(ranks)}" + (
        f" of world {', '.join(map(str, doc.world_sizes))}" if doc.world_sizes else "") + presence
        + (f" (from the {doc.ranks_from})" if doc.ranks_from not in (None, "traces") else ""))
    out(f"hosts      {len(doc.hosts)}: {', '.join(doc.hosts) or '-'}", markup=False)
    out(f"devices    {', '.join(doc.devices) or '-'}", markup=False)
    out(f"formats    {', '.join(f'{k} ({v})' for k, v in sorted(doc.formats.items())) or '-'}")
    out(f"steps      {fmt_ranks(doc.steps) or '-'}" + _analyzed(doc))
    span = doc.span
    if span.start_ns is not None:
        out(f"time span  {span.duration_s:.6f} s (from {span.start_ns} ns to {span.end_ns} ns)")
    out(f"tables     {', '.join(f'{k} {v:,}' for k, v in sorted(doc.tables.items()))}")
    for b in doc.microbench:
        peak = "-" if b.peak_busbw_gbps is None else f"{b.peak_busbw_gbps:.2f} GB/s at {b.peak_size_bytes} B"
        out(f"nccl-tests {b.test or '?'}: {b.nranks or '?'} ranks on {b.hosts or '?'} host(s), "
            f"{b.sizes} sizes, peak busbw {peak} ({b.peak_side or '-'})")
    if doc.groups:
        t = Table(title="groups", title_justify="left", show_edge=False)
        for col in ("group", "desc", "backend", "size", "ranks", "dims", "collectives"):
            t.add_column(col, justify="right" if col in ("size", "collectives") else "left")
        for g in doc.groups:
            ranks_txt = fmt_ranks(g.ranks) + ("" if g.ranks_complete else " (partial)")
            t.add_row(g.group, _desc(g.desc), g.backend or "-", str(g.size or "-"),
                      ranks_txt, ",".join(g.dims) or "-", f"{g.collectives:,}")
        out()
        out(t)
    _print_communicators(out, doc.communicators, [w.text for w in doc.nccl_warnings])
    from tracekit._text import grouped_warnings, short_paths
    from tracekit.cli.ingest import sources_table
    from tracekit.present import skipped_summary

    out()
    out(sources_table(doc.sources, title="sources"))
    note = skipped_summary([s for s in doc.sources if not s.error])
    if note:
        out(note, soft_wrap=True)
    names = short_paths([s.path for s in doc.sources])
    for s in doc.sources:
        if s.error:
            out(f"error: {s.error}", markup=False)
    for line in grouped_warnings((names[s.path], s.warnings or []) for s in doc.sources):
        out(f"warning: {line}", markup=False)
    for w in doc.warnings:
        out(f"warning: {w}", markup=False)
    for f in validity.found:
        out(f"warning: {f.text}", markup=False)


def _print_communicators(out: Any, comms: list[Communicator], warnings: list[str]) -> None:
    """The fabric NCCL built, per communicator (from NCCL logs), and the ranks' NCCL warnings."""
    from rich.table import Table

    for text in warnings:
        out(f"nccl: {text}", markup=False)
    if not comms:
        return
    t = Table(title="NCCL communicators (the fabric NCCL built)", title_justify="left", show_edge=False)
    for col in ("communicator", "size", "ranks", "hosts", "channels", "ring", "tree", "NICs used", "PXN", "GDR",
                "NVLS", "CollNet"):
        t.add_column(col, justify="right" if col in ("size", "channels") else "left", overflow="fold")

    def flag(v: bool | None) -> str:
        return "-" if v is None else ("on" if v else "off")

    for c in comms:
        used = sum(len(v) for v in c.nics_used.values())
        avail = sum(len(v) for v in c.nics_available.values())
        nics = f"{used} of {avail}" if avail else (str(used) if used else "-")
        t.add_row(c.group, str(c.size or "-"), fmt_ranks(c.ranks, limit=6) or "-",
                  ", ".join(c.hosts) or "-", str(c.channels or "-"),
                  _transports(c.transports.get("ring")), _transports(c.transports.get("tree")), nics,
                  flag(c.pxn), flag(c.gdr), "on" if c.nvls else "off", "on" if c.collnet else "off")
    out()
    out(t)
    for c in comms:
        if c.network:
            out(f"  {c.group}: network {', '.join(c.network)}", markup=False)
        for note in c.notes:
            out(f"  {c.group}: {note}", markup=False)


def _transports(counts: dict[str, int] | None) -> str:
    """ "NET 16, P2P 112" (edges per transport)."""
    if not counts:
        return "-"
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _desc(desc: str | None) -> str:
    """A group's description; "(unnamed)" for PyTorch's default "undefined" (the other columns say what it is)."""
    from tracekit.present import UNNAMED_DESCS

    if desc is None:
        return "-"
    return "(unnamed)" if desc.strip().lower() in UNNAMED_DESCS else desc


def _analyzed(doc: RunInfo) -> str:
    """ " (none marked in the traces; `analyze` found 1 step: ...)" when the traces mark no step."""
    found = doc.analyzed_steps
    if doc.steps or not doc.ranks or doc.ranks_from != "traces":
        return ""
    if not found or not found.steps:
        return " (none marked in the traces; `tracekit analyze` derives them)"
    n = len(found.steps)
    how = f", from {' and '.join(found.found_from)}" if found.found_from else ""
    return f" (none marked in the traces; `tracekit analyze` found {n} step{'s' if n != 1 else ''}{how})"
