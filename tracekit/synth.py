"""Synthetic DP x PP x EP (x TP) training runs at any scale, with known injected facts.

The generator lays out ranks Megatron-style (TP innermost, then DP, then PP stage), writes a
per-rank program for each step (GPipe forward and backward over micro-batches, MoE layers with
an all-to-all dispatch and combine, PP send/recv between stages, DP gradient all-reduce in
buckets that overlap the backward pass) and plays it with a small time-ordered event loop.

Each rank has a CPU thread and CUDA streams. The CPU launches every kernel (a `cudaLaunchKernel`,
or `cuLaunchKernelEx` for NCCL, sharing the kernel's correlation id) after some framework
overhead and runs ahead of the GPU; a kernel starts when it is launched, its stream is free and
what it consumes is done: compute waits for the blocking collective before it (PyTorch's
`work.wait()`), a collective waits for the compute stream (c10d's stream sync), so a kernel is
often blocked behind its stream predecessor or a communication kernel on another stream. The CPU
waits for the GPU (`cudaEventSynchronize`, a `cuda_sync` Event Sync) before each MoE dispatch
(the token counts) and at the end of the step; the optimizer's stream waits for the last DP
all-reduce through a `cudaEventRecord` / `cudaStreamWaitEvent` pair (a Stream Wait Event).

A collective starts when its last participant arrives and ends for everyone at
`max(arrivals) + duration`. The duration comes from the generator's own contention model, not
from tracekit.replay: each GPU has NVLink egress and ingress (NVLINK_GBS per direction) and one
NIC (NIC_GBS per direction; rail-optimized, one NIC per GPU, no PXN). An instance puts NCCL-like
byte counts on those resources (ring all-reduce: 2(n-1)/n S per GPU, one channel leaving and
entering each host through each member's NIC; all-to-all: each sender's and each receiver's
bytes from the splits, so the hot receiver bounds it; p2p: S on the sender's egress and the
receiver's ingress) and lasts `max over its resources of bytes / (capacity / k) + steps x
step latency`, where `k` counts the instances active on that resource when it starts, itself
included. The share is fixed at the start (an instance never speeds up or slows down later),
where the replay re-solves max-min fair rates among flows at every event: the two models agree
on lone transfers and differ, on purpose, under contention (docs/design-notes.md).

Kernel names are NCCL 2.27's for what is modelled: `ncclDevKernel_AllReduce_Sum_bf16_RING_LL` (the
kernel every algorithm but tree runs in; the model is a ring, so the traced `algo` excludes tree
and replay on a fabric without NVLS or SHARP picks the ring) and `ncclDevKernel_SendRecv`.

The result is a set of tracekit tables (instance, dim and the true clock offsets filled) plus a
`truth` dict of what was injected: per-host clock skew, a straggler, skewed expert routing, and
optionally one degraded NIC.
Benchmarks and tests use it where real traces of the needed scale or shape do not exist.
"""

from __future__ import annotations

import heapq
import json
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute

from tracekit import schema
from tracekit.atomic import atomic_write_bytes, atomic_write_text
from tracekit.errors import TracekitError
from tracekit.manifest import Manifest, SourceRecord
from tracekit.parsers._kineto_calls import kernel_algo
from tracekit.store import Run, RunLock, SourceSink, commit

#: NVLink 4 (H100): 18 links x 25 GB/s, per direction per GPU.
NVLINK_GBS = 450.0
#: what the traces say they ran on (the run directory and the Kineto export alike)
DEVICE_NAME = "NVIDIA H100 80GB HBM3"
#: One 400 Gb/s NIC per GPU, per direction.
NIC_GBS = 50.0
#: Latency of one algorithm step (a ring all-reduce has 2(n-1), an all-to-all or a p2p one).
NET_STEP_NS = 4_000
NVLINK_STEP_NS = 1_000
DTYPE_BYTES = 2

#: CPU costs (uniform ranges, ns): framework time before a compute launch and before a
#: collective (c10d), the launch calls, launch-to-start when the stream is idle (below the
#: replay's 10 us "blocked" threshold), an event record, and a CPU sync's return after the GPU.
CPU_OP_NS = (10_000, 40_000)
CPU_COLL_NS = (30_000, 80_000)
LAUNCH_NS = (4_000, 9_000)
NCCL_LAUNCH_NS = (8_000, 20_000)
QUEUE_NS = (1_000, 4_000)
EVENT_RECORD_NS = (1_000, 5_000)
SYNC_RETURN_NS = (2_000, 6_000)

COMPUTE_STREAM = "stream7"
DP_STREAM = "stream13"
TP_STREAM = "stream16"
EP_STREAM = "stream20"
PP_STREAM = "stream24"

_NIC_TX, _NIC_RX, _NVL_TX, _NVL_RX = range(4)


@dataclass(frozen=True)
class SynthSpec:
    """Shape of a synthetic run. `world = hosts * gpus_per_host = tp * dp * pp`.

    `nic_gbs` / `nvlink_gbs` are GB/s per GPU per direction; `slow_nic_rank` injects a degraded
    NIC (that rank's NIC runs at `nic_gbs / slow_nic_factor` both ways, e.g. a link that trained
    down); `slow_stage` a compute regression (that pipeline stage's forward and backward kernels
    take `slow_stage_factor` times longer); `ring_channels` the ring channels of an all-reduce
    across hosts (default: one per member of the largest host share, so every NIC carries one; fewer
    put a member's NIC under more of them) and, when set, a `channels` table saying so;
    `launch_events=False` leaves the CPU runtime calls and `cuda_sync` records out of the tables
    (the timing is the same); `schedule` the pipeline schedule (`tracekit.pipeline.SCHEDULES`; the
    default GPipe order is the original generator's) with `pp_chunks` model chunks per stage for
    interleaved 1F1B."""

    hosts: int = 2
    gpus_per_host: int = 4
    tp: int = 1
    pp: int = 2
    ep: int = 2
    steps: int = 2
    micro_batches: int = 2
    layers_per_stage: int = 2
    kernels_per_block: int = 3
    hidden: int = 1024
    tokens: int = 2048
    dp_buckets: int = 2
    dp_bucket_bytes: int = 64 << 20
    hot_expert_share: float = 0.7
    straggler_rank: int | None = 1
    straggler_step: int = 1
    straggler_delay_ns: int = 20_000_000
    clock_skew_ns: int = 2_000_000
    seed: int = 0
    t0_ns: int = 1_767_225_600_000_000_000
    nic_gbs: float = NIC_GBS
    nvlink_gbs: float = NVLINK_GBS
    slow_nic_rank: int | None = None
    slow_nic_factor: float = 4.0
    launch_events: bool = True
    slow_stage: int | None = None
    slow_stage_factor: float = 1.5
    ring_channels: int | None = None
    schedule: str = "gpipe"
    pp_chunks: int = 1

    @property
    def world(self) -> int:
        return self.hosts * self.gpus_per_host

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    def validate(self) -> None:
        if self.world % (self.tp * self.pp):
            raise TracekitError(f"synth: world {self.world} is not divisible by tp*pp = {self.tp * self.pp}")
        if self.dp % self.ep:
            raise TracekitError(f"synth: dp {self.dp} is not divisible by ep {self.ep}")
        if self.straggler_rank is not None and not 0 <= self.straggler_rank < self.world:
            raise TracekitError(f"synth: straggler_rank {self.straggler_rank} outside 0..{self.world - 1}")
        if self.nic_gbs <= 0 or self.nvlink_gbs <= 0:
            raise TracekitError("synth: nic_gbs and nvlink_gbs must be positive")
        if self.slow_nic_rank is not None and not 0 <= self.slow_nic_rank < self.world:
            raise TracekitError(f"synth: slow_nic_rank {self.slow_nic_rank} outside 0..{self.world - 1}")
        if self.slow_stage is not None and not 0 <= self.slow_stage < self.pp:
            raise TracekitError(f"synth: slow_stage {self.slow_stage} outside 0..{self.pp - 1}")
        if self.slow_stage_factor <= 0:
            raise TracekitError(f"synth: slow_stage_factor {self.slow_stage_factor} must be positive")
        if self.ring_channels is not None and self.ring_channels < 1:
            raise TracekitError(f"synth: ring_channels {self.ring_channels} must be at least 1")
        if self.slow_nic_factor < 1:
            raise TracekitError(f"synth: slow_nic_factor {self.slow_nic_factor} must be at least 1")
        if self.schedule != "gpipe" or self.pp_chunks != 1:
            from tracekit.pipeline import ScheduleError, plan

            try:
                plan(self.schedule, self.pp, self.micro_batches, self.pp_chunks)
            except ScheduleError as exc:
                raise TracekitError(f"synth: {exc}") from None


@dataclass
class _Instance:
    key: int
    group: str
    op: str
    dim: str
    members: tuple[int, ...]
    bytes_per_rank: dict[int, int]
    name: str
    step: int
    loads: dict[int, float]  # resource -> bytes
    n_steps: int
    crosses_hosts: bool
    splits: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    peers: dict[int, int] = field(default_factory=dict)
    arrivals: dict[int, int] = field(default_factory=dict)
    lanes: dict[int, str] = field(default_factory=dict)
    start: int | None = None
    end: int | None = None
    dur_ns: int = 0
    solo_ns: int = 0


def _layout(spec: SynthSpec) -> dict[str, Any]:
    """Ranks' coordinates and the process groups of each parallel dimension."""
    coords = {}
    for r in range(spec.world):
        tp_i = r % spec.tp
        dp_i = (r // spec.tp) % spec.dp
        pp_i = r // (spec.tp * spec.dp)
        coords[r] = {"tp": tp_i, "dp": dp_i, "pp": pp_i, "ep": dp_i % spec.ep,
                     "host": f"node{r // spec.gpus_per_host:03d}", "device": r % spec.gpus_per_host}
    groups: list[dict[str, Any]] = []

    def add(desc: str, dim: str, ranks: list[int]) -> str:
        name = str(len(groups) + 1)
        groups.append({"group": name, "desc": desc, "ranks": ranks, "dim": dim})
        return name

    dp_group, ep_group, tp_group, pp_pair = {}, {}, {}, {}
    for pp_i in range(spec.pp):
        for tp_i in range(spec.tp):
            members = [pp_i * spec.tp * spec.dp + d * spec.tp + tp_i for d in range(spec.dp)]
            g = add(f"dp_group_pp{pp_i}_tp{tp_i}", "DP", members)
            for r in members:
                dp_group[r] = g
            for e0 in range(0, spec.dp, spec.ep):
                ep_members = members[e0:e0 + spec.ep]
                if len(ep_members) > 1:
                    g = add(f"ep_group_pp{pp_i}_tp{tp_i}_{e0 // spec.ep}", "EP", ep_members)
                    for r in ep_members:
                        ep_group[r] = g
        if spec.tp > 1:
            for d in range(spec.dp):
                members = [pp_i * spec.tp * spec.dp + d * spec.tp + t for t in range(spec.tp)]
                g = add(f"tp_group_pp{pp_i}_dp{d}", "TP", members)
                for r in members:
                    tp_group[r] = g
    for pp_i in range(spec.pp - 1):
        for i in range(spec.tp * spec.dp):
            a = pp_i * spec.tp * spec.dp + i
            b = a + spec.tp * spec.dp
            pp_pair[(a, b)] = add(f"pp_group_{a}_{b}", "PP", [a, b])
    flows: dict[tuple[int, int, str], str] = {}
    if spec.schedule != "gpipe" or spec.pp_chunks != 1:
        for (a, b), g in list(pp_pair.items()):
            flows[(a, b, "F")] = flows[(b, a, "B")] = g
            flows[(b, a, "F")] = add(f"pp_group_{b}_{a}_fwd", "PP", [a, b])
            flows[(a, b, "B")] = add(f"pp_group_{a}_{b}_bwd", "PP", [a, b])
        if spec.schedule == "interleaved-1f1b" and spec.pp > 2:
            for i in range(spec.tp * spec.dp):
                last, first = (spec.pp - 1) * spec.tp * spec.dp + i, i
                flows[(last, first, "F")] = add(f"pp_group_{last}_{first}_fwd", "PP", [first, last])
                flows[(first, last, "B")] = add(f"pp_group_{first}_{last}_bwd", "PP", [first, last])
    return {"coords": coords, "groups": groups, "dp_group": dp_group, "ep_group": ep_group,
            "tp_group": tp_group, "pp_pair": pp_pair, "pp_flow": flows}


class _Links:
    """The generator's network: per-GPU NIC and NVLink resources, each direction apart, and the
    instances active on each. An instance's duration is fixed when it starts (static share)."""

    def __init__(self, spec: SynthSpec) -> None:
        self.gpus_per_host = spec.gpus_per_host
        self.ring_channels = spec.ring_channels
        self.cap = (spec.nic_gbs, spec.nic_gbs, spec.nvlink_gbs, spec.nvlink_gbs)  # bytes/ns
        self.slow = {} if spec.slow_nic_rank is None else {
            4 * spec.slow_nic_rank + k: spec.nic_gbs / spec.slow_nic_factor for k in (_NIC_TX, _NIC_RX)}
        self.active: dict[int, list[int]] = {}  # resource -> ends of the instances active on it

    def host(self, rank: int) -> int:
        return rank // self.gpus_per_host

    def p2p(self, src: int, dst: int, nbytes: float) -> dict[int, float]:
        """S on the sender's egress and the receiver's ingress."""
        if self.host(src) == self.host(dst):
            return {4 * src + _NVL_TX: nbytes, 4 * dst + _NVL_RX: nbytes}
        return {4 * src + _NIC_TX: nbytes, 4 * dst + _NIC_RX: nbytes}

    def all_to_all(self, members: tuple[int, ...], send: np.ndarray) -> dict[int, float]:
        """Each sender's bytes to the other members on its egress, each receiver's on its ingress
        (NVLink within a host, the NIC across hosts), so the hot receiver's ingress bounds it."""
        loads: dict[int, float] = {}
        for i, a in enumerate(members):
            for j, b in enumerate(members):
                if i == j or not send[i, j]:
                    continue
                tx, rx = (_NVL_TX, _NVL_RX) if self.host(a) == self.host(b) else (_NIC_TX, _NIC_RX)
                loads[4 * a + tx] = loads.get(4 * a + tx, 0.0) + float(send[i, j])
                loads[4 * b + rx] = loads.get(4 * b + rx, 0.0) + float(send[i, j])
        return loads

    def ring_all_reduce(self, members: tuple[int, ...], nbytes: float) -> dict[int, float]:
        """2(n-1)/n S per GPU. Across hosts, one channel per member of the largest host share: a
        channel leaves and enters each host through one member's NIC (rail-aligned), so each
        member's NIC carries its channels' share and NVLink the rest."""
        n = len(members)
        if n < 2:
            return {}
        total = 2 * (n - 1) / n * nbytes
        by_host: dict[int, list[int]] = {}
        for m in members:
            by_host.setdefault(self.host(m), []).append(m)
        if len(by_host) == 1:
            return {k: total for m in members for k in (4 * m + _NVL_TX, 4 * m + _NVL_RX)}
        channels = self.ring_channels or max(len(v) for v in by_host.values())
        exits = dict.fromkeys(members, 0)
        for local in by_host.values():
            for c in range(channels):
                exits[local[c % len(local)]] += 1
        loads: dict[int, float] = {}
        for m in members:
            net = total * exits[m] / channels
            loads[4 * m + _NIC_TX] = loads[4 * m + _NIC_RX] = net
            if exits[m] < channels:
                loads[4 * m + _NVL_TX] = loads[4 * m + _NVL_RX] = total - net
        return loads

    def start(self, inst: _Instance, now: int) -> None:
        """Fix the instance's duration from the load on its resources at `now`: on each, its
        bytes at 1/k of the capacity, k = the instances active on it, itself included; the
        slowest resource bounds it. Instances already running keep their durations."""
        busy = solo = 0.0
        for res, nbytes in inst.loads.items():
            ends = [e for e in self.active.get(res, ()) if e > now]
            self.active[res] = ends
            t = nbytes / self.slow.get(res, self.cap[res & 3])
            solo = max(solo, t)
            busy = max(busy, t * (len(ends) + 1))
        latency = inst.n_steps * (NET_STEP_NS if inst.crosses_hosts else NVLINK_STEP_NS)
        inst.start = now
        inst.dur_ns = round(busy) + latency
        inst.solo_ns = round(solo) + latency
        inst.end = now + inst.dur_ns
        for res in inst.loads:
            self.active[res].append(inst.end)


class _Builder:
    """Writes programs (one per rank) and the collective instances they meet."""

    def __init__(self, spec: SynthSpec, layout: dict[str, Any]) -> None:
        self.spec = spec
        self.layout = layout
        self.rng = np.random.default_rng(spec.seed)
        self.links = _Links(spec)
        self.programs: list[list[tuple]] = [[] for _ in range(spec.world)]
        self.instances: dict[int, _Instance] = {}
        self.group_members = {g["group"]: tuple(g["ranks"]) for g in layout["groups"]}
        self.ep_traffic: list[dict[str, Any]] = []

    def _crosses(self, members: tuple[int, ...]) -> bool:
        return len({self.links.host(m) for m in members}) > 1

    def instance(self, group: str, op: str, dim: str, nbytes: dict[int, int], name: str, step: int,
                 *, loads: dict[int, float], n_steps: int, splits: dict | None = None,
                 peers: dict | None = None, members: tuple[int, ...] | None = None) -> int:
        key = len(self.instances)
        members = members or self.group_members[group]
        self.instances[key] = _Instance(key, group, op, dim, members, nbytes, name, step, loads, n_steps,
                                        self._crosses(members), splits or {}, peers or {})
        return key

    def lane(self, rank: int, stream: str) -> str:
        return f"gpu{self.layout['coords'][rank]['device']}/{stream}"

    def compute(self, rank: int, name: str, dur_ns: int) -> None:
        k = self.spec.kernels_per_block
        if self.layout["coords"][rank]["pp"] == self.spec.slow_stage and name.startswith(("fwd", "bwd")):
            dur_ns = int(dur_ns * self.spec.slow_stage_factor)
        base = max(dur_ns // k, 1)
        for i in range(k):
            self.programs[rank].append(("compute", f"{name}_k{i}", base))

    def all_to_all(self, ranks: list[int], step: int, tag: str) -> dict[int, int]:
        spec = self.spec
        members = tuple(ranks)
        group = self.layout["ep_group"][ranks[0]]
        n = len(members)
        probs = np.full(n, (1.0 - spec.hot_expert_share) / max(n - 1, 1))
        probs[0] = spec.hot_expert_share if n > 1 else 1.0
        tokens_per_rank = spec.tokens // spec.micro_batches
        row_bytes = spec.hidden * DTYPE_BYTES
        counts = np.stack([self.rng.multinomial(tokens_per_rank, probs) for _ in members])
        send = counts * row_bytes
        splits = {r: ([int(x) for x in send[i]], [int(x) for x in send[:, i]]) for i, r in enumerate(members)}
        nbytes = {r: int(send[i].sum()) for i, r in enumerate(members)}
        key = self.instance(group, "all_to_all", "EP", nbytes, "ncclDevKernel_SendRecv", step,
                            loads=self.links.all_to_all(members, send), n_steps=1, splits=splits)
        self.ep_traffic.append({"step": step, "group": group, "tag": tag, "ranks": list(members),
                                "bytes": send.tolist()})
        for r in members:
            self.programs[r].append(("coll", key, True, EP_STREAM))
        return {r: int(send[:, i].sum()) for i, r in enumerate(members)}

    def build(self) -> None:
        spec, coords = self.spec, self.layout["coords"]
        stages = [[r for r in range(spec.world) if coords[r]["pp"] == s] for s in range(spec.pp)]
        act_bytes = spec.tokens // spec.micro_batches * spec.hidden * DTYPE_BYTES // max(spec.tp, 1)
        scheduled = spec.schedule != "gpipe" or spec.pp_chunks != 1
        for step in range(spec.steps):
            for r in range(spec.world):
                self.programs[r].append(("step_begin", step))
                if r == spec.straggler_rank and step == spec.straggler_step:
                    self.programs[r].append(("gap", spec.straggler_delay_ns))
                else:
                    self.programs[r].append(("gap", int(self.rng.integers(20_000, 200_000))))
            for phase in () if scheduled else ("fwd", "bwd"):
                order = range(spec.micro_batches) if phase == "fwd" else reversed(range(spec.micro_batches))
                for mb in order:
                    stage_order = range(spec.pp) if phase == "fwd" else reversed(range(spec.pp))
                    for s in stage_order:
                        src_s = s - 1 if phase == "fwd" else s + 1
                        if 0 <= src_s < spec.pp:
                            for r in stages[s]:
                                self._p2p(stages[src_s][stages[s].index(r)], r, act_bytes, step)
                        self._stage_block(stages[s], step, phase, mb)
            if scheduled:
                self._scheduled_step(stages, step, act_bytes)
            for s in range(spec.pp):
                self._dp_buckets(stages[s], step)
            for r in range(spec.world):
                if len(self.group_members[self.layout["dp_group"][r]]) > 1:
                    self.programs[r].append(("wait_stream", DP_STREAM))
                self.compute(r, "optimizer_step", 400_000)
                self.programs[r].append(("host_sync",))
                self.programs[r].append(("step_end", step))

    def _scheduled_step(self, stages: list[list[int]], step: int, act_bytes: int) -> None:
        """One step's chunks in the order `spec.schedule` gives each stage (`tracekit.pipeline`):
        a chunk receives its input from the stage before it on its route (non-blocking sends, one
        stream and one process group per pair, kind and direction, as batched p2p avoids the
        deadlocks of blocking ones), computes (EP and TP inside), and sends its output on."""
        from tracekit.pipeline import INPUT_GRAD, WEIGHT_GRAD, plan

        spec = self.spec
        p = plan(spec.schedule, spec.pp, spec.micro_batches, spec.pp_chunks)
        share = 1.0 / spec.pp_chunks
        made: dict[tuple, int] = {}
        for s in range(spec.pp):
            for slot in p.slots[s]:
                sends = []
                for stage_io in (True, False):
                    for chunk in slot.chunks:
                        if chunk.kind == WEIGHT_GRAD:
                            if not stage_io:
                                self._weight_block(stages[s], step, chunk.mb, share)
                            continue
                        route = p.routes[chunk.mb]
                        pos = p.position(s, chunk)
                        forward = chunk.kind == "F"
                        kind = "F" if forward else "B"
                        src, dst = (pos - 1, pos + 1) if forward else (pos + 1, pos - 1)
                        if stage_io:  # a slot receives every input first (DualPipe's pair posts both)
                            if 0 <= src < len(route) and route[src][0] != s:
                                self._pp_transfer(stages, route[src][0], s, kind, (kind, chunk.mb, src), step,
                                                  act_bytes, made, receiving=True)
                            continue
                        half = 0.5 if chunk.kind == INPUT_GRAD else 1.0
                        self._stage_block(stages[s], step, "fwd" if forward else "bwd", chunk.mb,
                                          share=share * half, tag=f"_c{chunk.chunk}")
                        if 0 <= dst < len(route) and route[dst][0] != s:
                            sends.append((s, route[dst][0], kind, (kind, chunk.mb, pos)))
                for src_s, dst_s, kind, tag in sends:
                    self._pp_transfer(stages, src_s, dst_s, kind, tag, step, act_bytes, made, receiving=False)

    def _pp_transfer(self, stages: list[list[int]], src_s: int, dst_s: int, kind: str, tag: tuple, step: int,
              nbytes: int, made: dict[tuple, int], *, receiving: bool) -> None:
        """One side of a pipeline transfer (the instance is made by whichever side comes first)."""
        for i, (src, dst) in enumerate(zip(stages[src_s], stages[dst_s], strict=True)):
            key = made.get((*tag, i))
            if key is None:
                group = self.layout["pp_flow"][(src, dst, kind)]
                key = self.instance(group, "send", "PP", {src: nbytes, dst: nbytes}, "ncclDevKernel_SendRecv", step,
                                    loads=self.links.p2p(src, dst, nbytes), n_steps=1, peers={src: dst, dst: src},
                                    members=(src, dst))
                made[(*tag, i)] = key
            rank = dst if receiving else src
            stream = f"stream{26 + 4 * (kind == 'B') + 2 * (dst_s < src_s) + receiving}"
            self.programs[rank].append(("coll", key, receiving, stream))

    def _weight_block(self, stage_ranks: list[int], step: int, mb: int, share: float) -> None:
        """A weight-gradient chunk (zero-bubble schedules): the backward's other half, no communication."""
        for layer in range(self.spec.layers_per_stage):
            for r in stage_ranks:
                self.compute(r, f"wgrad_l{layer}", int(250_000 * share))

    def _p2p(self, src: int, dst: int, nbytes: int, step: int) -> None:
        a, b = sorted((src, dst))
        group = self.layout["pp_pair"][(a, b)]
        key = self.instance(group, "send", "PP", {src: nbytes, dst: nbytes}, "ncclDevKernel_SendRecv", step,
                            loads=self.links.p2p(src, dst, nbytes), n_steps=1, peers={src: dst, dst: src},
                            members=(src, dst))
        for r in (src, dst):
            self.programs[r].append(("coll", key, True, PP_STREAM))

    def _stage_block(self, stage_ranks: list[int], step: int, phase: str, mb: int, *, share: float = 1.0,
                     tag: str = "") -> None:
        spec = self.spec
        scale: float = 1 if phase == "fwd" else 2
        if share != 1.0:
            scale *= share
        for layer in range(spec.layers_per_stage):
            for r in stage_ranks:
                self.compute(r, f"{phase}_attn_l{layer}", int(300_000 * scale))
            if spec.tp > 1:
                for tp_members in {self.layout["tp_group"][r] for r in stage_ranks}:
                    members = self.group_members[tp_members]
                    nbytes = spec.tokens // spec.micro_batches * spec.hidden * DTYPE_BYTES // 4
                    key = self.instance(tp_members, "all_reduce", "TP", dict.fromkeys(members, nbytes),
                                        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", step,
                                        loads=self.links.ring_all_reduce(members, nbytes),
                                        n_steps=2 * (len(members) - 1))
                    for r in members:
                        self.programs[r].append(("coll", key, True, TP_STREAM))
            ep_groups: dict[str, list[int]] = {}
            for r in stage_ranks:
                if r in self.layout["ep_group"]:
                    ep_groups.setdefault(self.layout["ep_group"][r], []).append(r)
            received: dict[int, int] = {}
            for ranks in ep_groups.values():
                for r in ranks:
                    self.programs[r].append(("host_sync",))  # the token counts, read on the CPU
                received.update(self.all_to_all(ranks, step, f"{phase}_mb{mb}{tag}_l{layer}_dispatch"))
            for r in stage_ranks:
                rows = received.get(r, spec.tokens // spec.micro_batches * spec.hidden * DTYPE_BYTES)
                self.compute(r, f"{phase}_expert_l{layer}", int(200_000 * scale * rows
                                                               / (spec.tokens // spec.micro_batches
                                                                  * spec.hidden * DTYPE_BYTES) + 50_000))
            for ranks in ep_groups.values():
                self.all_to_all(ranks, step, f"{phase}_mb{mb}{tag}_l{layer}_combine")

    def _dp_buckets(self, stage_ranks: list[int], step: int) -> None:
        """Gradient buckets become ready during the backward pass (as in DDP), so each all-reduce is
        issued after its share of this step's backward compute and overlaps the rest of it."""
        spec = self.spec
        groups: dict[str, list[int]] = {}
        for r in stage_ranks:
            groups.setdefault(self.layout["dp_group"][r], []).append(r)
        for group, members in groups.items():
            if len(members) < 2:
                continue
            keys = []
            for _ in range(spec.dp_buckets):
                keys.append(self.instance(group, "all_reduce", "DP", dict.fromkeys(members, spec.dp_bucket_bytes),
                                          "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", step,
                                          loads=self.links.ring_all_reduce(tuple(members), spec.dp_bucket_bytes),
                                          n_steps=2 * (len(members) - 1)))
            for r in members:
                backward = self._step_backward_indices(r)
                for b in reversed(range(spec.dp_buckets)):
                    ready = backward[max(int((b + 1) / spec.dp_buckets * len(backward)) - 1, 0)]
                    self.programs[r].insert(ready + 1, ("coll", keys[b], False, DP_STREAM))

    def _step_backward_indices(self, rank: int) -> list[int]:
        prog = self.programs[rank]
        begin = max((i for i, op in enumerate(prog) if op[0] == "step_begin"), default=0)
        found = [i for i in range(begin, len(prog)) if prog[i][0] == "compute" and str(prog[i][1]).startswith("bwd")]
        return found or [len(prog) - 1]


class _Draws:
    """Uniform draws of one rank, made in blocks (one generator per rank, so a rank's CPU costs do
    not depend on the order in which the event loop visits ranks)."""

    def __init__(self, seed: int, rank: int) -> None:
        self.rng = np.random.default_rng([seed, 7, rank])
        self.buf: list[float] = []
        self.i = 0

    def uniform(self) -> float:
        if self.i == len(self.buf):
            self.buf = self.rng.random(4096).tolist()
            self.i = 0
        self.i += 1
        return self.buf[self.i - 1]

    def between(self, lo_hi: tuple[int, int]) -> int:
        return int(lo_hi[0] + self.uniform() * (lo_hi[1] - lo_hi[0]))


# record: (kind, lane, name, start, end, key, step, correlation, cat, sync_lane, sync_correlation)
Record = tuple


def _play(builder: _Builder) -> dict[int, list[Record]]:
    """Run every rank's program in time order; return per-rank records (see `Record`).

    Ranks run their programs until they need the end of a collective that has not started; an
    instance starts (its duration fixed by `_Links.start`) when the loop reaches the latest
    arrival, so every instance sees all those started before it.
    """
    spec = builder.spec
    world = spec.world
    draws = [_Draws(spec.seed, r) for r in range(world)]
    start_jitter = [int(builder.rng.integers(0, 50_000)) for _ in range(world)]
    cpu = [spec.t0_ns + start_jitter[r] for r in range(world)]
    corr = [0] * world
    pc = [0] * world
    step_of = [0] * world
    free: list[dict[str, int]] = [{} for _ in range(world)]
    inflight: list[dict[str, int]] = [{} for _ in range(world)]  # lane -> instance not yet started
    queued: list[dict[str, deque]] = [{} for _ in range(world)]  # lane -> (key, ready) behind it
    last_on: list[dict[str, int]] = [{} for _ in range(world)]  # lane -> last instance issued
    waits: list[list[int]] = [[] for _ in range(world)]  # instances the compute stream waits for
    paused_on: dict[int, list[int]] = {}
    records: dict[int, list[Record]] = {r: [] for r in range(world)}
    step_marks: dict[int, list[list[int]]] = {r: [] for r in range(world)}
    cpu_lane = "cpu/thread1"
    compute_lane = [builder.lane(r, COMPUTE_STREAM) for r in range(world)]
    heap: list[tuple[int, int, int, int]] = []  # (time, order, what, who): what 0 = run rank, 1 = start instance
    order = 0
    now = 0

    def push(t: int, what: int, who: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(heap, (t, order, what, who))

    def next_corr(r: int) -> int:
        corr[r] += 1
        return corr[r]

    def runtime(r: int, name: str, cat: str, lo_hi: tuple[int, int], pre: tuple[int, int] | None = None
                ) -> tuple[int, int, int]:
        if pre is not None:
            cpu[r] += draws[r].between(pre)
        c = next_corr(r)
        ts = cpu[r]
        cpu[r] += draws[r].between(lo_hi)
        records[r].append(("runtime", cpu_lane, name, ts, cpu[r], None, step_of[r], c, cat, None, None))
        return c, ts, cpu[r]

    def pending(r: int) -> int | None:
        """An instance the compute stream waits for whose end is not known yet."""
        for k in waits[r]:
            if builder.instances[k].end is None:
                return k
        return None

    def frontier(r: int) -> int:
        """When the compute stream has finished everything issued to it so far."""
        t = free[r].get(compute_lane[r], 0)
        for k in waits[r]:
            t = max(t, builder.instances[k].end)  # type: ignore[arg-type]
        return t

    def arrive(r: int, key: int, when: int, lane: str) -> None:
        if when < now:
            raise TracekitError("synth: an arrival went back in time (a bug in the generator)")
        inst = builder.instances[key]
        inst.arrivals[r] = when
        inst.lanes[r] = lane
        inflight[r][lane] = key
        if len(inst.arrivals) == len(inst.members):
            push(max(inst.arrivals.values()), 1, key)

    def start(key: int) -> None:
        inst = builder.instances[key]
        builder.links.start(inst, now)
        for r in inst.members:
            lane = inst.lanes[r]
            records[r].append(("comm", lane, inst.name, inst.arrivals[r], inst.end, key, inst.step,
                               inst_corr[(r, key)], "kernel", None, None))
            free[r][lane] = inst.end  # type: ignore[assignment]
            if inflight[r].get(lane) == key:
                del inflight[r][lane]
                behind = queued[r].get(lane)
                if behind:
                    nxt, ready = behind.popleft()
                    arrive(r, nxt, max(ready, inst.end), lane)  # type: ignore[type-var]
        for r in paused_on.pop(key, ()):
            push(now, 0, r)

    inst_corr: dict[tuple[int, int], int] = {}

    def run(r: int) -> None:
        prog = builder.programs[r]
        d = draws[r]
        while pc[r] < len(prog):
            op = prog[pc[r]]
            kind = op[0]
            if kind in ("compute", "coll", "host_sync"):
                k = pending(r)
                if k is not None:
                    paused_on.setdefault(k, []).append(r)
                    return
            pc[r] += 1
            if kind == "compute":
                c, _, launched = runtime(r, "cudaLaunchKernel", "cuda_runtime", LAUNCH_NS, CPU_OP_NS)
                begin = max(launched + d.between(QUEUE_NS), frontier(r))
                end = begin + int(op[2] * (0.95 + 0.1 * d.uniform()))
                records[r].append(("compute", compute_lane[r], op[1], begin, end, None, step_of[r], c, "kernel",
                                   None, None))
                free[r][compute_lane[r]] = end
                waits[r].clear()
            elif kind == "coll":
                key, blocking, stream = op[1], op[2], op[3]
                lane = builder.lane(r, stream)
                c, _, launched = runtime(r, "cuLaunchKernelEx", "cuda_driver", NCCL_LAUNCH_NS, CPU_COLL_NS)
                inst_corr[(r, key)] = c
                ready = max(launched + d.between(QUEUE_NS), frontier(r))
                if lane in inflight[r]:
                    queued[r].setdefault(lane, deque()).append((key, ready))
                else:
                    arrive(r, key, max(ready, free[r].get(lane, 0)), lane)
                last_on[r][stream] = key
                if blocking:
                    waits[r].append(key)
            elif kind == "host_sync":
                rec, _, _ = runtime(r, "cudaEventRecord", "cuda_runtime", EVENT_RECORD_NS)
                c = next_corr(r)
                ts = cpu[r]
                done = max(ts + d.between(EVENT_RECORD_NS), frontier(r) + d.between(SYNC_RETURN_NS))
                records[r].append(("runtime", cpu_lane, "cudaEventSynchronize", ts, done, None, step_of[r], c,
                                   "cuda_runtime", None, None))
                records[r].append(("sync", builder.lane(r, "stream-1"), "Event Sync", ts + 1_000,
                                   max(done - 1_000, ts + 1_000), None, step_of[r], c, "cuda_sync",
                                   compute_lane[r], rec))
                cpu[r] = done
            elif kind == "wait_stream":
                stream = op[1]
                target = last_on[r].get(stream)
                if target is None:
                    continue
                rec, _, _ = runtime(r, "cudaEventRecord", "cuda_runtime", EVENT_RECORD_NS, CPU_OP_NS)
                c, ts, _ = runtime(r, "cudaStreamWaitEvent", "cuda_runtime", EVENT_RECORD_NS)
                records[r].append(("sync", compute_lane[r], "Stream Wait Event", ts + 1_000, ts + 3_000, None,
                                   step_of[r], c, "cuda_sync", builder.lane(r, stream), rec))
                waits[r].append(target)
            elif kind == "gap":
                cpu[r] += op[1]
            elif kind == "step_begin":
                step_of[r] = op[1]
                step_marks[r].append([op[1], cpu[r], 0])
            elif kind == "step_end":
                step_marks[r][-1][2] = cpu[r]

    for r in range(world):
        push(0, 0, r)
    while heap:
        now, _, what, who = heapq.heappop(heap)
        if what == 0:
            run(who)
        else:
            start(who)
    if any(pc[r] < len(builder.programs[r]) for r in range(world)) or paused_on:
        raise TracekitError("synth: the generated programs deadlocked (a bug in the generator)")
    for r in range(world):
        for s, begin, end in step_marks[r]:
            records[r].append(("annotation", cpu_lane, f"ProfilerStep#{s}", begin, end, None, s, None,
                               "user_annotation", None, None))
    return records


def make_run_tables(spec: SynthSpec | None = None, **overrides: Any) -> tuple[dict[str, pa.Table], dict[str, Any]]:
    """Build a synthetic run: (tables, truth). Keyword overrides change fields of the spec."""
    spec = spec or SynthSpec()
    if overrides:
        spec = SynthSpec(**{**asdict(spec), **overrides})
    spec.validate()
    layout = _layout(spec)
    builder = _Builder(spec, layout)
    builder.build()
    records = _play(builder)
    rng = np.random.default_rng(spec.seed + 1)
    host_offsets = {h: 0 if h == 0 else int(rng.integers(-spec.clock_skew_ns, spec.clock_skew_ns + 1))
                    for h in range(spec.hosts)}
    offset = {r: host_offsets[r // spec.gpus_per_host] for r in range(spec.world)}

    ev: dict[str, list] = {k: [] for k in ("rank", "lane", "kind", "name", "ts_ns", "dur_ns", "step",
                                           "correlation", "coll_id", "cat", "sync_lane", "sync_correlation")}
    co: dict[str, list] = {k: [] for k in ("coll_id", "rank", "group", "seq", "op", "dtype", "in_bytes",
                                           "out_bytes", "nranks", "peer", "in_splits", "out_splits", "ts_ns",
                                           "dur_ns", "state", "source", "instance", "dim", "seq_explicit",
                                           "name", "lane", "step", "algo")}
    for r in range(spec.world):
        seq_counter: dict[str, int] = {}
        ordinal = 0
        ordered = sorted(records[r], key=lambda x: (x[3], x[4]))
        if not spec.launch_events:
            ordered = [x for x in ordered if x[0] not in ("runtime", "sync")]
        for kind, lane, name, start, end, key, step, corr, cat, sync_lane, sync_corr in ordered:
            own_start = start - offset[r]
            coll_id = None
            if key is not None:
                inst = builder.instances[key]
                coll_id = (r << 32) | ordinal
                ordinal += 1
                seq = seq_counter.get(inst.group, 0)
                seq_counter[inst.group] = seq + 1
                op = inst.op
                peer = inst.peers.get(r)
                if inst.peers:
                    op = "send" if _is_sender(inst, r) else "recv"
                splits = inst.splits.get(r)
                nbytes = inst.bytes_per_rank.get(r, 0)
                co["coll_id"].append(coll_id)
                co["rank"].append(r)
                co["group"].append(inst.group)
                co["seq"].append(seq)
                co["op"].append(op)
                co["dtype"].append("BFloat16")
                co["in_bytes"].append(nbytes)
                co["out_bytes"].append(sum(splits[1]) if splits else nbytes)
                co["nranks"].append(len(inst.members))
                co["peer"].append(peer)
                co["in_splits"].append(splits[0] if splits else None)
                co["out_splits"].append(splits[1] if splits else None)
                co["ts_ns"].append(own_start)
                co["dur_ns"].append(end - start)
                co["state"].append("completed")
                co["source"].append("synth")
                co["instance"].append(key)
                co["dim"].append(inst.dim)
                co["seq_explicit"].append(True)
                co["name"].append(name)
                co["algo"].append(kernel_algo(name))
                co["lane"].append(lane)
                co["step"].append(step)
            ev["rank"].append(r)
            ev["lane"].append(lane)
            ev["kind"].append(kind)
            ev["name"].append(name)
            ev["ts_ns"].append(own_start)
            ev["dur_ns"].append(end - start)
            ev["step"].append(step)
            ev["correlation"].append(corr if spec.launch_events else None)
            ev["coll_id"].append(coll_id)
            ev["cat"].append(cat)
            ev["sync_lane"].append(sync_lane)
            ev["sync_correlation"].append(sync_corr)

    coords = layout["coords"]
    tables = {
        "ranks": schema.conform("ranks", {
            "rank": list(range(spec.world)),
            "world_size": [spec.world] * spec.world,
            "host": [coords[r]["host"] for r in range(spec.world)],
            "pid": [10_000 + r for r in range(spec.world)],
            "local_device": [coords[r]["device"] for r in range(spec.world)],
            "source_file": [f"synth/rank{r}" for r in range(spec.world)],
            "source_format": ["synth"] * spec.world,
            "clock_offset_ns": [offset[r] for r in range(spec.world)],
            "backend": ["nccl"] * spec.world,
            "device_name": [DEVICE_NAME] * spec.world,
        }),
        "groups": schema.conform("groups", {
            "group": [g["group"] for g in layout["groups"]],
            "desc": [g["desc"] for g in layout["groups"]],
            "backend": ["nccl"] * len(layout["groups"]),
            "ranks": [g["ranks"] for g in layout["groups"]],
            "size": [len(g["ranks"]) for g in layout["groups"]],
            "dims": [[g["dim"]] for g in layout["groups"]],
            "ranks_complete": [True] * len(layout["groups"]),
        }),
        "events": schema.conform("events", ev),
        "collectives": schema.conform("collectives", co),
    }
    if spec.ring_channels is not None:
        tables["channels"] = _ring_channels(spec, layout)
    truth = _truth(spec, layout, builder, offset)
    return tables, truth


def _ring_channels(spec: SynthSpec, layout: dict[str, Any]) -> pa.Table:
    """The ring channels of each DP group (as NCCL's Channel lines would give them): channel c
    leaves each host through member c of that host's share (the generator's exits), so each member
    sends to the next one of its ring, over its NIC across hosts and NVLink (P2P) within one."""
    coords = layout["coords"]
    rows: dict[str, list] = {k: [] for k in ("group", "rank", "channel", "pattern", "peer_rank", "direction",
                                             "transport", "detail", "nic")}
    for g in layout["groups"]:
        if g["dim"] != "DP" or len(g["ranks"]) < 2:
            continue
        by_host: dict[str, list[int]] = {}
        for r in g["ranks"]:
            by_host.setdefault(coords[r]["host"], []).append(r)
        for c in range(spec.ring_channels or 1):
            ring: list[int] = []
            for local in by_host.values():
                k = (c % len(local)) + 1
                ring += local[k:] + local[:k]  # the exit, local[c % n], is the host's last
            for i, r in enumerate(ring):
                peer = ring[(i + 1) % len(ring)]
                net = coords[r]["host"] != coords[peer]["host"]
                for key, value in (("group", g["group"]), ("rank", r), ("channel", c), ("pattern", "ring"),
                                   ("peer_rank", peer), ("direction", "send"), ("transport", "NET" if net else "P2P"),
                                   ("detail", "IB/0/GDRDMA" if net else "P2P/CUMEM"),
                                   ("nic", f"mlx5_{coords[r]['device']}" if net else None)):
                    rows[key].append(value)
    return schema.conform("channels", rows)


def _is_sender(inst: _Instance, rank: int) -> bool:
    return inst.members[0] == rank


def _truth(spec: SynthSpec, layout: dict[str, Any], builder: _Builder, offset: dict[int, int]) -> dict[str, Any]:
    hot: dict[str, Any] = {}
    for group in {t["group"] for t in builder.ep_traffic}:
        mats = [np.array(t["bytes"]) for t in builder.ep_traffic if t["group"] == group]
        recv = sum(m.sum(axis=0) for m in mats)
        ranks = next(t["ranks"] for t in builder.ep_traffic if t["group"] == group)
        hot[group] = {"ranks": ranks, "hot_rank": ranks[int(np.argmax(recv))],
                      "hot_share": float(recv.max() / recv.sum())}
    defaults = SynthSpec()
    return {
        "spec": {k: v for k, v in asdict(spec).items()
                 if k not in ("schedule", "pp_chunks") or v != getattr(defaults, k)},
        "clock_offset_ns": {str(r): v for r, v in offset.items()},
        "straggler": None if spec.straggler_rank is None or not 0 <= spec.straggler_step < spec.steps else {
            "rank": spec.straggler_rank, "step": spec.straggler_step, "delay_ns": spec.straggler_delay_ns},
        "ep_hot": hot,
        "groups": [{k: g[k] for k in ("group", "desc", "ranks", "dim")} for g in layout["groups"]],
        "instances": len(builder.instances),
        "ring_channels": spec.ring_channels,
        "slow_stage": None if spec.slow_stage is None else {"stage": spec.slow_stage,
                                                             "factor": spec.slow_stage_factor},
        "slow_nic": None if spec.slow_nic_rank is None else {
            "rank": spec.slow_nic_rank, "host": layout["coords"][spec.slow_nic_rank]["host"],
            "device": layout["coords"][spec.slow_nic_rank]["device"],
            "gbs": spec.nic_gbs / spec.slow_nic_factor, "factor": spec.slow_nic_factor},
        "network": {"nic_gbs": spec.nic_gbs, "nvlink_gbs": spec.nvlink_gbs, "net_step_ns": NET_STEP_NS,
                    "nvlink_step_ns": NVLINK_STEP_NS,
                    "share": "1/k of a resource for k active instances, fixed at the instance start"},
        "contention": _contention(builder),
    }


def _contention(builder: _Builder) -> dict[str, Any]:
    """Per op: how much contention stretched the instances (duration / duration alone)."""
    by_op: dict[str, list[float]] = {}
    for inst in builder.instances.values():
        if inst.solo_ns:
            by_op.setdefault(inst.op, []).append(inst.dur_ns / inst.solo_ns)
    return {op: {"instances": len(v), "slowed": sum(x > 1.001 for x in v),
                 "median_stretch": round(float(np.median(v)), 4), "max_stretch": round(max(v), 4)}
            for op, v in sorted(by_op.items())}


def write_run(tables: dict[str, pa.Table], out: str | Path, *, truth: dict[str, Any] | None = None) -> Run:
    """Write synthetic tables as a run directory (events partitioned by rank)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sink = SourceSink(out, "synth")
    sink.add_events(tables["events"])
    parts = sink.close()
    events = tables["events"]
    ts = events.column("ts_ns")
    steps = sorted({s for s in events.column("step").to_pylist() if s is not None})
    source = SourceRecord(path="synth", format="synth", key="synth", read=events.num_rows, stored=events.num_rows,
                          ranks=sorted(tables["ranks"].column("rank").to_pylist()), events=events.num_rows,
                          collectives=tables["collectives"].num_rows, groups=tables["groups"].num_rows, steps=steps,
                          ts_min_ns=pa.compute.min(ts).as_py(), ts_max_ns=pa.compute.max(ts).as_py(), parts=parts)
    manifest = Manifest.new([source], {name: t.num_rows for name, t in tables.items()})
    with RunLock(out):
        commit(out, {name: schema.conform(name, t) for name, t in tables.items() if name != "events"}, manifest)
    run = Run(out)
    if truth is not None:
        atomic_write_text(out / "truth.json", json.dumps(truth, indent=1, sort_keys=True))
    return run


_KINETO_COLLECTIVE_NAMES = {"all_reduce": "allreduce", "all_to_all": "all_to_allv", "send": "send", "recv": "recv",
                            "all_gather": "_allgather_base", "reduce_scatter": "_reduce_scatter_base"}
_BASE_GRID_NS = 7_889_238_000_000_000
#: CUPTI callback ids of the runtime/driver calls the generator writes.
_CBID = {"cudaLaunchKernel": 211, "cuLaunchKernelEx": 652, "cudaEventRecord": 135, "cudaStreamWaitEvent": 147,
         "cudaEventSynchronize": 137}
#: Calls whose GPU-side record Kineto links with an `ac2g` flow (start on the call, end on the record).
_FLOW_CALLS = frozenset({"cudaLaunchKernel", "cuLaunchKernelEx", "cudaStreamWaitEvent", "cudaEventSynchronize"})


def _flow(ph: str, corr: int, pid: int, tid: int, ts: float) -> dict[str, Any]:
    """Kineto's launch-to-kernel arrow: "s" on the runtime call, "f" (binding "e") on the GPU record."""
    f: dict[str, Any] = {"ph": ph, "id": corr, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g"}
    if ph == "f":
        f["bp"] = "e"
    return f


def _stream_of(lane: str) -> int:
    return int(str(lane).rsplit("stream", 1)[-1])


def write_kineto(tables: dict[str, pa.Table], out: str | Path, *, gzip: bool = True) -> list[Path]:
    """Write the run as one PyTorch-profiler (Kineto) Chrome trace per rank, in the 2024+ format.

    Timestamps are float microseconds relative to `baseTimeNanoseconds`; comm kernels carry the
    collective args that Kineto copies from `record_param_comms` (split sizes in rows). Runtime
    calls (`cuda_runtime` / `cuda_driver`), `cuda_sync` records and the `ac2g` flow events that
    link a launch to its kernel have the shapes Kineto writes (pid = the process on the CPU side,
    the device on the GPU side; tid = the thread, or the stream, -1 for a device-wide sync).
    """
    import gzip as gz

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ranks = tables["ranks"].to_pylist()
    groups = tables["groups"].to_pylist()
    pg_config: dict[int, list[dict[str, Any]]] = {}  # as PyTorch lists them: only the rank's own groups
    for g in groups:
        entry = {"pg_name": g["group"], "pg_desc": g["desc"], "backend_config": "cuda:nccl",
                 "pg_size": g["size"], "ranks": g["ranks"]}
        for member in g["ranks"]:
            pg_config.setdefault(member, []).append(entry)
    group_by_name = {g["group"]: g for g in groups}
    coll_by_id = {c["coll_id"]: c for c in tables["collectives"].to_pylist()}
    events = tables["events"].to_pylist()
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        by_rank.setdefault(e["rank"], []).append(e)
    row_bytes = None
    paths = []
    for info in ranks:
        r = info["rank"]
        device = info["local_device"]
        pid = info["pid"] if info.get("pid") is not None else 10_000 + r
        rank_events = by_rank.get(r, [])
        base = (min(e["ts_ns"] for e in rank_events) // _BASE_GRID_NS) * _BASE_GRID_NS if rank_events else 0
        record_ids: dict[int, int] = {}
        trace_events: list[dict[str, Any]] = []

        for e in rank_events:
            ts = round((e["ts_ns"] - base) / 1000, 3)
            dur = round(e["dur_ns"] / 1000, 3)
            corr = e["correlation"]
            kind = e["kind"]
            if kind == "annotation":
                trace_events.append({"ph": "X", "cat": "user_annotation", "name": e["name"], "pid": pid,
                                     "tid": 1, "ts": ts, "dur": dur, "args": {"Record function id": 0}})
                continue
            if kind == "runtime":
                trace_events.append({"ph": "X", "cat": e["cat"] or "cuda_runtime", "name": e["name"], "pid": pid,
                                     "tid": 1, "ts": ts, "dur": dur,
                                     "args": {"External id": corr, "cbid": _CBID.get(e["name"], 0),
                                              "correlation": corr}})
                if e["name"] in _FLOW_CALLS:
                    trace_events.append(_flow("s", corr, pid, 1, ts))
                continue
            if kind == "sync":
                stream = _stream_of(e["lane"])
                waited = _stream_of(e["sync_lane"])
                rec = e["sync_correlation"]
                event_id = record_ids.setdefault(rec, len(record_ids) + 1)
                trace_events.append({"ph": "X", "cat": "cuda_sync", "name": e["name"], "pid": device, "tid": stream,
                                     "ts": ts, "dur": dur,
                                     "args": {"External id": corr, "cuda_sync_kind": e["name"],
                                              "wait_on_stream": waited, "wait_on_cuda_event_record_corr_id": rec,
                                              "wait_on_cuda_event_id": event_id, "stream": stream,
                                              "correlation": corr, "device": device, "context": 1}})
                trace_events.append(_flow("f", corr, device, stream, ts))
                continue
            stream = _stream_of(e["lane"])
            args: dict[str, Any] = {"External id": corr, "queued": 0, "device": device, "context": 1,
                                    "stream": stream, "correlation": corr}
            if e["coll_id"] is not None:
                c = coll_by_id[e["coll_id"]]
                g = group_by_name[c["group"]]
                elem = 2
                if c["op"] == "all_to_all":
                    rows = sum(c["in_splits"])
                    row_bytes = c["in_bytes"] // max(rows, 1) if rows else row_bytes
                    rb = row_bytes or 1
                    in_split = str([s // rb for s in c["in_splits"]])
                    out_split = str([s // rb for s in c["out_splits"]])
                else:
                    in_split = out_split = "[]"
                args.update({
                    "Collective name": _KINETO_COLLECTIVE_NAMES.get(c["op"], c["op"]),
                    "In msg nelems": c["in_bytes"] // elem, "Out msg nelems": c["out_bytes"] // elem,
                    "Group size": c["nranks"], "dtype": "BFloat16", "In split size": in_split,
                    "Out split size": out_split, "Process Group Name": c["group"],
                    "Process Group Description": g["desc"], "Process Group Ranks": str(g["ranks"]),
                })
                if c["seq_explicit"] is not False:
                    args["Seq"] = c["seq"]
                if c["op"] == "send":
                    args["Dst Rank"] = c["peer"]
                elif c["op"] == "recv":
                    args["Src Rank"] = c["peer"]
            trace_events.append({"ph": "X", "cat": "kernel", "name": e["name"], "pid": device,
                                 "tid": stream, "ts": ts, "dur": dur, "args": args})
            if corr is not None:
                trace_events.append(_flow("f", corr, device, stream, ts))
        doc = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": device, "name": DEVICE_NAME}],
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": info["world_size"],
                                "pg_count": len(pg_config.get(r, [])), "pg_config": pg_config.get(r, []),
                                "nccl_version": "2.27.5"},
            "hostname": info["host"],
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": base,
            "traceEvents": trace_events,
            "traceName": f"rank{r}.pt.trace.json",
        }
        payload = json.dumps(doc).encode()
        path = out / f"rank{r}.pt.trace.json{'.gz' if gzip else ''}"
        atomic_write_bytes(path, gz.compress(payload, compresslevel=5, mtime=0) if gzip else payload)
        paths.append(path)
    return paths
