"""What-if studio: change the run (EP expert placement, rank placement, north-south traffic, the
job's scale, node-limited routing), replay it, and compare with the baseline replay on the same
topology (model vs model).

`whatif(run, ["eplb:redundant=8", "placement:pp-adjacent"], topology=...)` returns a
`WhatIfResult`; each scenario also has its own function (`eplb`, `placement`, `storage_traffic`,
`scale`, `node_limited`)
taking a `Baseline` from `make_baseline`. See docs/whatif.md.
"""

from __future__ import annotations

from tracekit.whatif.core import (
    Baseline,
    Change,
    Placement,
    RankLoad,
    ScenarioResult,
    Slowdown,
    WhatIfError,
    WhatIfResult,
    WhatIfSummary,
    make_baseline,
    traced_placement,
)
from tracekit.whatif.eplb import EplbError, ExpertPlan, rebalance_experts
from tracekit.whatif.experts import ExpertLoads, eplb, read_expert_loads, read_expert_map
from tracekit.whatif.placement import named_placement, placement, read_placement
from tracekit.whatif.routing import node_limited
from tracekit.whatif.scale import scale
from tracekit.whatif.scenarios import Scenario, parse_scenario, run_scenario, whatif

__all__ = [
    "Baseline", "Change", "EplbError", "ExpertLoads", "ExpertPlan", "Placement", "RankLoad", "Scenario",
    "ScenarioResult", "Slowdown", "WhatIfError", "WhatIfResult", "WhatIfSummary", "eplb", "make_baseline",
    "named_placement", "node_limited", "parse_scenario", "placement", "read_expert_loads", "read_expert_map",
    "read_placement", "rebalance_experts", "run_scenario", "scale", "traced_placement", "whatif",
]
