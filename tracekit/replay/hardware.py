"""Hardware profiles: what NCCL achieves on each link class, kept apart from line rates.

A topology spec's `nvlink_gbs`, `nic_gbps` and `pcie_gbps` are line rates. NCCL never reaches them:
its topology graph gives NVLink a per-link figure below the line rate (src/graph/topo.h), and public
nccl-tests runs measure NICs at 92-97% of the port rate. A `GpuProfile` holds, per GPU generation, the
line rate, what NCCL achieves over it, whether the system has NVLink SHARP (NVLS), and the NVLS
all-reduce efficiency measured on it; a `NicProfile` the achieved fraction of a NIC port. docs/hardware.md
gives every figure with its source. `achievable(spec)` is the one place the replay turns line rates
into the capacities it simulates.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tracekit.errors import TracekitError


@dataclass(frozen=True)
class GpuProfile:
    """One GPU generation's NVLink and NVLS figures (GB/s per GPU, one direction)."""

    name: str
    generation: str            # NCCL's tuning family: volta, ampere, hopper, blackwell
    nvlink_links: int
    nvlink_line_gbs: float     # the NVLink generation's line rate x links
    nvlink_link_gbs: float     # NCCL's effective figure per link (topo.h)
    nvls: bool                 # NVSwitch with multimem (NVLink SHARP) on the SXM system
    nvls_efficiency: float     # NVLS all-reduce algbw / achievable NVLink, as measured
    pcie_gen: int
    source: str

    @property
    def nvlink_gbs(self) -> float:
        """Achievable NVLink per GPU and direction: NCCL's per-link figure x links."""
        return self.nvlink_links * self.nvlink_link_gbs

    @property
    def nvlink_fraction(self) -> float:
        return self.nvlink_gbs / self.nvlink_line_gbs


@dataclass(frozen=True)
class NicProfile:
    """The fraction of a NIC port's line rate NCCL traffic achieves."""

    min_gbps: float
    fraction: float
    source: str


_NVLS_HOPPER = ("NVLS all-reduce on 8 GPUs: 480 GB/s busbw on H100 (nccl-tests#212, nccl#1374, the DGX H100 "
                "exemplar) and 215 on H800 (nccl#1374) are both 0.74 x achievable NVLink x 2(n-1)/n")
GPUS: dict[str, GpuProfile] = {p.name: p for p in (
    GpuProfile("v100", "volta", 6, 150.0, 20.0, False, 0.0, 3, "NVLink 2: 6 links; NCCL topo.h SM70 20 GB/s per link"),
    GpuProfile("a100", "ampere", 12, 300.0, 20.0, False, 0.0, 4,
               "NVLink 3: 12 links; NCCL topo.h SM80 20 GB/s per link"),
    GpuProfile("h100", "hopper", 18, 450.0, 20.6, True, 0.74, 5,
               "NVLink 4: 18 links; NCCL topo.h SM90 20.6 GB/s per link (370.8, 'effective NVLink bandwidth "
               "of 370GB/s', nccl-tests#212); " + _NVLS_HOPPER),
    GpuProfile("h200", "hopper", 18, 450.0, 20.6, True, 0.74, 5, "as H100 (same NVLink 4 and NVSwitch)"),
    GpuProfile("h800", "hopper", 8, 200.0, 20.6, True, 0.74, 5,
               "NVLink 4 with 8 links; NCCL topo.h SM90 20.6 per link; " + _NVLS_HOPPER),
    GpuProfile("b200", "blackwell", 18, 900.0, 40.1, True, 0.74, 5,
               "NVLink 5: 18 links; NCCL topo.h SM100 40.1 GB/s per link; NVLS efficiency 0.74 is NCCL's "
               "Blackwell figure (tuning.cc): no public B200 NVLS run was read"),
)}
DEFAULT_GPU = "h100"

# By port speed (Gb/s, the largest min_gbps at or below the port wins).
NICS: tuple[NicProfile, ...] = (
    NicProfile(0.0, 0.96, "12 GB/s per 100G NIC (nccl-tests#119)"),
    NicProfile(150.0, 0.96, "24 GB/s per 200G HDR NIC (nccl-tests#119)"),
    NicProfile(300.0, 0.94, "46-48 GB/s per 400G NDR NIC (nccl-tests#290); 400G all-to-all at 92% "
               "(xxrjun 10 x 8 H100)"),
)

# A ring channel whose hop crosses the network moves at most this many GB/s (Simple protocol),
# falling with the ring's node count: least squares of busbw / 16 channels on Together AI's
# published ring all-reduce table (togethercomputer/together-nccl-tests @6fd65d19,
# baselines/flapping-airplanes/2026-05-04 report, "MD1 ring": B200, 8 x NDR 400G per node,
# 2-46 nodes: 344.7 ... 291.4 GB/s). Not NCCL's model: NCCL's tuning counts a full NIC per
# channel pair. With NCCL's default of one queue pair per connection: a cluster that sets
# NCCL_IB_QPS_PER_CONNECTION=2 reaches the NICs (docs/hardware.md section 7), and its user lifts
# the figure with the spec's `ring_channel_gbs`. Held at the last measured node count beyond it;
# not applied to ports faster than the measured 400G (no run was read there).
RING_NET_CHANNEL = (22.27, 0.713)  # (GB/s at 1 node, GB/s lost per doubling of nodes)
RING_NET_CHANNEL_MAX_NODES = 46
RING_NET_CHANNEL_MAX_PORT_GBPS = 400.0
RING_NET_CHANNEL_SOURCE = ("ring channel over the network: 22.27 - 0.713 log2(nodes) GB/s, fitted on Together "
                           "AI's B200 8 x NDR ring all-reduce at 2-46 nodes (docs/hardware.md)")


def ring_net_channel_gbs(n_nodes: int, given: float = 0.0, port_gbps: float = 400.0) -> float:
    """The most one ring channel moves over a network hop (GB/s) in a ring across `n_nodes` hosts:
    `given` (a spec's `ring_channel_gbs`) when set, else the fitted figure for ports up to 400G;
    unlimited on one host."""
    if n_nodes < 2:
        return math.inf
    if given > 0:
        return float(given)
    if port_gbps > RING_NET_CHANNEL_MAX_PORT_GBPS:
        return math.inf
    base, per_doubling = RING_NET_CHANNEL
    return base - per_doubling * math.log2(min(n_nodes, RING_NET_CHANNEL_MAX_NODES))


_DEVICE_PATTERNS = (("gb200", "b200"), ("b200", "b200"), ("h800", "h800"), ("h200", "h200"),
                    ("h100", "h100"), ("a100", "a100"), ("a800", "a100"), ("v100", "v100"))


class HardwareError(TracekitError):
    """An unknown GPU name in a topology spec."""


def gpu_profile(name: str | None) -> GpuProfile:
    """The profile for a GPU name (`h100`, `A100`, `NVIDIA H100 80GB HBM3`, ...); H100 when empty."""
    if not name:
        return GPUS[DEFAULT_GPU]
    found = gpu_from_device(name)
    if found is None:
        raise HardwareError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
    return GPUS[found]


def gpu_from_device(device: str) -> str | None:
    """The profile name a device string names (nccl-tests' 'NVIDIA H100 80GB HBM3'), or None. PCIe
    cards have no NVSwitch (at most a bridged pair): no SXM profile describes them."""
    text = re.sub(r"[^a-z0-9]", "", str(device).lower())
    if "pcie" in text:
        return None
    for pattern, name in _DEVICE_PATTERNS:
        if pattern in text:
            return name
    return None


def nic_profile(port_gbps: float) -> NicProfile:
    """The achieved-fraction profile for a NIC port speed."""
    return [p for p in NICS if port_gbps >= p.min_gbps][-1]


@dataclass(frozen=True)
class Achievable:
    """What a spec's links carry in the replay (GB/s per GPU or NIC, one direction), with the profile."""

    gpu: GpuProfile
    nvlink_gbs: float
    nic_gbs: float          # per NIC port (per plane: divide by planes)
    nic_fraction: float
    nvls_efficiency: float


def achievable(spec) -> Achievable:
    """Capacities the replay simulates for a spec: line rates times the profile's fractions, or the
    spec's own `nvlink_efficiency` / `nic_efficiency` when it gives them."""
    gpu = gpu_profile(getattr(spec, "gpu", "") or None)
    nv_frac = spec.nvlink_efficiency or gpu.nvlink_fraction
    nic_frac = spec.nic_efficiency or nic_profile(spec.nic_gbps).fraction
    return Achievable(gpu=gpu, nvlink_gbs=spec.nvlink_gbs * nv_frac, nic_gbs=spec.nic_gbps / 8.0 * nic_frac,
                      nic_fraction=nic_frac, nvls_efficiency=spec.nvls_efficiency or gpu.nvls_efficiency)


def profile_defaults(gpu: str) -> dict[str, Any]:
    """Spec fields a `gpu=` name sets when the spec does not give them: NVLink line rate, PCIe, NVLS."""
    p = gpu_profile(gpu)
    return {"gpu": p.name, "nvlink_gbs": p.nvlink_line_gbs, "pcie_gbps": {3: 128.0, 4: 256.0, 5: 512.0}[p.pcie_gen],
            "nvls": p.nvls}


def describe_profile(spec) -> str:
    """One line naming the GPU profile a spec runs with, its line rates and what is achieved on them."""
    rates = achievable(spec)
    gpu = rates.gpu
    nvls = f"; NVLS {rates.nvls_efficiency:g} of NVLink" if spec.nvls else ""
    chosen = spec.gpu or f"{gpu.name} (default)"
    return (f"hardware profile {chosen}: NVLink {spec.nvlink_gbs:g} GB/s line, {rates.nvlink_gbs:.1f} achieved; "
            f"NIC {spec.nic_gbps:g} Gb/s line, {rates.nic_fraction:g} achieved{nvls} (docs/hardware.md)")
