"""Topology model, flow decomposition and the numba flow simulator.

`replay(tables, topologies)` re-times a run's communication on network models; `parse_spec`,
`build` and `describe` handle topology specs. See docs/replay.md.
"""

from __future__ import annotations

from tracekit.replay.engine import (
    Identity,
    ReplayError,
    ReplayResult,
    ReplaySummary,
    TopologyResult,
    TopologySummary,
    dependency_edges,
    identity,
    replay,
)
from tracekit.replay.topology import (
    Topology,
    TopologyError,
    TopologySpec,
    build,
    describe,
    parse_spec,
    presets,
    sized,
)

__all__ = [
    "Identity", "ReplayError", "ReplayResult", "ReplaySummary", "Topology", "TopologyError", "TopologyResult",
    "TopologySpec", "TopologySummary",
    "build", "dependency_edges", "describe", "identity", "parse_spec", "presets", "replay", "sized",
]
