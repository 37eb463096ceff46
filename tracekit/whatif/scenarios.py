"""Scenario strings (`eplb:redundant=8`, `placement:pp-adjacent`, `checkpoint:...`) and the front door
`whatif()`, which replays the baseline once and every scenario against it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from tracekit._progress import muted, status
from tracekit.replay.backend import cpu_backend
from tracekit.whatif.core import (
    DEFAULT_TOPOLOGY,
    Baseline,
    ScenarioResult,
    SkippedScenario,
    WhatIfError,
    WhatIfResult,
    WhatIfSummary,
    as_int,
    load_tables,
    make_baseline,
    parse_params,
)
from tracekit.whatif.experts import ep_bytes_missing

KINDS = ("eplb", "placement", "checkpoint", "dataload", "scale", "routing", "schedule")
EPLB_FIELDS = ("redundant", "groups", "nodes", "experts", "compute")
SCALE_FIELDS = ("dp", "ep", "hosts")


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario: its kind, its text as given, and its fields."""

    kind: str
    text: str
    params: dict[str, str] = field(default_factory=dict)
    target: str | None = None  # placement: the named placement or file


def parse_scenario(text: str) -> Scenario:
    """`KIND:fields`; the message of a bad scenario names the field."""
    raw = text.strip()
    kind, _, rest = raw.partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise WhatIfError(f"unknown scenario {raw!r}; scenarios are {', '.join(k + ':...' for k in KINDS)}")
    if kind == "eplb":
        params = parse_params(kind, rest, EPLB_FIELDS)
        if "redundant" not in params:
            raise WhatIfError("eplb: field 'redundant' is required (extra expert slots per EP group)")
        for key in ("redundant", "groups", "nodes", "experts"):
            if key in params:
                as_int(kind, key, params[key], minimum=0 if key == "redundant" else 1)
        return Scenario(kind, raw, params)
    if kind == "placement":
        target, _, options = rest.partition(",") if rest.startswith("auto") else (rest, "", "")
        target = target.strip()
        if not target:
            raise WhatIfError("placement: give a file or one of pp-adjacent, pp-spread, ep-in-node, auto")
        params = parse_params(kind, options, ("replays",))
        if "replays" in params:
            as_int(kind, "replays", params["replays"], minimum=1)
        return Scenario(kind, raw, params, target=target)
    if kind in ("scale", "routing"):
        known = SCALE_FIELDS if kind == "scale" else ("nodes",)
        params = parse_params(kind, rest, known)
        if not params or (kind == "routing" and "nodes" not in params):
            raise WhatIfError(f"{kind}: give {' or '.join(f'{k}=N' for k in known)}")
        for key, value in params.items():
            as_int(kind, key, value, minimum=1)
        return Scenario(kind, raw, params)
    if kind == "schedule":
        from tracekit.whatif.schedule import parse as parse_schedule

        name, params = parse_schedule(rest)
        return Scenario(kind, raw, params, target=name)
    from tracekit.whatif.storage import parse_storage_params

    return Scenario(kind, raw, parse_storage_params(kind, rest))


#: Scenarios that change only the run's collectives (their sizes or their ranks' places): with no
#: collective simulated in the baseline they would replay the baseline again (EPLB given expert
#: loads derives its own traffic, and runs).
COLLECTIVE_ONLY = ("eplb", "placement", "scale", "routing")
NOTHING_SIMULATED = ("not replayed: the baseline simulated no collective (see the not_simulated caution), so "
                     "this scenario, which changes only collectives, would repeat it")

NO_COLLECTIVE_TO_SLOW = ("the baseline simulated no collective: these transfers can slow none, so the step and "
                         "exposed communication stay as traced by construction, not by measurement")


def run_scenario(base: Baseline, scenario: Scenario | str, *, expert_loads: Any = None) -> ScenarioResult:
    """Apply one scenario to the baseline's run, replay it, and compare."""
    sc = parse_scenario(scenario) if isinstance(scenario, str) else scenario
    p = sc.params
    if sc.kind == "eplb":
        from tracekit.whatif.experts import eplb

        return eplb(base, redundant=int(p["redundant"]), groups=int(p.get("groups", 1)),
                    nodes=int(p["nodes"]) if "nodes" in p else None, experts_per_rank=int(p.get("experts", 1)),
                    loads=expert_loads, compute=p.get("compute"), scenario=sc.text)
    if sc.kind == "placement":
        from tracekit.whatif.placement import AUTO_REPLAYS, placement

        return placement(base, sc.target or "", max_replays=int(p.get("replays", AUTO_REPLAYS)), scenario=sc.text)
    if sc.kind == "scale":
        from tracekit.whatif.scale import scale

        return scale(base, **{k: int(v) for k, v in p.items()}, loads=expert_loads, scenario=sc.text)
    if sc.kind == "routing":
        from tracekit.whatif.routing import node_limited

        return node_limited(base, nodes=int(p["nodes"]), scenario=sc.text)
    if sc.kind == "schedule":
        from tracekit.whatif.schedule import DEFAULT_SM_SHARE, schedule_whatif

        return schedule_whatif(base, sc.target or "", microbatches=int(p["microbatches"]) if "microbatches" in p
                               else None, chunks=int(p["chunks"]) if "chunks" in p else None,
                               sm_share=float(p.get("sm_share", DEFAULT_SM_SHARE)), scenario=sc.text)
    from tracekit.whatif.storage import storage_traffic

    return storage_traffic(base, sc)


def whatif(source: Mapping[str, pa.Table], scenarios: Sequence[Scenario | str], *,
           topology: str = DEFAULT_TOPOLOGY, expert_loads: Any = None, **replay_options: Any) -> WhatIfResult:
    """Replay the run on `topology` (the baseline), then each scenario against it.

    `source` is the prepared tables (`tracekit.workflows.whatif` gives a run's); `expert_loads`
    (`ExpertLoads`) feeds EPLB and scale's EP re-split with per-expert token counts; `replay_options` go to
    `tracekit.replay.replay`.
    """
    parsed = [parse_scenario(s) if isinstance(s, str) else s for s in scenarios]
    if not parsed:
        raise WhatIfError("give at least one scenario")
    tables = load_tables(source)
    cpu = cpu_backend(tables)
    if cpu is not None:
        return WhatIfResult(WhatIfSummary(topology=topology, cautions=[cpu]))
    base = make_baseline(tables, topology, **replay_options)
    results, skipped = [], []
    for k, s in enumerate(parsed, 1):
        if base.replay.errors is None and s.kind in COLLECTIVE_ONLY and not (s.kind == "eplb" and expert_loads):
            missing = ep_bytes_missing(tables) if s.kind in ("eplb", "routing") else None
            reason = f"not replayed: {missing}" if missing else NOTHING_SIMULATED
            skipped.append(SkippedScenario(scenario=s.text, reason=reason))
            continue
        status(f"scenario {k}/{len(parsed)}: {s.text}")
        with muted():
            result = run_scenario(base, s, expert_loads=expert_loads)
        if base.replay.errors is None and s.kind != "schedule":
            result.notes.append(NO_COLLECTIVE_TO_SLOW)
        results.append(result)
    return WhatIfResult(WhatIfSummary(topology=topology, replay_error=base.replay.errors, scenarios=results,
                                      cautions=list(base.replay.findings), skipped=skipped),
                        baseline_step_ns=dict(base.result.step_ns), baseline_exposed_ns=dict(base.result.exposed_ns))
