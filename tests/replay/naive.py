"""A slow, obviously correct twin of the fluid simulator: full progressive filling at every event."""

from __future__ import annotations

import math

import numpy as np


def progressive_filling(paths: dict[int, list[int]], cap: np.ndarray,
                        weight: dict[int, float] | None = None) -> dict[int, float]:
    """Weighted max-min fair rates of the flows `paths` (flow -> resources) on capacities `cap`:
    every unfrozen flow's rate rises as `weight x level` (weight 1 when not given)."""
    w = {f: 1.0 if weight is None else float(weight[f]) for f in paths}
    rates: dict[int, float] = {}
    unfrozen = set(paths)
    remaining = {r: float(cap[r]) for p in paths.values() for r in p}
    while unfrozen:
        share = {}
        for r, c in remaining.items():
            wsum = sum(w[f] for f in unfrozen if r in paths[f])
            if wsum:
                share[r] = max(c, 0.0) / wsum
        r_min = min(share, key=lambda r: (share[r], r))
        inc = share[r_min]
        for f in unfrozen:
            rates[f] = rates.get(f, 0.0) + inc * w[f]
            for r in paths[f]:
                remaining[r] -= inc * w[f]
        saturated = {r for r, c in remaining.items() if c <= 1e-9 * cap[r]}
        saturated.add(r_min)
        unfrozen = {f for f in unfrozen if not saturated.intersection(paths[f])}
    return rates


def simulate_naive(indptr, res, nbytes, release, lat_mult, cap, res_lat, rel_eps=1e-9, windows=None,
                   weight=None):
    """Finish time of every flow (ns). With `windows=(n_windows, window_ns)` also the bytes each
    resource carried in each window from t = 0 (rate x overlap per flow, hop and interval), as
    (finish, bytes[resource, window]). `weight`: per flow, for weighted max-min (default all 1)."""
    n = len(nbytes)
    n_win, width = windows if windows is not None else (0, 1.0)
    win = np.zeros((len(cap), n_win))
    paths = {f: [int(r) for r in res[indptr[f]:indptr[f + 1]]] for f in range(n)}
    latency = [lat_mult[f] * sum(res_lat[r] for r in paths[f]) for f in range(n)]
    finish = np.full(n, np.nan)
    rem = {f: float(nbytes[f]) for f in range(n)}
    pending = sorted(range(n), key=lambda f: (release[f], f))
    active: dict[int, float] = {}
    t = -math.inf
    while pending or active:
        t_rel = release[pending[0]] if pending else math.inf
        t_fin = min((t + rem[f] / r for f, r in active.items()), default=math.inf)
        now = min(t_rel, t_fin)
        for f, r in active.items():
            rem[f] -= r * (now - t)
            for w in range(n_win):
                overlap = min(now, (w + 1) * width) - max(t, w * width)
                if overlap > 0:
                    for hop in paths[f]:
                        win[hop, w] += r * overlap
        tol = rel_eps * abs(now) + 1e-6
        for f in list(active):
            if rem[f] <= tol * active[f]:
                finish[f] = now + latency[f]
                del active[f]
        while pending and release[pending[0]] <= now + tol:
            f = pending.pop(0)
            if rem[f] <= 0 or not paths[f]:
                finish[f] = release[f] + latency[f] + (0.0 if rem[f] <= 0 else math.inf)
                continue
            active[f] = 0.0
        if active:
            active = progressive_filling({f: paths[f] for f in active}, cap,
                                         None if weight is None else {f: weight[f] for f in active})
        t = now
    return finish if windows is None else (finish, win)


def schedule_naive(prev, deps, slack, tr_start, dur, inst, members, inst_dur, end_frac):
    """Replayed start/end per event (the rules of `_kernels.schedule`, recomputed by repeated
    passes): an event starts at the latest end of its lane predecessor `prev[i]` and of its
    dependencies `deps` ((src, dst) pairs) plus its slack (its traced start when it has none); a
    member of instance k arrives then; when all of `members[k]` have arrived, member j ends
    `end_frac[j] * inst_dur[k]` after the last arrival. Inputs must be acyclic."""
    n = len(tr_start)
    preds = [[] for _ in range(n)]
    for i in range(n):
        if prev[i] >= 0:
            preds[i].append(int(prev[i]))
    for s, d in deps:
        preds[d].append(int(s))
    start = [None] * n
    end = [None] * n
    inst_start = [None] * len(members)
    while any(e is None for e in end):
        progress = False
        for i in range(n):
            if start[i] is None and all(end[p] is not None for p in preds[i]):
                start[i] = max(end[p] for p in preds[i]) + slack[i] if preds[i] else tr_start[i]
                if inst[i] < 0:
                    end[i] = start[i] + dur[i]
                progress = True
        for k, ms in enumerate(members):
            if inst_start[k] is None and all(start[j] is not None for j in ms):
                inst_start[k] = max(start[j] for j in ms)
                for j in ms:
                    end[j] = inst_start[k] + inst_dur[k] * end_frac[j]
                progress = True
        if not progress:
            raise ValueError("cyclic input")
    return np.array(start, float), np.array(end, float), np.array(inst_start, float)


MASK64 = (1 << 64) - 1


def splitmix64_mix_naive(x: int) -> int:
    """splitmix64's finaliser on a Python int, every product masked back to 64 bits."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def flow_hash_naive(a: int, b: int, c: int, d: int) -> int:
    """`_kernels.flow_hash` in Python ints: start from the golden-ratio constant, absorb each input
    (masked to 63 bits) by xor and mix; drop the lowest bit so the result fits a signed int64."""
    x = 0x9E3779B97F4A7C15
    for v in (a, b, c, d):
        x = splitmix64_mix_naive(x ^ (int(v) & 0x7FFFFFFFFFFFFFFF))
    return x >> 1


def route_fat_tree_naive(t, mode: int, src: int, dst: int, channel: int, fhash: int) -> list[int]:
    """Resources of one flow on fat-tree tables `t` (a `FatTreeTables`), hop by hop as the modes read."""
    nic_j = channel % t.nics_per_gpu
    plane = (channel // t.nics_per_gpu) % t.planes
    spine = fhash % t.leaf_spine_up.shape[1]
    core = (fhash // t.leaf_spine_up.shape[1]) % t.spine_core_up.shape[2]
    if mode in (5, 6):
        r = int((t.nvl_up if mode == 5 else t.nvl_down)[src])
        return [r] if r >= 0 else []
    if mode in (1, 2):
        nic = src * t.nics_per_gpu + nic_j
        up = [int(t.pcie_up[nic]), int(t.nic_leaf_up[nic, plane])]
        return up if mode == 1 else [int(t.leaf_nic_down[nic, plane]), int(t.pcie_down[nic])]
    if mode in (3, 4):
        if t.leaf_spine_up[src, 0] < 0:
            return []
        if t.spray:
            return [int((t.leaf_up_agg if mode == 3 else t.leaf_down_agg)[src])]
        return [int((t.leaf_spine_up if mode == 3 else t.spine_leaf_down)[src, spine])]
    if mode in (7, 8):
        if t.spine_core_up[src, 0, 0] < 0:
            return []
        if t.spray:
            return [int((t.pod_up_agg if mode == 7 else t.pod_down_agg)[src])]
        return [int((t.spine_core_up if mode == 7 else t.core_spine_down)[src, spine, core])]
    if src == dst:
        return []
    same_domain = t.domain > 1 and src // t.domain == dst // t.domain
    if same_domain:
        return [int(t.nvl_up[src]), int(t.nvl_down[dst])]
    path: list[int] = []
    sender = src
    proxy = src - src % t.gpus_per_host + dst % t.gpus_per_host
    if t.pxn and mode == 0 and t.domain > 1 and proxy != src and proxy // t.domain == src // t.domain:
        path += [int(t.nvl_up[src]), int(t.nvl_down[proxy])]
        sender = proxy
    ns, nd = sender * t.nics_per_gpu + nic_j, dst * t.nics_per_gpu + nic_j
    leaf_s, leaf_d = int(t.nic_leaf[ns, plane]), int(t.nic_leaf[nd, plane])
    path += [int(t.pcie_up[ns]), int(t.nic_leaf_up[ns, plane])]
    if leaf_s != leaf_d:
        pod_s, pod_d = int(t.leaf_pod[leaf_s]), int(t.leaf_pod[leaf_d])
        if t.spray:
            middle = [t.leaf_up_agg[leaf_s], t.leaf_down_agg[leaf_d]] if pod_s == pod_d else [
                t.leaf_up_agg[leaf_s], t.pod_up_agg[pod_s], t.pod_down_agg[pod_d], t.leaf_down_agg[leaf_d]]
        elif pod_s == pod_d:
            middle = [t.leaf_spine_up[leaf_s, spine], t.spine_leaf_down[leaf_d, spine]]
        else:
            middle = [t.leaf_spine_up[leaf_s, spine], t.spine_core_up[pod_s, spine, core],
                      t.core_spine_down[pod_d, spine, core], t.spine_leaf_down[leaf_d, spine]]
        path += [int(x) for x in middle]
    return [*path, int(t.leaf_nic_down[nd, plane]), int(t.pcie_down[nd])]


def route_graph_naive(t, src: int, dst: int, fhash: int) -> list[int] | None:
    """Resources of one GPU -> GPU flow on graph tables `t` (a `GraphTables`): NVLink inside a host,
    else its NIC's PCIe link, then at each node the next hop picked by `flow_hash_naive(fhash, hop,
    node, 0)` among the neighbours (in adjacency order) one hop nearer the destination's NIC through
    switches (hops by a breadth-first search of our own, not the tables' `dist`), then the
    destination's PCIe link. None when the NICs are not connected."""
    if src == dst:
        return []
    if t.gpu_host[src] == t.gpu_host[dst]:
        return [int(t.nvl_up[src]), int(t.nvl_down[dst])]
    target = int(t.gpu_nic[dst])
    hops = {target: 0}
    todo = [target]
    for u in todo:  # grows while it is read: a queue
        if u != target and not t.transit[u]:
            continue  # a host's NIC is an end, never a way through
        for v in t.adj_node[t.adj_ptr[u]:t.adj_ptr[u + 1]].tolist():
            if v not in hops:
                hops[v] = hops[u] + 1
                todo.append(v)
    u = int(t.gpu_nic[src])
    if u not in hops:
        return None
    path = [int(t.pcie_up[src])]
    hop = 0
    while u != target:
        nearer = [(int(t.adj_node[e]), int(t.adj_res[e])) for e in range(t.adj_ptr[u], t.adj_ptr[u + 1])
                  if hops.get(int(t.adj_node[e])) == hops[u] - 1
                  and (t.transit[t.adj_node[e]] or t.adj_node[e] == target)]
        u, r = nearer[flow_hash_naive(fhash, hop, u, 0) % len(nearer)]
        path.append(r)
        hop += 1
    return [*path, int(t.pcie_down[dst])]


def nccl_btree_children_naive(m: int) -> dict[int, list[int]]:
    """Children of every node of NCCL's binary tree over m nodes, built top-down (the direction
    trees.cc computes `down0`/`down1`): the root 0 has one child, the highest power of two below m;
    a node whose lowest set bit is b has children pos - b/2 and the first of pos + b/2, pos + b/4,
    ... that exists."""
    children: dict[int, list[int]] = {p: [] for p in range(m)}
    if m < 2:
        return children
    top = 1 << (m - 1).bit_length() - 1
    children[0].append(top)
    stack = [top]
    while stack:
        pos = stack.pop()
        low = (pos & -pos) >> 1
        if low == 0:
            continue
        children[pos].append(pos - low)
        stack.append(pos - low)
        step = low
        while step and pos + step >= m:
            step >>= 1
        if step:
            children[pos].append(pos + step)
            stack.append(pos + step)
    return children
