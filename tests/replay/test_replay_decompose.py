"""Decomposition: byte counts per flow, NCCL's channel layout, and closed-form times per algorithm.

Closed forms use latency 0 (`latency_ns=0,nvlink_latency_ns=0`) so a collective's time is its
bandwidth term alone, forced to protocol Simple; `eff` is NCCL's factor for the algorithm
(tree all-reduce 0.92, NVLS 0.85, CollNet direct 0.85, ring 1), by which flows carry S/eff.
Bandwidths in bytes/ns: NIC 400 Gb/s = 50, 200 Gb/s = 25, NVLink 450 GB/s = 450.
"""

import math

import numpy as np
import pytest

from tracekit.replay.decompose import Instance, decompose, decompose_plan
from tracekit.replay.simulate import (
    MODE_CORE_UP,
    MODE_LEAF_DOWN,
    MODE_LEAF_UP,
    MODE_NVLS_DOWN,
    MODE_NVLS_UP,
    MODE_SPINE_UP,
    Flows,
    connection_weights,
    resource_bytes,
    route,
    simulate,
    to_cables,
)
from tracekit.replay.topology import build, parse_spec

S = 1_000_000.0
# line rates and no latency: these closed forms test the decomposition, not the hardware profiles
ZERO_LAT = "latency_ns=0,nvlink_latency_ns=0,nvlink_efficiency=1,nic_efficiency=1"


def _topo(text="single-switch:hosts=4,gpus=1"):
    return build(parse_spec(text))


def _sent(flows, n):
    out = np.zeros(n)
    np.add.at(out, flows.src, flows.nbytes)
    return out


def _time(spec, inst, algo="auto", proto="Simple"):
    """Simulated transfer time (ns) of one instance alone, and its decomposition."""
    topo = _topo(spec)
    dec = decompose_plan([inst], topo, np.arange(topo.n_gpus), algo=algo, proto=proto)
    indptr, ids = route(topo, dec.flows)
    return float(simulate(topo, indptr, ids, dec.flows).finish.max()), dec, topo


def _cable_bytes(topo, flows, tier):
    per = to_cables(topo, resource_bytes(topo.cap.size, *route(topo, flows), flows.nbytes))
    names = np.array(topo.links.column("link").to_pylist())
    tiers = np.array(topo.links.column("tier").to_pylist())
    up = per[0::2]
    return {str(n): float(b) for n, b, t in zip(names, up, tiers, strict=True) if t == tier}


@pytest.mark.parametrize("op, factor", [("all_reduce", 2 * 3 / 4), ("all_gather", 3 / 4),
                                        ("reduce_scatter", 3 / 4)])
def test_ring_bytes_per_rank(op, factor):
    flows = decompose([Instance(0, op, [0, 1, 2, 3], S)], _topo(), np.arange(4), algo="ring", proto="Simple")
    # 1 GPU per host on a 400G NIC: NCCL's search duplicates its 48 GB/s channel and the connect
    # step doubles them (search.cc, connect.cc): 4 channels
    assert len(flows) == 4 * 4
    np.testing.assert_allclose(_sent(flows, 4), factor * S)
    assert set(zip(flows.src.tolist(), flows.dst.tolist(), strict=True)) == {(0, 1), (1, 2), (2, 3), (3, 0)}


def test_protocol_and_algorithm_efficiency_inflate_bytes():
    inst = [Instance(0, "all_reduce", [0, 1, 2, 3], S)]
    ll = decompose(inst, _topo(), np.arange(4), algo="ring", proto="LL")
    simple = decompose(inst, _topo(), np.arange(4), algo="ring", proto="Simple")
    np.testing.assert_allclose(ll.nbytes.sum(), 2 * simple.nbytes.sum())  # LL: 8 bytes per 4


def test_traced_algo_and_proto_are_followed():
    dec = decompose_plan([Instance(0, "all_reduce", list(range(4)), S, algo="TREE", proto="LL128")], _topo(),
                         np.arange(4))
    assert (dec.plans[0].algo, dec.plans[0].proto, dec.plans[0].source) == ("tree", "LL128", "trace")


def test_ring_channels_leave_hosts_on_every_nic():
    """The issue's case: a ring all-reduce across 2 hosts x 8 GPUs on a rail-optimized fabric of 8
    NICs per host. 16 channels, channel c enters and leaves each host through NIC c mod 8, so all
    8 NICs of a host send 2 channels' crossing edges of 2(n-1)/n S/16 each."""
    spec = f"rail-optimized:hosts=2,gpus=8,nic_gbps=400,ring_channel_gbs=1000,{ZERO_LAT}"
    t, dec, topo = _time(spec, Instance(0, "all_reduce", list(range(16)), S), algo="ring")
    assert dec.plans[0].channels == 16
    nic = _cable_bytes(topo, dec.flows, "nic-leaf")
    assert len(nic) == 16
    np.testing.assert_allclose(list(nic.values()), 2 * (2 * 15 / 16) * S / 16, rtol=1e-9)
    # T = 2(n-1)/n S / (8 NICs x 50 B/ns); one channel on rail 0 took 8x that
    assert t == pytest.approx(1.875 * S / 400, rel=0.01)


@pytest.mark.parametrize("hosts", [2, 10, 64])
def test_ring_channel_over_the_network_binds_at_eight_gpus_per_host(hosts):
    """Closed form with the measured ring-channel ceiling c(N) = 22.27 - 0.713 log2 N GB/s (N held
    at 46): 16 channels each move 2(n-1)/n S/16 over their network hops at c(N), so a ring
    all-reduce of 8 GPUs x 8 x 400G per host reaches busbw 16 c(N) (345 GB/s at 2 hosts, 318 at 10),
    below the 8 x 50 GB/s the NICs carry; at one host nothing changes."""
    n = 8 * hosts
    spec = f"rail-optimized:hosts={hosts},gpus=8,nic_gbps=400,{ZERO_LAT}"
    t, dec, _ = _time(spec, Instance(0, "all_reduce", list(range(n)), S), algo="ring", proto="Simple")
    c = 22.27 - 0.713 * math.log2(min(hosts, 46))
    assert dec.plans[0].channels == 16
    assert t == pytest.approx(2 * (n - 1) / n * S / 16 / c, rel=0.01)
    given, _, _ = _time(spec + ",ring_channel_gbs=10", Instance(0, "all_reduce", list(range(n)), S), algo="ring",
                        proto="Simple")
    assert given == pytest.approx(2 * (n - 1) / n * S / 16 / 10, rel=0.01)


def test_ring_channel_ceiling_leaves_nic_bound_rings_alone():
    """At 1 GPU per host NCCL runs 4 channels per 400G NIC (12.5 GB/s each, under the ceiling):
    the ring stays NIC-bound, T = 2(n-1)/n S / 50 GB/s."""
    spec = f"rail-optimized:hosts=10,gpus=1,nic_gbps=400,{ZERO_LAT}"
    t, dec, _ = _time(spec, Instance(0, "all_reduce", list(range(10)), S), algo="ring", proto="Simple")
    assert dec.plans[0].channels == 4
    assert t == pytest.approx(2 * 9 / 10 * S / 50, rel=0.01)


def test_hierarchical_ring_crosses_hosts_once_per_host():
    topo = _topo("rail-optimized:hosts=2,gpus=4")
    ranks = [0, 4, 1, 5, 2, 6, 3, 7]
    dec = decompose_plan([Instance(0, "all_reduce", ranks, S)], topo, np.arange(8), algo="ring")
    flows = dec.flows
    for c in range(dec.plans[0].channels):
        mine = flows.channel == c
        crossing = (flows.src[mine] // 4) != (flows.dst[mine] // 4)
        assert crossing.sum() == 2


def test_observed_rings_are_all_used():
    rings = {"g": [[0, 2, 1, 3], [0, 3, 1, 2]]}
    dec = decompose_plan([Instance(0, "all_reduce", [0, 1, 2, 3], S, group="g")], _topo(), np.arange(4),
                         rings=rings, algo="ring")
    flows = dec.flows
    assert dec.plans[0].channels == 2
    edges = {c: set(zip(flows.src[flows.channel == c].tolist(), flows.dst[flows.channel == c].tolist(),
                        strict=True)) for c in (0, 1)}
    assert edges == {0: {(0, 2), (2, 1), (1, 3), (3, 0)}, 1: {(0, 3), (3, 1), (1, 2), (2, 0)}}


def test_channel_count_from_logs():
    dec = decompose_plan([Instance(0, "all_reduce", [0, 1, 2, 3], S, group="g")], _topo(), np.arange(4),
                         channels={"g": 5}, algo="ring")
    assert dec.plans[0].channels == 5 and set(dec.flows.channel.tolist()) == set(range(5))


def test_all_to_all_uses_splits():
    splits = {0: [0, 10, 20, 30], 1: [5, 0, 0, 7], 2: [1, 1, 1, 1], 3: [0, 0, 9, 0]}
    flows = decompose([Instance(0, "all_to_all", [0, 1, 2, 3], 60, splits=splits)], _topo(), np.arange(4),
                      proto="Simple")
    pairs = {(int(s), int(d)): b for s, d, b in zip(flows.src, flows.dst, flows.nbytes, strict=True)}
    assert pairs == {(0, 1): 10, (0, 2): 20, (0, 3): 30, (1, 0): 5, (1, 3): 7, (2, 0): 1, (2, 1): 1,
                     (2, 3): 1, (3, 2): 9}


def test_send_is_split_over_nccls_channels_for_its_size():
    """A 1 MB send between two hosts (one 400G NIC each): the comm has 4 p2p channels (one ring
    channel per NIC, duplicated by the search, doubled by the connect step); a peer across the
    network gets ceil(50 / 14) = 4, which 4 x ceil(2 / 8) fits (paths.cc); the operation starts on
    2 channels (2 ranks x 4 > 4) and doubles while a part exceeds the 128 KiB chunk (enqueue.cc):
    4 flows of S/4, each at most 14 GB/s."""
    flows = decompose([Instance(0, "send", [0, 3], S, src=3, dst=0)], _topo(), np.arange(4))
    assert (len(flows), set(flows.src.tolist()), set(flows.dst.tolist())) == (4, {3}, {0})
    assert flows.nbytes.tolist() == [S / 4] * 4 and flows.channel.tolist() == [0, 1, 2, 3]
    assert flows.max_gbs.tolist() == [14.0] * 4


def test_broadcast_and_reduce_chains():
    b = decompose([Instance(0, "broadcast", [0, 1, 2, 3], S, root=2)], _topo(), np.arange(4), proto="Simple")
    assert len(b) == 3 * 4 and b.nbytes.sum() == pytest.approx(3 * S) and 2 in b.src and 2 not in b.dst
    r = decompose([Instance(0, "reduce", [0, 1, 2, 3], S, root=2)], _topo(), np.arange(4), proto="Simple")
    assert len(r) == 3 * 4 and 2 in r.dst and 2 not in r.src


def test_nvls_is_s_up_and_s_down_per_gpu():
    topo = _topo("rail-optimized:hosts=1,gpus=8,nvls=true")
    flows = decompose([Instance(0, "all_reduce", list(range(8)), S)], topo, np.arange(8), algo="nvls")
    assert sorted(set(flows.mode.tolist())) == [MODE_NVLS_UP, MODE_NVLS_DOWN]
    per = to_cables(topo, resource_bytes(topo.cap.size, *route(topo, flows), flows.nbytes))
    tiers = np.repeat(np.array(topo.links.column("tier").to_pylist()), 2)
    np.testing.assert_allclose(per[tiers == "nvlink"], S / 0.74)


def test_sharp_halves_nic_bytes():
    ring_topo = _topo("fat-tree:hosts=8,gpus=1,leaf_radix=8")
    sharp_topo = _topo("fat-tree:hosts=8,gpus=1,leaf_radix=8,sharp=true")
    inst = [Instance(0, "all_reduce", list(range(8)), S)]
    ring = decompose(inst, ring_topo, np.arange(8), algo="ring", proto="Simple")
    sharp = decompose(inst, sharp_topo, np.arange(8), algo="collnet_chain")
    np.testing.assert_allclose(list(_cable_bytes(ring_topo, ring, "nic-leaf").values()), 2 * 7 / 8 * S)
    np.testing.assert_allclose(list(_cable_bytes(sharp_topo, sharp, "nic-leaf").values()), S)
    assert {MODE_LEAF_UP, MODE_LEAF_DOWN, MODE_SPINE_UP} <= set(sharp.mode.tolist())


def test_sharp_reaches_the_core_tier():
    """8 hosts, 2 per leaf, 2 leaves per pod: the shards meet at the core; with core_oversub=8 the
    core carries each pod's reduced S at 1/8 of the leaf uplinks, so SHARP slows down by it."""
    base = f"fat-tree:hosts=8,gpus=1,leaf_radix=4,tiers=3,sharp=true,{ZERO_LAT}"
    inst = Instance(0, "all_reduce", list(range(8)), S)
    t1, dec, _ = _time(base, inst, algo="collnet_chain")
    assert MODE_CORE_UP in dec.flows.mode.tolist()
    # NIC-bound: every GPU sends S to its leaf at 50 B/ns
    assert t1 == pytest.approx(S / 50, rel=0.01)
    t8, _, _ = _time(base + ",core_oversub=8", inst, algo="collnet_chain")
    # a pod's spines reach the core with 1/8 of its leaves' uplinks (2 x 100 B/ns / 8 = 25 B/ns)
    # for the pod's reduced S: the core binds at S / 25 or slower (ECMP may not spread it evenly)
    assert t8 >= S / 25 * 0.99


def test_tree_moves_s_per_tree_edge():
    topo = _topo("fat-tree:hosts=4,gpus=1,leaf_radix=8")
    flows = decompose([Instance(0, "all_reduce", [0, 1, 2, 3], S, algo="tree")], topo, np.arange(4),
                      proto="Simple")
    # 2 channels, one per tree; each of a tree's 3 edges carries S/2 each way, as S/0.92
    assert flows.nbytes.sum() == pytest.approx(2 * 2 * 3 * S / 2 / 0.92)


# ---- closed forms, 1 GPU per host (4 hosts on one rail leaf, NIC 50 B/ns) ----------------------

ONE = f"rail-optimized:hosts=4,gpus=1,nic_gbps=400,{ZERO_LAT}"


@pytest.mark.parametrize("op, algo, expected", [
    # ring: each GPU sends 2(n-1)/n S (all-reduce) or (n-1)/n S over its NIC
    ("all_reduce", "ring", 1.5 * S / 50),
    ("all_gather", "ring", 0.75 * S / 50),
    ("reduce_scatter", "ring", 0.75 * S / 50),
    # NCCL's double binary tree over 4 hosts (trees.cc: 1->0, 2->0... tree 0 is 1->2, 3->2, 2->0;
    # tree 1 its mirror 2->1, 0->1, 1->3): host 2 is interior in tree 0 (3 edges) and a leaf in
    # tree 1 (1 edge), S/2 per tree each way: it sends 4 x S/2 = 2 S, as S/0.92
    ("all_reduce", "tree", 2 * S / 0.92 / 50),
    # chain from the root: every NIC but the last sends S
    ("broadcast", "ring", S / 50),
    # uniform all-to-all: S/n to each of n-1 peers
    ("all_to_all", "ring", 0.75 * S / 50),
])
def test_closed_form_one_gpu_per_host(op, algo, expected):
    t, _, _ = _time(ONE, Instance(0, op, list(range(4)), S, root=0), algo=algo)
    assert t == pytest.approx(expected, rel=0.01)


def test_closed_form_send_recv_and_sharp_one_gpu_per_host():
    # a send: 4 channels of S/4 at NCCL's 14 GB/s per network channel, 56 above the NIC's 50,
    # which binds
    t, _, _ = _time(ONE, Instance(0, "send", [0, 3], S, src=0, dst=3))
    assert t == pytest.approx(S / 50, rel=0.01)
    # CollNet direct (SHARP): every GPU sends S/0.85 up its NIC and gets it back reduced
    t, _, _ = _time(ONE + ",sharp=true", Instance(0, "all_reduce", list(range(4)), S), algo="collnet_direct")
    assert t == pytest.approx(S / 0.85 / 50, rel=0.01)


# ---- closed forms, 8 GPUs per host (2 hosts, NVLink 450 B/ns per GPU, 8 NICs per host) ----------

EIGHT = f"rail-optimized:hosts=2,gpus=8,{ZERO_LAT}"


@pytest.mark.parametrize("nic, op, algo, expected", [
    # ring over 16 channels, 2 per NIC: T = factor x S / min(8 x 50, 16 x c(2)), where the measured
    # ring-channel ceiling c(2) = 22.27 - 0.713 = 21.557 GB/s binds (345 < 400)
    (400, "all_reduce", "ring", 1.875 * S / (16 * 21.557)),
    (400, "all_gather", "ring", 0.9375 * S / (16 * 21.557)),
    (400, "reduce_scatter", "ring", 0.9375 * S / (16 * 21.557)),
    # the same with the ceiling lifted: NIC-bound, T = factor x S / (8 x 50)
    (400, "all_reduce,ring_channel_gbs=1000", "ring", 1.875 * S / 400),
    # tree, NIC-bound at 200 Gb/s: a host's 8 NICs carry S/0.92 each way
    (200, "all_reduce", "tree", S / 0.92 / 200),
    # tree, NVLink-bound at 400 Gb/s: a GPU is head in 2 of 16 channels, tail in 2, middle (up
    # and down) in 12: 28 flows of S/16 share its 450 B/ns
    (400, "all_reduce", "tree", 28 * S / 16 / 0.92 / 450),
    # broadcast: each channel's chain crosses each way once, 2 channels per NIC at 25 B/ns
    (200, "broadcast", "ring", 2 * S / 16 / 25),
    # all-to-all: NIC j of host 0 carries host 0's 8 GPUs' S/16 to GPU j of host 1 (PXN)
    (400, "all_to_all", "ring", 8 * S / 16 / 50),
])
def test_closed_form_eight_gpus_per_host(nic, op, algo, expected):
    op, _, extra = op.partition(",")
    spec = f"{EIGHT},nic_gbps={nic}" + (f",{extra}" if extra else "")
    t, _, _ = _time(spec, Instance(0, op, list(range(16)), S, root=0), algo=algo)
    assert t == pytest.approx(expected, rel=0.01)


def test_closed_form_nvls_family_eight_gpus_per_host():
    inst = Instance(0, "all_reduce", list(range(8)), S)
    # NVLS in one host: S/0.74 up and down each GPU's NVLink (the measured multimem efficiency)
    t, _, _ = _time(f"rail-optimized:hosts=1,gpus=8,nvls=true,{ZERO_LAT}", inst, algo="nvls")
    assert t == pytest.approx(S / 0.74 / 450, rel=0.01)
    both = Instance(0, "all_reduce", list(range(16)), S)
    # NVLS-tree over 2 hosts: NVLS inside (S/0.74 each way per GPU) binds before the heads' tree
    # over 8 NICs (S/0.92 each way)
    t, _, _ = _time(f"{EIGHT},nic_gbps=400,nvls=true", both, algo="nvls_tree")
    assert t == pytest.approx(max(S / 0.74 / 450, S / 0.92 / 400), rel=0.01)
    # NVLS+SHARP: each GPU sends its S/8 share (as S/0.85) to its rail leaf, which reduces it
    t, dec, _ = _time(f"{EIGHT},nic_gbps=400,nvls=true,sharp=true", both, algo="nvls")
    assert MODE_SPINE_UP not in dec.flows.mode.tolist()  # both hosts of a rail share its leaf
    assert t == pytest.approx(S / 0.85 / 400, rel=0.01)
    # CollNet chain without NVLS: the intra-host ring (2 x 7/8 S per GPU) binds on NVLink
    t, _, _ = _time(f"{EIGHT},nic_gbps=400,sharp=true", both, algo="collnet_chain")
    assert t == pytest.approx(1.75 * S / 450, rel=0.01)


def test_send_recv_eight_gpus_per_host():
    """A 2-rank comm across hosts: as on one GPU per host, 4 channels at 14 GB/s each, NIC-bound."""
    t, _, _ = _time(f"{EIGHT},nic_gbps=400", Instance(0, "send", [0, 8], S, src=0, dst=8))
    assert t == pytest.approx(S / 50, rel=0.01)


def test_what_ifs_sharp_and_twice_the_nic_speed():
    """Ring all-reduce across 4 hosts x 8 GPUs: NIC-bound at 2(n-1)/n S / (8 x 50). SHARP as NCCL
    runs it on NVSwitch hosts (NVLS+SHARP) sends S/0.85 per host instead, NVLS inside at
    S/0.85/450 per GPU: ratio (1/0.85) / (2 x 31/32) = 0.607. CollNet without NVLS is bound by its
    intra-host ring (2 x 7/8 S per GPU on NVLink): ratio (1.75/0.85/450) / (1.9375/400) = 0.944.
    Twice the NIC speed moves the ring's bottleneck to NVLink: every GPU sends all 16 channels'
    ring edges (2(n-1)/n S) through its 450 B/ns port, above the host's 8 x 100: ratio 400/450.
    (Ring-channel ceiling lifted; with it, see the last lines.)"""
    inst = Instance(0, "all_reduce", list(range(32)), 64 * S)
    spec = f"rail-optimized:hosts=4,gpus=8,nic_gbps=400,pcie_gbps=1000,ring_channel_gbs=1000,{ZERO_LAT}"
    ring, _, _ = _time(spec, inst, algo="ring")
    assert ring == pytest.approx(2 * 31 / 32 * 64 * S / 400, rel=0.01)
    sharp, _, _ = _time(spec + ",sharp=true,nvls=true", inst, algo="nvls")
    assert sharp / ring == pytest.approx((1 / 0.85) / (2 * 31 / 32), rel=0.01)
    collnet, _, _ = _time(spec + ",sharp=true", inst, algo="collnet_direct")
    assert collnet / ring == pytest.approx((1.75 / 0.85 / 450) / (1.9375 / 400), rel=0.01)
    fast, _, _ = _time(spec.replace("nic_gbps=400", "nic_gbps=800"), inst, algo="ring")
    assert fast / ring == pytest.approx(400 / 450, rel=0.01)
    # with the measured ceiling (400G ports), 16 channels x c(4) = 16 x 20.844 = 333.5 GB/s bind
    # before the NICs; it was measured on 400G only and is not carried to 800G, which is NVLink-bound
    capped = spec.replace(",ring_channel_gbs=1000", "")
    ring, _, _ = _time(capped, inst, algo="ring")
    assert ring == pytest.approx(2 * 31 / 32 * 64 * S / (16 * 20.844), rel=0.01)
    fast, _, _ = _time(capped.replace("nic_gbps=400", "nic_gbps=800"), inst, algo="ring")
    assert fast / ring == pytest.approx(16 * 20.844 / 450, rel=0.01)


def test_tuning_picks_tree_for_large_all_reduce_on_two_nodes():
    dec = decompose_plan([Instance(0, "all_reduce", list(range(16)), 8 * 2**30)],
                         _topo("rail-optimized:hosts=2,gpus=8,nic_gbps=200"), np.arange(16))
    plan = dec.plans[0]
    assert (plan.algo, plan.proto, plan.source) == ("tree", "Simple", "tuning")
    # 16 hops of 512 KiB chunks on 2^33 / 16 bytes per channel
    rate = 0.92 * 192  # 8 NICs at 24 B/ns; a chunk crosses 14 chain hops and 2 NIC hops at their share
    assert dec.fill[0] == pytest.approx(1 + (14 * rate / 370.8 + 2 * rate / 192) * 2**19 / 2**29)




# ---- the traced algorithm (kernel names, NCCL logs) against NCCL's tuning rule --------------------

NOT_TREE = "RING|COLLNET_DIRECT|COLLNET_CHAIN|NVLS|NVLS_TREE"  # an NCCL >= 2.19 RING-named all-reduce kernel
SAMPLE = "rail-optimized:hosts=2,gpus=4,nic_gbps=400"  # the bundled sample's DP group: 2 hosts x 4 GPUs


def _plan(spec, algo=None, traced_on=None, nbytes=64 * 2**20):
    topo = _topo(spec)
    inst = Instance(0, "all_reduce", list(range(8)), nbytes, algo=algo)
    base = (_topo(traced_on), np.arange(8)) if traced_on else None
    return decompose_plan([inst], topo, np.arange(topo.n_gpus), traced_on=base).plans[0]


def test_a_kernel_name_that_rules_out_tree_gives_ring_where_the_rule_picks_tree():
    assert _plan(SAMPLE).algo == "tree"  # NCCL's rule alone, for 64 MiB on 2 hosts
    plan = _plan(SAMPLE, NOT_TREE)
    assert (plan.algo, plan.source) == ("ring", "trace")  # the rule's protocol within the traced set
    assert _plan(SAMPLE, "TREE").algo == "tree"
    assert _plan(SAMPLE, "ring").algo == "ring"


def test_a_what_if_weighs_the_in_network_reduction_the_traced_network_lacked():
    sharp = SAMPLE + ",sharp=true"
    # without knowing where the trace came from, a traced RING stays a ring
    assert _plan(sharp, "RING").algo == "ring"
    # on a SHARP what-if of a ring-traced run, the rule weighs CollNet (new there) against the ring
    plan = _plan(sharp, "RING", traced_on=SAMPLE)
    assert plan.algo in ("collnet_direct", "collnet_chain") and plan.source == "tuning"
    assert _plan(sharp, NOT_TREE, traced_on=SAMPLE).algo in ("collnet_direct", "collnet_chain")
    # a what-if that adds no algorithm keeps the traced one (the rule alone would pick tree)
    plan = _plan(SAMPLE.replace("nic_gbps=400", "nic_gbps=800"), "RING", traced_on=SAMPLE)
    assert (plan.algo, plan.source) == ("ring", "trace")
    # a traced algorithm the what-if cannot run falls back to the rule
    assert _plan(SAMPLE, "COLLNET_DIRECT").source == "tuning"



def test_sample_dp_all_reduce_by_hand():
    """The bundled sample's DP all-reduce: 64 MiB over 8 ranks on 2 hosts x 4 GPUs, rail-optimized
    400 Gb/s (50 B/ns per NIC). synth traced it at 643.2 us = its bandwidth term plus 14 x 4 us;
    the replay's 817 us (uncalibrated) decomposes as follows (docs/replay.md, section 3.1)."""
    S = 64 * 2**20
    inst = Instance(0, "all_reduce", list(range(8)), S, algo=NOT_TREE)
    # 8 channels, 2 per NIC: each NIC carries 2 of the ring's crossing edges, 2(n-1)/n S / 8 each
    band = 2 * 7 / 8 * S / 4 / 50
    assert band == pytest.approx(587_202.6, abs=0.1)
    t, _, _ = _time(f"{SAMPLE},{ZERO_LAT}", inst, proto="Simple")
    assert t == pytest.approx(band, rel=1e-9)
    # what the rule runs: ring/LL128 (NCCL's factor 0.92), 14 steps of 1.5 us each (NVLink to the
    # rail's GPU 150 ns + NIC-leaf 600 + leaf-NIC 600 + NVLink 150; PCIe adds none)
    # (and NICs at their achievable 0.94 of 400 Gb/s, hardware.NICS)
    t, dec, _ = _time(SAMPLE, inst, proto="auto")
    assert (dec.plans[0].algo, dec.plans[0].proto) == ("ring", "LL128")
    assert t == pytest.approx(band / 0.92 / 0.94 + 14 * 1_500, rel=1e-9)  # 700.0 us
    # the rest is contention: a send of one ring flow's size from GPU 0 to GPU 4, released with it,
    # shares NIC 0 with channels 0 and 4: three flows at 50/3 B/ns, so the whole instance takes 3/2
    # as long (synth keeps a started transfer's full share; max-min re-shares at every event)
    topo = _topo(f"{SAMPLE},{ZERO_LAT}")
    ring = decompose_plan([inst], topo, np.arange(8), proto="Simple").flows
    flows = Flows.concat([ring, Flows.from_lists([0], [4], [2 * 7 / 8 * S / 8], key=[1])])
    out = simulate(topo, *route(topo, flows), flows)
    assert out.finish[flows.key == 0].max() == pytest.approx(1.5 * band, rel=1e-9)


def test_a_collective_takes_one_nic_share_whatever_its_flow_count():
    """CollNet puts one flow per channel on every GPU's NIC (16 here: 4 ports of 400G per host give
    NCCL 16 channels), the ring one per channel crossing hosts through that NIC (4). Shared per
    flow, a transfer released with the all-reduce on NIC 0 of host 0 got 1/17 of it next to CollNet
    and 1/5 next to the ring; shared per
    connection set (`connection_weights`: each of an instance's flows weighs 1 / its most flows on
    one NIC link) it gets 1/2 next to either (docs/replay.md, section 4.1)."""
    topo = _topo(f"{SAMPLE},sharp=true,{ZERO_LAT}")
    S = 64 * 2**20
    per = S / 4 / 16 / 0.85  # a GPU's share, per channel, as S/0.85
    alone = Flows.from_lists([0], [4], [per], key=[1])  # a transfer from GPU 0 to GPU 4
    assert simulate(topo, *route(topo, alone), alone).finish.max() == pytest.approx(per / 50, rel=1e-9)
    for algo, flows_per_nic in (("collnet_direct", 16), ("ring", 4)):
        dec = decompose_plan([Instance(0, "all_reduce", list(range(8)), S)], topo, np.arange(8), algo=algo,
                             proto="Simple")
        assert dec.plans[0].algo == algo
        flows = Flows.concat([dec.flows, alone])
        indptr, ids = route(topo, flows)
        weight = connection_weights(topo, indptr, ids, flows.key)
        assert set(weight[flows.key == 0] / weight[flows.key == 1].max()) == {1 / flows_per_nic}
        out = simulate(topo, indptr, ids, flows)
        assert out.finish[flows.key == 1].max() == pytest.approx(2 * per / 50, rel=1e-9)
        per_flow = simulate(topo, indptr, ids, flows, weight=np.ones(len(flows)))
        assert per_flow.finish[flows.key == 1].max() == pytest.approx((flows_per_nic + 1) * per / 50, rel=1e-9)


@pytest.mark.parametrize("a2a_mib", [1, 4, 16, 64])
@pytest.mark.parametrize("ar_mib", [16, 64, 256])
def test_sharp_never_slows_an_unrelated_all_to_all_by_its_flow_count(ar_mib, a2a_mib):
    """The SHARP what-if of the bundled sample's shape (2 hosts x 4 GPUs, a NIC per GPU): a DP
    all-reduce and an EP all-to-all on the same 8 GPUs, released together. CollNet sends S/4 per
    NIC where the ring sends 2 x 7/8 S / 4, through 8 flows per NIC instead of 2. With the NIC
    shared per connection set the all-to-all finishes no later with SHARP than with the ring (as
    late while the all-reduce runs: half the NIC either way). Shared per flow (the control), an
    all-to-all that ends while the all-reduce runs got 4 of 12 flows' shares of a NIC next to
    CollNet and 4 of 6 next to the ring, so it took 1.9-2x as long with SHARP (1.3x where
    per-peer rate limits cap the all-to-all's flows below their NIC share)."""
    topo = _topo(f"{SAMPLE},sharp=true")
    insts = [Instance(0, "all_reduce", list(range(8)), ar_mib * 2**20),
             Instance(1, "all_to_all", list(range(8)), a2a_mib * 2**20)]
    finish = {}
    for algo in ("collnet_direct", "ring"):
        dec = decompose_plan(insts, topo, np.arange(8), algo=algo, proto="Simple")
        assert dec.plans[0].algo == algo
        indptr, ids = route(topo, dec.flows)
        a2a = dec.flows.key == 1
        for sharing, weight in (("instance", None), ("flow", np.ones(len(dec.flows)))):
            out = simulate(topo, indptr, ids, dec.flows, weight=weight)
            finish[algo, sharing] = out.finish[a2a].max()
    assert finish["collnet_direct", "instance"] <= finish["ring", "instance"] * (1 + 1e-9)
    if 4 * a2a_mib <= ar_mib:  # the all-to-all ends while the all-reduce runs
        assert finish["collnet_direct", "instance"] == pytest.approx(finish["ring", "instance"], rel=1e-9)
        assert finish["collnet_direct", "flow"] > 1.2 * finish["ring", "flow"]
