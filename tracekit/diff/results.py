"""The typed results of `tracekit diff`: what was matched, the decomposed step-time change, and
the per bucket, per rank and setup differences behind it (JSON through `tracekit.results`)."""

from __future__ import annotations

import msgspec

from tracekit.diff.network import NetworkSplit
from tracekit.results import Result

JSON_SCHEMA = "tracekit.diff/1"


class GroupPair(Result):
    """A process group of A matched to one of B, and how (membership and description, or one alone)."""

    group_a: str
    group_b: str
    desc: str | None
    size: int
    by: str


class Matching(Result):
    """What could be lined up between the runs. `notes` says every mismatch (world size, missing
    ranks, groups, steps, collectives), so that nothing is compared silently."""

    ranks_by: str
    ranks: dict[int, int]  # rank in A -> rank in B
    ranks_only_a: list[int]
    ranks_only_b: list[int]
    groups: list[GroupPair]
    groups_only_a: list[str]
    groups_only_b: list[str]
    steps_a: list[int]
    steps_b: list[int]
    steps: list[int]  # compared (in both)
    instances_by_seq: int
    instances_by_position: int
    instances_only_a: int
    instances_only_b: int
    notes: list[str]


class Part(Result):
    """One bar of the waterfall: the mean per step of one share of the step time in A and in B.

    `noise_ns` is twice the standard error of the difference of the two means (each run's own
    step-to-step variation); a part is `significant` only when its change exceeds it."""

    name: str
    a_ns: float
    b_ns: float
    delta_ns: float
    noise_ns: float
    significant: bool


class StepOutlier(Result):
    """One step whose change stands far out of the other steps' (a one-off stall, not a trend), and
    the root rank whose waits grew most in it."""

    step: int
    delta_ns: float
    others_ns: float  # the median |change| of the other steps
    root_rank: int | None
    host: str | None


class Decomposition(Result):
    """The step-time change and its parts; `remainder_ns` = delta_ns - the sum of the parts."""

    source: str  # "critical_path" or "rank_means"
    steps: int
    step_a_ns: float
    step_b_ns: float
    delta_ns: float
    noise_ns: float
    significant: bool
    parts: list[Part]
    parts_sum_ns: float
    remainder_ns: float
    outlier: StepOutlier | None = None


class WaitShift(Result):
    """The waits whose chains end at one root rank: rank-time lost per step in A and in B."""

    rank: int  # in B (or A when only A has it)
    host: str | None
    a_ns: float
    b_ns: float
    delta_ns: float


class BucketChange(Result):
    """One collective bucket (op, size, group, dim): per step counts, the median duration and bus
    bandwidth with their spread, in A and B. `flagged` when the change stands out of both runs'
    own variation (and is at least `diff.MIN_RELATIVE`)."""

    op: str
    dim: str | None
    group_a: str | None
    group_b: str | None
    bytes: int | None
    per_step_a: float
    per_step_b: float
    duration_a_ns: float | None
    duration_b_ns: float | None
    spread_a_ns: float | None
    spread_b_ns: float | None
    busbw_a_gbps: float | None
    busbw_b_gbps: float | None
    busbw_spread_a_gbps: float | None  # robust spread over the instances
    busbw_spread_b_gbps: float | None
    ratio: float | None  # speed in B against A: median duration A / B (= busbw B / A at one size)
    flagged: bool


class RankChange(Result):
    """A rank's mean per step window in A and B, and where it got slower (if it did)."""

    rank_a: int
    rank_b: int
    host: str | None
    compute_a_ns: float
    compute_b_ns: float
    exposed_a_ns: float
    exposed_b_ns: float
    late_a_ns: float  # how much later than the first arrival, on average, it reached its collectives
    late_b_ns: float
    slower_in: list[str]  # "compute", "communication", "late"


class Culprit(Result):
    """A rank or host that is in (nearly) every collective that slowed and in few that did not."""

    kind: str  # "rank" or "host"
    name: str
    slowed: int  # slowed instances it took part in
    slowed_total: int
    unslowed: int  # instances it took part in that did not slow
    added_share: float  # of the time the slowed instances added, the share in those it took part in
    ratio: float  # median duration B / A of the matched instances it took part in
    nics: list[str] = msgspec.field(default_factory=list)  # a rank's network NICs in B's channels table


class SetupChange(Result):
    """One thing that differs in how the runs were set up (or a telemetry figure), A against B."""

    item: str
    a: str
    b: str


class RunDiff(Result, kw_only=True):
    """`tracekit diff A B`: the verdict first, then the parts it rests on."""

    schema: str = JSON_SCHEMA
    a: str
    b: str
    verdict: str
    matching: Matching
    decomposition: Decomposition
    waits: list[WaitShift]
    buckets: list[BucketChange]
    ranks: list[RankChange]
    culprits: list[Culprit]
    setup: list[SetupChange]
    network: NetworkSplit | None = None  # with a topology: the change split into network and job
