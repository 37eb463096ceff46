"""What-if scenarios: a transformation of the run's tables, replayed and compared with the
baseline replay on the same topology.

Both sides of every comparison are replays (model vs model): the scenario's step time is set
against the baseline replay's, never against the trace, so the model's own error cancels to first
order. The scenario replay reuses the baseline's calibration (the per-(op, size) efficiency fitted
on the unchanged run), so the change is not fitted away.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgspec
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from msgspec import UNSET, UnsetType

from tracekit import schema
from tracekit.errors import TracekitError
from tracekit.finding import Finding
from tracekit.replay import ReplayResult, TopologyResult, TopologySpec, replay
from tracekit.replay.calibration import ReplayErrors
from tracekit.replay.engine import InstanceReplay
from tracekit.results import Result, dumps

DEFAULT_TOPOLOGY = "rail-optimized"
COMPARISON = ("each scenario is replayed and compared with the baseline replay of the unchanged run on "
              "the same topology (model vs model, with the baseline's calibration); neither side is "
              "the traced timeline")
UNKNOWN_HOSTS_PER = 8


class WhatIfError(TracekitError):
    """A scenario cannot be parsed or applied; the message names the field or the problem."""


class Change(Result, frozen=True):
    """One figure before (baseline) and after (scenario)."""

    before: float
    after: float

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before else math.nan


class Placement(Result, frozen=True, kw_only=True, dict=True):
    """Where each rank runs: `ranks[rank] = (host name, GPU index in the host)`; `hosts` names the
    host indices in order (the traced names where known, each once). `Placement.of` builds one
    from slots; `slots[rank] = (host index, GPU index)` is the same placement by host index."""

    hosts: tuple[str, ...]
    ranks: dict[int, tuple[str, int]]

    @classmethod
    def of(cls, slots: Mapping[int, tuple[int, int]], hosts: Sequence[str]) -> Placement:
        """The placement of `slots[rank] = (host index, GPU index)` on hosts named `hosts`."""
        names = tuple(hosts)
        return cls(hosts=names, ranks={r: (names[h], g) for r, (h, g) in sorted(slots.items())})

    @cached_property
    def slots(self) -> dict[int, tuple[int, int]]:
        index = {name: h for h, name in enumerate(self.hosts)}
        return {r: (index[name], g) for r, (name, g) in self.ranks.items()}

    @property
    def gpus_per_host(self) -> int:
        return max(g for _, g in self.slots.values()) + 1

    def host_of(self, rank: int) -> int:
        return self.slots[rank][0]

    def ranks_on(self, host: int) -> list[int]:
        return sorted((r for r, (h, _) in self.slots.items() if h == host), key=lambda r: self.slots[r][1])


class RankLoad(Result, frozen=True):
    """Bytes each rank of one EP group received over the run's EP all-to-alls, before and after."""

    group: str
    ranks: tuple[int, ...]
    before: tuple[int, ...]
    after: tuple[int, ...]

    @property
    def imbalance(self) -> Change:
        return Change(_max_over_mean(self.before), _max_over_mean(self.after))


class Slowdown(Result, frozen=True, kw_only=True):
    """A collective instance that the scenario made slower (scenario minus baseline replay)."""

    group: str
    seq: int
    op: str
    dim: str
    baseline_ns: int
    scenario_ns: int


class PlacedChunk(Result, frozen=True, kw_only=True):
    """One slot of a Gantt chart: a device (stage) runs `chunks` (e.g. "F3", or "F3+B1" paired) from start to end."""

    stage: int
    chunks: str
    kind: str  # F, B, Bi, W, or FB for a DualPipe pair
    start_ns: float
    end_ns: float
    exposed_ns: float


class PipelineRun(Result, frozen=True, kw_only=True):
    """One schedule placed in time: its name, shape, pipeline span and per-stage bubble, and its chunks."""

    name: str
    stages: int
    microbatches: int
    chunks: int
    span_ns: float
    bubble_ns: tuple[float, ...]
    exposed_ns: dict[str, float]
    placed: tuple[PlacedChunk, ...]
    step_ns: float = 0.0  # the pipeline and each stage's step after it (DP all-reduce, optimizer), to the last end
    dp_exposed_ns: tuple[float, ...] = ()  # per stage, its DP all-reduce past its last chunk


class ScheduleOutcome(Result, frozen=True, kw_only=True):
    """The traced schedule rebuilt (baseline) and the new one, with the same chunk costs."""

    baseline: PipelineRun
    scenario: PipelineRun
    sm_share: float
    traced_step: int | None


class InterHostBytes(Result, frozen=True, kw_only=True):
    """Bytes per dim that left hosts through their NICs, in the baseline replay and the scenario's."""

    before: dict[str, int] = msgspec.field(default_factory=dict)
    after: dict[str, int] = msgspec.field(default_factory=dict)


class PlacementChange(Result, frozen=True, kw_only=True):
    """The traced placement and the one a placement scenario replayed."""

    before: Placement
    after: Placement


class ScenarioResult(Result, frozen=False, kw_only=True):
    """One scenario against the baseline replay. Fields that do not apply are None
    (`simulated_gpus`, set by scale scenarios only, is left out of the JSON otherwise)."""

    scenario: str
    step_ns: dict[str, int]
    baseline_step_ns: dict[str, int]
    exposed_ns: dict[str, int]
    baseline_exposed_ns: dict[str, int]
    ep_imbalance: Change | None = None
    inter_host_bytes: InterHostBytes = msgspec.field(default_factory=InterHostBytes)
    checkpoint_ns: int | None = None
    simulated_gpus: int | UnsetType = UNSET  # scale: the GPUs replayed (the baseline's are the traced ones)
    kind: str
    a2a_ns: Change | None = None
    ep_load: list[RankLoad] | None = None
    slowed: list[Slowdown] | None = None
    placement: PlacementChange | None = None
    details: dict[str, Any] | None = None  # per kind: what the scenario did (docs/whatif.md)
    schedule: ScheduleOutcome | None = None  # schedule scenarios: both pipelines placed in time
    notes: list[str] = msgspec.field(default_factory=list)

    @property
    def step_change(self) -> Change:
        return Change(_mean(self.baseline_step_ns), _mean(self.step_ns))

    @property
    def inter_host_before(self) -> dict[str, int]:
        return self.inter_host_bytes.before

    @property
    def inter_host_after(self) -> dict[str, int]:
        return self.inter_host_bytes.after

    @property
    def placement_before(self) -> Placement | None:
        return self.placement.before if self.placement is not None else None

    @property
    def placement_after(self) -> Placement | None:
        return self.placement.after if self.placement is not None else None


class SkippedScenario(Result, frozen=True, kw_only=True):
    """A scenario not replayed, and why (a change to collectives the baseline did not simulate
    would only repeat the baseline: a +0.0% that measures nothing)."""

    scenario: str
    reason: str


class WhatIfSummary(Result, frozen=True, kw_only=True):
    """What `tracekit whatif --json` prints: every scenario against the baseline replay, its error
    and cautions, and the scenarios not replayed."""

    topology: str
    comparison: str = COMPARISON
    replay_error: ReplayErrors | None = None
    cautions: list[Finding] = msgspec.field(default_factory=list)
    scenarios: list[ScenarioResult] = msgspec.field(default_factory=list)
    skipped: list[SkippedScenario] = msgspec.field(default_factory=list)


@dataclass(frozen=True)
class WhatIfResult:
    """Every scenario of one `whatif` call against the same baseline replay: its `summary` (the
    JSON) and the baseline's step and exposed times the scenarios are compared with."""

    summary: WhatIfSummary
    baseline_step_ns: dict[str, int] = field(default_factory=dict)
    baseline_exposed_ns: dict[str, int] = field(default_factory=dict)

    @property
    def topology(self) -> str:
        return self.summary.topology

    @property
    def comparison(self) -> str:
        return self.summary.comparison

    @property
    def replay_error(self) -> ReplayErrors | None:
        return self.summary.replay_error

    @property
    def cautions(self) -> list[Finding]:
        return self.summary.cautions

    @property
    def scenarios(self) -> list[ScenarioResult]:
        return self.summary.scenarios

    @property
    def skipped(self) -> list[SkippedScenario]:
        return self.summary.skipped

    def dumps(self) -> str:
        return dumps(self.summary)


@dataclass
class Baseline:
    """The unchanged run replayed on one topology: what every scenario is compared with."""

    tables: dict[str, pa.Table]
    topology: str
    placement: Placement
    replay: ReplayResult
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: What scenarios derive from the baseline alone, kept for the next scenario (the schedule
    #: what-if's chunk costs and traced schedule rebuilt).
    memo: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def result(self) -> TopologyResult:
        return self.replay.results[0]

    def replay_with(self, *, tables: Mapping[str, pa.Table] | None = None, placement: Placement | None = None,
                    topology: TopologySpec | None = None, **extra: Any) -> TopologyResult:
        """Replay a changed run (tables, placement, or the topology with storage added) with the
        baseline's calibration."""
        out = replay(dict(tables or self.tables), [topology or self.topology], efficiency=self.replay.efficiency,
                     terms=self.replay.terms, placement=dict((placement or self.placement).slots),
                     **self.options, **extra)
        return out.results[0]

    def compare(self, scenario: str, kind: str, after: TopologyResult, *,
                placement: Placement | None = None) -> ScenarioResult:
        """The fields every scenario reports, scenario replay against baseline replay."""
        base = self.result
        before, after_bytes = inter_host_bytes(base), inter_host_bytes(after)
        dims = sorted(set(before) | set(after_bytes))
        return ScenarioResult(
            scenario=scenario, kind=kind, step_ns=dict(after.step_ns), baseline_step_ns=dict(base.step_ns),
            exposed_ns=dict(after.exposed_ns), baseline_exposed_ns=dict(base.exposed_ns),
            inter_host_bytes=InterHostBytes(before={d: before.get(d, 0) for d in dims},
                                            after={d: after_bytes.get(d, 0) for d in dims}),
            placement=PlacementChange(before=self.placement, after=placement) if placement is not None else None,
            notes=list(self.notes))


def load_tables(source: Mapping[str, pa.Table]) -> dict[str, pa.Table]:
    """Prepared tables (matched, aligned, classified) as they are; a run directory's come from
    the front door (`tracekit.workflows.whatif`)."""
    if not isinstance(source, Mapping):
        raise TypeError(f"what-ifs take prepared tables, not {type(source).__name__}: "
                        "use tracekit.workflows.whatif for a run")
    return dict(source)


def make_baseline(source: Mapping[str, pa.Table], topology: str = DEFAULT_TOPOLOGY,
                  **options: Any) -> Baseline:
    """Replay the unchanged run on `topology` (`options` go to `tracekit.replay.replay`)."""
    tables = load_tables(source)
    placement, notes = traced_placement(tables)
    result = replay(tables, [topology], placement=dict(placement.slots), **options)
    return Baseline(tables=tables, topology=topology, placement=placement, replay=result,
                    options=dict(options), notes=notes)


def traced_placement(tables: Mapping[str, pa.Table]) -> tuple[Placement, list[str]]:
    """Hosts and GPUs as traced (`ranks.host`, `ranks.local_device`): hosts numbered by their lowest
    rank, GPUs by local device. Without host names, ranks are packed 8 per host in rank order."""
    ranks = pl.from_arrow(schema.conform("ranks", tables.get("ranks")))
    coll = tables["collectives"]
    all_ranks = sorted(set(ranks.get_column("rank").to_list())
                       | set(pc.unique(coll.column("rank")).to_pylist() if coll.num_rows else []))
    host_of = {int(r): str(h) for r, h in zip(ranks.get_column("rank").to_list(),
                                              ranks.get_column("host").cast(pl.Utf8).to_list(), strict=True)
               if h is not None}
    local_of = {int(r): int(d) for r, d in zip(ranks.get_column("rank").to_list(),
                                               ranks.get_column("local_device").to_list(), strict=True)
                if d is not None}
    if not all_ranks:
        raise WhatIfError("the run holds no rank and no collective call: there is nothing to replay (what-ifs "
                          "need profiler traces, NCCL logs with collectives, or Flight Recorder dumps)")
    if not host_of:
        per = min(UNKNOWN_HOSTS_PER, len(all_ranks))
        slots = {r: divmod(i, per) for i, r in enumerate(all_ranks)}
        names = tuple(f"host{h}" for h in range(max(h for h, _ in slots.values()) + 1))
        return Placement.of(slots, names), [f"hosts unknown: ranks packed {per} per host in rank order"]
    members: dict[str, list[int]] = {}
    for r in all_ranks:
        members.setdefault(host_of.get(r, f"?{r}"), []).append(r)
    order = sorted(members, key=lambda h: min(members[h]))
    slots = {}
    for h_idx, h in enumerate(order):
        for g_idx, r in enumerate(sorted(members[h], key=lambda r: (local_of.get(r, r), r))):
            slots[r] = (h_idx, g_idx)
    return Placement.of(slots, order), []


def inter_host_bytes(result: TopologyResult) -> dict[str, int]:
    """Bytes per dim that left hosts through their NICs in a replay."""
    return dict(sorted(result.tier_bytes.get("nic-leaf", {}).items()))


def instance_times(result: TopologyResult, *, op: str | None = None, dim: str | None = None
                   ) -> dict[tuple[str, int], InstanceReplay]:
    """Replayed instances by (group, seq), optionally only one op and dim."""
    return {(i.group, i.seq): i for i in result.instances
            if (op is None or i.op == op) and (dim is None or i.dim == dim)}


def parse_params(kind: str, text: str, known: Sequence[str]) -> dict[str, str]:
    """`key=value,key=value` into a dict, rejecting unknown keys (the message names them)."""
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise WhatIfError(f"{kind}: expected key=value, got {item!r}")
        if key not in known:
            raise WhatIfError(f"{kind}: unknown field {key!r}; known: {', '.join(known)}")
        out[key] = value.strip()
    return out


def as_int(kind: str, key: str, value: str, *, minimum: int = 0) -> int:
    try:
        number = int(value)
    except ValueError:
        raise WhatIfError(f"{kind}: field {key!r} expects an integer, got {value!r}") from None
    if number < minimum:
        raise WhatIfError(f"{kind}: field {key!r} must be >= {minimum}, got {number}")
    return number


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
          "gib": 2**30, "tib": 2**40}


def as_bytes(kind: str, key: str, value: str) -> int:
    """`2GB`, `512MiB`, `1e9` -> bytes."""
    text = value.strip().lower().replace("_", "")
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(digits):]
    try:
        number = float(digits)
    except ValueError:
        number = math.nan
    if unit not in _UNITS or not math.isfinite(number) or number < 0:
        raise WhatIfError(f"{kind}: field {key!r} expects bytes (e.g. 2GB, 512MiB), got {value!r}")
    return int(number * _UNITS[unit])


def _max_over_mean(values: Sequence[float]) -> float:
    total = float(sum(values))
    return max(values) / (total / len(values)) if values and total > 0 else 1.0


def _mean(values: Mapping[str, int]) -> float:
    return sum(values.values()) / len(values) if values else 0.0

