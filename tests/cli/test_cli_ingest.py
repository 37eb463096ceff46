"""`tracekit ingest` and `tracekit info` through click's CliRunner."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.cli import main

REAL = Path(__file__).parents[2] / ".." / "shared" / "real_traces" / "kineto"


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not REAL.is_dir():
        pytest.skip(f"real traces not present at {REAL}")
    d = tmp_path_factory.mktemp("in")
    for p in sorted((REAL / "param_dlrm_kineto_8rank").glob("worker[0-2]_*.json")):
        shutil.copy(p, d / p.name)
    shutil.copy(REAL / "hta_edge_cases" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", d)
    return d


def test_ingest_then_info(traces: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "run"
    res = runner.invoke(main, ["ingest", str(traces), "-o", str(out), "--jobs", "1"])
    assert res.exit_code == 1 and "2 different jobs" in res.stderr and "--allow-mixed" in res.stderr
    assert not (out / "manifest.json").exists()
    out = tmp_path / "mixed"
    res = runner.invoke(main, ["ingest", str(traces), "-o", str(out), "--jobs", "1", "--allow-mixed"])
    assert res.exit_code == 0, res.output
    assert "kineto" in res.stdout and "4 source(s), 4 rank(s)" in res.stdout
    assert "worker0_step_12" in res.stdout and "skipped, by reason: flow " in res.stdout
    assert "mixes 2 jobs" in res.stderr
    again = runner.invoke(main, ["ingest", str(traces), "-o", str(out), "--allow-mixed"])
    assert again.exit_code == 0 and "4 source(s) (4 cached)" in again.stdout
    info = runner.invoke(main, ["info", str(out)])
    assert info.exit_code == 0, info.output
    assert "ranks      4: 0-2,34" in info.stdout
    assert "default_pg" in info.stdout and "steps      10,551" in info.stdout
    doc = json.loads(runner.invoke(main, ["info", str(out), "--json"]).stdout)
    assert doc["ranks"] == [0, 1, 2, 34] and doc["formats"] == {"kineto": 4}
    assert {g["group"] for g in doc["groups"]} >= {"0"}


def test_nothing_ingested_is_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_bytes(b"\x00\x01 not a trace")
    res = CliRunner().invoke(main, ["ingest", str(bad), "-o", str(tmp_path / "run")])
    assert res.exit_code == 1
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [f"Error: nothing ingested: {bad}: unknown format (not a Kineto/Chrome trace or "
                     f"another supported format); no run written to {tmp_path / 'run'}"]
    assert not (tmp_path / "run" / "manifest.json").exists()


def test_bad_file_next_to_good_one(traces: Path, tmp_path: Path) -> None:
    d = tmp_path / "in"
    d.mkdir()
    shutil.copy(next(traces.glob("worker0_*")), d / "good.json")
    (d / "cut.json.gz").write_bytes(b"\x1f\x8b\x08\x00\x00")
    res = CliRunner().invoke(main, ["ingest", str(d), "-o", str(tmp_path / "run")])
    assert res.exit_code == 2  # some sources ingested, some failed
    assert "error:" in res.stderr and "cut.json.gz" in res.stderr and "Traceback" not in res.output
    assert "1 of 2 source(s) ingested" in res.stderr


def test_rank_and_pattern_options(tmp_path: Path) -> None:
    if not REAL.is_dir():
        pytest.skip("real traces absent")
    src = REAL / "hta_edge_cases" / "rank_not_found.json.gz"
    runner = CliRunner()
    res = runner.invoke(main, ["ingest", str(src), "-o", str(tmp_path / "a")])
    assert res.exit_code == 1 and "--rank" in res.stderr
    res = runner.invoke(main, ["ingest", str(src), "-o", str(tmp_path / "b"), "--rank", "6"])
    assert res.exit_code == 0 and " 6 " in res.stdout
    res = runner.invoke(main, ["ingest", str(src), "-o", str(tmp_path / "c"), "--comm-pattern", "(["])
    assert res.exit_code == 1 and "invalid comm pattern" in res.stderr


def test_info_on_a_non_run(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["info", str(tmp_path)])
    assert res.exit_code == 1 and "not a tracekit run directory" in res.stderr
