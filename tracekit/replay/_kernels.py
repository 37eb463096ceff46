"""numba kernels for replay: routing to CSR paths, the max-min fair fluid simulator, and the
dependency scheduler. Kernels see numpy arrays, scalars and named tuples of them (`FatTreeTables`,
`GraphTables`) only, and read no module globals but constants (`FlowMode`; the flow kernel's state
table layout, `_S` and `_LAYOUT`)."""

from __future__ import annotations

import ctypes
import math
from enum import IntEnum
from typing import NamedTuple

import numba
import numpy as np
from numba.core import types
from numba.extending import intrinsic

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


# The kernel's state. `_simulate_sorted` keeps its arrays in three arenas (float64, int64, bool)
# and a table of (address, shape) per array, `_S` naming the rows; each phase function takes the
# table's address `st` and scalars, and rebuilds the views it reads with `numba.carray`. A view
# over a raw address carries no reference count, so a phase call costs no NRT_incref/decref pair
# per array (passing the arrays themselves cost 20% of the time: docs/replay.md, section 4).


class _S(IntEnum):
    """Rows of the flow kernel's state table: one array each (F: flows, R: resources, P: path
    entries, A: a lazy class's link slots; all flows are numbered in release order)."""

    INDPTR = 0      # [F + 1] int64: start of each flow's path in RES (CSR)
    RES = 1         # [P] int64: the resources of each path
    RELEASE = 2     # [F] float64: release time (ns)
    CAP = 3         # [R] float64: capacity (bytes/ns)
    WT = 4          # [F] float64: max-min weight
    FINISH = 5      # [F] float64: finish time with latency (out; nan until it finishes)
    LATENCY = 6     # [F] float64: latency added to the finish
    IW = 7          # [F] float64: 1 / weight (rates compare per unit weight as rate x IW)
    RATE = 8        # [F] float64: current rate (bytes/ns)
    REM = 9         # [F] float64: remaining bytes at TLAST (a lazy member: its key, see LZF)
    TLAST = 10      # [F] float64: time REM was last brought up to date
    ORIG = 11       # [F] float64: a member of S: its rate before this event
    NEW_RATE = 12   # [F] float64: S member i's new rate
    ACTIVE = 13     # [F] bool: released, with bytes and a path, not finished
    BOTT = 14       # [F] int64: bottleneck resource (-1: none)
    BPOS = 15       # [F] int64: slot in its bottleneck's part of BPOOL
    IN_S = 16       # [F] int64: the event it joined S at (-1: none)
    CHECKED = 17    # [F] int64: stamp of the verify pass that checked it
    FROZE_AT = 18   # [F] int64: S member i's freezing resource (the class's, or the water-fill's)
    S_LIST = 19     # [F] int64: the flows of S
    CAND = 20       # [F] int64: scratch: flows to check on changed resources
    BAD = 21        # [F] int64: scratch: flows found without a bottleneck
    ORDER = 22      # [F] int64: flows by release time
    LZC = 23        # [F] int64: its lazy class (by resource; -1: none)
    FIN = 24        # [F] int64: scratch: the lazy members finishing
    HK = 25         # [F] float64: completion heap: key (drain time)
    HI = 26         # [F] int64: completion heap: flow
    HPOS = 27       # [F] int64: a flow's slot in the completion heap (-1: none)
    LOAD = 28       # [R] float64: sum of the rates crossing it
    MAXR = 29       # [R] float64: largest rate per unit weight crossing it
    MAXR_OK = 30    # [R] bool: MAXR is up to date
    LSTART = 31     # [R] int64: first slot of the resource in the per-path-entry pools
    LUSED = 32      # [R] int64: flows in its part of POOLF
    LCNT = 33       # [R] int64: active flows crossing it
    NARR = 34       # [R] int64: flows that arrived on it this event
    BCNT = 35       # [R] int64: flows bottlenecked on it (its part of BPOOL)
    RCHG = 36       # [R] int64: the event that last changed it (-1: none)
    CHG_LINKS = 37  # [R] int64: the resources changed this event
    THR = 38        # [R] float64: scratch: residual capacity, or the slowest bad flow's rate
    MARKED = 39     # [R] int64: scratch: the resources THR holds
    CMARK = 40      # [R] int64: stamp: a class's resource this pass
    CLS_N = 41      # [R] int64: members of the class on it (-1: its fair share is set)
    CLS_W = 42      # [R] float64: their weight
    CLS_X = 43      # [R] float64: residual capacity, then the class's fair share
    LMAP = 44       # [R] int64: the water-fill's local id of a resource
    LMARK = 45      # [R] int64: stamp: LMAP / THR valid
    AMAP = 46       # [R] int64: scratch: 1 + a resource's slot in AGR while a class forms
    GK = 47         # [R] float64: heap of lazy classes: key (the first member's drain time)
    GI = 48         # [R] int64: heap of lazy classes: class
    GPOS = 49       # [R] int64: a class's slot in that heap (-1: none)
    DONE_K = 50     # [R] float64: scratch: classes applied at this event, their keys
    DONE_I = 51     # [R] int64: and the classes
    LZF = 52        # [R, 4] float64: per class: rate per unit weight, V, time of V, members' weight
    LZI = 53        # [R, 3] int64: per class: members, start and length of its links in AGR
    POOLF = 54      # [P] int64: per resource, the flows that crossed it since the last pass
    BPOOL = 55      # [P] int64: per resource, the flows bottlenecked on it
    AGGPOS = 56     # [P] int64: a lazy member's path entry's slot in AGR
    CK = 57         # [P] float64: member heaps (slots from LSTART of the class): key
    CI = 58         # [P] int64: member heaps: flow
    W_LINKS = 59    # [R] int64: water-fill scratch: per local link, its resource
    W_CNT = 60      # [R + 1] int64: start of its members
    W_FILL = 61     # [R] int64: members placed
    W_MEMBERS = 62  # [P] int64: per link, the S members crossing it
    W_RESID = 63    # [R] float64: capacity left by the flows outside S
    W_NUN = 64      # [R] int64: its unfrozen members
    W_WUN = 65      # [R] float64: their weight
    W_USED = 66     # [R] float64: rate of its frozen members
    W_VER = 67      # [R] int64: version of its key (stale heap entries)
    W_HK = 68       # [R + P + 1] float64: heap of links: key
    W_HI = 69       # [R + P + 1] int64: local link
    W_HT = 70       # [R + P + 1] int64: version
    W_FROZEN = 71   # [F] bool: S member i is frozen
    W_SPTR = 72     # [F + 1] int64: S's paths in local link ids: start
    W_SLOC = 73     # [P] int64: local link ids
    WD = 74         # [window + 1, RW, 2] float64: window integrals of the loads (see _simulate_sorted)
    AGR = 75        # [A] int64: a lazy class's links other than its own: resource
    AGC = 76        # [A] int64: members crossing it
    AGW = 77        # [A] float64: their weight


_N_SLOTS = len(_S)

# per row of _S: dtype (0 float64, 1 int64, 2 bool), its dims (0: none, 1: F, 2: R, 3: P, 4: F + 1,
# 5: R + 1, 6: R + P + 1, 7: windows + 1, 8: 2, 9: 3, 10: 4, 11: RW, the resources with windows),
# initial value (0: 0, 1: -1, 2: nan,
# 3: set by _new_state's caller); rows 0-4 and AGR-AGW are the caller's arrays (dtype -1)
_LAYOUT = np.array([
    (-1, 4, 0, 0, 3), (-1, 3, 0, 0, 3), (-1, 1, 0, 0, 3), (-1, 2, 0, 0, 3), (-1, 1, 0, 0, 3),
    (0, 1, 0, 0, 2), (0, 1, 0, 0, 3), (0, 1, 0, 0, 3), (0, 1, 0, 0, 0), (0, 1, 0, 0, 3),
    (0, 1, 0, 0, 0), (0, 1, 0, 0, 0), (0, 1, 0, 0, 0), (2, 1, 0, 0, 0), (1, 1, 0, 0, 1),
    (1, 1, 0, 0, 0), (1, 1, 0, 0, 1), (1, 1, 0, 0, 1), (1, 1, 0, 0, 0), (1, 1, 0, 0, 0),
    (1, 1, 0, 0, 0), (1, 1, 0, 0, 0), (1, 1, 0, 0, 3), (1, 1, 0, 0, 1), (1, 1, 0, 0, 0),
    (0, 1, 0, 0, 0), (1, 1, 0, 0, 0), (1, 1, 0, 0, 1), (0, 2, 0, 0, 0), (0, 2, 0, 0, 0),
    (2, 2, 0, 0, 0), (1, 2, 0, 0, 3), (1, 2, 0, 0, 0), (1, 2, 0, 0, 0), (1, 2, 0, 0, 0),
    (1, 2, 0, 0, 0), (1, 2, 0, 0, 1), (1, 2, 0, 0, 0), (0, 2, 0, 0, 0), (1, 2, 0, 0, 0),
    (1, 2, 0, 0, 1), (1, 2, 0, 0, 0), (0, 2, 0, 0, 0), (0, 2, 0, 0, 0), (1, 2, 0, 0, 0),
    (1, 2, 0, 0, 1), (1, 2, 0, 0, 0), (0, 2, 0, 0, 0), (1, 2, 0, 0, 0), (1, 2, 0, 0, 1),
    (0, 2, 0, 0, 0), (1, 2, 0, 0, 0), (0, 2, 10, 0, 0), (1, 2, 9, 0, 0), (1, 3, 0, 0, 0),
    (1, 3, 0, 0, 0), (1, 3, 0, 0, 0), (0, 3, 0, 0, 0), (1, 3, 0, 0, 0), (1, 2, 0, 0, 0),
    (1, 5, 0, 0, 0), (1, 2, 0, 0, 0), (1, 3, 0, 0, 0), (0, 2, 0, 0, 0), (1, 2, 0, 0, 0),
    (0, 2, 0, 0, 0), (0, 2, 0, 0, 0), (1, 2, 0, 0, 0), (0, 6, 0, 0, 0), (1, 6, 0, 0, 0),
    (1, 6, 0, 0, 0), (2, 1, 0, 0, 0), (1, 4, 0, 0, 0), (1, 3, 0, 0, 0), (0, 7, 11, 8, 0),
    (-1, 0, 0, 0, 3), (-1, 0, 0, 0, 3), (-1, 0, 0, 0, 3),
], np.int64)


if numba.config.DISABLE_JIT:  # plain Python (the NUMBA_DISABLE_JIT test run): ctypes pointers
    _CTYPES = {np.float64: ctypes.c_double, np.int64: ctypes.c_int64, np.bool_: ctypes.c_bool}

    def _pointer(address, dtype):
        """The int `address` as a pointer to `dtype` (for numba.carray)."""
        return ctypes.cast(int(address), ctypes.POINTER(_CTYPES[dtype]))
else:
    @intrinsic
    def _pointer(typingctx, address, dtype):
        """The int `address` as a pointer to `dtype` (for numba.carray)."""
        item = dtype.dtype
        sig = types.CPointer(item)(types.intp, dtype)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(types.CPointer(item)))

        return sig, codegen


@njit_inline
def _table(st):
    return numba.carray(_pointer(st, np.int64), (_N_SLOTS, 4))


@njit_inline
def _f1(st, slot):
    """Row `slot` of the state table at `st` as a 1-D float64 view (so for the others)."""
    t = _table(st)
    return numba.carray(_pointer(t[slot, 0], np.float64), t[slot, 1])


@njit_inline
def _i1(st, slot):
    t = _table(st)
    return numba.carray(_pointer(t[slot, 0], np.int64), t[slot, 1])


@njit_inline
def _b1(st, slot):
    t = _table(st)
    return numba.carray(_pointer(t[slot, 0], np.bool_), t[slot, 1])


@njit_inline
def _f2(st, slot):
    t = _table(st)
    return numba.carray(_pointer(t[slot, 0], np.float64), (t[slot, 1], t[slot, 2]))


@njit_inline
def _i2(st, slot):
    t = _table(st)
    return numba.carray(_pointer(t[slot, 0], np.int64), (t[slot, 1], t[slot, 2]))


@njit_inline
def _f3(st, slot):
    t = _table(st)
    return numba.carray(_pointer(t[slot, 0], np.float64), (t[slot, 1], t[slot, 2], t[slot, 3]))


@njit
def _point(tab, slot, address, n):
    """Make row `slot` of the table a 1-D array of n at `address` (the caller's array)."""
    tab[slot, 0] = address
    tab[slot, 1] = n
    tab[slot, 2] = 1
    tab[slot, 3] = 1


@njit
def _new_state(n_flows, n_res, n_inc, n_win, n_wres):
    """The state table and its three arenas (float64, int64, bool) for `_simulate_sorted`, every
    array at its `_LAYOUT` initial value; the caller points rows 0-4 and AGR-AGW at its arrays and
    sets the rows marked 3, and keeps the arenas alive while the table is used."""
    sizes = np.array([1, n_flows, n_res, n_inc, n_flows + 1, n_res + 1, n_res + n_inc + 1, n_win + 1, 2, 3, 4,
                      n_wres])
    tab = np.zeros((_N_SLOTS, 4), np.int64)
    used = np.zeros(3, np.int64)
    start = np.zeros(_N_SLOTS, np.int64)
    for s in range(_N_SLOTS):
        kind = _LAYOUT[s, 0]
        n = sizes[_LAYOUT[s, 1]] * sizes[_LAYOUT[s, 2]] * sizes[_LAYOUT[s, 3]]
        for d in range(3):
            tab[s, 1 + d] = sizes[_LAYOUT[s, 1 + d]]
        if kind >= 0:
            start[s] = used[kind]
            used[kind] += n
    af = np.zeros(used[0], np.float64)
    ai = np.zeros(used[1], np.int64)
    ab = np.zeros(used[2], np.bool_)
    for s in range(_N_SLOTS):
        kind = _LAYOUT[s, 0]
        n = tab[s, 1] * tab[s, 2] * tab[s, 3]
        init = _LAYOUT[s, 4]
        if kind == 0:
            part = af[start[s]:start[s] + n]
            tab[s, 0] = part.ctypes.data
            if init == 1:
                part[:] = -1.0
            elif init == 2:
                part[:] = np.nan
        elif kind == 1:
            part_i = ai[start[s]:start[s] + n]
            tab[s, 0] = part_i.ctypes.data
            if init == 1:
                part_i[:] = -1
        elif kind == 2:
            tab[s, 0] = ab[start[s]:start[s] + n].ctypes.data
    return tab, af, ai, ab


@njit
def _waterfill(st, s_n, stamp):
    """Weighted max-min rates of the flows in S given every other flow's current rate (progressive
    filling from the residual capacities: every unfrozen flow's rate is wt[f] x the level). Writes
    new_rate[i] for S member i and froze_at[i], the resource that froze it."""
    indptr = _i1(st, _S.INDPTR)
    res = _i1(st, _S.RES)
    cap = _f1(st, _S.CAP)
    wt = _f1(st, _S.WT)
    rate = _f1(st, _S.RATE)
    new_rate = _f1(st, _S.NEW_RATE)
    froze_at = _i1(st, _S.FROZE_AT)
    s_list = _i1(st, _S.S_LIST)
    hk = _f1(st, _S.W_HK)
    hi = _i1(st, _S.W_HI)
    load = _f1(st, _S.LOAD)
    lmap = _i1(st, _S.LMAP)
    lmark = _i1(st, _S.LMARK)
    links = _i1(st, _S.W_LINKS)
    cnt = _i1(st, _S.W_CNT)
    fill = _i1(st, _S.W_FILL)
    members = _i1(st, _S.W_MEMBERS)
    resid = _f1(st, _S.W_RESID)
    nun = _i1(st, _S.W_NUN)
    wun = _f1(st, _S.W_WUN)
    used = _f1(st, _S.W_USED)
    ver = _i1(st, _S.W_VER)
    ht = _i1(st, _S.W_HT)
    frozen = _b1(st, _S.W_FROZEN)
    sptr = _i1(st, _S.W_SPTR)
    sloc = _i1(st, _S.W_SLOC)
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


@njit
def _lz_flush(st, b, now, hn):
    """Turn lazy class b back into flows at `now` (remaining bytes and completion-heap keys as the
    exact algorithm has them); the caller takes it off the class heap. Returns the completion
    heap's new size. lzf, lzi, ck, ci, lzc, lstart: the classes (`_lz_event`); rate, wt, rem,
    tlast: per flow; hk, hi, hpos, hn: the completion heap and its size."""
    wt = _f1(st, _S.WT)
    rate = _f1(st, _S.RATE)
    rem = _f1(st, _S.REM)
    tlast = _f1(st, _S.TLAST)
    lzc = _i1(st, _S.LZC)
    hk = _f1(st, _S.HK)
    hi = _i1(st, _S.HI)
    hpos = _i1(st, _S.HPOS)
    lstart = _i1(st, _S.LSTART)
    lzf = _f2(st, _S.LZF)
    lzi = _i2(st, _S.LZI)
    ck = _f1(st, _S.CK)
    ci = _i1(st, _S.CI)
    _lz_advance(b, now, lzf)
    x = lzf[b, 0]
    v = lzf[b, 1]
    base = lstart[b]
    for m in range(lzi[b, 0]):
        g = ci[base + m]
        left = max(ck[base + m] - v, 0.0) * wt[g]
        rem[g] = left
        rate[g] = x * wt[g]
        tlast[g] = now
        lzc[g] = -1
        hn += 1
        _ih_set(hk, hi, hpos, hn, hn - 1, now + left / rate[g], g)
    lzi[b, 0] = 0
    return hn


@njit
def _lz_event(st, b, now, tol, tol_b, gn, w_on, wrow, wfrac):
    """An event at `now` in which flows of lazy class b finish. When it is a one-class event of
    the exact algorithm (the class is every flow bottlenecked on b, a member is left, nobody else
    is bottlenecked on a link the event touches, and every other link the class crosses stays
    below cap (1 - tol) at the class's new fair share), apply it and return True; else leave
    everything as it was and return False. The class's links other than b, with the number of
    members crossing each and their weight, are agr/agc/agw[lzi[b, 1]:+lzi[b, 2]]; aggpos maps a member's path entry
    to its slot there. Load changes go onto the window integrals wd (row wrow, see
    `_simulate_sorted`) when w_on."""
    indptr = _i1(st, _S.INDPTR)
    res = _i1(st, _S.RES)
    cap = _f1(st, _S.CAP)
    wt = _f1(st, _S.WT)
    finish = _f1(st, _S.FINISH)
    latency = _f1(st, _S.LATENCY)
    rate = _f1(st, _S.RATE)
    rem = _f1(st, _S.REM)
    active = _b1(st, _S.ACTIVE)
    bott = _i1(st, _S.BOTT)
    bpos = _i1(st, _S.BPOS)
    lzc = _i1(st, _S.LZC)
    fin = _i1(st, _S.FIN)
    load = _f1(st, _S.LOAD)
    maxr = _f1(st, _S.MAXR)
    maxr_ok = _b1(st, _S.MAXR_OK)
    lstart = _i1(st, _S.LSTART)
    lcnt = _i1(st, _S.LCNT)
    bcnt = _i1(st, _S.BCNT)
    gk = _f1(st, _S.GK)
    gi = _i1(st, _S.GI)
    gpos = _i1(st, _S.GPOS)
    lzf = _f2(st, _S.LZF)
    lzi = _i2(st, _S.LZI)
    bpool = _i1(st, _S.BPOOL)
    aggpos = _i1(st, _S.AGGPOS)
    ck = _f1(st, _S.CK)
    ci = _i1(st, _S.CI)
    wd = _f3(st, _S.WD)
    agr = _i1(st, _S.AGR)
    agc = _i1(st, _S.AGC)
    agw = _f1(st, _S.AGW)
    base = lstart[b]
    n_all = lzi[b, 0]
    x = lzf[b, 0]
    v0 = lzf[b, 1]
    t0 = lzf[b, 2]
    n = n_all
    n_fin = 0
    while n > 0 and t0 + (ck[base] - v0) / x <= now + tol:
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
    w_all = lzf[b, 3]
    w_left = w_all
    for j in range(n_fin):
        w_left -= wt[fin[j]]
    if ok:
        # the other flows on b keep their rates; the class shares what they leave
        x_new = max(cap[b] - (load[b] - w_all * x), 0.0) / w_left
        ok = x_new > 0.0
    a0 = lzi[b, 1]
    a1 = a0 + lzi[b, 2]
    if ok:
        for j in range(n_fin):
            f = fin[j]
            for k in range(indptr[f], indptr[f + 1]):
                if res[k] != b:
                    q = aggpos[k]
                    agc[q] -= 1
                    agw[q] = agw[q] - wt[f] if agc[q] > 0 else 0.0
        d = x_new - x
        lim = 1.0 - tol_b
        # one pass: loads, their window integrals, the check, the largest rates (undone below if
        # the check fails: a raised largest rate is then marked for recomputing)
        for j in range(a0, a1):
            c = agw[j]  # the members' weight on it (0: none left)
            if c > 0.0:
                r = agr[j]
                dl = c * d
                load[r] += dl
                if w_on and r < wd.shape[1]:
                    wd[wrow, r, 0] += dl * wfrac
                    wd[wrow, r, 1] += dl
                if bcnt[r] > 0 or load[r] >= cap[r] * lim:
                    ok = False
                if x_new > maxr[r]:
                    maxr[r] = x_new
        if ok:
            load[b] += w_left * d
            if w_on and b < wd.shape[1]:
                wd[wrow, b, 0] += w_left * d * wfrac
                wd[wrow, b, 1] += w_left * d
        else:  # undo
            for j in range(a0, a1):
                c = agw[j]
                if c > 0.0:
                    r = agr[j]
                    dl = c * d
                    load[r] -= dl
                    if w_on and r < wd.shape[1]:
                        wd[wrow, r, 0] -= dl * wfrac
                        wd[wrow, r, 1] -= dl
                    maxr_ok[r] = False
            for j in range(n_fin):
                f = fin[j]
                for k in range(indptr[f], indptr[f + 1]):
                    if res[k] != b:
                        agc[aggpos[k]] += 1
                        agw[aggpos[k]] += wt[f]
    if not ok:
        for j in range(n_fin):  # put the finished flows back
            f = fin[j]
            _mh_push(ck, ci, base, n, rem[f], f)
            n += 1
        return False
    _lz_advance(b, now, lzf)
    if x_new > maxr[b]:
        maxr[b] = x_new
    for j in range(n_fin):
        f = fin[j]
        key = rem[f]
        t_proj = t0 + (key - v0) / x
        finish[f] = t_proj + latency[f]
        active[f] = False
        lzc[f] = -1
        i = bpos[f]
        last = bpool[lstart[b] + bcnt[b] - 1]
        bpool[lstart[b] + i] = last
        bpos[last] = i
        bcnt[b] -= 1
        bott[f] = -1
        x_f = x * wt[f]
        late = x_f * (t_proj - now)  # bytes it carries after `now` (|t_proj - now| <= tol)
        for k in range(indptr[f], indptr[f + 1]):
            r = res[k]
            lcnt[r] -= 1
            dl = -x_f
            load[r] -= x_f
            if x >= maxr[r] * (1.0 - tol_b):
                maxr_ok[r] = False
            if lcnt[r] == 0:
                dl -= load[r]
                load[r] = 0.0
            if w_on and r < wd.shape[1]:
                wd[wrow, r, 0] += dl * wfrac + late
                wd[wrow, r, 1] += dl
        rate[f] = 0.0
        rem[f] = 0.0
    lzi[b, 0] = n
    lzf[b, 0] = x_new
    lzf[b, 3] = w_left
    _ih_set(gk, gi, gpos, gn, gpos[b], now + (ck[base] - lzf[b, 1]) / x_new, b)
    return True


@njit
def simulate_flows(indptr, res, nbytes, release, lat_mult, cap, res_lat, n_windows, window_ns,
                   t_origin, rel_eps, merge, lazy_min=16, weight=None, n_window_res=-1):
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
    | n_window_res | scalar    | int     | windows for resources below it only (-1: all)           |

    Returns finish [flow] float64 (ns, latency included; inf: bytes but no path) and bytes
    [resource, window] float64 (the first `n_window_res` resources when given: a rate limit's
    private resources, appended after the topology's, need none, and there is one per limited
    flow).
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
    n_wres = cap.size if n_window_res < 0 else min(n_window_res, cap.size)
    finish2, win = _simulate_sorted(indptr2, res2, nbytes[order], release[order], lat_mult[order],
                                    cap, res_lat, n_windows, window_ns, t_origin, rel_eps, merge, lazy_min, wt,
                                    n_wres)
    finish = np.empty(n_flows, np.float64)
    finish[order] = finish2
    return finish, win


@njit
def _simulate_sorted(indptr, res, nbytes, release, lat_mult, cap, res_lat, n_windows, window_ns,
                     t_origin, rel_eps, merge, lazy_min, wt, n_wres):
    """`simulate_flows` on flows numbered in release order (`wt`: their weights; windows for the
    first `n_wres` resources; parameters as there). Rates compare per unit weight wherever
    max-min compares them: the largest rate of a link (`maxr`), the bottleneck check, a class's
    fair share and a lazy class's rate are all rate / weight. Each event runs the phases in
    turn: lazy classes' finishes, finishes, arrivals, S0, then S solved and verified until every
    flow next to a change has a bottleneck, a new lazy class, the completion keys. The phases'
    parameters besides the state table `st`:

    | name        | meaning                                                                  |
    |-------------|--------------------------------------------------------------------------|
    | now, event  | the event's time (ns) and number (1, 2, ...; RCHG, IN_S compare with it)  |
    | tol, tol_b  | its tolerance (rel_eps x abs(now) + 1e-6 ns); that of saturation and of  |
    |             | the bottleneck check (1e3 x rel_eps)                                     |
    | rel_eps     | `simulate_flows`'s; a load change above it changes a resource            |
    | merge       | `simulate_flows`'s early-finish fraction                                 |
    | unit        | every weight is 1 (rates compare as they are)                            |
    | hn, gn      | sizes of the completion heap (HK) and of the class heap (GK)             |
    | nxt         | the next flow to release, in ORDER                                       |
    | s_n, n_chg  | flows in S (S_LIST); changed resources (CHG_LINKS)                       |
    | n_bad       | flows without a bottleneck (BAD)                                         |
    | wstamp      | a stamp no earlier pass used (CMARK, LMARK, CHECKED compare with it)     |
    | ag_used     | slots of AGR/AGC/AGW in use                                              |
    | lz_b, b     | a lazy class, by its resource (-1: none)                                 |
    | w_on, wrow, | whether this event counts in the window integrals WD, in which row, and  |
    | wfrac       | for how long (ns) up to its window's end (`_event_window`)               |
    """
    n_flows = nbytes.size
    n_res = cap.size
    n_win = max(n_windows, 0)
    if n_flows == 0:
        return np.full(n_flows, np.nan), np.zeros((n_wres, n_win), np.float64)
    release = release.astype(np.float64)
    cap = cap.astype(np.float64)
    wt = wt.astype(np.float64)
    tab, arena_f, arena_i, arena_b = _new_state(n_flows, n_res, res.size, n_win, n_wres)
    st = tab.ctypes.data
    _point(tab, _S.INDPTR, indptr.ctypes.data, indptr.size)
    _point(tab, _S.RES, res.ctypes.data, res.size)
    _point(tab, _S.RELEASE, release.ctypes.data, n_flows)
    _point(tab, _S.CAP, cap.ctypes.data, n_res)
    _point(tab, _S.WT, wt.ctypes.data, n_flows)
    agr = np.empty(1024, np.int64)
    agc = np.empty(1024, np.int64)
    agw = np.empty(1024, np.float64)
    _point(tab, _S.AGR, agr.ctypes.data, agr.size)
    _point(tab, _S.AGC, agc.ctypes.data, agc.size)
    _point(tab, _S.AGW, agw.ctypes.data, agw.size)
    unit = _init_flows(st, nbytes, lat_mult, res_lat)
    order = _i1(st, _S.ORDER)
    hk = _f1(st, _S.HK)
    gk = _f1(st, _S.GK)
    bcnt = _i1(st, _S.BCNT)
    hn = gn = nxt = event = wstamp = ag_used = 0
    tol_b = 1e3 * rel_eps
    if merge != 0.0:
        lazy_min = 0
    while True:
        t_rel = release[order[nxt]] if nxt < n_flows else np.inf
        t_fin = hk[0] if hn > 0 else np.inf
        t_cls = gk[0] if gn > 0 else np.inf
        if t_rel == np.inf and t_fin == np.inf and t_cls == np.inf:
            break
        now = min(t_rel, t_fin, t_cls)
        tol = rel_eps * abs(now) + 1e-6
        event += 1
        w_on, wrow, wfrac = _event_window(now, n_win, window_ns, t_origin)
        if gn == 0:
            ag_used = 0
        else:
            gn, hn = _lazy_finishes(st, now, tol, tol_b, gn, hn, w_on, wrow, wfrac)
            lim = now + tol
            if t_rel > lim and (hn == 0 or hk[0] > lim):
                continue
        hn, n_chg = _finish_flows(st, now, tol, tol_b, merge, event, hn, unit, w_on, wrow, wfrac)
        nxt, s_n, n_chg, arrivals = _arrive(st, now, tol, event, nxt, n_chg)
        s_n, gn, hn = _seed_s(st, now, event, arrivals, s_n, n_chg, gn, hn)
        if not arrivals:
            s_n = _drop_pinned(st, event, s_n, tol_b, unit)
        fast_cls = -1
        while s_n > 0:
            wstamp += 1
            one, fast_cls = _rate_classes(st, s_n, wstamp, tol_b)
            if not one:
                wstamp += 1
                _waterfill(st, s_n, wstamp)
            n_chg = _apply_rates(st, s_n, event, n_chg, rel_eps, tol_b, unit, w_on, wrow, wfrac)
            wstamp += 1
            n_bad, gn, hn = _verify(st, s_n, n_chg, now, wstamp, gn, hn, tol_b, unit)
            if n_bad == 0:
                break
            wstamp += 1
            s_n, grew, gn, hn = _grow_s(st, s_n, n_bad, event, wstamp, now, gn, hn, rel_eps, unit)
            if not grew:
                fast_cls = -1
                break
        lz_b = -1
        if lazy_min > 0 and fast_cls >= 0 and s_n >= lazy_min and bcnt[fast_cls] == s_n:
            lz_b = _whole_class(st, s_n, fast_cls)
        if lz_b >= 0:
            need = ag_used + _class_slots(st, s_n)
            if need > agr.size:
                size = max(2 * agr.size, need)
                agr = _grown(agr, ag_used, size)
                agc = _grown(agc, ag_used, size)
                agw = _grown(agw, ag_used, size)
                _point(tab, _S.AGR, agr.ctypes.data, size)
                _point(tab, _S.AGC, agc.ctypes.data, size)
                _point(tab, _S.AGW, agw.ctypes.data, size)
            ag_used = _form_lazy(st, lz_b, s_n, now, ag_used)
        hn, gn = _rekey(st, s_n, lz_b, now, hn, gn, unit)
    finish = _f1(st, _S.FINISH).copy()
    out = _window_bytes(_f3(st, _S.WD), n_wres, n_win, window_ns)
    _keep_alive(tab, arena_f, arena_i, arena_b, agr, agc, agw, release, cap, wt)
    return finish, out


@njit
def _grown(a, used, size):
    """A new array of `size` holding a's first `used` items."""
    out = np.empty(size, a.dtype)
    out[:used] = a[:used]
    return out


@njit
def _keep_alive(*arrays):
    """Nothing: a last use of the arrays behind the state table's views (numba frees an array
    after its last use, and a view over its address does not count as one)."""
    return len(arrays)


@njit
def _init_flows(st, nbytes, lat_mult, res_lat):
    """Fill the rows set from the inputs (REM, IW, LATENCY, LSTART, ORDER); returns whether every
    weight is 1."""
    indptr = _i1(st, _S.INDPTR)
    res = _i1(st, _S.RES)
    release = _f1(st, _S.RELEASE)
    wt = _f1(st, _S.WT)
    latency = _f1(st, _S.LATENCY)
    iw = _f1(st, _S.IW)
    rem = _f1(st, _S.REM)
    order = _i1(st, _S.ORDER)
    lstart = _i1(st, _S.LSTART)
    n_flows = rem.size
    n_res = lstart.size
    for f in range(n_flows):
        rem[f] = nbytes[f]
        iw[f] = 1.0 / wt[f]
    unit = True
    for f in range(n_flows):
        if wt[f] != 1.0:
            unit = False
    static = np.zeros(n_res, np.int64)
    for f in range(n_flows):
        lat = 0.0
        for k in range(indptr[f], indptr[f + 1]):
            static[res[k]] += 1
            lat += res_lat[res[k]]
        latency[f] = lat * lat_mult[f]
    for r in range(1, n_res):
        lstart[r] = lstart[r - 1] + static[r - 1]
    order[:] = np.argsort(release, kind="mergesort")
    return unit


@njit
def _event_window(now, n_win, window_ns, t_origin):
    """Whether an event at `now` counts in the window integrals, in which row of WD and for how
    long (ns) up to its window's end."""
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
def _lazy_finishes(st, now, tol, tol_b, gn, hn, w_on, wrow, wfrac):
    """Each lazy class with members finishing at `now`: a lazy class event, else flows again (the
    classes are independent, so one after the other at `now` is the same as all together).
    Returns the heaps' new sizes (classes, completions)."""
    gk = _f1(st, _S.GK)
    gi = _i1(st, _S.GI)
    gpos = _i1(st, _S.GPOS)
    done_k = _f1(st, _S.DONE_K)
    done_i = _i1(st, _S.DONE_I)
    lim = now + tol
    n_done = 0
    while gn > 0 and gk[0] <= lim:
        cb = gi[0]
        if _lz_event(st, cb, now, tol, tol_b, gn, w_on, wrow, wfrac):
            done_k[n_done] = gk[gpos[cb]]
            done_i[n_done] = cb
            n_done += 1
            gn = _ih_delete(gk, gi, gpos, gn, cb)
        else:
            gn = _ih_delete(gk, gi, gpos, gn, cb)
            hn = _lz_flush(st, cb, now, hn)
    for j in range(n_done):
        gn += 1
        _ih_set(gk, gi, gpos, gn, gn - 1, done_k[j], done_i[j])
    return gn, hn


@njit
def _finish_flows(st, now, tol, tol_b, merge, event, hn, unit, w_on, wrow, wfrac):
    """The flows draining at `now` (within tol, or `merge` x their age) finish: off the heap, their
    bottleneck and their links, whose loads (and window integrals) drop. Returns the completion
    heap's size and the number of changed resources (CHG_LINKS)."""
    indptr = _i1(st, _S.INDPTR)
    res = _i1(st, _S.RES)
    release = _f1(st, _S.RELEASE)
    finish = _f1(st, _S.FINISH)
    latency = _f1(st, _S.LATENCY)
    iw = _f1(st, _S.IW)
    rate = _f1(st, _S.RATE)
    rem = _f1(st, _S.REM)
    tlast = _f1(st, _S.TLAST)
    active = _b1(st, _S.ACTIVE)
    bott = _i1(st, _S.BOTT)
    bpos = _i1(st, _S.BPOS)
    hk = _f1(st, _S.HK)
    hi = _i1(st, _S.HI)
    hpos = _i1(st, _S.HPOS)
    load = _f1(st, _S.LOAD)
    maxr = _f1(st, _S.MAXR)
    maxr_ok = _b1(st, _S.MAXR_OK)
    lstart = _i1(st, _S.LSTART)
    lcnt = _i1(st, _S.LCNT)
    bcnt = _i1(st, _S.BCNT)
    rchg = _i1(st, _S.RCHG)
    chg_links = _i1(st, _S.CHG_LINKS)
    bpool = _i1(st, _S.BPOOL)
    wd = _f3(st, _S.WD)
    n_chg = 0
    while hn > 0 and hk[0] <= now + tol + merge * (hk[0] - release[hi[0]]):
        f = hi[0]
        t_proj = hk[0]
        tf = t_proj if t_proj <= now + tol else now
        # pop the heap top (inlined, as are the other helpers of this loop: numba's inliner
        # wraps array arguments in reference counting, which cost a third of the time)
        hpos[f] = -1
        hn -= 1
        if hn > 0:
            hk[0] = hk[hn]
            hi[0] = hi[hn]
            hpos[hi[0]] = 0
            key = hk[0]
            item = hi[0]
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
                hpos[hi[i]] = i
                i = c
            hk[i] = key
            hi[i] = item
            hpos[item] = i
        # the bytes it carries after `now` (t_proj - now: at most tol, or `merge` x its age)
        late = rate[f] * (t_proj - now) if t_proj > tlast[f] else 0.0
        rem[f] = 0.0
        finish[f] = tf + latency[f]
        active[f] = False
        old = bott[f]
        if old >= 0:
            i = bpos[f]
            last = bpool[lstart[old] + bcnt[old] - 1]
            bpool[lstart[old] + i] = last
            bpos[last] = i
            bcnt[old] -= 1
            bott[f] = -1
        for k in range(indptr[f], indptr[f + 1]):
            r = res[k]
            lcnt[r] -= 1
            dl = -rate[f]
            load[r] -= rate[f]
            if (rate[f] if unit else rate[f] * iw[f]) >= maxr[r] * (1.0 - tol_b):
                maxr_ok[r] = False
            if lcnt[r] == 0:
                dl -= load[r]
                load[r] = 0.0
            if w_on and r < wd.shape[1]:
                wd[wrow, r, 0] += dl * wfrac + late
                wd[wrow, r, 1] += dl
            if rchg[r] != event:
                rchg[r] = event
                chg_links[n_chg] = r
                n_chg += 1
        rate[f] = 0.0
    return hn, n_chg


@njit
def _arrive(st, now, tol, event, nxt, n_chg):
    """The flows released at `now` become active and join S (in flow order) and their links'
    pools. Returns the next flow to release, the size of S, the changed resources and whether any
    flow arrived."""
    indptr = _i1(st, _S.INDPTR)
    res = _i1(st, _S.RES)
    release = _f1(st, _S.RELEASE)
    finish = _f1(st, _S.FINISH)
    latency = _f1(st, _S.LATENCY)
    rate = _f1(st, _S.RATE)
    rem = _f1(st, _S.REM)
    tlast = _f1(st, _S.TLAST)
    orig = _f1(st, _S.ORIG)
    active = _b1(st, _S.ACTIVE)
    in_s = _i1(st, _S.IN_S)
    s_list = _i1(st, _S.S_LIST)
    order = _i1(st, _S.ORDER)
    lstart = _i1(st, _S.LSTART)
    lused = _i1(st, _S.LUSED)
    lcnt = _i1(st, _S.LCNT)
    narr = _i1(st, _S.NARR)
    rchg = _i1(st, _S.RCHG)
    chg_links = _i1(st, _S.CHG_LINKS)
    poolf = _i1(st, _S.POOLF)
    n_flows = order.size
    s_n = 0
    arrivals = False
    while nxt < n_flows and release[order[nxt]] <= now + tol:
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
                chg_links[n_chg] = r
                n_chg += 1
    return nxt, s_n, n_chg, arrivals


@njit
def _seed_s(st, now, event, arrivals, s_n, n_chg, gn, hn):
    """S0: the flows on a touched resource that arrived now (in S already) or were bottlenecked
    there (a lazy member turns its class back into flows). Returns S's and the heaps' sizes."""
    rate = _f1(st, _S.RATE)
    orig = _f1(st, _S.ORIG)
    active = _b1(st, _S.ACTIVE)
    in_s = _i1(st, _S.IN_S)
    s_list = _i1(st, _S.S_LIST)
    lzc = _i1(st, _S.LZC)
    lstart = _i1(st, _S.LSTART)
    lused = _i1(st, _S.LUSED)
    lcnt = _i1(st, _S.LCNT)
    narr = _i1(st, _S.NARR)
    bcnt = _i1(st, _S.BCNT)
    chg_links = _i1(st, _S.CHG_LINKS)
    gk = _f1(st, _S.GK)
    gi = _i1(st, _S.GI)
    gpos = _i1(st, _S.GPOS)
    poolf = _i1(st, _S.POOLF)
    bpool = _i1(st, _S.BPOOL)
    for c in range(n_chg):
        r = chg_links[c]
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
                if lzc[g] >= 0:  # a lazy class's member: the class becomes flows again
                    cb = lzc[g]
                    gn = _ih_delete(gk, gi, gpos, gn, cb)
                    hn = _lz_flush(st, cb, now, hn)
                if in_s[g] != event:
                    in_s[g] = event
                    orig[g] = rate[g]
                    s_list[s_n] = g
                    s_n += 1
            lused[r] = w - lstart[r]
        else:
            for q in range(lstart[r], lstart[r] + bcnt[r]):
                g = bpool[q]
                if lzc[g] >= 0:  # a lazy class's member: the class becomes flows again
                    cb = lzc[g]
                    gn = _ih_delete(gk, gi, gpos, gn, cb)
                    hn = _lz_flush(st, cb, now, hn)
                if in_s[g] != event:
                    in_s[g] = event
                    orig[g] = rate[g]
                    s_list[s_n] = g
                    s_n += 1
    return s_n, gn, hn


@njit
def _drop_pinned(st, event, s_n, tol_b, unit):
    """An event without arrivals: a flow of S pinned by another valid bottleneck on an unchanged
    resource leaves S. Returns S's size."""
    indptr = _i1(st, _S.INDPTR)
    res = _i1(st, _S.RES)
    cap = _f1(st, _S.CAP)
    iw = _f1(st, _S.IW)
    rate = _f1(st, _S.RATE)
    active = _b1(st, _S.ACTIVE)
    bott = _i1(st, _S.BOTT)
    bpos = _i1(st, _S.BPOS)
    in_s = _i1(st, _S.IN_S)
    s_list = _i1(st, _S.S_LIST)
    lzc = _i1(st, _S.LZC)
    load = _f1(st, _S.LOAD)
    maxr = _f1(st, _S.MAXR)
    maxr_ok = _b1(st, _S.MAXR_OK)
    lstart = _i1(st, _S.LSTART)
    lused = _i1(st, _S.LUSED)
    bcnt = _i1(st, _S.BCNT)
    rchg = _i1(st, _S.RCHG)
    lzf = _f2(st, _S.LZF)
    poolf = _i1(st, _S.POOLF)
    bpool = _i1(st, _S.BPOOL)
    kept = 0
    skip = event
    hint = -1
    for i in range(s_n):
        h = s_list[i]
        b = -1
        p0 = indptr[h]
        for a in range(0, indptr[h + 1] - p0):
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
                b = r
                break
        if b >= 0:
            old = bott[h]
            if old != b:
                if old >= 0:
                    j = bpos[h]
                    last = bpool[lstart[old] + bcnt[old] - 1]
                    bpool[lstart[old] + j] = last
                    bpos[last] = j
                    bcnt[old] -= 1
                if b >= 0:
                    bpool[lstart[b] + bcnt[b]] = h
                    bpos[h] = bcnt[b]
                    bcnt[b] += 1
                bott[h] = b
            in_s[h] = -1
        else:
            s_list[kept] = h
            kept += 1
    s_n = kept
    return s_n


@njit
def _rate_classes(st, s_n, wstamp, tol_b):
    """Rate classes: flows of S bottlenecked on the same resource b are one class. When no flow of
    S crosses another class's resource and, with each class at its resource's fair share x_b,
    every other resource S crosses stays clearly unsaturated, progressive filling freezes each
    class at x_b on b: the water-fill's result without running it (most events of a skewed
    all-to-all; the same numbers, in the same order). Then sets NEW_RATE and FROZE_AT. Returns
    whether it did, and the class's resource when S is one class (else -1)."""
    indptr = _i1(st, _S.INDPTR)
    res = _i1(st, _S.RES)
    cap = _f1(st, _S.CAP)
    wt = _f1(st, _S.WT)
    rate = _f1(st, _S.RATE)
    new_rate = _f1(st, _S.NEW_RATE)
    bott = _i1(st, _S.BOTT)
    froze_at = _i1(st, _S.FROZE_AT)
    s_list = _i1(st, _S.S_LIST)
    load = _f1(st, _S.LOAD)
    thr = _f1(st, _S.THR)
    marked = _i1(st, _S.MARKED)
    cmark = _i1(st, _S.CMARK)
    cls_n = _i1(st, _S.CLS_N)
    cls_w = _f1(st, _S.CLS_W)
    cls_x = _f1(st, _S.CLS_X)
    lmark = _i1(st, _S.LMARK)
    fast_cls = -1
    n_cls = 0
    one = True
    for i in range(s_n):
        b = bott[s_list[i]]
        if b < 0:
            one = False
            break
        if cmark[b] != wstamp:
            cmark[b] = wstamp
            n_cls += 1
            cls_n[b] = 0
            cls_w[b] = 0.0
            cls_x[b] = cap[b] - load[b]
        cls_n[b] += 1
        cls_w[b] += wt[s_list[i]]
        cls_x[b] += rate[s_list[i]]
    if one:
        n_mark = 0
        for i in range(s_n):
            g = s_list[i]
            b = bott[g]
            if cls_n[b] > 0:  # first member: resid -> fair share
                x = max(cls_x[b], 0.0) / cls_w[b]
                cls_x[b] = x
                cls_n[b] = -1
                if x <= 0.0:
                    one = False
                    break
            d = cls_x[b] * wt[g] - rate[g]
            for k in range(indptr[g], indptr[g + 1]):
                r = res[k]
                if r == b:
                    continue
                if cmark[r] == wstamp:  # crosses another class's resource
                    one = False
                    break
                if lmark[r] != wstamp:
                    lmark[r] = wstamp
                    thr[r] = cap[r] - load[r]
                    marked[n_mark] = r
                    n_mark += 1
                thr[r] -= d
            if not one:
                break
        if one:
            for i in range(n_mark):
                r = marked[i]
                if thr[r] <= cap[r] * tol_b:
                    one = False
                    break
    if one:
        for i in range(s_n):
            b = bott[s_list[i]]
            new_rate[i] = cls_x[b] * wt[s_list[i]]
            froze_at[i] = b
        if n_cls == 1:
            fast_cls = bott[s_list[0]]
    return one, fast_cls


@njit
def _apply_rates(st, s_n, event, n_chg, rel_eps, tol_b, unit, w_on, wrow, wfrac):
    """S takes its new rates: loads, window integrals and largest rates follow; a resource whose
    load changed by more than rel_eps joins CHG_LINKS. Returns their number."""
    indptr = _i1(st, _S.INDPTR)
    res = _i1(st, _S.RES)
    iw = _f1(st, _S.IW)
    rate = _f1(st, _S.RATE)
    new_rate = _f1(st, _S.NEW_RATE)
    s_list = _i1(st, _S.S_LIST)
    load = _f1(st, _S.LOAD)
    maxr = _f1(st, _S.MAXR)
    maxr_ok = _b1(st, _S.MAXR_OK)
    rchg = _i1(st, _S.RCHG)
    chg_links = _i1(st, _S.CHG_LINKS)
    wd = _f3(st, _S.WD)
    for i in range(s_n):
        g = s_list[i]
        d = new_rate[i] - rate[g]
        if d != 0.0:
            big = abs(d) > rel_eps * max(rate[g], new_rate[i])
            for k in range(indptr[g], indptr[g + 1]):
                r = res[k]
                load[r] += d
                if w_on and r < wd.shape[1]:
                    wd[wrow, r, 0] += d * wfrac
                    wd[wrow, r, 1] += d
                if d > 0.0:
                    nr = new_rate[i] if unit else new_rate[i] * iw[g]
                    if nr > maxr[r]:
                        maxr[r] = nr
                elif (rate[g] if unit else rate[g] * iw[g]) >= maxr[r] * (1.0 - tol_b):
                    # r x (1/w) can round below the share it was set from: a rate that
                    # falls (or a flow that leaves) near the largest marks it for recomputing
                    maxr_ok[r] = False
                if big and rchg[r] != event:
                    rchg[r] = event
                    chg_links[n_chg] = r
                    n_chg += 1
            rate[g] = new_rate[i]
    return n_chg


@njit
def _verify(st, s_n, n_chg, now, wstamp, gn, hn, tol_b, unit):
    """Every flow in S or bottlenecked on a changed resource needs a bottleneck (a saturated
    resource on which its rate per unit weight is the largest): each one's is found (first trying
    the resource that froze it) and kept in BOTT/BPOOL; those without go to BAD. Returns their
    number and the heaps' sizes."""
    indptr = _i1(st, _S.INDPTR)
    res = _i1(st, _S.RES)
    cap = _f1(st, _S.CAP)
    iw = _f1(st, _S.IW)
    rate = _f1(st, _S.RATE)
    active = _b1(st, _S.ACTIVE)
    bott = _i1(st, _S.BOTT)
    bpos = _i1(st, _S.BPOS)
    checked = _i1(st, _S.CHECKED)
    froze_at = _i1(st, _S.FROZE_AT)
    s_list = _i1(st, _S.S_LIST)
    cand = _i1(st, _S.CAND)
    bad = _i1(st, _S.BAD)
    lzc = _i1(st, _S.LZC)
    load = _f1(st, _S.LOAD)
    maxr = _f1(st, _S.MAXR)
    maxr_ok = _b1(st, _S.MAXR_OK)
    lstart = _i1(st, _S.LSTART)
    lused = _i1(st, _S.LUSED)
    bcnt = _i1(st, _S.BCNT)
    rchg = _i1(st, _S.RCHG)
    chg_links = _i1(st, _S.CHG_LINKS)
    gk = _f1(st, _S.GK)
    gi = _i1(st, _S.GI)
    gpos = _i1(st, _S.GPOS)
    lzf = _f2(st, _S.LZF)
    poolf = _i1(st, _S.POOLF)
    bpool = _i1(st, _S.BPOOL)
    n_bad = 0
    skip = -2
    for phase in range(2):
        # phase 0: the flows of S (first trying the resource that froze them); phase 1:
        # the flows bottlenecked on a changed resource
        n_chk = s_n
        if phase == 1:
            n_chk = 0
            for c in range(n_chg):
                r = chg_links[c]
                for q in range(lstart[r], lstart[r] + bcnt[r]):
                    h = bpool[q]
                    if lzc[h] >= 0:  # a lazy class's member: the class becomes flows again
                        cb = lzc[h]
                        gn = _ih_delete(gk, gi, gpos, gn, cb)
                        hn = _lz_flush(st, cb, now, hn)
                    if checked[h] != wstamp:
                        checked[h] = wstamp
                        cand[n_chk] = h
                        n_chk += 1
        for i in range(n_chk):
            if phase == 0:
                h = s_list[i]
                checked[h] = wstamp
                hint = froze_at[i]
            else:
                h = cand[i]
                hint = bott[h]
            b = -1
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
                    b = r
                    break
            old = bott[h]
            if old != b:
                if old >= 0:
                    j = bpos[h]
                    last = bpool[lstart[old] + bcnt[old] - 1]
                    bpool[lstart[old] + j] = last
                    bpos[last] = j
                    bcnt[old] -= 1
                if b >= 0:
                    bpool[lstart[b] + bcnt[b]] = h
                    bpos[h] = bcnt[b]
                    bcnt[b] += 1
                bott[h] = b
            if b < 0:
                bad[n_bad] = h
                n_bad += 1
    return n_bad, gn, hn


@njit
def _grow_s(st, s_n, n_bad, event, wstamp, now, gn, hn, rel_eps, unit):
    """A flow without a bottleneck joins S with the flows at least as fast on its saturated
    resources. Returns S's size, whether it grew, and the heaps' sizes."""
    indptr = _i1(st, _S.INDPTR)
    res = _i1(st, _S.RES)
    cap = _f1(st, _S.CAP)
    iw = _f1(st, _S.IW)
    rate = _f1(st, _S.RATE)
    orig = _f1(st, _S.ORIG)
    active = _b1(st, _S.ACTIVE)
    in_s = _i1(st, _S.IN_S)
    s_list = _i1(st, _S.S_LIST)
    bad = _i1(st, _S.BAD)
    lzc = _i1(st, _S.LZC)
    load = _f1(st, _S.LOAD)
    lstart = _i1(st, _S.LSTART)
    lused = _i1(st, _S.LUSED)
    thr = _f1(st, _S.THR)
    marked = _i1(st, _S.MARKED)
    lmark = _i1(st, _S.LMARK)
    gk = _f1(st, _S.GK)
    gi = _i1(st, _S.GI)
    gpos = _i1(st, _S.GPOS)
    lzf = _f2(st, _S.LZF)
    poolf = _i1(st, _S.POOLF)
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
            if load[rr] < cap[rr] * (1.0 - 1e3 * rel_eps):
                continue
            if lmark[rr] != wstamp:
                lmark[rr] = wstamp
                thr[rr] = rate[h] if unit else rate[h] * iw[h]
                marked[n_mark] = rr
                n_mark += 1
            elif (rate[h] if unit else rate[h] * iw[h]) < thr[rr]:
                thr[rr] = rate[h] if unit else rate[h] * iw[h]
    for i in range(n_mark):
        rr = marked[i]
        limit = thr[rr] * (1.0 - 1e3 * rel_eps)
        w = lstart[rr]
        for qq in range(lstart[rr], lstart[rr] + lused[rr]):
            g = poolf[qq]
            if not active[g]:
                continue
            poolf[w] = g
            w += 1
            nr = (rate[g] if unit else rate[g] * iw[g]) if lzc[g] < 0 else lzf[lzc[g], 0]
            if in_s[g] != event and nr >= limit:
                if lzc[g] >= 0:  # a lazy class's member: the class becomes flows again
                    cb = lzc[g]
                    gn = _ih_delete(gk, gi, gpos, gn, cb)
                    hn = _lz_flush(st, cb, now, hn)
                in_s[g] = event
                orig[g] = rate[g]
                s_list[s_n] = g
                s_n += 1
                grew = True
        lused[rr] = w - lstart[rr]
    return s_n, grew, gn, hn


@njit
def _whole_class(st, s_n, b):
    """After a one-class event on resource b: b when S is b's class, each member at the class's
    fair share (it can become lazy), else -1."""
    wt = _f1(st, _S.WT)
    rate = _f1(st, _S.RATE)
    bott = _i1(st, _S.BOTT)
    s_list = _i1(st, _S.S_LIST)
    cls_x = _f1(st, _S.CLS_X)
    lz_b = b
    for i in range(s_n):
        g = s_list[i]
        if bott[g] != lz_b or rate[g] != cls_x[lz_b] * wt[g]:
            lz_b = -1
            break
    return lz_b


@njit
def _class_slots(st, s_n):
    """Slots of AGR a class of S's flows may take: |S| x its longest path."""
    indptr = _i1(st, _S.INDPTR)
    s_list = _i1(st, _S.S_LIST)
    n_inc = indptr[s_list[0] + 1] - indptr[s_list[0]]
    for i in range(s_n):
        n_inc = max(n_inc, indptr[s_list[i] + 1] - indptr[s_list[i]])
    return s_n * n_inc


@njit
def _form_lazy(st, lz_b, s_n, now, ag_used):
    """S, every flow bottlenecked on lz_b, becomes a lazy class: its rate, V = 0 now, its members'
    weight, and its links other than lz_b with the members crossing each (from AGR[ag_used]).
    Returns the slots of AGR used."""
    indptr = _i1(st, _S.INDPTR)
    res = _i1(st, _S.RES)
    wt = _f1(st, _S.WT)
    s_list = _i1(st, _S.S_LIST)
    cls_x = _f1(st, _S.CLS_X)
    amap = _i1(st, _S.AMAP)
    lzf = _f2(st, _S.LZF)
    lzi = _i2(st, _S.LZI)
    aggpos = _i1(st, _S.AGGPOS)
    agr = _i1(st, _S.AGR)
    agc = _i1(st, _S.AGC)
    agw = _f1(st, _S.AGW)
    lzf[lz_b, 0] = cls_x[lz_b]
    lzf[lz_b, 1] = 0.0
    lzf[lz_b, 2] = now
    lzi[lz_b, 0] = s_n
    w_cls = 0.0
    for i in range(s_n):
        w_cls += wt[s_list[i]]
    lzf[lz_b, 3] = w_cls
    a0 = ag_used
    for i in range(s_n):
        g = s_list[i]
        for k in range(indptr[g], indptr[g + 1]):
            r = res[k]
            if r == lz_b:
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
    lzi[lz_b, 1] = a0
    lzi[lz_b, 2] = ag_used - a0
    return ag_used


@njit
def _rekey(st, s_n, lz_b, now, hn, gn, unit):
    """The flows of S whose rate changed bring their remaining bytes up to `now` and take a new
    completion key; the members of a new lazy class go to its member heap, keyed by V, and the
    class onto the class heap. Returns the heaps' sizes."""
    iw = _f1(st, _S.IW)
    rate = _f1(st, _S.RATE)
    rem = _f1(st, _S.REM)
    tlast = _f1(st, _S.TLAST)
    orig = _f1(st, _S.ORIG)
    s_list = _i1(st, _S.S_LIST)
    lzc = _i1(st, _S.LZC)
    hk = _f1(st, _S.HK)
    hi = _i1(st, _S.HI)
    hpos = _i1(st, _S.HPOS)
    lstart = _i1(st, _S.LSTART)
    gk = _f1(st, _S.GK)
    gi = _i1(st, _S.GI)
    gpos = _i1(st, _S.GPOS)
    lzf = _f2(st, _S.LZF)
    ck = _f1(st, _S.CK)
    ci = _i1(st, _S.CI)
    for i in range(s_n):
        g = s_list[i]
        if rate[g] == orig[g] and lz_b < 0:
            continue
        if orig[g] > 0.0:
            rem[g] -= orig[g] * (now - tlast[g])
            if rem[g] < 0.0:
                rem[g] = 0.0
        tlast[g] = now
        if lz_b >= 0:  # into the class's heap, keyed by the class's V (0 now) at which it drains
            if hpos[g] >= 0:
                hn = _ih_delete(hk, hi, hpos, hn, g)
            lzc[g] = lz_b
            rem[g] = rem[g] if unit else rem[g] * iw[g]
            _mh_push(ck, ci, lstart[lz_b], i, rem[g], g)
            continue
        r_g = rate[g] if rate[g] > 0.0 else 1e-300
        key = now + rem[g] / r_g
        i = hpos[g]
        if i < 0:
            i = hn
            hn += 1
        _ih_set(hk, hi, hpos, hn, i, key, g)
    if lz_b >= 0:
        gn += 1
        _ih_set(gk, gi, gpos, gn, gn - 1, now + ck[lstart[lz_b]] / lzf[lz_b, 0], lz_b)
    return hn, gn


@njit
def _window_bytes(wd, n_res, n_win, window_ns):
    """Bytes per resource and window from the window integrals of the loads: WD[w + 1, r] holds,
    for the load changes in window w, dl x (end of w - now) and dl (row 0: before the first)."""
    out = np.empty((n_res, n_win), np.float64)
    for r in range(n_res):
        level = wd[0, r, 1]
        for w in range(n_win):
            out[r, w] = wd[w + 1, r, 0] + level * window_ns
            level += wd[w + 1, r, 1]
    return out


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
