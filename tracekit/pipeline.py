"""Pipeline-parallel schedules: each device's order of chunks for GPipe, 1F1B, interleaved 1F1B,
ZB-H1, DualPipe and DualPipeV, and a list-scheduling simulator that places those chunks in time.

A micro-batch's forward pass visits a *route* of (device, chunk) positions; its backward pass
walks the route back. A forward at route position l waits for the forward at l-1, a backward
for the backward at l+1 (the last position's for its own forward), a weight-gradient chunk for
its backward; a hop between devices adds a transfer. Each device runs its slots in order, a slot
being one chunk or DualPipe's overlapped forward/backward pair. The orders follow the published
schedules: Megatron-LM's (1F1B, interleaved), the zero-bubble paper's ZB-H1, and DualPipe's and
DualPipeV's `step()` (github.com/deepseek-ai/DualPipe).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from tracekit.errors import TracekitError

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "dualpipe", "dualpipev")
#: Schedules whose backward is split into an input-gradient chunk (B) and a weight-gradient chunk (W).
SPLIT_BACKWARD = ("zb-h1", "dualpipe", "dualpipev")

FORWARD, BACKWARD, INPUT_GRAD, WEIGHT_GRAD = "F", "B", "Bi", "W"


class ScheduleError(TracekitError):
    """A schedule cannot be built for these stages, micro-batches and chunks (the message says why)."""


@dataclass(frozen=True, order=True)
class Chunk:
    """One piece of work: `kind` F (forward), B (full backward), Bi (input-gradient backward) or W
    (weight gradient), of micro-batch `mb`, on the device's model chunk `chunk`."""

    kind: str
    mb: int
    chunk: int


@dataclass(frozen=True)
class Slot:
    """What a device runs next: one chunk, or DualPipe's forward and backward run as one (forward first)."""

    chunks: tuple[Chunk, ...]

    @property
    def paired(self) -> bool:
        return len(self.chunks) == 2


@dataclass(frozen=True)
class Plan:
    """A schedule's slots per device and the route (device, chunk) of every micro-batch."""

    name: str
    stages: int
    microbatches: int
    chunks: int
    slots: tuple[tuple[Slot, ...], ...]
    routes: tuple[tuple[tuple[int, int], ...], ...]

    def position(self, device: int, chunk: Chunk) -> int:
        """Where on its micro-batch's route `chunk` runs on `device`."""
        return self._positions[self.routes[chunk.mb]][(device, chunk.chunk)]

    @cached_property
    def _positions(self) -> dict[tuple[tuple[int, int], ...], dict[tuple[int, int], int]]:
        return {route: {place: i for i, place in enumerate(route)} for route in set(self.routes)}


@dataclass(frozen=True)
class ChunkCost:
    """Time of one chunk: compute, and communication inside it (per dim: EP all-to-alls, TP
    collectives), which runs after its compute unless the chunk is paired."""

    compute_ns: float
    comm_ns: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Placed:
    """One slot placed in time on its device, with the part of it spent on exposed communication."""

    device: int
    chunks: tuple[Chunk, ...]
    start_ns: float
    end_ns: float
    compute_ns: float
    exposed_ns: Mapping[str, float]
    pp_wait_ns: float  # idle before the slot spent waiting for a transfer between devices


@dataclass(frozen=True)
class Simulation:
    """A plan placed in time: the step's pipeline span, and per device its busy time and bubble
    (the span minus its busy time: idle while waiting for other stages)."""

    plan: Plan
    span_ns: float
    busy_ns: tuple[float, ...]
    bubble_ns: tuple[float, ...]
    exposed_ns: Mapping[str, float]  # per dim, summed over devices (PP: waits on transfers)
    placed: tuple[Placed, ...]


def plan(name: str, stages: int, microbatches: int, chunks: int = 1) -> Plan:
    """Every device's slots for the schedule `name` (one of SCHEDULES)."""
    s, m, v = stages, microbatches, chunks
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
    if s < 1 or m < 1 or v < 1:
        raise ScheduleError(f"{name}: stages, micro-batches and chunks must be positive (got {s}, {m}, {v})")
    if name != "interleaved-1f1b" and v != 1 and not (name.startswith("dualpipe") and v == 2):
        raise ScheduleError(f"{name}: chunks={v} applies only to interleaved-1f1b")
    if name == "interleaved-1f1b":
        if m % s:
            raise ScheduleError(f"interleaved-1f1b: micro-batches {m} must be a multiple of the stages {s}")
        routes = tuple(tuple((d, c) for c in range(v) for d in range(s)) for _ in range(m))
        slots = tuple(_interleaved(d, s, m, v) for d in range(s))
    elif name == "dualpipe":
        if s % 2 or m % 2 or m < 2 * s:
            raise ScheduleError(f"dualpipe: needs an even number of stages and an even number of micro-batches of "
                                f"at least twice the stages (got stages {s}, micro-batches {m})")
        half = m // 2
        routes = tuple(tuple((d, 0) for d in range(s)) if mb < half else tuple((s - 1 - d, 1) for d in range(s))
                       for mb in range(m))
        slots = tuple(_dualpipe(d, s, m, v_shape=False) for d in range(s))
        v = 2
    elif name == "dualpipev":
        if m < 2 * s:
            raise ScheduleError(f"dualpipev: needs at least twice as many micro-batches as devices (got devices {s}, "
                                f"micro-batches {m})")
        routes = tuple(tuple([(d, 0) for d in range(s)] + [(d, 1) for d in reversed(range(s))]) for _ in range(m))
        slots = tuple(_dualpipe(d, s, m, v_shape=True) for d in range(s))
        v = 2
    else:
        routes = tuple(tuple((d, 0) for d in range(s)) for _ in range(m))
        make = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "zb-h1": _zb_h1}[name]
        slots = tuple(make(d, s, m) for d in range(s))
    return Plan(name, s, m, v, slots, routes)


def _single(*chunks: Chunk) -> list[Slot]:
    return [Slot((c,)) for c in chunks]


def _gpipe(d: int, s: int, m: int) -> tuple[Slot, ...]:
    return tuple(_single(*(Chunk(FORWARD, i, 0) for i in range(m)),
                         *(Chunk(BACKWARD, i, 0) for i in reversed(range(m)))))


def _one_f_one_b_order(d: int, s: int, m: int) -> list[tuple[str, int]]:
    warmup = min(s - d - 1, m)
    order = [(FORWARD, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [(FORWARD, warmup + i), (BACKWARD, i)]
    order += [(BACKWARD, i) for i in range(m - warmup, m)]
    return order


def _one_f_one_b(d: int, s: int, m: int) -> tuple[Slot, ...]:
    return tuple(Slot((Chunk(k, i, 0),)) for k, i in _one_f_one_b_order(d, s, m))


def _zb_h1(d: int, s: int, m: int) -> tuple[Slot, ...]:
    """1F1B's order of forwards and backwards with each backward split: device d keeps up to d
    weight-gradient chunks back (so every device holds at most the S activations 1F1B's first
    stage holds) and runs them in the cool-down, where 1F1B waits."""
    out: list[Slot] = []
    pending: deque[int] = deque()
    keep = d
    backwards_left = m
    for kind, i in _one_f_one_b_order(d, s, m):
        if kind == FORWARD:
            out.append(Slot((Chunk(FORWARD, i, 0),)))
            continue
        out.append(Slot((Chunk(INPUT_GRAD, i, 0),)))
        pending.append(i)
        backwards_left -= 1
        if len(pending) > min(keep, backwards_left):
            out.append(Slot((Chunk(WEIGHT_GRAD, pending.popleft(), 0),)))
    out += [Slot((Chunk(WEIGHT_GRAD, i, 0),)) for i in pending]
    return tuple(out)


def _interleaved(d: int, s: int, m: int, v: int) -> tuple[Slot, ...]:
    """Megatron-LM's interleaved 1F1B (`forward_backward_pipelining_with_interleaving`)."""
    total = m * v

    def chunk_of(k: int, forward: bool) -> int:
        c = (k % (s * v)) // s
        return c if forward else v - 1 - c

    def mb_of(k: int) -> int:
        return (k // (s * v)) * s + k % s

    warmup = total if m == s else min((s - d - 1) * 2 + (v - 1) * s, total)
    order = [Chunk(FORWARD, mb_of(k), chunk_of(k, True)) for k in range(warmup)]
    for i in range(total - warmup):
        k = warmup + i
        order += [Chunk(FORWARD, mb_of(k), chunk_of(k, True)), Chunk(BACKWARD, mb_of(i), chunk_of(i, False))]
    order += [Chunk(BACKWARD, mb_of(k), chunk_of(k, False)) for k in range(total - warmup, total)]
    return tuple(_single(*order))


def _dualpipe(rank: int, n: int, m: int, *, v_shape: bool) -> tuple[Slot, ...]:
    """DualPipe's (or DualPipeV's) `step()` for one rank, as its eight steps."""
    half_m = m // 2
    if v_shape:
        half_rank, n_half = rank, n
        middle = rank == n - 1  # DualPipeV's last rank turns the V: its chunk 0 feeds its chunk 1
        chunk_of_phase = (0, 1)
        first_mb = (0, 0)
        main = m - 2 * n + rank + 1
    else:
        half_rank, n_half = min(rank, n - 1 - rank), n // 2
        middle = half_rank == n_half - 1
        direction = (0, 1) if rank < n // 2 else (1, 0)
        chunk_of_phase = direction
        first_mb = tuple(0 if dr == 0 else half_m for dr in direction)
        main = half_m - n + half_rank + 1
    f_next = list(first_mb)
    b_next = list(first_mb)
    weights: deque[Chunk] = deque()
    out: list[Slot] = []

    def forward(p: int) -> Chunk:
        c = Chunk(FORWARD, f_next[p], chunk_of_phase[p])
        f_next[p] += 1
        return c

    def backward(p: int, zero_bubble: bool = False) -> Chunk:
        mb = b_next[p]
        b_next[p] += 1
        if zero_bubble:
            weights.append(Chunk(WEIGHT_GRAD, mb, chunk_of_phase[p]))
            return Chunk(INPUT_GRAD, mb, chunk_of_phase[p])
        return Chunk(BACKWARD, mb, chunk_of_phase[p])

    def run(*chunks: Chunk) -> None:
        out.append(Slot(tuple(chunks)))

    for _ in range((n_half - half_rank - 1) * 2):  # step 1: nF0
        run(forward(0))
    for _ in range(half_rank + 1):  # step 2: nF0F1
        run(forward(0))
        run(forward(1))
    for _ in range(n_half - half_rank - 1):  # step 3: nB1W1F1
        run(backward(1, zero_bubble=True))
        run(weights.popleft())
        run(forward(1))
    for i in range(main):  # step 4: nF0B1F1B0
        if i == 0 and middle:
            run(forward(0))
            run(backward(1))
        else:
            run(forward(0), backward(1))
        run(forward(1), backward(0))
    for _ in range(n_half - half_rank - 1):  # step 5: nB1F1B0
        run(backward(1))
        run(forward(1), backward(0))
    zero_bubble = False
    steps_6 = half_rank + 1
    for i in range(steps_6):  # step 6: nB1B0, the second half with zero bubble
        if i == steps_6 // 2 and half_rank % 2 == 1:
            zero_bubble = True
        run(backward(1, zero_bubble))
        if i == steps_6 // 2 and half_rank % 2 == 0:
            zero_bubble = True
        run(backward(0, zero_bubble))
    for _ in range(n_half - half_rank - 1):  # step 7: nWB0
        run(weights.popleft())
        run(backward(0, zero_bubble=True))
    for _ in range(half_rank + 1):  # step 8: nW
        run(weights.popleft())
    if weights:
        raise ScheduleError("dualpipe: weight-gradient chunks left over (a bug in the schedule)")
    return tuple(out)


CostOf = Callable[[int, Chunk], ChunkCost]
TransferOf = Callable[[int, int, Chunk], float]


def uniform_costs(forward_ns: float, backward_ns: float, weight_ns: float = 0.0, *, chunks: int = 1,
                  comm_ns: Mapping[str, Mapping[str, float]] | None = None) -> CostOf:
    """Costs of the closed forms: every device's forward F, full backward B (of which W is the
    weight gradient) per micro-batch, split evenly over its `chunks` model chunks; `comm_ns[kind]`
    the communication inside each chunk of that kind, per dim."""
    base = {FORWARD: forward_ns, BACKWARD: backward_ns, INPUT_GRAD: backward_ns - weight_ns, WEIGHT_GRAD: weight_ns}
    comm = comm_ns or {}

    def cost(device: int, chunk: Chunk) -> ChunkCost:
        return ChunkCost(base[chunk.kind] / chunks, dict(comm.get(chunk.kind, {})))

    return cost


def paired_ns(compute_ns: float, comm_ns: float, sm_share: float) -> float:
    """Duration of an overlapped pair: its communication (`comm_ns`, serial on its own stream)
    runs beside its compute, which meanwhile has `1 - sm_share` of the SMs; compute left when the
    communication ends runs at full speed. max(comm, compute + sm_share * comm)."""
    return max(comm_ns, compute_ns + sm_share * comm_ns)


def simulate(p: Plan, cost: CostOf, *, transfer: TransferOf | None = None, sm_share: float = 0.0,
             release_ns: Sequence[float] | None = None) -> Simulation:
    """Place every slot of `p` in time: a slot starts when its device is free and the chunks it
    depends on have ended (plus `transfer(src, dst, chunk)` between devices). `release_ns` the
    time each device may start (default 0)."""
    if not 0.0 <= sm_share < 1.0:
        raise ScheduleError(f"sm_share must be in [0, 1), got {sm_share}")
    hop = transfer or (lambda a, b, c: 0.0)
    n = p.stages
    free = list(release_ns) if release_ns is not None else [0.0] * n
    first = list(free)
    ends: dict[tuple[str, int, int], tuple[float, int]] = {}  # (kind, mb, route position) -> (end, device)
    pointer = [0] * n
    placed: list[Placed] = []
    busy = [0.0] * n
    exposed: dict[str, float] = {}
    full_b = {BACKWARD, INPUT_GRAD}

    def needs(device: int, c: Chunk) -> list[tuple[tuple[str, int, int], Chunk]] | None:
        pos = p.position(device, c)
        last = len(p.routes[c.mb]) - 1
        if c.kind == FORWARD:
            keys = [("F", c.mb, pos - 1)] if pos > 0 else []
        elif c.kind == WEIGHT_GRAD:
            keys = [("B", c.mb, pos)]
        else:
            keys = [("B", c.mb, pos + 1)] if pos < last else [("F", c.mb, pos)]
        if any(k not in ends for k in keys):
            return None
        return [(k, c) for k in keys]

    remaining = sum(len(x) for x in p.slots)
    while remaining:
        progressed = False
        for d in range(n):
            while pointer[d] < len(p.slots[d]):
                slot = p.slots[d][pointer[d]]
                deps = [needs(d, c) for c in slot.chunks]
                if any(x is None for x in deps):
                    break
                ready, pp_ready = free[d], free[d]
                for group in deps:
                    for key, c in group or ():
                        end, src = ends[key]
                        arrive = end + (hop(src, d, c) if src != d else 0.0)
                        ready = max(ready, arrive)
                        pp_ready = max(pp_ready, end)
                costs = [cost(d, c) for c in slot.chunks]
                compute = sum(c.compute_ns for c in costs)
                comm: dict[str, float] = {}
                for c in costs:
                    for dim, t in c.comm_ns.items():
                        comm[dim] = comm.get(dim, 0.0) + t
                total_comm = sum(comm.values())
                dur = paired_ns(compute, total_comm, sm_share) if slot.paired else compute + total_comm
                shown = {dim: (dur - compute) * t / total_comm for dim, t in comm.items()} if total_comm else {}
                pp_wait = ready - max(pp_ready, free[d])
                start, end = ready, ready + dur
                for c in slot.chunks:
                    kind = "B" if c.kind in full_b else c.kind
                    ends[(kind, c.mb, p.position(d, c))] = (end, d)
                placed.append(Placed(d, slot.chunks, start, end, compute, shown, pp_wait))
                busy[d] += dur
                for dim, t in shown.items():
                    exposed[dim] = exposed.get(dim, 0.0) + t
                if pp_wait > 0:
                    exposed["PP"] = exposed.get("PP", 0.0) + pp_wait
                free[d] = end
                pointer[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {d: p.slots[d][pointer[d]].chunks for d in range(n) if pointer[d] < len(p.slots[d])}
            raise ScheduleError(f"{p.name}: the chunk orders deadlock (waiting: {stuck})")
    span = max(free) - min(first)
    bubble = tuple(span - b for b in busy)
    return Simulation(p, span, tuple(busy), bubble, dict(sorted(exposed.items())), tuple(placed))


def closed_form_bubble(name: str, stages: int, forward_ns: float, backward_ns: float, weight_ns: float = 0.0, *,
                       chunks: int = 1, paired_ns: float | None = None) -> float:
    """The published bubble per device (DualPipe's README table; interleaved 1F1B from Megatron-LM):
    1F1B and GPipe (PP-1)(F+B), ZB-H1 (PP-1)(F+B-2W), DualPipe and DualPipeV (PP/2-1)(F&B+B-3W),
    interleaved (PP-1)(F+B)/v. `stages` is PP, the pipeline stages (DualPipeV runs them on PP/2
    devices); `paired_ns` is F&B (default F+B)."""
    f, b, w = forward_ns, backward_ns, weight_ns
    fb = f + b if paired_ns is None else paired_ns
    if name in ("gpipe", "1f1b"):
        return (stages - 1) * (f + b)
    if name == "interleaved-1f1b":
        return (stages - 1) * (f + b) / chunks
    if name == "zb-h1":
        return (stages - 1) * (f + b - 2 * w)
    if name in ("dualpipe", "dualpipev"):
        return (stages / 2 - 1) * (fb + b - 3 * w)
    raise ScheduleError(f"unknown schedule {name!r}")
