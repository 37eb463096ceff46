"""Network topology specs (YAML file or preset string) built into node/link tables and routing arrays.

A spec describes hosts of `gpus` GPUs joined by an NVLink domain, NICs per GPU, and a leaf/spine/core
fabric (single switch, fat-tree or rail-optimised) with an oversubscription ratio per tier. `build`
turns it into a `Topology`: the `topology_nodes` / `topology_links` tables (one row per cable, full
duplex, `gbps` per direction) and the arrays the router and the simulator use. Every cable is two
simulator resources (src->dst, dst->src); spray routing adds aggregate resources (all uplinks of a
leaf or a pod as one pipe), which is exact for ideal spraying and is split evenly back onto the
cables when reporting.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import yaml

from tracekit import _yaml, schema
from tracekit.errors import TracekitError
from tracekit.finding import Finding
from tracekit.replay import hardware
from tracekit.replay._kernels import FatTreeTables, GraphTables
from tracekit.results import Result

KINDS = ("single-switch", "fat-tree", "rail-optimized")
ROUTINGS = ("ecmp", "spray")
STORAGE_NETWORKS = ("frontend", "backend")
TIER_NAMES = ("nvlink", "pcie", "nic-leaf", "leaf-spine", "spine-core", "host-tor", "tor-agg", "storage")
GBPS_TO_BYTES_PER_NS = 1.0 / 8.0


class TopologyError(TracekitError):
    """A topology spec is invalid; the message names the bad field."""

    def __init__(self, field_name: str, problem: str) -> None:
        self.field = field_name
        super().__init__(f"topology field {field_name!r}: {problem}")


@dataclass(frozen=True)
class TopologySpec:
    """A network model. Bandwidths: `nvlink_gbs` in GB/s per GPU per direction, others in Gb/s."""

    name: str = "custom"
    kind: str = "rail-optimized"
    hosts: int | None = None
    gpus: int = 8
    nvlink_domain: int | None = None
    nvlink_gbs: float = 450.0
    nvlink_latency_ns: int = 150
    pcie_gbps: float = 512.0
    nics_per_gpu: int = 1
    nic_gbps: float = 400.0
    leaf_radix: int = 64
    tiers: int = 2
    oversub: float = 1.0
    core_oversub: float = 1.0
    planes: int = 1
    latency_ns: int = 600
    sharp: bool = False
    nvls: bool = False
    routing: str = "ecmp"
    pxn: bool = True
    frontend_gbps: float = 0.0
    frontend_nics: int = 1
    frontend_radix: int = 64
    frontend_oversub: float = 1.0
    storage: int = 0
    storage_gbps: float = 400.0
    storage_network: str = "frontend"
    gpu: str = ""
    nvlink_efficiency: float = 0.0
    nic_efficiency: float = 0.0
    nvls_efficiency: float = 0.0
    net_latency_us: float = 0.0
    ring_channel_gbs: float = 0.0
    given: tuple[str, ...] = ()

    @property
    def domain(self) -> int:
        return self.nvlink_domain or self.gpus

    def replace(self, **changes: Any) -> TopologySpec:
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, dict[str, Any]] = {
    "single-switch": {"kind": "single-switch", "tiers": 1},
    "fat-tree": {"kind": "fat-tree"},
    "rail-optimized": {"kind": "rail-optimized"},
    # NVIDIA DGX SuperPOD H100 reference architecture: 8 rails of NDR 400G, 1:1, SU = 32 nodes,
    # QM9700 (64 ports: 32 down, 32 up).
    "dgx-h100-superpod": {"kind": "rail-optimized", "hosts": 32, "gpus": 8, "nvlink_gbs": 450.0,
                          "nics_per_gpu": 1, "nic_gbps": 400.0, "leaf_radix": 64, "tiers": 2,
                          "oversub": 1.0, "sharp": True, "nvls": True},
    "dgx-a100-superpod": {"kind": "rail-optimized", "hosts": 20, "gpus": 8, "nvlink_gbs": 300.0,
                          "nics_per_gpu": 1, "nic_gbps": 200.0, "leaf_radix": 40, "tiers": 2,
                          "oversub": 1.0, "sharp": True},
    "dgx-b200-superpod": {"kind": "rail-optimized", "hosts": 32, "gpus": 8, "nvlink_gbs": 900.0,
                          "nics_per_gpu": 1, "nic_gbps": 400.0, "leaf_radix": 64, "tiers": 2,
                          "oversub": 1.0, "sharp": True, "nvls": True},
    "gb200-nvl72": {"kind": "rail-optimized", "hosts": 18, "gpus": 4, "nvlink_domain": 72,
                    "nvlink_gbs": 900.0, "nics_per_gpu": 1, "nic_gbps": 400.0, "leaf_radix": 64,
                    "tiers": 2, "nvls": True},
    "h800-fat-tree": {"kind": "fat-tree", "gpus": 8, "nvlink_gbs": 200.0, "nics_per_gpu": 1,
                      "nic_gbps": 400.0, "leaf_radix": 64, "tiers": 2},
    "hpn-dual-plane": {"kind": "rail-optimized", "gpus": 8, "nvlink_gbs": 450.0,
                       "nics_per_gpu": 1, "nic_gbps": 400.0, "planes": 2, "leaf_radix": 128},
}

_FIELDS = {f.name: f for f in dataclasses.fields(TopologySpec)}
_ALIASES = {"gpus_per_host": "gpus", "nvlink_gbps_per_gpu": "nvlink_gbs", "radix": "leaf_radix",
            "nics": "nics_per_gpu", "latency": "latency_ns", "domain": "nvlink_domain"}


def presets() -> list[str]:
    """Names accepted as a preset string."""
    return sorted(PRESETS)


def parse_spec(text: str | os.PathLike[str] | TopologySpec) -> TopologySpec:
    """A spec from a preset string (`rail-optimized:hosts=2,oversub=2`) or a YAML file path."""
    if isinstance(text, TopologySpec):
        return text
    raw = os.fspath(text).strip()
    path = Path(raw)
    if raw.endswith((".yaml", ".yml")) or path.is_file():
        return load_yaml(path)
    base, _, params = raw.partition(":")
    if base not in PRESETS:
        raise TopologyError("preset", f"unknown preset {base!r}; choose one of {', '.join(presets())} "
                            "or give a YAML file")
    values: dict[str, Any] = dict(PRESETS[base])
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise TopologyError(key.strip(), "expected key=value")
        values[key.strip()] = value.strip()
    values.setdefault("name", raw if params else base)
    return spec_from_mapping(values)


def load_yaml(path: str | os.PathLike[str]) -> TopologySpec:
    """A spec from a YAML mapping; `preset: NAME` starts from a preset."""
    path = Path(path)
    try:
        data = _yaml.load(path.read_text())
    except OSError as exc:
        raise TopologyError("file", f"{path}: {exc}") from exc
    except (_yaml.YAMLBudgetError, RecursionError) as exc:
        raise TopologyError("file", f"{path}: {exc or 'YAML nested too deeply'}") from exc
    except yaml.YAMLError as exc:
        raise TopologyError("file", f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise TopologyError("file", f"{path}: expected a mapping of fields")
    values: dict[str, Any] = {}
    preset = data.pop("preset", None)
    if preset is not None:
        if preset not in PRESETS:
            raise TopologyError("preset", f"unknown preset {preset!r}")
        values.update(PRESETS[preset])
    values.update(data)
    values.setdefault("name", path.stem)
    return spec_from_mapping(values)


def spec_from_mapping(values: dict[str, Any]) -> TopologySpec:
    """Validate and convert field values (strings from a preset string are parsed)."""
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        name = _ALIASES.get(str(key), str(key))
        f = _FIELDS.get(name)
        if f is None:
            raise TopologyError(str(key), f"unknown field; known: {', '.join(sorted(_FIELDS))}")
        if name == "given":
            raise TopologyError(str(key), "is set by the parser, not by a spec")
        kwargs[name] = _convert(name, f.type, value)
    if kwargs.get("gpu"):
        try:
            defaults = hardware.profile_defaults(kwargs["gpu"])
        except hardware.HardwareError as exc:
            raise TopologyError("gpu", str(exc)) from None
        kwargs = {**{k: v for k, v in defaults.items() if k not in kwargs}, **kwargs, "gpu": defaults["gpu"]}
    spec = TopologySpec(**kwargs, given=tuple(sorted(k for k in kwargs if k != "name")))
    validate(spec)
    return spec


def with_gpu(spec: TopologySpec, device: str | None, *, nvls: bool = True) -> TopologySpec:
    """The spec with the GPU profile an input names (a device string), where the spec names none:
    the profile's line rates (and NVLS, unless `nvls` is False) fill the fields the spec did not
    give; explicit fields win."""
    name = hardware.gpu_from_device(device) if device else None
    if spec.gpu or name is None:
        return spec
    defaults = hardware.profile_defaults(name)
    if not nvls:
        defaults.pop("nvls")
    return spec.replace(**{k: v for k, v in defaults.items() if k not in spec.given or k == "gpu"})


def _convert(name: str, type_name: Any, value: Any) -> Any:
    type_name = str(type_name)
    if value is None:
        if "None" in type_name:
            return None
        raise TopologyError(name, "must not be empty")
    try:
        if type_name.startswith("bool"):
            if isinstance(value, bool):
                return value
            text = str(value).lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if type_name.startswith("int"):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(str(value)) if isinstance(value, str) else int(value)
        if type_name.startswith("float"):
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        expected = type_name.split(" ")[0].split("|")[0]
        raise TopologyError(name, f"expected {expected}, got {value!r}") from None


def validate(spec: TopologySpec) -> None:
    """Raise TopologyError naming the first bad field."""
    if spec.kind not in KINDS:
        raise TopologyError("kind", f"{spec.kind!r} is not one of {', '.join(KINDS)}")
    if spec.routing not in ROUTINGS:
        raise TopologyError("routing", f"{spec.routing!r} is not one of {', '.join(ROUTINGS)}")
    _validate_frontend(spec)
    positive_ints = ("gpus", "nics_per_gpu", "planes", "leaf_radix")
    for name in positive_ints:
        if getattr(spec, name) < 1:
            raise TopologyError(name, f"must be >= 1, got {getattr(spec, name)}")
    if spec.hosts is not None and spec.hosts < 1:
        raise TopologyError("hosts", f"must be >= 1, got {spec.hosts}")
    if spec.nvlink_domain is not None and spec.nvlink_domain < 1:
        raise TopologyError("nvlink_domain", f"must be >= 1, got {spec.nvlink_domain}")
    if spec.nvlink_domain is not None and spec.nvlink_domain % spec.gpus and spec.gpus % spec.nvlink_domain:
        raise TopologyError("nvlink_domain", "must divide or be a multiple of gpus per host")
    for name in ("nvlink_gbs", "pcie_gbps", "nic_gbps"):
        if not getattr(spec, name) > 0:
            raise TopologyError(name, f"must be > 0, got {getattr(spec, name)}")
    for name in ("nvlink_efficiency", "nic_efficiency", "nvls_efficiency"):
        if not 0.0 <= getattr(spec, name) <= 1.0:
            raise TopologyError(name, f"must be a fraction in (0, 1] (0: the GPU profile's), got {getattr(spec, name)}")
    if spec.gpu and spec.gpu not in hardware.GPUS:
        raise TopologyError("gpu", f"unknown GPU {spec.gpu!r}; known: {', '.join(hardware.GPUS)}")
    for name in ("oversub", "core_oversub"):
        if not getattr(spec, name) >= 1:
            raise TopologyError(name, f"must be >= 1 (k for k:1), got {getattr(spec, name)}")
    if spec.tiers not in (1, 2, 3):
        raise TopologyError("tiers", f"must be 1, 2 or 3, got {spec.tiers}")
    if spec.kind != "single-switch" and spec.leaf_radix < 2:
        raise TopologyError("leaf_radix", "must be >= 2")
    if not spec.ring_channel_gbs >= 0:
        raise TopologyError("ring_channel_gbs",
                            f"must be >= 0 (0: the hardware profile's), got {spec.ring_channel_gbs}")
    for name in ("latency_ns", "nvlink_latency_ns", "net_latency_us"):
        if getattr(spec, name) < 0:
            raise TopologyError(name, "must be >= 0")
    rails = spec.gpus * spec.nics_per_gpu
    if spec.kind == "fat-tree" and rails > spec.leaf_radix // 2:
        raise TopologyError("leaf_radix", f"a fat-tree leaf takes whole hosts, and one host has {rails} NICs "
                            f"({spec.gpus} GPUs x {spec.nics_per_gpu}); leaf_radix {spec.leaf_radix} leaves "
                            f"{spec.leaf_radix // 2} down ports (half the radix; the rest go up)")
    if spec.hosts is not None and spec.nvlink_domain is not None and spec.nvlink_domain > spec.hosts * spec.gpus:
        raise TopologyError("nvlink_domain", f"{spec.nvlink_domain} GPUs is more than the {spec.hosts} hosts x "
                            f"{spec.gpus} GPUs = {spec.hosts * spec.gpus} there are")


def _validate_frontend(spec: TopologySpec) -> None:
    if spec.storage_network not in STORAGE_NETWORKS:
        raise TopologyError("storage_network", f"{spec.storage_network!r} is not one of {', '.join(STORAGE_NETWORKS)}")
    if spec.frontend_gbps < 0:
        raise TopologyError("frontend_gbps", f"must be >= 0 (0: no front-end network), got {spec.frontend_gbps}")
    if spec.storage < 0:
        raise TopologyError("storage", f"must be >= 0, got {spec.storage}")
    if spec.frontend_nics < 1:
        raise TopologyError("frontend_nics", f"must be >= 1, got {spec.frontend_nics}")
    if spec.frontend_radix < 2:
        raise TopologyError("frontend_radix", f"must be >= 2, got {spec.frontend_radix}")
    if spec.frontend_oversub < 1:
        raise TopologyError("frontend_oversub", f"must be >= 1 (k for k:1), got {spec.frontend_oversub}")
    if spec.storage and not spec.storage_gbps > 0:
        raise TopologyError("storage_gbps", f"must be > 0, got {spec.storage_gbps}")
    if spec.storage and spec.storage_network == "frontend" and not spec.frontend_gbps:
        raise TopologyError("frontend_gbps", "storage on the front-end needs a front-end network (frontend_gbps > 0)")
    if spec.frontend_nics > spec.frontend_radix // 2:
        raise TopologyError("frontend_radix", f"{spec.frontend_radix // 2} down ports cannot take a host's "
                            f"{spec.frontend_nics} front-end NICs")


def sized(spec: TopologySpec, *, hosts: int, gpus: int | None = None) -> TopologySpec:
    """The spec sized for a run of `hosts` hosts with `gpus` ranks per host, when it needs it.

    A spec without hosts, or with fewer GPUs than the run has ranks, gets enough hosts: the run's
    hosts when its hosts fit the spec's, else its ranks packed `spec.gpus` per host (`place`).
    """
    gpus = gpus or spec.gpus
    needed = hosts if gpus <= spec.gpus else math.ceil(hosts * gpus / spec.gpus)
    if spec.hosts is not None and spec.hosts >= needed:
        return spec
    return spec.replace(hosts=max(needed, 1))


def _no_ids(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.int64)


@dataclass(frozen=True)
class StorageRoutes:
    """Resource ids of the front-end network and the storage nodes (empty arrays when absent)."""

    n_storage: int = 0
    storage_on: str = "frontend"   # the network the storage nodes hang off ("frontend" or "backend")
    has_frontend: bool = False
    fe_up: np.ndarray = field(default_factory=lambda: _no_ids(0, 0))    # [host, front-end NIC] NIC -> ToR
    fe_down: np.ndarray = field(default_factory=lambda: _no_ids(0, 0))  # [host, front-end NIC] ToR -> NIC
    fe_tor: np.ndarray = field(default_factory=lambda: _no_ids(0))      # [host] its ToR
    tor_up: np.ndarray = field(default_factory=lambda: _no_ids(0))      # [ToR] ToR -> aggregation switch
    tor_down: np.ndarray = field(default_factory=lambda: _no_ids(0))
    storage_in: np.ndarray = field(default_factory=lambda: _no_ids(0))  # [storage node] switch -> node
    storage_out: np.ndarray = field(default_factory=lambda: _no_ids(0))
    spine_to_store: np.ndarray = field(default_factory=lambda: _no_ids(0))  # [pod * spines + spine] back-end
    store_to_spine: np.ndarray = field(default_factory=lambda: _no_ids(0))


@dataclass(frozen=True)
class FatTreeRoutes:
    """How flows are routed on a built fat-tree: the router's tables, the fabric's sizes (for
    `describe`) and the storage routes."""

    tables: FatTreeTables
    n_gpus: int
    n_leaves: int
    n_spines: int
    n_core: int
    use_spines: bool
    leaf_up_gbps: float
    down_ports: int
    leaf_groups: int
    storage: StorageRoutes

    @property
    def gpus_per_host(self) -> int:
        return self.tables.gpus_per_host

    @property
    def nics_per_gpu(self) -> int:
        return self.tables.nics_per_gpu

    @property
    def pxn(self) -> bool:
        return self.tables.pxn


@dataclass(frozen=True)
class GraphRoutes:
    """How flows are routed on an observed fabric (a general graph, shortest paths with ECMP): the
    router's tables and the names its errors use. The fat-tree sizes `describe` reads are 0."""

    tables: GraphTables
    n_gpus: int
    gpus_per_host: int
    nics_per_gpu: int
    node_names: list[str]
    hosts: list[str]
    storage: StorageRoutes = field(default_factory=StorageRoutes)
    use_spines: bool = True
    n_leaves: int = 0
    n_spines: int = 0
    n_core: int = 0
    pxn: bool = False


@dataclass
class Topology:
    """A built topology: tables, simulator resources and routing arrays."""

    spec: TopologySpec
    nodes: pa.Table
    links: pa.Table
    cap: np.ndarray          # bytes/ns per resource
    res_latency: np.ndarray  # ns per resource
    res_cable_ptr: np.ndarray  # CSR: resource -> cable-direction slots (2*cable + dir)
    res_cable_ids: np.ndarray
    res_cable_frac: np.ndarray
    route: FatTreeRoutes | GraphRoutes

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def n_gpus(self) -> int:
        return int(self.route.n_gpus)

    @property
    def n_cables(self) -> int:
        return self.links.num_rows


class _Builder:
    def __init__(self) -> None:
        self.nodes: dict[str, list[Any]] = {"node": [], "kind": [], "host": [], "rank": [], "network": []}
        self.links: dict[str, list[Any]] = {k: [] for k in (
            "link", "src", "dst", "gbps", "latency_ns", "medium", "plane", "tier", "cables", "network")}

    def node(self, name: str, kind: str, host: str | None = None, rank: int | None = None,
             network: str = "backend") -> str:
        for key, value in (("node", name), ("kind", kind), ("host", host), ("rank", rank), ("network", network)):
            self.nodes[key].append(value)
        return name

    def cable(self, src: str, dst: str, gbps: float, latency: int, medium: str, plane: int,
              tier: str, cables: int = 1, network: str = "backend") -> tuple[int, int]:
        """Add a full-duplex cable; return its (src->dst, dst->src) resource ids."""
        i = len(self.links["link"])
        for key, value in (("link", f"{src}--{dst}"), ("src", src), ("dst", dst), ("gbps", gbps),
                           ("latency_ns", latency), ("medium", medium), ("plane", plane),
                           ("tier", tier), ("cables", cables), ("network", network)):
            self.links[key].append(value)
        return 2 * i, 2 * i + 1


def _hosts_per_leaf(spec: TopologySpec) -> int:
    """Hosts under one leaf (one rail's leaf of a rail-optimized fabric)."""
    hosts = spec.hosts or 1
    if spec.kind == "single-switch":
        return hosts
    if spec.kind == "fat-tree":
        return max(1, (spec.leaf_radix // 2) // (spec.gpus * spec.nics_per_gpu))
    return max(1, spec.leaf_radix // 2)


def leaves_per_plane(spec: TopologySpec) -> int:
    """Leaf switches per plane the spec builds (one host when it gives none)."""
    groups = math.ceil((spec.hosts or 1) / _hosts_per_leaf(spec))
    return groups * (spec.gpus * spec.nics_per_gpu if spec.kind == "rail-optimized" else 1)


def build(spec: TopologySpec) -> Topology:
    """Build nodes, links, resources and routing arrays for a spec (which must give hosts)."""
    validate(spec)
    if spec.hosts is None:
        raise TopologyError("hosts", "not given; size the spec from a run first (sized())")
    b = _Builder()
    hosts, g_per_host, k = spec.hosts, spec.gpus, spec.nics_per_gpu
    n_gpus = hosts * g_per_host
    planes = spec.planes
    domain = spec.domain
    n_dom = math.ceil(n_gpus / domain)
    net_medium = "ib"
    rates = hardware.achievable(spec)

    nvl_up = np.full(n_gpus, -1, np.int64)
    nvl_down = np.full(n_gpus, -1, np.int64)
    gpu_names = []
    for g in range(n_gpus):
        h, local = divmod(g, g_per_host)
        gpu_names.append(b.node(f"h{h}/gpu{local}", "gpu", host=f"h{h}", rank=g))
    if domain > 1:
        for d in range(n_dom):
            host = f"h{d * domain // g_per_host}" if domain <= g_per_host else None
            sw = b.node(f"nvl{d}/nvswitch", "nvswitch", host=host)
            for g in range(d * domain, min(n_gpus, (d + 1) * domain)):
                nvl_up[g], nvl_down[g] = b.cable(gpu_names[g], sw, spec.nvlink_gbs * 8,
                                                 spec.nvlink_latency_ns, "nvlink", -1, "nvlink")
    n_nics = n_gpus * k
    pcie_up = np.empty(n_nics, np.int64)
    pcie_down = np.empty(n_nics, np.int64)
    nic_names = []
    for n in range(n_nics):
        g, j = divmod(n, k)
        h, local = divmod(g, g_per_host)
        name = b.node(f"h{h}/nic{local * k + j}", "nic", host=f"h{h}")
        nic_names.append(name)
        pcie_up[n], pcie_down[n] = b.cable(gpu_names[g], name, spec.pcie_gbps, 0, "pcie", -1, "pcie")

    rails = g_per_host * k
    hosts_per_leaf = _hosts_per_leaf(spec)
    leaf_groups = math.ceil(hosts / hosts_per_leaf)
    rail_leaves = spec.kind == "rail-optimized"
    n_leaves_plane = leaves_per_plane(spec)
    n_leaves = n_leaves_plane * planes
    nic_gbps = spec.nic_gbps / planes
    nic_leaf = np.empty((n_nics, planes), np.int64)
    nic_leaf_up = np.empty((n_nics, planes), np.int64)
    leaf_nic_down = np.empty((n_nics, planes), np.int64)
    leaf_names = [b.node(f"p{p}/leaf{i}", "leaf") for p in range(planes) for i in range(n_leaves_plane)]
    for n in range(n_nics):
        g, j = divmod(n, k)
        h, local = divmod(g, g_per_host)
        group = h // hosts_per_leaf
        for p in range(planes):
            leaf = p * n_leaves_plane + (group * rails + local * k + j if rail_leaves else group)
            nic_leaf[n, p] = leaf
            nic_leaf_up[n, p], leaf_nic_down[n, p] = b.cable(
                nic_names[n], leaf_names[leaf], nic_gbps, spec.latency_ns, net_medium, p, "nic-leaf")

    # Spine and core tiers (per plane). Leaf down ports are half the radix; up = down / oversub.
    attached = min(hosts_per_leaf, hosts)
    down_ports = (attached * rails if not rail_leaves else attached) if spec.kind != "single-switch" else 0
    up_ports = down_ports / spec.oversub if down_ports else 0.0
    leaf_up_gbps = up_ports * nic_gbps
    use_spines = spec.tiers >= 2 and n_leaves_plane > 1
    if use_spines:
        pod_leaves = n_leaves_plane if spec.tiers == 2 else max(1, spec.leaf_radix // 2)
        pods_per_plane = math.ceil(n_leaves_plane / pod_leaves)
        spine_down_radix = spec.leaf_radix if spec.tiers == 2 else spec.leaf_radix // 2
        n_sp = max(1, math.ceil(min(pod_leaves, n_leaves_plane) * up_ports / spine_down_radix))
    else:
        pod_leaves, pods_per_plane, n_sp = max(1, n_leaves_plane), 1, 1
    n_pods = pods_per_plane * planes
    leaf_pod = np.array([(i // n_leaves_plane) * pods_per_plane + (i % n_leaves_plane) // pod_leaves
                         for i in range(n_leaves)], np.int64)
    leaf_spine_up = np.full((n_leaves, n_sp), -1, np.int64)
    spine_leaf_down = np.full((n_leaves, n_sp), -1, np.int64)
    n_core = 1
    spine_core_up = np.full((n_pods, n_sp, 1), -1, np.int64)
    core_spine_down = np.full((n_pods, n_sp, 1), -1, np.int64)
    leaf_up_agg = np.full(n_leaves, -1, np.int64)
    leaf_down_agg = np.full(n_leaves, -1, np.int64)
    pod_up_agg = np.full(n_pods, -1, np.int64)
    pod_down_agg = np.full(n_pods, -1, np.int64)
    agg_members: list[list[int]] = []

    def agg(resources: list[int]) -> int:
        agg_members.append(resources)
        return len(agg_members) - 1

    if use_spines:
        bundle_gbps = leaf_up_gbps / n_sp
        bundle_cables = max(1, math.ceil(up_ports / n_sp))
        spine_names = {}
        for pod in range(n_pods):
            p = pod // pods_per_plane
            for s in range(n_sp):
                spine_names[pod, s] = b.node(f"p{p}/pod{pod % pods_per_plane}/spine{s}", "spine")
        for leaf in range(n_leaves):
            pod = int(leaf_pod[leaf])
            p = pod // pods_per_plane
            for s in range(n_sp):
                leaf_spine_up[leaf, s], spine_leaf_down[leaf, s] = b.cable(
                    leaf_names[leaf], spine_names[pod, s], bundle_gbps, spec.latency_ns, net_medium, p,
                    "leaf-spine", bundle_cables)
            leaf_up_agg[leaf] = agg(list(leaf_spine_up[leaf]))
            leaf_down_agg[leaf] = agg(list(spine_leaf_down[leaf]))
        if spec.tiers == 3 and pods_per_plane > 1:
            leaves_in_pod = min(pod_leaves, n_leaves_plane)
            spine_up_gbps = leaves_in_pod * bundle_gbps / spec.core_oversub
            spine_up_ports = spine_up_gbps / nic_gbps
            # as in a k-ary fat-tree, spine s of every pod joins core group s only (one cable per
            # uplink port, a core per port): the cables grow with the pods, not with their square
            per_group = max(1, math.ceil(spine_up_ports))
            n_core = n_sp * per_group
            spine_core_up = np.full((n_pods, n_sp, per_group), -1, np.int64)
            core_spine_down = np.full((n_pods, n_sp, per_group), -1, np.int64)
            cores = {(p, c): b.node(f"p{p}/core{c}", "core") for p in range(planes) for c in range(n_core)}
            for pod in range(n_pods):
                p = pod // pods_per_plane
                for s in range(n_sp):
                    for c in range(per_group):
                        spine_core_up[pod, s, c], core_spine_down[pod, s, c] = b.cable(
                            spine_names[pod, s], cores[p, s * per_group + c], spine_up_gbps / per_group,
                            spec.latency_ns, net_medium, p, "spine-core")
                pod_up_agg[pod] = agg([int(x) for x in spine_core_up[pod].ravel()])
                pod_down_agg[pod] = agg([int(x) for x in core_spine_down[pod].ravel()])

    storage_route = _storage(b, spec, leaf_names=leaf_names, spine_names=spine_names if use_spines else {},
                             pods_per_plane=pods_per_plane, n_sp=n_sp)

    n_cable_res = 2 * len(b.links["link"])
    gbps = np.asarray(b.links["gbps"], np.float64)
    lat = np.asarray(b.links["latency_ns"], np.float64)
    # links keep line rates; the simulated capacity is what NCCL achieves on them (hardware.py)
    achieved = np.array([rates.nvlink_gbs / spec.nvlink_gbs if m == "nvlink" else
                         rates.nic_fraction if m == "ib" and t != "storage" else 1.0
                         for m, t in zip(b.links["medium"], b.links["tier"], strict=True)], np.float64)
    cap = np.repeat(gbps * achieved * GBPS_TO_BYTES_PER_NS, 2)
    res_lat = np.repeat(lat, 2)
    ptr = [0]
    ids: list[int] = []
    frac: list[float] = []
    for r in range(n_cable_res):
        ids.append(r)
        frac.append(1.0)
        ptr.append(len(ids))
    agg_cap, agg_lat = [], []
    for members in agg_members:
        total = float(sum(cap[m] for m in members))
        agg_cap.append(total)
        agg_lat.append(float(res_lat[members[0]]))
        for m in members:
            ids.append(int(m))
            frac.append(float(cap[m] / total))
        ptr.append(len(ids))
    for arr in (leaf_up_agg, leaf_down_agg, pod_up_agg, pod_down_agg):
        arr[arr >= 0] += n_cable_res
    cap = np.concatenate([cap, np.asarray(agg_cap, np.float64)])
    res_lat = np.concatenate([res_lat, np.asarray(agg_lat, np.float64)])

    nodes = schema.conform("topology_nodes", {
        "node": pa.array(b.nodes["node"], pa.string()),
        "kind": pa.array(b.nodes["kind"], pa.string()),
        "host": pa.array(b.nodes["host"], pa.string()),
        "rank": pa.array(b.nodes["rank"], pa.int32()),
        "network": pa.array(b.nodes["network"], pa.string()),
    })
    links = schema.conform("topology_links", {
        "link": pa.array(b.links["link"], pa.string()),
        "src": pa.array(b.links["src"], pa.string()),
        "dst": pa.array(b.links["dst"], pa.string()),
        "gbps": pa.array(b.links["gbps"], pa.float64()),
        "latency_ns": pa.array(b.links["latency_ns"], pa.int64()),
        "medium": pa.array(b.links["medium"], pa.string()),
        "plane": pa.array(b.links["plane"], pa.int32()),
        "tier": pa.array(b.links["tier"], pa.string()),
        "cables": pa.array(b.links["cables"], pa.int32()),
        "network": pa.array(b.links["network"], pa.string()),
    })
    tables = FatTreeTables(
        gpus_per_host=g_per_host, nics_per_gpu=k, planes=planes, domain=domain, nvl_up=nvl_up, nvl_down=nvl_down,
        pcie_up=pcie_up, pcie_down=pcie_down, nic_leaf=nic_leaf, nic_leaf_up=nic_leaf_up,
        leaf_nic_down=leaf_nic_down, leaf_pod=leaf_pod, leaf_spine_up=leaf_spine_up, spine_leaf_down=spine_leaf_down,
        spine_core_up=spine_core_up, core_spine_down=core_spine_down, leaf_up_agg=leaf_up_agg,
        leaf_down_agg=leaf_down_agg, pod_up_agg=pod_up_agg, pod_down_agg=pod_down_agg,
        spray=spec.routing == "spray", pxn=bool(spec.pxn and spec.kind == "rail-optimized"))
    route = FatTreeRoutes(
        tables=tables, n_gpus=n_gpus, n_leaves=n_leaves, n_spines=n_sp * n_pods if use_spines else 0, n_core=n_core,
        use_spines=use_spines, leaf_up_gbps=leaf_up_gbps, down_ports=down_ports, leaf_groups=leaf_groups,
        storage=storage_route)
    return Topology(spec=spec, nodes=nodes, links=links, cap=cap, res_latency=res_lat,
                    res_cable_ptr=np.asarray(ptr, np.int64), res_cable_ids=np.asarray(ids, np.int64),
                    res_cable_frac=np.asarray(frac, np.float64), route=route)


def _storage(b: _Builder, spec: TopologySpec, *, leaf_names: list[str], spine_names: dict[tuple[int, int], str],
             pods_per_plane: int, n_sp: int) -> StorageRoutes:
    """The front-end network (a front-end NIC per host to ToR switches under one aggregation switch)
    and the storage nodes, on the front-end or on the back-end fabric (a storage leaf wired to every
    spine of plane 0, or to the only leaf when there are no spines). Routing arrays for both."""
    hosts = spec.hosts or 0
    out: dict[str, np.ndarray] = {}
    if spec.frontend_gbps > 0:
        nics = spec.frontend_nics
        per_tor = max(1, (spec.frontend_radix // 2) // nics)
        n_tor = math.ceil(hosts / per_tor)
        tors = [b.node(f"fe/tor{t}", "leaf", network="frontend") for t in range(n_tor)]
        fe_up = np.empty((hosts, nics), np.int64)
        fe_down = np.empty((hosts, nics), np.int64)
        for h in range(hosts):
            for j in range(nics):
                nic = b.node(f"h{h}/fe-nic{j}", "nic", host=f"h{h}", network="frontend")
                fe_up[h, j], fe_down[h, j] = b.cable(nic, tors[h // per_tor], spec.frontend_gbps, spec.latency_ns,
                                                     "eth", -1, "host-tor", network="frontend")
        agg = b.node("fe/agg", "spine", network="frontend")
        tor_up = np.empty(n_tor, np.int64)
        tor_down = np.empty(n_tor, np.int64)
        for t in range(n_tor):
            ports = min(per_tor, hosts - t * per_tor) * nics
            up_ports = max(1, math.ceil(ports / spec.frontend_oversub))
            tor_up[t], tor_down[t] = b.cable(tors[t], agg, ports * spec.frontend_gbps / spec.frontend_oversub,
                                             spec.latency_ns, "eth", -1, "tor-agg", up_ports, network="frontend")
        out.update(fe_up=fe_up, fe_down=fe_down, fe_tor=np.arange(hosts, dtype=np.int64) // per_tor,
                   tor_up=tor_up, tor_down=tor_down)
        if spec.storage and spec.storage_network == "frontend":
            attach = agg
    if spec.storage and spec.storage_network == "backend":
        if spine_names:
            attach = b.node("p0/storage-leaf", "leaf")
            spines = [spine_names[pod, s] for pod in range(pods_per_plane) for s in range(n_sp)]
            to_spine = np.empty(len(spines), np.int64)
            from_spine = np.empty(len(spines), np.int64)
            gbps = spec.storage * spec.storage_gbps / len(spines)
            for i, sp in enumerate(spines):
                to_spine[i], from_spine[i] = b.cable(attach, sp, gbps, spec.latency_ns, "ib", 0, "leaf-spine",
                                                     max(1, math.ceil(spec.storage / len(spines))))
            out.update(spine_to_store=from_spine, store_to_spine=to_spine)
        else:
            attach = leaf_names[0]
    if spec.storage:
        network = spec.storage_network
        medium = "eth" if network == "frontend" else "ib"
        storage_out = np.empty(spec.storage, np.int64)
        storage_in = np.empty(spec.storage, np.int64)
        for i in range(spec.storage):
            node = b.node(f"storage{i}", "storage", network=network)
            storage_out[i], storage_in[i] = b.cable(node, attach, spec.storage_gbps, spec.latency_ns, medium, -1,
                                                    "storage", network=network)
        out.update(storage_out=storage_out, storage_in=storage_in)
    return StorageRoutes(n_storage=spec.storage, storage_on=spec.storage_network,
                         has_frontend=spec.frontend_gbps > 0, **out)


class TierLinks(Result):
    """The links of one tier: how many, their cables, their bandwidth (Gb/s one way) and what they are."""

    links: int
    cables: int
    gbps: float
    medium: str | None
    network: str | None


class FrontendInfo(Result):
    """The front-end (north-south) Ethernet of a spec."""

    gbps_per_nic: float
    nics_per_host: int
    oversub: float


class StorageInfo(Result):
    """The storage nodes of a spec and the network they sit on."""

    nodes: int
    network: str
    gbps: float


class TopologyDescription(Result):
    """What `tracekit topology` shows of a spec: GPUs, switches, links per tier, bisection
    bandwidth and oversubscription per tier, the hardware profile, front end and storage."""

    name: str
    kind: str
    hosts: int | None
    gpus: int
    gpus_per_host: int
    nvlink_domain: int | None
    nics: int
    leaves: int
    spines: int
    cores: int
    planes: int
    links_per_tier: dict[str, TierLinks]
    bisection_gbps: float
    oversubscription: dict[str, float]
    routing: str
    pxn: bool
    sharp: bool
    nvls: bool
    profile: str | None
    frontend: FrontendInfo | None
    storage: StorageInfo | None


def describe(topology: Topology | TopologySpec | str) -> TopologyDescription:
    """Summary: GPUs, links per tier, bisection bandwidth and oversubscription per tier."""
    if not isinstance(topology, Topology):
        spec = parse_spec(topology) if not isinstance(topology, TopologySpec) else topology
        if spec.hosts is None:
            spec = spec.replace(hosts=1)
        topology = build(spec)
    spec, links = topology.spec, topology.links
    tiers = links.column("tier").to_pylist()
    gbps = links.column("gbps").to_numpy()
    cables = links.column("cables").to_numpy()
    media = links.column("medium").to_pylist()
    networks = links.column("network").to_pylist()
    per_tier: dict[str, dict[str, Any]] = {}
    for tier, g, c, medium, network in zip(tiers, gbps, cables, media, networks, strict=False):
        entry = per_tier.setdefault(tier, {"links": 0, "cables": 0, "gbps": 0.0, "medium": medium,
                                           "network": network})
        entry["links"] += 1
        entry["cables"] += int(c)
        entry["gbps"] += float(g)
    r = topology.route
    oversub = {"leaf": spec.oversub if r.use_spines else 1.0}
    if "spine-core" in per_tier:
        oversub["spine"] = spec.core_oversub
    return TopologyDescription(
        name=spec.name,
        kind=spec.kind,
        hosts=spec.hosts,
        gpus=topology.n_gpus,
        gpus_per_host=spec.gpus,
        nvlink_domain=spec.domain,
        nics=topology.n_gpus * spec.nics_per_gpu,
        leaves=r.n_leaves,
        spines=r.n_spines,
        cores=r.n_core if "spine-core" in per_tier else 0,
        planes=spec.planes,
        links_per_tier={t: TierLinks(**per_tier[t]) for t in TIER_NAMES if t in per_tier},
        bisection_gbps=bisection_gbps(topology),
        oversubscription=oversub,
        routing=spec.routing,
        pxn=bool(r.pxn),
        sharp=spec.sharp,
        nvls=spec.nvls,
        profile=hardware.describe_profile(spec),
        frontend=(FrontendInfo(gbps_per_nic=spec.frontend_gbps, nics_per_host=spec.frontend_nics,
                               oversub=spec.frontend_oversub) if spec.frontend_gbps else None),
        storage=(StorageInfo(nodes=spec.storage, network=spec.storage_network, gbps=spec.storage_gbps)
                 if spec.storage else None),
    )


def bisection_gbps(topology: Topology) -> float:
    """Bandwidth (one direction, Gb/s) across a cut halving the hosts: min of the NIC tier and the
    fabric above it (NVLink domains spanning hosts are not counted)."""
    spec, r = topology.spec, topology.route
    hosts = spec.hosts or 1
    if hosts < 2:
        return 0.0
    half_hosts = hosts // 2
    nic_side = half_hosts * spec.gpus * spec.nics_per_gpu * spec.nic_gbps
    if not isinstance(r, FatTreeRoutes) or not r.use_spines or r.leaf_groups < 2:
        return float(nic_side)
    leaf_side = r.n_leaves / 2 * r.leaf_up_gbps
    return float(min(nic_side, leaf_side))


def place(spec: TopologySpec, hosts: list[list[int]]) -> tuple[dict[int, int], Finding | None]:
    """GPU index of every rank, and how the ranks were placed when the spec's hosts differ.

    `hosts`: the run's ranks per host (in host order, local order within). A what-if changes the
    network, not the job's placement: when the run's hosts fit the spec's, every rank keeps its
    host and local index; only hosts too small for the run's get its ranks packed in that order,
    `spec.gpus` per host. NVLink reach follows `nvlink_domain` alone: a domain larger than a host
    joins whole hosts, a smaller one splits them.
    """
    per_run = max((len(h) for h in hosts), default=1)
    notes = []
    if per_run < spec.gpus:
        notes.append(f"ranks keep their {len(hosts)} hosts ({per_run} of {spec.gpus} GPUs per host used)")
    if per_run <= spec.gpus:
        gmap = {r: h * spec.gpus + local for h, ranks in enumerate(hosts) for local, r in enumerate(ranks)}
    else:
        flat = [r for ranks in hosts for r in ranks]
        gmap = {r: i for i, r in enumerate(flat)}
        n_hosts = math.ceil(len(flat) / spec.gpus)
        notes.append(f"{len(flat)} ranks on {len(hosts)} hosts of {per_run} re-placed on {n_hosts} hosts of "
                     f"{spec.gpus} GPUs, packed in host then local order")
    if spec.domain > spec.gpus:
        notes.append(f"NVLink domain of {spec.domain} GPUs joins {spec.domain // spec.gpus} hosts of {spec.gpus}: "
                     "traffic between them rides NVLink")
    elif spec.domain < spec.gpus:
        notes.append(f"NVLink domain of {spec.domain} GPUs splits each host into {spec.gpus // spec.domain} "
                     "domains: traffic between them goes through the NICs")
    if not notes:
        return gmap, None
    return gmap, Finding(kind="placement", text=f"{spec.name}: " + "; ".join(notes) + ".",
                         data={"gpus_per_host": spec.gpus, "nvlink_domain": spec.domain})


def physics_caps(spec: TopologySpec) -> list[Finding]:
    """Caps that bind on a path of the spec, each as a `physics_cap` finding naming the field to set
    (unless the spec string already sets it: then the cap is what the user asked for)."""
    out: list[Finding] = []
    given = {part.split("=", 1)[0].strip() for part in spec.name.partition(":")[2].split(",") if "=" in part}

    def cap(text: str, field_name: str, value: float) -> None:
        if field_name in given:
            text = text.removesuffix(f"; set {field_name}") + f" (as {field_name}={value:g} asks)"
        out.append(Finding(kind="physics_cap", severity="warning", text=text, value=value,
                           data={"field": field_name, "topology": spec.name}))

    if spec.pcie_gbps < spec.nic_gbps:
        cap(f"NIC {spec.nic_gbps:g} Gb/s is capped by PCIe {spec.pcie_gbps:g} Gb/s; set pcie_gbps",
            "pcie_gbps", spec.pcie_gbps)
    nvlink_gbps = spec.nvlink_gbs * 8
    gpu_net = spec.nics_per_gpu * min(spec.nic_gbps, spec.pcie_gbps)
    if spec.domain > 1 and spec.pxn and spec.kind == "rail-optimized" and nvlink_gbps < gpu_net:
        cap(f"PXN relays over NVLink {nvlink_gbps:g} Gb/s per GPU, below the GPU's {gpu_net:g} Gb/s of NICs; "
            "set nvlink_gbs", "nvlink_gbs", nvlink_gbps)
    if spec.kind != "single-switch" and spec.tiers >= 2 and spec.oversub > 1:
        cap(f"leaf uplinks carry 1/{spec.oversub:g} of the NIC bandwidth below them (oversub {spec.oversub:g}:1): "
            "traffic between leaves is capped there; set oversub", "oversub", spec.oversub)
    if spec.kind != "single-switch" and spec.tiers >= 3 and spec.core_oversub > 1:
        cap(f"spine uplinks carry 1/{spec.core_oversub:g} of the leaf uplinks (core_oversub "
            f"{spec.core_oversub:g}:1): traffic between pods is capped there; set core_oversub",
            "core_oversub", spec.core_oversub)
    return out
