"""`tracekit report`: write the standalone HTML report for a run."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli._common import open_run_arg, user_errors


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} KB"


@click.command()
@click.argument("run_dir", metavar="RUN|PATH", type=click.Path(path_type=Path))
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the HTML file.")
@click.option("--cdn", is_flag=True, help="Load BokehJS from its CDN instead of inlining it (smaller file, needs "
                                          "network access to view).")
@user_errors
def report(run_dir: Path, out: Path, cdn: bool) -> None:
    """Write one standalone HTML report (summary, timeline, overlap, EP, links, replay, hang).

    RUN|PATH is a run directory, or a trace file or folder, ingested first into the run `tracekit
    replay` keeps for it.
    """
    from tracekit import workflows

    run = open_run_arg(run_dir)
    run.require_data()
    info = workflows.report(run, out, cdn=cdn)
    click.echo(f"wrote {info.path} ({_size(info.size_bytes)}; tabs: {', '.join(info.tabs)})")
    if info.merged_full_view or info.merged_intervals:
        click.echo(f"{info.raw_intervals:,} intervals: {info.merged_full_view:,} merged into busy bars at full view, "
                   f"{info.merged_intervals:,} still merged at the finest zoom level")
    else:
        click.echo(f"{info.raw_intervals:,} intervals, none merged")
    for note in info.notes:
        click.echo(f"note: {note}")
