"""Every real Kineto trace in ../shared/real_traces/kineto ingests with the counts an independent
json.load scan predicts, plus era-specific checks (args, groups, ROCm, ns time, 2021 names)."""

from __future__ import annotations

import bisect
import gzip
import json
import math
import re
from decimal import Decimal
from pathlib import Path

import pyarrow.compute as pc
import pytest
from kineto_helpers import REAL, parse_into

from tracekit import schema
from tracekit.errors import InputError
from tracekit.parsers import kineto

COMM = re.compile(r"nccl(Dev)?Kernel_|multimem_all_reduce|dpsk::ep::|cross_device_reduce")
LAUNCH_CATS = ("cuda_runtime", "Runtime", "cuda_driver")
NEEDS_RANK = {"distributed_info_not_found.json.gz", "rank_not_found.json.gz",
              "mi250_minitoy_train_ROCm6_2_kineto.json.gz"}

# file name -> (rank, stored events, collectives); the scan below must agree with these.
EXPECTED = {
    "df_index_resolver.json.gz": (1, 123379, 2020),
    "distributed_info_not_found.json.gz": (5, 2467, 6),
    "event_sync_trace.json.gz": (0, 57, 0),
    "inference_rank_1.json.gz": (1, 13, 0),
    "mi250_minitoy_train_ROCm6_2_kineto.json.gz": (5, 113, 0),
    "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": (34, 16, 10),
    "rank_not_found.json.gz": (5, 2467, 6),
    "nccl_data.json.gz": (0, 26933, 21),
    "rank0.json.gz": (0, 67217, 90),
    "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz": (0, 45420, 35),
    "control.json.gz": (3, 74937, 60),
    "test.json.gz": (1, 68324, 64),
    "sampled_rank-0.json.gz": (0, 4811, 10),
    "sampled_rank-1.json.gz": (1, 4676, 10),
    "worker0_step_12.1694128201545.pt.trace.json": (0, 2460, 8),
    "worker1_step_12.1694128201556.pt.trace.json": (1, 2527, 8),
    "worker2_step_12.1694128201554.pt.trace.json": (2, 2449, 8),
    "worker3_step_12.1694128201557.pt.trace.json": (3, 2552, 8),
    "worker4_step_12.1694128201547.pt.trace.json": (4, 2470, 8),
    "worker5_step_12.1694128201549.pt.trace.json": (5, 2440, 8),
    "worker6_step_12.1694128201553.pt.trace.json": (6, 2451, 8),
    "worker7_step_12.1694128201553.pt.trace.json": (7, 2440, 8),
    "eager_trace.json.gz": (0, 22355, 74),
    "resnet_act_checkpoint.json.gz": (0, 49208, 17),
}


def _files() -> list[Path]:
    if not REAL.is_dir():
        return []
    return sorted(p for p in REAL.rglob("*.json*"))


def load(path: Path, **kw) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        return json.load(fh, **kw)


def scan(doc: dict) -> dict:
    """Independent expectations from a plain json.load of the whole file."""
    events = doc["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X"]
    kernels = [e for e in xs if e.get("cat") in ("kernel", "Kernel") and COMM.search(e["name"])]
    corrs = {e["args"].get("correlation") for e in kernels}
    launches = [e for e in xs if e.get("cat") in LAUNCH_CATS
                and e.get("args", {}).get("correlation") in corrs]
    anns = [e for e in xs if e.get("cat") == "user_annotation" and re.match(r"(nccl|gloo):", e["name"])]
    by_tid: dict = {}
    for la in launches:
        by_tid.setdefault(la["tid"], []).append(la["ts"])
    for v in by_tid.values():
        v.sort()

    def has_launch(a: dict) -> bool:
        ts = by_tid.get(a["tid"], [])
        i = bisect.bisect_left(ts, a["ts"])
        return i < len(ts) and ts[i] <= a["ts"] + a["dur"]

    lonely = [a for a in anns if not has_launch(a)]
    dist = doc.get("distributedInfo") or {}
    return {"read": len(events), "x": len(xs), "kernels": len(kernels),
            "collectives": len(kernels) + len(lonely), "rank": dist.get("rank")}


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.name)
def test_every_real_trace_ingests(path: Path, tmp_path: Path) -> None:
    doc = scan(load(path))
    rank = None if path.name not in NEEDS_RANK else 5
    p = parse_into(path, tmp_path, rank=rank)
    stats = p.result.stats
    exp_rank, exp_stored, exp_coll = EXPECTED[path.name]
    assert stats.balanced
    assert stats.read == doc["read"]
    assert stats.stored == doc["x"] == exp_stored == p.events.num_rows
    assert p.result.rank == exp_rank == (doc["rank"] if doc["rank"] is not None else 5)
    assert p.collectives.num_rows == doc["collectives"] == exp_coll
    kinds = p.events.column("kind").to_pylist()
    assert kinds.count("comm") == doc["kernels"]
    for name in ("events", "collectives", "groups", "ranks"):
        table = getattr(p, name)
        if table.num_rows:
            assert schema.validate(name, schema.conform(name, table)) == []
    assert set(p.events.column("rank").to_pylist()) == {exp_rank}
    if p.collectives.num_rows:
        ids = p.collectives.column("coll_id").to_pylist()
        assert len(set(ids)) == len(ids)
        assert all(i >> 32 == exp_rank for i in ids)
        linked = {c for c in p.events.column("coll_id").to_pylist() if c is not None}
        assert linked <= set(ids)
        assert set(p.collectives.column("state").to_pylist()) == {"completed"}
        assert set(p.collectives.column("source").to_pylist()) == {"kineto"}


@pytest.mark.parametrize("name", sorted(NEEDS_RANK))
def test_missing_rank_needs_option(real: Path, tmp_path: Path, name: str) -> None:
    path = next(real.rglob(name))
    with pytest.raises(InputError, match="--rank") as err:
        parse_into(path, tmp_path / "a")
    assert name in str(err.value)
    assert parse_into(path, tmp_path / "b", rank=3).result.rank == 3


def test_dlrm_ops_and_steps(real: Path, tmp_path: Path) -> None:
    p = parse_into(next(real.glob("param_dlrm_kineto_8rank/worker0_*")), tmp_path)
    c = p.collectives.to_pydict()
    assert c["op"] == ["all_to_all"] * 4 + ["all_reduce", "all_to_all", "all_reduce", "all_reduce"]
    assert c["seq"] == list(range(8)) and not any(c["seq_explicit"])
    assert set(c["group"]) == {"0"} and set(c["nranks"]) == {8}
    assert set(c["step"]) == {10}
    assert all(n.startswith("ncclKernel_") for n in c["name"])
    kernels = p.events.filter(pc.equal(p.events.column("kind"), "comm"))
    assert kernels.column("step").to_pylist() == [10] * 8
    assert kernels.column("coll_id").null_count == 0
    g = p.groups.to_pylist()
    assert g[0]["group"] == "0" and g[0]["ranks"] == list(range(8)) and g[0]["size"] == 8
    doc = load(next(real.glob("param_dlrm_kineto_8rank/worker0_*")))
    anns = sorted((e for e in doc["traceEvents"] if e.get("name") == "nccl:all_reduce"),
                  key=lambda e: e["ts"])
    want = [math.prod(e["args"]["Input Dims"][0]) * 4 for e in anns]
    got = [b for b, op in zip(c["in_bytes"], c["op"], strict=True) if op == "all_reduce"]
    assert got == want and want[0] == 394241 * 4


def test_nccl_data_collective_args_and_pg_config(real: Path, tmp_path: Path) -> None:
    path = real / "hta_nccl_parser_config" / "nccl_data.json.gz"
    p = parse_into(path, tmp_path)
    doc = load(path)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and COMM.search(e["name"])]
    kernels.sort(key=lambda e: e["ts"])
    c = p.collectives.to_pylist()
    assert [r["op"] for r in c] == [
        "broadcast" if e["args"]["Collective name"] == "broadcast" else "all_reduce" for e in kernels]
    width = {"Float": 4, "Long": 8}
    for row, k in zip(c, kernels, strict=True):
        a = k["args"]
        assert row["in_bytes"] == a["In msg nelems"] * width[a["dtype"]]
        assert row["out_bytes"] == a["Out msg nelems"] * width[a["dtype"]]
        assert row["dtype"] == a["dtype"] and row["nranks"] == a["Group size"] == 2
        assert row["group"] == "0" and row["in_splits"] is None
        assert row["dur_ns"] == round(Decimal(str(k["dur"])) * 1000)
    assert [r["seq"] for r in c] == list(range(21))
    assert p.groups.to_pylist() == [{"group": "0", "desc": "default_pg", "backend": "nccl",
                                     "ranks": [0, 1], "size": 2, "dims": [],
                                     "ranks_complete": True}]
    r = p.ranks.to_pylist()[0]
    assert r["nccl_version"] == "2.17.1" and r["world_size"] == 2 and r["backend"] == "nccl"
    assert r["device_name"] == "NVIDIA A100-PG509-200" and r["local_device"] == 0


def test_b200_dev_kernels_and_multimem(real: Path, tmp_path: Path) -> None:
    p = parse_into(real / "tracelens_b200_eager_rank0of8" / "eager_trace.json.gz", tmp_path)
    c = p.collectives.to_pylist()
    nccl = [r for r in c if r["name"].startswith("ncclDevKernel_AllGather")]
    assert len(nccl) == 1
    ag = nccl[0]
    assert (ag["op"], ag["group"], ag["nranks"], ag["dtype"]) == ("all_gather", "3", 8, "BFloat16")
    assert (ag["in_bytes"], ag["out_bytes"]) == (25136 * 2, 201088 * 2)
    mm = [r for r in c if "multimem_all_reduce_kernel" in r["name"]]
    assert len(mm) == 73 and {r["op"] for r in mm} == {"all_reduce"}
    groups = {g["group"]: g for g in p.groups.to_pylist()}
    assert len(groups) == 15 and groups["3"]["ranks"] == list(range(8))
    assert p.ranks.column("device_name").to_pylist() == ["NVIDIA B200"]


def test_mi300_rccl_partial_args(real: Path, tmp_path: Path) -> None:
    p = parse_into(real / "tracelens_mi300_resnet_rank0of8" / "resnet_act_checkpoint.json.gz", tmp_path)
    c = p.collectives.to_pylist()
    assert len(c) == 17 and all(r["name"].startswith("ncclDevKernel_Generic") for r in c)
    with_args = [r for r in c if r["dtype"] is not None]
    assert len(with_args) == 12
    assert {r["op"] for r in with_args} == {"all_reduce", "broadcast"}
    assert {r["op"] for r in c if r["dtype"] is None} == {"other"}
    assert p.ranks.column("device_name").to_pylist() == ["AMD Instinct MI300X"]
    assert p.ranks.column("nccl_version").to_pylist() == ["2.22.3"]


def test_rank34_pg_config_300_ranks(real: Path, tmp_path: Path) -> None:
    p = parse_into(next(real.rglob("rank-34.*")), tmp_path)
    groups = {g["group"]: g for g in p.groups.to_pylist()}
    assert groups["0"]["ranks"] == list(range(300)) and groups["0"]["ranks_complete"]
    assert groups["0"]["backend"] == "gloo" and groups["0"]["desc"] == "default_pg"
    c = p.collectives.to_pydict()
    assert c["op"] == ["all_reduce"] * 10 and set(c["name"]) == {"gloo:all_reduce"}
    assert p.ranks.column("world_size").to_pylist() == [300]


def test_ns_resolution_times_exact(real: Path, tmp_path: Path) -> None:
    path = next(real.glob("hta_ns_resolution_trace/*.gz"))
    p = parse_into(path, tmp_path)
    doc = load(path, parse_float=Decimal)
    want = [int(Decimal(e["ts"]) * 1000) for e in doc["traceEvents"] if e.get("ph") == "X"]
    got = p.events.column("ts_ns").to_pylist()
    assert got == want
    assert any(t % 1000 for t in got)
    assert p.collectives.num_rows == 35


def test_relative_times_use_base(real: Path, tmp_path: Path) -> None:
    path = real / "hta_edge_cases" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    p = parse_into(path, tmp_path, rank=0)
    doc = load(path, parse_float=Decimal)
    base = doc["baseTimeNanoseconds"]
    want = [base + int(Decimal(e["ts"]) * 1000) for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert p.events.column("ts_ns").to_pylist() == want
    assert p.ranks.column("device_name").to_pylist() == ["AMD Radeon Graphics"]


def test_2021_category_names(real: Path, tmp_path: Path) -> None:
    p = parse_into(real / "hta_edge_cases" / "inference_rank_1.json.gz", tmp_path)
    rows = p.events.to_pylist()
    kinds = {(r["cat"], r["kind"]) for r in rows}
    assert ("Kernel", "compute") in kinds and ("Runtime", "runtime") in kinds
    assert all(r["lane"].startswith("gpu") for r in rows if r["cat"] == "Kernel")
    assert p.result.stats.skipped["flow"] == 8


def test_cuda_sync_edges(real: Path, tmp_path: Path) -> None:
    p = parse_into(real / "hta_edge_cases" / "event_sync_trace.json.gz", tmp_path)
    sync = [r for r in p.events.to_pylist() if r["kind"] == "sync"]
    assert len(sync) == 5
    swe = next(r for r in sync if r["name"] == "Stream Wait Event")
    assert (swe["lane"], swe["sync_lane"], swe["sync_correlation"]) == ("gpu0/stream24", "gpu0/stream20", 1385)
    assert sum(r["sync_lane"] is not None for r in sync) == 3


def test_gpu_steps_follow_launch(real: Path, tmp_path: Path) -> None:
    p = parse_into(real / "hta_nccl_parser_config" / "nccl_data.json.gz", tmp_path)
    ev = p.events.to_pylist()
    launch_step = {r["correlation"]: r["step"] for r in ev if r["kind"] == "runtime"}
    gpu = [r for r in ev if r["lane"].startswith("gpu") and r["correlation"] in launch_step]
    assert gpu and all(r["step"] == launch_step[r["correlation"]] for r in gpu)
    assert p.result.steps == [4, 5, 6]


def test_small_chunks_same_result(real: Path, tmp_path: Path) -> None:
    path = next(real.glob("param_dlrm_kineto_8rank/worker3_*"))
    a = parse_into(path, tmp_path / "a")
    b = parse_into(path, tmp_path / "b", chunk_size=4099)
    assert a.events.to_pylist() == b.events.to_pylist()
    assert a.collectives.to_pylist() == b.collectives.to_pylist()


def test_comm_patterns_option(real: Path, tmp_path: Path) -> None:
    path = real / "tracelens_b200_eager_rank0of8" / "eager_trace.json.gz"
    p = parse_into(path, tmp_path, comm_patterns=[r"^ncclDevKernel_"])
    assert p.collectives.num_rows == 1
    assert kineto.compile_patterns([]).search("ncclKernel_AllReduce") is None


def test_kernel_names_give_the_algorithm(real: Path, tmp_path: Path) -> None:
    """NCCL 2.17 (nccl_data) and the DLRM traces name the algorithm of each collective kernel; a
    2.19+ RING-named AllGather (B200) only rules out tree; SendRecv and RCCL's Generic say nothing;
    no kernel name gives the protocol."""
    p = parse_into(real / "hta_nccl_parser_config" / "nccl_data.json.gz", tmp_path / "a")
    c = p.collectives.to_pydict()
    assert set(c["algo"]) == {"RING"} and len(c["algo"]) == 21 and set(c["proto"]) == {None}
    p = parse_into(next(real.glob("param_dlrm_kineto_8rank/worker0_*")), tmp_path / "b")
    c = p.collectives.to_pydict()
    assert {(op, a) for op, a in zip(c["op"], c["algo"], strict=True)} == {("all_reduce", "RING"),
                                                                            ("all_to_all", None)}
    p = parse_into(real / "tracelens_b200_eager_rank0of8" / "eager_trace.json.gz", tmp_path / "c")
    ag = [r for r in p.collectives.to_pylist() if r["name"].startswith("ncclDevKernel_AllGather")]
    assert [r["algo"] for r in ag] == ["RING|COLLNET_DIRECT|NVLS|PAT"]
    assert {r["algo"] for r in p.collectives.to_pylist() if "multimem" in r["name"]} == {None}
    p = parse_into(real / "tracelens_mi300_resnet_rank0of8" / "resnet_act_checkpoint.json.gz", tmp_path / "d")
    assert set(p.collectives.column("algo").to_pylist()) == {None}
