"""results/analysis.json is one encoder call over `AnalysisDocument`: its keys sorted, the alignment's
rank keys sorted as numbers and every other block's keys (the hang verdict's ranks too) as text."""

from __future__ import annotations

import dataclasses
import json

import msgspec
import pytest
from analysis_helpers import strip_derived

from tracekit.analysis import analyze
from tracekit.analysis.clocks import Alignment
from tracekit.analysis.core import AnalysisDocument, Bandwidth, RankStep
from tracekit.hang import HangResult, Location
from tracekit.results import to_builtins
from tracekit.synth import SynthSpec, make_run_tables


@pytest.fixture(scope="module")
def result():
    tables, _ = make_run_tables(SynthSpec(hosts=1, gpus_per_host=4, pp=2, ep=2, steps=2, seed=7,
                                          micro_batches=1, layers_per_stage=1, kernels_per_block=1))
    return analyze(strip_derived(tables))


def _pairs(text: str) -> dict:
    return json.loads(text, object_pairs_hook=lambda kv: {"keys": [k for k, _ in kv], **dict(kv)})


def test_alignment_keys_are_numbers_and_hang_keys_text(result):
    hang = HangResult(groups=[], findings=[], source="flight_recorder",
                      locations={10: Location(pid=1), 2: Location(pid=2), 1: Location(pid=3)})
    alignment = Alignment(method="m", per_rank_residual_ns={10: 1.0, 2: 2.0, 1: 3.0})
    doc = msgspec.structs.replace(result.document(), alignment=alignment, hang=hang)
    got = _pairs(dataclasses.replace(result, alignment=alignment, hang=hang).dumps())
    assert got["alignment"]["per_rank_residual_ns"]["keys"] == ["1", "2", "10"]
    assert got["hang"]["locations"]["keys"] == ["1", "10", "2"]
    assert got["keys"] == sorted(got["keys"]) == list(AnalysisDocument.__struct_fields__)
    stored = to_builtins(doc)
    assert list(stored["alignment"]["per_rank_residual_ns"]) == [10, 2, 1]  # numbers, for `sort_keys`
    assert list(stored["hang"]["locations"]) == ["1", "2", "10"]


def test_document_fields_are_in_key_order():
    for kind in (AnalysisDocument, RankStep, Bandwidth):
        fields = list(kind.__struct_fields__)
        assert fields == sorted(fields), kind


def test_overlap_repeats_overlap_ns(result):
    doc = json.loads(result.dumps())
    assert doc["per_rank_step"] and all(r["overlap"] == r["overlap_ns"] for r in doc["per_rank_step"])
    kinds = {b["basis"] for b in doc["bandwidth"]}
    assert kinds <= {"instance", "kernel_time"} and all(("bytes" in b) == (b["basis"] == "kernel_time")
                                                       for b in doc["bandwidth"])
