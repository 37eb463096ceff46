"""Collective instances -> flows (bytes, path endpoints, latency multiplier), per algorithm.

Channels are laid out as NCCL builds them: channel `c` enters and leaves every host through the
GPU next to NIC `c` (rail-aligned, PXN carries the last hop of a host over NVLink to that GPU), so
a ring or tree across hosts spreads over all NICs. The algorithm and protocol of each call come
from the trace when known, else from NCCL's tuning rule (`tuning.select`). Byte counts per flow
are in docs/replay.md. All flows of an instance are released together at the instance start; a
pipelined algorithm's step count goes into the latency multiplier and its pipeline fill into
`Decomposition.fill`. Point-to-point (send/recv, all-to-all) runs on NCCL's p2p channels, one
rate-limited flow per channel (`tuning.p2p_channels_per_peer`, docs/replay.md section 3.5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracekit.replay import hardware, tuning
from tracekit.replay.simulate import (
    MODE_CORE_DOWN,
    MODE_CORE_UP,
    MODE_GPU,
    MODE_LEAF_DOWN,
    MODE_LEAF_UP,
    MODE_NET,
    MODE_NVLS_DOWN,
    MODE_NVLS_UP,
    MODE_SPINE_DOWN,
    MODE_SPINE_UP,
    Flows,
)
from tracekit.replay.topology import Topology, TopologySpec

RING_OPS = ("all_reduce", "all_gather", "reduce_scatter", "barrier")


@dataclass
class Instance:
    """One collective call across its participants (global ranks in group order). `op` is a
    collective's, or `sendrecv` (nccl-tests: every rank sends `nbytes` to the next rank at once)."""

    key: int
    op: str
    ranks: Sequence[int]
    nbytes: float
    algo: str | None = None
    root: int | None = None
    src: int | None = None
    dst: int | None = None
    splits: Mapping[int, Sequence[float]] = field(default_factory=dict)
    group: str | None = None
    proto: str | None = None
    max_p2p_peers: int | None = None  # NCCL 2.30's maxP2pPeers of the comm; None: its size


class _Acc:
    """Flow columns gathered call by call; a scalar stays one value until `flows` repeats it."""

    DTYPES = (("src", np.int64), ("dst", np.int64), ("nbytes", np.float64), ("lat_mult", np.float64),
              ("channel", np.int64), ("mode", np.int64), ("key", np.int64), ("max_gbs", np.float64))

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {k: [] for k, _ in self.DTYPES}
        self.counts: list[int] = []

    def add(self, src, dst, nbytes, *, lat_mult=1.0, channel=0, mode=MODE_GPU, key=0, max_gbs=np.inf) -> None:
        src = np.atleast_1d(np.array(src, np.int64))
        self.counts.append(src.size)
        for name, value in (("src", src), ("dst", dst), ("nbytes", nbytes), ("lat_mult", lat_mult),
                            ("channel", channel), ("mode", mode), ("key", key), ("max_gbs", max_gbs)):
            self.cols[name].append(np.array(value) if isinstance(value, (np.ndarray, list, tuple)) else value)

    def flows(self) -> Flows:
        if not self.counts:
            return Flows.from_lists([], [], [])
        counts = np.asarray(self.counts, np.int64)
        c = {}
        for name, dtype in self.DTYPES:
            values = self.cols[name]
            if not any(isinstance(v, np.ndarray) and v.ndim for v in values):
                c[name] = np.repeat(np.array(values, dtype), counts)
            else:
                c[name] = np.concatenate([np.broadcast_to(np.asarray(v, dtype), (n,)) for v, n in
                                          zip(values, self.counts, strict=True)])
        return Flows(c["src"], c["dst"], c["nbytes"], np.zeros(c["src"].size), c["lat_mult"],
                     c["channel"], c["mode"], c["key"], c["max_gbs"])


@dataclass
class Decomposition:
    """Flows of all instances plus, per instance (by position), NCCL's plan and its fixed costs.

    `fill[i]` multiplies the instance's simulated transfer time by its pipeline fill (1 for rings,
    all-to-all and p2p); `latency_ns[i]` is NCCL's own latency for the plan (not in the flows).
    """

    flows: Flows
    plans: list[tuning.Plan | None]
    fill: np.ndarray
    latency_ns: np.ndarray


def channels_for(topology: Topology) -> int:
    """Channels of point-to-point and all-to-all traffic: one per NIC port of a GPU."""
    return max(1, topology.spec.nics_per_gpu * topology.spec.planes)


def hierarchical_ring(gpus: np.ndarray) -> np.ndarray:
    """Positions of the participants in ring order: by GPU index (hosts contiguous)."""
    return np.argsort(gpus, kind="stable")


def channel_ring(gpus: np.ndarray, gpus_per_host: int, channel: int, ports_per_gpu: int) -> np.ndarray:
    """Positions of the participants in channel `channel`'s ring, as NCCL lays it out: hosts in
    order, and inside each host the GPUs rotated to start at the one whose NIC the channel uses
    (NIC slot `channel // ports_per_gpu`), so the ring enters and leaves each host on that rail."""
    order = hierarchical_ring(gpus)
    if not order.size:
        return order
    hosts = gpus[order] // gpus_per_host
    first = np.flatnonzero(np.r_[True, hosts[1:] != hosts[:-1]])  # hosts are contiguous in ring order
    size = np.diff(np.r_[first, order.size])
    start = np.repeat(first, size)
    shift = np.repeat((channel // ports_per_gpu) % size, size)
    within = np.arange(order.size) - start
    return order[start + (within + shift) % np.repeat(size, size)]


def decompose(instances: Sequence[Instance], topology: Topology, gpu_of_rank: Mapping[int, int] | np.ndarray,
              *, rings: Mapping[str, list[list[int]]] | None = None, algo: str = "auto",
              proto: str = "auto", channels: Mapping[str, int] | None = None,
              hops: Mapping[str, Mapping[tuple[int, int, int], tuple[int, int]]] | None = None) -> Flows:
    """Flows for every instance (release 0; `key` = instance key). See `decompose_plan`."""
    return decompose_plan(instances, topology, gpu_of_rank, rings=rings, algo=algo, proto=proto,
                          channels=channels, hops=hops).flows


def decompose_plan(instances: Sequence[Instance], topology: Topology,
                   gpu_of_rank: Mapping[int, int] | np.ndarray, *,
                   rings: Mapping[str, list[list[int]]] | None = None, algo: str = "auto",
                   proto: str = "auto", channels: Mapping[str, int] | None = None,
                   hops: Mapping[str, Mapping[tuple[int, int, int], tuple[int, int]]] | None = None,
                   traced_on: tuple[Topology, Mapping[int, int] | np.ndarray] | None = None) -> Decomposition:
    """Flows, NCCL plans and fixed costs for every instance.

    `rings`: observed rings per group (one rank cycle per channel; all are used, and their count
    is the channel count); `channels`: channel count per group from NCCL logs; else NCCL's default
    for the topology. `hops`: per group, (channel, rank, next rank) of an observed ring edge NCCL
    sent over the network -> (rank whose NIC sent it, rank whose NIC received it), from NCCL logs
    (`tracekit.nccl_fabric.replay_fabric`): that edge leaves and enters through those GPUs' NICs (over
    NVLink to them when they are not the edge's own GPUs) and is never re-routed through a PXN proxy.
    `algo`/`proto`: "auto" follows each instance's traced algo/proto (one algorithm, or the set a
    kernel name narrows it to) where the shape can run it, and NCCL's tuning rule where unknown; a
    name forces it where the shape allows. `traced_on`: the (topology, placement) the trace was
    recorded on, when `topology` is a what-if: algorithms the what-if offers and that one did not
    (in-network reduction) are weighed against the traced choice by the tuning rule, since NCCL
    would have considered them.
    """
    acc = _Acc()
    spec = topology.spec
    gmap = np.asarray(gpu_of_rank) if not isinstance(gpu_of_rank, Mapping) else None
    p2p_ch = channels_for(topology)
    ring_cache: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    plans: list[tuning.Plan | None] = []
    fill = np.ones(len(instances))
    latency = np.zeros(len(instances))

    def gpu(rank: int) -> int:
        return int(gmap[rank]) if gmap is not None else int(gpu_of_rank[rank])

    def newly_offered(op: str, ranks: list[int], shape: tuning.Shape) -> frozenset[str]:
        if traced_on is None:
            return frozenset()
        base_topo, base_map = traced_on
        base_gpus = [int(base_map[r]) for r in ranks]
        base = tuning.shape_of(base_topo, base_gpus, n_ranks=len(ranks))
        return frozenset(a for a in tuning.ALGOS if tuning.offered(op, a, shape) and not tuning.offered(op, a, base))

    for idx, inst in enumerate(instances):
        ranks = list(inst.ranks)
        n = len(ranks)
        op = inst.op
        k = inst.key
        plans.append(None)
        if op in ("send", "recv", "sendrecv"):
            pairs = _p2p_pairs(inst, ranks)
            if not pairs:
                continue
            comm = ranks if len(ranks) >= 2 else [inst.src, inst.dst]
            shape = tuning.shape_of(topology, [gpu(r) for r in comm], n_ranks=len(comm))
            p2p = tuning.p2p_channels_per_peer(topology, shape, channels=(channels or {}).get(inst.group or ""),
                                               max_peers=inst.max_p2p_peers)
            senders, receivers = (np.array([gpu(r) for r in side]) for side in zip(*pairs, strict=True))
            plans[idx], latency[idx] = _p2p(acc, senders, receivers, np.full(len(pairs), float(inst.nbytes)), spec,
                                            shape, p2p, key=k, peers=1, proto=proto)
            continue
        if n < 2:
            continue
        gpus = np.array([gpu(r) for r in ranks], np.int64)
        if op == "all_to_all":
            shape = tuning.shape_of(topology, gpus.tolist(), n_ranks=n)
            p2p = tuning.p2p_channels_per_peer(topology, shape, channels=(channels or {}).get(inst.group or ""),
                                               max_peers=inst.max_p2p_peers)
            plans[idx], latency[idx] = _all_to_all(acc, inst, ranks, gpus, spec, shape, p2p, proto=proto)
            continue
        if op in ("gather", "scatter"):
            root = inst.root if inst.root in ranks else ranks[0]
            rg = gpu(root)
            others = gpus[gpus != rg]
            per = inst.nbytes / n / p2p_ch
            for c in range(p2p_ch):
                if op == "gather":
                    acc.add(others, rg, per, channel=c, key=k)
                else:
                    acc.add(rg, others, per, channel=c, key=k)
            continue
        if op not in RING_OPS and op not in ("broadcast", "reduce"):
            continue
        shape = tuning.shape_of(topology, gpus.tolist(), n_ranks=n)
        observed = [o for o in ((rings or {}).get(inst.group or "", [])) if _ring_order(o, ranks) is not None]
        n_ch = len(observed) or int((channels or {}).get(inst.group or "", 0)) or tuning.default_channels(
            topology, shape)
        want_algo = inst.algo if algo == "auto" else algo
        want_proto = inst.proto if proto == "auto" else proto
        source = "trace" if algo == "auto" and (inst.algo or inst.proto) else "forced"
        coll = "all_reduce" if op == "barrier" else op
        also = newly_offered(coll, ranks, shape) if algo == "auto" and want_algo else frozenset()
        plan = tuning.select(coll, inst.nbytes, shape, n_ch, algo=want_algo, proto=want_proto, source=source,
                             also=also)
        plans[idx] = plan
        latency[idx] = plan.latency_us * 1000.0
        s_wire = inst.nbytes / plan.efficiency
        ports = spec.nics_per_gpu * spec.planes
        per_host = spec.gpus
        if op in ("broadcast", "reduce"):
            root = inst.root if inst.root in ranks else ranks[0]
            for c in range(n_ch):
                order = gpus[channel_ring(gpus, per_host, c, ports)]
                start = int(np.nonzero(order == gpu(root))[0][0])
                chain = np.roll(order, -start)
                src, dst = (chain[:-1], chain[1:]) if op == "broadcast" else (chain[1:], chain[:-1])
                acc.add(src, dst, s_wire / n_ch, lat_mult=n - 1, channel=c, key=k)
            fill[idx] = plan.fill_factor(inst.nbytes / n_ch)
            continue
        if plan.algo == "nvls" and shape.n_nodes == 1:
            acc.add(gpus, gpus, s_wire, lat_mult=2.0, mode=MODE_NVLS_UP, key=k)
            acc.add(gpus, gpus, s_wire, lat_mult=2.0, mode=MODE_NVLS_DOWN, key=k)
            fill[idx] = plan.fill_factor(inst.nbytes / n_ch)
            continue
        if plan.algo in ("nvls", "collnet_direct", "collnet_chain"):
            _sharp(acc, inst, gpus, topology, n_ch, s_wire, nvls=plan.algo == "nvls")
            fill[idx] = plan.fill_factor(inst.nbytes / n_ch)
            continue
        if plan.algo in ("tree", "nvls_tree") and op == "all_reduce":
            nvls_tree = plan.algo == "nvls_tree"
            # NVLS-tree: the multimem stages run at NVLS's measured efficiency, the NIC tree at the tree's
            s_tree = inst.nbytes / tuning.efficiency(op, "tree", "Simple", shape) if nvls_tree else s_wire
            s_nvls = inst.nbytes / shape.nvls_efficiency if nvls_tree else s_wire
            _tree(acc, inst, gpus, topology, n_ch, s_tree, plan, nvls=nvls_tree, s_nvls=s_nvls)
            fill[idx] = plan.fill_factor(inst.nbytes / n_ch)
            continue
        steps = {"all_reduce": 2 * (n - 1), "barrier": 2 * (n - 1)}.get(op, n - 1)
        factor = {"all_reduce": 2 * (n - 1) / n, "barrier": 0.0}.get(op, (n - 1) / n)
        per = s_wire * factor / n_ch
        edge_hops = (hops or {}).get(inst.group or "") if observed else None
        channel_cap = (hardware.ring_net_channel_gbs(shape.n_nodes, spec.ring_channel_gbs, spec.nic_gbps)
                       if plan.proto == "Simple" else np.inf)
        for c in range(n_ch):
            order = _ring_order(observed[c], ranks) if observed else channel_ring(gpus, per_host, c, ports)
            ring = gpus[order]
            if edge_hops:
                src, dst, mode = _ring_hops(observed[c], ring, c, edge_hops, gpu, per_host, ring_cache)
                acc.add(src, dst, per, lat_mult=steps, channel=c, mode=mode, key=k,
                        max_gbs=_net_hop_cap(spec, src, dst, channel_cap))
                continue
            nxt = np.roll(ring, -1)
            acc.add(ring, nxt, per, lat_mult=steps, channel=c, key=k,
                    max_gbs=_net_hop_cap(spec, ring, nxt, channel_cap))
    return Decomposition(acc.flows(), plans, fill, latency)


def _net_hop_cap(spec: TopologySpec, src: np.ndarray, dst: np.ndarray, cap_gbs: float) -> np.ndarray | float:
    """Per ring hop, the channel's ceiling where the hop crosses the network, else no limit."""
    if not np.isfinite(cap_gbs):
        return np.inf
    return np.where(tuning.p2p_links(spec, src, dst) == tuning.P2P_LINKS.index("net"), cap_gbs, np.inf)


def _ring_hops(ring_ranks: list[int], ring: np.ndarray, channel: int,
               hops: Mapping[tuple[int, int, int], tuple[int, int]], gpu: Callable[[int], int], per_host: int,
               cache: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray, np.ndarray]]
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flows of one observed ring channel: a network edge goes from the GPU whose NIC NCCL sent
    it with to the GPU whose NIC received it (MODE_NET), with NVLink legs to and from them. A NIC
    GPU placed on another host than the edge's own GPU (a what-if placement) is not used."""
    key = (id(hops), channel, tuple(ring_ranks))
    hit = cache.get(key)
    if hit is not None:
        return hit
    src: list[int] = []
    dst: list[int] = []
    mode: list[int] = []

    def add(a: int, b: int, m: int) -> None:
        src.append(a)
        dst.append(b)
        mode.append(m)

    n = len(ring_ranks)
    for i, a in enumerate(ring_ranks):
        b = ring_ranks[(i + 1) % n]
        ga, gb = int(ring[i]), int(ring[(i + 1) % n])
        hop = hops.get((channel, a, b))
        if hop is None:
            add(ga, gb, MODE_GPU)
            continue
        gs, gr = _gpu_or(gpu, hop[0], ga), _gpu_or(gpu, hop[1], gb)
        gs = gs if gs // per_host == ga // per_host else ga
        gr = gr if gr // per_host == gb // per_host else gb
        if gs != ga:
            add(ga, gs, MODE_GPU)
        add(gs, gr, MODE_NET)
        if gr != gb:
            add(gr, gb, MODE_GPU)
    out = (np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(mode, np.int64))
    cache[key] = out
    return out


def _gpu_or(gpu: Callable[[int], int], rank: int, default: int) -> int:
    try:
        return gpu(rank)
    except (KeyError, IndexError):
        return default


def _ring_order(ring: list[int], ranks: list[int]) -> np.ndarray | None:
    pos = {r: i for i, r in enumerate(ranks)}
    if sorted(ring) != sorted(ranks):
        return None
    return np.array([pos[r] for r in ring], np.int64)


def _p2p_pairs(inst: Instance, ranks: list[int]) -> list[tuple[int, int]]:
    """(sender, receiver) ranks of a p2p instance: one pair for send/recv; for nccl-tests'
    `sendrecv`, every rank of the group to the next one (a ring of pairs)."""
    if inst.op == "sendrecv":
        return [(a, b) for a, b in zip(ranks, ranks[1:] + ranks[:1], strict=True) if a != b]
    if inst.src is None or inst.dst is None or inst.src == inst.dst:
        return []
    return [(inst.src, inst.dst)]


def _p2p(acc: _Acc, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, spec: TopologySpec, shape: tuning.Shape,
         p2p: tuning.P2pChannels, *, key: int, peers: int, proto: str = "auto") -> tuple[tuning.Plan, float]:
    """Flows of p2p sends (source GPUs, destination GPUs, bytes), as NCCL runs them: each send is
    split over the channels NCCL gives an operation of its size (`P2pChannels.op_channels`), one
    flow per channel, each flow no faster than one p2p channel over its link (`p2p_channel_gbs`);
    LL (at most 16 KiB per channel, or forced by `proto`) carries 8 bytes per 4. Returns the plan
    and its latency (ns): the slowest send's, with `peers` operations per rank."""
    src, dst, nbytes = (np.asarray(a) for a in (src, dst, nbytes))
    keep = (src != dst) & (nbytes > 0)
    src, dst, nbytes = src[keep].astype(np.int64), dst[keep].astype(np.int64), nbytes[keep].astype(np.float64)
    link = tuning.p2p_links(spec, src, dst)
    n_op = p2p.op_channels(nbytes, shape.n_nodes)
    forced = tuning.normalize_proto(proto)
    ll = nbytes <= n_op * tuning.P2P_LL_THRESHOLD if forced not in ("LL", "Simple") else np.full(
        src.size, forced == "LL")
    if src.size:
        total = int(n_op.sum())
        first = np.cumsum(n_op) - n_op
        per_link = shape.nvlink_link_gbs
        rate = np.array([tuning.p2p_channel_gbs(name, per_link) for name in tuning.P2P_LINKS])[link]
        acc.add(np.repeat(src, n_op), np.repeat(dst, n_op), np.repeat(nbytes / np.where(ll, 0.5, 1.0) / n_op, n_op),
                channel=np.arange(total) - np.repeat(first, n_op), key=key, max_gbs=np.repeat(rate, n_op))
    kinds = set(zip(ll.tolist(), link.tolist(), n_op.tolist(), strict=True))
    latency_us = max((tuning.p2p_latency_us("LL" if is_ll else "Simple", tuning.P2P_LINKS[i], peers=peers,
                                            op_channels=c, p2p=p2p) for is_ll, i, c in kinds), default=0.0)
    proto = "LL" if src.size and ll.all() else "Simple"
    plan = tuning.Plan(algo="p2p", proto=proto, channels=int(n_op.max(initial=1)), depth=1,
                       chunk_bytes=float(p2p.chunk_bytes), efficiency=0.5 if proto == "LL" else 1.0,
                       latency_us=latency_us)
    return plan, latency_us * 1000.0


def _all_to_all(acc: _Acc, inst: Instance, ranks: list[int], gpus: np.ndarray, spec: TopologySpec,
                shape: tuning.Shape,
                p2p: tuning.P2pChannels, *, proto: str = "auto") -> tuple[tuning.Plan, float]:
    """Every rank sends its split to every other rank at once (grouped sends, `_p2p`); the latency
    counts each rank's n-1 peers against the comm's p2p channels."""
    n = len(ranks)
    src, dst, nbytes = [], [], []
    for i, r in enumerate(ranks):
        splits = inst.splits.get(r)
        row = np.full(n, inst.nbytes / n) if splits is None or len(splits) != n else np.asarray(splits, np.float64)
        mask = (np.arange(n) != i) & (row > 0) & (gpus != gpus[i])
        src.append(np.full(int(mask.sum()), gpus[i]))
        dst.append(gpus[mask])
        nbytes.append(row[mask])
    return _p2p(acc, np.concatenate(src), np.concatenate(dst), np.concatenate(nbytes), spec, shape, p2p,
                key=inst.key, peers=n - 1, proto=proto)


def _host_chains(gpus: np.ndarray, per_host: int, channel: int, ports: int) -> list[np.ndarray]:
    """Per host (in order), its participating GPUs starting at the channel's NIC slot."""
    ordered = gpus[channel_ring(gpus, per_host, channel, ports)]
    hosts = ordered // per_host
    return np.split(ordered, np.flatnonzero(hosts[1:] != hosts[:-1]) + 1) if ordered.size else []


def btree_parent(pos: int, m: int) -> int | None:
    """The parent of position `pos` in NCCL's binary tree over `m` nodes (src/graph/trees.cc), or
    None at the root (position 0): clear the lowest set bit and set the next one up, or just clear
    it when that falls outside."""
    if pos == 0:
        return None
    bit = pos & -pos
    up = (pos ^ bit) | (bit << 1)
    return up if up < m else pos ^ bit


def dtree_parent(pos: int, m: int, second: bool) -> int | None:
    """The parent in one of NCCL's two trees: the second is the first mirrored (node k plays m-1-k)
    when m is even, shifted by one node when m is odd, so a node interior in one is a leaf in the other."""
    if not second:
        return btree_parent(pos, m)
    if m % 2:
        up = btree_parent((pos - 1) % m, m)
        return None if up is None else (up + 1) % m
    up = btree_parent(m - 1 - pos, m)
    return None if up is None else m - 1 - up


def _btree_parents(m: int, mirrored: bool) -> list[tuple[int, int]]:
    """(child, parent) host positions of one of NCCL's double binary trees over `m` hosts."""
    pairs = [(pos, dtree_parent(pos, m, mirrored)) for pos in range(m)]
    return [(c, p) for c, p in pairs if p is not None]


def _tree(acc: _Acc, inst: Instance, gpus: np.ndarray, topology: Topology, n_ch: int, s_wire: float,
          plan: tuning.Plan, *, nvls: bool, s_nvls: float = 0.0) -> None:
    """NCCL's tree all-reduce: per channel a chain inside each host from the channel's NIC GPU
    (or NVLS within the host for NVLS-tree) and a binary tree over the hosts' head GPUs; the
    second half of the channels use the mirrored tree. Every edge carries S/C each way."""
    spec = topology.spec
    per = s_wire / n_ch
    lat = float(plan.depth)
    k = inst.key
    if nvls:
        acc.add(gpus, gpus, s_nvls or s_wire, lat_mult=lat, mode=MODE_NVLS_UP, key=k)
        acc.add(gpus, gpus, s_nvls or s_wire, lat_mult=lat, mode=MODE_NVLS_DOWN, key=k)
    ports = spec.nics_per_gpu * spec.planes
    for c in range(n_ch):
        chains = _host_chains(gpus, spec.gpus, c, ports)
        if not nvls:
            for members in chains:
                if members.size > 1:
                    acc.add(members[1:], members[:-1], per, lat_mult=lat, channel=c, key=k)
                    acc.add(members[:-1], members[1:], per, lat_mult=lat, channel=c, key=k)
        heads = [int(m[0]) for m in chains]
        for child, parent in _btree_parents(len(heads), mirrored=c >= (n_ch + 1) // 2 and n_ch > 1):
            acc.add(heads[child], heads[parent], per, lat_mult=lat, channel=c, key=k)
            acc.add(heads[parent], heads[child], per, lat_mult=lat, channel=c, key=k)


def _sharp(acc: _Acc, inst: Instance, gpus: np.ndarray, topology: Topology, n_ch: int, s_wire: float,
           *, nvls: bool) -> None:
    """In-network reduction (CollNet/SHARP, or NVLS+SHARP): each host reduces inside (a ring
    reduce-scatter + all-gather, or NVLS), each GPU sends its 1/l share up to its leaf and gets it
    back, and every switch tier the channel's leaves span (spine, core) reduces once more."""
    spec = topology.spec
    per_host = spec.gpus
    hosts = gpus // per_host
    k = spec.nics_per_gpu
    tables = topology.route.tables
    nic_leaf, leaf_pod = tables.nic_leaf, tables.leaf_pod
    key = inst.key
    # (channel, shard) -> switch -> bytes: shard `pos` of a host (its GPU `pos`'s share) meets the
    # same shard of the other hosts at a switch; it climbs a tier only when they are apart.
    at_leaf: dict[tuple[int, int], dict[int, float]] = {}
    at_pod: dict[tuple[int, int], dict[int, float]] = {}
    if nvls:
        acc.add(gpus, gpus, s_wire, lat_mult=2.0, mode=MODE_NVLS_UP, key=key)
        acc.add(gpus, gpus, s_wire, lat_mult=2.0, mode=MODE_NVLS_DOWN, key=key)
    for h in np.unique(hosts):
        members = np.sort(gpus[hosts == h])
        loc = members.size
        if loc > 1 and not nvls:
            per = 2 * (loc - 1) / loc * s_wire / n_ch
            for c in range(n_ch):
                acc.add(members, np.roll(members, -1), per, lat_mult=2 * (loc - 1), channel=c, key=key)
        share = s_wire / loc / n_ch
        for c in range(n_ch):
            acc.add(members, members, share, lat_mult=2.0, channel=c, mode=MODE_LEAF_UP, key=key)
            acc.add(members, members, share, lat_mult=2.0, channel=c, mode=MODE_LEAF_DOWN, key=key)
            j, p = c % k, (c // k) % spec.planes
            for pos, g in enumerate(members):
                leaf = int(nic_leaf[int(g) * k + j, p])
                at_leaf.setdefault((c, pos), {})[leaf] = share
                at_pod.setdefault((c, pos), {})[int(leaf_pod[leaf])] = share
    for tier, up, down in ((at_leaf, MODE_SPINE_UP, MODE_SPINE_DOWN), (at_pod, MODE_CORE_UP, MODE_CORE_DOWN)):
        load: dict[tuple[int, int], float] = {}
        for (c, _pos), where in tier.items():
            if len(where) > 1:
                for switch, b in where.items():
                    load[switch, c] = load.get((switch, c), 0.0) + b
        for (switch, c), b in sorted(load.items()):
            acc.add(switch, switch, b, lat_mult=2.0, channel=c, mode=up, key=key)
            acc.add(switch, switch, b, lat_mult=2.0, channel=c, mode=down, key=key)
