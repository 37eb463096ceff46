"""Trace-driven replay of a run's communication on one or more network models.

Compute keeps its traced durations; every matched collective instance becomes flows on the
topology and gets a new duration from the fluid simulation. Events are re-timed through the
dependencies the trace shows (`tracekit.replay.dependencies`), collective sync and p2p pairing.
Release times and durations depend on each other, so the schedule and the simulation alternate
until the instance start times settle. A per-(op, size) efficiency fitted on the baseline is
applied on every topology; its error is reported uncalibrated, in sample and cross-validated
(`tracekit.replay.calibration`). Replaying with the traced durations reproduces the trace
(`identity`); where the trace contradicts the model, the instance keeps its traced relation.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute
from msgspec import UNSET, UnsetType

from tracekit import __version__, schema
from tracekit._progress import status
from tracekit.analysis.breakdown import BUSY, COMPUTE, DimExposure, breakdown, mean_exposure
from tracekit.errors import TracekitError
from tracekit.finding import Finding
from tracekit.nccl_fabric import NcclFabric, replay_fabric
from tracekit.replay import _kernels, hardware
from tracekit.replay import dependencies as deps
from tracekit.replay.backend import cpu_backend
from tracekit.replay.calibration import (
    Calibration,
    ReplayErrors,
    TwoTerms,
    applied,
    calibrate,
    replay_errors,
    scored,
    unseen_buckets,
)
from tracekit.replay.decompose import Instance, decompose_plan
from tracekit.replay.fabric_graph import build_observed, is_observed, observed_spec
from tracekit.replay.replicate import Replication, replicated_plan
from tracekit.replay.rounds import Rounds
from tracekit.replay.simulate import (
    Flows,
    SimResult,
    connection_weights,
    resource_bytes,
    route,
    simulate,
    to_cables,
)
from tracekit.replay.storage import STORAGE_DIM, StorageFlows, route_storage
from tracekit.replay.topology import (
    Topology,
    TopologySpec,
    build,
    parse_spec,
    physics_caps,
    place,
    sized,
    with_gpu,
)
from tracekit.results import Result, dumps, from_builtins
from tracekit.store import Run
from tracekit.telemetry.compare import TelemetryComparison

TIMED_KINDS = ("compute", "comm", "memcpy", "memset")
DEP_GAP_NS = deps.DEP_GAP_NS
MAX_ITER = 8
#: The schedule/simulate fixed point has settled when no instance start moved by more than this
#: share of the longest replayed network time.
SETTLE_FRAC = 1e-3
N_WINDOWS = 200
HOT_LINKS = 10
#: A collective's members "end far apart" when their ends spread over more than this share of its
#: traced network time (and more than END_SPREAD_NS).
END_SPREAD_FRAC = 0.25
END_SPREAD_NS = 10_000
#: Cautions: the baseline step off the traced step, or the cross-validated p90, beyond these.
CAUTION_STEP = 0.05
CAUTION_P90 = 0.25


class ReplayError(TracekitError):
    """The run cannot be replayed (missing instances, no timed communication, ...)."""


class Oscillation(Result, frozen=True, kw_only=True):
    """A collective instance that kept moving: how far its start and its replayed network time
    ranged over the rounds of the cycle (or the last two rounds), ns."""

    group: str
    seq: int
    op: str
    dim: str
    start_swing_ns: float
    duration_swing_ns: float


class Convergence(Result, frozen=True, kw_only=True):
    """How the schedule/simulate fixed point of one topology ended: the rounds run, the largest
    instance start move of each (ns) and of the last (`residual_ns`), against `tolerance_ns`
    (SETTLE_FRAC of the longest replayed network time).

    `cycle` > 0: from round `cycle_from` the starts came back every `cycle` rounds (a limit
    cycle), and the rounds after it were damped, from the cycle's mean network times (Aitken
    relaxation; each of their moves is the one a plain round would make from the damped state).
    Not converged: the result is the damped state (with a cycle) or the last round's (the cap),
    not a fixed point; the instances that kept moving, those whose network time swings first, are
    in `oscillating` (`n_oscillating` of them in all)."""

    rounds: int
    residual_ns: float
    tolerance_ns: float
    converged: bool
    moves_ns: tuple[float, ...] = ()
    cycle: int = 0
    cycle_from: int = 0
    n_oscillating: int = 0
    oscillating: tuple[Oscillation, ...] = ()


class InstanceReplay(Result, frozen=True, kw_only=True):
    """One collective instance on one topology: its traced and replayed network time (ns), where its
    efficiency came from in sample and cross-validated, its fallback reason, and the NCCL plan used."""

    group: str
    seq: int
    op: str
    dim: str
    traced_ns: int
    replayed_ns: int
    calibration: str | None = None
    cross_validation: str | None = None
    fallback: str | None = None
    algo: str | None = None
    proto: str | None = None
    algo_source: str | None = None


class HotLink(Result, frozen=True, kw_only=True):
    """One of a topology's busiest cables: peak and mean window utilisation, bytes both ways."""

    link: str
    peak_util: float
    mean_util: float
    bytes: int


class TopologySummary(Result, frozen=True, kw_only=True):
    """What results/replay.json keeps of one topology's replay."""

    topology: str
    step_ns: dict[str, int] = msgspec.field(default_factory=dict)
    traced_step_ns: dict[str, int] = msgspec.field(default_factory=dict)
    comm_ns: dict[str, int] = msgspec.field(default_factory=dict)
    exposed_ns: dict[str, int] = msgspec.field(default_factory=dict)
    instances: list[InstanceReplay] = msgspec.field(default_factory=list)
    hot_links: list[HotLink] = msgspec.field(default_factory=list)
    replay_error: ReplayErrors | None = None
    convergence: Convergence | UnsetType = UNSET  # unset: a replay.json written before it was kept


@dataclass
class TopologyResult:
    """Replay of one topology: its `summary` (the JSON) and the tables and arrays the JSON leaves out
    (empty when read back from results/replay.json: the link samples are in the run's table)."""

    summary: TopologySummary
    link_samples: pa.Table = field(default_factory=lambda: pa.table({}))
    topology_nodes: pa.Table = field(default_factory=lambda: pa.table({}))
    topology_links: pa.Table = field(default_factory=lambda: pa.table({}))
    link_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    n_flows: int = 0
    step_error: dict[str, float] = field(default_factory=dict)
    timeline: pa.Table | None = None  # per replayed event: rank, lane, kind, replayed and traced ts/dur
    tier_bytes: dict[str, dict[str, int]] = field(default_factory=dict)  # tier -> dim -> bytes sent up into it
    storage_ns: dict[str, int] = field(default_factory=dict)  # north-south transfer tag -> duration

    @property
    def topology(self) -> str:
        return self.summary.topology

    @property
    def step_ns(self) -> dict[str, int]:
        return self.summary.step_ns

    @property
    def traced_step_ns(self) -> dict[str, int]:
        return self.summary.traced_step_ns

    @property
    def comm_ns(self) -> dict[str, int]:
        return self.summary.comm_ns

    @property
    def exposed_ns(self) -> dict[str, int]:
        return self.summary.exposed_ns

    @property
    def instances(self) -> list[InstanceReplay]:
        return self.summary.instances

    @property
    def hot_links(self) -> list[HotLink]:
        return self.summary.hot_links

    @property
    def replay_error(self) -> ReplayErrors | None:
        return self.summary.replay_error

    @property
    def convergence(self) -> Convergence | None:
        """None: read back from a replay.json written before it was kept."""
        return self.summary.convergence if isinstance(self.summary.convergence, Convergence) else None


class Fallback(Result, frozen=True, kw_only=True):
    """A collective instance whose trace contradicts the model, replayed with its traced relation."""

    group: str
    seq: int
    op: str
    reason: str  # "ended_before_peer_arrived" or "members_end_apart"
    ranks: tuple[int, ...] = ()
    text: str


class Identity(Result, frozen=True, kw_only=True):
    """The baseline replayed with every traced duration: how far it lands from the trace."""

    max_step_error: float
    instances_fallen_back: int
    max_event_error_ns: float
    fallbacks: tuple[Fallback, ...] = ()
    #: per dim, comm and exposed comm on the identity timeline (the analysis' figures, `_exposure`)
    comm_ns: dict[str, int] = msgspec.field(default_factory=dict)
    exposed_ns: dict[str, int] = msgspec.field(default_factory=dict)


class CalibrationSummary(Result, frozen=True, kw_only=True):
    """The `calibration` block of results/replay.json: the efficiency per bucket, the two-term fits,
    how the error was split, the run the factors came from, and the buckets cross-validation filled
    without a fit of their own."""

    efficiency: dict[str, float] = msgspec.field(default_factory=dict)
    terms: dict[str, TwoTerms] = msgspec.field(default_factory=dict)
    split: str | None = None
    calibrated_on: str | None = None
    unseen_buckets: dict[str, str] = msgspec.field(default_factory=dict)


class ReplaySummary(Result, frozen=True, kw_only=True):
    """results/replay.json (and `tracekit replay --json`'s replay)."""

    topologies: list[str] = msgspec.field(default_factory=list)
    results: list[TopologySummary] = msgspec.field(default_factory=list)
    identity: Identity | None = None
    dependencies: dict[str, int] = msgspec.field(default_factory=dict)
    calibration: CalibrationSummary = msgspec.field(default_factory=CalibrationSummary)
    findings: list[Finding] = msgspec.field(default_factory=list)
    telemetry: TelemetryComparison | UnsetType = UNSET  # set when the run has telemetry


@dataclass
class ReplayResult:
    """Results per topology; the first is the baseline (the observed network). `summary` is its JSON."""

    topologies: list[str]
    results: list[TopologyResult]
    baseline: str
    efficiency: dict[str, float]
    errors: ReplayErrors | None = None
    identity: Identity | None = None
    terms: dict[str, TwoTerms] = field(default_factory=dict)  # two-term fits per (op, algorithm) group
    dependencies: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    telemetry: TelemetryComparison | None = None  # when the run has telemetry
    unseen: dict[str, str] = field(default_factory=dict)  # buckets without a fit under cross-validation
    scored: int = 0  # the collective instances the replay error scores (0 when read back)

    @property
    def summary(self) -> ReplaySummary:
        err = self.errors
        return ReplaySummary(
            topologies=list(self.topologies), results=[r.summary for r in self.results], identity=self.identity,
            dependencies=dict(self.dependencies),
            calibration=CalibrationSummary(efficiency=dict(self.efficiency), terms=self.terms,
                                           split=err.split if err else None,
                                           calibrated_on=err.calibrated_on if err else None,
                                           unseen_buckets=dict(self.unseen) if err else {}),
            findings=self.findings, telemetry=self.telemetry if self.telemetry is not None else UNSET)

    def dumps(self) -> str:
        return dumps(self.summary)

    @classmethod
    def of(cls, summary: ReplaySummary) -> ReplayResult:
        """The replay a stored summary (results/replay.json) describes, without the tables it leaves out."""
        results = [TopologyResult(summary=r) for r in summary.results]
        names = [r.topology for r in results]
        cal = summary.calibration
        return cls(topologies=summary.topologies or names, results=results, baseline=names[0] if names else "",
                   efficiency=cal.efficiency, terms=cal.terms, errors=results[0].replay_error if results else None,
                   identity=summary.identity, dependencies=summary.dependencies, findings=summary.findings,
                   telemetry=summary.telemetry if isinstance(summary.telemetry, TelemetryComparison) else None,
                   unseen=cal.unseen_buckets)

    @classmethod
    def load(cls, run: Run | str | os.PathLike[str]) -> ReplayResult | None:
        """The replay stored in a run directory (results/replay.json), or None."""
        doc = (run if isinstance(run, Run) else Run(run)).read_json("replay")
        return cls.of(from_builtins(doc, ReplaySummary)) if isinstance(doc, Mapping) else None

    def result(self, name: str) -> TopologyResult:
        for r in self.results:
            if r.topology == name:
                return r
        raise KeyError(name)

    def link_samples(self) -> pa.Table:
        """All topologies' replayed link samples in one table."""
        return pa.concat_tables([r.link_samples for r in self.results], promote_options="permissive")


# ------------------------------------------------------------------------------------------
# Preparation: tables -> events, instances and placement (topology independent).


@dataclass
class _Inst:
    group: str
    seq: int
    op: str
    dim: str
    ranks: list[int]
    nbytes: float
    splits: dict[int, Sequence[float]]
    src: int | None
    dst: int | None
    algo: str | None
    traced_start: float
    traced_end: float
    members: list[int]
    proto: str | None = None
    step: int = -1
    fallback: Fallback | None = None
    size: int = 0  # the communicator's size (its calls' nranks), members outside the run included

    @property
    def traced_ns(self) -> float:
        return max(self.traced_end - self.traced_start, 1.0)


@dataclass
class _Prepared:
    t0: int
    rank: np.ndarray
    lane: np.ndarray
    kind: np.ndarray  # 0 compute, 1 comm, 2 other timed
    start: np.ndarray
    end: np.ndarray
    step: np.ndarray
    inst: np.ndarray  # the instance of each comm event (-1: none)
    sched_inst: np.ndarray  # the instance each event waits for (-1 also for decoupled members)
    end_frac: np.ndarray  # a member's end within its instance: (traced end - start) / network time
    prev: np.ndarray
    nxt: np.ndarray
    dep_ptr: np.ndarray
    dep_ids: np.ndarray
    slack: np.ndarray
    order_by_start: np.ndarray
    instances: list[_Inst]
    inst_ptr: np.ndarray
    inst_ids: np.ndarray
    placement: dict[int, tuple[int, int]]  # rank -> (host index, local index)
    hosts: int
    gpus_per_host: int
    fabric: NcclFabric  # rings, channel counts and network hops NCCL built (from NCCL logs)
    has_steps: bool
    dep_counts: dict[str, int] = field(default_factory=dict)
    dep_rule: np.ndarray | None = None
    replay_dur: np.ndarray | None = None  # replayed durations of timed events (events.replay_dur_ns or traced)
    step_time: dict[str, float] = field(default_factory=dict)  # the analysis' step times (steps.STEP_TIME)
    host_names: list[str] = field(default_factory=list)  # per host index, when the ranks table names them
    ib_fabric: tuple[pa.Table | None, pa.Table | None] = (None, None)  # topology_nodes / topology_links (ibnetdiscover)
    call_dim: np.ndarray | None = None  # per event, the dim of its own collective call ("OTHER": none)
    windows: pl.DataFrame | None = None  # the analysis' step windows (rank, step, start_ns, end_ns) on this clock


def _plain(df: pl.DataFrame) -> pl.DataFrame:
    """Categorical (dictionary) columns as plain strings."""
    cats = [c for c, t in df.schema.items() if t == pl.Categorical or isinstance(t, pl.Enum)]
    return df.with_columns([pl.col(c).cast(pl.Utf8) for c in cats]) if cats else df


def _prepare(tables: Mapping[str, pa.Table], *, need_collectives: bool = True,
             placement: Mapping[int, tuple[int, int]] | None = None) -> _Prepared:
    for name in ("events", "collectives") if need_collectives else ("events",):
        if name not in tables:
            raise ReplayError(f"replay needs the {name!r} table")
    ranks = pl.from_arrow(schema.conform("ranks", tables.get("ranks")))
    coll = pl.from_arrow(schema.conform("collectives", tables.get("collectives")))
    events = pl.from_arrow(schema.conform("events", tables["events"]))
    groups = pl.from_arrow(schema.conform("groups", tables.get("groups")))
    fabric = replay_fabric(schema.conform("groups", tables.get("groups")),
                           schema.conform("channels", tables.get("channels")),
                           schema.conform("ranks", tables.get("ranks")))
    events, coll, groups = (_plain(df) for df in (events, coll, groups))
    if need_collectives and coll.height == 0:
        raise ReplayError("the run has no collective calls to replay (nothing was ingested, or the traces "
                          "hold no communication)")
    if need_collectives and coll.get_column("instance").null_count() == coll.height:
        raise ReplayError("no matched collective instances: run the analysis step (prepare) first")

    all_ranks = sorted(set(events.get_column("rank").to_list()) | set(coll.get_column("rank").to_list())
                       | set(ranks.get_column("rank").to_list()))
    offset = {r: 0 for r in all_ranks}
    host_of: dict[int, str] = {}
    local_of: dict[int, int] = {}
    for row in ranks.iter_rows(named=True):
        offset[row["rank"]] = int(row["clock_offset_ns"] or 0)
        if row["host"] is not None:
            host_of[row["rank"]] = str(row["host"])
        if row["local_device"] is not None:
            local_of[row["rank"]] = int(row["local_device"])
    if placement is not None:
        placement, hosts, per_host = _given_placement(all_ranks, placement)
    else:
        placement, hosts, per_host = _placement(all_ranks, host_of, local_of)
    host_names = [""] * hosts
    for r, (h, _) in placement.items():
        if r in host_of and not host_names[h]:
            host_names[h] = host_of[r]
    if not all(host_names):
        host_names = []

    offs = pl.DataFrame({"rank": all_ranks, "_off": [offset[r] for r in all_ranks]},
                        schema={"rank": pl.Int32, "_off": pl.Int64})
    ev = (events.filter(pl.col("kind").is_in(list(TIMED_KINDS)) & pl.col("ts_ns").is_not_null())
          .join(offs, on="rank", how="left")
          .with_columns((pl.col("ts_ns") + pl.col("_off").fill_null(0)).alias("t"),
                        pl.col("dur_ns").fill_null(0).clip(lower_bound=0).alias("d"),
                        (pl.col("replay_dur_ns") if "replay_dur_ns" in events.columns
                         else pl.lit(None, pl.Int64)).cast(pl.Int64).alias("replay_d")))
    call_dims = coll.select("coll_id", pl.col("dim").cast(pl.String).fill_null("OTHER").alias("_call_dim"))
    coll = coll.filter(pl.col("instance").is_not_null())
    coll_ids = coll.select("coll_id", "instance")
    # collectives that carry their own timing but have no event: timeline entries of their own
    linked = set(ev.get_column("coll_id").drop_nulls().to_list())
    extra = (coll.filter(~pl.col("coll_id").is_in(list(linked)) & pl.col("ts_ns").is_not_null()
                         & pl.col("dur_ns").is_not_null())
             .join(offs, on="rank", how="left")
             .select(pl.col("rank"), pl.col("lane").fill_null("comm").alias("lane"),
                     pl.lit("comm").alias("kind"), pl.col("step"), pl.col("coll_id"),
                     (pl.col("ts_ns") + pl.col("_off").fill_null(0)).alias("t"),
                     pl.col("dur_ns").clip(lower_bound=0).alias("d"),
                     pl.lit(None, pl.Int64).alias("correlation"), pl.lit(None, pl.Int64).alias("replay_d")))
    keep = ["rank", "lane", "kind", "step", "coll_id", "t", "d", "correlation", "replay_d"]
    sync = (events.filter((pl.col("kind") == "sync") & pl.col("ts_ns").is_not_null()
                          & pl.col("sync_lane").is_not_null())
            .join(offs, on="rank", how="left")
            .select("rank", "lane", "sync_lane", "sync_correlation", "correlation",
                    (pl.col("ts_ns") + pl.col("_off").fill_null(0)).alias("t"),
                    pl.col("dur_ns").fill_null(0).clip(lower_bound=0).alias("d")))
    launches = (events.filter((pl.col("kind") == "runtime") & pl.col("ts_ns").is_not_null()
                              & pl.col("correlation").is_not_null())
                .join(offs, on="rank", how="left")
                .group_by("rank", "correlation")
                .agg((pl.col("ts_ns") + pl.col("dur_ns").fill_null(0).clip(lower_bound=0)
                      + pl.col("_off").fill_null(0)).max().alias("_launch")))
    ev = ev.select([pl.col(c) for c in keep])
    if extra.height:
        ev = pl.concat([ev, extra.select([pl.col(c).cast(ev.schema[c]) for c in keep])])
    if ev.height == 0:
        raise ReplayError("no timed events to replay")
    ev = ev.join(coll_ids, on="coll_id", how="left").join(call_dims, on="coll_id", how="left")
    ev = ev.with_columns(pl.when(pl.col("kind") == "comm").then(pl.col("instance")).otherwise(None)
                         .alias("instance"))
    t0 = int(ev.get_column("t").min())
    ev = (ev.join(launches, on=["rank", "correlation"], how="left")
          .with_columns((pl.col("t") - t0).alias("t"), (pl.col("_launch") - t0).alias("_launch"))
          .sort(["rank", "lane", "t", "d"]))
    n = ev.height
    rank = ev.get_column("rank").to_numpy().astype(np.int64)
    kind_s = ev.get_column("kind").to_numpy()
    kind = np.where(kind_s == "compute", 0, np.where(kind_s == "comm", 1, 2)).astype(np.int64)
    call_dim = ev.get_column("_call_dim").fill_null("OTHER").to_numpy().astype(object)
    start = ev.get_column("t").to_numpy().astype(np.float64)
    end = start + ev.get_column("d").to_numpy().astype(np.float64)
    replay_d = ev.get_column("replay_d").fill_null(-1).to_numpy().astype(np.float64)
    step = ev.get_column("step").fill_null(-1).to_numpy().astype(np.int64)
    lane_key = (ev.get_column("rank").cast(pl.Utf8) + "|" + ev.get_column("lane").fill_null("")).to_numpy()
    same = np.zeros(n, bool)
    same[1:] = lane_key[1:] == lane_key[:-1]
    prev = np.where(same, np.arange(n) - 1, -1).astype(np.int64)
    nxt = np.full(n, -1, np.int64)
    nxt[:-1] = np.where(same[1:], np.arange(1, n), -1)

    # instances
    inst_raw = ev.get_column("instance").fill_null(-1).to_numpy().astype(np.int64)
    group_ranks = {str(g): [int(x) for x in (rs or [])] for g, rs in zip(
        groups.get_column("group").to_list(), groups.get_column("ranks").to_list(), strict=False)}
    linked = np.flatnonzero(inst_raw >= 0)
    linked = linked[np.argsort(inst_raw[linked], kind="stable")]  # by instance, then event order
    values, first = np.unique(inst_raw[linked], return_index=True)
    inst_vals = values.tolist()
    parts = np.split(linked, first[1:]) if values.size else []
    by_inst = dict(zip(inst_vals, (part.tolist() for part in parts), strict=True))
    needed = ["instance", "rank", "group", "seq", "op", "in_bytes", "out_bytes", "nranks", "peer", "in_splits",
              "out_splits", "algo", "proto", "dim"]
    rows = {int(k): part for k, part in coll.select([c for c in needed if c in coll.columns])
            .rows_by_key("instance", named=True, include_key=True).items()}
    instances: list[_Inst] = []
    inst = np.full(n, -1, np.int64)
    sched_inst = np.full(n, -1, np.int64)
    end_frac = np.ones(n)
    ptr = [0]
    ids: list[int] = []
    for v in inst_vals:
        members = by_inst[v]
        part = rows.get(v)
        if part is None or not members:
            continue
        info = _instance_info(part, group_ranks)
        k = len(instances)
        synced = _synchronised(info, members, rank, start, end)
        info.members = members
        info.step = int(step[members].max())
        instances.append(info)
        inst[members] = k
        sched_inst[synced] = k
        end_frac[synced] = (end[synced] - info.traced_start) / info.traced_ns
        ids.extend(synced)
        ptr.append(len(ids))

    dependencies = deps.build(ev, sync.with_columns(pl.col("t") - t0), rank, kind, start, end, prev,
                              ev.get_column("_launch").fill_null(np.nan).to_numpy().astype(np.float64))
    order_by_start = np.lexsort((np.arange(n), start)).astype(np.int64)
    return _Prepared(
        t0=t0, rank=rank, lane=ev.get_column("lane").fill_null("").to_numpy(), kind=kind, start=start,
        end=end, step=step, inst=inst, sched_inst=sched_inst,
        end_frac=end_frac, prev=prev, nxt=nxt, dep_ptr=dependencies.dep_ptr, dep_ids=dependencies.dep_ids,
        slack=dependencies.slack, order_by_start=order_by_start,
        instances=instances, inst_ptr=np.asarray(ptr, np.int64), inst_ids=np.asarray(ids, np.int64),
        placement=placement, hosts=hosts, gpus_per_host=per_host, fabric=fabric,
        has_steps=bool((step >= 0).any()), dep_counts=dependencies.counts, dep_rule=dependencies.rule,
        replay_dur=np.where(replay_d >= 0, replay_d, end - start), host_names=host_names,
        ib_fabric=(tables.get("topology_nodes"), tables.get("topology_links")),
        step_time=_step_times(tables.get("step_times")), windows=_windows(tables.get("step_windows"), offs, t0),
        call_dim=call_dim)


def _windows(table: pa.Table | None, offsets: pl.DataFrame, t0: int) -> pl.DataFrame | None:
    """The analysis' step windows moved onto the replay's clock (rank offset, less t0), or None."""
    if table is None or table.num_rows == 0:
        return None
    w = pl.from_arrow(table)
    assert isinstance(w, pl.DataFrame)
    return (w.with_columns(pl.col("rank").cast(pl.Int32)).join(offsets, on="rank", how="left")
            .select("rank", "step", *[(pl.col(c) + pl.col("_off").fill_null(0) - t0).alias(c)
                                      for c in ("start_ns", "end_ns")]))


def _step_times(table: pa.Table | None) -> dict[str, float]:
    """{step: step time} from `analysis.prepare`'s step_times (one step-time definition for the
    analysis, the replay and the report), or {} when the tables carry none."""
    if table is None or table.num_rows == 0:
        return {}
    return {str(s): float(ns) for s, ns in zip(table.column("step").to_pylist(), table.column("step_ns").to_pylist(),
                                               strict=True) if s is not None and ns is not None}


def _synchronised(info: _Inst, members: list[int], rank: np.ndarray, start: np.ndarray, end: np.ndarray
                  ) -> list[int]:
    """The members that waited for the instance (all but those that ended before the last member
    arrived, e.g. a buffered send completed before its recv was posted); sets the instance's
    traced start and end from them and records a fallback where the trace contradicts the model."""
    arrive = start[members]
    last = members[int(np.argmax(arrive))]
    t_start = float(arrive.max())
    synced = [j for j in members if j == last or end[j] > t_start]
    early = [j for j in members if j != last and end[j] <= t_start]
    info.traced_start = t_start
    info.traced_end = float(end[synced].max())
    ends = end[synced]
    spread = float(ends.max() - ends.min())
    what = "send completed before its recv was posted" if info.op == "send" else \
        "a member ended before the last one arrived"
    if early:
        gone = tuple(sorted({int(rank[j]) for j in early}))
        info.fallback = Fallback(group=info.group, seq=info.seq, op=info.op, reason="ended_before_peer_arrived",
                                 text=f"{info.op} {info.group}#{info.seq}: {what} "
                                 f"(rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))}); "
                                 "those members keep their traced duration", ranks=gone)
    elif spread > max(END_SPREAD_NS, END_SPREAD_FRAC * info.traced_ns):
        first = tuple(sorted({int(rank[j]) for j in synced if end[j] - ends.min() < spread / 2}))
        info.fallback = Fallback(group=info.group, seq=info.seq, op=info.op, reason="members_end_apart",
                                 text=f"{info.op} {info.group}#{info.seq}: members end {spread / 1e3:.0f} µs apart "
                                 f"({spread / info.traced_ns:.0%} of its network time); each keeps its traced "
                                 "end within the instance", ranks=first)
    return synced


def _placement(all_ranks: list[int], host_of: dict[int, str], local_of: dict[int, int]
               ) -> tuple[dict[int, tuple[int, int]], int, int]:
    if not host_of:
        per = 8 if len(all_ranks) >= 8 else len(all_ranks)
        return {r: divmod(i, per) for i, r in enumerate(all_ranks)}, math.ceil(len(all_ranks) / per), per
    hosts: dict[str, list[int]] = {}
    for r in all_ranks:
        hosts.setdefault(host_of.get(r, f"?{r}"), []).append(r)
    order = sorted(hosts, key=lambda h: min(hosts[h]))
    placement = {}
    for h_idx, h in enumerate(order):
        for l_idx, r in enumerate(sorted(hosts[h], key=lambda r: (local_of.get(r, r), r))):
            placement[r] = (h_idx, l_idx)
    return placement, len(order), max(len(v) for v in hosts.values())


def _given_placement(all_ranks: list[int], given: Mapping[int, tuple[int, int]]
                     ) -> tuple[dict[int, tuple[int, int]], int, int]:
    missing = [r for r in all_ranks if r not in given]
    if missing:
        raise ReplayError(f"the placement gives no (host, gpu) for rank(s) {missing[:8]}")
    placement = {r: (int(given[r][0]), int(given[r][1])) for r in all_ranks}
    if len(set(placement.values())) < len(placement):
        raise ReplayError("the placement puts two ranks on the same (host, gpu)")
    if min(min(v) for v in placement.values()) < 0:
        raise ReplayError("the placement has a negative host or gpu index")
    hosts = max(h for h, _ in placement.values()) + 1
    return placement, hosts, max(g for _, g in placement.values()) + 1


def _instance_info(part: list[dict[str, Any]], group_ranks: dict[str, list[int]]) -> _Inst:
    """What the replay needs of one instance, from its collective rows (one dict per member call)."""
    ops = [row["op"] for row in part if row["op"]]
    op = ops[0] if ops else "other"
    if {"send", "recv"} & set(ops):
        op = "send"
    group = str(part[0]["group"])
    dims = [row["dim"] for row in part if row["dim"]]
    seqs = [row["seq"] for row in part if row["seq"] is not None]
    algos = [row["algo"] for row in part if row["algo"]]
    protos = [row["proto"] for row in part if row.get("proto")]
    participants = sorted({row["rank"] for row in part})
    order = group_ranks.get(group) or []
    present, listed = set(participants), set(order)
    ranks = [r for r in order if r in present] + [r for r in participants if r not in listed]
    in_b = [row["in_bytes"] for row in part if row["in_bytes"] is not None]
    out_b = [row["out_bytes"] for row in part if row["out_bytes"] is not None]
    n = max(len(ranks), int(max([row["nranks"] for row in part if row["nranks"] is not None] or [1])))
    nbytes = float(max(in_b or [0]))
    if op == "all_gather":
        nbytes = float(max(out_b)) if out_b else nbytes * n
    elif op == "reduce_scatter" and not in_b:
        nbytes = float(max(out_b or [0])) * n
    elif op in ("gather", "scatter"):
        nbytes = float(max(in_b + out_b or [0]))
    elif op == "barrier":
        nbytes = 0.0
    splits: dict[int, Sequence[float]] = {}
    src = dst = None
    for row in part:
        if op == "all_to_all" and row["in_splits"]:
            splits[row["rank"]] = np.asarray(row["in_splits"], np.float64)
        if op == "send":
            b = row["in_bytes"] if row["op"] == "send" else row["out_bytes"]
            nbytes = max(nbytes, float(b or 0))
            if row["op"] == "send":
                src, dst = row["rank"], row["peer"] if row["peer"] is not None else dst
            elif row["op"] == "recv":
                dst = row["rank"]
                if src is None and row["peer"] is not None:
                    src = row["peer"]
    if op == "all_to_all" and not splits:
        recv = {row["rank"]: row["out_splits"] for row in part if row["out_splits"]}
        if recv and len(recv) == len(ranks):
            for i, r in enumerate(ranks):
                splits[r] = [float(recv[q][i]) if len(recv[q]) > i else 0.0 for q in ranks]
    return _Inst(group=group, seq=int(min(seqs)) if seqs else -1, op=op, dim=dims[0] if dims else "OTHER",
                 ranks=ranks, nbytes=nbytes, splits=splits, src=src, dst=dst,
                 algo=algos[0] if algos else None, traced_start=0.0, traced_end=0.0, members=[],
                 proto=protos[0] if protos else None, size=n)


# ------------------------------------------------------------------------------------------
# Replay


def _gpu_map(prep: _Prepared, spec: TopologySpec) -> dict[int, int]:
    hosts: list[list[int]] = [[] for _ in range(prep.hosts)]
    for r in sorted(prep.placement, key=lambda r: prep.placement[r]):
        hosts[prep.placement[r][0]].append(r)
    return place(spec, hosts)[0]


class _Net:
    """One topology with the run's flows decomposed and routed (release times set per call)."""

    def __init__(self, prep: _Prepared, spec: TopologySpec, algo: str, storage: StorageFlows | None = None,
                 baseline: _Net | None = None, replication: Replication | None = None) -> None:
        if is_observed(spec):
            self.topology: Topology = build_observed(*prep.ib_fabric, prep.host_names, prep.gpus_per_host, spec=spec)
            gmap = {r: h * prep.gpus_per_host + local for r, (h, local) in prep.placement.items()}
            if storage is not None and len(storage):
                raise ReplayError("storage flows need storage nodes, which the observed fabric does not name")
        else:
            spec = sized(spec, hosts=prep.hosts, gpus=prep.gpus_per_host)
            self.topology = build(spec)
            gmap = _gpu_map(prep, spec)
        self.gmap = gmap
        # a send/recv whose peer is outside the run has no flow (it is then `not_simulated`)
        insts = [Instance(key=k, op=i.op, ranks=i.ranks, nbytes=i.nbytes, algo=i.algo,
                          src=i.src if i.src in gmap and i.dst in gmap else None,
                          dst=i.dst if i.src in gmap and i.dst in gmap else None,
                          splits=i.splits, group=i.group, proto=i.proto)
                 for k, i in enumerate(prep.instances)]
        fab = prep.fabric
        traced_on = (baseline.topology, baseline.gmap) if baseline is not None else None
        if replication is not None:
            plan = replicated_plan(insts, replication, gmap, self.topology, rings=fab.rings, channels=fab.channels,
                                   hops=fab.hops, algo=algo)
        else:
            plan = decompose_plan(insts, self.topology, gmap, rings=fab.rings, channels=fab.channels,
                                  hops=fab.hops, algo=algo, traced_on=traced_on)
        self.plans = plan.plans
        self.flows: Flows = plan.flows
        self.fill = plan.fill  # pipeline fill of trees and chains
        self.latency_ns = np.asarray(plan.latency_ns, np.float64)  # NCCL's own latency per instance
        self.indptr, self.ids = route(self.topology, self.flows)
        self.hop_ns = _hop_latency(self.topology, self.indptr, self.ids, self.flows, len(prep.instances))
        self.weight = connection_weights(self.topology, self.indptr, self.ids, self.flows.key)
        self.n_inst = len(prep.instances)
        self.n_main = len(self.flows)
        self.storage = storage if storage is not None and len(storage) else None
        self.nbytes = self.flows.nbytes  # every flow's bytes: the collectives', then the storage flows'
        if self.storage is not None:
            s_ptr, s_ids = route_storage(self.topology, gmap, self.storage)
            self.indptr = np.concatenate([self.indptr, s_ptr[1:] + self.indptr[-1]])
            self.ids = np.concatenate([self.ids, s_ids])
            self.nbytes = np.concatenate([self.flows.nbytes, self.storage.nbytes])
            self.weight = np.concatenate([self.weight, np.ones(len(self.storage))])
            self.storage_release = self.storage.release_ns - prep.t0
        self.lat_mult = np.concatenate([self.flows.lat_mult, np.ones(self.nbytes.size - self.n_main)])
        self.max_gbs = np.concatenate([self.flows.rate_limits(), np.full(self.nbytes.size - self.n_main, np.inf)])
        key = self.flows.key
        # flows come instance by instance: the last finish per instance is then one reduceat
        self._runs = (np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
                      if self.n_main and np.all(key[1:] >= key[:-1]) else None)

    def run(self, inst_start: np.ndarray, *, n_windows: int = 0, window_ns: float = 1.0,
            merge: float = 0.0):
        """Simulate every flow released at its instance's start: (network time per instance, the
        simulation's result)."""
        release = self.release(inst_start)
        flows = Flows.from_lists(np.zeros(release.size), np.zeros(release.size), self.nbytes,
                                 release=release, lat_mult=self.lat_mult, max_gbs=self.max_gbs)
        out = simulate(self.topology, self.indptr, self.ids, flows, n_windows=n_windows,
                       window_ns=window_ns, merge=merge, weight=self.weight)
        return self.durations(release, out.finish), out

    def release(self, inst_start: np.ndarray) -> np.ndarray:
        """Every flow's release time: its instance's start (storage flows: their own)."""
        rel = np.nan_to_num(inst_start[self.flows.key]) if self.n_main else np.zeros(0)
        return np.concatenate([rel, self.storage_release]) if self.storage is not None else rel

    def durations(self, release: np.ndarray, finish: np.ndarray) -> np.ndarray:
        """Network time per instance (its last flow's finish), stretched by the pipeline fill."""
        dur = np.zeros(self.n_inst)
        if self.n_main:
            took = finish[:self.n_main] - release[:self.n_main]
            if self._runs is not None:
                dur[self.flows.key[self._runs]] = np.maximum(np.maximum.reduceat(took, self._runs), 0.0)
            else:
                np.maximum.at(dur, self.flows.key, took)
        return dur * self.fill

    def terms(self, sim: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The modelled time of each instance as (latency, transfer), ns: transfer is the simulated
        time `sim` without its flows' path latency; latency is NCCL's for the instance's plan, which
        counts every hop already, or that path latency where NCCL's model gives none (all-to-all,
        p2p). Instances without traffic (`sim` 0) get (0, 0)."""
        sim = np.asarray(sim, np.float64)
        hop = np.minimum(self.hop_ns, sim)
        latency = np.where(self.latency_ns > 0, self.latency_ns, hop)
        return np.where(sim > 0, latency, 0.0), sim - hop

    def storage_ns(self, out: Any) -> dict[str, int]:
        """Per tag of the storage flows, the time from their first release to their last finish."""
        if self.storage is None:
            return {}
        finish = out.finish[self.n_main:]
        result = {}
        for t, name in enumerate(self.storage.tags):
            sel = self.storage.tag == t
            if sel.any():
                result[name] = round(float(finish[sel].max() - self.storage_release[sel].min()))
        return result


def _hop_latency(topology: Topology, indptr: np.ndarray, ids: np.ndarray, flows: Flows, n_inst: int) -> np.ndarray:
    """Per instance, the largest path latency of its flows (latency multiplier included), ns."""
    out = np.zeros(n_inst)
    if len(flows):
        summed = np.concatenate([[0.0], np.cumsum(topology.res_latency[ids[:indptr[len(flows)]]])])
        path = (summed[indptr[1:len(flows) + 1]] - summed[indptr[:len(flows)]]) * flows.lat_mult
        np.maximum.at(out, flows.key, path)
    return out


def replay(tables: Mapping[str, pa.Table], topologies: Sequence[str | TopologySpec], *,
           baseline: str | TopologySpec | None = None, algo: str = "auto", max_iter: int = MAX_ITER,
           merge: float = 0.0, efficiency: Mapping[str, float] | None = None,
           terms: Mapping[str, TwoTerms] | None = None,
           placement: Mapping[int, tuple[int, int]] | None = None, storage: StorageFlows | None = None,
           calibrated_on: str | None = None, replication: Replication | None = None,
           link_windows: int | None = None) -> ReplayResult:
    """Replay the run's communication on each topology; the baseline (default: the first
    topology) is the observed network, on which the per-(op, size) efficiency is fitted and the
    replay error measured.

    What-ifs that change the run itself (tracekit.whatif) pass `efficiency` and `terms` (a
    baseline replay's `ReplayResult.efficiency` and `.terms`), applied as they are instead of a fit
    on the changed run; `placement`
    (rank -> (host index, GPU index in the host)) to override the hosts of the `ranks` table; and
    `storage`, north-south flows (checkpoints, data loading) added on every topology, which must
    have storage nodes (their durations in `TopologyResult.storage_ns`). `calibrated_on` names
    the run `efficiency` was fitted on when it is another run of the same job (`tracekit replay
    --calibration-from`): the error is then reported as out of sample. An optional
    `events.replay_dur_ns` column gives an event the duration it is replayed with; its traced
    times still define dependencies and slack. `replication` replays the run's ranks as copies
    on every topology (`tracekit.replay.replicate`: the scale what-if); `link_windows` bounds the
    windows of the link samples (0: none, and no last simulation to make them; a scale what-if
    needs only its times)."""
    # a trace names its GPU but not whether NCCL had NVLS (driver, fabric manager, NCCL_NVLS_ENABLE):
    # the profile's rates apply, NVLS stays as the spec says
    device = traced_device(tables)
    specs = [with_gpu(_spec(t), device, nvls=False) for t in topologies]
    base_spec = with_gpu(_spec(baseline_of(topologies, baseline)), device, nvls=False)
    cpu = cpu_backend(tables)
    if cpu is not None:
        return _not_modelled(tables, cpu)
    ordered = [base_spec] + [s for s in specs if s != base_spec]
    names = _unique_names(ordered)
    prep = _prepare(tables, placement=placement)
    if not prep.instances:
        raise ReplayError("no collective instance has a timed event to replay")
    traced = np.array([i.traced_ns for i in prep.instances])
    traced_start = np.array([i.traced_start for i in prep.instances])
    identity = _identity(prep)

    status(f"replaying {len(prep.instances)} collective instance(s) on {names[0]} (baseline)")
    base_net = _Net(prep, base_spec, algo, storage, replication=replication)
    n_windows = 0 if link_windows == 0 else window_count(base_net.topology.cap.size,
                                                         link_windows or 2 * N_WINDOWS + 1)
    window_ns = max(1000.0, math.ceil(float(prep.end.max()) / max(1, (n_windows - 1) // 2)))
    raw, raw_out = base_net.run(traced_start, n_windows=n_windows, window_ns=window_ns, merge=merge)
    latency, transfer = base_net.terms(raw)
    modelled = latency + transfer
    ops, nbytes = [i.op for i in prep.instances], np.array([i.nbytes for i in prep.instances])
    algos = [p.algo if p is not None else None for p in base_net.plans]
    cal = (applied(ops, nbytes, modelled, efficiency, terms=terms, algos=algos)
           if efficiency is not None else _calibration(prep, traced, modelled, latency, algos))
    no_flow = raw <= 0
    errors: ReplayErrors | None = replay_errors(
        ops, nbytes, traced, modelled, cal, calibrated_on=calibrated_on if efficiency is not None else None,
        latency=latency)
    unsimulated = _not_simulated(prep, no_flow)
    if no_flow.all():
        errors = None  # nothing was simulated: there is no replay error to quote, not a 0% one

    results = []
    for name, spec in zip(names, ordered, strict=False):
        if spec is not base_spec:
            status(f"replaying on {name}")
        net = base_net if spec is base_spec else _Net(prep, spec, algo, storage, baseline=base_net,
                                                      replication=replication)
        first = (raw, raw_out) if net is base_net else None
        results.append(_replay_one(prep, net, name, cal, no_flow, traced, max_iter, merge, window_ns,
                                   n_windows, first))
    base = results[0]
    for r in results:
        r.summary = msgspec.structs.replace(
            r.summary, replay_error=errors if r is base or errors is None else errors.inherited())
    for r in results[1:]:
        r.step_error = dict(base.step_error)
    findings = ([unsimulated] if unsimulated is not None else []) + _cautions(base, errors, identity, results)
    return ReplayResult(topologies=names, results=results, baseline=names[0], efficiency=cal.efficiency,
                        terms=dict(cal.terms), errors=errors, identity=identity, dependencies=dict(prep.dep_counts),
                        findings=findings,
                        unseen=unseen_buckets(ops, nbytes, traced, modelled, cal) if errors is not None else {},
                        scored=int(scored(traced, modelled).sum()) if errors is not None else 0)


@dataclass(frozen=True)
class RoutedInstance:
    """One collective instance of the run as the replay decomposed it (in the replay's order:
    `TopologyResult.instances[k]` is instance k)."""

    group: str
    seq: int
    op: str
    dim: str
    ranks: tuple[int, ...]
    src: int | None
    dst: int | None
    step: int


@dataclass(frozen=True)
class RoutedFlows:
    """The run's flows decomposed and routed on one topology (CSR paths `indptr`/`ids`), each
    owned by an instance (`key`), as the replay simulates them: what-ifs that re-time the flows
    themselves (the schedule what-if) start from these."""

    topology: Topology
    indptr: np.ndarray
    ids: np.ndarray
    nbytes: np.ndarray
    lat_mult: np.ndarray
    max_gbs: np.ndarray
    key: np.ndarray
    instances: tuple[RoutedInstance, ...]
    gpu_of: Mapping[int, int] = field(default_factory=dict)  # rank -> GPU on `topology`


def routed_flows(tables: Mapping[str, pa.Table], topology: str | TopologySpec, *, algo: str = "auto",
                 placement: Mapping[int, tuple[int, int]] | None = None) -> RoutedFlows:
    """The run's collective flows on `topology`, decomposed and routed as `replay` does."""
    spec = with_gpu(_spec(topology), traced_device(tables), nvls=False)
    prep = _prepare(tables, placement=placement)
    net = _Net(prep, spec, algo)
    n = net.n_main
    insts = tuple(RoutedInstance(group=i.group, seq=int(i.seq), op=i.op, dim=i.dim, ranks=tuple(i.ranks),
                                 src=i.src, dst=i.dst, step=i.step) for i in prep.instances)
    return RoutedFlows(topology=net.topology, indptr=net.indptr[:n + 1], ids=net.ids[:net.indptr[n]],
                       nbytes=net.nbytes[:n], lat_mult=net.lat_mult[:n], max_gbs=net.max_gbs[:n],
                       key=np.asarray(net.flows.key[:n], np.int64), instances=insts, gpu_of=dict(net.gmap))


def _not_simulated(prep: _Prepared, no_flow: np.ndarray) -> Finding | None:
    """The `not_simulated` finding: how many collective instances the model gave no traffic, and
    why (members outside the run, no byte count in the trace, or nothing to send: a one-rank
    group). They keep their traced durations, and the replay error scores only the simulated
    ones; when none was simulated there is no replay error at all (`replay_error` null), and
    every topology replays the trace as it was."""
    n = len(prep.instances)
    idle = np.flatnonzero(no_flow).tolist()
    if not idle:
        return None
    present = set(prep.placement)
    why: dict[str, int] = {"members_outside": 0, "no_bytes": 0, "no_peer": 0}
    for k in idle:
        inst = prep.instances[k]
        why["no_bytes" if inst.nbytes <= 0 else "members_outside" if _members_outside(inst, present)
            else "no_peer"] += 1
    words = {"members_outside": "members outside the run", "no_bytes": "no byte count in the trace",
             "no_peer": "no other member"}
    reason = ", ".join(f"{v} with {words[k]}" for k, v in why.items() if v)
    data = {"instances": n, "simulated": n - len(idle), "not_simulated": len(idle), **why,
            "ranks_present": len(present)}
    if len(idle) == n:
        return Finding("not_simulated", f"nothing was simulated: none of the {n} collective instance"
                       f"{'s' if n > 1 else ''} has traffic in the model ({reason}), so they keep their traced "
                       "durations, the replay error is not available and every topology gives the traced step",
                       severity="warning", value=float(len(idle)), data=data)
    return Finding("not_simulated", f"{len(idle)} of {n} collective instances were not simulated ({reason}): they "
                   f"keep their traced durations, and the replay error scores the {n - len(idle)} simulated ones",
                   severity="warning", value=float(len(idle)), data=data)


def _members_outside(inst: _Inst, present: set[int]) -> bool:
    """Whether a collective instance has members the run did not trace."""
    if inst.op == "send":
        return not {inst.src, inst.dst} <= present
    return inst.size > len(inst.ranks)


def _not_modelled(tables: Mapping[str, pa.Table], finding: Finding) -> ReplayResult:
    """The replay of a run the network model does not apply to (`backend.cpu_backend`): no topology
    results and no calibration, only the finding and the identity check, which needs no network."""
    try:
        ident: Identity | None = identity(tables)
    except ReplayError:
        ident = None
    return ReplayResult(topologies=[], results=[], baseline="", efficiency={}, identity=ident, findings=[finding])


def baseline_of(topologies: Sequence[str | TopologySpec],
                baseline: str | TopologySpec | None = None) -> str | TopologySpec:
    """The network a replay calibrates on and compares with: `baseline`, else the first topology."""
    if baseline is not None:
        return baseline
    if not topologies:
        raise ReplayError("give at least one topology")
    return topologies[0]


def physics_notes(topologies: Sequence[str]) -> list[tuple[str, Finding]]:
    """Per modelled topology spec, the caps that bind on its paths (`topology.physics_caps`); the
    observed fabric is measured, not modelled, and has none."""
    return [(text, f) for text in topologies if not is_observed(text) for f in physics_caps(parse_spec(text))]


def traced_device(tables: Mapping[str, pa.Table]) -> str | None:
    """The GPU the trace ran on (Kineto's `deviceProperties` name in the ranks table), when it names
    one a hardware profile knows; the topology takes that profile where its spec names none."""
    ranks = tables.get("ranks")
    if ranks is None or "device_name" not in ranks.column_names:
        return None
    for name in ranks.column("device_name").to_pylist():
        if name and hardware.gpu_from_device(name):
            return str(name)
    return None


def _spec(text: str | TopologySpec) -> TopologySpec:
    """A spec, or the observed-fabric marker for "observed"."""
    return observed_spec() if is_observed(text) else parse_spec(text)


def identity(tables: Mapping[str, pa.Table]) -> Identity:
    """Replay the run's schedule with every traced duration, without a network model: how far
    the dependencies and collective relations land from the trace (0 when they reproduce it)."""
    prep = _prepare(tables)
    if not prep.instances:
        raise ReplayError("no collective instance has a timed event to replay")
    return _identity(prep)


def dependency_edges(tables: Mapping[str, pa.Table]) -> pa.Table:
    """Every cross-lane dependency the replay uses, one row per edge: the rank, the waited-on
    and the waiting event (lane, traced ts_ns) and the rule that found it (lane order is implied
    and not listed). Needs only the events table."""
    prep = _prepare(tables, need_collectives=False)
    src = np.repeat(np.arange(prep.rank.size), np.diff(prep.dep_ptr))
    dst = prep.dep_ids
    ts = prep.start.astype(np.int64) + prep.t0
    return pa.table({
        "rank": pa.array(prep.rank[src], pa.int32()),
        "src_lane": pa.array(prep.lane[src].tolist(), pa.string()),
        "src_ts_ns": pa.array(ts[src], pa.int64()),
        "dst_lane": pa.array(prep.lane[dst].tolist(), pa.string()),
        "dst_ts_ns": pa.array(ts[dst], pa.int64()),
        "rule": pa.array((prep.dep_rule if prep.dep_rule is not None else np.zeros(0, object)).tolist(),
                         pa.string())})


def _calibration(prep: _Prepared, traced: np.ndarray, modelled: np.ndarray, latency: np.ndarray,
                 algos: Sequence[str | None]) -> Calibration:
    """Fit on the baseline (two terms per (op, algorithm) where the sizes allow); cross-validate
    leaving one step out when the instances span several steps, else one instance out."""
    steps = np.array([i.step for i in prep.instances], np.int64)
    several = np.unique(steps[steps >= 0]).size >= 2
    return calibrate([i.op for i in prep.instances], np.array([i.nbytes for i in prep.instances]), traced,
                     modelled, steps if several else None, latency=latency, algos=algos)


def _identity(prep: _Prepared) -> Identity:
    """Replay the schedule with every instance's traced network time."""
    traced = np.array([i.traced_ns for i in prep.instances])
    start, end = _schedule(prep, traced)
    err = np.concatenate([np.abs(start - prep.start), np.abs(end - prep.end)])
    step_ns, traced_step = _steps(prep, start, end, exact=True)
    rel = [abs(step_ns[s] - traced_step[s]) / traced_step[s] for s in step_ns if traced_step.get(s)]
    fallbacks = tuple(i.fallback for i in prep.instances if i.fallback is not None)
    exposure = _exposure(prep, start, end)
    return Identity(max_step_error=float(max(rel, default=0.0)),
                    max_event_error_ns=float(np.nanmax(err, initial=0.0)) if not np.isnan(err).all() else math.inf,
                    instances_fallen_back=len(fallbacks), fallbacks=fallbacks,
                    comm_ns=exposure.comm_ns, exposed_ns=exposure.exposed_ns)


def _schedule(prep: _Prepared, inst_dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    start, end, _ = _kernels.schedule(
        prep.prev, prep.nxt, prep.dep_ptr, prep.dep_ids, prep.slack, prep.start, prep.end - prep.start,
        prep.sched_inst, prep.inst_ptr, prep.inst_ids, inst_dur, prep.end_frac, prep.order_by_start)
    return start, end


def _cautions(base: TopologyResult, errors: ReplayErrors | None, identity: Identity,
              results: Sequence[TopologyResult] = ()) -> list[Finding]:
    """Typed cautions: the baseline step off the traced one by more than CAUTION_STEP, the
    cross-validated p90 above CAUTION_P90, instances replayed with their traced relation, a
    topology whose schedule/simulate fixed point did not settle within the rounds allowed."""
    out: list[Finding] = []
    for r in results:
        cv = r.convergence
        if cv is not None and not cv.converged:
            cycle = (f"from round {cv.cycle_from} its starts cycled with period {cv.cycle}, and damping did not "
                     "settle it: " if cv.cycle else "")
            whose = "; ".join(f"{o.op} {o.group}#{o.seq} start ±{o.start_swing_ns / 2e3:.1f} µs, network time "
                              f"±{o.duration_swing_ns / 2e3:.1f} µs" for o in cv.oscillating[:3])
            out.append(Finding("replay_caution", f"the replay on {r.topology} did not settle in {cv.rounds} rounds: "
                               f"{cycle}the last round still moved an instance start by {cv.residual_ns / 1e3:.1f} µs "
                               f"(tolerance {cv.tolerance_ns / 1e3:.1f} µs); its times are the "
                               f"{'damped' if cv.cycle else 'last'} round's, not the fixed point's"
                               + (f"; {cv.n_oscillating} instance(s) kept moving: {whose}" if whose else ""),
                               severity="warning", value=cv.residual_ns,
                               data={"reason": "not_converged", "topology": r.topology, "rounds": cv.rounds,
                                     "residual_ns": cv.residual_ns, "tolerance_ns": cv.tolerance_ns,
                                     "cycle": cv.cycle}))
    for step, ns in base.step_ns.items():
        traced = base.traced_step_ns.get(step)
        if traced and abs(ns - traced) / traced > CAUTION_STEP:
            rel = (ns - traced) / traced
            out.append(Finding("replay_caution", f"the baseline replay of step {step} is {rel:+.1%} off the traced "
                               f"step ({ns / 1e6:.3f} ms vs {traced / 1e6:.3f} ms): read what-ifs with care",
                               severity="warning", step=int(step) if step.lstrip("-").isdigit() else None,
                               value=rel, data={"reason": "baseline_step"}))
    if errors is not None and errors.p90 > CAUTION_P90:
        what = (f"out-of-sample replay error p90 (calibrated on {errors.calibrated_on})"
                if errors.calibrated_on is not None else "cross-validated replay error p90")
        out.append(Finding("replay_caution", f"{what} is {errors.p90:.1%} "
                           f"(above {CAUTION_P90:.0%}): per-collective predictions are uncertain",
                           severity="warning", value=errors.p90,
                           data={"reason": "cross_validated_p90"}))
    if identity.instances_fallen_back:
        out.append(Finding("replay_caution", f"{identity.instances_fallen_back} collective instance"
                           f"{'s' if identity.instances_fallen_back > 1 else ''} contradict the model and keep "
                           "their traced relation (see identity.fallbacks)", severity="info",
                           value=float(identity.instances_fallen_back), data={"reason": "fallback"}))
    return out


def _unique_names(specs: list[TopologySpec]) -> list[str]:
    names: list[str] = []
    for s in specs:
        name = s.name
        i = 2
        while name in names:
            name = f"{s.name}#{i}"
            i += 1
        names.append(name)
    return names


def _replay_one(prep: _Prepared, net: _Net, name: str, cal: Calibration, no_flow: np.ndarray,
                traced: np.ndarray, max_iter: int, merge: float, window_ns: float, n_windows: int,
                first: tuple[np.ndarray, Any] | None = None) -> TopologyResult:
    inst_start = np.array([i.traced_start for i in prep.instances])
    rounds: Rounds | None = None
    moves: list[float] = []
    tolerance = 0.0
    seen_start: list[np.ndarray] = []  # each unsettled round's instance starts and durations
    seen_dur: list[np.ndarray] = []
    period = 0
    cap = max(1, max_iter)

    def sched(durations: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        start, end, new_start = _kernels.schedule(
            prep.prev, prep.nxt, prep.dep_ptr, prep.dep_ids, prep.slack, prep.start, prep.replay_dur,
            prep.sched_inst, prep.inst_ptr, prep.inst_ids, durations, prep.end_frac, prep.order_by_start)
        return start, end, np.nan_to_num(new_start)

    def durations_at(inst_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flow finishes and replayed network times with instances started at `inst_start`."""
        assert rounds is not None
        release = net.release(inst_start)
        finish = rounds.step(release)
        return finish, np.where(no_flow, traced, cal.predict(*net.terms(net.durations(release, finish))))

    for it in range(cap):
        release = net.release(inst_start)
        if rounds is None or it == cap - 1:  # the first and the last for sure: everything,
            sim, out = first if it == 0 and first is not None else net.run(  # with the link windows
                inst_start, n_windows=n_windows, window_ns=window_ns, merge=merge)
            finish = out.finish
            rounds = Rounds(net.topology, net.indptr, net.ids, net.nbytes, net.lat_mult, release, finish,
                            merge=merge, max_gbs=net.max_gbs, weight=net.weight)
            replayed = np.where(no_flow, traced, cal.predict(*net.terms(sim)))
        else:  # later rounds: only what moved, without windows (`out` is then made for the last)
            finish, replayed = durations_at(inst_start)
            out = None
        start, end, new_start = sched(replayed)
        moved = float(np.max(np.abs(new_start - inst_start))) if new_start.size else 0.0
        tolerance = SETTLE_FRAC * max(1.0, float(np.max(replayed, initial=0.0)))
        moves.append(moved)
        if moved <= tolerance:
            break
        seen_start.append(inst_start)
        seen_dur.append(replayed)
        period = _period(seen_start, new_start, tolerance, moved)
        inst_start = new_start
        if period:
            break
    cycle_from = len(seen_start) - period + 1 if period else 0
    slow = not period and moves[-1] > tolerance and len(seen_dur) >= 2
    if period or slow:  # a limit cycle, or the cap on a slow approach: damped rounds, from the cycle's
        # mean network times (or the last round's), with Aitken's relaxation (docs/replay.md, 5)
        span_rounds = period or 2
        swings = _swings(np.array(seen_start[-span_rounds:]), np.array(seen_dur[-span_rounds:]))
        damped = np.mean(seen_dur[-period:], axis=0) if period else seen_dur[-1]
        step, last = 0.5, None
        for _ in range(DAMPED_ROUNDS):
            _, _, inst_start = sched(damped)
            finish, replayed = durations_at(inst_start)
            start, end, new_start = sched(replayed)
            moves.append(float(np.max(np.abs(new_start - inst_start), initial=0.0)))
            if moves[-1] <= tolerance:
                break
            resid = replayed - damped
            if last is not None:  # Aitken's relaxation: the step that would zero a linear residual
                change = resid - last
                norm = float(change @ change)
                if norm > 0:
                    step = float(np.clip(-step * float(last @ change) / norm, MIN_STEP, 1.0))
            damped, last = np.maximum(damped + step * resid, 0.0), resid
        else:  # not settled: the damped network times, as scheduled
            replayed = damped
            start, end, inst_start = sched(damped)
        out = None
    elif moves[-1] > tolerance:  # the cap after one round: what it moved
        swings = _swings(np.array([seen_start[-1], inst_start]), np.array(seen_dur[-2:]))
    else:
        swings = (np.zeros(len(prep.instances)), np.zeros(len(prep.instances)))
    horizon = float(np.nanmax(end)) if end.size else 1.0
    span = max(horizon, float(np.nanmax(finish, initial=0.0)))
    if n_windows == 0:  # no link windows wanted: the last round's finishes are the result
        out = SimResult(finish, np.zeros((net.topology.cap.size, 0)), window_ns, 0.0)
    elif out is None or span >= n_windows * window_ns:  # the link windows of the last round's releases
        if span >= n_windows * window_ns:
            wanted = window_count(net.topology.cap.size, min(N_WINDOWS + 1, n_windows))
            window_ns = max(1000.0, math.ceil(span / (wanted - 1)))
            n_windows = math.ceil(span / window_ns) + 1
        _, out = net.run(inst_start, n_windows=n_windows, window_ns=window_ns, merge=merge)
        span = max(horizon, float(np.nanmax(out.finish, initial=0.0)))
    out.windows = out.windows[:, :min(n_windows, math.ceil(span / window_ns) + 1)]

    topo = net.topology
    per_res = resource_bytes(topo.cap.size, net.indptr, net.ids, net.nbytes)
    cable_bytes = to_cables(topo, per_res)
    cable_win = to_cables(topo, out.windows)
    samples, hot = _link_outputs(topo, cable_win, cable_bytes, window_ns, prep.t0, name, horizon)

    step_ns, traced_step = _steps(prep, start, end)
    exposure = _exposure(prep, start, end)
    step_rel = [abs(step_ns[s] - traced_step[s]) / traced_step[s] for s in step_ns if traced_step.get(s)]
    instances = [InstanceReplay(group=i.group, seq=i.seq, op=i.op, dim=i.dim,
                                traced_ns=round(traced[k]), replayed_ns=round(replayed[k]),
                                calibration=cal.in_sample_source[k], cross_validation=cal.cross_validated_source[k],
                                fallback=i.fallback.reason if i.fallback is not None else None,
                                algo=net.plans[k].algo if net.plans[k] is not None else None,
                                proto=net.plans[k].proto if net.plans[k] is not None else None,
                                algo_source=net.plans[k].source if net.plans[k] is not None else None)
                 for k, i in enumerate(prep.instances)]
    return TopologyResult(
        summary=TopologySummary(
            topology=name, step_ns=step_ns, traced_step_ns=traced_step, comm_ns=exposure.comm_ns,
            exposed_ns=exposure.exposed_ns, instances=instances, hot_links=hot,
            convergence=Convergence(rounds=len(moves), residual_ns=moves[-1], tolerance_ns=tolerance,
                                    converged=moves[-1] <= tolerance, moves_ns=tuple(moves), cycle=period,
                                    cycle_from=cycle_from,
                                    **_oscillating(prep, *swings, tolerance if moves[-1] > tolerance else math.inf))),
        link_samples=samples, topology_nodes=topo.nodes, topology_links=topo.links,
        link_bytes=cable_bytes, n_flows=len(net.flows), timeline=_timeline(prep, start, end),
        tier_bytes=_tier_bytes(prep, net), storage_ns=net.storage_ns(out),
        step_error={"median": float(np.median(step_rel)) if step_rel else 0.0,
                    "p90": float(np.percentile(step_rel, 90)) if step_rel else 0.0})


#: The link windows' cells (resources x windows) a replay may hold: a topology of many resources
#: (a scale what-if) gets fewer windows, not more memory.
MAX_WINDOW_CELLS = 4_000_000


def window_count(n_resources: int, wanted: int) -> int:
    """Link windows for a topology of `n_resources`: `wanted`, or fewer (at least 3) within
    MAX_WINDOW_CELLS."""
    return int(max(3, min(wanted, MAX_WINDOW_CELLS // max(n_resources, 1))))


#: Rounds of damped iteration allowed after a limit cycle is found, and the smallest step.
DAMPED_ROUNDS = 8
MIN_STEP = 0.05
#: Limit cycles are looked for up to this period (rounds) ...
MAX_PERIOD = 4
#: ... and found when the starts come back to those of `p` rounds before within the tolerance or
#: this share of the round's move.
CYCLE_FRAC = 0.01
#: Oscillating instances listed in a Convergence (the largest swings; `n_oscillating` counts all).
OSCILLATING_LISTED = 10


def _period(seen_start: list[np.ndarray], new_start: np.ndarray, tolerance: float, moved: float) -> int:
    """The smallest p >= 2 such that `new_start` returns to the starts of p rounds before (the
    rounds' inputs in `seen_start`, the last one now), or 0."""
    limit = max(tolerance, CYCLE_FRAC * moved)
    for p in range(2, min(MAX_PERIOD, len(seen_start)) + 1):
        if float(np.max(np.abs(new_start - seen_start[-p]), initial=0.0)) <= limit:
            return p
    return 0


def _swings(starts: np.ndarray, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per instance, how far its start and its replayed duration range over these rounds (ns)."""
    return starts.max(axis=0) - starts.min(axis=0), durations.max(axis=0) - durations.min(axis=0)


def _oscillating(prep: _Prepared, start_swing: np.ndarray, dur_swing: np.ndarray, tolerance: float
                 ) -> dict[str, Any]:
    """The instances whose start or duration swings beyond `tolerance`: those whose network time
    swings first (the cause: the others move because they wait for them), largest first."""
    moving = np.flatnonzero((start_swing > tolerance) | (dur_swing > tolerance))
    order = moving[np.lexsort((moving, -start_swing[moving], -dur_swing[moving]))]
    listed = tuple(Oscillation(group=prep.instances[k].group, seq=prep.instances[k].seq, op=prep.instances[k].op,
                               dim=prep.instances[k].dim, start_swing_ns=float(start_swing[k]),
                               duration_swing_ns=float(dur_swing[k]))
                   for k in order[:OSCILLATING_LISTED].tolist())
    return {"n_oscillating": int(moving.size), "oscillating": listed}


def _tier_bytes(prep: _Prepared, net: _Net) -> dict[str, dict[str, int]]:
    """Per tier and dim, the bytes sent up into the tier (cable direction src -> dst, which is
    always from the lower tier): each byte is counted once per tier it climbs into. The
    "nic-leaf" figure is the traffic that leaves hosts; north-south flows are dim "storage"."""
    topo, flows = net.topology, net.flows
    tiers = np.array(topo.links.column("tier").to_pylist(), dtype=object)
    names = sorted({i.dim or "OTHER" for i in prep.instances} | {"OTHER"} | {STORAGE_DIM})
    inst_code = np.array([names.index(i.dim or "OTHER") for i in prep.instances] + [names.index("OTHER")], np.int64)
    code = np.concatenate([inst_code[flows.key] if len(flows) else np.zeros(0, np.int64),
                           np.full(net.nbytes.size - len(flows), names.index(STORAGE_DIM), np.int64)])
    per_res = _kernels.class_resource_bytes(net.indptr, net.ids, net.nbytes, code, len(names), topo.cap.size)
    present = np.zeros(len(names), bool)
    present[np.unique(code)] = True
    out: dict[str, dict[str, int]] = {}
    for j, d in enumerate(names):
        if not present[j]:
            continue
        up = to_cables(topo, per_res[j])[0::2]
        for t in sorted(set(tiers.tolist())):
            total = float(up[tiers == t].sum())
            if total > 0:
                out.setdefault(t, {})[d] = round(total)
    return out


def _timeline(prep: _Prepared, start: np.ndarray, end: np.ndarray) -> pa.Table:
    kinds = np.array(["compute", "comm", "other"], dtype=object)[prep.kind]
    return pa.table({
        "rank": pa.array(prep.rank, pa.int32()), "lane": pa.array(prep.lane.tolist(), pa.string()),
        "kind": pa.array(kinds.tolist(), pa.string()),
        "ts_ns": pa.array(np.round(np.nan_to_num(start)).astype(np.int64) + prep.t0, pa.int64()),
        # end rounded, not the duration: back-to-back events stay back to back after rounding
        "dur_ns": pa.array((np.round(np.nan_to_num(end)) - np.round(np.nan_to_num(start))).astype(np.int64),
                           pa.int64()),
        "traced_ts_ns": pa.array(prep.start.astype(np.int64) + prep.t0, pa.int64()),
        "traced_dur_ns": pa.array((prep.end - prep.start).astype(np.int64), pa.int64())})


def _steps(prep: _Prepared, start: np.ndarray, end: np.ndarray, *, exact: bool = False
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per step, the replayed and the traced step time. The traced one is the analysis' step time
    (`tracekit.analysis.steps.STEP_TIME`) when known, and the replayed one moves from it by as much
    as the span of the step's events moved; else both are the span of the step's events."""
    keys = prep.step if prep.has_steps else np.zeros(prep.step.size, np.int64)
    out: dict[str, Any] = {}
    traced: dict[str, Any] = {}
    fmt = float if exact else round
    for s in np.unique(keys):
        if s < 0:
            continue
        sel = keys == s
        label = str(int(s)) if prep.has_steps else "all"
        replayed_span = np.nanmax(end[sel]) - np.nanmin(start[sel])
        traced_span = prep.end[sel].max() - prep.start[sel].min()
        base = prep.step_time.get(label, traced_span)
        out[label] = fmt(base + replayed_span - traced_span)
        traced[label] = fmt(base)
    return out, traced


def _exposure(prep: _Prepared, start: np.ndarray, end: np.ndarray) -> DimExposure:
    """Per dim (each comm event's own call's), comm time and its part not hidden under compute on
    the replayed timeline, by the analysis' rule (`breakdown.breakdown`, `mean_exposure`) in its
    step windows, each moved as far as its rank's first start and last end in that step moved
    (unmoved on the identity replay, which so gives the analysis' figure)."""
    if prep.call_dim is not None:
        comm_dim = prep.call_dim
    else:
        comm_dim = np.array([i.dim or "OTHER" for i in prep.instances] + ["OTHER"], dtype=object)[prep.inst]
    dim = np.where(prep.kind == 0, COMPUTE, np.where(prep.kind == 1, comm_dim, BUSY))
    intervals = pl.DataFrame({"rank": prep.rank.astype(np.int32), "s": np.round(start).astype(np.int64),
                              "e": np.round(end).astype(np.int64), "dim": dim.astype(str)})
    moves = (pl.DataFrame({"rank": prep.rank.astype(np.int32), "step": prep.step.astype(np.int32),
                           "s": start, "e": end, "ts": prep.start, "te": prep.end})
             .group_by("rank", "step").agg((pl.col("s").min() - pl.col("ts").min()).alias("ds"),
                                           (pl.col("e").max() - pl.col("te").max()).alias("de")))
    windows = prep.windows if prep.windows is not None else _event_windows(prep)
    windows = (windows.join(moves, on=["rank", "step"], how="left")
               .with_columns((pl.col("start_ns") + pl.col("ds").fill_null(0).round()).cast(pl.Int64),
                             (pl.col("end_ns") + pl.col("de").fill_null(0).round()).cast(pl.Int64))
               .filter(pl.col("end_ns") > pl.col("start_ns")))
    return mean_exposure(*breakdown(intervals, windows))


def _event_windows(prep: _Prepared) -> pl.DataFrame:
    """Step windows from the events themselves when the tables bring none: per rank and step (or
    per rank, step 0, without steps) the first start to the last end, on the traced timeline."""
    step = prep.step if prep.has_steps else np.zeros(prep.step.size, np.int64)
    return (pl.DataFrame({"rank": prep.rank.astype(np.int32), "step": step.astype(np.int32),
                          "s": prep.start, "e": prep.end})
            .filter(pl.col("step") >= 0).group_by("rank", "step")
            .agg(pl.col("s").min().round().cast(pl.Int64).alias("start_ns"),
                 pl.col("e").max().round().cast(pl.Int64).alias("end_ns")))


def _link_outputs(topo: Topology, cable_win: np.ndarray, cable_bytes: np.ndarray, window_ns: float,
                  t0: int, name: str, horizon: float) -> tuple[pa.Table, list[dict[str, Any]]]:
    links = topo.links
    n_c = links.num_rows
    n_w = cable_win.shape[1] if cable_win.ndim == 2 else 0
    cap = links.column("gbps").to_numpy() / 8.0 * window_ns  # bytes per window per direction
    tx = cable_win[0::2]
    rx = cable_win[1::2]
    tx_util = tx / cap[:, None]
    rx_util = rx / cap[:, None]
    util = np.maximum(tx_util, rx_util)
    link_names = np.array(links.column("link").to_pylist(), dtype=object)
    saturated = util.ravel() >= 0.99
    offsets = np.zeros(saturated.size + 1, np.int32)
    np.cumsum(saturated, out=offsets[1:])
    flags = pa.ListArray.from_arrays(pa.array(offsets),
                                     pa.repeat(pa.scalar("saturated", pa.string()), int(offsets[-1])))
    per_sample = np.repeat(np.arange(n_c), n_w)

    def repeat(column: str) -> pa.Array:  # each cable's value per sample, encoded as the schema's dictionary
        enc = pa.compute.dictionary_encode(pa.compute.cast(links.column(column).combine_chunks(), pa.string()))
        return pa.DictionaryArray.from_arrays(enc.indices.cast(pa.int32()).take(per_sample), enc.dictionary)

    columns = {
        "link": repeat("link"),
        "device": repeat("src"),
        "port": repeat("dst"),
        "ts_ns": pa.array(np.tile(t0 + (np.arange(n_w) * window_ns).astype(np.int64), n_c), pa.int64()),
        "interval_ns": pa.array(np.full(n_c * n_w, int(window_ns)), pa.int64()),
        "tx_bytes": pa.array(tx.ravel(), pa.float64()),
        "rx_bytes": pa.array(rx.ravel(), pa.float64()),
        "tx_util": pa.array(tx_util.ravel(), pa.float64()),
        "rx_util": pa.array(rx_util.ravel(), pa.float64()),
        "flags": flags,
        "origin": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n_c * n_w, np.int32)),
                                                 pa.array([f"replay:{name}"], pa.string())),
    }
    nulls: dict[pa.DataType, pa.Array] = {}  # the telemetry-only columns: one null array per type, shared
    for f in schema.SCHEMAS["link_samples"]:
        if f.name not in columns:
            if f.type not in nulls:
                nulls[f.type] = pa.nulls(n_c * n_w, f.type)
            columns[f.name] = nulls[f.type]
    samples = schema.conform("link_samples", columns)
    total = cable_bytes[0::2] + cable_bytes[1::2]
    n_active = max(1, math.ceil(horizon / window_ns))
    peak = util.max(axis=1) if n_w else np.zeros(n_c)
    mean = util[:, :n_active].sum(axis=1) / n_active if n_w else np.zeros(n_c)
    # Ranked on the figures as reported, so last-bit noise in a float peak never reorders ties.
    order = np.lexsort((link_names.astype(str), -np.round(total), -np.round(peak, 4)))
    hot = [HotLink(link=str(link_names[i]), peak_util=round(float(peak[i]), 4),
                   mean_util=round(float(mean[i]), 4), bytes=round(total[i]))
           for i in order[:HOT_LINKS] if total[i] > 0]
    return samples, hot


# ------------------------------------------------------------------------------------------
# What a replay leaves in a run (written by `tracekit.workflows.replay`)


def with_replayed(link_samples: pa.Table, result: ReplayResult) -> pa.Table:
    """A run's `link_samples` with the rows of earlier replays (origin "replay:...") replaced by
    this replay's."""
    old = link_samples
    if old.num_rows:
        origin = pa.compute.cast(old.column("origin"), pa.string())
        keep = pa.compute.invert(pa.compute.fill_null(pa.compute.starts_with(origin, "replay:"), False))
        old = old.filter(keep)
    replayed = [result.link_samples()] if result.results else []
    return pa.concat_tables([schema.conform("link_samples", old), *replayed], promote_options="permissive")


class CalibrationFile(Result, frozen=True, kw_only=True):
    """results/calibration.json: the factors a replay fitted on its own run, what `read_calibration`
    reads back."""

    run: str
    topology: str
    efficiency: dict[str, float]
    terms: dict[str, TwoTerms]
    split: str
    tracekit_version: str = __version__


def calibration_document(result: ReplayResult, run_name: str) -> CalibrationFile | None:
    """results/calibration.json of a replay fitted on its own run (None when it applied another
    run's calibration, or had nothing to fit)."""
    if result.errors is None or result.errors.calibrated_on is not None:
        return None
    return CalibrationFile(run=run_name, topology=result.baseline, efficiency=dict(result.efficiency),
                           terms=result.terms, split=result.errors.split)


@dataclass(frozen=True)
class SavedCalibration:
    """A per-(op, size) efficiency fitted on one run, to apply to another (`replay(...,
    efficiency=, calibrated_on=)`): `name` says where it came from, `topology` the baseline it
    was fitted on."""

    efficiency: dict[str, float]
    name: str
    topology: str | None
    terms: dict[str, TwoTerms] = field(default_factory=dict)

    def options(self) -> dict[str, Any]:
        """The `replay` keywords that apply this calibration (its error then out of sample)."""
        return {"efficiency": self.efficiency, "terms": self.terms, "calibrated_on": self.name}

    def mismatch(self, baseline: str | TopologySpec) -> str | None:
        """What to say when it was fitted on another network than the `baseline` it is applied to."""
        if self.topology is not None and self.topology != str(baseline):
            return f"the calibration was fitted on {self.topology}, applied to baseline {baseline}"
        return None


def read_calibration(path: str | os.PathLike[str]) -> SavedCalibration:
    """The calibration in a JSON file written by `tracekit replay` (`RUN/results/calibration.json`,
    or a `replay.json`)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReplayError(f"{path}: not a calibration file ({exc})") from None
    eff = doc.get("efficiency") if isinstance(doc, dict) else None
    raw_terms = doc.get("terms") if isinstance(doc, dict) else None
    if eff is None and isinstance(doc, dict):
        eff = (doc.get("calibration") or {}).get("efficiency")
        raw_terms = (doc.get("calibration") or {}).get("terms")
        topo = (doc.get("topologies") or [None])[0]
    else:
        topo = doc.get("topology") if isinstance(doc, dict) else None
    if not isinstance(eff, dict) or not eff:
        raise ReplayError(f"{path}: no fitted efficiency in it (write one with tracekit replay)")
    try:
        eff = {str(k): float(v) for k, v in eff.items()}
    except (TypeError, ValueError):
        raise ReplayError(f"{path}: efficiency values must be numbers") from None
    try:
        terms = from_builtins(raw_terms or {}, dict[str, TwoTerms])
    except (TypeError, ValueError, KeyError, AttributeError):
        raise ReplayError(f"{path}: two-term calibration values must be numbers") from None
    name = str(doc.get("run") or path) if isinstance(doc, dict) else str(path)
    return SavedCalibration(eff, name, topo, terms)


def fitted_calibration(fitted: ReplayResult, name: str) -> SavedCalibration:
    """The calibration a replay fitted on its baseline, to apply to another run."""
    if fitted.errors is None or not fitted.efficiency:
        raise ReplayError(f"{name}: nothing to calibrate on (no collective with traffic)")
    return SavedCalibration(dict(fitted.efficiency), name, fitted.baseline, dict(fitted.terms))
