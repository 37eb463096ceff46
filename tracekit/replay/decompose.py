"""Collective instances -> flows (bytes, path endpoints, latency multiplier), per algorithm.

Byte counts per flow are in docs/replay.md. All flows of an instance are released together at
the instance start: a ring is modelled as pipelined (every hop carries its whole share at once),
and its step count goes into the latency multiplier.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from tracekit.replay.simulate import (
    MODE_GPU,
    MODE_LEAF_DOWN,
    MODE_LEAF_UP,
    MODE_NVLS_DOWN,
    MODE_NVLS_UP,
    MODE_SPINE_DOWN,
    MODE_SPINE_UP,
    Flows,
)
from tracekit.replay.topology import Topology

RING_OPS = ("all_reduce", "all_gather", "reduce_scatter", "barrier")


@dataclass
class Instance:
    """One collective call across its participants (global ranks in group order)."""

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


class _Acc:
    def __init__(self) -> None:
        self.cols: dict[str, list[np.ndarray]] = {k: [] for k in (
            "src", "dst", "nbytes", "lat_mult", "channel", "mode", "key")}

    def add(self, src, dst, nbytes, *, lat_mult=1.0, channel=0, mode=MODE_GPU, key=0) -> None:
        src = np.atleast_1d(np.asarray(src, np.int64))
        n = src.size
        for name, value, dtype in (("src", src, np.int64), ("dst", dst, np.int64),
                                   ("nbytes", nbytes, np.float64), ("lat_mult", lat_mult, np.float64),
                                   ("channel", channel, np.int64), ("mode", mode, np.int64),
                                   ("key", key, np.int64)):
            self.cols[name].append(np.broadcast_to(np.asarray(value, dtype), (n,)).copy())

    def flows(self) -> Flows:
        if not self.cols["src"]:
            return Flows.from_lists([], [], [])
        c = {k: np.concatenate(v) for k, v in self.cols.items()}
        return Flows(c["src"], c["dst"], c["nbytes"], np.zeros(c["src"].size), c["lat_mult"],
                     c["channel"], c["mode"], c["key"])


def channels_for(topology: Topology) -> int:
    """Rings/channels used per collective: one per NIC port (NICs per GPU x planes)."""
    return max(1, topology.spec.nics_per_gpu * topology.spec.planes)


def hierarchical_ring(gpus: np.ndarray) -> np.ndarray:
    """Positions of the participants in ring order: by GPU index (hosts contiguous)."""
    return np.argsort(gpus, kind="stable")


def decompose(instances: Sequence[Instance], topology: Topology, gpu_of_rank: Mapping[int, int] | np.ndarray,
              *, rings: Mapping[str, list[list[int]]] | None = None, algo: str = "auto") -> Flows:
    """Flows for every instance (release 0; `key` = instance key)."""
    acc = _Acc()
    n_ch = channels_for(topology)
    spec = topology.spec
    gmap = np.asarray(gpu_of_rank) if not isinstance(gpu_of_rank, Mapping) else None

    def gpu(rank: int) -> int:
        return int(gmap[rank]) if gmap is not None else int(gpu_of_rank[rank])

    domain = topology.route["domain"]
    for inst in instances:
        ranks = list(inst.ranks)
        n = len(ranks)
        op = inst.op
        k = inst.key
        if op in ("send", "recv"):
            if inst.src is None or inst.dst is None or inst.src == inst.dst:
                continue
            s, d = gpu(inst.src), gpu(inst.dst)
            acc.add([s] * n_ch, [d] * n_ch, inst.nbytes / n_ch, channel=np.arange(n_ch), key=k)
            continue
        if n < 2:
            continue
        gpus = np.array([gpu(r) for r in ranks], np.int64)
        chosen = (inst.algo or "").lower() if algo == "auto" else algo
        if op == "all_to_all":
            _all_to_all(acc, inst, ranks, gpus, n_ch)
            continue
        if op in ("gather", "scatter"):
            root = inst.root if inst.root in ranks else ranks[0]
            rg = gpu(root)
            others = gpus[gpus != rg]
            per = inst.nbytes / n / n_ch
            for c in range(n_ch):
                if op == "gather":
                    acc.add(others, rg, per, channel=c, key=k)
                else:
                    acc.add(rg, others, per, channel=c, key=k)
            continue
        if op in ("broadcast", "reduce"):
            root = inst.root if inst.root in ranks else ranks[0]
            order = gpus[hierarchical_ring(gpus)]
            start = int(np.nonzero(order == gpu(root))[0][0])
            chain = np.roll(order, -start)
            src, dst = (chain[:-1], chain[1:]) if op == "broadcast" else (chain[1:], chain[:-1])
            for c in range(n_ch):
                acc.add(src, dst, inst.nbytes / n_ch, lat_mult=n - 1, channel=c, key=k)
            continue
        if op not in RING_OPS:
            continue
        same_domain = len(set((gpus // domain).tolist())) == 1
        if op == "all_reduce" and spec.nvls and same_domain and domain > 1:
            acc.add(gpus, gpus, inst.nbytes, lat_mult=2.0, mode=MODE_NVLS_UP, key=k)
            acc.add(gpus, gpus, inst.nbytes, lat_mult=2.0, mode=MODE_NVLS_DOWN, key=k)
            continue
        if op == "all_reduce" and spec.sharp and not same_domain and "ring" not in chosen:
            _sharp(acc, inst, gpus, topology, n_ch)
            continue
        if op == "all_reduce" and "tree" in chosen:
            _tree(acc, inst, gpus, topology, n_ch)
            continue
        steps = {"all_reduce": 2 * (n - 1), "barrier": 2 * (n - 1)}.get(op, n - 1)
        factor = {"all_reduce": 2 * (n - 1) / n, "barrier": 0.0}.get(op, (n - 1) / n)
        per = inst.nbytes * factor / n_ch
        observed = (rings or {}).get(inst.group or "", [])
        for c in range(n_ch):
            order = _ring_order(observed[c % len(observed)], ranks) if observed else None
            if order is None:
                order = hierarchical_ring(gpus)
            ring = gpus[order]
            acc.add(ring, np.roll(ring, -1), per, lat_mult=steps, channel=c, key=k)
    return acc.flows()


def _ring_order(ring: list[int], ranks: list[int]) -> np.ndarray | None:
    pos = {r: i for i, r in enumerate(ranks)}
    if sorted(ring) != sorted(ranks):
        return None
    return np.array([pos[r] for r in ring], np.int64)


def _all_to_all(acc: _Acc, inst: Instance, ranks: list[int], gpus: np.ndarray, n_ch: int) -> None:
    n = len(ranks)
    src, dst, nbytes = [], [], []
    for i, r in enumerate(ranks):
        splits = inst.splits.get(r)
        row = np.full(n, inst.nbytes / n) if splits is None or len(splits) != n else np.asarray(splits, np.float64)
        mask = (np.arange(n) != i) & (row > 0) & (gpus != gpus[i])
        src.append(np.full(int(mask.sum()), gpus[i]))
        dst.append(gpus[mask])
        nbytes.append(row[mask])
    s, d, b = np.concatenate(src), np.concatenate(dst), np.concatenate(nbytes)
    channel = np.arange(s.size) % n_ch
    acc.add(s, d, b, channel=channel, key=inst.key)


def _tree(acc: _Acc, inst: Instance, gpus: np.ndarray, topology: Topology, n_ch: int) -> None:
    """NCCL-style double binary tree over hosts (S/2 each), a chain inside each host."""
    per_host = topology.spec.gpus
    hosts = gpus // per_host
    order = np.argsort(gpus, kind="stable")
    leaders: list[int] = []
    chains: list[np.ndarray] = []
    for h in np.unique(hosts):
        members = gpus[order][hosts[order] == h]
        leaders.append(int(members[0]))
        chains.append(members)
    s = inst.nbytes
    m = len(leaders)
    depth = max(1, int(np.ceil(np.log2(m + 1))))
    local = max(len(c) for c in chains)
    lat = 2 * (depth + local - 1)
    for members in chains:
        if members.size > 1:
            for c in range(n_ch):
                acc.add(members[1:], members[:-1], s / n_ch, lat_mult=lat, channel=c, key=inst.key)
                acc.add(members[:-1], members[1:], s / n_ch, lat_mult=lat, channel=c, key=inst.key)
    if m < 2:
        return
    for tree in range(2):
        ids = list(range(m)) if tree == 0 else [m - 1 - i for i in range(m)]
        for pos in range(1, m):
            child = leaders[ids[pos]]
            parent = leaders[ids[(pos - 1) // 2]]
            for c in range(n_ch):
                part = s / 2 / n_ch
                acc.add(child, parent, part, lat_mult=lat, channel=c, key=inst.key)
                acc.add(parent, child, part, lat_mult=lat, channel=c, key=inst.key)


def _sharp(acc: _Acc, inst: Instance, gpus: np.ndarray, topology: Topology, n_ch: int) -> None:
    """In-network reduction: reduce-scatter inside each host, each GPU sends its 1/l share up to
    its leaf and receives it back, each leaf sends the reduced shares to the spine tier and back,
    then an all-gather inside the host."""
    per_host = topology.spec.gpus
    hosts = gpus // per_host
    s = inst.nbytes
    k = topology.spec.nics_per_gpu
    nic_leaf = topology.route["nic_leaf"]
    leaf_shares: dict[tuple[int, int], dict[int, float]] = {}
    for h in np.unique(hosts):
        members = np.sort(gpus[hosts == h])
        loc = members.size
        if loc > 1:
            per = 2 * (loc - 1) / loc * s / n_ch
            for c in range(n_ch):
                acc.add(members, np.roll(members, -1), per, lat_mult=2 * (loc - 1), channel=c,
                        key=inst.key)
        share = s / loc / n_ch
        for c in range(n_ch):
            acc.add(members, members, share, lat_mult=2.0, channel=c, mode=MODE_LEAF_UP, key=inst.key)
            acc.add(members, members, share, lat_mult=2.0, channel=c, mode=MODE_LEAF_DOWN, key=inst.key)
            j, p = c % k, (c // k) % topology.spec.planes
            for pos, g in enumerate(members):
                leaf = int(nic_leaf[int(g) * k + j, p])
                shares = leaf_shares.setdefault((leaf, c), {})
                shares[pos] = max(shares.get(pos, 0.0), share)
    leaves = {leaf for leaf, _ in leaf_shares}
    if len(leaves) > 1:
        for (leaf, c), shares in sorted(leaf_shares.items()):
            b = sum(shares.values())
            acc.add(leaf, leaf, b, lat_mult=2.0, channel=c, mode=MODE_SPINE_UP, key=inst.key)
            acc.add(leaf, leaf, b, lat_mult=2.0, channel=c, mode=MODE_SPINE_DOWN, key=inst.key)
