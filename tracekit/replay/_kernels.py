"""numba kernels for replay: routing to CSR paths, the max-min fair fluid simulator, and the
dependency scheduler. Kernels see numpy arrays, scalars and named tuples of them (`FatTreeTables`,
`GraphTables`) only, and read no module globals but the `FlowMode` constants."""

from __future__ import annotations

import math
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from tracekit._jit import njit

njit_inline = njit(inline=True)  # small helpers of hot loops


class FlowMode(IntEnum):
    """What a flow's `src`/`dst` name and which resources `route_flows` gives it."""

    GPU = 0          # GPU -> GPU (NVLink inside a domain, else NICs and fabric; PXN may relay)
    LEAF_UP = 1      # GPU -> its leaf (in-network reduction up)
    LEAF_DOWN = 2    # leaf -> GPU
    SPINE_UP = 3     # leaf -> spine tier (src = leaf index)
    SPINE_DOWN = 4   # spine tier -> leaf
    NVLS_UP = 5      # GPU -> NVSwitch (NVLS)
    NVLS_DOWN = 6    # NVSwitch -> GPU
    CORE_UP = 7      # spine tier of a pod -> core tier (src = pod index)
    CORE_DOWN = 8    # core tier -> spine tier of a pod
    NET = 9          # GPU -> GPU from the source GPU's own NIC, never through a PXN proxy


class FatTreeTables(NamedTuple):
    """The resource ids a fat-tree (or rail-optimized) flow can cross, -1 where there is none; what
    `route_flows` reads. NIC n is GPU n // nics_per_gpu's NIC n % nics_per_gpu; a flow on channel c
    uses NIC c % nics_per_gpu and plane (c // nics_per_gpu) % planes."""

    gpus_per_host: int
    nics_per_gpu: int
    planes: int
    domain: int                 # GPUs per NVLink domain (1: none)
    nvl_up: np.ndarray          # [gpu] GPU -> NVSwitch
    nvl_down: np.ndarray        # [gpu] NVSwitch -> GPU
    pcie_up: np.ndarray         # [nic] GPU -> NIC
    pcie_down: np.ndarray       # [nic] NIC -> GPU
    nic_leaf: np.ndarray        # [nic, plane] leaf index
    nic_leaf_up: np.ndarray     # [nic, plane] NIC -> leaf
    leaf_nic_down: np.ndarray   # [nic, plane] leaf -> NIC
    leaf_pod: np.ndarray        # [leaf] pod index
    leaf_spine_up: np.ndarray   # [leaf, spine of its pod] leaf -> spine
    spine_leaf_down: np.ndarray  # [leaf, spine of its pod] spine -> leaf
    spine_core_up: np.ndarray   # [pod, spine, core] spine -> core
    core_spine_down: np.ndarray  # [pod, spine, core] core -> spine
    leaf_up_agg: np.ndarray     # [leaf] all its uplinks as one resource (spray routing)
    leaf_down_agg: np.ndarray   # [leaf] all its downlinks from spines as one resource
    pod_up_agg: np.ndarray      # [pod] all its spine -> core links as one resource
    pod_down_agg: np.ndarray    # [pod] all its core -> spine links as one resource
    spray: bool                 # packet spraying over the aggregates, else ECMP by flow hash
    pxn: bool                   # relay to the NIC of the rail of the destination over NVLink


class GraphTables(NamedTuple):
    """A general graph of switches (the observed fabric) and the GPU ends around it; what
    `route_graph` reads. Nodes are numbered; adjacency is CSR (adj_ptr, adj_node, adj_res)."""

    gpu_host: np.ndarray   # [gpu] host index
    gpu_nic: np.ndarray    # [gpu] node of its NIC
    nic_row: np.ndarray    # [gpu] row of its NIC in `dist`
    nvl_up: np.ndarray     # [gpu] GPU -> NVSwitch
    nvl_down: np.ndarray   # [gpu] NVSwitch -> GPU
    pcie_up: np.ndarray    # [gpu] GPU -> NIC
    pcie_down: np.ndarray  # [gpu] NIC -> GPU
    adj_ptr: np.ndarray    # [node + 1] start of the node's edges
    adj_node: np.ndarray   # [edge] node the edge leads to
    adj_res: np.ndarray    # [edge] resource of the edge's direction
    transit: np.ndarray    # [node] a switch (forwards traffic)
    dist: np.ndarray       # [NIC row, node] hops to that NIC (-1: unreachable), `fabric_distances`


@njit_inline
def _mul64(a, b):
    """a * b mod 2**64 of two uint64 from their 32-bit halves: no multiply overflows, so the same
    code runs warning-free as plain numpy (NUMBA_DISABLE_JIT) and bit for bit as compiled."""
    m32 = np.uint64(0xFFFFFFFF)
    s32 = np.uint64(32)
    a_lo, a_hi = a & m32, a >> s32
    b_lo, b_hi = b & m32, b >> s32
    lo = a_lo * b_lo
    mid = ((lo >> s32) + ((a_hi * b_lo) & m32) + ((a_lo * b_hi) & m32)) & m32
    return (mid << s32) | (lo & m32)


@njit_inline
def _splitmix64_mix(x):
    """splitmix64's finaliser (Steele, Lea and Flood 2014; Stafford's Mix13 constants): a bijection
    of uint64 in which every input bit flips each output bit with probability about 1/2."""
    x = _mul64(x ^ (x >> np.uint64(30)), np.uint64(0xBF58476D1CE4E5B9))
    x = _mul64(x ^ (x >> np.uint64(27)), np.uint64(0x94D049BB133111EB))
    return x ^ (x >> np.uint64(31))


@njit
def flow_hash(a: int, b: int, c: int, d: int) -> int:
    """A deterministic 63-bit hash of four integers (each masked to 63 bits): the splitmix64
    finaliser applied after absorbing each one by xor. Its wrapping multiplies make it non-linear
    over GF(2), so `hash mod k` of structured flows (src, dst, channel, key) spreads like balls in
    bins; an xorshift hash is linear and sends such flows to one spine."""
    x = np.uint64(0x9E3779B97F4A7C15)
    for v in (a, b, c, d):
        x = _splitmix64_mix(x ^ np.uint64(v & 0x7FFFFFFFFFFFFFFF))
    return np.int64(x >> np.uint64(1))


@njit
def flow_hashes(src, dst, channel, key):
    """`flow_hash` of every flow (the ECMP hash `route_flows` and `route_graph` read)."""
    out = np.empty(src.size, np.int64)
    for i in range(src.size):
        out[i] = flow_hash(src[i], dst[i], channel[i], key[i])
    return out


@njit
def _route_one(mode, src, dst, channel, fhash, t, out, pos, write):
    """Resources of one flow on fat-tree tables `t` (written at out[pos:] when `write`); their count."""
    gpus_per_host, nics_per_gpu, planes, domain = t.gpus_per_host, t.nics_per_gpu, t.planes, t.domain
    nvl_up, nvl_down, pcie_up, pcie_down = t.nvl_up, t.nvl_down, t.pcie_up, t.pcie_down
    nic_leaf, nic_leaf_up, leaf_nic_down, leaf_pod = t.nic_leaf, t.nic_leaf_up, t.leaf_nic_down, t.leaf_pod
    leaf_spine_up, spine_leaf_down = t.leaf_spine_up, t.spine_leaf_down
    spine_core_up, core_spine_down = t.spine_core_up, t.core_spine_down
    leaf_up_agg, leaf_down_agg, pod_up_agg, pod_down_agg = t.leaf_up_agg, t.leaf_down_agg, t.pod_up_agg, t.pod_down_agg
    spray, pxn = t.spray, t.pxn
    n = 0
    j = channel % nics_per_gpu
    p = (channel // nics_per_gpu) % planes
    n_sp = leaf_spine_up.shape[1]
    if mode == FlowMode.NVLS_UP or mode == FlowMode.NVLS_DOWN:
        r = nvl_up[src] if mode == FlowMode.NVLS_UP else nvl_down[src]
        if r >= 0:
            if write:
                out[pos] = r
            n += 1
        return n
    if mode == FlowMode.LEAF_UP or mode == FlowMode.LEAF_DOWN:
        nic = src * nics_per_gpu + j
        if write:
            if mode == FlowMode.LEAF_UP:
                out[pos] = pcie_up[nic]
                out[pos + 1] = nic_leaf_up[nic, p]
            else:
                out[pos] = leaf_nic_down[nic, p]
                out[pos + 1] = pcie_down[nic]
        return 2
    if mode == FlowMode.SPINE_UP or mode == FlowMode.SPINE_DOWN:
        if leaf_spine_up[src, 0] < 0:
            return 0
        if write:
            if spray:
                out[pos] = leaf_up_agg[src] if mode == FlowMode.SPINE_UP else leaf_down_agg[src]
            else:
                s = fhash % n_sp
                out[pos] = leaf_spine_up[src, s] if mode == FlowMode.SPINE_UP else spine_leaf_down[src, s]
        return 1
    if mode == FlowMode.CORE_UP or mode == FlowMode.CORE_DOWN:
        if spine_core_up[src, 0, 0] < 0:
            return 0
        if write:
            if spray:
                out[pos] = pod_up_agg[src] if mode == FlowMode.CORE_UP else pod_down_agg[src]
            else:
                s = fhash % n_sp
                c = (fhash // n_sp) % spine_core_up.shape[2]
                out[pos] = spine_core_up[src, s, c] if mode == FlowMode.CORE_UP else core_spine_down[src, s, c]
        return 1
    if src == dst:
        return 0
    if domain > 1 and src // domain == dst // domain:
        if write:
            out[pos] = nvl_up[src]
            out[pos + 1] = nvl_down[dst]
        return 2
    sender = src
    if pxn and mode == FlowMode.GPU and domain > 1:
        proxy = src - src % gpus_per_host + dst % gpus_per_host
        if proxy != src and proxy // domain == src // domain:
            if write:
                out[pos] = nvl_up[src]
                out[pos + 1] = nvl_down[proxy]
            n += 2
            sender = proxy
    ns = sender * nics_per_gpu + j
    nd = dst * nics_per_gpu + j
    ls = nic_leaf[ns, p]
    ld = nic_leaf[nd, p]
    if write:
        out[pos + n] = pcie_up[ns]
        out[pos + n + 1] = nic_leaf_up[ns, p]
    n += 2
    if ls != ld:
        ps = leaf_pod[ls]
        pd = leaf_pod[ld]
        if ps == pd:
            if write:
                if spray:
                    out[pos + n] = leaf_up_agg[ls]
                    out[pos + n + 1] = leaf_down_agg[ld]
                else:
                    s = fhash % n_sp
                    out[pos + n] = leaf_spine_up[ls, s]
                    out[pos + n + 1] = spine_leaf_down[ld, s]
            n += 2
        else:
            if write:
                if spray:
                    out[pos + n] = leaf_up_agg[ls]
                    out[pos + n + 1] = pod_up_agg[ps]
                    out[pos + n + 2] = pod_down_agg[pd]
                    out[pos + n + 3] = leaf_down_agg[ld]
                else:
                    n_core = spine_core_up.shape[2]
                    s = fhash % n_sp
                    c = (fhash // n_sp) % n_core
                    out[pos + n] = leaf_spine_up[ls, s]
                    out[pos + n + 1] = spine_core_up[ps, s, c]
                    out[pos + n + 2] = core_spine_down[pd, s, c]
                    out[pos + n + 3] = spine_leaf_down[ld, s]
            n += 4
    if write:
        out[pos + n] = leaf_nic_down[nd, p]
        out[pos + n + 1] = pcie_down[nd]
    n += 2
    return n


@njit
def route_flows(mode, src, dst, channel, fhash, tables):
    """Paths of all flows as CSR (indptr, resource ids). Per flow: its `FlowMode`, ends, channel
    and ECMP hash; `tables`: a `FatTreeTables`."""
    f_count = src.size
    indptr = np.zeros(f_count + 1, np.int64)
    dummy = np.zeros(1, np.int64)
    for f in range(f_count):
        indptr[f + 1] = indptr[f] + _route_one(mode[f], src[f], dst[f], channel[f], fhash[f], tables, dummy, 0, False)
    ids = np.empty(indptr[f_count], np.int64)
    for f in range(f_count):
        _route_one(mode[f], src[f], dst[f], channel[f], fhash[f], tables, ids, indptr[f], True)
    return indptr, ids


# --------------------------------------------------------------------------------------------
# Max-min fair fluid simulation.
#
# `_simulate_sorted` runs one event at a time through phase functions, each called once per
# event: the lazy classes' finishes (`_class_finishes`), the other finishes (`_finish_due`), the
# arrivals (`_arrive`), S's seed (`_seed`, `_drop_pinned`), the re-fill of S (`_solve`:
# `_class_rates` or `_waterfill`, `_apply_rates`, `_verify`, `_grow`), a new lazy class
# (`_form_class`) and the new remaining bytes and heap keys (`_rekey`); `_window_bytes` sums the
# window integrals at the end. Its state is a few named tuples of arrays, which numba passes as one
# tuple each: `Paths` (read only), `FlowState`, `LinkState`, `Solve` and `Fill` (scratch of one
# event), `Lazy` and `Agg` (the lazy classes), `Heap` (the completion heap of flows and the heap of
# lazy classes) and `Clock` (the event's time, tolerances and window). Phases unpack the fields
# they use into locals before their loops. Phases and the helpers they call per flow are inlined
# by numba (`njit_inline`): a compiled call passes every array of its tuples, reference counted,
# which cost 1.6x on events of few flows; inlined, the kernel runs as fast as in one function.
#
# The phases' parameters, by name (each function's docstring names the others):
#
# | name        | type                 | meaning                                                 |
# |-------------|----------------------|---------------------------------------------------------|
# | ev          | Clock                | the event                                               |
# | p           | Paths                | flows and resources (read only)                         |
# | fs, ls      | FlowState, LinkState | per flow and per resource state                         |
# | sv, wf      | Solve, Fill          | scratch of the event's re-solve and of `_waterfill`     |
# | lz, ag      | Lazy, Agg            | the lazy classes and their links                        |
# | ch, hn      | Heap, int            | completion heap of flows (key: drain time), its size    |
# | gh, gn      | Heap, int            | heap of lazy classes (key: next member's), its size     |
# | s_n         | int                  | the size of S (sv.s_list[:s_n])                         |
# | n_chg       | int                  | changed resources so far (sv.chg[:n_chg])               |
# | stamp       | int                  | a mark no earlier pass used (lmark, cmark, checked)     |
# | b           | int                  | a lazy class, by its resource                           |
# | rel_eps,    | float, float, int    | as `simulate_flows`                                     |
# | merge,      |                      |                                                         |
# | lazy_min    |                      |                                                         |
#
# Functions that change hn or gn (a lazy class turned back into flows moves its members to the
# completion heap) return the new sizes.


class Paths(NamedTuple):
    """The flows, numbered in release order, and the resources: what the simulation never writes."""

    indptr: np.ndarray   # [flow + 1] int64: start of the flow's path in `res`
    res: np.ndarray      # [incidence] int64: the resources of each path, in path order
    release: np.ndarray  # [flow] float64: release time (ns), ascending
    latency: np.ndarray  # [flow] float64: latency added to its finish (ns)
    wt: np.ndarray       # [flow] float64: weight (> 0)
    iw: np.ndarray       # [flow] float64: 1 / weight (rates per unit weight are rate x iw)
    cap: np.ndarray      # [resource] float64: capacity (bytes/ns)
    lstart: np.ndarray   # [resource] int64: first slot of the resource in the per-resource pools
    #                      (`poolf`, `bpool`, `ck`, `ci`): as many slots as paths cross it
    unit: bool           # every weight is 1: a rate per unit weight is the rate itself


class FlowState(NamedTuple):
    """Per flow, what changes as it runs."""

    rate: np.ndarray     # [flow] float64: current rate (bytes/ns; a lazy member's is stale)
    rem: np.ndarray      # [flow] float64: remaining bytes at `tlast` (a lazy member: its key, the
    #                      class's V at which it drains)
    tlast: np.ndarray    # [flow] float64: when `rem` was last brought up to date
    active: np.ndarray   # [flow] bool: released and not finished
    finish: np.ndarray   # [flow] float64: finish time, latency included (nan until it finishes)
    bott: np.ndarray     # [flow] int64: its bottleneck resource (-1: none known)
    bpos: np.ndarray     # [flow] int64: its slot in its bottleneck's part of `LinkState.bpool`
    lzc: np.ndarray      # [flow] int64: the lazy class (its resource) it is a member of, -1: none
    in_s: np.ndarray     # [flow] int64: the event at which it joined S (another value: not in S)
    orig: np.ndarray     # [flow] float64: its rate when it joined S
    checked: np.ndarray  # [flow] int64: the stamp of the last `_verify` that checked it


class LinkState(NamedTuple):
    """Per resource, what changes as flows run, and the window integrals of its load."""

    load: np.ndarray     # [resource] float64: sum of the rates of the flows crossing it
    lcnt: np.ndarray     # [resource] int64: active flows crossing it
    narr: np.ndarray     # [resource] int64: flows that arrived on it at this event
    poolf: np.ndarray    # [incidence] int64: per resource (slots from lstart), the flows that
    #                      crossed it since the last pass over them (finished ones are dropped then)
    lused: np.ndarray    # [resource] int64: slots of `poolf` in use
    bpool: np.ndarray    # [incidence] int64: per resource, the flows bottlenecked on it
    bcnt: np.ndarray     # [resource] int64: how many
    maxr: np.ndarray     # [resource] float64: largest rate per unit weight of its flows
    maxr_ok: np.ndarray  # [resource] bool: `maxr` is up to date (else recomputed when read)
    rchg: np.ndarray     # [resource] int64: the event at which it joined the changed resources
    wd: np.ndarray       # [window + 1, resource, 2] float64: window integrals (`_simulate_sorted`)


class Solve(NamedTuple):
    """Scratch of one event's re-solve: S and the lists and marks its phases build."""

    s_list: np.ndarray    # [flow] int64: the flows of S
    new_rate: np.ndarray  # [flow] float64: the rate of S's member i
    froze_at: np.ndarray  # [flow] int64: the resource that froze S's member i
    chg: np.ndarray       # [resource] int64: the resources the event changed
    cand: np.ndarray      # [flow] int64: flows bottlenecked on a changed resource
    bad: np.ndarray       # [flow] int64: flows without a bottleneck
    thr: np.ndarray       # [resource] float64: headroom (`_class_rates`), slowest rate (`_grow`)
    marked: np.ndarray    # [resource] int64: the resources `thr` holds
    cmark: np.ndarray     # [resource] int64: stamp of the rate class on it
    cls_n: np.ndarray     # [resource] int64: members of the rate class on it
    cls_w: np.ndarray     # [resource] float64: their weight
    cls_x: np.ndarray     # [resource] float64: residual capacity, then fair share per unit weight
    lmap: np.ndarray      # [resource] int64: its local id in `_waterfill`
    lmark: np.ndarray     # [resource] int64: stamp of `thr` and `lmap`


class Fill(NamedTuple):
    """Scratch of `_waterfill`, per local link (the links S crosses, numbered as met)."""

    links: np.ndarray    # [resource] int64: the resource of each local link
    cnt: np.ndarray      # [resource + 1] int64: start of the link's members in `members`
    fill: np.ndarray     # [resource] int64: members placed so far
    members: np.ndarray  # [incidence] int64: per link, the S members crossing it
    resid: np.ndarray    # [resource] float64: capacity left by the flows outside S
    nun: np.ndarray      # [resource] int64: unfrozen members
    wun: np.ndarray      # [resource] float64: their weight
    used: np.ndarray     # [resource] float64: rate of the frozen members
    ver: np.ndarray      # [resource] int64: version of the link's key (a stale heap entry differs)
    hk: np.ndarray       # [resource + incidence + 1] float64: heap of links, key (level)
    hi: np.ndarray       # [...] int64: its local link
    ht: np.ndarray       # [...] int64: the version its key was computed at
    frozen: np.ndarray   # [flow] bool: S member i is frozen
    sptr: np.ndarray     # [flow + 1] int64: S member i's path in `sloc`
    sloc: np.ndarray     # [incidence] int64: S's paths in local link ids


class Lazy(NamedTuple):
    """The lazy rate classes, one per resource b (see the comment below)."""

    lzf: np.ndarray     # [resource, 4] float64: rate per unit weight, V, time of V, members' weight
    lzi: np.ndarray     # [resource, 3] int64: members, start and length of its links in `Agg`
    ck: np.ndarray      # [incidence] float64: per class (slots from lstart), member heap keys
    ci: np.ndarray      # [incidence] int64: the members
    aggpos: np.ndarray  # [incidence] int64: a member's path entry's slot in `Agg`
    amap: np.ndarray    # [resource] int64: 1 + its slot in `Agg` while a class is formed, else 0
    fin: np.ndarray     # [flow] int64: the members finishing at a class event
    done_k: np.ndarray  # [resource] float64: classes applied at this event: their heap keys
    done_i: np.ndarray  # [resource] int64: and their resources


class Agg(NamedTuple):
    """Per lazy class, its links other than its resource (grown as classes form)."""

    agr: np.ndarray  # [slot] int64: the resource
    agc: np.ndarray  # [slot] int64: members crossing it
    agw: np.ndarray  # [slot] float64: their weight (0: none left)


class Heap(NamedTuple):
    """An indexed min-heap (`_ih_set`, `_ih_delete`): of flows by completion time, or of lazy
    classes by their next member's."""

    key: np.ndarray   # [slot] float64
    item: np.ndarray  # [slot] int64
    pos: np.ndarray   # [item] int64: its slot, -1: not in the heap


class Clock(NamedTuple):
    """One event: its time, tolerances and where its load changes go in the window integrals."""

    now: float    # ns
    tol: float    # events within `tol` of now are one event
    tol_b: float  # relative tolerance of saturation and of the bottleneck check (1e3 x rel_eps)
    event: int    # its number (stamps `in_s` and `rchg`)
    w_on: bool    # it lies before the end of the last window
    wrow: int     # its row of `LinkState.wd` (0: before the first window)
    wfrac: float  # ns from now to the end of its window


@njit
def _sift_down(hk, hi, ht, n, i, key, item, tag):
    """Put (key, item, tag) at slot i of a plain min-heap of n entries and sift it down."""
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and hk[c + 1] < hk[c]:
            c += 1
        if hk[c] >= key:
            break
        hk[i] = hk[c]
        hi[i] = hi[c]
        ht[i] = ht[c]
        i = c
    hk[i] = key
    hi[i] = item
    ht[i] = tag


@njit_inline
def _fill_links(s_n, p, fs, ls, sv, stamp, wf):
    """`_waterfill`'s setup: the local links of S (numbered as met), each link's members, residual
    capacity, unfrozen count and weight, and S's paths in local ids; the number of local links."""
    indptr, res, cap, wt = p.indptr, p.res, p.cap, p.wt
    rate, load, s_list, lmap, lmark = fs.rate, ls.load, sv.s_list, sv.lmap, sv.lmark
    links, cnt, fill, members, resid = wf.links, wf.cnt, wf.fill, wf.members, wf.resid
    nun, wun, used, ver, frozen, sptr, sloc = wf.nun, wf.wun, wf.used, wf.ver, wf.frozen, wf.sptr, wf.sloc
    n_loc = 0
    q = 0
    sptr[0] = 0
    for i in range(s_n):
        f = s_list[i]
        frozen[i] = False
        for k in range(indptr[f], indptr[f + 1]):
            r = res[k]
            if lmark[r] != stamp:
                lmark[r] = stamp
                lmap[r] = n_loc
                links[n_loc] = r
                cnt[n_loc + 1] = 0
                wun[n_loc] = 0.0
                n_loc += 1
            loc = lmap[r]
            cnt[loc + 1] += 1
            wun[loc] += wt[f]
            sloc[q] = loc
            q += 1
        sptr[i + 1] = q
    cnt[0] = 0
    for j in range(n_loc):
        cnt[j + 1] += cnt[j]
        fill[j] = cnt[j]
        resid[j] = cap[links[j]] - load[links[j]]
        used[j] = 0.0
        ver[j] = 0
        nun[j] = cnt[j + 1] - cnt[j]
    for i in range(s_n):
        rf = rate[s_list[i]]
        for k in range(sptr[i], sptr[i + 1]):
            loc = sloc[k]
            members[fill[loc]] = i
            fill[loc] += 1
            resid[loc] += rf
    return n_loc


@njit_inline
def _waterfill(s_n, p, fs, ls, sv, stamp, wf):
    """Weighted max-min rates of the flows in S given every other flow's current rate (progressive
    filling from the residual capacities: every unfrozen flow's rate is wt[f] x the level). Writes
    sv.new_rate[i] for S member i and sv.froze_at[i], the resource that froze it."""
    wt, s_list, new_rate, froze_at = p.wt, sv.s_list, sv.new_rate, sv.froze_at
    links, cnt, members, resid, nun, wun = wf.links, wf.cnt, wf.members, wf.resid, wf.nun, wf.wun
    used, ver, hk, hi, ht, frozen, sptr, sloc = wf.used, wf.ver, wf.hk, wf.hi, wf.ht, wf.frozen, wf.sptr, wf.sloc
    n_loc = _fill_links(s_n, p, fs, ls, sv, stamp, wf)
    # A link's share only grows as flows freeze (each froze at a level <= its share), so a stale
    # heap key is a lower bound: on reaching the top it is refreshed and sifted down in place.
    for j in range(n_loc):
        hk[j] = max(resid[j], 0.0) / wun[j]
        hi[j] = j
        ht[j] = 0
    hn = n_loc
    for j in range(n_loc // 2 - 1, -1, -1):
        _sift_down(hk, hi, ht, hn, j, hk[j], hi[j], ht[j])
    level = 0.0
    left = s_n
    x = 0.0
    while hn > 0 and left > 0:
        j = hi[0]
        live = nun[j] != 0
        if live and ht[0] != ver[j]:  # stale key: refresh it in place
            key = max(resid[j] - used[j], 0.0) / wun[j]
            item = j
            tag = ver[j]
            live = False
        else:  # pop
            x = hk[0]
            hn -= 1
            key = hk[hn]
            item = hi[hn]
            tag = ht[hn]
        if hn > 0:
            _sift_down(hk, hi, ht, hn, 0, key, item, tag)
        if not live:
            continue
        if x > level:
            level = x
        for m in range(cnt[j], cnt[j + 1]):
            i = members[m]
            if frozen[i]:
                continue
            frozen[i] = True
            left -= 1
            w_i = wt[s_list[i]]
            r_i = level * w_i
            new_rate[i] = r_i
            froze_at[i] = links[j]
            for k in range(sptr[i], sptr[i + 1]):
                loc = sloc[k]
                nun[loc] -= 1
                wun[loc] -= w_i
                used[loc] += r_i
                ver[loc] += 1


# Lazy rate classes. Most events of a skewed all-to-all are one flow of a class (the flows
# bottlenecked on one resource b, all at one rate x_b) finishing, after which only that class's
# rate rises. Such a class is kept once while its events involve nobody else: its members sit in
# a heap of their own keyed by the class's cumulative per-flow service V_b at which each drains
# (remaining bytes = key - V_b), so a rate change re-keys no flow. Rates and link loads stay exact
# (and so do the window bytes, which integrate link loads). A class event is applied in one pass
# over the members' links when it is a one-class event of the exact algorithm (nobody else is
# bottlenecked on a link it touches and every other link stays unsaturated); anything else first
# turns the classes it reaches back into flows (remaining bytes, completion-heap keys) and runs as
# before. lzf[b]: 0 rate per unit weight, 1 V, 2 time of V, 3 the members' weight. lzi[b]: 0
# members, 1 start and 2 length of its links in agr/agc/agw (members crossing it, their weight).
# A member's rem holds its key (V at which it drains: its remaining bytes / its weight + V).


@njit
def _lz_advance(b, now, lzf):
    """Move class b's V to `now` at its current rate."""
    lzf[b, 1] += lzf[b, 0] * (now - lzf[b, 2])
    lzf[b, 2] = now


@njit
def _mh_push(ck, ci, base, n, key, item):
    """Push onto the member heap of a class (slots base .. base + n - 1)."""
    i = n
    while i > 0:
        p = (i - 1) >> 1
        if ck[base + p] <= key:
            break
        ck[base + i] = ck[base + p]
        ci[base + i] = ci[base + p]
        i = p
    ck[base + i] = key
    ci[base + i] = item


@njit
def _mh_pop(ck, ci, base, n):
    """Remove the top of a class's member heap of n entries (the caller reads it first)."""
    n -= 1
    key = ck[base + n]
    item = ci[base + n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and ck[base + c + 1] < ck[base + c]:
            c += 1
        if ck[base + c] >= key:
            break
        ck[base + i] = ck[base + c]
        ci[base + i] = ci[base + c]
        i = c
    if n > 0:
        ck[base + i] = key
        ci[base + i] = item


@njit
def _ih_set(hk, hi, hpos, n, i, key, item):
    """Put (key, item) at slot i of an indexed min-heap of n entries and restore the heap."""
    while i > 0:
        p = (i - 1) >> 1
        if hk[p] <= key:
            break
        hk[i] = hk[p]
        hi[i] = hi[p]
        hpos[hi[i]] = i
        i = p
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and hk[c + 1] < hk[c]:
            c += 1
        if hk[c] >= key:
            break
        hk[i] = hk[c]
        hi[i] = hi[c]
        hpos[hi[i]] = i
        i = c
    hk[i] = key
    hi[i] = item
    hpos[item] = i


@njit
def _ih_delete(hk, hi, hpos, n, item):
    """Remove item from an indexed min-heap of n entries; returns the new size."""
    i = hpos[item]
    hpos[item] = -1
    n -= 1
    if i < n:
        _ih_set(hk, hi, hpos, n, i, hk[n], hi[n])
    return n


@njit_inline
def _pool_remove(f, b, bpool, bpos, bcnt, lstart):
    """Take flow f out of the pool of the flows bottlenecked on b (the last one takes its slot)."""
    i = bpos[f]
    last = bpool[lstart[b] + bcnt[b] - 1]
    bpool[lstart[b] + i] = last
    bpos[last] = i
    bcnt[b] -= 1


@njit_inline
def _set_bottleneck(h, b, p, fs, ls):
    """Make b (-1: none) flow h's bottleneck, moving h between the pools."""
    bott, bpos, bpool, bcnt, lstart = fs.bott, fs.bpos, ls.bpool, ls.bcnt, p.lstart
    old = bott[h]
    if old == b:
        return
    if old >= 0:
        _pool_remove(h, old, bpool, bpos, bcnt, lstart)
    if b >= 0:
        bpool[lstart[b] + bcnt[b]] = h
        bpos[h] = bcnt[b]
        bcnt[b] += 1
    bott[h] = b


@njit_inline
def _leave(f, rf, per_w, late, ev, p, ls, chg, n_chg, mark):
    """Take finishing flow f (rate rf, per unit weight per_w) off its path: loads, active counts,
    stale largest rates, window integrals (`late`: bytes it carries after `now`) and, when `mark`,
    the event's changed resources (chg, n_chg of them); their new count."""
    indptr, res = p.indptr, p.res
    lcnt, load, maxr, maxr_ok, rchg, wd = ls.lcnt, ls.load, ls.maxr, ls.maxr_ok, ls.rchg, ls.wd
    tol_b, event, w_on, wrow, wfrac = ev.tol_b, ev.event, ev.w_on, ev.wrow, ev.wfrac
    for k in range(indptr[f], indptr[f + 1]):
        r = res[k]
        lcnt[r] -= 1
        dl = -rf
        load[r] -= rf
        if per_w >= maxr[r] * (1.0 - tol_b):
            maxr_ok[r] = False
        if lcnt[r] == 0:
            dl -= load[r]
            load[r] = 0.0
        if w_on:
            wd[wrow, r, 0] += dl * wfrac + late
            wd[wrow, r, 1] += dl
        if mark and rchg[r] != event:
            rchg[r] = event
            chg[n_chg] = r
            n_chg += 1
    return n_chg


@njit_inline
def _lz_flush(b, now, p, fs, lz, ch, hn):
    """Turn lazy class b back into flows at `now` (remaining bytes and completion-heap keys as the
    exact algorithm has them); the caller takes it off the class heap. Returns the completion
    heap's new size."""
    lzf, lzi, ck, ci = lz.lzf, lz.lzi, lz.ck, lz.ci
    wt, rate, rem, tlast, lzc = p.wt, fs.rate, fs.rem, fs.tlast, fs.lzc
    _lz_advance(b, now, lzf)
    x = lzf[b, 0]
    v = lzf[b, 1]
    base = p.lstart[b]
    for m in range(lzi[b, 0]):
        g = ci[base + m]
        left = max(ck[base + m] - v, 0.0) * wt[g]
        rem[g] = left
        rate[g] = x * wt[g]
        tlast[g] = now
        lzc[g] = -1
        hn += 1
        _ih_set(ch.key, ch.item, ch.pos, hn, hn - 1, now + left / rate[g], g)
    lzi[b, 0] = 0
    return hn


@njit_inline
def _unlazy(b, now, p, fs, lz, ch, hn, gh, gn):
    """Lazy class b becomes flows again (an event reached a member): off the class heap, its
    members onto the completion heap; the two heaps' new sizes (hn, gn)."""
    gn = _ih_delete(gh.key, gh.item, gh.pos, gn, b)
    hn = _lz_flush(b, now, p, fs, lz, ch, hn)
    return hn, gn


@njit_inline
def _lz_raise(b, n_fin, x, ev, p, ls, lz, ag):
    """The class share of lazy class b after its members lz.fin[:n_fin] leave, applied to the loads
    of the class's other links (and their window integrals) if every one stays below cap (1 - tol_b)
    with nobody else bottlenecked on it; else everything is left as it was. Returns (applied, the
    new share, the members' weight left)."""
    indptr, res, cap, wt = p.indptr, p.res, p.cap, p.wt
    load, bcnt, maxr, maxr_ok, wd = ls.load, ls.bcnt, ls.maxr, ls.maxr_ok, ls.wd
    lzf, lzi, fin, aggpos = lz.lzf, lz.lzi, lz.fin, lz.aggpos
    agr, agc, agw = ag.agr, ag.agc, ag.agw
    tol_b, w_on, wrow, wfrac = ev.tol_b, ev.w_on, ev.wrow, ev.wfrac
    w_all = lzf[b, 3]
    w_left = w_all
    for j in range(n_fin):
        w_left -= wt[fin[j]]
    # the other flows on b keep their rates; the class shares what they leave
    x_new = max(cap[b] - (load[b] - w_all * x), 0.0) / w_left
    if not x_new > 0.0:
        return False, x_new, w_left
    a0 = lzi[b, 1]
    a1 = a0 + lzi[b, 2]
    for j in range(n_fin):
        f = fin[j]
        for k in range(indptr[f], indptr[f + 1]):
            if res[k] != b:
                q = aggpos[k]
                agc[q] -= 1
                agw[q] = agw[q] - wt[f] if agc[q] > 0 else 0.0
    d = x_new - x
    lim = 1.0 - tol_b
    ok = True
    # one pass: loads, their window integrals, the check, the largest rates (undone below if the
    # check fails: a raised largest rate is then marked for recomputing)
    for j in range(a0, a1):
        c = agw[j]  # the members' weight on it (0: none left)
        if c > 0.0:
            r = agr[j]
            dl = c * d
            load[r] += dl
            if w_on:
                wd[wrow, r, 0] += dl * wfrac
                wd[wrow, r, 1] += dl
            if bcnt[r] > 0 or load[r] >= cap[r] * lim:
                ok = False
            if x_new > maxr[r]:
                maxr[r] = x_new
    if ok:
        load[b] += w_left * d
        if w_on:
            wd[wrow, b, 0] += w_left * d * wfrac
            wd[wrow, b, 1] += w_left * d
        return True, x_new, w_left
    for j in range(a0, a1):  # undo
        c = agw[j]
        if c > 0.0:
            r = agr[j]
            dl = c * d
            load[r] -= dl
            if w_on:
                wd[wrow, r, 0] -= dl * wfrac
                wd[wrow, r, 1] -= dl
            maxr_ok[r] = False
    for j in range(n_fin):
        f = fin[j]
        for k in range(indptr[f], indptr[f + 1]):
            if res[k] != b:
                agc[aggpos[k]] += 1
                agw[aggpos[k]] += wt[f]
    return False, x_new, w_left


@njit_inline
def _lz_event(b, ev, p, fs, ls, lz, ag, gh, gn):
    """An event at `now` in which flows of lazy class b finish. When it is a one-class event of
    the exact algorithm (the class is every flow bottlenecked on b, a member is left, nobody else
    is bottlenecked on a link the event touches, and every other link the class crosses stays
    below cap (1 - tol_b) at the class's new fair share: `_lz_raise`), apply it and return True;
    else leave everything as it was and return False."""
    indptr, res, wt, latency, lstart = p.indptr, p.res, p.wt, p.latency, p.lstart
    rate, rem, active, finish, bott, bpos, lzc = fs.rate, fs.rem, fs.active, fs.finish, fs.bott, fs.bpos, fs.lzc
    bcnt = ls.bcnt
    lzf, lzi, ck, ci, fin = lz.lzf, lz.lzi, lz.ck, lz.ci, lz.fin
    now = ev.now
    base = lstart[b]
    n_all = lzi[b, 0]
    x = lzf[b, 0]
    v0 = lzf[b, 1]
    t0 = lzf[b, 2]
    n = n_all
    n_fin = 0
    while n > 0 and t0 + (ck[base] - v0) / x <= now + ev.tol:
        fin[n_fin] = ci[base]
        n_fin += 1
        _mh_pop(ck, ci, base, n)
        n -= 1
    ok = n > 0 and n_fin > 0 and bcnt[b] == n_all
    for j in range(n_fin):
        f = fin[j]
        for k in range(indptr[f], indptr[f + 1]):
            if res[k] != b and bcnt[res[k]] > 0:
                ok = False
    x_new = 0.0
    w_left = 0.0
    if ok:
        ok, x_new, w_left = _lz_raise(b, n_fin, x, ev, p, ls, lz, ag)
    if not ok:
        for j in range(n_fin):  # put the finished flows back
            f = fin[j]
            _mh_push(ck, ci, base, n, rem[f], f)
            n += 1
        return False
    _lz_advance(b, now, lzf)
    if x_new > ls.maxr[b]:
        ls.maxr[b] = x_new
    for j in range(n_fin):
        f = fin[j]
        t_proj = t0 + (rem[f] - v0) / x
        finish[f] = t_proj + latency[f]
        active[f] = False
        lzc[f] = -1
        _pool_remove(f, b, ls.bpool, bpos, bcnt, lstart)
        bott[f] = -1
        x_f = x * wt[f]
        # bytes it carries after `now` (|t_proj - now| <= tol)
        _leave(f, x_f, x, x_f * (t_proj - now), ev, p, ls, fin, 0, False)
        rate[f] = 0.0
        rem[f] = 0.0
    lzi[b, 0] = n
    lzf[b, 0] = x_new
    lzf[b, 3] = w_left
    _ih_set(gh.key, gh.item, gh.pos, gn, gh.pos[b], now + (ck[base] - lzf[b, 1]) / x_new, b)
    return True


@njit_inline
def _clock(now, event, rel_eps, n_win, t_origin, window_ns):
    """The event at `now`: its tolerances and its row and fraction of the window integrals."""
    w_on = False
    wrow = 0
    wfrac = 0.0
    if n_win > 0:
        ew = math.floor((now - t_origin) / window_ns)
        if ew < n_win:
            w_on = True
            if ew >= 0:
                wrow = ew + 1
                wfrac = min(max(t_origin + (ew + 1) * window_ns - now, 0.0), window_ns)
    return Clock(now, rel_eps * abs(now) + 1e-6, 1e3 * rel_eps, event, w_on, wrow, wfrac)


@njit_inline
def _class_finishes(ev, p, fs, ls, lz, ag, ch, hn, gh, gn):
    """Each lazy class with members finishing now: a lazy class event, else flows again (the
    classes are independent, so one after the other at `now` is the same as all together). The
    heaps' new sizes (hn, gn)."""
    gk, gi, gpos, done_k, done_i = gh.key, gh.item, gh.pos, lz.done_k, lz.done_i
    lim = ev.now + ev.tol
    n_done = 0
    while gn > 0 and gk[0] <= lim:
        cb = gi[0]
        if _lz_event(cb, ev, p, fs, ls, lz, ag, gh, gn):
            done_k[n_done] = gk[gpos[cb]]
            done_i[n_done] = cb
            n_done += 1
            gn = _ih_delete(gk, gi, gpos, gn, cb)
        else:
            hn, gn = _unlazy(cb, ev.now, p, fs, lz, ch, hn, gh, gn)
    for j in range(n_done):
        gn += 1
        _ih_set(gk, gi, gpos, gn, gn - 1, done_k[j], done_i[j])
    return hn, gn


@njit_inline
def _finish_due(ev, merge, p, fs, ls, sv, ch, hn):
    """The flows of the completion heap that drain by now (within the tolerance, or within `merge`
    x their age) finish; the heap's new size and the number of resources they changed."""
    release, latency, iw, unit = p.release, p.latency, p.iw, p.unit
    rate, rem, tlast, active, finish = fs.rate, fs.rem, fs.tlast, fs.active, fs.finish
    hk, hi, hpos = ch.key, ch.item, ch.pos
    now, tol = ev.now, ev.tol
    n_chg = 0
    while hn > 0 and hk[0] <= now + tol + merge * (hk[0] - release[hi[0]]):
        f = hi[0]
        t_proj = hk[0]
        tf = t_proj if t_proj <= now + tol else now
        hn = _ih_delete(hk, hi, hpos, hn, f)
        # the bytes it carries after `now` (t_proj - now: at most tol, or `merge` x its age)
        late = rate[f] * (t_proj - now) if t_proj > tlast[f] else 0.0
        rem[f] = 0.0
        finish[f] = tf + latency[f]
        active[f] = False
        _set_bottleneck(f, -1, p, fs, ls)
        rf = rate[f]
        n_chg = _leave(f, rf, rf if unit else rf * iw[f], late, ev, p, ls, sv.chg, n_chg, True)
        rate[f] = 0.0
    return hn, n_chg


@njit_inline
def _arrive(ev, order, nxt, n_chg, p, fs, ls, sv):
    """The flows released by now (`order[nxt:]`) start, each into S and onto its resources' flow
    lists; an empty or zero-byte flow finishes at once. Returns (nxt, the size of S, the number of
    changed resources, whether any flow started)."""
    indptr, res, release, latency, lstart = p.indptr, p.res, p.release, p.latency, p.lstart
    rate, rem, tlast, active, finish, in_s, orig = fs.rate, fs.rem, fs.tlast, fs.active, fs.finish, fs.in_s, fs.orig
    poolf, lused, lcnt, narr, rchg = ls.poolf, ls.lused, ls.lcnt, ls.narr, ls.rchg
    s_list, chg = sv.s_list, sv.chg
    now, event = ev.now, ev.event
    n_flows = release.size
    s_n = 0
    arrivals = False
    while nxt < n_flows and release[order[nxt]] <= now + ev.tol:
        f = order[nxt]
        nxt += 1
        if rem[f] <= 0.0 or indptr[f + 1] == indptr[f]:
            finish[f] = release[f] + latency[f] + (0.0 if rem[f] <= 0.0 else np.inf)
            continue
        active[f] = True
        arrivals = True
        tlast[f] = now
        rate[f] = 0.0
        in_s[f] = event  # into S in flow order (the order of the arrays S's loops read)
        orig[f] = 0.0
        s_list[s_n] = f
        s_n += 1
        for k in range(indptr[f], indptr[f + 1]):
            r = res[k]
            poolf[lstart[r] + lused[r]] = f
            lused[r] += 1
            lcnt[r] += 1
            narr[r] += 1
            if rchg[r] != event:
                rchg[r] = event
                chg[n_chg] = r
                n_chg += 1
    return nxt, s_n, n_chg, arrivals


@njit_inline
def _seed(ev, arrivals, s_n, n_chg, p, fs, ls, sv, lz, ch, hn, gh, gn):
    """S0: with the arrivals (in S already), the flows on a changed resource (all of them when flows
    arrived, else those bottlenecked there); a lazy class reached becomes flows. Returns (the size
    of S, hn, gn)."""
    lstart = p.lstart
    rate, active, lzc, in_s, orig = fs.rate, fs.active, fs.lzc, fs.in_s, fs.orig
    poolf, lused, lcnt, narr, bpool, bcnt = ls.poolf, ls.lused, ls.lcnt, ls.narr, ls.bpool, ls.bcnt
    s_list, chg = sv.s_list, sv.chg
    now, event = ev.now, ev.event
    for c in range(n_chg):
        r = chg[c]
        if arrivals:
            every = narr[r] == lcnt[r]
            narr[r] = 0
            if every:  # all its flows arrived now
                continue
            w = lstart[r]
            for q in range(lstart[r], lstart[r] + lused[r]):
                g = poolf[q]
                if not active[g]:
                    continue
                poolf[w] = g
                w += 1
                if lzc[g] >= 0:
                    hn, gn = _unlazy(lzc[g], now, p, fs, lz, ch, hn, gh, gn)
                if in_s[g] != event:
                    in_s[g] = event
                    orig[g] = rate[g]
                    s_list[s_n] = g
                    s_n += 1
            lused[r] = w - lstart[r]
        else:
            for q in range(lstart[r], lstart[r] + bcnt[r]):
                g = bpool[q]
                if lzc[g] >= 0:
                    hn, gn = _unlazy(lzc[g], now, p, fs, lz, ch, hn, gh, gn)
                if in_s[g] != event:
                    in_s[g] = event
                    orig[g] = rate[g]
                    s_list[s_n] = g
                    s_n += 1
    return s_n, hn, gn


@njit_inline
def _find_bottleneck(h, hint, skip, tol_b, p, fs, ls, lzf):
    """A bottleneck of flow h: a resource of its path, saturated (load >= cap (1 - tol_b)), on
    which its rate per unit weight is the largest (to within tol_b), trying `hint` first (-1:
    none) and passing over resources whose `rchg` is `skip`; -1 if there is none. A stale largest
    rate it reads is recomputed (dropping finished flows from the resource's list)."""
    indptr, res, cap, lstart, iw, unit = p.indptr, p.res, p.cap, p.lstart, p.iw, p.unit
    rate, active, lzc = fs.rate, fs.active, fs.lzc
    load, poolf, lused, maxr, maxr_ok, rchg = ls.load, ls.poolf, ls.lused, ls.maxr, ls.maxr_ok, ls.rchg
    p0 = indptr[h]
    for a in range(-1 if hint >= 0 else 0, indptr[h + 1] - p0):
        r = hint if a < 0 else res[p0 + a]
        if (a >= 0 and r == hint) or rchg[r] == skip or load[r] < cap[r] * (1.0 - tol_b):
            continue
        if not maxr_ok[r]:
            maxr_ok[r] = True
            m = 0.0
            w = lstart[r]
            for q in range(lstart[r], lstart[r] + lused[r]):
                g = poolf[q]
                if active[g]:
                    poolf[w] = g
                    w += 1
                    m = max(m, (rate[g] if unit else rate[g] * iw[g]) if lzc[g] < 0 else lzf[lzc[g], 0])
            lused[r] = w - lstart[r]
            maxr[r] = m
        if (rate[h] if unit else rate[h] * iw[h]) >= maxr[r] * (1.0 - tol_b):
            return r
    return -1


@njit_inline
def _drop_pinned(ev, s_n, p, fs, ls, sv, lzf):
    """With no arrivals, a flow of S pinned by a valid bottleneck on a resource the event did not
    change keeps its rate and leaves S; the new size of S."""
    s_list, in_s = sv.s_list, fs.in_s
    kept = 0
    for i in range(s_n):
        h = s_list[i]
        b = _find_bottleneck(h, -1, ev.event, ev.tol_b, p, fs, ls, lzf)
        if b >= 0:
            _set_bottleneck(h, b, p, fs, ls)
            in_s[h] = -1
        else:
            s_list[kept] = h
            kept += 1
    return kept


@njit_inline
def _class_rates(ev, s_n, stamp, p, fs, ls, sv):
    """Rate classes: flows of S bottlenecked on the same resource b are one class. When no flow of S
    crosses another class's resource and, with each class at its resource's fair share x_b, every
    other resource S crosses stays clearly unsaturated, progressive filling freezes each class at
    x_b on b: the water-fill's result without running it (most events of a skewed all-to-all; the
    same numbers, in the same order). Writes sv.new_rate and sv.froze_at then; returns (whether
    it did, the class's resource when there is one class, else -1)."""
    indptr, res, cap, wt = p.indptr, p.res, p.cap, p.wt
    rate, bott, load = fs.rate, fs.bott, ls.load
    s_list, new_rate, froze_at, thr, marked = sv.s_list, sv.new_rate, sv.froze_at, sv.thr, sv.marked
    cmark, cls_n, cls_w, cls_x, lmark = sv.cmark, sv.cls_n, sv.cls_w, sv.cls_x, sv.lmark
    n_cls = 0
    for i in range(s_n):
        b = bott[s_list[i]]
        if b < 0:
            return False, -1
        if cmark[b] != stamp:
            cmark[b] = stamp
            n_cls += 1
            cls_n[b] = 0
            cls_w[b] = 0.0
            cls_x[b] = cap[b] - load[b]
        cls_n[b] += 1
        cls_w[b] += wt[s_list[i]]
        cls_x[b] += rate[s_list[i]]
    n_mark = 0
    for i in range(s_n):
        g = s_list[i]
        b = bott[g]
        if cls_n[b] > 0:  # first member: resid -> fair share
            x = max(cls_x[b], 0.0) / cls_w[b]
            cls_x[b] = x
            cls_n[b] = -1
            if x <= 0.0:
                return False, -1
        d = cls_x[b] * wt[g] - rate[g]
        for k in range(indptr[g], indptr[g + 1]):
            r = res[k]
            if r == b:
                continue
            if cmark[r] == stamp:  # crosses another class's resource
                return False, -1
            if lmark[r] != stamp:
                lmark[r] = stamp
                thr[r] = cap[r] - load[r]
                marked[n_mark] = r
                n_mark += 1
            thr[r] -= d
    for i in range(n_mark):
        r = marked[i]
        if thr[r] <= cap[r] * ev.tol_b:
            return False, -1
    for i in range(s_n):
        b = bott[s_list[i]]
        new_rate[i] = cls_x[b] * wt[s_list[i]]
        froze_at[i] = b
    return True, bott[s_list[0]] if n_cls == 1 else -1


@njit_inline
def _apply_rates(ev, s_n, n_chg, rel_eps, p, fs, ls, sv):
    """S takes its new rates: loads, their window integrals and largest rates; a resource whose
    load moved by more than rel_eps joins the changed ones. Their new count."""
    indptr, res, iw, unit = p.indptr, p.res, p.iw, p.unit
    rate = fs.rate
    load, maxr, maxr_ok, rchg, wd = ls.load, ls.maxr, ls.maxr_ok, ls.rchg, ls.wd
    s_list, new_rate, chg = sv.s_list, sv.new_rate, sv.chg
    tol_b, event, w_on, wrow, wfrac = ev.tol_b, ev.event, ev.w_on, ev.wrow, ev.wfrac
    for i in range(s_n):
        g = s_list[i]
        d = new_rate[i] - rate[g]
        if d != 0.0:
            big = abs(d) > rel_eps * max(rate[g], new_rate[i])
            for k in range(indptr[g], indptr[g + 1]):
                r = res[k]
                load[r] += d
                if w_on:
                    wd[wrow, r, 0] += d * wfrac
                    wd[wrow, r, 1] += d
                if d > 0.0:
                    nr = new_rate[i] if unit else new_rate[i] * iw[g]
                    if nr > maxr[r]:
                        maxr[r] = nr
                elif (rate[g] if unit else rate[g] * iw[g]) >= maxr[r] * (1.0 - tol_b):
                    # r x (1/w) can round below the share it was set from: a rate that falls (or
                    # a flow that leaves) near the largest marks it for recomputing
                    maxr_ok[r] = False
                if big and rchg[r] != event:
                    rchg[r] = event
                    chg[n_chg] = r
                    n_chg += 1
            rate[g] = new_rate[i]
    return n_chg


@njit_inline
def _verify(ev, s_n, n_chg, stamp, p, fs, ls, sv, lz, ch, hn, gh, gn):
    """Max-min's condition: every flow of S (first trying the resource that froze it) and every flow
    bottlenecked on a changed resource needs a bottleneck; each moves to its bottleneck's pool, and
    those without one are listed in sv.bad. Returns (their number, hn, gn)."""
    lstart, bott, lzc, checked, bpool, bcnt = p.lstart, fs.bott, fs.lzc, fs.checked, ls.bpool, ls.bcnt
    s_list, froze_at, chg, cand, bad, lzf = sv.s_list, sv.froze_at, sv.chg, sv.cand, sv.bad, lz.lzf
    n_bad = 0
    for i in range(s_n):
        h = s_list[i]
        checked[h] = stamp
        b = _find_bottleneck(h, froze_at[i], -2, ev.tol_b, p, fs, ls, lzf)
        _set_bottleneck(h, b, p, fs, ls)
        if b < 0:
            bad[n_bad] = h
            n_bad += 1
    n_chk = 0
    for c in range(n_chg):
        r = chg[c]
        for q in range(lstart[r], lstart[r] + bcnt[r]):
            h = bpool[q]
            if lzc[h] >= 0:
                hn, gn = _unlazy(lzc[h], ev.now, p, fs, lz, ch, hn, gh, gn)
            if checked[h] != stamp:
                checked[h] = stamp
                cand[n_chk] = h
                n_chk += 1
    for i in range(n_chk):
        h = cand[i]
        b = _find_bottleneck(h, bott[h], -2, ev.tol_b, p, fs, ls, lzf)
        _set_bottleneck(h, b, p, fs, ls)
        if b < 0:
            bad[n_bad] = h
            n_bad += 1
    return n_bad, hn, gn


@njit_inline
def _grow(ev, n_bad, s_n, stamp, p, fs, ls, sv, lz, ch, hn, gh, gn):
    """S grows by the flows without a bottleneck and, on each saturated resource they cross, the
    flows at least as fast (per unit weight, within tol_b) as the slowest of them there. Returns
    (the size of S, whether it grew, hn, gn)."""
    indptr, res, cap, lstart, iw, unit = p.indptr, p.res, p.cap, p.lstart, p.iw, p.unit
    rate, active, lzc, in_s, orig = fs.rate, fs.active, fs.lzc, fs.in_s, fs.orig
    load, poolf, lused = ls.load, ls.poolf, ls.lused
    s_list, bad, thr, marked, lmark, lzf = sv.s_list, sv.bad, sv.thr, sv.marked, sv.lmark, lz.lzf
    event, tol_b = ev.event, ev.tol_b
    grew = False
    n_mark = 0
    for i in range(n_bad):
        h = bad[i]
        if in_s[h] != event:
            in_s[h] = event
            orig[h] = rate[h]
            s_list[s_n] = h
            s_n += 1
            grew = True
        for kk in range(indptr[h], indptr[h + 1]):
            rr = res[kk]
            if load[rr] < cap[rr] * (1.0 - tol_b):
                continue
            if lmark[rr] != stamp:
                lmark[rr] = stamp
                thr[rr] = rate[h] if unit else rate[h] * iw[h]
                marked[n_mark] = rr
                n_mark += 1
            elif (rate[h] if unit else rate[h] * iw[h]) < thr[rr]:
                thr[rr] = rate[h] if unit else rate[h] * iw[h]
    for i in range(n_mark):
        rr = marked[i]
        limit = thr[rr] * (1.0 - tol_b)
        w = lstart[rr]
        for qq in range(lstart[rr], lstart[rr] + lused[rr]):
            g = poolf[qq]
            if not active[g]:
                continue
            poolf[w] = g
            w += 1
            nr = (rate[g] if unit else rate[g] * iw[g]) if lzc[g] < 0 else lzf[lzc[g], 0]
            if in_s[g] != event and nr >= limit:
                if lzc[g] >= 0:
                    hn, gn = _unlazy(lzc[g], ev.now, p, fs, lz, ch, hn, gh, gn)
                in_s[g] = event
                orig[g] = rate[g]
                s_list[s_n] = g
                s_n += 1
                grew = True
        lused[rr] = w - lstart[rr]
    return s_n, grew, hn, gn


@njit_inline
def _solve(ev, s_n, n_chg, stamp, rel_eps, p, fs, ls, sv, wf, lz, ch, hn, gh, gn):
    """Re-fill S until max-min's condition holds: rates by classes or by water-filling, applied,
    verified, S grown by the flows without a bottleneck. Returns (the size of S, the resource of
    its one class when the last fill was a one-class event, else -1, the last stamp, hn, gn)."""
    fast_cls = -1
    while s_n > 0:
        stamp += 1
        one, fast_cls = _class_rates(ev, s_n, stamp, p, fs, ls, sv)
        if not one:
            stamp += 1
            _waterfill(s_n, p, fs, ls, sv, stamp, wf)
        n_chg = _apply_rates(ev, s_n, n_chg, rel_eps, p, fs, ls, sv)
        stamp += 1
        n_bad, hn, gn = _verify(ev, s_n, n_chg, stamp, p, fs, ls, sv, lz, ch, hn, gh, gn)
        if n_bad == 0:
            break
        stamp += 1
        s_n, grew, hn, gn = _grow(ev, n_bad, s_n, stamp, p, fs, ls, sv, lz, ch, hn, gh, gn)
        if not grew:
            fast_cls = -1
            break
    return s_n, fast_cls, stamp, hn, gn


@njit_inline
def _form_class(ev, s_n, fast_cls, lazy_min, p, fs, ls, sv, lz, ag, ag_used):
    """After a one-class event that set the rate of every flow bottlenecked on its resource (at least
    `lazy_min` of them), keep the class lazily from now on: its rate, V, weight and its links other
    than its resource, with the members crossing each and their weight, at ag[ag_used:] (grown when
    full). Returns (its resource, -1 when not kept, the `Agg` arrays, their slots in use)."""
    indptr, res, wt = p.indptr, p.res, p.wt
    rate, bott, bcnt = fs.rate, fs.bott, ls.bcnt
    s_list, cls_x = sv.s_list, sv.cls_x
    lzf, lzi, aggpos, amap = lz.lzf, lz.lzi, lz.aggpos, lz.amap
    if lazy_min <= 0 or fast_cls < 0 or s_n < lazy_min or bcnt[fast_cls] != s_n:
        return -1, ag, ag_used
    b = fast_cls
    for i in range(s_n):
        g = s_list[i]
        if bott[g] != b or rate[g] != cls_x[b] * wt[g]:
            return -1, ag, ag_used
    lzf[b, 0] = cls_x[b]
    lzf[b, 1] = 0.0
    lzf[b, 2] = ev.now
    lzi[b, 0] = s_n
    w_cls = 0.0
    for i in range(s_n):
        w_cls += wt[s_list[i]]
    lzf[b, 3] = w_cls
    n_inc = indptr[s_list[0] + 1] - indptr[s_list[0]]
    for i in range(s_n):
        n_inc = max(n_inc, indptr[s_list[i] + 1] - indptr[s_list[i]])
    if ag_used + s_n * n_inc > ag.agr.size:
        size = max(2 * ag.agr.size, ag_used + s_n * n_inc)
        agr = np.empty(size, np.int64)
        agr[:ag_used] = ag.agr[:ag_used]
        agc = np.empty(size, np.int64)
        agc[:ag_used] = ag.agc[:ag_used]
        agw = np.empty(size, np.float64)
        agw[:ag_used] = ag.agw[:ag_used]
        ag = Agg(agr, agc, agw)
    agr, agc, agw = ag.agr, ag.agc, ag.agw
    a0 = ag_used
    for i in range(s_n):
        g = s_list[i]
        for k in range(indptr[g], indptr[g + 1]):
            r = res[k]
            if r == b:
                continue
            if amap[r] == 0:
                agr[ag_used] = r
                agc[ag_used] = 0
                agw[ag_used] = 0.0
                ag_used += 1
                amap[r] = ag_used
            aggpos[k] = amap[r] - 1
            agc[amap[r] - 1] += 1
            agw[amap[r] - 1] += wt[g]
    for j in range(a0, ag_used):
        amap[agr[j]] = 0
    lzi[b, 1] = a0
    lzi[b, 2] = ag_used - a0
    return b, ag, ag_used


@njit_inline
def _rekey(ev, s_n, lz_b, p, fs, sv, lz, ch, hn, gh, gn):
    """The flows of S whose rate changed: remaining bytes brought up to `now` and new completion
    keys; with a new lazy class (lz_b >= 0) every member goes to the class's heap instead, keyed by
    the V (0 now) at which it drains, and the class onto the class heap. Returns (hn, gn)."""
    lstart, iw, unit = p.lstart, p.iw, p.unit
    rate, rem, tlast, orig, lzc = fs.rate, fs.rem, fs.tlast, fs.orig, fs.lzc
    hk, hi, hpos, s_list, ck, ci = ch.key, ch.item, ch.pos, sv.s_list, lz.ck, lz.ci
    now = ev.now
    for i in range(s_n):
        g = s_list[i]
        if rate[g] == orig[g] and lz_b < 0:
            continue
        if orig[g] > 0.0:
            rem[g] -= orig[g] * (now - tlast[g])
            if rem[g] < 0.0:
                rem[g] = 0.0
        tlast[g] = now
        if lz_b >= 0:
            if hpos[g] >= 0:
                hn = _ih_delete(hk, hi, hpos, hn, g)
            lzc[g] = lz_b
            rem[g] = rem[g] if unit else rem[g] * iw[g]
            _mh_push(ck, ci, lstart[lz_b], i, rem[g], g)
            continue
        r_g = rate[g] if rate[g] > 0.0 else 1e-300
        key = now + rem[g] / r_g
        j = hpos[g]
        if j < 0:
            j = hn
            hn += 1
        _ih_set(hk, hi, hpos, hn, j, key, g)
    if lz_b >= 0:
        gn += 1
        _ih_set(gh.key, gh.item, gh.pos, gn, gn - 1, now + ck[lstart[lz_b]] / lz.lzf[lz_b, 0], lz_b)
    return hn, gn


@njit
def _window_bytes(wd, window_ns):
    """Bytes per resource per window from the window integrals (`_simulate_sorted`)."""
    n_win = wd.shape[0] - 1
    n_res = wd.shape[1]
    out = np.empty((n_res, n_win), np.float64)
    for r in range(n_res):
        level = wd[0, r, 1]
        for w in range(n_win):
            out[r, w] = wd[w + 1, r, 0] + level * window_ns
            level += wd[w + 1, r, 1]
    return out


@njit
def _new_state(indptr, res, nbytes, release, lat_mult, cap, res_lat, n_win, wt):
    """The simulation's state at the start: `Paths`, `FlowState`, `LinkState`, `Solve`, `Fill`,
    `Lazy`, `Agg` and the two `Heap`s (completion heap of flows, heap of lazy classes)."""
    n_flows, n_res, n_inc = nbytes.size, cap.size, res.size
    unit = True
    for f in range(n_flows):
        if wt[f] != 1.0:
            unit = False
    static = np.zeros(n_res, np.int64)
    latency = np.zeros(n_flows, np.float64)
    for f in range(n_flows):
        lat = 0.0
        for k in range(indptr[f], indptr[f + 1]):
            static[res[k]] += 1
            lat += res_lat[res[k]]
        latency[f] = lat * lat_mult[f]
    lstart = np.zeros(n_res, np.int64)
    for r in range(1, n_res):
        lstart[r] = lstart[r - 1] + static[r - 1]
    p = Paths(indptr, res, release, latency, wt, 1.0 / wt, cap, lstart, unit)
    fs = FlowState(np.zeros(n_flows, np.float64), nbytes.astype(np.float64).copy(), np.zeros(n_flows, np.float64),
                   np.zeros(n_flows, np.bool_), np.full(n_flows, np.nan), np.full(n_flows, -1, np.int64),
                   np.zeros(n_flows, np.int64), np.full(n_flows, -1, np.int64), np.full(n_flows, -1, np.int64),
                   np.zeros(n_flows, np.float64), np.full(n_flows, -1, np.int64))
    ls = LinkState(np.zeros(n_res, np.float64), np.zeros(n_res, np.int64), np.zeros(n_res, np.int64),
                   np.empty(n_inc, np.int64), np.zeros(n_res, np.int64), np.empty(n_inc, np.int64),
                   np.zeros(n_res, np.int64), np.zeros(n_res, np.float64), np.zeros(n_res, np.bool_),
                   np.full(n_res, -1, np.int64), np.zeros((n_win + 1, n_res, 2), np.float64))
    sv = Solve(np.empty(n_flows, np.int64), np.empty(n_flows, np.float64), np.empty(n_flows, np.int64),
               np.empty(n_res, np.int64), np.empty(n_flows, np.int64), np.empty(n_flows, np.int64),
               np.zeros(n_res, np.float64), np.empty(n_res, np.int64), np.full(n_res, -1, np.int64),
               np.zeros(n_res, np.int64), np.zeros(n_res, np.float64), np.zeros(n_res, np.float64),
               np.zeros(n_res, np.int64), np.full(n_res, -1, np.int64))
    n_heap = n_res + n_inc + 1
    wf = Fill(np.empty(n_res, np.int64), np.zeros(n_res + 1, np.int64), np.empty(n_res, np.int64),
              np.empty(n_inc, np.int64), np.empty(n_res, np.float64), np.empty(n_res, np.int64),
              np.empty(n_res, np.float64), np.empty(n_res, np.float64), np.empty(n_res, np.int64),
              np.empty(n_heap, np.float64), np.empty(n_heap, np.int64), np.empty(n_heap, np.int64),
              np.empty(n_flows, np.bool_), np.empty(n_flows + 1, np.int64), np.empty(n_inc, np.int64))
    lz = Lazy(np.zeros((n_res, 4), np.float64), np.zeros((n_res, 3), np.int64), np.empty(n_inc, np.float64),
              np.empty(n_inc, np.int64), np.empty(n_inc, np.int64), np.zeros(n_res, np.int64),
              np.empty(n_flows, np.int64), np.empty(n_res, np.float64), np.empty(n_res, np.int64))
    ag = Agg(np.empty(1024, np.int64), np.empty(1024, np.int64), np.empty(1024, np.float64))
    ch = Heap(np.empty(n_flows, np.float64), np.empty(n_flows, np.int64), np.full(n_flows, -1, np.int64))
    gh = Heap(np.empty(n_res, np.float64), np.empty(n_res, np.int64), np.full(n_res, -1, np.int64))
    return p, fs, ls, sv, wf, lz, ag, ch, gh


@njit
def _simulate_sorted(indptr, res, nbytes, release, lat_mult, cap, res_lat, n_windows, window_ns,
                     t_origin, rel_eps, merge, lazy_min, wt):
    """`simulate_flows` on flows numbered in release order (`wt`: their weights), one event at a
    time through the phases above. Rates compare per unit weight wherever max-min compares them:
    the largest rate of a link (`maxr`), the bottleneck check, a class's fair share and a lazy
    class's rate are all rate / weight.

    Bytes per window are integrals of the link loads: a change dl of load[r] at `now`, in window
    w, adds dl * (end of w - now) to w and dl * window_ns to each later window. LinkState.wd[w + 1,
    r] holds those two parts (row 0: changes before the first window); `_window_bytes` sums them
    up. Every change of a load is a change of flows' rates, so this is the bytes each flow carried
    in each window, at O(1) per change instead of O(windows) per flow."""
    n_flows = nbytes.size
    n_win = max(n_windows, 0)
    if n_flows == 0:
        return np.full(n_flows, np.nan), np.zeros((cap.size, n_win), np.float64)
    p, fs, ls, sv, wf, lz, ag, ch, gh = _new_state(indptr, res, nbytes, release, lat_mult, cap, res_lat, n_win, wt)
    order = np.argsort(release, kind="mergesort")
    hn = 0
    gn = 0
    nxt = 0
    event = 0
    stamp = 0
    ag_used = 0
    if merge != 0.0:
        lazy_min = 0
    while True:
        t_rel = release[order[nxt]] if nxt < n_flows else np.inf
        t_fin = ch.key[0] if hn > 0 else np.inf
        t_cls = gh.key[0] if gn > 0 else np.inf
        if t_rel == np.inf and t_fin == np.inf and t_cls == np.inf:
            break
        event += 1
        ev = _clock(min(t_rel, t_fin, t_cls), event, rel_eps, n_win, t_origin, window_ns)
        if gn == 0:
            ag_used = 0
        else:
            hn, gn = _class_finishes(ev, p, fs, ls, lz, ag, ch, hn, gh, gn)
            lim = ev.now + ev.tol
            if t_rel > lim and (hn == 0 or ch.key[0] > lim):
                continue
        hn, n_chg = _finish_due(ev, merge, p, fs, ls, sv, ch, hn)
        nxt, s_n, n_chg, arrivals = _arrive(ev, order, nxt, n_chg, p, fs, ls, sv)
        s_n, hn, gn = _seed(ev, arrivals, s_n, n_chg, p, fs, ls, sv, lz, ch, hn, gh, gn)
        if not arrivals:
            s_n = _drop_pinned(ev, s_n, p, fs, ls, sv, lz.lzf)
        s_n, fast_cls, stamp, hn, gn = _solve(ev, s_n, n_chg, stamp, rel_eps, p, fs, ls, sv, wf, lz, ch, hn, gh, gn)
        lz_b, ag, ag_used = _form_class(ev, s_n, fast_cls, lazy_min, p, fs, ls, sv, lz, ag, ag_used)
        hn, gn = _rekey(ev, s_n, lz_b, p, fs, sv, lz, ch, hn, gh, gn)
    return fs.finish, _window_bytes(ls.wd, window_ns)


@njit
def simulate_flows(indptr, res, nbytes, release, lat_mult, cap, res_lat, n_windows, window_ns,
                   t_origin, rel_eps, merge, lazy_min=16, weight=None):
    """Event-driven fluid simulation with max-min fair sharing, exact at every arrival and finish.
    `weight` (per flow, > 0; default all 1) makes it weighted max-min: flows sharing a bottleneck
    get rates in proportion to their weights.

    Flows: CSR paths (indptr, res), bytes, release time (ns) and a latency multiplier (the flow's
    latency is lat_mult * sum of its resources' latencies, added at the end). Resources: capacity
    in bytes/ns and latency in ns. Returns (finish time per flow, bytes per resource per window).
    `merge` > 0 lets a flow finish early, together with the current event, when its finish is
    within `merge` x its age (0: exact).

    At each event (all arrivals and finishes at one time) only the affected flows are re-solved:
    S starts as the flows on the touched resources, is water-filled on the residual capacities,
    and grows until every flow next to a changed resource has a bottleneck (a saturated resource
    on which its rate is the largest), which is the max-min fairness condition.

    | name      | shape        | dtype   | meaning                                                 |
    |-----------|--------------|---------|---------------------------------------------------------|
    | indptr    | [flow + 1]   | int64   | start of each flow's path in `res` (CSR)                |
    | res       | [incidence]  | int64   | the resources of each path, in path order               |
    | nbytes    | [flow]       | number  | bytes to carry (<= 0: finishes at its release)          |
    | release   | [flow]       | float64 | release time (ns)                                       |
    | lat_mult  | [flow]       | float64 | latency multiplier: latency = lat_mult x sum of res_lat |
    | cap       | [resource]   | float64 | capacity (bytes/ns)                                     |
    | res_lat   | [resource]   | float64 | latency (ns)                                            |
    | n_windows | scalar       | int     | windows of bytes per resource (0: none)                 |
    | window_ns | scalar       | float   | their length (ns)                                       |
    | t_origin  | scalar       | float   | start of the first window (ns)                          |
    | rel_eps   | scalar       | float   | event tolerance rel_eps x abs(now) + 1e-6 ns; 1e3 x     |
    |           |              |         | rel_eps: of saturation and of the bottleneck check      |
    | merge     | scalar       | float   | early finish within merge x the flow's age (0: exact)   |
    | lazy_min  | scalar       | int     | members of the smallest lazy rate class (0: none)       |
    | weight    | [flow], None | float64 | max-min weight (> 0; None: all 1)                       |

    Returns finish [flow] float64 (ns, latency included; inf: bytes but no path) and bytes
    [resource, window] float64.
    """
    # Flows are renumbered by release time, then by the last resource of their path (the
    # destination's downlink), so that the flows active together, and the flows an incast makes
    # share a bottleneck, sit next to each other in memory (2x faster on a skewed all-to-all);
    # the simulation itself is order-independent.
    n_flows = nbytes.size
    last = np.full(n_flows, -1, np.int64)
    for f in range(n_flows):
        if indptr[f + 1] > indptr[f]:
            last[f] = res[indptr[f + 1] - 1]
    by_last = np.argsort(last, kind="mergesort")
    order = by_last[np.argsort(release[by_last], kind="mergesort")]
    indptr2 = np.zeros(n_flows + 1, np.int64)
    for a in range(n_flows):
        f = order[a]
        indptr2[a + 1] = indptr2[a] + indptr[f + 1] - indptr[f]
    res2 = np.empty(indptr2[n_flows], np.int64)
    for a in range(n_flows):
        f = order[a]
        res2[indptr2[a]:indptr2[a + 1]] = res[indptr[f]:indptr[f + 1]]
    wt = np.ones(n_flows, np.float64) if weight is None else weight.astype(np.float64)[order]
    finish2, win = _simulate_sorted(indptr2, res2, nbytes[order], release[order], lat_mult[order],
                                    cap, res_lat, n_windows, window_ns, t_origin, rel_eps, merge, lazy_min, wt)
    finish = np.empty(n_flows, np.float64)
    finish[order] = finish2
    return finish, win


# --------------------------------------------------------------------------------------------
# Trace-driven schedule.


@njit
def schedule(prev, nxt, dep_ptr, dep_ids, slack, tr_start, dur, inst, inst_ptr, inst_ids, inst_dur,
             end_frac, order_by_start):
    """Replayed start/end of every event and start of every instance.

    An event starts when its lane predecessor and its cross-lane dependencies (`dep_ids[dep_ptr[i]:
    dep_ptr[i+1]]` lists the events that wait on i) have ended, plus its traced slack (host-bound
    gap). An event without predecessors keeps its traced start. Events of instance k (>= 0) arrive
    at that time; the instance starts when the last participant arrives and member j ends
    `end_frac[j] * inst_dur[k]` later (1: all end together). Cycles (inconsistent traces) are
    broken at the earliest traced event.
    """
    n = prev.size
    n_inst = inst_dur.size
    indeg = np.zeros(n, np.int64)
    for i in range(n):
        if prev[i] >= 0:
            indeg[i] += 1
        for q in range(dep_ptr[i], dep_ptr[i + 1]):
            indeg[dep_ids[q]] += 1
    ready = np.full(n, -np.inf)
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    arrived = np.zeros(n, np.bool_)
    pending = np.zeros(n_inst, np.int64)
    for k in range(n_inst):
        pending[k] = inst_ptr[k + 1] - inst_ptr[k]
    inst_ready = np.full(n_inst, -np.inf)
    inst_start = np.full(n_inst, np.nan)
    stack = np.empty(n + 1, np.int64)
    sn = 0
    fin = np.empty(n + 1, np.int64)
    for i in range(n):
        if indeg[i] == 0:
            stack[sn] = i
            sn += 1
    done = 0
    cursor = 0
    while done < n:
        if sn == 0:
            while cursor < n and arrived[order_by_start[cursor]]:
                cursor += 1
            if cursor >= n:
                break
            stack[0] = order_by_start[cursor]
            sn = 1
        i = stack[sn - 1]
        sn -= 1
        if arrived[i]:
            continue
        arrived[i] = True
        done += 1
        s = tr_start[i] if ready[i] == -np.inf else ready[i] + slack[i]
        start[i] = s
        fn = 0
        k = inst[i]
        if k < 0:
            end[i] = s + dur[i]
            fin[0] = i
            fn = 1
        else:
            if s > inst_ready[k]:
                inst_ready[k] = s
            pending[k] -= 1
            if pending[k] == 0:
                inst_start[k] = inst_ready[k]
                for q in range(inst_ptr[k], inst_ptr[k + 1]):
                    j = inst_ids[q]
                    end[j] = inst_start[k] + inst_dur[k] * end_frac[j]
                    fin[fn] = j
                    fn += 1
        for a in range(fn):
            j = fin[a]
            succ = nxt[j]
            if succ >= 0:
                if end[j] > ready[succ]:
                    ready[succ] = end[j]
                indeg[succ] -= 1
                if indeg[succ] == 0:
                    stack[sn] = succ
                    sn += 1
            for q in range(dep_ptr[j], dep_ptr[j + 1]):
                d = dep_ids[q]
                if end[j] > ready[d]:
                    ready[d] = end[j]
                indeg[d] -= 1
                if indeg[d] == 0:
                    stack[sn] = d
                    sn += 1
    for k in range(n_inst):
        if pending[k] > 0 and inst_ptr[k + 1] > inst_ptr[k]:
            inst_start[k] = inst_ready[k]
            for q in range(inst_ptr[k], inst_ptr[k + 1]):
                j = inst_ids[q]
                if arrived[j]:
                    end[j] = inst_start[k] + inst_dur[k] * end_frac[j]
    return start, end, inst_start


# --------------------------------------------------------------------------------------------
# General-graph routing (the observed fabric): shortest paths, ECMP among equal next hops.


@njit
def fabric_distances(adj_ptr, adj_node, transit, targets):
    """Hops from every node to each target (row per target; -1: unreachable). Only `transit`
    nodes (switches) forward: a path never passes through another host's NIC."""
    n = adj_ptr.size - 1
    dist = np.full((targets.size, n), -1, np.int32)
    queue = np.empty(max(n, 1), np.int64)
    for t in range(targets.size):
        root = targets[t]
        dist[t, root] = 0
        head = 0
        tail = 1
        queue[0] = root
        while head < tail:
            u = queue[head]
            head += 1
            if u != root and not transit[u]:
                continue
            for e in range(adj_ptr[u], adj_ptr[u + 1]):
                v = adj_node[e]
                if dist[t, v] < 0:
                    dist[t, v] = dist[t, u] + 1
                    queue[tail] = v
                    tail += 1
    return dist


@njit_inline
def _graph_path(s, d, h, t, out, at, write):
    """Resources of one GPU -> GPU flow with hash h on graph tables `t` (written at out[at:] when
    `write`); their count, -1 if unreachable."""
    gpu_host, gpu_nic, nic_row, dist = t.gpu_host, t.gpu_nic, t.nic_row, t.dist
    nvl_up, nvl_down, pcie_up, pcie_down = t.nvl_up, t.nvl_down, t.pcie_up, t.pcie_down
    adj_ptr, adj_node, adj_res, transit = t.adj_ptr, t.adj_node, t.adj_res, t.transit
    if s == d:
        return 0
    if gpu_host[s] == gpu_host[d]:
        if write:
            out[at] = nvl_up[s]
            out[at + 1] = nvl_down[d]
        return 2
    row = nic_row[d]
    u = gpu_nic[s]
    target = gpu_nic[d]
    if dist[row, u] < 0:
        return -1
    k = 0
    if write:
        out[at] = pcie_up[s]
    k += 1
    hop = 0
    while u != target:
        want = dist[row, u] - 1
        count = 0
        for e in range(adj_ptr[u], adj_ptr[u + 1]):
            v = adj_node[e]
            if dist[row, v] == want and (transit[v] or v == target):
                count += 1
        pick = flow_hash(h, hop, u, 0) % count
        for e in range(adj_ptr[u], adj_ptr[u + 1]):
            v = adj_node[e]
            if dist[row, v] == want and (transit[v] or v == target):
                if pick == 0:
                    if write:
                        out[at + k] = adj_res[e]
                    k += 1
                    u = v
                    break
                pick -= 1
        hop += 1
    if write:
        out[at + k] = pcie_down[d]
    return k + 1


@njit
def route_graph(src, dst, fhash, tables):
    """CSR paths (indptr, resource ids) of GPU -> GPU flows on a general graph (`tables`: a
    `GraphTables`), and the index of the first flow with no path (-1 when all have one)."""
    f_count = src.size
    indptr = np.zeros(f_count + 1, np.int64)
    dummy = np.zeros(1, np.int64)
    for f in range(f_count):
        k = _graph_path(src[f], dst[f], fhash[f], tables, dummy, 0, False)
        if k < 0:
            return indptr, np.zeros(0, np.int64), f
        indptr[f + 1] = indptr[f] + k
    ids = np.empty(indptr[f_count], np.int64)
    for f in range(f_count):
        _graph_path(src[f], dst[f], fhash[f], tables, ids, indptr[f], True)
    return indptr, ids, -1


# --------------------------------------------------------------------------------------------
# Independent parts of a simulation (the replay re-simulates only the parts whose releases moved).


@njit
def path_latency(res_lat, indptr, res, lat_mult):
    """Per flow, lat_mult x the sum of its resources' latencies, summed in path order: the latency
    `simulate_flows` adds to its finish, bit for bit."""
    n = lat_mult.size
    out = np.empty(n, np.float64)
    for f in range(n):
        lat = 0.0
        for k in range(indptr[f], indptr[f + 1]):
            lat += res_lat[res[k]]
        out[f] = lat * lat_mult[f]
    return out


@njit
def flow_components(indptr, res, start, end, n_res):
    """Connected components of flows that share a resource while both are active (`start` <=
    t < `end`): the label of each flow is the smallest flow index of its component. Max-min
    fair rates decompose over these components, so each can be simulated alone."""
    n = start.size
    order = np.argsort(start, kind="mergesort")
    cnt = np.zeros(n_res + 1, np.int64)
    for k in range(res.size):
        cnt[res[k] + 1] += 1
    for r in range(n_res):
        cnt[r + 1] += cnt[r]
    pos = cnt[:n_res].copy()
    by_res = np.empty(res.size, np.int64)
    for o in range(n):
        f = order[o]
        for k in range(indptr[f], indptr[f + 1]):
            r = res[k]
            by_res[pos[r]] = f
            pos[r] += 1
    parent = np.arange(n)
    for r in range(n_res):
        reach = -np.inf  # the latest end of the overlapping run so far on this resource
        rep = -1
        for q in range(cnt[r], cnt[r + 1]):
            f = by_res[q]
            if start[f] < reach:
                x = f
                while parent[x] != x:
                    parent[x] = parent[parent[x]]
                    x = parent[x]
                y = rep
                while parent[y] != y:
                    parent[y] = parent[parent[y]]
                    y = parent[y]
                if x < y:
                    parent[y] = x
                elif y < x:
                    parent[x] = y
                if end[f] > reach:
                    reach = end[f]
            else:
                reach = end[f]
                rep = f
    label = np.empty(n, np.int64)
    for f in range(n):
        x = f
        while parent[x] != x:
            x = parent[x]
        label[f] = x
    return label


@njit
def mixed_components(label, unit):
    """Per flow, whether its component (`label`, as `flow_components` gives) holds flows of more
    than one unit (a unit: flows whose results came from one simulation)."""
    n = label.size
    first = np.full(n, -1, np.int64)
    mixed = np.zeros(n, np.bool_)
    seen = np.zeros(n, np.bool_)
    for f in range(n):
        c = label[f]
        if not seen[c]:
            seen[c] = True
            first[c] = unit[f]
        elif unit[f] != first[c]:
            mixed[c] = True
    out = np.empty(n, np.bool_)
    for f in range(n):
        out[f] = mixed[label[f]]
    return out


@njit
def class_resource_bytes(indptr, res, nbytes, cls, n_cls, n_res):
    """Bytes carried by each resource per class of flow (row `cls[f]`): one pass over the paths,
    summing in flow order as `np.bincount` does."""
    out = np.zeros((n_cls, n_res), np.float64)
    for f in range(nbytes.size):
        c = cls[f]
        for k in range(indptr[f], indptr[f + 1]):
            out[c, res[k]] += nbytes[f]
    return out
