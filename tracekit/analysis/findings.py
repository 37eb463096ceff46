"""Findings: the analysis results said in sentences, with the numbers behind them, as typed
`tracekit.finding.Finding` objects (the CLI prints their text, `--json` their fields, the report
draws them).

Every sentence that depends on ranks being present, hosts being known or split sizes being in
the trace says so itself; nothing here is re-derived by the report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from tracekit._text import fmt_ns, fmt_ranks
from tracekit.finding import Finding

if TYPE_CHECKING:
    from tracekit.analysis.core import AnalysisResult

__all__ = ["findings", "fmt_ns", "op_label"]

#: Causes and waits shorter than this share of the median step (and 1 ms) are not findings.
FLOOR_SHARE = 0.05
FLOOR_NS = 1_000_000


def _pl(t: Any) -> pl.DataFrame:
    df = pl.from_arrow(t)
    assert isinstance(df, pl.DataFrame)
    return df.with_columns(pl.col(pl.Categorical).cast(pl.String))


def op_label(dim: str | None, op: str | None, seq: int | None) -> str:
    """ "PP send/recv #3", "EP all_to_all #5": how an instance is named in sentences and tables."""
    name = "send/recv" if op == "send_recv" else (op or "?")
    return f"{dim or '?'} {name} #{seq if seq is not None else '?'}"


def _step(step: int | None) -> str:
    return "" if step is None else f" in step {step}"


def findings(r: AnalysisResult) -> list[Finding]:
    """Findings, most important first, each once: run validity (mixed jobs, missing ranks), hang,
    root causes, stragglers, where the time went, the critical path, EP, PP, mismatches, unknown
    hosts (only when the run communicates), calls without a group (only when several ranks call)
    and clocks."""
    out: list[Finding] = []
    v = r.validity
    partial = v.partial and v.cross_rank
    groups = _pl(r.groups)
    descs = dict(groups.select("group", "desc").iter_rows())

    def gname(g: str | None) -> str:
        if g is None:
            return "(no group)"
        d = descs.get(g)
        return f"{g} ({d})" if d and d != g else str(g)

    validity = v.findings()
    hosts = [f for f in validity if f.kind == "unknown_hosts"]
    out.extend(f for f in validity if f.kind != "unknown_hosts")
    if r.hang is not None and r.hang.hung:
        fr = r.hang.source == "flight_recorder"
        for lead in r.hang.findings:
            out.append(Finding(kind="hang", severity="error" if fr else "warning", text=lead.text,
                               ranks=tuple(r.hang.suspects), data={"source": r.hang.source}))
            break
        for g in r.hang.groups:
            if g.status in ("hang", "mismatch"):
                out.append(Finding(kind="hang", severity="error" if fr else "warning", text=g.verdict,
                                   ranks=tuple(g.suspects), group=g.group,
                                   value=None if g.first_divergent_seq is None else float(g.first_divergent_seq),
                                   data={"status": g.status, "source": r.hang.source}))

    wide = _pl(r.per_rank_step)
    inst = _pl(r.instances)
    strag = _pl(r.stragglers)
    steps = _pl(r.step_times)
    step_ns = float(steps.get_column("step_ns").median() or 0) if steps.height else 0.0
    floor = max(float(FLOOR_NS), FLOOR_SHARE * step_ns)
    maybe_absent = (f" ({v.presence()}: the rank everyone waited for may be outside the run)"
                    if partial else "")

    casc = _pl(r.root_causes)
    by_id = {row["instance"]: row for row in inst.iter_rows(named=True)} if inst.height else {}
    seen_roots: set[int] = set()
    for row in casc.iter_rows(named=True):
        if len(seen_roots) >= 3 or row["worst_wait_ns"] < floor:
            break
        if row["root_rank"] in seen_roots:
            continue
        seen_roots.add(row["root_rank"])
        out.append(_root_finding(row, casc, by_id, gname, maybe_absent))

    for row in strag.head(3).iter_rows(named=True):
        if row["excess_ns"] < floor:
            break
        where = _where_steps(row["steps"])
        extra = ("" if row["excess_ns"] >= 0.95 * row["delay_ns"] else
                 f"; {fmt_ns(row['excess_ns'])} of it beyond the usual waits of the step")
        out.append(Finding(
            kind="straggler", severity="warning", ranks=(row["rank"],), value=float(row["excess_ns"]),
            step=(row["steps"] or [None])[0],
            text=f"rank {row['rank']} was last in {row['times_last']} of {row['instances']} collectives and "
                 f"delayed them by {fmt_ns(row['delay_ns'])} in total{where}{extra}{maybe_absent}."))
    systemic = strag.filter((pl.col("caused_ns") - pl.col("excess_ns")) >= floor).sort(
        pl.col("caused_ns") - pl.col("excess_ns"), descending=True)
    for row in systemic.head(2).iter_rows(named=True):
        group = (row["groups"] or [None])[0]
        out.append(Finding(
            kind="systemic_straggler", severity="info", ranks=(row["rank"],), group=group,
            value=float(row["caused_ns"] - row["excess_ns"]),
            text=f"rank {row['rank']} is regularly last (in {row['times_last']} of {row['instances']} "
                 f"collectives), a recurring delay of {fmt_ns(row['caused_ns'] - row['excess_ns'])} "
                 f"over the run, mostly on group {gname(group)}{maybe_absent}."))

    if wide.height:
        out.extend(_time_findings(r, wide, steps, v))
    out.extend(_critical_findings(r))
    out.extend(_ep_findings(r, gname))
    bub = _pl(r.pp_bubbles)
    if bub.height:
        per_stage = bub.group_by("stage").agg((pl.col("bubble_ns").sum() / pl.col("span_ns").sum()).alias("f"))
        worst = bub.sort(["bubble_ns", "rank"], descending=[True, False]).row(0, named=True)
        stages = ", ".join(f"stage {s} {100 * f:.0f}%" for s, f in per_stage.sort("stage").iter_rows())
        out.append(Finding(
            kind="pp_bubble", severity="info", ranks=(worst["rank"],), step=worst["step"],
            value=float(worst["bubble_ns"]),
            text=f"Pipeline bubbles (idle or waiting on recv) per stage: {stages}; the largest was "
                 f"{fmt_ns(worst['bubble_ns'])} on rank {worst['rank']}{_step(worst['step'])}."
                 + (f" Stages come from the {v.presence()}." if partial else "")))
    if r.mismatches.num_rows:
        mm = _pl(r.mismatches)
        fields = ", ".join(sorted(set(mm.get_column("field").to_list())))
        n = mm.get_column("instance").n_unique()
        out.append(Finding(kind="mismatch", severity="warning", value=float(n),
                           text=f"{n} collective instances disagree across ranks ({fields}); see the mismatches "
                                "table."))
    if r.collectives.num_rows:  # where hosts matter: after what the run says, before how it was read
        out.extend(hosts)
    no_group = r.collectives.column("group").null_count if r.collectives.num_rows else 0
    calling_ranks = len(set(r.collectives.column("rank").to_pylist())) if no_group else 0
    if no_group and calling_ranks > 1:  # one rank's calls have nothing to be paired with
        out.append(Finding(kind="no_group", severity="warning", value=float(no_group),
                           text=f"{no_group} of {r.collectives.num_rows} collective calls carry no process group; "
                                "they are matched by call order on each rank, which can pair unrelated calls."))
    out.extend(_alignment_findings(r))
    from tracekit.microbench import microbench_findings

    out.extend(microbench_findings(r.microbench))
    seen: set[tuple[str, str]] = set()
    unique = []
    for f in out:  # a caveat said once
        if (f.kind, f.text) not in seen:
            seen.add((f.kind, f.text))
            unique.append(f)
    return unique


def _root_finding(row: dict[str, Any], casc: pl.DataFrame, by_id: dict[int, dict[str, Any]], gname: Any,
                  caveat: str) -> Finding:
    """ "rank A waited W at X for rank B; rank B was late because it waited for rank C; rank C
    was busy S with its own work before Y: the root cause of N waits"."""
    worst = by_id[row["worst_instance"]]
    root = by_id[row["root_instance"]]
    chain = worst.get("chain") or []
    hops = [by_id[i] for i in chain[1:] if i in by_id]
    middle = ""
    via = [h for h in hops if h["last_rank"] not in (worst["last_rank"], row["root_rank"])]
    if worst["last_rank"] != row["root_rank"]:
        through = ", ".join(f"rank {h['last_rank']}" for h in via[:3])
        middle = (f"; rank {worst['last_rank']} was late because it waited "
                  + (f"via {through} " if via else "") + f"for rank {row['root_rank']}")
    reason = {"own_work": "was busy {} with its own work before {} on group {}{}",
              "first_call": "was {} late to its first collective, {} on group {}{}"}[row["root_reason"]]
    cause = reason.format(fmt_ns(row["root_stall_ns"]), op_label(root["dim"], root["op"], root["seq"]),
                          gname(root["group"]), _step(row["root_step"]))
    same = casc.filter(pl.col("root_rank") == row["root_rank"])
    elsewhere = same.filter(pl.col("root_step").ne_missing(row["root_step"]))
    others = sorted(s for s in elsewhere.get_column("root_step").to_list() if s is not None)
    n, lost = int(row["instances"]), int(row["total_wait_ns"])
    again = (f"; rank {row['root_rank']} was also at the root of waits in step{'s' if len(others) > 1 else ''} "
             f"{', '.join(map(str, others))} ({fmt_ns(int(elsewhere.get_column('total_wait_ns').sum()))} of rank "
             "time)" if others else "")
    text = (f"rank {worst['first_rank']} waited {fmt_ns(worst['max_wait_ns'])} at "
            f"{op_label(worst['dim'], worst['op'], worst['seq'])} on group {gname(worst['group'])}"
            f"{_step(worst['step'])} for rank {worst['last_rank']}{middle}; rank {row['root_rank']} {cause}: "
            f"the root cause of {n} wait{'s' if n != 1 else ''} ({fmt_ns(lost)} of rank time lost){caveat}{again}.")
    return Finding(
        kind="root_cause", severity="warning", text=text, ranks=(row["root_rank"],), group=root["group"],
        step=row["root_step"], value=float(row["root_stall_ns"]),
        data={"root_rank": row["root_rank"], "waited_on": worst["last_rank"], "waiter": worst["first_rank"],
              "root_instance": row["root_instance"], "instance": worst["instance"], "wait_ns": worst["max_wait_ns"],
              "chain": list(chain), "chain_ranks": list(worst.get("chain_ranks") or []),
              "steps": sorted(s for s in same.get_column("root_step").to_list() if s is not None),
              "instances": n, "total_wait_ns": lost})


def _where_steps(steps: list[int] | None) -> str:
    steps = [s for s in (steps or []) if s is not None]
    if not steps:
        return ""
    return f" (step {steps[0]})" if len(steps) == 1 else f" (mostly step {steps[0]})"


def _time_findings(r: AnalysisResult, wide: pl.DataFrame, steps: pl.DataFrame, v: Any) -> list[Finding]:
    out: list[Finding] = []
    total = float(wide.get_column("span_ns").sum() or 0)
    if total <= 0:
        return out
    long = _pl(r.per_rank_step_dim)
    exp = float(wide.get_column("exposed_ns").sum() or 0)
    by_dim = (long.group_by("dim").agg(pl.col("exposed_ns").sum()).sort("exposed_ns", descending=True)
              if long.height else long)
    parts = ", ".join(f"{d} {100 * x / total:.0f}%" for d, x in by_dim.select("dim", "exposed_ns").iter_rows()
                      if x / total >= 0.005)
    comp = float(wide.get_column("compute_ns").sum() or 0)
    idle = float(wide.get_column("idle_ns").sum() or 0)
    mean_step = float(steps.get_column("step_ns").mean() or 0) if steps.height else 0.0
    lead = (f"The mean step time is {fmt_ns(mean_step)} over {steps.height} step{'s' if steps.height != 1 else ''} "
            "(first rank in to last rank out). " if mean_step else "")
    who = ("" if not v.partial else f" ({v.presence()}: these shares describe only them)")
    out.append(Finding(
        kind="exposed_comm", severity="info", value=exp / total,
        data={"compute_share": comp / total, "idle_share": idle / total,
              "by_dim": {d: x / total for d, x in by_dim.select("dim", "exposed_ns").iter_rows()}},
        text=f"{lead}Within the ranks' step windows, exposed communication took {100 * exp / total:.0f}%"
             + (f" ({parts})" if parts else "") + f", compute {100 * comp / total:.0f}%, idle "
             f"{100 * idle / total:.0f}%{who}."))
    share = wide.group_by("rank").agg((pl.col("idle_ns").sum() / pl.col("span_ns").sum()).alias("f"))
    top = share.sort(["f", "rank"], descending=[True, False]).row(0, named=True)
    if top["f"] and top["f"] >= 0.2:
        if share.height == 1:
            text = (f"rank {top['rank']} was idle {100 * top['f']:.0f}% of its step windows"
                    + (f" ({v.presence()}: it cannot be compared with the others)" if v.partial else "") + ".")
        else:
            text = (f"rank {top['rank']} was idle {100 * top['f']:.0f}% of its step windows, the most of the "
                    f"{share.height} ranks" + (f" present ({v.presence()})" if v.partial else "") + ".")
        out.append(Finding(kind="idle", severity="info", ranks=(top["rank"],), value=float(top["f"]), text=text))
    return out


def _critical_findings(r: AnalysisResult) -> list[Finding]:
    cp = _pl(r.critical_path)
    if cp.height == 0:
        return []
    total = float(cp.get_column("step_ns").sum() or 0)
    if total <= 0:
        return []
    dims: dict[str, int] = {}
    for items in cp.get_column("comm_by_dim").to_list():
        for item in items or []:
            dims[item["dim"]] = dims.get(item["dim"], 0) + item["ns"]
    comp = float(cp.get_column("compute_ns").sum())
    idle = float(cp.get_column("idle_ns").sum())
    comm = ", ".join(f"{d} {100 * x / total:.0f}%" for d, x in sorted(dims.items(), key=lambda kv: -kv[1])
                     if x / total >= 0.005)
    ranks = sorted({x for rs in cp.get_column("ranks").to_list() for x in rs or []})
    hops = int(cp.get_column("hops").sum())
    return [Finding(
        kind="critical_path", severity="info", value=comp / total, ranks=tuple(ranks),
        data={"compute_share": comp / total, "idle_share": idle / total,
              "comm_share": {d: x / total for d, x in dims.items()}},
        text=f"Critical path (walked back from the rank that ended each step, jumping to the rank it "
             f"waited for, {hops} jump{'s' if hops != 1 else ''} over ranks {fmt_ranks(ranks, limit=8)}): "
             f"compute {100 * comp / total:.0f}%, communication "
             + (comm if comm else "0%") + f", idle or waiting on untraced work {100 * idle / total:.0f}%.")]


def _ep_findings(r: AnalysisResult, gname: Any) -> list[Finding]:
    out: list[Finding] = []
    for row in _pl(r.ep_groups).iter_rows(named=True):
        g = gname(row["group"])
        if not row["complete"]:
            out.append(Finding(
                kind="partial_run", severity="warning", group=row["group"], value=float(row["present"]),
                text=f"EP group {g}: {row['present']} of {row['members']} members present: the load per rank "
                     "cannot be measured (bytes received from ranks outside the run are unknown); "
                     "traffic to absent members is not drawn."))
            continue
        if row["splits_assumed"] > 0:
            n = round(row["splits_assumed"] * row["instances"])
            out.append(Finding(
                kind="assumed_splits", severity="warning", group=row["group"], value=row["splits_assumed"],
                text=f"EP group {g}: split sizes not in the trace for {n} of {row['instances']} all-to-alls: "
                     "traffic assumed even, so no imbalance can be seen there."))
            if row["splits_assumed"] >= 1:
                continue
        if row["hot_rank"] is None:
            if row["imbalance"] is not None:
                out.append(Finding(
                    kind="ep_imbalance", severity="info", group=row["group"], value=row["imbalance"],
                    text=f"EP group {g}: all-to-all traffic is balanced (at most {row['imbalance']:.2f}x the "
                         f"mean per rank over {row['instances']} all-to-alls); no rank is hot."))
            continue
        inter = row["inter_host_share"]
        out.append(Finding(
            kind="ep_imbalance", severity="warning", group=row["group"], ranks=tuple(row["hot_ranks"] or []),
            value=row["imbalance"],
            text=f"EP group {g}: rank {row['hot_rank']} is hot, receiving {100 * (row['hot_share'] or 0):.0f}% "
                 f"of the all-to-all bytes when traffic is skewed (imbalance up to {row['imbalance']:.1f}x "
                 f"max/mean over {row['instances']} all-to-alls)"
                 + ("; hosts unknown, so the inter-host share is not known" if inter is None else
                    f"; {100 * inter:.0f}% of the bytes cross hosts") + "."))
    return out


def _alignment_findings(r: AnalysisResult) -> list[Finding]:
    a = r.alignment
    out: list[Finding] = []
    offs = [x for x in _pl(r.ranks).get_column("clock_offset_ns").to_list() if x is not None]
    if a.instances_used:
        res = a.residual_ns
        out.append(Finding(
            kind="alignment", severity="info", value=res["median"],
            text=f"Clock offsets span {fmt_ns(max(offs) - min(offs))}; after alignment, collective end times "
                 f"agree within {fmt_ns(res['median'])} (median) and {fmt_ns(res['p90'])} (p90) over "
                 f"{a.instances_used} instances."))
    elif r.validity.cross_rank:
        out.extend(Finding(kind="alignment", severity="warning", text=n) for n in a.notes)
    if not a.converged:
        out.append(Finding(
            kind="alignment", severity="warning", value=a.iterations,
            text=f"Clock alignment stopped at its iteration cap ({a.iterations}) before the offsets "
                 "settled; cross-rank waits may be off by the offsets' remaining error."))
    if a.unconnected_ranks:
        out.append(Finding(
            kind="alignment", severity="warning", ranks=tuple(a.unconnected_ranks),
            text=f"Ranks {fmt_ranks(a.unconnected_ranks)} share no timed collective with rank {a.anchor}; "
                 "their clocks could not be aligned to it."))
    return out
