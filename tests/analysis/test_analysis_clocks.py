import numpy as np
import polars as pl
import pytest
from analysis_helpers import (
    alignment_edges,
    coll_table,
    dense_irls,
    dense_weighted_offsets,
    ranks_table,
    smoothed_lad,
    strip_derived,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tracekit.analysis import _kernels, align_clocks, clocks, match_collectives, prepare
from tracekit.synth import SynthSpec, make_run_tables


def _offsets(ranks) -> dict[int, int]:
    df = pl.from_arrow(ranks)
    return dict(zip(df["rank"].to_list(), df["clock_offset_ns"].to_list(), strict=True))


def _close(est: int, true: int) -> bool:
    return abs(est - true) <= max(0.05 * abs(true), 50_000)


def _skewed_run(offset: dict[int, int], groups: dict[str, list[int]], n: int, seed: int = 0,
                jitter_ns: int = 3_000, start_spread_ns: int = 2_000_000) -> list[dict]:
    """Collectives whose true ends agree within `jitter_ns`, seen on clocks shifted by -offset."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        t = i * 10_000_000
        for g, members in groups.items():
            end = t + 5_000_000
            for r in members:
                start = t + int(rng.integers(0, start_spread_ns))
                e = end + int(rng.integers(0, jitter_ns))
                rows.append({"rank": r, "group": g, "seq": i, "op": "all_reduce", "in_bytes": 1 << 20,
                             "out_bytes": 1 << 20, "ts_ns": start - offset[r], "dur_ns": e - start})
    return rows


def test_recovers_ms_offsets_across_overlapping_groups():
    rng = np.random.default_rng(1)
    offset = {r: int(rng.integers(-4_000_000, 4_000_000)) for r in range(8)}
    offset[0] = 0
    groups = {"dp0": [0, 1, 2, 3], "dp1": [4, 5, 6, 7], "x": [0, 4], "y": [3, 7, 5]}
    coll, _ = match_collectives(coll_table(_skewed_run(offset, groups, 40)))
    ranks, report = align_clocks(coll, ranks_table(8))
    est = _offsets(ranks)
    assert all(_close(est[r], offset[r]) for r in range(8)), (est, offset)
    assert report.residual_ns["p90"] < 10_000
    assert report.raw_spread_ns["median"] > 1_000_000
    assert report.anchor == 0 and not report.unconnected_ranks


def test_tightly_bound_blocks_move_together():
    """Hosts of 4 ranks with many intra-host collectives and few inter-host ones: rank-by-rank
    medians would leave every host at 0; the joint solve moves each host as a block."""
    offset = {r: [0, 1_500_000, -2_500_000][r // 4] for r in range(12)}
    groups = {f"tp{h}": list(range(4 * h, 4 * h + 4)) for h in range(3)}
    rows = _skewed_run(offset, groups, 60)
    rows += _skewed_run(offset, {"dp": [0, 4, 8]}, 5, seed=2)
    for r in rows[-15:]:
        r["seq"] += 1000
    coll, _ = match_collectives(coll_table(rows))
    est = _offsets(align_clocks(coll, ranks_table(12))[0])
    assert all(_close(est[r], offset[r]) for r in range(12)), est


def test_robust_to_an_outlier_instance():
    offset = {0: 0, 1: 700_000, 2: -300_000, 3: 1_200_000}
    rows = _skewed_run(offset, {"w": [0, 1, 2, 3]}, 30)
    rows[5]["dur_ns"] += 40_000_000  # one rank's kernel ran long after the others finished
    coll, _ = match_collectives(coll_table(rows))
    est = _offsets(align_clocks(coll, ranks_table(4))[0])
    assert all(_close(est[r], offset[r]) for r in range(4))


def test_p2p_used_only_to_connect():
    offset = {0: 0, 1: 0, 2: 2_000_000, 3: 2_000_000}
    rows = _skewed_run(offset, {"a": [0, 1], "b": [2, 3]}, 10)
    for k in range(4):
        end = 500_000_000 + k * 1_000_000
        rows.append({"rank": 1, "group": "p", "seq": k, "op": "send", "peer": 2, "in_bytes": 8,
                     "ts_ns": end - 1000, "dur_ns": 1000})
        rows.append({"rank": 2, "group": "p", "seq": k, "op": "recv", "peer": 1, "out_bytes": 8,
                     "ts_ns": end - 5000 - offset[2], "dur_ns": 5000})
    coll, _ = match_collectives(coll_table(rows))
    ranks, report = align_clocks(coll, ranks_table(4))
    assert report.used_p2p
    est = _offsets(ranks)
    assert all(_close(est[r], offset[r]) for r in range(4))


def test_unconnected_ranks_are_reported():
    offset = dict.fromkeys(range(4), 0)
    coll, _ = match_collectives(coll_table(_skewed_run(offset, {"a": [0, 1], "b": [2, 3]}, 5)))
    ranks, report = align_clocks(coll, ranks_table(5))
    assert report.unconnected_ranks == [2, 3, 4]
    assert _offsets(ranks)[4] == 0
    assert any("share no timed collective" in n for n in report.notes)


def test_no_timestamps_leaves_zero_offsets():
    rows = [{"rank": r, "group": "g", "seq": 0, "op": "all_reduce"} for r in range(3)]
    coll, _ = match_collectives(coll_table(rows))
    ranks, report = align_clocks(coll, ranks_table(3))
    assert set(_offsets(ranks).values()) == {0}
    assert "no collectives with timestamps" in report.notes[0]


@pytest.mark.parametrize("fixture", ["synth_small", "synth_wide"])
def test_recovers_synth_host_offsets(request, fixture):
    tables, truth = request.getfixturevalue(fixture)
    est = _offsets(prepare(tables)["ranks"])
    true = {int(r): v for r, v in truth["clock_offset_ns"].items()}
    base = true[0]
    assert all(_close(est[r], true[r] - base) for r in true), (est, true)


def test_a_1000_rank_send_recv_chain_is_recovered_exactly_in_few_solver_steps():
    """A pipeline of 1,000 ranks linked only by send/recv to the next one: rank r's clock runs
    (r * 7919 mod 1000) us behind the common one, and each pair's send and recv end at the same
    common instant, so the offsets are exactly those (rank 0's is 0) with zero residual. The graph is
    a path 1,000 ranks long: Jacobi-preconditioned CG took 999 steps; the spanning-tree
    preconditioner is exact on it."""
    n, k = 1000, 2
    offset = [(r * 7919 % 1000) * 1000 for r in range(n)]
    rank, op, peer, end = [], [], [], []
    for r in range(n - 1):
        for j in range(k):
            t = 10**9 + (r * k + j) * 100_000
            rank += [r, r + 1]
            op += ["send", "recv"]
            peer += [r + 1, r]
            end += [t - offset[r], t - offset[r + 1]]
    coll = pl.DataFrame({"coll_id": range(len(rank)), "rank": rank, "group": "pp", "op": op, "peer": peer,
                         "in_bytes": 1 << 20, "out_bytes": 1 << 20, "ts_ns": [x - 40_000 for x in end],
                         "dur_ns": 40_000})
    matched, _ = match_collectives(coll)
    ranks, report = align_clocks(matched, ranks_table(n))
    assert _offsets(ranks) == dict(enumerate(offset))
    assert report.used_p2p and report.residual_ns["max"] == 0
    assert report.solver_steps <= 3, report.solver_steps


_NEAR, _FAR = (2000, 4000), (6000, 8000)


def _link_gaps(r: int) -> list[int]:
    """Recv-minus-send end gaps (common clock) of link r -> r+1 in `_jittered_chain`: +-2 and +-4 us,
    then 6 and 8 us on one side and 60 and 80 us on the other, the side alternating by link."""
    sign = 1 if r % 2 else -1
    return [*_NEAR, *(-g for g in _NEAR), *(sign * g for g in _FAR), *(-sign * 10 * g for g in _FAR)]


def _jittered_chain(n: int) -> tuple[pl.DataFrame, list[int]]:
    """A send/recv chain on clocks (r * 7919 mod 1000) us behind the common one, link r's transfers
    ending `_link_gaps(r)` apart."""
    offset = [(r * 7919 % 1000) * 1000 for r in range(n)]
    rank, op, peer, end = [], [], [], []
    for r in range(n - 1):
        for j, d in enumerate(_link_gaps(r)):
            t = 10**9 + (r * 16 + j) * 100_000
            rank += [r, r + 1]
            op += ["send", "recv"]
            peer += [r + 1, r]
            end += [t - offset[r], t + d - offset[r + 1]]
    coll = pl.DataFrame({"coll_id": range(len(rank)), "rank": rank, "group": "pp", "op": op, "peer": peer,
                         "in_bytes": 1 << 20, "out_bytes": 1 << 20, "ts_ns": [x - 40_000 for x in end],
                         "dur_ns": 40_000})
    return match_collectives(coll)[0], offset


def test_a_jittered_chain_converges_well_inside_the_cap_to_the_optimum():
    """A chain is a tree, so each link is its own one-variable problem: the pair residuals are
    +-(gap - x)/2 for an error x in the link's offset difference, and the smoothed objective is
    minimal where sum phi'((gap - x)/2) = 0, phi'(u) = u / sqrt(u^2 + (100 ns)^2), found here by
    bisection (x* ~ 75 ns: the far gaps pull harder on one side). Links alternate sides, so their
    errors cancel in pairs: even ranks sit exactly on the injected offsets, odd ranks x* behind.
    The optimum lies in a 4 us-wide flat stretch (40x the floor) that least squares starts ~4 us
    away from; plain IRLS reweighting crept there by ~0.5% of the remaining error per step, stopped
    at the 100-iteration cap 690 ns off, and needed ~1,750 iterations to settle."""
    lo, hi = -2000.0, 2000.0
    gaps = np.array(_link_gaps(0), np.float64)
    for _ in range(100):
        mid = (lo + hi) / 2
        u = (gaps - mid) / 2
        lo, hi = (mid, hi) if np.sum(u / np.sqrt(u * u + 100.0**2)) > 0 else (lo, mid)
    x = (lo + hi) / 2
    assert 50 < x < 100
    matched, offset = _jittered_chain(100)
    ranks, report = align_clocks(matched, ranks_table(100))
    assert report.converged and report.iterations <= 20, report.iterations
    got = _offsets(ranks)
    want = [offset[r] - (x if r % 2 else 0.0) for r in range(100)]
    assert max(abs(got[r] - want[r]) for r in range(100)) <= 1
    assert not any("settled" in n for n in report.notes)


def test_stopping_at_the_cap_is_reported():
    """Cut to 3 iterations the same chain is not settled: the report says so, in a note and in the
    flag the analysis turns into an alignment warning."""
    from types import SimpleNamespace

    from tracekit.analysis.findings import _alignment_findings

    matched, _ = _jittered_chain(20)
    ranks, report = align_clocks(matched, ranks_table(20), max_iter=3)
    assert not report.converged and report.iterations == 3
    assert any("had not settled after 3 iterations" in n for n in report.notes)
    found = _alignment_findings(SimpleNamespace(alignment=report, ranks=ranks, validity=None))
    assert [f.severity for f in found if "iteration cap" in f.text] == ["warning"]


def test_the_preconditioner_follows_the_heavy_links():
    """300 ranks in a chain, each link 10 transfers, plus one light transfer from every rank to the
    one two further on: the maximum-weight tree is the chain and CG needs 79 steps; Jacobi (272)
    or a tree of the light links (285) need about as many as the chain is long."""
    n = 300
    pairs = [(a, a + 1) for a in range(n - 1) for _ in range(10)] + [(a, a + 2) for a in range(n - 2)]
    r = np.array(pairs).ravel()
    i = np.repeat(np.arange(len(pairs)), 2)
    e = np.random.default_rng(0).normal(size=len(r)) * 1e3
    fixed = np.arange(n) == 0
    got, steps = clocks.weighted_offsets(r, i, e, np.ones(len(r)), n, len(pairs), fixed)
    assert steps <= 100, steps
    np.testing.assert_allclose(got, dense_weighted_offsets(r, i, e, np.ones(len(r)), n, len(pairs), fixed),
                               atol=1e-6)


# --- the solver at scale: exactness against the dense solve, injected truth, invariants ----------


@st.composite
def _graphs(draw):
    """A random rank-instance graph: instances over random rank subsets, ends on skewed clocks
    with jitter and an occasional late outlier."""
    n_r = draw(st.integers(2, 10))
    n_i = draw(st.integers(1, 25))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    true = rng.integers(-5_000_000, 5_000_000, n_r)
    r, i, e = [], [], []
    for k in range(n_i):
        members = rng.choice(n_r, size=int(rng.integers(2, n_r + 1)), replace=False)
        for m in members:
            late = 3_000_000 if rng.random() < 0.05 else 0
            r.append(m)
            i.append(k)
            e.append(k * 50_000_000 - true[m] + int(rng.integers(0, 8_000)) + late)
    r, i = np.array(r, np.int64), np.array(i, np.int64)
    labels = _kernels.components(r, i, n_r, n_i)
    fixed = np.bincount(r, minlength=n_r) == 0
    fixed[np.unique(labels)] = True
    e = np.array(e, np.float64) - float(np.median(e))
    return r, i, e, n_r, n_i, fixed


def _graph(r, i, e, fixed):
    """An explicit `_graphs` example."""
    r, i = np.array(r, np.int64), np.array(i, np.int64)
    return r, i, np.array(e, np.float64), len(fixed), int(i.max()) + 1, np.array(fixed)


@settings(max_examples=100, deadline=None)
@given(_graphs(), st.integers(0, 2**31))
# found by hypothesis (seed 1, 2000 examples): stopped after its first step (curvature floor 0.1),
# 4.3 ns from dense IRLS, objective 1e-4 ns higher
@example(_graph([3, 5, 4, 1, 8, 7, 6, 7, 3, 2, 5, 1], [0] * 6 + [1] * 6,
                [-24825080, -29480344, -29117092, -29143722, -24246500, -20523670, 20582065, 29479688,
                 25170502, 21471626, 20523670, 20851050], [True, True] + [False] * 7), 0)
# 52 µs from dense IRLS on a flat stretch, objective 1.2e-3 ns higher
@example(_graph([2, 4, 3, 0, 3, 1, 2, 5, 0, 0, 1, 5, 0, 4, 2, 5, 3], [0] * 4 + [1] * 5 + [2] * 3 + [3] * 5,
                [-54032227, -46036360, -52322701, -50001059, -2322310, -4462487, -1028264, -5048354, 0,
                 46999034, 45539077, 44952116, 97004739, 100961512, 95967351, 94950828, 97681753],
                [True] + [False] * 5), 0)
def test_sparse_solve_equals_the_dense_solve(g, seed):
    """One weighted step (weights spread like IRLS's, 1e-7 to 1e-2) to 1e-4 ns; the whole solve
    against dense IRLS run to convergence: within 2 ns, or an objective at most 0.01 ns higher; or,
    within the cap, not converged and saying so (some of these few-instance graphs with ms skews
    have a kinked optimum that takes thousands of iterations).
    The objective, not the offsets: with ms residuals the optimum can lie on a flat stretch (an even
    number of ends, µs apart, on either side; no pair near its kink), where offsets ns or even µs
    apart fit within 1e-3 ns of the same sum. There a step is damped by the curvature floor, so it
    moves under 0.5 ns well before the offsets are within 0.5 ns, and dense IRLS creeps too: in 4,500
    graphs 29 solves ended over 2 ns from it, 25 of them with the lower objective, the rest at most
    2.1e-3 ns higher. Precision is the chain's and the synth runs' tests; here a stop at 50 ns steps,
    or plain IRLS, is 1.1 or 0.017 ns worse."""
    r, i, e, n_r, n_i, fixed = g
    w = 10.0 ** np.random.default_rng(seed).uniform(-7, -2, len(e))
    got, _ = clocks.weighted_offsets(r, i, e, w, n_r, n_i, fixed)
    np.testing.assert_allclose(got, dense_weighted_offsets(r, i, e, w, n_r, n_i, fixed), atol=1e-4)
    got, it, _, converged = clocks._solve(r, i, e, n_r, n_i, 100, 0.5, fixed)
    if not converged:
        assert it == 100
        return
    want = dense_irls(r, i, e, n_r, n_i, fixed)
    if not np.allclose(got, want, rtol=0, atol=2.0):
        assert smoothed_lad(r, i, e, got, n_i) <= smoothed_lad(r, i, e, want, n_i) + 0.01


def test_a_shortened_step_is_not_taken_for_convergence():
    """Found by hypothesis in CI: three ranks, eight instances, ms skews. The line search cut the
    tenth step to 1/8, which moved no offset by more than 0.5 ns while the offsets were still 20 ns
    from the optimum; the solve must go on to it (dense IRLS) and say it converged."""
    r = np.array([2, 1, 1, 0, 2, 1, 2, 0, 2, 1, 0, 1, 0, 2, 0, 2, 1, 0, 2, 2, 1])
    i = np.array([0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 6, 6, 6, 7, 7])
    e = np.array([-153906113, -155762815, -105757116, -99998882, -103907142, -55760924, -53907772,
                  -49998081, -3904408, -2762442, 0, 44240812, 49999179, 46094018, 100002601, 96095219,
                  144239376, 150005530, 146095760, 196089113, 194235673], np.float64)
    fixed = np.array([True, False, False])
    got, it, _, converged = clocks._solve(r, i, e, 3, 8, 100, 0.5, fixed)
    assert converged and it < 100
    np.testing.assert_allclose(got, dense_irls(r, i, e, 3, 8, fixed), atol=0.5)


def test_weighted_offsets_are_the_least_squares_solution():
    """One weighted solve against brute-force least squares over offsets and common ends."""
    rng = np.random.default_rng(4)
    r = np.array([0, 1, 2, 0, 2, 1, 3, 4, 5, 4])
    inst = np.array([0, 0, 0, 1, 1, 2, 2, 3, 3, 4])
    e = rng.normal(size=10) * 1e6
    w = rng.uniform(0.01, 5, size=10)
    fixed = np.zeros(7, bool)
    fixed[[0, 4, 6]] = True  # two components anchored at 0 and 4; rank 6 has no edge
    got, steps = clocks.weighted_offsets(r, inst, e, w, 7, 5, fixed)
    assert 0 < steps <= 7
    free = [1, 2, 3, 5]
    a = np.zeros((10, len(free) + 5))
    for k in range(10):
        if r[k] in free:
            a[k, free.index(r[k])] = 1
        a[k, len(free) + inst[k]] = -1
    sw = np.sqrt(w)
    x, *_ = np.linalg.lstsq(a * sw[:, None], -e * sw, rcond=None)
    np.testing.assert_allclose(got[free], x[:len(free)], atol=1e-6)
    assert got[[0, 4, 6]].tolist() == [0, 0, 0]


def _synth_collectives(hosts: int, seed: int, *, noise: bool):
    tables, truth = make_run_tables(SynthSpec(hosts=hosts, gpus_per_host=8, pp=4, ep=8, steps=1, seed=seed,
                                              clock_skew_ns=3_000_000, straggler_rank=5, launch_events=False))
    coll = pl.from_arrow(strip_derived(tables)["collectives"])
    if noise:
        rng = np.random.default_rng(seed)
        late = (rng.random(coll.height) < 0.02) * rng.integers(1_000_000, 20_000_000, coll.height)
        coll = coll.with_columns(pl.col("dur_ns") + pl.Series(rng.integers(0, 5_000, coll.height) + late))
    true = {int(r): v - truth["clock_offset_ns"]["0"] for r, v in truth["clock_offset_ns"].items()}
    return coll, true


def test_recovers_synth_offsets_at_256_ranks_with_jitter_outliers_and_a_detached_group():
    """256 synth ranks (per-host skew up to 3 ms, a straggler, 0-5 us end jitter, 2% of ends late by
    1-20 ms) plus 4 ranks that only talk among themselves on their own clocks."""
    coll, true = _synth_collectives(32, 7, noise=True)
    extra_off = {256: 0, 257: 900_000, 258: -1_300_000, 259: 2_000_000}
    rows = _skewed_run(extra_off, {"island": list(extra_off)}, 20, seed=3)
    island = pl.from_arrow(coll_table(rows))
    coll = pl.concat([coll, island], how="diagonal_relaxed")
    matched, _ = match_collectives(coll)
    ranks, report = align_clocks(matched, ranks_table(260))
    est = _offsets(ranks)
    err = max(abs(est[r] - true[r]) for r in true)
    assert err < 10_000, err
    assert report.unconnected_ranks == [256, 257, 258, 259]
    assert sorted(report.components, key=len)[0] == [256, 257, 258, 259]
    assert all(abs(est[r] - extra_off[r]) < 10_000 for r in extra_off)
    assert report.residual_ns["p90"] < 20_000 < report.raw_spread_ns["median"]


def test_one_method_at_512_ranks():
    """The 512-rank case the old alternating-medians path got wrong by up to 2 ms."""
    coll, true = _synth_collectives(64, 1, noise=False)
    matched, _ = match_collectives(coll)
    ranks, report = align_clocks(matched, ranks_table(512))
    est = _offsets(ranks)
    assert max(abs(est[r] - true[r]) for r in true) <= 1
    assert report.method.startswith("end-time least absolute deviation")
    assert not hasattr(clocks, "DENSE_LIMIT")


def test_equals_the_dense_solve_on_a_noisy_64_rank_synth_run():
    coll, _ = _synth_collectives(8, 2, noise=True)
    matched, _ = match_collectives(coll)
    _, report = align_clocks(matched, ranks_table(64))
    assert report.used_p2p  # pipeline stages meet only in send/recv
    r, i, e, n_i, fixed = alignment_edges(matched, 64, p2p=True)
    want = dense_irls(r, i, e, 64, n_i, fixed)
    got, _, _, _ = clocks._solve(r, i, e, 64, n_i, 100, 0.5, fixed)
    np.testing.assert_allclose(got, want, atol=0.1)
    assert report.iterations > 2 and report.solver_steps > report.iterations
    # each step's solve starts from zero (the step, not the offsets) to a relative 1e-6: 324 CG steps
    # in all; from the offsets, or to 1e-12, it took 455 or 510
    assert report.converged and report.solver_steps <= 400, report.solver_steps


@st.composite
def _runs(draw):
    n = draw(st.integers(3, 7))
    off = {r: draw(st.integers(-3_000_000, 3_000_000)) for r in range(n)}
    groups = {"all": list(range(n)), "pair": [0, n - 1], "sub": list(range(1, n))}
    return _skewed_run(off, groups, draw(st.integers(3, 8)), seed=draw(st.integers(0, 1000))), n


@settings(max_examples=25, deadline=None)
@given(_runs(), st.integers(-(10**15), 10**15))
def test_a_constant_on_every_clock_changes_nothing(run, shift):
    rows, n = run
    base = align_clocks(match_collectives(coll_table(rows))[0], ranks_table(n))
    moved = [{**r, "ts_ns": r["ts_ns"] + shift} for r in rows]
    again = align_clocks(match_collectives(coll_table(moved))[0], ranks_table(n))
    assert _offsets(again[0]) == _offsets(base[0])
    assert again[1].residual_ns == base[1].residual_ns


@settings(max_examples=25, deadline=None)
@given(_runs(), st.randoms(use_true_random=False))
def test_permuting_ranks_permutes_offsets(run, rnd):
    """Renaming ranks renames their offsets (relative to the new lowest rank), within 20 ns: the solver
    stops once no offset moves 0.5 ns, and where the L1 optimum is flat, summing in another order
    stops it a few ns elsewhere (up to 5 ns seen in 300 examples)."""
    rows, n = run
    perm = list(range(n))
    rnd.shuffle(perm)
    base = _offsets(align_clocks(match_collectives(coll_table(rows))[0], ranks_table(n))[0])
    renamed = [{**r, "rank": perm[r["rank"]]} for r in rows]
    got = _offsets(align_clocks(match_collectives(coll_table(renamed))[0], ranks_table(n))[0])
    anchor = perm.index(0)  # the new lowest rank is old rank `anchor`: offsets are relative to it
    for r in range(n):
        assert abs(got[perm[r]] - (base[r] - base[anchor])) <= 20, (r, got, base, perm)
