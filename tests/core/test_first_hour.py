"""What a new user sees in the first hour on real traces (issue 21): nccl-tests runs, one-rank runs,
empty results, and the smaller frictions. Real traces come from ../shared/real_traces and the tests
that need them skip with the reason when it is absent; the others use small inputs made here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tracekit.cli import main

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "real_traces"
NCCL_TESTS_2NODE = (REAL / "nccl_tests" / "all_reduce_perf_2node_16xH100.txt").resolve()
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason=f"needs the real traces at {REAL}")


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def nccl_tests_run(tmp_path_factory) -> Path:
    if not NCCL_TESTS_2NODE.is_file():
        pytest.skip(f"needs the real nccl-tests output at {NCCL_TESTS_2NODE}")
    run = tmp_path_factory.mktemp("nt") / "run"
    code, out = _cli("ingest", str(NCCL_TESTS_2NODE), "-o", str(run))
    assert code == 0, out
    return run


@needs_real
def test_info_shows_the_nccl_tests_headers_ranks_and_hosts(nccl_tests_run):
    code, out = _cli("info", str(nccl_tests_run))
    assert code == 0, out
    assert "ranks      16: 0-15 (from the nccl-tests header)" in out
    assert "hosts      2: ztan-mig-235z, ztan-mig-gq73" in out
    assert "peak busbw 338.82 GB/s at 8589934592 B (out-of-place)" in out
    doc = json.loads(_cli("info", str(nccl_tests_run), "--json")[1])
    assert doc["ranks"] == list(range(16)) and doc["ranks_from"] == "nccl-tests header"


@needs_real
def test_analyze_shows_the_busbw_table_and_its_peak(nccl_tests_run):
    code, out = _cli("analyze", str(nccl_tests_run), "--no-write")
    assert code == 0, out
    assert "nothing stands out" not in out
    assert "peak busbw 339 GB/s at 8.59 GB (out-of-place), 31 sizes" in out
    assert " 8589934592 │   47535.0 │       338.82 │" in out  # the 8 GiB row as nccl-tests printed it
    doc = json.loads(_cli("analyze", str(nccl_tests_run), "--no-write", "--json")[1])
    (bench,) = doc["microbench"]
    assert bench["nranks"] == 16 and bench["hosts"] == 2 and len(bench["sizes"]) == 31
    assert bench["peak_busbw_gbps"] == pytest.approx(338.82) and bench["peak_size_bytes"] == 8589934592
    assert [f["kind"] for f in doc["findings"]] == ["microbench"]


@needs_real
def test_report_shows_the_busbw_table(nccl_tests_run, tmp_path):
    from tracekit.viz.report import build_report_data
    from tracekit.viz.summary import summary_html

    data = build_report_data(nccl_tests_run)
    assert data["presence"] == "16 ranks (nccl-tests header), no trace" and len(data["hosts"]) == 2
    html = summary_html(data)
    assert "0 ranks present" not in html and "nccl-tests all_reduce_perf busbw" in html
    assert "<td class='num'>338.82</td>" in html
    assert ("peak busbw", "339 GB/s") in data["summary"]["kpis"]


@needs_real
def test_replay_of_an_nccl_tests_run_names_the_command(nccl_tests_run):
    code, out = _cli("replay", str(nccl_tests_run), "--topology", "single-switch:gpus=16", "--no-write")
    assert code == 1
    assert "nothing was ingested" not in out
    assert (f"replay the sweep with `tracekit replay --nccl-tests {NCCL_TESTS_2NODE} --topology "
            "single-switch:gpus=16`") in " ".join(out.split())
