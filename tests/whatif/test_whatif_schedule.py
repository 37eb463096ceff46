"""The schedule what-if: rebuilding the traced schedule gives the baseline replay; other schedules
move the step by the pipeline's change; DualPipe's pairs hide the all-to-all that fits."""

from __future__ import annotations

import pytest

from tracekit.pipeline import SCHEDULES
from tracekit.results import to_builtins
from tracekit.synth import make_run_tables
from tracekit.whatif import WhatIfError, whatif
from tracekit.whatif.chunk_flows import SETTLE_TOLERANCE
from tracekit.whatif.scenarios import parse_scenario


def _tables(name: str, *, pp: int = 2, m: int = 4, v: int = 1, **extra):
    tables, _ = make_run_tables(schedule=name, pp=pp, pp_chunks=v, micro_batches=m, hosts=2, gpus_per_host=4, ep=2,
                                steps=2, straggler_rank=None, **extra)
    return tables


@pytest.fixture(scope="module")
def one_f_one_b():
    return whatif(_tables("1f1b"), [f"schedule:{s}" for s in SCHEDULES]
                  + ["schedule:dualpipe,sm_share=0", "schedule:dualpipe,sm_share=0.5", "schedule:1f1b,microbatches=8"])


@pytest.mark.parametrize("name", SCHEDULES)
def test_rebuilding_the_traced_schedule_is_the_baseline(name: str) -> None:
    v = 2 if name == "interleaved-1f1b" else 1
    result = whatif(_tables(name, v=v), [f"schedule:{name}"])
    s = result.scenarios[0]
    # both placements replay their communication until it settles (SETTLE_TOLERANCE, relative)
    bound = 10 * SETTLE_TOLERANCE
    for k, step in result.baseline_step_ns.items():
        assert abs(s.step_ns[k] - step) <= max(1, bound * step)
    for dim, ns in result.baseline_exposed_ns.items():
        assert abs(s.exposed_ns[dim] - ns) <= max(1, bound * ns)
    assert s.schedule is not None
    span = s.schedule.baseline.span_ns
    assert s.schedule.scenario.span_ns == pytest.approx(span, rel=bound)
    assert s.schedule.scenario.bubble_ns == pytest.approx(s.schedule.baseline.bubble_ns, abs=bound * span)
    assert [(p.stage, p.chunks) for p in s.schedule.scenario.placed] == [
        (p.stage, p.chunks) for p in s.schedule.baseline.placed]
    assert [p.start_ns for p in s.schedule.scenario.placed] == pytest.approx(
        [p.start_ns for p in s.schedule.baseline.placed], abs=bound * span)
    assert s.details["traced_schedule"].name == name


def test_other_schedules_move_the_step_by_the_pipeline_and_the_step_after_it(one_f_one_b) -> None:
    base = one_f_one_b.baseline_step_ns
    by_name = {s.scenario: s for s in one_f_one_b.scenarios}
    off_span = 0
    for s in one_f_one_b.scenarios:
        moved = s.schedule.scenario.step_ns - s.schedule.baseline.step_ns
        assert all(s.step_ns[k] == round(base[k] + moved) for k in base), s.scenario
        assert s.schedule.scenario.step_ns > s.schedule.scenario.span_ns  # the DP all-reduce and optimizer after it
        off_span += abs(moved - (s.schedule.scenario.span_ns - s.schedule.baseline.span_ns)) > 1_000
    assert off_span  # the step after the pipeline is replayed, not carried over
    assert by_name["schedule:1f1b"].step_ns == base
    bubble = {k: max(s.schedule.scenario.bubble_ns) for k, s in by_name.items()}
    assert bubble["schedule:interleaved-1f1b"] < bubble["schedule:1f1b"]  # v=2 halves the (PP-1)(F+B) part
    assert bubble["schedule:zb-h1"] < bubble["schedule:1f1b"]
    assert bubble["schedule:dualpipe"] < bubble["schedule:zb-h1"]  # PP=2: (PP/2-1) = 0, transfers left


def test_the_dp_all_reduces_follow_the_chunks_they_followed_in_the_trace() -> None:
    """The synth run issues two gradient buckets per stage: one after half its backward kernels
    (inside the pipeline), one after the last; then the optimizer (400 us of kernels)."""
    from tracekit.analysis.schedule import read_schedule
    from tracekit.pipeline import plan
    from tracekit.whatif.core import make_baseline
    from tracekit.whatif.schedule import _costs

    tables = _tables("1f1b")
    base = make_baseline(tables, "rail-optimized")
    traced = read_schedule(tables)
    tail = _costs(base, traced, plan("1f1b", 2, 4)).tail
    replayed = {float(i.replayed_ns) for i in base.result.instances if i.dim == "DP"}
    for d, calls in enumerate(tail.calls):
        assert [c.cls for c in calls] == [("DP", d, 0), ("DP", d, 1)]
        first, last = calls
        assert 0.3 < first.share < 0.7 and last.share == 1.0
        assert all(0 <= c.delay_ns < 20_000 for c in calls)
        assert {c.nominal_ns for c in calls} <= replayed  # at their baseline-replay times
        assert tail.after_ns[d] == pytest.approx(400_000, rel=0.05)


def test_dualpipe_pairs_hide_the_all_to_all_the_share_of_sms_taken_shows(one_f_one_b) -> None:
    by_name = {s.scenario: s for s in one_f_one_b.scenarios}
    free, half = by_name["schedule:dualpipe,sm_share=0"], by_name["schedule:dualpipe,sm_share=0.5"]
    zb = by_name["schedule:zb-h1"]  # the same split chunks, none paired
    pairs = [p for p in free.schedule.scenario.placed if p.kind == "FB"]
    assert pairs and all(p.exposed_ns == 0 for p in pairs)  # an all-to-all under its pair's compute
    assert all(p.exposed_ns > 0 for p in half.schedule.scenario.placed if p.kind == "FB")
    assert free.exposed_ns["EP"] < zb.exposed_ns["EP"] <= one_f_one_b.baseline_exposed_ns["EP"]
    assert free.step_ns["0"] < half.step_ns["0"]


def test_more_micro_batches_cut_the_same_batch(one_f_one_b) -> None:
    s = next(x for x in one_f_one_b.scenarios if x.scenario == "schedule:1f1b,microbatches=8")
    busy = [s.schedule.baseline.span_ns - b for b in s.schedule.baseline.bubble_ns]
    busy_after = [s.schedule.scenario.span_ns - b for b in s.schedule.scenario.bubble_ns]
    # the same work per stage; the communication inside it replays its own contention (0.02% here)
    assert busy_after == pytest.approx(busy, rel=1e-3)
    assert max(s.schedule.scenario.bubble_ns) < max(s.schedule.baseline.bubble_ns)


def test_json_carries_both_pipelines(one_f_one_b) -> None:
    doc = to_builtins(one_f_one_b.summary)["scenarios"][0]
    assert doc["kind"] == "schedule" and doc["details"]["schedule"]["name"] == "gpipe"
    assert doc["details"]["traced_schedule"] == {"name": "1f1b", "stages": 2, "microbatches": 4, "chunks": 1}
    placed = doc["schedule"]["scenario"]["placed"][0]
    assert set(placed) == {"stage", "chunks", "kind", "start_ns", "end_ns", "exposed_ns"}
    assert doc["schedule"]["sm_share"] == pytest.approx(20 / 132)
    assert set(doc["details"]["replayed_rounds"]) == {"baseline", "scenario"}
    assert all(set(c) == {"min", "max"} for c in doc["details"]["contention"].values())


def test_the_new_order_replays_its_own_communication(one_f_one_b) -> None:
    """DualPipeV's order puts transfers and all-to-alls together that 1F1B runs apart: some job is
    slowed by contention the traced order did not have, and no note says it is not replayed."""
    by_name = {s.scenario: s for s in one_f_one_b.scenarios}
    assert by_name["schedule:dualpipev"].details["contention"]["scenario"]["max"] > 1.5
    assert all("not replayed" not in note for s in one_f_one_b.scenarios for note in s.notes)


@pytest.mark.parametrize(("text", "message"), [
    ("schedule:pipedream", "unknown schedule 'pipedream'"),
    ("schedule:1f1b,chunks=x", "expects an integer"),
    ("schedule:1f1b,sm_share=1.5", "sm_share"),
    ("schedule:1f1b,depth=2", "unknown field 'depth'"),
])
def test_bad_fields_are_named(text: str, message: str) -> None:
    with pytest.raises(WhatIfError, match=message):
        parse_scenario(text)


def test_schedules_that_do_not_fit_say_why() -> None:
    tables = _tables("1f1b")
    with pytest.raises(WhatIfError, match="twice the stages"):
        whatif(tables, ["schedule:dualpipe,microbatches=2"])
    with pytest.raises(WhatIfError, match="chunks' applies to interleaved-1f1b"):
        whatif(tables, ["schedule:zb-h1,chunks=2"])


def test_a_run_without_a_pipeline_says_so() -> None:
    tables, _ = make_run_tables(pp=1, hosts=1, gpus_per_host=4, ep=2, steps=1, straggler_rank=None)
    with pytest.raises(WhatIfError, match="no pipeline"):
        whatif(tables, ["schedule:1f1b"])


def test_a_baseline_of_other_instances_is_refused(monkeypatch) -> None:
    """The job templates take each instance's replayed time by position: a decomposition that does
    not line up with the baseline's instances stops with a one-line error."""
    import dataclasses

    from tracekit.whatif import schedule as module

    real = module.routed_flows

    def shuffled(*args, **kwargs):
        routed = real(*args, **kwargs)
        return dataclasses.replace(routed, instances=routed.instances[::-1])

    monkeypatch.setattr(module, "routed_flows", shuffled)
    with pytest.raises(WhatIfError, match="not the run's as decomposed again"):
        whatif(_tables("1f1b"), ["schedule:zb-h1"])


def test_an_interleaved_hop_the_trace_never_made_is_replayed_like_a_traced_one() -> None:
    """PP=4 over 2 hosts (stages 0-1 on host 0, 2-3 on host 1), traced 1F1B: interleaved 1F1B's
    hops between stage 3 and stage 0 were never traced. Each takes the traced hop across hosts
    (stage 1 to 2: the same bytes) moved to stages 3 and 0, is routed there, and replayed with the
    rest: alone it keeps that hop's replayed time, and where it overlaps other traffic it slows."""
    from tracekit.analysis.schedule import read_schedule
    from tracekit.pipeline import Chunk, plan
    from tracekit.replay.simulate import Flows, route
    from tracekit.whatif.core import make_baseline
    from tracekit.whatif.schedule import _cost_functions, _costs, _run

    tables = _tables("1f1b", pp=4)
    base = make_baseline(tables, "rail-optimized")
    traced = read_schedule(tables)
    traced_plan = plan("1f1b", 4, 4)
    costs = _costs(base, traced, traced_plan)
    network = costs.network
    assert network.stands_for == {("PP", 3, 0): ("PP", 1, 2), ("PP", 0, 3): ("PP", 1, 2)}
    twin, hop = network.templates[("PP", 1, 2)], network.templates[("PP", 3, 0)]
    assert hop.nbytes.tolist() == twin.nbytes.tolist() and hop.nominal_ns == twin.nominal_ns
    gpu = _gpus(base)
    indptr, ids = route(network.topology, Flows.from_lists([gpu[6], gpu[7]], [gpu[0], gpu[1]], [1.0, 1.0]))
    expected = {tuple(ids[indptr[i]:indptr[i + 1]].tolist()) for i in range(2)}
    assert tuple(hop.ids[hop.indptr[0]:hop.indptr[1]].tolist()) in expected  # stage 3's GPUs to stage 0's
    assert hop.ids.tolist() != twin.ids.tolist()
    interleaved = plan("interleaved-1f1b", 4, 4, 2)
    _, transfer = _cost_functions(interleaved, costs)
    assert transfer(3, 0, Chunk("F", 0, 1)) == pytest.approx(costs.transfer_ns[(1, 2)])
    before = _run(traced_plan, costs, 0.0)
    after = _run(interleaved, costs, 0.0, before.reference)
    wrap = [f for k, f in after.factors.items() if k[0] == "pp" and {k[1], k[2]} == {0, 3}]
    assert len(wrap) == 8  # 4 micro-batches forward (3 -> 0) and backward (0 -> 3)
    assert min(wrap) == pytest.approx(1.0, rel=1e-6) and max(wrap) > 1.2


def _gpus(base):
    from tracekit.replay.engine import routed_flows

    return routed_flows(base.tables, base.topology, placement=dict(base.placement.slots)).gpu_of


def test_the_bundled_samples_dp_all_reduces_settle_by_the_rule(monkeypatch) -> None:
    """On the bundled sample the DP all-reduces released after the pipeline share links with its
    last all-to-alls, and the factors oscillate: undamped, 1F1B rebuilt does not settle in 25
    rounds; with the rule (half steps only where a factor turned back, from round 3) it settles
    in 14 rounds (the traced order rebuilt) and 11 (1F1B against it), and halving every factor
    from round 3 (or from round 7, the rule before) takes longer."""
    from pathlib import Path

    from tracekit import workflows
    from tracekit.whatif import chunk_flows, make_baseline, run_scenario

    monkeypatch.setattr(chunk_flows, "MAX_ROUNDS", 25)
    sample = Path(__file__).parents[2] / "sample_traces" / "synth_moe_16rank"
    base = make_baseline(workflows.whatif_tables(workflows._run(sample)), "rail-optimized:nic_gbps=400")

    def rounds(rule=None) -> tuple[int, int, bool]:
        if rule is not None:
            monkeypatch.setattr(chunk_flows, "next_factors", rule)
        base.memo.clear()
        s = run_scenario(base, "schedule:1f1b")
        monkeypatch.setattr(chunk_flows, "next_factors", next_factors)
        unsettled = any("did not settle" in n for n in s.notes)
        return s.details["replayed_rounds"]["baseline"], s.details["replayed_rounds"]["scenario"], unsettled

    next_factors = chunk_flows.next_factors

    def undamped(measured, factors, last, round_no):
        return dict(measured), {}

    def halving_from(first):
        def rule(measured, factors, last, round_no):
            if round_no < first:
                return dict(measured), {}
            return {k: 0.5 * (v + factors.get(k, 1.0)) for k, v in measured.items()}, {}
        return rule

    assert rounds() == (14, 11, False)
    assert rounds(undamped) == (25, 25, True)
    for first in (3, 7):
        baseline, scenario, _ = rounds(halving_from(first))
        assert baseline > 14 and scenario > 11
