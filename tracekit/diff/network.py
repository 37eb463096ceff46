"""Network or job? Replay both runs on the observed network with A's calibration.

Replaying B's trace with the per-(op, size) efficiency fitted on A asks: how long would B's work
(its compute, its collectives, its sizes) have taken on the network A had? So
`job_ns` = replayed B - replayed A (both on A's calibration: the model's own bias cancels) is
the part of the change the job asked for, and `network_ns` = the measured change - `job_ns` the
part the network delivered less (or more) for the same work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pyarrow as pa

from tracekit.results import Result
from tracekit.store import Run

if TYPE_CHECKING:
    from tracekit.replay.engine import ReplayResult


#: Neither network nor job dominates when both are within this share of A's step (or the replay's error).
MIN_SHARE = 0.01


class NetworkSplit(Result):
    """The step-time change split into network and job, with the replay's own error beside it.

    `step_error` is |replayed A - traced A| / traced A over the compared steps (how far the replay
    is from the trace it was fitted on); `instance_error_*` are A's cross-validated per-instance
    errors (docs/replay.md, section 5)."""

    topology: str
    steps: int
    step_a_ns: float
    step_b_ns: float
    replayed_a_ns: float
    replayed_b_ns: float
    job_ns: float
    network_ns: float
    dominant: str  # "network", "job", or "neither" (both within the replay's own step error)
    step_error: float
    instance_error_median: float | None
    instance_error_p90: float | None


Source = Run | Mapping[str, pa.Table]


def _replay(source: Source, topology: str, fit: ReplayResult | None = None,
            calibrated_on: str | None = None) -> ReplayResult:
    """A replay on `topology`, calibrated on the trace, or with another replay's calibration (`fit`:
    both its one-factor efficiencies and its two-term fits)."""
    options = {} if fit is None else {"efficiency": dict(fit.efficiency), "terms": dict(fit.terms),
                                      "calibrated_on": calibrated_on}
    from tracekit.analysis import prepare
    from tracekit.replay.engine import replay

    tables = dict(prepare(source, write=False))
    for name in ("channels", "topology_nodes", "topology_links"):
        if name not in tables:
            table = (source.table(name) if source.has(name) else None) if isinstance(source, Run) else source.get(name)
            if table is not None:
                tables[name] = table
    return replay(tables, [topology], **options)


def _mean(values: Mapping[str, float], steps: list[int]) -> float:
    picked = [float(values[str(s)]) for s in steps if str(s) in values]
    return sum(picked) / len(picked) if picked else 0.0


def network_or_job(a: Source, b: Source, topology: str, steps: list[int], b_steps: list[int] | None = None, *,
                   name_a: str = "A") -> NetworkSplit:
    """Fit A's calibration on `topology` (the network A ran on), replay B with it, and split the
    mean step-time change over `steps` (B's own numbers of them: `b_steps`, default the same)
    into job (replayed B - replayed A) and network (the rest)."""
    b_steps = steps if b_steps is None else b_steps
    fit = _replay(a, topology)
    base_a = fit.results[0]
    again = _replay(b, topology, fit, name_a)
    base_b = again.results[0]
    traced_a, traced_b = _mean(base_a.traced_step_ns, steps), _mean(base_b.traced_step_ns, b_steps)
    replayed_a, replayed_b = _mean(base_a.step_ns, steps), _mean(base_b.step_ns, b_steps)
    job = replayed_b - replayed_a
    network = (traced_b - traced_a) - job
    cv = fit.errors.cross_validated if fit.errors is not None else None
    step_error = abs(replayed_a - traced_a) / traced_a if traced_a else 0.0
    floor = max(step_error, MIN_SHARE) * traced_a
    dominant = ("neither" if max(abs(network), abs(job)) <= floor else
                "network" if abs(network) >= abs(job) else "job")
    return NetworkSplit(topology=fit.baseline, steps=len(steps), step_a_ns=traced_a, step_b_ns=traced_b,
                        replayed_a_ns=replayed_a, replayed_b_ns=replayed_b, job_ns=job, network_ns=network,
                        dominant=dominant, step_error=step_error,
                        instance_error_median=None if cv is None else cv.median,
                        instance_error_p90=None if cv is None else cv.p90)
