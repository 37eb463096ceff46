"""The analysis: `prepare` (match, align, classify) and `analyze` (everything, with findings)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import polars as pl
import pyarrow as pa
from msgspec import UNSET, UnsetType

from tracekit.analysis import breakdown, ep, pp, rootcause, stalls, steps
from tracekit.analysis._frames import frame, table
from tracekit.analysis.classify import Overrides, classify, embedding_all_to_all
from tracekit.analysis.clocks import Alignment, align_clocks
from tracekit.analysis.matching import match_collectives
from tracekit.analysis.schedule import ScheduleShape
from tracekit.errors import TracekitError
from tracekit.executors import Executor, parse_executor
from tracekit.finding import Finding
from tracekit.microbench import MicrobenchRun, microbench_runs
from tracekit.results import Result, dumps
from tracekit.store import Run
from tracekit.validity import RunValidity, run_validity

if TYPE_CHECKING:
    from tracekit.analysis.schedule import TracedSchedule
    from tracekit.hang import HangResult  # the front door computes it (tests/core/test_layers.py)

RunLike = Run | str | os.PathLike[str] | Mapping[str, pa.Table]
JSON_SCHEMA = "tracekit.analysis/1"
_TABLES = ("ranks", "groups", "collectives", "events")


def _load(source: RunLike) -> tuple[Run | None, dict[str, Any]]:
    if isinstance(source, Mapping):
        return None, {name: source.get(name) for name in _TABLES}
    run = source if isinstance(source, Run) else Run(source)
    tables: dict[str, Any] = {name: run.table(name) for name in _TABLES if name != "events"}
    tables["events"] = run.scan("events").collect() if run.has("events") else None
    return run, tables


def _prepared(source: RunLike, dims: str | Overrides | None, write: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Match, align, classify and find steps; Arrow small tables, the events as a polars frame."""
    run, t = _load(source)
    coll, mismatches = match_collectives(t["collectives"])
    ranks, align = align_clocks(coll, t["ranks"])
    ev = frame(t["events"], "events")
    names = ev.get_column("name").cast(pl.String).unique().to_list() if ev.height else []
    coll, groups = classify(coll, t["groups"], ranks, overrides=dims, embedding=embedding_all_to_all(names))
    c = frame(coll, "collectives")
    windows = steps.step_windows(ev, c)
    c = steps.assign_step(c, windows)
    coll = table(c, "collectives")
    if run is not None and write:
        _store(run, {"collectives": coll, "ranks": ranks, "groups": groups})
    extra = {"alignment": align, "mismatches": mismatches, "windows": windows, "events": ev,
             "events_in": t["events"], "collectives": c}
    return {"ranks": ranks, "groups": groups, "collectives": coll}, extra


def prepare(source: RunLike, *, dims: str | Overrides | None = None, write: bool = True) -> dict[str, pa.Table]:
    """Match, align and classify: the tables every later step needs.

    `source` is a run directory (path or `Run`) or a dict of tables. Returns "ranks" (with
    clock_offset_ns), "groups" (with dims), "collectives" (with instance, seq, dim and step),
    "events" (as stored, a null step filled from the step windows) and "step_times" (the one
    step time per step, `steps.STEP_TIME`) and "step_windows" (each rank's step windows on
    its own clock, which the replay's exposed communication is measured in). With a run and
    `write=True`, the three small tables are written back.
    """
    return prepared(source, dims=dims, write=write).tables


@dataclass(frozen=True)
class Prepared:
    """A run matched, aligned and classified once: `prepare`'s tables, and what `analyze` goes on
    from (`analyze(..., prepared_run=)`), so a replay and the report's analysis share one preparation."""

    tables: dict[str, pa.Table]
    dims: str | Overrides | None
    extra: dict[str, Any]  # `_prepared`'s: alignment, mismatches, windows, events and collectives frames

    def store(self, run: Run) -> None:
        """Write the three small prepared tables back into `run`, as `prepare(..., write=True)` does."""
        _store(run, self.tables)


def _store(run: Run, tables: Mapping[str, pa.Table]) -> None:
    run.write_tables({name: tables[name] for name in ("collectives", "ranks", "groups")})


def prepared(source: RunLike, *, dims: str | Overrides | None = None, write: bool = True) -> Prepared:
    """`prepare`'s tables with what `analyze` needs of the same preparation (see `Prepared`)."""
    out, extra = _prepared(source, dims, write)
    events = extra["events_in"]
    out["events"] = events if isinstance(events, pa.Table) else table(extra["events"], "events")
    windows = extra["windows"]
    if windows.height and out["events"].column("step").null_count:
        # the replay counts a step's events by this column: the analysis' windows fill it
        out["events"] = table(steps.assign_step(frame(out["events"], "events"), windows), "events")
    out["step_times"] = table(steps.step_times(extra["windows"], frame(out["ranks"], "ranks")))
    out["step_windows"] = windows.select("rank", "step", "start_ns", "end_ns").to_arrow()
    return Prepared(tables=out, dims=dims, extra=extra)


STALL_COLUMNS = ("instance", "group", "seq", "op", "dim", "step", "first_rank", "last_rank", "waited_on",
                 "root_rank", "root_instance", "root_step", "root_stall_ns", "chain", "chain_ranks", "max_wait_ns",
                 "caused_ns", "excess_ns", "participants", "nranks", "complete", "bytes", "duration_ns",
                 "busbw_gbps")


class AnalysisCounts(Result, frozen=True, kw_only=True):
    """The document's `summary`: what the run holds and the mean step time."""

    collective_calls: int
    groups: int
    instances: int
    mean_step_ns: float | None
    mismatches: int
    ranks: int
    step_sources: list[str]
    step_time: str
    steps: list[int | None]


class RankStep(Result, frozen=True, kw_only=True):
    """One rank's step window: its span, compute, idle and communication time (ns), per dim and in
    total; `overlap` repeats `overlap_ns` (the name the first documents used)."""

    comm_ns: dict[str, int]
    comm_total_ns: int | None
    compute_ns: int | None
    exposed_ns: dict[str, int]
    exposed_total_ns: int | None
    idle_ns: int | None
    overlap: dict[str, int] = msgspec.field(default_factory=dict)
    overlap_ns: dict[str, int]
    rank: int
    span_ns: int | None
    step: int | None

    def __post_init__(self) -> None:
        msgspec.structs.force_setattr(self, "overlap", self.overlap_ns)


class Bandwidth(Result, frozen=True, kw_only=True):
    """The median bandwidth of one group and op (`basis` "instance"), or of one group, op and size from
    kernel times alone (`basis` "kernel_time", `stalls.kernel_bandwidth`: then `bytes` is the size)."""

    algbw_median_gbps: float | None
    basis: str
    busbw_median_gbps: float | None
    busbw_p10_gbps: float | None
    bytes: int | UnsetType | None = UNSET
    bytes_median: float | None
    dim: str | None
    duration_median_ns: float | None
    group: str | None
    instances: int
    op: str | None


class AnalysisDocument(Result, frozen=True, kw_only=True):
    """results/analysis.json and `analyze --json` (layout: docs/analysis.md): the fields in key order,
    tables as their rows. Its keys are sorted (`sort_keys`); `alignment` keeps its rank keys as numbers
    (sorted as numbers), every other block's keys are text (`number_keys`, `tracekit.results`)."""

    number_keys: ClassVar[tuple[str, ...]] = ("alignment",)

    alignment: Alignment
    alignment_residual_ns: dict[str, float | None]
    bandwidth: list[Bandwidth]
    clock_offsets_ns: dict[str, int | None]
    critical_path: pa.Table
    dims: dict[str, list[str]]
    ep: pa.Table
    findings: list[Finding]
    hang: HangResult | None
    microbench: list[MicrobenchRun]
    mismatches: pa.Table
    per_rank_step: list[RankStep]
    pp_bubbles: pa.Table
    pp_schedule: ScheduleShape | None
    pp_stages: dict[str, int]
    root_causes: pa.Table
    schema: str = JSON_SCHEMA
    stalls: pa.Table
    step_times: pa.Table
    stragglers: pa.Table
    summary: AnalysisCounts
    validity: RunValidity


@dataclass
class AnalysisResult:
    """Every analysis table (Arrow), the alignment report, the run's validity, the hang verdict
    (`tracekit hang`'s, when the front door attached it) and the findings, as typed `Finding` objects.

    `steps` holds each rank's step windows and `step_times` the one step time per step (see
    `tracekit.analysis.steps.STEP_TIME`). `instances` carries, per instance, the rank waited on
    and the root of its chain of waits; `participants` every rank's arrival and wait;
    `root_causes` one row per cascade of waits; `critical_path` each step's critical path.
    """

    ranks: pa.Table
    groups: pa.Table
    collectives: pa.Table
    mismatches: pa.Table
    steps: pa.Table
    per_rank_step: pa.Table
    per_rank_step_dim: pa.Table
    instances: pa.Table
    stragglers: pa.Table
    ep_instances: pa.Table
    ep_groups: pa.Table
    ep_traffic: pa.Table
    pp_bubbles: pa.Table
    alignment: Alignment
    validity: RunValidity = field(default_factory=RunValidity)
    step_times: pa.Table = field(default_factory=lambda: table(pl.DataFrame(schema=steps.STEP_TIME_SCHEMA)))
    participants: pa.Table = field(default_factory=lambda: pa.table({}))
    root_causes: pa.Table = field(default_factory=lambda: table(pl.DataFrame(schema=rootcause.CASCADE_SCHEMA)))
    critical_path: pa.Table = field(default_factory=lambda: table(pl.DataFrame(schema=rootcause.CRITICAL_SCHEMA)))
    pp_stages: pa.Table = field(default_factory=lambda: pa.table({"rank": pa.array([], pa.int32()),
                                                                 "stage": pa.array([], pa.int32())}))
    hang: HangResult | None = None  # given by the front door (`tracekit.workflows.analyze`)
    microbench: list[MicrobenchRun] = field(default_factory=list)  # nccl-tests tables in the run
    kernel_bandwidth: pa.Table = field(default_factory=lambda: pa.table({}))  # see stalls.kernel_bandwidth
    pp_schedule: TracedSchedule | None = None  # the pipeline schedule read from the PP transfers
    findings: list[Finding] = field(default_factory=list)
    top: int = 10

    def tables(self) -> dict[str, pa.Table]:
        """The result tables by name."""
        return {k: v for k, v in self.__dict__.items() if isinstance(v, pa.Table)}

    def stalls(self, n: int | None = None) -> pl.DataFrame:
        """Instances by longest wait, longest first."""
        df = pl.from_arrow(self.instances)
        assert isinstance(df, pl.DataFrame)
        df = df.filter(pl.col("max_wait_ns") > 0).sort(["max_wait_ns", "instance"], descending=[True, False])
        return df.head(n or self.top)

    def document(self) -> AnalysisDocument:
        """The result as results/analysis.json holds it (`tracekit.results` encodes it; docs/analysis.md)."""
        return _document(self)

    def per_rank_means(self) -> pl.DataFrame:
        """Per rank, the mean over its step windows of the window span, compute, exposed comm and idle
        time (ns): columns rank, span, compute, exposed, idle, by rank."""
        wide = _pl(self.per_rank_step)
        if wide.height == 0:
            return pl.DataFrame(schema={"rank": pl.Int64, "span": pl.Float64, "compute": pl.Float64,
                                        "exposed": pl.Float64, "idle": pl.Float64})
        prs = pl.DataFrame([{"rank": r["rank"], "span": r["span_ns"], "compute": r["compute_ns"],
                             "exposed": r["exposed_ns"], "idle": r["idle_ns"]} for r in wide.iter_rows(named=True)])
        return prs.group_by("rank").agg(pl.all().mean()).sort("rank")

    def mean_step_ns(self) -> float | None:
        """The mean step time (see `tracekit.analysis.steps.STEP_TIME`), or None without steps."""
        st = self.step_times
        if st.num_rows == 0:
            return None
        return float(sum(st.column("step_ns").to_pylist()) / st.num_rows)

    def bandwidth(self) -> list[Bandwidth]:
        """The median bandwidth per group and op of the instances with a bandwidth, then the kernel-time
        estimates per group, op and size (`stalls.kernel_bandwidth`)."""
        inst = _pl(self.instances)
        bw = (inst.filter(pl.col("busbw_gbps").is_not_null())
              .group_by("dim", "op", "group")
              .agg(pl.len().alias("instances"), pl.col("bytes").median().alias("bytes_median"),
                   pl.col("duration_ns").median().alias("duration_median_ns"),
                   pl.col("algbw_gbps").median().alias("algbw_median_gbps"),
                   pl.col("busbw_gbps").median().alias("busbw_median_gbps"),
                   pl.col("busbw_gbps").quantile(0.1).alias("busbw_p10_gbps"))
              .sort("dim", "op", "group", nulls_last=True))
        kernel_bw = _pl(self.kernel_bandwidth) if self.kernel_bandwidth.num_columns else pl.DataFrame()
        return ([Bandwidth(**row, basis="instance") for row in bw.to_dicts()]
                + [Bandwidth(**row, basis="kernel_time") for row in kernel_bw.to_dicts()])

    def dumps(self) -> str:
        """The JSON text of `document()`, as `analyze --json` prints it."""
        return dumps(self.document(), sort_keys=True)


def analyze(source: RunLike, *, dims: str | Overrides | None = None, top: int = 10,
            compute: str | Sequence[str] = "auto", write: bool = True,
            executor: str | Executor | None = None, partitioned: bool = True,
            hang: HangResult | None = None, prepared_run: Prepared | None = None) -> AnalysisResult:
    """Run every analysis on a run directory (or a dict of tables) and summarise it in words.

    `compute` says what counts as compute (see `breakdown.compute_intervals`). With a run and
    `write=True`, the prepared tables are written back into the run (results/analysis.json is
    the front door's, `tracekit.workflows.analyze`). `hang` is the run's hang verdict, which the
    result carries and its findings lead with; the analysis never computes one (the front door,
    `tracekit.workflows.analyze`, passes `tracekit.hang`'s).
    A run directory's events are read per rank partition (`tracekit.analysis.partitioned`), so
    memory is bounded by the largest partition, not the run; `executor` "ray" or
    "ray://HOST:PORT" maps those partitions over Ray tasks. `partitioned=False` loads every
    event at once (tables in memory always are); the results are the same, bit for bit.
    `prepared_run` is this source's preparation (`prepared`, with these `dims`), which the analysis
    then goes on from instead of preparing again; its events are in memory, so it is eager.
    """
    exe = parse_executor(executor)
    run = None if isinstance(source, Mapping) else source if isinstance(source, Run) else Run(source)
    if not exe.is_local and run is None:
        raise TracekitError("the ray executor analyses a run directory, not tables in memory")
    validity = run_validity(run if run is not None else source)
    if prepared_run is not None and prepared_run.dims != dims:
        raise TracekitError(f"the preparation given was made with dims {prepared_run.dims!r}, not {dims!r}")
    if prepared_run is not None or run is None or (exe.is_local and not partitioned):
        t, extra = ((prepared_run.tables, prepared_run.extra) if prepared_run is not None
                    else _prepared(run if run is not None else source, dims, write))
        ev: pl.DataFrame = extra["events"]
        coll: pl.DataFrame = extra["collectives"]
        windows: pl.DataFrame = extra["windows"]
        wide, long = breakdown.per_rank_step(ev, coll, windows, compute=compute)
        compute_iv = breakdown.compute_intervals(ev, breakdown.comm_intervals(ev, coll), compute=compute)
        events: pl.DataFrame | pl.LazyFrame | None = ev
    else:
        from tracekit.analysis import partitioned as by_partition

        t, extra = by_partition.prepared(run, exe, dims=dims, write=write, compute=compute)
        coll, windows, wide, long = extra["collectives"], extra["windows"], extra["wide"], extra["long"]
        compute_iv = extra["compute"]
        events = run.scan("events") if run.has("events") else None  # read_schedule loads the pipeline's ranks
    rk = frame(t["ranks"], "ranks")
    grp = frame(t["groups"], "groups")
    parts = stalls.participants(coll, rk)
    inst = stalls.instances(parts) if parts.height else _empty_instances()
    chains = rootcause.wait_chains(parts, inst)
    inst = inst.join(chains.drop("waited_on"), on="instance", how="left").with_columns(
        pl.when(pl.col("max_wait_ns") > 0).then(pl.col("last_rank")).cast(pl.Int32).alias("waited_on"))
    parts = parts.join(inst.select("instance", "last_rank"), on="instance", how="left").with_columns(
        pl.when(pl.col("wait_ns") > 0).then(pl.col("last_rank")).cast(pl.Int32).alias("waited_on")).drop("last_rank")
    casc = rootcause.cascades(inst, parts)
    critical = rootcause.critical_path(parts, inst, windows, rk, compute_iv)
    strag = stalls.stragglers(inst, parts) if parts.height else pl.DataFrame(
        schema={"rank": pl.Int32, "times_last": pl.UInt32, "instances": pl.UInt32, "delay_ns": pl.Int64,
                "caused_ns": pl.Int64, "excess_ns": pl.Int64, "worst_wait_ns": pl.Int64, "steps": pl.List(pl.Int32),
                "groups": pl.List(pl.String)})
    kernel_bw = stalls.kernel_bandwidth(coll, inst)
    pairs = ep.ep_pairs(coll, grp)
    ep_inst, ep_groups, ep_traffic = ep.ep_summary(pairs, rk)
    bubbles = pp.pp_bubbles(parts, inst, grp, wide)
    stage = pp.pp_stages(inst, grp)
    from tracekit.analysis.schedule import read_schedule

    pp_schedule = read_schedule({"collectives": coll, "events": events, "step_windows": windows, "ranks": t["ranks"]})
    result = AnalysisResult(
        ranks=t["ranks"], groups=t["groups"], collectives=t["collectives"], mismatches=extra["mismatches"],
        steps=table(windows), per_rank_step=table(wide), per_rank_step_dim=table(long),
        instances=table(inst), stragglers=table(strag), ep_instances=table(ep_inst),
        ep_groups=table(ep_groups), ep_traffic=table(ep_traffic), pp_bubbles=table(bubbles),
        alignment=extra["alignment"], validity=validity, step_times=table(steps.step_times(windows, rk)),
        participants=table(parts), root_causes=table(casc), critical_path=table(critical),
        pp_stages=pa.table({"rank": pa.array(list(stage), pa.int32()),
                            "stage": pa.array(list(stage.values()), pa.int32())}),
        kernel_bandwidth=table(kernel_bw), hang=hang, microbench=_microbench(run, source), top=top,
        pp_schedule=pp_schedule,
    )
    from tracekit.analysis.findings import findings

    result.findings = findings(result)
    return result


def _microbench(run: Run | None, source: RunLike) -> list[MicrobenchRun]:
    table = run.table("microbench") if run is not None else source.get("microbench")  # type: ignore[union-attr]
    return microbench_runs(table) if table is not None and table.num_rows else []


def _empty_instances() -> pl.DataFrame:
    return pl.DataFrame(schema={
        "instance": pl.Int64, "group": pl.String, "seq": pl.Int64, "op": pl.String, "dim": pl.String,
        "step": pl.Int32, "participants": pl.UInt32, "nranks": pl.Int32, "dtype": pl.String,
        "bytes": pl.Int64, "first_arrival_ns": pl.Int64, "last_arrival_ns": pl.Int64,
        "last_end_ns": pl.Int64, "mean_wait_ns": pl.Float64, "src": pl.Int32, "dst": pl.Int32,
        "first_rank": pl.Int32, "complete": pl.Boolean,
        "last_rank": pl.Int32, "max_wait_ns": pl.Int64, "duration_ns": pl.Int64, "caused_ns": pl.Int64,
        "algbw_gbps": pl.Float64, "busbw_gbps": pl.Float64, "slot": pl.Int64,
        "lead_ns": pl.Int64, "baseline_lead_ns": pl.Int64, "excess_ns": pl.Int64})


def _pl(t: pa.Table) -> pl.DataFrame:
    df = pl.from_arrow(t)
    assert isinstance(df, pl.DataFrame)
    return df.with_columns(pl.col(pl.Categorical).cast(pl.String))


def _document(r: AnalysisResult) -> AnalysisDocument:
    rk = _pl(r.ranks)
    wide = _pl(r.per_rank_step)
    long = _pl(r.per_rank_step_dim)
    inst = _pl(r.instances)
    per_dim: dict[tuple[int, int], tuple[dict[str, int], dict[str, int], dict[str, int]]] = {}
    for row in long.iter_rows(named=True):
        comm, exposed, overlap = per_dim.setdefault((row["rank"], row["step"]), ({}, {}, {}))
        comm[row["dim"]] = row["comm_ns"]
        exposed[row["dim"]] = row["exposed_ns"]
        overlap[row["dim"]] = row["overlap_ns"]
    prs = []
    for row in wide.iter_rows(named=True):
        comm, exposed, overlap = per_dim.get((row["rank"], row["step"]), ({}, {}, {}))
        prs.append(RankStep(rank=row["rank"], step=row["step"], span_ns=row["span_ns"], compute_ns=row["compute_ns"],
                            comm_ns=comm, exposed_ns=exposed, overlap_ns=overlap, comm_total_ns=row["comm_ns"],
                            exposed_total_ns=row["exposed_ns"], idle_ns=row["idle_ns"]))
    groups = _pl(r.groups)
    stalls_rows = (r.stalls().join(groups.select("group", "desc"), on="group", how="left", maintain_order="left")
                   .select(*STALL_COLUMNS, "desc") if inst.height else pl.DataFrame())
    bandwidth = r.bandwidth()
    from tracekit.analysis.steps import STEP_TIME

    counts = AnalysisCounts(
        ranks=rk.height, groups=groups.height, steps=sorted(set(wide.get_column("step").to_list())),
        collective_calls=r.collectives.num_rows, instances=inst.height, mismatches=r.mismatches.num_rows,
        mean_step_ns=r.mean_step_ns(), step_time=STEP_TIME,
        step_sources=sorted({str(x) for x in _pl(r.steps).get_column("source").to_list() if x is not None})
        if "source" in r.steps.column_names else [])
    return AnalysisDocument(
        summary=counts, validity=r.validity, step_times=_rows(r.step_times),
        clock_offsets_ns={str(k): v for k, v in rk.select("rank", "clock_offset_ns").iter_rows()},
        alignment_residual_ns=r.alignment.residual_ns, alignment=r.alignment,
        dims={g: list(d or []) for g, d in groups.select("group", "dims").iter_rows()},
        pp_stages={str(k): v for k, v in _pl(r.pp_stages).iter_rows()}, per_rank_step=prs,
        stalls=stalls_rows.to_arrow(), root_causes=_rows(r.root_causes, r.top),
        critical_path=_rows(r.critical_path), stragglers=_rows(r.stragglers, r.top), ep=_rows(r.ep_groups),
        pp_bubbles=_rows(r.pp_bubbles), pp_schedule=r.pp_schedule.shape() if r.pp_schedule is not None else None,
        bandwidth=bandwidth, mismatches=_rows(r.mismatches, r.top * 10), hang=r.hang, microbench=r.microbench,
        findings=r.findings)


def _rows(t: pa.Table, n: int | None = None) -> pa.Table:
    """`t` as the document lists it: categories as text, the first `n` rows."""
    df = _pl(t)
    return (df if n is None else df.head(n)).to_arrow()
