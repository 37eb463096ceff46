"""Report inputs made by the real pipeline (ingest -> analyze -> replay -> hang), never by hand:
the helpers and names the viz tests share (the fixtures are in conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracekit.analysis import AnalysisResult
from tracekit.ingest import ingest
from tracekit.replay.engine import ReplayResult
from tracekit.store import Run
from tracekit.workflows import analyze
from tracekit.workflows import replay as replay_run
from tracekit.workflows import report_data as build_report_data

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "sample_traces"
REAL = REPO.parent / "shared" / "real_traces"
HOSTILE = "<img src=x onerror=window.__pwned=1>"
GLOO_TOPOLOGIES = ["single-switch", "fat-tree:nic_gbps=100,oversub=4"]
#: What-ifs on the bundled 16-rank sample (as in the README, less the slow placement search).
WHATIF_TOPOLOGY = "rail-optimized:nic_gbps=400"
WHATIF_SCENARIOS = ["eplb:redundant=8", "placement:pp-adjacent",
                    "checkpoint:bytes_per_rank=1GB,every=2,at=0.5,via=backend,storage=4"]
SYNTH_TOPOLOGIES = ["rail-optimized:nic_gbps=400", "rail-optimized:nic_gbps=400,sharp=true",
                    "fat-tree:nic_gbps=100,oversub=4"]


@dataclass
class Pipeline:
    """One run through the whole pipeline, and the report data built from its results."""

    run: Run
    analysis: AnalysisResult
    replay: ReplayResult | None
    data: dict[str, Any]
    topologies: list[str]


def pipeline(paths: list[Path], out: Path, topologies: list[str] | None = None, *, dims: str | None = None,
             **ingest_options: Any) -> Pipeline:
    ingest([str(p) for p in paths], out, **ingest_options)
    result = analyze(out, dims=dims)
    replay = replay_run(out, topologies) if topologies else None
    run = Run(out)
    return Pipeline(run, result, replay, build_report_data(run, analysis=result, replay=replay), topologies or [])
