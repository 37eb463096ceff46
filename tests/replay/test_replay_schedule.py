"""The schedule kernel against its naive twin (tests/replay/naive.py) on random acyclic timelines."""

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from naive import schedule_naive

from tracekit.replay import _kernels


@st.composite
def timelines(draw):
    """Events in levels (one per lane per level at most); lane order and dependencies go from a
    lower level to a higher one and instance members share a level, so the graph is acyclic."""
    n_lanes = draw(st.integers(1, 4))
    n_levels = draw(st.integers(1, 5))
    events = []  # (level, lane)
    for level in range(n_levels):
        for lane in range(n_lanes):
            if draw(st.booleans()):
                events.append((level, lane))
    if not events:
        events = [(0, 0)]
    n = len(events)
    tr_start = np.array([lv * 100.0 + draw(st.integers(0, 40)) for lv, _ in events])
    dur = np.array([float(draw(st.integers(0, 50))) for _ in events])
    order = sorted(range(n), key=lambda i: (events[i][1], events[i][0]))
    prev = np.full(n, -1, np.int64)
    nxt = np.full(n, -1, np.int64)
    for a, b in itertools.pairwise(order):
        if events[a][1] == events[b][1]:
            prev[b], nxt[a] = a, b
    deps = set()
    for _ in range(draw(st.integers(0, 6))):
        a, b = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if events[a][0] < events[b][0] and events[a][1] != events[b][1]:
            deps.add((a, b))
    deps = sorted(deps)
    inst = np.full(n, -1, np.int64)
    members = []
    for level in range(n_levels):
        at = [i for i in range(n) if events[i][0] == level]
        if len(at) >= 2 and draw(st.booleans()):
            ms = at[: draw(st.integers(2, len(at)))]
            inst[ms] = len(members)
            members.append(ms)
    inst_dur = np.array([float(draw(st.integers(1, 80))) for _ in members])
    end_frac = np.array([draw(st.sampled_from([1.0, 0.5, 0.25])) for _ in range(n)])
    slack = np.array([float(draw(st.integers(0, 10))) for _ in range(n)])
    return prev, nxt, deps, slack, tr_start, dur, inst, members, inst_dur, end_frac


@settings(max_examples=150, deadline=None)
@given(timelines())
def test_schedule_matches_naive_twin(case):
    prev, nxt, deps, slack, tr_start, dur, inst, members, inst_dur, end_frac = case
    n = prev.size
    src = np.array([s for s, _ in deps], np.int64)
    dst = np.array([d for _, d in deps], np.int64)
    o = np.argsort(src, kind="stable")
    dep_ptr = np.zeros(n + 1, np.int64)
    np.add.at(dep_ptr, src + 1, 1)
    dep_ptr = np.cumsum(dep_ptr)
    inst_ptr = np.cumsum([0] + [len(m) for m in members]).astype(np.int64)
    inst_ids = np.array([j for m in members for j in m], np.int64)
    order_by_start = np.lexsort((np.arange(n), tr_start)).astype(np.int64)
    start, end, inst_start = _kernels.schedule(prev, nxt, dep_ptr, dst[o], slack, tr_start, dur, inst, inst_ptr,
                                               inst_ids, inst_dur, end_frac, order_by_start)
    n_start, n_end, n_inst = schedule_naive(prev, deps, slack, tr_start, dur, inst, members, inst_dur, end_frac)
    np.testing.assert_allclose(start, n_start, rtol=0, atol=1e-9)
    np.testing.assert_allclose(end, n_end, rtol=0, atol=1e-9)
    np.testing.assert_allclose(inst_start, n_inst, rtol=0, atol=1e-9)
