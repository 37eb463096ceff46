"""Pipeline schedules against the published bubble formulas (communication off), and the
overlap of DualPipe's paired chunks."""

import pytest

from tracekit.pipeline import (
    SCHEDULES,
    SPLIT_BACKWARD,
    Chunk,
    ScheduleError,
    closed_form_bubble,
    paired_ns,
    plan,
    simulate,
    uniform_costs,
)

F, B, W = 1000, 2000, 1000  # DualPipe's figure: a forward, a full backward of two, a weight gradient of one
CASES = [(name, pp, m) for name in SCHEDULES for pp in (2, 4, 8) for m in (4, 8, 16)]


def _devices(name: str, pp: int) -> int:
    return pp // 2 if name == "dualpipev" else pp  # DualPipeV runs PP stages on PP/2 devices


def _applies(name: str, pp: int, m: int) -> bool:
    if name in ("zb-h1", "dualpipe", "dualpipev"):
        return m >= 2 * pp if name != "dualpipev" else m >= pp
    return not (name == "interleaved-1f1b" and m % pp)


@pytest.mark.parametrize(("name", "pp", "m"), CASES)
def test_bubble_equals_published_formula(name: str, pp: int, m: int) -> None:
    if not _applies(name, pp, m):
        with pytest.raises(ScheduleError) if name != "zb-h1" else _nothing():
            plan(name, _devices(name, pp), m, 2 if name == "interleaved-1f1b" else 1)
        return
    v = 2 if name == "interleaved-1f1b" else 1
    w = W if name in SPLIT_BACKWARD else 0
    sim = simulate(plan(name, _devices(name, pp), m, v), uniform_costs(F, B, w, chunks=v))
    expected = closed_form_bubble(name, pp, F, B, w, chunks=v)
    assert sim.bubble_ns == (expected,) * _devices(name, pp)
    per_device_work = m * (F + B) * (2 if name == "dualpipev" else 1)  # DualPipeV: two stages per device
    assert sim.span_ns == per_device_work + expected


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


@pytest.mark.parametrize("v", [2, 4])
def test_interleaved_bubble_shrinks_by_chunks(v: int) -> None:
    sim = simulate(plan("interleaved-1f1b", 4, 8, v), uniform_costs(F, B, chunks=v))
    assert set(sim.bubble_ns) == {3 * (F + B) / v}


def test_every_chunk_runs_once() -> None:
    for name, pp, m in CASES:
        if not _applies(name, pp, m):
            continue
        v = 2 if name == "interleaved-1f1b" else 1
        p = plan(name, _devices(name, pp), m, v)
        seen = [(d, c) for d, slots in enumerate(p.slots) for s in slots for c in s.chunks]
        assert len(seen) == len(set(seen))
        per_device = len(p.routes[0]) // p.stages
        kinds = 3 if name in SPLIT_BACKWARD else 2
        full = sum(1 for _, c in seen if c.kind == "B")
        assert len(seen) + (full if kinds == 3 else 0) == p.stages * per_device * m * kinds


def test_paired_chunk_hides_all_to_all_that_fits() -> None:
    """DualPipe pairs a forward with a backward; their all-to-alls run beside the pair's compute,
    which keeps 1 - sm_share of the SMs. An all-to-all under the pair hides; a longer one shows."""
    share = 0.1
    assert paired_ns(3000, 1000, share) == 3000 + 0.1 * 1000
    assert paired_ns(3000, 5000, share) == 5000
    fits = {"F": {"EP": 400.0}, "B": {"EP": 600.0}}  # 1000 ns of all-to-all per pair, under 3000 of compute
    big = {"F": {"EP": 2000.0}, "B": {"EP": 3000.0}}  # 5000 ns: longer than the pair's compute
    base = plan("dualpipe", 4, 8)
    hidden = simulate(base, uniform_costs(F, B, W, comm_ns=fits), sm_share=share)
    shown = simulate(base, uniform_costs(F, B, W, comm_ns=big), sm_share=share)
    pairs = [p for p in hidden.placed if len(p.chunks) == 2]
    assert pairs and all(p.end_ns - p.start_ns == pytest.approx(F + B + share * 1000) for p in pairs)
    assert all(p.exposed_ns["EP"] == pytest.approx(share * 1000) for p in pairs)
    big_pairs = [p for p in shown.placed if len(p.chunks) == 2]
    assert all(p.end_ns - p.start_ns == pytest.approx(5000) for p in big_pairs)
    assert all(p.exposed_ns["EP"] == pytest.approx(5000 - (F + B)) for p in big_pairs)
    single = [p for p in hidden.placed if len(p.chunks) == 1 and p.chunks[0].kind == "F"]
    assert all(p.exposed_ns["EP"] == pytest.approx(400) for p in single)  # unpaired: all-to-all in series


def test_unknown_and_impossible_schedules_say_why() -> None:
    with pytest.raises(ScheduleError, match="unknown schedule 'x'"):
        plan("x", 4, 8)
    with pytest.raises(ScheduleError, match="twice the stages"):
        plan("dualpipe", 4, 4)
    with pytest.raises(ScheduleError, match="multiple of the stages"):
        plan("interleaved-1f1b", 4, 6, 2)


def test_order_positions_follow_routes() -> None:
    p = plan("dualpipev", 2, 4)
    assert p.position(0, Chunk("F", 0, 1)) == 3 and p.position(1, Chunk("F", 0, 1)) == 2


def test_where_the_formulas_stop_holding() -> None:
    """docs/whatif.md: ZB-H1 with fewer than 2 PP micro-batches, and DualPipe when W != B/2."""
    zb = simulate(plan("zb-h1", 4, 4), uniform_costs(F, B, W))
    assert set(zb.bubble_ns) == {4000} and closed_form_bubble("zb-h1", 4, F, B, W) == 3000
    dp = simulate(plan("dualpipe", 4, 8), uniform_costs(F, B, 800))
    assert set(dp.bubble_ns) == {2400} and closed_form_bubble("dualpipe", 4, F, B, 800) == 2600
