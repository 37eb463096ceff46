"""Cross-rank analyses: pure functions from tables to tables.

`prepare` matches collectives into instances, aligns clocks and classifies dims (`prepared` keeps
what `analyze` goes on from, so a replay and an analysis share it); `analyze` adds
the per rank and step breakdown, stalls and stragglers, EP load, PP bubbles, bandwidth and
findings in words. See docs/analysis.md.
"""

from __future__ import annotations

from tracekit.analysis._frames import frame
from tracekit.analysis.classify import classify, parse_dims
from tracekit.analysis.clocks import align_clocks
from tracekit.analysis.core import AnalysisResult, Prepared, analyze, prepare, prepared
from tracekit.analysis.findings import fmt_ns
from tracekit.analysis.matching import match_collectives

__all__ = [
    "AnalysisResult", "Prepared", "align_clocks", "analyze", "classify", "fmt_ns", "frame", "match_collectives",
    "parse_dims", "prepare", "prepared",
]
