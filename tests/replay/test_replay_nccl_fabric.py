"""Replay on the fabric NCCL built, end to end: profiler traces and an NCCL log of the same job
are ingested together, and the replay's flows follow the log's rings, channel count and NICs
(PXN proxy, a channel that crosses rails without PXN), not the decomposer's own layout."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pytest

from tracekit.ingest import ingest
from tracekit.replay import engine
from tracekit.replay.decompose import Instance, decompose_plan
from tracekit.replay.simulate import MODE_GPU, MODE_NET, Flows, route
from tracekit.replay.topology import build, parse_spec
from tracekit.store import Run
from tracekit.synth import SynthSpec, make_run_tables, write_kineto

GPUS = 4
COMM = "0x7e57000000000001"
# Rank 0 prints one ring per channel; channel 0 leaves host 0 from GPU 1 and enters host 1 at
# GPU 2 (rails 1 -> 2, no PXN), channel 1 leaves host 1 from GPU 0 through GPU 2's NIC (PXN).
RINGS = [[0, 3, 2, 1, 6, 5, 7, 4], [0, 1, 2, 3, 7, 6, 5, 4]]
NET = {  # (channel, from, to) -> (send line's NET device + proxy, receive line's NET device)
    (0, 1, 6): ("IB/1", "IB/2"), (0, 4, 0): ("IB/0", "IB/0"),
    (1, 3, 7): ("IB/3", "IB/3"), (1, 4, 0): ("IB/2(6)", "IB/2"),
}


def host(r: int) -> str:
    return f"node{r // GPUS:03d}"


def nccl_log() -> list[str]:
    """An NCCL 2.24 log of the 8 ranks (2 hosts x 4 GPUs), in NCCL's own line formats."""
    lines = []
    for r in range(2 * GPUS):
        d = r % GPUS
        pre = f"{host(r)}:{5000 + r}:{5000 + r} [{d}] NCCL INFO "
        init = (f"ncclCommInitRank comm 0x5500{r:02x}00 rank {r} nranks 8 cudaDev {d} nvmlDev {d} "
                f"busId {0x18 + 0x10 * d:x}000 commId {COMM} - Init ")
        lines += [pre + "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [2]mlx5_2:1/RoCE [3]mlx5_3:1/RoCE "
                  "; OOB eth0:10.0.0.1<0>", pre + "Using network IB", pre + init + "START",
                  pre + f"comm 0x5500{r:02x}00 rank {r} nRanks 8 nNodes 2 localRanks {GPUS} localRank {d} MNNVL 0"]
        if r == 0:
            lines += [pre + f"Channel {c:02d}/02 :" + "".join(f" {x}" for x in ring) for c, ring in enumerate(RINGS)]
        for c, ring in enumerate(RINGS):
            i = ring.index(r)
            nxt, prv = ring[(i + 1) % len(ring)], ring[i - 1]
            if (c, prv, r) in NET:
                dev = NET[(c, prv, r)][1]
                lines.append(pre + f"Channel {c:02d}/0 : {prv}[{prv % GPUS}] -> {r}[{d}] [receive] "
                             f"via NET/{dev}/GDRDMA")
            if (c, r, nxt) in NET:
                dev = NET[(c, r, nxt)][0]
                lines.append(pre + f"Channel {c:02d}/0 : {r}[{d}] -> {nxt}[{nxt % GPUS}] [send] via NET/{dev}/GDRDMA")
            else:
                lines.append(pre + f"Channel {c:02d}/0 : {r}[{d}] -> {nxt}[{nxt % GPUS}] via P2P/IPC/read")
        lines += [pre + "Connected all rings, use ring PXN 1 GDR 1",
                  pre + "2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer",
                  pre + init + "COMPLETE"]
    return lines


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    src = tmp_path_factory.mktemp("inputs")
    tables, _ = make_run_tables(SynthSpec(hosts=2, gpus_per_host=GPUS, pp=1, ep=2, steps=1, micro_batches=1,
                                          layers_per_stage=1, straggler_rank=None))
    write_kineto(tables, src / "kineto")
    (src / "nccl.log").write_text("\n".join(nccl_log()) + "\n")
    out = tmp_path_factory.mktemp("run") / "run"
    report = ingest([src], out)
    assert not report.failed, [s.error for s in report.failed]
    return Run(out)


def test_the_profilers_group_takes_the_logs_rings(run: Run) -> None:
    groups = {g["group"]: g for g in run.table("groups").to_pylist()}
    (dp,) = [g for g, row in groups.items() if row["backend"] == "nccl" and row["ranks"] == list(range(8))
             and g != COMM]
    fab = engine._prepare(dict(_prepared(run))).fabric
    assert fab.via[dp] == COMM and fab.rings[dp] == RINGS and fab.channels[dp] == 2
    assert fab.hops[dp][(1, 4, 0)] == (6, 2) and fab.hops[dp][(0, 1, 6)] == (1, 6)
    assert fab.hops[dp][(0, 4, 0)] == (4, 0) and (0, 3, 2) not in fab.hops[dp]


def test_replay_flows_follow_the_log(run: Run) -> None:
    prep = engine._prepare(dict(_prepared(run)))
    net = engine._Net(prep, parse_spec(f"rail-optimized:hosts=2,gpus={GPUS}"), "ring")
    flows = net.flows
    keys = [k for k, i in enumerate(prep.instances) if i.op == "all_reduce" and len(i.ranks) == 8]
    assert keys
    mine = np.isin(flows.key, keys)
    edges = {(int(c), int(s), int(d), int(m)) for c, s, d, m in zip(
        flows.channel[mine], flows.src[mine], flows.dst[mine], flows.mode[mine], strict=True)}
    gmap = engine._gpu_map(prep, net.topology.spec)
    g = {r: gmap[r] for r in range(8)}
    want = set()
    for c, ring in enumerate(RINGS):
        for i, a in enumerate(ring):
            b = ring[(i + 1) % len(ring)]
            if (c, a, b) == (1, 4, 0):
                want |= {(c, g[4], g[6], MODE_GPU), (c, g[6], g[2], MODE_NET), (c, g[2], g[0], MODE_GPU)}
            else:
                want.add((c, g[a], g[b], MODE_NET if (c, a, b) in NET else MODE_GPU))
    assert edges == want
    # channel 0 crosses rails 1 -> 2 from GPU 1's own NIC, as the log says, not over NVLink to a proxy
    names = _names(net.topology, net.indptr, net.ids, np.nonzero(mine & (flows.mode == MODE_NET)
                                                                  & (flows.src == g[1]))[0][0])
    assert names[0] == "h0/gpu1>h0/nic1" and any("spine" in n for n in names) and names[-1] == "h1/nic2>h1/gpu2"


def test_without_the_log_the_decomposer_lays_out_its_own_rings() -> None:
    """The mutation check of the test above: with no rings the same call has other edges."""
    topo = build(parse_spec(f"rail-optimized:hosts=2,gpus={GPUS}"))
    inst = Instance(0, "all_reduce", list(range(8)), 1 << 20, group="g")
    own = decompose_plan([inst], topo, np.arange(8), algo="ring").flows
    logged = decompose_plan([inst], topo, np.arange(8), algo="ring", rings={"g": RINGS}, channels={"g": 2}).flows
    assert set(zip(own.src.tolist(), own.dst.tolist(), strict=True)) != set(
        zip(logged.src.tolist(), logged.dst.tolist(), strict=True))
    assert not (own.mode == MODE_NET).any()


def test_net_mode_is_never_proxied() -> None:
    topo = build(parse_spec("rail-optimized:hosts=2"))
    ip, ids = route(topo, Flows.from_lists([1, 1], [10, 10], [1.0, 1.0], mode=[MODE_GPU, MODE_NET]))
    pxn = _names(topo, ip, ids, 0)
    own = _names(topo, ip, ids, 1)
    assert pxn[:2] == ["h0/gpu1>nvl0/nvswitch", "nvl0/nvswitch>h0/gpu2"]
    assert own[0] == "h0/gpu1>h0/nic1" and own[-1] == "h1/nic2>h1/gpu2" and len(own) == 6


def _prepared(run: Run):
    from tracekit.analysis import prepare

    tables = dict(prepare(run, write=False))
    tables.setdefault("channels", run.table("channels"))
    return tables


def _names(topo, indptr, ids, f: int) -> list[str]:
    links = topo.links.column("link").to_pylist()
    out = []
    for r in ids[indptr[f]:indptr[f + 1]]:
        src, dst = links[r // 2].split("--")
        out.append(f"{src}>{dst}" if r % 2 == 0 else f"{dst}>{src}")
    return out


def test_printed_rings_repeat_over_duplicated_channels_and_gloo_groups_stay_apart() -> None:
    """NCCL prints the searched rings (`Channel 00/02`) and duplicates them up to its channel
    count: channel c runs ring c mod 2. A gloo group never takes an NCCL communicator's rings."""
    import pyarrow as pa

    from tracekit import schema
    from tracekit.nccl_fabric import replay_fabric

    groups = schema.conform("groups", pa.Table.from_pylist([
        {"group": COMM, "backend": "nccl", "ranks": [0, 1, 2, 3], "size": 4, "ranks_complete": True,
         "rank_map": [3, 2, 1, 0], "ring_orders": [[0, 1, 2, 3], [0, 2, 1, 3]], "n_channels": 4},
        {"group": "7", "backend": "nccl", "ranks": [0, 1, 2, 3], "size": 4, "ranks_complete": True},
        {"group": "8", "backend": "gloo", "ranks": [0, 1, 2, 3], "size": 4, "ranks_complete": True},
        {"group": "9", "backend": "nccl", "ranks": [0, 1, 2], "size": 3, "ranks_complete": True},
    ], schema=pa.schema([*schema.GROUPS, pa.field("rank_map", pa.list_(pa.int32())),
                         pa.field("ring_orders", pa.list_(pa.list_(pa.int32()))), pa.field("n_channels", pa.int64())])))
    fab = replay_fabric(groups, schema.empty("channels"))
    want = [[3, 2, 1, 0], [3, 1, 2, 0]] * 2
    assert fab.rings[COMM] == want and fab.channels[COMM] == 4
    assert fab.rings["7"] == want and fab.via["7"] == COMM
    assert "8" not in fab.via and "9" not in fab.via


def test_a_log_without_whole_rings_still_gives_the_channel_count(run: Run) -> None:
    """One node's log of a job whose rank 0 logged elsewhere: no ring closes, but NCCL's channel
    count (`2 coll channels`) is used instead of the topology default (8 here)."""
    tables = dict(_prepared(run))
    tables["groups"] = tables["groups"].drop_columns(["ring_orders"])
    ch = tables["channels"]
    tables["channels"] = ch.filter(pa.compute.less(ch.column("rank"), 4))
    prep = engine._prepare(tables)
    assert not prep.fabric.rings and set(prep.fabric.channels.values()) == {2}
    net = engine._Net(prep, parse_spec(f"rail-optimized:hosts=2,gpus={GPUS}"), "ring")
    keys = [k for k, i in enumerate(prep.instances) if i.op == "all_reduce" and len(i.ranks) == 8]
    assert set(net.flows.channel[np.isin(net.flows.key, keys)].tolist()) == {0, 1}


def test_a_nic_gpu_on_another_host_is_not_used() -> None:
    """With a what-if placement a logged NIC rank may sit on another host than the edge: the edge
    then leaves from its own GPU (no cross-host 'NVLink' leg), still as MODE_NET."""
    topo = build(parse_spec(f"rail-optimized:hosts=2,gpus={GPUS}"))
    inst = Instance(0, "all_reduce", list(range(8)), 1 << 20, group="g")
    ring = [0, 1, 2, 3, 4, 5, 6, 7]
    hops = {"g": {(0, 3, 4): (6, 4), (0, 7, 0): (7, 2)}}
    flows = decompose_plan([inst], topo, np.arange(8), algo="ring", rings={"g": [ring]}, hops=hops).flows
    edges = set(zip(flows.src.tolist(), flows.dst.tolist(), flows.mode.tolist(), strict=True))
    assert (3, 4, MODE_NET) in edges and not any(s == 3 and d == 6 for s, d, _ in edges)
    assert {(7, 2, MODE_NET), (2, 0, MODE_GPU)} <= edges


def test_logged_rings_carry_the_channel_ceiling_on_their_network_edges_only() -> None:
    """A ring NCCL logged: its MODE_NET edges get the ring-channel ceiling c(2) (ring/Simple), the
    NVLink legs to and from the NIC GPUs none (docs/hardware.md section 7)."""
    topo = build(parse_spec(f"rail-optimized:hosts=2,gpus={GPUS}"))
    inst = Instance(0, "all_reduce", list(range(8)), 1 << 30, group="g")
    hops = {"g": {(0, 3, 4): (3, 4), (0, 7, 0): (7, 2)}}
    flows = decompose_plan([inst], topo, np.arange(8), algo="ring", proto="Simple", rings={"g": [list(range(8))]},
                           hops=hops).flows
    limits = flows.rate_limits()
    net = flows.mode == MODE_NET
    assert net.sum() == 2
    np.testing.assert_allclose(limits[net], 22.27 - 0.713)
    assert np.isinf(limits[~net]).all()
