"""tracekit.runinfo: what `tracekit info` shows, typed, read back equal, and its JSON keys as they were."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tracekit import workflows
from tracekit.ingest import ingest
from tracekit.results import from_builtins, to_builtins
from tracekit.runinfo import RunInfo, info_json

ROOT = Path(__file__).parents[2]
SAMPLE = ROOT / "sample_traces" / "gloo_moe_8rank"
sys.path.insert(0, str(ROOT / "tests" / "telemetry"))


@pytest.fixture(scope="module")
def analysed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gloo sample with a small fabric and switch counters beside it, ingested and analysed."""
    from test_telemetry_ingest_cli import _telemetry

    base = tmp_path_factory.mktemp("info")
    shutil.copytree(SAMPLE, base / "in" / "traces")
    _telemetry(base / "in" / "tel")
    assert not ingest([base / "in"], base / "run").failed
    workflows.analyze(base / "run")
    return base / "run"


def test_info_of_a_run_with_traces_analysis_and_telemetry(analysed_run: Path) -> None:
    found = workflows.info(analysed_run)
    assert found.ranks == list(range(8)) and found.world_sizes == [8] and found.ranks_from == "traces"
    assert found.formats["kineto"] == 8 and found.analyzed_steps is not None and found.analyzed_steps.steps
    assert sum(g.collectives for g in found.groups) == workflows.open(analysed_run).table("collectives").num_rows
    assert found.span.duration_s and found.span.duration_s > 0
    assert found.telemetry and found.telemetry.counters == 6 and len(found.telemetry.links) == 1
    assert found.telemetry.summary and found.telemetry.summary.accounting_text.startswith("6 counter samples")
    assert all(s.read == s.stored + sum(s.skipped.values()) for s in found.sources if not s.error)


def test_info_json_keeps_its_keys_and_reads_back_equal(analysed_run: Path) -> None:
    found = workflows.info(analysed_run)
    doc = json.loads(info_json(found))
    assert list(doc) == sorted(doc)
    assert "findings" in doc["validity"] and "found" not in doc["validity"]
    assert set(doc["analyzed_steps"]) == {"steps", "from"}
    assert doc["telemetry"]["summary"]["accounting"] == found.telemetry.summary.accounting_text
    assert all(isinstance(b["sizes"], int) for b in doc["microbench"])
    assert from_builtins(to_builtins(found), RunInfo) == found


def test_a_run_without_counters_has_no_telemetry_key(tmp_path: Path) -> None:
    assert not ingest([SAMPLE], tmp_path / "run").failed
    doc = json.loads(info_json(workflows.info(tmp_path / "run")))
    assert "telemetry" not in doc and doc["analyzed_steps"] is None and doc["ranks"] == list(range(8))


def test_an_nccl_tests_run_takes_its_ranks_from_the_header(tmp_path: Path) -> None:
    assert not ingest([ROOT / "sample_traces" / "nccl_tests"], tmp_path / "run").failed
    found = workflows.info(tmp_path / "run")
    (bench,) = found.microbench
    assert found.ranks_from == "nccl-tests header" and len(found.ranks) == bench.nranks == 2
    assert bench.sizes > 1 and json.loads(info_json(found))["microbench"][0]["sizes"] == bench.sizes
