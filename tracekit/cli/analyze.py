"""`tracekit analyze`: align ranks, classify dims and say where the time went."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tracekit.cli._common import executor_options, json_option, open_run_arg, run_argument, unsaved_note, user_errors


@click.command()
@run_argument
@json_option
@click.option("--dims", default=None, metavar="DIM=GROUP[,GROUP],...",
              help="Force dims for groups, by group id or description substring, e.g. dp=3,5,ep=moe.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1),
              help="How many stalls and stragglers to list.")
@click.option("--compute", default="auto", show_default=True,
              help="What counts as compute: auto, gpu, cpu, or comma-separated event kinds.")
@click.option("--no-write", is_flag=True, help="Do not write the prepared tables and results/analysis.json.")
@executor_options
@user_errors
def analyze(run: Path, as_json: bool, dims: str | None, top: int, compute: str, no_write: bool, executor: str,
            task_memory: str | None) -> None:
    """Match collectives, align clocks, classify dims, and report root causes, stragglers, EP and PP.

    Findings come first, most important first, each saying when it rests on partial or assumed
    data; then the tables they come from. RUN|PATH is a run directory, or a trace file or folder,
    ingested first into the run `tracekit replay` keeps for it.
    """
    from tracekit import workflows
    from tracekit.executors import parse_executor

    kinds: Any = compute if compute in ("auto", "gpu", "cpu") else [k.strip() for k in compute.split(",")]
    exe = parse_executor(executor, task_memory=task_memory)
    r = open_run_arg(run)
    r.require_data()
    result = workflows.analyze(r, dims=dims, top=top, compute=kinds, write=not no_write, executor=exe)
    unsaved_note(r)
    if as_json:
        click.echo(result.dumps())
        return
    _print(result, top)


def _print(result: Any, top: int) -> None:
    from rich.table import Table

    from tracekit.cli._common import console as make_console
    from tracekit.present import analysis_view

    console = make_console()
    view = analysis_view(result, top)
    console.print("Findings", style="bold")
    for line in view.findings:
        console.print(f"  - {line}")
    if view.steps:
        console.print()
        console.print(view.steps)
    if view.pipeline:
        console.print()
        console.print(view.pipeline)
    for table in view.tables:
        if not table.rows:
            continue
        t = Table(title=table.title, title_justify="left", show_edge=False, caption=table.caption,
                  caption_justify="left")
        for c in table.columns:
            text = c in ("group", "name", "op", "dim", "dims", "steps", "worst wait", "ranks")
            t.add_column(c, justify="left" if text else "right", no_wrap=not text,
                         overflow="fold" if text else "ellipsis")
        for r in table.rows:
            t.add_row(*r)
        console.print()
        console.print(t)
    if view.alignment:
        console.print()
        console.print(view.alignment)
