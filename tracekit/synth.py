"""Synthetic DP x PP x EP (x TP) training runs at any scale, with known injected facts.

The generator lays out ranks Megatron-style (TP innermost, then DP, then PP stage), writes a
per-rank program for each step (GPipe forward and backward over micro-batches, MoE layers with
an all-to-all dispatch and combine, PP send/recv between stages, DP gradient all-reduce in
buckets that overlap the backward pass) and plays it with a small discrete-event loop in which a
collective ends for everyone at `max(arrivals) + duration`. The result is a set of tracekit tables
(instance, dim and the true clock offsets filled) plus a `truth` dict of what was injected:
per-host clock skew, a straggler, and skewed expert routing. Benchmarks and tests use it where
real traces of the needed scale or shape do not exist.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute

from tracekit import __version__, schema
from tracekit.errors import TracekitError
from tracekit.store import Run, SourceSink, write_manifest

NVLINK_GBPS = 150.0  # GB/s per GPU inside a host
NIC_GBPS = 50.0  # GB/s per GPU across hosts (400 Gb/s)
LATENCY_NS = 5_000
DTYPE_BYTES = 2


@dataclass(frozen=True)
class SynthSpec:
    """Shape of a synthetic run. `world = hosts * gpus_per_host = tp * dp * pp`."""

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


@dataclass
class _Instance:
    key: int
    group: str
    op: str
    dim: str
    members: tuple[int, ...]
    bytes_per_rank: dict[int, int]
    dur_ns: int
    name: str
    step: int
    splits: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    peers: dict[int, int] = field(default_factory=dict)
    arrivals: dict[int, int] = field(default_factory=dict)
    end: int | None = None


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
    return {"coords": coords, "groups": groups, "dp_group": dp_group, "ep_group": ep_group,
            "tp_group": tp_group, "pp_pair": pp_pair}


def _transfer_ns(nbytes: float, intra: bool) -> int:
    gbps = NVLINK_GBPS if intra else NIC_GBPS
    return int(nbytes / gbps) + LATENCY_NS


class _Builder:
    """Writes programs (one per rank) and the collective instances they meet."""

    def __init__(self, spec: SynthSpec, layout: dict[str, Any]) -> None:
        self.spec = spec
        self.layout = layout
        self.rng = np.random.default_rng(spec.seed)
        self.programs: list[list[tuple]] = [[] for _ in range(spec.world)]
        self.instances: dict[int, _Instance] = {}
        self.group_members = {g["group"]: tuple(g["ranks"]) for g in layout["groups"]}
        self.ep_traffic: list[dict[str, Any]] = []

    def _intra(self, members: tuple[int, ...]) -> bool:
        return len({m // self.spec.gpus_per_host for m in members}) == 1

    def instance(self, group: str, op: str, dim: str, nbytes: dict[int, int], name: str, step: int,
                 *, dur_ns: int, splits: dict | None = None, peers: dict | None = None,
                 members: tuple[int, ...] | None = None) -> int:
        key = len(self.instances)
        self.instances[key] = _Instance(key, group, op, dim, members or self.group_members[group], nbytes,
                                        dur_ns, name, step, splits or {}, peers or {})
        return key

    def compute(self, rank: int, name: str, dur_ns: int) -> None:
        k = self.spec.kernels_per_block
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
        volume = max(int(send.sum(axis=1).max()), int(send.sum(axis=0).max()))
        dur = _transfer_ns(volume * (n - 1) / n, self._intra(members))
        nbytes = {r: int(send[i].sum()) for i, r in enumerate(members)}
        key = self.instance(group, "all_to_all", "EP", nbytes, "ncclDevKernel_SendRecv", step,
                            dur_ns=dur, splits=splits)
        self.ep_traffic.append({"step": step, "group": group, "tag": tag, "ranks": list(members),
                                "bytes": send.tolist()})
        for r in members:
            self.programs[r].append(("coll", key, True, f"gpu{self.layout['coords'][r]['device']}/stream20"))
        return {r: int(send[:, i].sum()) for i, r in enumerate(members)}

    def build(self) -> None:
        spec, coords = self.spec, self.layout["coords"]
        stages = [[r for r in range(spec.world) if coords[r]["pp"] == s] for s in range(spec.pp)]
        act_bytes = spec.tokens // spec.micro_batches * spec.hidden * DTYPE_BYTES // max(spec.tp, 1)
        for step in range(spec.steps):
            for r in range(spec.world):
                self.programs[r].append(("step_begin", step))
                if r == spec.straggler_rank and step == spec.straggler_step:
                    self.programs[r].append(("gap", spec.straggler_delay_ns))
                else:
                    self.programs[r].append(("gap", int(self.rng.integers(20_000, 200_000))))
            for phase in ("fwd", "bwd"):
                order = range(spec.micro_batches) if phase == "fwd" else reversed(range(spec.micro_batches))
                for mb in order:
                    stage_order = range(spec.pp) if phase == "fwd" else reversed(range(spec.pp))
                    for s in stage_order:
                        src_s = s - 1 if phase == "fwd" else s + 1
                        if 0 <= src_s < spec.pp:
                            for r in stages[s]:
                                self._p2p(stages[src_s][stages[s].index(r)], r, act_bytes, step)
                        self._stage_block(stages[s], step, phase, mb)
            for s in range(spec.pp):
                self._dp_buckets(stages[s], step)
            for r in range(spec.world):
                self.programs[r].append(("wait_async",))
                self.compute(r, "optimizer_step", 400_000)
                self.programs[r].append(("step_end", step))

    def _p2p(self, src: int, dst: int, nbytes: int, step: int) -> None:
        a, b = sorted((src, dst))
        group = self.layout["pp_pair"][(a, b)]
        dur = _transfer_ns(nbytes, self._intra((src, dst)))
        key = self.instance(group, "send", "PP", {src: nbytes, dst: nbytes}, "ncclDevKernel_SendRecv", step,
                            dur_ns=dur, peers={src: dst, dst: src}, members=(src, dst))
        for r in (src, dst):
            self.programs[r].append(("coll", key, True, f"gpu{self.layout['coords'][r]['device']}/stream24"))

    def _stage_block(self, stage_ranks: list[int], step: int, phase: str, mb: int) -> None:
        spec = self.spec
        scale = 1 if phase == "fwd" else 2
        for layer in range(spec.layers_per_stage):
            for r in stage_ranks:
                self.compute(r, f"{phase}_attn_l{layer}", 300_000 * scale)
            if spec.tp > 1:
                for tp_members in {self.layout["tp_group"][r] for r in stage_ranks}:
                    members = self.group_members[tp_members]
                    nbytes = spec.tokens // spec.micro_batches * spec.hidden * DTYPE_BYTES // 4
                    key = self.instance(tp_members, "all_reduce", "TP", dict.fromkeys(members, nbytes),
                                        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", step,
                                        dur_ns=_transfer_ns(2 * nbytes, self._intra(members)))
                    for r in members:
                        self.programs[r].append(("coll", key, True,
                                                 f"gpu{self.layout['coords'][r]['device']}/stream16"))
            ep_groups: dict[str, list[int]] = {}
            for r in stage_ranks:
                if r in self.layout["ep_group"]:
                    ep_groups.setdefault(self.layout["ep_group"][r], []).append(r)
            received: dict[int, int] = {}
            for ranks in ep_groups.values():
                received.update(self.all_to_all(ranks, step, f"{phase}_mb{mb}_l{layer}_dispatch"))
            for r in stage_ranks:
                rows = received.get(r, spec.tokens // spec.micro_batches * spec.hidden * DTYPE_BYTES)
                self.compute(r, f"{phase}_expert_l{layer}", int(200_000 * scale * rows
                                                               / (spec.tokens // spec.micro_batches
                                                                  * spec.hidden * DTYPE_BYTES) + 50_000))
            for ranks in ep_groups.values():
                self.all_to_all(ranks, step, f"{phase}_mb{mb}_l{layer}_combine")

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
            n = len(members)
            keys = []
            for _ in range(spec.dp_buckets):
                dur = _transfer_ns(2 * (n - 1) / n * spec.dp_bucket_bytes, self._intra(tuple(members)))
                keys.append(self.instance(group, "all_reduce", "DP", dict.fromkeys(members, spec.dp_bucket_bytes),
                                          "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", step, dur_ns=dur))
            for r in members:
                backward = self._step_backward_indices(r)
                lane = f"gpu{self.layout['coords'][r]['device']}/stream13"
                for b in reversed(range(spec.dp_buckets)):
                    ready = backward[max(int((b + 1) / spec.dp_buckets * len(backward)) - 1, 0)]
                    self.programs[r].insert(ready + 1, ("coll", keys[b], False, lane))

    def _step_backward_indices(self, rank: int) -> list[int]:
        prog = self.programs[rank]
        begin = max((i for i, op in enumerate(prog) if op[0] == "step_begin"), default=0)
        found = [i for i in range(begin, len(prog)) if prog[i][0] == "compute" and str(prog[i][1]).startswith("bwd")]
        return found or [len(prog) - 1]


def _play(builder: _Builder) -> dict[int, list[tuple]]:
    """Run every rank's program; return per-rank records (kind, lane, name, start, end, key, step)."""
    spec = builder.spec
    world = spec.world
    t = [spec.t0_ns + int(builder.rng.integers(0, 50_000)) for _ in range(world)]
    pc = [0] * world
    step_of = [0] * world
    lane_free: list[dict[str, int]] = [{} for _ in range(world)]
    pending_async: list[dict[str, deque]] = [{} for _ in range(world)]
    unresolved: list[set[int]] = [set() for _ in range(world)]
    waiting: dict[int, int] = {}
    records: dict[int, list[tuple]] = {r: [] for r in range(world)}
    step_marks: dict[int, list[tuple[int, int, int]]] = {r: [] for r in range(world)}
    runnable = deque(range(world))
    queued = [True] * world
    compute_lane = [f"gpu{builder.layout['coords'][r]['device']}/stream7" for r in range(world)]

    def arrive(rank: int, key: int, when: int, lane: str) -> None:
        inst = builder.instances[key]
        inst.arrivals[rank] = max(when, lane_free[rank].get(lane, 0))
        if len(inst.arrivals) == len(inst.members):
            resolve(inst, lane)

    def resolve(inst: _Instance, lane_hint: str) -> None:
        inst.end = max(inst.arrivals.values()) + inst.dur_ns
        for r in inst.members:
            lane = f"gpu{builder.layout['coords'][r]['device']}/{lane_hint.split('/')[1]}"
            records[r].append(("comm", lane, inst.name, inst.arrivals[r], inst.end, inst.key, inst.step))
            lane_free[r][lane] = inst.end
            if waiting.get(r) == inst.key:
                del waiting[r]
                t[r] = max(t[r], inst.end)
                wake(r)
            if inst.key in unresolved[r]:
                unresolved[r].discard(inst.key)
                fifo = pending_async[r].get(lane)
                if fifo:
                    fifo.popleft()
                    if fifo:
                        nxt_key, issued = fifo[0]
                        arrive(r, nxt_key, max(issued, inst.end), lane)
                if waiting.get(r) == -1 and not unresolved[r]:
                    del waiting[r]
                    wake(r)

    def wake(r: int) -> None:
        if not queued[r]:
            queued[r] = True
            runnable.append(r)

    while runnable:
        r = runnable.popleft()
        queued[r] = False
        prog = builder.programs[r]
        while pc[r] < len(prog) and r not in waiting:
            op = prog[pc[r]]
            pc[r] += 1
            kind = op[0]
            if kind == "compute":
                start = max(t[r], lane_free[r].get(compute_lane[r], 0))
                end = start + int(op[2] * builder.rng.uniform(0.95, 1.05))
                records[r].append(("compute", compute_lane[r], op[1], start, end, None, step_of[r]))
                lane_free[r][compute_lane[r]] = end
                t[r] = end
            elif kind == "gap":
                t[r] += op[1]
            elif kind == "step_begin":
                step_of[r] = op[1]
                step_marks[r].append((op[1], t[r], 0))
            elif kind == "step_end":
                s, start, _ = step_marks[r][-1]
                step_marks[r][-1] = (s, start, t[r])
            elif kind == "coll":
                key, blocking, lane = op[1], op[2], op[3]
                if blocking:
                    waiting[r] = key
                    arrive(r, key, t[r], lane)
                else:
                    unresolved[r].add(key)
                    fifo = pending_async[r].setdefault(lane, deque())
                    fifo.append((key, t[r]))
                    if len(fifo) == 1:
                        arrive(r, key, t[r], lane)
            elif kind == "wait_async":
                if unresolved[r]:
                    waiting[r] = -1
                else:
                    t[r] = max([t[r], *lane_free[r].values()])
    if any(pc[r] < len(builder.programs[r]) or r in waiting for r in range(world)):
        raise TracekitError("synth: the generated programs deadlocked (a bug in the generator)")
    for r in range(world):
        for s, start, end in step_marks[r]:
            records[r].append(("annotation", "cpu/thread1", f"ProfilerStep#{s}", start, end, None, s))
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
                                           "correlation", "coll_id", "cat")}
    co: dict[str, list] = {k: [] for k in ("coll_id", "rank", "group", "seq", "op", "dtype", "in_bytes",
                                           "out_bytes", "nranks", "peer", "in_splits", "out_splits", "ts_ns",
                                           "dur_ns", "state", "source", "instance", "dim", "seq_explicit",
                                           "name", "lane", "step")}
    for r in range(spec.world):
        seq_counter: dict[str, int] = {}
        ordinal = 0
        ordered = sorted(records[r], key=lambda x: (x[3], x[4]))
        for corr, (kind, lane, name, start, end, key, step) in enumerate(ordered):
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
                co["lane"].append(lane)
                co["step"].append(step)
            ev["rank"].append(r)
            ev["lane"].append(lane)
            ev["kind"].append(kind)
            ev["name"].append(name)
            ev["ts_ns"].append(own_start)
            ev["dur_ns"].append(end - start)
            ev["step"].append(step)
            ev["correlation"].append(corr)
            ev["coll_id"].append(coll_id)
            ev["cat"].append("kernel" if kind in ("compute", "comm") else "user_annotation")

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
    truth = _truth(spec, layout, builder, offset)
    return tables, truth


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
    return {
        "spec": asdict(spec),
        "clock_offset_ns": {str(r): v for r, v in offset.items()},
        "straggler": None if spec.straggler_rank is None else {
            "rank": spec.straggler_rank, "step": spec.straggler_step, "delay_ns": spec.straggler_delay_ns},
        "ep_hot": hot,
        "groups": [{k: g[k] for k in ("group", "desc", "ranks", "dim")} for g in layout["groups"]],
        "instances": len(builder.instances),
    }


def write_run(tables: dict[str, pa.Table], out: str | Path, *, truth: dict[str, Any] | None = None) -> Run:
    """Write synthetic tables as a run directory (events partitioned by rank)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sink = SourceSink(out, "synth")
    sink.add_events(tables["events"])
    parts = sink.close()
    from tracekit.ingest import SourceReport

    events = tables["events"]
    ts = events.column("ts_ns")
    steps = sorted({s for s in events.column("step").to_pylist() if s is not None})
    source = SourceReport(path="synth", format="synth", key="synth", read=events.num_rows, stored=events.num_rows,
                          ranks=sorted(tables["ranks"].column("rank").to_pylist()), events=events.num_rows,
                          collectives=tables["collectives"].num_rows, groups=tables["groups"].num_rows, steps=steps,
                          ts_min_ns=pa.compute.min(ts).as_py(), ts_max_ns=pa.compute.max(ts).as_py())
    write_manifest(out, {
        "tracekit_version": __version__,
        "schema_version": schema.SCHEMA_VERSION,
        "sources": [{**source.to_dict(), "parts": parts}],
        "tables": {name: t.num_rows for name, t in tables.items()},
    })
    run = Run(out)
    for name, table in tables.items():
        if name != "events":
            run.write_table(name, table)
    if truth is not None:
        (out / "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True))
    return run


_KINETO_COLLECTIVE_NAMES = {"all_reduce": "allreduce", "all_to_all": "all_to_allv", "send": "send", "recv": "recv",
                            "all_gather": "_allgather_base", "reduce_scatter": "_reduce_scatter_base"}
_BASE_GRID_NS = 7_889_238_000_000_000


def write_kineto(tables: dict[str, pa.Table], out: str | Path, *, gzip: bool = True) -> list[Path]:
    """Write the run as one PyTorch-profiler (Kineto) Chrome trace per rank, in the 2024+ format.

    Timestamps are float microseconds relative to `baseTimeNanoseconds`; comm kernels carry the
    collective args that Kineto copies from `record_param_comms` (split sizes in rows).
    """
    import gzip as gz

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ranks = tables["ranks"].to_pylist()
    groups = tables["groups"].to_pylist()
    pg_config = [{"pg_name": g["group"], "pg_desc": g["desc"], "backend_config": "cuda:nccl",
                  "pg_size": g["size"], "ranks": g["ranks"]} for g in groups]
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
        rank_events = by_rank.get(r, [])
        base = (min(e["ts_ns"] for e in rank_events) // _BASE_GRID_NS) * _BASE_GRID_NS if rank_events else 0
        trace_events: list[dict[str, Any]] = []
        for e in rank_events:
            ts = round((e["ts_ns"] - base) / 1000, 3)
            dur = round(e["dur_ns"] / 1000, 3)
            if e["kind"] == "annotation":
                trace_events.append({"ph": "X", "cat": "user_annotation", "name": e["name"], "pid": 10_000 + r,
                                     "tid": 1, "ts": ts, "dur": dur, "args": {"External id": e["correlation"]}})
                continue
            stream = int(str(e["lane"]).rsplit("stream", 1)[-1])
            args: dict[str, Any] = {"device": info["local_device"], "stream": stream,
                                    "correlation": e["correlation"], "External id": e["correlation"]}
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
                    "Seq": c["seq"],
                })
                if c["op"] == "send":
                    args["Dst Rank"] = c["peer"]
                elif c["op"] == "recv":
                    args["Src Rank"] = c["peer"]
            trace_events.append({"ph": "X", "cat": "kernel", "name": e["name"], "pid": info["local_device"],
                                 "tid": stream, "ts": ts, "dur": dur, "args": args})
        doc = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": info["local_device"], "name": "NVIDIA H100 80GB HBM3"}],
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": info["world_size"],
                                "pg_count": len(pg_config), "pg_config": pg_config, "nccl_version": "2.27.5"},
            "hostname": info["host"],
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": base,
            "traceEvents": trace_events,
            "traceName": f"rank{r}.pt.trace.json",
        }
        payload = json.dumps(doc).encode()
        path = out / f"rank{r}.pt.trace.json{'.gz' if gzip else ''}"
        path.write_bytes(gz.compress(payload, compresslevel=5, mtime=0) if gzip else payload)
        paths.append(path)
    return paths
