"""`tracekit export`: one Chrome-trace / Perfetto file with every rank on the aligned clock."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli._common import json_option, open_run_arg, run_argument, user_errors


@click.command()
@run_argument
@click.option("--chrome", "chrome", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Chrome-trace JSON to write (gzip when it ends in .gz); opens in Perfetto or chrome://tracing.")
@click.option("--no-flows", is_flag=True, help="Leave out the flow arrows linking each collective's participants.")
@click.option("--no-stalls", is_flag=True, help="Leave out the stall slices (waits for the last arrival).")
@click.option("--no-replay", is_flag=True, help="Leave out the replayed timelines stored by `tracekit replay`.")
@json_option
@user_errors
def export(run: Path, chrome: Path, no_flows: bool, no_stalls: bool, no_replay: bool, as_json: bool) -> None:
    """Export RUN as one trace: a process per rank, a thread per lane, collectives linked by
    arrows, stalls as slices, and replayed timelines as extra processes. RUN|PATH is a run
    directory, or a trace file or folder, ingested first into the run `tracekit replay` keeps for it
    (with the timelines a replay stored there)."""
    from tracekit import workflows
    from tracekit.results import dumps

    summary = workflows.export(open_run_arg(run), chrome, flows=not no_flows, stalls=not no_stalls,
                               include_replay=not no_replay)
    if as_json:
        click.echo(dumps(summary, sort_keys=True))
        return
    replay = "".join(f", replay {name}: {n:,} slices" for name, n in summary.replay.items())
    skipped = "".join(f", skipped {n:,} ({why})" for why, n in sorted(summary.skipped.items()))
    if summary.overlapping:
        skipped += f", {summary.overlapping:,} overlapping slices on '(overlap)' threads"
    click.echo(f"wrote {chrome}: {summary.ranks:,} ranks, {summary.slices:,} slices, {summary.flows:,} flow arrows, "
               f"{summary.stalls:,} stalls{replay}{skipped}")
    for note in summary.notes:
        click.echo(f"note: {note}", err=True)
