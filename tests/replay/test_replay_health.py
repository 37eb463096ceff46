"""Health of a measured nccl-tests run: a verdict per table, the error by file, op and size band.

The degraded inputs are made the honest way: a real nccl-tests output from ../shared/real_traces
with its measured times scaled by 8 (and its bandwidth columns divided by 8) into a temporary file.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from nccl_tests_table import CASES

from tracekit.cli import main
from tracekit.replay.microbench import (
    DEGRADED_BELOW,
    MicrobenchRow,
    MicrobenchRowSummary,
    bench_tables,
    error_bands,
    microbench_report,
    table_health,
)
from tracekit.results import to_builtins

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "real_traces" / "nccl_tests"
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason="needs ../shared/real_traces/nccl_tests")
MIB = 2**20
A3 = "all_reduce_perf_2node_16xH100.txt"
A3_SPEC = "rail-optimized:gpus=8,nic_gbps=200"
#: One spec for a folder of the four real files: 8 GPUs per host, hosts sized per sweep, NVLS off.
FOLDER_SPEC = "rail-optimized:gpus=8,nic_gbps=200"


def _row(size: int, measured_us: float, predicted_us: float, *, op: str = "all_reduce", table: int = 0,
         source: str = "a.txt", modelled: bool = True) -> MicrobenchRow:
    factor = 2 * 15 / 16
    return MicrobenchRow(MicrobenchRowSummary(
        op=op, size_bytes=size, measured_us=measured_us, predicted_us=predicted_us,
        measured_busbw=size / measured_us / 1000 * factor, predicted_busbw=size / predicted_us / 1000 * factor,
        algo="ring", proto="Simple", channels=8, latency_bound=size < 64 * MIB, source=source, table=table,
        test=f"{op}_perf", modelled=modelled), nranks=16)


def test_health_is_the_median_ratio_at_64_mib_and_up():
    """Small sizes do not count: they are 10x slower than predicted here and the verdict is still healthy."""
    rows = [_row(MIB, 1000.0, 100.0), _row(8 * MIB, 1000.0, 100.0),
            _row(64 * MIB, 100.0, 60.0), _row(128 * MIB, 100.0, 70.0), _row(256 * MIB, 100.0, 90.0)]
    h = table_health(rows)
    assert (h.verdict, h.sizes, h.rows) == ("healthy", ">= 64 MiB", 3)
    assert h.measured_over_predicted == pytest.approx(0.7)
    assert h.measured_busbw == pytest.approx(128 * MIB / 100.0 / 1000 * 30 / 16)
    assert h.predicted_busbw == pytest.approx(128 * MIB / 70.0 / 1000 * 30 / 16)


def test_below_half_the_model_is_degraded_and_half_is_not():
    at = [_row(64 * MIB, 100.0, 100.0 * DEGRADED_BELOW)]
    below = [_row(64 * MIB, 100.0, 100.0 * DEGRADED_BELOW * 0.99)]
    assert table_health(at).verdict == "healthy"
    assert table_health(below).verdict == "degraded"


def test_without_large_sizes_the_largest_three_decide():
    rows = [_row(2**k, 100.0, 100.0) for k in range(10, 17)] + [_row(2**17, 100.0, 10.0),
                                                              _row(2**18, 100.0, 10.0), _row(2**19, 100.0, 10.0)]
    h = table_health(rows)
    assert (h.verdict, h.sizes, h.rows) == ("degraded", "the 3 largest sizes", 3)
    assert h.measured_over_predicted == pytest.approx(0.1)


def test_a_table_the_model_does_not_predict_has_no_verdict():
    h = table_health([_row(64 * MIB, 100.0, 1e-9, op="other", modelled=False)])
    assert (h.verdict, h.measured_over_predicted, h.rows) == ("unknown", None, 0)


def test_tables_are_blocks_of_source_and_index():
    rows = [_row(64 * MIB, 100.0, 90.0, table=0), _row(64 * MIB, 100.0, 20.0, op="all_gather", table=1),
            _row(64 * MIB, 100.0, 90.0, source="b.txt", table=0)]
    tables = bench_tables(rows)
    assert [(t.source, t.table, t.op, t.health.verdict) for t in tables] == [
        ("a.txt", 0, "all_reduce", "healthy"), ("a.txt", 1, "all_gather", "degraded"),
        ("b.txt", 0, "all_reduce", "healthy")]


def test_bands_include_their_edges():
    """1 MiB is in "<= 1 MiB", 1 MiB + 1 and 64 MiB - 1 in "1-64 MiB", 64 MiB in ">= 64 MiB" (as the
    error table of docs/hardware.md); the error is measured / predicted time - 1."""
    rows = [_row(MIB, 120.0, 100.0), _row(MIB + 1, 80.0, 100.0), _row(64 * MIB - 1, 150.0, 100.0),
            _row(64 * MIB, 110.0, 100.0), _row(64 * MIB, 1.0, 1.0, op="other", modelled=False)]
    bands = {b.band: b for b in error_bands(rows)}
    assert list(bands) == ["<= 1 MiB", "1-64 MiB", ">= 64 MiB"]
    assert (bands["<= 1 MiB"].rows, bands["<= 1 MiB"].median_error) == (1, pytest.approx(0.2))
    assert bands["1-64 MiB"].rows == 2 and bands["1-64 MiB"].worst_error == pytest.approx(0.5)
    assert bands["1-64 MiB"].median_abs_error == pytest.approx(0.35)
    assert bands[">= 64 MiB"].rows == 1 and bands[">= 64 MiB"].median_error == pytest.approx(0.1)


def test_report_json_carries_table_indices_and_health():
    rows = [_row(64 * MIB, 100.0, 90.0, table=0), _row(64 * MIB, 100.0, 20.0, op="all_gather", table=1)]
    doc = to_builtins(microbench_report(rows, "rail-optimized", path="a.txt").summary)
    assert [r["table"] for r in doc["rows"]] == [0, 1]
    assert doc["tables"][1]["health"] == {"verdict": "degraded", "measured_over_predicted": pytest.approx(0.2),
                                          "measured_busbw": pytest.approx(rows[1].timed_busbw),
                                          "predicted_busbw": pytest.approx(rows[1].predicted_busbw),
                                          "sizes": ">= 64 MiB", "rows": 1}


# ------------------------------------------------------------------------------------------
# real nccl-tests outputs


def scaled_copy(src: Path, dst: Path, factor: float = 8.0) -> Path:
    """`src` with every data row's out-of-place and in-place times x `factor` and algbw and busbw /
    `factor` (the run measured `factor` times slower), other lines unchanged."""
    out = []
    for line in src.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 13 and fields[0].isdigit():
            for i in (5, 9):
                fields[i] = f"{float(fields[i]) * factor:.1f}"
            for i in (6, 7, 10, 11):
                fields[i] = f"{float(fields[i]) / factor:.2f}"
            line = " ".join(f"{x:>12}" for x in fields)
        out.append(line)
    dst.write_text("\n".join(out) + "\n")
    return dst


def _replay_json(path: Path, spec: str, cache: Path) -> dict:
    res = CliRunner().invoke(main, ["replay", "--nccl-tests", str(path), "--topology", spec, "--json",
                                    "--cache", str(cache)])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout[res.stdout.index("{"):])


@needs_real
@pytest.mark.parametrize("case", [c for c in CASES if c.primary], ids=lambda c: c.file.split(".")[0])
def test_real_runs_are_healthy_and_8x_slower_copies_degraded(case, tmp_path):
    """Every real output on the spec of its hardware is healthy; the same file measured 8x slower is
    degraded, table by table. Each JSON row names its table, and the tables are numbered as in the file."""
    original = _replay_json(REAL / case.file, case.spec, tmp_path / "a")
    slow = _replay_json(scaled_copy(REAL / case.file, tmp_path / case.file), case.spec, tmp_path / "b")
    for doc in (original, slow):
        assert sorted({r["table"] for r in doc["rows"]}) == [t["table"] for t in doc["tables"]]
        assert [t["table"] for t in doc["tables"]] == list(range(len(doc["tables"])))
    verdicts = [t["health"]["verdict"] for t in original["tables"]]
    assert "degraded" not in verdicts and "healthy" in verdicts, verdicts
    for before, after in zip(original["tables"], slow["tables"], strict=True):
        assert before["op"] == after["op"]
        if before["health"]["verdict"] == "unknown":  # sendrecv until the model has p2p tables
            assert after["health"]["verdict"] == "unknown"
            continue
        assert after["health"]["verdict"] == "degraded", after
        assert after["health"]["measured_over_predicted"] == pytest.approx(
            before["health"]["measured_over_predicted"] / 8, rel=0.02)


@needs_real
def test_degraded_text_says_what_to_check(tmp_path):
    slow = scaled_copy(REAL / A3, tmp_path / "slow_all_reduce.txt")
    res = CliRunner().invoke(main, ["replay", "--nccl-tests", str(slow), "--topology", A3_SPEC,
                                    "--cache", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    [line] = [x for x in res.stdout.splitlines() if x.startswith("  table 0")]
    assert line.startswith("  table 0 (all_reduce_perf): degraded: measured 35.1 GB/s busbw at >= 64 MiB where "
                           "this fabric should give about ")
    assert line.endswith("check cabling, GPUDirect RDMA, the NICs NCCL picked")


@needs_real
def test_folder_gives_the_error_by_file_op_and_band(tmp_path):
    """The four real files and an 8x slower copy of one, in one folder: one table of error by file, op and
    size band; only the slow copy is degraded; the report draws every file."""
    folder = tmp_path / "outputs"
    folder.mkdir()
    for case in CASES:
        shutil.copy(REAL / case.file, folder / case.file)
    scaled_copy(REAL / A3, folder / "slow_copy.txt")
    report = tmp_path / "nccl.html"
    res = CliRunner().invoke(main, ["replay", "--nccl-tests", str(folder), "--topology", FOLDER_SPEC,
                                    "--cache", str(tmp_path / "c"), "--report", str(report)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == f"nccl-tests outputs/ (5 files, 13 tables) on {FOLDER_SPEC}:"
    assert re.split(r"\s{2,}", lines[1]) == ["file", "op", "band", "rows", "median |error|", "median error",
                                             "worst"]
    body = [re.split(r"\s{2,}", x) for x in lines[2:lines.index("error = predicted / measured busbw - 1 "
                                                                "(out-of-place, from the times)")]]
    assert all(len(b) == 7 for b in body)
    keys = {(b[0], b[1], b[2]) for b in body}
    assert (A3, "all_reduce", "<= 1 MiB") in keys and ("slow_copy.txt", "all_reduce", ">= 64 MiB") in keys
    n1 = "xxrjun_cluster01_N1_G8_cnode3-002_h100_5ops.log"
    assert {op for f, op, _ in keys if f == n1} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                                    "sendrecv"}
    assert all(band in ("<= 1 MiB", "1-64 MiB", ">= 64 MiB") for _, _, band in keys)
    health = [x for x in lines if x.startswith("  ") and " table " in x]
    assert len(health) == 13
    degraded = [x for x in health if ": degraded: " in x]
    assert degraded == [x for x in health if x.startswith("  slow_copy.txt table 0 ")] and len(degraded) == 1
    text = report.read_text()
    for case in CASES:
        assert case.file in text
    assert "slow_copy.txt" in text and "check cabling" in text
    floors = [x for x in lines if x.startswith("    small messages")]
    assert floors and all("the network adds about" in x for x in floors)  # the A3-Mega floor and its copy
    assert "the network adds about 51 us per hop" in text  # the report says it under the same table


def test_not_an_nccl_tests_file_is_a_one_line_error(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\nthis is not nccl-tests output\n")
    res = CliRunner().invoke(main, ["replay", "--nccl-tests", str(bad), "--topology", A3_SPEC,
                                    "--cache", str(tmp_path / "c")])
    assert res.exit_code == 1
    assert "notes.txt" in res.output and "Traceback" not in res.output


def test_bundled_degraded_sample_is_its_recipe_output():
    """sample_traces/nccl_tests holds exactly what its generator writes (project-made, regenerable)."""
    import importlib.util

    repo = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("make_degraded", repo / "sample_traces" /
                                                  "make_nccl_tests_degraded.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sample = repo / "sample_traces" / "nccl_tests" / module.NAME
    assert sample.read_text() == "\n".join(module.lines()) + "\n"


def test_report_data_is_per_file_with_the_cli_sentences():
    from tracekit.present import health_sentence
    from tracekit.viz.data import microbench_data

    rows = [_row(MIB, 1000.0, 100.0), _row(64 * MIB, 100.0, 20.0),
            _row(64 * MIB, 100.0, 1e-9, op="other", table=1, modelled=False),
            _row(64 * MIB, 100.0, 90.0, source="dir/b.txt")]
    report = microbench_report(rows, "rail-optimized", path="dir")
    md = microbench_data(report)
    assert [f.file for f in md.files] == ["a.txt", "b.txt"]
    first = md.files[0].tables
    assert [t.verdict for t in first] == ["degraded", "unknown"]
    assert first[0].size_bytes == [MIB, 64 * MIB] and first[1].size_bytes == []
    assert first[0].measured == pytest.approx([r.timed_busbw for r in rows[:2]])
    assert first[0].sentence == health_sentence(report.tables[0])
    assert first[0].floor is None  # no row of 64 KiB or below


@needs_real
def test_a_topology_too_small_for_the_sweep_is_a_one_line_error(tmp_path):
    """Regression: 10 hosts x 8 ranks on a 2-host spec ended in a traceback from the router."""
    n10 = "xxrjun_cluster01_N10_G8_h100_5ops.log"
    res = CliRunner().invoke(main, ["replay", "--nccl-tests", str(REAL / n10), "--topology",
                                    "rail-optimized:hosts=2,gpus=8,nic_gbps=400", "--cache", str(tmp_path / "c")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert n10 in res.output and "10 hosts x 8 ranks" in res.output and "2 hosts x 8 GPUs" in res.output
