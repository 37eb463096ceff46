"""The observed fabric (`topology_nodes` / `topology_links` from `ibnetdiscover -p` or a link map)
built into a replay `Topology` routed as a general graph.

Ranks are placed by host name: each run host is matched to the fabric's HCAs on that host (exact
name, else the short name before the first dot, case-insensitive). GPU `l` of a host uses the
host's HCA `l mod n` (HCAs in name order), over a PCIe link; GPUs of one host talk over NVLink.
Between hosts a flow takes a shortest path over the switches (hop count), the next hop chosen
per flow by ECMP hash among the equal-cost ones, like the fabric's own adaptive-off routing.
Cables keep the fabric's link names, so replayed `link_samples` line up with telemetry.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tracekit import schema
from tracekit.errors import TracekitError
from tracekit.replay import _kernels, hardware
from tracekit.replay._kernels import GraphTables
from tracekit.replay.topology import GBPS_TO_BYTES_PER_NS, GraphRoutes, Topology, TopologySpec

NAME = "observed"
SWITCH_KINDS = ("leaf", "spine", "core", "switch", "nvswitch")
DEFAULT_LATENCY_NS = 600


class ObservedFabricError(TracekitError):
    """The run cannot be placed on (or routed over) its observed fabric."""


def observed_spec(name: str = NAME) -> TopologySpec:
    """The marker spec `replay` turns into the observed fabric of the run (`--topology observed`)."""
    return TopologySpec(name=name, kind=NAME, sharp=False, nvls=False, pxn=False)


def is_observed(spec: object) -> bool:
    return (isinstance(spec, TopologySpec) and spec.kind == NAME) or spec == NAME


def _host_key(name: str) -> str:
    return name.split(".", 1)[0].lower()


def build_observed(nodes: pa.Table | None, links: pa.Table | None, hosts: list[str], gpus_per_host: int, *,
                   spec: TopologySpec | None = None) -> Topology:
    """A `Topology` over the observed fabric with `gpus_per_host` GPUs on each run host (in the
    order of `hosts`, GPU index = host index x gpus_per_host + local index)."""
    spec = spec or observed_spec()
    if links is None or links.num_rows == 0:
        raise ObservedFabricError("--topology observed needs the fabric: ingest `ibnetdiscover -p` output "
                                  "(or a link map) with the run")
    if not hosts:
        raise ObservedFabricError("--topology observed places ranks by host name, and the run names no hosts")
    links = schema.conform("topology_links", links)
    nodes = schema.conform("topology_nodes", nodes) if nodes is not None else schema.empty("topology_nodes")
    kind_of = {n["node"]: n["kind"] for n in nodes.select(["node", "kind"]).to_pylist()}
    host_of = {n["node"]: n["host"] for n in nodes.select(["node", "host"]).to_pylist() if n["host"]}
    rows = links.to_pylist()
    names: list[str] = []
    index: dict[str, int] = {}

    def node(name: str) -> int:
        if name not in index:
            index[name] = len(names)
            names.append(name)
        return index[name]

    for r in rows:
        node(r["src"])
        node(r["dst"])
    nics_by_host: dict[str, list[str]] = {}
    for name in names:
        if kind_of.get(name, "switch") == "nic" and host_of.get(name):
            nics_by_host.setdefault(_host_key(host_of[name]), []).append(name)
    missing = [h for h in hosts if _host_key(h) not in nics_by_host]
    if missing:
        known = sorted(nics_by_host)
        raise ObservedFabricError(
            f"{len(missing)} run host(s) have no HCA in the observed fabric ({', '.join(missing[:5])}"
            f"{', ...' if len(missing) > 5 else ''}); the fabric's hosts: {', '.join(known[:8]) or 'none'}"
            f"{', ...' if len(known) > 8 else ''}")
    gpus_per_host = max(1, int(gpus_per_host))
    n_gpus = len(hosts) * gpus_per_host
    gpu_nic = np.empty(n_gpus, np.int64)
    gpu_host = np.repeat(np.arange(len(hosts), dtype=np.int64), gpus_per_host)
    for h, host in enumerate(hosts):
        nics = sorted(nics_by_host[_host_key(host)])
        for local in range(gpus_per_host):
            gpu_nic[h * gpus_per_host + local] = index[nics[local % len(nics)]]

    out_links: dict[str, list] = {k: [] for k in ("link", "src", "dst", "gbps", "latency_ns", "medium", "plane",
                                                     "tier", "cables", "network")}
    cap: list[float] = []
    lat: list[float] = []

    def cable(link: str, src: str, dst: str, gbps: float, latency: int, medium: str, tier: str,
              plane: int | None = None, network: str = "backend", cables: int = 1) -> tuple[int, int]:
        i = len(out_links["link"])
        for key, value in (("link", link), ("src", src), ("dst", dst), ("gbps", gbps), ("latency_ns", latency),
                           ("medium", medium), ("plane", plane), ("tier", tier), ("cables", cables),
                           ("network", network)):
            out_links[key].append(value)
        cap.extend([gbps * GBPS_TO_BYTES_PER_NS] * 2)
        lat.extend([float(latency)] * 2)
        return 2 * i, 2 * i + 1

    adj: list[list[tuple[int, int]]] = [[] for _ in names]
    for r in rows:
        gbps = r.get("gbps")
        if gbps is None or not gbps > 0:
            raise ObservedFabricError(f"observed link {r['link']} has no speed")
        up, down = cable(r["link"], r["src"], r["dst"], float(gbps), int(r.get("latency_ns") or DEFAULT_LATENCY_NS),
                         r.get("medium") or "ib", r.get("tier") or "fabric", r.get("plane"),
                         r.get("network") or "backend", int(r.get("cables") or 1))
        s, d = index[r["src"]], index[r["dst"]]
        adj[s].append((d, up))
        adj[d].append((s, down))
    nvl_up = np.empty(n_gpus, np.int64)
    nvl_down = np.empty(n_gpus, np.int64)
    pcie_up = np.empty(n_gpus, np.int64)
    pcie_down = np.empty(n_gpus, np.int64)
    gpu_nodes: list[tuple[str, str, str]] = []
    for h, host in enumerate(hosts):
        nvsw = f"{host}/nvswitch"
        gpu_nodes.append((nvsw, "nvswitch", host))
        for local in range(gpus_per_host):
            g = h * gpus_per_host + local
            gpu = f"{host}/gpu{local}"
            gpu_nodes.append((gpu, "gpu", host))
            nvl_up[g], nvl_down[g] = cable(f"{gpu}--{nvsw}", gpu, nvsw, hardware.achievable(spec).nvlink_gbs * 8.0,
                                           spec.nvlink_latency_ns, "nvlink", "nvlink")
            nic = names[gpu_nic[g]]
            pcie_up[g], pcie_down[g] = cable(f"{gpu}--{nic}", gpu, nic, spec.pcie_gbps, 0, "pcie", "pcie")
    adj_ptr = np.zeros(len(names) + 1, np.int64)
    adj_ptr[1:] = np.cumsum([len(a) for a in adj])
    adj_node = np.array([v for a in adj for v, _ in a], np.int64)
    adj_res = np.array([e for a in adj for _, e in a], np.int64)
    transit = np.array([kind_of.get(n, "switch") in SWITCH_KINDS for n in names], np.bool_)
    targets = np.unique(gpu_nic)
    nic_row = np.searchsorted(targets, gpu_nic).astype(np.int64)
    dist = _kernels.fabric_distances(adj_ptr, adj_node, transit, targets)

    node_rows = nodes.filter(pa.compute.is_in(nodes.column("node"), pa.array(names, pa.string())))
    extra = schema.conform("topology_nodes", {
        "node": pa.array([n for n, _, _ in gpu_nodes], pa.string()),
        "kind": pa.array([k for _, k, _ in gpu_nodes], pa.string()),
        "host": pa.array([h for _, _, h in gpu_nodes], pa.string()),
    })
    all_nodes = schema.conform("topology_nodes", pa.concat_tables([node_rows, extra], promote_options="permissive"))
    all_links = schema.conform("topology_links", {
        "link": pa.array(out_links["link"], pa.string()), "src": pa.array(out_links["src"], pa.string()),
        "dst": pa.array(out_links["dst"], pa.string()), "gbps": pa.array(out_links["gbps"], pa.float64()),
        "latency_ns": pa.array(out_links["latency_ns"], pa.int64()),
        "medium": pa.array(out_links["medium"], pa.string()), "plane": pa.array(out_links["plane"], pa.int32()),
        "tier": pa.array(out_links["tier"], pa.string()), "cables": pa.array(out_links["cables"], pa.int32()),
        "network": pa.array(out_links["network"], pa.string()),
    })
    nic_gbps = min((float(r["gbps"]) for r in rows if kind_of.get(r["src"]) == "nic"
                    or kind_of.get(r["dst"]) == "nic"), default=spec.nic_gbps)
    nics_per_host = min(len(v) for k, v in nics_by_host.items() if k in {_host_key(h) for h in hosts})
    spec = spec.replace(hosts=len(hosts), gpus=gpus_per_host, nic_gbps=nic_gbps,
                        nics_per_gpu=max(1, nics_per_host // gpus_per_host))
    n_res = len(cap)
    tables = GraphTables(gpu_host=gpu_host, gpu_nic=gpu_nic, nic_row=nic_row, nvl_up=nvl_up, nvl_down=nvl_down,
                         pcie_up=pcie_up, pcie_down=pcie_down, adj_ptr=adj_ptr, adj_node=adj_node, adj_res=adj_res,
                         transit=transit, dist=dist)
    route = GraphRoutes(tables=tables, n_gpus=n_gpus, gpus_per_host=gpus_per_host, nics_per_gpu=spec.nics_per_gpu,
                        node_names=names, hosts=list(hosts))
    return Topology(spec=spec, nodes=all_nodes, links=all_links, cap=np.asarray(cap, np.float64),
                    res_latency=np.asarray(lat, np.float64), res_cable_ptr=np.arange(n_res + 1, dtype=np.int64),
                    res_cable_ids=np.arange(n_res, dtype=np.int64), res_cable_frac=np.ones(n_res), route=route)


def route_graph(topology: Topology, src: np.ndarray, dst: np.ndarray, fhash: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """CSR paths of GPU -> GPU flows on an observed topology; a flow between hosts the fabric does
    not connect is an error naming them."""
    r = topology.route
    if not isinstance(r, GraphRoutes):
        raise TypeError(f"{topology.name} is not an observed fabric")
    indptr, ids, bad = _kernels.route_graph(src, dst, fhash, r.tables)
    if bad >= 0:
        names, hosts, t = r.node_names, r.hosts, r.tables
        s, d = int(src[bad]), int(dst[bad])
        raise ObservedFabricError(
            f"the observed fabric has no path from {hosts[t.gpu_host[s]]} ({names[t.gpu_nic[s]]}) to "
            f"{hosts[t.gpu_host[d]]} ({names[t.gpu_nic[d]]}): the ibnetdiscover output covers part of "
            "the fabric only")
    return indptr, ids
