"""The communication of a rebuilt pipeline schedule replayed on the topology.

Each placed slot's EP/TP communication (per dim) and each PP transfer between devices is a job:
a share of its class's traced flows (the step's flows of that dim on the stage's ranks, or of the
PP sends between the two stages; bytes in proportion to the job's nominal time), released when
the job starts in the placement. All jobs' flows are simulated together on the topology, so jobs
that now overlap share links. A job's time is its nominal time (the baseline replay's) times its
contention factor: simulated time per nominal ns, relative to its class's in the traced schedule
rebuilt (so the traced order keeps, class by class, its baseline-replay communication time).
The step after the pipeline (`Tail`: each stage's DP all-reduces and what follows them) is placed
after the chunks it followed in the trace and replayed with them, so it shares their links.
Placing and simulating alternate until the factors settle (`settle`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tracekit.pipeline import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD, Chunk, ChunkCost, Plan, Simulation, simulate
from tracekit.replay.engine import RoutedFlows
from tracekit.replay.rounds import Rounds
from tracekit.replay.simulate import Flows, connection_weights
from tracekit.replay.simulate import simulate as simulate_flows
from tracekit.replay.topology import Topology

#: Rounds of place-and-simulate before the factors are given up on as unsettled.
MAX_ROUNDS = 40
#: From this round on, a factor that turned back moves half way (a damped fixed point).
DAMP_FROM = 2
#: Factors settled: none moved by more than this (relative).
SETTLE_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Template:
    """One class's traced flows (CSR paths on the topology) and the nominal time they stand for."""

    indptr: np.ndarray
    ids: np.ndarray
    nbytes: np.ndarray
    lat_mult: np.ndarray
    max_gbs: np.ndarray
    nominal_ns: float


@dataclass(frozen=True)
class Job:
    """A communication of the placed schedule: its class's flows scaled to `nominal_ns`, released at `release_ns`."""

    key: Hashable
    cls: Hashable
    release_ns: float
    nominal_ns: float


class ChunkNetwork:
    """Templates per class on one topology; `times(jobs)` simulates jobs together. A class the
    traced order never ran (an interleaved hop between stages the trace did not join) takes its
    contention reference from the traced class it stands in for (`stands_for`)."""

    def __init__(self, topology: Topology, templates: Mapping[Hashable, Template],
                 stands_for: Mapping[Hashable, Hashable] | None = None) -> None:
        self.topology = topology
        self.templates = dict(templates)
        self.stands_for = dict(stands_for or {})

    def times(self, jobs: Sequence[Job]) -> np.ndarray:
        """Per job, from its release to its last flow's finish (ns), all jobs' flows sharing the topology."""
        return self.session(jobs).times(np.array([job.release_ns for job in jobs], np.float64))

    def session(self, jobs: Sequence[Job]) -> JobFlows:
        """The jobs' flows, to be simulated for successive release times (`JobFlows.times`)."""
        return JobFlows(self, jobs)


class JobFlows:
    """The flows of a fixed set of jobs on a `ChunkNetwork`; each call of `times` re-simulates only
    the flows that new release times change (`replay.rounds.Rounds`, exact)."""

    def __init__(self, network: ChunkNetwork, jobs: Sequence[Job]) -> None:
        self.topology = network.topology
        self.keys = [job.key for job in jobs]
        parts = [network.templates[job.cls] for job in jobs]
        self.owner = np.concatenate([np.full(t.nbytes.size, j, np.int64) for j, t in enumerate(parts)] or [
            np.zeros(0, np.int64)])
        lens = np.concatenate([np.diff(t.indptr) for t in parts] or [np.zeros(0, np.int64)])
        self.indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        self.ids = np.concatenate([t.ids for t in parts] or [np.zeros(0, np.int64)]).astype(np.int64)
        self.nbytes = np.concatenate([t.nbytes * (job.nominal_ns / t.nominal_ns) for t, job in zip(
            parts, jobs, strict=True)] or [np.zeros(0)])
        self.lat_mult = np.concatenate([t.lat_mult for t in parts] or [np.zeros(0)])
        self.max_gbs = np.concatenate([t.max_gbs for t in parts] or [np.zeros(0)])
        self.weight = connection_weights(self.topology, self.indptr, self.ids, self.owner)
        self.n_jobs = len(jobs)
        self._rounds: Rounds | None = None

    def times(self, release_ns: np.ndarray) -> np.ndarray:
        """Per job released at `release_ns`, from its release to its last flow's finish (ns)."""
        out = np.zeros(self.n_jobs)
        if not self.owner.size:
            return out
        release = np.asarray(release_ns, np.float64)[self.owner]
        if self._rounds is None:
            flows = Flows.from_lists(np.zeros(self.owner.size), np.zeros(self.owner.size), self.nbytes,
                                     release=release, lat_mult=self.lat_mult, key=self.owner, max_gbs=self.max_gbs)
            finish = simulate_flows(self.topology, self.indptr, self.ids, flows, weight=self.weight).finish
            self._rounds = Rounds(self.topology, self.indptr, self.ids, self.nbytes, self.lat_mult, release, finish,
                                  max_gbs=self.max_gbs, weight=self.weight)
        else:
            finish = self._rounds.step(release)
        np.maximum.at(out, self.owner, finish - release)
        return out


def templates_from(routed: RoutedFlows, classes: Mapping[Hashable, tuple[Sequence[int], float]]) -> dict[
        Hashable, Template]:
    """Templates per class from `classes`: class -> (its instances, indices into `routed.instances`;
    the nominal time they stand for). A class without flows or time is left out."""
    owner_start = np.searchsorted(routed.key, np.arange(len(routed.instances) + 1)) if routed.key.size else None
    ordered = routed.key.size == 0 or bool(np.all(routed.key[1:] >= routed.key[:-1]))
    out: dict[Hashable, Template] = {}
    for cls, (instances, nominal) in classes.items():
        if owner_start is not None and ordered:
            sel = np.concatenate([np.arange(owner_start[k], owner_start[k + 1]) for k in instances] or [[]])
        else:
            sel = np.flatnonzero(np.isin(routed.key, list(instances)))
        sel = sel.astype(np.int64)
        if sel.size == 0 or nominal <= 0:
            continue
        lens = np.diff(routed.indptr)[sel]
        ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        at = np.repeat(routed.indptr[sel] - ptr[:-1], lens) + np.arange(ptr[-1])
        out[cls] = Template(ptr, routed.ids[at], routed.nbytes[sel], routed.lat_mult[sel], routed.max_gbs[sel],
                            float(nominal))
    return out


@dataclass(frozen=True)
class TailCall:
    """A DP call of a stage's step after (or overlapping) its pipeline: issued once the stage has
    done `share` of its chunk compute, `delay_ns` later; its class's flows at `nominal_ns`."""

    cls: Hashable
    share: float
    delay_ns: float
    nominal_ns: float


@dataclass(frozen=True)
class Tail:
    """Per stage, the step outside its pipeline: its DP calls, and the time from the later of its
    pipeline's end and its last DP call's end to the end of its step (`after_ns`: optimizer, host)."""

    calls: tuple[tuple[TailCall, ...], ...]
    after_ns: tuple[float, ...]


@dataclass(frozen=True)
class Settled:
    """A plan placed with its communication replayed: the placement, each job's contention
    factor, the per-class reference (simulated per nominal ns) and how the rounds went; with a
    `Tail`, `step_ns` is when the last stage's step ends (else the pipeline's span), and
    `dp_exposed_ns` per stage the part of its DP calls that runs past its last chunk."""

    simulation: Simulation
    factors: Mapping[Hashable, float]
    reference: Mapping[Hashable, float]
    rounds: int
    converged: bool
    step_ns: float = 0.0
    dp_exposed_ns: tuple[float, ...] = ()


CostOf = Callable[[int, Chunk], ChunkCost]
TransferOf = Callable[[int, int, Chunk], float]


def settle(p: Plan, cost: CostOf, transfer: TransferOf, network: ChunkNetwork, *, sm_share: float = 0.0,
           reference: Mapping[Hashable, float] | None = None, tail: Tail | None = None) -> Settled:
    """Place `p` and replay its jobs (and `tail`'s DP calls) until the factors settle. Without
    `reference`, `p` is the traced schedule: its own classes' mean simulated time per nominal ns
    is the reference."""
    slot_of = {(d, c): i for d, slots in enumerate(p.slots) for i, s in enumerate(slots) for c in s.chunks}
    factors: dict[Hashable, float] = {}
    ref: dict[Hashable, float] = dict(reference or {})
    rounds, converged = 0, False
    last_step: dict[Hashable, float] = {}
    session: JobFlows | None = None
    while True:
        sim = _place(p, cost, transfer, sm_share, factors, slot_of)
        if rounds >= MAX_ROUNDS:
            break
        rounds += 1
        jobs = _jobs(p, sim, cost, transfer, network) + _tail_jobs(sim, tail, network)
        if session is None or session.keys != [job.key for job in jobs]:
            session = network.session(jobs)
        took = session.times(np.array([job.release_ns for job in jobs], np.float64))
        rate = {job.key: t / job.nominal_ns for job, t in zip(jobs, took, strict=True)}
        if reference is None:
            per: dict[Hashable, list[float]] = {}
            for job, t in zip(jobs, took, strict=True):
                acc = per.setdefault(job.cls, [0.0, 0.0])
                acc[0] += t
                acc[1] += job.nominal_ns
            ref = {cls: s / n for cls, (s, n) in per.items() if n > 0 and s > 0}
        base = {job.cls: ref.get(job.cls) or ref.get(network.stands_for.get(job.cls)) for job in jobs}
        measured = {job.key: rate[job.key] / base[job.cls] if base[job.cls] else 1.0 for job in jobs}
        new, last_step = next_factors(measured, factors, last_step, rounds)
        moved = max((abs(v - factors.get(k, 1.0)) / max(v, 1e-12) for k, v in new.items()), default=0.0)
        factors = new
        if moved <= SETTLE_TOLERANCE:
            converged = True
            sim = _place(p, cost, transfer, sm_share, factors, slot_of)
            break
    step, dp_exposed = _step_end(sim, tail, factors)
    return Settled(sim, factors, ref, rounds, converged, step, dp_exposed)


def next_factors(measured: Mapping[Hashable, float], factors: Mapping[Hashable, float],
                 last_step: Mapping[Hashable, float], round_no: int) -> tuple[dict[Hashable, float],
                                                                        dict[Hashable, float]]:
    """The settling rule: the factors for the next placement from those `measured` in round
    `round_no` (1-based) and the current ones (1 where absent), and the step each took. Up to
    round DAMP_FROM every factor takes its measured value; from the next round on, a factor whose
    step turned back against its last one (an oscillation) moves half way, the others take
    theirs in full."""
    new = dict(measured)
    if round_no > DAMP_FROM:
        new = {k: 0.5 * (v + factors.get(k, 1.0)) if (v - factors.get(k, 1.0)) * last_step.get(k, 0.0) < 0
               else v for k, v in new.items()}
    return new, {k: v - factors.get(k, 1.0) for k, v in new.items()}


def compute_reached(sim: Simulation, device: int, share: float) -> float:
    """When `device` has done `share` of its placed chunk compute (a slot computes from its start)."""
    mine = sorted((x for x in sim.placed if x.device == device), key=lambda x: x.start_ns)
    target = share * sum(x.compute_ns for x in mine)
    done = 0.0
    for x in mine:
        if done + x.compute_ns >= target:
            return x.start_ns + max(target - done, 0.0)
        done += x.compute_ns
    return mine[-1].start_ns + mine[-1].compute_ns if mine else 0.0


def _tail_jobs(sim: Simulation, tail: Tail | None, network: ChunkNetwork) -> list[Job]:
    if tail is None:
        return []
    return [Job(("dp", d, i), call.cls, compute_reached(sim, d, call.share) + call.delay_ns, call.nominal_ns)
            for d, calls in enumerate(tail.calls) for i, call in enumerate(calls)
            if call.nominal_ns > 0 and call.cls in network.templates]


def _step_end(sim: Simulation, tail: Tail | None, factors: Mapping[Hashable, float]) -> tuple[float, tuple[
        float, ...]]:
    """When the last stage's step ends (the pipeline's span without a tail), and per stage the
    time its DP calls run past its last chunk."""
    if tail is None:
        return sim.span_ns, ()
    last = [0.0] * sim.plan.stages
    for x in sim.placed:
        last[x.device] = max(last[x.device], x.end_ns)
    ends, exposed = [], []
    for d, calls in enumerate(tail.calls):
        dp_end = max((compute_reached(sim, d, c.share) + c.delay_ns + c.nominal_ns * factors.get(("dp", d, i), 1.0)
                      for i, c in enumerate(calls)), default=0.0)
        ends.append(max(last[d], dp_end) + tail.after_ns[d])
        exposed.append(max(dp_end - last[d], 0.0))
    return max(ends, default=sim.span_ns), tuple(exposed)


def _place(p: Plan, cost: CostOf, transfer: TransferOf, sm_share: float, factors: Mapping[Hashable, float],
           slot_of: Mapping[tuple[int, Chunk], int]) -> Simulation:
    def scaled_cost(d: int, c: Chunk) -> ChunkCost:
        base = cost(d, c)
        slot = slot_of[(d, c)]
        return ChunkCost(base.compute_ns, {dim: t * factors.get(("comm", d, slot, dim), 1.0)
                                           for dim, t in base.comm_ns.items()})

    def scaled_transfer(a: int, b: int, c: Chunk) -> float:
        return transfer(a, b, c) * factors.get(("pp", a, b, c), 1.0)

    return simulate(p, scaled_cost, transfer=scaled_transfer, sm_share=sm_share)


def _jobs(p: Plan, sim: Simulation, cost: CostOf, transfer: TransferOf, network: ChunkNetwork) -> list[Job]:
    """The placement's communication jobs that have a template: per slot and dim, and per PP transfer."""
    jobs: list[Job] = []
    ends: dict[tuple[str, int, int], tuple[float, int]] = {}
    count = [0] * p.stages
    for x in sim.placed:
        for c in x.chunks:
            kind = "B" if c.kind in (BACKWARD, INPUT_GRAD) else c.kind
            ends[(kind, c.mb, p.position(x.device, c))] = (x.end_ns, x.device)
    for x in sim.placed:
        d = x.device
        slot = count[d]
        count[d] += 1
        nominal: dict[str, float] = {}
        for c in x.chunks:
            for dim, t in cost(d, c).comm_ns.items():
                nominal[dim] = nominal.get(dim, 0.0) + t
        release = x.start_ns if len(x.chunks) == 2 else x.start_ns + x.compute_ns
        for dim, t in sorted(nominal.items()):
            cls = (dim, d)
            if t > 0 and cls in network.templates:
                jobs.append(Job(("comm", d, slot, dim), cls, release, t))
        for c in x.chunks:
            producer = _producer(p, d, c)
            if producer is None or producer not in ends:
                continue
            end, src = ends[producer]
            t = transfer(src, d, c)
            cls = ("PP", src, d)
            if src != d and t > 0 and cls in network.templates:
                jobs.append(Job(("pp", src, d, c), cls, end, t))
    return jobs


def _producer(p: Plan, device: int, c: Chunk) -> tuple[str, int, int] | None:
    """The chunk whose output `c` needs, as (kind, micro-batch, route position), or None."""
    pos = p.position(device, c)
    if c.kind == FORWARD:
        return ("F", c.mb, pos - 1) if pos > 0 else None
    if c.kind == WEIGHT_GRAD:
        return None
    return ("B", c.mb, pos + 1) if pos < len(p.routes[c.mb]) - 1 else None
