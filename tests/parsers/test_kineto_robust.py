"""Truncated, corrupt and hostile inputs; the counting rule on random event lists."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kineto_helpers import parse_into

from tracekit._limits import RANGES
from tracekit.errors import InputError
from tracekit.parsers import kineto

DLRM0 = "param_dlrm_kineto_8rank/worker0_step_12.1694128201545.pt.trace.json"


def _doc(events: list[dict], **top) -> dict:
    return {"schemaVersion": 1, "traceEvents": events, **top}


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _cuts(raw: bytes) -> list[int]:
    inside_string = raw.index(b'"name": "ProfilerStep#10"') + 12
    return [raw.index(b"traceEvents") + 40, inside_string, len(raw) // 3, len(raw) // 2,
            len(raw) - 300, len(raw) - 3]


@pytest.mark.parametrize("i", range(6))
def test_truncated_plain_json_salvages(real: Path, tmp_path: Path, i: int) -> None:
    raw = (real / DLRM0).read_bytes()
    cut = _cuts(raw)[i]
    p = parse_into(_write(tmp_path, "rank0.json", raw[:cut]), tmp_path / "run")
    s = p.result.stats
    assert s.balanced and s.read == s.stored + sum(s.skipped.values())
    assert any("truncated" in w for w in s.warnings)
    full = raw[:cut].count(b'"ph": "X"')
    assert s.stored in (full, full - 1)
    assert p.events.num_rows == s.stored
    if cut < len(raw) - 100:
        assert s.skipped["truncated"] == 1


@pytest.mark.parametrize("frac", [0.05, 0.3, 0.6, 0.97])
def test_truncated_gzip_salvages(real: Path, tmp_path: Path, frac: float) -> None:
    gz = (real / "hta_nccl_parser_config" / "nccl_data.json.gz").read_bytes()
    p = parse_into(_write(tmp_path, "t.json.gz", gz[: int(len(gz) * frac)]), tmp_path / "run")
    s = p.result.stats
    assert s.balanced and s.stored > 0 and s.skipped["truncated"] == 1
    assert any("gzip stream cut short" in w for w in s.warnings)
    assert p.result.rank == 0


def test_truncated_before_rank_uses_option(real: Path, tmp_path: Path) -> None:
    raw = json.dumps(_doc([{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1,
                            "ts": 1, "dur": 1}] * 3, distributedInfo={"rank": 7})).encode()
    cut = raw[: raw.index(b"distributedInfo") - 4]
    path = _write(tmp_path, "trace.json", cut)
    with pytest.raises(InputError, match="no rank"):
        parse_into(path, tmp_path / "a")
    assert parse_into(path, tmp_path / "b", rank=7).result.stats.stored == 3


@pytest.mark.parametrize("data,match", [
    (b"", "not a Kineto trace"),
    (b"hello world", "not a JSON object"),
    (b"[1, 2, 3]", "not a JSON object"),
    (b'{"foo": 1}', "no traceEvents"),
    (b"\x1f\x8b\x08\x00garbage-garbage", "corrupt gzip"),
    (b'{"traceEvents": 5}', "traceEvents"),
])
def test_corrupt_inputs_raise_input_error(tmp_path: Path, data: bytes, match: str) -> None:
    path = _write(tmp_path, "bad.json", data)
    with pytest.raises(InputError, match=match) as err:
        parse_into(path, tmp_path / "run", rank=0)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


HOSTILE = [
    "<script>alert('x')</script>", '<img src=x onerror="alert(1)">', "\x00\x01\x07\x1b[31m",
    'a"}, {"ph": "X", "name": "fake"}, {"x": "', "}]}", "\\", "ünï©ødé 🚀", "x" * 300_000,
    "{{{[[[", "'; DROP TABLE events; --", "__import__('os').system('true')",
]


@pytest.mark.parametrize("chunk", [1 << 22, 777])
def test_hostile_strings_round_trip(tmp_path: Path, chunk: int) -> None:
    events = [{"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 7, "ts": 10 + i, "dur": 1,
               "args": {"correlation": i, "Collective name": n}} for i, n in enumerate(HOSTILE)]
    events.append({"ph": "X", "cat": "user_annotation", "name": "nccl:" + HOSTILE[0], "pid": 1,
                   "tid": 1, "ts": 1, "dur": 100})
    events.append({"ph": "X", "cat": "cpu_op", "name": "big ints", "pid": 1, "tid": 1, "ts": 2,
                   "dur": 1, "args": {"External id": 2**70, "correlation": -(2**70),
                                      "Comms Id": 2**64 - 1}})
    doc = _doc(events, distributedInfo={"rank": 1, "backend": HOSTILE[0]}, hostname=HOSTILE[1])
    p = parse_into(_write(tmp_path, "h.json", json.dumps(doc).encode()), tmp_path / "run",
                   chunk_size=chunk)
    assert p.result.stats.stored == len(events)
    assert p.events.column("name").to_pylist()[: len(HOSTILE)] == HOSTILE
    assert p.ranks.column("host").to_pylist() == [HOSTILE[1]]
    assert p.events.column("external_id").to_pylist()[-1] is None


def test_on_demand_style_metadata_after_events(tmp_path: Path) -> None:
    args = {"Collective name": "allreduce", "In msg nelems": 8, "Out msg nelems": 8, "dtype": "Float",
            "Group size": 4, "Process Group Name": "5", "correlation": 1}
    events = [{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)",
               "pid": 1, "tid": 7, "ts": 10.5, "dur": 1.25, "args": args}]
    raw = json.dumps({"traceEvents": events, "baseTimeNanoseconds": 1_000_000_000,
                      "distributedInfo": {"backend": "nccl", "rank": "3", "world_size": 4,
                                          "nccl_version": "unknown",
                                          "pg_config": "[{'pg_name': '5', 'pg_desc': 'tp', "
                                                       "'pg_size': 4, 'ranks': '[0, 1, 2, 3]'}]"}})
    p = parse_into(_write(tmp_path, "od.json", raw.encode()), tmp_path / "r")
    assert p.result.rank == 3
    assert p.events.column("ts_ns").to_pylist() == [1_000_010_500]
    assert p.events.column("dur_ns").to_pylist() == [1_250]
    assert p.groups.to_pylist()[0]["ranks"] == [0, 1, 2, 3]
    assert p.groups.to_pylist()[0]["desc"] == "tp"
    row = p.collectives.to_pylist()[0]
    assert (row["group"], row["nranks"], row["ts_ns"], row["step"]) == ("5", 4, 1_000_010_500, None)


def test_comms_id_beyond_int64(tmp_path: Path) -> None:
    big = 2**64 - 5
    args = {"Collective name": "allreduce", "In msg nelems": 4, "Out msg nelems": 4, "dtype": "Float",
            "Group size": 2, "Process Group Name": "0", "Process Group Ranks": "[0, 1]",
            "Seq": 41, "Comms Id": big, "correlation": 5, "External id": 9}
    doc = _doc([{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                 "pid": 0, "tid": 7, "ts": 10, "dur": 1, "args": args}],
               distributedInfo={"rank": 0})
    p = parse_into(_write(tmp_path, "c.json", json.dumps(doc).encode()), tmp_path / "run")
    row = p.collectives.to_pylist()[0]
    assert row["comms_id"] == str(big) and row["seq"] == 41 and row["seq_explicit"]
    assert (row["op"], row["in_bytes"], row["nranks"]) == ("all_reduce", 16, 2)


def test_splits_are_rows_converted_to_bytes(tmp_path: Path) -> None:
    args = {"Collective name": "all_to_allv", "In msg nelems": 40, "Out msg nelems": 60,
            "dtype": "BFloat16", "Group size": 4, "In split size": "[1, 2, 3, 4]",
            "Out split size": "[3, 3, 3, 3]", "Process Group Name": "7",
            "Process Group Description": "ep", "Process Group Ranks": "[0, 2, 4, 6]",
            "correlation": 5}
    doc = _doc([{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(x)", "pid": 0,
                 "tid": 7, "ts": 10, "dur": 1, "args": args}], distributedInfo={"rank": 2})
    row = parse_into(_write(tmp_path, "a.json", json.dumps(doc).encode()), tmp_path / "r").collectives.to_pylist()[0]
    assert row["op"] == "all_to_all"
    assert row["in_splits"] == [8, 16, 24, 32] and row["out_splits"] == [30, 30, 30, 30]
    assert (row["in_bytes"], row["out_bytes"], row["group"]) == (80, 120, "7")


def test_truncated_rank_list_marks_incomplete(tmp_path: Path) -> None:
    ranks = "[" + ", ".join(map(str, range(29))) + ", ..., 63]"
    args = {"Collective name": "send", "In msg nelems": 8, "Out msg nelems": 8, "dtype": "Half",
            "Group size": 64, "Process Group Name": "9", "Process Group Ranks": ranks,
            "Dst Rank": 12, "correlation": 1}
    doc = _doc([{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(x)", "pid": 0,
                 "tid": 7, "ts": 10, "dur": 1, "args": args}], distributedInfo={"rank": 2})
    p = parse_into(_write(tmp_path, "s.json", json.dumps(doc).encode()), tmp_path / "r")
    g = p.groups.to_pylist()[0]
    assert g["ranks_complete"] is False and g["ranks"][-1] == 63 and g["size"] == 64
    row = p.collectives.to_pylist()[0]
    assert (row["op"], row["peer"], row["in_bytes"]) == ("send", 12, 16)


def test_record_param_comms_links_kernel_once(tmp_path: Path) -> None:
    a = {"Collective name": "_allgather_base", "In msg nelems": 10, "Out msg nelems": 40,
         "dtype": "Float", "Group size": 4, "Process Group Name": "3", "External id": 100}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "c10d::_allgather_base_", "pid": 1, "tid": 1,
         "ts": 100, "dur": 50, "args": {"External id": 99}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 101,
         "dur": 40, "args": a},
        {"ph": "X", "cat": "user_annotation", "name": "nccl:_all_gather_base", "pid": 1, "tid": 1,
         "ts": 102, "dur": 30},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
         "ts": 110, "dur": 5, "args": {"correlation": 7, "External id": 100}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(x)", "pid": 0,
         "tid": 9, "ts": 200, "dur": 80, "args": {"correlation": 7, "External id": 100}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 300,
         "dur": 2, "args": {"Collective name": "wait"}},
    ]
    p = parse_into(_write(tmp_path, "l.json", json.dumps(_doc(events, distributedInfo={"rank": 3})).encode()),
                   tmp_path / "r")
    rows = p.collectives.to_pylist()
    assert len(rows) == 1
    r = rows[0]
    assert (r["op"], r["ts_ns"], r["dur_ns"], r["in_bytes"], r["out_bytes"]) == ("all_gather", 200_000, 80_000, 40, 160)
    assert r["coll_id"] == 3 * 2**32 and r["lane"] == "gpu0/stream9"
    linked = [e["name"] for e in p.events.to_pylist() if e["coll_id"] == r["coll_id"]]
    assert sorted(linked) == sorted(["c10d::_allgather_base_", "record_param_comms",
                                     "nccl:_all_gather_base", "ncclDevKernel_AllGather_RING_LL(x)"])


def test_deepep_and_custom_patterns(tmp_path: Path) -> None:
    events = [{"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 3, "ts": i, "dur": 1}
              for i, n in enumerate(["void dpsk::ep::internode::dispatch<8>(int*)",
                                     "cross_device_reduce_2stage<float>", "my_allreduce_kernel"])]
    path = _write(tmp_path, "d.json", json.dumps(_doc(events, distributedInfo={"rank": 0})).encode())
    p = parse_into(path, tmp_path / "a")
    c = p.collectives.to_pylist()
    assert [(r["op"], r["dim_hint"]) for r in c] == [("all_to_all", "EP"), ("all_reduce", None)]
    p2 = parse_into(path, tmp_path / "b", comm_patterns=[*kineto.DEFAULT_COMM_PATTERNS, r"^my_allreduce"])
    assert p2.collectives.num_rows == 3


def test_deepep_layout_kernel_is_compute_not_an_all_to_all(tmp_path: Path) -> None:
    """DeepEP's get_dispatch_layout (as in DeepSeek-V3's published train.json) reads the top-k
    expert ids on its own GPU: a compute kernel; dispatch, notify_dispatch and combine communicate."""
    names = ["void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int)",
             "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*)",
             "void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*)",
             "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*)"]
    events = [{"ph": "X", "cat": "kernel", "name": n, "pid": 0, "tid": 3, "ts": 10 * i, "dur": 1}
              for i, n in enumerate(names)]
    path = _write(tmp_path, "d.json", json.dumps(_doc(events, distributedInfo={"rank": 0})).encode())
    p = parse_into(path, tmp_path / "a")
    assert [(r["op"], r["dim_hint"]) for r in p.collectives.to_pylist()] == [("all_to_all", "EP")] * 2
    kinds = {e["name"]: e["kind"] for e in p.events.to_pylist()}
    assert [kinds[n] for n in names] == ["compute", "compute", "comm", "comm"]


def test_ops_and_dtypes_vocabulary() -> None:
    assert kineto.op_from_name("nccl:_all_gather_base") == "all_gather"
    assert kineto.op_from_name("c10d::allreduce_") == "all_reduce"
    assert kineto.op_from_name("allgather_into_tensor_coalesced") == "all_gather"
    assert kineto.op_from_name("_reduce_scatter_base") == "reduce_scatter"
    assert kineto.op_from_name("gloo:all_to_all") == "all_to_all"
    assert kineto.op_from_name("c10d::alltoall_base_") == "all_to_all"
    assert kineto.op_from_name("wait") is None
    assert kineto.kernel_op("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(x)") == ("other", None)
    assert kineto.kernel_op("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(x)")[0] == "reduce_scatter"
    assert [kineto.dtype_bytes(d) for d in ("Float", "BFloat16", "Half", "Double", "Long", "Int",
                                              "Byte", "Char", "Bool", "Float8_e4m3fn", "?")] == \
        [4, 2, 2, 8, 8, 4, 1, 1, 1, 1, None]
    assert kineto.rank_from_name("trace_rank-12.json") == 12
    assert kineto.rank_from_name("worker3.pt.trace.json") == 3
    assert kineto.rank_from_name("job_rank7_x.json.gz") == 7
    assert kineto.rank_from_name("rank_5.json") == 5
    assert kineto.rank_from_name("ranked.json") is None
    assert kineto.parse_rank_list("[0, 1, ..., 28, ..., 99]") == ([0, 1, 28, 99], False)
    assert kineto.parse_rank_list([3, 4]) == ([3, 4], True)


def test_host_from_tensorboard_name(tmp_path: Path) -> None:
    ev = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 4242, "tid": 1, "ts": 1, "dur": 1}]
    raw = json.dumps(_doc(ev, distributedInfo={"rank": 0})).encode()
    good = parse_into(_write(tmp_path, "node-17_4242.1700000000000000000.pt.trace.json", raw), tmp_path / "a")
    assert good.ranks.column("host").to_pylist() == ["node-17"]
    bad = parse_into(_write(tmp_path, "node-17_999.1700000000000000000.pt.trace.json", raw), tmp_path / "b")
    assert bad.ranks.column("host").to_pylist() == [None]


_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "M", "i", "s", "f", "C", "B", "Q"])},
    optional={
        "cat": st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "gpu_memcpy", "weird", "Kernel"]),
        "name": st.text(max_size=12),
        "pid": st.one_of(st.integers(0, 3), st.text(max_size=3)),
        "tid": st.integers(-2, 99),
        "ts": st.one_of(st.integers(0, 2**53), st.floats(0, 1e12, allow_nan=False), st.text(max_size=3)),
        "dur": st.one_of(st.integers(0, 10**6), st.floats(0, 1e6, allow_nan=False)),
        "args": st.fixed_dictionaries({}, optional={"correlation": st.integers(-5, 2**66),
                                                   "External id": st.text(max_size=3)}),
    })


def _number(ts: object) -> bool:
    """A time stamp the parser reads: a JSON number, or a quoted decimal number (`"12"`), whose
    ns value is inside `RANGES["time_ns"]` (an integer µs stamp past 2**62 ns is skipped)."""
    if isinstance(ts, int):
        lo, hi = RANGES["time_ns"]
        return lo <= ts * 1000 <= hi
    if isinstance(ts, float):
        return True
    if not isinstance(ts, str) or not ts.strip() or not ts.isascii():
        return False
    from decimal import Decimal, InvalidOperation

    try:
        return Decimal(ts.strip()).is_finite()
    except InvalidOperation:
        return False


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(_event, max_size=30), gz=st.booleans(), chunk=st.sampled_from([64, 1 << 20]))
@example(events=[{"ph": "X", "cat": "kernel", "ts": 2**62 // 1000}], gz=False, chunk=64)
@example(events=[{"ph": "X", "cat": "kernel", "ts": 2**62 // 1000 + 1}], gz=False, chunk=64)
def test_counting_rule_holds(tmp_path_factory: pytest.TempPathFactory, events: list[dict],
                             gz: bool, chunk: int) -> None:
    tmp = tmp_path_factory.mktemp("h")
    raw = json.dumps(_doc(events, distributedInfo={"rank": 1})).encode()
    path = _write(tmp, "e.json.gz" if gz else "e.json", gzip.compress(raw) if gz else raw)
    p = parse_into(path, tmp / "run", chunk_size=chunk)
    s = p.result.stats
    assert s.read == len(events) == s.stored + sum(s.skipped.values())
    assert p.events.num_rows == s.stored
    known = {"kernel", "cpu_op", "cuda_runtime", "gpu_memcpy", "Kernel"}
    expect = sum(1 for e in events if e["ph"] == "X" and e.get("cat") in known
                 and _number(e.get("ts")) and not isinstance(e.get("name", ""), int))
    assert s.stored == expect


@pytest.mark.parametrize("name, algo", [
    # NCCL 2.8-2.18: one kernel per algorithm, the protocol always LL in the name
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "RING"),
    ("ncclKernel_AllReduce_TREE_LL_Sum_half", "TREE"),
    ("ncclKernel_AllReduce_COLLNET_DIRECT_LL_Sum_float", "COLLNET_DIRECT"),
    ("ncclKernel_AllReduce_NVLS_TREE_LL_Sum_float", "NVLS_TREE"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t", "RING"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", None),
    # NCCL >= 2.19: TREE, or RING for every other algorithm
    ("ncclDevKernel_AllReduce_Sum_f32_TREE_LL(ncclDevKernelArgsStorage<4096ul>)", "TREE"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "RING|COLLNET_DIRECT|COLLNET_CHAIN|NVLS|NVLS_TREE"),
    ("ncclDevKernel_AllGather_RING_LL", "RING|COLLNET_DIRECT|NVLS|PAT"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "RING|COLLNET_DIRECT|NVLS|PAT"),
    ("ncclDevKernel_Broadcast_RING_LL", "RING"),
    ("ncclDevKernel_SendRecv", None),
    ("ncclDevKernel_Generic", None),  # RCCL
    # NCCL 2.4-2.7
    ("ncclAllReduceTreeLLKernel_sum_f32", "TREE"),
    ("ncclAllReduceRingLLKernel_sum_f32", "RING"),
    ("multimem_all_reduce_kernel", None),
])
def test_kernel_name_algorithm(name: str, algo: str | None) -> None:
    assert kineto.kernel_algo(name) == algo


def test_legacy_kernel_names_are_communication() -> None:
    assert kineto.kernel_op("ncclAllReduceRingLLKernel_sum_f32(ncclColl)") == ("all_reduce", None)
    assert kineto.kernel_op("ncclSendRecvKernel_copy_i8(ncclColl)") == ("other", None)
    assert any(re.search(p, "ncclAllGatherRingLLKernel_copy_i8") for p in kineto.DEFAULT_COMM_PATTERNS)
