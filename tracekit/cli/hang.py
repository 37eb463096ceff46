"""`tracekit hang`: why did the job hang? (Flight Recorder dumps, or a run that holds them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tracekit.cli._common import console as safe_console
from tracekit.cli._common import json_option, unsaved_note, user_errors


@click.command()
@click.argument("paths", nargs=-1, required=True)
@json_option
@click.option("-o", "--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Ingest raw dumps into this run directory instead of the cache `tracekit replay` keeps for "
                   "the same paths (both kept and reused).")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="Rank for a dump whose content and file name name none.")
@click.option("--no-write", is_flag=True, help="Do not save results/hang.json in the run directory.")
@user_errors
def hang(paths: tuple[str, ...], as_json: bool, out: Path | None, rank: int | None, no_write: bool) -> None:
    """Say why a job hung: per process group, the last seq each rank reached, the first seq where
    the ranks diverge, the ranks that never issued it, and op/dtype/size mismatches.

    PATHS is a run directory, or Flight Recorder dumps (pickle or JSON) or NCCL debug logs (files,
    directories or globs), which are ingested first. With NCCL logs the sequence is NCCL's opCount
    per communicator, and the NCCL warnings and watchdog timeouts of the ranks involved are shown.
    A hang is a finding, not an error: the exit code is 0.
    """
    from tracekit import workflows
    from tracekit.results import dumps
    from tracekit.store import Run

    if len(paths) == 1 and Run.is_run(paths[0]):
        r = Run(paths[0])
        r.require_data()
        result = workflows.hang(r, write=not no_write)
        unsaved_note(r)
    else:
        result = workflows.hang(list(paths), out=out, rank=rank, write=not no_write)
    if as_json:
        click.echo(dumps(result, sort_keys=True))
        return
    _print(result)


def _print(result: Any) -> None:
    from rich.table import Table

    from tracekit.finding import texts
    from tracekit.hang import fmt_ranks

    console = safe_console(soft_wrap=True)
    if not console.is_terminal:
        console = safe_console(soft_wrap=True, width=160)
    err = safe_console(stderr=True, soft_wrap=True)
    for note in result.notes:
        err.print(f"note: {note}", markup=False)
    console.print("Verdict", style="bold")
    for line in texts(result.findings) or ["no divergence: every rank reached the same seq in every group."]:
        console.print(f"  - {line}", markup=False)
    table = Table(show_edge=False, title="Groups (last seq reached: ranks)", title_justify="left")
    for col in ("group", "desc", "ranks", "status", "diverges at", "missing", "last seq: ranks"):
        table.add_column(col, justify="right" if col in ("ranks", "diverges at") else "left", overflow="fold")
    for g in result.groups:
        by_seq: dict[int, list[int]] = {}
        for r, s in g.last_seq.items():
            by_seq.setdefault(s, []).append(r)
        spread = " · ".join(f"{s}: {fmt_ranks(rs, limit=8)}" for s, rs in sorted(by_seq.items(), reverse=True))
        table.add_row(g.group, g.desc or "", str(len(g.ranks)), g.status,
                      "" if g.first_divergent_seq is None else str(g.first_divergent_seq),
                      fmt_ranks(g.missing_ranks, limit=8) or "", spread or "-")
    console.print()
    console.print(table)
