"""`tracekit analyze`: align ranks, classify dims and say where the time went."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tracekit.cli._common import executor_options, json_option, open_run_arg, run_argument, unsaved_note, user_errors

LEGEND = ("delay: the waits of the collectives where the rank was last; caused: the part its own work "
          "explains (it arrived later than its usual gap); excess: the part beyond the step's usual pattern.")


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
    from tracekit.analysis import analyze as run_analysis
    from tracekit.executors import parse_executor

    kinds: Any = compute if compute in ("auto", "gpu", "cpu") else [k.strip() for k in compute.split(",")]
    exe = parse_executor(executor, task_memory=task_memory)
    r = open_run_arg(run)
    r.require_data()
    result = run_analysis(r, dims=dims, top=top, compute=kinds, write=not no_write, executor=exe)
    unsaved_note(r)
    if as_json:
        click.echo(result.dumps())
        return
    _print(result, top)


def _print(result: Any, top: int) -> None:
    from rich.table import Table

    from tracekit._text import fmt_bytes, fmt_ns, fmt_pct, fmt_rate
    from tracekit.analysis.steps import STEP_TIME
    from tracekit.cli._common import console as make_console
    from tracekit.present import group_rows, root_cause_rows, schedule_line, straggler_rows

    console = make_console()
    doc = result.to_json()
    console.print("Findings", style="bold")
    for f in result.findings or []:
        console.print(f"  - {f.text}")
    if not result.findings:
        console.print("  - nothing stands out.")

    def show(title: str, columns: list[str], rows: list[list[str]], caption: str | None = None) -> None:
        if not rows:
            return
        t = Table(title=title, title_justify="left", show_edge=False, caption=caption, caption_justify="left")
        for c in columns:
            text = c in ("group", "name", "op", "dim", "dims", "steps", "worst wait", "ranks")
            t.add_column(c, justify="left" if text else "right", no_wrap=not text,
                         overflow="fold" if text else "ellipsis")
        for r in rows:
            t.add_row(*r)
        console.print()
        console.print(t)

    steps = doc["step_times"]
    if steps:
        console.print()
        console.print(f"{STEP_TIME}: mean {fmt_ns(doc['summary']['mean_step_ns'])}; "
                      + ", ".join(f"step {s['step']} {fmt_ns(s['step_ns'])}" for s in steps[:12]))
    show("Stalls by root cause (one row per cascade of waits)",
         ["root", "step", "busy", "waits", "lost", "worst wait"],
         [[c.root, c.step, c.busy, c.waits, c.lost, c.worst] for c in root_cause_rows(result, top)],
         caption="root: the rank at the end of the chain of waits; busy: how long it was busy with its own work "
                 "while the others waited; lost: every waiting rank's wait, summed.")
    show("Stragglers", ["rank", "last", "of", "delay", "caused", "excess", "steps"],
         [[s.rank, s.last, s.of, s.delay, s.caused, s.excess, s.steps] for s in straggler_rows(result, top)],
         caption=LEGEND)
    cp = doc["critical_path"]
    cp_dims = sorted({d["dim"] for c in cp for d in c["comm_by_dim"]})
    show("Critical path per step", ["step", "step time", "compute", *(f"{d} comm" for d in cp_dims), "idle", "ranks",
                                    "jumps"], [
        [str(c["step"]), fmt_ns(c["step_ns"]), fmt_ns(c["compute_ns"]),
         *(fmt_ns({d["dim"]: d["ns"] for d in c["comm_by_dim"]}.get(dim, 0)) for dim in cp_dims),
         fmt_ns(c["idle_ns"]), ",".join(map(str, c["ranks"])), str(c["hops"])] for c in cp[:top]],
        caption="Walked back from the rank that ended the step, jumping to the rank it waited for; idle: nothing "
                "traced on the path (host time, data loading, start skew).")
    agg = result.per_rank_means()
    if agg.height:
        show("Per rank (mean per step window)", ["rank", "window", "compute", "exposed comm", "idle"], [
            [str(r["rank"]), fmt_ns(r["span"]), fmt_ns(r["compute"]), fmt_ns(r["exposed"]), fmt_ns(r["idle"])]
            for r in agg.head(max(top, 16)).iter_rows(named=True)],
            caption="window: the rank's own ProfilerStep span (not the step time, which runs from the first "
                    "rank in to the last rank out).")
    show("EP groups", ["group", "ranks", "splits", "hot rank", "hot share", "imbalance", "inter-host"], [
        [str(e["group"]), f"{e['present']} of {e['members']}" if not e["complete"] else str(e["members"]),
         "assumed" if e["splits_assumed"] >= 1 else ("measured" if not e["splits_assumed"] else
                                                     f"{100 * e['splits_assumed']:.0f}% assumed"),
         "-" if e["hot_rank"] is None else str(e["hot_rank"]), fmt_pct(e["hot_share"]),
         "-" if e["imbalance"] is None else f"{e['imbalance']:.2f}x", fmt_pct(e["inter_host_share"])]
        for e in doc["ep"][:top]],
        caption="hot: receives at least 1.25x the mean in some all-to-all; imbalance: max/mean of the bytes "
                "received per rank; inter-host: '-' when hosts are unknown.")
    sched = result.pp_schedule
    if sched is not None:
        console.print()
        console.print(schedule_line(sched))
    by_instance = [b for b in doc["bandwidth"] if b["basis"] == "instance"]
    show("Bandwidth (median per group and op)", ["group", "op", "dim", "n", "size", "busbw"], [
        [str(b["group"]), str(b["op"]), str(b["dim"]), str(b["instances"]), fmt_bytes(b["bytes_median"]),
         fmt_rate(b["busbw_median_gbps"])] for b in by_instance[:top]],
        caption="busbw: algbw x the nccl-tests factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, "
                "all_to_all (n-1)/n; 1 otherwise).")
    by_kernel = [b for b in doc["bandwidth"] if b["basis"] == "kernel_time"]
    show("Bandwidth from kernel times (per group, op and size; no other rank of the call is in the run)",
         ["group", "op", "dim", "n", "size", "kernel time", "busbw (at least)"], [
             [str(b["group"]), str(b["op"]), str(b["dim"]), str(b["instances"]), fmt_bytes(b["bytes_median"]),
              fmt_ns(b["duration_median_ns"]), fmt_rate(b["busbw_median_gbps"])] for b in by_kernel[:top * 2]],
         caption="kernel time: the median kernel duration, an upper bound on the transfer (it includes waiting for "
                 "the ranks outside the run), so busbw is a lower bound; factors as above.")
    for mb in result.microbench:
        show(f"nccl-tests {mb.test or ''} busbw ({mb.nranks or '?'} ranks, {mb.source})",
             ["size (B)", "time (us)", "busbw (GB/s)", "in-place time (us)", "in-place busbw (GB/s)"],
             [[str(x.size_bytes), _num(x.oop_time_us, 1), _num(x.oop_busbw_gbps, 2), _num(x.ip_time_us, 1),
               _num(x.ip_busbw_gbps, 2)] for x in mb.sizes],
             caption=f"as nccl-tests printed it (out-of-place, then in-place); peak {fmt_rate(mb.peak_busbw_gbps)} "
                     f"at {fmt_bytes(mb.peak_size_bytes)} ({mb.peak_side}).")
    used, idle = group_rows(result)
    show("Groups (with collective calls in the trace)", ["group", "name", "size", "dims", "calls"],
         [[g.group, g.label, str(g.size or "-"), g.dims, f"{g.calls:,}"] for g in used[:top * 2]],
         caption=f"{idle} more group{'s' if idle != 1 else ''} declared by the trace "
                 f"carr{'y' if idle != 1 else 'ies'} no collective call (tracekit info lists them)." if idle else None)
    a = result.alignment
    if not result.collectives.num_rows:
        return
    console.print()
    console.print(f"clock alignment: {a.method}; {a.instances_used} instances, residual median "
                  f"{fmt_ns(a.residual_ns['median'])}, p90 {fmt_ns(a.residual_ns['p90'])}, "
                  f"max {fmt_ns(a.residual_ns['max'])}")



def _num(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"
