"""Hand-made inputs for the viz tests: a tiny 4-rank run with a hostile kernel name."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tracekit import schema

HOSTILE = "<img src=x onerror=window.__pwned=1>"
T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def tiny_tables() -> dict[str, pa.Table]:
    """4 ranks on 2 hosts (host b's clock reads 1 ms early), one DP all-reduce that rank 3 joins
    late, one PP send/recv pair, one EP all-to-all, compute kernels (one hostile name)."""
    offsets = [0, 0, MS, MS]
    ev: dict[str, list[Any]] = {k: [] for k in ("rank", "lane", "kind", "name", "ts_ns", "dur_ns", "step",
                                                "coll_id")}
    co: dict[str, list[Any]] = {k: [] for k in ("coll_id", "rank", "group", "seq", "op", "in_bytes", "out_bytes",
                                                "nranks", "peer", "in_splits", "ts_ns", "dur_ns", "state",
                                                "instance", "dim", "name")}

    def event(rank: int, kind: str, name: str, start_ms: float, dur_ms: float, coll_id: int | None = None,
              step: int = 0) -> None:
        ev["rank"].append(rank)
        ev["lane"].append("gpu0/stream7" if kind == "compute" else "gpu0/stream20")
        ev["kind"].append(kind)
        ev["name"].append(name)
        ev["ts_ns"].append(T0 + int(start_ms * MS) - offsets[rank])  # own clock
        ev["dur_ns"].append(int(dur_ms * MS))
        ev["step"].append(step)
        ev["coll_id"].append(coll_id)

    def coll(cid: int, rank: int, group: str, seq: int, op: str, nbytes: int, inst: int, dim: str,
             peer: int | None = None, splits: list[int] | None = None, nranks: int = 4) -> None:
        for k, v in (("coll_id", cid), ("rank", rank), ("group", group), ("seq", seq), ("op", op),
                     ("in_bytes", nbytes), ("out_bytes", nbytes), ("nranks", nranks), ("peer", peer),
                     ("in_splits", splits), ("ts_ns", None), ("dur_ns", None), ("state", "completed"),
                     ("instance", inst), ("dim", dim), ("name", f"nccl:{op}")):
            co[k].append(v)

    for r in range(4):
        event(r, "compute", HOSTILE if r == 0 else "gemm_fwd", 0.0, 2.0)
        # DP all-reduce: ranks 0-2 enter at 2 ms, rank 3 at 3 ms; all end at 4 ms
        start = 3.0 if r == 3 else 2.0
        coll(10 + r, r, "dp0", 0, "all_reduce", 64 * MS, 100, "DP")
        event(r, "comm", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", start, 4.0 - start, 10 + r)
        # EP all-to-all over ranks 0..3 with skewed splits (everyone sends most to rank 1)
        coll(20 + r, r, "ep0", 0, "all_to_all", 10_000, 200, "EP", splits=[1_000, 7_000, 1_000, 1_000])
        event(r, "comm", "ncclDevKernel_SendRecv", 5.0, 0.5, 20 + r)
        for k in range(20):  # many tiny kernels: merged at full view
            event(r, "compute", "tiny_elementwise", 6.0 + k * 0.01, 0.005, step=1)
    # PP send 0 -> 2 with its own times only in collectives (no kernel event)
    coll(30, 0, "pp0", 0, "send", 1 * MS, 300, "PP", peer=2, nranks=2)
    coll(31, 2, "pp0", 0, "recv", 1 * MS, 300, "PP", peer=0, nranks=2)
    co["ts_ns"][-2:] = [T0 + int(4.5 * MS), T0 + int(4.5 * MS) - MS]
    co["dur_ns"][-2:] = [int(0.3 * MS), int(0.3 * MS)]
    return {
        "ranks": schema.conform("ranks", {
            "rank": [0, 1, 2, 3], "world_size": [4] * 4, "host": ["host-a", "host-a", "host-b", "host-b"],
            "clock_offset_ns": offsets}),
        "groups": schema.conform("groups", {
            "group": ["dp0", "ep0", "pp0", "pp1"], "desc": ["dp", "ep", HOSTILE, "pp"],
            "ranks": [[0, 1, 2, 3], [0, 1, 2, 3], [0, 2], [1, 3]], "size": [4, 4, 2, 2],
            "dims": [["DP"], ["EP"], ["PP"], ["PP"]]}),
        "events": schema.conform("events", ev),
        "collectives": schema.conform("collectives", co),
    }


def tiny_analysis() -> dict[str, Any]:
    """An analysis result in the shape of AnalysisResult.to_json(), for the tiny run."""
    prs = []
    for r in range(4):
        prs.append({"rank": r, "step": 0, "compute_ns": 2 * MS, "comm_ns": {"DP": 2 * MS, "EP": MS // 2},
                    "exposed_ns": {"DP": 2 * MS, "EP": MS // 4}, "overlap": {"DP": 0.0, "EP": 0.5},
                    "idle_ns": MS})
    return {
        "clock_offsets_ns": {"0": 0, "1": 0, "2": MS, "3": MS}, "alignment_residual_ns": 1200,
        "per_rank_step": prs,
        "stalls": [{"group": "dp0", "seq": 0, "op": "all_reduce", "dim": "DP", "step": 0, "last_rank": 3,
                    "max_wait_ns": MS}],
        "stragglers": [{"rank": 3, "times_last": 1, "delay_ns": MS, "steps": [0]}],
        "ep": [{"group": "ep0", "ranks": [0, 1, 2, 3], "hot_rank": 1, "hot_share": 0.7, "imbalance": 2.8,
                "inter_host_share": 0.5}],
        "pp_bubbles": [], "dims": {"dp0": ["DP"], "ep0": ["EP"], "pp0": ["PP"]},
        "findings": [f"Rank 3 entered the DP all-reduce 1.00 ms late; kernel {HOSTILE} is fine."],
    }


def tiny_replay() -> dict[str, Any]:
    """A replay result in the shape of ReplayResult.to_json()."""
    res = []
    for name, scale in (("observed", 1.0), ("rail-2x", 0.6)):
        res.append({
            "topology": name, "step_ns": {"0": int(8 * MS * (0.5 + 0.5 * scale))}, "traced_step_ns": 8 * MS,
            "comm_ns": {"DP": 2 * MS * scale, "EP": MS // 2 * scale},
            "exposed_ns": {"DP": 2 * MS * scale, "EP": MS // 4 * scale},
            "instances": [{"group": "dp0", "seq": 0, "op": "all_reduce", "dim": "DP", "traced_ns": 2 * MS,
                           "replayed_ns": 2 * MS * scale},
                          {"group": HOSTILE, "seq": 0, "op": "all_to_all", "dim": "EP", "traced_ns": MS // 2,
                           "replayed_ns": MS // 2 * scale * 1.1}],
            "hot_links": [{"link": "host-a/nic0->leaf0", "peak_util": 0.9 * scale, "mean_util": 0.4 * scale,
                           "bytes": 1e9}],
            "replay_error": {"median": 0.03, "p90": 0.08} if name == "observed" else None,
        })
    return {"topologies": ["observed", "rail-2x"], "results": res}


def tiny_link_samples() -> pa.Table:
    """Telemetry and replay samples for three links over 10 windows of 1 ms."""
    rows: dict[str, list[Any]] = {k: [] for k in ("link", "ts_ns", "interval_ns", "tx_util", "rx_util", "origin")}
    for origin, scale in (("telemetry", 1.0), ("replay:rail-2x", 0.5)):
        for li, link in enumerate(["host-a/nic0->leaf0", "host-b/nic0->leaf0", HOSTILE]):
            for w in range(10):
                rows["link"].append(link)
                rows["ts_ns"].append(T0 + w * MS)
                rows["interval_ns"].append(MS)
                rows["tx_util"].append(scale * (0.1 * w if li == 0 else 0.2))
                rows["rx_util"].append(0.05)
                rows["origin"].append(origin)
    return schema.conform("link_samples", rows)
