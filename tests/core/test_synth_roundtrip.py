"""End to end on synthetic Kineto traces: write, ingest, analyze, and recover the injected truth."""

import pytest

from tracekit.analysis import analyze
from tracekit.ingest import ingest
from tracekit.synth import make_run_tables, write_kineto


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    base = tmp_path_factory.mktemp("synth")
    tables, truth = make_run_tables(hosts=4, gpus_per_host=2, pp=2, ep=4, steps=2, straggler_rank=5,
                                    straggler_step=1, clock_skew_ns=3_000_000, seed=3)
    write_kineto(tables, base / "traces")
    report = ingest([base / "traces"], base / "run")
    return tables, truth, report, analyze(base / "run", write=False).to_json()


def test_every_call_ingests_with_its_bytes_and_peers(round_trip):
    tables, _, report, _ = round_trip
    assert not report.failed
    assert sum(s.collectives for s in report.ingested) == tables["collectives"].num_rows
    assert sum(s.events for s in report.ingested) == tables["events"].num_rows


def test_clock_offsets_recovered(round_trip):
    _, truth, _, doc = round_trip
    for rank, offset in truth["clock_offset_ns"].items():
        assert abs(doc["clock_offsets_ns"][rank] - offset) <= max(50_000, 0.05 * abs(offset))


def test_straggler_and_hot_expert_found(round_trip):
    _, truth, _, doc = round_trip
    top = doc["stragglers"][0]
    assert top["rank"] == truth["straggler"]["rank"]
    assert truth["straggler"]["step"] in top["steps"]
    hot = {e["group"]: e["hot_rank"] for e in doc["ep"]}
    assert hot == {g: v["hot_rank"] for g, v in truth["ep_hot"].items()}


def test_dims_match_the_layout(round_trip):
    _, truth, _, doc = round_trip
    for g in truth["groups"]:
        assert g["dim"] in doc["dims"][g["group"]]
