"""`tracekit hang` end to end: raw dumps (ingested on the fly) and run directories."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.cli import main
from tracekit.ingest import ingest
from tracekit.store import Run

REPO = Path(__file__).resolve().parents[2]
FR_REAL = REPO / ".." / "shared" / "real_traces" / "flight_recorder" / "gloo_torch2.13_cpu"
SAMPLE = REPO / "sample_traces" / "gloo_moe_8rank"


@pytest.fixture(scope="module")
def real() -> Path:
    if not FR_REAL.is_dir():
        pytest.skip(f"real Flight Recorder dumps not present at {FR_REAL}")
    return FR_REAL.resolve()


def run(*args: str):
    return CliRunner().invoke(main, ["hang", *args])


def test_missing_rank_from_raw_dumps(real):
    result = run(str(real / "missing_rank" / "pickle"))
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Start with rank 1" in out
    assert "ranks 0,2,3 reached all_reduce seq 11" in out and "rank 1 is the one to look at" in out
    assert "11: 0,2,3 · 10: 1" in out and "Traceback" not in out


def test_type_mismatch_json_output(real):
    result = run(str(real / "type_mismatch" / "json"), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    g0 = doc["groups"][0]
    assert g0["status"] == "mismatch" and g0["suspects"] == [3] and doc["suspects"] == [3]
    assert g0["mismatches"][0]["field"] == "op" and g0["mismatches"][0]["minority_ranks"] == [3]
    assert doc["notes"][0] == "ingested 4 flight_recorder sources"


def test_healthy_glob(real):
    result = run(str(real / "healthy" / "json" / "rank_*.json"))
    assert result.exit_code == 0, result.output
    assert "no divergence: every rank reached the same seq in every group." in result.output


def test_run_directory_and_saved_result(real, tmp_path):
    out = tmp_path / "run"
    result = run(str(real / "missing_rank" / "json"), "-o", str(out))
    assert result.exit_code == 0, result.output
    saved = Run(out).read_json("hang")
    assert saved["last_seq"]["0"] == {"0": 11, "1": 10, "2": 11, "3": 11}
    again = run(str(out), "--json", "--no-write")
    assert again.exit_code == 0 and json.loads(again.output)["suspects"] == [1]


def test_ingest_detects_and_counts_flight_recorder(real, tmp_path):
    report = ingest([real / "missing_rank" / "pickle", real / "missing_rank" / "json"], tmp_path / "run")
    assert {s.format for s in report.ingested} == {"flight_recorder"} and len(report.ingested) == 8
    assert not report.failed
    for s in report.ingested:
        assert s.read == s.stored + sum(s.skipped.values()) and s.collectives == s.read
    groups = {g["group"]: g["ranks"] for g in Run(tmp_path / "run").table("groups").to_pylist()}
    assert groups == {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}
    cached = ingest([real / "missing_rank" / "pickle"], tmp_path / "run")
    assert all(s.cached for s in cached.ingested)


def test_sample_run_with_kineto_and_fr(tmp_path):
    files = sorted(SAMPLE.glob("rank*.pt.trace.json.gz")) + sorted((SAMPLE / "fr" / "json").glob("rank_*.json"))
    if len(files) != 16:
        pytest.skip("sample traces not present")
    ingest(files, tmp_path / "run")
    result = run(str(tmp_path / "run"), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["findings"] == [] and doc["source"] == "flight_recorder"
    assert doc["last_seq"]["3"] == dict.fromkeys(("0", "1", "2", "3"), 25)


def test_garbage_is_a_clean_error(tmp_path):
    bad = tmp_path / "rank_0"
    bad.write_bytes(b"\x80\x04\x95" + b"pg_config collective_seq_id" + b"\x00" * 20)
    result = run(str(bad))
    assert result.exit_code == 1
    assert "nothing ingested" in result.output and str(bad) in result.output and "Traceback" not in result.output


class _Boom:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):
        import os
        return (os.system, (self.cmd,))


def test_hostile_pickle_through_the_cli(tmp_path):
    marker = tmp_path / "pwned"
    dump = {"version": "2.10", "pg_config": {}, "entries": [{"collective_seq_id": _Boom(f"touch {marker}")}]}
    (tmp_path / "rank_0").write_bytes(pickle.dumps(dump, protocol=2))
    result = run(str(tmp_path / "rank_0"))
    assert result.exit_code == 1 and "refused to unpickle global" in result.output and "system" in result.output
    assert not marker.exists()
