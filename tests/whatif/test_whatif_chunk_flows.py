"""The rebuilt schedule's communication replayed on the topology: jobs the new order overlaps on
one link share it (closed form: two equal flows on one NIC each get half), jobs on separate links
do not, and the traced order keeps its own times."""

from __future__ import annotations

import numpy as np
import pytest

from tracekit.pipeline import BACKWARD, FORWARD, Chunk, ChunkCost, Plan, Slot
from tracekit.replay import build, parse_spec
from tracekit.replay.simulate import Flows, route
from tracekit.whatif.chunk_flows import (
    DAMP_FROM,
    SETTLE_TOLERANCE,
    ChunkNetwork,
    Job,
    Tail,
    TailCall,
    Template,
    compute_reached,
    next_factors,
    settle,
)

COMPUTE_NS = 1_000.0
NBYTES = 5e6


def _one_flow(topology, src: int, dst: int, replayed_per_simulated: float) -> Template:
    """One flow of NBYTES, standing for `replayed_per_simulated` times its simulated time alone
    (the baseline replay's calibration of it)."""
    indptr, ids = route(topology, Flows.from_lists([src], [dst], [NBYTES]))
    alone = NBYTES / float(topology.cap[ids].min())  # GB/s = bytes per ns; no latency on this spec
    return Template(indptr, ids, np.array([NBYTES]), np.ones(1), np.full(1, np.inf), alone * replayed_per_simulated)


def _network(second_src: int, second_dst: int, replayed_per_simulated: float = 1.0) -> tuple[ChunkNetwork, float]:
    """Stage 0's EP all-to-all is one flow GPU 0 -> GPU 1 (host 0's NIC to host 1's); stage 1's
    is GPU `second_src` -> `second_dst`; returns the network and the all-to-all's replayed time."""
    topology = build(parse_spec("single-switch:hosts=2,gpus=1,nic_gbps=400,latency_ns=0,nvlink_latency_ns=0"))
    first = _one_flow(topology, 0, 1, replayed_per_simulated)
    second = _one_flow(topology, second_src, second_dst, replayed_per_simulated)
    return ChunkNetwork(topology, {("EP", 0): first, ("EP", 1): second}), first.nominal_ns


def _plans() -> tuple[Plan, Plan]:
    """Traced: one micro-batch through both stages (stage 1 starts when stage 0 is done: the
    all-to-alls never overlap). New: two micro-batches, one per stage, run at once."""
    f = Chunk(FORWARD, 0, 0)
    traced = Plan("traced", 2, 1, 1, ((Slot((f,)),), (Slot((f,)),)), (((0, 0), (1, 0)),))
    apart = Plan("apart", 2, 2, 1, ((Slot((f,)),), (Slot((Chunk(FORWARD, 1, 0),)),)), (((0, 0),), ((1, 0),)))
    return traced, apart


def _settle(network: ChunkNetwork, all_to_all_ns: float):
    def cost(device: int, chunk: Chunk) -> ChunkCost:
        return ChunkCost(COMPUTE_NS, {"EP": all_to_all_ns})

    traced, apart = _plans()
    before = settle(traced, cost, lambda a, b, c: 0.0, network)
    after = settle(apart, cost, lambda a, b, c: 0.0, network, reference=before.reference)
    return before, after


def test_two_all_to_alls_forced_onto_one_nic_each_take_twice_as_long() -> None:
    network, a = _network(0, 1)  # both stages' flows cross host 0's NIC, up, at the same time
    before, after = _settle(network, a)
    assert before.converged and after.converged
    assert before.simulation.span_ns == pytest.approx(2 * (COMPUTE_NS + a), rel=1e-9)  # the traced order as replayed
    # closed form: two flows of X bytes on one link of capacity c get c/2 each: both take 2 X / c
    assert after.simulation.span_ns == pytest.approx(COMPUTE_NS + 2 * a, rel=1e-6)
    assert after.simulation.exposed_ns["EP"] == pytest.approx(2 * (2 * a), rel=1e-6)
    assert list(after.factors.values()) == pytest.approx([2.0, 2.0], rel=1e-6)


def test_all_to_alls_on_separate_links_keep_their_time() -> None:
    network, a = _network(1, 0)  # stage 1's flow runs the other way: the full-duplex links are not shared
    _, after = _settle(network, a)
    assert after.simulation.span_ns == pytest.approx(COMPUTE_NS + a, rel=1e-6)
    assert list(after.factors.values()) == pytest.approx([1.0, 1.0], rel=1e-6)


def test_nominal_times_are_kept_relative_to_the_traced_order() -> None:
    """A baseline replay that gave the all-to-all 3x its flow time (calibration) keeps 3x alone, 6x shared."""
    network, a = _network(0, 1, replayed_per_simulated=3.0)  # `a` is 3x the flow's simulated time
    before, after = _settle(network, a)
    assert before.simulation.span_ns == pytest.approx(2 * (COMPUTE_NS + a), rel=1e-9)
    assert after.simulation.span_ns == pytest.approx(COMPUTE_NS + 2 * a, rel=1e-6)


def test_a_transfer_sent_while_an_all_to_all_runs_on_its_nic_shares_it() -> None:
    """Stage 0 sends micro-batch 0 to stage 1 (one flow GPU 0 -> GPU 1) when its forward ends at C;
    stage 1 runs micro-batch 1 first in the new order, its all-to-all (forced onto the same link)
    starting at C too: both take 2A, then micro-batch 0 runs on stage 1 with its all-to-all alone.
    Traced (micro-batch 0 first on stage 1) nothing overlaps: 3C + 3A; new: 2C + 3A (2C + 2A
    without contention)."""
    topology = build(parse_spec("single-switch:hosts=2,gpus=1,nic_gbps=400,latency_ns=0,nvlink_latency_ns=0"))
    link = _one_flow(topology, 0, 1, 1.0)
    a = link.nominal_ns
    network = ChunkNetwork(topology, {("EP", 1): link, ("PP", 0, 1): link})
    f0, f1 = Chunk(FORWARD, 0, 0), Chunk(FORWARD, 1, 0)
    routes = (((0, 0), (1, 0)), ((1, 0),))
    traced = Plan("traced", 2, 2, 1, ((Slot((f0,)),), (Slot((f0,)), Slot((f1,)))), routes)
    reordered = Plan("reordered", 2, 2, 1, ((Slot((f0,)),), (Slot((f1,)), Slot((f0,)))), routes)

    def cost(device: int, chunk: Chunk) -> ChunkCost:
        return ChunkCost(COMPUTE_NS, {"EP": a} if device == 1 else {})

    def transfer(src: int, dst: int, chunk: Chunk) -> float:
        return a

    before = settle(traced, cost, transfer, network)
    after = settle(reordered, cost, transfer, network, reference=before.reference)
    assert before.simulation.span_ns == pytest.approx(3 * COMPUTE_NS + 3 * a, rel=1e-9)
    assert after.simulation.span_ns == pytest.approx(2 * COMPUTE_NS + 3 * a, rel=1e-6)
    assert after.factors[("pp", 0, 1, f0)] == pytest.approx(2.0, rel=1e-6)
    assert after.factors[("comm", 1, 0, "EP")] == pytest.approx(2.0, rel=1e-6)  # micro-batch 1's, shared
    assert after.factors[("comm", 1, 1, "EP")] == pytest.approx(1.0, rel=1e-6)  # micro-batch 0's, alone


def test_later_rounds_re_simulating_what_moved_match_one_simulation_of_all() -> None:
    """`JobFlows.times` after its first call (replay.rounds: only the components that moved) gives
    what a fresh simulation of every job does."""
    network, a = _network(0, 1)
    jobs = [Job(("comm", d, k, "EP"), ("EP", d), 0.0, a * (1 + k)) for d in (0, 1) for k in range(3)]
    session = network.session(jobs)
    rng = np.random.default_rng(24)
    session.times(rng.uniform(0, 4 * a, len(jobs)))
    for _ in range(5):
        release = rng.uniform(0, 4 * a, len(jobs))
        fresh = network.session(jobs).times(release)
        assert session.times(release) == pytest.approx(fresh, rel=1e-9)


def _tail_plans() -> tuple[Plan, Plan]:
    """Micro-batch 0 runs through both stages (F, then B back), micro-batch 1 on stage 1 alone.
    Traced: stage 1 runs micro-batch 1 first, so stage 0's last backward waits until 4C and ends
    at 5C, after stage 1's (4C). New: stage 1 runs micro-batch 0 first: stage 0 ends at 4C,
    stage 1 at 5C; the span stays 5C (no communication in the chunks)."""
    f0, b0, f1, b1 = Chunk(FORWARD, 0, 0), Chunk(BACKWARD, 0, 0), Chunk(FORWARD, 1, 0), Chunk(BACKWARD, 1, 0)
    routes = (((0, 0), (1, 0)), ((1, 0),))
    stage0 = (Slot((f0,)), Slot((b0,)))
    traced = Plan("traced", 2, 2, 1, (stage0, (Slot((f1,)), Slot((b1,)), Slot((f0,)), Slot((b0,)))), routes)
    new = Plan("new", 2, 2, 1, (stage0, (Slot((f0,)), Slot((b0,)), Slot((f1,)), Slot((b1,)))), routes)
    return traced, new


def test_a_dp_all_reduce_that_starts_earlier_hides_under_the_other_stage() -> None:
    """Stage 0's DP all-reduce (one flow alone on its link, A = its time) starts when stage 0's
    last chunk ends. Traced: 5C + A; new: stage 0 ends at 4C + A <= 5C (C = 2A), so the step is
    stage 1's 5C: A shorter although the pipeline's span did not move."""
    network, a = _network(0, 1)
    network = ChunkNetwork(network.topology, {("DP", 0, 0): network.templates[("EP", 0)]})
    c = 2 * a
    tail = Tail(((TailCall(("DP", 0, 0), share=1.0, delay_ns=0.0, nominal_ns=a),), ()), (0.0, 0.0))
    traced, new = _tail_plans()
    before = settle(traced, lambda d, ch: ChunkCost(c), lambda s, t, ch: 0.0, network, tail=tail)
    after = settle(new, lambda d, ch: ChunkCost(c), lambda s, t, ch: 0.0, network, reference=before.reference,
                   tail=tail)
    assert before.simulation.span_ns == after.simulation.span_ns == pytest.approx(5 * c)
    assert before.step_ns == pytest.approx(5 * c + a, rel=1e-9)
    assert after.step_ns == pytest.approx(5 * c, rel=1e-9)
    assert after.dp_exposed_ns == pytest.approx((a, 0.0), rel=1e-9)  # past stage 0's last chunk, under stage 1's


def test_a_dp_all_reduce_shares_its_link_with_the_pipeline_that_now_overlaps_it() -> None:
    """Stage 1's micro-batch-1 backward has an all-to-all (A alone) on the link stage 0's DP
    all-reduce (A alone, issued C after stage 0's last chunk) uses. Traced: the all-to-all runs at
    2C, the DP at 6C + A, alone: step 6C + 2A. New: both start at 5C on one link, each at half
    its capacity: 2A, the step 5C + 2A (5C + A if they did not share the link)."""
    network, a = _network(0, 1)
    network = ChunkNetwork(network.topology, {("DP", 0, 0): network.templates[("EP", 0)],
                                              ("EP", 1): network.templates[("EP", 0)]})
    c = 2 * a
    tail = Tail(((TailCall(("DP", 0, 0), share=1.0, delay_ns=c, nominal_ns=a),), ()), (0.0, 0.0))

    def cost(device: int, chunk: Chunk) -> ChunkCost:
        return ChunkCost(c, {"EP": a} if (device, chunk) == (1, Chunk(BACKWARD, 1, 0)) else {})

    traced, new = _tail_plans()
    before = settle(traced, cost, lambda s, t, ch: 0.0, network, tail=tail)
    after = settle(new, cost, lambda s, t, ch: 0.0, network, reference=before.reference, tail=tail)
    assert before.step_ns == pytest.approx(6 * c + 2 * a, rel=1e-9)
    assert after.converged
    assert after.step_ns == pytest.approx(5 * c + 2 * a, rel=1e-6)
    assert after.factors[("dp", 0, 0)] == pytest.approx(2.0, rel=1e-6)
    assert after.dp_exposed_ns[0] == pytest.approx(c + 2 * a, rel=1e-6)  # from stage 0's last chunk end, 4C
    assert after.factors[("comm", 1, 3, "EP")] == pytest.approx(2.0, rel=1e-6)


def test_without_a_tail_the_step_is_the_span() -> None:
    network, a = _network(0, 1)
    before, _ = _settle(network, a)
    assert before.step_ns == before.simulation.span_ns


def test_a_call_issued_during_the_pipeline_follows_the_same_share_of_the_compute() -> None:
    """Of stage 1's compute (4 chunks of C), half is done when its second slot ends (2C traced) and
    five eighths half-way through its third: at 2.5C in the traced order, 3.5C in the new one
    (stage 1 waits C for stage 0's forward there)."""
    traced, new = _tail_plans()
    cost = lambda d, ch: ChunkCost(COMPUTE_NS)  # noqa: E731
    before = settle(traced, cost, lambda s, t, ch: 0.0, ChunkNetwork(None, {}))
    after = settle(new, cost, lambda s, t, ch: 0.0, ChunkNetwork(None, {}))
    assert compute_reached(before.simulation, 1, 0.5) == pytest.approx(2 * COMPUTE_NS)
    assert compute_reached(before.simulation, 1, 0.625) == pytest.approx(2.5 * COMPUTE_NS)
    assert compute_reached(after.simulation, 1, 0.625) == pytest.approx(3.5 * COMPUTE_NS)
    assert compute_reached(after.simulation, 0, 1.0) == pytest.approx(4 * COMPUTE_NS)


def test_the_settling_rule_takes_full_steps_until_it_damps() -> None:
    """Up to round DAMP_FROM (2) every factor takes its measured value, even one that turned back."""
    assert DAMP_FROM == 2
    for round_no in (1, DAMP_FROM):
        new, step = next_factors({"a": 1.0}, {"a": 1.2}, {"a": 0.2}, round_no)
        assert new == {"a": 1.0} and step == pytest.approx({"a": -0.2})


def test_the_settling_rule_halves_only_a_step_that_turned_back() -> None:
    """From round 3: a factor whose step reverses its last one moves half way; one that keeps its
    direction, one without a last step and one whose last step was zero take the measured value."""
    factors = {"back": 1.2, "on": 1.2, "new": 1.0, "still": 1.5, "down": 0.8}
    last = {"back": 0.2, "on": 0.2, "still": 0.0, "down": -0.2}
    measured = {"back": 1.0, "on": 1.3, "new": 0.7, "still": 1.1, "down": 1.0}
    new, step = next_factors(measured, factors, last, DAMP_FROM + 1)
    assert new == pytest.approx({"back": 1.1, "on": 1.3, "new": 0.7, "still": 1.1, "down": 0.9})
    assert step == pytest.approx({"back": -0.1, "on": 0.1, "new": -0.3, "still": -0.4, "down": 0.1})


def _rounds_to_settle(measure, max_rounds: int = 40) -> tuple[int, float]:
    """settle's loop on one factor whose measured value is `measure(factor)`."""
    factors: dict = {}
    last: dict = {}
    for round_no in range(1, max_rounds + 1):
        new, last = next_factors({"x": measure(factors.get("x", 1.0))}, factors, last, round_no)
        moved = abs(new["x"] - factors.get("x", 1.0)) / new["x"]
        factors = new
        if moved <= SETTLE_TOLERANCE:
            return round_no, factors["x"]
    return max_rounds + 1, factors["x"]


def test_an_oscillation_settles_at_its_fixed_point_and_a_monotone_approach_is_not_slowed() -> None:
    """A factor measured as 3 - f flips between 1 and 2 for ever undamped; the rule's half step at
    round 3 lands on the fixed point 1.5, settled at round 4. A contraction approached from one
    side (f -> 1 + (f - 1) / 2 + 0.25, fixed point 1.5) is never damped: as many rounds as the
    undamped iteration."""
    assert _rounds_to_settle(lambda f: 3.0 - f) == (4, 1.5)
    rounds, fixed = _rounds_to_settle(lambda f: 1.25 + (f - 1.0) / 2)
    assert fixed == pytest.approx(1.5, rel=1e-5)
    undamped, f = 0, 1.0
    while True:
        undamped += 1
        nxt = 1.25 + (f - 1.0) / 2
        if abs(nxt - f) / nxt <= SETTLE_TOLERANCE:
            break
        f = nxt
    assert rounds == undamped
