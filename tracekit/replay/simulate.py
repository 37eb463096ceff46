"""Flows on a topology: routing to CSR paths and the fluid simulation (wrappers over `_kernels`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracekit.replay import _kernels
from tracekit.replay._kernels import FlowMode
from tracekit.replay.topology import GraphRoutes, Topology

MODE_GPU = FlowMode.GPU
MODE_LEAF_UP = FlowMode.LEAF_UP
MODE_LEAF_DOWN = FlowMode.LEAF_DOWN
MODE_SPINE_UP = FlowMode.SPINE_UP
MODE_SPINE_DOWN = FlowMode.SPINE_DOWN
MODE_NVLS_UP = FlowMode.NVLS_UP
MODE_NVLS_DOWN = FlowMode.NVLS_DOWN
MODE_CORE_UP = FlowMode.CORE_UP
MODE_CORE_DOWN = FlowMode.CORE_DOWN
MODE_NET = FlowMode.NET


@dataclass
class Flows:
    """Flows as parallel arrays. `src`/`dst` are GPU indices (leaf indices for the spine modes, pod
    indices for the core modes; see `FlowMode`)."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    release: np.ndarray
    lat_mult: np.ndarray
    channel: np.ndarray
    mode: np.ndarray
    key: np.ndarray  # the owner (a collective instance index), also salts the ECMP hash
    max_gbs: np.ndarray | None = None  # per flow, the most it may move (GB/s; inf or None: no limit)

    def __len__(self) -> int:
        return int(self.src.size)

    @classmethod
    def from_lists(cls, src, dst, nbytes, *, release=None, lat_mult=None, channel=None, mode=None,
                   key=None, max_gbs=None) -> Flows:
        n = len(src)

        def arr(values, dtype, default):
            return np.full(n, default, dtype) if values is None else np.asarray(values, dtype).reshape(n)

        return cls(arr(src, np.int64, 0), arr(dst, np.int64, 0), arr(nbytes, np.float64, 0.0),
                   arr(release, np.float64, 0.0), arr(lat_mult, np.float64, 1.0),
                   arr(channel, np.int64, 0), arr(mode, np.int64, MODE_GPU), arr(key, np.int64, 0),
                   None if max_gbs is None else arr(max_gbs, np.float64, np.inf))

    def rate_limits(self) -> np.ndarray:
        """Per flow, its rate limit in GB/s (inf where it has none)."""
        return np.full(len(self), np.inf) if self.max_gbs is None else self.max_gbs

    @classmethod
    def concat(cls, parts: list[Flows]) -> Flows:
        if not parts:
            return cls.from_lists([], [], [])
        limited = any(p.max_gbs is not None for p in parts)
        return cls(*(np.concatenate([getattr(p, name) for p in parts]) for name in (
            "src", "dst", "nbytes", "release", "lat_mult", "channel", "mode", "key")),
                   np.concatenate([p.rate_limits() for p in parts]) if limited else None)


def route(topology: Topology, flows: Flows) -> tuple[np.ndarray, np.ndarray]:
    """CSR paths (indptr, resource ids) of the flows on the topology."""
    r = topology.route
    n_gpus = r.n_gpus
    pair = (flows.mode == FlowMode.GPU) | (flows.mode == FlowMode.NET)
    gpu_modes = pair | (flows.mode == FlowMode.LEAF_UP) | (flows.mode == FlowMode.LEAF_DOWN) | (
        flows.mode == FlowMode.NVLS_UP) | (flows.mode == FlowMode.NVLS_DOWN)
    if len(flows) and gpu_modes.any():
        bad = gpu_modes & ((flows.src < 0) | (flows.src >= n_gpus) | (pair & (
            (flows.dst < 0) | (flows.dst >= n_gpus))))
        if bad.any():
            raise ValueError(f"flow endpoints outside the topology's {n_gpus} GPUs")
    fhash = _kernels.flow_hashes(flows.src, flows.dst, flows.channel, flows.key)
    if isinstance(r, GraphRoutes):
        from tracekit.replay.fabric_graph import route_graph

        if len(flows) and not pair.all():
            raise ValueError("the observed fabric routes GPU-to-GPU flows only (no in-network reduction)")
        return route_graph(topology, flows.src, flows.dst, fhash)
    return _kernels.route_flows(flows.mode, flows.src, flows.dst, flows.channel, fhash, r.tables)


@dataclass
class SimResult:
    """Finish time per flow (ns, latency included) and bytes per resource per window."""

    finish: np.ndarray
    windows: np.ndarray
    window_ns: float
    t_origin: float


def nic_links(topology: Topology) -> np.ndarray:
    """Per resource: True for either direction of a cable between a NIC and the fabric (not the
    NIC's PCIe side)."""
    links = topology.links
    nics = set(pc.filter(topology.nodes.column("node"), pc.equal(topology.nodes.column("kind"), "nic")).to_pylist())
    ends = pc.or_(pc.is_in(links.column("src"), pa.array(list(nics), pa.string())),
                  pc.is_in(links.column("dst"), pa.array(list(nics), pa.string())))
    per_cable = pc.and_(ends, pc.not_equal(links.column("tier"), "pcie")).to_numpy(zero_copy_only=False)
    mask = np.zeros(topology.cap.size, np.bool_)
    mask[:2 * per_cable.size] = np.repeat(per_cable, 2)
    return mask


def connection_weights(topology: Topology, indptr: np.ndarray, ids: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Per flow, its weight in the weighted max-min sharing: `1 / n_k`, `n_k` the most flows its
    instance (`key`) puts on one NIC link (1 when the instance crosses no NIC), scaled so that the
    largest weight is 1. A collective's
    connections through a NIC then take one share of it together, whatever its channel count,
    while its own flows keep equal weights (a collective alone replays as with per-flow sharing).
    docs/replay.md section 4.1."""
    n = int(indptr.size - 1)
    weight = np.ones(n, np.float64)
    if n == 0:
        return weight
    on_nic = nic_links(topology)[ids]
    if not on_nic.any():
        return weight
    flow_of = np.repeat(np.arange(n), np.diff(indptr))[on_nic]
    keys, key_index = np.unique(np.asarray(key), return_inverse=True)
    pair = key_index[flow_of].astype(np.int64) * topology.cap.size + ids[on_nic]
    uniq, count = np.unique(pair, return_counts=True)
    most = np.ones(keys.size, np.int64)
    np.maximum.at(most, uniq // topology.cap.size, count)
    weight = 1.0 / most[key_index]
    return weight / weight.max()  # only ratios matter; one instance alone gets exactly 1


def simulate(topology: Topology, indptr: np.ndarray, ids: np.ndarray, flows: Flows, *,
             n_windows: int = 0, window_ns: float = 1.0, t_origin: float = 0.0,
             rel_eps: float = 1e-9, merge: float = 0.0, weight: np.ndarray | None = None) -> SimResult:
    """Run the weighted max-min fluid simulation of routed flows (`merge` > 0: finish flows early
    by up to that fraction of their age to merge events; 0 is exact). `weight`: per flow; by
    default `connection_weights` of the flows' keys (NIC shared per collective instance);
    `np.ones` gives per-flow sharing. A flow with a rate limit (`Flows.max_gbs`) also crosses a
    resource of its own of that capacity."""
    if weight is None:
        weight = connection_weights(topology, indptr, ids, flows.key)
    cap, lat = topology.cap, topology.res_latency
    if flows.max_gbs is not None and np.isfinite(flows.max_gbs).any():
        indptr, ids, cap, lat = with_rate_limits(indptr, ids, flows.max_gbs, cap, lat)
    finish, win = _kernels.simulate_flows(
        indptr, ids, flows.nbytes, flows.release, flows.lat_mult, cap, lat, int(n_windows),
        float(window_ns), float(t_origin), float(rel_eps), float(merge), 16, np.asarray(weight, np.float64),
        topology.cap.size)  # no windows for the rate limits' private resources
    return SimResult(finish, win, float(window_ns), float(t_origin))


def with_rate_limits(indptr: np.ndarray, ids: np.ndarray, max_gbs: np.ndarray, cap: np.ndarray,
                     res_latency: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Paths and resources with one private resource (capacity `max_gbs`, no latency) put first on
    the path of every flow whose limit is finite; the others are unchanged."""
    limited = np.isfinite(max_gbs)
    lens = np.diff(indptr)
    ptr = np.zeros(lens.size + 1, np.int64)
    np.cumsum(lens + limited, out=ptr[1:])
    out = np.empty(ptr[-1], np.int64)
    out[np.repeat(ptr[:-1] + limited - indptr[:-1], lens) + np.arange(indptr[-1] - indptr[0]) + indptr[0]] = \
        ids[indptr[0]:indptr[-1]]
    out[ptr[:-1][limited]] = cap.size + np.arange(int(limited.sum()))
    return (ptr, out, np.concatenate([cap, max_gbs[limited].astype(np.float64)]),  # GB/s = bytes/ns
            np.concatenate([res_latency, np.zeros(int(limited.sum()))]))


def resource_bytes(n_res: int, indptr: np.ndarray, ids: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Bytes carried by each resource: the sum over the flows routed across it."""
    counts = np.diff(indptr)
    return np.bincount(ids, weights=np.repeat(nbytes, counts), minlength=n_res)


def to_cables(topology: Topology, per_resource: np.ndarray) -> np.ndarray:
    """Resource values (bytes, or bytes per window along axis 1) onto cable directions
    (2 * cables: even = src->dst, odd = dst->src); aggregates are split by capacity."""
    ptr, cid, frac = topology.res_cable_ptr, topology.res_cable_ids, topology.res_cable_frac
    owner = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
    n_dir = 2 * topology.n_cables
    values = per_resource[owner]
    weights = frac if values.ndim == 1 else frac[:, None]
    out = np.zeros((n_dir, *per_resource.shape[1:]), np.float64)
    np.add.at(out, cid, values * weights)
    return out
