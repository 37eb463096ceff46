"""`tracekit ingest`: read trace files into a run directory."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli._common import user_errors


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Run directory to write (created if missing; re-ingest reuses unchanged sources).")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Parallel parser processes (default: min(CPUs, files)).")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="Rank for traces whose distributedInfo has none (else taken from the file name).")
@click.option("--comm-pattern", "comm_patterns", multiple=True, metavar="REGEX",
              help="Regex marking a GPU kernel as communication (repeatable; replaces the defaults).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@user_errors
def ingest(paths: tuple[str, ...], out: Path, jobs: int | None, rank: int | None,
           comm_patterns: tuple[str, ...], quiet: bool) -> None:
    """Ingest trace files, directories and globs (format detected by content) into OUT."""
    from rich.console import Console

    from tracekit.ingest import ingest as run_ingest

    err = Console(stderr=True, markup=False, highlight=False)
    patterns = list(comm_patterns) if comm_patterns else None
    if quiet or not err.is_terminal:
        report = run_ingest(paths, out, jobs=jobs, rank=rank, comm_patterns=patterns)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        with Progress(TextColumn("ingest"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.description}"), console=err, transient=True) as bar:
            task = bar.add_task("", total=None)

            def progress(source, done: int, total: int) -> None:
                bar.update(task, completed=done, total=total, description=Path(source.path).name)

            report = run_ingest(paths, out, jobs=jobs, rank=rank, comm_patterns=patterns,
                                progress=progress)
    _print(report)
    if not report.ingested:
        ignored = (f": {len(report.ignored)} file(s) found, none in a supported format (Kineto traces, "
                   "Flight Recorder dumps, NCCL logs, NCCL Inspector or profiler-plugin files, nccl-tests "
                   "output)" if report.ignored else ": no input files")
        raise click.ClickException("nothing ingested" + (
            f": {report.failed[0].error}" if len(report.failed) == 1 else
            f" ({len(report.failed)} sources failed)" if report.failed else ignored))


def _print(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(markup=False, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(markup=False, highlight=False, soft_wrap=True, width=160)
    err = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)
    table = Table(show_edge=False, title_justify="left")
    for col in ("source", "format", "ranks", "events", "collectives", "skipped", "cached"):
        table.add_column(col, justify="right" if col in ("events", "collectives") else "left",
                         no_wrap=col != "skipped", overflow="fold")
    for s in report.sources:
        if not s.ok:
            continue
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(s.skipped.items())) or "-"
        table.add_row(Path(s.path).name, s.format or "?", ",".join(map(str, s.ranks)) or "-",
                      f"{s.events:,}", f"{s.collectives:,}", skipped, "yes" if s.cached else "no")
    if report.ingested:
        console.print(table)
        console.print(f"{len(report.ingested)} source(s), {len(report.ranks)} rank(s) -> {report.run_dir}")
    by_text: dict[str, list[str]] = {}
    for s in report.sources:
        for w in s.warnings:
            by_text.setdefault(w, []).append(Path(s.path).name)
    for w, names in by_text.items():
        where = names[0] if len(names) == 1 else f"{len(names)} sources"
        err.print(f"warning: {where}: {w}", markup=False)
    for w in report.warnings:
        err.print(f"warning: {w}", markup=False)
    if report.ingested or len(report.failed) > 1:
        for s in report.failed:
            err.print(f"error: {s.error}", markup=False)
    if report.ignored:
        names = ", ".join(Path(i["path"]).name for i in report.ignored[:5])
        more = f" and {len(report.ignored) - 5} more" if len(report.ignored) > 5 else ""
        err.print(f"note: ignored {len(report.ignored)} file(s) of unknown format found in directories: "
                  f"{names}{more}", markup=False)
