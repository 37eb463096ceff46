"""`tracekit analyze`: align ranks, classify dims and say where the time went."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tracekit.cli._common import json_option, user_errors


@click.command()
@click.argument("run", type=click.Path(exists=True, file_okay=False, path_type=Path))
@json_option
@click.option("--dims", default=None, metavar="DIM=GROUP[,GROUP],...",
              help="Force dims for groups, by group id or description substring, e.g. dp=3,5,ep=moe.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1),
              help="How many stalls and stragglers to list.")
@click.option("--compute", default="auto", show_default=True,
              help="What counts as compute: auto, gpu, cpu, or comma-separated event kinds.")
@click.option("--no-write", is_flag=True, help="Do not write the prepared tables and results/analysis.json.")
@user_errors
def analyze(run: Path, as_json: bool, dims: str | None, top: int, compute: str, no_write: bool) -> None:
    """Match collectives, align clocks, classify dims, and report stalls, stragglers, EP and PP."""
    from tracekit.analysis import analyze as run_analysis

    kinds: Any = compute if compute in ("auto", "gpu", "cpu") else [k.strip() for k in compute.split(",")]
    result = run_analysis(run, dims=dims, top=top, compute=kinds, write=not no_write)
    if as_json:
        click.echo(result.dumps())
        return
    _print(result, top)


def _print(result: Any, top: int) -> None:
    import polars as pl
    from rich.console import Console
    from rich.table import Table

    from tracekit.analysis import fmt_ns

    console = Console(markup=False, highlight=False, soft_wrap=True)
    doc = result.to_json()
    console.print("Findings", style="bold")
    for line in doc["findings"] or ["nothing stands out."]:
        console.print(f"  - {line}")

    def show(title: str, columns: list[str], rows: list[list[str]]) -> None:
        if not rows:
            return
        t = Table(title=title, title_justify="left", show_edge=False)
        for c in columns:
            t.add_column(c, justify="left" if c in ("group", "op", "dim", "dims", "steps") else "right")
        for r in rows:
            t.add_row(*r)
        console.print()
        console.print(t)

    show("Stragglers", ["rank", "last", "of", "delay", "caused", "excess", "steps"], [
        [str(s["rank"]), str(s["times_last"]), str(s["instances"]), fmt_ns(s["delay_ns"]),
         fmt_ns(s["caused_ns"]), fmt_ns(s["excess_ns"]), ",".join(map(str, (s["steps"] or [])[:5]))]
        for s in doc["stragglers"][:top] if s["times_last"]])
    show("Longest waits", ["group", "seq", "op", "dim", "step", "last rank", "max wait", "busbw GB/s"], [
        [str(s["group"]), str(s["seq"]), str(s["op"]), str(s["dim"]), str(s["step"]), str(s["last_rank"]),
         fmt_ns(s["max_wait_ns"]), _num(s["busbw_gbps"])] for s in doc["stalls"][:top]])
    prs = pl.DataFrame([{"rank": r["rank"], "span": r["span_ns"], "compute": r["compute_ns"],
                         "exposed": r["exposed_total_ns"], "idle": r["idle_ns"]} for r in doc["per_rank_step"]]
                       ) if doc["per_rank_step"] else None
    if prs is not None:
        agg = prs.group_by("rank").agg(pl.all().mean()).sort("rank")
        show("Per rank (mean per step)", ["rank", "step time", "compute", "exposed comm", "idle"], [
            [str(r["rank"]), fmt_ns(r["span"]), fmt_ns(r["compute"]), fmt_ns(r["exposed"]), fmt_ns(r["idle"])]
            for r in agg.head(max(top, 16)).iter_rows(named=True)])
    show("EP groups", ["group", "ranks", "hot rank", "hot share", "imbalance", "inter-host"], [
        [str(e["group"]), str(len(e["ranks"] or [])), str(e["hot_rank"]), _pct(e["hot_share"]),
         _num(e["imbalance"]), _pct(e["inter_host_share"])] for e in doc["ep"][:top]])
    show("Bandwidth (median per group and op)", ["group", "op", "dim", "n", "bytes", "busbw GB/s"], [
        [str(b["group"]), str(b["op"]), str(b["dim"]), str(b["instances"]), _num(b["bytes_median"]),
         _num(b["busbw_median_gbps"])] for b in doc["bandwidth"][:top]])
    show("Groups", ["group", "dims"], [[g, ",".join(d)] for g, d in list(doc["dims"].items())[:top * 2]])
    a = doc["alignment"]
    console.print()
    console.print(f"clock alignment: {a['method']}; {a['instances_used']} instances, residual median "
                  f"{fmt_ns(a['residual_ns']['median'])}, p90 {fmt_ns(a['residual_ns']['p90'])}, "
                  f"max {fmt_ns(a['residual_ns']['max'])}")


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"

