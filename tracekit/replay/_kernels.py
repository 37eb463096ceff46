"""numba kernels for replay: routing to CSR paths, the max-min fair fluid simulator, and the
dependency scheduler. Kernels see numpy arrays, scalars and named tuples of them (`FatTreeTables`,
`GraphTables`) only, and read no module globals but the `FlowMode` constants and the row numbers
of the simulator's state arrays (`FF_*`, `FI_*`, `RF_*`, `RI_*`, `PI_*`, `AG_*`)."""

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


@njit
def _waterfill(s_list, s_n, indptr, res, cap, load, rate, wt, lmap, lmark, stamp, new_rate, froze_at,
               links, cnt, fill, members, resid, nun, wun, used, ver, hk, hi, ht, frozen, sptr, sloc):
    """Weighted max-min rates of the flows in S given every other flow's current rate (progressive
    filling from the residual capacities: every unfrozen flow's rate is wt[f] x the level). Writes
    new_rate[i] for S member i and froze_at[i], the resource that froze it.

    | name              | shape                  | dtype   | meaning                                  |
    |-------------------|------------------------|---------|------------------------------------------|
    | s_list, s_n       | [flow], scalar         | int64   | the flows of S: s_list[:s_n]             |
    | indptr, res       | [flow + 1], [incidence]| int64   | the paths (CSR)                          |
    | cap, load         | [resource]             | float64 | capacity; sum of the current rates       |
    | rate, wt          | [flow]                 | float64 | current rate; weight                     |
    | lmap, lmark, stamp| [resource], scalar     | int64   | local id of a resource, valid where      |
    |                   |                        |         | lmark == stamp (a value no pass used)    |
    | new_rate, froze_at| [flow]                 | f8, i8  | out: S member i's rate, freezing resource|
    | links             | [resource]             | int64   | scratch, per local link: its resource    |
    | cnt, fill         | [resource + 1], [res.] | int64   | start of its members; members placed     |
    | members           | [incidence]            | int64   | per link, the S members crossing it      |
    | resid, used       | [resource]             | float64 | capacity left by the flows outside S;    |
    |                   |                        |         | rate of its frozen members               |
    | nun, wun          | [resource]             | i8, f8  | its unfrozen members; their weight       |
    | ver               | [resource]             | int64   | version of its key (stale heap entries)  |
    | hk, hi, ht        | [res. + incidence + 1] | f8,i8,i8| heap of links: key, local link, version  |
    | frozen            | [flow]                 | bool    | S member i is frozen                     |
    | sptr, sloc        | [flow + 1], [incidence]| int64   | S's paths in local link ids              |
    """
    n_loc = 0
    p = 0
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
            sloc[p] = loc
            p += 1
        sptr[i + 1] = p
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
    # A link's share only grows as flows freeze (each froze at a level <= its share), so a stale
    # heap key is a lower bound: on reaching the top it is refreshed and sifted down in place.
    for j in range(n_loc):
        hk[j] = max(resid[j], 0.0) / wun[j]
        hi[j] = j
        ht[j] = 0
    # (heap code written out: numba's inliner wraps array arguments in reference counting)
    hn = n_loc
    for j in range(n_loc // 2 - 1, -1, -1):
        i = j
        key = hk[j]
        item = hi[j]
        tag = ht[j]
        while True:
            c = 2 * i + 1
            if c >= hn:
                break
            if c + 1 < hn and hk[c + 1] < hk[c]:
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
            i = 0
            while True:
                c = 2 * i + 1
                if c >= hn:
                    break
                if c + 1 < hn and hk[c + 1] < hk[c]:
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


# The simulator's state (`_simulate_sorted` and its phase functions): one float64 and one int64
# array per entity, shape (rows, entities), a row per quantity, named by the constants below.
# Scratch rows indexed by a position (in S, in a heap, in a list) rather than by the entity say so.
# ff: per flow, float64
FF_RATE = 0      # current rate (bytes/ns)
FF_REM = 1       # bytes left at FF_TLAST (a lazy class member: the class's V at which it drains)
FF_TLAST = 2     # time of FF_REM
FF_ORIG = 3      # rate before this event's re-solve (members of S)
FF_LAT = 4       # latency added to the finish
FF_WT = 5        # max-min weight
FF_IW = 6        # 1 / weight (rates compare per unit weight)
FF_FINISH = 7    # finish time, latency included (the result; nan until known)
FF_NEW = 8       # by position in S: the member's new rate
FF_HKEY = 9      # by slot of the completion heap: its key, the projected finish
FF_REL = 10      # release time
N_FF = 11
# fi: per flow, int64
FI_BOTT = 0      # its bottleneck resource (-1: none)
FI_BPOS = 1      # its slot among the flows bottlenecked on FI_BOTT (PI_BOTT)
FI_IN_S = 2      # the event at which it joined S (-1: pinned out of it)
FI_CHECKED = 3   # the stamp at which the bottleneck check took it
FI_LZC = 4       # its lazy class (-1: none)
FI_HPOS = 5      # its slot in the completion heap (-1: none)
FI_HITEM = 6     # by slot of the completion heap: its flow
FI_S = 7         # by position: the flows of S
FI_CAND = 8      # by position: flows bottlenecked on a changed resource, to check
FI_BAD = 9       # by position: flows the check found without a bottleneck
FI_FIN = 10      # by position: members of a lazy class finishing now
FI_FROZE = 11    # by position in S: the resource that froze the member
FI_ORDER = 12    # by position: the flows in release order
N_FI = 13
# rf: per resource, float64
RF_CAP = 0       # capacity (bytes/ns)
RF_LOAD = 1      # sum of the current rates of the flows crossing it
RF_MAXR = 2      # largest rate per unit weight crossing it (valid where RI_MAXR_OK)
RF_THR = 3       # scratch: residual or rate threshold of a marked resource
RF_CLS_W = 4     # rate class on it: the members' weight
RF_CLS_X = 5     # rate class on it: residual, then fair share per unit weight
RF_GKEY = 6      # by slot of the class heap: its key, the class's next finish
RF_DONE_K = 7    # by position: keys of the lazy class events applied at this time
RF_LZ_X = 8      # lazy class on it: rate per unit weight
RF_LZ_V = 9      # lazy class: cumulative per-flow service V
RF_LZ_T = 10     # lazy class: time of V
RF_LZ_W = 11     # lazy class: the members' weight
N_RF = 12
# ri: per resource, int64
RI_START = 0     # first slot of its part of the per-path-entry pools (PI_POOL, PI_BOTT, ck)
RI_USED = 1      # entries of PI_POOL in use (finished flows are dropped by the next pass)
RI_ACT = 2       # active flows crossing it
RI_NARR = 3      # flows that arrived on it this event
RI_BCNT = 4      # flows bottlenecked on it
RI_CMARK = 5     # stamp: a rate class of S is on it
RI_CLS_N = 6     # rate class: members (-1 once its share is set)
RI_RCHG = 7      # the event that last changed it
RI_LMARK = 8     # stamp: marked (thresholds, the water-fill's local ids)
RI_LMAP = 9      # the water-fill's local id
RI_MARKED = 10   # by position: the marked resources
RI_CHG = 11      # by position: the resources changed this event
RI_AMAP = 12     # scratch of a new lazy class: 1 + its slot in ag (0: none)
RI_GITEM = 13    # by slot of the class heap: its class
RI_GPOS = 14     # its lazy class's slot in the class heap (-1: none)
RI_DONE_I = 15   # by position: the lazy classes whose event was applied at this time
RI_MAXR_OK = 16  # RF_MAXR is up to date
RI_LZ_N = 17     # lazy class on it: members
RI_LZ_A0 = 18    # lazy class: first slot of its other links in ag/agw
RI_LZ_AN = 19    # lazy class: number of those links
N_RI = 20
# pi: per path entry (incidence), int64; ck: float64, the same slots
PI_POOL = 0      # from RI_START: flows that crossed the resource since the last pass over them
PI_BOTT = 1      # from RI_START: the flows bottlenecked on it (RI_BCNT of them)
PI_AGG = 2       # by path entry of a lazy class member: its link's slot in ag/agw
PI_CITEM = 3     # from RI_START: the member heap of the resource's lazy class (keys in ck)
N_PI = 4
# ag (int64) / agw (float64): per slot, the links of the lazy classes other than their own
AG_RES = 0       # the resource
AG_CNT = 1       # members crossing it
#
# Names shared by the phase functions:
#   indptr, res         the paths (CSR, flows in release order)
#   ff, fi, rf, ri, pi  the state above; ck [incidence] float64: member-heap keys
#   ag, agw             a lazy class's links: resource and members (ag), their weight (agw)
#   wd                  [window + 1, resource, 2] the window integrals (`_simulate_sorted`)
#   w_on, wrow, wfrac   whether this event's load changes count in a window, in which row of wd,
#                       and for how long (ns) to the end of that window (`_window_of`)
#   now, tol, tol_b     the event's time; its tolerance; that of saturation and of the bottleneck
#                       check (1e3 x rel_eps)
#   event, stamp        the event's number; a fresh mark value (RI_LMARK, RI_CMARK, FI_CHECKED)
#   unit                every weight is 1 (a rate per unit weight is the rate)
#   s_n, n_chg          flows in S (FI_S); changed resources (RI_CHG)
#   hn, gn              sizes of the completion heap (FF_HKEY/FI_HITEM/FI_HPOS) and of the class
#                       heap (RF_GKEY/RI_GITEM/RI_GPOS); a function that can change them returns them
#
# Lazy rate classes. Most events of a skewed all-to-all are one flow of a class (the flows
# bottlenecked on one resource b, all at one rate x_b) finishing, after which only that class's
# rate rises. Such a class is kept once while its events involve nobody else: its members sit in
# a heap of their own keyed by the class's cumulative per-flow service V_b at which each drains
# (remaining bytes = key - V_b), so a rate change re-keys no flow. Rates and link loads stay exact
# (and so do the window bytes, which integrate link loads). A class event is applied in one pass
# over the members' links when it is a one-class event of the exact algorithm (nobody else is
# bottlenecked on a link it touches and every other link stays unsaturated); anything else first
# turns the classes it reaches back into flows (remaining bytes, completion-heap keys) and runs as
# before. A member's FF_REM holds its key (V at which it drains: its remaining bytes / its weight + V).


@njit
def _lz_advance(b, now, rf):
    """Move class b's V to `now` at its current rate."""
    rf[RF_LZ_V, b] += rf[RF_LZ_X, b] * (now - rf[RF_LZ_T, b])
    rf[RF_LZ_T, b] = now


@njit
def _mh_push(ck, pi, base, n, key, item):
    """Push onto the member heap of a class (slots base .. base + n - 1)."""
    i = n
    while i > 0:
        p = (i - 1) >> 1
        if ck[base + p] <= key:
            break
        ck[base + i] = ck[base + p]
        pi[PI_CITEM, base + i] = pi[PI_CITEM, base + p]
        i = p
    ck[base + i] = key
    pi[PI_CITEM, base + i] = item


@njit
def _heap_set(keys, ids, k_row, i_row, p_row, n, i, key, item):
    """Put (key, item) at slot i of an indexed min-heap of n entries and restore the heap. The heap
    is rows of the state: keys[k_row, slot], ids[i_row, slot] its item, ids[p_row, item] its slot
    (the completion heap: ff, fi, FF_HKEY, FI_HITEM, FI_HPOS; the class heap: rf, ri, RF_GKEY,
    RI_GITEM, RI_GPOS)."""
    while i > 0:
        p = (i - 1) >> 1
        if keys[k_row, p] <= key:
            break
        keys[k_row, i] = keys[k_row, p]
        ids[i_row, i] = ids[i_row, p]
        ids[p_row, ids[i_row, i]] = i
        i = p
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and keys[k_row, c + 1] < keys[k_row, c]:
            c += 1
        if keys[k_row, c] >= key:
            break
        keys[k_row, i] = keys[k_row, c]
        ids[i_row, i] = ids[i_row, c]
        ids[p_row, ids[i_row, i]] = i
        i = c
    keys[k_row, i] = key
    ids[i_row, i] = item
    ids[p_row, item] = i


@njit
def _heap_delete(keys, ids, k_row, i_row, p_row, n, item):
    """Remove item from an indexed min-heap of n entries (`_heap_set`); returns the new size."""
    i = ids[p_row, item]
    ids[p_row, item] = -1
    n -= 1
    if i < n:
        _heap_set(keys, ids, k_row, i_row, p_row, n, i, keys[k_row, n], ids[i_row, n])
    return n


@njit
def _lz_flush(b, now, hn, ff, fi, rf, ri, pi, ck):
    """Turn lazy class b back into flows at `now` (remaining bytes and completion-heap keys as the
    exact algorithm has them); the caller takes it off the class heap. Returns hn."""
    _lz_advance(b, now, rf)
    x = rf[RF_LZ_X, b]
    v = rf[RF_LZ_V, b]
    base = ri[RI_START, b]
    for m in range(ri[RI_LZ_N, b]):
        g = pi[PI_CITEM, base + m]
        left = max(ck[base + m] - v, 0.0) * ff[FF_WT, g]
        ff[FF_REM, g] = left
        ff[FF_RATE, g] = x * ff[FF_WT, g]
        ff[FF_TLAST, g] = now
        fi[FI_LZC, g] = -1
        hn += 1
        _heap_set(ff, fi, FF_HKEY, FI_HITEM, FI_HPOS, hn, hn - 1, now + left / ff[FF_RATE, g], g)
    ri[RI_LZ_N, b] = 0
    return hn


@njit
def _lz_unlazy(b, now, gn, hn, ff, fi, rf, ri, pi, ck):
    """Lazy class b off the class heap and back into flows; returns (gn, hn)."""
    gn = _heap_delete(rf, ri, RF_GKEY, RI_GITEM, RI_GPOS, gn, b)
    hn = _lz_flush(b, now, hn, ff, fi, rf, ri, pi, ck)
    return gn, hn


@njit
def _lz_event(b, now, tol, tol_b, gn, ff, fi, active, rf, ri, pi, ck, indptr, res, ag, agw, wd, w_on, wrow, wfrac):
    """An event at `now` in which flows of lazy class b finish. When it is a one-class event of
    the exact algorithm (the class is every flow bottlenecked on b, a member is left, nobody else
    is bottlenecked on a link the event touches, and every other link the class crosses stays
    below cap (1 - tol) at the class's new fair share), apply it and return True; else leave
    everything as it was and return False (the finishing members are in FI_FIN either way)."""
    base = ri[RI_START, b]
    n_all = ri[RI_LZ_N, b]
    x = rf[RF_LZ_X, b]
    v0 = rf[RF_LZ_V, b]
    t0 = rf[RF_LZ_T, b]
    n = n_all
    n_fin = 0
    while n > 0 and t0 + (ck[base] - v0) / x <= now + tol:
        fi[FI_FIN, n_fin] = pi[PI_CITEM, base]
        n_fin += 1
        n -= 1  # pop the top of the member heap (written out, see `_finishes`)
        key = ck[base + n]
        item = pi[PI_CITEM, base + n]
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
            pi[PI_CITEM, base + i] = pi[PI_CITEM, base + c]
            i = c
        if n > 0:
            ck[base + i] = key
            pi[PI_CITEM, base + i] = item
    ok = n > 0 and n_fin > 0 and ri[RI_BCNT, b] == n_all
    for j in range(n_fin):
        f = fi[FI_FIN, j]
        for k in range(indptr[f], indptr[f + 1]):
            if res[k] != b and ri[RI_BCNT, res[k]] > 0:
                ok = False
    x_new = 0.0
    w_all = rf[RF_LZ_W, b]
    w_left = w_all
    for j in range(n_fin):
        w_left -= ff[FF_WT, fi[FI_FIN, j]]
    if ok:
        # the other flows on b keep their rates; the class shares what they leave
        x_new = max(rf[RF_CAP, b] - (rf[RF_LOAD, b] - w_all * x), 0.0) / w_left
        ok = x_new > 0.0
    if ok:
        ok = _lz_shift(b, n_fin, x_new, x_new - x, w_left, tol_b, ff, fi, rf, ri, pi, indptr, res, ag, agw,
                       wd, w_on, wrow, wfrac)
    if not ok:
        for j in range(n_fin):  # put the finished flows back
            f = fi[FI_FIN, j]
            _mh_push(ck, pi, base, n, ff[FF_REM, f], f)
            n += 1
        return False
    _lz_retire(b, now, n_fin, x, v0, t0, x_new, tol_b, ff, fi, active, rf, ri, pi, indptr, res, wd, w_on, wrow, wfrac)
    ri[RI_LZ_N, b] = n
    rf[RF_LZ_X, b] = x_new
    rf[RF_LZ_W, b] = w_left
    _heap_set(rf, ri, RF_GKEY, RI_GITEM, RI_GPOS, gn, ri[RI_GPOS, b], now + (ck[base] - rf[RF_LZ_V, b]) / x_new, b)
    return True


@njit_inline
def _lz_shift(b, n_fin, x_new, d, w_left, tol_b, ff, fi, rf, ri, pi, indptr, res, ag, agw, wd, w_on, wrow, wfrac):
    """The loads of class b's links at its new share x_new (d: the change per unit weight) with
    the FI_FIN members gone, and the check that no other link it crosses saturates or holds
    another bottleneck. True: applied (loads, window integrals, largest rates); False: undone (a
    raised largest rate is then marked for recomputing)."""
    for j in range(n_fin):
        f = fi[FI_FIN, j]
        for k in range(indptr[f], indptr[f + 1]):
            if res[k] != b:
                q = pi[PI_AGG, k]
                ag[AG_CNT, q] -= 1
                agw[q] = agw[q] - ff[FF_WT, f] if ag[AG_CNT, q] > 0 else 0.0
    ok = True
    lim = 1.0 - tol_b
    a0 = ri[RI_LZ_A0, b]
    a1 = a0 + ri[RI_LZ_AN, b]
    for j in range(a0, a1):
        c = agw[j]  # the members' weight on it (0: none left)
        if c > 0.0:
            r = ag[AG_RES, j]
            dl = c * d
            rf[RF_LOAD, r] += dl
            if w_on:
                wd[wrow, r, 0] += dl * wfrac
                wd[wrow, r, 1] += dl
            if ri[RI_BCNT, r] > 0 or rf[RF_LOAD, r] >= rf[RF_CAP, r] * lim:
                ok = False
            if x_new > rf[RF_MAXR, r]:
                rf[RF_MAXR, r] = x_new
    if ok:
        rf[RF_LOAD, b] += w_left * d
        if w_on:
            wd[wrow, b, 0] += w_left * d * wfrac
            wd[wrow, b, 1] += w_left * d
        return True
    for j in range(a0, a1):
        c = agw[j]
        if c > 0.0:
            r = ag[AG_RES, j]
            dl = c * d
            rf[RF_LOAD, r] -= dl
            if w_on:
                wd[wrow, r, 0] -= dl * wfrac
                wd[wrow, r, 1] -= dl
            ri[RI_MAXR_OK, r] = 0
    for j in range(n_fin):
        f = fi[FI_FIN, j]
        for k in range(indptr[f], indptr[f + 1]):
            if res[k] != b:
                ag[AG_CNT, pi[PI_AGG, k]] += 1
                agw[pi[PI_AGG, k]] += ff[FF_WT, f]
    return False


@njit_inline
def _lz_retire(b, now, n_fin, x, v0, t0, x_new, tol_b, ff, fi, active, rf, ri, pi, indptr, res, wd, w_on, wrow, wfrac):
    """Finish the FI_FIN members of class b (rate x per unit weight, V = v0 at t0 before this
    event) at their projected times: finish times, loads and window integrals, bottleneck lists."""
    _lz_advance(b, now, rf)
    if x_new > rf[RF_MAXR, b]:
        rf[RF_MAXR, b] = x_new
    for j in range(n_fin):
        f = fi[FI_FIN, j]
        key = ff[FF_REM, f]
        t_proj = t0 + (key - v0) / x
        ff[FF_FINISH, f] = t_proj + ff[FF_LAT, f]
        active[f] = False
        fi[FI_LZC, f] = -1
        i = fi[FI_BPOS, f]  # off the flows bottlenecked on b
        last = pi[PI_BOTT, ri[RI_START, b] + ri[RI_BCNT, b] - 1]
        pi[PI_BOTT, ri[RI_START, b] + i] = last
        fi[FI_BPOS, last] = i
        ri[RI_BCNT, b] -= 1
        fi[FI_BOTT, f] = -1
        x_f = x * ff[FF_WT, f]
        late = x_f * (t_proj - now)  # bytes it carries after `now` (|t_proj - now| <= tol)
        for k in range(indptr[f], indptr[f + 1]):
            r = res[k]
            ri[RI_ACT, r] -= 1
            dl = -x_f
            rf[RF_LOAD, r] -= x_f
            if x >= rf[RF_MAXR, r] * (1.0 - tol_b):
                ri[RI_MAXR_OK, r] = 0
            if ri[RI_ACT, r] == 0:
                dl -= rf[RF_LOAD, r]
                rf[RF_LOAD, r] = 0.0
            if w_on:
                wd[wrow, r, 0] += dl * wfrac + late
                wd[wrow, r, 1] += dl
        ff[FF_RATE, f] = 0.0
        ff[FF_REM, f] = 0.0


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


@njit
def _simulate_sorted(indptr, res, nbytes, release, lat_mult, cap, res_lat, n_windows, window_ns,
                     t_origin, rel_eps, merge, lazy_min, wt):
    """`simulate_flows` on flows numbered in release order (`wt`: their weights), one event at a
    time through the phase functions below. Rates compare per unit weight wherever max-min
    compares them: the largest rate of a link (RF_MAXR), the bottleneck check, a class's fair
    share and a lazy class's rate are all rate / weight. Bytes per window are integrals of the
    link loads: a change dl of a load at `now`, in window w, adds dl * (end of w - now) to w and
    dl * window_ns to each later window; wd[w + 1, r] holds those two parts (row 0: changes before
    the first window) and `_window_bytes` sums them up, O(1) per change."""
    n_flows = nbytes.size
    n_res = cap.size
    n_win = max(n_windows, 0)
    wd = np.zeros((n_win + 1, n_res, 2), np.float64)
    if n_flows == 0:
        return np.full(n_flows, np.nan), np.zeros((n_res, n_win), np.float64)
    ff, fi, rf, ri, pi = _state(indptr, res, nbytes, release, lat_mult, cap, res_lat, wt)
    unit = True
    for f in range(n_flows):
        if wt[f] != 1.0:
            unit = False
    active = np.zeros(n_flows, np.bool_)  # running (a bool array: scans of a pool read it flow by flow)
    ck = np.empty(res.size, np.float64)
    ag = np.empty((2, 1024), np.int64)
    agw = np.empty(1024, np.float64)
    (w_links, w_cnt, w_fill, w_members, w_resid, w_nun, w_wun, w_used, w_ver, w_hk, w_hi, w_ht, w_frozen, w_sptr,
     w_sloc) = _waterfill_scratch(n_flows, n_res, res.size)
    s_list, new_rate, froze_at, lmap, lmark = fi[FI_S], ff[FF_NEW], fi[FI_FROZE], ri[RI_LMAP], ri[RI_LMARK]
    cap_r, load_r, rate_r, wt_r = rf[RF_CAP], rf[RF_LOAD], ff[FF_RATE], ff[FF_WT]
    hn = gn = nxt = event = wstamp = ag_used = 0
    lazy_min = 0 if merge != 0.0 else lazy_min
    tol_b = 1e3 * rel_eps
    while True:
        t_rel = ff[FF_REL, fi[FI_ORDER, nxt]] if nxt < n_flows else np.inf
        t_fin = ff[FF_HKEY, 0] if hn > 0 else np.inf
        t_cls = rf[RF_GKEY, 0] if gn > 0 else np.inf
        if t_rel == np.inf and t_fin == np.inf and t_cls == np.inf:
            break
        now = min(t_rel, t_fin, t_cls)
        tol = rel_eps * abs(now) + 1e-6
        event += 1
        w_on, wrow, wfrac = _window_of(now, n_win, t_origin, window_ns)
        if gn == 0:
            ag_used = 0
        else:
            gn, hn = _class_events(now, tol, tol_b, gn, hn, ff, fi, active, rf, ri, pi, ck, indptr, res, ag, agw,
                                   wd, w_on, wrow, wfrac)
            if t_rel > now + tol and (hn == 0 or ff[FF_HKEY, 0] > now + tol):
                continue
        hn, n_chg = _finishes(now, tol, tol_b, merge, unit, event, hn, ff, fi, active, rf, ri, pi, indptr, res,
                              wd, w_on, wrow, wfrac)
        nxt, s_n, n_chg, arrivals = _arrivals(now, tol, event, nxt, n_chg, ff, fi, active, ri, pi, indptr, res)
        s_n, gn, hn = _seed(now, event, arrivals, n_chg, s_n, gn, hn, ff, fi, active, rf, ri, pi, ck)
        if not arrivals:  # a flow pinned by another valid bottleneck on an unchanged resource stays out of S
            s_n = _bottlenecks(0, s_n, 0, 0, event, tol_b, unit, ff, fi, active, rf, ri, pi, indptr, res)
        fast_cls = -1
        while s_n > 0:
            wstamp += 1
            fast_cls = -1
            one, n_cls = _class_shares(wstamp, s_n, tol_b, ff, fi, rf, ri, indptr, res)
            if one and n_cls == 1:
                fast_cls = fi[FI_BOTT, fi[FI_S, 0]]
            elif not one:
                wstamp += 1
                _waterfill(s_list, s_n, indptr, res, cap_r, load_r, rate_r, wt_r, lmap, lmark, wstamp, new_rate,
                           froze_at, w_links, w_cnt, w_fill, w_members, w_resid, w_nun, w_wun, w_used, w_ver,
                           w_hk, w_hi, w_ht, w_frozen, w_sptr, w_sloc)
            n_chg = _apply_rates(event, s_n, n_chg, rel_eps, tol_b, unit, ff, fi, rf, ri, indptr, res,
                                 wd, w_on, wrow, wfrac)
            wstamp += 1
            n_bad, gn, hn = _verify(now, wstamp, s_n, n_chg, gn, hn, tol_b, unit, ff, fi, active, rf, ri, pi, ck,
                                    indptr, res)
            if n_bad == 0:
                break
            wstamp += 1
            grew, s_n, gn, hn = _grow(now, event, wstamp, s_n, n_bad, gn, hn, tol_b, unit, ff, fi, active, rf, ri,
                                      pi, ck, indptr, res)
            if not grew:
                fast_cls = -1
                break
        lz_b = _lazy_class_of(fast_cls, s_n, lazy_min, ff, fi, rf, ri)
        if lz_b >= 0:
            ag, agw, ag_used = _make_class(lz_b, now, s_n, ag_used, ag, agw, ff, fi, rf, ri, pi, indptr, res)
        hn, gn = _rekey(now, lz_b, s_n, hn, gn, unit, ff, fi, rf, ri, pi, ck)
    return ff[FF_FINISH].copy(), _window_bytes(wd, n_win, window_ns)


@njit
def _state(indptr, res, nbytes, release, lat_mult, cap, res_lat, wt):
    """The state arrays (ff, fi, rf, ri, pi) at the start: every flow waiting, every load 0."""
    n_flows = nbytes.size
    n_res = cap.size
    ff = np.zeros((N_FF, n_flows), np.float64)
    fi = np.zeros((N_FI, n_flows), np.int64)
    rf = np.zeros((N_RF, n_res), np.float64)
    ri = np.zeros((N_RI, n_res), np.int64)
    pi = np.zeros((N_PI, res.size), np.int64)
    static = np.zeros(n_res, np.int64)
    for f in range(n_flows):
        lat = 0.0
        for k in range(indptr[f], indptr[f + 1]):
            static[res[k]] += 1
            lat += res_lat[res[k]]
        ff[FF_LAT, f] = lat * lat_mult[f]
        ff[FF_REM, f] = nbytes[f]
        ff[FF_WT, f] = wt[f]
        ff[FF_FINISH, f] = np.nan
        ff[FF_REL, f] = release[f]
    ff[FF_IW, :] = 1.0 / wt  # an array division, as numpy divides (no ZeroDivisionError)
    for row in (FI_BOTT, FI_IN_S, FI_CHECKED, FI_LZC, FI_HPOS):
        fi[row, :] = -1
    fi[FI_ORDER, :] = np.argsort(release, kind="mergesort")
    for r in range(n_res):
        rf[RF_CAP, r] = cap[r]
    for r in range(1, n_res):
        ri[RI_START, r] = ri[RI_START, r - 1] + static[r - 1]
    for row in (RI_CMARK, RI_RCHG, RI_LMARK, RI_GPOS):
        ri[row, :] = -1
    return ff, fi, rf, ri, pi


@njit
def _waterfill_scratch(n_flows, n_res, n_inc):
    """`_waterfill`'s scratch arrays, made once per simulation (its docstring's table)."""
    n_heap = n_res + n_inc + 1
    return (np.empty(n_res, np.int64), np.zeros(n_res + 1, np.int64), np.empty(n_res, np.int64),
            np.empty(n_inc, np.int64), np.empty(n_res, np.float64), np.empty(n_res, np.int64),
            np.empty(n_res, np.float64), np.empty(n_res, np.float64), np.empty(n_res, np.int64),
            np.empty(n_heap, np.float64), np.empty(n_heap, np.int64), np.empty(n_heap, np.int64),
            np.empty(n_flows, np.bool_), np.empty(n_flows + 1, np.int64), np.empty(n_inc, np.int64))


@njit_inline
def _window_of(now, n_win, t_origin, window_ns):
    """(w_on, wrow, wfrac) of an event at `now`: whether its load changes count in a window, the
    row of wd they go to and the time (ns) from `now` to the end of that window."""
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
    return w_on, wrow, wfrac


@njit
def _window_bytes(wd, n_win, window_ns):
    """Bytes per resource per window [resource, window] from the integrals wd."""
    n_res = wd.shape[1]
    out = np.empty((n_res, n_win), np.float64)
    for r in range(n_res):
        level = wd[0, r, 1]
        for w in range(n_win):
            out[r, w] = wd[w + 1, r, 0] + level * window_ns
            level += wd[w + 1, r, 1]
    return out


@njit
def _class_events(now, tol, tol_b, gn, hn, ff, fi, active, rf, ri, pi, ck, indptr, res, ag, agw, wd, w_on, wrow, wfrac):
    """Each lazy class with flows finishing now: a lazy class event, else flows again (the classes
    are independent, so one after the other at `now` is the same as all together). Returns (gn, hn)."""
    lim = now + tol
    n_done = 0
    while gn > 0 and rf[RF_GKEY, 0] <= lim:
        cb = ri[RI_GITEM, 0]
        if _lz_event(cb, now, tol, tol_b, gn, ff, fi, active, rf, ri, pi, ck, indptr, res, ag, agw, wd, w_on, wrow,
                     wfrac):
            rf[RF_DONE_K, n_done] = rf[RF_GKEY, ri[RI_GPOS, cb]]
            ri[RI_DONE_I, n_done] = cb
            n_done += 1
            gn = _heap_delete(rf, ri, RF_GKEY, RI_GITEM, RI_GPOS, gn, cb)
        else:
            gn, hn = _lz_unlazy(cb, now, gn, hn, ff, fi, rf, ri, pi, ck)
    for j in range(n_done):
        gn += 1
        _heap_set(rf, ri, RF_GKEY, RI_GITEM, RI_GPOS, gn, gn - 1, rf[RF_DONE_K, j], ri[RI_DONE_I, j])
    return gn, hn


@njit
def _mark_changed(r, event, n_chg, ri):
    """Add resource r to this event's changed resources (once); returns n_chg."""
    if ri[RI_RCHG, r] != event:
        ri[RI_RCHG, r] = event
        ri[RI_CHG, n_chg] = r
        n_chg += 1
    return n_chg


@njit
def _finishes(now, tol, tol_b, merge, unit, event, hn, ff, fi, active, rf, ri, pi, indptr, res, wd, w_on, wrow, wfrac):
    """The flows of the completion heap finishing now (or, with `merge`, within merge x their age):
    finish times, loads and window integrals, bottleneck lists; the resources they free are the
    event's first changed resources. Returns (hn, n_chg)."""
    n_chg = 0
    while hn > 0 and ff[FF_HKEY, 0] <= now + tol + merge * (ff[FF_HKEY, 0] - ff[FF_REL, fi[FI_HITEM, 0]]):
        f = fi[FI_HITEM, 0]
        t_proj = ff[FF_HKEY, 0]
        tf = t_proj if t_proj <= now + tol else now
        # pop the heap top (written out, as is the bottleneck list below: a call per flow to a
        # helper taking arrays costs reference counting numba cannot prune)
        fi[FI_HPOS, f] = -1
        hn -= 1
        if hn > 0:
            key = ff[FF_HKEY, hn]
            item = fi[FI_HITEM, hn]
            i = 0
            while True:
                c = 2 * i + 1
                if c >= hn:
                    break
                if c + 1 < hn and ff[FF_HKEY, c + 1] < ff[FF_HKEY, c]:
                    c += 1
                if ff[FF_HKEY, c] >= key:
                    break
                ff[FF_HKEY, i] = ff[FF_HKEY, c]
                fi[FI_HITEM, i] = fi[FI_HITEM, c]
                fi[FI_HPOS, fi[FI_HITEM, i]] = i
                i = c
            ff[FF_HKEY, i] = key
            fi[FI_HITEM, i] = item
            fi[FI_HPOS, item] = i
        rate_f = ff[FF_RATE, f]
        # the bytes it carries after `now` (t_proj - now: at most tol, or `merge` x its age)
        late = rate_f * (t_proj - now) if t_proj > ff[FF_TLAST, f] else 0.0
        ff[FF_REM, f] = 0.0
        ff[FF_FINISH, f] = tf + ff[FF_LAT, f]
        active[f] = False
        old = fi[FI_BOTT, f]
        if old >= 0:
            i = fi[FI_BPOS, f]
            last = pi[PI_BOTT, ri[RI_START, old] + ri[RI_BCNT, old] - 1]
            pi[PI_BOTT, ri[RI_START, old] + i] = last
            fi[FI_BPOS, last] = i
            ri[RI_BCNT, old] -= 1
            fi[FI_BOTT, f] = -1
        per_wt = rate_f if unit else rate_f * ff[FF_IW, f]
        for k in range(indptr[f], indptr[f + 1]):
            r = res[k]
            ri[RI_ACT, r] -= 1
            dl = -rate_f
            rf[RF_LOAD, r] -= rate_f
            if per_wt >= rf[RF_MAXR, r] * (1.0 - tol_b):
                ri[RI_MAXR_OK, r] = 0
            if ri[RI_ACT, r] == 0:
                dl -= rf[RF_LOAD, r]
                rf[RF_LOAD, r] = 0.0
            if w_on:
                wd[wrow, r, 0] += dl * wfrac + late
                wd[wrow, r, 1] += dl
            n_chg = _mark_changed(r, event, n_chg, ri)
        ff[FF_RATE, f] = 0.0
    return hn, n_chg


@njit
def _arrivals(now, tol, event, nxt, n_chg, ff, fi, active, ri, pi, indptr, res):
    """The flows released now (from FI_ORDER[nxt]) start at rate 0 and join S, in flow order (the
    order of the arrays S's loops read); a flow with no bytes or no path finishes at once.
    Returns (nxt, s_n, n_chg, whether any started)."""
    n_flows = fi.shape[1]
    s_n = 0
    arrivals = False
    while nxt < n_flows and ff[FF_REL, fi[FI_ORDER, nxt]] <= now + tol:
        f = fi[FI_ORDER, nxt]
        nxt += 1
        if ff[FF_REM, f] <= 0.0 or indptr[f + 1] == indptr[f]:
            ff[FF_FINISH, f] = ff[FF_REL, f] + ff[FF_LAT, f] + (0.0 if ff[FF_REM, f] <= 0.0 else np.inf)
            continue
        active[f] = True
        arrivals = True
        ff[FF_TLAST, f] = now
        ff[FF_RATE, f] = 0.0
        fi[FI_IN_S, f] = event
        ff[FF_ORIG, f] = 0.0
        fi[FI_S, s_n] = f
        s_n += 1
        for k in range(indptr[f], indptr[f + 1]):
            r = res[k]
            pi[PI_POOL, ri[RI_START, r] + ri[RI_USED, r]] = f
            ri[RI_USED, r] += 1
            ri[RI_ACT, r] += 1
            ri[RI_NARR, r] += 1
            n_chg = _mark_changed(r, event, n_chg, ri)
    return nxt, s_n, n_chg, arrivals


@njit
def _join_s(g, event, s_n, ff, fi):
    """Flow g into S (once per event), its rate kept as FF_ORIG; returns s_n."""
    if fi[FI_IN_S, g] != event:
        fi[FI_IN_S, g] = event
        ff[FF_ORIG, g] = ff[FF_RATE, g]
        fi[FI_S, s_n] = g
        s_n += 1
    return s_n


@njit
def _seed(now, event, arrivals, n_chg, s_n, gn, hn, ff, fi, active, rf, ri, pi, ck):
    """S0: the flows on a changed resource that arrived now (in S already) or, with no arrival,
    were bottlenecked there; a lazy class it reaches becomes flows again. Returns (s_n, gn, hn)."""
    for c in range(n_chg):
        r = ri[RI_CHG, c]
        start = ri[RI_START, r]
        if arrivals:
            every = ri[RI_NARR, r] == ri[RI_ACT, r]
            ri[RI_NARR, r] = 0
            if every:  # all its flows arrived now
                continue
            w = start
            for q in range(start, start + ri[RI_USED, r]):
                g = pi[PI_POOL, q]
                if not active[g]:
                    continue
                pi[PI_POOL, w] = g
                w += 1
                if fi[FI_LZC, g] >= 0:
                    gn, hn = _lz_unlazy(fi[FI_LZC, g], now, gn, hn, ff, fi, rf, ri, pi, ck)
                s_n = _join_s(g, event, s_n, ff, fi)
            ri[RI_USED, r] = w - start
        else:
            for q in range(start, start + ri[RI_BCNT, r]):
                g = pi[PI_BOTT, q]
                if fi[FI_LZC, g] >= 0:
                    gn, hn = _lz_unlazy(fi[FI_LZC, g], now, gn, hn, ff, fi, rf, ri, pi, ck)
                s_n = _join_s(g, event, s_n, ff, fi)
    return s_n, gn, hn


@njit
def _bottlenecks(mode, n, n_out, stamp, skip, tol_b, unit, ff, fi, active, rf, ri, pi, indptr, res):
    """The bottleneck of each of n flows: a saturated resource on its path on which its rate per
    unit weight is the largest (a resource whose RI_RCHG is `skip` is passed over; `hint` is tried
    first). mode 0: the flows of S with no arrival; one with a bottleneck on a resource this
    event did not change leaves S (the members keep their rates), returns the new s_n. mode 1:
    the flows of S after a solve (hint: the resource that froze it); mode 2: FI_CAND (hint: its
    bottleneck); both set the bottleneck and append the flows without one to FI_BAD from n_out,
    returning their number. One loop for the three: the per-flow work stays inline."""
    out = n_out
    for i in range(n):
        if mode == 2:
            h = fi[FI_CAND, i]
            hint = fi[FI_BOTT, h]
        else:
            h = fi[FI_S, i]
            hint = -1
            if mode == 1:
                fi[FI_CHECKED, h] = stamp
                hint = fi[FI_FROZE, i]
        rh = ff[FF_RATE, h] if unit else ff[FF_RATE, h] * ff[FF_IW, h]
        b = -1
        p0 = indptr[h]
        for a in range(-1 if hint >= 0 else 0, indptr[h + 1] - p0):
            r = hint if a < 0 else res[p0 + a]
            if (a >= 0 and r == hint) or ri[RI_RCHG, r] == skip or rf[RF_LOAD, r] < rf[RF_CAP, r] * (1.0 - tol_b):
                continue
            if ri[RI_MAXR_OK, r] == 0:  # recompute its largest rate, dropping finished flows from its pool
                ri[RI_MAXR_OK, r] = 1
                m = 0.0
                start = ri[RI_START, r]
                w = start
                for q in range(start, start + ri[RI_USED, r]):
                    g = pi[PI_POOL, q]
                    if active[g]:
                        pi[PI_POOL, w] = g
                        w += 1
                        c = fi[FI_LZC, g]
                        rg = ff[FF_RATE, g] if unit else ff[FF_RATE, g] * ff[FF_IW, g]
                        m = max(m, rg if c < 0 else rf[RF_LZ_X, c])
                ri[RI_USED, r] = w - start
                rf[RF_MAXR, r] = m
            if rh >= rf[RF_MAXR, r] * (1.0 - tol_b):
                b = r
                break
        if mode == 0 and b < 0:
            fi[FI_S, out] = h
            out += 1
            continue
        old = fi[FI_BOTT, h]
        if old != b:
            if old >= 0:  # off the flows bottlenecked on old
                j = fi[FI_BPOS, h]
                last = pi[PI_BOTT, ri[RI_START, old] + ri[RI_BCNT, old] - 1]
                pi[PI_BOTT, ri[RI_START, old] + j] = last
                fi[FI_BPOS, last] = j
                ri[RI_BCNT, old] -= 1
            if b >= 0:
                pi[PI_BOTT, ri[RI_START, b] + ri[RI_BCNT, b]] = h
                fi[FI_BPOS, h] = ri[RI_BCNT, b]
                ri[RI_BCNT, b] += 1
            fi[FI_BOTT, h] = b
        if mode == 0:
            fi[FI_IN_S, h] = -1
        elif b < 0:
            fi[FI_BAD, out] = h
            out += 1
    return out


@njit
def _class_shares(stamp, s_n, tol_b, ff, fi, rf, ri, indptr, res):
    """Rate classes: flows of S bottlenecked on the same resource b are one class. When no flow of
    S crosses another class's resource and, with each class at its resource's fair share x_b,
    every other resource S crosses stays clearly unsaturated, progressive filling freezes each
    class at x_b on b: the water-fill's result without running it (most events of a skewed
    all-to-all; the same numbers, in the same order). Then FF_NEW and FI_FROZE are set. Returns
    (whether it applied, the number of classes)."""
    n_cls = 0
    for i in range(s_n):
        g = fi[FI_S, i]
        b = fi[FI_BOTT, g]
        if b < 0:
            return False, n_cls
        if ri[RI_CMARK, b] != stamp:
            ri[RI_CMARK, b] = stamp
            n_cls += 1
            ri[RI_CLS_N, b] = 0
            rf[RF_CLS_W, b] = 0.0
            rf[RF_CLS_X, b] = rf[RF_CAP, b] - rf[RF_LOAD, b]
        ri[RI_CLS_N, b] += 1
        rf[RF_CLS_W, b] += ff[FF_WT, g]
        rf[RF_CLS_X, b] += ff[FF_RATE, g]
    n_mark = 0
    for i in range(s_n):
        g = fi[FI_S, i]
        b = fi[FI_BOTT, g]
        if ri[RI_CLS_N, b] > 0:  # first member: residual -> fair share
            x = max(rf[RF_CLS_X, b], 0.0) / rf[RF_CLS_W, b]
            rf[RF_CLS_X, b] = x
            ri[RI_CLS_N, b] = -1
            if x <= 0.0:
                return False, n_cls
        d = rf[RF_CLS_X, b] * ff[FF_WT, g] - ff[FF_RATE, g]
        for k in range(indptr[g], indptr[g + 1]):
            r = res[k]
            if r == b:
                continue
            if ri[RI_CMARK, r] == stamp:  # crosses another class's resource
                return False, n_cls
            if ri[RI_LMARK, r] != stamp:
                ri[RI_LMARK, r] = stamp
                rf[RF_THR, r] = rf[RF_CAP, r] - rf[RF_LOAD, r]
                ri[RI_MARKED, n_mark] = r
                n_mark += 1
            rf[RF_THR, r] -= d
    for i in range(n_mark):
        r = ri[RI_MARKED, i]
        if rf[RF_THR, r] <= rf[RF_CAP, r] * tol_b:
            return False, n_cls
    for i in range(s_n):
        g = fi[FI_S, i]
        b = fi[FI_BOTT, g]
        ff[FF_NEW, i] = rf[RF_CLS_X, b] * ff[FF_WT, g]
        fi[FI_FROZE, i] = b
    return True, n_cls


@njit
def _apply_rates(event, s_n, n_chg, rel_eps, tol_b, unit, ff, fi, rf, ri, indptr, res, wd, w_on, wrow, wfrac):
    """S's new rates (FF_NEW) onto the loads, window integrals and largest rates; a resource whose
    load moved by more than rel_eps joins the changed ones. Returns n_chg."""
    for i in range(s_n):
        g = fi[FI_S, i]
        nw = ff[FF_NEW, i]
        d = nw - ff[FF_RATE, g]
        if d != 0.0:
            big = abs(d) > rel_eps * max(ff[FF_RATE, g], nw)
            for k in range(indptr[g], indptr[g + 1]):
                r = res[k]
                rf[RF_LOAD, r] += d
                if w_on:
                    wd[wrow, r, 0] += d * wfrac
                    wd[wrow, r, 1] += d
                if d > 0.0:
                    nr = nw if unit else nw * ff[FF_IW, g]
                    if nr > rf[RF_MAXR, r]:
                        rf[RF_MAXR, r] = nr
                elif (ff[FF_RATE, g] if unit else ff[FF_RATE, g] * ff[FF_IW, g]) >= rf[RF_MAXR, r] * (1.0 - tol_b):
                    # r x (1/w) can round below the share it was set from: a rate that
                    # falls (or a flow that leaves) near the largest marks it for recomputing
                    ri[RI_MAXR_OK, r] = 0
                if big:
                    n_chg = _mark_changed(r, event, n_chg, ri)
            ff[FF_RATE, g] = nw
    return n_chg


@njit
def _verify(now, stamp, s_n, n_chg, gn, hn, tol_b, unit, ff, fi, active, rf, ri, pi, ck, indptr, res):
    """Every flow of S and every flow bottlenecked on a changed resource needs a bottleneck
    (`_bottlenecks` modes 1 and 2); a lazy class reached becomes flows again. Returns (the number
    of flows without one, in FI_BAD; gn; hn)."""
    n_bad = _bottlenecks(1, s_n, 0, stamp, -2, tol_b, unit, ff, fi, active, rf, ri, pi, indptr, res)
    n_chk = 0
    for c in range(n_chg):
        r = ri[RI_CHG, c]
        start = ri[RI_START, r]
        for q in range(start, start + ri[RI_BCNT, r]):
            h = pi[PI_BOTT, q]
            if fi[FI_LZC, h] >= 0:  # a lazy class's member: the class becomes flows again
                gn, hn = _lz_unlazy(fi[FI_LZC, h], now, gn, hn, ff, fi, rf, ri, pi, ck)
            if fi[FI_CHECKED, h] != stamp:
                fi[FI_CHECKED, h] = stamp
                fi[FI_CAND, n_chk] = h
                n_chk += 1
    n_bad = _bottlenecks(2, n_chk, n_bad, stamp, -2, tol_b, unit, ff, fi, active, rf, ri, pi, indptr, res)
    return n_bad, gn, hn


@njit
def _grow(now, event, stamp, s_n, n_bad, gn, hn, tol_b, unit, ff, fi, active, rf, ri, pi, ck, indptr, res):
    """S grows by the flows without a bottleneck and, on each saturated resource they cross, by
    every flow at a rate per unit weight near or above the least of theirs. Returns (whether it
    grew, s_n, gn, hn)."""
    grew = False
    n_mark = 0
    for i in range(n_bad):
        h = fi[FI_BAD, i]
        if fi[FI_IN_S, h] != event:
            s_n = _join_s(h, event, s_n, ff, fi)
            grew = True
        rh = ff[FF_RATE, h] if unit else ff[FF_RATE, h] * ff[FF_IW, h]
        for k in range(indptr[h], indptr[h + 1]):
            r = res[k]
            if rf[RF_LOAD, r] < rf[RF_CAP, r] * (1.0 - tol_b):
                continue
            if ri[RI_LMARK, r] != stamp:
                ri[RI_LMARK, r] = stamp
                rf[RF_THR, r] = rh
                ri[RI_MARKED, n_mark] = r
                n_mark += 1
            elif rh < rf[RF_THR, r]:
                rf[RF_THR, r] = rh
    for i in range(n_mark):
        r = ri[RI_MARKED, i]
        limit = rf[RF_THR, r] * (1.0 - tol_b)
        start = ri[RI_START, r]
        w = start
        for q in range(start, start + ri[RI_USED, r]):
            g = pi[PI_POOL, q]
            if not active[g]:
                continue
            pi[PI_POOL, w] = g
            w += 1
            c = fi[FI_LZC, g]
            nr = (ff[FF_RATE, g] if unit else ff[FF_RATE, g] * ff[FF_IW, g]) if c < 0 else rf[RF_LZ_X, c]
            if fi[FI_IN_S, g] != event and nr >= limit:
                if c >= 0:  # a lazy class's member: the class becomes flows again
                    gn, hn = _lz_unlazy(c, now, gn, hn, ff, fi, rf, ri, pi, ck)
                s_n = _join_s(g, event, s_n, ff, fi)
                grew = True
        ri[RI_USED, r] = w - start
    return grew, s_n, gn, hn


@njit
def _lazy_class_of(fast_cls, s_n, lazy_min, ff, fi, rf, ri):
    """The resource of a one-class event that set the rate of every flow bottlenecked on it (at
    least lazy_min of them): that class is kept lazily from now on; else -1."""
    if lazy_min <= 0 or fast_cls < 0 or s_n < lazy_min or ri[RI_BCNT, fast_cls] != s_n:
        return -1
    for i in range(s_n):
        g = fi[FI_S, i]
        if fi[FI_BOTT, g] != fast_cls or ff[FF_RATE, g] != rf[RF_CLS_X, fast_cls] * ff[FF_WT, g]:
            return -1
    return fast_cls


@njit
def _make_class(b, now, s_n, ag_used, ag, agw, ff, fi, rf, ri, pi, indptr, res):
    """S becomes lazy class b at `now` (V = 0): its rate and weight, and its links other than b
    with the members crossing each (appended to ag/agw, grown when full). Returns (ag, agw, ag_used)."""
    rf[RF_LZ_X, b] = rf[RF_CLS_X, b]
    rf[RF_LZ_V, b] = 0.0
    rf[RF_LZ_T, b] = now
    ri[RI_LZ_N, b] = s_n
    w_cls = 0.0
    for i in range(s_n):
        w_cls += ff[FF_WT, fi[FI_S, i]]
    rf[RF_LZ_W, b] = w_cls
    g0 = fi[FI_S, 0]
    n_inc = indptr[g0 + 1] - indptr[g0]
    for i in range(s_n):
        n_inc = max(n_inc, indptr[fi[FI_S, i] + 1] - indptr[fi[FI_S, i]])
    if ag_used + s_n * n_inc > agw.size:
        size = max(2 * agw.size, ag_used + s_n * n_inc)
        grown = np.empty((2, size), np.int64)
        grown[:, :ag_used] = ag[:, :ag_used]
        ag = grown
        grown_w = np.empty(size, np.float64)
        grown_w[:ag_used] = agw[:ag_used]
        agw = grown_w
    a0 = ag_used
    for i in range(s_n):
        g = fi[FI_S, i]
        for k in range(indptr[g], indptr[g + 1]):
            r = res[k]
            if r == b:
                continue
            if ri[RI_AMAP, r] == 0:
                ag[AG_RES, ag_used] = r
                ag[AG_CNT, ag_used] = 0
                agw[ag_used] = 0.0
                ag_used += 1
                ri[RI_AMAP, r] = ag_used
            q = ri[RI_AMAP, r] - 1
            pi[PI_AGG, k] = q
            ag[AG_CNT, q] += 1
            agw[q] += ff[FF_WT, g]
    for j in range(a0, ag_used):
        ri[RI_AMAP, ag[AG_RES, j]] = 0
    ri[RI_LZ_A0, b] = a0
    ri[RI_LZ_AN, b] = ag_used - a0
    return ag, agw, ag_used


@njit
def _rekey(now, lz_b, s_n, hn, gn, unit, ff, fi, rf, ri, pi, ck):
    """S's flows whose rate changed: remaining bytes brought to `now` and a new projected finish
    in the completion heap or, when S became lazy class lz_b, into the class's member heap keyed
    by the class's V (0 now) at which each drains, the class into the class heap. Returns (hn, gn)."""
    for i in range(s_n):
        g = fi[FI_S, i]
        if ff[FF_RATE, g] == ff[FF_ORIG, g] and lz_b < 0:
            continue
        if ff[FF_ORIG, g] > 0.0:
            ff[FF_REM, g] -= ff[FF_ORIG, g] * (now - ff[FF_TLAST, g])
            if ff[FF_REM, g] < 0.0:
                ff[FF_REM, g] = 0.0
        ff[FF_TLAST, g] = now
        if lz_b >= 0:
            if fi[FI_HPOS, g] >= 0:
                hn = _heap_delete(ff, fi, FF_HKEY, FI_HITEM, FI_HPOS, hn, g)
            fi[FI_LZC, g] = lz_b
            ff[FF_REM, g] = ff[FF_REM, g] if unit else ff[FF_REM, g] * ff[FF_IW, g]
            _mh_push(ck, pi, ri[RI_START, lz_b], i, ff[FF_REM, g], g)
            continue
        r_g = ff[FF_RATE, g] if ff[FF_RATE, g] > 0.0 else 1e-300
        key = now + ff[FF_REM, g] / r_g
        slot = fi[FI_HPOS, g]
        if slot < 0:
            slot = hn
            hn += 1
        _heap_set(ff, fi, FF_HKEY, FI_HITEM, FI_HPOS, hn, slot, key, g)
    if lz_b >= 0:
        gn += 1
        key = now + ck[ri[RI_START, lz_b]] / rf[RF_LZ_X, lz_b]
        _heap_set(rf, ri, RF_GKEY, RI_GITEM, RI_GPOS, gn, gn - 1, key, lz_b)
    return hn, gn



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
