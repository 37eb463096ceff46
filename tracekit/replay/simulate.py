"""Flows on a topology: routing to CSR paths and the fluid simulation (wrappers over `_kernels`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit.replay import _kernels
from tracekit.replay.topology import Topology

MODE_GPU = 0
MODE_LEAF_UP = 1
MODE_LEAF_DOWN = 2
MODE_SPINE_UP = 3
MODE_SPINE_DOWN = 4
MODE_NVLS_UP = 5
MODE_NVLS_DOWN = 6
MODE_CORE_UP = 7    # spine tier of a pod -> core tier (in-network reduction), src = pod index
MODE_CORE_DOWN = 8
MODE_NET = 9  # GPU to GPU over the network from the source GPU's own NIC, never through a PXN proxy


@dataclass
class Flows:
    """Flows as parallel arrays. `src`/`dst` are GPU indices (leaf indices for modes 3..4, pod
    indices for modes 7..8)."""

    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    release: np.ndarray
    lat_mult: np.ndarray
    channel: np.ndarray
    mode: np.ndarray
    key: np.ndarray  # the owner (a collective instance index), also salts the ECMP hash

    def __len__(self) -> int:
        return int(self.src.size)

    @classmethod
    def from_lists(cls, src, dst, nbytes, *, release=None, lat_mult=None, channel=None, mode=None,
                   key=None) -> Flows:
        n = len(src)

        def arr(values, dtype, default):
            return np.full(n, default, dtype) if values is None else np.asarray(values, dtype).reshape(n)

        return cls(arr(src, np.int64, 0), arr(dst, np.int64, 0), arr(nbytes, np.float64, 0.0),
                   arr(release, np.float64, 0.0), arr(lat_mult, np.float64, 1.0),
                   arr(channel, np.int64, 0), arr(mode, np.int64, MODE_GPU), arr(key, np.int64, 0))

    @classmethod
    def concat(cls, parts: list[Flows]) -> Flows:
        if not parts:
            return cls.from_lists([], [], [])
        return cls(*(np.concatenate([getattr(p, name) for p in parts]) for name in (
            "src", "dst", "nbytes", "release", "lat_mult", "channel", "mode", "key")))


def route(topology: Topology, flows: Flows) -> tuple[np.ndarray, np.ndarray]:
    """CSR paths (indptr, resource ids) of the flows on the topology."""
    r = topology.route
    n_gpus = r["n_gpus"]
    pair = (flows.mode == MODE_GPU) | (flows.mode == MODE_NET)
    gpu_modes = pair | (flows.mode == MODE_LEAF_UP) | (flows.mode == MODE_LEAF_DOWN) | (
        flows.mode == MODE_NVLS_UP) | (flows.mode == MODE_NVLS_DOWN)
    if len(flows) and gpu_modes.any():
        bad = gpu_modes & ((flows.src < 0) | (flows.src >= n_gpus) | (pair & (
            (flows.dst < 0) | (flows.dst >= n_gpus))))
        if bad.any():
            raise ValueError(f"flow endpoints outside the topology's {n_gpus} GPUs")
    fhash = np.empty(len(flows), np.int64)
    _hashes(flows.src, flows.dst, flows.channel, flows.key, fhash)
    if r.get("graph"):
        from tracekit.replay.observed import route_graph

        if len(flows) and not pair.all():
            raise ValueError("the observed fabric routes GPU-to-GPU flows only (no in-network reduction)")
        return route_graph(topology, flows.src, flows.dst, fhash)
    return _kernels.route_flows(
        flows.mode, flows.src, flows.dst, flows.channel, fhash, r["gpus_per_host"],
        r["nics_per_gpu"], r["planes"], r["domain"], r["nvl_up"], r["nvl_down"], r["pcie_up"],
        r["pcie_down"], r["nic_leaf"], r["nic_leaf_up"], r["leaf_nic_down"], r["leaf_pod"],
        r["leaf_spine_up"], r["spine_leaf_down"], r["spine_core_up"], r["core_spine_down"],
        r["leaf_up_agg"], r["leaf_down_agg"], r["pod_up_agg"], r["pod_down_agg"], r["spray"], r["pxn"])


@_kernels.njit
def _hash_all(src, dst, channel, key, out):
    for i in range(src.size):
        out[i] = _kernels.flow_hash(src[i], dst[i], channel[i], key[i])


def _hashes(src, dst, channel, key, out) -> None:
    _hash_all(src, dst, channel, key, out)


@dataclass
class SimResult:
    """Finish time per flow (ns, latency included) and bytes per resource per window."""

    finish: np.ndarray
    windows: np.ndarray
    window_ns: float
    t_origin: float


def simulate(topology: Topology, indptr: np.ndarray, ids: np.ndarray, flows: Flows, *,
             n_windows: int = 0, window_ns: float = 1.0, t_origin: float = 0.0,
             rel_eps: float = 1e-9, merge: float = 0.0) -> SimResult:
    """Run the max-min fluid simulation of routed flows (`merge` > 0: finish flows early by up to
    that fraction of their age to merge events; 0 is exact)."""
    finish, win = _kernels.simulate_flows(
        indptr, ids, flows.nbytes, flows.release, flows.lat_mult, topology.cap,
        topology.res_latency, int(n_windows), float(window_ns), float(t_origin), float(rel_eps),
        float(merge))
    return SimResult(finish, win, float(window_ns), float(t_origin))


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
