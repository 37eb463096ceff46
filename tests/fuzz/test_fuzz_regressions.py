"""Every failure the fuzzers found, as a regression test (minimal inputs built here)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import fuzzing
import pytest

from tracekit.errors import InputError

MODULES = fuzzing.parsers()


def _event(**over) -> dict:
    e = {"name": "sub1", "timestamp": 200, "tags": {"source": "leaf1:6030", "interface_name": "Ethernet1"},
         "values": {"/interfaces/interface/state/counters/in-octets": 100}}
    e.update(over)
    return e


def _run(fmt: str, data: bytes, tmp_path: Path, name: str = "x.json") -> fuzzing.Outcome:
    out = fuzzing.run_case(fmt, MODULES[fmt], data, False, tmp_path / "w", name=name)
    assert out.kind in ("ok", "salvage", "error"), f"{out.signature}\n{out.detail}"
    return out


def test_gnmic_deeply_nested_json(tmp_path: Path) -> None:
    """RecursionError@gnmic.py:_objects"""
    deep = "[" * 50_000 + "]" * 50_000
    data = (json.dumps([_event(), _event(timestamp=300)]) + "\n" + deep + "\n" + json.dumps(_event(timestamp=400)))
    _run("gnmic", data.encode(), tmp_path)


def test_gnmic_lone_surrogate_in_a_name(tmp_path: Path) -> None:
    """UnicodeEncodeError@schema.py:_as_array (a JSON "\\ud800" escape in a port name)"""
    ev = _event()
    ev["tags"]["interface_name"] = "Eth\ud800"
    data = json.dumps([ev, _event(timestamp=300)]).encode()
    out = _run("gnmic", data, tmp_path)
    assert out.kind != "error"


@pytest.mark.parametrize("ts", [2**62 + 1, 10**30, "9" * 30, -(2**63)])
def test_gnmic_timestamp_out_of_range(tmp_path: Path, ts) -> None:
    """range: ts_ns out of range (stored as is) and OverflowError@gnmic.py:_store"""
    data = json.dumps([_event(timestamp=ts), _event(timestamp=300)]).encode()
    _run("gnmic", data, tmp_path)


def test_gnmic_value_beyond_float(tmp_path: Path) -> None:
    """OverflowError@gnmic.py:_store"""
    data = json.dumps([_event(values={"/interfaces/interface/state/counters/in-octets": 10**400}),
                       _event(timestamp=300)]).encode()
    _run("gnmic", data, tmp_path)


def test_ufm_value_beyond_float(tmp_path: Path) -> None:
    """OverflowError@ufm_telemetry.py:_number"""
    seeds = fuzzing.cached_seeds()["ufm_telemetry"]
    if not seeds or seeds[0].name == "builtin":
        pytest.skip("no UFM seed")
    doc = json.loads(seeds[0].data)
    text = json.dumps(doc)
    # replace the first number value with one beyond float range
    import re

    m = re.search(r'": (\d+)', text)
    assert m
    data = (text[:m.start(1)] + "1" + "0" * 400 + text[m.end(1):]).encode()
    _run("ufm_telemetry", data, tmp_path, name="ufm.json")


def test_link_map_bad_yaml_is_one_line(tmp_path: Path) -> None:
    """multiline_error (a YAML parser message spanning lines)"""
    data = b"links:\n  - {host: node7, device: mlx5_0, port:: 1}\n peer_port: 17, gbps: 400}\n"
    out = _run("link_map", data, tmp_path, name="map.yaml")
    assert out.kind == "error" and "line" in out.detail


def test_link_map_csv_error(tmp_path: Path) -> None:
    """Error@link_map.py (csv.Error: a field larger than the field limit, or a NUL)"""
    data = b"host,device,port,link\nnode7,mlx5_0,1,\"" + b"x" * 200_000 + b"\n"
    _run("link_map", data, tmp_path, name="map.csv")


def test_input_error_is_always_one_line() -> None:
    assert "\n" not in str(InputError("f", "a\nb\n  c"))


@pytest.mark.parametrize("line", [
    "CA 9999999999999999999 1 0x38 4x HDR - SW 1 79 0x94 ( 'a' - 'b' )",
    "SW 1 99999999999 0x38 4x HDR - CA 1 1 0x94 ( 'a' - 'b' )",
    'Switch 36 "S-0000000000000001" # "leaf" lid 99999999999999999999999',
])
def test_ibnetdiscover_numbers_beyond_range(tmp_path: Path, line: str) -> None:
    """OverflowError@schema.py:_as_array (a lid or port beyond int32)"""
    good = "CA 3 1 0x0002c903000a0b0c 4x HDR - SW 1 7 0x0002c903000d0e0f ( 'node1 mlx5_0' - 'leaf1' )"
    _run("ibnetdiscover", f"{good}\n{line}\n".encode(), tmp_path, name="ibnetdiscover_p_links.txt")


def test_gnmic_deep_nesting_inside_an_object_is_quick(tmp_path: Path) -> None:
    """hang@gnmic (100,000 nested lists inside a tag: json's recursion limit cost seconds)"""
    ev = json.dumps(_event())
    deep = "[" * 100_000 + '"Ethernet1"' + "]" * 100_000
    data = ("[" + ev + ", " + ev.replace('"Ethernet1"', deep) + "]").encode()
    out = fuzzing.run_case("gnmic", MODULES["gnmic"], data, False, tmp_path / "w", name="x.json", timeout=10)
    assert out.kind == "error" and "nested deeper" in out.detail, out


@pytest.mark.parametrize("line", [
    "host:1:1 [7] NCCL INFO Channel 15/0 : 99999999999999999999999999[7] -> 7[7] [receive] via NET/IB/7/GDRDMA",
    "host:1:1 [5] NCCL INFO comm 0x55e5e8d6c970 rank 13 nRanks 16 nNodes 99999999999999999999999999 localRanks 8 "
    "localRank 5 MNNVL 0",
])
def test_nccl_log_numbers_beyond_int64(tmp_path: Path, line: str) -> None:
    """OverflowError@schema.py:_as_array (a channel peer or nNodes beyond int64 in an NCCL log)"""
    head = ("host:1:1 [5] NCCL INFO comm 0x55e5e8d6c970 rank 13 nRanks 16 nNodes 2 localRanks 8 localRank 5 MNNVL 0\n"
            "host:1:1 [5] NCCL INFO Channel 00/0 : 12[5] -> 13[5] via P2P/CUMEM\n")
    _run("nccl_log", (head + line + "\n").encode(), tmp_path, name="node.log")


@pytest.mark.parametrize("body", ["links:\n  - {" + "[" * 100_000 + "]" * 100_000 + "}\n",
                                  "links:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 800))])
def test_link_map_deep_yaml_is_refused_quickly(tmp_path: Path, body: str) -> None:
    """hang@link_map (libyaml recursing on 100,000 nested flow sequences: a segfault in-process)"""
    out = fuzzing.run_case("link_map", MODULES["link_map"], body.encode(), False, tmp_path / "w", name="map.yaml",
                           timeout=20)
    assert out.kind == "error" and "nested deeper" in out.detail, out


@pytest.mark.parametrize("fmt", ["prometheus_json", "nccl_profiler", "nccl_inspector", "ufm_telemetry", "nccl_tests"])
def test_msgspec_recursion_is_a_clean_error(tmp_path: Path, fmt: str) -> None:
    """RecursionError@prometheus_json.py:parse (msgspec raises RecursionError, not DecodeError, on deep JSON)"""
    deep = "[" * 100_000 + "]" * 100_000
    data = ('{"status": "success", "data": {"resultType": "matrix", "result": ' + deep + "}}\n").encode()
    _run(fmt, data, tmp_path, name="x.json")


_NT_RESULT = {"size": 1024, "count": 256, "type": "float", "redop": "sum", "root": -1,
              "out_of_place": {"time": 24.0, "alg_bw": 0.04, "bus_bw": 0.06, "nwrong": 0},
              "in_place": {"time": 23.8, "alg_bw": 0.04, "bus_bw": 0.06, "nwrong": 0}}
_NT_TEXT = (fuzzing.TEST_DATA / "nccl_tests_all_reduce_4rank.txt").read_text()


def test_nccl_tests_json_salvage_stops_at_a_stray_brace(tmp_path: Path) -> None:
    """hang@nccl_tests (found by benchmarks/fuzz.py: a `}` inside `results` of a corrupt report is
    a zero-length value, and the salvage loop stood still on it)"""
    data = ('{"args": ["./all_reduce_perf"], "results": [' + json.dumps(_NT_RESULT) + ', "x": 1}').encode()
    out = fuzzing.run_case("nccl_tests", MODULES["nccl_tests"], data, False, tmp_path / "w", name="x.json",
                           timeout=10)
    assert out.kind == "salvage" and "salvaged 1 results" in out.detail, out


def test_nccl_tests_rank_line_without_a_bracket_is_linear(tmp_path: Path) -> None:
    """hang@nccl_tests (the CI fuzz profile's > 60 s case: a device line repeated on one line with
    no closing `]`, where the rank pattern rescanned the rest of the line from every `Rank`)"""
    line = "#  Rank  0 Group  0 Pid  11000 on node-a device  0 [0000:18:00 " * 20_000
    out = fuzzing.run_case("nccl_tests", MODULES["nccl_tests"], (_NT_TEXT + line + "\n").encode(), False,
                           tmp_path / "w", name="all_reduce_perf.txt", timeout=10)
    assert out.kind in ("ok", "salvage"), out


@pytest.mark.parametrize("over", [{"out_of_place": {"time": 10**400, "alg_bw": 1, "bus_bw": 1, "nwrong": 0}},
                                  {"root": 2**31}, {"root": "-2147483649"}])
def test_nccl_tests_json_numbers_beyond_range(tmp_path: Path, over: dict) -> None:
    """OverflowError@nccl_tests.py:_float (an integer time beyond float) and SchemaError@schema.py:conform
    (a root beyond int32)"""
    doc = {"args": ["./all_reduce_perf"], "results": [{**_NT_RESULT, **over}, _NT_RESULT]}
    _run("nccl_tests", json.dumps(doc).encode(), tmp_path)


@pytest.mark.parametrize("key", ["graph", "iterations", "warmup_iters"])
def test_nccl_tests_json_config_beyond_int32(tmp_path: Path, key: str) -> None:
    """SchemaError@schema.py:conform (config.graph = -2147483649 in a mutated report)"""
    doc = {"args": ["./all_reduce_perf"], "config": {key: -(2**31) - 1}, "results": [_NT_RESULT]}
    _run("nccl_tests", json.dumps(doc).encode(), tmp_path)


@pytest.mark.parametrize("old, new", [("iters: 20", "iters: 99999999999"), ("graph: 0", "graph: 99999999999"),
                                      ("nThread 1", "nThread " + "9" * 5000),
                                      ("Rank  0", "Rank  " + "9" * 5000),
                                      ("     sum      -1", "     sum      99999999999")])
def test_nccl_tests_text_numbers_beyond_range(tmp_path: Path, old: str, new: str) -> None:
    """SchemaError@schema.py:conform (iterations, graph or root beyond int32) and ValueError (a
    5,000-digit rank or thread count: beyond Python's int-from-string limit)"""
    assert old in _NT_TEXT
    _run("nccl_tests", _NT_TEXT.replace(old, new, 1).encode(), tmp_path, name="all_reduce_perf.txt")


def test_nccl_tests_json_salvage_of_a_deep_key(tmp_path: Path) -> None:
    """RecursionError@nccl_tests.py:_salvage (a top-level `devices` nested 100,000 deep: the whole
    report and then the salvaged key raise RecursionError in msgspec)"""
    deep = "[" * 100_000 + "]" * 100_000
    data = ('{"devices": ' + deep + ', "results": [' + json.dumps(_NT_RESULT) + "]}").encode()
    out = _run("nccl_tests", data, tmp_path)
    assert out.kind == "salvage", out


_NL = "host:100:100 [0] NCCL INFO "
_NL_INIT = _NL + ("ncclCommInitRank comm 0x11 rank {rank} nranks {n} cudaDev 0 nvmlDev 0 busId 1000 commId {cid} - "
                  "Init COMPLETE")
_NL_COLL = (_NL + "AllReduce: opCount {op} sendbuff 0x1 recvbuff 0x2 count {count} datatype 7 op 0 root 0 comm 0x11 "
            "[nranks=2] stream 0x3")


def _parse_nccl_log(text: str, tmp_path: Path) -> tuple[Any, dict[str, list[dict]]]:
    import pyarrow as pa

    path = tmp_path / "node.log"
    path.write_text(text)
    sink = fuzzing.MemorySink(tmp_path / "run", "k")
    res = MODULES["nccl_log"].parse(path, sink, rank=None)
    sink.close()
    return res, {k: pa.concat_tables(v).to_pylist() for k, v in sink.tables.items()}


@pytest.mark.parametrize("rank, n, reason", [(0, 999_999_999, "nranks_out_of_range"), (0, 0, "nranks_out_of_range"),
                                             (5, 4, "rank_out_of_range"), (0, "9" * 5000, "nranks_out_of_range")],
                         ids=["huge", "zero", "rank_beyond", "digits"])
def test_nccl_log_communicator_size_out_of_range(tmp_path: Path, rank: int, n, reason: str) -> None:
    """memory: an Init line declaring nranks 999,999,999 sized a rank map by it (22 GB RSS before
    the deadline); nranks beyond 4,300 digits raised ValueError"""
    text = _NL + "NCCL version 2.22.3+cuda12.6\n" + _NL_INIT.format(rank=rank, n=n, cid="0xabc") + "\n"
    res, _ = _parse_nccl_log(text, tmp_path)
    assert res.stats.skipped.get(reason) == 1, res.stats.counts()


def test_nccl_log_rank_maps_have_a_budget(tmp_path: Path, monkeypatch) -> None:
    """memory: thousands of communicators of MAX_WORLD_SIZE ranks each (a mutated log) add up
    their rank maps: beyond the budget a communicator has none, with a warning"""
    monkeypatch.setattr(MODULES["nccl_log"], "MAX_RANK_MAP_ENTRIES", 1000)
    text = "".join(_NL_INIT.format(rank=0, n=600, cid=f"0xab{i}").replace("0x11", f"0x1{i}").replace(
        "host:100:100", f"host:10{i}:10{i}") + "\n" for i in range(3))
    res, tables = _parse_nccl_log(text, tmp_path)
    assert any("without a rank map" in w for w in res.stats.warnings), res.stats.warnings
    assert sum(bool(g["rank_map"]) for g in tables["groups"]) == 1


def test_nccl_log_ring_channel_beyond_int64(tmp_path: Path) -> None:
    """OverflowError@nccl_log.py:_ring_orders (found by benchmarks/fuzz.py; a channel number of 21
    digits; one of 8 digits built a list of 100 million ints)"""
    text = "\n".join([_NL_INIT.format(rank=0, n=2, cid="0xabc"), _NL + "Channel 00/02 :    0   1",
                      _NL + "Channel 999999999999999999999/16 :   0   1", _NL + "Channel 99999999/16 :   0   1"])
    _, tables = _parse_nccl_log(text + "\n", tmp_path)
    assert tables["groups"][0]["ring_orders"] is None


def test_nccl_log_bytes_never_wrap(tmp_path: Path) -> None:
    """silent wrap: count 2**62 of a 4-byte type was stored as 0 bytes (int64 wrap)"""
    text = "\n".join([_NL_INIT.format(rank=0, n=2, cid="0xabc"), _NL_COLL.format(op=0, count=2**62),
                      _NL_COLL.format(op=1, count=8)])
    _, tables = _parse_nccl_log(text + "\n", tmp_path)
    assert [(r["in_bytes"], r["out_bytes"]) for r in tables["collectives"]] == [(None, None), (32, 32)]


@pytest.mark.parametrize("line", [
    "host:100:100 [0] NCCL INFO x" + " NCCL INFO x" * 100_000,  # many marks, none a new record
    "a" * 200_000 + " NCCL INFO x",  # a long run where a host name could start
], ids=["marks", "run"])
def test_nccl_log_long_lines_are_linear(tmp_path: Path, line: str) -> None:
    """hang@nccl_log (found by benchmarks/fuzz.py: a 4 MB line with 400 ` NCCL INFO ` inside one
    message was searched from the last record's start at every mark; a long run of host-name
    characters was tried from every position)"""
    out = fuzzing.run_case("nccl_log", MODULES["nccl_log"], (line + "\n").encode(), False, tmp_path / "w",
                           name="node.log", timeout=10)
    assert out.kind in ("ok", "salvage", "error"), out


@pytest.mark.parametrize("line", [
    "[rank{big}]:host:{big}:100 [0] NCCL INFO x", "host:100:{big} [0] NCCL INFO x",
    _NL + "2 coll channels, 0 collnet channels, 0 nvls channels, {big} p2p channels, 2 p2p channels per peer",
    _NL + "Channel 12/0 : 0[4] -> {big}[3] via P2P/IPC",
    _NL + "NET/IB : Using [0]mlx5_0:1/RoCE [{big}]mlx5_6:1/RoCE [7]mlx5_7:1",
    _NL + "AllReduce: 8 Bytes -> Algo {big} proto 2 time 10.5",
    _NL + "comm 0x11 rank 0 nRanks 2 cudaDev {big} busId 1000 - Destroy COMPLETE",
    "[Rank {big}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout",
], ids=["pid_tid", "tid", "channels", "topology", "net_devices", "tuning", "end", "watchdog"])
def test_nccl_log_numbers_beyond_the_digit_limit(tmp_path: Path, line: str) -> None:
    """ValueError@nccl_log.py:_info, _topology_item, <dictcomp> (found by benchmarks/fuzz.py once a
    mutator wrote 5,000-digit numbers: int() refuses more than 4,300 digits)"""
    text = "\n".join([_NL_INIT.format(rank=0, n=2, cid="0xabc"), line.format(big="9" * 5000),
                      _NL_COLL.format(op=0, count=8)])
    _run("nccl_log", (text + "\n").encode(), tmp_path, name="node.log")


def test_nccl_log_watchdog_search_is_linear(tmp_path: Path) -> None:
    """hang: `[Rank N].*?Watchdog caught` tried from every `[Rank N]` of a line to its end"""
    line = "[Rank 1] " * 50_000
    text = "\n".join([_NL_INIT.format(rank=0, n=2, cid="0xabc"), line, _NL_COLL.format(op=0, count=8)])
    out = fuzzing.run_case("nccl_log", MODULES["nccl_log"], (text + "\n").encode(), False, tmp_path / "w",
                           name="node.log", timeout=10)
    assert out.kind in ("ok", "salvage"), out


def test_gnmic_integer_beyond_the_digit_limit(tmp_path: Path) -> None:
    """ValueError@gnmic.py:_objects (the CI fuzz profile, once mutators wrote 5,000-digit numbers:
    Python's json refuses integers of more than 4,300 digits with a plain ValueError)"""
    bad = json.dumps(_event()).replace("100}", "9" * 5000 + "}")
    data = "\n".join([json.dumps(_event()), bad, json.dumps(_event(timestamp=300))]).encode()
    out = _run("gnmic", data, tmp_path)
    assert out.kind == "salvage", out


@pytest.mark.parametrize("name, body", [
    ("map.csv", "host,device,port,link\nnode7,mlx5_0,1,node7-rail0\n,leaf3,{big},node7-rail0\n"),
    ("map.yaml", "links:\n  - {{host: node7, device: mlx5_0, port: {big}, gbps: 400}}\n"),
    ("map.csv", "host,device,port,link\nnode7,mlx5_0,\u00b2,node7-rail0\n,leaf3,17,node7-rail0\n"),
], ids=["csv", "yaml", "superscript"])
def test_link_map_port_numbers_beyond_int(tmp_path: Path, name: str, body: str) -> None:
    """ValueError@_common.py:normal_port and @link_map.py:_rows (found by benchmarks/fuzz.py: a
    5,000-digit port; `str.isdigit` also says yes to `²`, which `int()` refuses)"""
    _run("link_map", body.format(big="9" * 5000).encode(), tmp_path, name=name)


@pytest.mark.parametrize("text", ["9" * 5000, "\u00b2", "-" + "9" * 30], ids=["digits", "superscript", "30"])
def test_digit_strings_in_json_fields(text: str) -> None:
    """ValueError: `isdigit()` then `int()` on a datatype, an Inspector integer or a profiler
    communicator id (5,000 digits, or `²`)"""
    from tracekit.parsers import _nccl, nccl_inspector, nccl_profiler

    assert _nccl.datatype(text) == (None, None)
    assert nccl_inspector._int(text) is None
    assert not nccl_profiler._digits(text)


_PQ = "# Port extended counters: Lid 1719 port {port}\nPortXmitData:....................{value}\n" \
      "PortRcvData:.....................12279028775751\n"


@pytest.mark.parametrize("port, value", [(1, "9" * 400), (1, "9" * 5000), ("9" * 5000, 36298026860928),
                                         ("9" * 30, 36298026860928)],
                         ids=["value400", "value5000", "port5000", "port30"])
def test_perfquery_numbers_beyond_range(tmp_path: Path, port, value) -> None:
    """OverflowError@perfquery.py:parse (a counter beyond float: found by benchmarks/fuzz.py) and
    ValueError (a 5,000-digit port in a block header)"""
    good = _PQ.format(port=2, value=1000)
    _run("perfquery", (good + _PQ.format(port=port, value=value)).encode(), tmp_path, name="perfquery_x_hca.txt")


@pytest.mark.parametrize("value", ["9" * 26, "9" * 400, "9" * 5000], ids=["26", "400", "5000"])
def test_sysfs_counter_beyond_64_bits(tmp_path: Path, value: str) -> None:
    """OverflowError@sysfs_ib.py:parse (found by benchmarks/fuzz.py: float() of a 400-digit counter)"""
    base = "/sys/class/infiniband/mlx5_0/ports/1/counters_ext/port_xmit_data_64"
    text = f"1700000000\n{base}:1000\n{base.replace('xmit', 'rcv')}:{value}\n1700000010\n{base}:2000\n"
    out = _run("sysfs_ib", text.encode(), tmp_path, name="sysfs.txt")
    assert out.kind == "salvage", out


# -- found by the hostile-class mutators of issue 22 (huge numbers) ----------------------------

NCCL_DATA = Path(__file__).resolve().parents[1] / "parsers" / "nccl_data"


def test_nccl_log_cuda_device_beyond_int32(tmp_path: Path) -> None:
    """SchemaError@schema.py:conform (ranks.local_device: cudaDev 4294967296 in an Init line)"""
    log = fuzzing._made_nccl_log().replace(b"cudaDev 0 ", b"cudaDev 4294967296 ")
    assert b"cudaDev 4294967296" in log
    _run("nccl_log", log, tmp_path, name="node.log")


def test_nccl_profiler_rank_beyond_int32(tmp_path: Path) -> None:
    """SchemaError@schema.py:conform (collectives.rank: a profiler event's Rank of 4294967296)"""
    src = NCCL_DATA / "nccl_profile_8796038454335958273_0.json"
    data = re.sub(rb'"Rank": *\d+', b'"Rank": 4294967296', src.read_bytes())
    seen: dict = {}
    out = fuzzing.run_case("nccl_profiler", MODULES["nccl_profiler"], data, False, tmp_path / "w",
                           name=src.name, on_stats=seen.update)
    assert out.kind in ("ok", "salvage", "error"), f"{out.signature}\n{out.detail}"
    if out.kind != "error":
        assert seen["stats"].skipped.get("rank_out_of_range")


def test_nested_integers_beyond_int64_are_null_not_a_recursion() -> None:
    """RecursionError@schema.py:_as_array (a list column holding an integer beyond int64)"""
    from tracekit import schema

    arr = schema._as_array([[1, 2**70], None, [3]])
    assert arr.to_pylist() == [[1, None], None, [3]]


# -- issue 22, round three: the 10,000-case campaigns (seed 22) -------------------------------------


def test_nccl_tests_busbw_beyond_any_rank_count(tmp_path: Path) -> None:
    """ZeroDivisionError@nccl_tests.py:infer_nranks (a row whose busbw / algbw reaches the op's
    factor limit, which no rank count gives, in a table without its device lines)"""
    data = (b"824 45   float  sum  18 2  26 2. 1.8 38 9223372036854775807.  18446744073709551616   0\nu")
    out = _run("nccl_tests", data, tmp_path, name="all_reduce_perf.txt")
    assert "Traceback" not in out.detail


@pytest.mark.parametrize("data", [
    b"18446744073709551616  92 float sum  -1  8  1.8   3 0\n  Avg bus bandwidth    : ",
    b'{"version":3,"0:00\\ue,"devices":[{"rank":0,"group":0,"piame":"28"},{"rank":1,"group":0,"pid":4101,'
    b'"hos[2J\\r\\u2028":"node-b\\nIN[2J\\r\\u2028","device_info":"M4-80GB"}]},"results":[{"size":1024,'
    b'"028":0.055622,"bus_bw":0.048669,"nwrong":0.0},"in_place":{',
], ids=["size_out_of_range", "device_without_host"])
def test_nccl_tests_info_of_rows_with_nulls(tmp_path: Path, data: bytes) -> None:
    """TypeError@microbench.py (`tracekit info` of an nccl-tests run: a row whose size is null, a
    device with no host name)"""
    out = fuzzing.run_cli(data, False, tmp_path / "cli", name="nccl_tests_all_gather_2x4.json"
                          if data.startswith(b"{") else "all_reduce_perf.txt")
    assert out.kind not in ("crash", "hang"), f"{out.signature}\n{out.detail}"
