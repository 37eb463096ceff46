"""`tracekit info`: what a run directory holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tracekit._text import fmt_ranks
from tracekit.cli._common import json_option, user_errors


@click.command()
@click.argument("run", type=click.Path(exists=True, file_okay=False, path_type=Path))
@json_option
@user_errors
def info(run: Path, as_json: bool) -> None:
    """Ranks, hosts, groups, steps, time span, formats and per-source counts of RUN."""
    from tracekit.ingest import describe_run

    doc = describe_run(run)
    if as_json:
        import json

        click.echo(json.dumps(doc, indent=1, sort_keys=True))
        return
    _print(doc)


def _print(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(markup=False, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(markup=False, highlight=False, soft_wrap=True, width=160)
    out = console.print
    ranks = doc["ranks"]
    out(f"run        {doc['run']}")
    out(f"tracekit   {doc['tracekit_version']} (schema {doc['schema_version']})")
    out(f"ranks      {len(ranks)}: {fmt_ranks(ranks)}" + (
        f" of world {', '.join(map(str, doc['world_sizes']))}" if doc["world_sizes"] else ""))
    out(f"hosts      {len(doc['hosts'])}: {', '.join(doc['hosts']) or '-'}", markup=False)
    out(f"devices    {', '.join(doc['devices']) or '-'}", markup=False)
    out(f"formats    {', '.join(f'{k} ({v})' for k, v in sorted(doc['formats'].items())) or '-'}")
    out(f"steps      {fmt_ranks(doc['steps']) or '-'}")
    span = doc["span"]
    if span["start_ns"] is not None:
        out(f"time span  {span['duration_s']:.6f} s (from {span['start_ns']} ns to {span['end_ns']} ns)")
    out(f"tables     {', '.join(f'{k} {v:,}' for k, v in sorted(doc['tables'].items()))}")
    if doc["groups"]:
        t = Table(title="groups", title_justify="left", show_edge=False)
        for col in ("group", "desc", "backend", "size", "ranks", "dims", "collectives"):
            t.add_column(col, justify="right" if col in ("size", "collectives") else "left")
        for g in doc["groups"]:
            ranks_txt = fmt_ranks(g["ranks"]) + ("" if g["ranks_complete"] else " (partial)")
            t.add_row(g["group"], g["desc"] or "-", g["backend"] or "-", str(g["size"] or "-"),
                      ranks_txt, ",".join(g["dims"]) or "-", f"{g['collectives']:,}")
        out()
        out(t)
    t = Table(title="sources", title_justify="left", show_edge=False)
    for col in ("source", "format", "ranks", "read", "stored", "skipped", "status"):
        t.add_column(col, justify="right" if col in ("read", "stored") else "left")
    for s in doc["sources"]:
        skipped = ", ".join(f"{k} {v}" for k, v in sorted((s.get("skipped") or {}).items())) or "-"
        status = "error" if s.get("error") else ("cached" if s.get("cached") else "ok")
        t.add_row(Path(s["path"]).name, s.get("format") or "?", ",".join(map(str, s.get("ranks") or [])) or "-",
                  f"{s.get('read') or 0:,}", f"{s.get('stored') or 0:,}", skipped, status)
    out()
    out(t)
    for s in doc["sources"]:
        if s.get("error"):
            out(f"error: {s['error']}", markup=False)
        for w in s.get("warnings") or []:
            out(f"warning: {Path(s['path']).name}: {w}", markup=False)
    for w in doc["warnings"]:
        out(f"warning: {w}", markup=False)
