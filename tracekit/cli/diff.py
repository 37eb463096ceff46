"""`tracekit diff`: why is run B slower than run A, and is the network the reason?"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from tracekit.cli._common import console as safe_console
from tracekit.cli._common import json_option, user_errors

if TYPE_CHECKING:
    from tracekit.diff import RunDiff


@click.command()
@click.argument("a", type=click.Path(exists=True))
@click.argument("b", type=click.Path(exists=True))
@json_option
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1),
              help="How many buckets and ranks to list.")
@click.option("--topology", default=None, metavar="TOPOLOGY",
              help="The network A ran on (a preset or YAML, as for replay): replay both runs on it with A's "
                   "calibration and split the change into network (less delivered for the same work) and job "
                   "(more or different work asked).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write an HTML report with a Diff tab (waterfall, buckets, per-host heatmap, setup).")
@user_errors
def diff(a: str, b: str, as_json: bool, top: int, topology: str | None, report_path: Path | None) -> None:
    """Compare run B against run A: the step-time change split into parts that add up (compute,
    communication per dim, idle), the collective buckets whose speed changed beyond each run's own
    step-to-step variation, the ranks and hosts behind it, and what differs in the setup.

    A and B are run directories or raw traces (ingested first, as `replay` does). Mismatched runs
    (world size, steps, groups, missing ranks) are matched where possible and said.
    """
    from tracekit import workflows
    from tracekit.results import dumps

    result = workflows.diff(a, b, topology=topology)
    if as_json:
        click.echo(dumps(result))
    else:
        _print(result, top)
    if report_path is not None:
        from tracekit.viz.diff import write_diff_report

        click.echo(f"report: {write_diff_report(result, report_path)}", err=as_json)


def _print(result: RunDiff, top: int) -> None:
    from rich.table import Table

    from tracekit.diff import present

    console = safe_console()
    console.print(result.verdict)
    for note in result.matching.notes:
        console.print(f"note: {note}")

    def show(title: str, columns: list[str], rows: list[list[str]], caption: str | None = None) -> None:
        if not rows:
            return
        t = Table(title=title, title_justify="left", show_edge=False, caption=caption, caption_justify="left")
        for i, c in enumerate(columns):
            text = i == 0 or c in ("", "host", "slower in", "what", "op", "dim")
            t.add_column(c, justify="left" if text else "right")
        for r in rows:
            t.add_row(*r)
        console.print()
        console.print(t)

    deco = result.decomposition
    if deco.steps:
        show(f"Step time, A -> B (mean of {deco.steps} steps; parts from the {deco.source.replace('_', ' ')})",
             present.WATERFALL_COLUMNS, present.waterfall_rows(result),
             caption="*: stands out of both runs' step-to-step variation (noise: twice the standard error of the "
                     "change); the parts and the remainder add up to the change.")
    show("Collective buckets that changed", present.BUCKET_COLUMNS, present.bucket_rows(result, top),
         caption="duration: median over steps of the mean per step, ± its robust spread; speed: duration A / B.")
    show("Ranks that got slower (mean per step window)", present.RANK_COLUMNS, present.rank_rows(result, top))
    lines = present.culprit_lines(result) + present.wait_lines(result)
    if lines:
        console.print()
        for line in lines:
            console.print(f"  - {line}")
    show("Setup differences", present.SETUP_COLUMNS, present.setup_rows(result))
    if result.network is not None:
        console.print()
        console.print(present.network_line(result))
    console.print()
    console.print(present.matching_line(result))
