"""Schedule what-if (`schedule:NAME[,microbatches=M,chunks=v,sm_share=s]`): rebuild each stage's
order of chunks for another pipeline schedule and compare its step with the traced schedule's.

The traced chunks (`tracekit.analysis.schedule`) give each stage's compute per chunk kind as
traced and the EP/TP communication inside its chunks, which is rescaled per dim to its time in
the baseline replay on the topology; a PP transfer takes its pair's median replayed time. Each
placement's communication is then replayed on the topology in its own order
(`tracekit.whatif.chunk_flows`): jobs that now overlap share links and slow each other. The
model is cut evenly along each schedule's route (an interleaved or V-shape chunk holds its share
of a traced stage's layers; DualPipe's second chunk on a device is the mirrored stage's). Both
the traced schedule and the new one are placed by `tracekit.pipeline.simulate` with these same
costs and replayed, each stage's DP all-reduces issued after the same share of its chunk compute
as traced and replayed with them (`chunk_flows.Tail`), the optimizer after them as traced; the
scenario's step is the baseline replay's step moved by the difference of the two steps so
placed, so rebuilding the traced schedule gives the baseline exactly. An interleaved hop the
trace never made is a traced hop of the same kind moved to its stages.
DualPipe's paired forward and backward overlap one chunk's communication with the other's
compute, the communication taking `sm_share` of the SMs while it runs.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median

import numpy as np
import polars as pl

from tracekit.analysis import breakdown, frame
from tracekit.analysis.schedule import DEFAULT_RATIO, StageCosts, TracedSchedule, read_schedule
from tracekit.pipeline import (
    BACKWARD,
    FORWARD,
    INPUT_GRAD,
    SCHEDULES,
    SPLIT_BACKWARD,
    WEIGHT_GRAD,
    Chunk,
    ChunkCost,
    Plan,
    ScheduleError,
    plan,
)
from tracekit.replay.engine import RoutedFlows, routed_flows
from tracekit.replay.simulate import Flows, route
from tracekit.whatif.chunk_flows import (
    ChunkNetwork,
    CostOf,
    Settled,
    Tail,
    TailCall,
    Template,
    TransferOf,
    settle,
    templates_from,
)
from tracekit.whatif.core import Baseline, PipelineRun, PlacedChunk, ScenarioResult, ScheduleOutcome, WhatIfError

FIELDS = ("microbatches", "chunks", "sm_share")
#: DeepSeek-V3 (arXiv 2412.19437, section 3.2.2): 20 of the H800's 132 SMs run the all-to-alls.
DEFAULT_SM_SHARE = 20 / 132
ASSUMPTIONS = (
    "chunks rebuilt from the traced schedule: compute per chunk kind as traced, the model cut evenly along the new "
    "schedule's route; EP/TP communication inside chunks and PP transfers replayed on the topology in the new order "
    "(flows of the traced step's instances, released where the chunks run, so transfers that now overlap share "
    "links), each at its baseline-replay time times its contention relative to the traced order's; each stage's DP "
    "all-reduces issued after the same share of its chunk compute as traced (the last when its last chunk's compute "
    "ends) and replayed with them, the optimizer and host time after them as traced; other micro-batch counts cut "
    "the same batch (per micro-batch times scale by traced/new)")


@dataclass(frozen=True)
class _Costs:
    """Chunk costs per route position of the traced plan, and transfer times per device pair."""

    traced: TracedSchedule
    traced_plan: Plan
    comm_scale: Mapping[tuple[int, str], float]  # (stage, dim) -> replayed / traced
    transfer_ns: Mapping[tuple[int, int], float]
    default_transfer_ns: float
    network: ChunkNetwork
    tail: Tail
    hop_scale: Mapping[tuple[int, int], float]  # an untraced hop's bytes over its stand-in's (see `_network`)


def parse(rest: str) -> tuple[str, dict[str, str]]:
    """`NAME[,key=value...]` of a schedule scenario."""
    from tracekit.whatif.core import as_int, parse_params

    name, _, options = rest.partition(",")
    name = name.strip()
    if name not in SCHEDULES:
        raise WhatIfError(f"schedule: unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
    params = parse_params("schedule", options, FIELDS)
    for key in ("microbatches", "chunks"):
        if key in params:
            as_int("schedule", key, params[key], minimum=1)
    if "sm_share" in params:
        share = _as_share(params["sm_share"])
        params["sm_share"] = str(share)
    return name, params


def _as_share(text: str) -> float:
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0.0 <= share < 1.0:
        raise WhatIfError(f"schedule: field 'sm_share' expects a share of the SMs in [0, 1), got {text!r}")
    return share


def schedule_whatif(base: Baseline, name: str, *, microbatches: int | None = None, chunks: int | None = None,
                    sm_share: float = DEFAULT_SM_SHARE, scenario: str | None = None) -> ScenarioResult:
    """Replay the run's pipeline under schedule `name` (see the module doc)."""
    text = scenario or f"schedule:{name}"
    traced = read_schedule(base.tables)
    if traced is None:
        raise WhatIfError("schedule: the run has no pipeline (no PP send/recv between stages)")
    if not traced.recognised or traced.microbatches is None:
        raise WhatIfError(f"schedule: the traced schedule is unrecognised, so its chunks cannot be rebuilt; seen "
                          f"{traced.seen[:400]}")
    traced_plan = plan(traced.name, traced.stages, traced.microbatches,
                       2 if traced.name.startswith("dualpipe") else traced.chunks or 1)
    m = microbatches or traced.microbatches
    if chunks is not None and chunks != 1 and name != "interleaved-1f1b":
        raise WhatIfError(f"schedule: field 'chunks' applies to interleaved-1f1b, not {name}")
    v = chunks or ((traced.chunks or 2) if traced.name == name else 2) if name == "interleaved-1f1b" else 1
    try:
        target = plan(name, traced.stages, m, v)
    except ScheduleError as exc:
        raise WhatIfError(f"schedule: {exc}") from None
    if "schedule" not in base.memo:
        base.memo["schedule"] = _costs(base, traced, traced_plan)
    costs: _Costs = base.memo["schedule"]
    key = ("schedule", sm_share if _has_pairs(traced_plan) else None)  # the share acts on paired slots only
    if key not in base.memo:
        base.memo[key] = _run(traced_plan, costs, sm_share)
    settled_before: Settled = base.memo[key]
    settled_after = _run(target, costs, sm_share, settled_before.reference)
    delta = settled_after.step_ns - settled_before.step_ns
    result = base.compare(text, "schedule", base.result)
    result.step_ns = {k: round(v + delta) for k, v in base.result.step_ns.items()}
    was, now = _exposed(settled_before), _exposed(settled_after)
    dims = sorted(set(was) | set(now) | set(base.result.exposed_ns))
    moved = {d: (now.get(d, 0.0) - was.get(d, 0.0)) / traced.stages for d in dims}
    result.exposed_ns = {d: max(round(base.result.exposed_ns.get(d, 0) + moved[d]), 0) for d in dims}
    result.schedule = ScheduleOutcome(baseline=_summary(settled_before), scenario=_summary(settled_after),
                                      sm_share=sm_share, traced_step=traced.step)
    result.details = {"traced_schedule": traced.shape(),
                      "schedule": {"name": name, "stages": traced.stages, "microbatches": m, "chunks": v},
                      "sm_share": sm_share,
                      "replayed_rounds": {"baseline": settled_before.rounds, "scenario": settled_after.rounds},
                      "contention": {"baseline": _spread(settled_before.factors),
                                     "scenario": _spread(settled_after.factors)}}
    result.notes.append(ASSUMPTIONS)
    for label, settled in (("the traced schedule rebuilt", settled_before), (name, settled_after)):
        if not settled.converged:
            result.notes.append(f"{label}: its communication did not settle in {settled.rounds} rounds of placing and "
                                f"replaying (the last round's times are shown)")
    if traced.name not in SPLIT_BACKWARD and name in SPLIT_BACKWARD:
        result.notes.append("the trace does not split the backward: its weight-gradient part is taken as half of "
                            "it (B = 2F, W = B/2, DualPipe's and Megatron-LM's convention)")
    unmeasured = [c.stage for c in traced.costs if not c.measured]
    if unmeasured:
        result.notes.append(f"stage(s) {unmeasured}: forward and backward were not traced apart; their compute "
                            f"is split as B = 2F")
    return result


def _costs(base: Baseline, traced: TracedSchedule, traced_plan: Plan) -> _Costs:
    coll = frame(base.tables["collectives"], "collectives")
    if traced.step is not None and "step" in coll.columns:
        coll = coll.filter(pl.col("step") == traced.step)
    replayed = {(i.group, i.seq): (i.traced_ns, i.replayed_ns) for i in base.result.instances}
    scale: dict[tuple[int, str], float] = {}
    for c in traced.costs:
        mine = coll.filter((pl.col("rank") == c.rank) & pl.col("dim").is_in(["EP", "TP"]))
        for dim in sorted(set(mine.get_column("dim").to_list())):
            pairs = [replayed[k] for k in mine.filter(pl.col("dim") == dim).select("group", "seq").iter_rows()
                     if k in replayed]
            was, now = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
            scale[(c.stage, dim)] = now / was if was > 0 else 1.0
    stage_of = {r: s for s, ranks in enumerate(traced.stage_ranks) for r in ranks}
    times: dict[tuple[int, int], list[float]] = {}
    pp = coll.filter((pl.col("dim") == "PP") & (pl.col("op") == "send") & pl.col("peer").is_not_null())
    for rank, peer, group, seq in pp.select("rank", "peer", "group", "seq").iter_rows():
        if rank in stage_of and peer in stage_of and (group, seq) in replayed:
            times.setdefault((stage_of[rank], stage_of[peer]), []).append(float(replayed[(group, seq)][1]))
    transfer = {k: median(v) for k, v in times.items()}
    everything = [t for v in times.values() for t in v]
    network = _network(base, traced, stage_of)
    sent: dict[tuple[int, int], list[float]] = {}
    for rank, peer, nbytes in pp.select("rank", "peer", "in_bytes").iter_rows():
        if rank in stage_of and peer in stage_of and nbytes is not None:
            sent.setdefault((stage_of[rank], stage_of[peer]), []).append(float(nbytes))
    hop_scale = {}
    for (_, a, b), twin in network.stands_for.items():
        mine = [x for (s, _), v in sent.items() if s == a for x in v]
        theirs = sent.get(twin[1:], [])
        hop_scale[(a, b)] = median(mine) / median(theirs) if mine and theirs and median(theirs) > 0 else 1.0
    return _Costs(traced, traced_plan, scale, transfer, median(everything) if everything else 0.0,
                  network, _tail(base, traced, coll, replayed), hop_scale)


def _tail(base: Baseline, traced: TracedSchedule, coll: pl.DataFrame,
          replayed: Mapping[tuple[str, int], tuple[int, int]]) -> Tail:
    """Per stage, from its traced rank's step: each DP call (by its order in its group's step)
    with the share of the stage's chunk compute done when it was issued and the delay after it,
    at its baseline-replay time; and the time from the later of the pipeline's end (its last
    chunk's compute and EP/TP/PP calls) and the last DP call's end to the rank's last GPU work."""
    ranks = [c.rank for c in traced.costs]
    ev = frame(base.tables.get("events"), "events").filter(pl.col("rank").is_in(ranks))
    if traced.step is not None and "step" in ev.columns:
        ev = ev.filter(pl.col("step") == traced.step)
    ev = ev.filter(pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null())
    compute = breakdown.compute_intervals(ev, breakdown.comm_intervals(ev, coll))
    dp_calls = coll.filter(pl.col("dim") == "DP").select(pl.col("group").cast(pl.Utf8), "rank").unique()
    members: dict[str, list[int]] = {}
    for group, rank in dp_calls.iter_rows():
        members.setdefault(group, []).append(int(rank))
    calls_out: list[tuple[TailCall, ...]] = []
    after: list[float] = []
    for d, rank in enumerate(ranks):
        mine = coll.filter((pl.col("rank") == rank) & pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null())
        gpu = ev.filter((pl.col("rank") == rank) & pl.col("kind").is_in(["compute", "comm"]))
        intervals = _merged(compute.filter(pl.col("rank") == rank).select("s", "e").sort("s").rows())
        dp = mine.filter(pl.col("dim") == "DP").sort("ts_ns")
        chunk_calls = mine.filter(pl.col("dim").is_in(["EP", "TP", "PP"]))
        pipeline_end = float(chunk_calls.select((pl.col("ts_ns") + pl.col("dur_ns")).max()).item() or 0)
        if dp.height:
            last_issue = float(dp.get_column("ts_ns").max())
            pipeline_end = max([pipeline_end] + [e for s, e in intervals if s < last_issue])
        total = _done_by(intervals, pipeline_end)
        order: dict[str, list[int]] = {}
        for group, seq in dp.select("group", "seq").iter_rows():
            order.setdefault(str(group), []).append(int(seq))
        calls = []
        dp_end = 0.0
        for group, seq, ts, dur in dp.select("group", "seq", "ts_ns", "dur_ns").iter_rows():
            done = min(_done_by(intervals, float(ts)), total)
            share = done / total if total > 0 else 1.0
            delay = float(ts) - _reached(intervals, done)
            nominal = float(replayed.get((str(group), int(seq)), (0, dur))[1])
            within = set(members.get(str(group), ())) <= set(traced.stage_ranks[d])
            cls = ("DP", d, sorted(order[str(group)]).index(int(seq))) if within else ("DP", str(group), int(seq))
            calls.append(TailCall(cls, share, delay, nominal))  # a DP call across stages: no flows, its replayed time
            dp_end = max(dp_end, float(ts + dur))
        gpu_end = float(gpu.select((pl.col("ts_ns") + pl.col("dur_ns")).max()).item() or 0) if gpu.height else 0.0
        calls_out.append(tuple(calls))
        after.append(max(gpu_end - max(pipeline_end, dp_end), 0.0))
    return Tail(tuple(calls_out), tuple(after))


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in intervals:
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], float(e)))
        else:
            out.append((float(s), float(e)))
    return out


def _done_by(intervals: list[tuple[float, float]], t: float) -> float:
    """Compute done before `t` (merged intervals)."""
    return sum(max(min(e, t) - s, 0.0) for s, e in intervals)


def _reached(intervals: list[tuple[float, float]], amount: float) -> float:
    """The first time `amount` of compute is done (merged intervals)."""
    done = 0.0
    for s, e in intervals:
        if done + (e - s) >= amount:
            return s + (amount - done)
        done += e - s
    return intervals[-1][1] if intervals else 0.0


def _network(base: Baseline, traced: TracedSchedule, stage_of: Mapping[int, int]) -> ChunkNetwork:
    """The traced step's flows on the baseline topology, by class: (dim, stage) for the EP/TP
    communication of a stage's ranks, ("DP", stage, i) for the i-th DP call of the step in each
    of the stage's DP groups, ("PP", a, b) for the PP sends from stage a to b; each with
    the baseline-replay time of its instances on the stage's traced rank (what the chunk costs
    are made of)."""
    routed = routed_flows(base.tables, base.topology, algo=base.options.get("algo", "auto"),
                          placement=dict(base.placement.slots))
    if [(i.group, i.seq) for i in routed.instances] != [(i.group, i.seq) for i in base.result.instances]:
        raise WhatIfError("schedule: the baseline replay's collective instances are not the run's as decomposed "
                          "again (was the baseline made from other tables?)")
    replayed = [float(i.replayed_ns) for i in base.result.instances]
    chain = [c.rank for c in traced.costs]
    members: dict[tuple, list[int]] = {}
    nominal: dict[tuple, float] = {}
    seqs: dict[str, list[int]] = {}
    for inst in routed.instances:
        if inst.dim == "DP" and (traced.step is None or inst.step == traced.step):
            seqs.setdefault(inst.group, []).append(inst.seq)
    dp_order = {(g, q): i for g, qs in seqs.items() for i, q in enumerate(sorted(qs))}
    for k, inst in enumerate(routed.instances):
        if traced.step is not None and inst.step != traced.step:
            continue
        if inst.dim == "PP" and inst.src is not None and inst.dst is not None:
            a, b = stage_of.get(inst.src), stage_of.get(inst.dst)
            if a is None or b is None or a == b:
                continue
            cls: tuple = ("PP", a, b)
            mine = inst.src == chain[a] and inst.dst == chain[b]
        elif inst.dim in ("EP", "TP", "DP"):
            stages = {stage_of.get(r) for r in inst.ranks}
            if len(stages) != 1 or None in stages:
                continue
            d = stages.pop()
            cls = ("DP", d, dp_order[(inst.group, inst.seq)]) if inst.dim == "DP" else (inst.dim, d)
            mine = chain[d] in inst.ranks
        else:
            continue
        members.setdefault(cls, []).append(k)
        if mine:
            nominal[cls] = nominal.get(cls, 0.0) + replayed[k]
    classes = {cls: (ks, nominal.get(cls, 0.0)) for cls, ks in members.items()}
    templates = templates_from(routed, classes)
    stands_for: dict[Hashable, Hashable] = {}
    host = base.placement.host_of
    for a, b in _untraced_hops(traced.stages, templates):
        crossing = host(chain[a]) != host(chain[b])
        like = sorted(k for k in templates if k[0] == "PP" and (host(chain[k[1]]) != host(chain[k[2]])) == crossing)
        if not like:
            continue
        twin = next((k for k in like if k[1] == a), like[0])
        template = _rerouted(routed, members[twin], traced.stage_ranks, (a, b), templates[twin].nominal_ns)
        if template is not None:
            templates[("PP", a, b)] = template
            stands_for[("PP", a, b)] = twin
    return ChunkNetwork(routed.topology, templates, stands_for)


def _untraced_hops(stages: int, templates: Mapping[Hashable, object]) -> list[tuple[int, int]]:
    """Interleaved 1F1B's hops between the last stage and the first when the trace never made
    them (more than 2 stages)."""
    if stages <= 2:
        return []
    return [(a, b) for a, b in ((stages - 1, 0), (0, stages - 1)) if ("PP", a, b) not in templates]


def _rerouted(routed: RoutedFlows, instances: Sequence[int], stage_ranks: Sequence[Sequence[int]],
              now: tuple[int, int], nominal_ns: float) -> Template | None:
    """The flows of a traced hop's instances, each moved to the ranks of stages `now` at its
    sender's and receiver's places in their stages, routed on the topology (bytes and flows as
    traced: a hop of the same kind, within a host or across hosts)."""
    where = {r: i for ranks in stage_ranks for i, r in enumerate(ranks)}

    def moved(rank: int, stage: int) -> int:
        return stage_ranks[stage][where[rank] % len(stage_ranks[stage])]

    src, dst, nbytes, lat, cap, channel = [], [], [], [], [], []
    for k in instances:
        inst = routed.instances[k]
        sender, receiver = moved(inst.src, now[0]), moved(inst.dst, now[1])
        if sender not in routed.gpu_of or receiver not in routed.gpu_of:
            continue
        for j, f in enumerate(np.flatnonzero(routed.key == k)):
            src.append(routed.gpu_of[sender])
            dst.append(routed.gpu_of[receiver])
            nbytes.append(float(routed.nbytes[f]))
            lat.append(float(routed.lat_mult[f]))
            cap.append(float(routed.max_gbs[f]))
            channel.append(j)
    if not src or nominal_ns <= 0:
        return None
    flows = Flows.from_lists(src, dst, nbytes, lat_mult=lat, channel=channel, max_gbs=cap)
    indptr, ids = route(routed.topology, flows)
    return Template(indptr.astype(np.int64), ids.astype(np.int64), np.asarray(nbytes), np.asarray(lat),
                    np.asarray(cap), nominal_ns)


def _cost_functions(p: Plan, costs: _Costs) -> tuple[CostOf, TransferOf]:
    """Chunk and transfer costs of `p` at their baseline-replay times; with other micro-batch
    counts than traced, the same batch is cut into them, so a micro-batch's compute,
    communication and transfers scale by traced / new count."""
    per_position = _position_costs(costs)
    n_traced = len(per_position)
    size = costs.traced_plan.microbatches / p.microbatches

    def cost(device: int, chunk: Chunk) -> ChunkCost:
        route = p.routes[chunk.mb]
        pos = p.position(device, chunk)
        lo, hi = pos / len(route), (pos + 1) / len(route)
        compute = 0.0
        comm: dict[str, float] = {}
        for j in range(n_traced):
            share = max(0.0, min(hi, (j + 1) / n_traced) - max(lo, j / n_traced)) * n_traced
            if share <= 0:
                continue
            c_compute, c_comm = _kind_cost(per_position[j], chunk.kind)
            compute += share * c_compute
            for dim, t in c_comm.items():
                comm[dim] = comm.get(dim, 0.0) + share * t
        return ChunkCost(compute * size, {dim: t * size for dim, t in comm.items()})

    def transfer(a: int, b: int, chunk: Chunk) -> float:
        if (a, b) in costs.transfer_ns:
            return costs.transfer_ns[(a, b)] * size
        twin = costs.network.stands_for.get(("PP", a, b))
        if twin is None:
            return costs.default_transfer_ns * size
        return costs.transfer_ns.get(twin[1:], costs.default_transfer_ns) * costs.hop_scale.get((a, b), 1.0) * size

    return cost, transfer


def _has_pairs(p: Plan) -> bool:
    """Whether `p` pairs a forward and a backward chunk in one slot (DualPipe), the only slots on
    which the SM share acts: a plan without pairs is placed and replayed alike at every share."""
    return any(slot.paired for slots in p.slots for slot in slots)


def _run(p: Plan, costs: _Costs, sm_share: float, reference: Mapping[Hashable, float] | None = None) -> Settled:
    """`p` placed in time with its communication replayed on the topology (`chunk_flows.settle`)."""
    cost, transfer = _cost_functions(p, costs)
    return settle(p, cost, transfer, costs.network, sm_share=sm_share, reference=reference, tail=costs.tail)


def _position_costs(costs: _Costs) -> list[tuple[StageCosts, Mapping[str, float]]]:
    """Per route position of the traced plan: its device's chunk costs and the replayed/traced
    scale of each dim's communication there."""
    out = []
    for device, _ in costs.traced_plan.routes[0]:
        c = costs.traced.costs[device]
        dims = {dim for per_kind in c.comm_ns.values() for dim in per_kind}
        out.append((c, {dim: costs.comm_scale.get((device, dim), 1.0) for dim in dims}))
    return out


def _kind_cost(entry: tuple[StageCosts, Mapping[str, float]], kind: str) -> tuple[float, dict[str, float]]:
    """A chunk kind's compute and comm at one traced position, converting between a split and a full backward."""
    c, scale = entry
    have = c.compute_ns

    def comm_of(k: str) -> dict[str, float]:
        return {d: t * scale.get(d, 1.0) for d, t in c.comm_ns.get(k, {}).items()}

    if kind in have:
        comm = comm_of(kind)
        return have[kind], comm
    if kind == BACKWARD:  # a full backward from a split one
        return have.get(INPUT_GRAD, 0.0) + have.get(WEIGHT_GRAD, 0.0), comm_of(INPUT_GRAD)
    full = have.get(BACKWARD, 0.0)
    w = full * DEFAULT_RATIO[WEIGHT_GRAD] / DEFAULT_RATIO[BACKWARD]
    if kind == WEIGHT_GRAD:
        return w, {}
    if kind == INPUT_GRAD:
        return full - w, comm_of(BACKWARD)
    return have.get(FORWARD, 0.0), comm_of(FORWARD)


def _spread(factors: Mapping[Hashable, float]) -> dict[str, float]:
    """The smallest and largest contention factor of a placement's communication (1: as in the traced order)."""
    values = list(factors.values()) or [1.0]
    return {"min": round(min(values), 4), "max": round(max(values), 4)}


def _exposed(settled: Settled) -> dict[str, float]:
    """Exposed communication per dim summed over stages: the pipeline's, and DP past the last chunks."""
    out = dict(settled.simulation.exposed_ns)
    if settled.dp_exposed_ns:
        out["DP"] = out.get("DP", 0.0) + sum(settled.dp_exposed_ns)
    return out


def _summary(settled: Settled) -> PipelineRun:
    sim = settled.simulation
    placed = []
    for x in sim.placed:
        label = "+".join(f"{c.kind}{c.mb}" for c in x.chunks)
        kind = "FB" if len(x.chunks) == 2 else x.chunks[0].kind
        placed.append(PlacedChunk(stage=x.device, chunks=label, kind=kind, start_ns=x.start_ns, end_ns=x.end_ns,
                                  exposed_ns=float(sum(x.exposed_ns.values()))))
    p = sim.plan
    return PipelineRun(name=p.name, stages=p.stages, microbatches=p.microbatches,
                       chunks=p.chunks if p.name == "interleaved-1f1b" else 1, span_ns=sim.span_ns,
                       bubble_ns=sim.bubble_ns, exposed_ns=dict(sim.exposed_ns), placed=tuple(placed),
                       step_ns=settled.step_ns, dp_exposed_ns=settled.dp_exposed_ns)
