"""`tracekit ingest`: read trace files into a run directory."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tracekit.cli._common import console, executor_options, json_option, user_errors

if TYPE_CHECKING:
    from tracekit.present import Source

safe_console = console


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Run directory to write (created if missing; re-ingest reuses unchanged sources).")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Parallel parser processes (default: min(CPUs, files)).")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="Rank for traces whose distributedInfo has none (else taken from the file name).")
@click.option("--rank-map", "rank_map", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="CSV of host,pid,device,rank: ranks for Nsight reports whose NCCL ranges carry none (NCCL < 2.19) "
                   "and that no NCCL log of the run describes.")
@click.option("--comm-pattern", "comm_patterns", multiple=True, metavar="REGEX",
              help="Regex marking a GPU kernel as communication (repeatable; replaces the defaults).")
@click.option("--allow-mixed", is_flag=True,
              help="Keep sources of different jobs (world sizes, process groups or times that disagree) in one "
                   "run; cross-rank results then mean little. A rank with sources from two jobs is still refused.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@json_option
@executor_options
@user_errors
def ingest(paths: tuple[str, ...], out: Path, jobs: int | None, rank: int | None, rank_map: Path | None,
           comm_patterns: tuple[str, ...], allow_mixed: bool, quiet: bool, as_json: bool, executor: str,
           task_memory: str | None) -> None:
    """Ingest trace files, directories and globs (format detected by content) into OUT.

    Sources from different jobs are refused (see --allow-mixed); the run records its world size
    and which ranks it holds, and later commands warn when ranks are missing.

    Exit code 0 when every source was ingested, 2 when some failed (the others are in OUT), 1
    when none could be (OUT is then left as it was; a new OUT gets no manifest).
    """
    from tracekit._text import term
    from tracekit.executors import parse_executor
    from tracekit.ingest import ingest as run_ingest
    from tracekit.ingest import read_rank_map

    err = console(stderr=True)
    patterns = list(comm_patterns) if comm_patterns else None
    options = {"jobs": jobs, "rank": rank, "comm_patterns": patterns, "allow_mixed": allow_mixed,
               "rank_map": read_rank_map(rank_map) if rank_map is not None else None,
               "executor": parse_executor(executor, task_memory=task_memory)}
    if quiet or as_json or not err.is_terminal:
        report = run_ingest(paths, out, **options)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        with Progress(TextColumn("ingest"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.description}"), console=err, transient=True) as bar:
            task = bar.add_task("", total=None)

            def progress(source, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, description=term(Path(source.path).name))

            report = run_ingest(paths, out, progress=progress, **options)
    if as_json:
        from tracekit.results import dumps

        click.echo(dumps(report, sort_keys=True))
    else:
        _print(report)
    if not report.ingested:
        from tracekit.parsers.registry import supported_formats
        from tracekit.store import Run

        ignored = (f": {len(report.ignored)} file(s) found, none in a supported format ({supported_formats()})"
                   if report.ignored else ": no input files")
        kept = f"; {out} left as it was" if Run.is_run(out) else f"; no run written to {out}"
        raise click.ClickException("nothing ingested" + (
            f": {report.failed[0].error}" if len(report.failed) == 1 else
            f" ({len(report.failed)} sources failed)" if report.failed else ignored) + kept)
    if report.exit_code == 2:
        if not as_json:
            err.print(f"partial: {len(report.ingested)} of {len(report.sources)} source(s) ingested, "
                      f"{len(report.failed)} failed (exit code 2)")
        raise SystemExit(2)


def sources_table(sources: Sequence[Source], *, title: str | None = None):
    """The per-source table `ingest` and `info` print (`present.source_rows`); the name column folds
    so that numbers are never cut."""
    from rich.table import Table

    from tracekit.present import source_rows

    table = Table(show_edge=False, title=title, title_justify="left", pad_edge=False)
    table.add_column("source", overflow="fold", ratio=1, min_width=12)
    table.add_column("format", no_wrap=True)
    table.add_column("ranks", overflow="fold", max_width=12)
    for col in ("stored", "skipped"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in source_rows(sources):
        table.add_row(r.source, r.format, r.ranks, r.stored, r.skipped)
    return table


def _print(report) -> None:
    from tracekit._text import grouped_warnings, short_paths
    from tracekit.present import skipped_summary

    console = safe_console(soft_wrap=False)
    err = safe_console(stderr=True, soft_wrap=True)
    ok = report.ingested
    if report.ingested:
        console.print(sources_table(ok))
        note = skipped_summary(ok)
        if note:
            console.print(note, soft_wrap=True)
        cached = sum(1 for s in report.ingested if s.cached)
        console.print(f"{len(report.ingested)} source(s){f' ({cached} cached)' if cached else ''}, "
                      f"{len(report.ranks)} rank(s) -> {report.run_dir}", soft_wrap=True)
        if report.validity is not None:
            for f in report.validity.findings():
                err.print(f"warning: {f.text}", markup=False)
    names = short_paths([s.path for s in report.sources])
    for line in grouped_warnings((names[s.path], s.warnings) for s in report.sources):
        err.print(f"warning: {line}", markup=False)
    for w in report.warnings:
        err.print(f"warning: {w}", markup=False)
    if report.ingested or len(report.failed) > 1:
        for s in report.failed:
            err.print(f"error: {s.error}", markup=False)
    if report.ignored:
        ignored = ", ".join(Path(i.path).name for i in report.ignored[:5])
        more = f" and {len(report.ignored) - 5} more" if len(report.ignored) > 5 else ""
        err.print(f"note: ignored {len(report.ignored)} file(s) of unknown format found in directories: "
                  f"{ignored}{more}", markup=False)
