"""The project's own 8-rank gloo MoE run ingests with the op, group, bytes and peers of truth.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit.ingest import ingest
from tracekit.store import Run

SAMPLE = Path(__file__).parents[2] / "sample_traces" / "gloo_moe_8rank"


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, dict]:
    if not (SAMPLE / "truth.json").is_file():
        pytest.skip(f"sample run not generated at {SAMPLE}")
    out = tmp_path_factory.mktemp("gloo") / "run"
    report = ingest(sorted(SAMPLE.glob("*.pt.trace.json.gz")), out)
    assert not report.failed and report.ranks == list(range(8))
    return Run(out), json.loads((SAMPLE / "truth.json").read_text())


def test_calls_match_truth(gloo: tuple[Run, dict]) -> None:
    run, truth = gloo
    pg_name = {g["desc"]: g["pg_name"] for g in truth["layout"]["groups"]}
    coll = run.table("collectives").to_pylist()
    for rank in range(8):
        mine = sorted((c for c in coll if c["rank"] == rank), key=lambda c: c["coll_id"])
        expected = truth["expected_calls"][str(rank)]["per_step_sequence"]
        want = [(int(step), c) for step in map(str, truth["profiled_steps"]) for c in expected[step]]
        assert len(mine) == len(want) == 32
        for got, (step, exp) in zip(mine, want, strict=True):
            width = 8 if exp["dtype"] == "Long" else 4
            row_bytes = width * (1 if exp["kind"] == "count_exchange" else 32)
            assert got["step"] == step
            assert got["op"] == exp["op"] and got["dtype"] == exp["dtype"]
            assert got["group"] == pg_name[exp["group"]]
            assert got["in_bytes"] == exp.get("in_bytes", 0)
            assert got["out_bytes"] == exp.get("out_bytes", 0)
            if exp["op"] in ("send", "recv"):
                assert got["peer"] == exp["peer"]
            if exp["op"] == "all_to_all":
                assert got["in_splits"] == [r * row_bytes for r in exp["input_split_sizes"]]
                assert got["out_splits"] == [r * row_bytes for r in exp["output_split_sizes"]]
                assert got["nranks"] == 4


def test_groups_and_hosts(gloo: tuple[Run, dict]) -> None:
    run, truth = gloo
    groups = {g["group"]: g for g in run.table("groups").to_pylist()}
    for g in truth["layout"]["groups"]:
        assert groups[g["pg_name"]]["ranks"] == g["ranks"]
        assert groups[g["pg_name"]]["desc"] == g["desc"]
        assert groups[g["pg_name"]]["backend"] == "gloo"
    hosts = {r["rank"]: r["host"] for r in run.table("ranks").to_pylist()}
    assert hosts == {r["rank"]: r["host"] for r in truth["layout"]["ranks"]}


def test_same_call_same_seq_across_ranks(gloo: tuple[Run, dict]) -> None:
    run, _ = gloo
    coll = run.table("collectives").to_pylist()
    by_key: dict[tuple, set] = {}
    for c in coll:
        if c["op"] in ("all_to_all", "all_reduce"):
            size = c["in_bytes"] if c["op"] == "all_reduce" else None
            by_key.setdefault((c["group"], c["seq"]), set()).add((c["op"], size))
    assert all(len(v) == 1 for v in by_key.values())
    assert len(by_key) == 2 * (20 + 4)
