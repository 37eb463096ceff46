"""Findings: the analysis results said in sentences, with numbers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from tracekit.analysis.core import AnalysisResult


def fmt_ns(ns: float | None) -> str:
    """A duration for people: 812 ns, 35.2 µs, 81.2 ms, 1.23 s."""
    if ns is None:
        return "n/a"
    a = abs(ns)
    if a < 1e3:
        return f"{ns:.0f} ns"
    if a < 1e6:
        return f"{ns / 1e3:.1f} µs"
    if a < 1e9:
        return f"{ns / 1e6:.1f} ms"
    return f"{ns / 1e9:.2f} s"


def _pl(t) -> pl.DataFrame:
    df = pl.from_arrow(t)
    assert isinstance(df, pl.DataFrame)
    return df.with_columns(pl.col(pl.Categorical).cast(pl.String))


def findings(r: AnalysisResult) -> list[str]:
    """Sentences, most important first: stragglers, worst stall, exposed comm, EP, PP, clocks."""
    out: list[str] = []
    groups = _pl(r.groups)
    descs = dict(groups.select("group", "desc").iter_rows())

    def gname(g: str | None) -> str:
        if g is None:
            return "(no group)"
        d = descs.get(g)
        return f"{g} ({d})" if d and d != g else str(g)

    wide = _pl(r.per_rank_step)
    inst = _pl(r.instances)
    strag = _pl(r.stragglers)
    step_ns = float(wide.get_column("span_ns").median() or 0) if wide.height else 0.0
    floor = max(1_000_000.0, 0.05 * step_ns)

    for row in strag.head(3).iter_rows(named=True):
        if row["excess_ns"] < floor:
            break
        steps = row["steps"] or []
        where = f" (step {steps[0]})" if len(steps) == 1 else (
            f" (mostly step {steps[0]})" if steps else "")
        extra = ("" if row["excess_ns"] >= 0.95 * row["delay_ns"] else
                 f"; {fmt_ns(row['excess_ns'])} of it beyond the usual waits of the step")
        out.append(
            f"rank {row['rank']} was last in {row['times_last']} of {row['instances']} collectives and "
            f"delayed them by {fmt_ns(row['delay_ns'])} in total{where}{extra}.")
    systemic = strag.filter((pl.col("caused_ns") - pl.col("excess_ns")) >= floor).sort(
        pl.col("caused_ns") - pl.col("excess_ns"), descending=True)
    for row in systemic.head(2).iter_rows(named=True):
        out.append(
            f"rank {row['rank']} is regularly last (in {row['times_last']} of {row['instances']} "
            f"collectives), a recurring delay of {fmt_ns(row['caused_ns'] - row['excess_ns'])} "
            f"over the run, mostly on group {gname((row['groups'] or [None])[0])}.")
    if inst.height:
        worst = inst.sort(["max_wait_ns", "instance"], descending=[True, False]).row(0, named=True)
        if worst["max_wait_ns"] and worst["max_wait_ns"] >= floor / 2:
            out.append(
                f"The longest wait was {fmt_ns(worst['max_wait_ns'])} at {worst['dim']} {worst['op']} "
                f"#{worst['seq']} on group {gname(worst['group'])} in step {worst['step']}, waiting for rank "
                f"{worst['last_rank']}.")
    if wide.height:
        total = float(wide.get_column("span_ns").sum() or 0)
        long = _pl(r.per_rank_step_dim)
        if total > 0:
            exp = float(wide.get_column("exposed_ns").sum() or 0)
            by_dim = (long.group_by("dim").agg(pl.col("exposed_ns").sum()).sort("exposed_ns", descending=True)
                      if long.height else long)
            parts = ", ".join(f"{d} {100 * v / total:.0f}%" for d, v in by_dim.select("dim", "exposed_ns").iter_rows()
                              if v / total >= 0.005)
            comp = float(wide.get_column("compute_ns").sum() or 0)
            out.append(f"Exposed communication took {100 * exp / total:.0f}% of step time"
                       + (f" ({parts})" if parts else "") + f"; compute {100 * comp / total:.0f}%, "
                       f"idle {100 * float(wide.get_column('idle_ns').sum() or 0) / total:.0f}%.")
            idle = wide.group_by("rank").agg((pl.col("idle_ns").sum() / pl.col("span_ns").sum()).alias("f"))
            top_idle = idle.sort(["f", "rank"], descending=[True, False]).row(0, named=True)
            if top_idle["f"] and top_idle["f"] >= 0.2:
                out.append(f"rank {top_idle['rank']} was idle {100 * top_idle['f']:.0f}% of its step time, "
                           "the most of any rank.")
    for row in _pl(r.ep_groups).iter_rows(named=True):
        if row["imbalance"] is None:
            continue
        inter = row["inter_host_share"]
        out.append(
            f"EP group {gname(row['group'])}: rank {row['hot_rank']} is hot, receiving "
            f"{100 * (row['hot_share'] or 0):.0f}% of the all-to-all bytes when traffic is skewed "
            f"(imbalance up to {row['imbalance']:.1f}x max/mean over {row['instances']} all-to-alls)"
            + ("" if inter is None else f"; {100 * inter:.0f}% of the bytes cross hosts") + ".")
    bub = _pl(r.pp_bubbles)
    if bub.height:
        per_stage = bub.group_by("stage").agg((pl.col("bubble_ns").sum() / pl.col("span_ns").sum()).alias("f"))
        worst = bub.sort(["bubble_ns", "rank"], descending=[True, False]).row(0, named=True)
        stages = ", ".join(f"stage {s} {100 * f:.0f}%" for s, f in per_stage.sort("stage").iter_rows())
        out.append(f"Pipeline bubbles (idle or waiting on recv) per stage: {stages}; the largest was "
                   f"{fmt_ns(worst['bubble_ns'])} on rank {worst['rank']} in step {worst['step']}.")
    if r.mismatches.num_rows:
        mm = _pl(r.mismatches)
        fields = ", ".join(sorted(set(mm.get_column("field").to_list())))
        out.append(f"{mm.get_column('instance').n_unique()} collective instances disagree across ranks "
                   f"({fields}); see the mismatches table.")
    no_group = r.collectives.column("group").null_count if r.collectives.num_rows else 0
    if no_group:
        out.append(f"{no_group} of {r.collectives.num_rows} collective calls carry no process group; they are "
                   "matched by call order on each rank, which can pair unrelated calls.")
    a = r.alignment
    offs = [v for v in _pl(r.ranks).get_column("clock_offset_ns").to_list() if v is not None]
    if a.get("instances_used"):
        res = a["residual_ns"]
        out.append(f"Clock offsets span {fmt_ns(max(offs) - min(offs))}; after alignment, collective end "
                   f"times agree within {fmt_ns(res['median'])} (median) and {fmt_ns(res['p90'])} (p90) "
                   f"over {a['instances_used']} instances.")
    else:
        out.extend(a.get("notes", []))
    if a.get("unconnected_ranks"):
        out.append(f"Ranks {a['unconnected_ranks']} share no timed collective with rank {a['anchor']}; "
                   "their clocks could not be aligned to it.")
    return out
