"""A small golden output: the JSON summary of a tiny synthetic run.

Regenerate after an intended change with `TRACEKIT_REGEN_GOLDEN=1 pytest tests/analysis/test_analysis_golden.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from analysis_helpers import strip_derived

from tracekit.analysis import analyze
from tracekit.synth import SynthSpec, make_run_tables

GOLDEN = Path(__file__).parent / "golden" / "synth_1host.json"


def _summary() -> dict:
    tables, _ = make_run_tables(SynthSpec(hosts=1, gpus_per_host=4, pp=2, ep=2, steps=2, seed=7,
                                          micro_batches=1, layers_per_stage=1, kernels_per_block=1))
    doc = json.loads(analyze(strip_derived(tables)).dumps())
    return {k: doc[k] for k in ("summary", "clock_offsets_ns", "dims", "stragglers", "ep", "findings")}


def test_golden_summary():
    got = json.loads(json.dumps(_summary(), sort_keys=True))
    if os.environ.get("TRACEKIT_REGEN_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(GOLDEN.read_text())
