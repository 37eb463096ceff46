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
    from tracekit.viz.summary import summary_html
    from tracekit.workflows import report_data as build_report_data

    data = build_report_data(nccl_tests_run)
    assert data.presence == "16 ranks (nccl-tests header), no trace" and len(data.hosts) == 2
    html = summary_html(data)
    assert "0 ranks present" not in html and "nccl-tests all_reduce_perf busbw" in html
    assert "<td class='num'>338.82</td>" in html
    assert ("peak busbw", "339 GB/s") in data.summary.kpis


@needs_real
def test_replay_of_an_nccl_tests_run_names_the_command(nccl_tests_run):
    code, out = _cli("replay", str(nccl_tests_run), "--topology", "single-switch:gpus=16", "--no-write")
    assert code == 1
    assert "nothing was ingested" not in out
    assert (f"replay the sweep with `tracekit replay --nccl-tests {NCCL_TESTS_2NODE} --topology "
            "single-switch:gpus=16`") in " ".join(out.split())


# --- item 6: one-rank runs ------------------------------------------------------------------------

HTA_NCCL = REAL / "kineto" / "hta_nccl_parser_config"
B200 = REAL / "kineto" / "tracelens_b200_eager_rank0of8"


def _ingested(tmp_path_factory, source: Path) -> Path:
    if not source.is_dir():
        pytest.skip(f"needs the real trace at {source}")
    run = tmp_path_factory.mktemp(source.name) / "run"
    code, out = _cli("ingest", str(source), "-o", str(run))
    assert code == 0, out
    return run


@pytest.fixture(scope="module")
def hta_nccl_run(tmp_path_factory) -> Path:
    return _ingested(tmp_path_factory, HTA_NCCL)


@pytest.fixture(scope="module")
def b200_run(tmp_path_factory) -> Path:
    return _ingested(tmp_path_factory, B200)


def _raw_kernels(path: Path) -> list[dict]:
    import gzip

    (trace,) = path.glob("*.json.gz")
    with gzip.open(trace) as fh:
        doc = json.load(fh)
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})]


@needs_real
def test_one_rank_run_gets_bandwidth_from_kernel_times(hta_nccl_run):
    """HTA's rank 0 of 2: every all-reduce kernel carries its size; the table's busbw is the
    trace's own bytes over its own kernel time (median over the calls of one size)."""
    import statistics

    doc = json.loads(_cli("analyze", str(hta_nccl_run), "--no-write", "--json")[1])
    rows = doc["bandwidth"]
    assert rows and {r["basis"] for r in rows} == {"kernel_time"}
    assert sorted((r["op"], r["bytes_median"]) for r in rows) == [
        ("all_reduce", 8196000), ("all_reduce", 9724160), ("all_reduce", 26255360), ("all_reduce", 26550272),
        ("all_reduce", 31502336), ("broadcast", 424), ("broadcast", 212480)]
    biggest = [e for e in _raw_kernels(HTA_NCCL) if e["args"]["In msg nelems"] * 4 == 31502336]
    dur_ns = statistics.median(e["dur"] * 1e3 for e in biggest)
    row = next(r for r in rows if r["bytes_median"] == 31502336)
    assert row["instances"] == len(biggest) == 3
    assert row["busbw_median_gbps"] == pytest.approx(31502336 / dur_ns * 2 * (2 - 1) / 2, rel=1e-3)
    out = _cli("analyze", str(hta_nccl_run), "--no-write")[1]
    assert "Bandwidth from kernel times" in out and "an upper bound on the transfer" in out


@needs_real
def test_unnamed_groups_are_named_from_their_process_group_args(b200_run):
    code, out = _cli("analyze", str(b200_run), "--no-write")
    assert code == 0, out
    assert "undefined" not in out
    assert " 3     │ unnamed: nccl, 8 ranks 0-7 │    8 │ DP   │     1 " in out
    assert "14 more groups declared by the trace carry no collective call" in out
    info = _cli("info", str(b200_run))[1]
    assert "undefined" not in info and "(unnamed)" in info


def test_no_kernel_time_rows_when_the_other_ranks_joined():
    """A run with every rank present has instance-based bandwidth only."""
    import polars as pl

    from tracekit.analysis.stalls import kernel_bandwidth

    coll = pl.DataFrame({"instance": [0, 0, 1], "rank": [0, 1, 0], "group": ["g", "g", "g"],
                         "op": ["all_reduce"] * 3, "dim": ["DP"] * 3, "in_bytes": [1000, 1000, 4000],
                         "out_bytes": [1000, 1000, 4000], "nranks": [2, 2, 2], "dur_ns": [100, 120, 200]})
    inst = pl.DataFrame({"instance": [0]})
    out = kernel_bandwidth(coll, inst)
    assert out.height == 1 and out.row(0, named=True)["bytes_median"] == 4000
    assert out.row(0, named=True)["busbw_median_gbps"] == pytest.approx(4000 / 200 * 2 * 1 / 2)
    assert kernel_bandwidth(coll, pl.DataFrame({"instance": [0, 1]})).height == 0


# --- item 12: empty results say why ---------------------------------------------------------------

NCCL_LOG_2GPU = REAL / "nccl_logs" / "gfbench_nccl2.20.5_straggler_2gpu"
INFINIBAND = REAL / "telemetry" / "infiniband"


@needs_real
def test_export_of_an_nccl_log_run_says_why_there_is_nothing(tmp_path_factory, tmp_path):
    run = _ingested(tmp_path_factory, NCCL_LOG_2GPU)
    code, out = _cli("export", str(run), "--chrome", str(tmp_path / "t.json"))
    assert code == 1 and not (tmp_path / "t.json").exists()
    text = " ".join(out.split())
    assert "nothing to export: the run holds no timed events" in text
    assert "NCCL logs give the collective calls and their order, not their start times or durations" in text


@needs_real
def test_export_of_an_nccl_tests_run_points_at_replay(nccl_tests_run, tmp_path):
    code, out = _cli("export", str(nccl_tests_run), "--chrome", str(tmp_path / "t.json"))
    assert code == 1 and "nccl-tests output is a table of sizes" in out and "replay --nccl-tests" in out


@pytest.fixture(scope="module")
def infiniband_run(tmp_path_factory) -> Path:
    return _ingested(tmp_path_factory, INFINIBAND)


@needs_real
def test_info_accounts_for_every_counter_sample(infiniband_run):
    import re

    code, out = _cli("info", str(infiniband_run))
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("telemetry"))
    assert line == ("telemetry  51 counter samples: 30 used on 6 port(s) (0 on topology links), 21 left out: "
                    "untimed 21 (no timestamp in perfquery 21)")
    total, used, left = map(int, re.findall(r"(\d+) counter samples: (\d+) used .* (\d+) left out", line)[0])
    assert used + left == total
    doc = json.loads(_cli("info", str(infiniband_run), "--json")[1])
    s = doc["telemetry"]["summary"]
    assert s["used"] + sum(s["skipped"].values()) == s["counters"] == 51


@needs_real
def test_report_of_a_telemetry_run_summarises_it(infiniband_run):
    from tracekit.viz.summary import summary_html
    from tracekit.workflows import report_data as build_report_data

    data = build_report_data(infiniband_run)
    html = summary_html(data)
    assert "Nothing stands out" not in html
    assert "Telemetry: 51 counter samples: 30 used on 6 port(s)" in html
    assert "the topology sources describe 14 nodes and 6 links" in html


# --- item 13: smaller frictions ------------------------------------------------------------------

KINETO = REAL / "kineto"


def test_physics_note_does_not_tell_a_user_to_set_what_they_set():
    from tracekit.replay.topology import parse_spec, physics_caps

    (given,) = physics_caps(parse_spec("fat-tree:nic_gbps=100,oversub=4"))
    assert "set oversub" not in given.text and given.text.endswith("(as oversub=4 asks)")
    (assumed,) = physics_caps(parse_spec("rail-optimized:nic_gbps=800"))
    assert assumed.text.endswith("; set pcie_gbps")


def test_one_host_topology_prints_no_zero_bisection():
    code, out = _cli("topology", "single-switch")
    assert code == 0 and "0.0 Tb/s" not in out
    assert "bisection     - (one host: no cut between hosts" in out
    assert "bisection     6.4 Tb/s" in _cli("topology", "rail-optimized:hosts=4")[1]


@needs_real
def test_info_says_how_analyze_found_steps_the_trace_does_not_mark(b200_run):
    assert "steps      - (none marked in the traces; `tracekit analyze` derives them)" in _cli("info", str(b200_run))[1]
    _cli("analyze", str(b200_run))
    assert ("steps      - (none marked in the traces; `tracekit analyze` found 1 step, from the whole trace "
            "(no step marks))") in _cli("info", str(b200_run))[1]


@needs_real
def test_mixed_jobs_error_names_every_file(tmp_path):
    files = [KINETO / "hta_trace_diff_control" / "control.json.gz", KINETO / "hta_trace_diff_test" / "test.json.gz",
             KINETO / "hta_nccl_parser_config" / "nccl_data.json.gz"]
    code, out = _cli("ingest", *map(str, files), "-o", str(tmp_path / "run"))
    text = " ".join(out.split())
    assert code == 1 and "3 different jobs" in text
    assert all(f.name in text for f in files), text


def test_nothing_ingested_lists_the_telemetry_formats(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_text("not a trace\n")
    code, out = _cli("ingest", str(tmp_path / "in"), "-o", str(tmp_path / "run"))
    text = " ".join(out.split())
    assert code == 1 and "telemetry: Prometheus text" in text and "ibnetdiscover -p" in text


@needs_real
def test_idle_nic_is_named(tmp_path_factory):
    run = _ingested(tmp_path_factory, REAL / "nccl_logs" / "slurmv4_nccl2.29.3_2node_16rank_roce")
    out = _cli("info", str(run))[1]
    assert "only 8 of 9 NICs on tpgds-aihub0003 carried traffic; idle: mlx5_10:1 (used: mlx5_0:1," in out


@needs_real
def test_a_lone_trace_without_rank_is_rank_0(tmp_path):
    lone = KINETO / "hta_edge_cases" / "distributed_info_not_found.json.gz"
    code, out = _cli("ingest", str(lone), "-o", str(tmp_path / "run"))
    assert code == 0, out
    assert "1 source(s), 1 rank(s)" in out and "taken as rank 0 (--rank sets it)" in out
    other = KINETO / "hta_edge_cases" / "rank_not_found.json.gz"
    code, out = _cli("ingest", str(lone), str(other), "-o", str(tmp_path / "two"))
    assert code == 1 and "pass --rank" in out  # two rankless traces cannot be told apart
    code, out = _cli("ingest", str(other), "-o", str(tmp_path / "nccl"))
    assert code == 1 and "pass --rank" in out  # distributedInfo names the nccl backend: one rank of many


SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "gloo_moe_8rank"


def test_info_analyze_and_export_take_a_trace_folder(tmp_path):
    """The bundled gloo sample's folder, given where a run directory was required: ingested into
    the run `tracekit replay` keeps for the same folder, and said so."""
    from tracekit.ingest import cache_dir
    from tracekit.workflows import open as replay_open_run

    result = CliRunner().invoke(main, ["info", str(SAMPLE)])
    assert result.exit_code == 0, result.output
    assert f"note: {SAMPLE} is not a run directory: ingested into {cache_dir([SAMPLE])}" in result.stderr
    assert "ranks      8: 0-7" in result.stdout
    assert replay_open_run([SAMPLE]).path == cache_dir([SAMPLE])
    code, out = _cli("analyze", str(SAMPLE), "--no-write")
    assert code == 0 and "Findings" in out
    code, out = _cli("export", str(SAMPLE), "--chrome", str(tmp_path / "t.json"))
    assert code == 0 and (tmp_path / "t.json").is_file() and "8 ranks" in out
    (tmp_path / "empty").mkdir()
    code, out = _cli("info", str(tmp_path / "empty"))
    assert code == 1 and "not a tracekit run directory, and ingesting it as traces failed" in out


MADE_NCCL_TESTS = """\
# nThread 1 nGpus 1 minBytes 1048576 maxBytes 4194304 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#  Rank  0 Group  0 Pid   101 on    node-a device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   102 on    node-a device  1 [0000:05:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid   201 on    node-b device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid   202 on    node-b device  1 [0000:05:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     1048576        262144     float     sum      -1    100.0   10.49   15.73      0    101.0   10.38   15.57      0
     2097152        524288     float     sum      -1    150.0   13.98   20.97      0    149.0   14.07   21.11      0
     4194304       1048576     float     sum      -1    260.0   16.13   24.20      0    262.0   16.01   24.01      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 20.2
"""


def test_a_made_nccl_tests_file_is_first_class(tmp_path):
    """A small nccl-tests output made here (4 ranks on 2 hosts): runs on a clone without ../shared."""
    src = tmp_path / "all_reduce_perf.txt"
    src.write_text(MADE_NCCL_TESTS)
    run = tmp_path / "run"
    assert _cli("ingest", str(src), "-o", str(run))[0] == 0
    out = _cli("info", str(run))[1]
    assert "ranks      4: 0-3 (from the nccl-tests header)" in out and "hosts      2: node-a, node-b" in out
    doc = json.loads(_cli("analyze", str(run), "--no-write", "--json")[1])
    (bench,) = doc["microbench"]
    assert bench["peak_busbw_gbps"] == 24.2 and bench["peak_side"] == "out-of-place"
    assert bench["host_names"] == ["node-a", "node-b"] and bench["ranks_per_host"] == 2
    code, out = _cli("replay", str(run), "--topology", "rail-optimized:hosts=2,gpus=2")
    assert code == 1 and "--nccl-tests" in out
