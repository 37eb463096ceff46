"""Results into rows and sentences, for the CLI and the report alike.

Every quantity a command prints or the report shows is formatted here once, from the typed result
(never from its JSON); the CLI modules only choose what to print and where.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import polars as pl
import pyarrow as pa
from msgspec import UNSET

from tracekit._text import fmt_ns, one_line
from tracekit.results import Result

if TYPE_CHECKING:
    from tracekit.analysis.core import AnalysisResult
    from tracekit.analysis.schedule import TracedSchedule
    from tracekit.replay.calibration import ErrorStats
    from tracekit.replay.engine import ReplayResult
    from tracekit.replay.microbench import BenchTable, MicrobenchReport
    from tracekit.replay.topology import TopologyDescription
    from tracekit.whatif.core import WhatIfResult
    from tracekit.whatif.schedule import PipelineRun, ScheduleOutcome


def printable(text: str) -> str:
    """A trace string inside one line of text output: control characters escaped."""
    return one_line(text)


def fmt_ms(ns: float) -> str:
    """A replayed time in milliseconds, three decimals."""
    return f"{ns / 1e6:.3f} ms"


def fmt_delta(value: float, base: float) -> str:
    """" (+12.3%)" against `base`, or "" without one."""
    if not base:
        return ""
    return f" ({(value - base) / base:+.1%})"


def fmt_error(stats: ErrorStats) -> str:
    """A replay error: "median 1.2%, p90 3.4%"."""
    return f"median {stats.median:.1%}, p90 {stats.p90:.1%}"


def fmt_gb(n: float) -> str:
    """Bytes as a bare count of GB, two decimals (the unit is in the column head)."""
    return f"{n / 1e9:.2f}"


def fmt_step(step: int | None) -> str:
    return "-" if step is None else str(step)


def mean_of(values: Mapping[str, float]) -> float:
    """The mean over steps of a per-step figure (0 without steps)."""
    return sum(values.values()) / len(values) if values else 0.0


# ------------------------------------------------------------------------------------------
# ingest and info


class Source(Protocol):
    """What the source table reads of an ingested source (`ingest.SourceReport`, `runinfo.SourceInfo`)."""

    path: str | None
    format: str | None
    ranks: list[int] | None
    stored: int | None
    skipped: dict[str, int] | None
    error: str | None


class SourceRow(Result, frozen=True, kw_only=True):
    """One ingested source as `ingest` and `info` list it: its name told apart by its folders, format,
    ranks, rows stored and events skipped (read = stored + skipped)."""

    source: str
    format: str
    ranks: str
    stored: str
    skipped: str


def source_rows(sources: Sequence[Source]) -> list[SourceRow]:
    """The sources that were read (a failed one's error is printed below the table instead)."""
    from tracekit._text import short_paths

    names = short_paths([str(s.path) for s in sources])
    return [SourceRow(source=names[str(s.path)], format=_short_format(s.format),
                      ranks=",".join(map(str, s.ranks or [])) or "-", stored=f"{s.stored or 0:,}",
                      skipped=f"{sum((s.skipped or {}).values()):,}")
            for s in sources if not s.error]


def _short_format(fmt: str | None) -> str:
    return {"flight_recorder": "flightrec"}.get(fmt or "", fmt or "?")


def skipped_summary(sources: Sequence[Source]) -> str | None:
    """ "skipped, by reason: flow 1,520, instant 16" over all sources, or None."""
    total: dict[str, int] = {}
    for s in sources:
        for k, v in (s.skipped or {}).items():
            total[k] = total.get(k, 0) + v
    if not total:
        return None
    return "skipped, by reason: " + ", ".join(f"{k} {v:,}" for k, v in sorted(total.items()))


# ------------------------------------------------------------------------------------------
# analyze


class RootCauseRow(Result, frozen=True, kw_only=True):
    """One cascade of waits, as `analyze` and the report's summary list it."""

    root: str
    step: str
    busy: str
    waits: str
    lost: str
    worst: str


class StragglerRow(Result, frozen=True, kw_only=True):
    """One rank that was last in some collectives, as `analyze` and the report list it."""

    rank: str
    last: str
    of: str
    delay: str
    caused: str
    excess: str
    steps: str


def instance_places(analysis: AnalysisResult) -> dict[int, str]:
    """Per instance, "op #seq on group G": where a wait happened."""
    from tracekit.analysis.findings import op_label

    inst = pl.from_arrow(analysis.instances)
    assert isinstance(inst, pl.DataFrame)
    if inst.height == 0:
        return {}
    return {row["instance"]: f"{op_label(row['dim'], row['op'], row['seq'])} on group {row['group']}"
            for row in inst.select("instance", "dim", "op", "seq", "group").iter_rows(named=True)}


def root_cause_rows(analysis: AnalysisResult, top: int | None = None) -> list[RootCauseRow]:
    """The first `top` cascades of waits (default: the result's own `top`)."""
    causes = pl.from_arrow(analysis.root_causes)
    assert isinstance(causes, pl.DataFrame)
    at = instance_places(analysis)
    return [RootCauseRow(root=str(c["root_rank"]), step=fmt_step(c["root_step"]), busy=fmt_ns(c["root_stall_ns"]),
                         waits=str(c["instances"]), lost=fmt_ns(c["total_wait_ns"]),
                         worst=f"{fmt_ns(c['worst_wait_ns'])}: rank {c['worst_waiter']} waited for rank "
                               f"{c['worst_waited_on']} at {at.get(c['worst_instance'], '-')}")
            for c in causes.head(min(analysis.top, top or analysis.top)).iter_rows(named=True)]


def straggler_rows(analysis: AnalysisResult, top: int | None = None) -> list[StragglerRow]:
    """Of the first `top` stragglers (default: the result's own `top`), those that were last at least once."""
    strag = pl.from_arrow(analysis.stragglers)
    assert isinstance(strag, pl.DataFrame)
    return [StragglerRow(rank=str(s["rank"]), last=str(s["times_last"]), of=str(s["instances"]),
                         delay=fmt_ns(s["delay_ns"]), caused=fmt_ns(s["caused_ns"]), excess=fmt_ns(s["excess_ns"]),
                         steps=",".join(str(x) for x in (s["steps"] or [])[:5] if x is not None) or "-")
            for s in strag.head(min(analysis.top, top or analysis.top)).iter_rows(named=True) if s["times_last"]]


STRAGGLER_LEGEND = ("delay: the waits of the collectives where the rank was last; caused: the part its own work "
                    "explains (it arrived later than its usual gap); excess: the part beyond the step's usual "
                    "pattern.")


class TableView(Result, frozen=True, kw_only=True):
    """One table `analyze` prints: title, column heads, rows of cells, and what the columns mean."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    caption: str | None = None


class AnalysisView(Result, frozen=True, kw_only=True):
    """What `tracekit analyze` prints, in order: the findings, the step line, the tables (empty
    ones are not shown) and the clock alignment."""

    findings: list[str]
    steps: str | None
    tables: list[TableView]
    alignment: str | None
    pipeline: str | None = None


def analysis_view(result: AnalysisResult, top: int) -> AnalysisView:
    """The findings, tables and lines `tracekit analyze` prints for `result`, `top` rows a table."""
    from tracekit._text import fmt_bytes, fmt_pct, fmt_rate
    from tracekit.analysis.steps import STEP_TIME

    findings = [f.text for f in result.findings or []] or ["nothing stands out."]
    steps = _rows(result.step_times)
    step_line = (f"{STEP_TIME}: mean {fmt_ns(result.mean_step_ns())}; "
                 + ", ".join(f"step {s['step']} {fmt_ns(s['step_ns'])}" for s in steps[:12])) if steps else None
    tables = [
        TableView(title="Stalls by root cause (one row per cascade of waits)",
                  columns=["root", "step", "busy", "waits", "lost", "worst wait"],
                  rows=[[c.root, c.step, c.busy, c.waits, c.lost, c.worst] for c in root_cause_rows(result, top)],
                  caption="root: the rank at the end of the chain of waits; busy: how long it was busy with its own "
                          "work while the others waited; lost: every waiting rank's wait, summed."),
        TableView(title="Stragglers", columns=["rank", "last", "of", "delay", "caused", "excess", "steps"],
                  rows=[[s.rank, s.last, s.of, s.delay, s.caused, s.excess, s.steps]
                        for s in straggler_rows(result, top)], caption=STRAGGLER_LEGEND)]
    cp = _rows(result.critical_path)
    cp_dims = sorted({d["dim"] for c in cp for d in c["comm_by_dim"]})
    tables.append(TableView(
        title="Critical path per step",
        columns=["step", "step time", "compute", *(f"{d} comm" for d in cp_dims), "idle", "ranks", "jumps"],
        rows=[[str(c["step"]), fmt_ns(c["step_ns"]), fmt_ns(c["compute_ns"]),
               *(fmt_ns({d["dim"]: d["ns"] for d in c["comm_by_dim"]}.get(dim, 0)) for dim in cp_dims),
               fmt_ns(c["idle_ns"]), ",".join(map(str, c["ranks"])), str(c["hops"])] for c in cp[:top]],
        caption="Walked back from the rank that ended the step, jumping to the rank it waited for; idle: nothing "
                "traced on the path (host time, data loading, start skew)."))
    agg = result.per_rank_means()
    if agg.height:
        tables.append(TableView(
            title="Per rank (mean per step window)", columns=["rank", "window", "compute", "exposed comm", "idle"],
            rows=[[str(r["rank"]), fmt_ns(r["span"]), fmt_ns(r["compute"]), fmt_ns(r["exposed"]), fmt_ns(r["idle"])]
                  for r in agg.head(max(top, 16)).iter_rows(named=True)],
            caption="window: the rank's own ProfilerStep span (not the step time, which runs from the first "
                    "rank in to the last rank out)."))
    tables.append(TableView(
        title="EP groups", columns=["group", "ranks", "splits", "hot rank", "hot share", "imbalance", "inter-host"],
        rows=[[str(e["group"]), f"{e['present']} of {e['members']}" if not e["complete"] else str(e["members"]),
               "assumed" if e["splits_assumed"] >= 1 else ("measured" if not e["splits_assumed"] else
                                                           f"{100 * e['splits_assumed']:.0f}% assumed"),
               "-" if e["hot_rank"] is None else str(e["hot_rank"]), fmt_pct(e["hot_share"]),
               "-" if e["imbalance"] is None else f"{e['imbalance']:.2f}x", fmt_pct(e["inter_host_share"])]
              for e in _rows(result.ep_groups)[:top]],
        caption="hot: receives at least 1.25x the mean in some all-to-all; imbalance: max/mean of the bytes "
                "received per rank; inter-host: '-' when hosts are unknown."))
    bandwidth = result.bandwidth()
    by_instance = [b for b in bandwidth if b.basis == "instance"]
    tables.append(TableView(
        title="Bandwidth (median per group and op)", columns=["group", "op", "dim", "n", "size", "busbw"],
        rows=[[str(b.group), str(b.op), str(b.dim), str(b.instances), fmt_bytes(b.bytes_median),
               fmt_rate(b.busbw_median_gbps)] for b in by_instance[:top]],
        caption="busbw: algbw x the nccl-tests factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter, "
                "all_to_all (n-1)/n; 1 otherwise)."))
    by_kernel = [b for b in bandwidth if b.basis == "kernel_time"]
    tables.append(TableView(
        title="Bandwidth from kernel times (per group, op and size; no other rank of the call is in the run)",
        columns=["group", "op", "dim", "n", "size", "kernel time", "busbw (at least)"],
        rows=[[str(b.group), str(b.op), str(b.dim), str(b.instances), fmt_bytes(b.bytes_median),
               fmt_ns(b.duration_median_ns), fmt_rate(b.busbw_median_gbps)] for b in by_kernel[:top * 2]],
        caption="kernel time: the median kernel duration, an upper bound on the transfer (it includes waiting for "
                "the ranks outside the run), so busbw is a lower bound; factors as above."))
    for mb in result.microbench:
        tables.append(TableView(
            title=f"nccl-tests {mb.test or ''} busbw ({mb.nranks or '?'} ranks, {mb.source})",
            columns=["size (B)", "time (us)", "busbw (GB/s)", "in-place time (us)", "in-place busbw (GB/s)"],
            rows=[[str(x.size_bytes), _num(x.oop_time_us, 1), _num(x.oop_busbw_gbps, 2), _num(x.ip_time_us, 1),
                   _num(x.ip_busbw_gbps, 2)] for x in mb.sizes],
            caption=f"as nccl-tests printed it (out-of-place, then in-place); peak {fmt_rate(mb.peak_busbw_gbps)} "
                    f"at {fmt_bytes(mb.peak_size_bytes)} ({mb.peak_side})."))
    used, idle = group_rows(result)
    tables.append(TableView(
        title="Groups (with collective calls in the trace)", columns=["group", "name", "size", "dims", "calls"],
        rows=[[g.group, g.label, str(g.size or "-"), g.dims, f"{g.calls:,}"] for g in used[:top * 2]],
        caption=f"{idle} more group{'s' if idle != 1 else ''} declared by the trace "
                f"carr{'y' if idle != 1 else 'ies'} no collective call (tracekit info lists them)." if idle else None))
    a = result.alignment
    alignment = None if not result.collectives.num_rows else (
        f"clock alignment: {a.method}; {a.instances_used} instances, residual median "
        f"{fmt_ns(a.residual_ns['median'])}, p90 {fmt_ns(a.residual_ns['p90'])}, max {fmt_ns(a.residual_ns['max'])}")
    pipeline = None if result.pp_schedule is None else schedule_line(result.pp_schedule)
    return AnalysisView(findings=findings, steps=step_line, tables=tables, alignment=alignment, pipeline=pipeline)


def _rows(table: pa.Table) -> list[dict]:
    """A result table's rows (categories as text)."""
    return table.to_pylist()


def _num(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


# ------------------------------------------------------------------------------------------
# replay


def replay_comparison(result: ReplayResult, *, verbose: bool = False) -> list[str]:
    """The comparison table: per topology, step time, exposed comm per dim and the hottest link,
    each against the baseline (the first result); the replay error (cross-validated, then in
    sample and uncalibrated), the identity check and any caution."""
    from tracekit.replay.calibration import WHAT_IF_NOTE

    results = result.results
    if not results:
        return _not_modelled(result)
    base = results[0]
    dims = sorted({d for r in results for d in r.exposed_ns})
    lines = []
    err = base.replay_error
    if err is None:
        # nothing was simulated: one line says so, and no table of topologies that cannot differ
        unsimulated = next((f for f in result.findings if f.kind == "not_simulated"), None)
        text = unsimulated.text if unsimulated is not None else "nothing was simulated"
        lines.append(f"replay error: not available: {printable(text)}")
        lines.append(f"traced step (mean) {fmt_ms(mean_of(base.traced_step_ns))}")
        lines.extend(f"caution: {printable(f.text)}" for f in result.findings
                     if f.kind == "replay_caution" and f.severity != "info")
        return lines
    if err.calibrated_on is not None:
        lines.append(f"baseline {printable(base.topology)}: replay error per instance "
                     f"{fmt_error(err.cross_validated)} (out of sample: calibrated on "
                     f"{printable(str(err.calibrated_on))}); uncalibrated {fmt_error(err.uncalibrated)}")
    else:
        lines.append(f"baseline {printable(base.topology)}: replay error per instance "
                     f"{fmt_error(err.cross_validated)} (cross-validated, {err.split}); in sample "
                     f"{fmt_error(err.in_sample)}; uncalibrated {fmt_error(err.uncalibrated)}")
    ident = result.identity
    if ident is not None:
        lines.append(f"identity (traced durations replayed): max step error {ident.max_step_error:.2e}, "
                     f"{ident.instances_fallen_back} instance(s) fall back to the traced relation")
    header = ["topology", "step (mean)"] + [f"exposed {d}/step" for d in dims] + ["hottest link"]
    rows = []
    base_step = mean_of(base.step_ns)
    for r in results:
        step = mean_of(r.step_ns)
        row = [printable(r.topology), fmt_ms(step) + fmt_delta(step, base_step)]
        for d in dims:
            v = r.exposed_ns.get(d, 0)
            row.append(fmt_ms(v) + fmt_delta(v, base.exposed_ns.get(d, 0)))
        hot = r.hot_links[0] if r.hot_links else None
        row.append(f"{hot.link} peak {hot.peak_util:.0%}" if hot else "-")
        rows.append(row)
    lines.extend(_table(header, rows))
    lines.append(f"traced step (mean) {fmt_ms(mean_of(base.traced_step_ns))}")
    if len(results) > 1:
        lines.append(f"note: {WHAT_IF_NOTE}")
    if result.efficiency:
        source = err.calibrated_on
        lines.append(f"calibration ({'from ' + printable(str(source)) + ', ' if source is not None else ''}"
                     "traced / modelled): " + ", ".join(
            f"{printable(k)} x{v:.2f}" for k, v in sorted(result.efficiency.items())))
    if result.terms:
        lines.append("calibration in two terms (traced = a x latency + b x transfer): " + ", ".join(
            f"{printable(g)} a {t.latency:.2f}, b {t.transfer:.2f}" for g, t in sorted(result.terms.items())))
    for f in result.findings:
        if f.kind in ("replay_caution", "not_simulated") and f.severity != "info":
            lines.append(f"caution: {printable(f.text)}")
    for r in results:
        cv = r.convergence
        if cv is not None and not cv.converged:
            lines.append(f"residual per round on {printable(r.topology)} (µs): "
                         + ", ".join(f"{m / 1e3:.1f}" for m in cv.moves_ns))
            lines.extend(f"  kept moving: {printable(o.op)} {printable(o.group)}#{o.seq} ({printable(o.dim)}): start "
                         f"over {o.start_swing_ns / 1e3:.1f} µs, network time over {o.duration_swing_ns / 1e3:.1f} µs"
                         for o in cv.oscillating)
    if verbose:
        lines.extend(_replay_details(result))
    return lines


def _not_modelled(result: ReplayResult) -> list[str]:
    """A replay the network model did not apply to (a CPU/gloo run): the finding that says why, and the
    identity check, which needs no network."""
    lines = [printable(f.text) for f in result.findings if f.kind == "cpu_backend"]
    ident = result.identity
    if ident is not None:
        lines.append(f"identity (traced durations replayed): max step error {ident.max_step_error:.2e}, "
                     f"{ident.instances_fallen_back} instance(s) fall back to the traced relation")
    lines += [f"caution: {printable(f.text)}" for f in result.findings
              if f.kind == "replay_caution" and f.severity != "info"]
    return lines


def _replay_details(result: ReplayResult) -> list[str]:
    lines = []
    if result.dependencies:
        lines.append("dependency edges per rule: " + ", ".join(f"{k} {v}" for k, v in result.dependencies.items()))
    err = result.results[0].replay_error
    assert err is not None
    heads = ("uncalibrated | out of sample" if err.calibrated_on is not None
             else "uncalibrated | in sample | cross-validated")
    lines.append(f"replay error per op (median / p90): {heads}")
    for op, kinds in err.by_op.items():
        lines.append(f"  {printable(op)}: " + " | ".join(
            f"{kinds[k].median:.1%} / {kinds[k].p90:.1%}" for k in err.kinds))
    unseen = result.unseen
    if unseen:
        lines.append("buckets without a fit of their own under cross-validation: " + ", ".join(
            f"{printable(b)} ({how})" for b, how in unseen.items()))
    for r in result.results:
        cv = r.convergence
        if cv is not None:
            lines.append(f"fixed point on {printable(r.topology)}: {cv.rounds} round"
                         f"{'s' if cv.rounds != 1 else ''}, last start move {cv.residual_ns / 1e3:.1f} µs "
                         f"(tolerance {cv.tolerance_ns / 1e3:.1f} µs){'' if cv.converged else ': not settled'}"
                         + (f"; a period-{cv.cycle} cycle from round {cv.cycle_from}, damped" if cv.cycle else ""))
    fallbacks = result.identity.fallbacks if result.identity is not None else ()
    for fb in fallbacks[:20]:
        lines.append(f"fallback: {printable(fb.text)}")
    if len(fallbacks) > 20:
        lines.append(f"fallback: ... and {len(fallbacks) - 20} more")
    for f in result.findings:
        if f.kind == "replay_caution" and f.severity == "info":
            lines.append(f"note: {printable(f.text)}")
    return lines


# ------------------------------------------------------------------------------------------
# replay --nccl-tests


def fmt_gbs(x: float) -> str:
    """A bandwidth in GB/s, three significant figures (whole numbers from 100 up)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def fmt_error_pct(x: float) -> str:
    """A signed error as a percentage, or as a ratio in scientific notation when it is absurd."""
    return f"{x:+.0%}" if abs(x) < 100 else f"{x:+.1e}x"


def health_sentence(table: BenchTable, *, with_file: bool = False) -> str:
    """One nccl-tests table's verdict in words, with the figures it rests on."""
    from pathlib import Path

    from tracekit.replay.microbench import DEGRADED_BELOW

    where = f"{Path(table.source).name} " if with_file else ""
    head = f"{printable(where)}table {table.table} ({printable(table.test or table.op)})"
    h = table.health
    if h.verdict == "unknown" or h.measured_busbw is None or h.predicted_busbw is None:
        return f"{head}: no verdict: the model predicts no row of op {printable(table.op)}"
    ratio = h.measured_over_predicted or 0.0
    if h.verdict == "degraded":
        return (f"{head}: degraded: measured {fmt_gbs(h.measured_busbw)} GB/s busbw at {h.sizes} where this "
                f"fabric should give about {fmt_gbs(h.predicted_busbw)} GB/s (x{ratio:.2f}, below "
                f"x{DEGRADED_BELOW:.1f}): check cabling, GPUDirect RDMA, the NICs NCCL picked")
    return (f"{head}: healthy: measured {fmt_gbs(h.measured_busbw)} GB/s busbw at {h.sizes}, "
            f"the model gives about {fmt_gbs(h.predicted_busbw)} GB/s (x{ratio:.2f})")


def floor_sentence(table: BenchTable) -> str | None:
    """A table's small-message floor in words, when it is well above the model's (NCCL's constants)."""
    floor = table.latency_floor
    if floor is None or not floor.high:
        return None
    head = (f"small messages (<= 64 KiB, {floor.rows} rows) take {floor.measured_us:.0f} us where NCCL's latency "
            f"constants give {floor.predicted_us:.0f} us (x{floor.measured_us / floor.predicted_us:.1f})")
    if floor.net_latency_us is None:
        return head + ": launch overhead or a slow path inside the host (NVLink/PCIe), not the network"
    return (head + f": the network adds about {floor.net_latency_us:.0f} us per hop, as plugin networks do "
            "(GPUDirect-TCPX/TCPXO, EFA) or a slow path (no GPUDirect RDMA, TCP sockets); "
            f"`net_latency_us={floor.net_latency_us:g}` in the topology spec replays with it")


def nccl_tests_lines(report: MicrobenchReport, *, verbose: bool = False) -> list[str]:
    """`replay --nccl-tests`: the caps that bind, then the rows (one file) or the error by file, op and
    size band (a folder; the rows too with `verbose`), then each table's health."""
    from pathlib import Path

    from tracekit.replay.microbench import DEGRADED_BELOW, format_microbench, is_folder

    lines = [f"note: {printable(f.text)}" for f in report.findings]
    name = printable(Path(report.path).name or report.path)
    folder = is_folder(report)
    if folder:
        lines.append(f"nccl-tests {name}/ ({len(report.sources)} files, {len(report.tables)} tables) on "
                     f"{printable(report.topology)}:")
        rows = [[printable(Path(b.source).name), printable(b.op), b.band, str(b.rows),
                 f"{b.median_abs_error:.0%}" if b.median_abs_error < 100 else f"{b.median_abs_error:.1e}x",
                 fmt_error_pct(b.median_error), fmt_error_pct(b.worst_error)] for b in report.bands]
        lines += [line.rstrip() for line in _table(
            ["file", "op", "band", "rows", "median |error|", "median error", "worst"], rows)]
        lines.append("error = predicted / measured busbw - 1 (out-of-place, from the times)")
        if verbose:
            for source in report.sources:
                lines.append(f"{printable(Path(source).name)}:")
                lines += format_microbench([r for r in report.rows if r.source == source]).splitlines()
    else:
        lines.append(f"nccl-tests {name} on {printable(report.topology)}:")
    lines += [printable(p) for p in report.profiles]
    if not folder:
        lines += format_microbench(list(report.rows)).splitlines()
    lines.append(f"health per table (measured / predicted busbw at the large sizes; degraded below "
                 f"x{DEGRADED_BELOW:.1f}):")
    for t in report.tables:
        lines.append(f"  {health_sentence(t, with_file=folder)}")
        if (floor := floor_sentence(t)) is not None:
            lines.append(f"    {floor}")
    return lines


# ------------------------------------------------------------------------------------------
# whatif


def whatif_comparison(result: WhatIfResult) -> list[str]:
    """The comparison table, then each scenario's notes (and its rank -> host map)."""
    cpu = [c for c in result.cautions if c.kind == "cpu_backend"]
    if cpu:
        return [f"what-if on {result.topology}: {printable(cpu[0].text)}"]
    rows = result.scenarios
    dims = sorted({d for s in rows for d in (*s.exposed_ns, *s.baseline_exposed_ns)})
    ih_dims = sorted({d for s in rows for side in (s.inter_host_before, s.inter_host_after) for d in side})
    err = result.replay_error
    # A calibration from another run has no cross-validated figure here: the line quotes 0, as it always has.
    cv = err.cross_validated if err is not None and err.calibrated_on is None else None
    lines = [f"what-if on {result.topology}: each scenario vs the baseline replay of the unchanged run "
             "(model vs model, not vs the trace)"]
    if err is None:
        lines.append("replay error of the baseline: not available (nothing was simulated)")
    else:
        lines.append(f"replay error of the baseline (cross-validated, per collective): median "
                     f"{cv.median if cv else 0:.1%}, p90 {cv.p90 if cv else 0:.1%}; the scenarios carry it plus the "
                     "model's limits")
    lines += [f"caution: {c.text}" for c in result.cautions if c.severity == "warning"]
    lines += [f"{s.scenario}: {s.reason}" for s in result.skipped]
    if not rows:
        return lines
    header = (["scenario", "step (mean)"] + [f"exposed {d}/step" for d in dims]
              + ["EP max/mean", "inter-host GB " + "/".join(ih_dims), "checkpoint"])
    table = []
    if rows:
        first = rows[0]
        table.append(["baseline", fmt_ms(mean_of(first.baseline_step_ns))]
                     + [fmt_ms(first.baseline_exposed_ns.get(d, 0)) for d in dims]
                     + ["", "/".join(fmt_gb(first.inter_host_before.get(d, 0)) for d in ih_dims), ""])
    for s in rows:
        base_step = mean_of(s.baseline_step_ns)
        step = mean_of(s.step_ns)
        imb = s.ep_imbalance
        table.append(
            [s.scenario, fmt_ms(step) + fmt_delta(step, base_step)]
            + [fmt_ms(s.exposed_ns.get(d, 0)) + fmt_delta(s.exposed_ns.get(d, 0), s.baseline_exposed_ns.get(d, 0))
               for d in dims]
            + [f"{imb.before:.2f} -> {imb.after:.2f}" if imb else "-",
               "/".join(fmt_gb(s.inter_host_after.get(d, 0)) for d in ih_dims),
               fmt_ms(s.checkpoint_ns) if s.checkpoint_ns is not None else "-"])
    lines += [line.rstrip() for line in _table(header, table)]
    for s in rows:
        lines.append("")
        lines.append(f"{s.scenario}:")
        if s.a2a_ns:
            lines.append(f"  EP all-to-all per instance (mean): {fmt_ms(s.a2a_ns.before)} -> {fmt_ms(s.a2a_ns.after)}")
        if s.schedule is not None:
            lines += schedule_lines(s.schedule)
        if s.slowed is not None:
            worst = max(s.slowed, key=lambda x: x.scenario_ns - x.baseline_ns, default=None)
            lines.append(f"  collectives slowed: {len(s.slowed)}" + (
                f" (worst {worst.op} {worst.dim} group {worst.group} seq {worst.seq}: "
                f"{fmt_ms(worst.baseline_ns)} -> {fmt_ms(worst.scenario_ns)})" if worst else ""))
        if s.placement_before and s.placement_after:
            after = s.placement_after
            by_host: dict[str, list[tuple[int, str]]] = {}
            for rank, (host, gpu) in after.slots.items():
                by_host.setdefault(after.hosts[host], []).append((gpu, str(rank)))
            for host in after.hosts:
                lines.append(f"  {host}: ranks {' '.join(r for _, r in sorted(by_host.get(host, [])))} (by GPU)")
        details = s.details or {}
        if s.simulated_gpus is not UNSET:
            copies = f"{details['copies']} cop{'ies' if details['copies'] != 1 else 'y'}"
            lines.append(f"  simulated GPUs: {s.simulated_gpus} ({copies} of the traced {details['traced_gpus']}) on "
                         f"{details['hosts']} hosts of {details['gpus_per_host']}, "
                         f"{details['tiers']} switch tiers, {details['flows']:,} flows")
        if "cross_node_bytes" in details:
            cross, m = details["cross_node_bytes"], details["nodes"]
            lines.append(f"  EP bytes across nodes: {fmt_gb(cross['before'])} -> {fmt_gb(cross['after'])} GB "
                         f"(each token's experts on at most {m} node{'s' if m != 1 else ''})")
        if "replays" in details:
            moved = details["moved_ranks"]
            kept = f"moved {moved} ranks" if moved else "kept the traced placement"
            lines.append(f"  search: started from the {details['start']} placement, {details['replays']} replays, "
                         f"{kept} (a change must shorten the step by more than {details['min_gain']:.1%})")
        for note in s.notes:
            lines.append(f"  - {note}")
    return lines


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-justified columns two spaces apart."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    return ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)),
            *("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)) for row in rows)]


# ------------------------------------------------------------------------------------------
# groups

#: Process-group descriptions that name nothing: PyTorch's default for a group created without one.
UNNAMED_DESCS = frozenset({"", "undefined"})


def group_label(desc: str | None, backend: str | None, ranks: Sequence[int] | None, size: int | None) -> str:
    """A group as its process-group args describe it: its description, or, for PyTorch's unnamed
    groups (`pg_desc` "undefined"), its backend and members: "nccl, 8 ranks 0-7"."""
    from tracekit._text import fmt_ranks

    if desc is not None and desc.strip().lower() not in UNNAMED_DESCS:
        return desc
    members = list(ranks or [])
    n = size or len(members) or None
    who = f"{n} rank{'s' if n != 1 else ''}" if n else "members unknown"
    if members:
        who += f" {fmt_ranks(members, limit=8)}"
    return f"unnamed: {backend + ', ' if backend else ''}{who}"


class GroupRow(Result):
    """One group as `analyze` lists it: id, label (see `group_label`), size, dims and calls in the trace."""

    group: str
    label: str
    size: int | None
    dims: str
    calls: int


def group_rows(result: AnalysisResult) -> tuple[list[GroupRow], int]:
    """The groups that carry collective calls in the trace, most calls first, and how many groups
    the trace declares (pg_config) that carry none."""
    groups = pl.from_arrow(result.groups)
    assert isinstance(groups, pl.DataFrame)
    calls: dict[str, int] = {}
    if result.collectives.num_rows:
        for g in result.collectives.column("group").to_pylist():
            if g is not None:
                calls[str(g)] = calls.get(str(g), 0) + 1
    rows = [GroupRow(group=str(g["group"]), label=group_label(g["desc"], g["backend"], g["ranks"], g["size"]),
                     size=g["size"], dims=",".join(g["dims"] or []) or "-", calls=calls.get(str(g["group"]), 0))
            for g in groups.with_columns(pl.col(pl.Categorical).cast(pl.String)).iter_rows(named=True)]
    used = sorted((r for r in rows if r.calls), key=lambda r: -r.calls)
    return used, len(rows) - len(used)


def schedule_line(schedule: TracedSchedule) -> str:
    """One line naming the traced pipeline schedule (or saying what was seen when it has no name)."""
    if not schedule.recognised:
        return printable(f"Pipeline schedule: unrecognised ({schedule.stages} stages); seen {schedule.seen}")
    chunks = f", {schedule.chunks} chunks per stage" if (schedule.chunks or 1) > 1 else ""
    also = f" (the trace fits {', '.join(schedule.also)} as well)" if schedule.also else ""
    step = "" if schedule.step is None else f" in step {schedule.step}"
    return (f"Pipeline schedule: {schedule.name}, {schedule.stages} stages, {schedule.microbatches} micro-batches"
            f"{chunks}{also}, read from the PP transfers and the compute between them{step}.")


def schedule_lines(outcome: ScheduleOutcome) -> list[str]:
    """A schedule scenario's pipeline against the traced one's: span and bubble per stage."""
    base, new = outcome.baseline, outcome.scenario

    def shape(run: PipelineRun) -> str:
        chunks = f", {run.chunks} chunks" if run.chunks > 1 else ""
        return f"{run.name} ({run.stages} stages, {run.microbatches} micro-batches{chunks})"

    return [f"  pipeline: {shape(base)} as traced -> {shape(new)}; span {fmt_ms(base.span_ns)} -> "
            f"{fmt_ms(new.span_ns)}{fmt_delta(new.span_ns, base.span_ns)}",
            "  bubble per stage: " + ", ".join(f"{i}: {fmt_ms(b)} -> {fmt_ms(a)}" for i, (b, a) in
                                               enumerate(zip(base.bubble_ns, new.bubble_ns, strict=True))),
            *([f"  communication's share of the SMs in DualPipe's pairs: {outcome.sm_share:.3f}"]
              if new.name.startswith("dualpipe") else [])]


def topology_description(info: TopologyDescription) -> str:
    """The lines `tracekit topology` prints for a spec."""
    lines = [
        f"topology      {info.name} ({info.kind}, routing {info.routing}"
        f"{', PXN' if info.pxn else ''}{', SHARP' if info.sharp else ''}"
        f"{', NVLS' if info.nvls else ''})",
        f"GPUs          {info.gpus} ({info.hosts} hosts x {info.gpus_per_host}, "
        f"NVLink domain {info.nvlink_domain})",
        f"switches      {info.leaves} leaf, {info.spines} spine, {info.cores} core, "
        f"{info.planes} plane(s)",
        "links per tier:",
    ]
    for tier, entry in info.links_per_tier.items():
        lines.append(f"  {tier:<11} {entry.links:>6} links {entry.cables:>7} cables "
                     f"{entry.gbps / 1000:>10.1f} Tb/s per direction  {entry.medium}, {entry.network}")
    lines.append(f"bisection     {info.bisection_gbps / 1000:.1f} Tb/s" if info.hosts > 1 else
                 "bisection     - (one host: no cut between hosts; its GPUs talk over NVLink)")
    if info.profile:
        lines.append(info.profile)
    lines.append("oversubscription " + ", ".join(f"{t} {v:g}:1" for t, v in info.oversubscription.items()))
    if info.frontend:
        fe = info.frontend
        lines.append(f"front-end     {fe.nics_per_host} x {fe.gbps_per_nic:g} Gb/s Ethernet per host, "
                     f"ToR uplinks {fe.oversub:g}:1")
    if info.storage:
        st = info.storage
        lines.append(f"storage       {st.nodes} node(s) of {st.gbps:g} Gb/s on the {st.network}")
    return "\n".join(lines)
