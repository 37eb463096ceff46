"""NCCL's algorithm/protocol choice, channel count and pipeline constants, re-expressed for replay.

NCCL (2.30.7: src/graph/tuning.cc `ncclTopoTuneModel`/`ncclTopoGetAlgoTime`, src/enqueue.cc
`topoGetAlgoInfo`/`calcCollChunking`, src/graph/connect.cc, src/init.cc) predicts, per collective
call, `time = latency(algo, proto) + bytes / bandwidth(algo, proto)` for every enabled pair and
runs the cheapest. Its latencies (microseconds) and efficiency factors are kept here as NCCL
states them; its bandwidths come from its own graph search, which replay replaces by the
topology's physics (the bottleneck of each algorithm's traffic pattern, `algorithm_bandwidth`).
docs/replay.md ("Algorithm and protocol") gives the rule in words.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from tracekit.replay import hardware
from tracekit.replay.topology import Topology, TopologySpec

NCCL_SOURCE = "NCCL 2.30.7 (src/graph/tuning.cc, src/enqueue.cc, src/graph/connect.cc, src/init.cc)"

ALGOS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOS = ("LL", "LL128", "Simple")
_ALIASES = {"collnet": "collnet_direct", "sharp": "collnet_direct", "nvlstree": "nvls_tree",
            "collnetdirect": "collnet_direct", "collnetchain": "collnet_chain", "nvls_sharp": "nvls"}

# Latencies in microseconds, (LL, LL128, Simple), Hopper (tuning.cc ncclTunerConstantsDefaults).
BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "collnet_direct": (0, 0, 0),
                   "collnet_chain": (0, 0, 0), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0),
                   "pat": (8.0, 8.0, 8.0)}
HW_LATENCY_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "collnet_direct": (0, 0, 3.7),
               "collnet_chain": (0, 0, 2.8), "nvls": (0, 0, 25), "nvls_tree": (0, 0, 25),
               "pat": (0, 0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "collnet_direct": (0, 0, 3.7),
            "collnet_chain": (0, 0, 2.8), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0), "pat": (0, 0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0), "collnet_direct": (0, 0, 31),
            "collnet_chain": (0, 0, 30), "nvls": (0, 0, 18), "nvls_tree": (0, 0, 20.9),
            "pat": (0, 0, 14)},
}
# Per-channel bus-bandwidth ceilings in GB/s by GPU generation and node count (1, 2, more), tuning.cc.
LL_MAX_BW_ONE_NODE = {"volta": 39.0, "ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}
LL_MAX_BW_MULTI = {2: 39.0, 3: 20.4}  # several nodes: Intel CPU row
PER_CH_MAX_RING_LL128 = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
PER_CH_MAX_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
                   "blackwell": (70.0, 42.8, 24.0)}
PER_CH_MAX_TREE_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
                         "hopper": (36.7, 36.7, 29.0), "blackwell": (55.6, 31.67, 20.0)}
PER_CH_MAX_NVLS_TREE = {"volta": (0.0, 18.5, 10.0), "ampere": (0.0, 23.6, 17.8), "hopper": (0.0, 57.7, 45.5),
                        "blackwell": (0.0, 96.0, 80.0)}
NET_OVERHEAD_US = 1.0  # x86 Intel; x3 for Simple
NVLS_EFFICIENCY = 0.85  # NCCL's Hopper figure, kept where NVLS meets the NICs (NVLS-tree, NVLS+SHARP)
RING_PLATEAU = {"volta": 1.9, "ampere": 1.4, "hopper": 1.4, "blackwell": 1.4}
# Tree all-reduce correction by log2(bytes / 64), per protocol (LL, LL128, Simple).
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)

# Buffers and pipelining (device.h, init.cc, collectives.h, nvls.cc).
NCCL_STEPS = 8
MAX_CHANNELS = 32  # what the connect step reaches by duplicating searched channels (MAXCHANNELS 64)
BUFFSIZE = {"LL": 8 * 512 * NCCL_STEPS * 16, "LL128": 120 * 640 * NCCL_STEPS * 8, "Simple": 1 << 22}
RING_CHUNK_STEPS = NCCL_STEPS // 2  # ALLREDUCE_CHUNKSTEPS
NVLS_CHUNK = 128 * 1024


def normalize_algo(name: str | None) -> str | None:
    """NCCL's spellings (RING, NVLS_TREE, CollNetDirect, ...) as one of ALGOS, or None."""
    if not name:
        return None
    key = str(name).strip().lower().replace("-", "_").replace(" ", "_")
    key = _ALIASES.get(key.replace("_", ""), _ALIASES.get(key, key))
    return key if key in ALGOS else None


def normalize_algos(value: str | None) -> frozenset[str] | None:
    """The algorithms a traced `algo` value allows: one NCCL name, or several joined by `|`
    when the source narrows the choice without naming it (kernel names since NCCL 2.19 say only
    TREE or not; see docs/data-model.md). None when nothing usable is given."""
    if not value:
        return None
    found = frozenset(a for a in (normalize_algo(part) for part in str(value).split("|")) if a)
    return found or None


def offered(op: str, algo: str, shape: Shape) -> bool:
    """Whether NCCL can run `algo` for `op` on the shape with any protocol."""
    return any(enabled(op, algo, p, shape) for p in PROTOS)


def normalize_proto(name: str | None) -> str | None:
    """LL, LL128 or Simple (any case), or None."""
    if not name:
        return None
    key = str(name).strip().lower()
    return {"ll": "LL", "ll128": "LL128", "simple": "Simple"}.get(key)


@dataclass(frozen=True)
class Plan:
    """How NCCL runs one call: algorithm, protocol, channels, and its pipeline.

    `efficiency` is NCCL's bandwidth factor for the pair (wire format and kernel limits: LL sends 8
    bytes per 4, tree all-reduce 0.92, ...); flows carry `bytes / efficiency`. A pipelined
    algorithm moves `chunk_bytes` per channel through `depth` hops, so the first chunk needs
    `depth - 1` extra chunk times before the pipe is full. `latency_us` is NCCL's own latency.
    `source` says whether the trace gave the choice ("trace"), a caller forced it ("forced") or
    NCCL's tuning rule chose it ("tuning").
    """

    algo: str
    proto: str
    channels: int
    depth: float
    chunk_bytes: float
    efficiency: float
    latency_us: float
    source: str = "tuning"

    def fill_factor(self, bytes_per_channel: float) -> float:
        """Transfer time with pipeline fill / transfer time of a full pipe."""
        if self.depth <= 1 or bytes_per_channel <= 0:
            return 1.0
        return 1.0 + (self.depth - 1) * min(self.chunk_bytes, bytes_per_channel) / bytes_per_channel


@dataclass(frozen=True)
class Shape:
    """What the tuning model needs of a call's participants on a topology."""

    n_ranks: int
    n_nodes: int       # NVLink domains spanned (NCCL's nodes)
    ppn: int           # ranks per node (the largest)
    intra_gbs: float   # per-GPU intra-node GB/s, one direction
    net_gbs: float     # per-node NIC GB/s, one direction (after PCIe caps)
    nvlink: bool       # intra-node traffic rides NVLink
    nvls: bool
    sharp: bool
    generation: str = "hopper"   # NCCL's tuning family (hardware.GpuProfile.generation)
    nvls_efficiency: float = 0.74
    net_latency_us: float = 0.0  # the network plugin's own latency per NET hop (NCCL's latencyInter)
    nvlink_link_gbs: float = 20.6  # NCCL's figure for one NVLink of the generation (hardware.GpuProfile)


def shape_of(topology: Topology | TopologySpec, gpus: list[int] | None = None, *,
             n_ranks: int | None = None) -> Shape:
    """The call shape of `gpus` (GPU indices on the topology; default: all of it)."""
    spec = topology.spec if isinstance(topology, Topology) else topology
    if gpus is None:
        gpus = list(range((spec.hosts or 1) * spec.gpus))
    domain = spec.domain
    per_node: dict[int, int] = {}
    for g in gpus:
        per_node[g // domain] = per_node.get(g // domain, 0) + 1
    ppn = max(per_node.values()) if per_node else 1
    rates = hardware.achievable(spec)
    nic_gbs = min(rates.nic_gbs, spec.pcie_gbps / 8.0) * spec.nics_per_gpu
    # NICs per node: the participating GPUs' own NICs (PXN spreads channels over them)
    net = nic_gbs * ppn
    nvlink = domain > 1
    intra = rates.nvlink_gbs if nvlink else spec.pcie_gbps / 8.0
    return Shape(n_ranks=n_ranks or len(gpus), n_nodes=len(per_node), ppn=ppn, intra_gbs=intra,
                 net_gbs=net, nvlink=nvlink, nvls=spec.nvls and nvlink, sharp=spec.sharp,
                 generation=rates.gpu.generation, nvls_efficiency=rates.nvls_efficiency,
                 net_latency_us=spec.net_latency_us, nvlink_link_gbs=rates.gpu.nvlink_link_gbs)


# NCCL's search speeds across hosts (GB/s per channel, search.cc), by tuning family
SEARCH_SPEEDS_INTER = {
    "pre-hopper": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4,
                   1.2, 0.24, 0.12),
    "hopper": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
    "blackwell": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0,
                  2.4, 1.2, 0.24, 0.12),
}


def search_speed(port_gbs: float, generation: str) -> float:
    """The per-channel speed NCCL's ring search settles on across hosts: the fastest of its speed
    steps one NIC port (line rate, PCIe-capped) can carry."""
    family = generation if generation in SEARCH_SPEEDS_INTER else "pre-hopper"
    speeds = SEARCH_SPEEDS_INTER[family]
    return next((v for v in speeds if v <= port_gbs), speeds[-1])


def default_channels(topology: Topology | TopologySpec, shape: Shape | None = None) -> int:
    """NCCL's channel count without logs, at most 32.

    Across hosts (search.cc, connect.cc): the search finds one channel per NIC port at the speed
    step the port carries; it duplicates them when that speed is at least 25 GB/s, unless it is
    under 50 GB/s with more than 4 channels on Hopper and later (`ncclTopoDupChannels`); the connect step
    doubles them; on Hopper and later it doubles them once more while the ring's speed per
    channel exceeds 45 GB/s and fewer than 16 ("4 compute channels per search channel"). So a
    400G port gives 4 channels at up to 4 ports per host, and 2 per port at 8 (16 in all); a
    200G or slower port gives 2. On one host: 2 per port, as the search finds one per GPU.
    """
    spec = topology.spec if isinstance(topology, Topology) else topology
    ppn = shape.ppn if shape is not None else spec.gpus
    n_nodes = shape.n_nodes if shape is not None else max(1, spec.hosts or 1)
    ports = max(1, ppn * spec.nics_per_gpu * spec.planes)
    if n_nodes <= 1:
        return int(min(MAX_CHANNELS, 2 * ports))
    generation = shape.generation if shape is not None else hardware.achievable(spec).gpu.generation
    speed = search_speed(min(spec.nic_gbps, spec.pcie_gbps) / 8.0, generation)
    channels = ports
    newer = generation in ("hopper", "blackwell")
    if speed >= 25.0 and not (newer and speed < 50.0 and channels > 4):
        channels, speed = min(2 * channels, MAX_CHANNELS), speed / 2
    channels = min(MAX_CHANNELS, 2 * channels)
    if newer and speed > 45.0 and channels < 16:
        channels = min(MAX_CHANNELS, 2 * channels)
    return int(channels)


def _node_index(n_nodes: int) -> int:
    return min(n_nodes, 3)


def _log2i(x: int) -> int:
    return max(0, int(x).bit_length() - 1)


def enabled(op: str, algo: str, proto: str, shape: Shape) -> bool:
    """NCCL's enable rules for one (op, algo, proto) on a call shape (tuning.cc and enqueue.cc)."""
    multi = shape.n_nodes > 1
    if op in ("broadcast", "reduce") and algo != "ring":
        return False
    if op in ("all_gather", "reduce_scatter") and algo not in ("ring", "nvls", "pat"):
        return False
    if op == "all_reduce" and algo == "pat":
        return False
    if op not in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"):
        return algo == "ring"
    if algo in ("nvls", "nvls_tree") and proto != "Simple":
        return False
    if algo in ("collnet_direct", "collnet_chain") and proto != "Simple":
        return False
    if algo == "nvls" and (not shape.nvls or (multi and not shape.sharp) or (op != "all_reduce" and multi)):
        return False
    if algo == "nvls_tree" and (not shape.nvls or not multi):
        return False
    if algo in ("collnet_direct", "collnet_chain") and (not shape.sharp or not multi or shape.ppn > 8):
        return False
    if algo == "pat" and (proto != "Simple" or shape.ppn != 1):
        return False
    return not (algo == "tree" and shape.n_ranks < 2)


def algorithm_bandwidth(op: str, algo: str, shape: Shape) -> float:
    """Physical algorithm bandwidth (GB/s of payload S per second) of the traffic pattern.

    ring: every channel's ring crosses each node boundary through its own NIC, so a rank's
    `steps/n · S` goes over the slower of its NVLink port and its node's NICs; tree: a node's
    NICs carry S each way with 2 nodes, 2S (interior in one tree, leaf in the other) beyond, and
    the intra-node chain sends S up and S down from each GPU; NVLS: S up and S down per GPU;
    NVLS-tree: NVLS inside, tree over the NICs; CollNet/SHARP: each node sends S to the switches
    and receives S back.
    """
    n, ppn = shape.n_ranks, shape.ppn
    multi = shape.n_nodes > 1
    edge = min(shape.intra_gbs, shape.net_gbs) if multi else shape.intra_gbs
    if algo == "ring" or algo == "pat":
        factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
                  "reduce_scatter": (n - 1) / n}.get(op, 1.0)
        return edge / max(factor, 1e-12)
    tree_net = shape.net_gbs / (1.0 if shape.n_nodes <= 2 else 2.0)
    if algo == "tree":
        # the chain is rotated per channel: a GPU sends 2 (ppn-1) / ppn of S on average
        intra = shape.intra_gbs * ppn / (2.0 * (ppn - 1)) if ppn > 1 else math.inf
        return min(intra, tree_net) if multi else intra
    if algo == "nvls":
        if op == "all_reduce":
            return min(shape.intra_gbs, shape.net_gbs) if multi else shape.intra_gbs
        return shape.intra_gbs * ppn / max(ppn - 1, 1)
    if algo == "nvls_tree":
        return min(shape.intra_gbs, tree_net)
    if algo in ("collnet_direct", "collnet_chain"):
        intra = shape.intra_gbs * ppn / (2 * max(ppn - 1, 1)) if ppn > 1 else math.inf
        return min(intra, shape.net_gbs)
    return edge


def efficiency(op: str, algo: str, proto: str, shape: Shape) -> float:
    """NCCL's bandwidth factor for the pair (tuning.cc 'model refinements')."""
    eff = 1.0
    if algo == "ring" and proto == "LL":
        eff = 0.5
    elif algo == "ring" and proto == "LL128":
        eff = 0.92
    elif algo == "tree":
        if op == "all_reduce":
            eff = 0.92
        if proto == "LL":
            eff /= 3.8
        elif proto == "LL128":
            eff *= 7.0 / 9.0 if shape.n_nodes == 1 else 120.0 / 128.0
    elif algo == "nvls" and shape.n_nodes == 1:
        eff = shape.nvls_efficiency  # measured multimem all-reduce (hardware.py), not NCCL's model
    elif algo in ("nvls", "nvls_tree"):
        eff = NVLS_EFFICIENCY
    elif algo == "collnet_direct":
        eff = 0.85
    elif algo == "pat":
        eff = 0.75
    return eff


def _caps_gbs(op: str, algo: str, proto: str, shape: Shape, channels: int) -> float:
    """NCCL's per-channel ceilings, as algorithm bandwidth."""
    ni = _node_index(shape.n_nodes) - 1
    gen = shape.generation
    n = shape.n_ranks
    nsteps = 2 * (n - 1) if op == "all_reduce" else (n - 1 if op in ("all_gather", "reduce_scatter") else n)
    ratio = 0.5 if algo in ("tree", "collnet_direct", "collnet_chain") else n / max(nsteps, 1)
    cap = math.inf
    ll_max = LL_MAX_BW_ONE_NODE[gen] if shape.n_nodes == 1 else LL_MAX_BW_MULTI[ni + 1]
    if algo == "ring" and proto == "LL":
        cap = ll_max
    elif algo == "ring" and proto == "LL128":
        cap = channels * PER_CH_MAX_RING_LL128[gen]
    elif algo == "tree" and op == "all_reduce":
        cap = channels * (PER_CH_MAX_TREE[gen][ni] if proto == "Simple" else
                          PER_CH_MAX_TREE_LL128[gen][ni] if proto == "LL128" else ll_max)
    elif algo == "nvls_tree" and PER_CH_MAX_NVLS_TREE[gen][ni] > 0:
        cap = channels * PER_CH_MAX_NVLS_TREE[gen][ni]
    return cap * ratio


def latency_us(op: str, algo: str, proto: str, shape: Shape) -> float:
    """NCCL's latency for the pair (tuning.cc), without the graph's extra network latency."""
    p = PROTOS.index(proto)
    n, nodes, ppn = shape.n_ranks, shape.n_nodes, shape.ppn
    intra_hw = "nvlink" if shape.nvlink else "pci"
    hw = intra_hw if nodes == 1 else "net"
    nsteps = 2 * (n - 1) if op == "all_reduce" else (n - 1 if op in ("all_gather", "reduce_scatter") else n)
    lat = BASE_LATENCY_US[algo][p]
    intra = HW_LATENCY_US[intra_hw][algo][p]
    inter = HW_LATENCY_US["net"]["tree" if ppn == 1 else algo][p]
    inter += shape.net_latency_us * (2 if proto == "Simple" else 1)  # tuning.cc: twice for Simple
    if algo == "ring":
        if op in ("broadcast", "reduce"):
            return lat + HW_LATENCY_US[hw]["ring"][p]
        overhead = 0.0
        if nodes > 1:
            overhead = NET_OVERHEAD_US * (3 if proto == "Simple" else 1)
        intra = max(intra, overhead)
        inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if op == "all_reduce" else nodes - 1)
        return lat + (nsteps - inter_steps) * intra + inter_steps * inter
    if algo == "tree":
        return lat + 2 * ((ppn - 1) * intra + _log2i(nodes) * inter)
    if algo == "collnet_direct":
        return lat + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * 0.4) + inter
    if algo == "collnet_chain":
        return lat + 2 * (ppn - 1) * intra + inter
    if algo == "nvls":
        return intra + (inter if nodes > 1 else 0.0)
    if algo == "nvls_tree":
        return lat + intra + 2 * _log2i(nodes) * inter
    if algo == "pat":
        return lat + _log2i(nodes) * inter / 3.5 + n * 2.8
    return lat


def predicted_us(op: str, algo: str, proto: str, nbytes: float, shape: Shape, channels: int) -> float:
    """NCCL's own time estimate for the pair (`ncclTopoGetAlgoTime`), or inf when disabled."""
    if not enabled(op, algo, proto, shape):
        return math.inf
    bw = min(algorithm_bandwidth(op, algo, shape) * efficiency(op, algo, proto, shape),
             _caps_gbs(op, algo, proto, shape, channels))
    if not bw > 0:
        return math.inf
    lat = latency_us(op, algo, proto, shape)
    log_size = _log2i(int(nbytes) >> 6) if nbytes >= 64 else -1
    if algo == "tree" and op == "all_reduce" and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[PROTOS.index(proto)][log_size]
    if (algo == "ring" and proto == "Simple" and shape.n_nodes > 1 and op == "all_reduce"
            and nbytes / (channels * shape.n_ranks) >= 64):
        lat *= RING_PLATEAU[shape.generation]
    return lat + nbytes / (1000.0 * bw)


def pipeline(op: str, algo: str, proto: str, nbytes: float, shape: Shape, channels: int) -> tuple[float, float]:
    """(depth in hops, chunk bytes per channel) of the pair's pipeline (enqueue.cc chunking).

    Rings keep every link busy from the first step (depth 1); a chain from a root has n-1 hops;
    a tree all-reduce goes up the intra-node chain and the inter-node tree and back down.
    """
    step = BUFFSIZE[proto] / NCCL_STEPS
    chunk = step / 2 if proto == "LL" else (step * 15 / 16 if proto == "LL128" else step)
    n, ppn, nodes = shape.n_ranks, shape.ppn, shape.n_nodes
    levels = max(1, math.ceil(math.log2(nodes))) if nodes > 1 else 0
    if algo == "ring":
        return (n - 1, chunk) if op in ("broadcast", "reduce") else (1, chunk * RING_CHUNK_STEPS)
    if algo == "tree":
        if proto == "LL128":
            chunk = _tree_ll128_chunk(chunk, nbytes, channels, nodes, n / max(nodes, 1))
        # a chunk crosses each hop at the hop's per-channel share of its link, not at the call's
        # bottleneck rate: hops count by (call rate / link rate)
        rate = algorithm_bandwidth(op, algo, shape) * efficiency(op, algo, proto, shape)
        intra = 2 * (ppn - 1) * min(1.0, rate / shape.intra_gbs)
        inter = 2 * levels * min(1.0, rate / shape.net_gbs) if shape.net_gbs > 0 else 2 * levels
        return 1.0 + intra + inter, chunk
    if algo in ("nvls", "nvls_tree"):
        per_call = nbytes / max(channels, 1)
        nvls_chunk = float(NVLS_CHUNK)
        for factor, floor in ((32, 262144), (16, 131072), (4, 65536), (1, 32768)):
            if per_call < factor * nvls_chunk and nvls_chunk > floor:
                nvls_chunk = float(floor)
        return (2 + 2 * levels if algo == "nvls_tree" else 2), min(nvls_chunk, chunk)
    if algo == "collnet_chain":
        return 2 * (ppn - 1) + 2, min(chunk, 256 * 1024)
    if algo == "collnet_direct":
        return 4, chunk
    return 1, chunk


def _tree_ll128_chunk(chunk: float, nbytes: float, channels: int, nodes: int, ppn: float) -> float:
    """NCCL's tree/LL128 chunk (enqueue.cc `calcCollChunking`): halved while the call has too few
    chunks per channel for the tree's depth, down to 128 KiB, then to 32 KiB."""
    steps = 1 + _log2i(nodes) + 0.1 * ppn
    per = nbytes / max(channels, 1)
    while per // chunk < steps * 64 / ppn and chunk > 131072:
        chunk /= 2
    while per // chunk < steps * 16 / ppn and chunk > 32768:
        chunk /= 2
    return chunk


def select(op: str, nbytes: float, shape: Shape, channels: int, *, algo: str | Collection[str] | None = None,
           proto: str | None = None, source: str = "tuning", also: Collection[str] = ()) -> Plan:
    """NCCL's choice for one call: the enabled (algo, proto) of least predicted time, restricted
    to `algo` (a name, `a|b`, or a set: from the trace or forced) and to `proto` for those
    algorithms. `also` adds algorithms the rule may weigh against them, with any protocol (a
    what-if topology's in-network reduction that the traced network lacked). A restriction the
    shape cannot run falls back to the rule's choice."""
    want = (normalize_algos(algo) if isinstance(algo, str) or algo is None
            else frozenset(a for a in (normalize_algo(x) for x in algo) if a) or None)
    want_proto = normalize_proto(proto)
    extra = frozenset(a for a in (normalize_algo(x) for x in also) if a) - (want or frozenset())
    best: tuple[float, str, str] | None = None
    for a in ALGOS:
        if want and a not in want and a not in extra:
            continue
        for p in PROTOS:
            if want_proto and p != want_proto and (not want or a in want):
                continue
            t = predicted_us(op, a, p, nbytes, shape, channels)
            if math.isfinite(t) and (best is None or t < best[0]):
                best = (t, a, p)
    if best is None and (want or want_proto):
        return select(op, nbytes, shape, channels, source="tuning")
    if best is None:
        best = (math.inf, "ring", "Simple")
    _, a, p = best
    depth, chunk = pipeline(op, a, p, nbytes, shape, channels)
    constrained = (want is not None and a in want) or (want is None and want_proto is not None)
    return Plan(algo=a, proto=p, channels=channels, depth=depth, chunk_bytes=chunk,
                efficiency=efficiency(op, a, p, shape), latency_us=latency_us(op, a, p, shape),
                source=source if constrained else "tuning")


# Point-to-point (send/recv, all-to-all): NCCL 2.30.7 src/graph/paths.cc (`ncclTopoGetNchannels`,
# `ncclTopoComputeP2pChannels`), src/enqueue.cc (`addP2pToPlan`, the p2p scheduler), src/init.cc
# (chunk sizes), src/include/device.h (batch size), src/graph/topo.h (per-link NVLink bandwidth).
P2P_PER_CHANNEL_NET_GBS = 14.0  # P2P_PER_CHANNEL_NET_BW: what NCCL counts on one network channel moving
NVLINK_PER_LINK_GBS = 20.6  # Hopper (SM90), the default: shapes carry their profile's figure
P2P_PER_BATCH = 8  # NCCL_MAX_DEV_WORK_P2P_PER_BATCH: p2p operations a channel runs at once
P2P_LL_THRESHOLD = 16384  # P2P_LL_THRESHOLD: LL up to this many bytes per channel
P2P_NET_CHUNK = 1 << 17  # P2P_NET_CHUNKSIZE (and P2P_PCI_CHUNKSIZE)
P2P_NVL_CHUNK = 1 << 19  # P2P_NVL_CHUNKSIZE, when every peer is on NVLink
P2P_MAX_CHANNELS = 64  # MAXCHANNELS: NCCL_MAX_P2P_NCHANNELS' default


@dataclass(frozen=True)
class P2pChannels:
    """NCCL's p2p channel layout of a communicator on a topology.

    `channels`: the comm's p2p channels (p2pnChannels); `per_peer`: channels one peer may use
    (p2pnChannelsPerPeer); `min_per_op`: channels a p2p operation starts from before large
    operations double it (the scheduler's nChannelsMin); `link`: the slowest class any peer is
    reached over ("net", "nvlink" or "pci"), which sets the chunk and the per-hop latency.
    """

    channels: int
    per_peer: int
    min_per_op: int
    link: str

    @property
    def chunk_bytes(self) -> int:
        """P2P chunk: 512 KiB when every peer is on NVLink, else 128 KiB (init.cc)."""
        return P2P_NVL_CHUNK if self.link == "nvlink" else P2P_NET_CHUNK

    def op_channels(self, nbytes: np.ndarray | float, n_nodes: int) -> np.ndarray:
        """Channels one send (or receive) of each size in `nbytes` uses (enqueue.cc `addP2pToPlan`):
        at most one part per half chunk (an eighth across one node), from `min_per_op`, doubled
        while a part exceeds a chunk (32 chunks on one node) and channels remain."""
        step = self.chunk_bytes
        min_part, max_part = (step / 2, step) if n_nodes > 1 else (step / 8, step * 32)
        nbytes = np.asarray(nbytes, np.float64)
        n = np.maximum(1, np.minimum(self.min_per_op, np.ceil(nbytes / min_part))).astype(np.int64)
        while True:
            grow = (np.maximum(min_part, np.ceil(nbytes / n)) > max_part) & (n <= self.per_peer // 2)
            if not grow.any():
                return n
            n = np.where(grow, n * 2, n)


def _pow2_up(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


P2P_LINKS = ("nvlink", "pci", "net")


def p2p_links(spec: TopologySpec, src_gpus: np.ndarray, dst_gpus: np.ndarray) -> np.ndarray:
    """How NCCL reaches each destination GPU from its source GPU, as an index into P2P_LINKS:
    NVLink in one NVLink domain, PCIe on one host without NVLink, else the network."""
    src, dst = np.asarray(src_gpus, np.int64), np.asarray(dst_gpus, np.int64)
    same_domain = (src // spec.domain == dst // spec.domain) & (spec.domain > 1)
    return np.where(same_domain, 0, np.where(src // spec.gpus == dst // spec.gpus, 1, 2))


def _net_channels_per_peer(spec: TopologySpec) -> int:
    nics = max(1, spec.nics_per_gpu * spec.planes)
    gbs = min(spec.nic_gbps, spec.pcie_gbps) / 8.0 * spec.nics_per_gpu * spec.planes
    return max(nics, math.ceil(int(gbs) / P2P_PER_CHANNEL_NET_GBS))


def p2p_channels_per_peer(topology: Topology | TopologySpec, shape: Shape, *, channels: int | None = None,
                          max_peers: int | None = None) -> P2pChannels:
    """NCCL's p2p channels for a communicator of `shape` (paths.cc, enqueue.cc).

    A peer gets 2 channels per NVLink of its path, 2 over PCIe, and over the network one per local
    NIC or enough at 14 GB/s each to fill them; the comm keeps the least over its peers, made a
    power of two. The comm's p2p channels are its channels (`channels`, else NCCL's count on the
    topology) made a power of two. Across NVLink domains the per-peer count is halved until a
    round of every peer (`max_peers`, default the comm's size, in batches of 8) fits the p2p
    channels; on one domain it is capped by them. An operation starts from the per-peer count
    halved until all ranks fit the p2p channels once.
    """
    spec = topology.spec if isinstance(topology, Topology) else topology
    n_ch = channels or p2p_comm_channels(spec, shape)
    p2p_ch = _pow2_up(min(n_ch, P2P_MAX_CHANNELS))
    if shape.n_nodes > 1:
        link, least = "net", _net_channels_per_peer(spec)
        if shape.ppn > 1:  # peers in the same domain too
            least = min(least, 2 * max(1, round(shape.intra_gbs / shape.nvlink_link_gbs)) if shape.nvlink else 2)
    elif shape.nvlink:
        link, least = "nvlink", 2 * max(1, round(shape.intra_gbs / shape.nvlink_link_gbs))
    else:
        link, least = "pci", 2
    per_peer = _pow2_up(min(least, P2P_MAX_CHANNELS))
    if shape.n_nodes > 1:
        peers = max_peers or shape.n_ranks
        while per_peer * math.ceil(peers / P2P_PER_BATCH) > p2p_ch and per_peer > 1:
            per_peer //= 2
    else:
        per_peer = min(per_peer, p2p_ch)
    min_per_op = per_peer
    while min_per_op * shape.n_ranks > p2p_ch and min_per_op > 1:
        min_per_op //= 2
    return P2pChannels(channels=p2p_ch, per_peer=per_peer, min_per_op=min_per_op, link=link)


def p2p_comm_channels(spec: TopologySpec, shape: Shape) -> int:
    """The comm's channel count p2p starts from: on one NVLink domain NCCL's search finds about one
    ring channel per NVLink and duplicates them, up to 32 (2 x 18 links on H100 -> 32, 2 x 8 on
    H800 -> 16); across domains 2 per NIC port (`default_channels`)."""
    if shape.n_nodes == 1 and shape.nvlink:
        return int(min(MAX_CHANNELS, 2 * max(1, round(shape.intra_gbs / shape.nvlink_link_gbs))))
    return default_channels(spec, shape)


def p2p_channel_gbs(link: str, nvlink_link_gbs: float = NVLINK_PER_LINK_GBS) -> float:
    """The most one p2p channel moves (GB/s): over the network NCCL's own 14 GB/s per channel
    (P2P_PER_CHANNEL_NET_BW), over NVLink one NVLink's worth (NCCL's per-link figure of the GPU's
    generation, 20.6 on Hopper: one channel is one thread block copying); over PCIe no limit."""
    return {"net": P2P_PER_CHANNEL_NET_GBS, "nvlink": nvlink_link_gbs}.get(link, math.inf)


def p2p_proto(nbytes: float, op_channels: int) -> str:
    """LL when an operation carries at most 16 KiB per channel, else Simple (enqueue.cc)."""
    return "LL" if nbytes <= op_channels * P2P_LL_THRESHOLD else "Simple"


def p2p_latency_us(proto: str, link: str, *, peers: int = 1, op_channels: int = 1,
                   p2p: P2pChannels | None = None) -> float:
    """Latency of a group of p2p operations (µs). NCCL's tuning has no p2p model, so this uses its
    ring constants for one hop: the base latency of the protocol plus one hop of the link class,
    once per round of operations a channel runs in sequence (8 per batch: with `peers` peers of
    `op_channels` channels each over the comm's p2p channels)."""
    p = PROTOS.index(proto)
    hop = HW_LATENCY_US[link]["ring"][p]
    rounds = 1
    if p2p is not None and peers > 0:
        rounds = max(1, math.ceil(peers * op_channels / (p2p.channels * P2P_PER_BATCH)))
    return BASE_LATENCY_US["ring"][p] + rounds * hop
