"""nccl-tests text and `-J` JSON -> the `microbench` table: the real 16xH100 all_reduce_perf
output, and constructed outputs of every era and wrapper (layouts from NVIDIA/nccl-tests
src/common.cu and src/util.cu, v1.0.0 to v2.19.6)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit import schema
from tracekit.errors import InputError
from tracekit.parsers import nccl_tests
from tracekit.parsers.detect import detect_bytes, detect_format
from tracekit.store import SourceSink

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / ".." / "shared" / "real_traces" / "nccl_tests"
DATA = Path(__file__).parent / "nccl_data"

AR_TEXT = (DATA / "nccl_tests_all_reduce_4rank.txt").read_text()
AG_TEXT = (DATA / "nccl_tests_all_gather_4rank.txt").read_text()
AG_ROWS = [ln for ln in AG_TEXT.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]

def parse(path: Path, tmp: Path) -> tuple[nccl_tests.NcclTestsResult, list[dict[str, Any]]]:
    sink = SourceSink(tmp / "run", "k")
    res = nccl_tests.parse(path, sink)
    sink.close()
    table = pq.read_table(tmp / "run" / "sources" / "k" / "microbench.parquet")
    assert not schema.validate("microbench", schema.conform("microbench", table))
    assert res.stats.balanced
    return res, table.to_pylist()


def write(tmp: Path, body: str, name: str = "out.log") -> Path:
    p = tmp / name
    p.write_text(body)
    return p


def ar_output() -> str:
    return AR_TEXT


# -- the real file ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_file() -> Path:
    path = REAL / "all_reduce_perf_2node_16xH100.txt"
    if not path.is_file():
        pytest.skip(f"real traces not present at {REAL}")
    return path.resolve()


def test_real_rows_counted_independently(real_file: Path, tmp_path: Path) -> None:
    lines = real_file.read_text().splitlines()
    expected_rows = [ln for ln in lines if re.match(r"^\s*\d+\s+\d+\s+\w+\s+\w+\s+-?\d+(\s+\S+){8}\s*$", ln)]
    rank_lines = [ln for ln in lines if re.search(r"Rank\s+\d+\s+Group", ln)]
    hosts = {re.search(r" on\s+(\S+)", ln).group(1) for ln in rank_lines}  # type: ignore[union-attr]
    assert detect_format(real_file) == "nccl_tests"
    res, rows = parse(real_file, tmp_path)
    assert len(rows) == len(expected_rows) == 31
    assert res.stats.stored == len(expected_rows)
    assert res.stats.read == sum(1 for ln in lines if ln.strip())
    assert {r["nranks"] for r in rows} == {len(rank_lines)} == {16}
    assert {r["hosts"] for r in rows} == {len(hosts)} == {2}
    assert {r["ranks_per_host"] for r in rows} == {8}
    assert {r["test"] for r in rows} == {"all_reduce_perf"}
    assert {r["op"] for r in rows} == {"all_reduce"}
    assert [r["size_bytes"] for r in rows] == [int(ln.split()[0]) for ln in expected_rows]
    assert rows[0]["devices"] == ["NVIDIA H100 80GB HBM3"] * 16


def test_real_8gib_row_matches_the_bus_bandwidth_formula(real_file: Path, tmp_path: Path) -> None:
    _, rows = parse(real_file, tmp_path)
    big = rows[-1]
    assert big["size_bytes"] == 8 * 2**30 and big["count"] == 2 * 2**30
    assert big["oop_time_us"] == 47535 and big["ip_time_us"] == 47743
    algbw = big["size_bytes"] / 1e9 / (big["oop_time_us"] / 1e6)
    assert big["oop_algbw"] == pytest.approx(algbw, abs=0.01)
    n = big["nranks"]
    assert big["oop_busbw"] == pytest.approx(algbw * 2 * (n - 1) / n, abs=0.02)
    assert (big["oop_wrong"], big["ip_wrong"]) == (0, 0)


def test_real_sendrecv_rows_are_op_sendrecv(tmp_path: Path) -> None:
    """nccl-tests' sendrecv_perf is a ring of pairs (rank r sends to r+1, receives from r-1), not
    an unknown op: its rows carry op `sendrecv`, so replay can run them (they were `other`)."""
    path = REAL / "xxrjun_cluster01_N1_G8_cnode3-002_h100_5ops.log"
    if not path.is_file():
        pytest.skip(f"real traces not present at {REAL}")
    lines = path.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if "test starting: sendrecv_perf" in ln)
    end = next(i for i, ln in enumerate(lines) if "test concluded: sendrecv_perf" in ln)
    sizes = [int(ln.split()[0]) for ln in lines[start:end] if re.match(r"^\s*\d+\s+\d+\s+\w+", ln)]
    _, rows = parse(path.resolve(), tmp_path)
    sendrecv = [r for r in rows if r["test"] == "sendrecv_perf"]
    assert [r["size_bytes"] for r in sendrecv] == sizes and len(sizes) == 10
    assert {r["op"] for r in sendrecv} == {"sendrecv"}
    assert "other" not in {r["op"] for r in rows}
    assert {(r["tests_version"], r["nccl_version"]) for r in rows} == {("2.17.8", "2.29.2")}


def test_real_rows_infer_all_reduce_without_a_name(real_file: Path, tmp_path: Path) -> None:
    copy = write(tmp_path, real_file.read_text(), "results.txt")
    res, rows = parse(copy, tmp_path)
    assert {r["test"] for r in rows} == {"all_reduce_perf"}
    assert {r["test_inferred"] for r in rows} == {True}
    assert any("inferred all_reduce_perf" in w for w in res.stats.warnings)


# -- constructed text ---------------------------------------------------------------------------


def test_current_layout_names_test_version_and_ranks(tmp_path: Path) -> None:
    res, rows = parse(write(tmp_path, ar_output()), tmp_path)
    assert len(rows) == 3 and res.runs == 1
    r = rows[2]
    assert (r["test"], r["test_inferred"], r["op"]) == ("all_reduce_perf", False, "all_reduce")
    assert (r["size_bytes"], r["count"], r["dtype"], r["redop"], r["root"]) == (1024, 256, "float", "sum", -1)
    assert (r["nranks"], r["hosts"], r["ranks_per_host"]) == (4, 2, 2)
    assert (r["oop_time_us"], r["oop_busbw"], r["ip_time_us"]) == (24.0, 0.06, 23.8)
    assert (r["nccl_version"], r["iters"], r["warmup_iters"], r["graph"]) == ("2.27.3", 20, 5, 0)
    assert res.stats.skipped == {"header": sum(1 for ln in ar_output().splitlines()
                                                if ln.strip() and ln.lstrip().startswith("#"))}


def test_no_hash_prefixes_launcher_prefixes_and_stray_lines(tmp_path: Path) -> None:
    lines = ar_output().splitlines()
    mangled = []
    for i, ln in enumerate(lines):
        ln = ln[2:] if ln.startswith("# ") else ln
        mangled.append(f"[1,0]<stdout>:{ln}")
        if i == len(lines) - 6:
            mangled.append("node-a:11000:11000 [0] NCCL INFO comm 0x55 rank 0 nranks 4 cudaDev 0 busId 18000 - "
                           "Init COMPLETE")
            mangled.append("warning: something unrelated happened")
    res, rows = parse(write(tmp_path, "\n".join(mangled) + "\n"), tmp_path)
    assert [r["size_bytes"] for r in rows] == [8, 16, 1024]
    assert {r["test"] for r in rows} == {"all_reduce_perf"}
    assert res.stats.skipped.get("not nccl-tests output") == 2


def test_markdown_fences_ansi_and_crlf(tmp_path: Path) -> None:
    body = "Results\n\n```\n" + ar_output().replace("float", "\x1b[32mfloat\x1b[0m", 1) + "```\n"
    res, rows = parse(write(tmp_path, body.replace("\n", "\r\n")), tmp_path)
    assert len(rows) == 3
    assert res.stats.skipped["not nccl-tests output"] == 3


def test_several_runs_in_one_file(tmp_path: Path) -> None:
    body = ("$ mpirun -np 4 ./all_reduce_perf -b 8 -e 1K\n" + AR_TEXT
            + "$ mpirun -np 4 ./all_gather_perf -b 32 -e 1K\n" + AG_TEXT)
    res, rows = parse(write(tmp_path, body), tmp_path)
    assert res.runs == 2
    by_run = {r["run"]: r["test"] for r in rows}
    assert by_run == {0: "all_reduce_perf", 1: "all_gather_perf"}
    ag = [r for r in rows if r["run"] == 1]
    assert [r["ip_wrong"] for r in ag] == [None, None] and [r["oop_wrong"] for r in ag] == [0, 0]
    assert {r["op"] for r in ag} == {"all_gather"} and {r["test_inferred"] for r in ag} == {False}


def test_tables_without_header_infer_the_test(tmp_path: Path) -> None:
    body = "\n".join(AG_ROWS) + "\n"
    res, rows = parse(write(tmp_path, body), tmp_path)
    assert {r["test"] for r in rows} == {"all_gather_perf"}
    assert {r["test_inferred"] for r in rows} == {True}
    assert any("alltoall_perf prints the same" in w for w in res.stats.warnings)


def test_old_layout_without_redop_and_root(tmp_path: Path) -> None:
    body = """\
# nThread 1 nGpus 4 minBytes 8 maxBytes 64 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  2001 on    dgx1 device  0 [0x06] Tesla V100-SXM2-16GB
#   Rank  1 Pid  2001 on    dgx1 device  1 [0x07] Tesla V100-SXM2-16GB
#
#                                     out-of-place                       in-place
#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)             (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
          32             4   float     9.01    0.00    0.00  0e+00     8.80    0.00    0.00  0e+00
          64             8   float     9.20    0.01    0.00  0e+00     9.00    0.01    0.00  0e+00
 Out of bounds values : 0 OK
 Avg bus bandwidth    : 0.001
"""
    _, rows = parse(write(tmp_path, body, "all_gather_perf.log"), tmp_path)
    assert [r["count"] for r in rows] == [4, 8]
    assert {r["redop"] for r in rows} == {None} and {r["root"] for r in rows} == {None}
    assert {r["test"] for r in rows} == {"all_gather_perf"} and {r["test_inferred"] for r in rows} == {False}
    assert (rows[0]["oop_wrong"], rows[0]["nranks"], rows[0]["hosts"]) == (0, 2, 1)


def test_per_iteration_timestamp_cputime_and_in_place_only(tmp_path: Path) -> None:
    body = (DATA / "nccl_tests_broadcast_per_iter.txt").read_text()
    _, rows = parse(write(tmp_path, body), tmp_path)
    a, b = rows
    assert (a["time_kind"], a["oop_time_us"], a["oop_i_p99_us"], a["oop_i_cv_pct"]) == ("cputime", 10.0, 10.9, 2.5)
    assert a["ts_ns"] == 1_777_636_801 * 10**9
    assert (b["oop_time_us"], b["ip_time_us"], b["ip_i_min_us"]) == (None, 10.2, 9.4)
    assert {r["test"] for r in rows} == {"broadcast_perf"} and {r["root"] for r in rows} == {0}


def test_no_rows_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no nccl-tests result rows"):
        header = "".join(ln for ln in AR_TEXT.splitlines(keepends=True) if ln.lstrip().startswith("#"))
        parse(write(tmp_path, header), tmp_path)


@pytest.mark.parametrize(("rows", "test"), [
    ([{"size_bytes": 1024, "count": 256, "dtype": "float", "redop": "sum", "root": -1,
       "oop_algbw": 1.0, "oop_busbw": 1.75}], "all_reduce_perf"),
    ([{"size_bytes": 1024, "count": 32, "dtype": "float", "redop": "sum", "root": -1,
       "oop_algbw": 1.0, "oop_busbw": 0.875}], "reduce_scatter_perf"),
    ([{"size_bytes": 1024, "count": 256, "dtype": "float", "redop": "none", "root": 0,
       "oop_algbw": 1.0, "oop_busbw": 1.0}], "broadcast_perf"),
    ([{"size_bytes": 1024, "count": 256, "dtype": "float", "redop": "sum", "root": 3,
       "oop_algbw": 1.0, "oop_busbw": 1.0}], "reduce_perf"),
    ([{"size_bytes": 1024, "count": 256, "dtype": "float", "redop": "none", "root": -1,
       "oop_algbw": 1.0, "oop_busbw": 1.0}], "sendrecv_perf"),
    ([{"size_bytes": 1024, "count": 32, "dtype": "float", "redop": "none", "root": 2,
       "oop_algbw": 1.0, "oop_busbw": 0.875}], "gather_perf"),
])
def test_inference_rules(rows: list[dict[str, Any]], test: str) -> None:
    assert nccl_tests.infer_test(rows, 8)[0] == test


# -- JSON ---------------------------------------------------------------------------------------


def test_json_report(tmp_path: Path) -> None:
    src = DATA / "nccl_tests_all_gather_2x4.json"
    assert detect_format(src) == "nccl_tests"
    res, rows = parse(src, tmp_path)
    doc = json.loads(src.read_text())
    assert len(rows) == len(doc["results"]) == res.stats.stored == res.stats.read
    r = rows[-1]
    assert (r["test"], r["op"], r["nranks"]) == ("all_gather_perf", "all_gather", 8)
    assert (r["hosts"], r["ranks_per_host"]) == (2, 4)
    assert (r["root"], r["redop"], r["dtype"], r["time_kind"]) == (-1, "none", "float", "time")
    assert r["oop_time_us"] == doc["results"][-1]["out_of_place"]["time"]
    assert r["nccl_version"] == "2.27.3" and r["devices"] == ["NVIDIA A100-SXM4-80GB"] * 8
    assert r["host_names"] == [d["hostname"] for d in sorted(doc["config"]["devices"], key=lambda d: d["rank"])]


def test_json_report_without_devices_infers_the_rank_count(tmp_path: Path) -> None:
    doc = json.loads((DATA / "nccl_tests_all_gather_2x4.json").read_text())
    del doc["config"]["devices"]
    res, rows = parse(write(tmp_path, json.dumps(doc), "nodev.json"), tmp_path)
    assert {r["nranks"] for r in rows} == {8}
    assert any("no devices in the report; 8 ranks inferred from size / count" in w for w in res.stats.warnings)


def test_json_cut_short_is_salvaged(tmp_path: Path) -> None:
    src = (DATA / "nccl_tests_all_gather_2x4.json").read_bytes()
    cut = src[: src.rfind(b'{"size"') + 40]
    res, rows = parse(write(tmp_path, cut.decode(), "cut.json"), tmp_path)
    assert len(rows) == 2 and res.stats.skipped == {}
    assert any("salvaged 2 results" in w for w in res.stats.warnings)
    assert {r["test"] for r in rows} == {"all_gather_perf"}


@pytest.mark.parametrize("head", [
    b"# nThread 1 nGpus 1 minBytes 8 maxBytes 128 step: 2(factor)",
    b"#       size         count      type   redop    root     time",
    b'{"version":3,"start_time":"x","args":[],"results":[{"size":8,"out_of_place":{"alg_bw":1}}]}',
])
def test_detect(head: bytes) -> None:
    assert detect_bytes(head) == "nccl_tests"


# -- robustness ---------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(ar_output().splitlines() + AG_ROWS + ["", "garbage 1 2 float", "\x00\xff"]),
                max_size=40),
       st.integers(min_value=0, max_value=60), st.data())
def test_mangled_lines_never_raise_and_balance(lines: list[str], cut: int, data: st.DataObject) -> None:
    mangled = [ln[:cut] if data.draw(st.booleans()) else ln for ln in lines]
    reader = nccl_tests.TableReader("x")
    stats = nccl_tests.SourceStats()
    for ln in mangled:
        if ln.strip():
            nccl_tests._count(stats, reader.feed(ln))
    rows = reader.close()
    assert stats.balanced and stats.stored == len(rows)
    assert stats.read == sum(1 for ln in mangled if ln.strip())


def test_ingest_fills_microbench(real_file: Path, tmp_path: Path) -> None:
    from tracekit.ingest import ingest
    from tracekit.store import Run

    report = ingest([real_file, DATA / "nccl_tests_all_gather_2x4.json"], tmp_path / "run")
    assert [s.format for s in report.sources] == ["nccl_tests", "nccl_tests"]
    table = Run(tmp_path / "run").table("microbench")
    assert table.num_rows == 31 + 3
    assert sorted(set(table.column("test").to_pylist())) == ["all_gather_perf", "all_reduce_perf"]
    assert report.ranks == []


# -- outputs pasted without their device lines (READMEs, docs, chat) ----------------------------


def _without_devices(text: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if "Rank " not in ln and "Using devices" not in ln) + "\n"


@pytest.mark.parametrize(("text", "nranks", "how"), [
    (AR_TEXT, None, "too coarse"),  # its algbw is 0.04 GB/s at most: two decimals cannot tell
    (AG_TEXT, 4, "size / count"),
], ids=["all_reduce", "all_gather"])
def test_rank_count_inferred_without_device_lines(tmp_path: Path, text: str, nranks: int | None, how: str) -> None:
    res, rows = parse(write(tmp_path, _without_devices(text)), tmp_path)
    assert {r["nranks"] for r in rows} == {nranks}
    assert any("no device lines" in w and how in w for w in res.stats.warnings), res.stats.warnings


def test_rank_count_beyond_the_world_size_is_no_count(tmp_path: Path) -> None:
    """size / count of 2^29 ranks (a huge size; found by the round-three campaign's huge_number
    class): `tracekit info` built a list of that many rank ids (17 GB, OOM-killed). No count."""
    text = _without_devices(AG_TEXT).replace("          32             2     float",
                                              "  4294967296             2     float")
    text = text.replace("        1024            64     float", "137438953472            64     float")
    res, rows = parse(write(tmp_path, text), tmp_path)
    assert {r["nranks"] for r in rows} == {None}
    assert any("536,870,912 ranks, beyond 262,144" in w for w in res.stats.warnings), res.stats.warnings


def test_bandwidths_and_times_beyond_any_hardware_read_as_missing(tmp_path: Path) -> None:
    """A busbw of 1e30 GB/s or a time of 1e30 us (a corrupt or hostile row) was stored, printed and
    scored as a measurement; it is read as missing, counted in one warning."""
    text = AR_TEXT.replace("   24.00    0.04    0.06      0    23.80", "   1e30    0.04    2e30      0    23.80")
    assert text != AR_TEXT
    res, rows = parse(write(tmp_path, text), tmp_path)
    r = rows[2]
    assert (r["oop_time_us"], r["oop_algbw"], r["oop_busbw"], r["ip_time_us"]) == (None, 0.04, None, 23.8)
    assert any(w.startswith("2 bandwidth or time values beyond any hardware") for w in res.stats.warnings), \
        res.stats.warnings
    clean = tmp_path / "clean"
    clean.mkdir()
    _, rows = parse(write(clean, AR_TEXT), clean)
    assert rows[2]["oop_busbw"] == 0.06


def test_ranks_of_a_received_run_are_not_sized_by_an_absurd_count(tmp_path: Path) -> None:
    """A received run's microbench table with a rank count past MAX_WORLD_SIZE: `info` names no
    ranks from it and replay refuses the row, rather than allocating per rank."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tracekit import workflows
    from tracekit.ingest import ingest
    from tracekit.replay.microbench import not_replayable

    assert not ingest([DATA / "nccl_tests_all_gather_4rank.txt"], tmp_path / "run").failed
    path = tmp_path / "run" / "microbench.parquet"
    table = pq.read_table(path)
    table = table.set_column(table.schema.get_field_index("nranks"), "nranks",
                             pa.array([10_000_000] * table.num_rows, table.schema.field("nranks").type))
    pq.write_table(table, path)
    found = workflows.info(tmp_path / "run")
    assert found.ranks == [] and found.ranks_from == "nccl-tests header"
    assert not_replayable(table.to_pylist()[0]) == "its rank count 10000000 is beyond 262,144"


def test_real_output_without_device_lines_gives_its_rank_count(tmp_path: Path, real_file: Path) -> None:
    res, rows = parse(write(tmp_path, _without_devices(real_file.read_text())), tmp_path)
    assert {r["nranks"] for r in rows} == {16}
    assert any("16 ranks inferred from busbw / algbw" in w for w in res.stats.warnings)


@given(st.integers(2, 512), st.floats(0.01, 2000.0), st.sampled_from(["all_reduce", "all_gather"]),
       st.lists(st.floats(0.5, 1.0), min_size=1, max_size=6))
@settings(max_examples=300, deadline=None)
def test_rank_count_from_printed_bandwidths_is_right_or_unknown(n: int, top: float, op: str,
                                                                 scales: list[float]) -> None:
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    rows = [{"oop_algbw": round(top * s, 2), "oop_busbw": round(top * s * factor, 2)} for s in scales]
    got, why = nccl_tests.infer_nranks(rows, op)
    assert got in (None, n), why


def test_rank_count_of_sendrecv_cannot_be_told() -> None:
    got, why = nccl_tests.infer_nranks([{"oop_algbw": 100.0, "oop_busbw": 100.0}], "sendrecv")
    assert got is None and "whatever the rank count" in why
